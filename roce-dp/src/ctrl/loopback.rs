//! The appliance without a port: a [`Server`] and an [`Appliance`] on one engine whose frames come straight back
//! into it (every QP on one soft NIC, as `roce-dpd` on a loopback net_ring port), driven by a worker thread. No
//! DPDK: tests of the control plane, of isolation and of `roce-stat`, and the daemon benchmark, run it in-process
//! (or in a child process when the daemon's death is what is tested).
//!
//! The worker loop is [`pump`] (engine frames back into the engine, timers) plus the appliance's ring polling and
//! the control jobs, as `roce-dpd`'s worker does between bursts. Statistics carry a `worker` scope (id 0: loop
//! iterations, busy iterations, jobs) and a `port` scope (id 0: frames and bytes through the loopback).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use super::client::{Cq, Device, Error, Mr, Pd, Qp, QpInit, Remote};
use super::daemon::{Appliance, Cmd, Job, ServeError, Server, ServerConfig};
use super::proto::{DeviceInfo, StatRecord};
use super::shm::Backing;
use crate::engine::{Engine, EngineConfig, RxMeta, MAX_HEADER_BYTES};
use crate::mr::AccessFlags;
use crate::neigh::Neighbours;
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
    /// `None`: the worker busy-polls (benchmarks); `Some(us)`: it sleeps that long after an idle iteration (tests,
    /// so that a test's worker does not hold a core).
    pub idle_sleep_us: Option<u64>,
}

impl LoopbackConfig {
    /// Defaults for tests: mode 0o600, MTU 1024, depth 4096, 20 us sleeps when idle.
    pub fn new(path: impl Into<PathBuf>) -> LoopbackConfig {
        LoopbackConfig { path: path.into(), mode: 0o600, mtu: 1024, max_depth: 4096, idle_sleep_us: Some(20) }
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
        e.handle_rx(now, &buf[..n], RxMeta::default());
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

/// The engine configuration of the loopback port (MAC [`MAC`], IPv4 [`IPV4`]).
pub fn engine_config() -> EngineConfig {
    EngineConfig {
        local_mac: MacAddr(MAC),
        local_ip: LocalIp { v4: Some(IPV4), v6: None },
        qpn_base: 0x100,
        ..EngineConfig::default()
    }
}

fn server_config(cfg: &LoopbackConfig) -> ServerConfig {
    let info = DeviceInfo {
        abi: super::abi::ABI_VERSION,
        pid: std::process::id(),
        mac: MAC,
        ipv4: Some(IPV4),
        ipv6: None,
        mtu: cfg.mtu,
        hugetlb: false,
    };
    ServerConfig {
        path: cfg.path.clone(),
        mode: cfg.mode,
        backing: Backing::Pages,
        info,
        max_depth: cfg.max_depth,
        log: false,
    }
}

/// A running loopback daemon; dropping it shuts it down as [`shutdown`](Self::shutdown) does.
pub struct LoopbackDaemon {
    server: Option<Server>,
    stop: Arc<AtomicBool>,
    worker: Option<JoinHandle<Appliance>>,
    jobs: mpsc::Sender<Job>,
    path: PathBuf,
}

impl LoopbackDaemon {
    /// Starts the worker and the server on `cfg.path`.
    pub fn start(cfg: LoopbackConfig) -> Result<LoopbackDaemon, ServeError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let stop = Arc::new(AtomicBool::new(false));
        let st = stop.clone();
        let idle = cfg.idle_sleep_us;
        let worker = std::thread::Builder::new()
            .name("roce-dpd-lo-worker".into())
            .spawn(move || worker(&rx, &st, idle))
            .map_err(|e| ServeError(format!("worker thread: {e}")))?;
        let server = match Server::start(server_config(&cfg), tx.clone()) {
            Ok(s) => s,
            Err(e) => {
                stop.store(true, Ordering::Relaxed);
                let _ = worker.join();
                return Err(e);
            }
        };
        Ok(LoopbackDaemon { server: Some(server), stop, worker: Some(worker), jobs: tx, path: cfg.path })
    }

    /// Starts the server only: the worker is the returned [`Stepper`], which the caller steps. Control calls (a
    /// client opening its session, [`shutdown`](Self::shutdown)) wait for steps, so make them on another thread.
    pub fn start_stepped(cfg: LoopbackConfig) -> Result<(LoopbackDaemon, Stepper), ServeError> {
        let (tx, rx) = mpsc::channel::<Job>();
        let server = Server::start(server_config(&cfg), tx.clone())?;
        let d = LoopbackDaemon { server: Some(server), stop: Arc::default(), worker: None, jobs: tx, path: cfg.path };
        Ok((d, Stepper { w: LoopWorker::new(), jobs: rx }))
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
    /// told `reason` and closed (and reclaimed), the socket removed, the worker stopped. Returns the appliance, for
    /// its counts (`None` if the worker panicked, or for a stepped daemon, whose stepper must keep stepping while
    /// this runs).
    pub fn shutdown(&mut self, reason: &str) -> Option<Appliance> {
        let server = self.server.take()?;
        let (tx, rx) = mpsc::channel();
        let _ = self.jobs.send(Job { client: 0, cmd: Cmd::Shutdown, reply: tx });
        let _ = rx.recv_timeout(Duration::from_secs(5));
        server.shutdown(reason);
        self.stop.store(true, Ordering::Relaxed);
        self.worker.take()?.join().ok()
    }
}

impl Drop for LoopbackDaemon {
    fn drop(&mut self) {
        self.shutdown("the daemon was dropped");
    }
}

/// The worker's state: the engine, the appliance and the loopback port's counters.
struct LoopWorker {
    e: Engine,
    neigh: Neighbours,
    app: Appliance,
    buf: Vec<u8>,
    port: PumpStats,
    loops: u64,
    busy_loops: u64,
    served: u64,
    t0: std::time::Instant,
}

impl LoopWorker {
    fn new() -> LoopWorker {
        LoopWorker {
            e: Engine::new(engine_config()),
            neigh: Neighbours::new(MacAddr(MAC), Some(IPV4), None),
            app: Appliance::new(),
            buf: frame_buf(),
            port: PumpStats::default(),
            loops: 0,
            busy_loops: 0,
            served: 0,
            t0: std::time::Instant::now(),
        }
    }

    /// One iteration of the worker loop: control jobs, the QPs' rings, the loopback. Returns whether anything moved.
    fn step(&mut self, jobs: &mpsc::Receiver<Job>) -> bool {
        self.loops += 1;
        let mut busy = false;
        while let Ok(job) = jobs.try_recv() {
            self.served += 1;
            let (loops, busy_loops, served, port) = (self.loops, self.busy_loops, self.served, self.port);
            let extra = |v: &mut Vec<StatRecord>| {
                let mut rec = |scope: &str, name: &str, value: u64| {
                    v.push(StatRecord { scope: scope.into(), id: 0, name: name.into(), value })
                };
                rec("worker", "loops", loops);
                rec("worker", "busy_loops", busy_loops);
                rec("worker", "jobs", served);
                rec("port", "frames", port.frames);
                rec("port", "bytes", port.bytes);
            };
            self.app.serve(&mut self.e, &self.neigh, job, &extra);
            busy = true;
        }
        let now = Instant(self.t0.elapsed().as_nanos() as u64);
        busy |= self.app.poll(&mut self.e);
        if pump(&mut self.e, now, &mut self.buf, &mut self.port) {
            // Completions the frames just made go into the CQ rings in this iteration, not the next.
            self.app.poll(&mut self.e);
            busy = true;
        }
        if busy {
            self.busy_loops += 1;
        }
        busy
    }
}

fn worker(jobs: &mpsc::Receiver<Job>, stop: &AtomicBool, idle_sleep_us: Option<u64>) -> Appliance {
    let mut w = LoopWorker::new();
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
    jobs: mpsc::Receiver<Job>,
}

impl Stepper {
    /// One worker iteration; whether anything moved.
    pub fn step(&mut self) -> bool {
        self.w.step(&self.jobs)
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
        let init = QpInit { sq_depth: depth, rq_depth: depth, max_send_sge: 2, max_recv_sge: 2 };
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
