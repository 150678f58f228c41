//! The DCQCN reaction point (RP) of one QP, in integer fixed point, and its pacer.
//!
//! The equations are those of ROCE-NOTES §3.1 (Zhu et al., SIGCOMM 2015, and the author's ns3-rdma model), with
//! the ConnectX parameter set of §3.2. Written from those equations; no simulator or driver code was copied.
//!
//! ```text
//! on CNP      alpha = g'*alpha + (1-g')               g' = rp_dce_tcp_g/1024 (1019/1024: the paper's g = 5/1024)
//!             Rt = Rc   (first CNP; or clamp_tgt_rate; or clamp_tgt_rate_ati and the timer raised Rc since)
//!             Rc = max(Rc * (1 - alpha / 2^(rp_gd-10)), Rc * rp_min_dec_fac/100, rp_min_rate)
//!             time/byte stages := 0, byte counter := 0, timer T restarts, alpha period K restarts
//! every K     alpha = g'*alpha                          (K = rp_dce_tcp_rtt, only while no CNP arrives)
//! timer T     time stage += 1, then increase           (T = rp_time_reset; T/2 in hyper increase)
//! B bytes     byte stage += 1, then increase           (B = 64 * rp_byte_reset bytes; B/2 in hyper increase)
//! increase    both stages < F:  fast recovery          Rc = (Rc + Rt) / 2
//!             one stage >= F:   additive increase      Rt += R_AI;                      Rc = (Rc + Rt) / 2
//!             both >= F:        hyper increase         Rt += R_HAI * (min stage - F + 1); Rc = (Rc + Rt) / 2
//! ```
//! Decisions where the sources leave room (each a documented reading, `[est]` in the notes' sense):
//! - A QP runs at the line rate with no limiter until its first CNP; the first CNP allocates the limiter with
//!   alpha = `rp_initial_alpha_value` and Rc = Rt = line rate (or `rp_rate_to_set_on_first_cnp` when non-zero, in
//!   which case that rate is set and no further decrease is applied for this CNP). Once Rc climbs back to the
//!   line rate the limiter is released and the QP is unpaced again (as ConnectX frees its rate limiter).
//! - `rp_rate_reduce_monitor_period`: at most one decrease per period. A CNP inside the period still updates alpha
//!   and leaves one decrease pending, applied when the period ends (ConnectX checks once per period whether a CNP
//!   arrived).
//! - Alpha decays lazily: the number of whole K periods since the last CNP is applied when the next CNP arrives,
//!   which equals a timer firing every K µs without per-µs timer events.
//! - Rc = (Rc + Rt) / 2 rounds up, so Rc reaches Rt (and the line rate) instead of stalling one unit below.
//! - ns3-rdma's special case "first stage and Rt > 10*Rc: Rt /= 8" is not part of the ConnectX parameter set and
//!   is not implemented.
//! - `rp_byte_reset` counts 64-byte units: B = 64 * 32767 B ~ 2 MB by default. The vendor text does not give the
//!   unit (ROCE-NOTES §3.2 `[unverified]`; an early mstflint PRM layout says "bytes" next to a default of 150 and a
//!   "TBD: update the PRM"); Google's isekai model of ConnectX DCQCN counts `byte_reset * 64`. Read as bytes, the
//!   15-bit default would raise the rate every 32 KB sent (every 10 µs at 25 Gb/s), far more often than the 300 µs
//!   timer it sits beside: an 8:1 incast at 25 Gb/s then ramps each flow back to the line rate within ~50 µs of
//!   every quiet spell and overflows a 1 MB buffer again and again (jain 0.77, 5133 drops in 20 ms).
//! - Pacing counts frame bytes (Ethernet header to ICRC) at the current rate Rc; a QP that was idle does not bank
//!   credit (the next frame leaves at once, the one after it one frame time later).

use super::{CcState, DcqcnConfig};
use crate::time::{Duration, Instant};

/// Fractional bits of alpha: Q30, so the floor of each of the thousands of decay steps a long idle period can
/// apply costs at most 2^-30 (with Q20, rates drifted 0.1 % from an f64 model after a few hundred steps).
const ALPHA_BITS: u32 = 30;
/// Alpha 1.0.
pub const ALPHA_ONE: u64 = 1 << ALPHA_BITS;
/// Bytes per unit of `rp_byte_reset` (see the module notes).
pub const BYTE_RESET_UNIT: u64 = 64;

/// The parameters converted to the units the arithmetic uses.
#[derive(Clone, Copy, Debug)]
struct Params {
    max_kbps: u64,
    min_kbps: u64,
    ai_kbps: u64,
    hai_kbps: u64,
    first_kbps: u64,
    t_reset: Duration,
    byte_reset: u64,
    threshold: u32,
    gd: u32,
    min_dec_fac: u64,
    g: u64,
    k: Duration,
    rrm: Duration,
    alpha0: u64,
    clamp: bool,
    clamp_ati: bool,
}

/// The DCQCN reaction point of one QP plus its pacer.
#[derive(Clone, Debug)]
pub struct Dcqcn {
    p: Params,
    /// A rate limiter is allocated (a CNP arrived and Rc has not returned to the line rate).
    limited: bool,
    /// Current rate Rc, kb/s.
    rc: u64,
    /// Target rate Rt, kb/s.
    rt: u64,
    /// Alpha, Q30.
    alpha: u64,
    /// Start of the running alpha period (the last CNP).
    alpha_at: Instant,
    /// Time of the last decrease.
    last_cut: Option<Instant>,
    /// A CNP arrived inside the monitor period: decrease at `last_cut + rrm`.
    cut_pending: bool,
    /// The timer raised the rate since the last decrease (for `rp_clamp_tgt_rate_ati`).
    timer_raised: bool,
    time_stage: u32,
    byte_stage: u32,
    /// Bytes sent since the last byte-counter event.
    bytes: u64,
    /// Next rate-increase timer event.
    t_next: Option<Instant>,
    /// Earliest departure of the next frame.
    next_tx: Instant,
    /// Sub-nanosecond remainder of the pacing interval, in ns*kb/s.
    frac: u64,
    decreases: u64,
}

impl Dcqcn {
    /// A reaction point for a port of `line_rate_mbps`.
    pub fn new(c: &DcqcnConfig, line_rate_mbps: u32) -> Dcqcn {
        let line = u64::from(line_rate_mbps.max(1)) * 1000;
        let max_kbps = if c.rp_max_rate == 0 { line } else { (u64::from(c.rp_max_rate) * 1000).min(line) };
        let min_kbps = (u64::from(c.rp_min_rate.max(1)) * 1000).min(max_kbps);
        let p = Params {
            max_kbps,
            min_kbps,
            ai_kbps: u64::from(c.rp_ai_rate) * 1000,
            hai_kbps: u64::from(c.rp_hai_rate) * 1000,
            first_kbps: (u64::from(c.rp_rate_to_set_on_first_cnp) * 1000).min(max_kbps),
            t_reset: Duration::from_micros(u64::from(c.rp_time_reset.max(1))),
            byte_reset: u64::from(c.rp_byte_reset) * BYTE_RESET_UNIT,
            threshold: c.rp_threshold.max(1),
            gd: c.rp_gd.clamp(10, 20),
            min_dec_fac: u64::from(c.rp_min_dec_fac.min(100)),
            g: u64::from(c.rp_dce_tcp_g.min(1024)),
            k: Duration::from_micros(u64::from(c.rp_dce_tcp_rtt.max(1))),
            rrm: Duration::from_micros(u64::from(c.rp_rate_reduce_monitor_period)),
            alpha0: u64::from(c.rp_initial_alpha_value.min(1024)) << (ALPHA_BITS - 10),
            clamp: c.rp_clamp_tgt_rate,
            clamp_ati: c.rp_clamp_tgt_rate_ati,
        };
        let mut d = Dcqcn {
            p,
            limited: false,
            rc: 0,
            rt: 0,
            alpha: 0,
            alpha_at: Instant::ZERO,
            last_cut: None,
            cut_pending: false,
            timer_raised: false,
            time_stage: 0,
            byte_stage: 0,
            bytes: 0,
            t_next: None,
            next_tx: Instant::ZERO,
            frac: 0,
            decreases: 0,
        };
        d.reset();
        d
    }

    /// Back to the line rate with no limiter (QP reset).
    pub fn reset(&mut self) {
        self.release();
        self.alpha = self.p.alpha0;
        self.last_cut = None;
        self.next_tx = Instant::ZERO;
        self.frac = 0;
    }

    fn release(&mut self) {
        self.limited = false;
        self.rc = self.p.max_kbps;
        self.rt = self.p.max_kbps;
        self.cut_pending = false;
        self.timer_raised = false;
        self.time_stage = 0;
        self.byte_stage = 0;
        self.bytes = 0;
        self.t_next = None;
    }

    /// A rate limiter is active (a CNP arrived and the rate has not climbed back to the line rate).
    #[inline]
    pub fn limited(&self) -> bool {
        self.limited
    }

    /// The earliest time the next data frame may leave.
    #[inline]
    pub fn earliest_departure(&self, now: Instant) -> Instant {
        if self.limited {
            self.next_tx
        } else {
            now
        }
    }

    /// A data frame of `bytes` left at `now`: advance the pacer and the byte counter.
    pub fn on_sent(&mut self, now: Instant, bytes: u64) {
        if !self.limited {
            return;
        }
        // Pacing: this frame occupies bytes*8 / Rc of the QP's time; nanoseconds = bytes * 8e6 / kb/s.
        if self.next_tx < now {
            self.next_tx = now;
            self.frac = 0;
        }
        let num = bytes * 8_000_000 + self.frac;
        self.next_tx += Duration::from_nanos(num / self.rc);
        self.frac = num % self.rc;
        if self.p.byte_reset > 0 {
            self.bytes += bytes;
            let thr = if self.hyper() { (self.p.byte_reset / 2).max(1) } else { self.p.byte_reset };
            if self.bytes >= thr {
                self.bytes = (self.bytes - thr).min(thr - 1);
                self.byte_stage = self.byte_stage.saturating_add(1);
                self.increase(now);
            }
        }
    }

    /// A CNP arrived at `now`.
    pub fn on_cnp(&mut self, now: Instant) {
        if !self.limited {
            // The first CNP allocates a rate limiter.
            self.limited = true;
            self.alpha = self.p.alpha0;
            self.alpha_at = now;
            self.rc = self.p.max_kbps;
            self.rt = self.p.max_kbps;
            if self.p.first_kbps > 0 {
                self.set_rate(now, self.p.first_kbps.max(self.p.min_kbps));
                self.rt = self.rc;
                self.after_decrease(now);
                return;
            }
        } else {
            self.decay_alpha(now);
            //= DCQCN SIGCOMM'15 RP: alpha = (1 - g) * alpha + g on a CNP (g = (1024 - rp_dce_tcp_g) / 1024)
            self.alpha = (self.alpha * self.p.g + ((1024 - self.p.g) << ALPHA_BITS)) / 1024;
            self.alpha_at = now;
        }
        let free = match self.last_cut {
            None => true,
            Some(t) => now >= t + self.p.rrm,
        };
        if free {
            self.decrease(now);
        } else {
            self.cut_pending = true;
        }
    }

    /// Applies the alpha decays of every whole period K since the last CNP: alpha * (g/1024)^periods, the power by
    /// squaring in Q62 (a handful of multiplications however long the idle gap; one step per period cost up to
    /// ~8000 dependent multiplications, ~9 us, on the CNP after a long idle gap). The result is the exact product
    /// rounded down once, at most a few 2^-62 below it, where a floor per step lost up to 2^-30 each.
    fn decay_alpha(&mut self, now: Instant) {
        let periods = (now - self.alpha_at).as_nanos() / self.p.k.as_nanos().max(1);
        if self.p.g >= 1024 || periods == 0 || self.alpha == 0 {
            return;
        }
        if periods >= 8192 {
            // Below 2^-30 long before this many periods at any g < 1024 that matters (1023/1024: ~2e-4).
            self.alpha = 0;
            return;
        }
        const ONE: u128 = 1 << 62;
        let mul = |a: u128, b: u128| (a * b) >> 62;
        let (mut pow, mut base, mut n) = (ONE, u128::from(self.p.g) << 52, periods);
        while n > 0 {
            if n & 1 == 1 {
                pow = mul(pow, base);
            }
            base = mul(base, base);
            n >>= 1;
        }
        self.alpha = ((u128::from(self.alpha) * pow) >> 62) as u64;
    }

    /// The rate decrease of a CNP.
    fn decrease(&mut self, now: Instant) {
        // Rt keeps the rate before a run of CNPs unless the rate was raised since the last decrease: by the byte
        // counter (always), by the timer (with clamp_tgt_rate_ati), or on every decrease with clamp_tgt_rate.
        // (On the first CNP Rt = Rc = line rate already.)
        let raised_by_bytes = self.byte_stage > 0;
        if self.p.clamp || raised_by_bytes || (self.p.clamp_ati && self.timer_raised) {
            self.rt = self.rc;
        }
        //= DCQCN SIGCOMM'15 RP: Rc = Rc * (1 - alpha / 2), here alpha / 2^(rp_gd - 10)
        let cut = ((u128::from(self.rc) * u128::from(self.alpha)) >> (self.p.gd - 10 + ALPHA_BITS)) as u64;
        let floor = self.rc * self.p.min_dec_fac / 100;
        let rc = (self.rc - cut.min(self.rc)).max(floor).max(self.p.min_kbps).min(self.p.max_kbps);
        self.set_rate(now, rc);
        self.after_decrease(now);
    }

    fn after_decrease(&mut self, now: Instant) {
        self.decreases += 1;
        self.last_cut = Some(now);
        self.cut_pending = false;
        self.timer_raised = false;
        self.time_stage = 0;
        self.byte_stage = 0;
        self.bytes = 0;
        self.t_next = Some(now + self.p.t_reset);
    }

    #[inline]
    fn hyper(&self) -> bool {
        self.time_stage >= self.p.threshold && self.byte_stage >= self.p.threshold
    }

    /// Changes Rc; the part of the current pacing gap still ahead is rescaled to the new rate, so a rate change
    /// takes effect at once (a frame sent at 1 Mb/s does not hold the QP for 33 ms after the rate recovered).
    fn set_rate(&mut self, now: Instant, rc: u64) {
        if rc != self.rc && self.next_tx > now {
            let left = (self.next_tx - now).as_nanos();
            self.next_tx = now + Duration::from_nanos(left * self.rc / rc);
            self.frac = 0;
        }
        self.rc = rc;
    }

    /// One rate-increase event (the caller bumped the stage that caused it).
    fn increase(&mut self, now: Instant) {
        let f = self.p.threshold;
        if self.hyper() {
            let n = u64::from(self.time_stage.min(self.byte_stage) - f + 1);
            self.rt = self.rt.saturating_add(self.p.hai_kbps.saturating_mul(n));
        } else if self.time_stage >= f || self.byte_stage >= f {
            self.rt = self.rt.saturating_add(self.p.ai_kbps);
        }
        self.rt = self.rt.min(self.p.max_kbps);
        let rc = (self.rc + self.rt).div_ceil(2).min(self.p.max_kbps);
        self.set_rate(now, rc);
        if self.rc >= self.p.max_kbps {
            // Back at the line rate: the limiter is freed (a later CNP starts again from the initial alpha).
            self.release();
        }
    }

    /// Runs the rate-increase timer and a pending decrease whose time has come.
    pub fn on_timer(&mut self, now: Instant) {
        if !self.limited {
            return;
        }
        if self.cut_pending {
            if let Some(t) = self.last_cut {
                if now >= t + self.p.rrm {
                    self.decrease(now);
                }
            }
        }
        if let Some(t) = self.t_next {
            if now >= t {
                self.time_stage = self.time_stage.saturating_add(1);
                self.timer_raised = true;
                self.increase(now);
                if self.limited {
                    let period =
                        if self.hyper() { Duration::from_nanos(self.p.t_reset.as_nanos() / 2) } else { self.p.t_reset };
                    // At the end of representable time `now + period` saturates to `now`: a deadline already due
                    // would run again at once, for ever (the engine's handle_timeout would never return). The
                    // timer stops there instead.
                    let next = now + period;
                    self.t_next = (next > now && !self.stuck()).then_some(next);
                }
            }
        }
    }

    /// True if no increase event can change the rate again before the next CNP: Rc has reached Rt, and Rt cannot
    /// grow (no additive step, and no hyper step: rp_hai_rate 0 or no byte counter to reach the hyper stage). The
    /// rate-increase timer then stops: it would fire every T (T/2) for ever and change nothing (with
    /// rp_time_reset = 1 a limited QP, idle or not, woke its engine every microsecond for good).
    fn stuck(&self) -> bool {
        self.rc == self.rt && self.p.ai_kbps == 0 && (self.p.hai_kbps == 0 || self.p.byte_reset == 0)
    }

    /// When `on_timer` has work next.
    #[inline]
    pub fn next_timer(&self) -> Option<Instant> {
        let cut = match (self.cut_pending, self.last_cut) {
            (true, Some(t)) => Some(t + self.p.rrm),
            _ => None,
        };
        match (cut, self.t_next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Decreases so far.
    pub fn rate_decreases(&self) -> u64 {
        self.decreases
    }

    /// Current rate Rc, kb/s.
    pub fn rate_kbps(&self) -> u64 {
        self.rc
    }

    /// A snapshot.
    pub fn state(&self) -> CcState {
        let alpha_q20 = (self.alpha >> (ALPHA_BITS - 20)) as u32;
        CcState { rate_kbps: self.rc, target_kbps: self.rt, alpha_q20, limited: self.limited }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn us(t: u64) -> Instant {
        Instant::from_micros(t)
    }

    /// Alpha after a gap of n whole periods is alpha * (g/1024)^n to within 2^-30 (session 12: one floor per
    /// period, the old loop, ended up to n * 2^-30 low: ~2600 ulps after 5000 periods at g = 1023).
    #[test]
    fn alpha_decay_over_a_long_gap_is_the_power_rounded_once() {
        for (g, n) in [(1023u32, 5000u64), (1023, 1), (1023, 8191), (1019, 10), (1019, 700), (1, 3), (0, 2)] {
            let c = DcqcnConfig { rp_dce_tcp_g: g, ..DcqcnConfig::default() };
            let mut d = Dcqcn::new(&c, 25_000);
            d.on_cnp(us(10));
            let a0 = d.alpha;
            let k = d.p.k.as_nanos();
            d.decay_alpha(d.alpha_at + Duration::from_nanos(n * k + k / 2));
            let want = a0 as f64 * (f64::from(g) / 1024.0).powi(n as i32);
            assert!((d.alpha as f64 - want).abs() <= 1.0, "g {g} n {n}: alpha {} want {want}", d.alpha);
            assert!(d.alpha as f64 <= want + 1e-6, "g {g} n {n}: rounded up");
        }
    }

    #[test]
    fn first_cnp_halves_then_min_dec_fac_bounds_the_cut() {
        let mut d = Dcqcn::new(&DcqcnConfig::default(), 25_000);
        assert_eq!(d.earliest_departure(us(1)), us(1));
        d.on_cnp(us(10));
        // alpha = 1023/1024: Rc = 25e6 * (1 - 1023/2048) = 12_512_207.03 kb/s (floor of the cut rounds Rc up).
        assert_eq!(d.rate_kbps(), 25_000_000 - 25_000_000 * 1023 / 2048);
        assert_eq!(d.state().target_kbps, 25_000_000);
        // gd = 10 would cut by alpha ~ 1: min_dec_fac = 50 keeps half.
        let mut d = Dcqcn::new(&DcqcnConfig { rp_gd: 10, ..DcqcnConfig::default() }, 25_000);
        d.on_cnp(us(10));
        assert_eq!(d.rate_kbps(), 12_500_000);
    }

    #[test]
    fn rate_to_set_on_first_cnp_and_max_rate() {
        let c = DcqcnConfig { rp_rate_to_set_on_first_cnp: 5_000, rp_max_rate: 20_000, ..DcqcnConfig::default() };
        let mut d = Dcqcn::new(&c, 25_000);
        assert_eq!(d.rate_kbps(), 20_000_000, "rp_max_rate caps the line rate");
        d.on_cnp(us(10));
        // The first CNP sets the configured rate (and target) without a further cut.
        assert_eq!((d.rate_kbps(), d.state().target_kbps, d.rate_decreases()), (5_000_000, 5_000_000, 1));
        d.on_cnp(us(20));
        // Then a normal decrease: alpha decayed for 10 periods, raised by the CNP, Rc * (1 - alpha / 2).
        let g: f64 = 1019.0 / 1024.0;
        let alpha = 1023.0 / 1024.0 * g.powi(10) * g + (1.0 - g);
        let want = 5_000_000.0 * (1.0 - alpha / 2.0);
        assert!((d.rate_kbps() as f64 - want).abs() < 2.0, "{} vs {want}", d.rate_kbps());
        assert_eq!(d.rate_decreases(), 2);
        // A first-CNP rate above the maximum is capped to it.
        let c = DcqcnConfig { rp_rate_to_set_on_first_cnp: 90_000, ..DcqcnConfig::default() };
        let mut d = Dcqcn::new(&c, 25_000);
        d.on_cnp(us(1));
        assert_eq!(d.rate_kbps(), 25_000_000);
    }

    #[test]
    fn monitor_period_folds_cnps_into_one_deferred_decrease() {
        let mut d = Dcqcn::new(&DcqcnConfig::default(), 25_000);
        d.on_cnp(us(10));
        let r1 = d.rate_kbps();
        d.on_cnp(us(11)); // inside the 4 µs period
        d.on_cnp(us(12));
        assert_eq!(d.rate_kbps(), r1);
        assert_eq!(d.next_timer(), Some(us(14)));
        d.on_timer(us(14));
        assert!(d.rate_kbps() < r1);
        assert_eq!(d.rate_decreases(), 2);
        assert_eq!(d.next_timer(), Some(us(14 + 300)));
    }

    #[test]
    fn pacing_spaces_frames_at_the_current_rate_exactly() {
        let mut d = Dcqcn::new(&DcqcnConfig { rp_byte_reset: 0, ..DcqcnConfig::default() }, 10_000);
        d.on_cnp(us(0));
        let rate = d.rate_kbps(); // ~5 Gb/s
        let t0 = us(1);
        assert!(d.earliest_departure(t0) <= t0);
        let mut t = t0;
        for _ in 0..1000 {
            d.on_sent(t, 1000);
            t = d.earliest_departure(t);
        }
        // 1000 frames of 8000 bits at `rate` kb/s, to the nanosecond (the remainder is carried).
        let want = 1000 * 8_000 * 1_000_000 / rate;
        assert_eq!((t - t0).as_nanos(), want);
    }

    #[test]
    fn random_configs_and_events_keep_min_le_rc_le_rt_le_max() {
        use crate::sim::SimRng;
        let mut rng = SimRng::new(0xdc9c);
        for _ in 0..200 {
            let line = 1_000 + rng.below(400_000) as u32;
            let c = DcqcnConfig {
                rp_clamp_tgt_rate: rng.below(2) == 0,
                rp_clamp_tgt_rate_ati: rng.below(2) == 0,
                rp_time_reset: 1 + rng.below(500) as u32,
                rp_byte_reset: if rng.below(3) == 0 { 0 } else { 1 + rng.below(32_767) as u32 },
                rp_threshold: 1 + rng.below(5) as u32,
                rp_ai_rate: rng.below(100) as u32,
                rp_hai_rate: rng.below(1_000) as u32,
                rp_gd: 10 + rng.below(4) as u32,
                rp_min_dec_fac: rng.below(101) as u32,
                rp_min_rate: 1 + rng.below(2_000) as u32,
                rp_rate_to_set_on_first_cnp: if rng.below(2) == 0 { 0 } else { rng.below(50_000) as u32 },
                rp_dce_tcp_g: 900 + rng.below(125) as u32,
                rp_dce_tcp_rtt: 1 + rng.below(60) as u32,
                rp_rate_reduce_monitor_period: rng.below(20) as u32,
                rp_initial_alpha_value: rng.below(1025) as u32,
                rp_max_rate: if rng.below(2) == 0 { 0 } else { 1 + rng.below(500_000) as u32 },
                ..DcqcnConfig::default()
            };
            let mut d = Dcqcn::new(&c, line);
            let max = u64::from(line) * 1000;
            let min = (u64::from(c.rp_min_rate) * 1000).min(d.p.max_kbps);
            let mut now = Instant::ZERO;
            for _ in 0..500 {
                now += Duration::from_nanos(rng.below(50_000));
                while let Some(t) = d.next_timer().filter(|&t| t <= now) {
                    d.on_timer(t);
                    assert!(d.next_timer().is_none_or(|n| n > t), "a timer that does not advance");
                }
                match rng.below(3) {
                    0 => d.on_cnp(now),
                    _ => d.on_sent(now, 64 + rng.below(9000)),
                }
                let s = d.state();
                assert!(min <= s.rate_kbps && s.rate_kbps <= s.target_kbps && s.target_kbps <= max, "{c:?} {s:?}");
                assert!(u64::from(s.alpha_q20) <= 1 << 20);
            }
        }
    }

    #[test]
    fn unvalidated_extremes_from_the_api_never_overflow_and_keep_the_rate_in_bounds() {
        // EngineConfig::cc is not validated: every field at 0 and at its maximum, with line rates of 1 Mb/s and
        // u32::MAX Mb/s. Debug builds panic on an arithmetic overflow, so reaching the end is the check.
        let lo = DcqcnConfig {
            rp_clamp_tgt_rate: false,
            rp_clamp_tgt_rate_ati: false,
            rp_time_reset: 0,
            rp_byte_reset: 0,
            rp_threshold: 0,
            rp_ai_rate: 0,
            rp_hai_rate: 0,
            rp_gd: 0,
            rp_min_dec_fac: 0,
            rp_min_rate: 0,
            rp_rate_to_set_on_first_cnp: 0,
            rp_dce_tcp_g: 0,
            rp_dce_tcp_rtt: 0,
            rp_rate_reduce_monitor_period: 0,
            rp_initial_alpha_value: 0,
            rp_max_rate: 0,
            np_min_time_between_cnps: 0,
            np_cnp_dscp: 0,
            np_cnp_prio: 0,
        };
        let m = u32::MAX;
        let hi = DcqcnConfig {
            rp_clamp_tgt_rate: true,
            rp_clamp_tgt_rate_ati: true,
            rp_time_reset: m,
            rp_byte_reset: m,
            rp_threshold: m,
            rp_ai_rate: m,
            rp_hai_rate: m,
            rp_gd: m,
            rp_min_dec_fac: m,
            rp_min_rate: m,
            rp_rate_to_set_on_first_cnp: m,
            rp_dce_tcp_g: m,
            rp_dce_tcp_rtt: m,
            rp_rate_reduce_monitor_period: m,
            rp_initial_alpha_value: m,
            rp_max_rate: m,
            np_min_time_between_cnps: m,
            np_cnp_dscp: u8::MAX,
            np_cnp_prio: u8::MAX,
        };
        let mut rng = crate::sim::SimRng::new(7);
        for base in [lo, hi] {
            for flip in 0..16u32 {
                // One field at a time from the other extreme (15 cases), and the base itself.
                let mut c = base;
                let o = if base == lo { hi } else { lo };
                match flip {
                    0 => c.rp_time_reset = o.rp_time_reset,
                    1 => c.rp_byte_reset = o.rp_byte_reset,
                    2 => c.rp_threshold = o.rp_threshold,
                    3 => c.rp_ai_rate = o.rp_ai_rate,
                    4 => c.rp_hai_rate = o.rp_hai_rate,
                    5 => c.rp_gd = o.rp_gd,
                    6 => c.rp_min_dec_fac = o.rp_min_dec_fac,
                    7 => c.rp_min_rate = o.rp_min_rate,
                    8 => c.rp_rate_to_set_on_first_cnp = o.rp_rate_to_set_on_first_cnp,
                    9 => c.rp_dce_tcp_g = o.rp_dce_tcp_g,
                    10 => c.rp_dce_tcp_rtt = o.rp_dce_tcp_rtt,
                    11 => c.rp_rate_reduce_monitor_period = o.rp_rate_reduce_monitor_period,
                    12 => c.rp_initial_alpha_value = o.rp_initial_alpha_value,
                    13 => c.rp_max_rate = o.rp_max_rate,
                    14 => c.rp_clamp_tgt_rate = o.rp_clamp_tgt_rate,
                    _ => {}
                }
                for line in [1, 25_000, u32::MAX] {
                    let mut d = Dcqcn::new(&c, line);
                    let (min, max) = (d.p.min_kbps, d.p.max_kbps);
                    assert!(1_000 <= min && min <= max && max <= u64::from(line) * 1000, "{c:?} {line}");
                    let mut now = Instant::ZERO;
                    for _ in 0..300 {
                        now += Duration::from_nanos(rng.below(20_000_000));
                        let mut n = 0;
                        while let Some(t) = d.next_timer().filter(|&t| t <= now) {
                            d.on_timer(t);
                            n += 1;
                            assert!(n < 100_000, "{c:?}: the timer does not advance");
                        }
                        match rng.below(3) {
                            0 => d.on_cnp(now),
                            _ => {
                                let at = d.earliest_departure(now).max(now);
                                d.on_sent(at, 64 + rng.below(9000));
                            }
                        }
                        let s = d.state();
                        assert!(
                            min <= s.rate_kbps && s.rate_kbps <= s.target_kbps && s.target_kbps <= max,
                            "{c:?} {s:?}"
                        );
                    }
                    // The end of representable time as well.
                    d.on_cnp(Instant::MAX);
                    d.on_timer(Instant::MAX);
                    d.on_sent(Instant::MAX, 9000);
                    let s = d.state();
                    assert!(min <= s.rate_kbps && s.rate_kbps <= s.target_kbps && s.target_kbps <= max, "{c:?} {s:?}");
                }
            }
        }
    }

    #[test]
    fn no_timer_is_left_due_after_it_ran_at_the_end_of_time() {
        // A limited rate that can rise no further than its clamped target (no additive step; an idle QP has no byte
        // events for the hyper stage): the timer stays armed. Run at Instant::MAX it may not re-arm itself due.
        let c = DcqcnConfig { rp_ai_rate: 0, rp_clamp_tgt_rate: true, ..DcqcnConfig::default() };
        let mut d = Dcqcn::new(&c, 25_000);
        d.on_cnp(us(10));
        d.on_cnp(us(20));
        assert!(d.state().rate_kbps < d.state().target_kbps && d.next_timer().is_some());
        d.on_timer(Instant::MAX);
        assert!(d.state().limited);
        assert_eq!(d.next_timer(), None, "a timer due at the end of time runs again at once, for ever");
    }

    #[test]
    fn recovers_to_line_rate_and_releases_the_limiter() {
        let mut d = Dcqcn::new(&DcqcnConfig::default(), 25_000);
        d.on_cnp(us(0));
        let mut now = us(0);
        while let Some(t) = d.next_timer() {
            now = t;
            d.on_timer(now);
            assert!(d.rate_kbps() >= 1_000 && d.rate_kbps() <= 25_000_000);
        }
        assert!(!d.state().limited);
        assert_eq!(d.rate_kbps(), 25_000_000);
        assert!(now < us(100_000));
    }
}
