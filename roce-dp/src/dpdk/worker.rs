//! The poll-mode data path: a [`Worker`] joins one sans-IO [`Engine`] to one port queue pair.
//!
//! Each [`Worker::poll`] does a bounded amount of work:
//! 1. **rx**: one burst (from the port's rx queue, or from the worker's SPSC ring when a software [`Dispatch`]er
//!    steers frames to it); each RoCE frame goes to `Engine::handle_rx_mut` straight from the mbuf's data (no copy;
//!    a multi-segment mbuf is first made contiguous in one reusable scratch buffer, counted; data the mbuf does not
//!    own alone, a clone's or an external buffer's, goes read-only to `Engine::handle_rx`), frames for QPs of
//!    another worker go to that worker's ring, ARP and IPv6 ND go to the port's [`Neighbours`], everything else is
//!    counted and dropped; handled frames are freed in one bulk put at the end of the turn, after its tx bursts
//!    (the ACK or the next request leaves first);
//! 2. **timers**: `handle_timeout` when the engine's earliest deadline has passed;
//! 3. **tx**: mbufs come from a stash refilled with one bulk allocation; the engine writes each frame straight into
//!    an mbuf's tailroom (headers and payload in one pass, payload copied once from the registered region, ICRC
//!    computed once), the frame length is committed in Rust (no shim call), and one tx burst sends up to [`BURST`]
//!    frames.
//!    Frames the PMD does not take stay queued and go first next time (memif applies back-pressure; dropping them
//!    would cost a go-back-N retransmission); they are freed and counted only when the worker is dropped.
//!
//! Time is the TSC converted to nanoseconds ([`Clock`]), read once per poll; [`Worker::run`] reuses the last
//! reading for up to [`CLOCK_REUSE`] empty turns in a row while no engine deadline is within [`CLOCK_SLACK`] ns of
//! it (the TSC read is a third of an empty turn on this VM). [`Worker::run`] loops until an
//! `AtomicBool` stop flag is set, calling the application after each poll and then sending at once what it posted
//! (a request posted on a completion leaves in the same turn, not after the next rx burst: one poll less on the
//! ping-pong RTT), with an optional idle back-off for shared cores ([`Idle`]).
//!
//! Steering (README "Steering"): worker `w`'s engine numbers its QPs from `qpn_base + w * QPN_STRIDE`, so the
//! owner of a frame's BTH destination QP is a division. With software steering (one rx queue: net_ring, memif,
//! af_packet) worker 0 receives everything and forwards RoCE frames to their owner over an SPSC rte_ring. With
//! hardware steering (one rx queue per worker: exact per-QP rte_flow rules from [`Port::roce_flow`], or the port's
//! own RSS) every worker polls its own queue and its ring, and its [`Dispatch::hardware`] forwards the frames the
//! port delivered to the wrong queue (counted as steering misses) and ARP/ND to worker 0. Each worker sends on its
//! own tx queue.
//!
//! [`Port::roce_flow`]: super::Port::roce_flow

use std::sync::atomic::{AtomicBool, Ordering};

use crate::engine::{Engine, RxMeta, MAX_HEADER_BYTES};
use crate::neigh::{classify, FrameKind, NeighIp, Neighbours, ND_FRAME_LEN};
use crate::sim::SimRng;
use crate::time::Instant;

use super::error::{DpdkError, Result};
use super::mbuf::{Burst, Mbuf, BURST};
use super::mempool::Mempool;
use super::port::{PortInfo, QueuePair};
use super::ring::Ring;

pub use crate::engine::QPN_STRIDE;

/// Empty turns in a row of [`Worker::run`] that may reuse the last clock reading (then it is read again).
const CLOCK_REUSE: u32 = 3;
/// Nanoseconds between the last clock reading and the engine's earliest deadline below which every turn reads the
/// clock.
const CLOCK_SLACK: u64 = 2_000;

/// TSC → nanoseconds since the clock was made (fixed-point: one multiply and a shift per reading).
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    t0: u64,
    /// Nanoseconds per tick, << 32.
    mult: u128,
}

impl Clock {
    /// A clock starting now; `hz` is the TSC frequency ([`super::tsc_hz`]).
    pub fn new(hz: u64) -> Self {
        Self { t0: super::tsc(), mult: (1_000_000_000u128 << 32) / u128::from(hz.max(1)) }
    }

    /// The engine's time: nanoseconds since [`Clock::new`].
    #[inline]
    pub fn now(&self) -> Instant {
        Instant(self.ns(super::tsc()))
    }

    fn ns(&self, tsc: u64) -> u64 {
        ((u128::from(tsc.wrapping_sub(self.t0)) * self.mult) >> 32) as u64
    }
}

/// What a worker does after polls that found nothing to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Idle {
    /// Busy-poll (a dedicated core).
    Busy,
    /// After `after` empty polls in a row, a CPU pause per poll.
    Pause {
        /// Empty polls before backing off.
        after: u32,
    },
    /// After `after` empty polls, yield the CPU to the scheduler.
    Yield {
        /// Empty polls before backing off.
        after: u32,
    },
    /// After `after` empty polls, sleep `us` microseconds (shared cores, tests).
    Sleep {
        /// Empty polls before backing off.
        after: u32,
        /// Sleep length.
        us: u32,
    },
}

/// Worker settings.
#[derive(Clone, Copy, Debug)]
pub struct WorkerConfig {
    /// Frames per rx burst and per tx burst (1..=[`BURST`]).
    pub burst: usize,
    /// Idle behaviour of [`Worker::run`].
    pub idle: Idle,
    /// Test-only: drop this many received RoCE frames per million before the engine sees them.
    pub loss_ppm: u32,
    /// Seed of the loss generator.
    pub loss_seed: u64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        Self { burst: BURST, idle: Idle::Busy, loss_ppm: 0, loss_seed: 1 }
    }
}

/// Per-worker counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Calls to [`Worker::poll`].
    pub polls: u64,
    /// Rx bursts that returned frames.
    pub rx_bursts: u64,
    /// Rx bursts that returned nothing.
    pub rx_empty_polls: u64,
    /// Frames received (from the port and from other workers' dispatchers).
    pub rx_frames: u64,
    /// Of those, frames other workers forwarded to this one.
    pub rx_from_ring: u64,
    /// RoCE frames handed to the engine.
    pub rx_roce: u64,
    /// Multi-segment frames copied into the scratch buffer first.
    pub rx_linearized: u64,
    /// Frames that were neither RoCE, ARP nor ND (dropped).
    pub rx_other: u64,
    /// RoCE frames the port's own steering (rte_flow rules, RSS) delivered to this worker although another worker
    /// owns their QP; each is forwarded to the owner (and counted in `dispatched` too).
    pub steering_misses: u64,
    /// RoCE frames for a QP no worker owns (handed to this engine, which counts and drops them).
    pub rx_unknown_qp: u64,
    /// Frames forwarded to another worker's ring (RoCE frames to their QP's owner, ARP/ND to worker 0).
    pub dispatched: u64,
    /// Frames dropped because another worker's ring was full.
    pub dispatch_drops: u64,
    /// RoCE frames dropped by the test-only loss hook.
    pub loss_injected: u64,
    /// ARP/ND frames received and handled.
    pub rx_neigh: u64,
    /// ARP/ND frames sent (replies and resolutions).
    pub tx_neigh: u64,
    /// ARP/ND frames (replies, solicitations) not sent: no mbuf was free, or the tx burst was full with frames the
    /// PMD had not taken yet (an ARP storm against a full tx ring).
    pub tx_neigh_drops: u64,
    /// Tx bursts that sent at least one frame.
    pub tx_bursts: u64,
    /// Frames sent.
    pub tx_frames: u64,
    /// Tx bursts where the PMD took fewer frames than offered (the rest retried next poll).
    pub tx_partial: u64,
    /// Frames freed unsent when the worker stopped.
    pub tx_dropped: u64,
    /// Bulk mbuf allocations that failed (the pool was empty).
    pub mbuf_alloc_failures: u64,
    /// `handle_timeout` calls.
    pub timer_runs: u64,
}

impl WorkerStats {
    /// `name=value` pairs on one line.
    pub fn line(&self) -> String {
        format!(
            "polls={} rx_bursts={} rx_empty_polls={} rx_frames={} rx_from_ring={} rx_roce={} rx_linearized={} rx_other={} \
             steering_misses={} rx_unknown_qp={} dispatched={} dispatch_drops={} loss_injected={} rx_neigh={} tx_neigh={} tx_neigh_drops={} \
             tx_bursts={} tx_frames={} tx_partial={} tx_dropped={} mbuf_alloc_failures={} timer_runs={}",
            self.polls,
            self.rx_bursts,
            self.rx_empty_polls,
            self.rx_frames,
            self.rx_from_ring,
            self.rx_roce,
            self.rx_linearized,
            self.rx_other,
            self.steering_misses,
            self.rx_unknown_qp,
            self.dispatched,
            self.dispatch_drops,
            self.loss_injected,
            self.rx_neigh,
            self.tx_neigh,
            self.tx_neigh_drops,
            self.tx_bursts,
            self.tx_frames,
            self.tx_partial,
            self.tx_dropped,
            self.mbuf_alloc_failures,
            self.timer_runs,
        )
    }
}

/// A worker's dispatcher: RoCE frames whose BTH destination QP belongs to another worker go to that worker's ring.
/// With software steering only worker 0 receives from the port and has one; with hardware steering (one rx queue
/// per worker, [`Dispatch::hardware`]) every worker has one, forwards the frames the port delivered to the wrong
/// queue (counted as steering misses) and hands ARP/ND to worker 0, which keeps the port's neighbour table.
pub struct Dispatch {
    base: u32,
    me: usize,
    hardware: bool,
    /// Ring to worker `w` (None for this worker).
    rings: Vec<Option<Ring>>,
    out: Vec<Burst>,
}

impl Dispatch {
    /// A dispatcher in worker `me` for workers whose engines start at `base + w * QPN_STRIDE`; `rings[w]` carries
    /// frames to worker `w` (`rings[me]` is ignored).
    pub fn new(base: u32, me: usize, rings: Vec<Option<Ring>>) -> Self {
        let out = rings.iter().map(|_| Burst::new()).collect();
        Self { base, me, hardware: false, rings, out }
    }

    /// The port steers frames to every worker's own rx queue: frames forwarded here are steering misses, and
    /// ARP/ND frames go to worker 0. `rings[w]` must then be multi-producer when more than two workers forward.
    pub fn hardware(mut self) -> Self {
        self.hardware = true;
        self
    }

    /// The worker owning `qpn`, if any.
    pub fn owner(&self, qpn: u32) -> Option<usize> {
        crate::engine::qpn_owner(self.base, self.rings.len(), qpn)
    }
}

/// One poll-mode worker: an engine, a port queue pair, a mempool, and (on the worker that receives from the port)
/// the port's neighbour table.
pub struct Worker<'p> {
    /// The engine (the application posts work requests and polls completions through it between polls).
    pub engine: Engine,
    /// The port's neighbour table and ARP/ND responder (used by the worker that receives from the port).
    pub neigh: Neighbours,
    /// Counters.
    pub stats: WorkerStats,
    q: QueuePair<'p>,
    /// Frames steered to this worker by another worker's dispatcher.
    rx_ring: Option<Ring>,
    dispatch: Option<Dispatch>,
    pool: Mempool,
    cfg: WorkerConfig,
    clock: Clock,
    rx: Burst,
    /// Received frames already handled, freed in bulk at the end of the turn (after its tx bursts).
    rx_done: Burst,
    tx: Burst,
    /// Empty mbufs for the next frames (refilled in bulk).
    stash: Burst,
    scratch: Vec<u8>,
    /// Bytes appended to an mbuf for `poll_transmit`: the largest path MTU plus headers.
    frame_room: u16,
    rng: SimRng,
    empty_streak: u32,
    /// The time read at the start of the last [`Worker::poll`].
    turn_now: Instant,
    /// Turns in a row of [`Worker::run`] that reused `turn_now` instead of reading the clock.
    clock_reused: u32,
}

impl<'p> Worker<'p> {
    /// A worker running `engine` on queue pair `q` with mbufs from `pool`, whose frames are at most
    /// `max_mtu + MAX_HEADER_BYTES` bytes (the pool's data room must hold them: `EINVAL` otherwise).
    pub fn new(engine: Engine, q: QueuePair<'p>, pool: &Mempool, max_mtu: u32, cfg: WorkerConfig) -> Result<Self> {
        let room = max_mtu as usize + MAX_HEADER_BYTES;
        let avail = usize::from(pool.data_room()).saturating_sub(dpdk_sys::RTE_PKTMBUF_HEADROOM as usize);
        if room > avail || room > usize::from(u16::MAX) {
            return Err(DpdkError::new("worker: mbuf data room too small for the path MTU", libc::EINVAL));
        }
        let c = engine.config();
        let neigh = Neighbours::new(c.local_mac, c.local_ip.v4, c.local_ip.v6);
        Ok(Self {
            engine,
            neigh,
            stats: WorkerStats::default(),
            q,
            rx_ring: None,
            dispatch: None,
            pool: pool.clone(),
            cfg: WorkerConfig { burst: cfg.burst.clamp(1, BURST), ..cfg },
            clock: Clock::new(super::tsc_hz()),
            rx: Burst::new(),
            rx_done: Burst::new(),
            tx: Burst::new(),
            stash: Burst::new(),
            scratch: Vec::with_capacity(room),
            frame_room: room as u16,
            rng: SimRng::new(cfg.loss_seed),
            empty_streak: 0,
            turn_now: Instant(0),
            clock_reused: 0,
        })
    }

    /// Receive from `ring` (filled by another worker's [`Dispatch`]) instead of the port's rx queue.
    pub fn with_rx_ring(mut self, ring: Ring) -> Self {
        self.rx_ring = Some(ring);
        self
    }

    /// Forward RoCE frames for other workers' QPs through `d`.
    pub fn with_dispatch(mut self, d: Dispatch) -> Self {
        self.dispatch = Some(d);
        self
    }

    /// Use `clock` (e.g. one shared by several workers so their times agree).
    pub fn with_clock(mut self, clock: Clock) -> Self {
        self.clock = clock;
        self
    }

    /// Stop and hand back the engine (e.g. to read its memory after the run); the worker's mbufs are freed.
    pub fn into_engine(mut self) -> Engine {
        let tiny = crate::engine::EngineConfig { max_qps: 1, max_cqs: 1, max_mrs: 1, ..*self.engine.config() };
        std::mem::replace(&mut self.engine, Engine::new(tiny))
    }

    /// The current engine time.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// The queue pair.
    pub fn queue(&self) -> &QueuePair<'p> {
        &self.q
    }

    /// One bounded iteration: one rx burst, due timers, up to one tx burst. Returns the number of frames moved
    /// (0: nothing to do).
    pub fn poll(&mut self) -> usize {
        let moved = self.poll_turn();
        self.free_rx_done();
        moved
    }

    /// One turn for a caller that runs its application between turns (perftest's traffic loop): first one tx
    /// burst with what the application posted since the last turn together with the responses (ACKs) the last
    /// turn's frames queued, then the rx burst and due timers. The responses to this turn's frames wait for the
    /// next turn, so what the application posts in answer to them leaves in the same burst: in a ping-pong of
    /// WRITEs (`rdp_write_lat`) the ACK of the peer's WRITE and the reply WRITE go out together, one tx burst and
    /// one peer rx burst per hop instead of two. A response waits at most one application pass. Returns the
    /// frames moved.
    pub fn poll_tx_first(&mut self) -> usize {
        let now = self.start_turn();
        let mut moved = 0;
        if self.tx_pending() {
            moved += self.poll_tx(now);
        }
        self.free_rx_done();
        moved += self.poll_rx(now);
        self.run_due_timers(now);
        moved
    }

    /// Sends what is pending now (after the last [`Worker::poll_tx_first`] of a loop: the ACKs and requests of its
    /// final turn). Returns the frames sent.
    pub fn flush_tx(&mut self) -> usize {
        let mut sent = 0;
        if self.tx_pending() {
            sent = self.poll_tx(self.clock.now());
        }
        self.free_rx_done();
        sent
    }

    /// [`Worker::poll`] without freeing the frames it received: [`Worker::run`] frees them at the end of its turn,
    /// after the frames the turn produced (an ACK, a request the application posted on a completion) left.
    fn poll_turn(&mut self) -> usize {
        let now = self.start_turn();
        self.turn_after(now)
    }

    /// The turn after its clock reading: one rx burst, due timers, the tx burst if anything is pending. Inlined
    /// into [`Worker::run`]: a call here cost an empty turn ~13 instructions of register saves.
    #[inline(always)]
    fn turn_after(&mut self, now: Instant) -> usize {
        let got = self.poll_rx(now);
        self.run_due_timers(now);
        if got == 0 && !self.tx_pending() {
            return 0;
        }
        got + self.poll_tx(now)
    }

    /// The time the current turn started at (read once per turn).
    #[inline]
    pub fn turn_now(&self) -> Instant {
        self.turn_now
    }

    /// Counts a turn and reads the clock once for it.
    #[inline]
    fn start_turn(&mut self) -> Instant {
        self.stats.polls += 1;
        let now = self.clock.now();
        self.turn_now = now;
        now
    }

    /// [`Worker::start_turn`] for [`Worker::run`]'s turn after an empty one: reuses the last clock reading when
    /// fewer than [`CLOCK_REUSE`] turns in a row reused it and the engine's earliest deadline is more than
    /// [`CLOCK_SLACK`] after it (so a timer fires at most a few empty turns late only when those turns took more than
    /// the slack together). The TSC read costs ~20 ns on this VM, a third of an empty turn: the turn that finds the
    /// next frame starts sooner (one-in-flight RTT).
    #[inline]
    fn start_turn_after_empty(&mut self) -> Instant {
        if self.clock_reused < CLOCK_REUSE {
            let last = self.turn_now;
            if self.engine.poll_timeout().is_none_or(|t| t.0 > last.0.saturating_add(CLOCK_SLACK)) {
                self.clock_reused += 1;
                self.stats.polls += 1;
                return last;
            }
        }
        self.clock_reused = 0;
        self.start_turn()
    }

    /// Runs the engine's timers if its earliest deadline has passed.
    #[inline]
    fn run_due_timers(&mut self, now: Instant) {
        if self.engine.poll_timeout().is_some_and(|t| t <= now) {
            self.engine.handle_timeout(now);
            self.stats.timer_runs += 1;
        }
    }

    /// Frames left from the last tx burst, or frames the engine has to send.
    #[inline]
    fn tx_pending(&self) -> bool {
        !self.tx.is_empty() || self.engine.has_pending_tx()
    }

    /// Frees the frames handled since the last call, in one bulk put back into the pool.
    #[inline]
    fn free_rx_done(&mut self) {
        if !self.rx_done.is_empty() {
            self.rx_done.clear();
        }
    }

    /// One rx burst from the port's queue and/or the worker's ring. Inline, with the frames' handling out of line:
    /// an empty poll (most polls of a ping-pong: the turn that finds the answer starts sooner the shorter the empty
    /// ones are) is the PMD call and a compare, without the handler's register saves.
    #[inline(always)]
    fn poll_rx(&mut self, now: Instant) -> usize {
        // A worker with its own rx queue polls it; one fed by other workers' dispatchers polls its ring (with
        // hardware steering: both, the queue first).
        let mut got = 0;
        if self.q.has_rx() {
            let n = self.q.rx_burst_max(&mut self.rx, self.cfg.burst);
            got = if n == 0 { self.empty_rx() } else { self.handle_burst(now, n, false) };
        }
        if self.rx_ring.is_some() {
            let n = self.rx_ring.as_ref().map_or(0, |r| r.dequeue_burst(&mut self.rx));
            got += if n == 0 { self.empty_rx() } else { self.handle_burst(now, n, true) };
        }
        got
    }

    #[inline(always)]
    fn empty_rx(&mut self) -> usize {
        self.stats.rx_empty_polls += 1;
        0
    }

    /// Handles the `got` frames an rx burst just put into `self.rx`.
    #[inline(never)]
    fn handle_burst(&mut self, now: Instant, got: usize, from_ring: bool) -> usize {
        self.stats.rx_bursts += 1;
        self.stats.rx_frames += got as u64;
        if from_ring {
            self.stats.rx_from_ring += got as u64;
        }
        let meta = RxMeta { port: self.q.port_id(), queue: self.q.queue() };
        // Frames handled here are freed together at the end of the turn (one bulk put back into the pool instead
        // of one rte_pktmbuf_free per frame, and after the turn's tx burst: not on the way from a request to its
        // ACK); only frames steered to another worker leave the burst. The bursts stay in place (moving them out
        // of `self` copied 2 x 264 bytes twice per burst: ~200 instructions on each hop of a ping-pong).
        if self.rx_done.room() < got {
            // A second burst in one turn (port queue and ring): free the first one's frames now.
            self.rx_done.clear();
        }
        let n = self.rx.release();
        for i in 0..n {
            // SAFETY: i < n, each taken once, and nothing is stored into `self.rx` until the loop ends (frame
            // handling touches the tx burst, the stash and the dispatcher's bursts, never `self.rx`).
            let m = unsafe { self.rx.take_released(i) };
            if let Some(m) = self.handle_frame(now, m, meta) {
                // Cannot fail: `rx_done` has room for the whole burst (made above).
                let _ = self.rx_done.push(m);
            }
        }
        if let Some(d) = &mut self.dispatch {
            for (w, b) in d.out.iter_mut().enumerate() {
                if b.is_empty() {
                    continue;
                }
                if let Some(r) = &d.rings[w] {
                    r.enqueue_burst(b);
                }
                self.stats.dispatch_drops += b.len() as u64;
                b.clear();
            }
        }
        got
    }

    /// Handles one received frame; gives the mbuf back to be freed with the burst, unless it was steered to
    /// another worker's ring.
    fn handle_frame(&mut self, now: Instant, mut m: Mbuf, meta: RxMeta) -> Option<Mbuf> {
        let multi = m.nb_segs() > 1;
        if multi {
            m.copy_segments(&mut self.scratch);
            self.stats.rx_linearized += 1;
        }
        let data = if multi { &self.scratch[..] } else { m.data() };
        match classify(data) {
            FrameKind::Roce { dest_qp } => {
                if let Some(d) = &mut self.dispatch {
                    match d.owner(dest_qp) {
                        Some(w) if w != d.me => {
                            if d.hardware {
                                self.stats.steering_misses += 1;
                            }
                            return self.forward(w, m);
                        }
                        Some(_) => {}
                        None => self.stats.rx_unknown_qp += 1,
                    }
                }
                if self.cfg.loss_ppm > 0 && self.rng.chance_ppm(self.cfg.loss_ppm) {
                    self.stats.loss_injected += 1;
                    return Some(m);
                }
                self.stats.rx_roce += 1;
                // The frame is this worker's after the rx burst: the engine checks its ICRC in place (it puts the
                // bytes back before it returns). Not in data the mbuf shares (a clone, or the mbuf a clone was made
                // of: another holder may read it) or an external buffer (a PMD's memory, perhaps not writable).
                if multi {
                    self.engine.handle_rx_mut(now, &mut self.scratch[..], meta);
                } else if let Some(d) = m.data_mut() {
                    self.engine.handle_rx_mut(now, d, meta);
                } else {
                    self.engine.handle_rx(now, m.data(), meta);
                }
            }
            FrameKind::Arp | FrameKind::Nd => {
                if let Some(d) = &self.dispatch {
                    if d.hardware && d.me != 0 {
                        return self.forward(0, m);
                    }
                }
                self.stats.rx_neigh += 1;
                let mut out = [0u8; ND_FRAME_LEN];
                if let Some(n) = self.neigh.handle(data, &mut out) {
                    self.send_raw(&out[..n]);
                }
            }
            FrameKind::Other => self.stats.rx_other += 1,
        }
        Some(m)
    }

    /// Queue `m` for worker `w`'s ring (sent at the end of the burst); gives it back to be freed if that burst is
    /// full.
    fn forward(&mut self, w: usize, m: Mbuf) -> Option<Mbuf> {
        let d = self.dispatch.as_mut()?;
        self.stats.dispatched += 1;
        match d.out[w].push(m) {
            Ok(()) => None,
            Err(m) => {
                self.stats.dispatch_drops += 1;
                Some(m)
            }
        }
    }

    /// Queue a frame built outside the engine (ARP, ND); sent with the next tx burst. False (counted in
    /// `tx_neigh_drops`) if no mbuf was free or the tx burst is full.
    pub fn send_raw(&mut self, frame: &[u8]) -> bool {
        let queued = self.take_mbuf().and_then(|mut m| {
            m.append(frame.len() as u16)?.copy_from_slice(frame);
            self.tx.push(m).ok()
        });
        if queued.is_none() {
            self.stats.tx_neigh_drops += 1;
            return false;
        }
        self.stats.tx_neigh += 1;
        true
    }

    /// Send an ARP request / neighbour solicitation for `ip` (see [`Worker::resolve`]), unless `ip` was solicited
    /// too recently ([`Neighbours::solicit_at`]'s backoff: a control thread that asks every few milliseconds while
    /// a peer does not answer must not flood the segment with broadcasts).
    pub fn solicit(&mut self, ip: NeighIp) -> bool {
        let mut out = [0u8; ND_FRAME_LEN];
        let now = self.clock.now();
        match self.neigh.solicit_at(ip, now, &mut out) {
            Some(n) => self.send_raw(&out[..n]),
            None => false,
        }
    }

    /// Poll until `ip`'s MAC is known (static or learned), soliciting every 100 ms; `None` after `timeout`.
    pub fn resolve(&mut self, ip: NeighIp, timeout: std::time::Duration) -> Option<crate::wire::MacAddr> {
        let start = std::time::Instant::now();
        let mut last: Option<std::time::Instant> = None;
        loop {
            if let Some(mac) = self.neigh.lookup(ip) {
                return Some(mac);
            }
            if start.elapsed() >= timeout {
                return None;
            }
            if last.is_none_or(|t| t.elapsed() >= std::time::Duration::from_millis(100)) {
                self.solicit(ip);
                last = Some(std::time::Instant::now());
            }
            if self.poll() == 0 {
                std::thread::yield_now();
            }
        }
    }

    fn take_mbuf(&mut self) -> Option<Mbuf> {
        if self.stash.is_empty() && self.stash.alloc_bulk(&self.pool) == 0 {
            self.stats.mbuf_alloc_failures += 1;
            // Fall back to single allocations when the pool is nearly dry.
            return self.pool.alloc().ok();
        }
        self.stash.pop()
    }

    fn poll_tx(&mut self, now: Instant) -> usize {
        let limit = self.cfg.burst;
        while self.tx.len() < limit && self.engine.has_pending_tx() {
            let Some(mut m) = self.take_mbuf() else { break };
            let room = usize::from(self.frame_room);
            // The engine writes the frame straight into the mbuf's tailroom; its length is committed afterwards.
            let Some(buf) = m.spare_mut().get_mut(..room) else {
                self.stats.mbuf_alloc_failures += 1;
                break;
            };
            match self.engine.poll_transmit(now, buf) {
                Some(len) => {
                    // Cannot fail: len <= room <= the tailroom checked above.
                    m.extend(len as u16);
                    let _ = self.tx.push(m);
                }
                None => {
                    let _ = self.stash.push(m);
                    break;
                }
            }
        }
        if self.tx.is_empty() {
            return 0;
        }
        let offered = self.tx.len();
        let sent = self.q.tx_burst(&mut self.tx);
        if sent > 0 {
            self.stats.tx_bursts += 1;
            self.stats.tx_frames += sent as u64;
        }
        if sent < offered {
            self.stats.tx_partial += 1;
        }
        sent
    }

    /// Frames waiting for the PMD (not yet taken by a tx burst).
    pub fn tx_backlog(&self) -> usize {
        self.tx.len()
    }

    /// Mbufs the worker holds right now: spare ones for its next frames (the stash a bulk allocation refills),
    /// frames the PMD has not taken yet, handled frames waiting for the turn's bulk free, and frames queued for
    /// another worker's ring (the last two are empty between turns). A leak check compares the pool's count of
    /// mbufs in use minus these.
    pub fn held_mbufs(&self) -> usize {
        let out = self.dispatch.as_ref().map_or(0, |d| d.out.iter().map(Burst::len).sum());
        self.stash.len() + self.tx.len() + self.rx_done.len() + self.rx.len() + out
    }

    /// Poll until `stop` is set or `app` returns false; `app` runs after every poll (post work requests, poll
    /// completions). Applies the idle back-off after polls where neither moved anything (`app` returns whether
    /// it did work through the second element).
    pub fn run(&mut self, stop: &AtomicBool, mut app: impl FnMut(&mut Self) -> (bool, bool)) {
        // Whether the last turn found nothing to do and did not back off (its clock reading may be reused).
        let mut after_empty = false;
        while !stop.load(Ordering::Relaxed) {
            let now = if after_empty { self.start_turn_after_empty() } else { self.start_turn() };
            let mut moved = self.turn_after(now);
            let (go_on, app_busy) = app(self);
            // What the application just posted leaves in this turn, not after the next rx burst and timer check
            // (a request posted on a completion goes out one poll earlier: the ping-pong RTT). The turn's time is
            // reused: the engine only arms timers and paces with it.
            if go_on && self.engine.has_pending_tx() {
                moved += self.poll_tx(self.turn_now);
            }
            self.free_rx_done();
            if !go_on {
                break;
            }
            if moved > 0 || app_busy {
                self.empty_streak = 0;
                after_empty = false;
                continue;
            }
            self.empty_streak = self.empty_streak.saturating_add(1);
            after_empty = true;
            match self.cfg.idle {
                Idle::Busy => {}
                Idle::Pause { after } if self.empty_streak > after => std::hint::spin_loop(),
                Idle::Yield { after } if self.empty_streak > after => {
                    std::thread::yield_now();
                    after_empty = false;
                }
                Idle::Sleep { after, us } if self.empty_streak > after => {
                    std::thread::sleep(std::time::Duration::from_micros(u64::from(us)));
                    after_empty = false;
                }
                _ => {}
            }
        }
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        self.stats.tx_dropped += self.tx.len() as u64;
        self.tx.clear();
        if let Some(r) = &self.rx_ring {
            let mut b = Burst::new();
            while r.dequeue_burst(&mut b) > 0 {
                b.clear();
            }
        }
    }
}

/// Offloads to enable from what the driver reports: `(rx, tx)` bit masks. Fast free is safe (one pool, no
/// clones, refcount 1); multi-segment tx only when offered. IPv4 header checksums stay in software: the wire
/// layer writes them while it builds the frame (and the ICRC masks them anyway), so there is nothing to offload.
pub fn choose_offloads(info: &PortInfo) -> (u64, u64) {
    let want_tx = u64::from(dpdk_sys::RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE | dpdk_sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS);
    let want_rx = u64::from(dpdk_sys::RTE_ETH_RX_OFFLOAD_SCATTER);
    (info.rx_offload_capa & want_rx, info.tx_offload_capa & want_tx)
}

/// Pin the calling thread to `core` and register it with EAL (so it gets an lcore id and mempool caches).
pub fn register_thread(core: usize) -> Result<()> {
    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
        return Err(DpdkError::new("pin thread to core", libc::EINVAL));
    }
    if super::lcore_id().is_none() {
        // SAFETY: EAL is initialised (callers hold an Eal through their pool/port); registers this thread only.
        let ret = unsafe { dpdk_sys::rte_thread_register() };
        if ret != 0 {
            return Err(DpdkError::from_rte_errno("rte_thread_register"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_converts_ticks_to_ns() {
        let c = Clock { t0: 1000, mult: (1_000_000_000u128 << 32) / 2_600_000_000 };
        assert_eq!(c.ns(1000), 0);
        let one_s = c.ns(1000 + 2_600_000_000);
        assert!((999_999_990..=1_000_000_000).contains(&one_s), "{one_s}");
        assert!(c.ns(1000 + 26) >= 9);
    }

    #[test]
    fn dispatch_owner_by_qpn_range() {
        let d = Dispatch::new(0x100, 0, vec![None, None, None]);
        assert_eq!(d.owner(0x100), Some(0));
        assert_eq!(d.owner(0x100 + QPN_STRIDE + 5), Some(1));
        assert_eq!(d.owner(0x100 + 2 * QPN_STRIDE), Some(2));
        assert_eq!(d.owner(0x100 + 3 * QPN_STRIDE), None);
        assert_eq!(d.owner(0xff), None);
    }
}
