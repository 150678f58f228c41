//! The appliance's cost: the roce-dp engine driven through `roce-dpd`'s path (client library posting into the
//! shared QP ring, the worker polling the rings into the engine and the engine's completions into the shared CQ
//! ring, the client polling it) against the same engine embedded in the application (post_send and poll_cq on the
//! engine in the application's thread), in the same run, with the same message sizes. Both run on a loopback port
//! (`roce_dp::ctrl::loopback`: every frame the engine sends comes back into it, so one engine plays requester and
//! responder), so no DPDK is involved and the difference is the appliance's: the rings, the worker's polling, the
//! WQE validation, the shared-memory copies and the core crossing between client and worker.
//!
//! - post -> completion: one signaled 64 B WRITE in flight, nanoseconds from post to its completion polled.
//! - WRITE bandwidth: 4 KiB and 64 KiB WRITEs, 32 in flight (every 8th signaled), MiB/s.
//!
//! The daemon's worker busy-polls on its own thread (the client polls on the main thread): two cores busy, as with
//! `roce-dpd` and an application. It exists only while its case runs, so it never competes with the embedded runs.
//! Ratio = daemon throughput / embedded throughput (for the latency, embedded ns / daemon ns); the target is >= 0.9.
//! Medians of `--runs N` (default 5) alternating rounds.
//!
//! Reproduce: `flock /tmp/roce-dp-busy.lock cargo run --release -p roce-dp-bench --bin daemon [-- --runs N]`.
//! For profilers: `--only embedded|daemon|stepped` runs one path's post -> completion loop, and with `--bw SIZE`
//! its bandwidth loop instead (64 MiB of SIZE-byte WRITEs), e.g.
//! `valgrind --tool=callgrind target/release/daemon --only stepped --bw 4096`.

use std::time::Instant;

use roce_dp::ctrl::loopback::{self, LoopPair, LoopbackConfig, LoopbackDaemon, PumpStats, Stepper};
use roce_dp::{AccessFlags, Cqe, Engine, QpAttr, QpCaps, QpState, SendWr, Sge, WcStatus, WrOpcode};
use roce_dp_bench::median;

const MTU: u32 = 4096;
const DEPTH: u32 = 32;
const SIGNAL_EVERY: u64 = 8;
const REGION: usize = 2 << 20;
const VA: u64 = 0x7000_0000;

/// The engine embedded in the application: two connected QPs on one loopback engine, driven by this thread.
struct Embedded {
    e: Engine,
    a: u32,
    cq: roce_dp::CqId,
    lkey: u32,
    rkey: u32,
    buf: Vec<u8>,
    st: PumpStats,
    t0: Instant,
}

impl Embedded {
    fn new() -> Embedded {
        let mut e = Engine::new(loopback::engine_config());
        let pd = e.alloc_pd();
        let cq = e.create_cq(4 * DEPTH).expect("cq");
        let k = e.reg_mr(pd, VA, REGION, AccessFlags::ALL).expect("mr");
        let caps = QpCaps { max_send_wr: DEPTH, max_recv_wr: DEPTH, ..QpCaps::default() };
        let a = e.create_qp(pd, cq, cq, caps).expect("qp");
        let b = e.create_qp(pd, cq, cq, caps).expect("qp");
        let peer = roce_dp::PeerAddr {
            ip: roce_dp::wire::IpAddrs::V4 { src: loopback::IPV4, dst: loopback::IPV4 },
            mac: roce_dp::wire::MacAddr(loopback::MAC),
        };
        for (x, y) in [(a, b), (b, a)] {
            let init = QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() };
            e.modify_qp(x, &init).expect("init");
            let rtr = QpAttr {
                state: Some(QpState::Rtr),
                path_mtu: Some(MTU),
                dest_qpn: Some(y),
                rq_psn: Some(0),
                max_dest_rd_atomic: Some(16),
                min_rnr_timer: Some(1),
                peer: Some(peer),
                ..QpAttr::default()
            };
            e.modify_qp(x, &rtr).expect("rtr");
            let rts = QpAttr {
                state: Some(QpState::Rts),
                sq_psn: Some(0),
                timeout: Some(14),
                retry_cnt: Some(7),
                rnr_retry: Some(7),
                max_rd_atomic: Some(16),
                ..QpAttr::default()
            };
            e.modify_qp(x, &rts).expect("rts");
        }
        Embedded {
            e,
            a,
            cq,
            lkey: k.lkey,
            rkey: k.rkey,
            buf: loopback::frame_buf(),
            st: PumpStats::default(),
            t0: Instant::now(),
        }
    }

    fn pump(&mut self) {
        let now = roce_dp::Instant(self.t0.elapsed().as_nanos() as u64);
        loopback::pump(&mut self.e, now, &mut self.buf, &mut self.st);
    }
}

/// What both paths offer the measurement loops: post a WRITE of `len` bytes, poll completions.
trait Path {
    /// Posts one WR of a batch; the batch goes to the data path at [`flush`](Path::flush).
    fn post(&mut self, wr_id: u64, len: u32, signaled: bool);
    /// Ends a batch of posts (through the rings: one publish of the send ring's tail).
    fn flush(&mut self) {}
    /// Completions polled (their statuses checked); drives the engine when it is embedded.
    fn poll(&mut self, out: &mut [Cqe]) -> usize;
}

impl Path for Embedded {
    fn post(&mut self, wr_id: u64, len: u32, signaled: bool) {
        let mut wr = SendWr::new(wr_id, WrOpcode::RdmaWrite).remote(VA + (REGION / 2) as u64, self.rkey);
        wr.signaled = signaled;
        self.e.post_send(self.a, &wr, &[Sge { addr: VA, len, lkey: self.lkey }]).expect("post");
    }

    fn poll(&mut self, out: &mut [Cqe]) -> usize {
        self.pump();
        let n = self.e.poll_cq(self.cq, out);
        check(&out[..n]);
        n
    }
}

impl Path for LoopPair {
    fn post(&mut self, wr_id: u64, len: u32, signaled: bool) {
        let mut wr =
            SendWr::new(wr_id, WrOpcode::RdmaWrite).remote(self.mr.addr() + (REGION / 2) as u64, self.mr.rkey());
        wr.signaled = signaled;
        self.a.stage_send(&wr, &[self.mr.sge(0, len)]).expect("post");
    }

    fn flush(&mut self) {
        self.a.publish_sends();
    }

    fn poll(&mut self, out: &mut [Cqe]) -> usize {
        let n = self.cq.poll(out).expect("poll");
        check(&out[..n]);
        n
    }
}

fn check(c: &[Cqe]) {
    for c in c {
        assert_eq!(c.status, WcStatus::Success, "{c:?}");
    }
}

/// Nanoseconds per post -> completion, one 64 B WRITE in flight.
fn latency(p: &mut dyn Path, n: u64) -> f64 {
    let mut out = [Cqe::EMPTY; 4];
    for i in 0..n / 10 {
        p.post(i, 64, true);
        p.flush();
        while p.poll(&mut out) == 0 {}
    }
    let t = Instant::now();
    for i in 0..n {
        p.post(i, 64, true);
        p.flush();
        while p.poll(&mut out) == 0 {}
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// MiB/s of `n` WRITEs of `size` bytes, `DEPTH` in flight, every `SIGNAL_EVERY`th signaled.
fn bandwidth(p: &mut dyn Path, size: u32, n: u64) -> f64 {
    let mut out = [Cqe::EMPTY; 32];
    let t = Instant::now();
    let (mut posted, mut done) = (0u64, 0u64);
    while done < n {
        while posted - done < u64::from(DEPTH) && posted < n {
            let signaled = posted % SIGNAL_EVERY == SIGNAL_EVERY - 1 || posted + 1 == n;
            p.post(posted, size, signaled);
            posted += 1;
        }
        p.flush();
        let k = p.poll(&mut out);
        if k > 0 {
            done = out[k - 1].wr_id + 1;
        }
    }
    (n * u64::from(size)) as f64 / t.elapsed().as_secs_f64() / (1 << 20) as f64
}

/// A client session of a stepped daemon: its worker iterations run in the client's thread, between posts and polls.
struct Stepped {
    p: LoopPair,
    st: Stepper,
}

impl Path for Stepped {
    fn post(&mut self, wr_id: u64, len: u32, signaled: bool) {
        self.p.post(wr_id, len, signaled);
    }

    fn flush(&mut self) {
        self.p.flush();
    }

    fn poll(&mut self, out: &mut [Cqe]) -> usize {
        self.st.step();
        self.p.poll(out)
    }
}

/// Runs `f` on a fresh stepped loopback daemon (its worker iterations in this thread, see [`Stepped`]).
fn through_stepped<T>(f: impl FnOnce(&mut Stepped) -> T) -> T {
    let path = std::env::temp_dir().join(format!("roce-dp-bench-stepped-{}.sock", std::process::id()));
    let cfg = LoopbackConfig { mtu: MTU, ..LoopbackConfig::new(&path) };
    let (mut d, mut st) = LoopbackDaemon::start_stepped(cfg).expect("loopback daemon");
    // Control calls wait for worker steps: make them on another thread while this one steps.
    let open = std::thread::spawn(move || LoopPair::open(&path, REGION, DEPTH, MTU));
    // (Yielding between steps: under a profiler that runs one thread at a time, the other thread gets on.)
    while !open.is_finished() {
        st.step();
        std::thread::yield_now();
    }
    let mut s = Stepped { p: open.join().expect("open thread").expect("client session"), st };
    let r = f(&mut s);
    let Stepped { p, mut st } = s;
    let close = std::thread::spawn(move || {
        drop(p);
        d.shutdown("bench done");
    });
    while !close.is_finished() {
        st.step();
        std::thread::yield_now();
    }
    r
}

/// The floor of any two-thread path on this machine now: nanoseconds per round trip of one atomic between two
/// spinning threads (what a post and its completion cost at least when client and worker are on two cores).
fn crossing_floor(n: u64) -> f64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    let ping = std::sync::Arc::new(AtomicU64::new(0));
    let p2 = ping.clone();
    let echo = std::thread::spawn(move || {
        for i in 0..n {
            while p2.load(Ordering::Acquire) != 2 * i + 1 {
                std::hint::spin_loop();
            }
            p2.store(2 * i + 2, Ordering::Release);
        }
    });
    let t = Instant::now();
    for i in 0..n {
        ping.store(2 * i + 1, Ordering::Release);
        while ping.load(Ordering::Acquire) != 2 * i + 2 {
            std::hint::spin_loop();
        }
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    echo.join().expect("echo thread");
    ns
}

/// Runs `f` on a fresh loopback daemon (worker busy-polling) and a client session of it; the daemon stops after.
fn through_daemon<T>(f: impl FnOnce(&mut LoopPair) -> T) -> T {
    let path = std::env::temp_dir().join(format!("roce-dp-bench-daemon-{}.sock", std::process::id()));
    let cfg = LoopbackConfig { mtu: MTU, idle_sleep_us: None, ..LoopbackConfig::new(&path) };
    let mut d = LoopbackDaemon::start(cfg).expect("loopback daemon");
    let mut p = LoopPair::open(&path, REGION, DEPTH, MTU).expect("client session");
    let r = f(&mut p);
    drop(p);
    d.shutdown("bench done");
    r
}

/// `--serve PATH [--serve-secs SECS]`: a loopback daemon (worker busy-polling) on socket `PATH` for client processes (e.g.
/// `rdp_write_bw --daemon PATH` as both server and client: the loopback engine plays both ends), for at most SECS
/// seconds (default 60) or until a client session came and all sessions went; then its appliance counters, so a
/// tool's wake-ups (`events_signalled`) can be counted per message without DPDK.
fn serve(path: &str, secs: u64) {
    let cfg = LoopbackConfig { mtu: MTU, idle_sleep_us: None, ..LoopbackConfig::new(path) };
    let mut d = LoopbackDaemon::start(cfg).expect("loopback daemon");
    println!("serving {path}");
    let t = Instant::now();
    let mut seen = false;
    while t.elapsed().as_secs() < secs {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let n = d.sessions();
        if seen && n == 0 {
            break;
        }
        seen |= n > 0;
    }
    if let Some(a) = d.shutdown("serve done") {
        println!("{:?}", a.stats);
    }
}

const USAGE: &str = "\
usage: daemon [--runs N] [--quick]
       daemon --only embedded|daemon|stepped [--bw SIZE]
       daemon --serve PATH [--serve-secs SECS]
WRITE through the appliance's rings (client library -> worker -> engine, loopback port, no DPDK) against the engine
embedded in the application, same run: post -> completion ns (64 B, one in flight) and MiB/s at 4 KiB and 64 KiB;
medians of --runs N (default 5) alternating rounds. Busy-polls two threads: run it under
`flock /tmp/roce-dp-busy.lock`.
  --only PATH     one path's post -> completion loop (for profilers); with --bw SIZE its bandwidth loop (64 MiB)
  --serve PATH    a loopback daemon on socket PATH for client processes (rdp_write_bw --daemon PATH), for at most
                  --serve-secs (default 60) or until its clients are gone; then its counters";

/// The value after `flag`, parsed; `None` if the flag is absent. A value that does not parse is one line, exit 2.
fn value<T: std::str::FromStr>(args: &[String], flag: &str) -> Option<T> {
    let v = args.iter().position(|a| a == flag).map(|i| args[i + 1].as_str())?;
    match v.parse() {
        Ok(x) => Some(x),
        Err(_) => {
            eprintln!("daemon: {flag} {v}: not a valid value (see --help)");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args = roce_dp_bench::check_args(
        "daemon",
        USAGE,
        &[("--runs", 1), ("--quick", 0), ("--only", 1), ("--bw", 1), ("--serve", 1), ("--serve-secs", 1)],
    );
    let runs: usize = value(&args, "--runs").unwrap_or(5);
    let quick = args.iter().any(|a| a == "--quick");
    if let Some(path) = value::<String>(&args, "--serve") {
        return serve(&path, value(&args, "--serve-secs").unwrap_or(60));
    }
    // For profilers: one path's post -> completion loop only, or with `--bw SIZE` its WRITE bandwidth loop (64 MiB).
    let bw: Option<u32> = value(&args, "--bw");
    let only = args.iter().position(|a| a == "--only").map(|i| args[i + 1].as_str());
    let refuse = |msg: String| {
        eprintln!("daemon: {msg} (see --help)");
        std::process::exit(2)
    };
    if let Some(p) = only.filter(|p| !["embedded", "daemon", "stepped"].contains(p)) {
        refuse(format!("--only {p}: not one of embedded, daemon, stepped"));
    }
    match bw {
        Some(_) if only.is_none() => refuse("--bw needs --only".into()),
        Some(s) if !(1..=REGION as u32 / 2).contains(&s) => {
            refuse(format!("--bw {s}: out of range 1..={}", REGION / 2))
        }
        _ => {}
    }
    if let (Some(path), Some(size)) = (only, bw) {
        let n = (64u64 << 20) / u64::from(size);
        return match path {
            "embedded" => println!("{:.0} MiB/s", bandwidth(&mut Embedded::new(), size, n)),
            "daemon" => println!("{:.0} MiB/s", through_daemon(|p| bandwidth(p, size, n))),
            _ => println!("{:.0} MiB/s", through_stepped(|p| bandwidth(p, size, n))),
        };
    }
    match only {
        Some("embedded") => return println!("{:.0} ns", latency(&mut Embedded::new(), 500_000)),
        Some("daemon") => return println!("{:.0} ns", through_daemon(|p| latency(p, 500_000))),
        Some("stepped") => return println!("{:.0} ns", through_stepped(|p| latency(p, 500_000))),
        _ => {}
    }
    let (lat_n, bw_bytes) = if quick { (5_000u64, 64u64 << 20) } else { (50_000, 512 << 20) };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!(
        "roce-dp engine through roce-dpd's rings vs embedded; loopback engine, MTU {MTU}; {cpus} CPUs, loadavg {}; \
         medians of {runs} rounds",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    let sizes = [4096u32, 65536];
    // Per path (embedded, daemon on 2 threads, daemon stepped in 1 thread): latencies, then MiB/s per size.
    let mut lat: [Vec<f64>; 3] = Default::default();
    let mut floor = Vec::new();
    let mut bw: [Vec<Vec<f64>>; 3] = Default::default();
    for b in &mut bw {
        b.resize(sizes.len(), Vec::new());
    }
    for round in 0..runs {
        floor.push(crossing_floor(lat_n));
        // Rotate which path goes first, so a drift in machine load hits all alike.
        for k in 0..3 {
            let path = (round + k) % 3;
            let (l, b) = (&mut lat[path], &mut bw[path]);
            match path {
                0 => l.push(latency(&mut Embedded::new(), lat_n)),
                1 => l.push(through_daemon(|p| latency(p, lat_n))),
                _ => l.push(through_stepped(|p| latency(p, lat_n))),
            }
            for (i, &s) in sizes.iter().enumerate() {
                let n = bw_bytes / u64::from(s);
                b[i].push(match path {
                    0 => bandwidth(&mut Embedded::new(), s, n),
                    1 => through_daemon(|p| bandwidth(p, s, n)),
                    _ => through_stepped(|p| bandwidth(p, s, n)),
                });
            }
        }
    }
    let l: Vec<f64> = lat.iter_mut().map(|v| median(v)).collect();
    println!();
    println!("| case | engine embedded | through roce-dpd's rings, worker on its own thread | ratio | rings, worker stepped in the client's thread | ratio |");
    println!("|---|---|---|---|---|---|");
    println!(
        "| post -> completion, 64 B WRITE, one in flight | {:.0} ns | {:.0} ns | {:.3} | {:.0} ns | {:.3} |",
        l[0],
        l[1],
        l[0] / l[1],
        l[2],
        l[0] / l[2]
    );
    let floor = median(&mut floor);
    println!("| two threads, one atomic round trip (the floor of any core crossing now) | | {floor:.0} ns | | | |");
    let mut summary = format!(
        "bench: post_to_completion_ns embedded={:.0} daemon={:.0} stepped={:.0} ratio={:.3} stepped_ratio={:.3}",
        l[0],
        l[1],
        l[2],
        l[0] / l[1],
        l[0] / l[2]
    );
    for (i, &s) in sizes.iter().enumerate() {
        let m: Vec<f64> = bw.iter_mut().map(|b| median(&mut b[i])).collect();
        println!(
            "| WRITE {} KiB, {DEPTH} in flight | {:.0} MiB/s | {:.0} MiB/s | {:.3} | {:.0} MiB/s | {:.3} |",
            s / 1024,
            m[0],
            m[1],
            m[1] / m[0],
            m[2],
            m[2] / m[0]
        );
        let _ = std::fmt::Write::write_fmt(
            &mut summary,
            format_args!(
                " write_{}k_ratio={:.3} write_{}k_stepped_ratio={:.3}",
                s / 1024,
                m[1] / m[0],
                s / 1024,
                m[2] / m[0]
            ),
        );
    }
    println!("{summary}");
    println!(
        "reproduce: flock /tmp/roce-dp-busy.lock cargo run --release -p roce-dp-bench --bin daemon -- --runs {runs}"
    );
}
