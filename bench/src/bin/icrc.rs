//! ICRC generation throughput beside plain CRC-32 over the same bytes, and the cost of whole-frame emit/parse.
//!
//! Reproduce: `cargo run --release -p roce-dp-bench --bin icrc`

use roce_dp::wire::{
    emit_frame, icrc, parse_frame, BthRepr, EthRepr, IpAddrs, IpRepr, MacAddr, Opcode, Psn, RoceRepr, ROCE_UDP_PORT,
};
use roce_dp_bench::median;
use std::hint::black_box;
use std::time::Instant;

const RUNS: usize = 41;
/// Bytes hashed per timed run (per size), so every run lasts a few milliseconds at least.
const BYTES_PER_RUN: usize = 16 << 20;

fn repr() -> RoceRepr {
    RoceRepr {
        eth: EthRepr { dst: MacAddr([2, 0, 0, 0, 0, 2]), src: MacAddr([2, 0, 0, 0, 0, 1]), vlan: None },
        ip: IpRepr {
            addrs: IpAddrs::V4 { src: [10, 50, 0, 1], dst: [10, 50, 0, 2] },
            ttl: 64,
            dont_frag: true,
            ..IpRepr::default()
        },
        udp_src: 0xc8a1,
        udp_dst: ROCE_UDP_PORT,
        bth: BthRepr { opcode: Opcode::RC_SEND_ONLY, dest_qp: 0x11, psn: Psn::new(1), ..BthRepr::default() },
        ext: Default::default(),
    }
}

/// Seconds per call of `f`, one run of `iters` calls (after a short warm-up).
fn run(iters: usize, f: &mut dyn FnMut()) -> f64 {
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    t.elapsed().as_secs_f64() / iters as f64
}

/// Median seconds per call of each closure over `RUNS` runs, the closures interleaved run by run so that load from
/// other processes hits them alike.
fn time_all(iters: usize, fs: &mut [&mut dyn FnMut()]) -> Vec<f64> {
    for f in fs.iter_mut() {
        run(iters / 10 + 1, f);
    }
    let mut samples = vec![Vec::with_capacity(RUNS); fs.len()];
    for _ in 0..RUNS {
        for (f, s) in fs.iter_mut().zip(samples.iter_mut()) {
            s.push(run(iters, f));
        }
    }
    samples.iter_mut().map(|s| median(s)).collect()
}

const USAGE: &str = "\
ICRC generation beside plain CRC-32 over the same bytes (64 B, 1 KiB, 4 KiB frames), and emit/parse of whole frames.

Usage: icrc (no arguments)

Reproduce: cargo run --release -p roce-dp-bench --bin icrc";

fn main() {
    roce_dp_bench::check_args("icrc", USAGE, &[]);
    let r = repr();
    let headers = roce_dp::wire::frame_len(&r, 0);
    println!("ICRC generate (icrc::fill: masked pseudo-header + rest, stored in the frame) over IP header .. pad,");
    println!(
        "beside plain crc32fast::hash over the same bytes; interleaved runs, median of {RUNS}, {} MiB per run",
        BYTES_PER_RUN >> 20
    );
    println!();
    println!("| frame (target) | hashed bytes | icrc GB/s | plain crc32 GB/s | icrc/plain time | emit_frame ns | parse_frame ns |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    for target in [64usize, 1024, 4096] {
        // A RoCE frame without FCS is always 2 mod 4 bytes long (14-byte Ethernet header, the rest padded to 4):
        // take the largest one not above the target (62, 1022, 4094).
        let payload = (target - headers) & !3;
        let frame = headers + payload;
        let mut buf = vec![0u8; frame];
        let n = emit_frame(&mut buf, &r, payload, |p| p.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8))
            .expect("emit");
        assert_eq!(n, frame);
        let covered = &buf[14..n - 4];
        assert_eq!(icrc::compute(covered).ok(), Some(u32::from_le_bytes(buf[n - 4..].try_into().unwrap())));
        let iters = BYTES_PER_RUN / covered.len();

        let mut tx = buf[14..n].to_vec();
        let t = time_all(
            iters,
            &mut [
                &mut || {
                    black_box(icrc::fill(black_box(&mut tx)).ok());
                },
                &mut || {
                    black_box(crc32fast::hash(black_box(covered)));
                },
            ],
        );
        let (t_icrc, t_plain) = (t[0], t[1]);
        // Output buffer offset so it does not 4 KiB-alias the source (which slows the payload copy).
        let mut out_alloc = vec![0u8; frame + 256];
        let out = &mut out_alloc[192..];
        let src = &buf[54..54 + payload];
        let t = time_all(
            iters / 4,
            &mut [
                &mut || {
                    black_box(
                        emit_frame(black_box(&mut *out), black_box(&r), payload, |p| p.copy_from_slice(src)).ok(),
                    );
                },
                &mut || {
                    black_box(parse_frame(black_box(&buf)).map(|f| f.icrc_ok).ok());
                },
            ],
        );
        let (t_emit, t_parse) = (t[0], t[1]);
        let gbs = |t: f64| covered.len() as f64 / t / 1e9;
        println!(
            "| {frame} B ({target}) | {} | {:.2} | {:.2} | {:.2} | {:.0} | {:.0} |",
            covered.len(),
            gbs(t_icrc),
            gbs(t_plain),
            t_icrc / t_plain,
            t_emit * 1e9,
            t_parse * 1e9
        );
    }
    println!();
    println!("A RoCE frame (no FCS) is 2 mod 4 bytes long: each row is the largest one not above the target size.");
    println!("emit_frame and parse_frame include the ICRC (emit: all headers + payload copy; parse: every check).");
    println!();
    kernels();
    println!("reproduce: cargo run --release -p roce-dp-bench --bin icrc");
}

/// The CRC-32 kernel the ICRC uses ([`roce_dp::wire::crc`]) beside crc32fast over the same bytes, and the payload
/// copy hashed as it is copied (`crc::update_copy`) beside a copy then crc32fast: a payload of a 64 KiB region
/// (its offset moving by 4 KiB each call, as consecutive frames of a message) into a frame buffer at a frame's
/// payload offset.
fn kernels() {
    println!(
        "CRC-32 kernel (roce_dp::wire::crc, {}) beside crc32fast, same bytes, interleaved runs, median of {RUNS}:",
        if roce_dp::wire::crc::kernel_available() {
            "AVX-512 VPCLMULQDQ on this CPU"
        } else {
            "not available on this CPU: crc32fast"
        }
    );
    println!();
    println!("| bytes | crc32fast GB/s | kernel GB/s | kernel/crc32fast time | memcpy + crc32fast ns | copy hashed ns | ratio |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let region: Vec<u8> = (0..1u32 << 16).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    let mut frames = vec![0u8; 140_000];
    let proto = crc32fast::Hasher::new();
    for n in [256usize, 384, 512, 1024, 2048, 4096, 65536] {
        let data = &region[..n];
        let iters = BYTES_PER_RUN / n;
        let t = time_all(
            iters,
            &mut [
                &mut || {
                    let mut h = proto.clone();
                    h.update(black_box(data));
                    black_box(h.finalize());
                },
                &mut || {
                    black_box(roce_dp::wire::crc::update(0, black_box(data)));
                },
            ],
        );
        let (t_fast, t_kernel) = (t[0], t[1]);
        let (mut at, mut at2) = (0usize, 0usize);
        let step = |at: &mut usize| {
            *at = (*at + 4096) % (region.len() - n + 1);
            *at
        };
        let (fa, fb) = frames.split_at_mut(70_000);
        let t = time_all(
            iters / 2,
            &mut [
                &mut || {
                    let o = step(&mut at);
                    let dst = &mut fa[70..70 + n];
                    dst.copy_from_slice(&region[o..o + n]);
                    let mut h = proto.clone();
                    h.update(dst);
                    black_box(h.finalize());
                },
                &mut || {
                    let o = step(&mut at2);
                    black_box(roce_dp::wire::crc::update_copy(0, &region[o..o + n], &mut fb[70..70 + n]));
                },
            ],
        );
        let (t_copy_then, t_fused) = (t[0], t[1]);
        let gbs = |t: f64| n as f64 / t / 1e9;
        println!(
            "| {n} | {:.1} | {:.1} | {:.2} | {:.0} | {:.0} | {:.2} |",
            gbs(t_fast),
            gbs(t_kernel),
            t_kernel / t_fast,
            t_copy_then * 1e9,
            t_fused * 1e9,
            t_fused / t_copy_then
        );
    }
    println!();
}
