//! perftest's printed output, so that scripts that parse perftest parse ours: the banner block, the local and
//! remote address lines, the BW and latency tables (same columns, widths, tabs and units), and `--out_json`.
//!
//! The formats are perftest's (`perftest_parameters.h`, `perftest_communication.h`) as perftest 4.5 printed them
//! in `shared/vectors/rxe/*.perftest.txt`, with one deliberate difference: the BW header says `MiB/sec` (as
//! perftest >= 24.07 does) where 4.5 said `MB/sec`. The figures were always 2^20-based, and parsers read the
//! columns by position, so only the header text differs. The BW row separates the message rate with two tabs and
//! three spaces, as 4.5 printed it (ROCE-NOTES §2.3 quotes five spaces from a newer perftest).

use super::exchange::{BwReport, Dest, Mtu, Role, TestKind, Verb};
use super::params::AtomicType;
use hdrhistogram::Histogram;
use std::fmt::Write as _;
use std::time::Duration;

/// perftest's `RESULT_LINE`: 87 dashes.
pub const RESULT_LINE: &str = "---------------------------------------------------------------------------------------";
/// The BW table header in MiB/s.
pub const RESULT_FMT: &str = " #bytes     #iterations    BW peak[MiB/sec]    BW average[MiB/sec]   MsgRate[Mpps]";
/// The BW table header with `--report_gbits`.
pub const RESULT_FMT_G: &str = " #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]";
/// The latency table header (with perftest's trailing space).
pub const RESULT_FMT_LAT: &str =
    " #bytes #iterations    t_min[usec]    t_max[usec]  t_typical[usec]    t_avg[usec]    \
                                  t_stdev[usec]   99% percentile[usec]   99.9% percentile[usec] ";
/// The latency table header in duration mode (`-D`).
pub const RESULT_FMT_LAT_DUR: &str = " #bytes        #iterations       t_avg[usec]    tps average";

/// C's `%#0Nx`: `0x` and hex digits zero-padded to a total width of `width`; zero prints without `0x`.
pub fn c_alt_hex(v: u64, width: usize) -> String {
    if v == 0 {
        format!("{:0width$}", 0)
    } else {
        format!("{v:#0width$x}")
    }
}

/// C's `%-N.Pf`.
fn f(v: f64, width: usize, prec: usize) -> String {
    format!("{v:<width$.prec$}")
}

/// The test's title line as perftest centres it (20 spaces), e.g. `RDMA_Write BW Test`.
pub fn title(test: TestKind, atomic: AtomicType) -> String {
    title_of(test, atomic, false)
}

/// [`title`], with perftest's `Bidirectional` before `BW` for `-b` (`RDMA_Write Bidirectional BW Test`).
pub fn title_of(test: TestKind, atomic: AtomicType, duplex: bool) -> String {
    let op = match test.verb() {
        Verb::Send => "Send".to_string(),
        Verb::Write => "RDMA_Write".to_string(),
        Verb::Read => "RDMA_Read".to_string(),
        Verb::Atomic => format!("Atomic {}", atomic.name()),
    };
    let kind = match (test.is_bw(), duplex) {
        (true, true) => "Bidirectional BW",
        (true, false) => "BW",
        (false, _) => "Latency",
    };
    format!("                    {op} {kind} Test")
}

/// What the banner shows.
#[derive(Clone, Debug)]
pub struct Banner {
    /// The test.
    pub test: TestKind,
    /// `-A` (atomic tests).
    pub atomic_type: AtomicType,
    /// Client or server: the client shows its TX depth; the server its RX depth in send tests, else none.
    pub role: Role,
    /// `-b`: both sides send (and, in send tests, receive), so both show their TX depth (and RX depth).
    pub duplex: bool,
    /// The device (perftest: `rxe0`; ours: the port or soft-NIC name).
    pub device: String,
    /// `-q`.
    pub num_qps: u32,
    /// TX depth after clamping.
    pub tx_depth: u32,
    /// RX depth after clamping.
    pub rx_depth: u32,
    /// CQ moderation (BW tests).
    pub cq_mod: u32,
    /// The MTU both sides use.
    pub mtu: Mtu,
    /// The GID index.
    pub gid_index: u32,
    /// Inline threshold (send/write tests).
    pub max_inline: u32,
    /// Outstanding reads/atomics (read and atomic tests).
    pub out_reads: u32,
}

impl Banner {
    /// From the parsed flags and what the exchange settled.
    pub fn new(p: &super::params::Params, device: &str, mtu: Mtu, gid_index: u32, out_reads: u32) -> Banner {
        Banner {
            test: p.test,
            atomic_type: p.atomic_type,
            role: if p.is_client() { Role::Client } else { Role::Server },
            duplex: p.duplex,
            device: device.to_string(),
            num_qps: p.num_qps,
            tx_depth: p.tx_depth,
            rx_depth: p.rx_depth,
            cq_mod: p.cq_mod,
            mtu,
            gid_index,
            max_inline: 0,
            out_reads,
        }
    }

    /// The banner, between two `RESULT_LINE`s, one string per line (no newlines).
    pub fn lines(&self) -> Vec<String> {
        let verb = self.test.verb();
        let mut v = vec![
            RESULT_LINE.to_string(),
            title_of(self.test, self.atomic_type, self.duplex),
            format!(" Dual-port       : OFF\t\tDevice         : {}", self.device),
            format!(" Number of qps   : {}\t\tTransport type : IB", self.num_qps),
            " Connection type : RC\t\tUsing SRQ      : OFF".to_string(),
            // perftest 4.5 turned relaxed ordering off in write latency only (as captured); meaningless here.
            format!(" PCIe relax order: {}", if self.test == TestKind::WriteLat { "OFF" } else { "ON" }),
            " ibv_wr* API     : OFF".to_string(),
        ];
        // perftest: the TX depth if this side sends (the client, or both with -b), the RX depth in send tests if
        // this side receives (the server, or both with -b).
        if self.role == Role::Client || self.duplex {
            v.push(format!(" TX depth        : {}", self.tx_depth));
        }
        if verb == Verb::Send && (self.role == Role::Server || self.duplex) {
            v.push(format!(" RX depth        : {}", self.rx_depth));
        }
        if self.test.is_bw() {
            v.push(format!(" CQ Moderation   : {}", self.cq_mod));
        }
        v.push(format!(" Mtu             : {}[B]", self.mtu.bytes()));
        v.push(" Link type       : Ethernet".to_string());
        v.push(format!(" GID index       : {}", self.gid_index));
        if matches!(verb, Verb::Read | Verb::Atomic) {
            v.push(format!(" Outstand reads  : {}", self.out_reads));
        } else {
            v.push(format!(" Max inline data : {}[B]", self.max_inline));
        }
        v.push(" rdma_cm QPs\t : OFF".to_string());
        v.push(" Data ex. method : Ethernet".to_string());
        v.push(RESULT_LINE.to_string());
        v
    }
}

impl Banner {
    /// The banner's `label : value` pairs as perftest's `--out_json` names them in its `test_info`: the label with
    /// `_` for spaces and dashes, without `*` and `.` (`Dual_port`, `Number_of_qps`, `ibv_wr_API`, `TX_depth`,
    /// `CQ_Moderation`, `Mtu`, `GID_index`, `Max_inline_data`, `rdma_cm_QPs`, `Data_ex_method`), the value a
    /// number when it is one (`1024[B]` is 1024), else a string; only the lines this side's banner shows.
    pub fn json_fields(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        for line in self.lines().iter().filter(|l| l.contains(':')) {
            for part in line.split("\t\t") {
                let Some((label, value)) = part.split_once(':') else { continue };
                let key: String = label
                    .trim()
                    .chars()
                    .filter(|c| !matches!(c, '*' | '.'))
                    .map(|c| if c == ' ' || c == '-' { '_' } else { c })
                    .collect();
                let value = value.trim();
                let number = value.trim_end_matches("[B]");
                let value = match number.parse::<u64>() {
                    Ok(n) => n.to_string(),
                    Err(_) => json_str(value),
                };
                v.push((key, value));
            }
        }
        v
    }
}

/// The server's lines while it waits (perftest prints an empty line first).
pub fn waiting_lines() -> Vec<String> {
    let stars = "************************************".to_string();
    vec![String::new(), stars.clone(), "* Waiting for client to connect... *".to_string(), stars]
}

/// One QP's two address lines (`BASIC_ADDR_FMT` [+ `READ_FMT`] [+ `RDMA_FMT`], then `PERF_GID_FMT`): send and
/// atomic tests show LID/QPN/PSN only, read tests add OUT, read and write tests add RKey and VAddr.
pub fn address_lines(test: TestKind, local: bool, d: &Dest) -> [String; 2] {
    let mut s = format!(
        " {} address: LID {} QPN {} PSN {}",
        if local { "local" } else { "remote" },
        c_alt_hex(u64::from(d.lid), 4),
        c_alt_hex(u64::from(d.qpn), 6),
        c_alt_hex(u64::from(d.psn), 6)
    );
    if test.verb() == Verb::Read {
        let _ = write!(s, " OUT {}", c_alt_hex(u64::from(d.out_reads), 4));
    }
    if matches!(test.verb(), Verb::Read | Verb::Write) {
        let _ = write!(s, " RKey {} VAddr {}", c_alt_hex(u64::from(d.rkey), 8), c_alt_hex(d.vaddr, 16));
    }
    let gid: Vec<String> = d.gid.iter().map(|b| format!("{b:02}")).collect();
    [s, format!(" GID: {}", gid.join(":"))]
}

/// All local lines (one pair per QP), then all remote lines, then a `RESULT_LINE`, as perftest prints them.
pub fn addresses(test: TestKind, local: &[Dest], remote: &[Dest]) -> Vec<String> {
    let mut v: Vec<String> = local.iter().flat_map(|d| address_lines(test, true, d)).collect();
    v.extend(remote.iter().flat_map(|d| address_lines(test, false, d)));
    v.push(RESULT_LINE.to_string());
    v
}

/// Converts a MiB/s figure to Gb/s (perftest's `format_factor`: 2^20 vs 1.25e8 bytes per unit).
pub fn mibs_to_gbits(mibs: f64) -> f64 {
    mibs * 1_048_576.0 / 125_000_000.0
}

/// BW figures from a measurement, as perftest computes them: average = bytes / time in MiB/s over all QPs
/// (and both directions with `-b`), message rate = messages / time in Mpps, `#iterations` = per QP.
/// `peak_mibs` is the caller's (perftest: the fastest completion interval; 0 with `-N`).
pub fn bw_report(size: u64, iters: u64, num_qps: u32, duplex: bool, elapsed: Duration, peak_mibs: f64) -> BwReport {
    let msgs = iters as f64 * f64::from(num_qps) * if duplex { 2.0 } else { 1.0 };
    let secs = elapsed.as_secs_f64();
    let (avg, rate) =
        if secs > 0.0 { (size as f64 * msgs / secs / 1_048_576.0, msgs / secs / 1e6) } else { (0.0, 0.0) };
    BwReport { size, iters, bw_peak: peak_mibs, bw_avg: avg, msg_rate: rate }
}

/// The BW table header.
pub fn bw_header(gbits: bool) -> &'static str {
    if gbits {
        RESULT_FMT_G
    } else {
        RESULT_FMT
    }
}

/// True when perftest prints a BW row with six decimals (`REPORT_FMT_EXT`): in Gb/s, below 0.1 Gb/s average.
fn extended(r: &BwReport, gbits: bool) -> bool {
    gbits && mibs_to_gbits(r.bw_avg) < 0.1
}

/// One BW row (`REPORT_FMT`); `r` in MiB/s, printed in Gb/s with `gbits`. Below 0.1 Gb/s perftest prints the
/// figures with six decimals and other spacing (`REPORT_FMT_EXT`), and so does this.
pub fn bw_line(r: &BwReport, gbits: bool) -> String {
    let conv = |v: f64| if gbits { mibs_to_gbits(v) } else { v };
    // REPORT_FMT:     " %-7lu    %-10lu       %-7.2lf            %-7.2lf\t\t   %-7.6lf"
    // REPORT_FMT_EXT: " %-7lu    %lu           %-7.6lf            %-7.6lf            %-7.6lf"
    let (iters, sep, prec) = if extended(r, gbits) {
        (format!("{}           ", r.iters), "            ", 6)
    } else {
        (format!("{:<10}       ", r.iters), "\t\t   ", 2)
    };
    format!(
        " {:<7}    {iters}{}            {}{sep}{}",
        r.size,
        f(conv(r.bw_peak), 7, prec),
        f(conv(r.bw_avg), 7, prec),
        f(r.msg_rate, 7, 6)
    )
}

/// perftest's `rtt_factor`: send and write latencies are half the round trip (ping-pong), read and atomic the
/// full round trip.
pub fn rtt_factor(test: TestKind) -> u32 {
    match test.verb() {
        Verb::Read | Verb::Atomic => 1,
        Verb::Send | Verb::Write => 2,
    }
}

/// One latency row's figures, microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LatStats {
    /// Message size.
    pub size: u64,
    /// Iterations (as given with `-n`).
    pub iters: u64,
    /// Smallest sample.
    pub t_min: f64,
    /// Largest sample.
    pub t_max: f64,
    /// Median (perftest's "typical").
    pub t_typical: f64,
    /// Mean.
    pub t_avg: f64,
    /// Standard deviation (population).
    pub t_stdev: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
}

/// Collects round-trip samples and reports them as perftest's `print_report_lat` does: the samples sorted, the two
/// largest left out (`LAT_MEASURE_TAIL`), so that `t_max` is the second largest sample, `t_avg` and `t_stdev` are
/// over the rest, `t_typical` is their median (the mean of the middle two for an even count), and the 99% and
/// 99.9% figures are the samples at ranks `ceil(0.99 m)` and `ceil(0.999 m)` of the sorted samples (`m` = the
/// samples less two). Min, the two left out, sums and squares exactly; the other ranks from an HdrHistogram
/// (nanoseconds, 3 significant digits, so within 0.1%) instead of perftest's array of every sample.
pub struct LatRecorder {
    hist: Histogram<u64>,
    n: u64,
    sum: f64,
    sum_sq: f64,
    min: u64,
    /// The three largest samples, largest first.
    top: [u64; 3],
}

impl Default for LatRecorder {
    fn default() -> Self {
        LatRecorder::new()
    }
}

impl LatRecorder {
    /// An empty recorder.
    pub fn new() -> Self {
        // Auto-resizing, so no sample is ever refused.
        let mut hist = Histogram::new(3).expect("3 significant digits is a valid precision");
        hist.auto(true);
        LatRecorder { hist, n: 0, sum: 0.0, sum_sq: 0.0, min: u64::MAX, top: [0; 3] }
    }

    /// Records one sample (a full round trip, or one completion for read/atomic).
    pub fn record(&mut self, sample: Duration) {
        let ns = u64::try_from(sample.as_nanos()).unwrap_or(u64::MAX);
        // Cannot fail with auto-resize; a sample that still did not fit would only be missing from the quantiles.
        let _ = self.hist.record(ns);
        self.n += 1;
        self.sum += ns as f64;
        self.sum_sq += (ns as f64) * (ns as f64);
        self.min = self.min.min(ns);
        if let Some(i) = self.top.iter().position(|&t| ns > t) {
            self.top.copy_within(i..2, i + 1);
            self.top[i] = ns;
        }
    }

    /// The sample at `rank` (from 0) of the sorted samples: exact for the smallest and the three largest, else the
    /// histogram's bucket.
    fn at_rank(&self, rank: u64) -> u64 {
        let from_top = self.n - 1 - rank.min(self.n - 1);
        if from_top < 3 {
            return self.top[from_top as usize];
        }
        if rank == 0 {
            return self.min;
        }
        let mut seen = 0;
        for v in self.hist.iter_recorded() {
            seen += v.count_at_value();
            if seen > rank {
                return self.hist.highest_equivalent(v.value_iterated_to()).min(self.top[2]).max(self.min);
            }
        }
        self.top[0]
    }

    /// Samples recorded.
    pub fn len(&self) -> u64 {
        self.n
    }

    /// True before the first sample.
    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The row, every figure divided by `rtt_factor` and in microseconds; `None` without samples.
    pub fn stats(&self, size: u64, iters: u64, rtt_factor: u32) -> Option<LatStats> {
        if self.n == 0 {
            return None;
        }
        let k = 1000.0 * f64::from(rtt_factor);
        // perftest leaves the two largest samples out when it has more than two.
        let tail = if self.n > 2 { 2 } else { 0 };
        let m = self.n - tail;
        let (mut sum, mut sum_sq) = (self.sum, self.sum_sq);
        for &t in &self.top[..tail as usize] {
            sum -= t as f64;
            sum_sq -= (t as f64) * (t as f64);
        }
        let mean = sum / m as f64;
        let var = (sum_sq / m as f64 - mean * mean).max(0.0);
        let rank = |r: u64| self.at_rank(r) as f64 / k;
        // get_median over the m kept samples.
        let median = if (m - 1) % 2 == 1 { (rank(m / 2) + rank(m / 2 - 1)) / 2.0 } else { rank(m / 2) };
        let pct = |q: f64| rank(((m as f64) * q).ceil() as u64);
        Some(LatStats {
            size,
            iters,
            t_min: self.min as f64 / k,
            t_max: rank(m.min(self.n - 1)),
            t_typical: median,
            t_avg: mean / k,
            t_stdev: var.sqrt() / k,
            p99: pct(0.99),
            p999: pct(0.999),
        })
    }
}

/// One latency row (`REPORT_FMT_LAT`, with perftest's tabs).
pub fn lat_line(s: &LatStats) -> String {
    format!(
        " {:<7} {}          {}        {}      {}  \t       {}     \t{}\t\t{} \t\t{}",
        s.size,
        s.iters,
        f(s.t_min, 7, 2),
        f(s.t_max, 7, 2),
        f(s.t_typical, 7, 2),
        f(s.t_avg, 7, 2),
        f(s.t_stdev, 7, 2),
        f(s.p99, 7, 2),
        f(s.p999, 7, 2)
    )
}

/// One latency row in duration mode (`-D`): `REPORT_FMT_LAT_DUR` under [`RESULT_FMT_LAT_DUR`], the mean latency
/// in microseconds and the transactions per second.
pub fn lat_dur_line(size: u64, iters: u64, t_avg: f64, tps: f64) -> String {
    format!(" {size:<7}       {iters}            {}        {}", f(t_avg, 7, 2), f(tps, 7, 2))
}

/// A JSON string literal (roce-dump's escaping).
fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    crate::dump::json_str(&mut o, s);
    o
}

/// A number as the table prints it (same decimals), valid JSON (non-finite values become 0).
fn json_num(v: f64, prec: usize) -> String {
    let v = if v.is_finite() { v } else { 0.0 };
    format!("{v:.prec$}")
}

/// The results of a run, for `--out_json`.
#[derive(Clone, Debug)]
pub enum Results {
    /// BW rows (one per size), in MiB/s.
    Bw(Vec<BwReport>),
    /// Latency rows (one per size), in microseconds.
    Lat(Vec<LatStats>),
}

/// `--out_json`: `{"test_info": {...}, "results": {...}}`; `test_info` has our keys (`tool`, `role`, `num_qps`,
/// `bw_unit`, ...) and the banner's as perftest's JSON names them ([`Banner::json_fields`]); the result keys as perftest names them (`MsgSize`,
/// `n_iterations`, `BW_peak`, `BW_average`, `MsgRate`; `t_min` .. `t_stdev`, `percentile_99`,
/// `percentile_99.9`), with the same figures (same rounding) as the table. With several sizes (`-a`),
/// `results` is a list of such objects.
pub fn json(banner: &Banner, results: &Results, gbits: bool) -> String {
    let mut o = String::from("{\n  \"test_info\": {\n");
    let title = title_of(banner.test, banner.atomic_type, banner.duplex);
    let info = [
        ("test", json_str(title.trim())),
        ("tool", json_str(banner.test.tool_name())),
        ("role", json_str(if banner.role == Role::Client { "client" } else { "server" })),
        ("device", json_str(&banner.device)),
        ("connection", json_str("RC")),
        ("num_qps", banner.num_qps.to_string()),
        ("mtu", banner.mtu.bytes().to_string()),
        ("gid_index", banner.gid_index.to_string()),
        ("tx_depth", banner.tx_depth.to_string()),
        ("rx_depth", banner.rx_depth.to_string()),
        ("bw_unit", json_str(if gbits { "Gb/sec" } else { "MiB/sec" })),
    ];
    let perftest = banner.json_fields();
    let body: Vec<String> = info
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .chain(perftest)
        .map(|(k, v)| format!("    {}: {v}", json_str(&k)))
        .collect();
    o.push_str(&body.join(",\n"));
    o.push_str("\n  },\n  \"results\": ");
    let conv = |v: f64| if gbits { mibs_to_gbits(v) } else { v };
    let rows: Vec<String> = match results {
        Results::Bw(rows) => rows
            .iter()
            .map(|r| {
                let prec = if extended(r, gbits) { 6 } else { 2 };
                format!(
                    "{{\"MsgSize\": {}, \"n_iterations\": {}, \"BW_peak\": {}, \"BW_average\": {}, \"MsgRate\": {}}}",
                    r.size,
                    r.iters,
                    json_num(conv(r.bw_peak), prec),
                    json_num(conv(r.bw_avg), prec),
                    json_num(r.msg_rate, 6)
                )
            })
            .collect(),
        Results::Lat(rows) => rows
            .iter()
            .map(|s| {
                format!(
                    "{{\"MsgSize\": {}, \"n_iterations\": {}, \"t_min\": {}, \"t_max\": {}, \"t_typical\": {}, \
                     \"t_avg\": {}, \"t_stdev\": {}, \"percentile_99\": {}, \"percentile_99.9\": {}}}",
                    s.size,
                    s.iters,
                    json_num(s.t_min, 2),
                    json_num(s.t_max, 2),
                    json_num(s.t_typical, 2),
                    json_num(s.t_avg, 2),
                    json_num(s.t_stdev, 2),
                    json_num(s.p99, 2),
                    json_num(s.p999, 2)
                )
            })
            .collect(),
    };
    if rows.len() == 1 {
        o.push_str(&rows[0]);
    } else {
        o.push_str(&format!("[\n    {}\n  ]", rows.join(",\n    ")));
    }
    o.push_str("\n}\n");
    o
}

/// perftest's BW peak: the best rate over any run of messages that starts at a post and ends at a signaled
/// completion, i.e. the largest `(j - i + 1) / (completed[j] - posted[i])` over every post `i` and every signaled
/// completion `j >= i` (both counted over all QPs, in the order they happen), times the message size.
///
/// perftest searches every pair after the run; this keeps the upper convex hull of the points `(i, posted[i])`
/// instead, so each completion is one binary search and memory stays at the posts still in flight plus the hull:
/// the smallest slope from the point `(j + 1, completed[j])` to any earlier point is a tangent to that hull.
///
/// Posts with the same stamp as the post before them (a tool that reads its clock once per pass over its QPs and
/// stamps the pass's posts with it) are counted but not kept: for any completion `j`, a later post `i' > i` with
/// `posted[i'] == posted[i]` gives the same time `completed[j] - posted[i]` for fewer messages `j - i' + 1`, and
/// `i <= i' <= j` whenever `i'` itself is a candidate, so the best pair never needs `i'` (same peak, one point
/// per batch instead of one per post).
#[derive(Clone, Debug, Default)]
pub struct PeakMeter {
    /// Posts not yet covered by a completion: (index, nanoseconds).
    pending: std::collections::VecDeque<(u64, u64)>,
    /// Upper hull of the covered posts, left to right.
    hull: Vec<(u64, u64)>,
    posts: u64,
    /// The stamp of the last post kept.
    last: Option<u64>,
    /// Best rate so far as (messages, nanoseconds).
    best: Option<(u64, u64)>,
}

/// `(a - o) x (b - o)`: positive when `o -> a -> b` turns counter-clockwise.
fn cross(o: (u64, u64), a: (u64, u64), b: (u64, u64)) -> i128 {
    let d = |p: (u64, u64)| (i128::from(p.0) - i128::from(o.0), i128::from(p.1) - i128::from(o.1));
    let ((ax, ay), (bx, by)) = (d(a), d(b));
    ax * by - ay * bx
}

impl PeakMeter {
    /// An empty meter.
    pub fn new() -> PeakMeter {
        PeakMeter::default()
    }

    /// The next post (over all QPs) happened at `ns` (nanoseconds from any fixed origin, never decreasing).
    pub fn post(&mut self, ns: u64) {
        if self.last != Some(ns) {
            self.pending.push_back((self.posts, ns));
            self.last = Some(ns);
        }
        self.posts += 1;
    }

    /// The posts kept (still in flight, or on the hull): at most one per distinct stamp.
    pub fn points(&self) -> usize {
        self.pending.len() + self.hull.len()
    }

    /// The first `completed` posts (over all QPs) are complete, as a signaled completion at `ns` says.
    pub fn complete(&mut self, completed: u64, ns: u64) {
        while let Some(&(i, t)) = self.pending.front() {
            if i >= completed {
                break;
            }
            self.pending.pop_front();
            while self.hull.len() >= 2
                && cross(self.hull[self.hull.len() - 2], self.hull[self.hull.len() - 1], (i, t)) >= 0
            {
                self.hull.pop();
            }
            self.hull.push((i, t));
        }
        if self.hull.is_empty() {
            return;
        }
        let target = (completed, ns);
        // Slope from hull point k to the target, as a fraction (dt, dn) with dn > 0.
        let frac = |k: usize| {
            let (i, t) = self.hull[k];
            (i128::from(ns) - i128::from(t), i128::from(completed - i))
        };
        // Moving right along the hull lowers the slope while the edge k -> k+1 is steeper than k -> target (the
        // target lies below the edge's line); the edges' slopes fall, so that holds up to the tangent point.
        let (mut lo, mut hi) = (0usize, self.hull.len() - 1);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (a, b) = (self.hull[mid], self.hull[mid + 1]);
            if cross(a, b, target) < 0 {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        let (dt, dn) = frac(lo);
        let dt = dt.max(1) as u64;
        let dn = dn as u64;
        // dn / dt > best.0 / best.1 ?
        if self.best.is_none_or(|(bn, bt)| u128::from(dn) * u128::from(bt) > u128::from(bn) * u128::from(dt)) {
            self.best = Some((dn, dt));
        }
    }

    /// The peak in MiB/s for messages of `size` bytes (0 before the first completion).
    pub fn mibs(&self, size: u64) -> f64 {
        match self.best {
            Some((n, ns)) => size as f64 * n as f64 / (ns as f64 * 1e-9) / 1_048_576.0,
            None => 0.0,
        }
    }
}
