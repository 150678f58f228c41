//! Shared by the tools' tests: the captured vectors, the perftest TCP exchange inside the pcaps, and waiting for a
//! tool's process.
#![allow(dead_code, unreachable_pub)]

use roce_dp_tools::capture::for_each_frame;
use std::path::PathBuf;
use std::process::{Child, Output};
use std::time::{Duration, Instant};

/// A tool under test whose stdout and stderr are being read as it runs (a tool that prints more than a pipe holds
/// must not block on it while the test waits for another process).
pub struct Running {
    child: Child,
    out: std::thread::JoinHandle<Vec<u8>>,
    err: std::thread::JoinHandle<Vec<u8>>,
}

impl Running {
    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl From<Child> for Running {
    fn from(mut child: Child) -> Running {
        fn drain(r: Option<impl std::io::Read + Send + 'static>) -> std::thread::JoinHandle<Vec<u8>> {
            std::thread::spawn(move || {
                let mut v = Vec::new();
                if let Some(mut r) = r {
                    let _ = r.read_to_end(&mut v);
                }
                v
            })
        }
        let (out, err) = (drain(child.stdout.take()), drain(child.stderr.take()));
        Running { child, out, err }
    }
}

/// Waits at most `secs` for a tool under test; kills it and fails the test if it still runs, with its stderr.
pub fn wait_child(run: impl Into<Running>, secs: u64, what: &str) -> Output {
    let Running { mut child, out, err } = run.into();
    let until = Instant::now() + Duration::from_secs(secs);
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > until {
            child.kill().unwrap();
            let _ = child.wait();
            let err = err.join().unwrap();
            panic!("{what}: still running after {secs} s: {}", String::from_utf8_lossy(&err));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Output { status, stdout: out.join().unwrap(), stderr: err.join().unwrap() }
}

/// The rxe captures (roce-dp/tests/vectors/rxe, a vendored copy of shared/vectors/rxe); missing is a failure,
/// never a skip.
pub fn vectors() -> PathBuf {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../roce-dp/tests/vectors/rxe"));
    assert!(dir.is_dir(), "test vectors missing from the checkout: {}", dir.display());
    dir
}

/// One TCP payload of the exchange, in capture order.
#[derive(Clone, Debug)]
pub struct Segment {
    pub from_client: bool,
    pub data: Vec<u8>,
}

/// tools/tests/vectors/perftest-4.5: exchanges captured between two perftest 4.5 peers in the interop guests
/// (`-a`, `-b`, `-D`; see its README).
pub fn perftest_vectors() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/vectors/perftest-4.5"))
}

/// The TCP payloads to and from port 18515 in a capture of shared/vectors/rxe (IPv4, Ethernet), retransmissions
/// dropped.
pub fn oob_segments(name: &str) -> Vec<Segment> {
    oob_segments_at(&vectors().join(name))
}

/// [`oob_segments`] of the capture at `path`.
pub fn oob_segments_at(path: &std::path::Path) -> Vec<Segment> {
    let name = path.display();
    let mut out = Vec::new();
    let mut next_seq: [Option<u32>; 2] = [None, None];
    for_each_frame(path, |f| {
        let d = f.data;
        if d.len() < 14 + 20 || d[12..14] != [0x08, 0x00] {
            return;
        }
        let ip = &d[14..];
        let ihl = usize::from(ip[0] & 0xf) * 4;
        let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
        if ip[9] != 6 || total > ip.len() || total < ihl + 20 {
            return;
        }
        let tcp = &ip[ihl..total];
        let sport = u16::from_be_bytes([tcp[0], tcp[1]]);
        let dport = u16::from_be_bytes([tcp[2], tcp[3]]);
        let from_client = match (sport, dport) {
            (_, 18515) => true,
            (18515, _) => false,
            _ => return,
        };
        let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
        let payload = &tcp[usize::from(tcp[12] >> 4) * 4..];
        if payload.is_empty() {
            return;
        }
        let dir = usize::from(from_client);
        if let Some(n) = next_seq[dir] {
            if seq.wrapping_sub(n) as i32 != 0 {
                assert!((seq.wrapping_sub(n) as i32) < 0, "{name}: gap in the TCP stream");
                return; // a retransmission
            }
        }
        next_seq[dir] = Some(seq.wrapping_add(payload.len() as u32));
        out.push(Segment { from_client, data: payload.to_vec() });
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    assert!(!out.is_empty(), "{name}: no perftest exchange (TCP port 18515) in the capture");
    out
}
