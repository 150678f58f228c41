//! The appliance without a port: a [`Server`] and an [`Appliance`] per worker, on engines whose frames come straight
//! back to them (every QP on one soft NIC, as `roce-dpd` on a loopback net_ring port), each worker on a thread (or,
//! with one worker, stepped by the caller). No DPDK: tests of the control plane, of isolation and of `roce-stat`,
//! and the daemon benchmark, run it in-process (or in a child process when the daemon's death is what is tested).
//!
//! The worker loop is [`pump`] (engine frames back into the engine, timers) plus the appliance's ring polling and
//! the control jobs, as `roce-dpd`'s worker does between bursts. With several workers ([`LoopbackConfig::workers`])
//! each has its own engine (worker `w`'s QPs numbered from `0x100 + w * QPN_STRIDE`), and a frame whose BTH
//! destination QP belongs to another worker goes to that worker over a channel (one allocation per such frame:
//! a model of `roce-dpd`'s software dispatcher for tests, not a data path). Statistics carry a `worker` scope (id
//! = worker: loop iterations, busy iterations, jobs) and a `port` scope (id 0: frames and bytes through the
//! loopback, all workers).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use super::client::{Cq, Device, Error, Mr, Pd, Qp, QpInit, Remote};
use super::daemon::{job_channel, Appliance, JobReceiver, ServeError, Server, ServerConfig};
use super::proto::{DeviceInfo, StatRecord};
use super::shm::Backing;
use crate::engine::{qpn_owner, Engine, EngineConfig, RxMeta, MAX_HEADER_BYTES, QPN_STRIDE};
use crate::mr::AccessFlags;
use crate::neigh::{classify, FrameKind, Neighbours};
use crate::qp::LocalIp;
use crate::time::Instant;
use crate::verbs::Cqe;
use crate::wire::MacAddr;

/// The loopback port's MAC.
pub const MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
/// The loopback port's IPv4 address.
pub const IPV4: [u8; 4] = [10, 0, 0, 1];

/// How the loopback daemon runs.
#[derive(Clone, Debug)]
pub struct LoopbackConfig {
    /// Socket path.
    pub path: PathBuf,
    /// Socket permission bits.
    pub mode: u32,
    /// Path MTU told to clients.
    pub mtu: u32,
    /// Largest queue depth a client may ask for.
    pub max_depth: u32,
    /// What one session may hold at once (the daemon config's defaults).
    pub limits: super::daemon::SessionLimits,
    /// `None`: the workers busy-poll (benchmarks); `Some(us)`: they sleep that long after an idle iteration
    /// (tests, so that a test's workers do not hold a core).
    pub idle_sleep_us: Option<u64>,
    /// Workers, each on its own thread with its own engine (1..=16; [`LoopbackDaemon::start_stepped`] runs one).
    pub workers: usize,
    /// Bytes of statistics records per frame (tests lower it to see a small daemon's statistics in pages).
    pub stats_page_bytes: usize,
    /// What the rings and the clients' memory-region buffers are made of (`[daemon] backing`).
    pub backing: Backing,
}

impl LoopbackConfig {
    /// Defaults for tests: mode 0o600, MTU 1024, depth 4096, 20 us sleeps when idle, one worker, memfd pages.
    pub fn new(path: impl Into<PathBuf>) -> LoopbackConfig {
        LoopbackConfig {
            path: path.into(),
            mode: 0o600,
            mtu: 1024,
            max_depth: 4096,
            limits: super::daemon::SessionLimits::default(),
            idle_sleep_us: Some(20),
            workers: 1,
            stats_page_bytes: super::proto::STATS_PAGE_BYTES,
            backing: Backing::Pages,
        }
    }
}

/// Frames through the loopback.
#[derive(Clone, Copy, Debug, Default)]
pub struct PumpStats {
    /// Frames the engine sent (and received back).
    pub frames: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// One pass of a loopback port: every frame the engine has to send goes straight back into it, then expired
/// timers run. `buf` holds a frame of the largest path MTU plus [`MAX_HEADER_BYTES`]. Returns whether a frame moved.
pub fn pump(e: &mut Engine, now: Instant, buf: &mut [u8], st: &mut PumpStats) -> bool {
    let mut moved = false;
    while let Some(n) = e.poll_transmit(now, buf) {
        e.handle_rx_mut(now, &mut buf[..n], RxMeta::default());
        st.frames += 1;
        st.bytes += n as u64;
        moved = true;
    }
    if e.poll_timeout().is_some_and(|t| t <= now) {
        e.handle_timeout(now);
    }
    moved
}

/// A frame buffer for [`pump`].
pub fn frame_buf() -> Vec<u8> {
    vec![0u8; 4096 + MAX_HEADER_BYTES]
}

/// The engine configuration of the loopback port (MAC [`MAC`], IPv4 [`IPV4`]) for worker 0.
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        local_mac: MacAddr(MAC),
        local_ip: LocalIp { v4: Some(IPV4), v6: None },
        qpn_base: QPN_BASE,
        ..EngineConfig::default()
    }
}

/// The first QPN of worker 0's engine.
pub const QPN_BASE: u32 = 0x100;

fn server_config(cfg: &LoopbackConfig) -> ServerConfig {
    let info = DeviceInfo {
        abi: super::abi::ABI_VERSION,
        pid: std::process::id(),
        mac: MAC,
        ipv4: Some(IPV4),
        ipv6: None,
        mtu: cfg.mtu,
        hugetlb: cfg.backing == Backing::Hugetlb,
    };
    ServerConfig {
        path: cfg.path.clone(),
        mode: cfg.mode,
        backing: cfg.backing,
        info,
        max_depth: cfg.max_depth,
        limits: cfg.limits,
        log: false,
        stats_page_bytes: cfg.stats_page_bytes,
    }
}

/// A running loopback daemon; dropping it shuts it down as [`shutdown`](Self::shutdown) does.
pub struct LoopbackDaemon {
    server: Option<Server>,
    stop: Arc<AtomicBool>,
    workers: Vec<JoinHandle<Appliance>>,
    path: PathBuf,
}

impl LoopbackDaemon {
    /// Starts the workers and the server on `cfg.path`.
    pub fn start(cfg: LoopbackConfig) -> Result<LoopbackDaemon, ServeError> {
        let n = cfg.workers;
        if !(1..=16).contains(&n) {
            return Err(ServeError(format!("workers = {n} is not in 1..=16")));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let port = Arc::new(PortCounters::new(n));
        let wires: Vec<_> = (0..n).map(|_| mpsc::channel::<Vec<u8>>()).collect();
        let peers: Vec<_> = wires.iter().map(|(tx, _)| tx.clone()).collect();
        let mut jobs = Vec::new();
        let mut workers = Vec::new();
        let mut fail = None;
        for (w, (_, wire)) in wires.into_iter().enumerate() {
            let (tx, rx) = job_channel();
            jobs.push(tx);
            let mut lw = LoopWorker::new(w, port.clone());
            if n > 1 {
                lw.wire = Some(Wire { rx: wire, peers: peers.clone() });
            }
            let (st, idle) = (stop.clone(), cfg.idle_sleep_us);
            match std::thread::Builder::new()
                .name(format!("roce-dpd-lo-w{w}"))
                .spawn(move || worker(lw, &rx, &st, idle))
            {
                Ok(h) => workers.push(h),
                Err(e) => {
                    fail = Some(ServeError(format!("worker thread: {e}")));
                    break;
                }
            }
        }
        let server = match fail {
            Some(e) => Err(e),
            None => Server::start_workers(server_config(&cfg), jobs),
        };
        match server {
            Ok(s) => Ok(LoopbackDaemon { server: Some(s), stop, workers, path: cfg.path }),
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                for h in workers {
                    let _ = h.join();
                }
                Err(e)
            }
        }
    }

    /// Starts the server only: its one worker is the returned [`Stepper`], which the caller steps. Control calls (a
    /// client opening its session, [`shutdown`](Self::shutdown)) wait for steps, so make them on another thread.
    pub fn start_stepped(cfg: LoopbackConfig) -> Result<(LoopbackDaemon, Stepper), ServeError> {
        let (tx, rx) = job_channel();
        let server = Server::start(server_config(&cfg), tx)?;
        let d = LoopbackDaemon { server: Some(server), stop: Arc::default(), workers: Vec::new(), path: cfg.path };
        Ok((d, Stepper { w: LoopWorker::new(0, Arc::new(PortCounters::new(1))), jobs: rx }))
    }

    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sessions connected now.
    pub fn sessions(&self) -> usize {
        self.server.as_ref().map_or(0, Server::sessions)
    }

    /// Stops as `roce-dpd` does on SIGTERM: every QP to the error state and flushed into its CQ ring, every session
    /// told `reason` and closed (and reclaimed), the socket removed, the workers stopped. Returns worker 0's
    /// appliance, for its counts (`None` if a worker panicked, or for a stepped daemon, whose stepper must keep
    /// stepping while this runs).
    pub fn shutdown(&mut self, reason: &str) -> Option<Appliance> {
        self.shutdown_workers(reason)?.into_iter().next()
    }

    /// [`shutdown`](Self::shutdown) returning every worker's appliance, in worker order (`None` if one panicked or
    /// the daemon is stepped or already shut down).
    pub fn shutdown_workers(&mut self, reason: &str) -> Option<Vec<Appliance>> {
        let server = self.server.take()?;
        server.shutdown(reason);
        self.stop.store(true, Ordering::Relaxed);
        let mut apps = Vec::new();
        let mut ok = !self.workers.is_empty();
        for h in self.workers.drain(..) {
            match h.join() {
                Ok(a) => apps.push(a),
                Err(_) => ok = false,
            }
        }
        ok.then_some(apps)
    }
}

impl Drop for LoopbackDaemon {
    fn drop(&mut self) {
        self.shutdown_workers("the daemon was dropped");
    }
}

/// The port's frame and byte counts, one pair per worker (each stores its own; worker 0's statistics sum them).
struct PortCounters(Vec<[AtomicU64; 2]>);

impl PortCounters {
    fn new(workers: usize) -> PortCounters {
        PortCounters((0..workers).map(|_| [AtomicU64::new(0), AtomicU64::new(0)]).collect())
    }
}

/// With several workers: this worker's incoming frames and the senders to every worker (its own included).
struct Wire {
    rx: mpsc::Receiver<Vec<u8>>,
    peers: Vec<mpsc::Sender<Vec<u8>>>,
}

/// A worker's state: its engine, its appliance and its share of the loopback port's counters.
struct LoopWorker {
    w: usize,
    e: Engine,
    neigh: Neighbours,
    app: Appliance,
    buf: Vec<u8>,
    port: PumpStats,
    shared: Arc<PortCounters>,
    wire: Option<Wire>,
    loops: u64,
    busy_loops: u64,
    served: u64,
    t0: std::time::Instant,
}

impl LoopWorker {
    fn new(w: usize, shared: Arc<PortCounters>) -> LoopWorker {
        let cfg = EngineConfig { qpn_base: QPN_BASE + w as u32 * QPN_STRIDE, ..engine_config() };
        LoopWorker {
            w,
            e: Engine::new(cfg),
            neigh: Neighbours::new(MacAddr(MAC), Some(IPV4), None),
            app: Appliance::for_worker(w as u32),
            buf: frame_buf(),
            port: PumpStats::default(),
            shared,
            wire: None,
            loops: 0,
            busy_loops: 0,
            served: 0,
            t0: std::time::Instant::now(),
        }
    }

    /// One iteration of the worker loop: control jobs, the QPs' rings, the loopback. Returns whether anything moved.
    fn step(&mut self, jobs: &JobReceiver) -> bool {
        self.loops += 1;
        let mut busy = false;
        while let Ok(job) = jobs.try_recv() {
            self.served += 1;
            let (w, loops, busy_loops, served) = (self.w as u32, self.loops, self.busy_loops, self.served);
            let shared = &self.shared;
            let extra = |v: &mut Vec<StatRecord>| {
                let mut rec = |scope: &str, id: u32, name: &str, value: u64| {
                    v.push(StatRecord { scope: scope.into(), id, name: name.into(), value })
                };
                rec("worker", w, "loops", loops);
                rec("worker", w, "busy_loops", busy_loops);
                rec("worker", w, "jobs", served);
                if w == 0 {
                    let sum = |k: usize| shared.0.iter().map(|c| c[k].load(Ordering::Relaxed)).sum();
                    rec("port", 0, "frames", sum(0));
                    rec("port", 0, "bytes", sum(1));
                }
            };
            self.app.serve(&mut self.e, &self.neigh, job, &extra);
            busy = true;
        }
        // The clock is read only when the engine has a frame to send or a timer armed (or frames may come from
        // another worker), or a CQ holds a moderated event: an idle turn costs no clock read.
        let now = || Instant(self.t0.elapsed().as_nanos() as u64);
        if self.app.holds_events() {
            self.app.set_now(now());
        }
        busy |= self.app.poll(&mut self.e);
        let idle = self.wire.is_none() && !self.e.has_pending_tx() && self.e.poll_timeout().is_none();
        let moved = match &self.wire {
            _ if idle => false,
            None => pump(&mut self.e, now(), &mut self.buf, &mut self.port),
            Some(wire) => pump_wire(&mut self.e, now(), &mut self.buf, &mut self.port, self.w, wire),
        };
        if moved {
            self.app.set_now(now());
            // Completions the frames just made go into the CQ rings in this iteration, not the next (only the CQs:
            // the QPs' rings were looked at above, and WQEs posted since wait for the next turn's look).
            self.app.deliver(&mut self.e);
            let mine = &self.shared.0[self.w];
            mine[0].store(self.port.frames, Ordering::Relaxed);
            mine[1].store(self.port.bytes, Ordering::Relaxed);
            busy = true;
        }
        if busy {
            self.busy_loops += 1;
        }
        busy
    }
}

/// [`pump`] for one of several workers: each frame goes to the worker owning its BTH destination QP (this one,
/// or another over the channel), then the frames other workers sent here go into this engine.
fn pump_wire(e: &mut Engine, now: Instant, buf: &mut [u8], st: &mut PumpStats, me: usize, wire: &Wire) -> bool {
    let mut moved = false;
    while let Some(n) = e.poll_transmit(now, buf) {
        let frame = &mut buf[..n];
        st.frames += 1;
        st.bytes += n as u64;
        moved = true;
        let owner = match classify(frame) {
            FrameKind::Roce { dest_qp } => qpn_owner(QPN_BASE, wire.peers.len(), dest_qp).unwrap_or(me),
            _ => me,
        };
        if owner == me {
            e.handle_rx_mut(now, frame, RxMeta::default());
        } else {
            let _ = wire.peers[owner].send(frame.to_vec());
        }
    }
    while let Ok(mut f) = wire.rx.try_recv() {
        e.handle_rx_mut(now, &mut f, RxMeta::default());
        moved = true;
    }
    if e.poll_timeout().is_some_and(|t| t <= now) {
        e.handle_timeout(now);
    }
    moved
}

fn worker(mut w: LoopWorker, jobs: &JobReceiver, stop: &AtomicBool, idle_sleep_us: Option<u64>) -> Appliance {
    while !stop.load(Ordering::Relaxed) {
        if !w.step(jobs) {
            if let Some(us) = idle_sleep_us {
                std::thread::sleep(Duration::from_micros(us));
            }
        }
    }
    w.app
}

/// The worker of a daemon started with [`LoopbackDaemon::start_stepped`]: the caller runs its iterations on its own
/// thread (a benchmark of the appliance's work without the core crossing between client and worker).
pub struct Stepper {
    w: LoopWorker,
    jobs: JobReceiver,
}

impl Stepper {
    /// One worker iteration; whether anything moved.
    pub fn step(&mut self) -> bool {
        self.w.step(&self.jobs)
    }

    /// [`Appliance::event_unserved`] on the turn clock read now: whether an event this worker signalled still
    /// waits for its client to arm the CQ again (what roce-dpd's worker yields its core for when it is idle).
    pub fn event_unserved(&mut self) -> bool {
        self.w.app.set_now(Instant(self.w.t0.elapsed().as_nanos() as u64));
        self.w.app.event_unserved()
    }
}

/// A client session for loopback tests and benchmarks: one buffer, one CQ and two RC QPs connected to each other
/// through the loopback port (fields drop QPs first, as verbs wants).
pub struct LoopPair {
    /// Requester side.
    pub a: Qp,
    /// Responder side.
    pub b: Qp,
    /// The session's buffer.
    pub mr: Mr,
    /// Both QPs' CQ (send and receive).
    pub cq: Cq,
    /// The protection domain.
    pub pd: Pd,
    /// The session.
    pub dev: Device,
}

impl LoopPair {
    /// Opens a session on `path`, registers `mr_len` bytes, and connects two QPs of `depth` entries (CQ `4 * depth`)
    /// at path MTU `mtu`.
    pub fn open(path: &Path, mr_len: usize, depth: u32, mtu: u32) -> Result<LoopPair, Error> {
        let dev = Device::open(path)?;
        let pd = dev.alloc_pd()?;
        let mr = pd.reg_mr(mr_len, AccessFlags::ALL)?;
        let cq = dev.create_cq(4 * depth)?;
        let init = QpInit { sq_depth: depth, rq_depth: depth, max_send_sge: 2, max_recv_sge: 2, max_inline: 0 };
        let a = dev.create_qp(&pd, &cq, &cq, init)?;
        let b = dev.create_qp(&pd, &cq, &cq, init)?;
        for (x, y, psn) in [(&a, &b, 100), (&b, &a, 5000)] {
            x.to_init(AccessFlags::ALL)?;
            let peer_psn = if psn == 100 { 5000 } else { 100 };
            x.to_rtr(&Remote { qpn: y.qpn(), psn: peer_psn, gid: dev.gid(), mac: None }, mtu)?;
            x.to_rts(psn)?;
        }
        Ok(LoopPair { a, b, mr, cq, pd, dev })
    }
}

/// Polls `cq` until a completion arrives or `timeout` passes (`Ok(None)`); errors are the library's (the daemon
/// went away).
pub fn wait_cqe(cq: &mut Cq, timeout: Duration) -> Result<Option<Cqe>, Error> {
    let until = std::time::Instant::now() + timeout;
    let mut out = [Cqe::EMPTY; 1];
    loop {
        if cq.poll(&mut out)? == 1 {
            return Ok(Some(out[0]));
        }
        if std::time::Instant::now() >= until {
            return Ok(None);
        }
        std::hint::spin_loop();
    }
}
