//! roce-dpd: the soft-NIC appliance. It owns a DPDK port and workers running the roce-dp engine, and serves
//! applications (the `roce_dp::client` library) on a Unix socket: they create PDs, register buffers they share with
//! the daemon, create CQs and RC QPs whose rings live in shared memory, and then post work and poll completions
//! without system calls.
//!
//! `roce-dpd --config conf/daemon-ring.toml`: the port profile (`[port]`, `[net]`, `[eal]`, `[worker]`) plus a
//! `[daemon]` section (socket path and mode, memory backing, worker lcores). `[worker] workers = N` runs N workers:
//! worker 0 is the EAL main thread on the first of `worker_lcores`, the others are threads pinned to the rest and
//! registered with EAL. Each has its own engine (worker w's QPs numbered from 0x100 + w * 0x10000), its own tx
//! queue and its own QPs; worker 0 receives every frame and forwards RoCE frames for the others' QPs over SPSC rings
//! (the software dispatcher) and answers ARP/ND. Between bursts each worker serves the control requests the socket
//! threads route to it (its own `mpsc` channel polled with `try_recv`), moves new WQEs from its QPs' rings into its
//! engine and its engine's completions into its CQ rings (see `roce_dp::ctrl::daemon` for the routing).
//!
//! SIGINT/SIGTERM: every QP on every worker goes to the error state and is flushed into its CQ ring, every client
//! gets a shutdown notice and its socket closes, the socket file and EAL's runtime directory are removed, exit 0.
//! Exit status 2 with one line on stderr when the configuration is invalid, the socket is in use, or a DPDK setup
//! step (or pinning a worker to its lcore) fails.

// The clap help texts are these doc comments, and `[daemon]` in them is the config's TOML section, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use clap::Parser;
use roce_dp::config::{DaemonBacking, DaemonSection, Driver, HostView, Profile};
use roce_dp::ctrl::daemon::{job_channel, socket_path_problem, Appliance, JobReceiver, Server, ServerConfig};
use roce_dp::ctrl::proto::{DeviceInfo, StatRecord};
use roce_dp::ctrl::shm::Backing;
use roce_dp::dpdk::{
    self, choose_offloads, register_thread, Clock, Dispatch, Eal, Idle, Mempool, Port, PortConfig, Ring, Worker,
    WorkerConfig, WorkerStats, QPN_STRIDE,
};
use roce_dp::neigh::NeighIp;
use roce_dp::wire::MacAddr;
use roce_dp::{Engine, EngineConfig, LocalIp};
use roce_dp_tools::{dpdk_lookup, dpdk_step};

/// The first QPN of worker 0's engine.
const QPN_BASE: u32 = 0x100;

#[derive(Parser)]
#[command(name = "roce-dpd", version, about = "The roce-dp soft-NIC appliance: serves applications on a Unix socket")]
struct Cli {
    /// Configuration: a port profile with a [daemon] section, e.g. conf/daemon-ring.toml.
    #[arg(long)]
    config: PathBuf,
    /// Override [daemon] socket.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// EAL --file-prefix (default roce-dpd_PID; a plain name); its runtime directory is removed on exit.
    #[arg(long, value_parser = roce_dp_tools::file_prefix_arg)]
    file_prefix: Option<String>,
    /// Let DPDK print to the terminal.
    #[arg(short, long)]
    verbose: bool,
    /// Check the configuration against this machine (every key, the socket path, lcores, devices, hugepages: all
    /// that is checked before DPDK starts), print what would be served, and exit (0: good; 2: one line naming the
    /// problem). Nothing is started or created.
    #[arg(long)]
    check: bool,
}

/// Set by SIGINT/SIGTERM.
static STOP: AtomicBool = AtomicBool::new(false);
static SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    if STOP.swap(true, Ordering::SeqCst) {
        // SAFETY: signal() and raise() are async-signal-safe; with the default action restored, the second signal
        // terminates the process as if no handler were installed.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

struct Fail(String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Fail {
        Fail(e.to_string())
    }
}

fn main() -> ExitCode {
    let cli: Cli = match roce_dp_tools::parse_cli("roce-dpd") {
        Ok(c) => c,
        Err(code) => return code,
    };
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: on_signal only touches atomics and calls async-signal-safe functions.
        unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
    }
    let prefix = cli.file_prefix.clone().unwrap_or_else(|| format!("roce-dpd_{}", std::process::id()));
    let r = run(&cli, &prefix);
    roce_dp_tools::remove_runtime_dir(&prefix);
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(msg)) => {
            eprintln!("roce-dpd: {msg}");
            ExitCode::from(2)
        }
    }
}

/// What the profile names, checked against this machine (lcores, devices, interfaces, hugepages; warnings on stderr),
/// and the socket not held by a running daemon: the last checks before DPDK starts.
fn host_checks(cli: &Cli, prof: &Profile, d: &DaemonSection, path: &std::path::Path) -> Result<(), Fail> {
    let worker_lcores = d.worker_lcores.as_deref().map(|l| ("daemon.worker_lcores", l));
    let host = HostView::default();
    prof.check_host(&cli.config.display().to_string(), worker_lcores, &host).map_err(|e| Fail(e.0))?;
    for w in prof.host_warnings(&cli.config.display().to_string(), &host) {
        eprintln!("roce-dpd: warning: {w}");
    }
    if path.exists() && std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(Fail(format!(
            "socket {} is in use by a running daemon (stop it, or set [daemon] socket to another path)",
            path.display()
        )));
    }
    Ok(())
}

/// `--check`: every check a start makes before DPDK, then one line saying what would be served.
fn check_only(
    cli: &Cli,
    prof: &Profile,
    d: &DaemonSection,
    path: &std::path::Path,
    lcores: &[u32],
) -> Result<(), Fail> {
    host_checks(cli, prof, d, path)?;
    let nw = prof.worker.workers;
    let where_ = match lcores {
        [] => format!(
            "worker lcore {}",
            prof.eal.lcores.as_deref().and_then(|l| l.split([',', '-']).next()).unwrap_or("0")
        ),
        [l] => format!("worker lcore {l}"),
        l => {
            let l: Vec<String> = l.iter().map(u32::to_string).collect();
            format!("{nw} workers on lcores {} (idle {})", l.join(","), prof.worker.idle)
        }
    };
    let addr = match (prof.ipv4(), prof.ipv6()) {
        (Some(a), _) => std::net::Ipv4Addr::from(a).to_string(),
        (None, Some(a)) => std::net::Ipv6Addr::from(a).to_string(),
        (None, None) => String::new(),
    };
    println!(
        "roce-dpd: {}: ok: would serve {} (mode {:o}) on {} {addr} mtu {} ({} backing), {where_}; nothing started",
        cli.config.display(),
        path.display(),
        d.socket_mode,
        prof.port.driver.name(),
        prof.net.mtu,
        if d.backing == DaemonBacking::Hugetlbfs { "hugetlbfs" } else { "memfd" },
    );
    Ok(())
}

fn run(cli: &Cli, prefix: &str) -> Result<(), Fail> {
    let prof = Profile::load(&cli.config).map_err(|e| Fail(e.0))?;
    let Some(d) = prof.daemon.clone() else {
        return Err(Fail(format!(
            "{}: [daemon] section missing (it names the socket applications connect to, e.g. socket = \"/run/roce-dpd.sock\")",
            cli.config.display()
        )));
    };
    let path = cli.socket.clone().unwrap_or_else(|| PathBuf::from(&d.socket));
    // As [daemon] socket: clients name the daemon by its whole path (a relative one is relative to each's directory).
    if !path.is_absolute() {
        return Err(Fail(format!("--socket {}: not an absolute path (e.g. /run/roce-dpd.sock)", path.display())));
    }
    // Before DPDK starts, as "in use" below: a socket that cannot be made ended the run after EAL and the port.
    if let Some(why) = socket_path_problem(&path) {
        return Err(Fail(why));
    }
    let backing = match d.backing {
        DaemonBacking::Memfd => Backing::Pages,
        DaemonBacking::Hugetlbfs => Backing::Hugetlb,
    };
    let ipv4 = prof.ipv4();
    let ipv6 = prof.ipv6();
    let nw = prof.worker.workers as usize;
    // Validated with the profile: one lcore per worker when given (required for several workers).
    let lcores: Vec<u32> = d.lcores().and_then(Result::ok).unwrap_or_default();
    // The socket first: "in use" fails before DPDK starts. Requests wait in the channels until the workers poll.
    let (jobs_tx, jobs_rx): (Vec<_>, Vec<_>) = (0..nw).map(|_| job_channel()).unzip();
    let mut info = DeviceInfo {
        abi: roce_dp::ctrl::abi::ABI_VERSION,
        pid: std::process::id(),
        mac: prof.mac().map_or([0; 6], |m| m.0),
        ipv4,
        ipv6,
        mtu: prof.net.mtu,
        hugetlb: backing == Backing::Hugetlb,
    };
    // The control threads start from a thread made before EAL pins this one (worker 0) to its lcore, so they run
    // on any core; the server itself starts once the port's MAC is known.
    if cli.check {
        return check_only(cli, &prof, &d, &path, &lcores);
    }
    let (cfg_tx, cfg_rx) = mpsc::channel::<ServerConfig>();
    let (srv_tx, srv_rx) = mpsc::channel();
    std::thread::Builder::new().name("roce-dpd-ctl".into()).spawn(move || {
        if let Ok(cfg) = cfg_rx.recv() {
            let _ = srv_tx.send(Server::start_workers(cfg, jobs_tx));
        }
    })?;
    // Port and EAL next. EAL gets worker 0's lcore (its main lcore); the other workers are threads pinned to theirs.
    let lcore = lcores.first().map(u32::to_string);
    host_checks(cli, &prof, &d, &path)?;
    let args = prof.eal_args("roce-dpd", lcore.as_deref(), prefix);
    let shown = args.to_vec()[1..].join(" ");
    let eal = dpdk_step(|| {
        if cli.verbose {
            Eal::init(args.to_vec())
        } else {
            // Kept, not shown while starting: a failing step quotes DPDK's explanation (dpdk_step).
            Eal::init_captured(args.to_vec())
        }
    })
    .map_err(|e| Fail(format!("EAL ({shown}): {e}")))?;
    let room = prof.pool_data_room();
    let (rx_desc, tx_desc) = (prof.port.rx_desc.unwrap_or(1024), prof.port.tx_desc.unwrap_or(1024));
    let nq = nw as u32;
    // Each worker's tx queue and cache; the dispatcher's rings to workers 1.. hold up to 2048 frames each.
    let n = prof
        .mempool
        .mbufs
        .unwrap_or_else(|| dpdk::pool_size(1, rx_desc.into(), u32::from(tx_desc) * nq, nq, 256, 2048 * nq));
    // Each DPDK step from here on quotes what DPDK logged during it when it fails (dpdk_step).
    let mut port = if prof.port.driver == Driver::NetRing {
        // A loopback port: what the workers send comes back to worker 0 (every QP on this one soft NIC); with several
        // workers their tx queues share the ring (multi-producer).
        let ring = dpdk_step(|| match nw {
            1 => Ring::new(&eal, "roce_dpd_lo", 4096),
            _ => Ring::new_mp(&eal, "roce_dpd_lo", 4096),
        })
        .map_err(|e| Fail(format!("net_ring loopback ring: {e}")))?;
        dpdk_step(|| Port::from_rings_tx(&eal, "net_ring_lo", &ring, &ring, nw as u16))
            .map_err(|e| Fail(format!("net_ring loopback port: {e}")))?
    } else {
        let name = match prof.vdev() {
            Some((name, _)) => name,
            None => prof.port.pci.clone().unwrap_or_default(),
        };
        dpdk_lookup(&name, || Port::by_name(&eal, &name)).map_err(|e| Fail(format!("port {name}: {e}")))?
    };
    // The mempool after the port: a pool that takes the EAL's last memory then fails itself, in one line. Made
    // first, it left none for the net_ring port's ethdev data, and DPDK aborted the process (rte_panic "Cannot
    // allocate ethdev shared data" in rte_eth_dev_allocate, a stack dump, status 134).
    let pool = dpdk_step(|| Mempool::new(&eal, "roce_dpd_pool", n, 256, room))
        .map_err(|e| Fail(format!("mempool of {n} x {room} B ([mempool] mbufs, data_room): {e}")))?;
    let pinfo = dpdk_step(|| port.info()).map_err(|e| Fail(format!("port {}: {e}", port.name())))?;
    let (_rx_off, tx_off) = choose_offloads(&pinfo);
    let conf = PortConfig { rx_desc, tx_desc, tx_queues: nw as u16, tx_offloads: tx_off, ..PortConfig::default() };
    dpdk_step(|| port.configure(&conf, &pool))
        .map_err(|e| Fail(format!("configure {} ({}): {e}", port.name(), pinfo.driver)))?;
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match dpdk_step(|| port.start()) {
            Ok(()) => break,
            // A memif client waits for its server.
            Err(_)
                if prof.port.driver == Driver::Memif
                    && std::time::Instant::now() < until
                    && !STOP.load(Ordering::SeqCst) =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) if prof.port.driver == Driver::Memif && prof.port.role.as_deref() == Some("client") => {
                let (e, sock) = (e.error, prof.port.socket.as_deref().unwrap_or(""));
                return Err(Fail(format!(
                    "start {}: {e}: no memif server on {sock} within 30 s (this profile's role is client: start the \
                     daemon whose profile has role = \"server\" first)",
                    port.name()
                )));
            }
            Err(e) => return Err(Fail(format!("start {}: {e}", port.name()))),
        }
    }
    // Started: what DPDK says while running (a link going down, a memif peer leaving) is shown from now on, and its
    // capture file stops growing (with -v, DPDK prints to the terminal already).
    eal.log_to_stderr("roce-dpd: DPDK: ");
    let mac = match prof.mac() {
        Some(m) => m,
        None => MacAddr(dpdk_step(|| port.mac()).map_err(|e| Fail(format!("port {}: {e}", port.name())))?),
    };
    info.mac = mac.0;
    let idle = match prof.worker.idle.as_str() {
        "pause" => Idle::Pause { after: prof.worker.idle_after },
        "yield" => Idle::Yield { after: prof.worker.idle_after },
        "sleep" => Idle::Sleep { after: prof.worker.idle_after, us: prof.worker.sleep_us },
        _ => Idle::Busy,
    };
    let wcfg = WorkerConfig { burst: prof.worker.burst as usize, idle, ..WorkerConfig::default() };
    // Worker 0 receives from the port and, with several workers, forwards each RoCE frame to the worker owning its
    // BTH destination QP (worker w's engine numbers its QPs from QPN_BASE + w * QPN_STRIDE) over an SPSC ring.
    let dispatch: Vec<Option<Ring>> = (0..nw)
        .map(|w| {
            (w > 0)
                .then(|| {
                    dpdk_step(|| Ring::new(&eal, &format!("roce_dpd_d{w}"), 2048))
                        .map_err(|e| Fail(format!("worker 0's ring to worker {w} (2048 frames): {e}")))
                })
                .transpose()
        })
        .collect::<Result<_, _>>()?;
    let clock = Clock::new(dpdk::tsc_hz());
    let mut workers = Vec::new();
    for w in 0..nw {
        let ecfg = EngineConfig {
            local_mac: mac,
            local_ip: LocalIp { v4: ipv4, v6: ipv6 },
            qpn_base: QPN_BASE + w as u32 * QPN_STRIDE,
            ..EngineConfig::default()
        };
        let q = port.queue_pair(w as u16).ok_or_else(|| Fail(format!("port has no queue {w}")))?;
        let mut wk = dpdk_step(|| Worker::new(Engine::new(ecfg), q, &pool, prof.net.mtu, wcfg))
            .map_err(|e| Fail(format!("worker {w}: {e}")))?
            .with_clock(clock);
        if nw > 1 {
            wk = match &dispatch[w] {
                None => wk.with_dispatch(Dispatch::new(QPN_BASE, 0, dispatch.clone())),
                Some(r) => wk.with_rx_ring(r.clone()),
            };
        }
        for nb in &prof.net.neighbours {
            if let (Ok(ip), Some(m)) = (nb.ip.parse::<std::net::IpAddr>(), roce_dp::config::parse_mac(&nb.mac)) {
                let ip = match ip {
                    std::net::IpAddr::V4(a) => NeighIp::V4(a.octets()),
                    std::net::IpAddr::V6(a) => NeighIp::V6(a.octets()),
                };
                wk.neigh.add_static(ip, m);
            }
        }
        workers.push(wk);
    }

    let port_ref = &port;
    let done = AtomicBool::new(false);
    let mut jobs_rx = jobs_rx.into_iter();
    let jobs0 = jobs_rx.next().expect("worker 0's channel");
    let apps = std::thread::scope(|s| -> Result<Vec<(Appliance, WorkerStats)>, Fail> {
        let mut handles = Vec::new();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let mut others = workers.drain(1..).collect::<Vec<_>>().into_iter();
        for (w, jobs) in (1..nw).zip(jobs_rx.by_ref()) {
            let wk = others.next().expect("one worker per channel");
            let core = lcores.get(w).copied().unwrap_or(0);
            let (ready_tx, done) = (ready_tx.clone(), &done);
            let h = std::thread::Builder::new().name(format!("roce-dpd-w{w}")).spawn_scoped(s, move || {
                let r = register_thread(core as usize).map_err(|e| format!("worker {w}: pin to lcore {core}: {e}"));
                let ok = r.is_ok();
                let _ = ready_tx.send(r);
                drop(ready_tx);
                ok.then(|| serve_worker(w, wk, &jobs, None, done, &mut None))
            })?;
            handles.push(h);
        }
        drop(ready_tx);
        let mut failed = None;
        for r in ready_rx.iter().take(nw - 1) {
            if let Err(e) = r {
                failed.get_or_insert(e);
            }
        }
        if let Some(e) = failed {
            done.store(true, Ordering::SeqCst);
            for h in handles {
                let _ = h.join();
            }
            return Err(Fail(e));
        }
        let scfg = ServerConfig {
            path: path.clone(),
            mode: d.socket_mode,
            backing,
            info,
            max_depth: d.max_depth,
            limits: d.limits(),
            log: true,
            stats_page_bytes: roce_dp::ctrl::proto::STATS_PAGE_BYTES,
        };
        let server = cfg_tx
            .send(scfg)
            .map_err(|_| Fail("control thread gone".into()))
            .and_then(|()| srv_rx.recv().map_err(|_| Fail("control thread gone".into())))
            .and_then(|r| r.map_err(|e| Fail(e.0)));
        let server = match server {
            Ok(s) => s,
            Err(e) => {
                done.store(true, Ordering::SeqCst);
                for h in handles {
                    let _ = h.join();
                }
                return Err(e);
            }
        };
        // Serving: worker 0 polls EAL's main lcore, the others theirs: say so if another process polls one of them
        // too (a daemon that fails before, e.g. on its socket, polls nothing and says nothing about them).
        roce_dp_tools::claim_lcores("roce-dpd", std::iter::once(eal.main_lcore()).chain(lcores.iter().copied()));
        let where_ = if nw == 1 {
            format!("worker lcore {}", eal.main_lcore())
        } else {
            let l: Vec<String> = lcores.iter().map(u32::to_string).collect();
            format!("{nw} workers on lcores {} (idle {})", l.join(","), prof.worker.idle)
        };
        println!(
            "roce-dpd: serving {} (mode {:o}) on {} {} mtu {} ({} backing), {where_}",
            path.display(),
            d.socket_mode,
            pinfo.driver,
            ipv4.map(|a| std::net::Ipv4Addr::from(a).to_string()).unwrap_or_default(),
            prof.net.mtu,
            if backing == Backing::Hugetlb { "hugetlbfs" } else { "memfd" },
        );
        let w0 = workers.pop().expect("worker 0");
        let mut server = Some(server);
        let mut apps = vec![serve_worker(0, w0, &jobs0, Some(port_ref), &done, &mut server)];
        for h in handles {
            apps.extend(h.join().map_err(|_| Fail("a worker thread panicked".into()))?);
        }
        Ok(apps)
    })?;
    drop(workers);
    let (mut qps, mut cqs, mut mrs, mut pds) = (0, 0, 0, 0);
    for (app, _) in &apps {
        let (q, c, m, p) = app.counts();
        (qps, cqs, mrs, pds) = (qps + q, cqs + c, mrs.max(m), pds.max(p));
    }
    // Each worker's loop and port counters, then its appliance's (the completion events it signalled).
    let lines: Vec<String> = apps
        .iter()
        .enumerate()
        .map(|(w, (app, st))| {
            let a = &app.stats;
            format!(
                "worker {w}: {} wqes_posted={} cqes_delivered={} events_signalled={} events_unsent={}",
                st.line(),
                a.wqes_posted,
                a.cqes_delivered,
                a.events_signalled,
                a.events_unsent
            )
        })
        .collect();
    println!(
        "roce-dpd: stopped; {} sessions reclaimed, {qps} QPs {cqs} CQs {mrs} MRs {pds} PDs left; {}",
        apps[0].0.stats.sessions_reclaimed,
        lines.join("; ")
    );
    drop(apps);
    // Closing the port is routine: its messages go back to the capture file.
    eal.log_to_capture();
    let _ = port.stop();
    let _ = std::fs::remove_file(&path);
    Ok(())
}

/// One worker's loop: between bursts it serves the jobs routed to it, moves its QPs' new WQEs into its engine and
/// its engine's completions into its CQ rings. Worker 0 (`port` and `server` given) also reports the port's
/// counters, solicits peers for ARP/ND and, on SIGINT/SIGTERM, shuts the server down (every QP on every worker to
/// the error state and flushed, the clients told, their sessions reclaimed through the still-polling workers),
/// then sets `done`, which stops the others. Returns the worker's appliance and counters.
fn serve_worker(
    w: usize,
    mut wk: Worker<'_>,
    jobs: &JobReceiver,
    port: Option<&Port>,
    done: &AtomicBool,
    server: &mut Option<Server>,
) -> (Appliance, WorkerStats) {
    let mut app = Appliance::for_worker(w as u32);
    let mut closing: Option<std::thread::JoinHandle<()>> = None;
    let never = AtomicBool::new(false);
    wk.run(&never, |wk| {
        let mut busy = false;
        let mut solicit = Vec::new();
        while let Ok(job) = jobs.try_recv() {
            busy = true;
            let wstats = wk.stats;
            let extra = |v: &mut Vec<StatRecord>| {
                for kv in wstats.line().split_whitespace() {
                    if let Some((k, val)) = kv.split_once('=') {
                        v.push(StatRecord {
                            scope: "worker".into(),
                            id: w as u32,
                            name: k.into(),
                            value: val.parse().unwrap_or(0),
                        });
                    }
                }
                if let Some((pt, p)) = port.and_then(|pt| pt.stats().ok().map(|s| (pt, s))) {
                    let counters = [
                        ("ipackets", p.ipackets),
                        ("opackets", p.opackets),
                        ("ibytes", p.ibytes),
                        ("obytes", p.obytes),
                        ("imissed", p.imissed),
                        ("ierrors", p.ierrors),
                        ("oerrors", p.oerrors),
                        ("rx_nombuf", p.rx_nombuf),
                        // Bursts the memif guard cut short (the peer's disconnect unmapped the rings under them).
                        ("guard_faults", dpdk::guard_faults()),
                    ];
                    // The link as the PMD reports it now (memif: connected to its peer): the first thing to look at
                    // when a fabric does not come up, and a zero counter would hide it, so roce-stat always shows it.
                    let link =
                        pt.link().ok().map(|l| [("link", u64::from(l.up)), ("speed_mbps", u64::from(l.speed_mbps))]);
                    for (k, val) in counters.into_iter().chain(link.into_iter().flatten()) {
                        v.push(StatRecord { scope: "port".into(), id: u32::from(pt.id()), name: k.into(), value: val });
                    }
                }
            };
            if let Some(ip) = app.serve(&mut wk.engine, &wk.neigh, job, &extra) {
                solicit.push(ip);
            }
        }
        for ip in solicit {
            wk.solicit(ip);
        }
        app.set_now(wk.turn_now());
        busy |= app.poll(&mut wk.engine);
        // A client woken by an event this worker signalled and still waiting for the core (it shares it with
        // this busy worker, and the scheduler did not let it preempt): give it the core now, not at the next tick.
        if !busy && app.event_unserved() {
            std::thread::yield_now();
        }
        if let Some(s) = server.take_if(|_| STOP.load(Ordering::Relaxed)) {
            let sig = SIGNAL.load(Ordering::SeqCst);
            let reason = format!("roce-dpd stopped by {}", if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" });
            closing = Some(std::thread::spawn(move || s.shutdown(&reason)));
        }
        if closing.as_ref().is_some_and(|h| h.is_finished()) {
            done.store(true, Ordering::SeqCst);
            return (false, busy);
        }
        (!(w > 0 && done.load(Ordering::Relaxed)), busy)
    });
    if let Some(h) = closing.take() {
        let _ = h.join();
    }
    (app, wk.stats)
}
