//! A fake roce-dpd for the client library's tests: a thread speaking `ctrl::proto` on a Unix socket, answering
//! `Hello` as an honest daemon does and every other request as the test scripts it.

#![allow(dead_code, unreachable_pub)]

use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;

use roce_dp::ctrl::proto::{Conn, DeviceInfo, Request, Response};

/// The `Hello` answer of a daemon with this library's ABI (port 10.0.0.9, MAC 02:00:00:00:00:09, MTU 1024).
pub fn hello() -> Response {
    Response::Hello(DeviceInfo {
        abi: roce_dp::ctrl::abi::ABI_VERSION,
        pid: 1,
        mac: [2, 0, 0, 0, 0, 9],
        ipv4: Some([10, 0, 0, 9]),
        ipv6: None,
        mtu: 1024,
        hugetlb: false,
    })
}

/// A daemon on `path` that accepts one session, answers `Hello`, then hands every other request (with its sequence
/// number and the connection) to `answer`; it stops when `answer` returns false or the client goes.
pub fn scripted_daemon(
    path: PathBuf,
    mut answer: impl FnMut(&Request, u32, &mut Conn) -> bool + Send + 'static,
) -> (PathBuf, std::thread::JoinHandle<()>) {
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).unwrap();
    let h = std::thread::spawn(move || {
        let Ok((s, _)) = l.accept() else { return };
        let mut c = Conn::new(s);
        while let Ok(f) = c.recv_request() {
            if let Request::Hello { .. } = f.msg {
                c.send_response(f.seq, &hello(), &[]).unwrap();
            } else if !answer(&f.msg, f.seq, &mut c) {
                return;
            }
        }
    });
    (path, h)
}

/// Sends `r` as the answer to request `seq`, with the descriptor `fd` if any; false if the client is gone.
pub fn answer(c: &mut Conn, seq: u32, r: &Response, fd: Option<&OwnedFd>) -> bool {
    let fds: Vec<_> = fd.iter().map(|f| f.as_fd()).collect();
    c.send_response(seq, r, &fds).is_ok()
}
