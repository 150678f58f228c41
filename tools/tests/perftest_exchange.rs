//! The perftest out-of-band exchange against the real thing: every TCP exchange captured between two perftest 4.5
//! peers (shared/vectors/rxe/*.pcap, port 18515) is replayed through an in-memory peer in both roles, and every
//! byte we write must equal what perftest wrote (with our QP records and report set to the captured values, which
//! also checks the encoders byte for byte). Then our client against our server over TCP on 127.0.0.1, and the
//! failure modes: wrong version, MTU mismatch, refused connection, a vanished or silent peer, garbage.

mod common;

use common::{oob_segments, Segment};
use roce_dp_tools::perftest::exchange::{
    accept, check_gid_compatibility, connect, listen, BwReport, Dest, Exchange, ExchangeError, Mtu, Role, SysData,
    TestKind, DEST_LEN, REPORT_LEN,
};
use std::io::{self, ErrorKind, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

/// A peer that replays the captured segments of the other side, and only hands over a segment once we have
/// written everything the capture shows our side writing before it (so a read-before-write is caught).
struct ScriptedPeer {
    segs: Vec<Segment>,
    us_client: bool,
    /// Index of the next peer segment to deliver and how much of it was delivered.
    next: usize,
    offset: usize,
    written: Vec<u8>,
    /// Most bytes handed over per read and taken per write (1 tests partial reads and writes).
    chunk: usize,
}

impl ScriptedPeer {
    fn new(segs: Vec<Segment>, role: Role, chunk: usize) -> Self {
        ScriptedPeer { segs, us_client: role == Role::Client, next: 0, offset: 0, written: Vec::new(), chunk }
    }

    fn ours_expected(&self) -> Vec<u8> {
        self.segs.iter().filter(|s| s.from_client == self.us_client).flat_map(|s| s.data.clone()).collect()
    }
}

impl Read for ScriptedPeer {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.next < self.segs.len() && self.segs[self.next].from_client == self.us_client {
            self.next += 1;
        }
        if self.next >= self.segs.len() {
            return Ok(0);
        }
        let ours_before: usize =
            self.segs[..self.next].iter().filter(|s| s.from_client == self.us_client).map(|s| s.data.len()).sum();
        if self.written.len() < ours_before {
            return Err(io::Error::new(ErrorKind::WouldBlock, "read before writing what the capture writes first"));
        }
        let seg = &self.segs[self.next].data;
        let n = buf.len().min(seg.len() - self.offset).min(self.chunk);
        buf[..n].copy_from_slice(&seg[self.offset..self.offset + n]);
        self.offset += n;
        if self.offset == seg.len() {
            self.next += 1;
            self.offset = 0;
        }
        Ok(n)
    }
}

impl Write for ScriptedPeer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(self.chunk);
        self.written.extend_from_slice(&buf[..n]);
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// The first 108-byte record a side sent, and its report (40 bytes after the 5th-from-last record... found by
/// position: the five 8-byte segments) if any.
fn captured_values(segs: &[Segment], client: bool) -> (Dest, Option<[u8; REPORT_LEN]>) {
    let mine: Vec<&Segment> = segs.iter().filter(|s| s.from_client == client).collect();
    let rec = mine.iter().find(|s| s.data.len() == DEST_LEN).expect("a record");
    let dest = Dest::decode(&rec.data).expect("captured record parses");
    let eights: Vec<u8> = mine.iter().filter(|s| s.data.len() == 8).flat_map(|s| s.data.clone()).collect();
    let report = match eights.len() {
        0 => None,
        REPORT_LEN => Some(eights.try_into().unwrap()),
        n => panic!("{n} bytes of 8-byte segments, expected 0 or {REPORT_LEN}"),
    };
    (dest, report)
}

/// What one side does from connect to close, with one QP.
struct Outcome {
    peer_version: String,
    sys: SysData,
    mtu: Mtu,
    remote: Vec<Dest>,
    peer_report: Option<BwReport>,
}

fn run_side<S: Read + Write>(
    ex: Exchange<S>,
    test: TestKind,
    mine: &Dest,
    report: &BwReport,
    mtu: Mtu,
) -> Result<Outcome, ExchangeError> {
    let mut ex = ex;
    let n = ex.setup(SysData::default(), mtu, false)?;
    let remote = ex.exchange_dests(test, std::slice::from_ref(mine))?;
    ex.ready(test, mine, false)?;
    assert_eq!(ex.end_run(test, mine, report, false, false)?, None);
    let peer_report = ex.finish(test, mine, report, false)?;
    Ok(Outcome { peer_version: n.peer_version, sys: n.sys, mtu: n.mtu, remote, peer_report })
}

fn replay(name: &str, test: TestKind, role: Role, chunk: usize) {
    let segs = oob_segments(name);
    let us_client = role == Role::Client;
    let (mine, my_report) = captured_values(&segs, us_client);
    let (theirs, their_report) = captured_values(&segs, !us_client);
    let report = my_report.map(|r| BwReport::decode(&r)).unwrap_or_default();
    let mut peer = ScriptedPeer::new(segs.clone(), role, chunk);
    let out = {
        let ex = Exchange::new(&mut peer, role, Duration::from_secs(1));
        run_side(ex, test, &mine, &report, Mtu::Mtu1024).unwrap_or_else(|e| panic!("{name} as {role:?}: {e}"))
    };
    let expected = peer.ours_expected();
    assert_eq!(
        peer.written.len(),
        expected.len(),
        "{name} as {role:?}: wrote {} bytes, perftest wrote {}",
        peer.written.len(),
        expected.len()
    );
    if let Some(i) = (0..expected.len()).find(|&i| peer.written[i] != expected[i]) {
        panic!(
            "{name} as {role:?}: first difference at byte {i}: ours {:02x?}, perftest's {:02x?}",
            &peer.written[i..(i + 16).min(expected.len())],
            &expected[i..(i + 16).min(expected.len())]
        );
    }
    assert_eq!(out.peer_version, "6.06");
    assert_eq!(out.sys, SysData { cycle_buffer: 4096, cache_line: 64 });
    assert_eq!(out.mtu, Mtu::Mtu1024);
    assert_eq!(out.remote, vec![theirs], "{name}: the peer's QP as parsed");
    // Reports are swapped exactly in the write/read/atomic BW tests, and come back bit for bit.
    match (out.peer_report, their_report) {
        (Some(got), Some(raw)) => assert_eq!(got.encode(), raw, "{name}: peer report"),
        (None, None) => {}
        (got, raw) => panic!("{name}: report exchanged {:?} vs captured {:?}", got.is_some(), raw.is_some()),
    }
}

const CAPTURES: &[(&str, TestKind)] = &[
    ("rc_write_4k.pcap", TestKind::WriteBw),
    ("rc_send_4k.pcap", TestKind::SendBw),
    ("rc_read_4k.pcap", TestKind::ReadBw),
    ("rc_atomic.pcap", TestKind::AtomicBw),
    ("rc_send_lat_64.pcap", TestKind::SendLat),
    ("rc_write_lat_64.pcap", TestKind::WriteLat),
    ("drop5_write_tapa0.pcap", TestKind::WriteBw),
    ("ecn_ce_all_write_tapa0.pcap", TestKind::WriteBw),
    ("uc_write_4k.pcap", TestKind::WriteBw),
    ("ud_send_1k.pcap", TestKind::SendBw),
];

#[test]
fn client_writes_what_perftest_wrote_in_every_capture() {
    for &(name, test) in CAPTURES {
        replay(name, test, Role::Client, usize::MAX);
    }
}

#[test]
fn server_writes_what_perftest_wrote_in_every_capture() {
    for &(name, test) in CAPTURES {
        replay(name, test, Role::Server, usize::MAX);
    }
}

#[test]
fn byte_at_a_time_reads_and_writes_change_nothing() {
    for &(name, test) in CAPTURES {
        for role in [Role::Client, Role::Server] {
            replay(name, test, role, 1);
        }
    }
}

/// The exchanges captured between two perftest 4.5 peers with `-a`, `-b` and `-D` (tools/tests/vectors/perftest-4.5,
/// `scripts/interop-rxe.sh --smoke` with IOP_PCAP=1): file, test, sizes run, `-b`.
const MULTI_RUN: &[(&str, TestKind, usize, bool)] = &[
    ("ib_write_bw_a_n_5.pcap", TestKind::WriteBw, 23, false),
    ("ib_send_bw_a_n_5.pcap", TestKind::SendBw, 23, false),
    ("ib_send_lat_a_n_5.pcap", TestKind::SendLat, 23, false),
    ("ib_write_lat_a_n_5.pcap", TestKind::WriteLat, 23, false),
    ("ib_read_lat_a_n_5.pcap", TestKind::ReadLat, 23, false),
    ("ib_write_bw_s_4096_n_200_b.pcap", TestKind::WriteBw, 1, true),
    ("ib_send_bw_s_4096_n_200_b.pcap", TestKind::SendBw, 1, true),
    ("ib_read_bw_s_4096_n_200_b.pcap", TestKind::ReadBw, 1, true),
    ("ib_write_bw_a_b_n_5.pcap", TestKind::WriteBw, 23, true),
    ("ib_send_bw_a_b_n_5.pcap", TestKind::SendBw, 23, true),
    ("ib_write_bw_s_4096_D_3_f_1.pcap", TestKind::WriteBw, 1, false),
    ("ib_send_bw_s_4096_D_3_f_1.pcap", TestKind::SendBw, 1, false),
];

/// Every BW report a side sent (five 8-byte segments each), in order.
fn captured_reports(segs: &[Segment], client: bool) -> Vec<BwReport> {
    let eights: Vec<u8> =
        segs.iter().filter(|s| s.from_client == client && s.data.len() == 8).flat_map(|s| s.data.clone()).collect();
    assert_eq!(eights.len() % REPORT_LEN, 0, "8-byte segments that do not make whole reports");
    eights.chunks_exact(REPORT_LEN).map(|c| BwReport::decode(c.try_into().unwrap())).collect()
}

/// One side of a captured multi-run exchange against a replay of perftest's other side: every byte we write must
/// be perftest's (our record and reports set to the captured ones), and we must read each of the peer's reports.
fn replay_runs(name: &str, test: TestKind, runs: usize, duplex: bool, role: Role, chunk: usize) {
    let segs = common::oob_segments_at(&common::perftest_vectors().join(name));
    let us_client = role == Role::Client;
    let mine = first_record(&segs, us_client);
    let theirs = first_record(&segs, !us_client);
    let my_reports = captured_reports(&segs, us_client);
    let their_reports = captured_reports(&segs, !us_client);
    let ctx = format!("{name} as {role:?}");
    let mut peer = ScriptedPeer::new(segs.clone(), role, chunk);
    let (remote, per_run, last) = {
        let mut ex = Exchange::new(&mut peer, role, Duration::from_secs(1));
        let r = (|| -> Result<_, ExchangeError> {
            let n = ex.setup(SysData::default(), Mtu::Mtu1024, false)?;
            assert_eq!((n.peer_version.as_str(), n.mtu), ("6.06", Mtu::Mtu1024), "{ctx}");
            let remote = ex.exchange_dests(test, std::slice::from_ref(&mine))?;
            ex.connected(test, &mine)?;
            let mut per_run = Vec::new();
            for i in 0..runs {
                ex.start_run(test, &mine, duplex)?;
                let r = my_reports.get(i).copied().filter(|_| duplex).unwrap_or_default();
                per_run.push(ex.end_run(test, &mine, &r, duplex, runs > 1)?);
            }
            let last = ex.finish(test, &mine, &my_reports.last().copied().unwrap_or_default(), duplex)?;
            Ok((remote, per_run, last))
        })();
        r.unwrap_or_else(|e| panic!("{ctx}: {e}"))
    };
    let expected = peer.ours_expected();
    if let Some(i) = (0..expected.len().max(peer.written.len())).find(|&i| peer.written.get(i) != expected.get(i)) {
        panic!(
            "{ctx}: first difference at byte {i} of {} (perftest wrote {}): ours {:02x?}, perftest's {:02x?}",
            peer.written.len(),
            expected.len(),
            &peer.written[i.min(peer.written.len())..(i + 16).min(peer.written.len())],
            &expected[i.min(expected.len())..(i + 16).min(expected.len())]
        );
    }
    assert_eq!(remote, vec![theirs], "{ctx}: the peer's QP as parsed");
    // -b: a report each way after every size; one-way write/read/atomic BW: one, in the teardown; else none.
    let want_runs: Vec<Option<BwReport>> = (0..runs).map(|i| duplex.then(|| their_reports[i])).collect();
    let per_run_bits: Vec<_> = per_run.iter().map(|r| r.map(|r| r.encode())).collect();
    let want_bits: Vec<_> = want_runs.iter().map(|r| r.map(|r| r.encode())).collect();
    assert_eq!(per_run_bits, want_bits, "{ctx}: reports after each size");
    let teardown_report = !duplex && matches!(test, TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw);
    assert_eq!(last.map(|r| r.encode()), teardown_report.then(|| their_reports[0].encode()), "{ctx}: teardown report");
    assert_eq!(their_reports.len(), if duplex { runs } else { usize::from(teardown_report) }, "{ctx}: reports");
}

/// The first record a side sent.
fn first_record(segs: &[Segment], client: bool) -> Dest {
    let rec = segs.iter().find(|s| s.from_client == client && s.data.len() == DEST_LEN).expect("a record");
    Dest::decode(&rec.data).expect("captured record parses")
}

#[test]
fn all_sizes_bidirectional_and_timed_runs_write_what_perftest_wrote() {
    for &(name, test, runs, duplex) in MULTI_RUN {
        for role in [Role::Client, Role::Server] {
            replay_runs(name, test, runs, duplex, role, usize::MAX);
            replay_runs(name, test, runs, duplex, role, 1);
        }
    }
}

#[test]
fn multi_run_captures_have_the_shapes_the_sequence_predicts() {
    // Records per side: the setup ones, then per size what start_run/end_run add, then the teardown.
    for &(name, test, runs, duplex) in MULTI_RUN {
        let segs = common::oob_segments_at(&common::perftest_vectors().join(name));
        let records = segs.iter().filter(|s| s.from_client && s.data.len() == DEST_LEN).count();
        // A barrier before each size (send BW, send latency, -b), and after each but with -a (send BW, -b).
        let start = usize::from(matches!(test, TestKind::SendBw | TestKind::SendLat) || (duplex && test.is_bw()));
        let end = usize::from(runs > 1 && (test == TestKind::SendBw || (duplex && test.is_bw())));
        let before = test.records_before_traffic(1, duplex) - start;
        let teardown = match test {
            TestKind::WriteLat => 0,
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw if !duplex => 2,
            _ => 1,
        };
        assert_eq!(records, before + runs * (start + end) + teardown, "{name}: client records");
        let server = segs.iter().filter(|s| !s.from_client && s.data.len() == DEST_LEN).count();
        assert_eq!(server, records, "{name}: server records");
    }
}

#[test]
fn captured_shapes_match_the_documented_sequence() {
    // k records before the traffic and the teardown, as rxe-peer/README.md describes them.
    for &(name, test) in CAPTURES {
        let segs = oob_segments(name);
        let client: Vec<usize> = segs.iter().filter(|s| s.from_client).map(|s| s.data.len()).collect();
        let k = test.records_before_traffic(1, false);
        let mut want = vec![16, 4, 4, 2];
        want.extend(std::iter::repeat_n(DEST_LEN, k));
        match test {
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw => {
                want.extend([DEST_LEN, 8, 8, 8, 8, 8, DEST_LEN, 5])
            }
            TestKind::WriteLat => {}
            _ => want.extend([DEST_LEN, 5]),
        }
        assert_eq!(client, want, "{name}");
        let server: Vec<usize> = segs.iter().filter(|s| !s.from_client).map(|s| s.data.len()).collect();
        assert_eq!(server, want, "{name} (server side)");
    }
}

#[test]
fn record_encoding_matches_the_readme_example() {
    let d = Dest {
        lid: 0,
        out_reads: 1,
        qpn: 0x2f,
        psn: 0xdab31a,
        rkey: 0x20bb,
        vaddr: 0x55c4_cf0e_2000,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 0x0a, 0x32, 0, 1],
        srqn: 0,
    };
    let want = b"0000:0001:00002f:dab31a:000020bb:000055c4cf0e2000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:32:00:01:00000000:\0";
    assert_eq!(&d.encode().unwrap()[..], &want[..]);
    assert_eq!(Dest::decode(want).unwrap(), d);
    assert!(Dest { qpn: 1 << 24, ..d }.encode().is_err());
    assert!(Dest { psn: 1 << 24, ..d }.encode().is_err());
}

#[test]
fn garbage_records_are_errors_not_panics() {
    let good = *b"0000:0001:00002f:dab31a:000020bb:000055c4cf0e2000:00:00:00:00:00:00:00:00:00:00:ff:ff:0a:32:00:01:00000000:\0";
    assert!(Dest::decode(&good[..107]).is_err(), "short");
    let mut no_nul = good;
    no_nul[107] = b'x';
    assert!(Dest::decode(&no_nul).unwrap_err().contains("NUL"));
    let mut bad_hex = good;
    bad_hex[12] = b'g';
    assert!(Dest::decode(&bad_hex).unwrap_err().contains("QPN"));
    let mut bad_sep = good;
    bad_sep[4] = b';';
    assert!(Dest::decode(&bad_sep).unwrap_err().contains("LID"));
    let mut bad_gid = good;
    bad_gid[52] = b' ';
    assert!(Dest::decode(&bad_gid).unwrap_err().contains("GID[0]"));
    let mut sign = good;
    sign[0] = b'+';
    assert!(Dest::decode(&sign).is_err(), "from_str_radix would take a sign; we must not");
    // Every single-byte corruption either still parses (a different hex digit) or is an error; none panics.
    for i in 0..DEST_LEN {
        for b in [0u8, b':', b'z', 0xff, b'A'] {
            let mut r = good;
            r[i] = b;
            let _ = Dest::decode(&r);
        }
    }
    // Upper-case hex is what sscanf accepts too.
    let upper = good.map(|c| c.to_ascii_uppercase());
    assert_eq!(Dest::decode(&upper).unwrap(), Dest::decode(&good).unwrap());
}

#[test]
fn mtu_enum_round_trips() {
    for (bytes, e) in [(256, 1), (512, 2), (1024, 3), (2048, 4), (4096, 5)] {
        let m = Mtu::from_bytes(bytes).unwrap();
        assert_eq!(m as u8, e);
        assert_eq!(m.bytes(), bytes);
        assert_eq!(Mtu::from_enum(e), Some(m));
    }
    assert_eq!(Mtu::from_enum(0), None);
    assert_eq!(Mtu::from_enum(6), None);
    assert_eq!(Mtu::from_bytes(1500), None);
}

// ---- in-memory duplex pipe with timeouts, for the failure cases -------------------------------------------

#[derive(Default)]
struct PipeState {
    buf: [Vec<u8>; 2],
    closed: [bool; 2],
}

/// One end of an in-memory socket pair; reads time out (WouldBlock) like a socket with SO_RCVTIMEO.
struct PipeEnd {
    shared: Arc<(Mutex<PipeState>, Condvar)>,
    side: usize,
    timeout: Duration,
}

fn pipe(timeout: Duration) -> (PipeEnd, PipeEnd) {
    let shared = Arc::new((Mutex::new(PipeState::default()), Condvar::new()));
    (PipeEnd { shared: shared.clone(), side: 0, timeout }, PipeEnd { shared, side: 1, timeout })
}

impl Read for PipeEnd {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let (m, cv) = &*self.shared;
        let deadline = Instant::now() + self.timeout;
        let mut st = m.lock().unwrap();
        let from = 1 - self.side;
        loop {
            if !st.buf[from].is_empty() {
                let n = out.len().min(st.buf[from].len());
                out[..n].copy_from_slice(&st.buf[from][..n]);
                st.buf[from].drain(..n);
                return Ok(n);
            }
            if st.closed[from] {
                return Ok(0);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::Error::new(ErrorKind::WouldBlock, "timed out"));
            }
            st = cv.wait_timeout(st, left).unwrap().0;
        }
    }
}

impl Write for PipeEnd {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let (m, cv) = &*self.shared;
        let mut st = m.lock().unwrap();
        if st.closed[1 - self.side] {
            return Err(io::Error::new(ErrorKind::BrokenPipe, "peer closed"));
        }
        st.buf[self.side].extend_from_slice(data);
        cv.notify_all();
        Ok(data.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Drop for PipeEnd {
    fn drop(&mut self) {
        let (m, cv) = &*self.shared;
        m.lock().unwrap().closed[self.side] = true;
        cv.notify_all();
    }
}

fn dest(qpn: u32, last_ip: u8, out_reads: u16) -> Dest {
    Dest {
        lid: 0,
        out_reads,
        qpn,
        psn: 0x123456 ^ qpn,
        rkey: 0x1000 + qpn,
        vaddr: 0x7f00_0000_0000 + u64::from(qpn) * 0x1000,
        gid: [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 50, 0, last_ip],
        srqn: 0,
    }
}

/// Negotiated sys data and MTU, the peer's QPs, the peer's reports per run and at the end.
type SessionOutcome = (SysData, Mtu, Vec<Dest>, Vec<Option<BwReport>>, Option<BwReport>);

/// One side of a multi-run session as the tools will drive it.
fn session<S: Read + Write>(
    mut ex: Exchange<S>,
    test: TestKind,
    mine: &[Dest],
    sys: SysData,
    mtu: Mtu,
    reports: &[BwReport],
    duplex: bool,
) -> Result<SessionOutcome, ExchangeError> {
    let n = ex.setup(sys, mtu, false)?;
    let remote = ex.exchange_dests(test, mine)?;
    ex.connected(test, &mine[0])?;
    let all = reports.len() > 1;
    let mut per_run = Vec::new();
    for r in reports {
        ex.start_run(test, &mine[0], duplex)?;
        per_run.push(ex.end_run(test, &mine[0], r, duplex, all)?);
    }
    let last = ex.finish(test, &mine[0], reports.last().unwrap(), duplex)?;
    Ok((n.sys, n.mtu, remote, per_run, last))
}

#[test]
fn our_client_and_server_over_a_pipe_all_tests_qp_counts_sizes_and_directions() {
    for test in TestKind::ALL {
        for qps in [1u32, 3] {
            for duplex in [false, true] {
                for runs in [1u64, 3] {
                    if (duplex || qps > 1) && !test.is_bw() {
                        continue;
                    }
                    let ctx = format!("{test:?} q={qps} duplex={duplex} runs={runs}");
                    let (a, b) = pipe(Duration::from_secs(5));
                    let cl: Vec<Dest> = (0..qps).map(|i| dest(0x20 + i, 1, 0x80)).collect();
                    let sv: Vec<Dest> = (0..qps).map(|i| dest(0x40 + i, 2, 0x10)).collect();
                    let rep = |side: u64, i: u64| BwReport {
                        size: 2 << i,
                        iters: 20 + side,
                        bw_peak: 8.7 + i as f64,
                        bw_avg: 7.93,
                        msg_rate: 0.00203,
                    };
                    let crep: Vec<BwReport> = (0..runs).map(|i| rep(0, i)).collect();
                    let srep: Vec<BwReport> = (0..runs).map(|i| rep(1, i)).collect();
                    let (sv2, srep2) = (sv.clone(), srep.clone());
                    let server = thread::spawn(move || {
                        let ex = Exchange::new(b, Role::Server, Duration::from_secs(5));
                        let sys = SysData { cycle_buffer: 8192, cache_line: 64 };
                        session(ex, test, &sv2, sys, Mtu::Mtu4096, &srep2, duplex)
                    });
                    let ex = Exchange::new(a, Role::Client, Duration::from_secs(5));
                    let sys = SysData { cycle_buffer: 4096, cache_line: 128 };
                    let c = session(ex, test, &cl, sys, Mtu::Mtu1024, &crep, duplex)
                        .unwrap_or_else(|e| panic!("{ctx} client: {e}"));
                    let s = server.join().unwrap().unwrap_or_else(|e| panic!("{ctx} server: {e}"));
                    assert_eq!(c.0, SysData { cycle_buffer: 8192, cache_line: 128 }, "{ctx}");
                    assert_eq!(s.0, c.0, "{ctx}");
                    assert_eq!((c.1, s.1), (Mtu::Mtu1024, Mtu::Mtu1024), "{ctx}");
                    assert_eq!(c.2, sv, "{ctx}");
                    assert_eq!(s.2, cl, "{ctx}");
                    // Per-run reports only in duplex BW runs; the final one only in one-way write/read/atomic BW.
                    let per_run = duplex && test.is_bw();
                    let want_c: Vec<_> = srep.iter().map(|r| per_run.then_some(*r)).collect();
                    let want_s: Vec<_> = crep.iter().map(|r| per_run.then_some(*r)).collect();
                    assert_eq!((c.3.clone(), s.3.clone()), (want_c, want_s), "{ctx}");
                    let fin = !duplex && matches!(test, TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw);
                    assert_eq!(s.4, fin.then(|| *crep.last().unwrap()), "{ctx}");
                    assert_eq!(c.4, fin.then(|| *srep.last().unwrap()), "{ctx}");
                }
            }
        }
    }
}

/// Runs `peer` as the other side of a pipe and our side as `role` through `run_side`; returns our error.
fn against(role: Role, timeout: Duration, peer: impl FnOnce(PipeEnd) + Send + 'static) -> ExchangeError {
    let (a, b) = pipe(timeout);
    let t = thread::spawn(move || peer(b));
    let ex = Exchange::new(a, role, timeout);
    let start = Instant::now();
    let r = run_side(ex, TestKind::WriteBw, &dest(0x11, 1, 1), &BwReport::default(), Mtu::Mtu1024);
    assert!(start.elapsed() < timeout * 3, "took {:?}", start.elapsed());
    t.join().unwrap();
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e,
    }
}

fn version_bytes(v: &str) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[..v.len()].copy_from_slice(v.as_bytes());
    b
}

#[test]
fn another_perftest_version_is_refused_naming_both() {
    for role in [Role::Client, Role::Server] {
        let e = against(role, Duration::from_secs(2), |mut p| {
            p.write_all(&version_bytes("6.29")).unwrap();
            let mut theirs = [0u8; 16];
            p.read_exact(&mut theirs).unwrap();
            assert_eq!(&theirs, &version_bytes("6.06"), "the peer still gets our version");
        });
        let msg = e.to_string();
        assert!(matches!(e, ExchangeError::Version { .. }), "{msg}");
        assert!(msg.contains("\"6.29\"") && msg.contains("\"6.06\""), "{msg}");
        assert!(!msg.contains('\n'));
    }
}

#[test]
fn garbage_version_is_malformed() {
    let e = against(Role::Server, Duration::from_secs(2), |mut p| {
        p.write_all(&[0xff; 16]).unwrap();
        let _ = p.read(&mut [0u8; 16]);
    });
    assert!(matches!(e, ExchangeError::Malformed { step: "version", .. }), "{e}");
}

/// Plays a perftest server up to the MTU: answers version and sys data correctly, then sends `mtu`.
fn answer_until_mtu(p: &mut PipeEnd, mtu: [u8; 2]) {
    let mut buf = [0u8; 16];
    p.read_exact(&mut buf).unwrap();
    p.write_all(&version_bytes("6.06")).unwrap();
    for v in [4096i32, 64] {
        p.read_exact(&mut buf[..4]).unwrap();
        p.write_all(&v.to_be_bytes()).unwrap();
    }
    p.read_exact(&mut buf[..2]).unwrap();
    p.write_all(&mtu).unwrap();
}

fn peer_until_mtu(mtu: [u8; 2]) -> impl FnOnce(PipeEnd) + Send + 'static {
    move |mut p| answer_until_mtu(&mut p, mtu)
}

#[test]
fn forced_mtu_the_peer_cannot_use_is_a_clear_error() {
    let (a, b) = pipe(Duration::from_secs(2));
    let t = thread::spawn(move || peer_until_mtu(*b"3\0")(b));
    let mut ex = Exchange::new(a, Role::Client, Duration::from_secs(2));
    let e = ex.setup(SysData::default(), Mtu::Mtu4096, true).unwrap_err();
    t.join().unwrap();
    assert_eq!(e.to_string(), "MTU mismatch: -m 4096 was requested but the peer's MTU is 1024");
    // Not forced: both take the smaller.
    let (a, b) = pipe(Duration::from_secs(2));
    let t = thread::spawn(move || peer_until_mtu(*b"3\0")(b));
    let mut ex = Exchange::new(a, Role::Client, Duration::from_secs(2));
    assert_eq!(ex.setup(SysData::default(), Mtu::Mtu4096, false).unwrap().mtu, Mtu::Mtu1024);
    t.join().unwrap();
    // A peer with a larger MTU than our forced one is fine: both use ours.
    let (a, b) = pipe(Duration::from_secs(2));
    let t = thread::spawn(move || peer_until_mtu(*b"5\0")(b));
    let mut ex = Exchange::new(a, Role::Client, Duration::from_secs(2));
    assert_eq!(ex.setup(SysData::default(), Mtu::Mtu1024, true).unwrap().mtu, Mtu::Mtu1024);
    t.join().unwrap();
}

#[test]
fn garbage_mtu_and_sys_data_are_malformed() {
    for bad in [*b"7\0", *b"33", *b"\0\0"] {
        let e = against(Role::Client, Duration::from_secs(2), peer_until_mtu(bad));
        assert!(matches!(e, ExchangeError::Malformed { step: "MTU", .. }), "{bad:?}: {e}");
    }
    let e = against(Role::Client, Duration::from_secs(2), |mut p| {
        let mut buf = [0u8; 16];
        p.read_exact(&mut buf).unwrap();
        p.write_all(&version_bytes("6.06")).unwrap();
        p.read_exact(&mut buf[..4]).unwrap();
        p.write_all(&(-1i32).to_be_bytes()).unwrap();
    });
    assert!(matches!(e, ExchangeError::Malformed { step: "cycle buffer", .. }), "{e}");
}

#[test]
fn a_peer_that_vanishes_mid_exchange_is_reported() {
    for role in [Role::Client, Role::Server] {
        let e = against(role, Duration::from_secs(5), |mut p| {
            // Version only, then gone.
            let mut buf = [0u8; 16];
            if p.write_all(&version_bytes("6.06")).is_ok() {
                let _ = p.read_exact(&mut buf);
            }
        });
        assert!(matches!(e, ExchangeError::PeerClosed { .. }), "{role:?}: {e}");
        assert!(e.to_string().contains("peer closed the connection during the"), "{e}");
    }
}

#[test]
fn a_silent_peer_times_out() {
    let start = Instant::now();
    let e = against(Role::Client, Duration::from_millis(300), |p| {
        thread::sleep(Duration::from_millis(600));
        drop(p);
    });
    assert!(matches!(e, ExchangeError::Timeout { step: "version", .. }), "{e}");
    assert!(start.elapsed() >= Duration::from_millis(300));
    assert_eq!(e.to_string(), "peer sent nothing for 0.3 s during the version exchange");
}

#[test]
fn garbage_record_from_the_peer_is_malformed() {
    let e = against(Role::Client, Duration::from_secs(2), |mut p| {
        answer_until_mtu(&mut p, *b"3\0");
        let mut buf = [0u8; DEST_LEN];
        let _ = p.read_exact(&mut buf);
        let _ = p.write_all(&[b'?'; DEST_LEN]);
    });
    assert!(matches!(e, ExchangeError::Malformed { step: "QP record", .. }), "{e}");
}

// ---- real TCP on 127.0.0.1 ----------------------------------------------------------------------------------

#[test]
fn our_client_and_server_over_tcp_every_test() {
    for test in TestKind::ALL {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let sv = dest(0x51, 2, 16);
        let server = thread::spawn(move || {
            let s = accept(&listener, Some(Duration::from_secs(10)), Duration::from_secs(10)).unwrap();
            run_side(
                Exchange::new(s, Role::Server, Duration::from_secs(10)),
                test,
                &sv,
                &BwReport::default(),
                Mtu::Mtu4096,
            )
        });
        let cl = dest(0x31, 1, 16);
        let rep = BwReport { size: 65536, iters: 5000, bw_peak: 1000.5, bw_avg: 999.25, msg_rate: 0.015 };
        let s = connect("127.0.0.1", port, Duration::from_secs(10), Duration::from_secs(10)).unwrap();
        let c = run_side(Exchange::new(s, Role::Client, Duration::from_secs(10)), test, &cl, &rep, Mtu::Mtu2048)
            .unwrap_or_else(|e| panic!("{test:?} client: {e}"));
        let s = server.join().unwrap().unwrap_or_else(|e| panic!("{test:?} server: {e}"));
        assert_eq!(c.remote, vec![sv], "{test:?}");
        assert_eq!(s.remote, vec![cl], "{test:?}");
        assert_eq!((c.mtu, s.mtu), (Mtu::Mtu2048, Mtu::Mtu2048));
        let reports = matches!(test, TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw);
        assert_eq!(s.peer_report, reports.then_some(rep), "{test:?}");
    }
}

#[test]
fn connection_refused_is_one_line_within_the_timeout() {
    let port = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let start = Instant::now();
    // Refused connections are retried for the first duration only, whatever the exchange's timeout.
    let e = connect("127.0.0.1", port, Duration::from_millis(500), Duration::from_secs(60)).unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(3), "{:?}", start.elapsed());
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("couldn't connect to 127.0.0.1:{port}: ")), "{msg}");
    assert!(msg.to_lowercase().contains("refused"), "{msg}");
    // Session 18: and what to do about it.
    assert!(
        msg.ends_with(
            ": no server listens there; start the server first (the same command without the host argument), or \
             give its port with -p"
        ),
        "{msg}"
    );
    assert!(!msg.contains('\n'));
}

#[test]
fn the_client_waits_the_whole_timeout_for_each_step_not_the_connect_window() {
    // A perftest peer can be silent for seconds between two steps (ib_write_bw -a in a TCG guest: 6 s before its
    // first record); the connect window (5 s in the tools) must not become the exchange's read timeout.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let s = connect("127.0.0.1", port, Duration::from_millis(300), Duration::from_secs(40)).unwrap();
    assert_eq!(s.read_timeout().unwrap(), Some(Duration::from_secs(40)));
    assert_eq!(s.write_timeout().unwrap(), Some(Duration::from_secs(40)));
}

#[test]
fn no_client_in_time_is_an_accept_error() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let e = accept(&listener, Some(Duration::from_millis(200)), Duration::from_secs(1)).unwrap_err();
    assert!(matches!(e, ExchangeError::Listen { .. }), "{e}");
}

#[test]
fn a_tcp_peer_that_resets_mid_run_is_reported() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 16];
        s.read_exact(&mut buf).unwrap();
        s.write_all(&version_bytes("6.06")).unwrap();
        drop(s); // gone before the sys data
    });
    let s: TcpStream = connect("127.0.0.1", port, Duration::from_secs(5), Duration::from_secs(5)).unwrap();
    let start = Instant::now();
    let r = run_side(
        Exchange::new(s, Role::Client, Duration::from_secs(5)),
        TestKind::SendLat,
        &dest(1, 1, 1),
        &BwReport::default(),
        Mtu::Mtu1024,
    );
    peer.join().unwrap();
    let e = r.err().expect("an error");
    assert!(matches!(e, ExchangeError::PeerClosed { .. }), "{e}");
    assert!(start.elapsed() < Duration::from_secs(5));
}

#[test]
fn gid_types_must_agree() {
    let v4 = dest(1, 1, 1);
    let mut v6 = v4;
    v6.gid = [0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x50, 0x54, 0, 0xff, 0xfe, 0x50, 0, 1];
    check_gid_compatibility(&v4, &dest(2, 2, 1)).unwrap();
    check_gid_compatibility(&v6, &v6).unwrap();
    let e = check_gid_compatibility(&v4, &v6).unwrap_err().to_string();
    assert!(e.contains("ours IPv4-mapped, the peer's IPv6"), "{e}");
}

/// Plays the captured perftest peer over a real TCP connection: writes its segments, and reads ours checking
/// every byte against what perftest sent, in capture order; then expects our side to close.
fn perftest_peer_over_tcp(mut s: TcpStream, segs: Vec<Segment>, peer_is_client: bool, name: &str) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for (i, seg) in segs.iter().enumerate() {
        if seg.from_client == peer_is_client {
            s.write_all(&seg.data).unwrap();
        } else {
            let mut got = vec![0u8; seg.data.len()];
            s.read_exact(&mut got).unwrap_or_else(|e| panic!("{name}: segment {i}: {e}"));
            assert_eq!(got, seg.data, "{name}: segment {i}");
        }
    }
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{name}: {} bytes after the exchange", rest.len());
}

#[test]
fn captured_perftest_peer_over_tcp_in_both_roles() {
    for &(name, test) in CAPTURES {
        let segs = oob_segments(name);
        for role in [Role::Client, Role::Server] {
            let us_client = role == Role::Client;
            let (mine, my_report) = captured_values(&segs, us_client);
            let report = my_report.map(|r| BwReport::decode(&r)).unwrap_or_default();
            let listener = TcpListener::bind("127.0.0.1:0").unwrap();
            let port = listener.local_addr().unwrap().port();
            let segs2 = segs.clone();
            let out = if us_client {
                let peer = thread::spawn(move || {
                    let (s, _) = listener.accept().unwrap();
                    perftest_peer_over_tcp(s, segs2, false, name);
                });
                let s = connect("127.0.0.1", port, Duration::from_secs(5), Duration::from_secs(5)).unwrap();
                let out = run_side(Exchange::new(s, role, Duration::from_secs(5)), test, &mine, &report, Mtu::Mtu1024);
                peer.join().unwrap();
                out
            } else {
                let peer = thread::spawn(move || {
                    let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                    perftest_peer_over_tcp(s, segs2, true, name);
                });
                let s = accept(&listener, Some(Duration::from_secs(5)), Duration::from_secs(5)).unwrap();
                let out = run_side(Exchange::new(s, role, Duration::from_secs(5)), test, &mine, &report, Mtu::Mtu1024);
                peer.join().unwrap();
                out
            };
            let out = out.unwrap_or_else(|e| panic!("{name} as {role:?}: {e}"));
            assert_eq!(out.mtu, Mtu::Mtu1024);
        }
    }
}

#[test]
fn listen_on_a_busy_port_is_one_line() {
    let first = listen(0).unwrap();
    let port = first.local_addr().unwrap().port();
    // A client reaches it over IPv4 loopback.
    let c =
        thread::spawn(move || connect("127.0.0.1", port, Duration::from_secs(5), Duration::from_secs(5)).map(|_| ()));
    accept(&first, Some(Duration::from_secs(5)), Duration::from_secs(5)).unwrap();
    c.join().unwrap().unwrap();
    let e = listen(port).unwrap_err().to_string();
    assert!(e.starts_with(&format!("couldn't listen for a client on TCP port {port}: ")), "{e}");
    assert!(!e.contains('\n'));
}

#[test]
fn peer_gone_sees_a_closed_peer_without_blocking() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let peer = thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        rx.recv().unwrap();
        drop(s);
    });
    let s = connect("127.0.0.1", port, Duration::from_secs(5), Duration::from_secs(5)).unwrap();
    let ex = Exchange::new(s, Role::Client, Duration::from_secs(5));
    let start = Instant::now();
    assert!(!ex.peer_gone(), "an idle live peer is not gone");
    assert!(start.elapsed() < Duration::from_millis(500), "peer_gone blocked");
    tx.send(()).unwrap();
    peer.join().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while !ex.peer_gone() {
        assert!(Instant::now() < deadline, "closed peer never seen");
        thread::sleep(Duration::from_millis(10));
    }
    // Still usable as a blocking stream afterwards: a read reports the closed peer.
    let mut ex = ex;
    assert!(matches!(ex.exchange_versions(), Err(ExchangeError::PeerClosed { .. })));
}

/// The remote offsets a perftest 4.5 BW client touches in our region over `iters` posts of `size` bytes: its
/// documented walk (the address moves by the size rounded up to the cache line after each post, back to the base
/// once it reaches base + cycle buffer; messages above half the cycle buffer stay at the base).
fn perftest_walk(sys: SysData, size: u64, iters: u64) -> u64 {
    let (cycle, line) = (u64::from(sys.cycle_buffer), u64::from(sys.cache_line));
    let step = size.div_ceil(line) * line;
    let (mut off, mut end) = (0u64, 0u64);
    for _ in 0..iters {
        end = end.max(off + size);
        if size <= cycle / 2 {
            off += step;
            if off >= cycle {
                off = 0;
            }
        }
    }
    end
}

#[test]
fn regions_hold_every_address_a_perftest_client_walks_through() {
    // The interop run that found it: ib_write_bw / ib_read_bw -s 64 -n 1000 against our server, cycle buffer 4096
    // and cache line 64 from the exchange: perftest reached offset 4032 of a 64-byte region (remote access error).
    let sys = SysData::default();
    assert_eq!(perftest_walk(sys, 64, 1000), 4096);
    assert!(sys.region_len(64, 1) >= 4096);
    for cycle in [4096u32, 8192, 65536] {
        let sys = SysData { cycle_buffer: cycle, cache_line: 64 };
        for size in [1u64, 2, 8, 63, 64, 65, 100, 1000, 1500, 2047, 2048, 2049, 4095, 4096, 4097, 65536, 1 << 20] {
            let need = perftest_walk(sys, size, 3 * u64::from(cycle));
            assert!(sys.region_len(size, 1) >= need, "cycle {cycle} size {size}: need {need}");
        }
    }
    // A send server's receive slots still fit, and nothing is smaller than one atomic operand.
    assert!(sys.region_len(65536, 128) >= 128 * 65536);
    assert_eq!(sys.region_len(0, 1), 4096);
    assert!(SysData { cycle_buffer: 0, cache_line: 0 }.region_len(0, 1) >= 8);
    // A hostile peer's cycle buffer (positive i32, "both keep the larger") cannot make us allocate gigabytes.
    assert_eq!(SysData { cycle_buffer: i32::MAX as u32, cache_line: 64 }.region_len(64, 1), (1 << 20) + 64);
}

/// The requests (opcode, source IPv4, RETH va, last payload byte) of a captured perftest run, retransmissions
/// dropped (a PSN seen before from the same source).
fn captured_requests(name: &str) -> Vec<(roce_dp::wire::Opcode, [u8; 4], Option<u64>, u8)> {
    use roce_dp::wire::{parse_frame, IpAddrs};
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    roce_dp_tools::capture::for_each_frame(&common::vectors().join(name), |f| {
        let Ok(fr) = parse_frame(f.data) else { return };
        let IpAddrs::V4 { src, .. } = fr.repr.ip.addrs else { return };
        let op = fr.repr.bth.opcode;
        if fr.payload.is_empty() || !seen.insert((src, fr.repr.bth.psn)) {
            return;
        }
        out.push((op, src, fr.repr.ext.reth.map(|r| r.va), *fr.payload.last().expect("payload")));
    })
    .unwrap_or_else(|e| panic!("{name}: {e}"));
    out
}

#[test]
fn latency_tests_follow_the_captured_perftest_ping_pong() {
    use roce_dp::wire::Opcode;
    // ib_write_lat -s 64 -n 20, client 10.50.0.1 -> server 10.50.0.2: the server writes first; every write goes to
    // the address in the receiver's QP record as given and ends in the marker the receiver polls for.
    let segs = oob_segments("rc_write_lat_64.pcap");
    let (client_rec, _) = captured_values(&segs, true);
    let (server_rec, _) = captured_values(&segs, false);
    let server_ip = [10, 50, 0, 2];
    let writes = captured_requests("rc_write_lat_64.pcap");
    assert_eq!(writes.len(), 40, "20 writes each way");
    assert_eq!(writes[0].1 == server_ip, !TestKind::WriteLat.client_posts_first(), "who writes first");
    for from_server in [true, false] {
        let (dest, mine): (Dest, Vec<_>) = if from_server {
            (client_rec, writes.iter().filter(|w| w.1 == server_ip).collect())
        } else {
            (server_rec, writes.iter().filter(|w| w.1 != server_ip).collect())
        };
        assert_eq!(mine.len(), 20);
        for (k, (op, _, va, last)) in mine.iter().enumerate() {
            assert_eq!(*op, Opcode::RC_RDMA_WRITE_ONLY);
            assert_eq!(*va, Some(dest.vaddr), "write {k}: to the record's address");
            assert_eq!(*last, roce_dp_tools::perftest::exchange::latency_marker(k as u64), "write {k}: marker");
        }
    }
    // The strict alternation: the sides take turns, starting with the one that posts first.
    for (k, w) in writes.iter().enumerate() {
        assert_eq!(w.1 == server_ip, k % 2 == 0, "write {k} out of turn");
    }
    // ib_send_lat -s 64 -n 20: the client sends first.
    let sends = captured_requests("rc_send_lat_64.pcap");
    assert_eq!(sends.len(), 40, "20 sends each way");
    assert_eq!(sends[0].0, Opcode::RC_SEND_ONLY);
    assert_eq!(sends[0].1 == [10, 50, 0, 1], TestKind::SendLat.client_posts_first(), "who sends first");
    // Message 255 ends in 0 (perftest's counter is a C char).
    assert_eq!(roce_dp_tools::perftest::exchange::latency_marker(254), 255);
    assert_eq!(roce_dp_tools::perftest::exchange::latency_marker(255), 0);
    assert_eq!(roce_dp_tools::perftest::exchange::latency_marker(256), 1);
}

// ============================================================================ session 11: a broken or hostile peer
//
// The timeout held each read, not each message: a peer sending a byte now and then (a byte every 59 s against the
// default 60 s) kept a step alive for as long as it liked, 16 bytes of version or 108 of each record at a time. And a
// record naming QP 0 or 1, or a GID that is no unicast address (unspecified, broadcast, multicast, loopback), was
// taken: the QPs were connected towards it and failed only when their retries ran out (or never, for a peer that
// answered ARP for 0.0.0.0).

/// A perftest server that answers everything correctly, one byte every `gap`, until we close.
fn trickling_server(listener: TcpListener, gap: Duration) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut buf = [0u8; 16];
        let _ = s.read_exact(&mut buf);
        let answer: Vec<u8> = [&version_bytes("6.06")[..], &4096i32.to_be_bytes(), &64i32.to_be_bytes()].concat();
        for b in answer {
            thread::sleep(gap);
            if s.write_all(&[b]).is_err() {
                return;
            }
        }
    })
}

/// Over TCP through `Exchange::new` (the generic stream path): the version trickling in at a byte per 150 ms ends
/// at the read that passes the 1 s timeout, naming how much came; before, the version completed after 2.4 s and the
/// session went on at the peer's pace.
#[test]
fn a_peer_trickling_a_message_ends_the_step_at_the_timeout() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = trickling_server(listener, Duration::from_millis(150));
    let s = connect("127.0.0.1", port, Duration::from_secs(5), Duration::from_secs(1)).unwrap();
    let start = Instant::now();
    let r = run_side(
        Exchange::new(s, Role::Client, Duration::from_secs(1)),
        TestKind::WriteBw,
        &dest(0x11, 1, 1),
        &BwReport::default(),
        Mtu::Mtu1024,
    );
    let took = start.elapsed();
    let e = r.err().expect("an error").to_string();
    peer.join().unwrap();
    assert!(e.starts_with("peer sent only ") && e.ends_with(" of the 16 bytes of its version message in 1.0 s"), "{e}");
    assert!(took >= Duration::from_secs(1) && took < Duration::from_millis(1400), "took {took:?}");
}

/// `Exchange::tcp` (what the tools use) holds the message to the timeout to the millisecond even when the peer's
/// bytes come just slower than the timeout would notice per read: a byte every 700 ms against 1 s.
#[test]
fn over_tcp_the_message_deadline_is_exact() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let peer = trickling_server(listener, Duration::from_millis(700));
    let s = connect("127.0.0.1", port, Duration::from_secs(5), Duration::from_secs(1)).unwrap();
    let mut ex = Exchange::tcp(s, Role::Client, Duration::from_secs(1));
    let start = Instant::now();
    let e = ex.setup(SysData::default(), Mtu::Mtu1024, false).unwrap_err();
    let took = start.elapsed();
    drop(ex);
    peer.join().unwrap();
    assert!(matches!(e, ExchangeError::Slow { step: "version", got: 1, want: 16, .. }), "{e}");
    assert!(took >= Duration::from_secs(1) && took < Duration::from_millis(1150), "took {took:?}");
}

/// A peer whose QP record names QP 0 or 1, or a GID that is no unicast address, is refused at the record, in one
/// line naming what it sent; a record of a real RC QP at a unicast address is taken (IPv4-mapped or IPv6).
#[test]
fn peer_records_naming_no_rc_qp_or_no_unicast_gid_are_refused() {
    let mapped = |a: [u8; 4]| {
        let mut g = [0u8; 16];
        g[10..12].copy_from_slice(&[0xff, 0xff]);
        g[12..].copy_from_slice(&a);
        g
    };
    let v6 = |s: &str| s.parse::<std::net::Ipv6Addr>().unwrap().octets();
    let good = dest(0x22, 2, 1);
    for (qpn, gid, why) in [
        (0, good.gid, "QPN 0x0 is a management QP (QP0/QP1), not an RC QP"),
        (1, good.gid, "QPN 0x1 is a management QP (QP0/QP1), not an RC QP"),
        (0x22, mapped([0, 0, 0, 0]), "GID ::ffff:0.0.0.0 is unspecified, not the address of a RoCE port"),
        (
            0x22,
            mapped([255, 255, 255, 255]),
            "GID ::ffff:255.255.255.255 is the broadcast address, not the address of a RoCE port",
        ),
        (0x22, mapped([224, 0, 0, 1]), "GID ::ffff:224.0.0.1 is a multicast address, not the address of a RoCE port"),
        (0x22, mapped([127, 0, 0, 1]), "GID ::ffff:127.0.0.1 is a loopback address, not the address of a RoCE port"),
        (0x22, [0; 16], "GID :: is unspecified, not the address of a RoCE port"),
        (0x22, v6("ff02::1"), "GID ff02::1 is a multicast address, not the address of a RoCE port"),
        (0x22, v6("::1"), "GID ::1 is a loopback address, not the address of a RoCE port"),
    ] {
        let bad = Dest { qpn, gid, ..good };
        let e = against(Role::Client, Duration::from_secs(2), move |mut p| {
            answer_until_mtu(&mut p, *b"3\0");
            let mut buf = [0u8; DEST_LEN];
            for _ in 0..2 {
                if p.read_exact(&mut buf).is_err() || p.write_all(&bad.encode().unwrap()).is_err() {
                    return;
                }
            }
            let _ = p.read(&mut buf);
        });
        assert!(matches!(e, ExchangeError::Malformed { step: "QP record", .. }), "{why}: {e}");
        assert_eq!(e.to_string(), format!("peer sent a malformed QP record message: {why}"));
    }
    for gid in [mapped([10, 50, 0, 2]), v6("fe80::5054:ff:fe50:2"), v6("2001:db8::2")] {
        let d = Dest { gid, ..good };
        let (a, b) = pipe(Duration::from_secs(2));
        let t = thread::spawn(move || {
            let mut p = b;
            answer_until_mtu(&mut p, *b"3\0");
            let mut buf = [0u8; DEST_LEN];
            for _ in 0..2 {
                p.read_exact(&mut buf).unwrap();
                p.write_all(&d.encode().unwrap()).unwrap();
            }
        });
        let mut ex = Exchange::new(a, Role::Client, Duration::from_secs(2));
        ex.setup(SysData::default(), Mtu::Mtu1024, false).unwrap();
        assert_eq!(ex.exchange_dests(TestKind::WriteBw, &[dest(0x11, 1, 1)]).unwrap(), vec![d]);
        t.join().unwrap();
    }
}

/// perftest's READ/atomic depths (`ctx_modify_qp_to_rtr`/`_rts`): in read and atomic tests a QP issues at most
/// what the peer's record announces (its `-o`, rxe's default 128) and accepts what its own announces; before, every
/// QP issued and accepted 16 whatever `-o` and the peer said, so `-o 1` changed only the banner and a peer that
/// accepts 4 (`ib_read_bw -o 4`) got 16 READs at once. A peer record of OUT 0 in a read test is refused.
#[test]
fn read_and_atomic_depths_follow_both_records() {
    use roce_dp_tools::perftest::exchange::{check_peer_depth, rd_atomic_depths};
    let peer = |out_reads: u16| Dest { out_reads, ..dest(0x30, 2, 0) };
    for test in [TestKind::ReadBw, TestKind::ReadLat, TestKind::AtomicBw, TestKind::AtomicLat] {
        assert_eq!(rd_atomic_depths(test, 16, &peer(0x80)), (128, 16), "{test:?}");
        assert_eq!(rd_atomic_depths(test, 1, &peer(4)), (4, 1), "{test:?}");
        assert_eq!(rd_atomic_depths(test, 128, &peer(0xffff)), (128, 128), "{test:?}");
        let e = check_peer_depth(test, &[peer(4), peer(0)]).unwrap_err().to_string();
        assert_eq!(
            e,
            "peer sent a malformed QP record message: QP 0x30 accepts no outstanding READ/atomic request (OUT 0)"
        );
        check_peer_depth(test, &[peer(1)]).unwrap();
    }
    for test in [TestKind::WriteBw, TestKind::SendBw, TestKind::WriteLat, TestKind::SendLat] {
        assert_eq!(rd_atomic_depths(test, 4, &peer(1)), (16, 16), "{test:?}");
        check_peer_depth(test, &[peer(0)]).unwrap();
    }
}
