//! Engine-only throughput on one core: two roce-dp engines joined by in-memory frame queues, no I/O. Reports
//! messages/s and Gb/s for WRITE, SEND and READ at several message sizes (path MTU 4096), beside memcpy and
//! crc32 throughput measured in the same run as the physical reference; then WRITE with congestion control off
//! against DCQCN on without congestion (the pacer is consulted before every data frame, no CNP ever comes), runs
//! alternated, as the ratio of their message rates.
//!
//! Reproduce: `cargo run --release -p roce-dp-bench --bin engine [-- --quick]`

use roce_dp::engine::MAX_HEADER_BYTES;
use roce_dp::sim::Sim;
use roce_dp::{
    AccessFlags, AckPolicy, CcAlgorithm, CcConfig, CqId, Cqe, Duration, Engine, EngineConfig, Instant, QpAttr, QpCaps,
    QpState, RxMeta, SendWr, Sge, WcStatus, WrOpcode,
};
use roce_dp_bench::median;
use std::hint::black_box;

/// A fixed ring of frame buffers between the two engines (no allocation per frame).
struct Wire {
    bufs: Vec<Vec<u8>>,
    lens: Vec<usize>,
    n: usize,
}

impl Wire {
    fn new(cap: usize) -> Wire {
        Wire { bufs: vec![vec![0u8; 4096 + MAX_HEADER_BYTES]; cap], lens: vec![0; cap], n: 0 }
    }
}

struct Side {
    e: Engine,
    qpn: u32,
    cq: CqId,
    lkey: u32,
    rkey: u32,
}

const VA: u64 = 0x7000_0000;

fn side(n: usize, depth: u32, region: usize, coalesce: bool, cc: CcAlgorithm) -> Side {
    let cfg = EngineConfig {
        cc: CcConfig { algorithm: cc, ..CcConfig::default() },
        local_mac: roce_dp::sim::NODE_MAC[n],
        local_ip: roce_dp::LocalIp { v4: Some(roce_dp::sim::NODE_IP[n]), v6: None },
        max_unacked_psns: 1024,
        ack: if coalesce {
            AckPolicy { max_pkts: 16, max_delay: Duration::from_micros(2) }
        } else {
            AckPolicy::default()
        },
        ..EngineConfig::default()
    };
    let mut e = Engine::new(cfg);
    let pd = e.alloc_pd();
    let cq = e.create_cq(depth * 4).expect("cq");
    let k = e.reg_mr(pd, VA, region, AccessFlags::ALL).expect("mr");
    let caps = QpCaps { max_send_wr: depth, max_recv_wr: depth, ..QpCaps::default() };
    let qpn = e.create_qp(pd, cq, cq, caps).expect("qp");
    Side { e, qpn, cq, lkey: k.lkey, rkey: k.rkey }
}

fn connect(a: &mut Side, b_qpn: u32, peer: usize) {
    let e = &mut a.e;
    e.modify_qp(a.qpn, &QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() })
        .expect("init");
    e.modify_qp(
        a.qpn,
        &QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(4096),
            dest_qpn: Some(b_qpn),
            rq_psn: Some(0),
            max_dest_rd_atomic: Some(16),
            peer: Some(Sim::peer_of(peer)),
            ..QpAttr::default()
        },
    )
    .expect("rtr");
    e.modify_qp(
        a.qpn,
        &QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(0),
            timeout: Some(20),
            max_rd_atomic: Some(16),
            ..QpAttr::default()
        },
    )
    .expect("rts");
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Op {
    Write,
    Send,
    Read,
}

/// Moves every frame one engine has for the other. Returns frames moved.
fn pump(now: Instant, from: &mut Engine, to: &mut Engine, w: &mut Wire) -> usize {
    let mut moved = 0;
    loop {
        w.n = 0;
        while w.n < w.bufs.len() {
            match from.poll_transmit(now, &mut w.bufs[w.n]) {
                Some(len) => {
                    w.lens[w.n] = len;
                    w.n += 1;
                }
                None => break,
            }
        }
        if w.n == 0 {
            return moved;
        }
        for i in 0..w.n {
            to.handle_rx_mut(now, &mut w.bufs[i][..w.lens[i]], RxMeta::default());
        }
        moved += w.n;
    }
}

/// Runs `msgs` messages of `size` bytes; returns (seconds, frames moved).
fn run(op: Op, size: u32, msgs: u64, coalesce: bool, cc: CcAlgorithm) -> (f64, u64) {
    run_depth(op, size, msgs, coalesce, cc, 256)
}

/// [`run`] with `depth` WRs in flight (1: a ping-pong, every WR signaled).
fn run_depth(op: Op, size: u32, msgs: u64, coalesce: bool, cc: CcAlgorithm, depth: u32) -> (f64, u64) {
    let region = (size as usize).max(64);
    let mut a = side(0, depth, region, coalesce, cc);
    let mut b = side(1, depth, region, coalesce, cc);
    let (aq, bq) = (a.qpn, b.qpn);
    connect(&mut a, bq, 1);
    connect(&mut b, aq, 0);
    let mut wire = Wire::new(64);
    let blank = Cqe::EMPTY;
    let mut cqes = [blank; 64];
    let sge_a = Sge { addr: VA, len: size, lkey: a.lkey };
    let sge_b = Sge { addr: VA, len: size, lkey: b.lkey };
    let opcode = match op {
        Op::Write => WrOpcode::RdmaWrite,
        Op::Send => WrOpcode::Send,
        Op::Read => WrOpcode::RdmaRead,
    };
    if op == Op::Send {
        for i in 0..u64::from(depth) {
            b.e.post_recv(b.qpn, i, &[sge_b]).expect("recv");
        }
    }
    let (mut posted, mut done, mut outstanding) = (0u64, 0u64, 0u64);
    let mut frames = 0u64;
    let mut now = Instant::ZERO;
    let t0 = std::time::Instant::now();
    while done < msgs {
        while outstanding < u64::from(depth) && posted < msgs {
            // Signal every 32nd WR (and the last), as perftest's CQ moderation does.
            let mut wr = SendWr::new(posted, opcode).remote(VA, b.rkey);
            wr.signaled = depth == 1 || posted % 32 == 31 || posted + 1 == msgs;
            a.e.post_send(a.qpn, &wr, &[sge_a]).expect("post");
            posted += 1;
            outstanding += 1;
        }
        frames += pump(now, &mut a.e, &mut b.e, &mut wire) as u64;
        frames += pump(now, &mut b.e, &mut a.e, &mut wire) as u64;
        now += Duration::from_nanos(100);
        if b.e.poll_timeout().is_some_and(|t| t <= now) {
            b.e.handle_timeout(now);
        }
        loop {
            let n = a.e.poll_cq(a.cq, &mut cqes);
            if n == 0 {
                break;
            }
            for c in &cqes[..n] {
                assert_eq!(c.status, WcStatus::Success, "{c:?}");
                let k = c.wr_id + 1 - done;
                done += k;
                outstanding -= k;
            }
        }
        if op == Op::Send {
            loop {
                let n = b.e.poll_cq(b.cq, &mut cqes);
                if n == 0 {
                    break;
                }
                for c in &cqes[..n] {
                    assert_eq!(c.status, WcStatus::Success);
                    b.e.post_recv(b.qpn, c.wr_id, &[sge_b]).expect("repost");
                }
            }
        }
    }
    (t0.elapsed().as_secs_f64(), frames)
}

/// Copy throughput of `copy` for `len` bytes whose destination lies `dist` bytes after the source modulo 4 KiB
/// (glibc's `rep movsb` collapses for `dist` in 1..64: see `roce_dp::copy`).
fn copy_gbs(len: usize, dist: usize, copy: fn(&mut [u8], &[u8])) -> f64 {
    let mut buf = vec![7u8; 2 * len + 3 * 4096];
    let page = (buf.as_ptr() as usize).next_multiple_of(4096) - buf.as_ptr() as usize;
    let (a, b) = buf.split_at_mut(page + len.next_multiple_of(4096));
    let src = &a[page..page + len];
    let dst = &mut b[dist..dist + len];
    let reps = (256 << 20) / len;
    let t = std::time::Instant::now();
    for _ in 0..reps {
        copy(black_box(&mut *dst), black_box(src));
    }
    (reps * len) as f64 / t.elapsed().as_secs_f64() / 1e9
}

fn glibc_copy(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

fn crc_gbs(len: usize, crc: fn(&[u8]) -> u32) -> f64 {
    let src = vec![7u8; len];
    let reps = (256 << 20) / len;
    let t = std::time::Instant::now();
    for _ in 0..reps {
        black_box(crc(black_box(&src)));
    }
    (reps * len) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// The CRC-32 the engine's ICRC runs on long frames (`roce_dp::wire::crc`: its own kernel where the CPU has one).
fn kernel_crc(data: &[u8]) -> u32 {
    roce_dp::wire::crc::update(0, data)
}

const USAGE: &str = "\
Engine-only benchmark: two roce-dp engines on one core joined by in-memory queues (no DPDK, no NIC).

Usage: engine [--quick] | engine --one OP SIZE MSGS [--one-lat] [--one-dcqcn]

  (no arguments)        every case: WRITE, SEND, READ at 64 B .. 1 MiB, ACK policies, DCQCN on vs off;
                        messages/s and Gb/s beside memcpy and crc32fast measured in the same run (median of 5)
  --quick               the same, median of 3
  --one OP SIZE MSGS    one run of MSGS messages of SIZE bytes, OP = write, send or read (for profilers)
  --one-lat             with --one: one WR in flight, every WR signaled (the engines' share of a round trip)
  --one-dcqcn           with --one: DCQCN on the QPs (no congestion: what it costs against it off)

Reproduce: cargo run --release -p roce-dp-bench --bin engine [-- ARGS]";

fn main() {
    // `--one OP SIZE MSGS [--one-lat]`: a single run (for profilers such as callgrind); `--one-lat`: depth 1.
    let args = roce_dp_bench::check_args(
        "engine",
        USAGE,
        &[("--one", 3), ("--one-lat", 0), ("--one-dcqcn", 0), ("--quick", 0)],
    );
    if let Some(i) = args.iter().position(|a| a == "--one") {
        let bad = |what: &str, v: &str| -> ! {
            eprintln!(
                "engine: --one {what} {v:?}: expected {} (see --help)",
                if what == "OP" { "write, send or read" } else { "a positive integer" }
            );
            std::process::exit(2)
        };
        let op = match args[i + 1].as_str() {
            "send" => Op::Send,
            "read" => Op::Read,
            "write" => Op::Write,
            v => bad("OP", v),
        };
        let size: u32 = args[i + 2].parse().unwrap_or_else(|_| bad("SIZE", &args[i + 2]));
        let msgs: u64 = args[i + 3].parse().ok().filter(|&n| n > 0).unwrap_or_else(|| bad("MSGS", &args[i + 3]));
        // `--one-lat`: one WR in flight (the engines' share of a ping-pong round trip).
        let depth = if args.iter().any(|a| a == "--one-lat") { 1 } else { 256 };
        let dcqcn = args.iter().any(|a| a == "--one-dcqcn");
        let cc = if dcqcn { CcAlgorithm::Dcqcn } else { CcAlgorithm::LineRate };
        let (secs, frames) = run_depth(op, size, msgs, false, cc, depth);
        println!("{op:?} {size} B x {msgs}: {:.3} Mmsg/s, {frames} frames", msgs as f64 / secs / 1e6);
        return;
    }
    let quick = args.iter().any(|a| a == "--quick");
    let runs = if quick { 3 } else { 5 };
    let sizes: [u32; 5] = [64, 1024, 4096, 65536, 1 << 20];
    println!("Engine-only, one core, two engines joined by in-memory queues, path MTU 4096, SQ depth 256,");
    println!("every 32nd WR signaled; median of {runs} runs. Reference: memcpy / crc32fast over 4 KiB, same run.");
    // Distances: 198 B is where a DPDK mbuf's payload lies from a page-aligned region (headroom 128 + 70 B of
    // headers), 16 B is inside glibc's slow window.
    let mut g198 = Vec::new();
    let mut g16 = Vec::new();
    let mut v16 = Vec::new();
    let mut c198 = Vec::new();
    let mut cr = Vec::new();
    let mut ck = Vec::new();
    for _ in 0..runs {
        g198.push(copy_gbs(4096, 198, glibc_copy));
        g16.push(copy_gbs(4096, 16, glibc_copy));
        v16.push(copy_gbs(4096, 16, roce_dp::copy::copy_bytes));
        c198.push(copy_gbs(4096, 198, roce_dp::copy::copy_bytes));
        cr.push(crc_gbs(4096, crc32fast::hash));
        ck.push(crc_gbs(4096, kernel_crc));
    }
    let (g198, g16, v16, mc, cr, ck) =
        (median(&mut g198), median(&mut g16), median(&mut v16), median(&mut c198), median(&mut cr), median(&mut ck));
    println!(
        "reference (4 KiB): memcpy {mc:.1} GB/s (roce_dp::copy at 198 B from the source mod 4 KiB: glibc {g198:.1};"
    );
    println!("                   at 16 B, glibc's slow window: glibc {g16:.1}, roce_dp::copy's loop {v16:.1}),");
    println!(
        "                   crc32fast {cr:.1} GB/s, roce_dp::wire::crc {ck:.1} GB/s ({})\n",
        if roce_dp::wire::crc::kernel_available() { "its AVX-512 kernel" } else { "crc32fast on this CPU" }
    );
    println!("| op | size | ACK policy | Mmsg/s | Gb/s | frames/msg | Gb/s / memcpy Gb/s |");
    println!("|---|---:|---|---:|---:|---:|---:|");
    for op in [Op::Write, Op::Send, Op::Read] {
        for &size in &sizes {
            for coalesce in [false, true] {
                if coalesce && size > 4096 {
                    continue;
                }
                let total_bytes: u64 = if quick { 64 << 20 } else { 256 << 20 };
                let msgs = (total_bytes / u64::from(size)).clamp(2_000, 2_000_000);
                let msgs = if quick { msgs.min(300_000) } else { msgs };
                let mut rates = Vec::new();
                let mut fpm = 0.0;
                for _ in 0..runs {
                    let (secs, frames) = run(op, size, msgs, coalesce, CcAlgorithm::LineRate);
                    rates.push(msgs as f64 / secs);
                    fpm = frames as f64 / msgs as f64;
                }
                let r = median(&mut rates);
                let gbps = r * f64::from(size) * 8.0 / 1e9;
                println!(
                    "| {op:?} | {size} | {} | {:.2} | {:.1} | {:.2} | {:.2} |",
                    if coalesce { "coalesce 16/2us" } else { "every AckReq" },
                    r / 1e6,
                    gbps,
                    fpm,
                    gbps / (mc * 8.0)
                );
            }
        }
    }
    // Congestion control off against DCQCN without congestion, alternated so load changes hit both alike.
    println!("\n| WRITE size | CC off Mmsg/s | DCQCN on, no congestion, Mmsg/s | DCQCN / off |");
    println!("|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    for size in [64u32, 4096] {
        let msgs: u64 = if quick { 200_000 } else { 1_000_000 };
        let (mut off, mut on) = (Vec::new(), Vec::new());
        for _ in 0..runs {
            off.push(msgs as f64 / run(Op::Write, size, msgs, false, CcAlgorithm::LineRate).0);
            on.push(msgs as f64 / run(Op::Write, size, msgs, false, CcAlgorithm::Dcqcn).0);
        }
        let (off, on) = (median(&mut off), median(&mut on));
        println!("| {size} | {:.3} | {:.3} | {:.3} |", off / 1e6, on / 1e6, on / off);
        ratios.push(on / off);
    }
    println!("bench: cc_dcqcn_vs_off_64={:.3} cc_dcqcn_vs_off_4k={:.3}", ratios[0], ratios[1]);
    println!("\nreproduce: cargo run --release -p roce-dp-bench --bin engine");
}
