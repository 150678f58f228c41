//! Congestion control: the DCQCN reaction point (RP, [`dcqcn`]), the notification point (NP, [`np`]) and the
//! per-QP pacer the engine consults before every data frame.
//!
//! The engine talks to a QP's [`RateController`] through four calls: `earliest_departure(now)` before a data
//! frame (requests of the send queue and READ responses; never ACKs or CNPs), `on_sent(now, bytes)` after it,
//! `on_cnp(now)` when a CNP for the QP arrives, and `on_timer(now)` when the deadline from `next_timer()` passes.
//! Dispatch is an enum `match` (STYLE §7.2 item 5): no `dyn` call per packet, and the [`RateController::LineRate`]
//! arm of every call is a constant the compiler folds away, so congestion control switched off costs one
//! well-predicted branch per frame, and DCQCN without congestion (no limiter) the same: the engine calls `on_sent`
//! only while [`RateController::limited`].
//!
//! What is paced: every data-carrying frame a QP sends, i.e. its requests (SEND/WRITE data, READ requests,
//! atomics) and the READ responses its responder sends. A CNP names the QP whose frames were marked; for READ
//! traffic the marked frames are the responder's READ responses, so the same QP's limiter must slow them (a
//! limiter on the send queue alone would receive CNPs for traffic it cannot slow). ACKs, NAKs, atomic ACKs and
//! CNPs are never held. `earliest_departure` takes no frame size: the gap a frame occupies is charged after it
//! leaves (`on_sent(now, bytes)`), so the size of the next frame is not needed to decide whether it may leave.
//!
//! All arithmetic is integer fixed point (rates in kb/s, alpha in 2^-30 units, time in ns), so a simulation gives
//! the same trace bit for bit on every machine.
//!
//! Parameter names and defaults are the ConnectX ones (`/sys/kernel/debug/mlx5/<pci>/cc_params/rp_*`, `np_*`;
//! ROCE-NOTES §3.2), so an operator's tuning carries over.

pub mod dcqcn;
pub mod np;

pub use dcqcn::Dcqcn;
pub use np::NotificationPoint;

use crate::time::Instant;

/// DCQCN parameters with the ConnectX names and defaults (ROCE-NOTES §3.2). Units are the firmware's: µs, Mb/s,
/// bytes, percent, and 1/1024 fixed point for `rp_dce_tcp_g` and `rp_initial_alpha_value`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize), serde(default, deny_unknown_fields))]
pub struct DcqcnConfig {
    /// If true, every rate decrease first sets the target rate to the current rate (ConnectX `clamp_tgt_rate`,
    /// default false).
    pub rp_clamp_tgt_rate: bool,
    /// If true, a decrease sets the target rate to the current rate when the rate was raised by the timer since
    /// the previous decrease, not only by the byte counter (`clamp_tgt_rate_after_time_inc`, default true).
    pub rp_clamp_tgt_rate_ati: bool,
    /// Rate-increase timer T, µs (`rpg_time_reset`, default 300).
    pub rp_time_reset: u32,
    /// Byte counter B: a rate-increase event every `64 * rp_byte_reset` bytes sent, 0 = off (`rpg_byte_reset`, a
    /// 15-bit field, default 32767 = ~2 MB; the vendor does not state the unit: 64-byte units as Google's isekai
    /// model of ConnectX reads it, see [`dcqcn`]).
    pub rp_byte_reset: u32,
    /// F: the number of timer / byte-counter stages of fast recovery (`rpg_threshold`, default 1).
    pub rp_threshold: u32,
    /// Additive-increase step R_AI, Mb/s (`rpg_ai_rate`, default 5).
    pub rp_ai_rate: u32,
    /// Hyper-increase step R_HAI, Mb/s (`rpg_hai_rate`, default 50).
    pub rp_hai_rate: u32,
    /// Rate decrease divides alpha by 2^(rp_gd - 10): 11 gives the paper's `Rc * (1 - alpha/2)` (`rpg_gd`,
    /// default 11; 10..=20 accepted).
    pub rp_gd: u32,
    /// A single decrease keeps at least this percentage of the rate (`rpg_min_dec_fac`, default 50).
    pub rp_min_dec_fac: u32,
    /// Lowest rate, Mb/s (`rpg_min_rate`, default 1).
    pub rp_min_rate: u32,
    /// Rate set when the first CNP allocates a rate limiter to the QP, Mb/s; 0 = start from the line rate and
    /// apply the normal decrease (`rate_to_set_on_first_cnp`, default 0).
    pub rp_rate_to_set_on_first_cnp: u32,
    /// Alpha gain in 1/1024: `alpha = g/1024 * alpha (+ (1024-g)/1024 on a CNP)` (`dce_tcp_g`, default 1019).
    pub rp_dce_tcp_g: u32,
    /// Alpha update period K, µs: alpha decays once per period without a CNP (`dce_tcp_rtt`, default 1).
    pub rp_dce_tcp_rtt: u32,
    /// Least time between two rate decreases, µs; CNPs inside it are folded into one decrease at its end
    /// (`rate_reduce_monitor_period`, default 4).
    pub rp_rate_reduce_monitor_period: u32,
    /// Alpha when the first CNP arrives, in 1/1024 (`initial_alpha_value`, default 1023).
    pub rp_initial_alpha_value: u32,
    /// Highest rate, Mb/s; 0 = the line rate (`rpg_max_rate`, default 0).
    pub rp_max_rate: u32,
    /// NP: least time between two CNPs sent for one QP, µs (`min_time_between_cnps`, default 4; the paper and
    /// ns3-rdma use 50).
    pub np_min_time_between_cnps: u32,
    /// NP: DSCP of the CNPs we send (`cnp_dscp`, default 48).
    pub np_cnp_dscp: u8,
    /// NP: 802.1p priority of the CNPs we send; only written when the QP's frames carry a VLAN tag
    /// (`cnp_802p_prio`, default 6).
    pub np_cnp_prio: u8,
}

impl Default for DcqcnConfig {
    fn default() -> Self {
        DcqcnConfig {
            rp_clamp_tgt_rate: false,
            rp_clamp_tgt_rate_ati: true,
            rp_time_reset: 300,
            rp_byte_reset: 32767,
            rp_threshold: 1,
            rp_ai_rate: 5,
            rp_hai_rate: 50,
            rp_gd: 11,
            rp_min_dec_fac: 50,
            rp_min_rate: 1,
            rp_rate_to_set_on_first_cnp: 0,
            rp_dce_tcp_g: 1019,
            rp_dce_tcp_rtt: 1,
            rp_rate_reduce_monitor_period: 4,
            rp_initial_alpha_value: 1023,
            rp_max_rate: 0,
            np_min_time_between_cnps: 4,
            np_cnp_dscp: 48,
            np_cnp_prio: 6,
        }
    }
}

impl DcqcnConfig {
    /// The ConnectX defaults with the one change an 8:1 incast at 25 Gb/s into a 1 MB switch buffer needs to
    /// stay drop-free without PFC: `rp_dce_tcp_g` 1019 -> 1022, so alpha's memory (1024 / (1024 - g) alpha
    /// periods of 1 µs) grows from 0.2 ms to 0.5 ms, longer than the 300 µs rate-increase timer.
    ///
    /// Why the defaults drop (the incast simulator, `roce_dp::sim::incast`, RED 20/200 KiB at 10 %, seeds 1..16):
    /// eight flows starting together at the line rate build ~600 KB before the first CNPs act; every frame leaving
    /// that queue is marked, so each flow is cut about 20 times while it drains and ends near the minimum rate,
    /// with its target rate still at the line rate (nothing raised it between the cuts, so no clamp). 300 µs
    /// later the timer's fast recovery, Rc = (Rc + Rt) / 2, sends all eight back to 12.5 Gb/s at once: 100 Gb/s
    /// into 25 Gb/s. By then alpha has decayed to 0.23 of its value (1019/1024 per µs) and each flow gets a CNP
    /// only every ~10 µs (its share of the departures), so the cuts are ~5 % each and the buffer overflows for
    /// ~250 µs: 78-105 drops per run (1523 in 16 runs), all between 0.6 and 0.9 ms. Afterwards there are no
    /// drops, and from 10 ms on Jain is at least 0.98 and utilisation at least 0.997. With 1021 no run drops
    /// (peak queue 779 KiB), with 1022 the peak is 649 KiB (Jain at least 0.98, utilisation at least 0.998).
    /// `rp_dce_tcp_rtt` 2 with g = 1019 (0.4 ms of memory) works as well: no drops in 16 runs, peak 649 KiB. A
    /// lossless fabric (PFC) absorbs the same transient instead.
    pub fn connectx_lossy() -> DcqcnConfig {
        DcqcnConfig { rp_dce_tcp_g: 1022, ..DcqcnConfig::default() }
    }

    /// The timing of the DCQCN author's ns3-rdma sample configuration (ROCE-NOTES §3.1: alpha period K = 55 µs,
    /// g = 1/256, rate-increase timer T = 60 µs, byte counter off, F = 5, R_AI = 40 Mb/s, R_HAI = 200 Mb/s) with a
    /// 10 µs CNP interval and decrease period; everything else as ConnectX.
    ///
    /// Its additive increase (40 Mb/s every 60 µs) is ~50 times the ConnectX one (5 Mb/s every 300 µs), so flows
    /// that start at different rates converge to their fair shares within milliseconds; with the ConnectX
    /// defaults a flow joining a running 3:1 incast keeps 1.3-1.4x its share for at least 40 ms. The paper's 50 µs
    /// CNP interval reacts too slowly to a simultaneous start and overflows a 1 MB buffer once; 10 µs does not.
    pub fn ns3_sample() -> DcqcnConfig {
        DcqcnConfig {
            rp_dce_tcp_rtt: 55,
            rp_dce_tcp_g: 1020,
            rp_time_reset: 60,
            rp_byte_reset: 0,
            rp_threshold: 5,
            rp_ai_rate: 40,
            rp_hai_rate: 200,
            np_min_time_between_cnps: 10,
            rp_rate_reduce_monitor_period: 10,
            ..DcqcnConfig::default()
        }
    }

    /// Checks every value against its range; the error names the parameter.
    pub fn validate(&self) -> Result<(), String> {
        let checks: [(&str, u64, u64, u64); 13] = [
            ("rp_time_reset", self.rp_time_reset.into(), 1, 10_000_000),
            ("rp_byte_reset", self.rp_byte_reset.into(), 0, 32_767),
            ("rp_threshold", self.rp_threshold.into(), 1, 1_000),
            ("rp_ai_rate", self.rp_ai_rate.into(), 0, 1_600_000),
            ("rp_hai_rate", self.rp_hai_rate.into(), 0, 1_600_000),
            ("rp_gd", self.rp_gd.into(), 10, 20),
            ("rp_min_dec_fac", self.rp_min_dec_fac.into(), 0, 100),
            ("rp_min_rate", self.rp_min_rate.into(), 1, 1_600_000),
            ("rp_dce_tcp_g", self.rp_dce_tcp_g.into(), 0, 1024),
            ("rp_dce_tcp_rtt", self.rp_dce_tcp_rtt.into(), 1, 10_000_000),
            ("rp_rate_reduce_monitor_period", self.rp_rate_reduce_monitor_period.into(), 0, 10_000_000),
            ("rp_initial_alpha_value", self.rp_initial_alpha_value.into(), 0, 1024),
            ("np_cnp_dscp", self.np_cnp_dscp.into(), 0, 63),
        ];
        for (name, v, lo, hi) in checks {
            if v < lo || v > hi {
                return Err(format!("{name} = {v} is outside {lo}..={hi}"));
            }
        }
        if self.np_cnp_prio > 7 {
            return Err(format!("np_cnp_prio = {} is outside 0..=7", self.np_cnp_prio));
        }
        if self.np_min_time_between_cnps > 10_000_000 {
            return Err(format!(
                "np_min_time_between_cnps = {} is outside 0..=10000000",
                self.np_min_time_between_cnps
            ));
        }
        Ok(())
    }
}

/// The reaction-point algorithm of every QP of an engine.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize), serde(rename_all = "snake_case"))]
pub enum CcAlgorithm {
    /// No congestion control: frames leave as fast as the port takes them; CNPs are counted and ignored.
    #[default]
    LineRate,
    /// DCQCN (ConnectX parameter set).
    Dcqcn,
}

/// Congestion-control configuration of an engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize), serde(default, deny_unknown_fields))]
pub struct CcConfig {
    /// Reaction point (rate control of what our QPs send).
    pub algorithm: CcAlgorithm,
    /// Notification point: answer CE-marked frames with CNPs (ConnectX enables it by default).
    pub np_enabled: bool,
    /// The port's line rate, Mb/s: the highest DCQCN rate when `rp_max_rate` is 0.
    pub line_rate_mbps: u32,
    /// DCQCN parameters (also the NP's CNP interval, DSCP and priority).
    pub dcqcn: DcqcnConfig,
}

impl Default for CcConfig {
    fn default() -> Self {
        CcConfig {
            algorithm: CcAlgorithm::LineRate,
            np_enabled: true,
            line_rate_mbps: 100_000,
            dcqcn: DcqcnConfig::default(),
        }
    }
}

impl CcConfig {
    /// Checks the configuration; the error names the parameter.
    pub fn validate(&self) -> Result<(), String> {
        if self.line_rate_mbps == 0 || self.line_rate_mbps > 1_600_000 {
            return Err(format!("line_rate_mbps = {} is outside 1..=1600000", self.line_rate_mbps));
        }
        self.dcqcn.validate()
    }
}

/// A snapshot of a QP's rate control for tools and tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CcState {
    /// Current rate Rc in kb/s (the line rate when no limiter is active).
    pub rate_kbps: u64,
    /// Target rate Rt in kb/s.
    pub target_kbps: u64,
    /// Alpha in 2^-20 units (1.0 = 1 << 20), as of the last CNP.
    pub alpha_q20: u32,
    /// A rate limiter is active (a CNP arrived and the rate has not yet climbed back to the line rate).
    pub limited: bool,
}

/// Per-QP rate control, statically dispatched.
// The DCQCN variant lives inline in the (boxed) QP: boxing it would add a pointer chase per data frame.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug)]
pub enum RateController {
    /// No congestion control.
    LineRate,
    /// DCQCN reaction point and pacer.
    Dcqcn(Dcqcn),
}

impl RateController {
    /// The controller a new QP gets under `cfg`.
    pub fn new(cfg: &CcConfig) -> RateController {
        match cfg.algorithm {
            CcAlgorithm::LineRate => RateController::LineRate,
            CcAlgorithm::Dcqcn => RateController::Dcqcn(Dcqcn::new(&cfg.dcqcn, cfg.line_rate_mbps)),
        }
    }

    /// The earliest time the next data frame may leave (`now` or earlier means at once).
    #[inline(always)]
    pub fn earliest_departure(&self, now: Instant) -> Instant {
        match self {
            RateController::LineRate => now,
            RateController::Dcqcn(d) => d.earliest_departure(now),
        }
    }

    /// True while a DCQCN rate limiter is active. Only then does a sent frame change anything (the pacer, the
    /// byte counter): without one, `on_sent` and the timer sync after it have no work, and the engine skips both.
    #[inline(always)]
    pub fn limited(&self) -> bool {
        match self {
            RateController::LineRate => false,
            RateController::Dcqcn(d) => d.limited(),
        }
    }

    /// A data frame of `bytes` bytes left at `now`.
    #[inline(always)]
    pub fn on_sent(&mut self, now: Instant, bytes: usize) {
        if let RateController::Dcqcn(d) = self {
            d.on_sent(now, bytes as u64);
        }
    }

    /// A CNP for this QP arrived. Returns false if the controller ignores CNPs (no congestion control).
    pub fn on_cnp(&mut self, now: Instant) -> bool {
        match self {
            RateController::LineRate => false,
            RateController::Dcqcn(d) => {
                d.on_cnp(now);
                true
            }
        }
    }

    /// The deadline from [`RateController::next_timer`] passed.
    pub fn on_timer(&mut self, now: Instant) {
        if let RateController::Dcqcn(d) = self {
            d.on_timer(now);
        }
    }

    /// When `on_timer` has work next.
    #[inline]
    pub fn next_timer(&self) -> Option<Instant> {
        match self {
            RateController::LineRate => None,
            RateController::Dcqcn(d) => d.next_timer(),
        }
    }

    /// Back to the initial state (QP reset).
    pub fn reset(&mut self) {
        if let RateController::Dcqcn(d) = self {
            d.reset();
        }
    }

    /// Rate decreases so far (0 without congestion control).
    pub fn rate_decreases(&self) -> u64 {
        match self {
            RateController::LineRate => 0,
            RateController::Dcqcn(d) => d.rate_decreases(),
        }
    }

    /// The current state, or None without congestion control.
    pub fn state(&self) -> Option<CcState> {
        match self {
            RateController::LineRate => None,
            RateController::Dcqcn(d) => Some(d.state()),
        }
    }
}
