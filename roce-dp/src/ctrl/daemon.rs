//! The appliance's two halves, without DPDK: [`Server`] (control threads: the Unix socket, sessions, descriptor
//! passing, region creation, and the routing of each command to the worker that owns its object) and
//! [`Appliance`] (one per worker, owned by the worker that owns its engine: it executes the commands routed to it,
//! feeds the engine from its QPs' shared send and receive rings and moves completions into its CQ rings).
//! `roce-dpd` joins them to a DPDK port; tests join them to engines over an in-memory link.
//!
//! The two halves talk through one [`job_channel`] per worker (an `mpsc` channel of [`Job`]s beside a count of the
//! jobs sent and not yet taken): each worker looks at the count between bursts (one load of a line that only
//! changes when a command is sent) and takes its jobs with `try_recv` only when the count says there are some, and
//! answers each job on its own reply channel. So each engine is only ever touched by its worker, and control
//! requests wait at most one poll iteration.
//!
//! # Several workers
//! Each worker runs its own engine (worker `w` numbers its QPs from `qpn_base + w *`
//! [`QPN_STRIDE`](crate::engine::QPN_STRIDE)) and polls only its own QPs' rings. The server routes:
//! - a QP to one worker, chosen at `CreateQp`: the worker its CQs are bound to, else the worker with the fewest
//!   QPs (the lowest index on a tie); modify, query and destroy go to that worker;
//! - a CQ to the worker of the first QP that uses it (until then the server holds its ring region): its ring has
//!   one producer, so a QP whose send and receive CQs are bound to different workers is refused;
//! - PDs and MRs to every worker: worker 0 allocates the PD number and the keys, the others take the same ones
//!   ([`Cmd::SharePd`], [`Cmd::ShareMr`]), so a key means the same on every worker, locally and for peers;
//! - a modify-to-RTR whose peer MAC must be resolved to worker 0 first ([`Cmd::Resolve`]: it receives ARP/ND);
//! - statistics, reclaim and shutdown to every worker (reclaim last to worker 0, whose keys are then free).
//!
//! Commands that change what the routes know run one at a time (a mutex held only by control threads).
//!
//! Isolation: every handle a request names (PD, lkey, CQ, QPN) is looked up in the session's own objects; a
//! handle of another session is "not found". Each session has its own PDs, so the engine's PD check refuses an
//! SGE or rkey of another session's region (a key must belong to the QP's protection domain). A WQE the ring
//! reader refuses completes with [`Cqe::refused`](super::abi::Cqe::refused) and moves its QP to the error state;
//! inline payload is copied out of the slot's inline area once, at most the QP's `max_inline` bytes (a longer
//! `inline_len` is refused the same way, `vendor_err` 5). A session whose socket closes (its process exited or was
//! killed) has its QPs moved to the error state and everything it owned destroyed at once, on every worker.
//!
//! Completion channels: `CreateCompChannel` makes a socket pair here (the server keeps the daemon's end in its
//! routes; the client's end goes back with the reply); a CQ created with the channel carries the daemon's end to
//! the worker it is bound to, which signals it after publishing CQEs into the CQ when the client armed it
//! ([`super::client`] documents the protocol). The arm word is read from shared memory like any other hostile
//! input; the send never blocks. Event moderation (`ibv_modify_cq`'s `cq_count` / `cq_period`, the block's
//! `moderation` word, as hostile): an armed CQ's event is held until `count` completions were written since the
//! first of them, or until `period` microseconds after it, as the worker's turn clock ([`Appliance::set_now`])
//! sees it; a worker holding events looks at their periods once per [`Appliance::poll`]. The daemon's end closes when the session ends (routes and workers drop it).

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::abi::{self, SendRequest, SgeList, ABI_VERSION};
use super::proto::{Conn, DeviceInfo, ErrorCode, ModifyQp, ProtoError, Request, Response, StatRecord};
use super::shm::{Backing, DaemonCqRegion, DaemonQpRegion, QpRegionCaps, ShmBytes, ShmError, ShmRegion};
use super::wq::WqError;
pub use super::SessionLimits;
use crate::engine::{Engine, PostSendsStop};
use crate::mr::{AccessFlags, Pd};
use crate::neigh::{NeighIp, Neighbours};
use crate::qp::{PeerAddr, QpAttr, QpCaps, QpState, VerbsError};
use crate::verbs::{CqId, WcOpcode, WcStatus};
use crate::wire::{IpAddrs, MacAddr};

/// A command for a worker, from one session.
pub enum Cmd {
    /// Allocate a PD (worker 0: the engine picks the number).
    AllocPd,
    /// Take the PD worker 0 allocated (every other worker: the same number).
    SharePd(u32),
    /// Free a PD.
    DeallocPd(u32),
    /// Register a window of the session's shared memory (worker 0: the engine picks the keys).
    RegMr {
        /// PD.
        pd: u32,
        /// The client's address of the window's first byte.
        va: u64,
        /// The bytes.
        mem: ShmBytes,
        /// Rights.
        access: AccessFlags,
    },
    /// Register the window worker 0 registered, under its keys (every other worker).
    ShareMr {
        /// PD.
        pd: u32,
        /// The client's address of the window's first byte.
        va: u64,
        /// The bytes.
        mem: ShmBytes,
        /// Rights.
        access: AccessFlags,
        /// The key worker 0 chose (lkey = rkey).
        lkey: u32,
    },
    /// Deregister.
    DeregMr(u32),
    /// Bind a CQ the control thread made (its handle and ring region) to this worker.
    CreateCq {
        /// The handle the session knows it by.
        handle: u32,
        /// Ring region.
        region: Box<DaemonCqRegion>,
        /// The daemon's end of the completion channel the CQ signals, if it has one.
        event: Option<Arc<OwnedFd>>,
    },
    /// Destroy a CQ.
    DestroyCq(u32),
    /// Create a QP over a region the control thread made; its CQs are bound to this worker.
    CreateQp {
        /// PD.
        pd: u32,
        /// Send CQ.
        send_cq: u32,
        /// Receive CQ.
        recv_cq: u32,
        /// Ring region (its header gives the depths, SGE limits and `max_inline`).
        region: Box<DaemonQpRegion>,
    },
    /// Modify a QP.
    ModifyQp(u32, ModifyQp),
    /// The MAC of a peer GID (worker 0, which receives ARP/ND): sent on `mac`, answered `Ok`; not known yet:
    /// [`ErrorCode::Unresolved`] and a solicitation.
    Resolve {
        /// The peer's GID.
        gid: [u8; 16],
        /// Where its MAC goes.
        mac: mpsc::Sender<[u8; 6]>,
    },
    /// Query a QP.
    QueryQp(u32),
    /// Destroy a QP.
    DestroyQp(u32),
    /// Counters.
    Stats,
    /// The session ended: error its QPs and free everything it owned; true when it owned anything on any worker
    /// (it counts in `sessions_reclaimed`, alike on every worker).
    Reclaim(bool),
    /// The daemon is stopping: every QP of every session to the error state, completions flushed into the rings.
    Shutdown,
}

/// A command with its session and the channel its answer goes back on.
pub struct Job {
    /// Session id.
    pub client: u32,
    /// What to do.
    pub cmd: Cmd,
    /// Where the answer goes.
    pub reply: mpsc::Sender<Response>,
}

/// The control threads' end of a worker's job queue (cloned by every session thread).
#[derive(Clone)]
pub struct JobSender {
    tx: mpsc::Sender<Job>,
    pending: Arc<AtomicUsize>,
}

/// The worker's end of its job queue.
pub struct JobReceiver {
    rx: mpsc::Receiver<Job>,
    pending: Arc<AtomicUsize>,
}

/// A worker's job queue: an `mpsc` channel and the count of jobs sent and not yet taken, so that the worker's idle
/// turn costs one load of the count instead of a `try_recv` of the channel.
pub fn job_channel() -> (JobSender, JobReceiver) {
    let (tx, rx) = mpsc::channel();
    let pending = Arc::new(AtomicUsize::new(0));
    (JobSender { tx, pending: pending.clone() }, JobReceiver { rx, pending })
}

impl JobSender {
    /// Queues a job for the worker; false if the worker's end is gone (the job is dropped).
    #[must_use]
    pub fn send(&self, job: Job) -> bool {
        if self.tx.send(job).is_err() {
            return false;
        }
        // After the send (Release): a worker that sees the count sees the job in the channel.
        self.pending.fetch_add(1, Ordering::Release);
        true
    }
}

impl JobReceiver {
    /// The next job, if one was sent: [`TryRecvError::Empty`](mpsc::TryRecvError::Empty) at the cost of one load
    /// when none is pending.
    #[inline]
    pub fn try_recv(&self) -> Result<Job, mpsc::TryRecvError> {
        if self.pending.load(Ordering::Acquire) == 0 {
            return Err(mpsc::TryRecvError::Empty);
        }
        let job = self.rx.try_recv()?;
        self.pending.fetch_sub(1, Ordering::Relaxed);
        Ok(job)
    }
}

/// Counters of the appliance (scope `daemon` in the statistics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ApplianceStats {
    /// Send WQEs taken from the rings and posted to the engine.
    pub wqes_posted: u64,
    /// Receive WQEs posted.
    pub recvs_posted: u64,
    /// WQEs refused (bad fields, corrupt ring, or refused by the engine); each moved its QP to the error state.
    pub wqes_refused: u64,
    /// CQEs written into CQ rings.
    pub cqes_delivered: u64,
    /// CQEs dropped because their CQ ring was corrupt (or a refusal beyond the CQ's depth of held ones).
    pub cqes_dropped: u64,
    /// Completions of refused WQEs held back behind the engine's completions of their CQ or a full ring (each
    /// delivered in its place among them, as the ring has room, unless its QP is destroyed first).
    pub cqes_held: u64,
    /// WQEs a modify to RESET discarded without completions: those still in the QP's rings, and a refused one
    /// still waiting for the WRs before it (each a WR the application posted before the reset).
    pub wqes_discarded_reset: u64,
    /// Completions of a destroyed QP dropped by its destroy before they reached the CQ ring: the engine's still
    /// queued, and refusals held (what the ring already holds the client library skips).
    pub cqes_discarded_destroy: u64,
    /// Ended sessions that owned something (a PD, CQ, QP, MR or completion channel) and had it reclaimed; a session
    /// that only asked (`roce-stat`, an ABI probe) is not counted.
    pub sessions_reclaimed: u64,
    /// Commands served.
    pub commands: u64,
    /// Completion channels signalled (an armed CQ got its completion; one message on the channel's socket each).
    pub events_signalled: u64,
    /// Of those, messages the channel's socket did not take (its queue full or the client's end closed: the
    /// client's end is readable anyway, or nobody listens any more).
    pub events_unsent: u64,
}

struct CqSlot {
    client: u32,
    /// The session's handle.
    handle: u32,
    region: DaemonCqRegion,
    /// The client corrupted the ring's indices: completions are dropped.
    broken: bool,
    /// The completion channel and the arm sequence answered last.
    event: Option<CqEvent>,
    /// Completions of refused WQEs that must wait (at most the ring's capacity; see [`Appliance::poll_qp`]), each
    /// with the count of the engine's completions of this CQ that go before it ([`CqSlot::popped`] reaching it).
    refusals: std::collections::VecDeque<(u64, abi::Cqe)>,
    /// The engine's completions of this CQ taken so far (delivered or dropped).
    popped: u64,
}

/// A CQ's completion channel, worker side (see [`super::client`] for the protocol).
struct CqEvent {
    fd: Arc<OwnedFd>,
    /// The arm sequence this worker answered last (its own copy: the region's `fired` word is the client's to
    /// scribble on).
    answered: u32,
    /// An event held by the CQ's moderation: completions written since it was first held, and when (ns).
    held: Option<(u32, u64)>,
    /// When (the worker's turn clock, ns) the last event was signalled, while its client has not armed the CQ
    /// again since ([`Appliance::event_unserved`]).
    fired_at: Option<u64>,
}

impl CqEvent {
    /// Called after CQEs were published into the CQ's ring: signals the channel once if the client armed the CQ
    /// since the last signal and the batch answers the arm (`qualifies`: it held a solicited or a failed
    /// completion; a plain arm takes any). The SeqCst fence pairs with the client's between its arm store and its
    /// re-poll: either the worker sees the arm here or the client's re-poll sees the CQEs. The arm word is hostile:
    /// any value only makes this session's own channel fire, at most once per batch.
    ///
    /// Moderation: a plain arm on a CQ whose `moderation` word asks for it holds the event while fewer than
    /// `count` completions (`pushed` per batch, counted across re-arms) were written since the first held one and
    /// less than its period passed (`now`, ns); [`check_held`](Self::check_held) fires it when the period ends.
    fn after_publish(
        &mut self,
        notify: &super::ring::NotifyView,
        pushed: u32,
        qualifies: bool,
        now: u64,
        stats: &mut ApplianceStats,
    ) {
        std::sync::atomic::fence(Ordering::SeqCst);
        let word = notify.arm();
        let seq = word >> 1;
        if seq == 0 || seq == self.answered || (word & abi::ARM_SOLICITED != 0 && !qualifies) {
            return;
        }
        if word & abi::ARM_SOLICITED == 0 {
            let (count, period) = abi::moderation_parts(notify.moderation());
            if count > 1 && period > 0 {
                let (n, since) = self.held.get_or_insert((0, now));
                *n = n.saturating_add(pushed);
                if *n < u32::from(count) && now.saturating_sub(*since) < u64::from(period) * 1000 {
                    return;
                }
            }
        }
        self.fire(notify, seq, now, stats);
    }

    /// A held event whose period ran out (by the current `moderation` word) fires for the current arm; a held
    /// event whose arm was answered or turned solicited-only is dropped. Returns whether one is still held.
    fn check_held(&mut self, notify: &super::ring::NotifyView, now: u64, stats: &mut ApplianceStats) -> bool {
        let Some((_, since)) = self.held else { return false };
        let (_, period) = abi::moderation_parts(notify.moderation());
        if now.saturating_sub(since) < u64::from(period) * 1000 {
            return true;
        }
        std::sync::atomic::fence(Ordering::SeqCst);
        let word = notify.arm();
        let seq = word >> 1;
        if seq == 0 || seq == self.answered || word & abi::ARM_SOLICITED != 0 {
            self.held = None;
        } else {
            self.fire(notify, seq, now, stats);
        }
        false
    }

    fn fire(&mut self, notify: &super::ring::NotifyView, seq: u32, now: u64, stats: &mut ApplianceStats) {
        self.held = None;
        self.answered = seq;
        self.fired_at = Some(now);
        notify.set_fired(seq);
        stats.events_signalled += 1;
        if !super::shm::channel_signal(self.fd.as_fd()) {
            stats.events_unsent += 1;
        }
    }
}

/// How long after signalling an event [`Appliance::event_unserved`] keeps saying that its client may still wait
/// for the core (ns): longer than a scheduler tick at HZ=250 (4 ms), the longest such wait measured (session 12).
pub const UNSERVED_WINDOW_NS: u64 = 5_000_000;

/// Whether a completion answers a solicited-only arm: a solicited receive or any failed completion (IB: the
/// solicited-event bit on the message's last packet, or an error).
fn answers_solicited(c: &crate::verbs::Cqe) -> bool {
    c.solicited || c.status != WcStatus::Success
}

struct QpSlot {
    qpn: u32,
    client: u32,
    send_cq: CqId,
    recv_cq: CqId,
    region: DaemonQpRegion,
    sq_cap: u32,
    rq_cap: u32,
    /// The capacity of its send and receive CQs' rings (see [`Appliance::poll_qp`]).
    send_cq_cap: u32,
    recv_cq_cap: u32,
    /// A ring of this QP is corrupt: it is no longer read.
    broken: bool,
    /// A send WQE the daemon refused, whose completion waits until every WR posted before it has completed
    /// (the QP's send ring is not read meanwhile; its receive ring is).
    refusal: Option<abi::Cqe>,
}

/// A worker's half: the sessions' objects on its engine.
pub struct Appliance {
    /// This worker's index (statistics scopes).
    worker: u32,
    pds: HashMap<u32, u32>,
    /// lkey -> (client, pd).
    mrs: HashMap<u32, (u32, u32)>,
    /// By the engine's CQ id.
    cqs: Vec<Option<CqSlot>>,
    /// The sessions' CQ handles -> the engine's CQ ids.
    cq_ids: HashMap<u32, CqId>,
    qps: Vec<QpSlot>,
    req: SendRequest,
    sges: SgeList,
    /// Inline payload copied out of a send-queue slot ([`abi::MAX_INLINE_DATA`] bytes, allocated once).
    inline: Vec<u8>,
    /// The worker's turn clock (ns), for event moderation ([`set_now`](Self::set_now)).
    now: u64,
    /// Nonzero when a CQ may hold a moderated event (an upper bound: [`poll`](Self::poll) recounts when it looks).
    holding: u32,
    /// Nonzero when a signalled event may still wait for its client to run (an upper bound:
    /// [`event_unserved`](Self::event_unserved) recounts when it looks).
    unserved: u32,
    /// Counters.
    pub stats: ApplianceStats,
}

impl Default for Appliance {
    fn default() -> Appliance {
        Appliance::for_worker(0)
    }
}

fn err(code: ErrorCode, msg: impl Into<String>) -> Response {
    Response::Error { code, msg: msg.into() }
}

fn verbs_err(e: VerbsError) -> Response {
    let code = match e {
        VerbsError::NoSuchQp(_) | VerbsError::NoSuchCq(_) => ErrorCode::NotFound,
        VerbsError::ResourceExhausted(_) => ErrorCode::Exhausted,
        VerbsError::InUse(_) => ErrorCode::Busy,
        _ => ErrorCode::Invalid,
    };
    err(code, e.to_string())
}

/// The CQE of a WQE the daemon refuses (the QP then goes to the error state).
fn refused(wr_id: u64, qpn: u32, opcode: WcOpcode, vendor_err: u32) -> abi::Cqe {
    abi::Cqe {
        wr_id,
        status: WcStatus::LocQpOpErr.code() as u8,
        opcode: abi::wc_opcode_code(opcode),
        qpn,
        vendor_err,
        ..abi::Cqe::default()
    }
}

/// `vendor_err` of a WQE the engine refused at post time (the ring reader's own codes are below 0x100).
pub const VENDOR_ENGINE_REFUSED: u32 = 0x100;
/// `vendor_err` of the WQE that found a ring's indices corrupt.
pub const VENDOR_RING_CORRUPT: u32 = 0x101;

fn gid_addrs(gid: [u8; 16], local: crate::qp::LocalIp) -> Result<(IpAddrs, NeighIp), Response> {
    // A GID that is no host's (`::`, a broadcast, multicast or loopback address) was solicited with ARP/ND on the
    // port's network for the 3 s resolution timeout, then refused as "no ARP/ND answer" (`::` as "IPv6 GID but
    // the port has no IPv6 address"); given with a MAC, the QP sent its frames to that IP address.
    if let Some(why) = crate::wire::gid_not_unicast(gid) {
        let why = format!("peer GID {} is {why}, not the address of a RoCE port", std::net::Ipv6Addr::from(gid));
        return Err(err(ErrorCode::Invalid, why));
    }
    if gid[..12] == [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff] {
        let dst: [u8; 4] = gid[12..].try_into().expect("4 bytes");
        let src = local.v4.ok_or_else(|| err(ErrorCode::Invalid, "IPv4 GID but the port has no IPv4 address"))?;
        Ok((IpAddrs::V4 { src, dst }, NeighIp::V4(dst)))
    } else {
        let src = local.v6.ok_or_else(|| err(ErrorCode::Invalid, "IPv6 GID but the port has no IPv6 address"))?;
        Ok((IpAddrs::V6 { src, dst: gid }, NeighIp::V6(gid)))
    }
}

/// The peer's addresses for a GID: the IP pair and the MAC (`given`, the port's own for its own address, else the
/// neighbour table's). Not in the table: [`ErrorCode::Unresolved`] and the address to solicit.
fn peer_of(
    e: &Engine,
    neigh: &Neighbours,
    gid: [u8; 16],
    given: Option<[u8; 6]>,
) -> Result<(IpAddrs, MacAddr), (Response, Option<NeighIp>)> {
    let cfg = e.config();
    let (ip, nip) = gid_addrs(gid, cfg.local_ip).map_err(|r| (r, None))?;
    let own = match nip {
        NeighIp::V4(a) => cfg.local_ip.v4 == Some(a),
        NeighIp::V6(a) => cfg.local_ip.v6 == Some(a),
    };
    let mac = match given {
        // The next hop of a unicast connection (the neighbour table never learns these either).
        Some(mac) if mac[0] & 1 != 0 || mac == [0; 6] => {
            let shown: Vec<String> = mac.iter().map(|b| format!("{b:02x}")).collect();
            let why = format!(
                "peer MAC {} is a multicast, broadcast or zero address, not a unicast next hop",
                shown.join(":")
            );
            return Err((err(ErrorCode::Invalid, why), None));
        }
        Some(mac) => MacAddr(mac),
        None if own => cfg.local_mac,
        None => match neigh.lookup(nip) {
            Some(mac) => mac,
            None => return Err((err(ErrorCode::Unresolved, "peer MAC not resolved yet (ARP/ND sent)"), Some(nip))),
        },
    };
    Ok((ip, mac))
}

/// Names of the `daemon` counters every worker holds the same value of (PDs and MRs live on every worker, and
/// every worker reclaims every ended session): a statistics merge takes worker 0's instead of the sum.
const SHARED_COUNTERS: [&str; 4] = ["sessions_with_objects", "mrs", "pds", "sessions_reclaimed"];

impl Appliance {
    /// An appliance with no sessions (worker 0).
    pub fn new() -> Appliance {
        Appliance::for_worker(0)
    }

    /// An appliance with no sessions for worker `worker` (the id of its `worker` and `engine` statistics).
    pub fn for_worker(worker: u32) -> Appliance {
        Appliance {
            worker,
            pds: HashMap::new(),
            mrs: HashMap::new(),
            cqs: Vec::new(),
            cq_ids: HashMap::new(),
            qps: Vec::new(),
            req: SendRequest::default(),
            sges: SgeList::default(),
            inline: vec![0; abi::MAX_INLINE_DATA as usize],
            now: 0,
            holding: 0,
            unserved: 0,
            stats: ApplianceStats::default(),
        }
    }

    /// Live QPs, CQs, MRs and PDs of all sessions on this worker.
    pub fn counts(&self) -> (usize, usize, usize, usize) {
        (self.qps.len(), self.cqs.iter().flatten().count(), self.mrs.len(), self.pds.len())
    }

    fn own_pd(&self, client: u32, pd: u32) -> Result<Pd, Response> {
        match self.pds.get(&pd) {
            Some(&c) if c == client => Ok(Pd(pd)),
            _ => Err(err(ErrorCode::NotFound, format!("no protection domain {pd} in this session"))),
        }
    }

    fn own_cq(&self, client: u32, handle: u32) -> Result<CqId, Response> {
        match self.cq_ids.get(&handle).map(|id| (id, self.cqs.get(id.0 as usize))) {
            Some((&id, Some(Some(s)))) if s.client == client => Ok(id),
            _ => Err(err(ErrorCode::NotFound, format!("no completion queue {handle} in this session"))),
        }
    }

    fn own_qp(&self, client: u32, qpn: u32) -> Result<usize, Response> {
        self.qps
            .iter()
            .position(|q| q.qpn == qpn && q.client == client)
            .ok_or_else(|| err(ErrorCode::NotFound, format!("no queue pair {qpn:#x} in this session")))
    }

    /// Serves one job (the answer goes back on its channel). Returns an address to solicit (ARP/ND) when a
    /// modify-to-RTR or a [`Cmd::Resolve`] needs a MAC the neighbour table does not have yet; the control thread
    /// retries.
    pub fn serve(
        &mut self,
        e: &mut Engine,
        neigh: &Neighbours,
        job: Job,
        extra_stats: &dyn Fn(&mut Vec<StatRecord>),
    ) -> Option<NeighIp> {
        self.stats.commands += 1;
        let mut solicit = None;
        let r = match self.execute(e, neigh, job.client, job.cmd, extra_stats) {
            Ok(r) => r,
            Err((r, s)) => {
                solicit = s;
                r
            }
        };
        let _ = job.reply.send(r);
        solicit
    }

    fn execute(
        &mut self,
        e: &mut Engine,
        neigh: &Neighbours,
        client: u32,
        cmd: Cmd,
        extra_stats: &dyn Fn(&mut Vec<StatRecord>),
    ) -> Result<Response, (Response, Option<NeighIp>)> {
        let no = |r: Response| (r, None);
        Ok(match cmd {
            Cmd::AllocPd => {
                // After 2^32 allocations the numbers wrap: skip those still in use (another session's PD number
                // must never be handed out twice).
                let mut pd = e.alloc_pd();
                while self.pds.contains_key(&pd.0) {
                    pd = e.alloc_pd();
                }
                self.pds.insert(pd.0, client);
                Response::Pd { pd: pd.0 }
            }
            Cmd::SharePd(pd) => {
                if self.pds.get(&pd).is_some_and(|&c| c != client) {
                    return Err(no(err(ErrorCode::Busy, format!("protection domain {pd} belongs to another session"))));
                }
                self.pds.insert(pd, client);
                Response::Pd { pd }
            }
            Cmd::DeallocPd(pd) => {
                self.own_pd(client, pd).map_err(no)?;
                if self.mrs.values().any(|&(_, p)| p == pd) {
                    return Err(no(err(ErrorCode::Busy, format!("protection domain {pd} still has memory regions"))));
                }
                self.pds.remove(&pd);
                Response::Ok
            }
            Cmd::RegMr { pd, va, mem, access } => {
                let pd = self.own_pd(client, pd).map_err(no)?;
                let k = e.reg_mr_shared(pd, va, mem, access).map_err(|x| no(verbs_err(x)))?;
                self.mrs.insert(k.lkey, (client, pd.0));
                Response::Mr { lkey: k.lkey, rkey: k.rkey }
            }
            Cmd::ShareMr { pd, va, mem, access, lkey } => {
                let pd = self.own_pd(client, pd).map_err(no)?;
                let k = e.reg_mr_shared_at(lkey, pd, va, mem, access).map_err(|x| no(verbs_err(x)))?;
                self.mrs.insert(k.lkey, (client, pd.0));
                Response::Mr { lkey: k.lkey, rkey: k.rkey }
            }
            Cmd::DeregMr(lkey) => {
                match self.mrs.get(&lkey) {
                    Some(&(c, _)) if c == client => {}
                    _ => {
                        return Err(no(err(ErrorCode::NotFound, format!("no memory region {lkey:#x} in this session"))))
                    }
                }
                e.dereg_mr(lkey);
                self.mrs.remove(&lkey);
                Response::Ok
            }
            Cmd::CreateCq { handle, region, event } => {
                if self.cq_ids.contains_key(&handle) {
                    return Err(no(err(ErrorCode::Busy, format!("completion queue {handle} is already bound"))));
                }
                // The engine's CQ holds what the ring cannot take yet.
                let cq = e.create_cq(region.header.sq.capacity).map_err(|x| no(verbs_err(x)))?;
                let i = cq.0 as usize;
                if self.cqs.len() <= i {
                    self.cqs.resize_with(i + 1, || None);
                }
                let event = event.map(|fd| CqEvent { fd, answered: 0, held: None, fired_at: None });
                self.cqs[i] = Some(CqSlot {
                    client,
                    handle,
                    region: *region,
                    broken: false,
                    event,
                    refusals: Default::default(),
                    popped: 0,
                });
                self.cq_ids.insert(handle, cq);
                Response::Cq { cq: handle }
            }
            Cmd::DestroyCq(handle) => {
                let id = self.own_cq(client, handle).map_err(no)?;
                e.destroy_cq(id).map_err(|x| no(verbs_err(x)))?;
                self.cqs[id.0 as usize] = None;
                self.cq_ids.remove(&handle);
                Response::Ok
            }
            Cmd::CreateQp { pd, send_cq, recv_cq, region } => {
                let pd = self.own_pd(client, pd).map_err(no)?;
                let scq = self.own_cq(client, send_cq).map_err(no)?;
                let rcq = self.own_cq(client, recv_cq).map_err(no)?;
                let h = region.header;
                let caps = QpCaps {
                    max_send_wr: h.sq.capacity,
                    max_recv_wr: h.rq.capacity,
                    max_send_sge: h.sq_sges.per_slot + 1,
                    max_recv_sge: h.rq_sges.per_slot + 1,
                    max_inline: h.sq_inline.per_slot,
                };
                let qpn = e.create_qp(pd, scq, rcq, caps).map_err(|x| no(verbs_err(x)))?;
                // The engine's CQs hold their ring's capacity plus every WR of their QPs (see `poll_qp`); the
                // depth only grows (a destroyed QP's WRs complete without completions), the memory as entries come.
                e.set_cq_depth(scq, e.cq_depth(scq).saturating_add(caps.max_send_wr));
                e.set_cq_depth(rcq, e.cq_depth(rcq).saturating_add(caps.max_recv_wr));
                let ring_cap = |cq: CqId| match self.cqs.get(cq.0 as usize) {
                    Some(Some(c)) => c.region.header.sq.capacity,
                    _ => 0,
                };
                let (send_cq_cap, recv_cq_cap) = (ring_cap(scq), ring_cap(rcq));
                self.qps.push(QpSlot {
                    qpn,
                    client,
                    send_cq: scq,
                    recv_cq: rcq,
                    region: *region,
                    sq_cap: caps.max_send_wr,
                    rq_cap: caps.max_recv_wr,
                    send_cq_cap,
                    recv_cq_cap,
                    broken: false,
                    refusal: None,
                });
                Response::Qp { qpn }
            }
            Cmd::ModifyQp(qpn, m) => {
                let i = self.own_qp(client, qpn).map_err(no)?;
                let mut attr = QpAttr { peer: None, ..m.attr };
                if let Some(gid) = m.gid {
                    let (ip, mac) = peer_of(e, neigh, gid, m.mac)?;
                    attr.peer = Some(PeerAddr { ip, mac });
                }
                e.modify_qp(qpn, &attr).map_err(|x| no(verbs_err(x)))?;
                if attr.state == Some(QpState::Reset) {
                    // RESET discards every WR posted before it without a completion: the refused one waiting
                    // behind the engine's, and those still in the rings (a refusal waiting leaves them there).
                    // Read later, they went to the QP's new life: refused in RESET or INIT, it went to ERR. At
                    // most a ring's capacity each (a client that keeps posting does not hold the worker here).
                    // Counted in `wqes_discarded_reset`.
                    let q = &mut self.qps[i];
                    let mut n = u64::from(q.refusal.take().is_some());
                    for _ in 0..q.sq_cap {
                        match q.region.sq.poll_into(&mut self.req, &mut self.inline) {
                            Ok(true) | Err(WqError::Wqe { .. }) => n += 1,
                            Ok(false) | Err(_) => break,
                        }
                    }
                    q.region.sq.release();
                    for _ in 0..q.rq_cap {
                        match q.region.rq.poll_into(&mut self.sges) {
                            Ok(Some(_)) | Err(WqError::Wqe { .. }) => n += 1,
                            Ok(None) | Err(_) => break,
                        }
                    }
                    q.region.rq.release();
                    self.stats.wqes_discarded_reset += n;
                }
                Response::Ok
            }
            Cmd::Resolve { gid, mac } => {
                let (_, m) = peer_of(e, neigh, gid, None)?;
                let _ = mac.send(m.0);
                Response::Ok
            }
            Cmd::QueryQp(qpn) => {
                self.own_qp(client, qpn).map_err(no)?;
                Response::QpInfo(e.query_qp(qpn).map_err(|x| no(verbs_err(x)))?)
            }
            Cmd::DestroyQp(qpn) => {
                let i = self.own_qp(client, qpn).map_err(no)?;
                let (scq, rcq) = (self.qps[i].send_cq, self.qps[i].recv_cq);
                self.forget_cqes(e, scq, qpn);
                if rcq != scq {
                    self.forget_cqes(e, rcq, qpn);
                }
                let _ = e.destroy_qp(qpn);
                self.qps.swap_remove(i);
                // Every completion of the QP this worker wrote is before these tails (deliver and refuse publish
                // what they push before they return), and none of a later QP of the same number can be.
                Response::QpDestroyed { send_tail: self.ring_tail(scq), recv_tail: self.ring_tail(rcq) }
            }
            Cmd::Stats => Response::Stats(self.stat_records(e, extra_stats)),
            Cmd::Reclaim(owned) => {
                self.reclaim(e, client);
                self.stats.sessions_reclaimed += u64::from(owned);
                Response::Ok
            }
            Cmd::Shutdown => {
                let err_attr = QpAttr { state: Some(QpState::Err), ..QpAttr::default() };
                for q in &self.qps {
                    let _ = e.modify_qp(q.qpn, &err_attr);
                }
                self.deliver(e);
                Response::Ok
            }
        })
    }

    /// Moves the session's QPs to the error state and destroys everything it owned.
    fn reclaim(&mut self, e: &mut Engine, client: u32) {
        let err_attr = QpAttr { state: Some(QpState::Err), ..QpAttr::default() };
        self.qps.retain(|q| {
            if q.client != client {
                return true;
            }
            let _ = e.modify_qp(q.qpn, &err_attr);
            let _ = e.destroy_qp(q.qpn);
            false
        });
        for (i, slot) in self.cqs.iter_mut().enumerate() {
            if let Some(s) = slot.as_ref().filter(|s| s.client == client) {
                self.cq_ids.remove(&s.handle);
                let _ = e.destroy_cq(CqId(i as u32));
                *slot = None;
            }
        }
        self.mrs.retain(|&lkey, &mut (c, _)| {
            if c == client {
                e.dereg_mr(lkey);
            }
            c != client
        });
        self.pds.retain(|_, c| *c != client);
    }

    /// This worker's records: the `daemon` scope (its objects and counters: [`Server`] merges the workers'), its
    /// own objects and ring counters again under `worker` (id = worker), its engine's counters under `engine` (id
    /// = worker), each QP (with its `worker`), then what `extra` adds (the worker loop's and the port's counters).
    fn stat_records(&self, e: &Engine, extra: &dyn Fn(&mut Vec<StatRecord>)) -> Vec<StatRecord> {
        let mut v = Vec::new();
        let mut rec = |scope: &str, id: u32, name: &str, value: u64| {
            v.push(StatRecord { scope: scope.into(), id, name: name.into(), value })
        };
        let (qps, cqs, mrs, pds) = self.counts();
        let s = &self.stats;
        let sessions: std::collections::HashSet<u32> = self.pds.values().copied().collect();
        let own = [
            ("qps", qps as u64),
            ("cqs", cqs as u64),
            ("wqes_posted", s.wqes_posted),
            ("recvs_posted", s.recvs_posted),
            ("wqes_refused", s.wqes_refused),
            ("cqes_delivered", s.cqes_delivered),
            ("cqes_dropped", s.cqes_dropped),
            ("cqes_held", s.cqes_held),
            ("wqes_discarded_reset", s.wqes_discarded_reset),
            ("cqes_discarded_destroy", s.cqes_discarded_destroy),
            ("commands", s.commands),
            ("events_signalled", s.events_signalled),
            ("events_unsent", s.events_unsent),
        ];
        for (n, val) in [
            ("sessions_with_objects", sessions.len() as u64),
            ("qps", qps as u64),
            ("cqs", cqs as u64),
            ("mrs", mrs as u64),
            ("pds", pds as u64),
            ("wqes_posted", s.wqes_posted),
            ("recvs_posted", s.recvs_posted),
            ("wqes_refused", s.wqes_refused),
            ("cqes_delivered", s.cqes_delivered),
            ("cqes_dropped", s.cqes_dropped),
            ("cqes_held", s.cqes_held),
            ("wqes_discarded_reset", s.wqes_discarded_reset),
            ("cqes_discarded_destroy", s.cqes_discarded_destroy),
            ("sessions_reclaimed", s.sessions_reclaimed),
            ("commands", s.commands),
            ("events_signalled", s.events_signalled),
            ("events_unsent", s.events_unsent),
        ] {
            rec("daemon", 0, n, val);
        }
        for (n, val) in own {
            rec("worker", self.worker, n, val);
        }
        for (n, val) in e.stats().iter() {
            rec("engine", self.worker, n, val);
        }
        for q in &self.qps {
            rec("qp", q.qpn, "client", u64::from(q.client));
            rec("qp", q.qpn, "worker", u64::from(self.worker));
            if let Ok(info) = e.query_qp(q.qpn) {
                rec("qp", q.qpn, "state", u64::from(info.state as u8));
            }
            if let Some(cc) = e.qp_cc_state(q.qpn) {
                rec("qp", q.qpn, "rate_kbps", cc.rate_kbps);
            }
            if let Some(c) = e.qp_counters(q.qpn) {
                for (n, val) in c.iter() {
                    rec("qp", q.qpn, n, val);
                }
            }
        }
        extra(&mut v);
        v
    }

    /// One pass over every QP's rings (new WQEs to the engine) and every CQ (engine completions to the ring).
    /// Returns whether anything moved.
    pub fn poll(&mut self, e: &mut Engine) -> bool {
        let mut busy = false;
        for i in 0..self.qps.len() {
            busy |= self.poll_qp(e, i);
        }
        if self.holding > 0 {
            self.check_held();
        }
        busy | self.deliver(e)
    }

    /// The worker's clock (its turn's time), on which event moderation's periods count: call it every turn
    /// (periods count from the last time it was called).
    pub fn set_now(&mut self, now: crate::time::Instant) {
        self.now = now.0;
    }

    /// Whether an event may be held by moderation (for a worker that reads its clock only when it needs it).
    pub fn holds_events(&self) -> bool {
        self.holding > 0
    }

    /// Whether a completion event this worker signalled less than [`UNSERVED_WINDOW_NS`] ago (by the turn clock)
    /// still waits for its client: the client has not armed the CQ again since. A worker that finds nothing to do
    /// yields its core while this holds (roce-dpd), so that a client woken on the worker's core that the scheduler
    /// did not let preempt the busy worker runs now instead of after the worker's slice, while its QPs run dry.
    /// Cheap when nothing is pending (one load); the arm words are hostile input like everywhere else: a client
    /// that never arms again, or writes any other value, only makes the worker yield on its idle turns until the
    /// window ends.
    pub fn event_unserved(&mut self) -> bool {
        if self.unserved == 0 {
            return false;
        }
        let mut n = 0;
        for s in self.cqs.iter_mut().flatten() {
            let Some(ev) = s.event.as_mut() else { continue };
            let Some(at) = ev.fired_at else { continue };
            if s.region.notify.arm() >> 1 != ev.answered || self.now.saturating_sub(at) >= UNSERVED_WINDOW_NS {
                ev.fired_at = None;
            } else {
                n += 1;
            }
        }
        self.unserved = n;
        n > 0
    }

    /// Fires held events whose period ended; recounts the CQs still holding one.
    fn check_held(&mut self) {
        let mut holding = 0;
        for s in self.cqs.iter_mut().flatten() {
            if let Some(ev) = s.event.as_mut() {
                holding += u32::from(ev.check_held(&s.region.notify, self.now, &mut self.stats));
                self.unserved |= u32::from(ev.fired_at.is_some());
            }
        }
        self.holding = holding;
    }

    fn poll_qp(&mut self, e: &mut Engine, i: usize) -> bool {
        let q = &mut self.qps[i];
        if let Some(cqe) = q.refusal {
            // A send queue's completions come in the order its WRs were posted. The WRs before the refused one
            // complete first, as they would on a NIC (which refuses a bad WR at post time, or errors at it while
            // executing in order); then its completion, and the QP goes to error (the rest are flushed). The send
            // ring is not read meanwhile; the receive ring is (below): the two queues are independent, and a
            // peer's SEND in the wait must find the receives the application posted, not RNR NAKs.
            if e.wq_lens(q.qpn).is_none_or(|(sq, _)| sq == 0) {
                q.refusal = None;
                self.refuse(e, i, cqe);
                return true;
            }
        }
        let q = &mut self.qps[i];
        if q.broken {
            return false;
        }
        // An idle QP costs a look at each ring's cached tail (a load of the client's tail only when the cache says
        // empty); the engine is asked for its queues' room only when a ring has something.
        let (sq_new, rq_new) = (q.refusal.is_none() && q.region.sq.has_work(), q.region.rq.has_work());
        if !sq_new && !rq_new {
            return false;
        }
        let Some((sq_len, rq_len)) = e.wq_lens(q.qpn) else { return false };
        let mut moved = false;
        let mut failed: Option<abi::Cqe> = None;
        // No completion is lost to a CQ smaller than what its QPs have outstanding (an overflow of the engine's
        // CQ drops the completion and errors the QP: the application only sees completions that never come). The
        // engine's CQ holds its ring's capacity plus every WR of its QPs (set at create_qp), and a QP is fed new
        // WRs only while its CQ's engine queue holds less than a ring's capacity: then what is in it plus every WR
        // its QPs can have in the engine fits, whatever completes. The engine's queue grows that far only when
        // the ring is full too (the application is not polling): then the WRs wait in the QP's ring until it
        // polls, and posts find the ring full.
        let cq_full = |cq: CqId, cap: u32| e.cq_len(cq) >= cap as usize;
        let (scq_full, rcq_full) =
            (sq_new && cq_full(q.send_cq, q.send_cq_cap), rq_new && cq_full(q.recv_cq, q.recv_cq_cap));
        // Send queue: only as many as the engine's queue has room for; the rest wait in the ring. Each WQE is
        // validated straight into the engine's next send-queue slot (inline payload copied out of the ring's inline
        // area into the slot's, at most the QP's max_inline bytes: the reader refuses a longer inline_len); the
        // engine checks each as post_send does, wakes the requester once per batch.
        let room = if sq_new && !scq_full { q.sq_cap.saturating_sub(sq_len) } else { 0 };
        if room > 0 {
            let sq = &mut q.region.sq;
            // (Err, no such QP, cannot happen: wq_lens found it.)
            let (posted, stop) = e.post_sends_with(q.qpn, room, |slot| sq.poll_to(slot)).unwrap_or_default();
            moved |= posted > 0;
            self.stats.wqes_posted += u64::from(posted);
            match stop {
                None => {}
                Some(PostSendsStop::Refused { wr_id, .. }) => {
                    moved = true;
                    q.refusal = Some(refused(wr_id, q.qpn, WcOpcode::Send, VENDOR_ENGINE_REFUSED));
                }
                Some(PostSendsStop::Source(WqError::Wqe { wr_id, error, .. })) => {
                    moved = true;
                    q.refusal = Some(abi::Cqe::refused(wr_id, q.qpn, WcOpcode::Send, &error));
                }
                Some(PostSendsStop::Source(_)) => {
                    q.broken = true;
                    failed = Some(refused(0, q.qpn, WcOpcode::Send, VENDOR_RING_CORRUPT));
                }
            }
        }
        q.region.sq.release();
        let mut room = if rq_new && !rcq_full { q.rq_cap.saturating_sub(rq_len) } else { 0 };
        while room > 0 && failed.is_none() {
            match q.region.rq.poll_into(&mut self.sges) {
                Ok(None) => break,
                Ok(Some(wr_id)) => {
                    moved = true;
                    room -= 1;
                    match e.post_recv(q.qpn, wr_id, self.sges.as_slice()) {
                        Ok(()) => self.stats.recvs_posted += 1,
                        Err(_) => failed = Some(refused(wr_id, q.qpn, WcOpcode::Recv, VENDOR_ENGINE_REFUSED)),
                    }
                }
                Err(WqError::Wqe { wr_id, error, .. }) => {
                    failed = Some(abi::Cqe::refused(wr_id, q.qpn, WcOpcode::Recv, &error));
                }
                Err(_) => {
                    q.broken = true;
                    failed = Some(refused(0, q.qpn, WcOpcode::Recv, VENDOR_RING_CORRUPT));
                }
            }
        }
        q.region.rq.release();
        if let Some(cqe) = failed {
            self.refuse(e, i, cqe);
            moved = true;
        }
        moved
    }

    /// Completes a refused WQE of QP `i` with `cqe` and moves the QP to error. A send WQE's refusal comes here
    /// once the WRs before it have completed ([`poll_qp`](Self::poll_qp)); a receive WQE's, or a corrupt ring's
    /// (either queue's: a hostile client's, whose WRs before it are flushed, not waited for), at once: the QP goes
    /// to error first, so the engine's flush of the WRs posted before it comes before it. Either way it follows
    /// every completion the engine already has for its CQ, so each queue's completions stay in post order. A full
    /// ring (or completions of the engine still waiting for room) holds it back, delivered in its place as room
    /// comes; only beyond the CQ's own depth of held refusals (a client that posts past its CQ's depth and never
    /// polls: a CQ overrun in verbs) is one dropped and counted.
    fn refuse(&mut self, e: &mut Engine, i: usize, cqe: abi::Cqe) {
        self.stats.wqes_refused += 1;
        let q = &self.qps[i];
        let (qpn, recv) = (q.qpn, cqe.opcode == abi::wc_opcode::RECV);
        let cq = if recv { q.recv_cq } else { q.send_cq };
        let to_err = |e: &mut Engine| {
            let _ = e.modify_qp(qpn, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() });
        };
        let err_first = recv || cqe.vendor_err == VENDOR_RING_CORRUPT;
        if err_first {
            to_err(e);
        }
        if let Some(Some(slot)) = self.cqs.get_mut(cq.0 as usize) {
            let ahead = e.cq_len(cq);
            if slot.broken {
                self.stats.cqes_dropped += 1;
            } else if ahead > 0 || !slot.refusals.is_empty() || slot.region.cq.push_publish(cqe).is_err() {
                let at = slot.popped + ahead as u64;
                if !Self::hold_refusal(slot, at, cqe, &mut self.stats) {
                    self.stats.cqes_dropped += 1;
                }
            } else {
                self.stats.cqes_delivered += 1;
                if let Some(ev) = slot.event.as_mut() {
                    ev.after_publish(&slot.region.notify, 1, true, self.now, &mut self.stats);
                    self.holding |= u32::from(ev.held.is_some());
                    self.unserved |= u32::from(ev.fired_at.is_some());
                }
            }
        }
        if !err_first {
            to_err(e);
        }
    }

    /// Drops the completions of QP `qpn` (being destroyed) that CQ `cq` has not delivered: the engine's (as its
    /// destroy would) and the held refusals; the held refusals of other QPs keep their place among the engine's
    /// completions that stay. What the ring already holds the client library skips (see [`super::client`]). Counted
    /// in `cqes_discarded_destroy`.
    fn forget_cqes(&mut self, e: &mut Engine, cq: CqId, qpn: u32) {
        let Some(Some(slot)) = self.cqs.get_mut(cq.0 as usize) else { return };
        let mut gone = Vec::new();
        e.cq_clean(cq, qpn, |pos| gone.push(slot.popped + pos as u64));
        let held = slot.refusals.len();
        slot.refusals.retain(|(_, c)| c.qpn != qpn);
        self.stats.cqes_discarded_destroy += (gone.len() + held - slot.refusals.len()) as u64;
        shift_back(slot.refusals.iter_mut().map(|(at, _)| at), &gone);
    }

    /// The index CQ `cq`'s ring's next completion will be written at (0 for a CQ this worker does not have).
    fn ring_tail(&self, cq: CqId) -> u32 {
        self.cqs.get(cq.0 as usize).and_then(Option::as_ref).map_or(0, |s| s.region.cq.next_index())
    }

    /// Keeps a refused WQE's completion for [`deliver`](Self::deliver), to go after the CQ's `at`-th engine
    /// completion; false when the CQ already holds as many as its ring's capacity.
    fn hold_refusal(slot: &mut CqSlot, at: u64, cqe: abi::Cqe, stats: &mut ApplianceStats) -> bool {
        if slot.refusals.len() >= slot.region.header.sq.capacity as usize {
            return false;
        }
        slot.refusals.push_back((at, cqe));
        stats.cqes_held += 1;
        true
    }

    /// Engine completions into the CQ rings, as far as each ring has room (the second half of
    /// [`poll`](Self::poll), for a worker whose turn made completions after its look at the QPs' rings).
    pub fn deliver(&mut self, e: &mut Engine) -> bool {
        let mut moved = false;
        for (i, slot) in self.cqs.iter_mut().enumerate() {
            let Some(s) = slot else { continue };
            let id = CqId(i as u32);
            if e.cq_len(id) == 0 && s.refusals.is_empty() {
                continue;
            }
            let mut pushed = 0u32;
            let mut qualifies = false;
            loop {
                if !s.broken {
                    match s.region.cq.reserve() {
                        Ok(()) => {}
                        Err(super::ring::RingError::Full) => break,
                        Err(_) => s.broken = true,
                    }
                }
                // A held refusal goes in its place among the engine's completions (or when the engine has none
                // left: nothing it had when the refusal was held can still come).
                let due = s.refusals.front().is_some_and(|&(at, _)| at <= s.popped || e.cq_len(id) == 0);
                if due {
                    let (_, c) = s.refusals.pop_front().expect("a due refusal");
                    moved = true;
                    if s.broken {
                        self.stats.cqes_dropped += 1;
                        continue;
                    }
                    let _ = s.region.cq.push(c);
                    pushed += 1;
                    qualifies = true; // a failed completion answers a solicited-only arm too
                    self.stats.cqes_delivered += 1;
                    continue;
                }
                let Some(c) = e.poll_cq_one(id) else { break };
                s.popped += 1;
                moved = true;
                if s.broken {
                    self.stats.cqes_dropped += 1;
                    continue;
                }
                let _ = s.region.cq.push(abi::Cqe::from(&c));
                pushed += 1;
                qualifies |= answers_solicited(&c);
                self.stats.cqes_delivered += 1;
            }
            if pushed > 0 {
                s.region.cq.publish();
                if let Some(ev) = s.event.as_mut() {
                    ev.after_publish(&s.region.notify, pushed, qualifies, self.now, &mut self.stats);
                    self.holding |= u32::from(ev.held.is_some());
                    self.unserved |= u32::from(ev.fired_at.is_some());
                }
            }
        }
        moved
    }
}

// ------------------------------------------------------------------------------------------------ the routes

/// A CQ as the server knows it.
struct RouteCq {
    client: u32,
    /// The worker it is bound to (that of the first QP using it), once bound.
    worker: Option<usize>,
    /// Its ring region until it is bound (then the worker's appliance holds it).
    region: Option<Box<DaemonCqRegion>>,
    /// Its completion channel.
    channel: Option<u32>,
}

/// A completion channel: the daemon's end of its socket pair (the workers of its CQs hold it too; it closes when
/// the last of them lets go).
struct RouteChannel {
    client: u32,
    fd: Arc<OwnedFd>,
}

/// Which worker owns what (only the control threads touch this).
#[derive(Default)]
struct Routes {
    /// Live QPs: QPN -> (session, worker, PD).
    qps: HashMap<u32, (u32, usize, u32)>,
    /// Per session: its PDs and MRs (the workers hold them; counted here for the quotas).
    pds_mrs: HashMap<u32, (u32, u32)>,
    /// Per session: the bytes each of its MRs registers (by lkey), for `session_max_mr_bytes`.
    mr_bytes: HashMap<u32, HashMap<u32, u64>>,
    /// CQs by handle.
    cqs: HashMap<u32, RouteCq>,
    next_cq: u32,
    /// Completion channels by handle.
    channels: HashMap<u32, RouteChannel>,
    next_channel: u32,
}

/// Sends each command to the worker(s) that own its objects (see the module documentation).
struct Router {
    workers: Vec<JobSender>,
    routes: Mutex<Routes>,
    limits: SessionLimits,
}

/// The one-line refusal when a session holds `limit` objects of a kind already.
/// True for the errors of a full descriptor table (this process's EMFILE, the system's ENFILE).
fn out_of_fds(errno: i32) -> bool {
    errno == libc::EMFILE || errno == libc::ENFILE
}

/// One line for a request the daemon cannot serve because its descriptor table is full: Exhausted, naming the
/// limit, so that the client that asked (and only it) is told, and the daemon and every other session go on.
fn fds_exhausted(what: &str) -> Response {
    err(
        ErrorCode::Exhausted,
        format!(
            "{what}: roce-dpd is out of file descriptors (RLIMIT_NOFILE {}): close other sessions or objects, or \
             raise the daemon's limit (ulimit -n, LimitNOFILE=)",
            super::shm::nofile_limit()
        ),
    )
}

/// A region or channel the daemon could not create: Exhausted if for lack of descriptors or memory, else `code`.
fn create_failed(what: &str, e: &ShmError, code: ErrorCode) -> Response {
    match e {
        ShmError::Os { errno, .. } if out_of_fds(*errno) => fds_exhausted(what),
        ShmError::Os { errno: libc::ENOMEM | libc::ENOSPC, .. } => err(ErrorCode::Exhausted, format!("{what}: {e}")),
        _ => err(code, format!("{what}: {e}")),
    }
}

/// Answers a connection the daemon cannot take for lack of descriptors: its Hello (waited for at most 100 ms) gets
/// one Exhausted line, which the client library's `Device::open` returns, then the connection closes. Without
/// this the connection waited in the listen backlog and the client's open timed out after its call timeout.
fn refuse_session_for_fds(sock: UnixStream) {
    let _ = sock.set_nonblocking(false);
    let _ = sock.set_read_timeout(Some(Duration::from_millis(100)));
    let _ = sock.set_write_timeout(Some(Duration::from_millis(100)));
    let mut conn = Conn::new(sock);
    // The client library's Hello is request 1.
    let seq = conn.recv_request().map_or(1, |f| f.seq);
    let _ = conn.send_response(seq, &fds_exhausted("a new session"), &[]);
}

fn over_limit(what: &str, key: &str, limit: u32) -> Response {
    err(
        ErrorCode::Exhausted,
        format!(
            "this session already has {limit} {what}, the daemon's per-session limit ([daemon] {key}): destroy some \
             first, or raise the limit in the daemon's config"
        ),
    )
}

/// How long the server retries a modify-to-RTR whose peer MAC is not resolved yet.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);

fn not_found_cq(cq: u32) -> Response {
    err(ErrorCode::NotFound, format!("no completion queue {cq} in this session"))
}

fn not_found_qp(qpn: u32) -> Response {
    err(ErrorCode::NotFound, format!("no queue pair {qpn:#x} in this session"))
}

impl Router {
    fn new(workers: Vec<JobSender>, limits: SessionLimits) -> Router {
        Router { workers, routes: Mutex::default(), limits }
    }

    fn ask(&self, w: usize, client: u32, cmd: Cmd) -> Response {
        ask(&self.workers[w], client, cmd)
    }

    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        self.routes.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Worker 0 allocates the number, the others take it.
    fn alloc_pd(&self, client: u32) -> Response {
        let mut rt = self.routes();
        if rt.pds_mrs.get(&client).map_or(0, |c| c.0) >= self.limits.pds {
            return over_limit("protection domains", "session_max_pds", self.limits.pds);
        }
        let r = self.ask(0, client, Cmd::AllocPd);
        let Response::Pd { pd } = r else { return r };
        for w in 1..self.workers.len() {
            let s = self.ask(w, client, Cmd::SharePd(pd));
            if !matches!(s, Response::Pd { .. }) {
                for v in 0..w {
                    self.ask(v, client, Cmd::DeallocPd(pd));
                }
                return s;
            }
        }
        rt.pds_mrs.entry(client).or_default().0 += 1;
        r
    }

    /// Refused while a QP of the session uses the PD (on whichever worker: the routes know every QP's PD), as
    /// `ibv_dealloc_pd` fails with EBUSY; worker 0 refuses it while an MR does (MRs live on every worker).
    fn dealloc_pd(&self, client: u32, pd: u32) -> Response {
        let mut rt = self.routes();
        let users = rt.qps.values().filter(|&&(c, _, p)| c == client && p == pd).count();
        if users > 0 {
            return err(ErrorCode::Busy, format!("protection domain {pd} is still used by {users} QP(s)"));
        }
        let r = self.ask(0, client, Cmd::DeallocPd(pd));
        if matches!(r, Response::Ok) {
            for w in 1..self.workers.len() {
                self.ask(w, client, Cmd::DeallocPd(pd));
            }
            if let Some(c) = rt.pds_mrs.get_mut(&client) {
                c.0 = c.0.saturating_sub(1);
            }
        }
        r
    }

    /// Worker 0 picks the keys; the others register the same window under them.
    fn reg_mr(&self, client: u32, pd: u32, va: u64, mem: ShmBytes, access: AccessFlags) -> Response {
        let mut rt = self.routes();
        if rt.pds_mrs.get(&client).map_or(0, |c| c.1) >= self.limits.mrs {
            return over_limit("memory regions", "session_max_mrs", self.limits.mrs);
        }
        let len = mem.len() as u64;
        let held: u64 = rt.mr_bytes.get(&client).map_or(0, |m| m.values().sum());
        if held.saturating_add(len) > self.limits.mr_bytes {
            return err(
                ErrorCode::Exhausted,
                format!(
                    "registering {len} bytes would give this session {} bytes of memory regions, past the daemon's \
                     per-session limit of {} ([daemon] session_max_mr_bytes): deregister some first, or raise the \
                     limit in the daemon's config",
                    held.saturating_add(len),
                    self.limits.mr_bytes
                ),
            );
        }
        let r = self.ask(0, client, Cmd::RegMr { pd, va, mem: mem.clone(), access });
        let Response::Mr { lkey, .. } = r else { return r };
        for w in 1..self.workers.len() {
            let s = self.ask(w, client, Cmd::ShareMr { pd, va, mem: mem.clone(), access, lkey });
            if !matches!(s, Response::Mr { .. }) {
                for v in (0..w).rev() {
                    self.ask(v, client, Cmd::DeregMr(lkey));
                }
                return s;
            }
        }
        rt.pds_mrs.entry(client).or_default().1 += 1;
        rt.mr_bytes.entry(client).or_default().insert(lkey, len);
        r
    }

    /// Worker 0 last: its key slot is free again only when no other worker still holds the key.
    fn dereg_mr(&self, client: u32, lkey: u32) -> Response {
        let mut rt = self.routes();
        let mut r = Response::Ok;
        for w in (0..self.workers.len()).rev() {
            r = self.ask(w, client, Cmd::DeregMr(lkey));
            if !matches!(r, Response::Ok) {
                return r;
            }
        }
        if let Some(c) = rt.pds_mrs.get_mut(&client) {
            c.1 = c.1.saturating_sub(1);
        }
        if let Some(m) = rt.mr_bytes.get_mut(&client) {
            m.remove(&lkey);
        }
        r
    }

    /// A new CQ: its handle; the server holds its region until a QP binds it to a worker. Its channel must be one
    /// of the session's.
    fn create_cq(&self, client: u32, region: Box<DaemonCqRegion>, channel: Option<u32>) -> Response {
        let mut rt = self.routes();
        if let Some(ch) = channel {
            if rt.channels.get(&ch).is_none_or(|c| c.client != client) {
                return err(ErrorCode::NotFound, format!("no completion channel {ch} in this session"));
            }
        }
        if rt.cqs.values().filter(|c| c.client == client).count() >= self.limits.cqs as usize {
            return over_limit("completion queues", "session_max_cqs", self.limits.cqs);
        }
        let mut h = rt.next_cq;
        while rt.cqs.contains_key(&h) {
            h = h.wrapping_add(1);
        }
        rt.next_cq = h.wrapping_add(1);
        rt.cqs.insert(h, RouteCq { client, worker: None, region: Some(region), channel });
        Response::Cq { cq: h }
    }

    /// A new completion channel (the daemon's end of its socket pair): its handle.
    fn create_channel(&self, client: u32, fd: OwnedFd) -> Result<u32, Response> {
        let mut rt = self.routes();
        if rt.channels.values().filter(|c| c.client == client).count() >= self.limits.channels as usize {
            return Err(over_limit("completion channels", "session_max_channels", self.limits.channels));
        }
        let mut h = rt.next_channel.max(1);
        while rt.channels.contains_key(&h) {
            h = h.wrapping_add(1).max(1);
        }
        rt.next_channel = h.wrapping_add(1);
        rt.channels.insert(h, RouteChannel { client, fd: Arc::new(fd) });
        Ok(h)
    }

    /// Destroys a channel no CQ uses any more (as `ibv_destroy_comp_channel`, which refuses while CQs use it).
    fn destroy_channel(&self, client: u32, channel: u32) -> Response {
        let mut rt = self.routes();
        if rt.channels.get(&channel).is_none_or(|c| c.client != client) {
            return err(ErrorCode::NotFound, format!("no completion channel {channel} in this session"));
        }
        let users = rt.cqs.values().filter(|c| c.client == client && c.channel == Some(channel)).count();
        if users > 0 {
            return err(ErrorCode::Busy, format!("completion channel {channel} is still used by {users} CQ(s)"));
        }
        rt.channels.remove(&channel);
        Response::Ok
    }

    fn destroy_cq(&self, client: u32, cq: u32) -> Response {
        let mut rt = self.routes();
        let w = match rt.cqs.get(&cq) {
            Some(c) if c.client == client => c.worker,
            _ => return not_found_cq(cq),
        };
        let r = match w {
            Some(w) => self.ask(w, client, Cmd::DestroyCq(cq)),
            None => Response::Ok,
        };
        if matches!(r, Response::Ok) {
            rt.cqs.remove(&cq);
        }
        r
    }

    /// Picks the QP's worker (that of its CQs, else the one with the fewest QPs), binds its CQs there and creates it.
    fn create_qp(&self, client: u32, pd: u32, send_cq: u32, recv_cq: u32, region: Box<DaemonQpRegion>) -> Response {
        let mut rt = self.routes();
        if rt.qps.values().filter(|q| q.0 == client).count() >= self.limits.qps as usize {
            return over_limit("queue pairs", "session_max_qps", self.limits.qps);
        }
        let mut bound = Vec::new();
        for cq in [send_cq, recv_cq] {
            match rt.cqs.get(&cq) {
                Some(c) if c.client == client => bound.push(c.worker),
                _ => return not_found_cq(cq),
            }
        }
        let w = match (bound[0], bound[1]) {
            (Some(a), Some(b)) if a != b => {
                return err(
                    ErrorCode::Invalid,
                    format!(
                        "send CQ {send_cq} completes on worker {a} and receive CQ {recv_cq} on worker {b}: a QP's \
                         CQs must be on one worker (a CQ is bound to the worker of the first QP that uses it)"
                    ),
                )
            }
            (Some(a), _) | (None, Some(a)) => a,
            (None, None) => {
                let mut load = vec![0usize; self.workers.len()];
                for &(_, w, _) in rt.qps.values() {
                    load[w] += 1;
                }
                (0..load.len()).min_by_key(|&w| (load[w], w)).unwrap_or(0)
            }
        };
        for cq in [send_cq, recv_cq] {
            let channel = rt.cqs.get(&cq).and_then(|c| c.channel);
            let event = channel.and_then(|ch| rt.channels.get(&ch)).map(|ch| ch.fd.clone());
            let Some(c) = rt.cqs.get_mut(&cq) else { continue };
            let Some(region) = c.region.take() else { continue };
            match self.ask(w, client, Cmd::CreateCq { handle: cq, region, event }) {
                Response::Cq { .. } => c.worker = Some(w),
                r => {
                    // The region went with the command: this CQ cannot be used any more.
                    rt.cqs.remove(&cq);
                    return r;
                }
            }
        }
        let r = self.ask(w, client, Cmd::CreateQp { pd, send_cq, recv_cq, region });
        if let Response::Qp { qpn } = r {
            rt.qps.insert(qpn, (client, w, pd));
        }
        r
    }

    /// The worker of the session's QP `qpn`.
    fn qp_worker(&self, client: u32, qpn: u32) -> Result<usize, Response> {
        match self.routes().qps.get(&qpn) {
            Some(&(c, w, _)) if c == client => Ok(w),
            _ => Err(not_found_qp(qpn)),
        }
    }

    /// Asks until the answer is not [`ErrorCode::Unresolved`] (the worker solicits the peer meanwhile) or
    /// [`RESOLVE_TIMEOUT`] has passed.
    fn ask_resolving(&self, w: usize, client: u32, mut cmd: impl FnMut() -> Cmd, gid: [u8; 16]) -> Response {
        let until = std::time::Instant::now() + RESOLVE_TIMEOUT;
        loop {
            match self.ask(w, client, cmd()) {
                Response::Error { code: ErrorCode::Unresolved, .. } if std::time::Instant::now() < until => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Response::Error { code: ErrorCode::Unresolved, .. } => {
                    let ip = std::net::Ipv6Addr::from(gid);
                    return err(ErrorCode::Unresolved, format!("no ARP/ND answer from the peer {ip} in 3 s"));
                }
                r => return r,
            }
        }
    }

    fn modify_qp(&self, client: u32, qpn: u32, mut m: ModifyQp) -> Response {
        let w = match self.qp_worker(client, qpn) {
            Ok(w) => w,
            Err(r) => return r,
        };
        let Some(gid) = m.gid else { return self.ask(w, client, Cmd::ModifyQp(qpn, m)) };
        if w != 0 && m.mac.is_none() {
            // Only worker 0 receives ARP/ND: it resolves the peer for the QP's worker.
            let (tx, rx) = mpsc::channel();
            let r = self.ask_resolving(0, client, || Cmd::Resolve { gid, mac: tx.clone() }, gid);
            match (r, rx.try_recv()) {
                (Response::Ok, Ok(mac)) => m.mac = Some(mac),
                (Response::Ok, Err(_)) => return err(ErrorCode::ShuttingDown, "worker 0 did not resolve the peer"),
                (r, _) => return r,
            }
        }
        self.ask_resolving(w, client, || Cmd::ModifyQp(qpn, m), gid)
    }

    fn on_qp(&self, client: u32, qpn: u32, cmd: Cmd) -> Response {
        match self.qp_worker(client, qpn) {
            Ok(w) => self.ask(w, client, cmd),
            Err(r) => r,
        }
    }

    fn destroy_qp(&self, client: u32, qpn: u32) -> Response {
        let mut rt = self.routes();
        let w = match rt.qps.get(&qpn) {
            Some(&(c, w, _)) if c == client => w,
            _ => return not_found_qp(qpn),
        };
        let r = self.ask(w, client, Cmd::DestroyQp(qpn));
        if matches!(r, Response::QpDestroyed { .. }) {
            rt.qps.remove(&qpn);
        }
        r
    }

    /// Every worker's records: one `daemon` scope (the workers' counters summed, those in [`SHARED_COUNTERS`]
    /// from worker 0; `cqs` also counts CQs not bound yet, `workers` the workers), then the rest in worker order.
    fn stats(&self) -> Response {
        let unbound = self.routes().cqs.values().filter(|c| c.worker.is_none()).count() as u64;
        let mut daemon: Vec<StatRecord> = Vec::new();
        let mut rest = Vec::new();
        for w in 0..self.workers.len() {
            let Response::Stats(recs) = self.ask(w, 0, Cmd::Stats) else {
                return err(ErrorCode::ShuttingDown, format!("worker {w} did not answer the statistics request"));
            };
            for r in recs {
                if r.scope != "daemon" {
                    rest.push(r);
                } else if let Some(d) = daemon.iter_mut().find(|d| d.name == r.name) {
                    if !SHARED_COUNTERS.contains(&r.name.as_str()) {
                        d.value += r.value;
                    }
                } else {
                    daemon.push(r);
                }
            }
        }
        if let Some(d) = daemon.iter_mut().find(|d| d.name == "cqs") {
            d.value += unbound;
        }
        daemon.push(StatRecord {
            scope: "daemon".into(),
            id: 0,
            name: "workers".into(),
            value: self.workers.len() as u64,
        });
        daemon.push(StatRecord {
            scope: "daemon".into(),
            id: 0,
            name: "shm_pages_replaced".into(),
            value: super::sigbus::poisoned_count(),
        });
        daemon.extend(rest);
        Response::Stats(daemon)
    }

    /// Every worker reclaims the session (worker 0 last: see [`dereg_mr`](Self::dereg_mr)); its routes go.
    fn reclaim(&self, client: u32) -> Response {
        let mut rt = self.routes();
        let owned = rt.pds_mrs.get(&client).is_some_and(|&(pds, mrs)| pds + mrs > 0)
            || rt.qps.values().any(|&(c, _, _)| c == client)
            || rt.cqs.values().any(|c| c.client == client)
            || rt.channels.values().any(|c| c.client == client);
        let mut r = Response::Ok;
        for w in (0..self.workers.len()).rev() {
            let x = self.ask(w, client, Cmd::Reclaim(owned));
            if !matches!(x, Response::Ok) {
                r = x;
            }
        }
        rt.qps.retain(|_, &mut (c, _, _)| c != client);
        rt.cqs.retain(|_, c| c.client != client);
        // The daemon's ends of the session's channels close here (the workers dropped their CQs' copies).
        rt.channels.retain(|_, c| c.client != client);
        rt.pds_mrs.remove(&client);
        rt.mr_bytes.remove(&client);
        r
    }

    /// Every QP on every worker to the error state, flushed into its CQ ring.
    fn stop_qps(&self) {
        let _one_at_a_time = self.routes();
        for w in 0..self.workers.len() {
            self.ask(w, 0, Cmd::Shutdown);
        }
    }
}

// ------------------------------------------------------------------------------------------------ the server

/// How the daemon serves its socket.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Socket path.
    pub path: PathBuf,
    /// Its permission bits (0o600: the owner only).
    pub mode: u32,
    /// Backing of the ring regions (and, as told to clients, of their buffers).
    pub backing: Backing,
    /// What `Hello` answers.
    pub info: DeviceInfo,
    /// Default depths and SGE limits are the client's; these cap them.
    pub max_depth: u32,
    /// What one session may hold at once.
    pub limits: SessionLimits,
    /// Print one line per session event (refused open, end of a session) to stderr, prefixed `roce-dpd: `.
    pub log: bool,
    /// Bytes of statistics records per frame ([`proto::STATS_PAGE_BYTES`](super::proto::STATS_PAGE_BYTES));
    /// tests lower it to page small daemons.
    pub stats_page_bytes: usize,
}

use super::client::MAX_SOCKET_PATH;

/// What makes `path` unusable as the daemon's socket before anything is tried, as one line naming the path and what
/// to do: a directory that does not exist (bind's bare "No such file or directory" named neither), a path longer
/// than a Unix socket address holds (107 bytes), one naming a directory, something there that is not a socket. `roce-dpd` asks before DPDK starts; [`Server::start_workers`] too.
pub fn socket_path_problem(path: &Path) -> Option<String> {
    let shown = path.display();
    let len = path.as_os_str().len();
    if len > MAX_SOCKET_PATH {
        return Some(format!(
            "socket {shown}: {len} bytes, longer than a Unix socket path can be ({MAX_SOCKET_PATH}): give a shorter one"
        ));
    }
    // `Path` drops a trailing `/` or `/.` (`/run/d.sock/` has the parent `/run`), bind does not: it says "No such
    // file or directory", as for a missing directory.
    let last = path.as_os_str().as_encoded_bytes().rsplit(|&b| b == b'/').next().unwrap_or_default();
    if matches!(last, b"" | b"." | b"..") {
        return Some(format!(
            "socket {shown}: names a directory, not a file (give the socket's file name after the last '/')"
        ));
    }
    // Something other than a socket (a stale one is replaced): a directory, a file, a symbolic link.
    if std::fs::symlink_metadata(path).is_ok_and(|m| !std::os::unix::fs::FileTypeExt::is_socket(&m.file_type())) {
        return Some(format!("socket {shown}: exists and is not a socket: refusing to replace it (give another path)"));
    }
    let dir = match path.parent() {
        Some(d) if d.as_os_str().is_empty() => Path::new("."),
        Some(d) => d,
        None => return Some(format!("socket {shown}: not a file path")),
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => None,
        Ok(_) => Some(format!("socket {shown}: {} is not a directory", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some(format!(
            "socket {shown}: the directory {} does not exist (create it, or give a socket path in one that does)",
            dir.display()
        )),
        Err(e) => Some(format!("socket {shown}: {}: {e}", dir.display())),
    }
}

/// Why the server could not start.
#[derive(Debug)]
pub struct ServeError(pub String);

impl std::fmt::Display for ServeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ServeError {}

struct Session {
    writer: Mutex<Conn>,
    /// The socket, to cut the session off without its writer lock (which a reply blocked on a client that does not
    /// read holds).
    sock: UnixStream,
}

impl Session {
    /// Sends the unsolicited `notice` (seq 0) and shuts the socket down, so the session thread ends and reclaims.
    /// The notice waits at most 100 ms for the writer and 100 ms to be sent: a client that sends requests and never
    /// reads the answers (its session thread blocked writing one, holding the writer) gets none; shutting its socket
    /// down then ends that blocked write.
    fn cut_off(&self, notice: &Response) {
        let _ = self.sock.set_write_timeout(Some(Duration::from_millis(100)));
        if let Some(w) = lock_within(&self.writer, Duration::from_millis(100)) {
            let _ = w.send_response(0, notice, &[]);
        }
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
    }
}

/// The lock within `wait`, or None (a writer blocked on its client holds it).
fn lock_within<T>(m: &Mutex<T>, wait: Duration) -> Option<std::sync::MutexGuard<'_, T>> {
    let until = std::time::Instant::now() + wait;
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => return Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if std::time::Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// The control half: listens, runs one thread per session, routes commands to the workers.
pub struct Server {
    cfg: ServerConfig,
    listener: UnixListener,
    router: Arc<Router>,
    sessions: Arc<Mutex<HashMap<u32, Arc<Session>>>>,
    stop: Arc<AtomicBool>,
    threads: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: Option<JoinHandle<()>>,
}

/// How long a session thread waits for the worker's answer before it gives up on the request.
const WORKER_TIMEOUT: Duration = Duration::from_secs(5);

impl Server {
    /// Binds the socket (refusing a path another daemon answers on; replacing a stale socket file), sets its
    /// mode, and starts accepting. Commands go to the one worker's `jobs`.
    pub fn start(cfg: ServerConfig, jobs: JobSender) -> Result<Server, ServeError> {
        Server::start_workers(cfg, vec![jobs])
    }

    /// [`start`](Self::start) for several workers: `jobs[w]` reaches worker `w`, whose engine numbers its QPs
    /// from `qpn_base + w * QPN_STRIDE` (QPNs are routed by what `CreateQp` answered, not by that rule). Worker 0
    /// receives ARP/ND (it resolves peers for the others).
    pub fn start_workers(cfg: ServerConfig, jobs: Vec<JobSender>) -> Result<Server, ServeError> {
        if jobs.is_empty() {
            return Err(ServeError("no worker to serve the socket".into()));
        }
        let path = cfg.path.clone();
        let path = path.as_path();
        let shown = path.display();
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if UnixStream::connect(path).is_ok() {
                return Err(ServeError(format!(
                    "socket {shown} is in use by a running daemon (stop it, or set [daemon] socket to another path)"
                )));
            }
            // A stale socket goes; anything else there is refused below.
            if std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
                std::fs::remove_file(path).map_err(|e| ServeError(format!("remove stale socket {shown}: {e}")))?;
            }
        }
        if let Some(why) = socket_path_problem(path) {
            return Err(ServeError(why));
        }
        // Before any client's memory is mapped: a hole a client punches in it must not kill the daemon.
        super::sigbus::install().map_err(|e| ServeError(format!("cannot guard shared memory: {e}")))?;
        let listener = UnixListener::bind(path).map_err(|e| match e.kind() {
            // Not root (/run is root's): bind's bare "Permission denied" did not say what to change.
            std::io::ErrorKind::PermissionDenied => ServeError(format!(
                "cannot create the socket {shown}: permission denied on its directory: run roce-dpd as root, or set \
                 [daemon] socket (or --socket) to a path in a directory this user may write"
            )),
            _ => ServeError(format!("bind {shown}: {e}")),
        })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(cfg.mode))
            .map_err(|e| ServeError(format!("chmod {:o} {shown}: {e}", cfg.mode)))?;
        listener.set_nonblocking(true).map_err(|e| ServeError(format!("{shown}: {e}")))?;
        let limits = cfg.limits;
        let mut s = Server {
            cfg,
            listener,
            router: Arc::new(Router::new(jobs, limits)),
            sessions: Arc::default(),
            stop: Arc::default(),
            threads: Arc::default(),
            accept: None,
        };
        s.spawn_accept().map_err(|e| ServeError(format!("{shown}: {e}")))?;
        Ok(s)
    }

    fn spawn_accept(&mut self) -> std::io::Result<()> {
        let listener = self.listener.try_clone()?;
        let (cfg, router, sessions, stop, threads) =
            (self.cfg.clone(), self.router.clone(), self.sessions.clone(), self.stop.clone(), self.threads.clone());
        let next = Arc::new(AtomicU32::new(1));
        // A descriptor kept in reserve: when the table is full, it is given up to accept the waiting connection
        // and tell it so (refuse_session_for_fds), then taken again.
        let mut spare = std::fs::File::open("/dev/null").ok();
        let mut replaced = super::sigbus::poisoned_count();
        self.accept = Some(std::thread::Builder::new().name("roce-dpd-accept".into()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if super::sigbus::poisoned_count() != replaced {
                    replaced = super::sigbus::poisoned_count();
                    close_poisoned(&sessions, cfg.log);
                }
                // Wait for a connection first (poll takes no descriptor; it serves any descriptor, not only a
                // channel's): accept(2) reserves the new descriptor before it looks at the queue, so its EMFILE
                // does not mean that a connection waits. Taken as one, a full table with nobody connecting had
                // this thread spin giving up the spare and opening it again, and any other thread's descriptor
                // (a client's memfd received with a RegMr) could take the slot in between: the spare was then
                // gone for as long as the table stayed full, and no new session was answered.
                match super::shm::channel_wait(listener.as_fd(), Some(Duration::from_millis(20))) {
                    Ok(true) => {}
                    Ok(false) => continue,
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(20));
                        continue;
                    }
                }
                match listener.accept() {
                    Ok((sock, _)) => {
                        let _ = sock.set_nonblocking(false);
                        let id = next.fetch_add(1, Ordering::Relaxed);
                        let (Ok(w), Ok(cut)) = (sock.try_clone(), sock.try_clone()) else {
                            refuse_session_for_fds(sock);
                            continue;
                        };
                        let sess = Arc::new(Session { writer: Mutex::new(Conn::new(w)), sock: cut });
                        sessions.lock().expect("sessions").insert(id, sess.clone());
                        let (cfg, router, sessions) = (cfg.clone(), router.clone(), sessions.clone());
                        let h = std::thread::Builder::new().name(format!("roce-dpd-s{id}")).spawn(move || {
                            // The regions this thread maps are the session's (see close_poisoned).
                            super::sigbus::set_owner(id);
                            session(id, Conn::new(sock), &sess, &cfg, &router);
                            sessions.lock().expect("sessions").remove(&id);
                        });
                        if let Ok(h) = h {
                            threads.lock().expect("threads").push(h);
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) if e.raw_os_error().is_some_and(out_of_fds) && spare.is_some() => {
                        drop(spare.take());
                        if let Ok((sock, _)) = listener.accept() {
                            refuse_session_for_fds(sock);
                        }
                        spare = std::fs::File::open("/dev/null").ok();
                    }
                    Err(_) => {
                        std::thread::sleep(Duration::from_millis(20));
                        if spare.is_none() {
                            spare = std::fs::File::open("/dev/null").ok();
                        }
                    }
                }
            }
        })?);
        Ok(())
    }

    /// Sessions currently connected.
    pub fn sessions(&self) -> usize {
        self.sessions.lock().expect("sessions").len()
    }

    /// Every QP of every session on every worker to the error state, its completions flushed into the CQ rings
    /// (the workers must be polling). [`shutdown`](Self::shutdown) does this first.
    pub fn stop_qps(&self) {
        self.router.stop_qps();
    }

    /// Workers the server routes to.
    pub fn workers(&self) -> usize {
        self.router.workers.len()
    }

    /// Stops accepting, moves every QP to the error state and flushes it ([`stop_qps`](Self::stop_qps)), tells
    /// every session why (a [`Response::Shutdown`] notice), closes their sockets, waits for their threads (each
    /// reclaims its session through the workers, which must still be polling), and removes the socket file.
    pub fn shutdown(mut self, reason: &str) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
        self.router.stop_qps();
        let sessions: Vec<Arc<Session>> = self.sessions.lock().expect("sessions").values().cloned().collect();
        // Each notice is bounded (Session::cut_off), so every session thread ends.
        for s in sessions {
            s.cut_off(&Response::Shutdown { reason: reason.into() });
        }
        let threads = std::mem::take(&mut *self.threads.lock().expect("threads"));
        for h in threads {
            let _ = h.join();
        }
        let _ = std::fs::remove_file(&self.cfg.path);
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.cfg.path
    }
}

/// Closes every session a page of whose shared memory the SIGBUS guard replaced ([`super::sigbus`]): the client
/// punched a hole in a memory region or ring on hugetlbfs while the pool had no page to fill it. The session is
/// told why ([`Response::Closed`]) and its socket shut down, so its thread reclaims everything it held (and so
/// unmaps the replaced pages); the other sessions carry on.
fn close_poisoned(sessions: &Mutex<HashMap<u32, Arc<Session>>>, log: bool) {
    const WHY: &str = "a page of this session's shared memory (a memory region or a ring) vanished under the daemon: \
                       a hole was punched in it (fallocate PUNCH_HOLE or madvise MADV_REMOVE) while the huge-page pool \
                       had no free page to fill it";
    for owner in super::sigbus::take_poisoned() {
        let sess = sessions.lock().expect("sessions").get(&owner).cloned();
        if log {
            match &sess {
                Some(_) => eprintln!("roce-dpd: session {owner} closed: {WHY}"),
                None => eprintln!("roce-dpd: a page of shared memory of no open session vanished (replaced by zeros)"),
            }
        }
        if let Some(s) = sess {
            s.cut_off(&Response::Closed { reason: WHY.into() });
        }
    }
}

/// Sends `cmd` to the worker and waits for the answer.
fn ask(jobs: &JobSender, client: u32, cmd: Cmd) -> Response {
    let (tx, rx) = mpsc::channel();
    if !jobs.send(Job { client, cmd, reply: tx }) {
        return err(ErrorCode::ShuttingDown, "the daemon's worker has stopped");
    }
    rx.recv_timeout(WORKER_TIMEOUT)
        .unwrap_or_else(|_| err(ErrorCode::ShuttingDown, "the daemon's worker did not answer"))
}

/// One session: `Hello` first, then requests until the socket closes; then the worker reclaims what it owned.
fn session(id: u32, mut conn: Conn, sess: &Session, cfg: &ServerConfig, router: &Router) {
    let reply = |seq: u32, r: &Response, fd: Option<std::os::fd::BorrowedFd<'_>>| -> bool {
        let w = sess.writer.lock().expect("writer");
        let fds: Vec<_> = fd.into_iter().collect();
        w.send_response(seq, r, &fds).is_ok()
    };
    let mut opened = false;
    let mut objects = 0u32;
    // The statistics snapshot this session is reading in pages (empty when none is under way).
    let mut snapshot: Vec<StatRecord> = Vec::new();
    loop {
        let f = match conn.recv_request() {
            Ok(f) => f,
            Err(ProtoError::Io(_)) => break,
            Err(e) => {
                // One line to the client (it may be of another protocol version), then close.
                let _ = reply(0, &err(ErrorCode::Protocol, format!("roce-dpd: {e}")), None);
                break;
            }
        };
        let seq = f.seq;
        if !opened {
            match f.msg {
                Request::Hello { abi } if abi == ABI_VERSION => {
                    opened = true;
                    if !reply(seq, &Response::Hello(cfg.info), None) {
                        break;
                    }
                    continue;
                }
                Request::Hello { abi } => {
                    let msg = format!(
                        "shared-memory ABI mismatch: roce-dpd speaks v{ABI_VERSION}, the application's library \
                         v{abi}: rebuild the application against the daemon's roce-dp version"
                    );
                    if cfg.log {
                        eprintln!("roce-dpd: session {id} refused: {msg}");
                    }
                    let _ = reply(seq, &err(ErrorCode::Abi, msg), None);
                    break;
                }
                _ => {
                    let _ = reply(seq, &err(ErrorCode::Protocol, "the first request must be Hello"), None);
                    break;
                }
            }
        }
        objects += 1;
        let (r, fd) = match f.msg {
            _ if f.fds_lost => (fds_exhausted(&format!("the descriptor sent with {}", f.msg.name())), None),
            Request::Stats => match router.stats() {
                Response::Stats(all) => (stats_page(&mut snapshot, all, 0, cfg.stats_page_bytes), None),
                r => (r, None),
            },
            Request::StatsFrom { first } => {
                (stats_page(&mut snapshot, Vec::new(), first as usize, cfg.stats_page_bytes), None)
            }
            msg => handle(id, objects, msg, f.fds, cfg, router),
        };
        let ok = reply(seq, &r, fd.as_ref().map(|f| f.as_fd()));
        if !ok {
            break;
        }
    }
    if opened {
        let r = router.reclaim(id);
        if cfg.log {
            let how = if matches!(r, Response::Ok) { "its resources reclaimed".to_owned() } else { format!("{r:?}") };
            eprintln!("roce-dpd: session {id} ended after {objects} requests, {how}");
        }
    }
}

/// The answer to `Stats` (`fresh` = every record now, `first` = 0) or `StatsFrom { first }` (`fresh` empty: the
/// session's `snapshot` goes on): all of them in one [`Response::Stats`] when they fit `budget` bytes, else the page
/// of the snapshot from `first` on. The snapshot is kept until its last page has gone, so the pages of one reading
/// are one consistent list (a QP created meanwhile neither shifts nor repeats records).
fn stats_page(snapshot: &mut Vec<StatRecord>, fresh: Vec<StatRecord>, first: usize, budget: usize) -> Response {
    if first == 0 {
        if super::proto::stats_page_len(&fresh, budget) == fresh.len() {
            snapshot.clear();
            return Response::Stats(fresh);
        }
        *snapshot = fresh;
    } else if snapshot.is_empty() || first >= snapshot.len() {
        return err(
            ErrorCode::Invalid,
            format!(
                "StatsFrom {first}: no statistics snapshot has a record {first} ({} records taken; send Stats first)",
                snapshot.len()
            ),
        );
    }
    let n = super::proto::stats_page_len(&snapshot[first..], budget);
    let total = snapshot.len() as u32;
    let recs = snapshot[first..first + n].to_vec();
    if first + n == snapshot.len() {
        *snapshot = Vec::new();
    }
    Response::StatsPage { total, recs }
}

/// Serves one request: maps the client's memfd or creates a ring region here (off the workers), routes the command
/// to its worker(s), and returns the answer with the descriptor it carries.
fn handle(
    id: u32,
    n: u32,
    q: Request,
    mut fds: Vec<OwnedFd>,
    cfg: &ServerConfig,
    router: &Router,
) -> (Response, Option<OwnedFd>) {
    let max = cfg.max_depth;
    let r = match q {
        Request::Hello { .. } => err(ErrorCode::Protocol, "Hello was already sent"),
        Request::AllocPd => router.alloc_pd(id),
        Request::DeallocPd { pd } => router.dealloc_pd(id, pd),
        Request::RegMr { pd, va, len, offset, access } => {
            if fds.len() != 1 {
                return (err(ErrorCode::Protocol, "RegMr needs exactly one memfd"), None);
            }
            // Only the window's pages are mapped: the client's memfd may be far larger (and sparse).
            let (region, at) = match ShmRegion::map_window(fds.remove(0), offset, len) {
                Ok(Ok((r, at))) => (Arc::new(r), at),
                Ok(Err(size)) => {
                    return (
                        err(
                            ErrorCode::Invalid,
                            format!(
                                "memory registration: {len} bytes at offset {offset} exceed the {size}-byte buffer"
                            ),
                        ),
                        None,
                    )
                }
                Err(ShmError::Os { op: "mmap", errno: libc::ENOMEM }) => {
                    return (
                        err(
                            ErrorCode::Exhausted,
                            format!(
                                "memory registration: the daemon cannot map {len} more bytes (out of address space)"
                            ),
                        ),
                        None,
                    )
                }
                Err(e) => return (err(ErrorCode::Invalid, format!("memory registration: {e}")), None),
            };
            let Some(mem) = usize::try_from(len).ok().and_then(|l| region.window(at, l)) else {
                return (err(ErrorCode::Invalid, format!("memory registration: {len} bytes do not fit")), None);
            };
            router.reg_mr(id, pd, va, mem, AccessFlags(access & AccessFlags::ALL.0))
        }
        Request::DeregMr { lkey } => router.dereg_mr(id, lkey),
        Request::CreateCompChannel => {
            return match super::shm::channel_pair() {
                Ok((daemon_end, client_end)) => match router.create_channel(id, daemon_end) {
                    Ok(channel) => (Response::Channel { channel }, Some(client_end)),
                    Err(r) => (r, None),
                },
                Err(e) => (create_failed("completion channel", &e, ErrorCode::Os), None),
            };
        }
        Request::DestroyCompChannel { channel } => router.destroy_channel(id, channel),
        Request::CreateCq { depth, channel } => {
            if depth == 0 || depth > max {
                return (err(ErrorCode::Invalid, format!("CQ depth {depth} not in 1..={max}")), None);
            }
            let region = match DaemonCqRegion::create(&format!("roce-dpd-cq-s{id}-{n}"), depth, cfg.backing) {
                Ok(r) => r,
                Err(e) => return (create_failed("CQ region", &e, ErrorCode::Exhausted), None),
            };
            // The region's descriptor goes back with the reply (a duplicate: the region stays the daemon's), made
            // before the CQ exists: an answer without it would leave the client a CQ it cannot map.
            let fd = match region.fd().try_clone_to_owned() {
                Ok(fd) => Some(fd),
                Err(_) => return (fds_exhausted("CQ region"), None),
            };
            let r = router.create_cq(id, Box::new(region), channel);
            let fd = if matches!(r, Response::Cq { .. }) { fd } else { None };
            return (r, fd);
        }
        Request::DestroyCq { cq } => router.destroy_cq(id, cq),
        Request::CreateQp { pd, send_cq, recv_cq, sq_depth, rq_depth, max_send_sge, max_recv_sge, max_inline } => {
            for (what, d) in [("send queue depth", sq_depth), ("receive queue depth", rq_depth)] {
                if d == 0 || d > max {
                    return (err(ErrorCode::Invalid, format!("{what} {d} not in 1..={max}")), None);
                }
            }
            if max_inline > abi::MAX_INLINE_DATA {
                return (
                    err(
                        ErrorCode::Invalid,
                        format!("max_inline {max_inline} exceeds the daemon's limit of {} bytes", abi::MAX_INLINE_DATA),
                    ),
                    None,
                );
            }
            let caps = QpRegionCaps {
                sq_depth,
                rq_depth,
                max_send_sge: max_send_sge.max(1),
                max_recv_sge: max_recv_sge.max(1),
                max_inline: max_inline.next_multiple_of(abi::INLINE_ALIGN),
            };
            let region = match DaemonQpRegion::create(&format!("roce-dpd-qp-s{id}-{n}"), caps, cfg.backing) {
                Ok(region) => region,
                Err(e) => return (create_failed("QP region", &e, ErrorCode::Invalid), None),
            };
            let fd = match region.fd().try_clone_to_owned() {
                Ok(fd) => Some(fd),
                Err(_) => return (fds_exhausted("QP region"), None),
            };
            let r = router.create_qp(id, pd, send_cq, recv_cq, Box::new(region));
            let fd = if matches!(r, Response::Qp { .. }) { fd } else { None };
            return (r, fd);
        }
        Request::ModifyQp { qpn, m } => router.modify_qp(id, qpn, m),
        Request::QueryQp { qpn } => router.on_qp(id, qpn, Cmd::QueryQp(qpn)),
        Request::DestroyQp { qpn } => router.destroy_qp(id, qpn),
        // Answered by the session (stats_page), which keeps the snapshot.
        Request::Stats | Request::StatsFrom { .. } => router.stats(),
    };
    (r, None)
}

/// Moves each held refusal's place `at` (it goes once the CQ's `at` engine completions before it were popped) back
/// by the engine completions removed ahead of it: `gone` holds their indices, ascending; a removed completion at
/// index `at` or later came after the refusal and does not move it. Both lists are in order (`at` never falls along
/// the queue), so one merge walk: a destroy costs O(held + removed), not their product.
fn shift_back<'a>(ats: impl Iterator<Item = &'a mut u64>, gone: &[u64]) {
    let mut ahead = 0;
    for at in ats {
        while ahead < gone.len() && gone[ahead] < *at {
            ahead += 1;
        }
        *at -= ahead as u64;
    }
}

#[cfg(test)]
mod tests {
    /// A refusal moves back by exactly the removed completions before its place: one removed at its place or after
    /// it (it came after the refusal) does not move it; several refusals share one walk.
    /// The socket path check agrees with what bind does: 107 bytes bind and 108 do not (the check says so before
    /// anything starts); a path ending in '/', '/.' or '/..' (which `Path` reads as naming the last directory's
    /// entry, and bind refuses with "No such file or directory") and one under a file are refused in one line; a
    /// relative path is checked against the working directory; a non-UTF-8 name is fine.
    #[test]
    fn socket_path_problems_are_what_bind_refuses() {
        use std::os::unix::ffi::OsStrExt;
        let dir = std::env::temp_dir().join(format!("rdp-sock-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let d = dir.as_os_str().len();
        for len in [107usize, 108] {
            let p = dir.join("s".repeat(len - d - 1));
            assert_eq!(p.as_os_str().len(), len);
            let why = super::socket_path_problem(&p);
            let bound = std::os::unix::net::UnixListener::bind(&p);
            assert_eq!(why.is_none(), bound.is_ok(), "{len} bytes: {why:?} / {bound:?}");
            assert_eq!(bound.is_ok(), len == 107);
            let _ = std::fs::remove_file(&p);
        }
        let file = dir.join("f");
        std::fs::write(&file, b"").unwrap();
        for p in [
            format!("{}/s.sock/", dir.display()),
            format!("{}/s.sock/.", dir.display()),
            format!("{}/..", dir.display()),
        ] {
            let p = Path::new(&p);
            let why = super::socket_path_problem(p).unwrap_or_else(|| panic!("{} not refused", p.display()));
            assert!(why.contains("names a directory, not a file") && !why.contains('\n'), "{why}");
            assert!(std::os::unix::net::UnixListener::bind(p).is_err(), "{} binds", p.display());
        }
        let under_file = file.join("s.sock");
        assert_eq!(
            super::socket_path_problem(&under_file),
            Some(format!("socket {}: {} is not a directory", under_file.display(), file.display()))
        );
        // What is there already: a socket (stale: replaced) passes; a file, a directory, a symbolic link do not.
        let stale = dir.join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
        assert_eq!(super::socket_path_problem(&stale), None);
        let link = dir.join("link");
        std::os::unix::fs::symlink(&stale, &link).unwrap();
        for p in [&file, &dir, &link] {
            assert_eq!(
                super::socket_path_problem(p),
                Some(format!(
                    "socket {}: exists and is not a socket: refusing to replace it (give another path)",
                    p.display()
                ))
            );
        }
        assert_eq!(super::socket_path_problem(Path::new("s.sock")), None);
        let odd = dir.join(std::ffi::OsStr::from_bytes(b"s\xff.sock"));
        assert_eq!(super::socket_path_problem(&odd), None);
        assert!(std::os::unix::net::UnixListener::bind(&odd).is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn shift_back_counts_only_the_removed_completions_ahead() {
        let mut ats = [3u64, 3, 5, 9];
        // 1 and 2 are ahead of every refusal; 3 is at the first two refusals' place (after them); 7 is between.
        super::shift_back(ats.iter_mut(), &[1, 2, 3, 7]);
        assert_eq!(ats, [1, 1, 2, 5]);
        let mut none = [4u64];
        super::shift_back(none.iter_mut(), &[]);
        assert_eq!(none, [4]);
        let mut after = [2u64];
        super::shift_back(after.iter_mut(), &[2, 3]);
        assert_eq!(after, [2]);
    }

    use super::*;

    /// PD numbers wrap after 2^32 - 1 allocations without a panic (debug) and never hand out 0 or a number still
    /// in use (a collision would let a session register memory under another session's PD).
    #[test]
    fn pd_numbers_wrap_and_skip_the_ones_in_use() {
        let mut e = Engine::new(crate::engine::EngineConfig::default());
        let mut app = Appliance::for_worker(0);
        let neigh = Neighbours::new(crate::wire::MacAddr([2, 0, 0, 0, 0, 1]), Some([10, 0, 0, 1]), None);
        let alloc = |app: &mut Appliance, e: &mut Engine, client: u32| match app.execute(
            e,
            &neigh,
            client,
            Cmd::AllocPd,
            &|_: &mut Vec<StatRecord>| {},
        ) {
            Ok(Response::Pd { pd }) => pd,
            r => panic!("{r:?}"),
        };
        assert_eq!(alloc(&mut app, &mut e, 1), 1);
        assert_eq!(alloc(&mut app, &mut e, 1), 2);
        e.set_next_pd(u32::MAX - 1);
        assert_eq!(alloc(&mut app, &mut e, 2), u32::MAX - 1);
        assert_eq!(alloc(&mut app, &mut e, 2), u32::MAX);
        // Wraps: 0 is never a PD, 1 and 2 are client 1's.
        assert_eq!(alloc(&mut app, &mut e, 2), 3);
        assert_eq!(app.pds.get(&1), Some(&1), "client 1 keeps its PD");
    }

    #[test]
    fn job_channel_counts_what_waits() {
        let (tx, rx) = job_channel();
        assert!(matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)));
        let (reply, answers) = mpsc::channel();
        for client in [7, 8] {
            assert!(tx.clone().send(Job { client, cmd: Cmd::Stats, reply: reply.clone() }), "worker end alive");
        }
        assert_eq!(rx.pending.load(Ordering::Relaxed), 2);
        assert_eq!(rx.try_recv().map(|j| j.client).ok(), Some(7));
        assert_eq!(rx.try_recv().map(|j| j.client).ok(), Some(8));
        assert_eq!(rx.pending.load(Ordering::Relaxed), 0);
        assert!(matches!(rx.try_recv(), Err(mpsc::TryRecvError::Empty)));
        drop(rx);
        let sent = tx.send(Job { client: 9, cmd: Cmd::Stats, reply });
        assert!(!sent, "a send to a stopped worker fails");
        assert!(answers.try_recv().is_err());
    }
}
