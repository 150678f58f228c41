//! The out-of-band channel between the two rdp-nic processes: text lines over TCP on 127.0.0.1 (never another
//! address), or over a Unix socket path (processes in different network namespaces). Carries the workload parameters, addresses and QP attributes before traffic, and the stop handshake
//! after it (the server stops polling before it says STOPPED; only then may the client stop its memif port).

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::app::Remote;
use crate::SetupError;

pub(crate) enum Listener {
    Tcp(TcpListener),
    /// A Unix socket path (reachable across network namespaces, unlike 127.0.0.1); removed on drop.
    Unix(UnixListener, PathBuf),
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

/// The longest line either side sends is a QP line (under 200 bytes); a longer one is garbage.
const MAX_LINE: usize = 4096;

pub(crate) struct Oob {
    stream: Stream,
    buf: Vec<u8>,
}

impl Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
    fn write_all(&mut self, b: &[u8]) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.write_all(b),
            Stream::Unix(s) => s.write_all(b),
        }
    }
    fn set_nonblocking(&self, on: bool) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_nonblocking(on),
            Stream::Unix(s) => s.set_nonblocking(on),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, p) = self {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

fn oob_err(what: &str, e: std::io::Error) -> SetupError {
    SetupError(format!("out-of-band {what}: {e}"))
}

impl Oob {
    /// Listen on 127.0.0.1:`port`, or on the Unix socket `unix` if given.
    pub(crate) fn listen(port: u16, unix: Option<&Path>) -> std::io::Result<Listener> {
        if let Some(path) = unix {
            // A socket left by an earlier run is replaced; anything else at the path (a typo naming a profile, a
            // directory's file) is not ours to delete.
            match std::fs::symlink_metadata(path) {
                Ok(m) if m.file_type().is_socket() => {
                    let _ = std::fs::remove_file(path);
                }
                Ok(_) => {
                    return Err(std::io::Error::new(
                        ErrorKind::AlreadyExists,
                        "the path exists and is not a socket (left as it is)",
                    ))
                }
                Err(_) => {}
            }
            let l = UnixListener::bind(path)?;
            l.set_nonblocking(true)?;
            return Ok(Listener::Unix(l, path.to_owned()));
        }
        let l = TcpListener::bind(loopback(port))?;
        l.set_nonblocking(true)?;
        Ok(Listener::Tcp(l))
    }

    /// Connect to the server, retrying until `deadline` (it may not listen yet).
    pub(crate) fn connect(port: u16, unix: Option<&Path>, deadline: Instant) -> std::io::Result<Oob> {
        loop {
            let r = match unix {
                Some(p) => UnixStream::connect(p).map(Stream::Unix),
                None => TcpStream::connect_timeout(&loopback(port), Duration::from_secs(1)).map(|s| {
                    let _ = s.set_nodelay(true);
                    Stream::Tcp(s)
                }),
            };
            match r {
                Ok(s) => return Ok(Oob { stream: s, buf: Vec::new() }),
                Err(e) if Instant::now() >= deadline || roce_dp::dpdk::signal::stop_requested() => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    pub(crate) fn send(&mut self, line: &str) -> Result<(), SetupError> {
        let mut b = line.as_bytes().to_vec();
        b.push(b'\n');
        self.stream.write_all(&b).map_err(|e| oob_err("send", e))
    }

    pub(crate) fn set_nonblocking(&mut self, on: bool) -> Result<(), SetupError> {
        self.stream.set_nonblocking(on).map_err(|e| oob_err("setup", e))
    }

    fn take_line(&mut self) -> Option<String> {
        let i = self.buf.iter().position(|&c| c == b'\n')?;
        let line: Vec<u8> = self.buf.drain(..=i).collect();
        Some(String::from_utf8_lossy(&line[..i]).trim().to_owned())
    }

    /// A complete line if one has arrived (non-blocking socket), else None.
    pub(crate) fn try_line(&mut self) -> Result<Option<String>, SetupError> {
        if let Some(l) = self.take_line() {
            return Ok(Some(l));
        }
        let mut tmp = [0u8; 512];
        match self.stream.read(&mut tmp) {
            Ok(0) => Err(SetupError("out-of-band: the peer closed the connection".into())),
            Ok(n) => {
                self.buf.extend_from_slice(&tmp[..n]);
                let l = self.take_line();
                if l.is_none() && self.buf.len() > MAX_LINE {
                    // The peer is not trusted: a line without an end must not grow our buffer without bound.
                    return Err(SetupError(format!("out-of-band: a line longer than {MAX_LINE} bytes from the peer")));
                }
                Ok(l)
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => Ok(None),
            Err(e) => Err(oob_err("receive", e)),
        }
    }

    /// The next line, waiting until `deadline`.
    pub(crate) fn line(&mut self, deadline: Instant) -> Result<String, SetupError> {
        self.set_nonblocking(true)?;
        loop {
            if let Some(l) = self.try_line()? {
                return Ok(l);
            }
            if Instant::now() >= deadline || roce_dp::dpdk::signal::stop_requested() {
                return Err(SetupError("out-of-band: timed out waiting for the peer".into()));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    pub(crate) fn addr(&mut self, deadline: Instant) -> Result<[u8; 4], SetupError> {
        let l = self.line(deadline)?;
        l.strip_prefix("ADDR ")
            .and_then(|a| a.parse::<Ipv4Addr>().ok())
            .map(|a| a.octets())
            .ok_or_else(|| SetupError(format!("out-of-band: expected ADDR, got {l:?}")))
    }

    pub(crate) fn remote(&mut self, deadline: Instant) -> Result<Remote, SetupError> {
        let l = self.line(deadline)?;
        Remote::from_line(&l).ok_or_else(|| SetupError(format!("out-of-band: expected QP, got {l:?}")))
    }
}

impl Listener {
    pub(crate) fn accept(self, deadline: Instant) -> Result<Oob, SetupError> {
        loop {
            let r = match &self {
                Listener::Tcp(l) => l.accept().map(|(s, _)| {
                    let _ = s.set_nodelay(true);
                    Stream::Tcp(s)
                }),
                Listener::Unix(l, _) => l.accept().map(|(s, _)| Stream::Unix(s)),
            };
            match r {
                Ok(s) => {
                    s.set_nonblocking(false).map_err(|e| oob_err("accept", e))?;
                    return Ok(Oob { stream: s, buf: Vec::new() });
                }
                Err(e)
                    if e.kind() == ErrorKind::WouldBlock
                        && Instant::now() < deadline
                        && !roce_dp::dpdk::signal::stop_requested() =>
                {
                    std::thread::sleep(Duration::from_millis(10))
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    return Err(SetupError("out-of-band: no client connected before the timeout".into()))
                }
                Err(e) => return Err(oob_err("accept", e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_replaces_a_stale_socket_but_no_other_file() {
        // Session-11 audit: `--oob-unix PATH` removed whatever PATH named (as root: any file) before binding.
        let dir = std::env::temp_dir().join(format!("rdpn-oob-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("profile.toml");
        std::fs::write(&file, "[port]\n").unwrap();
        let e = Oob::listen(0, Some(&file)).err().expect("a plain file is refused");
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "[port]\n", "the file is left as it was");
        assert!(Oob::listen(0, Some(&dir)).is_err(), "a directory is refused");
        assert!(dir.is_dir());
        // A socket an earlier run left behind (its listener gone without removing it) is replaced.
        let sock = dir.join("oob.sock");
        drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
        assert!(sock.exists());
        let l = Oob::listen(0, Some(&sock)).expect("a stale socket is replaced");
        assert!(UnixStream::connect(&sock).is_ok());
        drop(l);
        assert!(!sock.exists(), "the listener removes its socket");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn an_endless_line_is_refused_at_the_limit() {
        // Session-10 audit: the buffer grew by every byte the peer sent until a newline or the deadline.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut oob = Oob { stream: Stream::Unix(a), buf: Vec::new() };
        let feeder = std::thread::spawn(move || {
            let chunk = [b'A'; 1024];
            for _ in 0..64 {
                if b.write_all(&chunk).is_err() {
                    break;
                }
            }
            b
        });
        let e = oob.line(Instant::now() + Duration::from_secs(30)).err().map(|e| e.0);
        assert_eq!(e.as_deref(), Some("out-of-band: a line longer than 4096 bytes from the peer"));
        assert!(oob.buf.len() <= MAX_LINE + 512, "{}", oob.buf.len());
        drop(oob);
        drop(feeder.join().unwrap());
        // Lines up to the limit still arrive whole.
        let (a, mut b) = UnixStream::pair().unwrap();
        let mut oob = Oob { stream: Stream::Unix(a), buf: Vec::new() };
        b.write_all(b"QP 1 2 3\nADDR 10.0.0.1\n").unwrap();
        let t = Instant::now() + Duration::from_secs(5);
        let mut next = || oob.line(t).map_err(|e| e.0);
        assert_eq!((next(), next()), (Ok("QP 1 2 3".to_owned()), Ok("ADDR 10.0.0.1".to_owned())));
    }
}
