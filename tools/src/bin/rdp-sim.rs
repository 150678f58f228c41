//! rdp-sim: runs the roce-dp RC engine between two simulated nodes over a lossy link, in virtual time, and checks
//! every completion and every byte.
//!
//! The last line is always
//! `result: status=ok|FAIL completed=N/N verified_bytes=N retransmits=N naks=N timeouts=N goodput_gbps=X sim_time_us=T`
//! and the exit code is 0 only for status=ok (1 for FAIL, 2 for bad arguments).
//!
//! With `--incast N` it runs the N:1 incast instead (N senders -> one switch queue with RED/ECN -> one receiver,
//! DCQCN on or off) and prints per-flow throughput, Jain fairness, link utilisation, queue, CNPs and drops; the
//! last line is then
//! `result: status=ok|FAIL flows=N jain=J util=U max_queue_kb=Q cnps=C drops=D`
//! where status=FAIL means a work request failed or the simulation stalled (drops and unfairness are reported,
//! not judged). `--trace FILE.csv` writes `time_us,flow,rate_gbps,goodput_gbps,queue_kb` per flow per sample;
//! `--plot FILE.svg` draws the rates and the queue over time.

use clap::{Parser, ValueEnum};
use roce_dp::sim::incast::{Incast, IncastConfig};
use roce_dp::sim::{ppm, run_workload, LinkConfig, Sim, SimOp, Workload};
use roce_dp::{CcAlgorithm, CcConfig, DcqcnConfig, Duration, EngineConfig};
use roce_dp_tools::incast::{plot_svg, trace_csv};
use roce_dp_tools::outln;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum OnOff {
    On,
    Off,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Preset {
    /// The ConnectX firmware defaults (DcqcnConfig::default).
    Connectx,
    /// ConnectX defaults with rp_dce_tcp_g = 1022, for a fabric without PFC (DcqcnConfig::connectx_lossy).
    ConnectxLossy,
    /// ns3-rdma sample timing with a 10 us CNP interval (DcqcnConfig::ns3_sample).
    Ns3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum MarkOn {
    Dequeue,
    Enqueue,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Op {
    Send,
    Write,
    Read,
    Atomic,
}

/// Run RoCEv2 RC traffic between two roce-dp engines over a simulated link (deterministic, seeded).
#[derive(Parser, Debug)]
#[command(name = "rdp-sim", version, allow_negative_numbers = true)]
struct Args {
    /// Operation.
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    /// Message size in bytes (0 ..= 2^31; atomics always 8).
    #[arg(long, default_value_t = 4096, value_parser = roce_dp_tools::whole_arg::<0, { u64::MAX }>)]
    size: u64,
    /// Messages per QP (at least 1: a run of none would prove nothing).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..))]
    msgs: u32,
    /// QP pairs.
    #[arg(long, default_value_t = 1)]
    qps: u32,
    /// Path MTU: 256, 512, 1024, 2048 or 4096.
    #[arg(long, default_value_t = 1024)]
    mtu: u32,
    /// Outstanding WRs per QP.
    #[arg(long, default_value_t = 16)]
    depth: u32,
    /// Loss probability per frame (0..1).
    #[arg(long, default_value_t = 0.0)]
    loss: f64,
    /// Duplication probability per frame (0..1).
    #[arg(long, default_value_t = 0.0)]
    dup: f64,
    /// Reordering probability per frame (0..1): the frame is held back up to --reorder-us.
    #[arg(long, default_value_t = 0.0)]
    reorder: f64,
    /// Largest extra delay of a reordered frame, µs.
    #[arg(long, default_value_t = 5.0)]
    reorder_us: f64,
    /// Corruption probability per frame (0..1): one bit flipped.
    #[arg(long, default_value_t = 0.0)]
    corrupt: f64,
    /// One-way propagation delay, µs.
    #[arg(long, default_value_t = 2.0)]
    delay_us: f64,
    /// Link rate, Gb/s (0.001 ..= 1600).
    #[arg(long, default_value_t = 100.0)]
    gbps: f64,
    /// Local ACK timeout exponent (4.096 µs * 2^t).
    #[arg(long, default_value_t = 8)]
    timeout: u8,
    /// Transport retry count (0..=7).
    #[arg(long, default_value_t = 7)]
    retry_cnt: u8,
    /// Connect over IPv6 GIDs (2001:db8::1 and ::2) instead of IPv4.
    #[arg(long)]
    ipv6: bool,
    /// Retry forever at --retry-cnt 7, as Linux rxe does (the IBA counts 7 retries).
    #[arg(long)]
    rxe_retry: bool,
    /// RNG seed (the same seed gives the same run). Also read from ROCE_SIM_SEED.
    #[arg(long, env = "ROCE_SIM_SEED", default_value_t = 1, value_parser = roce_dp_tools::whole_arg::<0, { u64::MAX }>)]
    seed: u64,
    /// Give up after this much virtual time, ms.
    #[arg(long, default_value_t = 60_000, value_parser = roce_dp_tools::whole_arg::<1, { u64::MAX }>)]
    time_limit_ms: u64,
    /// Give up after this many frames on the two links (retransmissions included): bounds the real time of a run
    /// (~4 million frames a second). A run whose messages alone need more is refused before it starts.
    #[arg(long, default_value_t = 100_000_000, value_parser = roce_dp_tools::whole_arg::<1, { u64::MAX }>)]
    frame_limit: u64,
    /// Print the report as one JSON object (before the result line).
    #[arg(long)]
    json: bool,

    /// Run an N:1 incast (N senders, one switch, one receiver) instead of the two-node workload.
    #[arg(long, value_name = "N", help_heading = "Incast")]
    incast: Option<u32>,
    /// Incast: rate of every link, Gb/s (0.001 ..= 1600).
    #[arg(long, default_value_t = 25.0, help_heading = "Incast")]
    link_gbps: f64,
    /// Incast: virtual time to run, ms (at most 10000, and --incast x --duration-ms at most 50000, which bounds the
    /// real time of a run to a few minutes).
    #[arg(long, default_value_t = 20.0, help_heading = "Incast")]
    duration_ms: f64,
    /// Incast: measure throughput, fairness and utilisation from this time on, ms (default: half the duration).
    #[arg(long, help_heading = "Incast")]
    measure_from_ms: Option<f64>,
    /// Incast: DCQCN on the senders (off: line rate, CNPs ignored).
    #[arg(long, value_enum, default_value = "on", help_heading = "Incast")]
    dcqcn: OnOff,
    /// Incast: DCQCN parameter set when no --cc-config is given.
    #[arg(long, value_enum, default_value = "connectx", help_heading = "Incast")]
    dcqcn_preset: Preset,
    /// Incast: congestion-control parameters from a TOML file (ConnectX rp_*/np_* names; see conf/dcqcn.toml).
    #[arg(long, value_name = "FILE.toml", help_heading = "Incast")]
    cc_config: Option<PathBuf>,
    /// Incast: RED Kmin, KiB (no marking at or below).
    #[arg(long, default_value_t = 20.0, help_heading = "Incast")]
    kmin_kb: f64,
    /// Incast: RED Kmax, KiB (every frame marked above).
    #[arg(long, default_value_t = 200.0, help_heading = "Incast")]
    kmax_kb: f64,
    /// Incast: RED marking probability at Kmax (0..1).
    #[arg(long, default_value_t = 0.1, help_heading = "Incast")]
    pmax: f64,
    /// Incast: switch buffer for the egress queue, KiB (tail drop beyond).
    #[arg(long, default_value_t = 1024.0, help_heading = "Incast")]
    buffer_kb: f64,
    /// Incast: decide ECN marking when a frame leaves the queue or when it enters.
    #[arg(long, value_enum, default_value = "dequeue", help_heading = "Incast")]
    mark_on: MarkOn,
    /// Incast: one-way propagation delay of each hop, µs.
    #[arg(long, default_value_t = 1.0, help_heading = "Incast")]
    hop_delay_us: f64,
    /// Incast: trace sample period, µs (0.001 ..= 1e6; at most 10 million samples of all flows in a run).
    #[arg(long, default_value_t = 10.0, help_heading = "Incast")]
    sample_us: f64,
    /// Incast: write per-flow rate, goodput and queue depth over time as CSV.
    #[arg(long, value_name = "FILE.csv", help_heading = "Incast")]
    trace: Option<PathBuf>,
    /// Incast: draw the rates and the queue over time as SVG.
    #[arg(long, value_name = "FILE.svg", help_heading = "Incast")]
    plot: Option<PathBuf>,
}

/// The most flow-milliseconds (--incast x --duration-ms) an incast run simulates.
const MAX_FLOW_MS: f64 = 50_000.0;
/// The most trace samples (flows x samples) an incast run keeps.
const MAX_TRACE_ROWS: f64 = 10_000_000.0;
/// Work-queue state per --depth entry of one QP pair (send and receive queues on both nodes; measured ~470 B).
const WQ_BYTES_PER_DEPTH: u64 = 512;
/// The rest of one QP pair's state (measured ~16 KiB).
const QP_PAIR_BYTES: u64 = 32 << 10;
/// The most payload bytes (--size x --msgs x --qps) a two-node run moves and verifies.
const MAX_PAYLOAD: u64 = 16 << 30;
/// The longest --cc-config file read.
const MAX_CC_CONFIG: u64 = 1 << 20;

/// Reads a congestion-control configuration from TOML; unknown keys and bad values are errors naming the key.
fn read_cc_config(path: &PathBuf) -> Result<CcConfig, String> {
    // At most 1 MiB: the file is a few hundred bytes, and reading a device such as /dev/zero to its end would take
    // all the memory there is.
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| std::io::Read::read_to_string(&mut std::io::Read::take(f, MAX_CC_CONFIG + 1), &mut text))
        .map_err(|e| format!("--cc-config {}: {e}", path.display()))?;
    if text.len() as u64 > MAX_CC_CONFIG {
        return Err(format!(
            "--cc-config {}: longer than {MAX_CC_CONFIG} bytes: not a congestion-control file",
            path.display()
        ));
    }
    let cfg: CcConfig = toml::from_str(&text)
        .map_err(|e| format!("--cc-config {}: {}", path.display(), roce_dp::config::toml_error(&text, &e)))?;
    cfg.validate().map_err(|e| format!("--cc-config {}: {e}", path.display()))?;
    Ok(cfg)
}

fn incast_config(a: &Args, n: u32) -> Result<IncastConfig, String> {
    if n == 0 || n > 1000 {
        return Err(format!("--incast {n} must be 1..=1000"));
    }
    // Below 1 Mb/s (0.001 Gb/s) the simulator would run at 1 Mb/s while the report said otherwise.
    if !(a.link_gbps >= 0.001 && a.link_gbps <= 1600.0) {
        return Err(format!("--link-gbps {} must be in [0.001, 1600]", a.link_gbps));
    }
    if !(a.duration_ms > 0.0 && a.duration_ms <= 10_000.0) {
        return Err(format!("--duration-ms {} must be in (0, 10000]", a.duration_ms));
    }
    // Real time grows with flows x virtual time (every event visits every flow): 1000 flows for 10 s would run
    // for hours.
    let flow_ms = f64::from(n) * a.duration_ms;
    if flow_ms > MAX_FLOW_MS {
        return Err(format!(
            "--incast {n} x --duration-ms {} = {flow_ms} flow-milliseconds to simulate (limit {MAX_FLOW_MS})",
            a.duration_ms
        ));
    }
    let measure = a.measure_from_ms.unwrap_or(a.duration_ms / 2.0);
    if !(measure >= 0.0 && measure < a.duration_ms) {
        return Err(format!("--measure-from-ms {measure} must be in [0, --duration-ms)"));
    }
    if !(0.0..=1.0).contains(&a.pmax) {
        return Err(format!("--pmax {} is not a probability in 0..1", a.pmax));
    }
    if !(a.kmin_kb >= 0.0 && a.kmax_kb >= a.kmin_kb && a.buffer_kb > 0.0 && a.buffer_kb < 1e9) {
        return Err("need 0 <= --kmin-kb <= --kmax-kb and --buffer-kb > 0".into());
    }
    // Below 1 ns the sample period would round to 0, which samples nothing.
    let sample_ok = a.sample_us >= 0.001 && a.sample_us <= 1e6;
    if !(0.0..=1e6).contains(&a.hop_delay_us) || !sample_ok {
        return Err("--hop-delay-us must be in [0, 1e6] and --sample-us in [0.001, 1e6]".into());
    }
    // Every sample holds a row per flow in memory (and in --trace): bounded, or a small --sample-us exhausts it.
    let rows = f64::from(n) * ((a.duration_ms * 1e3 / a.sample_us).floor() + 1.0);
    if rows > MAX_TRACE_ROWS {
        return Err(format!(
            "--incast {n} x (--duration-ms {} / --sample-us {}) = {rows} trace samples (limit {MAX_TRACE_ROWS}): \
             raise --sample-us",
            a.duration_ms, a.sample_us
        ));
    }
    let mut cc = match &a.cc_config {
        Some(p) => read_cc_config(p)?,
        None => CcConfig {
            dcqcn: match a.dcqcn_preset {
                Preset::Connectx => DcqcnConfig::default(),
                Preset::ConnectxLossy => DcqcnConfig::connectx_lossy(),
                Preset::Ns3 => DcqcnConfig::ns3_sample(),
            },
            ..CcConfig::default()
        },
    };
    cc.algorithm = if a.dcqcn == OnOff::On { CcAlgorithm::Dcqcn } else { CcAlgorithm::LineRate };
    let ms = |v: f64| Duration::from_nanos((v * 1e6).round() as u64);
    let us = |v: f64| Duration::from_nanos((v * 1e3).round() as u64);
    let kib = |v: f64| (v * 1024.0).round() as u64;
    Ok(IncastConfig {
        senders: n,
        link_mbps: (a.link_gbps * 1000.0).round().max(1.0) as u64,
        hop_delay: us(a.hop_delay_us),
        kmin_bytes: kib(a.kmin_kb),
        kmax_bytes: kib(a.kmax_kb),
        pmax_ppm: ppm(a.pmax),
        buffer_bytes: kib(a.buffer_kb),
        mark_on_dequeue: a.mark_on == MarkOn::Dequeue,
        duration: ms(a.duration_ms),
        measure_from: ms(measure),
        cc,
        sample_every: us(a.sample_us),
        seed: a.seed,
        ..IncastConfig::default()
    })
}

fn run_incast(a: &Args, n: u32) -> ExitCode {
    let cfg = match incast_config(a, n) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("rdp-sim: {e}");
            return ExitCode::from(2);
        }
    };
    if a.trace.is_some() && a.trace == a.plot {
        eprintln!("rdp-sim: --trace and --plot name the same file: the plot would overwrite the trace");
        return ExitCode::from(2);
    }
    // An output file that cannot be created fails now, not after the whole run.
    for (flag, p) in [("--trace", &a.trace), ("--plot", &a.plot)] {
        if let Some(p) = p {
            if let Err(e) = std::fs::File::create(p) {
                eprintln!("rdp-sim: {flag} {}: {e}", p.display());
                return ExitCode::from(2);
            }
        }
    }
    let (sample_ns, buffer_kb) = (cfg.sample_every.as_nanos(), a.buffer_kb);
    let d = &cfg.cc.dcqcn;
    outln!(
        "rdp-sim: incast {n}:1 at {} Gb/s, {} ms, DCQCN {}, RED Kmin {} KiB Kmax {} KiB Pmax {} ({}), buffer {} KiB, seed {}",
        a.link_gbps,
        a.duration_ms,
        if a.dcqcn == OnOff::On { "on" } else { "off" },
        a.kmin_kb,
        a.kmax_kb,
        a.pmax,
        if cfg.mark_on_dequeue { "on dequeue" } else { "on enqueue" },
        a.buffer_kb,
        a.seed
    );
    outln!("dcqcn: {d:?}");
    let measure_ms = cfg.measure_from.as_nanos() as f64 / 1e6;
    let inc = match Incast::new(cfg) {
        Ok(i) => i,
        Err(e) => {
            eprintln!("rdp-sim: {e}");
            return ExitCode::from(2);
        }
    };
    let r = inc.run();
    for (i, f) in r.flows.iter().enumerate() {
        outln!(
            "flow {i}: goodput_gbps={:.3} completed={} cnps_rcvd={} rate_decreases={} rate_gbps_min={:.3} rate_gbps_max={:.3} retransmits={}",
            f.goodput_gbps,
            f.completed,
            f.cnps_rcvd,
            f.rate_decreases,
            f.min_rate_kbps as f64 / 1e6,
            f.max_rate_kbps as f64 / 1e6,
            f.retransmits
        );
    }
    outln!(
        "after {measure_ms} ms: jain={:.4} util={:.4} drops={}; switch: max_queue_kb={:.1} mean_queue_kb={:.1} marked={} drops={}; receiver: cnps_sent={}",
        r.jain,
        r.util,
        r.window_drops,
        r.max_queue_bytes as f64 / 1024.0,
        r.mean_queue_bytes / 1024.0,
        r.marked,
        r.drops,
        r.cnps_sent
    );
    if let Some(f) = &r.failure {
        outln!("failure: {f} (reproduce with --seed {})", a.seed);
    }
    let mut io_ok = true;
    if let Some(p) = &a.trace {
        if let Err(e) = std::fs::write(p, trace_csv(&r.trace, sample_ns)) {
            eprintln!("rdp-sim: --trace {}: {e}", p.display());
            io_ok = false;
        }
    }
    if let Some(p) = &a.plot {
        let title = format!("rdp-sim --incast {n} --link-gbps {} --dcqcn {:?}", a.link_gbps, a.dcqcn).to_lowercase();
        if let Err(e) = std::fs::write(p, plot_svg(&r, a.link_gbps, buffer_kb, &title)) {
            eprintln!("rdp-sim: --plot {}: {e}", p.display());
            io_ok = false;
        }
    }
    outln!("{}", r.result_line());
    if !io_ok {
        ExitCode::from(2)
    } else if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn check(a: &Args) -> Result<(), String> {
    let prob = |name: &str, v: f64| {
        if (0.0..=1.0).contains(&v) {
            Ok(())
        } else {
            Err(format!("--{name} {v} is not a probability in 0..1"))
        }
    };
    prob("loss", a.loss)?;
    prob("dup", a.dup)?;
    prob("reorder", a.reorder)?;
    prob("corrupt", a.corrupt)?;
    if !roce_dp::qp::PATH_MTUS.contains(&a.mtu) {
        return Err(format!("--mtu {} is not one of 256, 512, 1024, 2048, 4096", a.mtu));
    }
    if a.size > roce_dp::qp::MAX_MSG_LEN {
        return Err(format!("--size {} exceeds the 2^31-byte message limit", a.size));
    }
    if a.qps == 0 || a.qps > 16_384 {
        return Err(format!("--qps {} must be 1..=16384", a.qps));
    }
    if a.depth == 0 || a.depth > 4096 {
        return Err(format!("--depth {} must be 1..=4096", a.depth));
    }
    if a.timeout > 31 || a.timeout == 0 {
        return Err(format!("--timeout {} must be 1..=31", a.timeout));
    }
    if a.retry_cnt > 7 {
        return Err(format!("--retry-cnt {} must be 0..=7", a.retry_cnt));
    }
    if !(a.gbps >= 0.001 && a.gbps <= 1600.0) {
        return Err(format!("--gbps {} must be in [0.001, 1600]", a.gbps));
    }
    if !(0.0..=1e6).contains(&a.delay_us) || !(0.0..=1e6).contains(&a.reorder_us) {
        return Err("--delay-us / --reorder-us must be between 0 and 1e6".into());
    }
    // Keep the simulated memory bounded: every QP holds min(depth, msgs) message slots on each node, and each QP
    // pair its work queues (--depth entries, send and receive, on both nodes) and its other state.
    let slots = u64::from(a.depth.min(a.msgs.max(1)));
    let per_pair = a.size.max(8) * slots * 2 + u64::from(a.depth) * WQ_BYTES_PER_DEPTH + QP_PAIR_BYTES;
    let bytes = per_pair * u64::from(a.qps);
    if bytes > 8 << 30 {
        return Err(format!(
            "--qps x (--size x --depth + --depth work-queue entries) needs {} GiB of simulated memory (limit 8)",
            bytes.div_ceil(1 << 30)
        ));
    }
    // Keep the real time bounded: every payload byte is written and checked, ~250 MB/s, and every frame costs
    // ~250 ns (retransmissions are bounded by --frame-limit while the run goes).
    let msgs = u64::from(a.msgs) * u64::from(a.qps);
    let size = if matches!(a.op, Op::Atomic) { 8 } else { a.size };
    if size.saturating_mul(msgs) > MAX_PAYLOAD {
        return Err(format!(
            "--size {size} x --msgs {} x --qps {} = {} GiB of payload to move and verify (limit {} GiB)",
            a.msgs,
            a.qps,
            size.saturating_mul(msgs) >> 30,
            MAX_PAYLOAD >> 30
        ));
    }
    let frames = msgs.saturating_mul(size.div_ceil(u64::from(a.mtu)).max(1));
    if frames > a.frame_limit {
        return Err(format!(
            "--msgs {} x --qps {} x {} frame(s) per message = {frames} frames, more than --frame-limit {}",
            a.msgs,
            a.qps,
            frames / msgs,
            a.frame_limit
        ));
    }
    Ok(())
}

/// A flag given on the command line that the run would ignore, so that it would not be the run asked for: one of
/// the mode not running (`--incast 8 --loss 0.1` has no loss; `--link-gbps 25` without --incast runs at --gbps),
/// or --dcqcn-preset beside --cc-config.
fn ignored_flags(a: &Args, m: &clap::ArgMatches) -> Result<(), String> {
    use clap::CommandFactory;
    for arg in Args::command().get_arguments() {
        let id = arg.get_id().as_str();
        if id == "incast" || id == "seed" || m.value_source(id) != Some(clap::parser::ValueSource::CommandLine) {
            continue;
        }
        let name = arg.get_long().unwrap_or(id);
        match (a.incast.is_some(), arg.get_help_heading() == Some("Incast")) {
            (true, false) => return Err(format!("--{name} applies to the two-node run, not to --incast")),
            (false, true) => return Err(format!("--{name} applies to the incast only: add --incast N")),
            _ => {}
        }
    }
    // Both name the DCQCN parameter set; the file would win without a word.
    if a.cc_config.is_some() && m.value_source("dcqcn_preset") == Some(clap::parser::ValueSource::CommandLine) {
        return Err("--dcqcn-preset and --cc-config both give the DCQCN parameters: give one of them".into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let (a, m): (Args, _) = match roce_dp_tools::parse_cli_matches("rdp-sim") {
        Ok(a) => a,
        Err(code) => return code,
    };
    if let Err(e) = ignored_flags(&a, &m) {
        eprintln!("rdp-sim: {e}");
        return ExitCode::from(2);
    }
    if let Some(n) = a.incast {
        return run_incast(&a, n);
    }
    if let Err(e) = check(&a) {
        eprintln!("rdp-sim: {e}");
        return ExitCode::from(2);
    }
    let link = LinkConfig {
        delay: Duration::from_nanos((a.delay_us * 1000.0).round() as u64),
        mbps: (a.gbps * 1000.0).round().max(1.0) as u64,
        loss_ppm: ppm(a.loss),
        dup_ppm: ppm(a.dup),
        reorder_ppm: ppm(a.reorder),
        reorder_window: Duration::from_nanos((a.reorder_us * 1000.0).round() as u64),
        corrupt_ppm: ppm(a.corrupt),
    };
    let op = match a.op {
        Op::Send => SimOp::Send,
        Op::Write => SimOp::Write,
        Op::Read => SimOp::Read,
        Op::Atomic => SimOp::Atomic,
    };
    let w = Workload {
        op,
        size: a.size as u32,
        msgs: a.msgs,
        qps: a.qps,
        mtu: a.mtu,
        depth: a.depth,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        time_limit: Duration::from_millis(a.time_limit_ms),
        frame_limit: a.frame_limit,
        ipv6: a.ipv6,
    };
    let n = a.qps.max(1024);
    let cfg = EngineConfig {
        retry_cnt_7_infinite: a.rxe_retry,
        max_qps: n,
        max_cqs: n,
        max_mrs: 2 * n,
        ..EngineConfig::default()
    };
    let mut sim = Sim::new(cfg, [link, link], a.seed);
    let r = run_workload(&mut sim, &w);
    // What each message moves: an atomic's 8 bytes whatever --size says (the report said "Atomic 4096 B", the
    // default --size, of 8-byte operations).
    let size = if matches!(a.op, Op::Atomic) { 8 } else { a.size };
    let l0 = sim.link_stats(0);
    let l1 = sim.link_stats(1);
    let c0 = sim.nodes[0].qp_totals();
    let c1 = sim.nodes[1].qp_totals();
    if a.json {
        outln!(
            "{{\"op\":\"{:?}\",\"size\":{},\"msgs\":{},\"qps\":{},\"mtu\":{},\"seed\":{},\"status\":\"{}\",\"completed\":{},\"expected\":{},\"verified_bytes\":{},\"retransmits\":{},\"naks\":{},\"timeouts\":{},\"goodput_gbps\":{:.3},\"sim_time_us\":{},\"frames\":[{},{}],\"lost\":[{},{}],\"duplicated\":[{},{}],\"reordered\":[{},{}],\"corrupted\":[{},{}],\"failure\":{}}}",
            op, size, a.msgs, a.qps, a.mtu, a.seed,
            if r.ok { "ok" } else { "FAIL" },
            r.completed, r.expected, r.verified_bytes, r.retransmits, r.naks, r.timeouts, r.goodput_gbps, r.sim_time_us,
            l0.frames, l1.frames, l0.lost, l1.lost, l0.duplicated, l1.duplicated, l0.reordered, l1.reordered,
            l0.corrupted, l1.corrupted,
            match &r.failure {
                Some(f) => format!("\"{}\"", f.replace('\\', "\\\\").replace('"', "\\\"")),
                None => "null".into(),
            }
        );
    } else {
        outln!(
            "rdp-sim: {op:?} {} B x {} msgs x {} QPs, MTU {}, {} Gb/s, {} us one way, seed {}",
            size,
            a.msgs,
            a.qps,
            a.mtu,
            a.gbps,
            a.delay_us,
            a.seed
        );
        outln!(
            "link  node0->node1: frames={} lost={} dup={} reordered={} corrupted={}",
            l0.frames,
            l0.lost,
            l0.duplicated,
            l0.reordered,
            l0.corrupted
        );
        outln!(
            "link  node1->node0: frames={} lost={} dup={} reordered={} corrupted={}",
            l1.frames,
            l1.lost,
            l1.duplicated,
            l1.reordered,
            l1.corrupted
        );
        for (n, c) in [(0, c0), (1, c1)] {
            let nz: Vec<String> = c.iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k}={v}")).collect();
            outln!("node{n} qp counters: {}", nz.join(" "));
            let e = sim.nodes[n].stats();
            let nz: Vec<String> = e.iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k}={v}")).collect();
            outln!("node{n} engine counters: {}", nz.join(" "));
        }
        if let Some(f) = &r.failure {
            outln!("failure: {f} (reproduce with --seed {})", a.seed);
        }
    }
    outln!("{}", r.result_line());
    if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
