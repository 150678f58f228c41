//! Raw mode for the benchmark: the same ports and frame sizes as a RoCE run, but frames are only moved (no
//! engine): `bw` streams frames client -> server for `--seconds`, `rtt` ping-pongs one frame `--iters` times.
//! The frames carry EtherType 0x88B5 (local experimental) and a sequence number; the server counts (bw) or echoes
//! (rtt) them.

use std::time::{Duration, Instant};

use roce_dp::dpdk::signal::stop_requested;
use roce_dp::dpdk::Burst;

use crate::app::rtt_summary;
use crate::oob::Oob;
use crate::{check, finish_port, leak_check, print_port_stats, Opts, Setup, SetupError};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum RawMode {
    Bw,
    Rtt,
}

const ETHERTYPE: [u8; 2] = [0x88, 0xb5];

pub(crate) fn run(o: &Opts, s: &mut Setup, client: bool, mut oob: Oob, mode: RawMode) -> Result<bool, SetupError> {
    let deadline = Instant::now() + Duration::from_secs(o.timeout);
    let size = o.size.clamp(64, u32::from(s.pool.data_room()) - 128) as u16;
    let label = if client { "raw client" } else { "raw server" };
    let mut ok = true;
    let (mut rx, mut tx) = (Burst::new(), Burst::new());
    if client {
        oob.send(&format!("RAW {mode:?} {size}"))?;
        let l = oob.line(deadline)?;
        if l != "READY" {
            return Err(SetupError(format!("out-of-band: expected READY, got {l:?}")));
        }
        let mut seq = 0u64;
        match mode {
            RawMode::Bw => {
                let t0 = Instant::now();
                let end = t0 + Duration::from_secs_f64(o.seconds);
                let mut sent = 0u64;
                let mut n = 0u64;
                loop {
                    n += 1;
                    if n.is_multiple_of(256) && (Instant::now() >= end || stop_requested()) {
                        break;
                    }
                    fill(&mut tx, s, size, &mut seq);
                    sent += s.port.tx_burst(0, &mut tx) as u64;
                }
                let secs = t0.elapsed().as_secs_f64();
                tx.clear();
                oob.send(&format!("DONE {sent}"))?;
                let l = oob.line(deadline)?;
                let got: u64 = l.strip_prefix("STOPPED ").and_then(|v| v.parse().ok()).unwrap_or(0);
                ok &= check(label, got == sent, format!("server received {got} of {sent} frames"));
                let fps = sent as f64 / secs;
                println!(
                    "RESULT raw bw size={size} frames={sent} seconds={secs:.6} fps={fps:.0} mib_s={:.2}",
                    fps * f64::from(size) / 1048576.0
                );
            }
            RawMode::Rtt => {
                // One time per echo, grown as they come (--iters may ask for a billion).
                let mut rtts = Vec::with_capacity(o.iters.min(1 << 20) as usize);
                for _ in 0..o.iters + 1000 {
                    fill_one(&mut tx, s, size, &mut seq);
                    let t = Instant::now();
                    if !send_all(s, &mut tx, deadline) {
                        return Err(SetupError(
                            "raw rtt: the port took no frame before the timeout (peer gone?)".into(),
                        ));
                    }
                    loop {
                        if s.port.rx_burst(0, &mut rx) > 0 {
                            rx.clear();
                            break;
                        }
                        if Instant::now() > deadline || stop_requested() {
                            return Err(SetupError("raw rtt: no echo before the timeout".into()));
                        }
                    }
                    rtts.push(t.elapsed().as_nanos() as u64);
                }
                let (avg, med, p10) = rtt_summary(&rtts, 1000).unwrap_or_default(); // after a warm-up
                let n = rtts.len().saturating_sub(1000);
                oob.send("DONE 0")?;
                let _ = oob.line(deadline)?;
                ok &= check(label, n as u64 == o.iters, format!("{n} echoes"));
                println!("RESULT raw rtt size={size} iters={n} avg_us={avg:.3} median_us={med:.3} p10_us={p10:.3}");
            }
        }
    } else {
        let hello = oob.line(deadline)?;
        if !hello.starts_with("RAW ") {
            return Err(SetupError(format!("out-of-band: expected RAW, got {hello:?}")));
        }
        oob.send("READY")?;
        oob.set_nonblocking(true)?;
        let mut received = 0u64;
        let mut done: Option<(u64, Instant)> = None;
        let mut n = 0u64;
        let mut stuck = false;
        loop {
            n += 1;
            let got = s.port.rx_burst(0, &mut rx);
            received += got as u64;
            if mode == RawMode::Rtt && got > 0 {
                // A client that stopped reading (or went away) must not keep this loop from its deadline.
                if !send_all(s, &mut rx, deadline) {
                    rx.clear();
                    stuck = true;
                    break;
                }
            } else {
                rx.clear();
            }
            if n.is_multiple_of(1024) || (got == 0 && done.is_some()) {
                if done.is_none() {
                    if let Some(l) = oob.try_line()? {
                        let want = l.strip_prefix("DONE ").and_then(|v| v.parse().ok()).unwrap_or(0);
                        done = Some((want, Instant::now()));
                    }
                }
                if let Some((want, at)) = done {
                    if received >= want || at.elapsed() > Duration::from_secs(2) {
                        break;
                    }
                }
                if Instant::now() > deadline || stop_requested() {
                    break;
                }
            }
        }
        oob.send(&format!("STOPPED {received}"))?;
        ok &= check(label, done.is_some(), format!("{received} frames received"));
        if stuck {
            ok &= check(label, false, format!("echoes taken by the port before the timeout ({} s)", o.timeout));
        }
    }
    drop((rx, tx));
    let after = s.pool.in_use();
    if o.stats {
        print_port_stats(label, &s.port);
    }
    finish_port(s, client, o)?;
    ok &= leak_check(label, s, after);
    Ok(ok)
}

/// Transmits every frame of `b`, retrying while the PMD takes none (memif applies back-pressure); false if
/// `deadline` passed first (a peer that stopped reading, or a memif link that went down: its tx takes nothing).
fn send_all(s: &mut Setup, b: &mut Burst, deadline: Instant) -> bool {
    while !b.is_empty() {
        if s.port.tx_burst(0, b) == 0 && (Instant::now() > deadline || stop_requested()) {
            return false;
        }
    }
    true
}

fn header(buf: &mut [u8], s: &Setup, seq: u64) {
    buf[0..6].copy_from_slice(&[0xff; 6]);
    buf[6..12].copy_from_slice(&s.mac.0);
    buf[12..14].copy_from_slice(&ETHERTYPE);
    buf[14..22].copy_from_slice(&seq.to_be_bytes());
}

/// Top the burst up with new frames (bulk allocation; payload bytes are whatever the buffer held: raw mode only
/// moves frames).
fn fill(tx: &mut Burst, s: &Setup, size: u16, seq: &mut u64) {
    if !tx.is_empty() || tx.alloc_bulk(&s.pool) == 0 {
        return;
    }
    for m in tx.as_mut_slice() {
        if let Some(b) = m.append(size) {
            header(b, s, *seq);
            *seq += 1;
        }
    }
}

fn fill_one(tx: &mut Burst, s: &Setup, size: u16, seq: &mut u64) {
    if let Ok(mut m) = s.pool.alloc() {
        if let Some(b) = m.append(size) {
            header(b, s, *seq);
            *seq += 1;
        }
        let _ = tx.push(m);
    }
}
