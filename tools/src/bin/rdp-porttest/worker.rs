//! `rdp-porttest worker` (tier 2): the data-path worker (`roce_dp::dpdk::Worker`, an engine on a port queue pair)
//! fed hand-made frames through a net_ring port whose two rings this harness owns: it enqueues frames on the ring
//! the port's rx queue reads, takes what the worker sends from the ring its tx queue writes (15 slots: a full tx
//! ring on demand), and plays worker 1 by holding the worker's dispatch ring to it (31 slots, read only when the
//! harness says so: a stopped or slow worker). Each case checks the worker's and the engine's counters and that the
//! mempool holds as many mbufs after it as before (mbufs in use minus those the worker holds by design:
//! [`Worker::held_mbufs`]); at the end, with the worker, port and rings gone, none is in use.
//!
//! The cases: every cut of a RoCE frame and other runts; a RoCE frame longer than the path MTU; frames whose data
//! the mbuf does not own alone (a read-only external buffer, clones: checked without a write); multi-segment
//! (chained) frames as memif or rx scatter deliver them, split at every header boundary (handed to the engine
//! whole: its ICRC checks, so the engine drops it only as "no such QP"; an ARP request in two mbufs answered; a
//! chained frame for worker 1 forwarded with all its segments); hostile BTH destination QPs (0, 1, 0xff, 0xffffff,
//! this worker's unused first QPN, worker 1's, a worker that does not exist); worker 1's ring full; the tx ring
//! full (partial bursts, every ARP reply sent once the ring drains); an empty mempool; and a stop with frames in
//! the tx backlog, on worker 1's ring and on the rx ring.

use roce_dp::dpdk::{Burst, Dispatch, Eal, Mbuf, Mempool, Port, PortConfig, Ring, Worker, WorkerConfig, QPN_STRIDE};
use roce_dp::neigh::{NeighIp, Neighbours};
use roce_dp::time::Instant as EngineInstant;
use roce_dp::wire::{self, BthRepr, EthRepr, ExtRepr, IpAddrs, IpRepr, MacAddr, RoceRepr, ROCE_UDP_PORT};
use roce_dp::{Engine, EngineConfig, EngineStats, LocalIp};

use roce_dp_tools::dpdk_step;

use crate::{Context, SetupError};

const OUR_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const OUR_IP: [u8; 4] = [10, 0, 0, 1];
const PEER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
const PEER_IP: [u8; 4] = [10, 0, 0, 2];
const QPN_BASE: u32 = 0x100;

/// A RoCE SEND_FIRST from the peer to `dest_qp` with `payload` bytes and a correct ICRC.
fn roce_frame(dest_qp: u32, payload: usize) -> Vec<u8> {
    let repr = RoceRepr {
        eth: EthRepr { dst: OUR_MAC, src: PEER_MAC, vlan: None },
        ip: IpRepr { addrs: IpAddrs::V4 { src: PEER_IP, dst: OUR_IP }, ttl: 64, ..IpRepr::default() },
        udp_src: 0xc000,
        udp_dst: ROCE_UDP_PORT,
        bth: BthRepr { dest_qp, ..BthRepr::default() },
        ext: ExtRepr::default(),
    };
    let mut buf = vec![0u8; 9000];
    let n = wire::emit_frame(&mut buf, &repr, payload, |d| d.fill(0x5a)).expect("frame");
    buf.truncate(n);
    buf
}

/// An ARP request from the peer for our address.
fn arp_request() -> Vec<u8> {
    let mut peer = Neighbours::new(PEER_MAC, Some(PEER_IP), None);
    let mut out = [0u8; 128];
    let n = peer.solicit_at(NeighIp::V4(OUR_IP), EngineInstant(0), &mut out).expect("ARP request");
    out[..n].to_vec()
}

/// One mbuf holding `bytes`, or a chain of mbufs holding `bytes` split at `cuts` (ascending offsets).
fn mbuf(pool: &Mempool, bytes: &[u8], cuts: &[usize]) -> Mbuf {
    let mut parts = Vec::new();
    let mut at = 0;
    for &c in cuts.iter().chain(std::iter::once(&bytes.len())) {
        parts.push(&bytes[at..c]);
        at = c;
    }
    let seg = |b: &[u8]| {
        let mut m = pool.alloc().expect("mbuf for a test frame");
        if !b.is_empty() {
            m.append(b.len() as u16).expect("room").copy_from_slice(b);
        }
        m
    };
    let mut head = seg(parts[0]);
    for p in &parts[1..] {
        if head.chain(seg(p)).is_err() {
            panic!("chain");
        }
    }
    head
}

/// The frame of `m` as one slice of bytes (all its segments).
fn bytes_of(m: &Mbuf) -> Vec<u8> {
    let mut v = Vec::new();
    m.copy_segments(&mut v);
    v
}

struct Harness<'p> {
    pool: Mempool,
    rx: Ring,
    tx: Ring,
    d1: Ring,
    w: Worker<'p>,
    ok: bool,
}

impl Harness<'_> {
    fn check(&mut self, pass: bool, what: String) {
        println!("CHECK {} worker: {what}", if pass { "ok  " } else { "FAIL" });
        self.ok &= pass;
    }

    /// Mbufs in use that the worker does not hold by design.
    fn loose(&self) -> i64 {
        i64::from(self.pool.in_use()) - self.w.held_mbufs() as i64
    }

    /// Enqueue `frames` on the port's rx ring (in bursts) and poll until the worker has handled them all.
    fn feed(&mut self, frames: Vec<Mbuf>) {
        let mut b = Burst::new();
        for m in frames {
            if let Err(m) = b.push(m) {
                self.flush_rx(&mut b);
                let _ = b.push(m);
            }
        }
        self.flush_rx(&mut b);
        self.poll_idle();
    }

    fn flush_rx(&mut self, b: &mut Burst) {
        while !b.is_empty() {
            self.rx.enqueue_burst(b);
            if !b.is_empty() {
                self.w.poll();
            }
        }
    }

    /// Poll until the rx ring is empty, then a few turns more.
    fn poll_idle(&mut self) {
        let mut n = 0;
        while self.rx.count() > 0 && n < 100_000 {
            self.w.poll();
            n += 1;
        }
        for _ in 0..4 {
            self.w.poll();
        }
    }

    /// Take everything on `ring` (the tx ring or worker 1's ring).
    fn take(ring: &Ring) -> Vec<Mbuf> {
        let mut out = Vec::new();
        let mut b = Burst::new();
        while ring.dequeue_burst(&mut b) > 0 {
            out.extend(b.drain());
        }
        out
    }

    /// Runs `case`, then checks the pool holds as many loose mbufs as before it.
    fn leak_checked(&mut self, name: &str, case: impl FnOnce(&mut Self)) {
        let before = self.loose();
        case(self);
        drop(Self::take(&self.tx));
        drop(Self::take(&self.d1));
        let after = self.loose();
        self.check(before == after, format!("{name}: mempool: {before} loose mbufs in use before, {after} after"));
    }
}

fn engine_delta(a: &EngineStats, b: &EngineStats) -> Vec<(&'static str, u64)> {
    a.iter().zip(b.iter()).filter(|((_, x), (_, y))| y != x).map(|((k, x), (_, y))| (k, y - x)).collect()
}

pub(crate) fn run(eal: &Eal) -> Result<bool, SetupError> {
    // No per-lcore cache: the pool's in-use count is exact at every moment.
    let pool =
        dpdk_step(|| Mempool::new(eal, "rdpt_wpool", 1023, 0, 2048 + 128)).ctx(|| "worker harness mempool".into())?;
    let rx = dpdk_step(|| Ring::new(eal, "rdpt_wrx", 256)).ctx(|| "rx ring".into())?;
    let tx = dpdk_step(|| Ring::new(eal, "rdpt_wtx", 16)).ctx(|| "tx ring".into())?;
    let d1 = dpdk_step(|| Ring::new(eal, "rdpt_wd1", 32)).ctx(|| "worker 1's ring".into())?;
    let in_use_start = pool.in_use();
    let ok;
    {
        let mut port =
            dpdk_step(|| Port::from_rings(eal, "net_ring_w", std::slice::from_ref(&rx), std::slice::from_ref(&tx)))
                .ctx(|| "port".into())?;
        let conf = PortConfig { rx_desc: 64, tx_desc: 64, ..PortConfig::default() };
        dpdk_step(|| port.configure(&conf, &pool)).ctx(|| "configure".into())?;
        dpdk_step(|| port.start()).ctx(|| "start".into())?;
        let q = port.queue_pair(0).expect("queue 0");
        let cfg = EngineConfig {
            local_mac: OUR_MAC,
            local_ip: LocalIp { v4: Some(OUR_IP), v6: None },
            qpn_base: QPN_BASE,
            ..EngineConfig::default()
        };
        let w = Worker::new(Engine::new(cfg), q, &pool, 1024, WorkerConfig::default())
            .ctx(|| "worker".into())?
            .with_dispatch(Dispatch::new(QPN_BASE, 0, vec![None, Some(d1.clone())]));
        let mut h = Harness { pool: pool.clone(), rx: rx.clone(), tx: tx.clone(), d1: d1.clone(), w, ok: true };
        cases(&mut h);
        // Stop with frames in flight: ARP replies the full tx ring did not take (the worker's tx backlog), frames
        // on worker 1's ring and on the port's rx ring that nobody will poll.
        let arp = arp_request();
        let frames = (0..40).map(|_| mbuf(&pool, &arp, &[])).collect();
        h.feed(frames);
        let backlog = h.w.tx_backlog();
        let for_w1 = (0..5).map(|_| mbuf(&pool, &roce_frame(QPN_BASE + QPN_STRIDE, 64), &[])).collect();
        h.feed(for_w1);
        let mut b = Burst::new();
        for _ in 0..7 {
            let _ = b.push(mbuf(&pool, &roce_frame(QPN_BASE, 64), &[]));
        }
        h.rx.enqueue_burst(&mut b);
        let (on_tx, on_d1, on_rx) = (h.tx.count(), h.d1.count(), h.rx.count());
        h.check(
            backlog > 0 && on_tx == 15 && on_d1 == 5 && on_rx == 7,
            format!("stop: {backlog} frames in the tx backlog, {on_tx} on the full tx ring, {on_d1} on worker 1's ring, {on_rx} on the rx ring"),
        );
        ok = h.ok;
        drop(h);
        dpdk_step(|| port.stop()).ctx(|| "stop".into())?;
    }
    // The worker, port and harness clones are gone; the rings go last (their leftovers back to the pool).
    drop((rx, tx, d1));
    let end = pool.in_use();
    let pass = end == in_use_start;
    println!(
        "CHECK {} worker: stop with frames in flight: {end} mbufs in use after the worker, port and rings are gone \
         ({in_use_start} before)",
        if pass { "ok  " } else { "FAIL" }
    );
    Ok(pass && ok)
}

fn cases(h: &mut Harness<'_>) {
    let pool = h.pool.clone();
    let first = roce_frame(QPN_BASE, 256);

    // Runts: every cut of a RoCE frame (0 bytes up to one short of whole) and frames of nothing but padding.
    h.leak_checked("runts", |h| {
        let (s0, e0) = (h.w.stats, *h.w.engine.stats());
        let mut frames: Vec<Mbuf> = (0..first.len()).map(|n| mbuf(&pool, &first[..n], &[])).collect();
        frames.push(mbuf(&pool, &[0u8; 60], &[]));
        let n = frames.len() as u64;
        h.feed(frames);
        let (s1, e1) = (h.w.stats, *h.w.engine.stats());
        let handed = s1.rx_roce - s0.rx_roce;
        let dropped: u64 =
            engine_delta(&e0, &e1).iter().filter(|(k, _)| k.starts_with("rx_drop")).map(|(_, v)| v).sum();
        h.check(
            s1.rx_frames - s0.rx_frames == n && handed > 0 && dropped == handed && e1.tx_frames == e0.tx_frames,
            format!(
                "runts: {n} frames received, {handed} classified RoCE and every one dropped by the engine \
                 ({dropped}: {:?}), nothing sent",
                engine_delta(&e0, &e1)
            ),
        );
    });

    // Longer than the path MTU (1800 bytes of payload at MTU 1024): whole, checked, dropped as no such QP (the
    // QP's MTU check needs a QP).
    h.leak_checked("frame above the path MTU", |h| {
        let e0 = *h.w.engine.stats();
        let f = roce_frame(QPN_BASE, 1800);
        h.feed(vec![mbuf(&pool, &f, &[])]);
        let e1 = *h.w.engine.stats();
        let d = engine_delta(&e0, &e1);
        h.check(
            d == [("rx_frames", 1), ("rx_drop_unknown_qp", 1)],
            format!("a {}-byte frame (payload 1800 at MTU 1024): engine {d:?}", f.len()),
        );
    });

    // Frames in data the mbuf does not own alone: a read-only copy in an external buffer (as a PMD receiving into
    // memory of its own delivers frames; a write there faults), a clone of that, and a clone of a frame in the
    // pool's own buffer whose original the harness holds. Each is small enough for the engine's in-place ICRC
    // check, which writes into the frame: the worker hands them over read-only, so each is checked whole (good
    // ICRC) and dropped as "no such QP", and the original's bytes are as they were.
    h.leak_checked("frames in data the worker may not write", |h| {
        let f = roce_frame(QPN_BASE, 64);
        let e0 = *h.w.engine.stats();
        let mut ext = pool.alloc().expect("mbuf for a test frame");
        ext.attach_read_only_copy(&f).expect("a read-only external buffer");
        let ext_clone = ext.clone_in(&pool).expect("a clone");
        let mut orig = mbuf(&pool, &f, &[]);
        let clone = orig.clone_in(&pool).expect("a clone");
        let owned = [&ext, &ext_clone, &orig, &clone].map(|m| m.data_exclusive());
        h.feed(vec![ext, ext_clone, clone]);
        let d = engine_delta(&e0, h.w.engine.stats());
        let intact = orig.data() == f.as_slice();
        drop(orig);
        h.check(
            owned == [false; 4] && d == [("rx_frames", 3), ("rx_drop_unknown_qp", 3)] && intact,
            format!(
                "a {}-byte frame in a read-only external buffer, its clone, a clone of one in the pool's buffer: \
                 exclusive {owned:?}, engine {d:?}, the original intact: {intact}",
                f.len()
            ),
        );
    });

    // Multi-segment frames split at every header boundary and inside the ICRC: the engine gets the whole frame
    // (its ICRC checks out; a first segment alone would be truncated), once per frame.
    h.leak_checked("multi-segment RoCE frames", |h| {
        let f = roce_frame(QPN_BASE, 1000);
        let n = f.len();
        let splits: Vec<Vec<usize>> =
            vec![vec![1], vec![14], vec![34], vec![42], vec![54], vec![n - 4], vec![n - 1], vec![14, 42, 500, n - 2]];
        let (s0, e0) = (h.w.stats, *h.w.engine.stats());
        let frames = splits.iter().map(|c| mbuf(&pool, &f, c)).collect();
        h.feed(frames);
        let (s1, e1) = (h.w.stats, *h.w.engine.stats());
        let k = splits.len() as u64;
        let d = engine_delta(&e0, &e1);
        h.check(
            s1.rx_linearized - s0.rx_linearized == k && d == [("rx_frames", k), ("rx_drop_unknown_qp", k)],
            format!(
                "{k} chained {n}-byte frames: {} linearized, engine {d:?} (whole, good ICRC)",
                s1.rx_linearized - s0.rx_linearized
            ),
        );
    });

    // An ARP request in two mbufs is answered; the reply teaches the peer our MAC.
    h.leak_checked("multi-segment ARP request", |h| {
        let arp = arp_request();
        let s0 = h.w.stats;
        h.feed(vec![mbuf(&pool, &arp, &[1]), mbuf(&pool, &arp, &[21, 30])]);
        let replies = Harness::take(&h.tx);
        let mut peer = Neighbours::new(PEER_MAC, Some(PEER_IP), None);
        let mut out = [0u8; 128];
        for r in &replies {
            let _ = peer.handle(&bytes_of(r), &mut out);
        }
        let s1 = h.w.stats;
        h.check(
            s1.rx_neigh - s0.rx_neigh == 2 && replies.len() == 2 && peer.lookup(NeighIp::V4(OUR_IP)) == Some(OUR_MAC),
            format!(
                "2 chained ARP requests: {} replies, the peer learned {:?}",
                replies.len(),
                peer.lookup(NeighIp::V4(OUR_IP))
            ),
        );
    });

    // A chained frame for worker 1 goes to its ring with every segment.
    h.leak_checked("multi-segment frame for worker 1", |h| {
        let f = roce_frame(QPN_BASE + QPN_STRIDE + 3, 700);
        h.feed(vec![mbuf(&pool, &f, &[14, 100, 600])]);
        let got = Harness::take(&h.d1);
        let whole = got.first().map(|m| (m.nb_segs(), m.pkt_len(), bytes_of(m) == f));
        h.check(
            got.len() == 1 && whole == Some((4, f.len(), true)),
            format!("forwarded to worker 1: {} frame(s), (segments, length, bytes equal) {whole:?}", got.len()),
        );
    });

    // Hostile destination QPs: none of ours reaches another worker's ring except worker 1's own QPN; those no
    // worker owns are counted and dropped by this engine.
    h.leak_checked("hostile destination QPs", |h| {
        let qpns = [0u32, 1, 0xff, 0xff_ffff, QPN_BASE, QPN_BASE + QPN_STRIDE, QPN_BASE + 2 * QPN_STRIDE];
        let (s0, e0) = (h.w.stats, *h.w.engine.stats());
        let frames = qpns.iter().map(|&q| mbuf(&pool, &roce_frame(q, 64), &[])).collect();
        h.feed(frames);
        let on_d1: Vec<u32> = Harness::take(&h.d1)
            .iter()
            .filter_map(|m| match roce_dp::neigh::classify(&bytes_of(m)) {
                roce_dp::neigh::FrameKind::Roce { dest_qp } => Some(dest_qp),
                _ => None,
            })
            .collect();
        let (s1, e1) = (h.w.stats, *h.w.engine.stats());
        let d = engine_delta(&e0, &e1);
        h.check(
            on_d1 == [QPN_BASE + QPN_STRIDE]
                && s1.rx_unknown_qp - s0.rx_unknown_qp == 5
                && s1.dispatched - s0.dispatched == 1
                && d == [("rx_frames", 6), ("rx_drop_unknown_qp", 6)],
            format!(
                "QPNs {qpns:x?}: worker 1 got {on_d1:x?}, rx_unknown_qp +{}, engine {d:?}",
                s1.rx_unknown_qp - s0.rx_unknown_qp
            ),
        );
    });

    // Worker 1 does not poll: its ring (31 slots) fills and the rest is dropped, counted.
    h.leak_checked("worker 1's ring full", |h| {
        let s0 = h.w.stats;
        let frames = (0..64).map(|i| mbuf(&pool, &roce_frame(QPN_BASE + QPN_STRIDE + i, 64), &[])).collect();
        h.feed(frames);
        let on_d1 = h.d1.count();
        let s1 = h.w.stats;
        let (disp, drops) = (s1.dispatched - s0.dispatched, s1.dispatch_drops - s0.dispatch_drops);
        h.check(
            on_d1 == 31 && disp == 64 && drops == 33,
            format!("64 frames for worker 1: {on_d1} on its ring, dispatched +{disp}, dispatch_drops +{drops}"),
        );
    });

    // The tx ring takes 15 frames: 40 ARP replies go out in partial bursts, each once, as the ring drains.
    h.leak_checked("tx ring full", |h| {
        let arp = arp_request();
        let s0 = h.w.stats;
        let frames = (0..40).map(|_| mbuf(&pool, &arp, &[])).collect();
        h.feed(frames);
        let mut sent = Vec::new();
        for _ in 0..20 {
            sent.extend(Harness::take(&h.tx));
            h.w.poll();
        }
        sent.extend(Harness::take(&h.tx));
        let s1 = h.w.stats;
        let (partial, neigh) = (s1.tx_partial - s0.tx_partial, s1.tx_neigh - s0.tx_neigh);
        h.check(
            sent.len() as u64 == neigh && partial > 0 && h.w.tx_backlog() == 0,
            format!(
                "40 ARP requests: {neigh} replies queued, {} sent, tx_partial +{partial}, backlog {}",
                sent.len(),
                h.w.tx_backlog()
            ),
        );
    });

    // An ARP storm against a tx ring nobody drains: every request is answered or its reply counted as dropped
    // (session 11: replies that found the tx burst full were freed without a count).
    h.leak_checked("ARP storm, tx ring full", |h| {
        let arp = arp_request();
        let s0 = h.w.stats;
        let frames = (0..96).map(|_| mbuf(&pool, &arp, &[])).collect();
        h.feed(frames);
        let s1 = h.w.stats;
        let (rx, tx, drops) =
            (s1.rx_neigh - s0.rx_neigh, s1.tx_neigh - s0.tx_neigh, s1.tx_neigh_drops - s0.tx_neigh_drops);
        let mut sent = Harness::take(&h.tx).len();
        for _ in 0..8 {
            h.w.poll();
            sent += Harness::take(&h.tx).len();
        }
        h.check(
            rx == 96 && drops > 0 && tx + drops == rx && sent as u64 == tx,
            format!(
                "96 ARP requests, tx ring full: {tx} replies queued and {sent} sent, {drops} counted as tx_neigh_drops"
            ),
        );
    });

    // An empty mempool: replies cannot be made (counted), nothing breaks, and all comes back.
    h.leak_checked("mempool empty", |h| {
        let arp = arp_request();
        let frames: Vec<Mbuf> = (0..64).map(|_| mbuf(&pool, &arp, &[])).collect();
        let mut hold = Vec::new();
        while let Ok(m) = pool.alloc() {
            hold.push(m);
        }
        let held = hold.len();
        let s0 = h.w.stats;
        h.feed(frames);
        drop(hold);
        let mut replies = Harness::take(&h.tx).len();
        for _ in 0..8 {
            h.w.poll();
            replies += Harness::take(&h.tx).len();
        }
        let s1 = h.w.stats;
        let fails = s1.mbuf_alloc_failures - s0.mbuf_alloc_failures;
        let drops = s1.tx_neigh_drops - s0.tx_neigh_drops;
        h.check(
            fails > 0 && s1.rx_neigh - s0.rx_neigh == 64 && replies as u64 + drops == 64,
            format!(
                "64 ARP requests with {} mbufs held: mbuf_alloc_failures +{fails}, {replies} replies, {drops} counted \
                 as tx_neigh_drops",
                held
            ),
        );
    });
}
