//! rdp-sim: runs the roce-dp RC engine between two simulated nodes over a lossy link, in virtual time, and checks
//! every completion and every byte.
//!
//! The last line is always
//! `result: status=ok|FAIL completed=N/N verified_bytes=N retransmits=N naks=N timeouts=N goodput_gbps=X sim_time_us=T`
//! and the exit code is 0 only for status=ok (1 for FAIL, 2 for bad arguments).

use clap::{Parser, ValueEnum};
use roce_dp::sim::{ppm, run_workload, LinkConfig, Sim, SimOp, Workload};
use roce_dp::{Duration, EngineConfig};
use std::process::ExitCode;

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Op {
    Send,
    Write,
    Read,
    Atomic,
}

/// Run RoCEv2 RC traffic between two roce-dp engines over a simulated link (deterministic, seeded).
#[derive(Parser, Debug)]
#[command(name = "rdp-sim", version, about)]
struct Args {
    /// Operation.
    #[arg(long, value_enum, default_value = "write")]
    op: Op,
    /// Message size in bytes (0 ..= 2^31; atomics always 8).
    #[arg(long, default_value_t = 4096)]
    size: u64,
    /// Messages per QP.
    #[arg(long, default_value_t = 1000)]
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
    /// Link rate, Gb/s.
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
    #[arg(long, env = "ROCE_SIM_SEED", default_value_t = 1)]
    seed: u64,
    /// Give up after this much virtual time, ms.
    #[arg(long, default_value_t = 60_000)]
    time_limit_ms: u64,
    /// Print the report as one JSON object (before the result line).
    #[arg(long)]
    json: bool,
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
    if !(a.gbps > 0.0 && a.gbps <= 1600.0) {
        return Err(format!("--gbps {} must be in (0, 1600]", a.gbps));
    }
    if !(0.0..=1e6).contains(&a.delay_us) || !(0.0..=1e6).contains(&a.reorder_us) {
        return Err("--delay-us / --reorder-us must be between 0 and 1e6".into());
    }
    // Keep the simulated memory bounded: every QP holds min(depth, msgs) message slots on each node.
    let slots = u64::from(a.depth.min(a.msgs.max(1)));
    let bytes = a.size.max(8) * slots * u64::from(a.qps) * 2;
    if bytes > 8 << 30 {
        return Err(format!("--size x --depth x --qps needs {} GiB of simulated memory (limit 8)", bytes >> 30));
    }
    Ok(())
}

fn main() -> ExitCode {
    let a = Args::parse();
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
    let l0 = sim.link_stats(0);
    let l1 = sim.link_stats(1);
    let c0 = sim.nodes[0].qp_totals();
    let c1 = sim.nodes[1].qp_totals();
    if a.json {
        println!(
            "{{\"op\":\"{:?}\",\"size\":{},\"msgs\":{},\"qps\":{},\"mtu\":{},\"seed\":{},\"status\":\"{}\",\"completed\":{},\"expected\":{},\"verified_bytes\":{},\"retransmits\":{},\"naks\":{},\"timeouts\":{},\"goodput_gbps\":{:.3},\"sim_time_us\":{},\"frames\":[{},{}],\"lost\":[{},{}],\"duplicated\":[{},{}],\"reordered\":[{},{}],\"corrupted\":[{},{}],\"failure\":{}}}",
            op, a.size, a.msgs, a.qps, a.mtu, a.seed,
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
        println!(
            "rdp-sim: {op:?} {} B x {} msgs x {} QPs, MTU {}, {} Gb/s, {} us one way, seed {}",
            a.size, a.msgs, a.qps, a.mtu, a.gbps, a.delay_us, a.seed
        );
        println!(
            "link  node0->node1: frames={} lost={} dup={} reordered={} corrupted={}",
            l0.frames, l0.lost, l0.duplicated, l0.reordered, l0.corrupted
        );
        println!(
            "link  node1->node0: frames={} lost={} dup={} reordered={} corrupted={}",
            l1.frames, l1.lost, l1.duplicated, l1.reordered, l1.corrupted
        );
        for (n, c) in [(0, c0), (1, c1)] {
            let nz: Vec<String> = c.iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k}={v}")).collect();
            println!("node{n} qp counters: {}", nz.join(" "));
            let e = sim.nodes[n].stats();
            let nz: Vec<String> = e.iter().filter(|(_, v)| *v != 0).map(|(k, v)| format!("{k}={v}")).collect();
            println!("node{n} engine counters: {}", nz.join(" "));
        }
        if let Some(f) = &r.failure {
            println!("failure: {f} (reproduce with --seed {})", a.seed);
        }
    }
    println!("{}", r.result_line());
    if r.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
