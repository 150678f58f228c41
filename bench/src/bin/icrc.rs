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
    println!("reproduce: cargo run --release -p roce-dp-bench --bin icrc");
}
