//! Completion channels of the client library (`CompChannel`, `Cq::req_notify`, `CompChannel::get_cq_event`,
//! `Cq::ack_events`) against the appliance in this process (`roce_dp::ctrl::loopback`, one worker on a thread):
//!
//! - a waiter blocked on the channel wakes when a completion lands in its armed CQ, and not without an arm;
//! - solicited-only arms: an unsolicited receive does not wake, a solicited SEND and a flushed (failed) receive do;
//! - the arm -> re-poll -> sleep pattern loses no wake-up: thousands of messages sent with random gaps while the
//!   receiver sleeps between them, not one wait runs into its timeout;
//! - a session that scribbles random arm words into its CQ's notification block only makes its own channel fire;
//!   the worker carries on and another session's transfer completes byte for byte;
//! - a session that ends (its socket closed) has its channel closed by the daemon: its end reads end-of-stream;
//! - event moderation (`Cq::set_event_moderation`): an armed CQ's event is held until its count of completions,
//!   or fires when its period ends with fewer; `(0, 0)` turns it off; a count without a period, a period without
//!   a count, or a CQ without a channel get one-line errors.
//!
//! Run: `cargo test -p roce-dp --test events`.

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use roce_dp::client::{CompChannel, Cq, Device, Error, Mr, Pd, Qp, QpInit, Remote, StatRecord};
use roce_dp::ctrl::loopback::{LoopbackConfig, LoopbackDaemon};
use roce_dp::sim::SimRng;
use roce_dp::{AccessFlags, Cqe, QpAttr, QpState, SendWr, WcOpcode, WcStatus, WrOpcode};

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-ev-{}-{tag}.sock", std::process::id()))
}

fn daemon(tag: &str) -> LoopbackDaemon {
    LoopbackDaemon::start(LoopbackConfig::new(sock(tag))).expect("loopback daemon")
}

/// One session: QP `a` sends (its CQ polled only), QP `b` receives into a CQ bound to the channel (fields drop
/// the QPs first, then the CQs, then the channel).
struct Pair {
    a: Qp,
    b: Qp,
    mr: Mr,
    cq_a: Cq,
    cq_b: Cq,
    ch: CompChannel,
    _pd: Pd,
    dev: Device,
}

const MSG: u32 = 64;
const SLOTS: u64 = 64;

fn pair(d: &LoopbackDaemon) -> Pair {
    let dev = Device::open(d.path()).expect("open");
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.reg_mr((2 * SLOTS * u64::from(MSG)) as usize, AccessFlags::ALL).unwrap();
    let ch = dev.create_comp_channel().unwrap();
    let cq_a = dev.create_cq(256).unwrap();
    let cq_b = dev.create_cq_with_channel(256, &ch).unwrap();
    let init = QpInit { sq_depth: 64, rq_depth: 64, max_send_sge: 1, max_recv_sge: 1, max_inline: 0 };
    let a = dev.create_qp(&pd, &cq_a, &cq_a, init).unwrap();
    let b = dev.create_qp(&pd, &cq_b, &cq_b, init).unwrap();
    for (x, y, psn, peer) in [(&a, &b, 100, 900), (&b, &a, 900, 100)] {
        x.to_init(AccessFlags::ALL).unwrap();
        x.to_rtr(&Remote { qpn: y.qpn(), psn: peer, gid: dev.gid(), mac: None }, 1024).unwrap();
        x.to_rts(psn).unwrap();
    }
    Pair { a, b, mr, cq_a, cq_b, ch, _pd: pd, dev }
}

impl Pair {
    fn post_recv(&mut self, i: u64) {
        let sge = self.mr.sge(((SLOTS + i % SLOTS) * u64::from(MSG)) as usize, MSG);
        self.b.post_recv(i, &[sge]).unwrap();
    }

    fn send(&mut self, i: u64, solicited: bool) {
        send_on(&mut self.a, &mut self.mr, i, solicited);
    }

    /// Polls the sender's CQ until its `n` completions are in (each must succeed).
    fn reap_sends(&mut self, n: usize) {
        let until = Instant::now() + Duration::from_secs(5);
        let mut got = 0;
        let mut wc = [Cqe::EMPTY; 16];
        while got < n {
            let k = self.cq_a.poll(&mut wc).unwrap();
            for c in &wc[..k] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
            }
            got += k;
            assert!(Instant::now() < until, "send completions: {got} of {n} in 5 s");
        }
    }

    /// Polls the receiver's CQ until a completion is there (at most 5 s).
    fn recv_one(&mut self) -> Cqe {
        let until = Instant::now() + Duration::from_secs(5);
        let mut wc = [Cqe::EMPTY; 1];
        loop {
            if self.cq_b.poll(&mut wc).unwrap() == 1 {
                return wc[0];
            }
            assert!(Instant::now() < until, "no receive completion in 5 s");
            std::thread::yield_now();
        }
    }
}

/// Message `i` (every byte `i`) from its send slot.
fn send_on(a: &mut Qp, mr: &mut Mr, i: u64, solicited: bool) {
    let off = (i % SLOTS) as usize * MSG as usize;
    mr.as_mut_slice()[off..off + MSG as usize].fill(i as u8);
    let mut wr = SendWr::new(i, WrOpcode::Send);
    wr.solicited = solicited;
    a.post_send(&wr, &[mr.sge(off, MSG)]).unwrap();
}

/// The next event of `ch` must name `cq` and come within 2 s (a timeout would find it too, after 5 s).
fn expect_event(ch: &CompChannel, cq: &Cq) {
    let t = Instant::now();
    assert_eq!(ch.get_cq_event(Some(Duration::from_secs(5))).unwrap(), Some(cq.handle()));
    assert!(t.elapsed() < Duration::from_secs(2), "the event came after {:?}", t.elapsed());
}

fn stat(recs: &[StatRecord], scope: &str, name: &str) -> u64 {
    recs.iter().find(|s| s.scope == scope && s.name == name).map_or(0, |s| s.value)
}

#[test]
fn a_blocked_waiter_wakes_on_a_completion_and_not_without_an_arm() {
    let d = daemon("wake");
    let mut p = pair(&d);
    p.post_recv(0);
    p.post_recv(1);
    // Not armed: a completion lands, the channel stays quiet.
    p.send(0, false);
    p.reap_sends(1);
    let c = p.recv_one();
    assert_eq!((c.wr_id, c.status, c.opcode), (0, WcStatus::Success, WcOpcode::Recv));
    assert_eq!(p.ch.get_cq_event(Some(Duration::from_millis(100))).unwrap(), None, "an event without an arm");

    // Armed, nothing there on the re-poll: a thread blocks on the channel until the SEND lands.
    p.cq_b.req_notify(false).unwrap();
    assert_eq!(p.cq_b.pending().unwrap(), 0);
    let woke = std::thread::scope(|s| {
        let ch = &p.ch;
        let waiter = s.spawn(move || {
            let r = ch.get_cq_event(Some(Duration::from_secs(10)));
            (r, Instant::now())
        });
        std::thread::sleep(Duration::from_millis(100));
        assert!(!waiter.is_finished(), "the waiter returned before any completion");
        let sent = Instant::now();
        send_on(&mut p.a, &mut p.mr, 1, false);
        let (r, returned) = waiter.join().unwrap();
        (r.unwrap(), returned, sent)
    });
    let (ev, returned, sent) = woke;
    assert_eq!(ev, Some(p.cq_b.handle()), "the event names the CQ");
    assert!(returned >= sent, "the waiter returned before the send");
    let since_send = returned - sent;
    assert!(since_send < Duration::from_secs(2), "woke {since_send:?} after the send");
    p.cq_b.ack_events(1);
    assert_eq!(p.cq_b.events(), (1, 1));
    let c = p.recv_one();
    assert_eq!((c.wr_id, c.status), (1, WcStatus::Success));
    p.reap_sends(1);
    // One arm, one event: the next completion (not re-armed) signals nothing.
    p.post_recv(2);
    p.send(2, false);
    p.reap_sends(1);
    p.recv_one();
    assert_eq!(p.ch.get_cq_event(Some(Duration::from_millis(100))).unwrap(), None);
    let recs = p.dev.stats().unwrap();
    assert_eq!(stat(&recs, "daemon", "events_signalled"), 1, "{recs:?}");
    assert_eq!(stat(&recs, "worker", "events_signalled"), 1);
    // A CQ without a channel cannot be armed: one line naming it.
    let e = p.cq_a.req_notify(false).unwrap_err();
    assert!(matches!(e, Error::NoChannel { .. }) && e.to_string().contains("create_cq_with_channel"), "{e}");
}

#[test]
fn event_moderation_holds_the_event_until_its_count_or_its_period() {
    let d = daemon("moderation");
    let mut p = pair(&d);
    // Bad values and a CQ without a channel: one line each, naming what to give.
    for (c, us) in [(4, 0), (0, 100)] {
        let e = p.cq_b.set_event_moderation(c, us).unwrap_err();
        assert!(matches!(e, Error::BadModeration { .. }), "{e:?}");
        assert_eq!(
            e.to_string(),
            format!(
                "CQ event moderation count {c} with period {us} us: give both a count (>= 1) and a period (1-65535 \
                 us; a count alone could hold an event forever), or 0 and 0 to turn it off"
            )
        );
    }
    let e = p.cq_a.set_event_moderation(4, 100).unwrap_err();
    assert!(matches!(e, Error::NoChannel { .. }), "{e:?}");
    // Count 3, the longest period (65.5 ms): two completions are held, the third fires at once.
    p.cq_b.set_event_moderation(3, u16::MAX).unwrap();
    p.cq_b.req_notify(false).unwrap();
    let first = Instant::now();
    for i in 0..2 {
        p.post_recv(i);
        p.send(i, false);
        p.reap_sends(1);
        p.recv_one();
    }
    // Held unless its period ran out: on a loaded machine the two messages may take longer than 65.5 ms (measured
    // from before the first was posted, so the bound is conservative).
    let fired = p.ch.get_cq_event(Some(Duration::ZERO)).unwrap();
    if fired.is_some() {
        let took = first.elapsed();
        assert!(took >= Duration::from_micros(u64::from(u16::MAX)), "fired before its count, after {took:?}");
        p.cq_b.ack_events(1);
    }
    // Armed, message `i` goes through; the event must come (and is acknowledged).
    let arm_and_expect = |p: &mut Pair, i: u64| {
        p.cq_b.req_notify(false).unwrap();
        p.post_recv(i);
        p.send(i, false);
        p.reap_sends(1);
        expect_event(&p.ch, &p.cq_b);
        p.cq_b.ack_events(1);
        assert_eq!(p.recv_one().wr_id, i);
    };
    // Re-arming (as a sleeping loop does after each look) keeps counting from the first held completion.
    arm_and_expect(&mut p, 2);
    // Count 1000 with a 1 us period: one completion fires when the period ends.
    p.cq_b.set_event_moderation(1000, 1).unwrap();
    arm_and_expect(&mut p, 3);
    // Off again: the first completion fires.
    p.cq_b.set_event_moderation(0, 0).unwrap();
    arm_and_expect(&mut p, 4);
    let recs = p.dev.stats().unwrap();
    assert_eq!(stat(&recs, "daemon", "events_signalled"), 3 + u64::from(fired.is_some()), "{recs:?}");
}

/// What roce-dpd's worker yields its idle core for (`Appliance::event_unserved`): an event it signalled whose
/// client has not armed the CQ again. True right after the event fires and until the client re-arms; false again
/// once it did, and false when the client never re-arms but the window (`UNSERVED_WINDOW_NS`) ran out; false when
/// no event was signalled. The worker is stepped on its own thread, which answers the test's questions between
/// steps.
#[test]
fn an_event_is_unserved_from_its_signal_until_the_client_arms_again() {
    use roce_dp::ctrl::daemon::UNSERVED_WINDOW_NS;
    let (d, mut st) = LoopbackDaemon::start_stepped(LoopbackConfig::new(sock("unserved"))).expect("stepped daemon");
    let (ask, asked) = std::sync::mpsc::channel::<std::sync::mpsc::Sender<bool>>();
    let stop = Arc::new(AtomicBool::new(false));
    let stepping = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                st.step();
                if let Ok(reply) = asked.try_recv() {
                    let _ = reply.send(st.event_unserved());
                }
            }
        })
    };
    let unserved = || {
        let (tx, rx) = std::sync::mpsc::channel();
        ask.send(tx).unwrap();
        rx.recv_timeout(Duration::from_secs(5)).expect("the stepping thread answers")
    };
    let mut p = pair(&d);
    assert!(!unserved(), "no event signalled yet");
    // Message `i` through the armed CQ: its event comes; then whether the worker calls it unserved (on a loaded
    // machine the window may end before the question: the send is earlier than the signal).
    let event_then_unserved = |p: &mut Pair, i: u64| {
        p.post_recv(i);
        let sent = Instant::now();
        p.send(i, false);
        p.reap_sends(1);
        expect_event(&p.ch, &p.cq_b);
        p.cq_b.ack_events(1);
        assert_eq!(p.recv_one().wr_id, i);
        unserved() || sent.elapsed() >= Duration::from_nanos(UNSERVED_WINDOW_NS)
    };
    p.cq_b.req_notify(false).unwrap();
    assert!(event_then_unserved(&mut p, 0), "the event's client has not armed the CQ again");
    // It arms again (as a sleeping loop does before it sleeps): served.
    p.cq_b.req_notify(false).unwrap();
    assert!(!unserved(), "the client armed the CQ again");
    // The next event, and a client that never arms again: unserved only until the window ends.
    assert!(event_then_unserved(&mut p, 1), "unserved right after the event");
    std::thread::sleep(Duration::from_nanos(UNSERVED_WINDOW_NS) + Duration::from_millis(2));
    assert!(!unserved(), "the window ended");
    drop(p);
    drop(d); // its shutdown waits for the worker's steps
    stop.store(true, Ordering::Relaxed);
    stepping.join().unwrap();
}

/// `get_cq_event` takes the channel's messages only after a wait (one per wake-up), yet never leaves one behind on
/// an `Ok(None)`: an `epoll` user woken by a message that a look without waiting already answered is not woken
/// again for nothing.
#[test]
fn an_event_found_without_waiting_leaves_no_stale_wakeup_after_none() {
    use std::os::fd::AsFd;
    let d = daemon("stale");
    let mut p = pair(&d);
    p.post_recv(0);
    p.cq_b.req_notify(false).unwrap();
    p.send(0, false);
    p.reap_sends(1);
    p.recv_one();
    // The daemon's message is on the socket now (it stores `fired` first, then sends).
    assert!(roce_dp::ctrl::shm::channel_wait(p.ch.as_fd(), Some(Duration::from_secs(2))).unwrap(), "no message");
    // Found by the look, without a wait: the message is still there.
    assert_eq!(p.ch.get_cq_event(Some(Duration::ZERO)).unwrap(), Some(p.cq_b.handle()));
    assert!(roce_dp::ctrl::shm::channel_wait(p.ch.as_fd(), Some(Duration::ZERO)).unwrap());
    // Nothing new fired: Ok(None), and the message was taken on the way.
    assert_eq!(p.ch.get_cq_event(Some(Duration::ZERO)).unwrap(), None);
    assert!(!roce_dp::ctrl::shm::channel_wait(p.ch.as_fd(), Some(Duration::ZERO)).unwrap(), "left readable");
    p.cq_b.ack_events(1);
    // The next arm still wakes a waiter.
    p.post_recv(1);
    p.cq_b.req_notify(false).unwrap();
    p.send(1, false);
    expect_event(&p.ch, &p.cq_b);
    p.cq_b.ack_events(1);
    p.reap_sends(1);
    p.recv_one();
}

#[test]
fn solicited_only_arms_wake_for_solicited_and_failed_completions_only() {
    let d = daemon("solicited");
    let mut p = pair(&d);
    for i in 0..4 {
        p.post_recv(i);
    }
    // An unsolicited SEND does not answer a solicited-only arm...
    p.cq_b.req_notify(true).unwrap();
    p.send(0, false);
    p.reap_sends(1);
    assert_eq!(p.recv_one().wr_id, 0);
    assert_eq!(p.ch.get_cq_event(Some(Duration::from_millis(150))).unwrap(), None, "unsolicited receive woke");
    // ...the arm is still there: a solicited one does.
    p.send(1, true);
    expect_event(&p.ch, &p.cq_b);
    assert_eq!(p.recv_one().wr_id, 1);
    p.reap_sends(1);
    // A plain arm takes an unsolicited one.
    p.cq_b.req_notify(false).unwrap();
    p.send(2, false);
    expect_event(&p.ch, &p.cq_b);
    assert_eq!(p.recv_one().wr_id, 2);
    p.reap_sends(1);
    // A failed completion answers a solicited-only arm: the receiver's QP to the error state flushes its receive.
    p.cq_b.req_notify(true).unwrap();
    assert_eq!(p.cq_b.pending().unwrap(), 0);
    p.b.modify(&roce_dp::client::ModifyQp {
        attr: QpAttr { state: Some(QpState::Err), ..QpAttr::default() },
        ..Default::default()
    })
    .unwrap();
    expect_event(&p.ch, &p.cq_b);
    let c = p.recv_one();
    assert_eq!((c.wr_id, c.status), (3, WcStatus::WrFlushErr));
    p.cq_b.ack_events(3);
    assert_eq!(p.cq_b.events(), (3, 3));
    assert_eq!(stat(&p.dev.stats().unwrap(), "daemon", "events_signalled"), 3);
}

/// This thread's CPU time.
fn thread_cpu() -> Duration {
    let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: t is a valid timespec for the call.
    assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) }, 0);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

/// A wait is one blocking `recv` with the socket's receive timeout (session 16): each timeout is honoured when
/// they change from call to call (the socket's is set again), a wait without a limit still wakes on a completion,
/// and a descriptor the application made non-blocking again (through `AsFd`) still sleeps instead of spinning.
#[test]
fn waits_honour_each_timeout_and_sleep_on_a_non_blocking_descriptor() {
    use std::os::fd::AsRawFd;
    let d = daemon("timeo");
    let mut p = pair(&d);
    for (k, ms) in [(0, 30u64), (1, 120), (2, 30), (3, 1)] {
        let (t, cpu) = (Instant::now(), thread_cpu());
        assert_eq!(p.ch.get_cq_event(Some(Duration::from_millis(ms))).unwrap(), None, "wait {k}");
        let (took, spent) = (t.elapsed(), thread_cpu() - cpu);
        assert!(took >= Duration::from_millis(ms), "wait {k} of {ms} ms returned after {took:?}");
        assert!(took < Duration::from_millis(ms + 2000), "wait {k} of {ms} ms took {took:?}");
        assert!(spent < Duration::from_millis(ms / 2 + 5), "wait {k} of {ms} ms spent {spent:?} of CPU");
        if k == 1 {
            // The application's own flag on its descriptor (what an epoll user might set).
            let fd = p.ch.as_raw_fd();
            // SAFETY: fcntl on a descriptor this test holds (through the channel).
            let fl = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            // SAFETY: as above.
            assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK) }, 0);
        }
    }
    // Without a limit: a thread sleeps until the SEND lands, on the non-blocking descriptor too.
    p.post_recv(0);
    p.cq_b.req_notify(false).unwrap();
    assert_eq!(p.cq_b.pending().unwrap(), 0);
    let (ev, spent) = std::thread::scope(|s| {
        let ch = &p.ch;
        let waiter = s.spawn(move || {
            let cpu = thread_cpu();
            (ch.get_cq_event(None), thread_cpu() - cpu)
        });
        std::thread::sleep(Duration::from_millis(150));
        assert!(!waiter.is_finished(), "the waiter returned before any completion");
        send_on(&mut p.a, &mut p.mr, 0, false);
        waiter.join().unwrap()
    });
    assert_eq!(ev.unwrap(), Some(p.cq_b.handle()));
    assert!(spent < Duration::from_millis(80), "the waiter spent {spent:?} of CPU in 150 ms");
    p.cq_b.ack_events(1);
    assert_eq!(p.recv_one().wr_id, 0);
}

/// The receiver sleeps whenever its CQ is empty (arm, re-poll, wait) while the sender posts with random gaps of 0
/// to ~200 us, so arms race with completions landing at every point of the pattern. A lost wake-up would leave the
/// receiver asleep with a completion in its ring: its wait would run into its timeout.
#[test]
fn arm_repoll_sleep_loses_no_wakeup_under_stress() {
    const N: u64 = 3000;
    let d = daemon("stress");
    let mut p = pair(&d);
    for i in 0..SLOTS.min(N) {
        p.post_recv(i);
    }
    let received = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let Pair { mut a, b, mr, mut cq_a, mut cq_b, ch, _pd, dev } = p;
    let mut b = b;
    let (sleeps, wakeups, events) = std::thread::scope(|s| {
        let (received2, done2) = (received.clone(), done.clone());
        let (mr_addr, mr_lkey) = (mr.addr(), mr.lkey());
        let recv = s.spawn(move || {
            let (mut sleeps, mut wakeups) = (0u64, 0u64);
            let mut wc = [Cqe::EMPTY; 16];
            let mut next_post = SLOTS.min(N);
            let mut got = 0u64;
            let mut rng = SimRng::new(7);
            while got < N {
                let k = cq_b.poll(&mut wc).unwrap();
                if k > 0 {
                    for c in &wc[..k] {
                        assert_eq!((c.status, c.wr_id), (WcStatus::Success, got), "{c:?}");
                        got += 1;
                        if next_post < N {
                            let off = (SLOTS + next_post % SLOTS) * u64::from(MSG);
                            let sge = roce_dp::Sge { addr: mr_addr + off, len: MSG, lkey: mr_lkey };
                            b.post_recv(next_post, &[sge]).unwrap();
                            next_post += 1;
                        }
                    }
                    received2.store(got, Ordering::Release);
                    continue;
                }
                // Half the arms are solicited-only (the sender marks every SEND solicited).
                cq_b.req_notify(rng.next_u64() & 1 == 1).unwrap();
                if cq_b.pending().unwrap() > 0 {
                    continue;
                }
                sleeps += 1;
                let t = Instant::now();
                let ev = ch.get_cq_event(Some(Duration::from_secs(4))).unwrap();
                // The sender never pauses for more than ~200 us on purpose: a wait of 2 s (half the timeout, far
                // beyond any scheduling delay) means the signal never came and the wait ended by its timeout.
                let waited = t.elapsed();
                assert!(waited < Duration::from_secs(2), "lost wake-up: slept {waited:?} after {got} messages");
                match ev {
                    Some(h) => {
                        assert_eq!(h, cq_b.handle());
                        cq_b.ack_events(1);
                        wakeups += 1;
                    }
                    None => {
                        let pending = cq_b.pending().unwrap();
                        panic!(
                            "a wait ran into its 4 s timeout with {pending} completion(s) pending after {got} messages"
                        );
                    }
                }
            }
            done2.store(true, Ordering::Release);
            (sleeps, wakeups, cq_b.events().0)
        });
        let mut rng = SimRng::new(11);
        let mut posted = 0u64;
        let mut completed = 0u64;
        let mut wc = [Cqe::EMPTY; 16];
        let until = Instant::now() + Duration::from_secs(60);
        while posted < N {
            // At most SLOTS in flight beyond what the receiver has taken (its receives are posted as it goes).
            if posted < received.load(Ordering::Acquire) + SLOTS / 2 {
                let mut wr = SendWr::new(posted, WrOpcode::Send);
                wr.solicited = true;
                let off = (posted % SLOTS) * u64::from(MSG);
                a.post_send(&wr, &[roce_dp::Sge { addr: mr.addr() + off, len: MSG, lkey: mr.lkey() }]).unwrap();
                posted += 1;
                let gap = rng.next_u64() % 200;
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(gap) {
                    std::hint::spin_loop();
                }
            }
            completed += cq_a.poll(&mut wc).unwrap() as u64;
            if recv.is_finished() {
                break; // the receiver failed: its panic comes with the join
            }
            assert!(Instant::now() < until, "stress run took over 60 s ({posted} posted)");
        }
        while completed < N && !recv.is_finished() {
            completed += cq_a.poll(&mut wc).unwrap() as u64;
            assert!(Instant::now() < until, "send completions: {completed} of {N}");
        }
        recv.join().unwrap()
    });
    assert!(done.load(Ordering::Acquire));
    eprintln!("stress: {N} messages, {sleeps} sleeps, {wakeups} wake-ups, none lost");
    assert!(sleeps >= N / 10, "the receiver slept only {sleeps} times: the race was not exercised");
    assert!(wakeups > 0 && events == wakeups, "wakeups {wakeups}, events {events}");
    let recs = dev.stats().unwrap();
    assert!(stat(&recs, "daemon", "events_signalled") >= wakeups, "{recs:?}");
}

/// A session speaking the protocol itself writes random arm words into its CQ's notification block while its own
/// QP and another session's pair move traffic: the worker signals at most the hostile session's own channel, never
/// panics, and the other session's transfer completes with every byte.
#[test]
fn hostile_arm_words_only_fire_the_own_channel() {
    use roce_dp::ctrl::abi::RegionHeader;
    use roce_dp::ctrl::proto::{Conn, ModifyQp, Request, Response};
    use roce_dp::ctrl::shm::ShmRegion;
    use std::os::unix::net::UnixStream;

    let d = daemon("hostile");
    let mut good = pair(&d);

    let mut conn = Conn::new(UnixStream::connect(d.path()).unwrap());
    let mut seq = 0;
    let mut call = |conn: &mut Conn, q: Request| {
        seq += 1;
        conn.send_request(seq, &q, &[]).unwrap();
        let f = conn.recv_response().unwrap();
        (f.msg, f.fds)
    };
    let abi = roce_dp::ctrl::abi::ABI_VERSION;
    assert!(matches!(call(&mut conn, Request::Hello { abi }).0, Response::Hello(_)));
    // A channel of another session's number is not found; ours works.
    let (Response::Channel { channel }, mut chfds) = call(&mut conn, Request::CreateCompChannel) else {
        panic!("channel")
    };
    let chan_end = chfds.pop().expect("the channel's socket");
    let other = good.ch.handle();
    let r = call(&mut conn, Request::CreateCq { depth: 64, channel: Some(channel.wrapping_add(1000)) }).0;
    assert!(matches!(r, Response::Error { .. }), "{r:?}");
    if other != channel {
        let r = call(&mut conn, Request::CreateCq { depth: 64, channel: Some(other) }).0;
        assert!(matches!(r, Response::Error { .. }), "another session's channel: {r:?}");
    }
    let Response::Pd { pd } = call(&mut conn, Request::AllocPd).0 else { panic!("pd") };
    let (Response::Cq { cq }, mut fds) = call(&mut conn, Request::CreateCq { depth: 64, channel: Some(channel) })
    else {
        panic!("cq")
    };
    let mut region = ShmRegion::map(fds.pop().unwrap()).unwrap();
    let h: RegionHeader = region.read(0).unwrap();
    assert!(h.notify > 0);
    let q = Request::CreateQp {
        pd,
        send_cq: cq,
        recv_cq: cq,
        sq_depth: 16,
        rq_depth: 16,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline: 64,
    };
    let (Response::Qp { qpn }, mut fds) = call(&mut conn, q) else { panic!("qp") };
    let mut qregion = ShmRegion::map(fds.pop().unwrap()).unwrap();
    let qh: RegionHeader = qregion.read(0).unwrap();
    let gid = Some(std::net::Ipv4Addr::from(roce_dp::ctrl::loopback::IPV4).to_ipv6_mapped().octets());
    for attr in common::raw_connect_attrs(qpn) {
        let m = ModifyQp { attr, gid: if attr.state == Some(QpState::Rtr) { gid } else { None }, mac: None };
        assert_eq!(call(&mut conn, Request::ModifyQp { qpn, m }).0, Response::Ok);
    }
    // The hostile QP writes to itself with inline WQEs (no memory region needed: zero-length WRITEs), unsignaled
    // except every 4th, while random words go into its CQ's arm word; its CQ ring is drained by hand.
    let mut rng = SimRng::new(3);
    let cq_tail_off = h.sq.offset as usize + 128;
    let cq_head_off = h.sq.offset as usize;
    let mut tail = 0u32;
    for i in 0..2000u32 {
        let w = roce_dp::ctrl::abi::Wqe {
            wr_id: u64::from(i),
            opcode: roce_dp::ctrl::abi::wr_opcode::RDMA_WRITE,
            flags: if i % 4 == 0 { roce_dp::ctrl::abi::send_flags::SIGNALED } else { 0 },
            ..Default::default()
        };
        let head: u32 = qregion.read(qh.sq.offset as usize).unwrap();
        if tail.wrapping_sub(head) < qh.sq.capacity {
            qregion.write(qh.sq.offset as usize + 256 + (tail % qh.sq.capacity) as usize * 64, w).unwrap();
            tail = tail.wrapping_add(1);
            qregion.write(qh.sq.offset as usize + 128, tail).unwrap();
        }
        region.write(h.notify as usize, rng.next_u64() as u32).unwrap();
        // Drain the CQ ring so that completions keep flowing.
        let t: u32 = region.read(cq_tail_off).unwrap();
        region.write(cq_head_off, t).unwrap();
        if i % 100 == 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
    // Meanwhile (afterwards, on the same worker) the good session moves 32 messages, every byte checked; its
    // channel, never armed, stays quiet.
    for i in 0..32 {
        good.post_recv(i);
        good.send(i, i % 2 == 0);
        let c = good.recv_one();
        assert_eq!((c.wr_id, c.status), (i, WcStatus::Success), "{c:?}");
        let off = ((SLOTS + i % SLOTS) * u64::from(MSG)) as usize;
        assert!(good.mr.as_slice()[off..off + MSG as usize].iter().all(|&x| x == i as u8), "message {i}");
        good.reap_sends(1);
    }
    assert_eq!(good.ch.get_cq_event(Some(Duration::ZERO)).unwrap(), None, "the good session's channel fired");
    // The hostile session's own end got what the worker sent (at most one per batch of its completions).
    let recs = good.dev.stats().unwrap();
    let signalled = stat(&recs, "daemon", "events_signalled");
    assert!(signalled <= 2000 / 4 + 1, "{signalled} events for at most 501 completions");
    let qp_state = recs.iter().find(|s| s.scope == "qp" && s.id == qpn && s.name == "state").map(|s| s.value);
    assert_eq!(qp_state, Some(QpState::Rts as u64), "the hostile QP's own traffic is fine");
    drop(chan_end);
}

/// A session that ends without cleaning up (its socket closed, as when the process dies) has its channel closed by
/// the daemon: a waiter sees the daemon's end gone, and the daemon keeps nothing of it.
#[test]
fn a_dead_sessions_channel_is_closed_at_reclaim() {
    let d = daemon("reclaim");
    let p = pair(&d);
    let watcher = Device::open(d.path()).unwrap();
    let before = stat(&watcher.stats().unwrap(), "daemon", "cqs");
    assert!(before >= 2);
    p.dev.abandon();
    let until = Instant::now() + Duration::from_secs(2);
    while stat(&watcher.stats().unwrap(), "daemon", "cqs") != 0 {
        assert!(Instant::now() < until, "the session was not reclaimed");
        std::thread::sleep(Duration::from_millis(5));
    }
    // The channel's socket: end of stream (the daemon's end is closed), reported as the daemon gone for this
    // session, within the wait.
    let t = Instant::now();
    let e = p.ch.get_cq_event(Some(Duration::from_secs(5))).unwrap_err();
    assert!(matches!(e, Error::DaemonGone { .. }), "{e}");
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
    // The socket itself says so (poll: readable with end of stream).
    let (n, closed) = roce_dp::ctrl::shm::channel_drain(std::os::fd::AsFd::as_fd(&p.ch)).unwrap();
    assert!(closed, "{n} messages, not closed");
    drop(p);
}

/// A channel still used by a CQ is not destroyed; a daemon that stops wakes its waiters with `DaemonGone`.
#[test]
fn busy_channel_and_daemon_shutdown() {
    use roce_dp::ctrl::proto::{Conn, ErrorCode, Request, Response};
    use std::os::unix::net::UnixStream;
    let mut d = daemon("shutdown");
    let mut conn = Conn::new(UnixStream::connect(d.path()).unwrap());
    let mut seq = 0;
    let mut call = |conn: &mut Conn, q: Request| {
        seq += 1;
        conn.send_request(seq, &q, &[]).unwrap();
        conn.recv_response().unwrap().msg
    };
    let abi = roce_dp::ctrl::abi::ABI_VERSION;
    assert!(matches!(call(&mut conn, Request::Hello { abi }), Response::Hello(_)));
    let Response::Channel { channel } = call(&mut conn, Request::CreateCompChannel) else { panic!("channel") };
    let Response::Cq { cq } = call(&mut conn, Request::CreateCq { depth: 8, channel: Some(channel) }) else {
        panic!("cq")
    };
    let r = call(&mut conn, Request::DestroyCompChannel { channel });
    assert!(matches!(&r, Response::Error { code: ErrorCode::Busy, msg } if msg.contains("still used")), "{r:?}");
    assert_eq!(call(&mut conn, Request::DestroyCq { cq }), Response::Ok);
    assert_eq!(call(&mut conn, Request::DestroyCompChannel { channel }), Response::Ok);
    let r = call(&mut conn, Request::DestroyCompChannel { channel });
    assert!(matches!(r, Response::Error { code: ErrorCode::NotFound, .. }), "{r:?}");

    let mut p = pair(&d);
    p.cq_b.req_notify(false).unwrap();
    let t = std::thread::scope(|s| {
        let ch = &p.ch;
        let w = s.spawn(move || {
            let t = Instant::now();
            (ch.get_cq_event(Some(Duration::from_secs(10))), t.elapsed())
        });
        std::thread::sleep(Duration::from_millis(50));
        d.shutdown("test over");
        w.join().unwrap()
    });
    let (r, waited) = t;
    assert!(waited < Duration::from_secs(5), "{waited:?}");
    match r {
        // The shutdown flushed nothing into this CQ (no receive posted): the waiter sees the channel close.
        Err(e) => assert!(matches!(e, Error::DaemonGone { .. }), "{e}"),
        Ok(ev) => panic!("an event {ev:?} without a completion"),
    }
}
