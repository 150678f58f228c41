//! rdp-porttest: send numbered, patterned frames both ways through DPDK ports and verify every byte.
//!
//! Modes (one per `scripts/test.sh` tier, and `scripts/run.sh`):
//! * `ring`: one process, two net_ring ports cross-connected with two rte_rings (no hugepages, no peer);
//! * `memif --role server|client --socket PATH`: one side of a memif pair (server on lcore 1, client on lcore 0);
//! * `af-packet --iface IF`: one side of a net_af_packet pair (e.g. the two ends of a veth pair in two netns).
//!
//! Output: one `CHECK ok|FAIL ...` line per verified direction and size (and for the stop handshake), one
//! `RESULT ...` line per side with frames/s. Exit status: 0 all checks passed, 1 a check failed (or the exchange
//! timed out), 2 setup failed, with one line on stderr naming the step and DPDK's error text, 130 interrupted
//! (SIGINT/SIGTERM: the tool stops polling and shuts DPDK down cleanly; a second signal kills it at once).

mod flow;
mod worker;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use roce_dp::dpdk::{self, offload_names, Burst, DpdkError, Eal, EalArgs, Mempool, Port, PortConfig, Ring};
use roce_dp_tools::{dpdk_step, DpdkFailure};

use flow::{Flow, FlowConfig};

#[derive(Parser)]
#[command(name = "rdp-porttest", version, about = "Send patterned frames both ways through DPDK ports and verify them")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
    #[command(flatten)]
    opt: Opts,
}

#[derive(Subcommand)]
enum Mode {
    /// One process, two net_ring ports cross-connected (no hugepages, no peer process).
    Ring,
    /// One side of a memif pair (copy mode; bsize = largest frame, rounded up to a power of two). Start the server
    /// first.
    Memif {
        /// server (lcore 1 by default) or client (lcore 0).
        #[arg(long)]
        role: Role,
        /// The memif control socket (the server creates it).
        #[arg(long, value_parser = socket_arg)]
        socket: PathBuf,
    },
    /// The data-path worker (engine + port queue pair) fed hand-made frames over a net_ring port: runts,
    /// multi-segment frames, hostile destination QPs, a full dispatch ring, a full tx ring, an empty mempool, a stop
    /// with frames in flight; counters and mempool checked after each (tier 2).
    Worker,
    /// One side of a net_af_packet pair on a kernel interface (4 KiB frames need MTU >= 4096 on it).
    AfPacket {
        /// The interface, e.g. one end of a veth pair.
        #[arg(long, value_parser = iface_arg)]
        iface: String,
    },
}

/// `--socket`: a memif socket path that leaves the devargs string as it is (no `,` or `=`; see
/// [`roce_dp::config::check_socket`]).
fn socket_arg(s: &str) -> Result<PathBuf, String> {
    roce_dp::config::check_socket(s).map(|()| PathBuf::from(s))
}

/// `--iface`: an interface name that leaves the devargs string as it is ([`roce_dp::config::check_iface`]).
fn iface_arg(s: &str) -> Result<String, String> {
    roce_dp::config::check_iface(s).map(|()| s.to_owned())
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Role {
    Server,
    Client,
}

#[derive(Args)]
struct Opts {
    /// Frame sizes in bytes (FCS excluded), cycled by sequence number.
    #[arg(long, global = true, value_delimiter = ',', default_value = "64,1024,4096",
          value_parser = clap::value_parser!(u32).range(64..=8192))]
    sizes: Vec<u32>,
    /// Queue pairs per port, each with its own flow (ring mode only: the other PMDs spread frames over queues).
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    queues: u16,
    /// Frames per size and direction (per queue pair).
    #[arg(long, global = true, default_value_t = 1000, value_parser = roce_dp_tools::whole_arg::<1, 1_000_000_000_000>)]
    frames: u64,
    /// Send for this many seconds instead of a fixed number of frames (throughput runs).
    #[arg(long, global = true, value_parser = roce_dp_tools::seconds_arg)]
    seconds: Option<f64>,
    /// Most unacknowledged frames in flight.
    #[arg(long, global = true, default_value_t = 256, value_parser = roce_dp_tools::whole_arg::<1, 65536>)]
    window: u64,
    /// Resend from the first unacknowledged frame after this many milliseconds without ACK progress (go-back-N).
    #[arg(long, global = true, default_value_t = 200, value_parser = roce_dp_tools::whole_arg::<1, 3_600_000>)]
    rto_ms: u64,
    /// Give up (exit 1) if the exchange has not finished after this many seconds.
    #[arg(long, global = true, default_value_t = 30,
          value_parser = roce_dp_tools::whole_arg::<1, { roce_dp_tools::MAX_SECONDS }>)]
    timeout: u64,
    /// Wait this long for the link (memif: the peer) to come up (exit 2 after).
    #[arg(long, global = true, default_value_t = 10,
          value_parser = roce_dp_tools::whole_arg::<1, { roce_dp_tools::MAX_SECONDS }>)]
    link_timeout: u64,
    /// EAL main lcore (default: 1 for the memif server, else 0).
    #[arg(long, global = true)]
    lcore: Option<u32>,
    /// EAL --file-prefix (default: rdpt_MODE_PID; a plain name); its /var/run/dpdk directory is removed on exit.
    #[arg(long, global = true, value_parser = roce_dp_tools::file_prefix_arg)]
    file_prefix: Option<String>,
    /// MiB of ordinary memory for EAL (--no-huge -m); default 256 for ring, 512 otherwise.
    #[arg(long, global = true)]
    mem: Option<u32>,
    /// Use hugepages (--in-memory) instead of --no-huge.
    #[arg(long, global = true)]
    hugepages: bool,
    /// Set this MTU on the port.
    #[arg(long, global = true)]
    mtu: Option<u16>,
    /// Milliseconds to wait after the stop handshake before stopping the port (default: 1500 for the memif client,
    /// else 0; the memif server waits for the client to disconnect instead).
    #[arg(long, global = true, value_parser = roce_dp_tools::whole_arg::<0, 600_000>)]
    stop_grace_ms: Option<u64>,
    /// Append DPDK's own output to this file (default: a temporary file, quoted from when a setup step fails).
    #[arg(long, global = true)]
    dpdk_log: Option<PathBuf>,
    /// Let DPDK print to the terminal (overrides --dpdk-log).
    #[arg(short, long, global = true)]
    verbose: bool,
    /// An extra EAL argument, passed verbatim after the others (repeatable), e.g. --eal=--log-level=*:debug.
    #[arg(long = "eal", global = true, allow_hyphen_values = true)]
    eal: Vec<String>,
}

/// A setup failure: one line for stderr, exit status 2.
struct SetupError(String);

impl From<DpdkError> for SetupError {
    fn from(e: DpdkError) -> Self {
        SetupError(e.to_string())
    }
}

/// Add context to a DPDK error: `ERROR (WHAT)`, and for a step run by [`dpdk_step`] `; DPDK: REASON` after it,
/// from what DPDK logged during that step only.
trait Context<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, SetupError>;
}

impl<T> Context<T> for Result<T, DpdkError> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, SetupError> {
        self.map_err(|e| SetupError(format!("{e} ({})", what())))
    }
}

impl<T> Context<T> for Result<T, DpdkFailure<DpdkError>> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, SetupError> {
        self.map_err(|e| SetupError(format!("{} ({}){}", e.error, what(), e.says)))
    }
}

/// One flow: a queue pair of a port (index into the port list) and the frames exchanged through it.
struct Side {
    label: String,
    port: usize,
    queue: u16,
    flow: Flow,
    rx: Burst,
    tx: Burst,
}

/// How the exchange ended.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Both directions complete and the stop handshake done.
    Finished,
    /// Not finished before --timeout.
    TimedOut,
    /// SIGINT or SIGTERM arrived.
    Interrupted,
}

fn main() -> ExitCode {
    let cli: Cli = match roce_dp_tools::parse_cli("rdp-porttest") {
        Ok(c) => c,
        Err(code) => return code,
    };
    dpdk::signal::stop_on_signals();
    let (mode_name, default_lcore) = match &cli.mode {
        Mode::Ring => ("ring", 0),
        Mode::Worker => ("worker", 0),
        Mode::Memif { role: Role::Server, .. } => ("memif_s", 1),
        Mode::Memif { role: Role::Client, .. } => ("memif_c", 0),
        Mode::AfPacket { .. } => ("afp", 0),
    };
    let prefix = cli.opt.file_prefix.clone().unwrap_or_else(|| format!("rdpt_{mode_name}_{}", std::process::id()));
    let lcore = cli.opt.lcore.unwrap_or(default_lcore);
    let result = run(&cli, &prefix, lcore);
    // Everything DPDK is dropped by now (rte_eal_cleanup ran); remove what EAL left in its runtime directory.
    roce_dp_tools::remove_runtime_dir(&prefix);
    match result {
        Ok(_) if dpdk::signal::stop_requested() => {
            eprintln!("rdp-porttest: interrupted");
            ExitCode::from(130)
        }
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(SetupError(msg)) => {
            eprintln!("rdp-porttest: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli, prefix: &str, lcore: u32) -> Result<bool, SetupError> {
    let o = &cli.opt;
    // An lcore this machine lacks: one line naming the flag, instead of EAL's "Invalid argument".
    let host = roce_dp::config::HostView::default();
    host.check_lcores(&lcore.to_string()).map_err(|why| SetupError(format!("--lcore: {why}")))?;
    let mut args = EalArgs::new("rdp-porttest", &lcore.to_string());
    args.file_prefix = Some(prefix.to_owned());
    if o.hugepages {
        args.in_memory = true;
    } else {
        args.no_huge_mb = Some(o.mem.unwrap_or(if matches!(cli.mode, Mode::Ring | Mode::Worker) { 256 } else { 512 }));
        args.no_shconf = true;
    }
    args.extra = o.eal.clone();
    let argv = args.to_vec();
    let shown = argv[1..].join(" ");
    // Named by its flag, before EAL: DPDK's step said only "open DPDK log file failed: No such file or directory
    // (EAL args: ...)".
    if let (Some(path), false) = (&o.dpdk_log, o.verbose) {
        std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .map_err(|e| SetupError(format!("--dpdk-log {}: {e}", path.display())))?;
    }
    let eal = dpdk_step(|| match (&o.dpdk_log, o.verbose) {
        (_, true) => Eal::init(argv),
        (Some(path), false) => Eal::init_with_log(argv, path),
        (None, false) => Eal::init_captured(argv),
    });
    let eal = eal.ctx(|| format!("EAL args: {shown}"))?;
    if matches!(cli.mode, Mode::Worker) {
        return worker::run(&eal);
    }

    let max_size = o.sizes.iter().copied().max().unwrap_or(64);
    let af_packet = matches!(cli.mode, Mode::AfPacket { .. });
    // af_packet copies each frame into an mbuf of framesz (8192) - 32 bytes; others need the largest frame.
    let room = dpdk::data_room_for(if af_packet { 8192 } else { max_size.max(2048) }).expect("sizes <= 8192");
    let ring_mode = matches!(cli.mode, Mode::Ring);
    if o.queues > 1 && !ring_mode {
        return Err(SetupError(format!(
            "--queues {} needs ring mode (other PMDs spread a flow over queues)",
            o.queues
        )));
    }
    let q = o.queues;
    let conf = PortConfig { mtu: o.mtu, rx_queues: q, tx_queues: q, ..PortConfig::default() };
    let nports: u32 = if ring_mode { 2 } else { 1 };
    let flows = nports * u32::from(q);
    let extra = u32::try_from(o.window).unwrap_or(u32::MAX).saturating_add(4 * dpdk::BURST as u32) * flows;
    let n = dpdk::pool_size(flows, conf.rx_desc.into(), conf.tx_desc.into(), 1, 256, extra);
    let pool = dpdk_step(|| Mempool::new(&eal, "rdpt_pool", n, 256, room)).ctx(|| format!("{n} mbufs of {room} B"))?;

    let mut ports = match &cli.mode {
        Mode::Worker => unreachable!("returned above"),
        Mode::Ring => {
            let rings = |dir: &str| -> Result<Vec<Ring>, SetupError> {
                (0..q)
                    .map(|i| {
                        dpdk_step(|| Ring::new(&eal, &format!("rdpt_{dir}{i}"), 1024)).ctx(|| format!("ring {dir}{i}"))
                    })
                    .collect()
            };
            let (ab, ba) = (rings("ab")?, rings("ba")?);
            let a = dpdk_step(|| Port::from_rings(&eal, "net_ring_a", &ba, &ab)).ctx(|| "port a".into())?;
            let b = dpdk_step(|| Port::from_rings(&eal, "net_ring_b", &ab, &ba)).ctx(|| "port b".into())?;
            vec![("ring a".to_owned(), a), ("ring b".to_owned(), b)]
        }
        Mode::Memif { role, socket } => {
            // One memif buffer per frame: DPDK 22.11's copy mode corrupts frames chained over several buffers
            // (measured: 4096 B frames with the default bsize=2048 arrive with wrong lengths and repeated).
            let memif_bsize = max_size.max(2048).next_power_of_two();
            let role = if *role == Role::Server { "server" } else { "client" };
            let args = format!("role={role},socket={},bsize={}", socket.display(), memif_bsize);
            let p = dpdk_step(|| Port::vdev(&eal, "net_memif0", &args)).ctx(|| format!("net_memif0,{args}"))?;
            vec![(format!("memif {role}"), p)]
        }
        Mode::AfPacket { iface } => {
            let args = format!("iface={iface},framesz=8192,blocksz=8192,framecnt=512,qpairs=1");
            let p = dpdk_step(|| Port::vdev(&eal, "net_af_packet0", &args)).ctx(|| format!("net_af_packet0,{args}"))?;
            vec![(format!("af_packet {iface}"), p)]
        }
    };
    for (label, port) in &mut ports {
        let info = dpdk_step(|| port.info()).ctx(|| label.clone())?;
        let mtu = o.mtu.map_or("default".to_owned(), |m| m.to_string());
        dpdk_step(|| port.configure(&conf, &pool)).ctx(|| format!("{label}: {q} rx/tx queue pair(s), mtu {mtu}"))?;
        // A memif client cannot start before its server listens: retry until the link timeout.
        let retry_until = Instant::now() + Duration::from_secs(o.link_timeout);
        while let Err(e) = dpdk_step(|| port.start()) {
            if dpdk::signal::stop_requested() {
                // main says "interrupted", exit 130.
                return Ok(false);
            }
            if !matches!(cli.mode, Mode::Memif { role: Role::Client, .. }) || Instant::now() >= retry_until {
                return Err(e).ctx(|| format!("{label}, after {} s", o.link_timeout));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        println!(
            "{label}: port {} {} ({}) mtu {}, max_rx_pktlen {}, queues {}/{}, rx offloads {:?}, tx offloads {:?}",
            port.id(),
            port.name(),
            info.driver,
            port.mtu().unwrap_or(0),
            info.max_rx_pktlen,
            info.max_rx_queues,
            info.max_tx_queues,
            offload_names(true, info.rx_offload_capa),
            offload_names(false, info.tx_offload_capa),
        );
    }
    let link_timeout = Duration::from_secs(o.link_timeout);
    for (label, port) in &ports {
        let link = dpdk_step(|| wait_link(port, true, link_timeout))
            .ctx(|| format!("{label}, link timeout {} s", o.link_timeout))?;
        println!("{label}: link up, {} Mbit/s", link.speed_mbps);
    }

    let start = Instant::now();
    let mut sides = Vec::new();
    for (p, (label, port)) in ports.iter().enumerate() {
        let mac = port.mac().unwrap_or([2, 0, 0, 0, 0, 0]);
        for queue in 0..q {
            let sizes = o.sizes.iter().map(|&s| s as usize).collect();
            let mut cfg = FlowConfig::count(sizes, o.frames, mac);
            cfg.window = o.window;
            cfg.rto = Duration::from_millis(o.rto_ms);
            if let Some(s) = o.seconds {
                cfg.frames_per_size = None;
                cfg.duration = Some(Duration::from_secs_f64(s));
            }
            let label = if q > 1 { format!("{label} queue {queue}") } else { label.clone() };
            let flow = Flow::new(cfg, start);
            sides.push(Side { label, port: p, queue, flow, rx: Burst::new(), tx: Burst::new() });
        }
    }
    let ports: Vec<Port> = ports.into_iter().map(|(_, port)| port).collect();

    let outcome = exchange(&ports, &mut sides, &pool, start + Duration::from_secs(o.timeout))?;
    let finished = outcome == Outcome::Finished;
    // memif teardown order (DPDK 22.11 crashes otherwise): neither side may poll while its peer disconnects, and
    // the server must not clean up EAL while the client's disconnect is still to come (measured: segfault in
    // eal-intr-thread). So the client waits until the server surely stopped polling (it lingers 100 ms after the
    // last frame), then closes; the server waits for that disconnect (link down) before it stops its port.
    let is_memif_server = matches!(cli.mode, Mode::Memif { role: Role::Server, .. });
    let grace =
        o.stop_grace_ms.unwrap_or(if matches!(cli.mode, Mode::Memif { role: Role::Client, .. }) { 1500 } else { 0 });
    std::thread::sleep(Duration::from_millis(grace));
    if is_memif_server && finished {
        for port in &ports {
            dpdk_step(|| wait_link(port, false, link_timeout))
                .ctx(|| "memif server: the client did not disconnect".into())?;
            // The link is down now (the wait above answers signals, Port's own does not): wait_peer_gone adds only
            // the wait for EAL's interrupt thread to finish the PMD's disconnect handler, which marks the link down
            // before it is done (README, "DPDK 22.11 behaviour").
            if let Err(e) = port.wait_peer_gone(Duration::ZERO) {
                eprintln!("rdp-porttest: {e}; stopping the port anyway");
            }
        }
    }
    let mut ok = finished;
    for s in &sides {
        ok &= report(s, &ports[s.port], finished, !ring_mode);
    }
    for mut port in ports {
        dpdk_step(|| port.stop()).ctx(|| port.name())?;
    }
    Ok(ok)
}

/// Poll the link every 10 ms until it is `up` (or down); ETIMEDOUT after `timeout`, EINTR on a signal.
fn wait_link(port: &Port, up: bool, timeout: Duration) -> Result<dpdk::Link, DpdkError> {
    let op = if up { "wait for link up" } else { "wait for link down" };
    let start = Instant::now();
    loop {
        let link = port.link()?;
        if link.up == up {
            return Ok(link);
        }
        if dpdk::signal::stop_requested() {
            return Err(DpdkError::new(op, libc::EINTR));
        }
        if start.elapsed() >= timeout {
            return Err(DpdkError::new(op, libc::ETIMEDOUT));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Poll every side until all flows finished, `deadline` passed or a signal arrived.
fn exchange(ports: &[Port], sides: &mut [Side], pool: &Mempool, deadline: Instant) -> Result<Outcome, SetupError> {
    loop {
        let now = Instant::now();
        let mut busy = false;
        for s in sides.iter_mut() {
            let port = &ports[s.port];
            if port.rx_burst(s.queue, &mut s.rx) == 0 {
                s.flow.rx_idle();
            }
            for m in s.rx.drain() {
                busy = true;
                s.flow.handle_rx(m.data(), now);
            }
            while s.tx.room() > 0 {
                let Ok(mut m) = pool.alloc() else { break };
                let Some(tx) = s.flow.poll_tx(now) else { break };
                let buf = m.append(tx.len() as u16).ok_or(SetupError(format!("mbuf too small for {}", tx.len())))?;
                s.flow.write(&tx, buf);
                let _ = s.tx.push(m);
            }
            if !s.tx.is_empty() {
                busy |= port.tx_burst(s.queue, &mut s.tx) > 0;
            }
        }
        if sides.iter().all(|s| s.flow.finished(now)) {
            return Ok(Outcome::Finished);
        }
        if now >= deadline {
            return Ok(Outcome::TimedOut);
        }
        if dpdk::signal::stop_requested() {
            return Ok(Outcome::Interrupted);
        }
        if !busy {
            // Let the kernel's softirq work run (af_packet on veth); costs nothing when the CPU is otherwise idle.
            std::thread::yield_now();
        }
    }
}

/// Print the side's CHECK and RESULT lines; true if all its checks passed.
fn report(s: &Side, port: &Port, finished: bool, handshake: bool) -> bool {
    let f = &s.flow;
    let mut ok = true;
    let mut check = |pass: bool, what: String| {
        println!("CHECK {} {}: {what}", if pass { "ok  " } else { "FAIL" }, s.label);
        ok &= pass;
    };
    for (size, got, want) in f.rx_results() {
        check(got == want && want > 0, format!("rx {size} B: {got}/{want} frames verified byte for byte"));
    }
    check(
        f.rx_bad == 0,
        format!("{} bad frames{}", f.rx_bad, f.first_bad.as_ref().map_or(String::new(), |b| format!(" (first: {b})"))),
    );
    if handshake {
        check(finished && f.handshake_complete(), "in-band stop handshake before port stop".to_owned());
    } else if !finished {
        check(false, "exchange finished before the timeout".to_owned());
    }
    let rate =
        |r: Option<(u64, f64)>| r.map_or("incomplete".to_owned(), |(n, fps)| format!("{n} frames, {fps:.0} frames/s"));
    let stats = port.stats().unwrap_or_default();
    println!(
        "RESULT {}: tx {} | rx {} | retransmitted {}, out-of-order {}, foreign {} | port ipackets {} opackets {} oerrors {} imissed {}",
        s.label,
        rate(f.tx_rate()),
        rate(f.rx_rate()),
        f.retransmits,
        f.rx_out_of_order,
        f.rx_foreign,
        stats.ipackets,
        stats.opackets,
        stats.oerrors,
        stats.imissed,
    );
    ok
}
