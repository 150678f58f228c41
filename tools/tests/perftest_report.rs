//! perftest's printed output, golden against the real perftest 4.5 outputs in shared/vectors/rxe/*.perftest.txt:
//! the figures each file printed go through our formatter, with the banner built from the same command line
//! through our flag parser and the address lines from the QP records in the same run's capture, and every
//! line must come out as perftest printed it. The one documented difference: the BW header says MiB/sec where
//! perftest 4.5 said MB/sec (same 2^20-based figures; perftest >= 24.07 prints MiB/sec).

mod common;

use common::{oob_segments, vectors};
use roce_dp_tools::perftest::exchange::{BwReport, Dest, Mtu, Role, TestKind, DEST_LEN};
use roce_dp_tools::perftest::params::{AtomicType, Params};
use roce_dp_tools::perftest::report::{
    address_lines, addresses, bw_header, bw_line, bw_report, c_alt_hex, json, lat_dur_line, lat_line, mibs_to_gbits,
    rtt_factor, title, waiting_lines, Banner, LatRecorder, LatStats, PeakMeter, Results, RESULT_FMT_LAT, RESULT_LINE,
};
use std::time::Duration;

/// (output file, capture, test)
const RUNS: &[(&str, &str, TestKind)] = &[
    ("rc_write_4k.perftest.txt", "rc_write_4k.pcap", TestKind::WriteBw),
    ("rc_send_4k.perftest.txt", "rc_send_4k.pcap", TestKind::SendBw),
    ("rc_read_4k.perftest.txt", "rc_read_4k.pcap", TestKind::ReadBw),
    ("rc_atomic.perftest.txt", "rc_atomic.pcap", TestKind::AtomicBw),
    ("rc_send_lat_64.perftest.txt", "rc_send_lat_64.pcap", TestKind::SendLat),
    ("rc_write_lat_64.perftest.txt", "rc_write_lat_64.pcap", TestKind::WriteLat),
    ("drop5_write_tapa0.perftest.txt", "drop5_write_tapa0.pcap", TestKind::WriteBw),
    ("ecn_ce_all_write_tapa0.perftest.txt", "ecn_ce_all_write_tapa0.pcap", TestKind::WriteBw),
];

struct Captured {
    args: Vec<String>,
    client: Vec<String>,
    server: Vec<String>,
}

fn read_output(name: &str) -> Captured {
    let text = std::fs::read_to_string(vectors().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let mut lines = text.lines();
    let head = lines.next().unwrap();
    // "### ib_write_bw -s 4096 -n 20  (client A -> server B via 10.50.0.2)"
    let cmd = head.strip_prefix("### ").unwrap().split("  (").next().unwrap();
    let args = cmd.split_whitespace().skip(1).map(String::from).collect();
    let mut client = Vec::new();
    let mut server = Vec::new();
    let mut in_client = true;
    for l in lines {
        if l.starts_with("### client rc-time") {
            in_client = false;
        } else if in_client {
            client.push(l.to_string());
        } else if let Some(s) = l.strip_prefix("  [srv] ") {
            server.push(s.to_string());
        }
    }
    // What perftest prints before its banner on rxe (an inline warning, a stray RESULT_LINE) is not ours.
    let title_at = client.iter().position(|l| l.starts_with("                    ")).expect("title");
    client.drain(..title_at - 1);
    let wait_at = server.iter().position(|l| l.contains("Waiting for client")).expect("waiting");
    server.drain(..wait_at - 2);
    Captured { args, client, server }
}

fn first_record(segs: &[common::Segment], client: bool) -> Dest {
    let s = segs.iter().find(|s| s.from_client == client && s.data.len() == DEST_LEN).unwrap();
    Dest::decode(&s.data).unwrap()
}

/// Our rendering of one side's output, from the figures in perftest's table row.
fn render(test: TestKind, args: &[String], role: Role, local: &Dest, remote: &Dest, row: &str) -> Vec<String> {
    let mut argv = vec![test.tool_name().to_string()];
    if role == Role::Client {
        argv.push("10.50.0.2".into());
    }
    argv.extend(args.iter().cloned());
    let p = Params::try_parse_from(test, &argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
    let banner = Banner::new(&p, "rxe0", Mtu::Mtu1024, 1, u32::from(local.out_reads));
    let mut out = if role == Role::Server { waiting_lines() } else { Vec::new() };
    out.extend(banner.lines());
    out.extend(addresses(test, std::slice::from_ref(local), std::slice::from_ref(remote)));
    let n: Vec<f64> = row.split_whitespace().map(|x| x.parse().unwrap()).collect();
    if test.is_bw() {
        out.push(bw_header(false).to_string());
        let r = BwReport { size: n[0] as u64, iters: n[1] as u64, bw_peak: n[2], bw_avg: n[3], msg_rate: n[4] };
        out.push(bw_line(&r, false));
    } else {
        out.push(RESULT_FMT_LAT.to_string());
        let s = LatStats {
            size: n[0] as u64,
            iters: n[1] as u64,
            t_min: n[2],
            t_max: n[3],
            t_typical: n[4],
            t_avg: n[5],
            t_stdev: n[6],
            p99: n[7],
            p999: n[8],
        };
        out.push(lat_line(&s));
    }
    out.push(RESULT_LINE.to_string());
    out
}

fn compare(what: &str, ours: &[String], theirs: &[String]) {
    let theirs: Vec<String> = theirs.iter().map(|l| l.replace("[MB/sec]", "[MiB/sec]")).collect();
    for (i, (o, t)) in ours.iter().zip(&theirs).enumerate() {
        assert_eq!(o, t, "{what}: line {i} differs");
    }
    assert_eq!(ours.len(), theirs.len(), "{what}: ours {ours:#?}\ntheirs {theirs:#?}");
}

#[test]
fn client_and_server_output_as_perftest_printed_it() {
    for &(txt, pcap, test) in RUNS {
        let cap = read_output(txt);
        let segs = oob_segments(pcap);
        let (c, s) = (first_record(&segs, true), first_record(&segs, false));
        let row_of = |lines: &[String]| lines[lines.len() - 2].clone();
        let ours = render(test, &cap.args, Role::Client, &c, &s, &row_of(&cap.client));
        compare(&format!("{txt} client"), &ours, &cap.client);
        let ours = render(test, &cap.args, Role::Server, &s, &c, &row_of(&cap.server));
        compare(&format!("{txt} server"), &ours, &cap.server);
    }
}

#[test]
fn the_mib_header_is_the_only_textual_change() {
    // perftest 4.5's header with MB -> MiB is exactly ours; nothing else moves.
    let theirs = " #bytes     #iterations    BW peak[MB/sec]    BW average[MB/sec]   MsgRate[Mpps]";
    assert_eq!(bw_header(false), theirs.replace("MB/sec", "MiB/sec"));
    assert_eq!(bw_header(true), theirs.replace("MB/sec", "Gb/sec"));
}

#[test]
fn c_alternate_hex_as_printf() {
    // Values from the captured address lines.
    assert_eq!(c_alt_hex(0, 4), "0000");
    assert_eq!(c_alt_hex(0x35, 6), "0x0035");
    assert_eq!(c_alt_hex(0x76849, 6), "0x76849");
    assert_eq!(c_alt_hex(0xdab31a, 6), "0xdab31a");
    assert_eq!(c_alt_hex(0x26a8, 8), "0x0026a8");
    assert_eq!(c_alt_hex(0x5621_a9ba_d000, 16), "0x005621a9bad000");
    assert_eq!(c_alt_hex(0x80, 4), "0x80");
}

#[test]
fn titles_of_all_eight_tests() {
    let t = |k, a| title(k, a).trim_start().to_string();
    assert_eq!(t(TestKind::SendBw, AtomicType::FetchAndAdd), "Send BW Test");
    assert_eq!(t(TestKind::WriteBw, AtomicType::FetchAndAdd), "RDMA_Write BW Test");
    assert_eq!(t(TestKind::ReadBw, AtomicType::FetchAndAdd), "RDMA_Read BW Test");
    assert_eq!(t(TestKind::AtomicBw, AtomicType::FetchAndAdd), "Atomic FETCH_AND_ADD BW Test");
    assert_eq!(t(TestKind::AtomicBw, AtomicType::CmpAndSwap), "Atomic CMP_AND_SWAP BW Test");
    assert_eq!(t(TestKind::SendLat, AtomicType::FetchAndAdd), "Send Latency Test");
    assert_eq!(t(TestKind::WriteLat, AtomicType::FetchAndAdd), "RDMA_Write Latency Test");
    assert_eq!(t(TestKind::ReadLat, AtomicType::FetchAndAdd), "RDMA_Read Latency Test");
    assert_eq!(t(TestKind::AtomicLat, AtomicType::FetchAndAdd), "Atomic FETCH_AND_ADD Latency Test");
    assert!(title(TestKind::SendBw, AtomicType::FetchAndAdd).starts_with(&" ".repeat(20)));
}

#[test]
fn several_qps_print_all_local_then_all_remote() {
    let d = |q| Dest { qpn: q, psn: q, ..Dest::default() };
    let v = addresses(TestKind::SendBw, &[d(1), d(2)], &[d(3), d(4)]);
    let qpns: Vec<&str> = v.iter().filter_map(|l| l.split("QPN ").nth(1)).map(|r| &r[..6]).collect();
    assert_eq!(qpns, ["0x0001", "0x0002", "0x0003", "0x0004"]);
    assert!(v[0].starts_with(" local") && v[4].starts_with(" remote"));
    assert_eq!(v.last().unwrap(), RESULT_LINE);
    assert_eq!(
        address_lines(TestKind::SendBw, true, &d(1))[1],
        " GID: 00:00:00:00:00:00:00:00:00:00:00:00:00:00:00:00"
    );
}

#[test]
fn bw_figures_from_a_measurement() {
    // 20 x 4096 B in 10 ms: 8192000 B/s = 7.8125 MiB/s; 2000 msg/s = 0.002 Mpps.
    let r = bw_report(4096, 20, 1, false, Duration::from_millis(10), 8.5);
    assert_eq!((r.size, r.iters), (4096, 20));
    assert!((r.bw_avg - 7.8125).abs() < 1e-9, "{}", r.bw_avg);
    assert!((r.msg_rate - 0.002).abs() < 1e-12);
    assert_eq!(r.bw_peak, 8.5);
    // Four QPs and both directions: eight times the bytes, the same #iterations column.
    let r4 = bw_report(4096, 20, 4, true, Duration::from_millis(10), 0.0);
    assert!((r4.bw_avg - 8.0 * 7.8125).abs() < 1e-9);
    assert_eq!(r4.iters, 20);
    assert_eq!(bw_line(&r, false), " 4096       20               8.50               7.81   \t\t   0.002000");
    // Gb/s: 7.8125 MiB/s = 8192000 B/s = 0.065536 Gb/s.
    assert!((mibs_to_gbits(7.8125) - 0.065536).abs() < 1e-12);
    // Below 0.1 Gb/s perftest prints six decimals with other spacing (REPORT_FMT_EXT,
    // " %-7lu    %lu           %-7.6lf            %-7.6lf            %-7.6lf"), where two decimals said 0.07.
    assert_eq!(bw_line(&r, true), " 4096       20           0.071303            0.065536            0.002000");
    // From 0.1 Gb/s on, REPORT_FMT again: 16 QPs, 1.048576 Gb/s.
    let r16 = bw_report(4096, 20, 16, false, Duration::from_millis(10), 0.0);
    assert_eq!(bw_line(&r16, true), " 4096       20               0.00               1.05   \t\t   0.032000");
    assert_eq!(bw_report(1, 1, 1, false, Duration::ZERO, 0.0).bw_avg, 0.0);
}

/// perftest's `print_report_lat` on the samples (microseconds), written from its description: sorted, the two
/// largest left out (LAT_MEASURE_TAIL), t_max = the sample at index m (m = count - 2), median of the m kept
/// (`get_median`), mean and population stdev of the m kept, 99% / 99.9% = the samples at ceil(m x 0.99) and
/// ceil(m x 0.999), every figure divided by the RTT factor.
fn perftest_lat(samples: &[u64], rtt: f64) -> [f64; 7] {
    let mut d: Vec<f64> = samples.iter().map(|&s| s as f64 / rtt).collect();
    d.sort_by(f64::total_cmp);
    let m = d.len() - 2;
    let median = if (m - 1) % 2 == 1 { (d[m / 2] + d[m / 2 - 1]) / 2.0 } else { d[m / 2] };
    let avg = d[..m].iter().sum::<f64>() / m as f64;
    let stdev = (d[..m].iter().map(|x| (avg - x).powi(2)).sum::<f64>() / m as f64).sqrt();
    let p = |q: f64| d[((m as f64) * q).ceil() as usize];
    [d[0], d[m], median, avg, stdev, p(0.99), p(0.999)]
}

/// Our row against perftest's figures: min, max, mean and stdev exact (to rounding), the median and percentiles
/// within the histogram's 0.1%.
#[track_caller]
fn assert_as_perftest(samples: &[u64], rtt: u32) {
    let mut rec = LatRecorder::new();
    for &us in samples {
        rec.record(Duration::from_micros(us));
    }
    let s = rec.stats(64, samples.len() as u64, rtt).unwrap();
    let want = perftest_lat(samples, f64::from(rtt));
    let got = [s.t_min, s.t_max, s.t_typical, s.t_avg, s.t_stdev, s.p99, s.p999];
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let tol = if matches!(i, 2 | 5 | 6) { w * 0.001 } else { 1e-9 * w.max(1.0) };
        assert!((g - w).abs() <= tol, "figure {i}: ours {g} perftest {w} ({} samples)", samples.len());
    }
}

#[test]
fn latency_statistics_and_rtt_factor() {
    assert_eq!(rtt_factor(TestKind::SendLat), 2);
    assert_eq!(rtt_factor(TestKind::WriteLat), 2);
    assert_eq!(rtt_factor(TestKind::ReadLat), 1);
    assert_eq!(rtt_factor(TestKind::AtomicLat), 1);
    let mut rec = LatRecorder::new();
    assert!(rec.stats(64, 20, 2).is_none());
    // 1..=1000 us round trips: perftest leaves 999 and 1000 out; t_max is 999, the median of 1..=998 is 499.5,
    // 99% is the sample at ceil(998 x 0.99) = 989, i.e. 990 us, 99.9% the one at 998, i.e. 999 us.
    let all: Vec<u64> = (1..=1000).collect();
    for &us in &all {
        rec.record(Duration::from_micros(us));
    }
    assert_eq!(rec.len(), 1000);
    let s = rec.stats(64, 1000, 1).unwrap();
    assert_eq!((s.t_min, s.t_max), (1.0, 999.0));
    assert!((s.t_avg - 499.5).abs() < 1e-9, "{}", s.t_avg);
    // Population stdev of 1..=n: sqrt((n^2 - 1) / 12), n = 998.
    assert!((s.t_stdev - ((998.0f64 * 998.0 - 1.0) / 12.0).sqrt()).abs() < 1e-6, "{}", s.t_stdev);
    let near = |got: f64, want: f64| (got - want).abs() <= want * 0.001 + 1e-9;
    assert!(near(s.t_typical, 499.5), "median {}", s.t_typical);
    assert!(near(s.p99, 990.0), "p99 {}", s.p99);
    assert_eq!(s.p999, 999.0);
    // Half round trip for send/write.
    let h = rec.stats(64, 1000, 2).unwrap();
    assert_eq!((h.t_min, h.t_max), (0.5, 499.5));
    assert!((h.t_avg - 249.75).abs() < 1e-9);
    // Outliers: the two largest do not count (perftest's LAT_MEASURE_TAIL), the third does.
    assert_as_perftest(&[10, 10, 10, 10, 1000], 1);
    assert_as_perftest(&[10, 11, 12, 500, 900, 1000], 2);
    assert_as_perftest(&all, 1);
    assert_as_perftest(&all, 2);
    // Odd and even counts, duplicates, skewed and random sets, perftest's smallest run (-n 5).
    let mut next = xorshift(0x1a7e);
    for n in [5usize, 6, 7, 8, 99, 100, 101, 1000, 4097] {
        let v: Vec<u64> = (0..n).map(|_| 1 + next(50) * next(50) + next(3) * 4000).collect();
        assert_as_perftest(&v, 1);
        assert_as_perftest(&v, 2);
    }
}

#[test]
fn json_carries_the_table_figures() {
    let p = Params::try_parse_from(TestKind::WriteBw, ["rdp_write_bw", "h", "-s", "4096", "-n", "20"]).unwrap();
    let banner = Banner::new(&p, "rdp0", Mtu::Mtu1024, 1, 1);
    let r = BwReport { size: 4096, iters: 20, bw_peak: 8.7, bw_avg: 7.93, msg_rate: 0.00203 };
    let j = json(&banner, &Results::Bw(vec![r]), false);
    assert!(j.contains("\"test\": \"RDMA_Write BW Test\""), "{j}");
    assert!(
        j.contains(
            "{\"MsgSize\": 4096, \"n_iterations\": 20, \"BW_peak\": 8.70, \"BW_average\": 7.93, \"MsgRate\": 0.002030}"
        ),
        "{j}"
    );
    assert!(j.contains("\"bw_unit\": \"MiB/sec\""));
    let g = json(&banner, &Results::Bw(vec![r, r]), true);
    assert!(g.contains("\"results\": [") && g.contains("\"bw_unit\": \"Gb/sec\""), "{g}");
    assert_eq!(g.matches("\"MsgSize\"").count(), 2);
    let p = Params::try_parse_from(TestKind::SendLat, ["rdp_send_lat"]).unwrap();
    let banner = Banner::new(&p, "a\"b", Mtu::Mtu4096, 0, 1);
    let s = LatStats {
        size: 2,
        iters: 1000,
        t_min: 1.0,
        t_max: 9.0,
        t_typical: 2.0,
        t_avg: f64::NAN,
        t_stdev: 0.5,
        p99: 8.0,
        p999: 9.0,
    };
    let j = json(&banner, &Results::Lat(vec![s]), false);
    assert!(j.contains("\"device\": \"a\\\"b\""), "{j}");
    assert!(
        j.contains("\"t_typical\": 2.00") && j.contains("\"t_avg\": 0.00") && j.contains("\"percentile_99.9\": 9.00"),
        "{j}"
    );
    assert!(j.contains("\"role\": \"server\""));
    // Balanced braces and brackets, no NaN.
    assert_eq!(j.matches('{').count(), j.matches('}').count());
    assert!(!j.contains("NaN"));
}

#[test]
fn latency_duration_row() {
    // REPORT_FMT_LAT_DUR: " %-7lu       %d            %-7.2f        %-7.2f".
    assert_eq!(lat_dur_line(2, 123456, 1.5, 333333.333), " 2             123456            1.50           333333.33");
}

/// perftest's own search: every post i, every signaled completion j >= i.
/// A deterministic xorshift64 generator from `seed`: each call gives the next value modulo `m`.
fn xorshift(mut seed: u64) -> impl FnMut(u64) -> u64 {
    move |m| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    }
}

fn brute_peak(posted: &[u64], signaled: &[(usize, u64)], size: u64) -> f64 {
    let mut best = 0.0f64;
    for (i, &p) in posted.iter().enumerate() {
        for &(j, c) in signaled.iter().filter(|(j, _)| *j >= i) {
            let rate = (j - i + 1) as f64 / ((c - p).max(1) as f64 * 1e-9);
            best = best.max(rate);
        }
    }
    size as f64 * best / 1_048_576.0
}

#[test]
fn bw_peak_is_perftests_best_run_of_messages() {
    // Deterministic pseudo-random post and completion times: a window of `depth` in flight, a completion signaled
    // every `cq_mod` posts and on the last, bursts and stalls mixed in.
    let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
    for (n, depth, cq_mod) in [(20usize, 20usize, 20usize), (500, 16, 4), (300, 7, 1), (1000, 128, 100), (64, 64, 1)] {
        let mut posted = Vec::new();
        let mut signaled = Vec::new();
        let mut meter = PeakMeter::new();
        let mut now = 1_000u64;
        let mut done = 0usize;
        while done < n {
            while posted.len() < n && posted.len() - done < depth && rnd(3) != 0 {
                now += rnd(50);
                posted.push(now);
                meter.post(now);
            }
            let stall = if rnd(10) == 0 { 5000 } else { 200 };
            now += 1 + rnd(stall);
            // Complete up to the next signaled WR that was posted.
            let next = (done / cq_mod + 1) * cq_mod;
            let upto = next.min(n);
            if upto <= posted.len() {
                signaled.push((upto - 1, now));
                meter.complete(upto as u64, now);
                done = upto;
            }
        }
        let want = brute_peak(&posted, &signaled, 4096);
        let got = meter.mibs(4096);
        assert!((got - want).abs() <= want * 1e-12, "n={n} depth={depth} cq_mod={cq_mod}: {got} vs {want}");
        // Never below the average over the whole run (the pair first post / last completion).
        let avg = 4096.0 * n as f64 / ((signaled.last().unwrap().1 - posted[0]) as f64 * 1e-9) / 1_048_576.0;
        assert!(got >= avg * (1.0 - 1e-12), "{got} < {avg}");
    }
    assert_eq!(PeakMeter::new().mibs(4096), 0.0);
}

#[test]
fn bw_peak_of_posts_stamped_per_pass_keeps_one_point_per_pass() {
    // A tool that reads its clock once per pass stamps every post of the pass alike. perftest's peak over such
    // input (brute force over every post) is unchanged when the meter keeps only the first post of each stamp,
    // and the meter holds at most one point per distinct stamp (it held one per post before).
    let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
    for (n, depth, cq_mod) in [(2000usize, 128usize, 100usize), (600, 16, 4), (600, 32, 8), (4000, 512, 100)] {
        let (mut posted, mut signaled) = (Vec::new(), Vec::new());
        let mut meter = PeakMeter::new();
        let (mut now, mut done, mut stamps, mut most) = (1_000u64, 0usize, 0usize, 0usize);
        while done < n {
            // One pass: one stamp for all its posts (taken before them), then the completions polled.
            now += 1 + rnd(40);
            let mut any = false;
            while posted.len() < n && posted.len() - done < depth && rnd(8) != 0 {
                posted.push(now);
                meter.post(now);
                any = true;
            }
            stamps += usize::from(any);
            most = most.max(meter.points());
            let stall = if rnd(10) == 0 { 5000 } else { 300 };
            now += 1 + rnd(stall);
            let upto = ((done / cq_mod + 1) * cq_mod).min(n);
            if upto <= posted.len() {
                signaled.push((upto - 1, now));
                meter.complete(upto as u64, now);
                done = upto;
            }
        }
        let want = brute_peak(&posted, &signaled, 4096);
        let got = meter.mibs(4096);
        assert!((got - want).abs() <= want * 1e-12, "n={n} depth={depth} cq_mod={cq_mod}: {got} vs {want}");
        assert!(stamps < n / 2, "the input must batch posts: {stamps} passes for {n} posts");
        assert!(most <= stamps, "n={n}: {most} points kept for {stamps} distinct stamps");
    }
}

/// `--out_json`'s `test_info` carries the banner under the keys perftest's JSON uses (as a consumer of
/// perftest's JSON reads them: Dual_port, Device, Number_of_qps, Transport_type, Connection_type, Using_SRQ,
/// PCIe_relax_order, ibv_wr_API, TX_depth, RX_depth, CQ_Moderation, Mtu, Link_type, GID_index, Max_inline_data,
/// rdma_cm_QPs, Data_ex_method), numbers as numbers; before, only our own keys. The document is valid JSON.
#[test]
fn json_test_info_has_perftests_keys() {
    let p = Params::try_parse_from(TestKind::WriteBw, ["rdp_write_bw", "h", "-s", "4096", "-n", "20"]).unwrap();
    let banner = Banner::new(&p, "rdp0", Mtu::Mtu1024, 1, 1);
    let r = BwReport { size: 4096, iters: 20, bw_peak: 8.7, bw_avg: 7.93, msg_rate: 0.00203 };
    let j: serde_json::Value = serde_json::from_str(&json(&banner, &Results::Bw(vec![r]), false)).unwrap();
    let info = &j["test_info"];
    for (k, v) in [
        ("Dual_port", serde_json::json!("OFF")),
        ("Device", serde_json::json!("rdp0")),
        ("Number_of_qps", serde_json::json!(1)),
        ("Transport_type", serde_json::json!("IB")),
        ("Connection_type", serde_json::json!("RC")),
        ("Using_SRQ", serde_json::json!("OFF")),
        ("PCIe_relax_order", serde_json::json!("ON")),
        ("ibv_wr_API", serde_json::json!("OFF")),
        ("TX_depth", serde_json::json!(20)),
        ("CQ_Moderation", serde_json::json!(20)),
        ("Mtu", serde_json::json!(1024)),
        ("Link_type", serde_json::json!("Ethernet")),
        ("GID_index", serde_json::json!(1)),
        ("Max_inline_data", serde_json::json!(0)),
        ("rdma_cm_QPs", serde_json::json!("OFF")),
        ("Data_ex_method", serde_json::json!("Ethernet")),
        ("test", serde_json::json!("RDMA_Write BW Test")),
    ] {
        assert_eq!(info[k], v, "{k}: {info}");
    }
    assert!(info.get("RX_depth").is_none(), "a write client shows no RX depth: {info}");
    assert_eq!(j["results"]["BW_average"], serde_json::json!(7.93));
    // A read server: no TX depth, its outstanding reads.
    let p = Params::try_parse_from(TestKind::ReadBw, ["rdp_read_bw", "-o", "4"]).unwrap();
    let j: serde_json::Value =
        serde_json::from_str(&json(&Banner::new(&p, "rdp0", Mtu::Mtu4096, 3, 4), &Results::Bw(vec![]), true)).unwrap();
    assert_eq!(j["test_info"]["Outstand_reads"], serde_json::json!(4), "{j}");
    assert!(j["test_info"].get("TX_depth").is_none(), "{j}");
}
