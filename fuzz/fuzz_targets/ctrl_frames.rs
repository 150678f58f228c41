//! Control-socket frames as the daemon (and the client) decode them: the input's first two bytes pick the kind and
//! the side, the rest is the body, sent as one frame followed by a good one. A message or a typed error, never a
//! panic, and the good frame after it still decodes.

#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_dp::ctrl::proto::{send_raw_frame, Conn, Request, Response, PROTO_VERSION};
use std::os::unix::net::UnixStream;

fuzz_target!(|data: &[u8]| {
    let Some((&[k, side], body)) = data.split_first_chunk::<2>() else { return };
    let body = &body[..body.len().min(60_000)];
    let (a, b) = UnixStream::pair().unwrap();
    let daemon_side = side & 1 == 0;
    // Kinds 0..=31 (requests) and 0x100..=0x11f (responses): the ones that exist and some that do not.
    let kind = u16::from(k & 0x1f) | if side & 2 != 0 { 0x100 } else { 0 };
    send_raw_frame(&a, PROTO_VERSION, kind, 0, body).unwrap();
    let follow = Conn::new(a.try_clone().unwrap());
    if daemon_side {
        follow.send_request(2, &Request::AllocPd, &[]).unwrap();
    } else {
        follow.send_response(2, &Response::Ok, &[]).unwrap();
    }
    let mut conn = Conn::new(b);
    if daemon_side {
        if let Err(e) = conn.recv_request() {
            assert!(!e.to_string().is_empty());
        }
        assert_eq!(conn.recv_request().unwrap().msg, Request::AllocPd);
    } else {
        if let Err(e) = conn.recv_response() {
            assert!(!e.to_string().is_empty());
        }
        assert_eq!(conn.recv_response().unwrap().msg, Response::Ok);
    }
});
