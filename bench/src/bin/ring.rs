//! The shared-memory rings (roce_dp::ctrl) beside std::sync::mpsc and crossbeam-channel, measured in one run:
//! - round trip: one side sends a value, the other sends it back (ns per round trip, i.e. two one-way hops);
//! - post -> completion: a client posts a 64-byte WQE through a SendQueueWriter, the "daemon" thread validates it
//!   (SendQueueReader) and answers with a 32-byte CQE that the client polls (the engine itself is not involved);
//! - the u64 round trip and the post -> completion path between two processes over sealed memfds (the benchmark
//!   spawns itself as the peer; the QP and CQ regions go to the client process over a Unix socket);
//! - streaming: ns per entry with batched publication (64 entries per index store).
//!
//! Waiting sides spin (with a `yield_now` every 256 empty polls, as the machine may have fewer free cores than
//! threads); the channels block in `recv`, their normal mode.
//!
//! Reproduce: `cargo run --release -p roce-dp-bench --bin ring [-- --quick]`

use std::io::Read;
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use roce_dp::ctrl::abi::{self, RingDesc, Wqe, WqeLimits};
use roce_dp::ctrl::ring::{heap_ring, heap_table, Consumer, Producer};
use roce_dp::ctrl::shm::{
    inherit_fd, recv_with_fds, send_with_fds, Backing, ClientCqRegion, ClientQpRegion, DaemonCqRegion, DaemonQpRegion,
    QpRegionCaps, ShmRegion,
};
use roce_dp::ctrl::wq::{CqReader, SendQueueReader, SendQueueWriter};
use roce_dp::{Cqe, SendWr, Sge, WcStatus, WrOpcode};
use roce_dp_bench::median;

const ROLE: &str = "ROCE_BENCH_ROLE";
const FD: &str = "ROCE_BENCH_FD";
const COUNT: &str = "ROCE_BENCH_COUNT";
const RUNS_ENV: &str = "ROCE_BENCH_RUNS";
const CAP: u32 = 256;
const TO_CHILD: RingDesc = RingDesc { offset: 0, capacity: CAP, entry_size: 8 };
const TO_PARENT: RingDesc = RingDesc { offset: 8192, capacity: CAP, entry_size: 8 };

/// Spins, yielding the core every 256 calls.
struct Backoff(u32);

impl Backoff {
    fn wait(&mut self) {
        self.0 += 1;
        if self.0.is_multiple_of(256) {
            thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
}

fn pop_spin(c: &mut Consumer<u64>) -> u64 {
    let mut b = Backoff(0);
    loop {
        if let Some(v) = c.pop().expect("ring") {
            c.release();
            return v;
        }
        b.wait();
    }
}

/// Echoes `n` values from `rx` to `tx`.
fn echo(mut rx: Consumer<u64>, mut tx: Producer<u64>, n: u64) {
    for _ in 0..n {
        let v = pop_spin(&mut rx);
        tx.push_publish(v).expect("echo ring has room");
    }
}

/// ns per round trip through a pair of rings, the peer in a thread.
fn rt_ring_threads(n: u64) -> f64 {
    let (mut tx, rx_peer) = heap_ring::<u64>(CAP);
    let (tx_peer, mut rx) = heap_ring::<u64>(CAP);
    let peer = thread::spawn(move || echo(rx_peer, tx_peer, n));
    let t = Instant::now();
    for i in 0..n {
        tx.push_publish(i).unwrap();
        assert_eq!(pop_spin(&mut rx), i);
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    peer.join().unwrap();
    ns
}

/// A blocking channel baseline.
trait Channel {
    type Tx: Send + 'static;
    type Rx: Send + 'static;
    fn pair() -> (Self::Tx, Self::Rx);
    fn send(tx: &Self::Tx, v: u64);
    fn recv(rx: &Self::Rx) -> u64;
}

/// std::sync::mpsc::sync_channel.
struct Std;

impl Channel for Std {
    type Tx = mpsc::SyncSender<u64>;
    type Rx = mpsc::Receiver<u64>;
    fn pair() -> (Self::Tx, Self::Rx) {
        mpsc::sync_channel(CAP as usize)
    }
    fn send(tx: &Self::Tx, v: u64) {
        tx.send(v).unwrap();
    }
    fn recv(rx: &Self::Rx) -> u64 {
        rx.recv().unwrap()
    }
}

/// crossbeam_channel::bounded.
struct Crossbeam;

impl Channel for Crossbeam {
    type Tx = crossbeam_channel::Sender<u64>;
    type Rx = crossbeam_channel::Receiver<u64>;
    fn pair() -> (Self::Tx, Self::Rx) {
        crossbeam_channel::bounded(CAP as usize)
    }
    fn send(tx: &Self::Tx, v: u64) {
        tx.send(v).unwrap();
    }
    fn recv(rx: &Self::Rx) -> u64 {
        rx.recv().unwrap()
    }
}

/// ns per round trip through a pair of channels, the peer in a thread.
fn rt_channel<C: Channel>(n: u64) -> f64 {
    let (tx, rx_peer) = C::pair();
    let (tx_peer, rx) = C::pair();
    let peer = thread::spawn(move || {
        for _ in 0..n {
            C::send(&tx_peer, C::recv(&rx_peer));
        }
    });
    let t = Instant::now();
    for i in 0..n {
        C::send(&tx, i);
        assert_eq!(C::recv(&rx), i);
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    peer.join().unwrap();
    ns
}

/// A send queue (client writer, daemon reader) and a CQ (daemon producer, client reader) on the heap.
fn heap_qp() -> (SendQueueWriter, SendQueueReader, Producer<abi::Cqe>, CqReader) {
    let limits = WqeLimits { max_sge: 4, max_inline: 64 };
    let (sp, sc) = heap_ring::<Wqe>(CAP);
    let (sw, sr) = heap_table::<abi::Sge>(CAP, 3);
    let (iw, ir) = heap_table::<u8>(CAP, 64);
    let (cq_tx, cq_rx) = heap_ring::<abi::Cqe>(CAP);
    (
        SendQueueWriter::new(sp, Some(sw), Some(iw), limits).unwrap(),
        SendQueueReader::new(sc, Some(sr), Some(ir), limits).unwrap(),
        cq_tx,
        CqReader::new(cq_rx),
    )
}

/// ns per post -> completion: WQE through a SendQueueWriter/Reader pair, CQE back through a CQ ring.
fn post_to_completion(n: u64) -> f64 {
    let (mut sq, mut daemon_sq, mut cq_tx, mut cq) = heap_qp();
    let daemon = thread::spawn(move || {
        let mut inline = [0u8; 64];
        let mut req = abi::SendRequest::default();
        let mut b = Backoff(0);
        let mut done = 0;
        while done < n {
            match daemon_sq.poll_into(&mut req, &mut inline).expect("valid WQEs") {
                true => {
                    daemon_sq.release();
                    cq_tx.push_publish(completion(&req)).expect("CQ has room");
                    done += 1;
                }
                false => b.wait(),
            }
        }
    });
    let sge = Sge { addr: 0x10000, len: 4096, lkey: 0x100 };
    let mut out = [abi::Cqe::default().decode().unwrap()];
    let t = Instant::now();
    for i in 0..n {
        sq.post(&SendWr::new(i, WrOpcode::RdmaWrite).remote(0x2000, 0x42), &[sge]).unwrap();
        let mut b = Backoff(0);
        while cq.poll(&mut out).unwrap() == 0 {
            b.wait();
        }
        assert_eq!((out[0].wr_id, out[0].status), (i, WcStatus::Success));
    }
    let ns = t.elapsed().as_nanos() as f64 / n as f64;
    daemon.join().unwrap();
    ns
}

/// ns per post -> validate -> CQE -> poll with both sides in this thread: the instruction cost of the path with no
/// cache-line transfer between cores and no scheduling (a floor for the cross-core figures).
fn post_to_completion_one_thread(n: u64) -> f64 {
    let (mut sq, mut daemon_sq, mut cq_tx, mut cq) = heap_qp();
    let sge = Sge { addr: 0x10000, len: 4096, lkey: 0x100 };
    let mut inline = [0u8; 64];
    let mut req = abi::SendRequest::default();
    let mut out = [abi::Cqe::default().decode().unwrap()];
    let t = Instant::now();
    for i in 0..n {
        sq.post(&SendWr::new(i, WrOpcode::RdmaWrite).remote(0x2000, 0x42), &[sge]).unwrap();
        assert!(daemon_sq.poll_into(&mut req, &mut inline).unwrap(), "posted");
        daemon_sq.release();
        cq_tx.push_publish(completion(&req)).unwrap();
        assert_eq!(cq.poll(&mut out).unwrap(), 1);
        assert_eq!(out[0].wr_id, i);
    }
    t.elapsed().as_nanos() as f64 / n as f64
}

/// ns per entry, streaming `n` entries one way with 64 entries per publication.
fn stream_ring(n: u64) -> f64 {
    let (mut tx, mut rx) = heap_ring::<u64>(CAP);
    let t = Instant::now();
    let consumer = thread::spawn(move || {
        let mut b = Backoff(0);
        let mut expect = 0u64;
        let mut buf = [0u64; 64];
        while expect < n {
            let k = rx.pop_batch(&mut buf).unwrap();
            for v in &buf[..k] {
                assert_eq!(*v, expect);
                expect += 1;
            }
            if k == 0 {
                rx.sync().unwrap();
                b.wait();
            } else {
                rx.release();
            }
        }
    });
    let mut b = Backoff(0);
    let mut i = 0;
    while i < n {
        if tx.push(i).is_ok() {
            i += 1;
            if i.is_multiple_of(64) {
                tx.publish();
            }
        } else {
            tx.sync().unwrap();
            b.wait();
        }
    }
    tx.publish();
    consumer.join().unwrap();
    t.elapsed().as_nanos() as f64 / n as f64
}

/// ns per entry, streaming `n` entries one way through a channel.
fn stream_channel<C: Channel>(n: u64) -> f64 {
    let (tx, rx) = C::pair();
    let t = Instant::now();
    let consumer = thread::spawn(move || {
        for i in 0..n {
            assert_eq!(C::recv(&rx), i);
        }
    });
    for i in 0..n {
        C::send(&tx, i);
    }
    consumer.join().unwrap();
    t.elapsed().as_nanos() as f64 / n as f64
}

/// The child process: echoes COUNT values over the inherited region.
fn child_echo() {
    let fd: i32 = std::env::var(FD).unwrap().parse().unwrap();
    let n: u64 = std::env::var(COUNT).unwrap().parse().unwrap();
    let region = Arc::new(ShmRegion::open_inherited(fd).expect("map inherited region"));
    // SAFETY: this process is the only consumer of TO_CHILD and the only producer of TO_PARENT.
    let (rx, tx) = unsafe { (region.consumer::<u64>(TO_CHILD).unwrap(), region.producer::<u64>(TO_PARENT).unwrap()) };
    echo(rx, tx, n);
}

/// Round trips between this process and a child over a memfd: `runs` timed runs of `n` round trips each.
fn rt_processes(runs: usize, n: u64) -> Vec<f64> {
    let region = Arc::new(ShmRegion::create("roce-dp-bench", 16384, Backing::Pages).unwrap());
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    let fd = region.share_with_child(&mut cmd);
    let total = (runs as u64 + 1) * n;
    let mut child = cmd.env(ROLE, "echo").env(FD, fd.to_string()).env(COUNT, total.to_string()).spawn().unwrap();
    // SAFETY: the child is the only other party; this process is the only producer of TO_CHILD and the only
    // consumer of TO_PARENT.
    let (mut tx, mut rx) =
        unsafe { (region.producer::<u64>(TO_CHILD).unwrap(), region.consumer::<u64>(TO_PARENT).unwrap()) };
    let mut samples = Vec::new();
    let mut i = 0u64;
    for run in 0..=runs {
        let t = Instant::now();
        for _ in 0..n {
            tx.push_publish(i).unwrap();
            assert_eq!(pop_spin(&mut rx), i);
            i += 1;
        }
        if run > 0 {
            // run 0 is the warm-up (child start-up, page faults)
            samples.push(t.elapsed().as_nanos() as f64 / n as f64);
        }
    }
    assert!(child.wait().unwrap().success());
    samples
}

/// The daemon's answer to a send request: a successful completion of its length.
fn completion(req: &abi::SendRequest) -> abi::Cqe {
    abi::Cqe::from(&Cqe {
        wr_id: req.wr.wr_id,
        status: WcStatus::Success,
        opcode: req.wr.opcode.wc_opcode(),
        qpn: 0x11,
        byte_len: req.sges.total_len() as u32,
        imm: None,
        invalidated_rkey: None,
        solicited: false,
    })
}

/// Child role "client": receives its QP and CQ regions over the inherited socket, times `runs` runs of `n`
/// post -> completion round trips (plus a warm-up run) and prints the ns per round trip of each run on stdout.
fn child_client() {
    let fd: i32 = std::env::var(FD).unwrap().parse().unwrap();
    let n: u64 = std::env::var(COUNT).unwrap().parse().unwrap();
    let runs: usize = std::env::var(RUNS_ENV).unwrap().parse().unwrap();
    // SAFETY: FD is the socket the parent made inheritable for this process; nothing else owns it.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut fds = Vec::new();
    recv_with_fds(&sock, &mut [0u8; 8], &mut fds).unwrap();
    let cq_fd = fds.pop().unwrap();
    let qp_fd = fds.pop().unwrap();
    // SAFETY: one client side per region in this process.
    let (mut qp, mut cq) = unsafe { (ClientQpRegion::open(qp_fd).unwrap(), ClientCqRegion::open(cq_fd).unwrap()) };
    let sge = Sge { addr: 0x10000, len: 4096, lkey: 0x100 };
    let mut out = [abi::Cqe::default().decode().unwrap()];
    let mut i = 0u64;
    let mut line = Vec::new();
    for run in 0..=runs {
        let t = Instant::now();
        for _ in 0..n {
            qp.sq.post(&SendWr::new(i, WrOpcode::RdmaWrite).remote(0x2000, 0x42), &[sge]).unwrap();
            let mut b = Backoff(0);
            while cq.cq.poll(&mut out).unwrap() == 0 {
                b.wait();
            }
            assert_eq!(out[0].wr_id, i);
            i += 1;
        }
        if run > 0 {
            line.push(format!("{}", t.elapsed().as_nanos() as f64 / n as f64));
        }
    }
    println!("{}", line.join(" "));
}

/// Post -> completion between a client process and this one as the daemon: `runs` samples of `n` round trips.
fn post_to_completion_processes(runs: usize, n: u64) -> Vec<f64> {
    let caps = QpRegionCaps { sq_depth: 256, rq_depth: 16, max_send_sge: 4, max_recv_sge: 1, max_inline: 64 };
    let mut qp = DaemonQpRegion::create("roce-dp-bench-qp", caps, Backing::Pages).unwrap();
    let mut cq = DaemonCqRegion::create("roce-dp-bench-cq", 256, Backing::Pages).unwrap();
    let (sock, client_sock) = UnixStream::pair().unwrap();
    let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
    let fd = inherit_fd(&mut cmd, client_sock.as_fd());
    cmd.env(ROLE, "client").env(FD, fd.to_string()).env(COUNT, n.to_string()).env(RUNS_ENV, runs.to_string());
    let mut child = cmd.stdout(std::process::Stdio::piped()).spawn().unwrap();
    drop(client_sock);
    send_with_fds(&sock, b"regions", &[qp.fd(), cq.fd()]).unwrap();
    let total = (runs as u64 + 1) * n;
    let mut inline = [0u8; 64];
    let mut req = abi::SendRequest::default();
    let mut b = Backoff(0);
    let mut done = 0;
    while done < total {
        match qp.sq.poll_into(&mut req, &mut inline).expect("valid WQEs") {
            true => {
                qp.sq.release();
                cq.cq.push_publish(completion(&req)).expect("CQ has room");
                done += 1;
            }
            false => b.wait(),
        }
    }
    let mut text = String::new();
    child.stdout.take().unwrap().read_to_string(&mut text).unwrap();
    assert!(child.wait().unwrap().success());
    text.split_whitespace().map(|v| v.parse().unwrap()).collect()
}

/// Median and minimum of `runs` runs of `f`.
fn measure(runs: usize, f: impl Fn() -> f64) -> (f64, f64) {
    f(); // warm-up
    let mut s: Vec<f64> = (0..runs).map(|_| f()).collect();
    let min = s.iter().copied().fold(f64::INFINITY, f64::min);
    (median(&mut s), min)
}

const USAGE: &str = "\
The shared-memory SPSC rings beside std::sync::mpsc and crossbeam-channel: round trips, post -> completion (one
thread, two threads, two processes over sealed memfds) and batched streaming.

Usage: ring [--quick]

  --quick   fewer and shorter runs (median of 5 instead of 11)

Reproduce: cargo run --release -p roce-dp-bench --bin ring [-- --quick]";

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("one-thread") => {
            // For profilers: just the single-thread path.
            return println!("{:.0} ns", post_to_completion_one_thread(20_000_000));
        }
        Ok("echo") => return child_echo(),
        Ok("client") => return child_client(),
        _ => {}
    }
    let quick = roce_dp_bench::check_args("ring", USAGE, &[("--quick", 0)]).iter().any(|a| a == "--quick");
    let (runs, rt_n, stream_n) = if quick { (5, 20_000, 1_000_000) } else { (11, 100_000, 5_000_000) };
    let cpus = thread::available_parallelism().map_or(0, |n| n.get());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "Shared-memory SPSC rings vs channels; {cpus} CPUs, loadavg {}; median (min) of {runs} runs",
        load.split_whitespace().take(3).collect::<Vec<_>>().join(" ")
    );
    println!();
    println!("| path | what | median ns | min ns |");
    println!("|---|---|---:|---:|");
    let row = |path: &str, what: &str, (med, min): (f64, f64)| println!("| {path} | {what} | {med:.0} | {min:.0} |");
    row("roce-dp ring, 2 threads", "u64 round trip", measure(runs, || rt_ring_threads(rt_n)));
    row("crossbeam bounded, 2 threads", "u64 round trip", measure(runs, || rt_channel::<Crossbeam>(rt_n)));
    row("std mpsc sync_channel, 2 threads", "u64 round trip", measure(runs, || rt_channel::<Std>(rt_n)));
    let mut p = rt_processes(runs, rt_n);
    let min = p.iter().copied().fold(f64::INFINITY, f64::min);
    row("roce-dp ring, 2 processes (memfd)", "u64 round trip", (median(&mut p), min));
    row(
        "roce-dp SQ + CQ rings, 2 threads",
        "post WQE -> validate -> CQE polled",
        measure(runs, || post_to_completion(rt_n)),
    );
    row(
        "roce-dp SQ + CQ rings, 1 thread",
        "post -> validate -> CQE -> poll, no core crossing",
        measure(runs, || post_to_completion_one_thread(stream_n / 4)),
    );
    let mut p = post_to_completion_processes(runs, rt_n);
    let min = p.iter().copied().fold(f64::INFINITY, f64::min);
    row("roce-dp QP + CQ regions, 2 processes", "post WQE -> validate -> CQE polled", (median(&mut p), min));
    row("roce-dp ring, 2 threads", "u64 streamed, per entry", measure(runs, || stream_ring(stream_n)));
    row(
        "crossbeam bounded, 2 threads",
        "u64 streamed, per entry",
        measure(runs, || stream_channel::<Crossbeam>(stream_n)),
    );
    row(
        "std mpsc sync_channel, 2 threads",
        "u64 streamed, per entry",
        measure(runs, || stream_channel::<Std>(stream_n)),
    );
    println!();
    println!("Round trip = two one-way hops. Ring waiters spin (yield every 256 polls); channels block in recv.");
    println!("With fewer idle cores than threads the spinning rows measure the scheduler, not the rings: when both");
    println!("sides share a core they hand over only at yields (~17-25 us per round trip on this 2-CPU VM), so a");
    println!("loaded machine gives bimodal rows. Pinning the sides to CPUs 0 and 1 made it worse here (busy cores).");
    println!("reproduce: cargo run --release -p roce-dp-bench --bin ring{}", if quick { " -- --quick" } else { "" });
}
