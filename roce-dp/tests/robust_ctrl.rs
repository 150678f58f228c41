//! Session 9: what users of a networking tool expect of the appliance when the daemon misbehaves or a client asks
//! for too much. The client library against a daemon that accepts and never answers, answers half a frame or
//! answers slowly while signals interrupt the wait (bounded control calls, `Error::Timeout` naming the socket and
//! the request, EINTR retried, a non-blocking alive check); per-session quotas of the daemon.
//!
//! The fake daemons are threads on Unix sockets in the temp directory; every wait of a test is bounded by a
//! channel's `recv_timeout`, so code that hangs fails the test instead of hanging the suite.

#![cfg(target_os = "linux")]

mod fake_daemon;

use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use roce_dp::client::{Device, Error, DEFAULT_CALL_TIMEOUT};
use roce_dp::ctrl::proto::{Conn, Request, Response};
use roce_dp::ctrl::shm::{Backing, DaemonCqRegion};

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-dp-robust-{}-{tag}.sock", std::process::id()))
}

/// Runs `f` on a thread and returns its result, or panics naming `what` if it takes longer than `limit` (a hang
/// of the code under test becomes a failure; the stuck thread is left behind).
fn within<T: Send + 'static>(what: &str, limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit).unwrap_or_else(|_| panic!("{what}: still waiting after {limit:?} (a hang)"))
}

/// A "daemon" that accepts connections and never reads or answers, until the returned sender is dropped.
fn silent_daemon(tag: &str) -> (PathBuf, mpsc::Sender<()>) {
    let path = sock(tag);
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path).unwrap();
    let (tx, rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        l.set_nonblocking(true).unwrap();
        loop {
            if let Ok((s, _)) = l.accept() {
                held.push(s);
            }
            if !matches!(rx.recv_timeout(Duration::from_millis(5)), Err(mpsc::RecvTimeoutError::Timeout)) {
                return;
            }
        }
    });
    (path, tx)
}

/// A daemon that opens the session, then answers each request with what `answer` does on the raw socket.
fn scripted_daemon(
    tag: &str,
    answer: impl FnMut(&Request, u32, &mut Conn) -> bool + Send + 'static,
) -> (PathBuf, std::thread::JoinHandle<()>) {
    fake_daemon::scripted_daemon(sock(tag), answer)
}

/// A daemon that accepts and never answers: `Device::open` fails within the call timeout with one line naming the
/// socket and the request it waited for, instead of hanging; the default timeout is 10 s.
#[test]
fn open_on_a_daemon_that_never_answers_times_out_with_one_line() {
    assert_eq!(DEFAULT_CALL_TIMEOUT, Duration::from_secs(10));
    let (path, stop) = silent_daemon("silent");
    let p = path.clone();
    let t0 = Instant::now();
    let r = within("Device::open on a silent daemon", Duration::from_secs(8), move || {
        Device::open_with_timeout(&p, Duration::from_millis(300)).map(|_| ())
    });
    let took = t0.elapsed();
    let e = r.expect_err("no answer, no device");
    assert!(matches!(e, Error::Timeout { request: "Hello", .. }), "{e:?}");
    assert!(took >= Duration::from_millis(300), "waited the timeout ({took:?})");
    let msg = e.to_string();
    assert!(msg.contains(&path.display().to_string()) && msg.contains("Hello") && msg.contains("0.3 s"), "{msg}");
    assert!(!msg.contains('\n'), "one line: {msg}");
    drop(stop);
    let _ = std::fs::remove_file(path);
}

/// Half a frame from a broken daemon: the call that waited for it times out, and `Cq::poll`'s alive check (which
/// looks at the socket after many empty polls) does not block on the missing rest; the session stays usable, and
/// when the rest of that answer and then the next one arrive, the late answer is discarded by its sequence number.
#[test]
fn half_a_frame_times_out_the_call_and_never_blocks_the_poll() {
    let cq = DaemonCqRegion::create("robust-cq", 8, Backing::Pages).unwrap();
    let mut cq_fd = Some(cq.fd().try_clone_to_owned().unwrap());
    let (go_on_tx, go_on_rx) = mpsc::channel::<()>();
    let mut late = false;
    let (path, h) = scripted_daemon("half", move |q, seq, c| {
        match q {
            Request::CreateCq { .. } => {
                let fds: Vec<OwnedFd> = cq_fd.take().into_iter().collect();
                let b: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
                c.send_response(seq, &Response::Cq { cq: 1 }, &b).unwrap();
            }
            Request::AllocPd if late => c.send_response(seq, &Response::Pd { pd: 8 }, &[]).unwrap(),
            Request::AllocPd => {
                late = true;
                // A whole `Pd` answer, serialised by a real Conn, sent in two halves with a pause between.
                let (a, mut b) = UnixStream::pair().unwrap();
                Conn::new(a).send_response(seq, &Response::Pd { pd: 7 }, &[]).unwrap();
                b.set_nonblocking(true).unwrap();
                let mut frame = vec![0u8; 64];
                let n = std::io::Read::read(&mut b, &mut frame).unwrap();
                let mut s = c.socket();
                s.write_all(&frame[..n / 2]).unwrap();
                if go_on_rx.recv().is_err() {
                    return false;
                }
                s.write_all(&frame[n / 2..n]).unwrap();
            }
            _ => c.send_response(seq, &Response::Ok, &[]).unwrap(),
        }
        true
    });
    let dev = Device::open_with_timeout(&path, Duration::from_millis(200)).unwrap();
    assert_eq!(dev.call_timeout(), Duration::from_millis(200));
    let mut cq = dev.create_cq(8).unwrap();
    let d = dev.clone();
    let e = within("alloc_pd on half an answer", Duration::from_secs(8), move || d.alloc_pd().err())
        .expect("half an answer is no answer");
    assert!(matches!(e, Error::Timeout { request: "AllocPd", .. }), "{e:?}");
    // Many empty polls: the alive check looks at the socket, finds half a frame, and returns.
    let polled = within("Cq::poll with half a frame on the socket", Duration::from_secs(8), move || {
        let mut wc = [roce_dp::Cqe::EMPTY; 4];
        for _ in 0..100_000 {
            assert_eq!(cq.poll(&mut wc).unwrap(), 0);
        }
        cq
    });
    // The rest of the late answer comes; the next call skips it and gets its own.
    go_on_tx.send(()).unwrap();
    dev.set_call_timeout(Duration::from_secs(5));
    let pd = dev.alloc_pd().expect("the session carries on after a timeout");
    assert_eq!(pd.handle(), 8, "its own answer, not the late one (7)");
    drop(pd);
    drop(polled);
    drop(dev);
    h.join().unwrap();
    let _ = std::fs::remove_file(path);
}

/// Bytes the peer of `s` has not read yet (`SIOCOUTQ` on the sending end).
fn unread(s: &UnixStream) -> i32 {
    let mut n: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer, which points at `n`.
    assert_eq!(unsafe { libc::ioctl(std::os::fd::AsRawFd::as_raw_fd(s), libc::TIOCOUTQ, &mut n) }, 0);
    n
}

/// A daemon whose socket holds a flood of answers to other requests (sequence numbers the library never sent),
/// more than a call can read within its timeout (1 ms; the socket filled before the call): the call ends with
/// `Error::Timeout` at its timeout, naming the request, with answers still unread, instead of reading them for as
/// long as the daemon has more to send (it returned only once the socket was empty, whatever its deadline). The
/// session carries on: the next call reads past the rest of the flood and gets its own answer.
#[test]
fn a_flood_of_answers_to_other_requests_times_out_the_call() {
    let (go_tx, go_rx) = mpsc::channel::<()>();
    let (unread_tx, unread_rx) = mpsc::channel::<i32>();
    let mut first = true;
    let (path, h) = scripted_daemon("flood", move |q, seq, c| {
        match q {
            Request::AllocPd if first => {
                first = false;
                c.send_response(seq, &Response::Pd { pd: 7 }, &[]).unwrap();
                // Answers to other requests, serialised by a real Conn, until the socket takes no more (as root,
                // a send buffer of 4 MiB: ~100 000 of them).
                let (a, mut b) = UnixStream::pair().unwrap();
                let w = Conn::new(a);
                let mut blob = Vec::new();
                for k in 0..2000u32 {
                    w.send_response(seq.wrapping_add(1000 + k), &Response::Pd { pd: 3 }, &[]).unwrap();
                    let mut frame = [0u8; 256];
                    let n = std::io::Read::read(&mut b, &mut frame).unwrap();
                    blob.extend_from_slice(&frame[..n]);
                }
                let mut s = c.socket();
                let big: libc::c_int = 4 << 20;
                let fd = std::os::fd::AsRawFd::as_raw_fd(s);
                let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
                // SAFETY: setsockopt reads one int from `big`; a refusal (not root) leaves the default size.
                unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, (&raw const big).cast(), size) };
                s.set_nonblocking(true).unwrap();
                let mut at = 0;
                'fill: for _ in 0..1000 {
                    at = 0;
                    while at < blob.len() {
                        match s.write(&blob[at..]) {
                            Ok(n) => at += n,
                            Err(_) => break 'fill,
                        }
                    }
                }
                s.set_nonblocking(false).unwrap();
                unread_tx.send(unread(s)).unwrap();
                // The test's call has returned: how much of the flood it left unread.
                if go_rx.recv().is_err() {
                    return false;
                }
                unread_tx.send(unread(s)).unwrap();
                // The rest of the last copy (whole answers: the next call reads past them).
                if s.write_all(&blob[at..]).is_err() {
                    return false;
                }
            }
            Request::AllocPd => c.send_response(seq, &Response::Pd { pd: 8 }, &[]).unwrap(),
            _ => c.send_response(seq, &Response::Ok, &[]).unwrap(),
        }
        true
    });
    let dev = Device::open_with_timeout(&path, Duration::from_secs(5)).unwrap();
    let first = dev.alloc_pd().unwrap();
    assert_eq!(first.handle(), 7);
    let queued = unread_rx.recv_timeout(Duration::from_secs(10)).expect("the daemon filled its socket");
    assert!(queued > 100_000, "{queued} bytes of answers queued");
    dev.set_call_timeout(Duration::from_millis(1));
    let d = dev.clone();
    let e = within("alloc_pd behind a flood of other answers", Duration::from_secs(20), move || d.alloc_pd().err())
        .expect("no answer of its own, no PD");
    assert!(matches!(e, Error::Timeout { request: "AllocPd", .. }), "{e:?}");
    go_tx.send(()).unwrap();
    let left = unread_rx.recv_timeout(Duration::from_secs(10)).expect("the daemon measured its socket");
    assert!(left > 0, "the call returned only once it had read every answer the daemon sent");
    dev.set_call_timeout(Duration::from_secs(20));
    let pd = dev.alloc_pd().expect("the session carries on after the flood");
    assert_eq!(pd.handle(), 8, "its own answer, not one of the flood's");
    drop((pd, first));
    drop(dev);
    h.join().unwrap();
    let _ = std::fs::remove_file(path);
}

extern "C" fn on_sigusr2(_: libc::c_int) {}

/// An application whose signal handlers are installed without SA_RESTART: a signal during a control call's wait
/// interrupts the system call (EINTR), which the library retries; the call gets its answer instead of a
/// permanent `DaemonGone`.
#[test]
fn a_signal_during_a_control_call_is_not_a_dead_daemon() {
    // SAFETY: a plain handler that does nothing, installed without SA_RESTART; only the thread below gets the signal.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigusr2 as *const () as usize;
        sa.sa_flags = 0;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGUSR2, &sa, std::ptr::null_mut()), 0);
    }
    let (path, h) = scripted_daemon("eintr", |q, seq, c| {
        std::thread::sleep(Duration::from_millis(400));
        let r = match q {
            Request::AllocPd => Response::Pd { pd: 3 },
            _ => Response::Ok,
        };
        c.send_response(seq, &r, &[]).is_ok()
    });
    let dev = Device::open(&path).unwrap();
    let (tid_tx, tid_rx) = mpsc::channel();
    let caller = std::thread::spawn(move || {
        // SAFETY: pthread_self has no preconditions.
        tid_tx.send(unsafe { libc::pthread_self() }).unwrap();
        let pd = dev.alloc_pd();
        pd.map(|p| p.handle())
    });
    let tid = tid_rx.recv().unwrap();
    for _ in 0..20 {
        std::thread::sleep(Duration::from_millis(10));
        // SAFETY: the thread is alive until it returns its result, which only comes after the daemon's 400 ms.
        unsafe { libc::pthread_kill(tid, libc::SIGUSR2) };
    }
    let r = caller.join().unwrap();
    assert_eq!(r.map_err(|e| e.to_string()), Ok(3), "the signals were retried");
    h.join().unwrap();
    let _ = std::fs::remove_file(path);
}

// ------------------------------------------------------------------------------------------------ the daemon

fn loopback(tag: &str) -> roce_dp::ctrl::loopback::LoopbackDaemon {
    let cfg = roce_dp::ctrl::loopback::LoopbackConfig::new(sock(tag));
    roce_dp::ctrl::loopback::LoopbackDaemon::start(cfg).expect("loopback daemon")
}

fn daemon_stat(dev: &Device, name: &str) -> u64 {
    let v = dev.stats().unwrap();
    v.iter().find(|s| s.scope == "daemon" && s.name == name).map_or(0, |s| s.value)
}

/// Every posted WR gets a completion: a WQE the daemon refuses (here: posted on a QP in RESET, which the engine
/// refuses as `ibv_post_send` does) completes with LOC_QP_OP_ERR even when its CQ's ring is full at that moment.
/// The refusal is held like the engine's completions and delivered when the client has polled room; it was
/// dropped (counted in `cqes_dropped`), and that wr_id never completed.
#[test]
fn a_refused_wqe_completes_even_when_its_cq_ring_is_full() {
    use roce_dp::client::QpInit;
    use roce_dp::{SendWr, WcStatus, WrOpcode};
    let d = loopback("refusal-held");
    let dev = Device::open(d.path()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mut cq = dev.create_cq(16).unwrap();
    let n = 24u64; // the ring holds 16
    let mut qps = Vec::new();
    for k in 0..n {
        let mut qp = dev.create_qp(&pd, &cq, &cq, QpInit::default()).unwrap();
        qp.post_send(&SendWr::new(k, WrOpcode::Send), &[]).unwrap();
        qps.push(qp);
    }
    let t0 = Instant::now();
    while daemon_stat(&dev, "wqes_refused") < n {
        assert!(t0.elapsed() < Duration::from_secs(10), "the daemon refuses the {n} WQEs");
        std::thread::sleep(Duration::from_millis(5));
    }
    let mut got = Vec::new();
    let mut wc = [roce_dp::Cqe::EMPTY; 4];
    while (got.len() as u64) < n && t0.elapsed() < Duration::from_secs(10) {
        let k = cq.poll(&mut wc).unwrap();
        for c in &wc[..k] {
            assert_eq!(c.status, WcStatus::LocQpOpErr, "{c:?}");
            got.push(c.wr_id);
        }
    }
    got.sort_unstable();
    assert_eq!(got, (0..n).collect::<Vec<_>>(), "every refused WR completed");
    assert_eq!(daemon_stat(&dev, "cqes_dropped"), 0);
    assert!(daemon_stat(&dev, "cqes_held") >= n - 16);
    drop(qps);
}

/// Per-session quotas (`[daemon] session_max_*`): past its limit a session gets one line naming the limit and the
/// config key (`ErrorCode::Exhausted`, as verbs' ENOMEM past a device's `max_*`); destroying an object gives its
/// room back; another session has its own room.
#[test]
fn each_session_has_its_own_limits_of_pds_mrs_cqs_qps_and_channels() {
    use roce_dp::client::{ErrorCode, QpInit};
    use roce_dp::ctrl::SessionLimits;
    use roce_dp::AccessFlags;
    let mut cfg = roce_dp::ctrl::loopback::LoopbackConfig::new(sock("quota"));
    cfg.limits = SessionLimits { qps: 2, cqs: 3, mrs: 2, pds: 2, channels: 1, mr_bytes: 1 << 40 };
    let d = roce_dp::ctrl::loopback::LoopbackDaemon::start(cfg).unwrap();
    let dev = Device::open(d.path()).unwrap();
    let over = |e: Error, key: &str| {
        let msg = e.to_string();
        assert!(matches!(e, Error::Refused { code: ErrorCode::Exhausted, .. }), "{e:?}");
        assert!(msg.contains(key) && !msg.contains('\n'), "{msg}");
    };
    let pd = dev.alloc_pd().unwrap();
    let pd2 = dev.alloc_pd().unwrap();
    over(dev.alloc_pd().err().unwrap(), "session_max_pds");
    drop(pd2);
    let pd2 = dev.alloc_pd().expect("room again after a dealloc");
    let m1 = pd.reg_mr(4096, AccessFlags::ALL).unwrap();
    let _m2 = pd2.reg_mr(4096, AccessFlags::ALL).unwrap();
    over(pd.reg_mr(4096, AccessFlags::ALL).err().unwrap(), "session_max_mrs");
    drop(m1);
    let _m1 = pd.reg_mr(4096, AccessFlags::ALL).expect("room again after a dereg");
    let ch = dev.create_comp_channel().unwrap();
    over(dev.create_comp_channel().err().unwrap(), "session_max_channels");
    let cq = dev.create_cq_with_channel(8, &ch).unwrap();
    let cq2 = dev.create_cq(8).unwrap();
    let cq3 = dev.create_cq(8).unwrap();
    over(dev.create_cq(8).err().unwrap(), "session_max_cqs");
    let _q1 = dev.create_qp(&pd, &cq, &cq, QpInit::default()).unwrap();
    let _q2 = dev.create_qp(&pd, &cq2, &cq2, QpInit::default()).unwrap();
    over(dev.create_qp(&pd, &cq3, &cq3, QpInit::default()).err().unwrap(), "session_max_qps");
    // Another session is not affected by this one's use.
    let other = Device::open(d.path()).unwrap();
    let opd = other.alloc_pd().unwrap();
    let ocq = other.create_cq(8).unwrap();
    other.create_qp(&opd, &ocq, &ocq, QpInit::default()).expect("its own quota");
}

/// `[daemon] session_max_mr_bytes`: the bytes a session has registered at once, over all its MRs, are capped (each
/// MR is a window of the client's memory that the daemon maps: its address space). Past the cap: one Exhausted line
/// naming the key, the sizes and the limit; a dereg gives the bytes back; another session has its own room.
#[test]
fn a_session_may_register_at_most_session_max_mr_bytes_at_once() {
    use roce_dp::client::ErrorCode;
    use roce_dp::ctrl::SessionLimits;
    use roce_dp::AccessFlags;
    const MIB: usize = 1 << 20;
    let mut cfg = roce_dp::ctrl::loopback::LoopbackConfig::new(sock("mrbytes"));
    cfg.limits = SessionLimits { mr_bytes: MIB as u64, ..SessionLimits::default() };
    let d = roce_dp::ctrl::loopback::LoopbackDaemon::start(cfg).unwrap();
    let dev = Device::open(d.path()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let a = pd.reg_mr(MIB / 2, AccessFlags::ALL).unwrap();
    let b = pd.reg_mr(MIB / 4, AccessFlags::ALL).unwrap();
    let _c = pd.reg_mr(MIB / 4, AccessFlags::ALL).expect("exactly the limit is allowed");
    let e = pd.reg_mr(4096, AccessFlags::ALL).err().unwrap();
    let msg = e.to_string();
    assert!(matches!(e, Error::Refused { code: ErrorCode::Exhausted, .. }), "{e:?}");
    assert!(!msg.contains('\n'), "{msg}");
    for part in ["registering 4096 bytes", "1052672 bytes", "limit of 1048576", "session_max_mr_bytes"] {
        assert!(msg.contains(part), "{part:?} not in {msg}");
    }
    // Another session is not affected.
    let other = Device::open(d.path()).unwrap();
    let _o = other.alloc_pd().unwrap().reg_mr(MIB, AccessFlags::ALL).expect("its own room");
    // A dereg gives its bytes back: a quarter fits again, a half does not.
    drop(b);
    let _b = pd.reg_mr(MIB / 4, AccessFlags::ALL).expect("room again after a dereg");
    assert!(pd.reg_mr(4096, AccessFlags::ALL).is_err());
    drop(a);
    let _a = pd.reg_mr(MIB / 2, AccessFlags::ALL).expect("the half again");
}
