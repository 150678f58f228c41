//! The port test's wire protocol, independent of DPDK: numbered test frames with a byte pattern, cumulative ACKs,
//! a send window with go-back-N retransmission (af_packet drops frames when the receiver lags), and an in-band STOP
//! handshake so that neither side stops its port while the other still polls (memif crashes otherwise).
//!
//! Frame layout (after a 14-byte Ethernet header with EtherType 0x88B5, "local experimental"):
//!
//! | offset | size | field                                                                 |
//! |--------|------|-----------------------------------------------------------------------|
//! | 14     | 4    | magic `RDPT`                                                          |
//! | 18     | 1    | kind: 1 DATA, 2 ACK, 3 STOP                                           |
//! | 19     | 1    | STOP flags: bit 0 "I am done", bit 1 "I have seen that you are done" |
//! | 20     | 2    | reserved (0)                                                          |
//! | 22     | 8    | DATA: sequence number; ACK: next expected; STOP: my total frames      |
//! | 30     | 8    | DATA: frame length; STOP: how many of your frames I received          |
//! | 38     | ..   | DATA: pattern bytes derived from the sequence number                  |
//!
//! Frame sizes cycle through the configured list by sequence number, so every size is exercised in both directions.

use std::time::{Duration, Instant};

/// EtherType of test frames (IEEE 802 local experimental).
pub(crate) const ETHERTYPE: u16 = 0x88B5;
/// Bytes before the pattern.
pub(crate) const HDR: usize = 38;
/// Smallest frame (and the size of ACK and STOP frames), FCS excluded.
pub(crate) const MIN_FRAME: usize = 64;
const MAGIC: [u8; 4] = *b"RDPT";
const KIND_DATA: u8 = 1;
const KIND_ACK: u8 = 2;
const KIND_STOP: u8 = 3;
const F_DONE: u8 = 1;
const F_SEEN_DONE: u8 = 2;

/// What one side sends and expects.
#[derive(Debug, Clone)]
pub(crate) struct FlowConfig {
    /// Frame sizes (bytes, FCS excluded), cycled by sequence number.
    pub sizes: Vec<usize>,
    /// Frames per size (count mode), or `None` with `duration` set (timed mode).
    pub frames_per_size: Option<u64>,
    /// Timed mode: send for this long.
    pub duration: Option<Duration>,
    /// Most data frames sent but not yet acknowledged.
    pub window: u64,
    /// Go back to the first unacknowledged frame after this long without ACK progress.
    pub rto: Duration,
    /// Acknowledge after this many in-order frames (and whenever rx goes idle).
    pub ack_every: u64,
    /// Repeat STOP this often until the peer confirms.
    pub stop_interval: Duration,
    /// After both sides are done, keep answering for this long without traffic before stopping.
    pub linger: Duration,
    /// Source MAC of our frames.
    pub src_mac: [u8; 6],
}

impl FlowConfig {
    /// Count mode with defaults for everything else.
    pub(crate) fn count(sizes: Vec<usize>, frames_per_size: u64, src_mac: [u8; 6]) -> Self {
        Self {
            sizes,
            frames_per_size: Some(frames_per_size),
            duration: None,
            window: 256,
            rto: Duration::from_millis(50),
            ack_every: 32,
            stop_interval: Duration::from_millis(10),
            linger: Duration::from_millis(100),
            src_mac,
        }
    }

    /// Frame length for sequence number `seq`.
    pub(crate) fn size_of(&self, seq: u64) -> usize {
        self.sizes[(seq % self.sizes.len() as u64) as usize]
    }

    /// How many of the first `total` sequence numbers have size index `i`.
    fn count_for(&self, i: usize, total: u64) -> u64 {
        let n = self.sizes.len() as u64;
        total / n + u64::from((i as u64) < total % n)
    }
}

/// A frame to send, as decided by [`Flow::poll_tx`]; [`Flow::write`] fills it in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tx {
    /// Test frame `seq`.
    Data {
        /// Sequence number.
        seq: u64,
        /// Frame length.
        len: usize,
    },
    /// Cumulative acknowledgement: everything below `next` arrived.
    Ack {
        /// Next expected sequence number.
        next: u64,
    },
    /// Stop handshake.
    Stop {
        /// How many frames I send in total.
        total: u64,
        /// How many of the peer's frames I received.
        received: u64,
        /// F_DONE / F_SEEN_DONE.
        flags: u8,
    },
}

impl Tx {
    /// Frame length in bytes.
    pub(crate) fn len(&self) -> usize {
        match *self {
            Tx::Data { len, .. } => len,
            _ => MIN_FRAME,
        }
    }
}

/// One side of a test: sends its frames, receives and verifies the peer's, then runs the stop handshake.
#[derive(Debug)]
pub(crate) struct Flow {
    cfg: FlowConfig,
    start: Instant,
    // --- sending ---
    next_tx: u64,
    highest_sent: u64,
    acked: u64,
    total: Option<u64>,
    last_ack_progress: Instant,
    tx_done_at: Option<Instant>,
    /// Data frames sent, retransmissions included.
    pub tx_frames: u64,
    /// Data frames sent again after a go-back-N timeout.
    pub retransmits: u64,
    // --- receiving ---
    rx_next: u64,
    unacked_rx: u64,
    ack_due: bool,
    peer_total: Option<u64>,
    first_rx_at: Option<Instant>,
    rx_done_at: Option<Instant>,
    last_rx_at: Instant,
    rx_ok: Vec<u64>,
    /// Frames whose bytes, length or sequence number were wrong.
    pub rx_bad: u64,
    /// The first verification failure, described.
    pub first_bad: Option<String>,
    /// Frames that arrived after a gap (dropped: the sender goes back) or twice.
    pub rx_out_of_order: u64,
    /// Frames that were not test frames (other EtherType, e.g. the kernel's IPv6 traffic on a veth).
    pub rx_foreign: u64,
    // --- stop handshake ---
    seen_peer_done: bool,
    peer_seen_my_done: bool,
    reply_stop: bool,
    /// The flags of the last STOP sent (a STOP goes out whenever they change).
    sent_flags: Option<u8>,
    last_stop_at: Option<Instant>,
}

impl Flow {
    /// A flow starting at `now`.
    pub(crate) fn new(cfg: FlowConfig, now: Instant) -> Self {
        let total = cfg.frames_per_size.map(|f| f * cfg.sizes.len() as u64);
        let nsizes = cfg.sizes.len();
        Flow {
            cfg,
            start: now,
            next_tx: 0,
            highest_sent: 0,
            acked: 0,
            total,
            last_ack_progress: now,
            tx_done_at: None,
            tx_frames: 0,
            retransmits: 0,
            rx_next: 0,
            unacked_rx: 0,
            ack_due: false,
            peer_total: None,
            first_rx_at: None,
            rx_done_at: None,
            last_rx_at: now,
            rx_ok: vec![0; nsizes],
            rx_bad: 0,
            first_bad: None,
            rx_out_of_order: 0,
            rx_foreign: 0,
            seen_peer_done: false,
            peer_seen_my_done: false,
            reply_stop: false,
            sent_flags: None,
            last_stop_at: None,
        }
    }

    fn sending_finished(&self) -> bool {
        self.total.is_some_and(|t| self.acked >= t)
    }

    fn receiving_finished(&self) -> bool {
        self.peer_total == Some(self.rx_next)
    }

    /// Both directions complete: everything I sent was acknowledged and I received everything the peer sent.
    pub(crate) fn done(&self) -> bool {
        self.sending_finished() && self.receiving_finished()
    }

    /// The handshake is over: both sides know both are done (the caller may stop polling after
    /// [`Flow::finished`]).
    pub(crate) fn handshake_complete(&self) -> bool {
        self.done() && self.seen_peer_done
    }

    /// Safe to stop polling: handshake complete and no frame from the peer for `linger`.
    pub(crate) fn finished(&self, now: Instant) -> bool {
        self.handshake_complete() && now.duration_since(self.last_rx_at) >= self.cfg.linger
    }

    fn stop_flags(&self) -> u8 {
        (if self.done() { F_DONE } else { 0 }) | (if self.seen_peer_done { F_SEEN_DONE } else { 0 })
    }

    fn stop(&self) -> Tx {
        Tx::Stop { total: self.total.unwrap_or(0), received: self.rx_next, flags: self.stop_flags() }
    }

    /// Handle one received frame.
    pub(crate) fn handle_rx(&mut self, frame: &[u8], now: Instant) {
        if frame.len() < HDR || frame[12..14] != ETHERTYPE.to_be_bytes() || frame[14..18] != MAGIC {
            self.rx_foreign += 1;
            return;
        }
        self.last_rx_at = now;
        let a = u64::from_le_bytes(frame[22..30].try_into().expect("8 bytes"));
        let b = u64::from_le_bytes(frame[30..38].try_into().expect("8 bytes"));
        match frame[18] {
            KIND_DATA => self.handle_data(a, b, frame, now),
            KIND_ACK => self.handle_ack(a, now),
            KIND_STOP => {
                let flags = frame[19];
                self.peer_total = Some(a);
                self.handle_ack(b, now);
                self.seen_peer_done |= flags & F_DONE != 0;
                self.peer_seen_my_done |= flags & F_SEEN_DONE != 0;
                if self.receiving_finished() && self.rx_done_at.is_none() {
                    self.rx_done_at = Some(now);
                }
                // Answer a peer that has not yet seen that we are done (its periodic STOPs stop once it has).
                if self.done() && flags & F_SEEN_DONE == 0 {
                    self.reply_stop = true;
                }
            }
            _ => self.rx_foreign += 1,
        }
    }

    fn handle_data(&mut self, seq: u64, len: u64, frame: &[u8], now: Instant) {
        if seq != self.rx_next {
            // Duplicate (our ACK was lost) or a gap (a frame was dropped): tell the sender where we are.
            self.rx_out_of_order += 1;
            self.ack_due = true;
            return;
        }
        self.first_rx_at.get_or_insert(now);
        let want = self.cfg.size_of(seq);
        let problem = if frame.len() != want || len != want as u64 {
            Some(format!("frame {seq}: length {} (header says {len}), expected {want}", frame.len()))
        } else {
            verify_pattern(seq, &frame[HDR..]).err().map(|off| {
                let got = frame[HDR + off];
                format!("frame {seq} ({want} B): byte {} is {got:#04x}, expected pattern", HDR + off)
            })
        };
        match problem {
            None => self.rx_ok[(seq % self.cfg.sizes.len() as u64) as usize] += 1,
            Some(p) => {
                self.rx_bad += 1;
                self.first_bad.get_or_insert(p);
            }
        }
        self.rx_next += 1;
        self.unacked_rx += 1;
        if self.unacked_rx >= self.cfg.ack_every {
            self.ack_due = true;
        }
        if self.receiving_finished() {
            self.rx_done_at.get_or_insert(now);
        }
    }

    fn handle_ack(&mut self, next: u64, now: Instant) {
        if next > self.acked && next <= self.highest_sent {
            self.acked = next;
            self.last_ack_progress = now;
            if self.sending_finished() {
                self.tx_done_at.get_or_insert(now);
            }
        }
    }

    /// Tell the flow that receiving went idle (an empty rx burst): acknowledge what arrived since the last ACK.
    pub(crate) fn rx_idle(&mut self) {
        if self.unacked_rx > 0 {
            self.ack_due = true;
        }
    }

    /// The next frame to send, if any: ACK, STOP, then data within the window.
    pub(crate) fn poll_tx(&mut self, now: Instant) -> Option<Tx> {
        if self.ack_due {
            self.ack_due = false;
            self.unacked_rx = 0;
            return Some(Tx::Ack { next: self.rx_next });
        }
        if self.sending_finished() {
            return self.poll_stop(now);
        }
        if self.total.is_none() && self.cfg.duration.is_some_and(|d| now.duration_since(self.start) >= d) {
            // Timed mode: the time is up; whatever was sent is the total.
            self.total = Some(self.highest_sent);
            if self.sending_finished() {
                self.tx_done_at = Some(now);
            }
            return None;
        }
        if self.next_tx > self.acked && now.duration_since(self.last_ack_progress) >= self.cfg.rto {
            // Go-back-N: no ACK progress for an RTO; resend from the first unacknowledged frame.
            self.retransmits += self.next_tx - self.acked;
            self.next_tx = self.acked;
            self.last_ack_progress = now;
        }
        let limit = self.total.unwrap_or(u64::MAX);
        if self.next_tx >= limit || self.next_tx - self.acked >= self.cfg.window {
            return None;
        }
        let seq = self.next_tx;
        self.next_tx += 1;
        self.highest_sent = self.highest_sent.max(self.next_tx);
        self.tx_frames += 1;
        if seq == self.acked {
            // The window was empty: the RTO counts from now.
            self.last_ack_progress = self.last_ack_progress.max(now);
        }
        Some(Tx::Data { seq, len: self.cfg.size_of(seq) })
    }

    fn poll_stop(&mut self, now: Instant) -> Option<Tx> {
        // Announce every change of our flags at once, answer a peer that has not seen our "done", and repeat
        // STOP until the handshake is complete and the peer has confirmed it saw our "done". Flags only ever go
        // from 0 to 1, so the exchange ends.
        let changed = self.sent_flags != Some(self.stop_flags());
        let periodic = !(self.handshake_complete() && self.peer_seen_my_done)
            && self.last_stop_at.is_none_or(|t| now.duration_since(t) >= self.cfg.stop_interval);
        if changed || self.reply_stop || periodic {
            self.sent_flags = Some(self.stop_flags());
            self.reply_stop = false;
            self.last_stop_at = Some(now);
            return Some(self.stop());
        }
        None
    }

    /// Write `tx` into `buf` (exactly `tx.len()` bytes).
    pub(crate) fn write(&self, tx: &Tx, buf: &mut [u8]) {
        buf[0..6].fill(0xff);
        buf[6..12].copy_from_slice(&self.cfg.src_mac);
        buf[12..14].copy_from_slice(&ETHERTYPE.to_be_bytes());
        buf[14..18].copy_from_slice(&MAGIC);
        let (kind, flags, a, b) = match *tx {
            Tx::Data { seq, len } => (KIND_DATA, 0, seq, len as u64),
            Tx::Ack { next } => (KIND_ACK, 0, next, 0),
            Tx::Stop { total, received, flags } => (KIND_STOP, flags, total, received),
        };
        buf[18] = kind;
        buf[19] = flags;
        buf[20..22].fill(0);
        buf[22..30].copy_from_slice(&a.to_le_bytes());
        buf[30..38].copy_from_slice(&b.to_le_bytes());
        match *tx {
            Tx::Data { seq, .. } => fill_pattern(seq, &mut buf[HDR..]),
            _ => buf[HDR..].fill(0),
        }
    }

    /// Per-size results of the receive direction: (size, frames verified, frames expected).
    pub(crate) fn rx_results(&self) -> Vec<(usize, u64, u64)> {
        let total = self.peer_total.or(self.total.filter(|_| self.cfg.frames_per_size.is_some()));
        self.cfg
            .sizes
            .iter()
            .enumerate()
            .map(|(i, &s)| (s, self.rx_ok[i], total.map_or(0, |t| self.cfg.count_for(i, t))))
            .collect()
    }

    /// Send rate: my frames per second from start until the last was acknowledged.
    pub(crate) fn tx_rate(&self) -> Option<(u64, f64)> {
        let t = self.tx_done_at?.duration_since(self.start).as_secs_f64();
        let n = self.total?;
        Some((n, if t > 0.0 { n as f64 / t } else { 0.0 }))
    }

    /// Receive rate: the peer's frames per second from the first to the last.
    pub(crate) fn rx_rate(&self) -> Option<(u64, f64)> {
        let t = self.rx_done_at?.duration_since(self.first_rx_at.unwrap_or(self.start)).as_secs_f64();
        Some((self.rx_next, if t > 0.0 { self.rx_next as f64 / t } else { 0.0 }))
    }
}

fn seed(seq: u64) -> u64 {
    (seq ^ 0x5244_5054).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn word(seed: u64, k: usize) -> u64 {
    seed ^ (k as u64 + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9)
}

/// Fill `payload` with frame `seq`'s pattern (little-endian 64-bit words; the tail takes the first bytes of one).
pub(crate) fn fill_pattern(seq: u64, payload: &mut [u8]) {
    let s = seed(seq);
    let mut chunks = payload.chunks_exact_mut(8);
    for (k, chunk) in chunks.by_ref().enumerate() {
        chunk.copy_from_slice(&word(s, k).to_le_bytes());
    }
    let k = payload.len() / 8;
    let tail = &mut payload[k * 8..];
    let n = tail.len();
    tail.copy_from_slice(&word(s, k).to_le_bytes()[..n]);
}

/// Check `payload` against frame `seq`'s pattern; the offset of the first wrong byte otherwise.
pub(crate) fn verify_pattern(seq: u64, payload: &[u8]) -> Result<(), usize> {
    let s = seed(seq);
    let first_diff = |k: usize, got: &[u8]| {
        let want = word(s, k).to_le_bytes();
        k * 8 + got.iter().zip(want).position(|(a, b)| *a != b).unwrap_or(0)
    };
    // Compare whole words first (the common, passing case stays branch-light and vectorisable).
    let words = payload.chunks_exact(8);
    let tail = words.remainder();
    let mut bad = 0u64;
    for (k, chunk) in words.clone().enumerate() {
        bad |= u64::from_le_bytes(chunk.try_into().expect("8 bytes")) ^ word(s, k);
    }
    if bad != 0 {
        let k = words.enumerate().position(|(k, c)| u64::from_le_bytes(c.try_into().expect("8 bytes")) != word(s, k));
        return Err(first_diff(k.unwrap_or(0), &payload[k.unwrap_or(0) * 8..]));
    }
    let k = payload.len() / 8;
    if tail != &word(s, k).to_le_bytes()[..tail.len()] {
        return Err(first_diff(k, tail));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic xorshift for the lossy-link test.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
    }

    /// Run two flows over an in-memory link that drops `loss_pct` % of frames (both ways); returns both flows.
    fn run_pair(loss_pct: u64, frames: u64) -> (Flow, Flow) {
        let t0 = Instant::now();
        let sizes = vec![64, 1024, 4096];
        let a = Flow::new(FlowConfig::count(sizes.clone(), frames, [2, 0, 0, 0, 0, 1]), t0);
        let b = Flow::new(FlowConfig::count(sizes, frames, [2, 0, 0, 0, 0, 2]), t0);
        let mut flows = [a, b];
        let mut rng = Rng(0x1234_5678);
        let mut now = t0;
        let mut buf = vec![0u8; 4096];
        for _ in 0..1_000_000 {
            now += Duration::from_micros(100);
            for dir in 0..2 {
                let (x, y) = flows.split_at_mut(1);
                let (from, to) = if dir == 0 { (&mut x[0], &mut y[0]) } else { (&mut y[0], &mut x[0]) };
                let mut sent = false;
                for _ in 0..8 {
                    let Some(tx) = from.poll_tx(now) else { break };
                    let f = &mut buf[..tx.len()];
                    from.write(&tx, f);
                    sent = true;
                    if rng.next() % 100 >= loss_pct {
                        to.handle_rx(f, now);
                    }
                }
                if !sent {
                    to.rx_idle();
                }
            }
            if flows.iter().all(|f| f.finished(now)) {
                let [a, b] = flows;
                return (a, b);
            }
        }
        panic!("did not finish: {flows:?}");
    }

    #[test]
    fn pattern_round_trip_and_detects_every_byte() {
        let mut p = vec![0u8; 4096 - HDR];
        fill_pattern(7, &mut p);
        assert_eq!(verify_pattern(7, &p), Ok(()));
        assert_eq!(verify_pattern(8, &p), Err(0));
        for i in [0, 1, 7, 8, 100, p.len() - 1] {
            p[i] ^= 0x10;
            assert_eq!(verify_pattern(7, &p), Err(i));
            p[i] ^= 0x10;
        }
    }

    #[test]
    fn lossless_pair_completes_and_verifies_every_size() {
        let (a, b) = run_pair(0, 100);
        for f in [&a, &b] {
            assert_eq!(f.rx_results(), [(64, 100, 100), (1024, 100, 100), (4096, 100, 100)]);
            assert_eq!((f.rx_bad, f.retransmits), (0, 0));
        }
    }

    #[test]
    fn lossy_pair_recovers_with_go_back_n() {
        let (a, b) = run_pair(10, 200);
        for f in [&a, &b] {
            assert_eq!(f.rx_results(), [(64, 200, 200), (1024, 200, 200), (4096, 200, 200)]);
            assert_eq!(f.rx_bad, 0);
            assert!(f.retransmits > 0);
        }
    }

    #[test]
    fn corrupted_frame_is_counted_and_described() {
        let t0 = Instant::now();
        let cfg = FlowConfig::count(vec![64], 1, [0; 6]);
        let mut tx = Flow::new(cfg.clone(), t0);
        let mut rx = Flow::new(cfg, t0);
        let frame = tx.poll_tx(t0).unwrap();
        let mut buf = vec![0u8; frame.len()];
        tx.write(&frame, &mut buf);
        buf[50] ^= 1;
        rx.handle_rx(&buf, t0);
        assert_eq!(rx.rx_bad, 1);
        assert!(rx.first_bad.as_deref().unwrap().contains("byte 50"), "{:?}", rx.first_bad);
        // A frame of another EtherType is ignored, not a failure.
        buf[12] = 0x08;
        rx.handle_rx(&buf, t0);
        assert_eq!((rx.rx_bad, rx.rx_foreign), (1, 1));
    }

    #[test]
    fn timed_mode_fixes_the_total_when_time_is_up() {
        let t0 = Instant::now();
        let mut cfg = FlowConfig::count(vec![64], 0, [0; 6]);
        cfg.frames_per_size = None;
        cfg.duration = Some(Duration::from_millis(1));
        let mut f = Flow::new(cfg, t0);
        assert!(matches!(f.poll_tx(t0), Some(Tx::Data { seq: 0, .. })));
        assert!(matches!(f.poll_tx(t0), Some(Tx::Data { seq: 1, .. })));
        assert_eq!(f.poll_tx(t0 + Duration::from_millis(2)), None);
        assert_eq!(f.total, Some(2));
    }
}
