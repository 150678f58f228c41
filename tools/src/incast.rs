//! Output of `rdp-sim --incast`: the trace as CSV and a hand-written SVG plot (no plotting dependency).

use roce_dp::sim::incast::{IncastReport, TraceRow};
use std::fmt::Write as _;

/// The CSV header of `--trace`.
pub const TRACE_HEADER: &str = "time_us,flow,rate_gbps,goodput_gbps,queue_kb";

/// The trace as CSV: one row per flow per sample. `rate_gbps` is the sender's rate setting (the DCQCN current
/// rate, or the line rate without congestion control), `goodput_gbps` the payload the receiver accepted for the
/// flow since the previous sample, `queue_kb` the switch egress queue (KiB) at the sample time.
pub fn trace_csv(trace: &[TraceRow], sample_ns: u64) -> String {
    let mut s = String::with_capacity(trace.len() * 40 + 64);
    s.push_str(TRACE_HEADER);
    s.push('\n');
    for t in trace {
        let gp = if sample_ns > 0 { t.bytes as f64 * 8.0 / sample_ns as f64 } else { 0.0 };
        let _ = writeln!(
            s,
            "{:.3},{},{:.6},{:.6},{:.3}",
            t.time_ns as f64 / 1000.0,
            t.flow,
            t.rate_kbps as f64 / 1e6,
            gp,
            t.queue_bytes as f64 / 1024.0
        );
    }
    s
}

const COLORS: [&str; 10] =
    ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

/// A panel: a box with axes, ticks and labels; maps data to pixels.
struct Panel {
    x0: f64,
    y0: f64,
    w: f64,
    h: f64,
    xmax: f64,
    /// The top of the y axis (5 % above `ytick`, so lines at the maximum stay visible).
    ymax: f64,
    /// The largest labelled y tick.
    ytick: f64,
}

impl Panel {
    fn px(&self, x: f64) -> f64 {
        self.x0 + x / self.xmax * self.w
    }
    fn py(&self, y: f64) -> f64 {
        self.y0 + self.h - (y / self.ymax).clamp(0.0, 1.0) * self.h
    }
    fn axes(&self, s: &mut String, xlabel: &str, ylabel: &str) {
        let (x0, y0, w, h) = (self.x0, self.y0, self.w, self.h);
        let _ = writeln!(s, r##"<rect x="{x0}" y="{y0}" width="{w}" height="{h}" fill="none" stroke="#000"/>"##);
        for i in 0..=5 {
            let f = f64::from(i) / 5.0;
            let (tx, ty) = (x0 + f * w, self.py(f * self.ytick));
            let _ = writeln!(
                s,
                r##"<line x1="{tx}" y1="{}" x2="{tx}" y2="{}" stroke="#000"/><text x="{tx}" y="{}" font-size="11" text-anchor="middle">{}</text>"##,
                y0 + h,
                y0 + h + 4.0,
                y0 + h + 16.0,
                nice(f * self.xmax)
            );
            let _ = writeln!(
                s,
                r##"<line x1="{}" y1="{ty}" x2="{x0}" y2="{ty}" stroke="#000"/><line x1="{x0}" y1="{ty}" x2="{}" y2="{ty}" stroke="#ddd"/><text x="{}" y="{}" font-size="11" text-anchor="end">{}</text>"##,
                x0 - 4.0,
                x0 + w,
                x0 - 6.0,
                ty + 4.0,
                nice(f * self.ytick)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" font-size="12" text-anchor="middle">{xlabel}</text>"#,
            x0 + w / 2.0,
            y0 + h + 32.0
        );
        let (lx, ly) = (x0 - 46.0, y0 + h / 2.0);
        let _ = writeln!(
            s,
            r#"<text x="{lx}" y="{ly}" font-size="12" text-anchor="middle" transform="rotate(-90 {lx} {ly})">{ylabel}</text>"#
        );
    }
    fn polyline(&self, s: &mut String, pts: impl Iterator<Item = (f64, f64)>, color: &str) {
        s.push_str(r#"<polyline fill="none" stroke-width="1.2" stroke=""#);
        s.push_str(color);
        s.push_str(r#"" points=""#);
        for (x, y) in pts {
            let _ = write!(s, "{:.1},{:.1} ", self.px(x), self.py(y));
        }
        s.push_str("\"/>\n");
    }
}

fn nice(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else if v.abs() >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// An SVG with two panels over virtual time: every flow's rate (Gb/s) and the switch queue (KiB), plus a legend
/// and the result line as the caption. At most ~2000 points per line (samples are thinned evenly).
pub fn plot_svg(r: &IncastReport, line_gbps: f64, buffer_kb: f64, title: &str) -> String {
    let n = r.flows.len().max(1);
    let samples = r.trace.len() / n;
    let step = samples.div_ceil(2000).max(1);
    let tmax = r.trace.last().map_or(1.0, |t| t.time_ns as f64 / 1e6).max(1e-3);
    let (w, h) = (960.0, 700.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif">"#
    );
    let _ = writeln!(s, r##"<rect width="{w}" height="{h}" fill="#fff"/>"##);
    let _ = writeln!(s, r#"<text x="{}" y="22" font-size="15" text-anchor="middle">{}</text>"#, w / 2.0, xml(title));
    let line = line_gbps.max(1e-3);
    let rate = Panel { x0: 70.0, y0: 40.0, w: 720.0, h: 330.0, xmax: tmax, ymax: line * 1.05, ytick: line };
    rate.axes(&mut s, "time (ms)", "rate (Gb/s)");
    for f in 0..n {
        // The trace holds one row per flow per sample, flows in order: flow f's rows are every n-th from row f.
        // (Filtering the whole trace for each flow cost flows x rows: ~30 s for 1000 flows x 5000 samples.)
        let pts = r.trace.iter().skip(f).step_by(n * step).map(|t| (t.time_ns as f64 / 1e6, t.rate_kbps as f64 / 1e6));
        rate.polyline(&mut s, pts, COLORS[f % COLORS.len()]);
    }
    for f in 0..n.min(16) {
        let y = 50.0 + 16.0 * f as f64;
        let _ = writeln!(
            s,
            r#"<line x1="805" y1="{y}" x2="825" y2="{y}" stroke="{}" stroke-width="2"/><text x="830" y="{}" font-size="11">flow {f}</text>"#,
            COLORS[f % COLORS.len()],
            y + 4.0
        );
    }
    let qmax = (r.max_queue_bytes as f64 / 1024.0).max(buffer_kb).max(1.0);
    let q = Panel { x0: 70.0, y0: 430.0, w: 720.0, h: 200.0, xmax: tmax, ymax: qmax * 1.05, ytick: qmax };
    q.axes(&mut s, "time (ms)", "queue (KiB)");
    let pts = r.trace.iter().step_by(n * step).map(|t| (t.time_ns as f64 / 1e6, t.queue_bytes as f64 / 1024.0));
    q.polyline(&mut s, pts, "#000");
    let by = q.py(buffer_kb);
    let _ = writeln!(
        s,
        r##"<line x1="70" y1="{by}" x2="790" y2="{by}" stroke="#d62728" stroke-dasharray="4 3"/><text x="795" y="{}" font-size="11">buffer</text>"##,
        by + 4.0
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="690" font-size="11" text-anchor="middle">{}</text>"#,
        w / 2.0,
        xml(&r.result_line())
    );
    s.push_str("</svg>\n");
    s
}

fn xml(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> IncastReport {
        let mut trace = Vec::new();
        for k in 0..5u64 {
            for f in 0..2u32 {
                trace.push(TraceRow {
                    time_ns: k * 10_000,
                    flow: f,
                    rate_kbps: 25_000_000 / (k + 1),
                    bytes: 4096 * k,
                    queue_bytes: 1024 * k,
                });
            }
        }
        IncastReport { ok: true, flows: vec![Default::default(); 2], trace, ..Default::default() }
    }

    #[test]
    fn csv_rows_and_units() {
        let r = report();
        let csv = trace_csv(&r.trace, 10_000);
        let lines: Vec<&str> = csv.lines().collect();
        assert_eq!(lines[0], TRACE_HEADER);
        assert_eq!(lines.len(), 11);
        // t = 20 us, flow 1: 25/3 Gb/s, 8192 B in 10 us = 6.5536 Gb/s, 2 KiB.
        assert_eq!(lines[6], "20.000,1,8.333333,6.553600,2.000");
    }

    #[test]
    fn svg_has_a_line_per_flow_and_the_queue() {
        let svg = plot_svg(&report(), 25.0, 1024.0, "t <1>");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.contains("rate (Gb/s)") && svg.contains("queue (KiB)") && svg.contains("t &lt;1&gt;"));
        assert!(svg.contains("result: status=ok flows=2"));
    }
}
