//! Garbage on the daemon's control socket: frames of every kind with random bodies, and real requests and
//! responses with their bodies mutated (bytes flipped, cut, extended), decoded by `Conn::recv_request` (the
//! daemon's side) and `Conn::recv_response` (the client's). The rule: a message or a typed `ProtoError`, never a
//! panic, and a connection that keeps decoding the frames after a bad one.
//!
//! Seeded (tests/seeded): `ROCE_HOSTILE_SEED`, `ROCE_HOSTILE_ITERS` (default 3000), `ROCE_HOSTILE_SOAK=1` (100x).

mod seeded;

use roce_dp::ctrl::proto::{send_raw_frame, Conn, ModifyQp, Request, Response, PROTO_VERSION};
use roce_dp::sim::SimRng;
use roce_dp::{QpAttr, QpState};
use seeded::Seeds;
use std::io::Read;
use std::os::unix::net::UnixStream;

/// The body bytes of a real request or response (the frame as `Conn` writes it, header stripped), and its kind.
fn encoded(send: impl FnOnce(&Conn)) -> (u16, Vec<u8>) {
    let (a, mut b) = UnixStream::pair().unwrap();
    send(&Conn::new(a));
    let mut len = [0u8; 4];
    b.read_exact(&mut len).unwrap();
    let mut rest = vec![0u8; u32::from_le_bytes(len) as usize];
    b.read_exact(&mut rest).unwrap();
    // After the length: version (2), kind (2), seq (4), descriptor count and padding (4), then the body.
    (u16::from_le_bytes([rest[2], rest[3]]), rest[12..].to_vec())
}

fn samples() -> Vec<(bool, u16, Vec<u8>)> {
    let attr = QpAttr { state: Some(QpState::Rts), sq_psn: Some(9), timeout: Some(3), ..QpAttr::default() };
    let m = ModifyQp { attr, gid: Some([0xfe; 16]), mac: None };
    let reqs = [
        Request::Hello { abi: 1 },
        Request::AllocPd,
        Request::DeallocPd { pd: 3 },
        Request::ModifyQp { qpn: 0x101, m },
        Request::QueryQp { qpn: 0x101 },
        Request::DestroyQp { qpn: 0x101 },
        Request::Stats,
    ];
    let mut v: Vec<(bool, u16, Vec<u8>)> = Vec::new();
    for q in reqs {
        let (k, b) = encoded(|c| c.send_request(1, &q, &[]).unwrap());
        v.push((true, k, b));
    }
    for r in [Response::Ok, Response::Pd { pd: 7 }] {
        let (k, b) = encoded(|c| c.send_response(1, &r, &[]).unwrap());
        v.push((false, k, b));
    }
    v
}

#[test]
fn garbage_control_frames_are_typed_errors() {
    let seeds = Seeds::from_env(0x50c_4e7, 3000);
    let samples = samples();
    let (mut ok, mut bad) = (0u64, 0u64);
    let failures = seeds.run("control frame", 3, |seed| {
        let mut rng = SimRng::new(seed);
        let (daemon_side, kind, body) = if rng.below(3) == 0 {
            let len = rng.below(120) as usize;
            (rng.below(2) == 0, rng.below(24) as u16, (0..len).map(|_| rng.next_u64() as u8).collect())
        } else {
            let (d, k, b) = &samples[rng.below(samples.len() as u64) as usize];
            let mut b = b.clone();
            for _ in 0..1 + rng.below(3) {
                match rng.below(4) {
                    0 if !b.is_empty() => {
                        let i = rng.below(b.len() as u64) as usize;
                        b[i] ^= 1 << rng.below(8);
                    }
                    1 if !b.is_empty() => {
                        let i = rng.below(b.len() as u64) as usize;
                        b[i] = [0, 0xff, 0x80, 1][rng.below(4) as usize];
                    }
                    2 => b.truncate(rng.below(b.len() as u64 + 1) as usize),
                    _ => b.extend((0..1 + rng.below(8)).map(|_| rng.next_u64() as u8)),
                }
            }
            (*d, *k, b)
        };
        let (a, b) = UnixStream::pair().unwrap();
        send_raw_frame(&a, PROTO_VERSION, kind, 0, &body).unwrap();
        // A good frame right behind the bad one: the connection still decodes it.
        let follow = Conn::new(a.try_clone().unwrap());
        if daemon_side {
            follow.send_request(2, &Request::AllocPd, &[]).unwrap();
        } else {
            follow.send_response(2, &Response::Ok, &[]).unwrap();
        }
        let mut conn = Conn::new(b);
        let (first, second) = if daemon_side {
            (conn.recv_request().map(|_| ()), conn.recv_request().map(|f| f.msg == Request::AllocPd))
        } else {
            (conn.recv_response().map(|_| ()), conn.recv_response().map(|f| f.msg == Response::Ok))
        };
        match first {
            Ok(()) => ok += 1,
            Err(e) if !e.to_string().is_empty() => bad += 1,
            Err(e) => return Err(format!("an empty error {e:?}")),
        }
        match second {
            Ok(true) => Ok(()),
            other => Err(format!("the frame after kind {kind} body {body:02x?} decoded as {other:?}")),
        }
    });
    eprintln!("control frames: {} frames, {ok} decoded, {bad} refused", seeds.iters);
    seeded::assert_none(&failures);
    if seeds.iters >= 1000 {
        assert!(ok > 0 && bad > seeds.iters / 4, "{ok} / {bad}");
    }
}
