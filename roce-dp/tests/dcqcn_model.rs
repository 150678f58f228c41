//! The DCQCN reaction point against an independent model: the equations of ROCE-NOTES §3.1 (with the ConnectX
//! parameters of §3.2 and the readings documented in roce_dp::cc::dcqcn) re-implemented here in plain f64, fed the
//! same scripted CNPs, bytes and timer expiries. The implementation's fixed-point rate trace must stay within
//! 0.1 % (+ 10 kb/s) of the model's, alpha within 1e-4, and both must agree on every timer deadline exactly.
//! Nothing here calls the implementation to compute an expected value.

use roce_dp::cc::Dcqcn;
use roce_dp::{DcqcnConfig, Instant};

/// The reaction point in f64: rates in Mb/s, time in ns.
struct Model {
    line: f64,
    min: f64,
    ai: f64,
    hai: f64,
    t_reset: u64,
    b: f64,
    f: u32,
    g: f64,
    k: u64,
    rrm: u64,
    alpha0: f64,
    gd_div: f64,
    min_dec: f64,
    clamp: bool,
    clamp_ati: bool,

    limited: bool,
    rc: f64,
    rt: f64,
    alpha: f64,
    alpha_at: u64,
    last_cut: Option<u64>,
    pending: bool,
    timer_raised: bool,
    ts: u32,
    bs: u32,
    bytes: f64,
    t_next: Option<u64>,
    /// Which branches ran: fast recovery, additive, hyper, deferred decrease, release.
    seen: [u32; 5],
}

impl Model {
    fn new(c: &DcqcnConfig, line_mbps: f64) -> Model {
        Model {
            line: line_mbps,
            min: f64::from(c.rp_min_rate),
            ai: f64::from(c.rp_ai_rate),
            hai: f64::from(c.rp_hai_rate),
            t_reset: u64::from(c.rp_time_reset) * 1000,
            // rp_byte_reset counts 64-byte units (roce_dp::cc::dcqcn, after Google's isekai ConnectX model).
            b: f64::from(c.rp_byte_reset) * 64.0,
            f: c.rp_threshold,
            g: f64::from(c.rp_dce_tcp_g) / 1024.0,
            k: u64::from(c.rp_dce_tcp_rtt) * 1000,
            rrm: u64::from(c.rp_rate_reduce_monitor_period) * 1000,
            alpha0: f64::from(c.rp_initial_alpha_value) / 1024.0,
            gd_div: f64::from(1u32 << (c.rp_gd - 10)),
            min_dec: f64::from(c.rp_min_dec_fac) / 100.0,
            clamp: c.rp_clamp_tgt_rate,
            clamp_ati: c.rp_clamp_tgt_rate_ati,
            limited: false,
            rc: line_mbps,
            rt: line_mbps,
            alpha: 0.0,
            alpha_at: 0,
            last_cut: None,
            pending: false,
            timer_raised: false,
            ts: 0,
            bs: 0,
            bytes: 0.0,
            t_next: None,
            seen: [0; 5],
        }
    }

    fn hyper(&self) -> bool {
        self.ts >= self.f && self.bs >= self.f
    }

    fn cnp(&mut self, t: u64) {
        if !self.limited {
            self.limited = true;
            self.alpha = self.alpha0;
            self.rc = self.line;
            self.rt = self.line;
        } else {
            // Every K without a CNP: alpha = (1 - g) alpha; on a CNP: alpha = (1 - g) alpha + g.
            let periods = (t - self.alpha_at) / self.k;
            self.alpha *= self.g.powi(periods as i32);
            self.alpha = self.g * self.alpha + (1.0 - self.g);
        }
        self.alpha_at = t;
        match self.last_cut {
            Some(c) if t < c + self.rrm => self.pending = true,
            _ => self.cut(t),
        }
    }

    fn cut(&mut self, t: u64) {
        if self.clamp || self.bs > 0 || (self.clamp_ati && self.timer_raised) {
            self.rt = self.rc;
        }
        let r = self.rc * (1.0 - self.alpha / self.gd_div);
        self.rc = r.max(self.rc * self.min_dec).max(self.min).min(self.line);
        self.ts = 0;
        self.bs = 0;
        self.bytes = 0.0;
        self.timer_raised = false;
        self.pending = false;
        self.last_cut = Some(t);
        self.t_next = Some(t + self.t_reset);
    }

    fn increase(&mut self) {
        if self.hyper() {
            self.rt += self.hai * f64::from(self.ts.min(self.bs) - self.f + 1);
            self.seen[2] += 1;
        } else if self.ts >= self.f || self.bs >= self.f {
            self.rt += self.ai;
            self.seen[1] += 1;
        } else {
            self.seen[0] += 1;
        }
        self.rt = self.rt.min(self.line);
        self.rc = (self.rc + self.rt) / 2.0;
        // Within the implementation's resolution (1 kb/s) of the line rate: the limiter is released and the QP
        // is unlimited again (the next CNP starts from the initial alpha).
        if self.line - self.rc < 0.001 {
            self.seen[4] += 1;
            self.limited = false;
            self.rc = self.line;
            self.rt = self.line;
            self.ts = 0;
            self.bs = 0;
            self.bytes = 0.0;
            self.pending = false;
            self.timer_raised = false;
            self.t_next = None;
        }
    }

    fn sent(&mut self, bytes: f64) {
        if !self.limited || self.b == 0.0 {
            return;
        }
        self.bytes += bytes;
        let thr = if self.hyper() { (self.b / 2.0).floor() } else { self.b };
        if self.bytes >= thr {
            self.bytes -= thr;
            self.bs += 1;
            self.increase();
        }
    }

    fn next_timer(&self) -> Option<u64> {
        let cut = if self.pending { self.last_cut.map(|c| c + self.rrm) } else { None };
        match (cut, self.t_next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn timer(&mut self, t: u64) {
        if self.pending && self.last_cut.is_some_and(|c| t >= c + self.rrm) {
            self.seen[3] += 1;
            self.cut(t);
        }
        if self.t_next.is_some_and(|n| t >= n) {
            self.ts += 1;
            self.timer_raised = true;
            self.increase();
            if self.limited {
                let period = if self.hyper() { self.t_reset / 2 } else { self.t_reset };
                self.t_next = Some(t + period);
            }
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Ev {
    Cnp,
    Sent(u64),
}

/// Runs the script on both, comparing after every event and every timer expiry. Returns the number of
/// comparisons, the lowest model rate seen, and how often each branch of the model ran.
fn replay(cfg: &DcqcnConfig, line_mbps: u32, script: &[(u64, Ev)]) -> (usize, f64, [u32; 5]) {
    let mut imp = Dcqcn::new(cfg, line_mbps);
    let mut m = Model::new(cfg, f64::from(line_mbps));
    let mut checks = 0;
    let mut lowest = f64::MAX;
    let mut compare = |imp: &Dcqcn, m: &Model, what: &str| {
        let s = imp.state();
        let (rc, rt) = (s.rate_kbps as f64 / 1000.0, s.target_kbps as f64 / 1000.0);
        // Rates are whole kb/s: each decrease rounds Rc up by < 1 kb/s, which a run of cuts by ~12 % accumulates
        // to < 1 / 0.12 kb/s; alpha is Q30.
        let tol = |x: f64| x * 1e-3 + 0.01;
        assert!((rc - m.rc).abs() <= tol(m.rc), "{what}: Rc {rc} Mb/s, model {}", m.rc);
        assert!((rt - m.rt).abs() <= tol(m.rt), "{what}: Rt {rt} Mb/s, model {}", m.rt);
        assert_eq!(s.limited, m.limited, "{what}");
        if m.limited {
            let a = f64::from(s.alpha_q20) / f64::from(1u32 << 20);
            assert!((a - m.alpha).abs() <= 1e-4, "{what}: alpha {a}, model {}", m.alpha);
        }
        assert_eq!(imp.next_timer().map(|t| t.as_nanos()), m.next_timer(), "{what}: timer deadline");
        assert!(rc >= f64::from(cfg.rp_min_rate) && rc <= f64::from(line_mbps), "{what}: Rc {rc} out of bounds");
        lowest = lowest.min(m.rc);
        checks += 1;
    };
    for &(t_us, ev) in script {
        let t = t_us * 1000;
        // Timer expiries due before this event, in order.
        while let Some(d) = m.next_timer().filter(|&d| d <= t) {
            m.timer(d);
            imp.on_timer(Instant(d));
            compare(&imp, &m, &format!("timer at {d} ns"));
        }
        match ev {
            Ev::Cnp => {
                m.cnp(t);
                imp.on_cnp(Instant(t));
            }
            Ev::Sent(b) => {
                m.sent(b as f64);
                imp.on_sent(Instant(t), b);
            }
        }
        compare(&imp, &m, &format!("{ev:?} at {t_us} us"));
    }
    (checks, lowest, m.seen)
}

/// The script: CNPs (one inside the monitor period), a stream of frames driving the byte counter, timer
/// expiries through fast recovery, additive and hyper increase, then a burst of CNPs down to the minimum rate.
fn script() -> Vec<(u64, Ev)> {
    let mut s = vec![(10, Ev::Cnp), (12, Ev::Cnp), (30, Ev::Cnp)];
    // 4 KiB frames every 2 us from 31 to 399 us: ~2 KB/us, byte stages every ~32 us.
    s.extend((31..400).step_by(2).map(|t| (t, Ev::Sent(4096))));
    s.sort_by_key(|e| e.0);
    s.push((455, Ev::Cnp));
    s.push((457, Ev::Cnp));
    s.extend((470..800).step_by(3).map(|t| (t, Ev::Sent(1500))));
    // A long burst: one CNP every 4 us (the monitor period) for 1 ms, down to the minimum rate.
    s.extend((800..1800).step_by(4).map(|t| (t, Ev::Cnp)));
    s.push((2_500, Ev::Sent(64)));
    s
}

#[test]
fn rate_trace_matches_the_reaction_point_equations() {
    let cfg = DcqcnConfig { rp_time_reset: 50, rp_byte_reset: 1024, rp_threshold: 2, ..DcqcnConfig::default() };
    let (checks, lowest, seen) = replay(&cfg, 25_000, &script());
    assert!(checks > 300, "{checks}");
    assert!(seen.iter().all(|&n| n > 0), "fast recovery, additive, hyper, deferred cut, release: {seen:?}");
    assert_eq!(lowest, 1.0, "the burst reaches the minimum rate");
}

#[test]
fn rate_trace_matches_with_clamping_and_the_paper_gain() {
    // Rt clamped on every decrease, g = 1/256 with a 55 us alpha period, gd = 10 (cut by alpha, bounded by
    // min_dec_fac), hyper increase after one stage, a 10 Mb/s floor.
    let cfg = DcqcnConfig {
        rp_clamp_tgt_rate: true,
        rp_time_reset: 40,
        rp_byte_reset: 313,
        rp_threshold: 1,
        rp_dce_tcp_g: 1020,
        rp_dce_tcp_rtt: 55,
        rp_gd: 10,
        rp_min_dec_fac: 30,
        rp_min_rate: 10,
        rp_ai_rate: 40,
        rp_hai_rate: 200,
        ..DcqcnConfig::default()
    };
    let (checks, lowest, seen) = replay(&cfg, 40_000, &script());
    assert!(checks > 300, "{checks}");
    assert!(seen[1] + seen[2] > 0 && seen[3] > 0, "{seen:?}");
    assert_eq!(lowest, 10.0);
}
