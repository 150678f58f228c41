//! rdp-nic: the roce-dp soft NIC on DPDK ports, running a verbs workload with every byte verified.
//!
//! Modes:
//! * `ring`: one process, two soft NICs on two net_ring ports cross-connected by rte_rings, each worker on its
//!   own thread pinned to its own core (lcores 0 and 1), peers resolved with ARP;
//! * `tap --bridge BR`: the same on two net_tap ports joined to a Linux bridge (run it in a network namespace),
//!   one rx queue per worker with `--steering rte_flow|rss|auto` (README "Steering");
//! * `server --profile conf/memif-server.toml --oob-port N` and `client --profile conf/memif-client.toml
//!   --oob-port N`: two processes (memif, af_packet, af_xdp, ...); QPN/PSN/rkey/VA and addresses are exchanged
//!   out of band over TCP on 127.0.0.1:N; the client is the requester, the server the responder.
//!
//! Output: `CHECK ok|FAIL ...` lines (what scripts/test.sh counts), a perftest-like table on the requester, and
//! with `--stats` per-port and per-worker counters. Exit status: 0 every WR completed OK and every byte verified
//! (and no mbuf leaked), 1 a check failed, 2 bad input or a setup failure (one line on stderr).

mod app;
mod oob;
mod raw;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand, ValueEnum};
use roce_dp::config::{check_iface, check_own_ipv4, check_socket, Driver, HostView, Profile};
use roce_dp::dpdk::{
    self, choose_offloads, register_thread, Burst, Dispatch, DpdkError, Eal, EalArgs, FlowDest, FlowRule, Idle,
    Mempool, Port, PortConfig, Ring, RoceMatch, Worker, WorkerConfig, QPN_STRIDE,
};
use roce_dp::neigh::NeighIp;
use roce_dp::steer::{FlowKey, RuleOp, SteerTable, SteeringMode};
use roce_dp::wire::{IpAddrs, MacAddr};
use roce_dp::{Engine, EngineConfig, LocalIp, PeerAddr};
use roce_dp_tools::{dpdk_lookup, dpdk_step};

use app::{rtt_summary, Local, Op, Params, Remote, Requester, Responder};
use oob::Oob;

/// The most messages per QP `--iters` takes: the run's byte count (iters x QPs x size) stays far inside a u64, and
/// raw RTT mode keeps one time per message.
const MAX_ITERS: u64 = 1_000_000_000;

#[derive(Parser)]
#[command(
    name = "rdp-nic",
    version,
    about = "The roce-dp soft NIC on DPDK ports: RoCE SEND/WRITE/READ/atomics, verified"
)]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
    #[command(flatten)]
    o: Opts,
}

#[derive(Subcommand)]
enum Mode {
    /// One process: two soft NICs on cross-connected net_ring ports, one thread each (cores 0 and 1).
    Ring,
    /// One process: two soft NICs on two net_tap ports (interfaces rdptap0, rdptap1) that the tool attaches to
    /// the existing Linux bridge BRIDGE; run it inside a network namespace. With `--steering rte_flow|rss` each
    /// worker receives on its own rx queue (hardware steering), with `software` worker 0 dispatches.
    Tap {
        /// The bridge (created beforehand, up) both tap interfaces join.
        #[arg(long)]
        bridge: String,
    },
    /// The responder side (start it first); its workload parameters come from the client.
    Server {
        /// Port profile (TOML), e.g. conf/memif-server.toml.
        #[arg(long)]
        profile: PathBuf,
    },
    /// The requester side.
    Client {
        /// Port profile (TOML), e.g. conf/memif-client.toml.
        #[arg(long)]
        profile: PathBuf,
    },
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum IdleArg {
    Busy,
    Pause,
    Yield,
    Sleep,
}

#[derive(Args)]
struct Opts {
    /// Operation (client and ring; the server follows the client).
    #[arg(long, global = true, value_enum, default_value = "write")]
    op: Op,
    /// Message size in bytes (atomics: 8).
    #[arg(long, global = true, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=(1 << 24)))]
    size: u32,
    /// Messages per QP.
    #[arg(long, global = true, default_value_t = 1000, value_parser = roce_dp_tools::whole_arg::<1, MAX_ITERS>)]
    iters: u64,
    /// QPs.
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=256))]
    qps: u32,
    /// Path MTU (default: the profile's; ring: 4096).
    #[arg(long, global = true)]
    mtu: Option<u32>,
    /// Outstanding WRs per QP (and message slots per side).
    #[arg(long, global = true, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=4096))]
    depth: u32,
    /// QP local ACK timeout exponent: 4.096 µs * 2^t (12: 16.8 ms; the cores here are shared with other work).
    #[arg(long, global = true, default_value_t = 12, value_parser = clap::value_parser!(u8).range(1..=31))]
    qp_timeout: u8,
    /// Benchmarks only: do not generate or check message contents (the data path still copies every payload
    /// once into its mbuf and computes the ICRC on both sides). Checks then cover completions only.
    #[arg(long, global = true)]
    no_verify: bool,
    /// Test only: drop this percentage of received RoCE frames (seeded; 0-100).
    #[arg(long, global = true, default_value_t = 0.0, value_parser = roce_dp_tools::percent_arg)]
    inject_loss: f64,
    /// Seed of the loss hook.
    #[arg(long, global = true, default_value_t = 1)]
    seed: u64,
    /// Print per-port and per-worker counters at the end.
    #[arg(long, global = true)]
    stats: bool,
    /// TCP port on 127.0.0.1 for the out-of-band exchange.
    #[arg(long, global = true, default_value_t = 18515, value_parser = clap::value_parser!(u16).range(1..))]
    oob_port: u16,
    /// Out-of-band exchange over this Unix socket path instead of TCP (processes in different network namespaces).
    #[arg(long, global = true)]
    oob_unix: Option<PathBuf>,
    /// Override the profile's memif socket.
    #[arg(long, global = true)]
    socket: Option<String>,
    /// Override the profile's interface (af_packet, af_xdp).
    #[arg(long, global = true)]
    iface: Option<String>,
    /// Ring mode: workers per soft NIC (one rx queue; worker 0 dispatches RoCE frames to the owner of the
    /// destination QP over SPSC rings; each worker sends on its own tx queue). Workers back off when idle.
    #[arg(long, global = true, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=4))]
    workers: u32,
    /// Ring and tap modes: how RoCE frames reach the worker owning their QP: `software` (worker 0 receives and
    /// forwards), `rte_flow` (an exact rule per QP: peer address + UDP source port -> the owner's rx queue; misses
    /// forwarded and counted), `rss` (the port spreads frames over the workers' rx queues; misses forwarded and
    /// counted), `auto` (rte_flow where the PMD accepts a rule, else software). Printed at start.
    #[arg(long, global = true, default_value = "auto", value_parser = parse_steering)]
    steering: SteeringMode,
    /// rte_flow steering: most exact rules per port (QPs beyond it are forwarded in software).
    #[arg(long, global = true, default_value_t = 1024)]
    max_rules: usize,
    /// Ring mode: RoCE over IPv6 (fd00::1, fd00::2), peers resolved with neighbour discovery.
    #[arg(long, global = true)]
    ipv6: bool,
    /// Override the profile's IPv4 address.
    #[arg(long, global = true)]
    ipv4: Option<std::net::Ipv4Addr>,
    /// Override the profile's main lcore.
    #[arg(long, global = true)]
    lcore: Option<u32>,
    /// EAL --file-prefix (default rdpn_MODE_PID; a plain name); its runtime directory is removed on exit.
    #[arg(long, global = true, value_parser = roce_dp_tools::file_prefix_arg)]
    file_prefix: Option<String>,
    /// Idle behaviour (default: the profile's; ring: busy).
    #[arg(long, global = true, value_enum)]
    idle: Option<IdleArg>,
    /// Give up (exit 1) after this many seconds.
    #[arg(long, global = true, default_value_t = 60,
          value_parser = roce_dp_tools::whole_arg::<1, { roce_dp_tools::MAX_SECONDS }>)]
    timeout: u64,
    /// Raw mode for the benchmark (no RoCE): `bw` streams frames of --size bytes client -> server, `rtt`
    /// ping-pongs one frame; compare with the same sizes over RoCE.
    #[arg(long, global = true, value_enum)]
    raw: Option<raw::RawMode>,
    /// Seconds a raw `bw` run sends for.
    #[arg(long, global = true, default_value_t = 2.0, value_parser = roce_dp_tools::seconds_arg)]
    seconds: f64,
    /// Ring and tap modes: after the run, print `HOLD` and wait until stdin reaches end of file before the
    /// steering rules and the ports go, so that they can be inspected from outside (e.g. the tap interfaces'
    /// rules and their hit counts with `tc -s filter show`).
    #[arg(long, global = true)]
    hold: bool,
    /// Let DPDK print to the terminal.
    #[arg(short, long, global = true)]
    verbose: bool,
}

/// Bad input or a failed setup step: one line, exit 2.
pub(crate) struct SetupError(pub(crate) String);

impl From<DpdkError> for SetupError {
    fn from(e: DpdkError) -> Self {
        SetupError(e.to_string())
    }
}

pub(crate) trait Ctx<T> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, SetupError>;
}

impl<T, E: std::fmt::Display> Ctx<T> for Result<T, E> {
    fn ctx(self, what: impl FnOnce() -> String) -> Result<T, SetupError> {
        self.map_err(|e| SetupError(format!("{}: {e}", what())))
    }
}

fn parse_steering(s: &str) -> Result<SteeringMode, String> {
    SteeringMode::parse(s)
}

fn main() -> ExitCode {
    let cli: Cli = match roce_dp_tools::parse_cli("rdp-nic") {
        Ok(c) => c,
        Err(code) => return code,
    };
    // SIGINT/SIGTERM stop the polling loops and waits; the ports, EAL and its runtime directory are then cleaned up
    // as after a run (a second signal kills at once).
    dpdk::signal::stop_on_signals();
    let mode = match cli.mode {
        Mode::Ring => "ring",
        Mode::Tap { .. } => "tap",
        Mode::Server { .. } => "server",
        Mode::Client { .. } => "client",
    };
    let prefix = cli.o.file_prefix.clone().unwrap_or_else(|| format!("rdpn_{mode}_{}", std::process::id()));
    let result = match &cli.mode {
        Mode::Ring => run_ring(&cli.o, &prefix, None),
        Mode::Tap { bridge } => run_ring(&cli.o, &prefix, Some(bridge)),
        Mode::Server { profile } => run_peer(&cli.o, &prefix, profile, false),
        Mode::Client { profile } => run_peer(&cli.o, &prefix, profile, true),
    };
    roce_dp_tools::remove_runtime_dir(&prefix);
    if dpdk::signal::stop_requested() {
        eprintln!("rdp-nic: interrupted");
        return ExitCode::from(130);
    }
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(SetupError(msg)) => {
            eprintln!("rdp-nic: {msg}");
            ExitCode::from(2)
        }
    }
}

/// A `CHECK` line; returns `pass`.
pub(crate) fn check(label: &str, pass: bool, what: impl std::fmt::Display) -> bool {
    println!("CHECK {} {label}: {what}", if pass { "ok  " } else { "FAIL" });
    pass
}

fn worker_config(o: &Opts, profile_idle: Option<(&str, u32, u32)>, seed: u64) -> WorkerConfig {
    let (idle, after, us) = profile_idle.unwrap_or(("busy", 1000, 50));
    let idle = match o.idle {
        Some(IdleArg::Busy) => Idle::Busy,
        Some(IdleArg::Pause) => Idle::Pause { after },
        Some(IdleArg::Yield) => Idle::Yield { after },
        Some(IdleArg::Sleep) => Idle::Sleep { after, us },
        None => match idle {
            "pause" => Idle::Pause { after },
            "yield" => Idle::Yield { after },
            "sleep" => Idle::Sleep { after, us },
            _ => Idle::Busy,
        },
    };
    let loss_ppm = (o.inject_loss.clamp(0.0, 100.0) * 10_000.0).round() as u32;
    WorkerConfig { idle, loss_ppm, loss_seed: seed, ..WorkerConfig::default() }
}

fn params(o: &Opts, mtu: u32) -> Params {
    Params {
        op: o.op,
        size: o.size,
        iters: o.iters,
        qps: o.qps,
        mtu,
        depth: o.depth,
        qp_timeout: o.qp_timeout,
        verify: !o.no_verify,
    }
}

fn check_mtu(mtu: u32, max: u32) -> Result<u32, SetupError> {
    if !roce_dp::qp::PATH_MTUS.contains(&mtu) {
        return Err(SetupError(format!("--mtu {mtu}: not a RoCE path MTU (256, 512, 1024, 2048, 4096)")));
    }
    if mtu > max {
        return Err(SetupError(format!("--mtu {mtu}: larger than the profile's path MTU {max}")));
    }
    Ok(mtu)
}

fn init_eal(args: EalArgs, verbose: bool) -> Result<Eal, SetupError> {
    let argv = args.to_vec();
    let shown = argv[1..].join(" ");
    // Quiet, DPDK's log is kept (not shown) so that a failed step can quote DPDK's reason.
    dpdk_step(|| if verbose { Eal::init(argv) } else { Eal::init_captured(argv) }).ctx(|| format!("EAL ({shown})"))
}

fn configure_and_start(
    port: &mut Port,
    pool: &Mempool,
    conf: &PortConfig,
    client_retry: Option<Duration>,
) -> Result<(), SetupError> {
    let info = dpdk_step(|| port.info()).ctx(|| format!("port {}", port.name()))?;
    // Rx scatter stays off: the pool holds every frame in one segment (a multi-segment frame would still be
    // linearized by the worker).
    let (_rx_off, tx_off) = choose_offloads(&info);
    let conf = PortConfig { tx_offloads: tx_off, ..conf.clone() };
    dpdk_step(|| port.configure(&conf, pool)).ctx(|| format!("configure {} ({})", port.name(), info.driver))?;
    let until = Instant::now() + client_retry.unwrap_or_default();
    loop {
        match dpdk_step(|| port.start()) {
            Ok(()) => return Ok(()),
            Err(e) if client_retry.is_some() && Instant::now() < until && !dpdk::signal::stop_requested() => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e).ctx(|| format!("start {}", port.name())),
        }
    }
}

// ------------------------------------------------------------------------------------------------ ring mode

const RING_MAC: [MacAddr; 2] = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])];
const RING_IP: [[u8; 4]; 2] = [[10, 0, 0, 1], [10, 0, 0, 2]];
const RING_IP6: [[u8; 16]; 2] =
    [[0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1], [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2]];

fn engine_config(mac: MacAddr, ip: LocalIp) -> EngineConfig {
    EngineConfig { local_mac: mac, local_ip: ip, qpn_base: 0x100, ..EngineConfig::default() }
}

/// Tap mode: the two soft NICs' interfaces.
const TAP_IFACE: [&str; 2] = ["rdptap0", "rdptap1"];

/// How the ring/tap mode steers, after `auto` is resolved and checked against the ports.
fn resolve_steering(o: &Opts, tap: bool, nw: usize) -> Result<SteeringMode, SetupError> {
    match o.steering {
        _ if nw == 1 => Ok(SteeringMode::Software),
        m @ (SteeringMode::RteFlow | SteeringMode::Rss) if !tap => Err(SetupError(format!(
            "--steering {}: net_ring ports have one rx queue and no rte_flow (use software or auto)",
            m.name()
        ))),
        SteeringMode::Software if tap => Err(SetupError(
            "--steering software: net_tap needs as many rx queues as tx queues (one per worker) and spreads frames \
             over them itself (use rss, rte_flow or auto)"
                .into(),
        )),
        m => Ok(m),
    }
}

/// Try one exact RoCE rule on `port` (and destroy it again): whether the PMD really installs such rules
/// (net_tap validates them in software and fails only at create when the kernel lacks cls_flower).
fn probe_rte_flow(port: &Port, queue: u16) -> Result<(), roce_dp::dpdk::FlowError> {
    let m = RoceMatch { ipv6: false, src_ip: Some(ip16(RING_IP[1])), udp_src: Some(1) };
    port.roce_flow(&m, FlowDest::Queue(queue)).map(drop)
}

fn ip16(a: [u8; 4]) -> [u8; 16] {
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(&a);
    v
}

/// Attach tap interface `iface` to `bridge` and bring it up (the PMD creates the interface when the port is made).
fn join_bridge(iface: &str, bridge: &str) -> Result<(), SetupError> {
    for args in [vec!["link", "set", "dev", iface, "master", bridge], vec!["link", "set", "dev", iface, "up"]] {
        let out = std::process::Command::new("ip").args(&args).output().ctx(|| format!("ip {}", args.join(" ")))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(SetupError(format!("ip {}: {}", args.join(" "), err.trim())));
        }
    }
    Ok(())
}

fn run_ring(o: &Opts, prefix: &str, bridge: Option<&str>) -> Result<bool, SetupError> {
    if o.raw.is_some() {
        return Err(SetupError("--raw needs the server/client modes".into()));
    }
    let tap = bridge.is_some();
    let mtu = match o.mtu {
        Some(m) if tap && m > 1024 => {
            return Err(SetupError(format!("--mtu {m}: tap mode carries frames up to 1500 bytes (path MTU <= 1024)")))
        }
        Some(m) => check_mtu(m, 4096)?,
        None if tap => 1024,
        None => 4096,
    };
    if tap && o.ipv6 {
        return Err(SetupError("--ipv6: tap mode runs RoCE over IPv4 only".into()));
    }
    let p = params(o, mtu);
    let nw = o.workers as usize;
    if o.workers > p.qps {
        return Err(SetupError(format!("--workers {}: more workers than QPs ({})", o.workers, p.qps)));
    }
    let mut steering = resolve_steering(o, tap, nw)?;
    let lcore = o.lcore.unwrap_or(0).to_string();
    HostView::default().check_lcores(&lcore).map_err(|why| SetupError(format!("--lcore: {why}")))?;
    let mut args = EalArgs::new("rdp-nic", &lcore);
    args.file_prefix = Some(prefix.to_owned());
    args.no_huge_mb = Some(if tap { 512 } else { 256 });
    args.no_shconf = true;
    let eal = init_eal(args, o.verbose)?;
    let frame = mtu + roce_dp::engine::MAX_HEADER_BYTES as u32;
    let room = dpdk::data_room_for(frame.max(2048)).expect("fits");
    let conf = PortConfig { rx_desc: 512, tx_desc: 512, tx_queues: o.workers as u16, ..PortConfig::default() };
    let n = dpdk::pool_size(2 * o.workers, 512, 512, 2 * o.workers + 1, 128, 2048 + 1024 * o.workers);
    let pool =
        dpdk_step(|| Mempool::new(&eal, "rdpn_pool", n, 128, room)).ctx(|| format!("mempool of {n} x {room} B"))?;
    let mut ports = if let Some(br) = bridge {
        let mk = |i: usize| {
            dpdk_step(|| Port::vdev(&eal, &format!("net_tap{i}"), &format!("iface={}", TAP_IFACE[i])))
                .ctx(|| format!("net_tap{i} (iface {})", TAP_IFACE[i]))
        };
        let ports = [mk(0)?, mk(1)?];
        for iface in TAP_IFACE {
            join_bridge(iface, br)?;
        }
        ports
    } else {
        // Each port has one rx queue and one tx queue per worker; with several workers their tx queues share the
        // ring to the peer (multi-producer), and worker 0 dispatches received RoCE frames to the others.
        let mk = |name: &str| {
            dpdk_step(|| if nw > 1 { Ring::new_mp(&eal, name, 2048) } else { Ring::new(&eal, name, 2048) })
                .ctx(|| format!("ring {name}"))
        };
        let ab = mk("rdpn_ab")?;
        let ba = mk("rdpn_ba")?;
        let port = |name: &str, rx: &Ring, tx: &Ring| {
            dpdk_step(|| Port::from_rings_tx(&eal, name, rx, tx, nw as u16)).ctx(|| format!("{name} port"))
        };
        [port("net_ring_a", &ba, &ab)?, port("net_ring_b", &ab, &ba)?]
    };
    let rx_queues = |m: SteeringMode| if tap && m != SteeringMode::Software { nw as u16 } else { 1 };
    for port in &mut ports {
        configure_and_start(port, &pool, &PortConfig { rx_queues: rx_queues(steering), ..conf.clone() }, None)?;
    }
    // Steering: rte_flow (and auto) need the PMD to really install a rule; rte_flow stops with the PMD's error,
    // auto falls back to software on net_ring (one rx queue, worker 0 dispatches) and to rss on net_tap (which
    // wants one rx queue per tx queue and spreads frames over them by the kernel's flow hash).
    if matches!(steering, SteeringMode::RteFlow | SteeringMode::Auto) {
        let mut refused = None;
        for (i, port) in ports.iter().enumerate() {
            let r = if tap { probe_rte_flow(port, nw as u16 - 1) } else { port.steer_roce(&[0]).map(drop) };
            if let Err(e) = r {
                refused = Some(format!("{} ({}) refused a RoCE rule: {e}", port.name(), ["a", "b"][i]));
                break;
            }
        }
        match (steering, refused) {
            (SteeringMode::RteFlow, Some(why)) => return Err(SetupError(format!("--steering rte_flow: {why}"))),
            (_, Some(why)) => {
                steering = if tap { SteeringMode::Rss } else { SteeringMode::Software };
                println!("STEERING auto: {} (rte_flow unavailable: {why})", steering.name());
            }
            (_, None) => steering = SteeringMode::RteFlow,
        }
    }
    let hw = steering != SteeringMode::Software;
    println!(
        "STEERING mode={} workers={nw} rx_queues={} ({})",
        steering.name(),
        rx_queues(steering),
        match steering {
            SteeringMode::RteFlow => "an exact rte_flow rule per QP to its owner's rx queue; misses forwarded",
            SteeringMode::Rss => "the port spreads frames over the workers' rx queues; misses forwarded",
            _ if nw > 1 => "worker 0 receives every frame and forwards each to its QP's owner",
            _ => "one worker",
        }
    );
    for port in &ports {
        port.wait_link_up(Duration::from_secs(5)).ctx(|| format!("{}: link", port.name()))?;
    }
    let in_use_before = pool.in_use();

    // QP q runs on worker q % nw of each node; worker w's engine numbers its QPs from 0x100 + w * QPN_STRIDE.
    let mut shares = Vec::new();
    for w in 0..nw {
        let qps = (p.qps as usize + nw - 1 - w) / nw;
        shares.push(Params { qps: qps as u32, ..p });
    }
    let mut workers: [Vec<Worker>; 2] = [Vec::new(), Vec::new()];
    let mut locals: [Vec<Vec<Local>>; 2] = [Vec::new(), Vec::new()];
    for node in 0..2 {
        // Software: rings to workers 1.. (worker 0 is the only sender). Hardware: a ring to every worker, fed by
        // every other worker (multi-producer beyond two workers).
        let dispatch_rings: Vec<Option<Ring>> = (0..nw)
            .map(|w| {
                let name = format!("rdpn_d{node}{w}");
                let ring = match (hw, w) {
                    (false, 0) => return Ok(None),
                    (true, _) if nw > 2 => dpdk_step(|| Ring::new_mp(&eal, &name, 2048)),
                    _ => dpdk_step(|| Ring::new(&eal, &name, 2048)),
                };
                ring.map(Some).ctx(|| format!("node {node}'s ring to worker {w} (2048 frames)"))
            })
            .collect::<Result<_, _>>()?;
        for (w, share) in shares.iter().enumerate() {
            let ip = if o.ipv6 {
                LocalIp { v4: None, v6: Some(RING_IP6[node]) }
            } else {
                LocalIp { v4: Some(RING_IP[node]), v6: None }
            };
            let cfg = EngineConfig { qpn_base: 0x100 + w as u32 * QPN_STRIDE, ..engine_config(RING_MAC[node], ip) };
            let mut e = Engine::new(cfg);
            locals[node].push(app::create(&mut e, share, node as u64).map_err(SetupError)?);
            let q = ports[node].queue_pair(w as u16).expect("configured tx queue");
            let seed = o.seed.wrapping_add((node * 16 + w) as u64);
            let mut wc = worker_config(o, None, seed);
            if nw > 1 && o.idle.is_none() {
                // 2 x workers threads on 2 cores: never two busy-pollers on one core.
                wc.idle = Idle::Sleep { after: 256, us: 20 };
            }
            let mut wk = dpdk_step(|| Worker::new(e, q, &pool, mtu, wc)).ctx(|| format!("node {node} worker {w}"))?;
            if hw {
                let mut out = dispatch_rings.clone();
                out[w] = None;
                wk = wk
                    .with_dispatch(Dispatch::new(0x100, w, out).hardware())
                    .with_rx_ring(dispatch_rings[w].clone().expect("ring"));
            } else if nw > 1 {
                wk = if w == 0 {
                    wk.with_dispatch(Dispatch::new(0x100, 0, dispatch_rings.clone()))
                } else {
                    wk.with_rx_ring(dispatch_rings[w].clone().expect("ring"))
                };
            }
            workers[node].push(wk);
        }
    }
    let remotes: [Vec<Vec<Remote>>; 2] = [
        locals[1].iter().map(|v| v.iter().map(Remote::of).collect()).collect(),
        locals[0].iter().map(|v| v.iter().map(Remote::of).collect()).collect(),
    ];
    // rte_flow: one exact rule per QP (the peer's address and the pair's UDP source port -> the owner's rx queue),
    // kept until the ports close; refused rules leave those frames to the forwarding.
    let mut rules: [HashMap<FlowKey, FlowRule>; 2] = [HashMap::new(), HashMap::new()];
    let mut tables = [SteerTable::new(o.max_rules), SteerTable::new(o.max_rules)];
    if steering == SteeringMode::RteFlow {
        for node in 0..2 {
            for (w, (ls, rs)) in locals[node].iter().zip(&remotes[node]).enumerate() {
                for (l, r) in ls.iter().zip(rs) {
                    let key = FlowKey::v4(RING_IP[1 - node], roce_dp::wire::rxe_udp_sport(l.qpn, r.qpn));
                    // An install the PMD refuses frees a slot another key may take: work through them in order.
                    let mut ops = std::collections::VecDeque::from(tables[node].add(key, l.qpn, w as u16));
                    while let Some(op) = ops.pop_front() {
                        match op {
                            RuleOp::Install { key, queue } => {
                                let m = RoceMatch { ipv6: false, src_ip: Some(key.src_ip), udp_src: Some(key.udp_src) };
                                match ports[node].roce_flow(&m, FlowDest::Queue(queue)) {
                                    Ok(rule) => {
                                        rules[node].insert(key, rule);
                                    }
                                    Err(e) => {
                                        println!(
                                            "STEERING node {node}: rule for UDP source port {:#06x} (queue {queue}) \
                                             refused ({e}): forwarded",
                                            key.udp_src
                                        );
                                        ops.extend(tables[node].refused(key));
                                    }
                                }
                            }
                            RuleOp::Remove { key } => drop(rules[node].remove(&key)),
                        }
                    }
                }
            }
            let st = tables[node].stats();
            println!(
                "STEERING node {} rules={} conflicts={} full={} refused={}",
                ["a", "b"][node],
                st.rules,
                st.conflicts,
                st.full,
                st.refused
            );
        }
    }

    let v6 = o.ipv6;
    let a_done = AtomicUsize::new(0);
    let b_done = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let start = StartLine::new(2 * nw);
    let deadline = Instant::now() + Duration::from_secs(o.timeout);
    let [wa, wb] = workers;
    let (res_a, res_b) = std::thread::scope(|s| {
        let mut ha = Vec::new();
        for (w, wk) in wa.into_iter().enumerate() {
            let (share, l, r) = (&shares[w], &locals[0][w], &remotes[0][w]);
            let (a_done, b_done, stop, start) = (&a_done, &b_done, &stop, &start);
            ha.push(s.spawn(move || {
                let mut marked = false;
                node(
                    (0, w, v6),
                    wk,
                    share,
                    l,
                    r,
                    start,
                    deadline,
                    |_| Ok(Requester::new(*share, l, r)),
                    |wk, req: &mut Requester| {
                        let busy = req.step(&mut wk.engine);
                        if req.finished() && !marked {
                            marked = true;
                            a_done.fetch_add(1, Ordering::AcqRel);
                        }
                        (b_done.load(Ordering::Acquire) < nw && !stop.load(Ordering::Relaxed), busy)
                    },
                )
            }));
        }
        let mut hb = Vec::new();
        for (w, wk) in wb.into_iter().enumerate() {
            let (share, l, r) = (&shares[w], &locals[1][w], &remotes[1][w]);
            let (a_done, b_done, stop, start) = (&a_done, &b_done, &stop, &start);
            hb.push(s.spawn(move || {
                let mut marked = false;
                node(
                    (1, w, v6),
                    wk,
                    share,
                    l,
                    r,
                    start,
                    deadline,
                    |wk| Responder::new(*share, l, &mut wk.engine),
                    |wk, resp: &mut Responder| {
                        let busy = resp.step(&mut wk.engine);
                        if resp.finished() && a_done.load(Ordering::Acquire) == nw && !marked {
                            marked = true;
                            b_done.fetch_add(1, Ordering::AcqRel);
                        }
                        // Worker 0 dispatches for the others: everyone polls until every responder is done.
                        (b_done.load(Ordering::Acquire) < nw && !stop.load(Ordering::Relaxed), busy)
                    },
                )
            }));
        }
        let ra: Vec<_> = ha.into_iter().map(|h| h.join().expect("node a thread")).collect();
        let rb: Vec<_> = hb.into_iter().map(|h| h.join().expect("node b thread")).collect();
        (ra, rb)
    });
    let res_a = res_a.into_iter().collect::<Result<Vec<_>, _>>()?;
    let res_b = res_b.into_iter().collect::<Result<Vec<_>, _>>()?;
    // Frames still on the rings (e.g. a last ACK sent after the peer stopped polling) go back to the pool.
    let mut stale = 0;
    for port in &ports {
        let mut b = Burst::new();
        for q in 0..rx_queues(steering) {
            while port.rx_burst(q, &mut b) > 0 {
                stale += b.len();
                b.clear();
            }
        }
    }
    let mut ok = true;
    let mut sum = ReqSummary::default();
    for (req, r) in &res_a {
        sum.add(req, &r.timing);
    }
    ok &= report_requester("node a", &p, &sum);
    let mut verified = sum.verified_bytes;
    let b_stats: Vec<String> = res_b.iter().map(|(_, r)| r.stats.line()).collect();
    for (w, (resp, r)) in res_b.into_iter().enumerate() {
        let mut resp = resp;
        if let Some(e) = &r.engine {
            resp.final_check(e);
        }
        let what = resp.failure.as_deref().unwrap_or("every message verified").to_owned();
        ok &= check(&format!("node b worker {w}"), resp.failure.is_none(), format!("responder: {what}"));
        verified += resp.verified_bytes;
    }
    let want = p.iters * u64::from(p.qps) * p.msg_size();
    ok &= check("ring", !p.verify || verified >= want, format!("{verified} bytes verified (verify={})", p.verify));
    let how = if o.ipv6 { "IPv6 neighbour discovery" } else { "ARP" };
    ok &= check("node a", res_a[0].1.resolved, format!("peer resolved with {how}"));
    let in_use_after = pool.in_use();
    ok &= check(
        "mempool",
        in_use_after == in_use_before,
        format!("{in_use_before} mbufs in use before, {in_use_after} after ({stale} stale frames drained)"),
    );
    if o.stats {
        for (i, port) in ports.iter().enumerate() {
            print_port_stats(&format!("port {}", ["a", "b"][i]), port);
        }
        for (w, (_, r)) in res_a.iter().enumerate() {
            println!("STATS worker a{w}: {}", r.stats.line());
            println!("STATS neigh a{w}: {:?}", r.neigh);
            if let Some(e) = &r.engine {
                println!("STATS engine a{w}: {}", engine_line(e));
            }
        }
        for (w, line) in b_stats.iter().enumerate() {
            println!("STATS worker b{w}: {line}");
        }
    }
    if o.hold {
        println!("HOLD rules and ports kept until stdin closes");
        hold_until_eof_or_signal();
    }
    // The rules go, then the ports stop and close when they drop (after every worker that borrowed a queue pair).
    Ok(ok)
}

/// `--hold`: reads and drops whatever stdin holds until its end of file (or a read error), or until SIGINT/SIGTERM.
/// stdin is polled in 100 ms steps, so a signal ends the hold too (a blocking read restarts after the signal, and
/// until session 11 only a second signal, which kills at once, or end of file ended it).
fn hold_until_eof_or_signal() {
    use std::io::Read;
    use std::os::fd::AsFd;
    let stdin = std::io::stdin();
    let mut buf = [0u8; 4096];
    while !dpdk::signal::stop_requested() {
        match roce_dp::ctrl::shm::channel_wait(stdin.as_fd(), Some(Duration::from_millis(100))) {
            Ok(false) => {}
            Ok(true) => match stdin.lock().read(&mut buf) {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            },
            Err(_) => return,
        }
    }
}

/// The requesters' results, summed over workers.
#[derive(Default)]
struct ReqSummary {
    completed: u64,
    verified_bytes: u64,
    failure: Option<String>,
    start: Option<Instant>,
    end: Option<Instant>,
    peak_msgs_per_s: f64,
    unfinished: bool,
    /// Ping-pong runs: post-to-completion times (ns).
    rtts: Vec<u64>,
}

impl ReqSummary {
    fn add(&mut self, req: &Requester, t: &Timing) {
        self.completed += req.completed();
        self.verified_bytes += req.verified_bytes;
        if self.failure.is_none() {
            self.failure.clone_from(&req.failure);
        }
        self.start = match (self.start, t.start) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match t.end {
            Some(e) => self.end = Some(self.end.map_or(e, |x| x.max(e))),
            None => self.unfinished = true,
        }
        self.peak_msgs_per_s += t.peak_msgs_per_s;
        self.rtts.extend_from_slice(&req.rtts);
    }
}

/// What a node thread hands back.
struct NodeResult {
    stats: dpdk::WorkerStats,
    neigh: roce_dp::neigh::NeighStats,
    resolved: bool,
    timing: Timing,
    engine: Option<Engine>,
}

/// Requester timing for the perftest line.
#[derive(Default, Clone, Copy)]
pub(crate) struct Timing {
    pub(crate) start: Option<Instant>,
    pub(crate) end: Option<Instant>,
    pub(crate) peak_msgs_per_s: f64,
    win_start: Option<Instant>,
    win_count: u64,
    calls: u64,
}

impl Timing {
    /// Note `completed` messages; looks at the clock only every 64th call (it showed at 15% of a poll loop).
    pub(crate) fn update(&mut self, completed: u64) {
        self.calls = self.calls.wrapping_add(1);
        if self.calls % 64 != 1 {
            return;
        }
        let now = Instant::now();
        let ws = *self.win_start.get_or_insert(now);
        let dt = now.duration_since(ws);
        if dt >= Duration::from_millis(10) {
            let rate = (completed - self.win_count) as f64 / dt.as_secs_f64();
            self.peak_msgs_per_s = self.peak_msgs_per_s.max(rate);
            self.win_start = Some(now);
            self.win_count = completed;
        }
    }
}

/// Turns in a row [`AppGate`] may skip the application's pass (~2-4 us of empty polls).
const APP_SKIP_MAX: u32 = 64;

/// Whether the requester's or responder's pass can have work after a turn. Their work comes only from completions
/// (a requester posts when one opens its window), and completions only from frames the worker handled or timers it
/// ran: after a turn that did neither, following a pass that did nothing, the pass would poll empty CQs and find its
/// window still full. Skipping it keeps the idle turn to the rx burst and the worker's bookkeeping (the turn that
/// finds the answer of a ping-pong starts sooner). Every [`APP_SKIP_MAX`]th turn runs it anyway (completions the
/// engine makes without a frame or a timer, e.g. a local error while building a request; the deadline checks).
#[derive(Default)]
struct AppGate {
    /// `rx_frames + timer_runs` of the worker at the last pass.
    seen: u64,
    skipped: u32,
}

impl AppGate {
    /// True if the application runs after this turn (the caller then reports its result with [`AppGate::ran`]).
    #[inline]
    fn due(&mut self, s: &dpdk::WorkerStats) -> bool {
        let events = s.rx_frames.wrapping_add(s.timer_runs);
        if events != self.seen || self.skipped >= APP_SKIP_MAX {
            self.seen = events;
            self.skipped = 0;
            return true;
        }
        self.skipped += 1;
        false
    }

    /// The pass did something (posted, completed): the next turn runs it again.
    #[inline]
    fn ran(&mut self, busy: bool) {
        if busy {
            self.skipped = APP_SKIP_MAX;
        }
    }
}

/// Where the ring-mode node threads wait for each other before traffic (no requester posts before its responder's
/// QPs are connected). A thread that could not get ready (it could not pin itself to its core: a machine, or a
/// cpuset, with one CPU; a QP that would not connect) still arrives and leaves its reason, so that every thread
/// stops with it instead of waiting for it for ever (session 11: they waited at a plain barrier for ever).
struct StartLine {
    barrier: Barrier,
    failed: std::sync::Mutex<Option<String>>,
}

impl StartLine {
    fn new(threads: usize) -> Self {
        Self { barrier: Barrier::new(threads), failed: std::sync::Mutex::new(None) }
    }

    /// Waits for every thread, `ready` being this one's preparation; the first failure of any thread for all.
    fn cross<T>(&self, ready: Result<T, SetupError>) -> Result<T, SetupError> {
        if let Err(e) = &ready {
            let mut f = self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            f.get_or_insert_with(|| e.0.clone());
        }
        self.barrier.wait();
        let failed = self.failed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        match failed {
            Some(why) => Err(SetupError(why)),
            None => ready,
        }
    }
}

/// One ring-mode node thread: pin, resolve the peer, connect QPs, wait for the other node, run `app`.
#[allow(clippy::too_many_arguments)]
fn node<'p, S: NodeState>(
    (i, wi, v6): (usize, usize, bool),
    mut w: Worker<'p>,
    p: &Params,
    locals: &[Local],
    remotes: &[Remote],
    start: &StartLine,
    deadline: Instant,
    init: impl FnOnce(&mut Worker<'p>) -> Result<S, String>,
    mut app: impl FnMut(&mut Worker<'p>, &mut S) -> (bool, bool),
) -> Result<(S, NodeResult), SetupError> {
    let core = (i + wi) % 2;
    let ready = (|| -> Result<bool, SetupError> {
        register_thread(core).ctx(|| format!("node {i} worker {wi}: pin to core {core} and register with EAL"))?;
        roce_dp_tools::claim_lcores("rdp-nic", u32::try_from(core).ok());
        let (peer_ip, ip) = if v6 {
            (NeighIp::V6(RING_IP6[1 - i]), IpAddrs::V6 { src: RING_IP6[i], dst: RING_IP6[1 - i] })
        } else {
            (NeighIp::V4(RING_IP[1 - i]), IpAddrs::V4 { src: RING_IP[i], dst: RING_IP[1 - i] })
        };
        // Worker 0 receives from the port and resolves the peer (ARP, or IPv6 neighbour discovery); the others (fed
        // by its dispatcher) do not see those frames and use the peer's known MAC.
        let mac = if wi == 0 { w.resolve(peer_ip, Duration::from_secs(5)) } else { Some(RING_MAC[1 - i]) };
        let peer = PeerAddr { ip, mac: mac.unwrap_or(RING_MAC[1 - i]) };
        for (l, r) in locals.iter().zip(remotes) {
            app::connect(&mut w.engine, l, r, p, peer).map_err(SetupError)?;
        }
        Ok(mac == Some(RING_MAC[1 - i]))
    })();
    let init = ready.is_ok().then(|| init(&mut w));
    let _ = w.poll();
    let resolved = start.cross(ready)?;
    let init = init.unwrap_or_else(|| Err("not ready".into()));
    let mut state = init.map_err(|e| SetupError(format!("node {i} worker {wi}: {e}")))?;
    let mut timing = Timing { start: Some(Instant::now()), ..Timing::default() };
    let mut n = 0u64;
    let mut timed_out = false;
    let mut gate = AppGate::default();
    w.run(dpdk::signal::stop_flag(), |w| {
        if !gate.due(&w.stats) {
            return (true, false);
        }
        let (go, busy) = app(w, &mut state);
        gate.ran(busy);
        if let Some(c) = state.completed() {
            timing.update(c);
            if state.is_finished() && timing.end.is_none() {
                timing.end = Some(Instant::now());
            }
        }
        n += 1;
        if n.is_multiple_of(4096) && Instant::now() > deadline {
            timed_out = true;
            return (false, busy);
        }
        (go, busy)
    });
    if timed_out {
        println!("node {i} worker {wi}: timed out");
    }
    let st = state;
    let stats = w.stats;
    let neigh = w.neigh.stats;
    // Hand the engine back (the responder's final check reads its memory); the worker's mbufs are freed here.
    let engine = w.into_engine();
    Ok((st, NodeResult { stats, neigh, resolved, timing, engine: Some(engine) }))
}

trait NodeState {
    fn completed(&self) -> Option<u64>;
    fn is_finished(&self) -> bool;
}

impl NodeState for Requester {
    fn completed(&self) -> Option<u64> {
        Some(Requester::completed(self))
    }
    fn is_finished(&self) -> bool {
        self.finished()
    }
}

impl NodeState for Responder {
    fn completed(&self) -> Option<u64> {
        None
    }
    fn is_finished(&self) -> bool {
        self.finished()
    }
}

/// The requester's CHECK lines and the perftest-like table.
fn report_requester(label: &str, p: &Params, r: &ReqSummary) -> bool {
    let total = p.iters * u64::from(p.qps);
    let mut ok = check(
        label,
        r.failure.is_none(),
        format!("requester: {}", r.failure.as_deref().unwrap_or("every completion OK")),
    );
    ok &= check(label, r.completed == total, format!("{}/{total} WRs completed", r.completed));
    let secs = match (r.start, r.end) {
        (Some(s), Some(e)) if !r.unfinished => e.duration_since(s).as_secs_f64().max(1e-9),
        _ => 0.0,
    };
    let size = p.msg_size() as f64;
    let avg = if secs > 0.0 { r.completed as f64 * size / secs / 1048576.0 } else { 0.0 };
    let peak = (r.peak_msgs_per_s * size / 1048576.0).max(avg);
    let mpps = if secs > 0.0 { r.completed as f64 / secs / 1e6 } else { 0.0 };
    println!(" #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]");
    println!(" {:<10} {:<14} {:<19.2} {:<21.2} {:.6}", p.msg_size(), total, peak, avg, mpps);
    // Ping-pong runs: the post-to-completion times after a warm-up, as the raw mode's RTT.
    let rtt = rtt_summary(&r.rtts, (r.rtts.len() / 10).min(1000))
        .map(|(avg, med, p10)| format!(" rtt_avg_us={avg:.3} rtt_median_us={med:.3} rtt_p10_us={p10:.3}"))
        .unwrap_or_default();
    println!(
        "RESULT op={} size={} iters={} qps={} mtu={} status={} seconds={secs:.6} avg_mib_s={avg:.2} mpps={mpps:.6}{rtt}",
        p.op.name(),
        p.msg_size(),
        p.iters,
        p.qps,
        p.mtu,
        if ok { "ok" } else { "FAIL" }
    );
    ok
}

/// The engine's non-zero counters on one line.
pub(crate) fn engine_line(e: &Engine) -> String {
    let mut v: Vec<String> = e.stats().iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("{k}={n}")).collect();
    v.extend(e.qp_totals().iter().filter(|(_, n)| *n > 0).map(|(k, n)| format!("qp.{k}={n}")));
    v.join(" ")
}

pub(crate) fn print_port_stats(label: &str, port: &Port) {
    let s = port.stats().unwrap_or_default();
    println!(
        "STATS {label}: ipackets={} opackets={} ibytes={} obytes={} imissed={} ierrors={} oerrors={} rx_nombuf={} \
         guard_faults={}",
        s.ipackets,
        s.opackets,
        s.ibytes,
        s.obytes,
        s.imissed,
        s.ierrors,
        s.oerrors,
        s.rx_nombuf,
        dpdk::guard_faults()
    );
}

// ------------------------------------------------------------------------------------------------ two processes

/// Everything a two-process side sets up before traffic.
pub(crate) struct Setup {
    pub(crate) profile: Profile,
    pub(crate) pool: Mempool,
    pub(crate) port: Port,
    pub(crate) mac: MacAddr,
    pub(crate) in_use_before: u32,
    pub(crate) memif: bool,
}

/// The profile with the command line's overrides (`--socket`, `--iface`, `--ipv4`) applied.
fn load_profile(o: &Opts, profile: &std::path::Path) -> Result<Profile, SetupError> {
    let mut prof = Profile::load(profile).map_err(|e| SetupError(e.0))?;
    // The overrides go into the same devargs string as the profile's values: checked the same way.
    if let Some(s) = &o.socket {
        check_socket(s).map_err(|why| SetupError(format!("--socket {why}")))?;
        prof.port.socket = Some(s.clone());
    }
    if let Some(i) = &o.iface {
        check_iface(i).map_err(|why| SetupError(format!("--iface {why}")))?;
        prof.port.iface = Some(i.clone());
    }
    if let Some(a) = o.ipv4 {
        check_own_ipv4(a).map_err(|why| SetupError(format!("--ipv4 {why}")))?;
        prof.net.ipv4 = Some(a.to_string());
    }
    Ok(prof)
}

/// The profile of a two-process side with the overrides applied, and checked against this machine: everything a
/// bad profile or flag can fail on, before the client waits for its server (it waited `--timeout` and then said
/// only "Connection refused") or either side starts DPDK.
fn checked_profile(o: &Opts, profile: &std::path::Path) -> Result<Profile, SetupError> {
    let prof = load_profile(o, profile)?;
    if prof.port.driver == Driver::NetRing {
        return Err(SetupError(format!("{}: net_ring profiles are for the ring mode", profile.display())));
    }
    let lcore = o.lcore.map(|l| l.to_string());
    let lcores = lcore.as_deref().map(|l| ("--lcore", l));
    prof.check_host(&profile.display().to_string(), lcores, &HostView::default()).map_err(|e| SetupError(e.0))?;
    Ok(prof)
}

/// EAL, the mempool and the started port of a two-process side, on a profile [`checked_profile`] returned.
pub(crate) fn setup_peer(o: &Opts, prefix: &str, prof: Profile, client: bool) -> Result<Setup, SetupError> {
    let lcore = o.lcore.map(|l| l.to_string());
    let args = prof.eal_args("rdp-nic", lcore.as_deref(), prefix);
    let eal = init_eal(args, o.verbose)?;
    let room = prof.pool_data_room();
    let (rx_desc, tx_desc) = (prof.port.rx_desc.unwrap_or(1024), prof.port.tx_desc.unwrap_or(1024));
    let n = prof.mempool.mbufs.unwrap_or_else(|| dpdk::pool_size(1, rx_desc.into(), tx_desc.into(), 1, 256, 1024));
    let pool = dpdk_step(|| Mempool::new(&eal, "rdpn_pool", n, 256, room))
        .ctx(|| format!("mempool of {n} x {room} B ([mempool] mbufs, data_room)"))?;
    let name = match prof.vdev() {
        Some((name, _)) => name,
        None => prof.port.pci.clone().unwrap_or_default(),
    };
    let mut port = dpdk_lookup(&name, || Port::by_name(&eal, &name)).ctx(|| format!("port {name}"))?;
    let memif = prof.port.driver == Driver::Memif;
    let conf = PortConfig { rx_desc, tx_desc, ..PortConfig::default() };
    let retry = (client && memif).then(|| Duration::from_secs(o.timeout.min(30)));
    configure_and_start(&mut port, &pool, &conf, retry)?;
    // Started: this thread polls the port on EAL's main lcore.
    roce_dp_tools::claim_lcores("rdp-nic", [eal.main_lcore()]);
    let mac = match prof.mac() {
        Some(m) => m,
        None => MacAddr(dpdk_step(|| port.mac()).ctx(|| format!("port {}", port.name()))?),
    };
    Ok(Setup { profile: prof, pool, port, mac, in_use_before: 0, memif })
}

fn oob_name(o: &Opts) -> String {
    match &o.oob_unix {
        Some(p) => p.display().to_string(),
        None => format!("127.0.0.1:{}", o.oob_port),
    }
}

/// Wait for the link, then note the mbufs in use (the leak check compares against this after the run).
fn link_up(s: &mut Setup, o: &Opts) -> Result<(), SetupError> {
    let name = s.port.name();
    s.port.wait_link_up(Duration::from_secs(o.timeout.min(10))).ctx(|| format!("{name}: link"))?;
    s.in_use_before = s.pool.in_use();
    Ok(())
}

fn run_peer(o: &Opts, prefix: &str, profile: &std::path::Path, client: bool) -> Result<bool, SetupError> {
    if o.hold {
        return Err(SetupError("--hold needs the ring or tap mode".into()));
    }
    // Check the profile (and the overrides) before touching DPDK or the peer so bad input fails fast with its own
    // line.
    let prof = checked_profile(o, profile)?;
    let max_mtu = prof.net.mtu;
    let mtu = match o.mtu {
        Some(m) => check_mtu(m, max_mtu)?,
        None => max_mtu,
    };
    let deadline = Instant::now() + Duration::from_secs(o.timeout);
    // The server listens once its port is started (memif: its socket exists), so a connected client can start its
    // own port at once.
    let (mut s, mut oob) = if client {
        let oob = Oob::connect(o.oob_port, o.oob_unix.as_deref(), deadline).map_err(|e| {
            SetupError(format!(
                "no rdp-nic server on {} within --timeout {} s ({e}): start `rdp-nic server --profile FILE` first{}",
                oob_name(o),
                o.timeout,
                if o.oob_unix.is_some() { " with the same --oob-unix" } else { " (same --oob-port)" }
            ))
        })?;
        (setup_peer(o, prefix, prof, client)?, oob)
    } else {
        let s = setup_peer(o, prefix, prof, client)?;
        let listener = Oob::listen(o.oob_port, o.oob_unix.as_deref()).ctx(|| format!("listen on {}", oob_name(o)))?;
        (s, listener.accept(deadline)?)
    };
    link_up(&mut s, o)?;
    if let Some(mode) = o.raw {
        return raw::run(o, &mut s, client, oob, mode);
    }
    let my_ip =
        s.profile.ipv4().ok_or_else(|| SetupError("the profile needs net.ipv4 (IPv6 peers: not yet)".into()))?;
    let ecfg = engine_config(s.mac, LocalIp { v4: Some(my_ip), v6: s.profile.ipv6() });
    let mut engine = Engine::new(ecfg);
    // Out of band: the client sends its parameters, address and QPs; the server answers with its own.
    let (p, locals, remotes, peer_ip) = if client {
        let p = params(o, mtu);
        let locals = app::create(&mut engine, &p, 0).map_err(SetupError)?;
        oob.send(&p.to_line())?;
        oob.send(&format!("ADDR {}", std::net::Ipv4Addr::from(my_ip)))?;
        for l in &locals {
            oob.send(&Remote::of(l).to_line())?;
        }
        let peer_ip = oob.addr(deadline)?;
        let remotes = (0..p.qps).map(|_| oob.remote(deadline)).collect::<Result<Vec<_>, _>>()?;
        (p, locals, remotes, peer_ip)
    } else {
        let line = oob.line(deadline)?;
        let p = Params::from_line(&line).ok_or_else(|| SetupError(format!("out-of-band: bad HELLO {line:?}")))?;
        check_mtu(p.mtu, max_mtu)?;
        let peer_ip = oob.addr(deadline)?;
        let remotes = (0..p.qps).map(|_| oob.remote(deadline)).collect::<Result<Vec<_>, _>>()?;
        let locals = app::create(&mut engine, &p, 1).map_err(SetupError)?;
        oob.send(&format!("ADDR {}", std::net::Ipv4Addr::from(my_ip)))?;
        for l in &locals {
            oob.send(&Remote::of(l).to_line())?;
        }
        (p, locals, remotes, peer_ip)
    };
    let idle = (s.profile.worker.idle.as_str(), s.profile.worker.idle_after, s.profile.worker.sleep_us);
    let seed = o.seed.wrapping_add(u64::from(client));
    let q = s.port.queue_pair(0).expect("queue 0");
    let wc = worker_config(o, Some(idle), seed);
    let mut w = dpdk_step(|| Worker::new(engine, q, &s.pool, max_mtu, wc)).ctx(|| "worker".into())?;
    for nb in &s.profile.net.neighbours {
        if let (Ok(ip), Some(mac)) = (nb.ip.parse::<std::net::IpAddr>(), roce_dp::config::parse_mac(&nb.mac)) {
            let ip = match ip {
                std::net::IpAddr::V4(a) => NeighIp::V4(a.octets()),
                std::net::IpAddr::V6(a) => NeighIp::V6(a.octets()),
            };
            w.neigh.add_static(ip, mac);
        }
    }
    let label = if client { "client" } else { "server" };
    let was_static = w.neigh.lookup(NeighIp::V4(peer_ip)).is_some();
    let mac = w
        .resolve(NeighIp::V4(peer_ip), deadline.saturating_duration_since(Instant::now()).min(Duration::from_secs(10)))
        .ok_or_else(|| SetupError(format!("no ARP answer from {}", std::net::Ipv4Addr::from(peer_ip))))?;
    println!(
        "{label}: peer {} at {mac} ({})",
        std::net::Ipv4Addr::from(peer_ip),
        if was_static { "static" } else { "ARP" }
    );
    let peer = PeerAddr { ip: IpAddrs::V4 { src: my_ip, dst: peer_ip }, mac };
    for (l, r) in locals.iter().zip(&remotes) {
        app::connect(&mut w.engine, l, r, &p, peer).map_err(SetupError)?;
    }
    let mut ok = true;
    let mut n = 0u64;
    let mut timed_out = false;
    if client {
        // Wait for the server's READY while polling (it may still be resolving us with ARP).
        oob.set_nonblocking(true)?;
        loop {
            w.poll();
            if let Some(l) = oob.try_line()? {
                if l == "READY" {
                    break;
                }
                return Err(SetupError(format!("out-of-band: expected READY, got {l:?}")));
            }
            if Instant::now() > deadline || dpdk::signal::stop_requested() {
                return Err(SetupError("out-of-band: no READY from the server".into()));
            }
        }
        let mut req = Requester::new(p, &locals, &remotes);
        let mut t = Timing { start: Some(Instant::now()), ..Timing::default() };
        let mut sent_done = false;
        let mut gate = AppGate::default();
        w.run(dpdk::signal::stop_flag(), |w| {
            if !gate.due(&w.stats) {
                return (true, false);
            }
            let busy = req.step(&mut w.engine);
            gate.ran(busy);
            t.update(req.completed());
            n += 1;
            if req.finished() {
                if !sent_done {
                    t.end = Some(Instant::now());
                    sent_done = true;
                    let _ = oob.send(if req.failure.is_none() { "DONE ok" } else { "DONE fail" });
                }
                // Poll until the server confirms it stopped polling.
                if let Ok(Some(_)) = oob.try_line() {
                    return (false, busy);
                }
            }
            if n.is_multiple_of(4096) && Instant::now() > deadline {
                timed_out = true;
                return (false, busy);
            }
            (true, busy)
        });
        ok &= check(label, !timed_out, format!("finished within {} s", o.timeout));
        let mut sum = ReqSummary::default();
        sum.add(&req, &t);
        ok &= report_requester(label, &p, &sum);
    } else {
        let mut resp = Responder::new(p, &locals, &mut w.engine).map_err(SetupError)?;
        oob.send("READY")?;
        oob.set_nonblocking(true)?;
        let mut peer_done: Option<String> = None;
        // The client's out-of-band connection ended (or broke) before its DONE: it is gone, and with it every
        // message it had still to send; waiting out --timeout would only delay the same FAIL.
        let mut peer_gone: Option<String> = None;
        let mut gate = AppGate::default();
        w.run(dpdk::signal::stop_flag(), |w| {
            if !gate.due(&w.stats) {
                return (true, false);
            }
            let busy = resp.step(&mut w.engine);
            gate.ran(busy);
            n += 1;
            if peer_done.is_none() && (resp.finished() || n.is_multiple_of(1024)) {
                match oob.try_line() {
                    Ok(Some(l)) => peer_done = Some(l),
                    Ok(None) => {}
                    Err(e) => {
                        peer_gone = Some(e.0);
                        return (false, busy);
                    }
                }
            }
            // The client says DONE only once every WR completed (or failed): everything it sent was ACKed, so
            // the responder has verified it already (it checks completions right after each poll).
            if peer_done.is_some() {
                return (false, busy);
            }
            if n.is_multiple_of(4096) && Instant::now() > deadline {
                timed_out = true;
                return (false, busy);
            }
            (true, busy)
        });
        // Stopped polling: tell the client, which may now stop its port.
        let _ = oob.send("STOPPED");
        resp.final_check(&w.engine);
        ok &= check(label, !timed_out, format!("finished within {} s", o.timeout));
        if let Some(why) = &peer_gone {
            ok &= check(label, false, format!("the client went away before it said DONE ({why})"));
        }
        if dpdk::guard_faults() > 0 {
            println!(
                "{label}: {} burst(s) cut short by a fault inside the PMD (memif: the peer's disconnect unmapped its \
                 rings under the burst; guarded)",
                dpdk::guard_faults()
            );
        }
        ok &= check(
            label,
            peer_done.as_deref() == Some("DONE ok"),
            format!("client reported {:?}", peer_done.as_deref().unwrap_or("nothing")),
        );
        ok &= check(
            label,
            resp.failure.is_none(),
            format!("responder: {}", resp.failure.as_deref().unwrap_or("every message verified")),
        );
        ok &=
            check(label, resp.finished(), "every message the responder can see completed (SEND/WRITE: every receive)");
        println!("RESULT server verified_bytes={}", resp.verified_bytes);
    }
    let stats = w.stats;
    let neigh = w.neigh.stats;
    let eline = engine_line(&w.engine);
    drop(w);
    let after = s.pool.in_use();
    if o.stats {
        print_port_stats(&format!("{label} port"), &s.port);
        println!("STATS {label} worker: {}", stats.line());
        println!("STATS {label} neigh: {neigh:?}");
        println!("STATS {label} engine: {eline}");
    }
    finish_port(&mut s, client, o)?;
    ok &= leak_check(label, &s, after);
    Ok(ok)
}

/// What DPDK 22.11's memif PMD keeps of a zero-copy client's pool for good: its receive ring stays filled with the
/// pool's mbufs (the server writes into them) and its transmit ring holds sent ones until a later burst sees them
/// consumed; neither `rte_eth_dev_stop` nor the queue release gives them back. Two rings of the PMD's default 1024
/// slots (the profile sets no `rsize`).
const MEMIF_ZC_HELD: u32 = 2 * 1024;

/// No mbuf leaked: the pool has as many in use after the run as before it (rx descriptors filled), or, for PMDs
/// that keep sent mbufs until a later tx burst reclaims them (af_xdp), none at all once the port is stopped; a memif
/// zero-copy client at most what the PMD's two rings hold ([`MEMIF_ZC_HELD`]).
pub(crate) fn leak_check(label: &str, s: &Setup, after: u32) -> bool {
    let stopped = s.pool.in_use();
    let zc = s.memif && s.profile.port.zero_copy;
    check(
        label,
        after == s.in_use_before || stopped == 0 || (zc && stopped <= s.in_use_before + MEMIF_ZC_HELD),
        format!(
            "mempool: {} mbufs in use before, {after} after, {stopped} after port stop{}",
            s.in_use_before,
            if zc { format!(" (memif zero-copy: its rings keep at most {MEMIF_ZC_HELD})") } else { String::new() }
        ),
    )
}

/// Stop the port in an order memif survives: the server stopped polling before it said STOPPED; the client then
/// disconnects (after a grace period), and the server stops its port only once the client is gone.
pub(crate) fn finish_port(s: &mut Setup, client: bool, o: &Opts) -> Result<(), SetupError> {
    if s.memif {
        if client {
            std::thread::sleep(Duration::from_millis(200));
        } else {
            let _ = s.port.wait_peer_gone(Duration::from_secs(o.timeout.min(10)));
        }
    }
    s.port.stop()?;
    Ok(())
}
