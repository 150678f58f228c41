//! Session 9's audit of the appliance's hostile-input surfaces outside the engine (README "Threat model"): the
//! control socket (descriptors of the wrong kind, size or seals, descriptors on requests that take none, stalled
//! and truncated frames, objects destroyed while in use, one session's thousands of objects) and the client
//! library against a hostile or broken daemon (region headers whose offsets overflow, regions that are not sealed,
//! garbage in the completion ring, answers without their descriptor, a daemon that dies in the middle of a call).
//!
//! Expected values come from the protocol's documentation (`ctrl::proto`, `ctrl::abi`), the verbs semantics the
//! daemon mirrors (`ibv_dealloc_pd` / `ibv_destroy_cq` refuse with EBUSY while something uses the object) and the
//! rule that bad input gets one line and leaves the session and the daemon working. The daemon is
//! `ctrl::loopback` in this process; the hostile daemon is a thread speaking `ctrl::proto` on its own socket.

#![cfg(target_os = "linux")]

mod fake_daemon;

use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use roce_dp::client::{Device, Error, QpInit};
use roce_dp::ctrl::abi::{self, region_kind, RegionHeader, ABI_VERSION};
use roce_dp::ctrl::loopback::{LoopbackConfig, LoopbackDaemon};
use roce_dp::ctrl::proto::{Conn, ErrorCode, ModifyQp, Request, Response, PROTO_VERSION};
use roce_dp::ctrl::shm::{open_memfds, Backing, DaemonCqRegion, DaemonQpRegion, QpRegionCaps, ShmRegion};
use roce_dp::{AccessFlags, QpAttr, QpState};

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-dp-audit-ctrl-{}-{tag}.sock", std::process::id()))
}

fn daemon(tag: &str) -> LoopbackDaemon {
    LoopbackDaemon::start(LoopbackConfig::new(sock(tag))).expect("loopback daemon")
}

/// A session spoken request by request.
struct Raw {
    conn: Conn,
    seq: u32,
}

impl Raw {
    fn open(d: &LoopbackDaemon) -> Raw {
        let mut r = Raw { conn: Conn::new(UnixStream::connect(d.path()).unwrap()), seq: 0 };
        assert!(matches!(r.call(&Request::Hello { abi: ABI_VERSION }), Response::Hello(_)));
        r
    }

    fn call_fds(&mut self, q: &Request, fds: &[std::os::fd::BorrowedFd<'_>]) -> (Response, Vec<OwnedFd>) {
        self.seq += 1;
        self.conn.send_request(self.seq, q, fds).expect("send");
        let f = self.conn.recv_response().expect("the daemon answers");
        assert_eq!(f.seq, self.seq, "{q:?}");
        (f.msg, f.fds)
    }

    fn call(&mut self, q: &Request) -> Response {
        self.call_fds(q, &[]).0
    }

    fn pd(&mut self) -> u32 {
        match self.call(&Request::AllocPd) {
            Response::Pd { pd } => pd,
            r => panic!("AllocPd: {r:?}"),
        }
    }

    fn cq(&mut self, channel: Option<u32>) -> u32 {
        match self.call(&Request::CreateCq { depth: 8, channel }) {
            Response::Cq { cq } => cq,
            r => panic!("CreateCq: {r:?}"),
        }
    }

    fn qp(&mut self, pd: u32, cq: u32) -> Result<u32, Response> {
        let q = Request::CreateQp {
            pd,
            send_cq: cq,
            recv_cq: cq,
            sq_depth: 1,
            rq_depth: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 0,
        };
        match self.call(&q) {
            Response::Qp { qpn } => Ok(qpn),
            r => Err(r),
        }
    }

    fn stat(&mut self, name: &str) -> u64 {
        match self.call(&Request::Stats) {
            Response::Stats(v) => v.iter().find(|s| s.scope == "daemon" && s.name == name).map_or(0, |s| s.value),
            r => panic!("Stats: {r:?}"),
        }
    }
}

/// `code` and a message of one line.
#[track_caller]
fn refused(r: &Response, code: ErrorCode) -> String {
    match r {
        Response::Error { code: c, msg } if *c == code => {
            assert!(!msg.is_empty() && !msg.contains('\n'), "one line: {msg:?}");
            msg.clone()
        }
        r => panic!("expected {code:?}, got {r:?}"),
    }
}

fn memfd(name: &str, len: i64, seals: libc::c_int) -> OwnedFd {
    let c = std::ffi::CString::new(name).unwrap();
    // SAFETY: c is NUL-terminated; the descriptor is fresh and owned by nobody else.
    let fd = unsafe {
        let raw = libc::memfd_create(c.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING);
        assert!(raw >= 0, "memfd_create");
        OwnedFd::from_raw_fd(raw)
    };
    // SAFETY: plain system calls on our descriptor.
    unsafe {
        assert_eq!(libc::ftruncate(fd.as_raw_fd(), len), 0);
        if seals != 0 {
            assert_eq!(libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals), 0);
        }
    }
    fd
}

const SHRINK_GROW: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;

/// Waits up to 2 s for `f` to hold.
fn eventually(what: &str, mut f: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(2);
    while !f() {
        assert!(Instant::now() < until, "{what}: not within 2 s");
        std::thread::sleep(Duration::from_millis(5));
    }
}

// ------------------------------------------------------------------------------------------------ the daemon

/// `DeallocPd` documents "it must have no MRs or QPs", as `ibv_dealloc_pd` fails with EBUSY while a QP or MR is
/// associated with the PD: a PD whose QP still exists is Busy, and freeing it works once the QP is gone.
#[test]
fn a_pd_with_a_qp_cannot_be_deallocated() {
    let d = daemon("pdbusy");
    let mut s = Raw::open(&d);
    let pd = s.pd();
    let cq = s.cq(None);
    let qpn = s.qp(pd, cq).expect("QP");
    let msg = refused(&s.call(&Request::DeallocPd { pd }), ErrorCode::Busy);
    assert!(msg.contains(&pd.to_string()), "{msg}");
    // The QP still works on its PD.
    let init = QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() };
    assert_eq!(s.call(&Request::ModifyQp { qpn, m: ModifyQp { attr: init, ..ModifyQp::default() } }), Response::Ok);
    assert_eq!(s.stat("pds"), 1);
    assert_eq!(s.call(&Request::DestroyQp { qpn }), Response::QpDestroyed { send_tail: 0, recv_tail: 0 });
    assert_eq!(s.call(&Request::DeallocPd { pd }), Response::Ok);
    assert_eq!(s.stat("pds"), 0);
}

/// The same with two workers: the QP lives on a worker other than worker 0, which allocated the PD.
#[test]
fn a_pd_with_a_qp_on_another_worker_cannot_be_deallocated() {
    let d = LoopbackDaemon::start(LoopbackConfig { workers: 2, ..LoopbackConfig::new(sock("pdbusy2w")) }).unwrap();
    let mut s = Raw::open(&d);
    let pd = s.pd();
    let (c0, c1) = (s.cq(None), s.cq(None));
    // The first QP goes to worker 0 (fewest QPs, lowest index), the second to worker 1.
    let q0 = s.qp(pd, c0).unwrap();
    let q1 = s.qp(pd, c1).unwrap();
    assert_ne!(q0 >> 16, q1 >> 16, "QPs {q0:#x} and {q1:#x} on two workers");
    assert_eq!(s.call(&Request::DestroyQp { qpn: q0 }), Response::QpDestroyed { send_tail: 0, recv_tail: 0 });
    refused(&s.call(&Request::DeallocPd { pd }), ErrorCode::Busy);
    assert_eq!(s.call(&Request::DestroyQp { qpn: q1 }), Response::QpDestroyed { send_tail: 0, recv_tail: 0 });
    assert_eq!(s.call(&Request::DeallocPd { pd }), Response::Ok);
}

/// Objects in use are not destroyed (`ibv_destroy_cq` / `ibv_destroy_comp_channel` / `ibv_dealloc_pd` with an MR:
/// EBUSY); each refusal is one line and the session carries on.
#[test]
fn objects_in_use_are_busy_and_the_session_carries_on() {
    let d = daemon("inuse");
    let mut s = Raw::open(&d);
    let (Response::Channel { channel }, _end) = s.call_fds(&Request::CreateCompChannel, &[]) else { panic!("channel") };
    let pd = s.pd();
    let cq = s.cq(Some(channel));
    let qpn = s.qp(pd, cq).unwrap();
    refused(&s.call(&Request::DestroyCq { cq }), ErrorCode::Busy);
    refused(&s.call(&Request::DestroyCompChannel { channel }), ErrorCode::Busy);
    let fd = memfd("audit-inuse", 4096, SHRINK_GROW);
    let q = Request::RegMr { pd, va: 0x1000, len: 4096, offset: 0, access: AccessFlags::ALL.0 };
    let Response::Mr { lkey, .. } = s.call_fds(&q, &[fd.as_fd()]).0 else { panic!("RegMr") };
    assert_eq!(s.call(&Request::DestroyQp { qpn }), Response::QpDestroyed { send_tail: 0, recv_tail: 0 });
    refused(&s.call(&Request::DeallocPd { pd }), ErrorCode::Busy);
    assert_eq!(s.call(&Request::DeregMr { lkey }), Response::Ok);
    assert_eq!(s.call(&Request::DeallocPd { pd }), Response::Ok);
    assert_eq!(s.call(&Request::DestroyCq { cq }), Response::Ok);
    assert_eq!(s.call(&Request::DestroyCompChannel { channel }), Response::Ok);
    // Requests out of order: to RTS from RESET, a QP of nobody, Hello again.
    let (pd, cq) = (s.pd(), s.cq(None));
    let qpn = s.qp(pd, cq).unwrap();
    let rts = QpAttr { state: Some(QpState::Rts), sq_psn: Some(1), ..QpAttr::default() };
    refused(&s.call(&Request::ModifyQp { qpn, m: ModifyQp { attr: rts, ..ModifyQp::default() } }), ErrorCode::Invalid);
    refused(&s.call(&Request::QueryQp { qpn: qpn + 1 }), ErrorCode::NotFound);
    refused(&s.call(&Request::Hello { abi: ABI_VERSION }), ErrorCode::Protocol);
    assert!(matches!(s.call(&Request::QueryQp { qpn }), Response::QpInfo(_)));
}

/// `RegMr` takes exactly one memfd sealed against shrinking and growing (a shrink would SIGBUS the daemon) whose
/// size holds the window. Anything else is refused with one line naming the problem, the descriptor is closed
/// (no copy stays open in the daemon) and the session goes on.
#[test]
fn reg_mr_refuses_descriptors_of_the_wrong_kind_size_or_seals() {
    let d = daemon("regmr");
    let mut s = Raw::open(&d);
    let pd = s.pd();
    let reg = |len: u64, offset: u64| Request::RegMr { pd, va: 0x10000, len, offset, access: AccessFlags::ALL.0 };
    let n = |i: usize| format!("audit-regmr-{}-{i}", std::process::id());

    // No descriptor, and two of them.
    refused(&s.call(&reg(4096, 0)), ErrorCode::Protocol);
    let (a, b) = (memfd(&n(0), 4096, SHRINK_GROW), memfd(&n(1), 4096, SHRINK_GROW));
    refused(&s.call_fds(&reg(4096, 0), &[a.as_fd(), b.as_fd()]).0, ErrorCode::Protocol);
    drop((a, b));

    let (p0, p1) = UnixStream::pair().unwrap();
    let cases: Vec<(&str, OwnedFd, u64, u64)> = vec![
        ("unsealed memfd", memfd(&n(2), 4096, 0), 4096, 0),
        ("memfd sealed against shrinking only", memfd(&n(3), 4096, libc::F_SEAL_SHRINK), 4096, 0),
        ("write-sealed memfd", memfd(&n(4), 4096, SHRINK_GROW | libc::F_SEAL_WRITE), 4096, 0),
        ("future-write-sealed memfd", memfd(&n(5), 4096, SHRINK_GROW | libc::F_SEAL_FUTURE_WRITE), 4096, 0),
        ("empty sealed memfd", memfd(&n(6), 0, SHRINK_GROW), 1, 0),
        ("window past the end", memfd(&n(7), 4096, SHRINK_GROW), 4097, 0),
        ("offset past the end", memfd(&n(8), 4096, SHRINK_GROW), 1, 4096),
        ("offset + len overflowing", memfd(&n(9), 4096, SHRINK_GROW), 2, u64::MAX),
        ("len of 2^64 - 1", memfd(&n(10), 4096, SHRINK_GROW), u64::MAX, 0),
        ("a socket", OwnedFd::from(p0), 4096, 0),
        ("a regular file", OwnedFd::from(std::fs::File::open("/proc/self/exe").unwrap()), 4096, 0),
        ("a directory", OwnedFd::from(std::fs::File::open("/").unwrap()), 4096, 0),
    ];
    for (what, fd, len, offset) in cases {
        let r = s.call_fds(&reg(len, offset), &[fd.as_fd()]).0;
        let msg = refused(&r, ErrorCode::Invalid);
        assert!(msg.contains("memory registration"), "{what}: {msg}");
    }
    drop(p1);
    eventually("every refused memfd closed in the daemon", || (2..=10).all(|i| open_memfds(&n(i)) == 0));
    assert_eq!(s.stat("mrs"), 0);
    // A window whose client address range wraps past 2^64.
    let wrap = memfd(&n(12), 8192, SHRINK_GROW);
    let q = Request::RegMr { pd, va: u64::MAX - 100, len: 4096, offset: 0, access: AccessFlags::ALL.0 };
    refused(&s.call_fds(&q, &[wrap.as_fd()]).0, ErrorCode::Invalid);
    // The session still registers a good region.
    let good = memfd(&n(11), 8192, SHRINK_GROW);
    assert!(matches!(s.call_fds(&reg(4096, 4096), &[good.as_fd()]).0, Response::Mr { .. }));
    assert_eq!(s.stat("mrs"), 1);
}

/// A descriptor sent with a request that takes none is closed, not kept: nothing of it stays open in the daemon.
#[test]
fn descriptors_on_requests_that_take_none_are_closed() {
    let d = daemon("strayfd");
    let mut s = Raw::open(&d);
    let name = format!("audit-stray-{}", std::process::id());
    let fd = memfd(&name, 4096, SHRINK_GROW);
    for q in
        [Request::AllocPd, Request::Stats, Request::CreateCq { depth: 4, channel: None }, Request::QueryQp { qpn: 1 }]
    {
        let _ = s.call_fds(&q, &[fd.as_fd()]);
    }
    drop(fd);
    eventually("the stray descriptors closed", || open_memfds(&name) == 0);
    assert!(matches!(s.call(&Request::AllocPd), Response::Pd { .. }));
}

/// One session per thread: a client that sends half a frame and stalls delays nobody else; one that sends a
/// truncated frame and closes is reclaimed like any session that ends.
#[test]
fn a_stalled_or_truncated_frame_holds_up_no_other_session() {
    let d = daemon("stall");
    let mut staller = UnixStream::connect(d.path()).unwrap();
    staller.write_all(&[16, 0, 0, 0, PROTO_VERSION as u8, 0]).unwrap();
    let mut other = Raw::open(&d);
    let pd = other.pd();
    let cq = other.cq(None);
    other.qp(pd, cq).unwrap();

    // A session with objects that dies in the middle of a frame.
    let mut dying = Raw::open(&d);
    let pd = dying.pd();
    let cq = dying.cq(None);
    dying.qp(pd, cq).unwrap();
    assert_eq!(other.stat("qps"), 2);
    let mut raw = dying.conn.socket().try_clone().unwrap();
    raw.write_all(&[40, 0, 0, 0, PROTO_VERSION as u8, 0, 9, 0, 1, 2]).unwrap();
    drop(raw);
    drop(dying);
    eventually("the dead session's QP reclaimed", || other.stat("qps") == 1);
    assert_eq!(other.stat("pds"), 1);
    drop(staller);
    eventually("the staller's session gone", || d.sessions() == 1);
}

/// One session may not take what the daemon has (session 10: per-session quotas, `[daemon] session_max_*`):
/// running out is one line (`Exhausted`, naming the limit), never a panic; the other sessions still get their QPs;
/// and when the session ends everything it held is freed, no ring region of it left open in the daemon.
#[test]
fn thousands_of_objects_from_one_session_are_refused_cleanly_and_all_reclaimed() {
    let d = daemon("hog");
    let mut hog = Raw::open(&d);
    let pd = hog.pd();
    let cq = hog.cq(None);
    let mut qps = 0;
    let msg = loop {
        match hog.qp(pd, cq) {
            Ok(_) => qps += 1,
            Err(r) => break refused(&r, ErrorCode::Exhausted),
        }
        assert!(qps <= 100_000, "no limit on QPs");
    };
    assert!(msg.contains("queue pairs") && msg.contains("session_max_qps"), "{msg}");
    assert_eq!(qps, 256, "the default per-session limit");
    assert_eq!(hog.stat("qps"), qps);
    // Unbound CQs: each is a ring region in the daemon. (Other tests' daemons run in this process too: their few
    // regions are the slack below.)
    let regions = || {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t.to_str().is_some_and(|t| t.starts_with("/memfd:roce-dpd-cq-s")))
            .count()
    };
    let base = regions();
    let mut cqs = 1;
    loop {
        hog.seq += 1;
        let seq = hog.seq;
        hog.conn.send_request(seq, &Request::CreateCq { depth: 8, channel: None }, &[]).unwrap();
        match hog.conn.recv_response().unwrap().msg {
            Response::Cq { .. } => cqs += 1,
            r => {
                let msg = refused(&r, ErrorCode::Exhausted);
                assert!(msg.contains("session_max_cqs"), "{msg}");
                break;
            }
        }
        assert!(cqs <= 2000, "no limit on CQs");
    }
    assert_eq!(cqs, 512, "the default per-session limit");
    assert_eq!(hog.stat("cqs"), 512);
    let mut other = Raw::open(&d);
    let opd = other.pd();
    let ocq = other.cq(None);
    other.qp(opd, ocq).expect("another session still gets a QP while the hog is at its limit");
    drop(hog);
    eventually("the hog's objects reclaimed", || other.stat("qps") == 1);
    eventually("the hog's ring regions closed", || regions() <= base + 50);
    other.qp(opd, ocq).expect("a QP once the hog is gone");
}

// ------------------------------------------------------------------------------------------------ a hostile daemon

/// A daemon on `path` that answers `Hello` and then every request with what `answer` says (None: it closes the
/// connection without answering).
fn fake_daemon(
    tag: &str,
    mut answer: impl FnMut(&Request) -> Option<(Response, Vec<OwnedFd>)> + Send + 'static,
) -> (PathBuf, std::thread::JoinHandle<()>) {
    fake_daemon::scripted_daemon(sock(tag), move |q, seq, c| match answer(q) {
        Some((r, fds)) => {
            let b: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
            c.send_response(seq, &r, &b).is_ok()
        }
        None => false,
    })
}

/// A CQ region as an honest daemon makes it, with `edit` applied to its header.
fn cq_region(edit: impl FnOnce(&mut RegionHeader)) -> OwnedFd {
    let r = DaemonCqRegion::create("audit-fake-cq", 8, Backing::Pages).unwrap();
    let mut m = ShmRegion::map(r.fd().try_clone_to_owned().unwrap()).unwrap();
    let mut h = r.header;
    edit(&mut h);
    m.write(0, h).unwrap();
    r.fd().try_clone_to_owned().unwrap()
}

/// Region headers whose offsets and sizes overflow 64 bits are inconsistent headers (`AbiError::Geometry`), as
/// any other layout that does not fit the mapping: the check must not overflow (a panic in a debug build, and a
/// wrapped sum that passes for a layout inside the region in a release build).
#[test]
fn region_headers_with_overflowing_offsets_are_refused() {
    let cq = RegionHeader::cq(8).unwrap();
    let qp = RegionHeader::qp(8, 8, 4, 4, 64).unwrap();
    let len = cq.region_len.max(qp.region_len) as usize;
    let top = u64::MAX - 127; // 128-byte aligned, as a ring must be
    let mut bad: Vec<(&str, RegionHeader, u32)> = Vec::new();
    let mut h = cq;
    h.sq.offset = top;
    bad.push(("CQ ring at 2^64 - 128", h, region_kind::CQ));
    let mut h = cq;
    h.notify = top;
    bad.push(("notification block at 2^64 - 128", h, region_kind::CQ));
    let mut h = qp;
    h.rq.offset = top;
    bad.push(("receive ring at 2^64 - 128", h, region_kind::QP));
    let mut h = qp;
    h.sq_sges.offset = u64::MAX - 7;
    bad.push(("SGE table at 2^64 - 8", h, region_kind::QP));
    let mut h = qp;
    h.sq_inline.per_slot = u32::MAX;
    h.sq.capacity = 1 << 30;
    bad.push(("inline area of 2^30 x (2^32 - 1) bytes", h, region_kind::QP));
    let mut h = qp;
    h.rq_sges.per_slot = u32::MAX;
    h.rq.capacity = 1 << 30;
    bad.push(("SGE table of 2^30 x (2^32 - 1) SGEs", h, region_kind::QP));
    for (what, h, kind) in bad {
        let r = std::panic::catch_unwind(|| h.check(kind, len));
        assert!(matches!(r, Ok(Err(abi::AbiError::Geometry(_)))), "{what}: {:?}", r.map_err(|_| "the check panicked"));
    }
}

/// The client library against a daemon that sends a CQ region with an overflowing header, an unsealed region,
/// an answer without its region: an error naming the problem, never a panic; the library then destroys the CQ it
/// could not use.
#[test]
fn the_client_refuses_bad_regions_from_a_hostile_daemon() {
    let bad_header = cq_region(|h| h.sq.offset = u64::MAX - 127);
    let unsealed = memfd("audit-unsealed-cq", 8192, 0);
    let mut regions = vec![Some(bad_header), Some(unsealed), None].into_iter();
    let destroyed = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let seen = destroyed.clone();
    let (path, h) = fake_daemon("badregion", move |q| match q {
        Request::CreateCq { .. } => Some((Response::Cq { cq: 5 }, regions.next()?.into_iter().collect())),
        Request::DestroyCq { cq: 5 } => {
            seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            Some((Response::Ok, Vec::new()))
        }
        _ => Some((Response::Ok, Vec::new())),
    });
    let dev = Device::open(&path).unwrap();
    let e = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dev.create_cq(8).err())).expect("no panic");
    assert!(matches!(e, Some(Error::Shm(_))), "{e:?}");
    let e = dev.create_cq(8).err().unwrap();
    assert!(e.to_string().contains("not a memfd sealed"), "{e}");
    let e = dev.create_cq(8).err().unwrap();
    assert!(matches!(e, Error::Protocol(_)) && e.to_string().contains("without its region"), "{e}");
    assert_eq!(destroyed.load(std::sync::atomic::Ordering::Relaxed), 3, "each unusable CQ destroyed");
    drop(dev);
    h.join().unwrap();
    let _ = std::fs::remove_file(path);
}

/// Garbage in the completion ring (a CQE of an unknown status, then a tail claiming more entries than the ring
/// holds) is an error of `Cq::poll`, not a panic and not a bogus completion; a daemon that dies in the middle of a
/// call is `DaemonGone`.
#[test]
fn the_client_survives_garbage_completions_and_a_daemon_that_dies_mid_call() {
    let r = DaemonCqRegion::create("audit-garbage-cq", 8, Backing::Pages).unwrap();
    let mut ring = ShmRegion::map(r.fd().try_clone_to_owned().unwrap()).unwrap();
    let h = r.header;
    let fd = r.fd().try_clone_to_owned().unwrap();
    let mut fd = Some(fd);
    let (path, t) = fake_daemon("garbage", move |q| match q {
        Request::CreateCq { .. } => Some((Response::Cq { cq: 1 }, fd.take().into_iter().collect())),
        Request::AllocPd => None, // dies mid-call
        _ => Some((Response::Ok, Vec::new())),
    });
    let dev = Device::open(&path).unwrap();
    let mut cq = dev.create_cq(8).unwrap();
    let slot = h.sq.offset as usize + 256;
    let good = abi::Cqe { wr_id: 7, status: 0, opcode: abi::wc_opcode::SEND, qpn: 0x100, ..abi::Cqe::default() };
    ring.write(slot, good).unwrap();
    ring.write(slot + 32, abi::Cqe { status: 200, ..good }).unwrap();
    ring.write(h.sq.offset as usize + 128, 2u32).unwrap();
    let mut out = [roce_dp::Cqe::EMPTY; 4];
    assert_eq!(cq.poll(&mut out).unwrap(), 1, "the good CQE first");
    assert_eq!(out[0].wr_id, 7);
    let e = cq.poll(&mut out).unwrap_err();
    assert!(e.to_string().contains("status") && e.to_string().contains("200"), "{e}");
    ring.write(h.sq.offset as usize + 128, 2u32 + 9).unwrap();
    let e = cq.poll(&mut out).unwrap_err();
    assert!(e.to_string().contains("ring corrupted"), "{e}");
    let e = dev.alloc_pd().err().expect("the daemon died");
    assert!(matches!(e, Error::DaemonGone { .. }), "{e:?}");
    assert!(matches!(dev.create_cq(8), Err(Error::DaemonGone { .. })), "gone stays gone");
    drop(cq);
    drop(dev);
    t.join().unwrap();
    let _ = std::fs::remove_file(path);
}

/// QP regions of a hostile daemon: a header with its receive ring past the mapping or overlapping the send ring
/// is refused by `create_qp`, with one line.
#[test]
fn the_client_refuses_a_qp_region_whose_rings_do_not_fit() {
    let caps = QpRegionCaps { sq_depth: 8, rq_depth: 8, max_send_sge: 2, max_recv_sge: 2, max_inline: 0 };
    let qp_region = |edit: &dyn Fn(&mut RegionHeader)| {
        let r = DaemonQpRegion::create("audit-fake-qp", caps, Backing::Pages).unwrap();
        let mut m = ShmRegion::map(r.fd().try_clone_to_owned().unwrap()).unwrap();
        let mut h = r.header;
        edit(&mut h);
        m.write(0, h).unwrap();
        r.fd().try_clone_to_owned().unwrap()
    };
    let mut regions = vec![
        qp_region(&|h| h.rq.offset = h.sq.offset),
        qp_region(&|h| h.rq.offset = u64::MAX - 127),
        qp_region(&|h| h.region_len = u64::MAX),
    ]
    .into_iter();
    let cqs = std::iter::repeat_with(|| DaemonCqRegion::create("audit-fake-cq2", 8, Backing::Pages).unwrap());
    let mut cqs = cqs.take(2).collect::<Vec<_>>().into_iter();
    let (path, t) = fake_daemon("badqp", move |q| match q {
        Request::CreateCq { .. } => {
            Some((Response::Cq { cq: 1 }, vec![cqs.next()?.fd().try_clone_to_owned().unwrap()]))
        }
        Request::AllocPd => Some((Response::Pd { pd: 1 }, Vec::new())),
        Request::CreateQp { .. } => Some((Response::Qp { qpn: 0x100 }, vec![regions.next()?])),
        _ => Some((Response::Ok, Vec::new())),
    });
    let dev = Device::open(&path).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    let init = QpInit { sq_depth: 8, rq_depth: 8, max_send_sge: 2, max_recv_sge: 2, max_inline: 0 };
    for what in ["overlapping rings", "ring at 2^64 - 128", "region_len of 2^64 - 1"] {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dev.create_qp(&pd, &cq, &cq, init)));
        let e = r.unwrap_or_else(|_| panic!("{what}: panicked")).err().unwrap_or_else(|| panic!("{what}: accepted"));
        assert!(!e.to_string().contains('\n'), "{what}: {e}");
        assert!(matches!(e, Error::Shm(_)), "{what}: {e:?}");
    }
    drop((cq, pd, dev));
    t.join().unwrap();
    let _ = std::fs::remove_file(path);
}

/// A client that sends requests and never reads the answers fills its socket: its session thread then blocks
/// writing an answer. That may stall its own session only; the daemon's shutdown (SIGTERM) must still end
/// promptly, telling the other sessions why, not wait forever for the stuck writer.
#[test]
fn a_client_that_never_reads_cannot_hang_the_shutdown() {
    let mut d = daemon("noread");
    let mut good = Raw::open(&d);
    good.pd();
    let mut deaf = Raw::open(&d);
    deaf.pd();
    let sock = deaf.conn.socket().try_clone().unwrap();
    // Stats answers are kilobytes each: a few hundred unread fill the socket's buffers.
    let writer = std::thread::spawn(move || {
        let c = Conn::new(sock);
        for seq in 100..2100 {
            if c.send_request(seq, &Request::Stats, &[]).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(500));
    let (tx, rx) = std::sync::mpsc::channel();
    let stopper = std::thread::spawn(move || {
        d.shutdown("test over");
        let _ = tx.send(());
    });
    assert!(rx.recv_timeout(Duration::from_secs(10)).is_ok(), "the shutdown hung on a client that never reads");
    stopper.join().unwrap();
    // The well-behaved session was told why.
    match good.conn.recv_response() {
        Ok(f) => assert!(matches!(f.msg, Response::Shutdown { .. }), "{:?}", f.msg),
        Err(e) => panic!("no shutdown notice: {e}"),
    }
    drop(deaf);
    let _ = writer.join();
}

/// A peer MAC given in `ModifyQp` is the next hop of a unicast RC connection: a broadcast, multicast or all-zero
/// address (which the neighbour table never learns either) is refused with one line, so a client cannot make
/// the daemon send its QP's frames to every host of the segment; a unicast one is taken.
#[test]
fn a_multicast_or_zero_peer_mac_is_refused() {
    let d = daemon("mcastmac");
    let mut s = Raw::open(&d);
    let (pd, cq) = (s.pd(), s.cq(None));
    let qpn = s.qp(pd, cq).unwrap();
    let init = QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() };
    assert_eq!(s.call(&Request::ModifyQp { qpn, m: ModifyQp { attr: init, ..ModifyQp::default() } }), Response::Ok);
    let rtr = QpAttr {
        state: Some(QpState::Rtr),
        path_mtu: Some(1024),
        dest_qpn: Some(0x123),
        rq_psn: Some(0),
        max_dest_rd_atomic: Some(1),
        min_rnr_timer: Some(1),
        ..QpAttr::default()
    };
    let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 9];
    for mac in [[0xff; 6], [0x01, 0x00, 0x5e, 0, 0, 1], [0x33, 0x33, 0, 0, 0, 1], [0; 6]] {
        let m = ModifyQp { attr: rtr, gid: Some(gid), mac: Some(mac) };
        let msg = refused(&s.call(&Request::ModifyQp { qpn, m }), ErrorCode::Invalid);
        assert!(msg.contains("MAC"), "{mac:02x?}: {msg}");
    }
    match s.call(&Request::QueryQp { qpn }) {
        Response::QpInfo(i) => assert_eq!(i.state, QpState::Init, "refused modifies left the QP in INIT"),
        r => panic!("{r:?}"),
    }
    let m = ModifyQp { attr: rtr, gid: Some(gid), mac: Some([2, 0, 0, 0, 0, 9]) };
    assert_eq!(s.call(&Request::ModifyQp { qpn, m }), Response::Ok);
}

// ============================================================================ session 10: RegMr of a huge sparse memfd

/// This process's virtual size (`VmSize` in /proc/self/status), in bytes.
fn vm_size() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("VmSize:")).expect("VmSize");
    l.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

/// A client may pass a memfd far larger than the window it registers (sparse: it costs the client nothing). The
/// daemon maps only the window's pages: registering 4 KiB at the end of a 16 TiB memfd must not cost the daemon
/// 16 TiB of its 128 TiB address space (eight such registrations took all of it, after which the daemon's own
/// allocations failed). The daemon here is the loopback one in this process, so this process's VmSize is its.
/// The memfd's seals still hold (no shrink under the mapping: SIGBUS) and a window past the end is still refused.
#[test]
fn a_small_window_of_a_huge_sparse_memfd_maps_only_its_pages() {
    let d = daemon("sparse");
    let mut s = Raw::open(&d);
    let pd = s.pd();
    const HUGE: u64 = 16 << 40;
    let fd = memfd(&format!("audit-sparse-{}", std::process::id()), HUGE as i64, SHRINK_GROW);
    let before = vm_size();
    let q = Request::RegMr { pd, va: 0x10000, len: 4096, offset: HUGE - 6000, access: AccessFlags::ALL.0 };
    let r = s.call_fds(&q, &[fd.as_fd()]).0;
    assert!(matches!(r, Response::Mr { .. }), "{r:?}");
    let grew = vm_size().saturating_sub(before);
    assert!(grew < 1 << 30, "registering 4 KiB of a 16 TiB memfd grew the daemon by {grew} bytes");
    // The client cannot shrink the memfd under the daemon's mapping.
    // SAFETY: plain system call on our descriptor.
    assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, -1);
    // Past the end: refused, naming the memfd's size.
    let q = Request::RegMr { pd, va: 0x10000, len: 4096, offset: HUGE - 100, access: AccessFlags::ALL.0 };
    let msg = refused(&s.call_fds(&q, &[fd.as_fd()]).0, ErrorCode::Invalid);
    assert!(msg.contains(&format!("{HUGE}-byte buffer")), "{msg}");
    assert_eq!(s.stat("mrs"), 1);
}

// ============================================================================ session 10: statistics in pages

/// roce-stat's `Stats` must never fail for size: a daemon's records beyond one frame (8 MiB: ~5 000 QPs, six
/// loaded workers) come in pages of one snapshot. Shown on a small daemon whose page is 1 KiB: the client library
/// reads every page (the same records, each once, as the daemon's own single-frame answer has); a session that
/// makes a QP between two pages does not change the snapshot it is reading; a StatsFrom without a snapshot, or
/// past its end, is one line. Before, a list too large for one frame was sent anyway and the client refused it as
/// "frame length out of range", so roce-stat could not read a busy daemon at all.
#[test]
fn statistics_beyond_one_frame_come_in_pages_of_one_snapshot() {
    let mut cfg = LoopbackConfig::new(sock("pages"));
    cfg.stats_page_bytes = 1024;
    let d = LoopbackDaemon::start(cfg).expect("loopback daemon");
    let p = roce_dp::ctrl::loopback::LoopPair::open(d.path(), 1 << 16, 16, 1024).expect("a QP pair");
    let recs = p.dev.stats().expect("paged statistics");
    let keys: std::collections::BTreeSet<(String, u32, String)> =
        recs.iter().map(|r| (r.scope.clone(), r.id, r.name.clone())).collect();
    assert_eq!(keys.len(), recs.len(), "a record came twice");
    for qp in [p.a.qpn(), p.b.qpn()] {
        let state = recs.iter().find(|r| r.scope == "qp" && r.id == qp && r.name == "state");
        assert_eq!(state.map(|r| r.value), Some(QpState::Rts as u64), "QP {qp:#x}");
    }
    assert!(recs.iter().any(|r| r.scope == "daemon" && r.name == "workers" && r.value == 1));

    // By hand: the first page, a QP made meanwhile, the rest of the same snapshot.
    let mut s = Raw::open(&d);
    let Response::StatsPage { total, recs: first } = s.call(&Request::Stats) else { panic!("not paged") };
    assert!(!first.is_empty() && first.len() < total as usize, "{} of {total}", first.len());
    let pd = s.pd();
    let cq = s.cq(None);
    s.qp(pd, cq).expect("a QP between two pages");
    let mut all = first;
    while all.len() < total as usize {
        match s.call(&Request::StatsFrom { first: all.len() as u32 }) {
            Response::StatsPage { total: t, recs } if t == total && !recs.is_empty() => all.extend(recs),
            r => panic!("StatsFrom {}: {r:?}", all.len()),
        }
    }
    assert_eq!(all.len(), total as usize);
    let qps =
        |v: &[roce_dp::ctrl::proto::StatRecord]| v.iter().filter(|r| r.scope == "qp" && r.name == "state").count();
    assert_eq!(qps(&all), 2, "the snapshot changed while it was read");
    // The snapshot is gone once read; asking on, or past its end, is one line.
    let msg = refused(&s.call(&Request::StatsFrom { first: 1 }), ErrorCode::Invalid);
    assert!(msg.contains("send Stats first"), "{msg}");
    let Response::StatsPage { total, .. } = s.call(&Request::Stats) else { panic!("not paged") };
    refused(&s.call(&Request::StatsFrom { first: total }), ErrorCode::Invalid);
    // The next reading sees the new QP.
    assert_eq!(qps(&p.dev.stats().unwrap()), 3);
}

/// The client library against a hostile daemon's statistics pages: a total beyond any daemon's (which would make
/// it gather records without bound, one page at a time), a page that does not move on, a total that changes, and a
/// page longer than what is left are each one Protocol error, never a hang or an unbounded allocation.
#[test]
fn the_client_refuses_statistics_pages_that_do_not_add_up() {
    use roce_dp::ctrl::proto::StatRecord;
    let rec = |i: u32| StatRecord { scope: "qp".into(), id: i, name: "state".into(), value: 3 };
    let cases: Vec<(&str, Vec<Response>)> = vec![
        ("a total of 2^32 - 1", vec![Response::StatsPage { total: u32::MAX, recs: vec![rec(0)] }]),
        ("an empty first page", vec![Response::StatsPage { total: 2, recs: vec![] }]),
        (
            "an empty later page",
            vec![Response::StatsPage { total: 2, recs: vec![rec(0)] }, Response::StatsPage { total: 2, recs: vec![] }],
        ),
        (
            "a total that changes",
            vec![
                Response::StatsPage { total: 2, recs: vec![rec(0)] },
                Response::StatsPage { total: 3, recs: vec![rec(1)] },
            ],
        ),
        (
            "a page past the total",
            vec![
                Response::StatsPage { total: 2, recs: vec![rec(0)] },
                Response::StatsPage { total: 2, recs: vec![rec(1), rec(2)] },
            ],
        ),
        (
            "a whole list for a later page",
            vec![Response::StatsPage { total: 2, recs: vec![rec(0)] }, Response::Stats(vec![rec(1)])],
        ),
    ];
    for (i, (what, answers)) in cases.into_iter().enumerate() {
        let mut answers = answers.into_iter();
        let (path, h) = fake_daemon(&format!("pages-{i}"), move |q| match q {
            Request::Stats | Request::StatsFrom { .. } => answers.next().map(|r| (r, vec![])),
            _ => None,
        });
        let dev = Device::open(&path).expect("the fake daemon's Hello");
        match dev.stats() {
            Err(Error::Protocol(m)) => assert!(!m.contains('\n') && m.contains("Stats"), "{what}: {m}"),
            r => panic!("{what}: {:?}", r.map(|v| v.len())),
        }
        drop(dev);
        h.join().unwrap();
    }
    // An honest two-page answer is taken whole.
    let mut answers = vec![
        Response::StatsPage { total: 2, recs: vec![rec(0)] },
        Response::StatsPage { total: 2, recs: vec![rec(1)] },
    ]
    .into_iter();
    let (path, h) = fake_daemon("pages-ok", move |q| match q {
        Request::Stats | Request::StatsFrom { .. } => answers.next().map(|r| (r, vec![])),
        _ => None,
    });
    let dev = Device::open(&path).unwrap();
    assert_eq!(dev.stats().unwrap(), vec![rec(0), rec(1)]);
    drop(dev);
    h.join().unwrap();
}

/// Session 13: the rest of a frame that a signal cut short goes by `write_all` on the UnixStream (not `sendmsg`
/// with MSG_NOSIGNAL as the frame's start): a peer gone meanwhile must still be an error, never a SIGPIPE that
/// kills an application running with SIGPIPE's default action (listed as a risk in session 12; measured: no
/// signal, EPIPE; this pins the outcome). In a child (the default action set there): a ~1 MiB frame to a peer that reads nothing, SIGUSR1 (a
/// handler without SA_RESTART) cuts the send short, the peer shuts its reading side and drains: EPIPE, no signal.
#[test]
fn a_frame_cut_short_by_a_signal_to_a_peer_that_went_fails_without_sigpipe() {
    use std::os::unix::process::ExitStatusExt;
    if std::env::var_os("RDP_SIGPIPE_CHILD").is_none() {
        let test = "a_frame_cut_short_by_a_signal_to_a_peer_that_went_fails_without_sigpipe";
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", test, "--test-threads", "1", "--nocapture"])
            .env("RDP_SIGPIPE_CHILD", "1")
            .output()
            .unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.signal(), None, "the child died of a signal: {said}");
        assert!(out.status.success() && said.contains("send failed: control socket"), "{:?} {said}", out.status);
        return;
    }
    extern "C" fn nothing(_: libc::c_int) {}
    // SAFETY: libc calls on this test process's own signal dispositions; the handler does nothing.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as extern "C" fn(libc::c_int) as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        sa.sa_flags = 0; // no SA_RESTART: the blocked send returns what it sent so far
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    let (a, b) = UnixStream::pair().unwrap();
    // SAFETY: this thread's id, signalled by the helper thread while this thread blocks in the send.
    let me = unsafe { libc::pthread_self() };
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: `me` is the test's thread, alive (blocked in the send) until this thread is joined.
        unsafe { libc::pthread_kill(me, libc::SIGUSR1) };
        std::thread::sleep(Duration::from_millis(300));
        // The peer stops reading for good, then drains what is queued (a close with unread data would reset the
        // connection instead: ECONNRESET, no SIGPIPE): the sender, woken by the room, finds the peer shut: EPIPE.
        let mut b = b;
        b.shutdown(std::net::Shutdown::Read).unwrap();
        b.set_read_timeout(Some(Duration::from_millis(100))).unwrap();
        let mut buf = vec![0u8; 1 << 16];
        while matches!(std::io::Read::read(&mut b, &mut buf), Ok(n) if n > 0) {}
        std::thread::sleep(Duration::from_millis(100));
        drop(b);
    });
    let recs: Vec<roce_dp::ctrl::proto::StatRecord> = (0..40_000u32)
        .map(|i| roce_dp::ctrl::proto::StatRecord {
            scope: "qp".into(),
            id: i,
            name: "a_counter".into(),
            value: u64::from(i),
        })
        .collect();
    let r = Conn::new(a).send_response(1, &Response::Stats(recs), &[]);
    t.join().unwrap();
    match r {
        Err(e) => println!("send failed: {e}"),
        Ok(()) => panic!("a send to a peer that closed succeeded"),
    }
}
