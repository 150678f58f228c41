//! `--daemon SOCKET`: the tools' QPs in a running roce-dpd, through the client library ([`roce_dp::client`]),
//! instead of an engine embedded in the tool. Every test and flag works as with `--port-conf` (the session flow
//! and the traffic loops are the same code, [`super::run::session`]): the out-of-band perftest exchange is the
//! same TCP exchange; the QP records carry the daemon's GID, our QPNs and PSNs, and the rkeys and addresses of
//! our shared-memory regions; posting and polling are index publishes in the shared rings.
//!
//! The daemon runs the data path, so a traffic loop's turn has nothing to poll but the CQ ring; after 64 empty
//! turns in a row the tool yields its CPU (it usually shares the cores with the daemon's busy worker). With `-e`
//! (perftest's `--events`) the QPs share one CQ, as perftest's QPs share its send CQ, bound to a completion
//! channel (one wake-up per completion batch of all the QPs, not one per QP: with a CQ per QP the wake-ups came in
//! pairs 10-25 us apart, and the second of a pair was where half of the tick-long waits for the shared core
//! were); a turn that moved nothing arms it ([`Cq::req_notify`]), looks at its ring once more ([`Cq::pending`]: a
//! completion that landed before the worker saw the arm is found here) and only then sleeps on the channel, at most
//! [`EVENT_WAIT`] so that the loops' clocks (`-D`, `--run_infinitely`, timeouts) still tick; the event is
//! acknowledged and the next turn polls. The tool then uses CPU only per completion batch, not per turn. The
//! passive side (the write/read/atomic server) sees traffic by the responder's expected PSN of its QPs, queried
//! every 100 ms. When the daemon goes (stopped, killed), the tool says so in one line (the client library's
//! [`Error::DaemonGone`](roce_dp::client::Error::DaemonGone)) and exits 2: from the traffic loops, from a wait on
//! the exchange, or after any other failure that the daemon's end caused.

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::time::{Duration, Instant};

use roce_dp::client::{CompChannel, Cq, Device, ModifyQp, Mr, Pd, Qp, QpInit};
use roce_dp::{AccessFlags, Cqe, SendWr};

use super::exchange::{self, Dest, Mtu, TestKind};
use super::params::Params;
use super::report;
use super::run::{detail, err, rc_connect, session, Fail, Local, NewQp, Nic};

/// One QP of ours in the daemon, with everything it needs (dropped QP first, its region last; the PD they share
/// is [`Daemon::pd`]).
struct DQp {
    qp: Qp,
    /// Its own CQ, or `None` with `-e` (the QPs' [`Shared`] CQ).
    cq: Option<Cq>,
    mr: Mr,
    /// The responder's expected PSN at the last look ([`Nic::rx_activity`]).
    rq_psn: u32,
}

/// `-e`: the CQ all the QPs complete on, and the completions polled from it that wait for their QP's turn.
struct Shared {
    cq: Cq,
    /// Per QP (index as in [`Daemon::qps`]), completions taken from the CQ and not yet handed to the loop.
    queued: Vec<VecDeque<Cqe>>,
    /// QPN -> index in [`Daemon::qps`].
    index: HashMap<u32, usize>,
}

/// The session with roce-dpd and our QPs in it (fields drop in order: the QPs before the CQ they share).
struct Daemon {
    qps: Vec<DQp>,
    shared: Option<Shared>,
    /// The one PD of every QP and region, as perftest's (a PD per QP spent the session's PD limit, 256 by
    /// default, before its QP limit, and `-q 257` was refused for PDs the test never needed). Dropped after them.
    pd: Option<Pd>,
    dev: Device,
    /// `--poll-sleep`.
    nap: Duration,
    /// `-e`: the channel every CQ signals.
    channel: Option<CompChannel>,
    /// `--event-moderation COUNT:US` for the shared CQ (`-e`).
    moderation: Option<(u16, u16)>,
    last_alive: Instant,
    /// Changes of a QP's expected PSN seen so far, when the QPs were last looked at, and the next to look at.
    activity: u64,
    last_sample: Instant,
    next_sample: usize,
}

/// Turns of a loop without work before the tool yields its CPU.
const YIELD_AFTER: u32 = 64;
/// How often the passive side looks at its QPs' receive PSNs, and at how many at most (round robin).
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
const SAMPLE_QPS: usize = 32;
/// The longest sleep on the completion channel (`-e`) before the loop looks at its clocks again.
pub(super) const EVENT_WAIT: Duration = Duration::from_millis(10);
/// Send WRs a BW loop stages before it publishes them (the rest of its batch follows at its end).
const STAGE_MAX: u32 = 32;
/// The largest shared CQ the tool asks for (the daemon's default `max_depth`).
const SHARED_CQ_MAX: u32 = 4096;
/// How often a loop looks at the daemon's socket.
const ALIVE_EVERY: Duration = Duration::from_millis(20);

/// A refused post, as one line (out of the per-WR path).
#[cold]
#[inline(never)]
fn post_failed(e: roce_dp::client::Error) -> Fail {
    err(format!("post_send: {e}"))
}

fn gone(e: roce_dp::client::Error) -> Fail {
    Fail(2, e.to_string())
}

/// The whole run of one tool through roce-dpd on `sock`.
/// `nap`: `--poll-sleep`, the sleep after a turn of a traffic loop that moved nothing (zero: spin, yielding the CPU
/// after [`YIELD_AFTER`] such turns).
/// `moderation`: `--event-moderation` (with `-e`), set on the QPs' shared CQ.
pub(super) fn run(
    test: TestKind,
    p: &Params,
    sock: &Path,
    timeout: Duration,
    nap: Duration,
    moderation: Option<(u16, u16)>,
) -> Result<(), Fail> {
    let dev = Device::open(sock).map_err(gone)?;
    let stream = if let Some(host) = &p.host {
        exchange::connect(host, p.port, timeout.min(Duration::from_secs(5)), timeout).map_err(err)?
    } else {
        let listener = exchange::listen(p.port).map_err(err)?;
        for l in report::waiting_lines() {
            println!("{l}");
        }
        exchange::accept(&listener, Some(timeout), timeout).map_err(err)?
    };
    let now = Instant::now();
    let channel = if p.use_event { Some(dev.create_comp_channel().map_err(err)?) } else { None };
    let mut nic = Daemon {
        qps: Vec::new(),
        shared: None,
        pd: None,
        dev: dev.clone(),
        nap,
        channel,
        moderation,
        last_alive: now,
        activity: 0,
        last_sample: now,
        next_sample: 0,
    };
    let r = session(&mut nic, test, p, stream, timeout).and_then(|out| out.print_end(p));
    drop(nic);
    // A failure the daemon's end caused (the peer gave up on it first, a ring stopped) is reported as that.
    r.map_err(|f| match dev.check_alive() {
        Err(e) if f.0 != 2 => gone(e),
        _ => f,
    })
}

impl Daemon {
    /// `-e`: arm every CQ, look once more, sleep on the channel (module documentation). Errors end the sleep; the
    /// loop's next liveness check reports a daemon that went away.
    fn sleep_on_events(&mut self) {
        let Some(sh) = &mut self.shared else { return };
        if sh.queued.iter().any(|q| !q.is_empty()) || sh.cq.req_notify(false).is_err() {
            return;
        }
        if sh.cq.pending().map_or(true, |n| n > 0) {
            return;
        }
        let Some(ch) = &self.channel else { return };
        if let Ok(Some(h)) = ch.get_cq_event(Some(EVENT_WAIT)) {
            if sh.cq.handle() == h {
                sh.cq.ack_events(1);
            }
        }
    }

    /// The shared CQ (`-e`), created with the first QP: room for every QP's send and receive completions, up to
    /// the daemon's default largest queue (a full CQ holds the daemon's completions back, it loses none).
    fn make_shared_cq(&mut self, p: &Params, depth: u32) -> Result<(), Fail> {
        if self.shared.is_none() {
            let Some(ch) = &self.channel else { return Err(err("no completion channel")) };
            let want = (depth * 2 + 16).saturating_mul(p.num_qps.max(1)).min(SHARED_CQ_MAX);
            let mut cq = self.dev.create_cq_with_channel(want, ch).map_err(err)?;
            if let Some((count, us)) = self.moderation {
                cq.set_event_moderation(count, us).map_err(|e| err(format!("--event-moderation {count}:{us}: {e}")))?;
            }
            self.shared = Some(Shared { cq, queued: Vec::new(), index: HashMap::new() });
        }
        Ok(())
    }
}

impl Nic for Daemon {
    fn port_mtu(&self) -> u32 {
        self.dev.info().mtu
    }

    fn gid(&self) -> [u8; 16] {
        self.dev.gid()
    }

    fn add_qp(&mut self, p: &Params, region_len: usize) -> Result<NewQp, Fail> {
        if self.pd.is_none() {
            self.pd = Some(self.dev.alloc_pd().map_err(err)?);
        }
        let depth = p.tx_depth.max(p.rx_depth).max(1);
        let own = if self.channel.is_some() { None } else { Some(self.dev.create_cq(depth * 2 + 16).map_err(err)?) };
        if own.is_none() {
            self.make_shared_cq(p, depth)?;
        }
        let pd = self.pd.as_ref().ok_or_else(|| err("no PD"))?;
        let mr = pd.reg_mr(region_len, AccessFlags::ALL).map_err(err)?;
        let init = QpInit { sq_depth: p.tx_depth.max(1), rq_depth: p.rx_depth.max(1), ..QpInit::default() };
        let cq = match (&own, &self.shared) {
            (Some(cq), _) | (None, Some(Shared { cq, .. })) => cq,
            (None, None) => return Err(err("no CQ for the QP")),
        };
        let qp = self.dev.create_qp(pd, cq, cq, init).map_err(err)?;
        qp.to_init(AccessFlags::ALL).map_err(err)?;
        let n = NewQp { qpn: qp.qpn(), rkey: mr.rkey(), va: mr.addr() };
        if let Some(sh) = &mut self.shared {
            sh.index.insert(qp.qpn(), self.qps.len());
            sh.queued.push(VecDeque::with_capacity(64));
        }
        self.qps.push(DQp { qp, cq: own, mr, rq_psn: 0 });
        Ok(n)
    }

    /// roce-dpd's port is up while it serves.
    fn start(&mut self, _: Duration) -> Result<(), Fail> {
        Ok(())
    }

    fn connect(&mut self, qps: &[Local], remote: &[Dest], mtu: Mtu, p: &Params, _: Duration) -> Result<(), Fail> {
        for ((d, l), r) in self.qps.iter_mut().zip(qps).zip(remote) {
            let (rtr, rts) = crate::rc_attrs(&rc_connect(l, r, mtu, p));
            // The daemon resolves the peer's MAC from its GID (ARP / neighbour discovery on its port).
            d.qp.modify(&ModifyQp { attr: rtr, gid: Some(r.gid), mac: None })
                .map_err(|e| err(format!("QP to RTR: {e}")))?;
            d.qp.modify(&ModifyQp { attr: rts, ..ModifyQp::default() }).map_err(|e| err(format!("QP to RTS: {e}")))?;
            d.rq_psn = r.psn;
        }
        Ok(())
    }

    fn post_send(&mut self, q: usize, wr: &SendWr, offset: u64, len: u32) -> Result<(), Fail> {
        let d = &mut self.qps[q];
        let sge = d.mr.sge(offset as usize, len);
        d.qp.post_send(wr, &[sge]).map_err(post_failed)
    }

    /// Staged in the send ring; published every [`STAGE_MAX`] WRs and at [`flush_sends`](Nic::flush_sends), so
    /// the worker starts on a long batch before its end. Inlined into the BW loop (the per-WR path: a call here
    /// was ~17 instructions a WR of saved registers).
    #[inline(always)]
    fn stage_send(&mut self, q: usize, wr: &SendWr, offset: u64, len: u32) -> Result<(), Fail> {
        let d = &mut self.qps[q];
        let sge = d.mr.sge(offset as usize, len);
        d.qp.stage_send(wr, &[sge]).map_err(post_failed)?;
        if d.qp.staged_sends() >= STAGE_MAX {
            d.qp.publish_sends();
        }
        Ok(())
    }

    fn flush_sends(&mut self, q: usize) {
        self.qps[q].qp.publish_sends();
    }

    fn post_recv(&mut self, q: usize, wr_id: u64, offset: u64, len: u32) -> Result<(), Fail> {
        let d = &mut self.qps[q];
        let sge = d.mr.sge(offset as usize, len);
        d.qp.post_recv(wr_id, &[sge]).map_err(|e| err(format!("post_recv: {e}")))
    }

    fn poll_cq(&mut self, q: usize, out: &mut [Cqe]) -> Result<usize, Fail> {
        let Some(sh) = &mut self.shared else {
            return self.qps[q].cq.as_mut().map_or(Ok(0), |cq| cq.poll(out).map_err(gone));
        };
        if sh.queued[q].is_empty() {
            // Take what the CQ has, each completion to its QP's queue (a QPN not ours: none of our QPs' business).
            let mut buf = [Cqe::EMPTY; 32];
            let k = sh.cq.poll(&mut buf).map_err(gone)?;
            for c in &buf[..k] {
                if let Some(&i) = sh.index.get(&c.qpn) {
                    sh.queued[i].push_back(*c);
                }
            }
        }
        let mut k = 0;
        while k < out.len() {
            let Some(c) = sh.queued[q].pop_front() else { break };
            out[k] = c;
            k += 1;
        }
        Ok(k)
    }

    fn mem(&mut self, q: usize) -> &[u8] {
        self.qps[q].mr.as_slice()
    }

    fn mem_mut(&mut self, q: usize) -> &mut [u8] {
        self.qps[q].mr.as_mut_slice()
    }

    /// The daemon's worker moves the frames.
    fn step(&mut self) -> bool {
        false
    }

    fn idle(&mut self, streak: u32) {
        if self.channel.is_some() {
            self.sleep_on_events();
        } else if !self.nap.is_zero() {
            std::thread::sleep(self.nap);
        } else if streak >= YIELD_AFTER {
            std::thread::yield_now();
        }
    }

    fn wait(&mut self) {
        std::thread::sleep(Duration::from_micros(500));
    }

    /// Counts the QPs' changes of the expected receive PSN (every request the responder accepted moves it).
    fn rx_activity(&mut self) -> u64 {
        if self.last_sample.elapsed() >= SAMPLE_EVERY {
            self.last_sample = Instant::now();
            for _ in 0..self.qps.len().min(SAMPLE_QPS) {
                self.next_sample = (self.next_sample + 1) % self.qps.len();
                let d = &mut self.qps[self.next_sample];
                // A failed query: the daemon is going; check_alive says so.
                if let Ok(info) = d.qp.query() {
                    if info.rq_psn != d.rq_psn {
                        d.rq_psn = info.rq_psn;
                        self.activity += 1;
                    }
                }
            }
        }
        self.activity
    }

    fn check_alive(&mut self) -> Result<(), Fail> {
        if self.last_alive.elapsed() < ALIVE_EVERY {
            return Ok(());
        }
        self.last_alive = Instant::now();
        self.dev.check_alive().map_err(gone)
    }

    fn failure_detail(&mut self, q: usize) -> String {
        let qpn = self.qps[q].qp.qpn();
        match self.dev.stats() {
            Ok(v) => detail(v.iter().filter(|s| s.scope == "qp" && s.id == qpn).map(|s| (s.name.as_str(), s.value))),
            Err(_) => String::new(),
        }
    }
}
