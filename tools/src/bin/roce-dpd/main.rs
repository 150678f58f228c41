//! roce-dpd: the soft-NIC appliance. It owns a DPDK port and a worker running the roce-dp engine, and serves
//! applications (the `roce_dp::client` library) on a Unix socket: they create PDs, register buffers they share with
//! the daemon, create CQs and RC QPs whose rings live in shared memory, and then post work and poll completions
//! without system calls.
//!
//! `roce-dpd --config conf/daemon-ring.toml`: the port profile (`[port]`, `[net]`, `[eal]`, `[worker]`) plus a
//! `[daemon]` section (socket path and mode, memory backing, worker lcore). The worker is the EAL main thread on
//! the worker lcore; between bursts it serves the control requests the socket threads forward to it (an `mpsc`
//! channel polled with `try_recv`), moves new WQEs from every QP's rings into the engine and the engine's
//! completions into the CQ rings.
//!
//! SIGINT/SIGTERM: every QP goes to the error state and is flushed into its CQ ring, every client gets a
//! shutdown notice and its socket closes, the socket file and EAL's runtime directory are removed, exit 0.
//! Exit status 2 with one line on stderr when the configuration is invalid, the socket is in use, or a DPDK
//! setup step fails.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use clap::Parser;
use roce_dp::config::{DaemonBacking, Driver, Profile};
use roce_dp::ctrl::daemon::{Appliance, Cmd, Job, Server, ServerConfig};
use roce_dp::ctrl::proto::{DeviceInfo, StatRecord};
use roce_dp::ctrl::shm::Backing;
use roce_dp::dpdk::{self, choose_offloads, Eal, Idle, Mempool, Port, PortConfig, Ring, Worker, WorkerConfig};
use roce_dp::neigh::NeighIp;
use roce_dp::wire::MacAddr;
use roce_dp::{Engine, EngineConfig, LocalIp};

#[derive(Parser)]
#[command(name = "roce-dpd", version, about = "The roce-dp soft-NIC appliance: serves applications on a Unix socket")]
struct Cli {
    /// Configuration: a port profile with a [daemon] section, e.g. conf/daemon-ring.toml.
    #[arg(long)]
    config: PathBuf,
    /// Override [daemon] socket.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// EAL --file-prefix (default roce-dpd_PID); its runtime directory is removed on exit.
    #[arg(long)]
    file_prefix: Option<String>,
    /// Let DPDK print to the terminal.
    #[arg(short, long)]
    verbose: bool,
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
    let _ = std::fs::remove_dir_all(PathBuf::from("/var/run/dpdk").join(&prefix));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(Fail(msg)) => {
            eprintln!("roce-dpd: {msg}");
            ExitCode::from(2)
        }
    }
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
    let backing = match d.backing {
        DaemonBacking::Memfd => Backing::Pages,
        DaemonBacking::Hugetlbfs => Backing::Hugetlb,
    };
    let ipv4 = prof.ipv4();
    let ipv6 = prof.ipv6();
    // The socket first: "in use" fails before DPDK starts. Requests wait in the channel until the worker polls.
    let (jobs_tx, jobs) = mpsc::channel::<Job>();
    let mut info = DeviceInfo {
        abi: roce_dp::ctrl::abi::ABI_VERSION,
        pid: std::process::id(),
        mac: prof.mac().map_or([0; 6], |m| m.0),
        ipv4,
        ipv6,
        mtu: prof.net.mtu,
        hugetlb: backing == Backing::Hugetlb,
    };
    if prof.worker.workers != 1 {
        return Err(Fail(format!(
            "{}: worker.workers = {}: roce-dpd runs one worker for now",
            cli.config.display(),
            prof.worker.workers
        )));
    }
    // The control threads start from a thread made before EAL pins this one (the worker) to its lcore, so they
    // run on any core; the server itself starts once the port's MAC is known.
    let (cfg_tx, cfg_rx) = mpsc::channel::<ServerConfig>();
    let (srv_tx, srv_rx) = mpsc::channel();
    let control_jobs = jobs_tx;
    std::thread::Builder::new().name("roce-dpd-ctl".into()).spawn(move || {
        if let Ok(cfg) = cfg_rx.recv() {
            let _ = srv_tx.send(Server::start(cfg, control_jobs));
        }
    })?;
    // Port and EAL next.
    let lcore = d.worker_lcores.clone();
    let args = prof.eal_args("roce-dpd", lcore.as_deref(), prefix);
    let shown = args.to_vec()[1..].join(" ");
    if path.exists() && std::os::unix::net::UnixStream::connect(&path).is_ok() {
        return Err(Fail(format!(
            "socket {} is in use by a running daemon (stop it, or set [daemon] socket to another path)",
            path.display()
        )));
    }
    let eal = if cli.verbose {
        Eal::init(args.to_vec())
    } else {
        Eal::init_with_log(args.to_vec(), std::path::Path::new("/dev/null"))
    }
    .map_err(|e| Fail(format!("EAL ({shown}): {e}")))?;
    let room = prof.pool_data_room();
    let (rx_desc, tx_desc) = (prof.port.rx_desc.unwrap_or(1024), prof.port.tx_desc.unwrap_or(1024));
    let n = prof.mempool.mbufs.unwrap_or_else(|| dpdk::pool_size(1, rx_desc.into(), tx_desc.into(), 1, 256, 2048));
    let pool = Mempool::new(&eal, "roce_dpd_pool", n, 256, room)
        .map_err(|e| Fail(format!("mempool of {n} x {room} B: {e}")))?;
    let mut port = if prof.port.driver == Driver::NetRing {
        // A loopback port: what the worker sends comes back to it (every QP on this one soft NIC).
        let ring = Ring::new(&eal, "roce_dpd_lo", 4096)?;
        Port::from_rings(&eal, "net_ring_lo", std::slice::from_ref(&ring), std::slice::from_ref(&ring))
            .map_err(|e| Fail(format!("net_ring loopback port: {e}")))?
    } else {
        let name = match prof.vdev() {
            Some((name, _)) => name,
            None => prof.port.pci.clone().unwrap_or_default(),
        };
        Port::by_name(&eal, &name).map_err(|e| Fail(format!("port {name}: {e}")))?
    };
    let pinfo = port.info()?;
    let (_rx_off, tx_off) = choose_offloads(&pinfo);
    let conf = PortConfig { rx_desc, tx_desc, tx_offloads: tx_off, ..PortConfig::default() };
    port.configure(&conf, &pool).map_err(|e| Fail(format!("configure {} ({}): {e}", port.name(), pinfo.driver)))?;
    let until = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        match port.start() {
            Ok(()) => break,
            // A memif client waits for its server.
            Err(_)
                if prof.port.driver == Driver::Memif
                    && std::time::Instant::now() < until
                    && !STOP.load(Ordering::SeqCst) =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            Err(e) => return Err(Fail(format!("start {}: {e}", port.name()))),
        }
    }
    let mac = prof.mac().unwrap_or(MacAddr(port.mac()?));
    info.mac = mac.0;
    let ecfg = EngineConfig {
        local_mac: mac,
        local_ip: LocalIp { v4: ipv4, v6: ipv6 },
        qpn_base: 0x100,
        ..EngineConfig::default()
    };
    let idle = match prof.worker.idle.as_str() {
        "pause" => Idle::Pause { after: prof.worker.idle_after },
        "yield" => Idle::Yield { after: prof.worker.idle_after },
        "sleep" => Idle::Sleep { after: prof.worker.idle_after, us: prof.worker.sleep_us },
        _ => Idle::Busy,
    };
    let wcfg = WorkerConfig { burst: prof.worker.burst as usize, idle, ..WorkerConfig::default() };
    let q = port.queue_pair(0).ok_or_else(|| Fail("port has no queue 0".into()))?;
    let mut w = Worker::new(Engine::new(ecfg), q, &pool, prof.net.mtu, wcfg)?;
    for nb in &prof.net.neighbours {
        if let (Ok(ip), Some(m)) = (nb.ip.parse::<std::net::IpAddr>(), roce_dp::config::parse_mac(&nb.mac)) {
            let ip = match ip {
                std::net::IpAddr::V4(a) => NeighIp::V4(a.octets()),
                std::net::IpAddr::V6(a) => NeighIp::V6(a.octets()),
            };
            w.neigh.add_static(ip, m);
        }
    }
    let scfg =
        ServerConfig { path: path.clone(), mode: d.socket_mode, backing, info, max_depth: d.max_depth, log: true };
    cfg_tx.send(scfg).map_err(|_| Fail("control thread gone".into()))?;
    let server = srv_rx.recv().map_err(|_| Fail("control thread gone".into()))?.map_err(|e| Fail(e.0))?;
    println!(
        "roce-dpd: serving {} (mode {:o}) on {} {} mtu {} ({} backing), worker lcore {}",
        path.display(),
        d.socket_mode,
        pinfo.driver,
        ipv4.map(|a| std::net::Ipv4Addr::from(a).to_string()).unwrap_or_default(),
        prof.net.mtu,
        if backing == Backing::Hugetlb { "hugetlbfs" } else { "memfd" },
        eal.main_lcore()
    );

    let mut app = Appliance::new();
    let mut server = Some(server);
    let mut closing: Option<std::thread::JoinHandle<()>> = None;
    let never = AtomicBool::new(false);
    let port_ref = &port;
    w.run(&never, |w| {
        let wstats = w.stats;
        let extra = |v: &mut Vec<StatRecord>| {
            for kv in wstats.line().split_whitespace() {
                if let Some((k, val)) = kv.split_once('=') {
                    v.push(StatRecord {
                        scope: "worker".into(),
                        id: 0,
                        name: k.into(),
                        value: val.parse().unwrap_or(0),
                    });
                }
            }
            if let Ok(p) = port_ref.stats() {
                for (k, val) in [
                    ("ipackets", p.ipackets),
                    ("opackets", p.opackets),
                    ("ibytes", p.ibytes),
                    ("obytes", p.obytes),
                    ("imissed", p.imissed),
                    ("ierrors", p.ierrors),
                    ("oerrors", p.oerrors),
                    ("rx_nombuf", p.rx_nombuf),
                ] {
                    v.push(StatRecord {
                        scope: "port".into(),
                        id: u32::from(port_ref.id()),
                        name: k.into(),
                        value: val,
                    });
                }
            }
        };
        let mut busy = false;
        let mut solicit = Vec::new();
        while let Ok(job) = jobs.try_recv() {
            busy = true;
            if let Some(ip) = app.serve(&mut w.engine, &w.neigh, job, &extra) {
                solicit.push(ip);
            }
        }
        for ip in solicit {
            w.solicit(ip);
        }
        busy |= app.poll(&mut w.engine);
        if STOP.load(Ordering::Relaxed) && closing.is_none() {
            // Every QP to the error state, flushed into the CQ rings; then the socket threads tell their clients and
            // close (each reclaims its session through this loop, which keeps polling until they are done).
            let (tx, _rx) = mpsc::channel();
            app.serve(&mut w.engine, &w.neigh, Job { client: 0, cmd: Cmd::Shutdown, reply: tx }, &extra);
            let sig = SIGNAL.load(Ordering::SeqCst);
            let reason = format!("roce-dpd stopped by {}", if sig == libc::SIGINT { "SIGINT" } else { "SIGTERM" });
            let s = server.take().expect("server");
            closing = Some(std::thread::spawn(move || s.shutdown(&reason)));
        }
        if closing.as_ref().is_some_and(|h| h.is_finished()) {
            return (false, busy);
        }
        (true, busy)
    });
    if let Some(h) = closing.take() {
        let _ = h.join();
    }
    let (qps, cqs, mrs, pds) = app.counts();
    println!(
        "roce-dpd: stopped; {} sessions reclaimed, {qps} QPs {cqs} CQs {mrs} MRs {pds} PDs left; {}",
        app.stats.sessions_reclaimed,
        w.stats.line()
    );
    drop(w);
    let _ = port.stop();
    let _ = std::fs::remove_file(&path);
    Ok(())
}
