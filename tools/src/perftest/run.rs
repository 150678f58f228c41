//! The eight `rdp_*` tools' run, on either of two backends behind one trait (`Nic`): an engine embedded in the
//! process on the DPDK port of a profile (`--port-conf FILE`, `perftest::embedded`), or QPs in a running roce-dpd
//! through the client library (`--daemon SOCKET`, `perftest::daemon`). Everything else is shared: the session flow
//! here and the traffic loops (`perftest::traffic`) are generic over the backend, so every test and flag works the
//! same on both.
//!
//! Flow: perftest flags ([`Params`]) -> the backend (EAL and port from the profile, or the daemon's device) -> the
//! perftest 4.5 out-of-band exchange over the kernel's TCP (server listens on `-p`, client connects to HOST) ->
//! QPs, CQs, regions -> records swapped -> QPs to RTS towards the peer's IPv4-mapped GID (embedded: MAC from the
//! profile's static neighbours, else ARP through the data path; daemon: roce-dpd resolves it) -> traffic ->
//! teardown exchange -> perftest's table (and `--out_json`).
//!
//! Implemented on both backends: all eight tests: the BW tests (client posts, `-Q` signals every Qth WR and the
//! last; the send server keeps receives posted; the write/read/atomic server waits for the client's report; `-b`
//! makes both sides post, and receive in send BW); read_lat and atomic_lat (one WR in flight, client-only loop,
//! HdrHistogram); send_lat and write_lat (ping-pong, write_lat polling the last byte as perftest); `-a` (a row per
//! size), `-D` and `-f` (BW), `--run_infinitely` (BW, until SIGINT/SIGTERM), `-q`, `-t`, `-r`, `-m`, `-u`, `-N`,
//! `--report_gbits`, `--out_json`, `--out_json_file`, `--data_validation` (not for send_lat/write_lat, nor with
//! `-b`). The BW peak is perftest's ([`super::report::PeakMeter`]).
//!
//! Flags of ours, before or among perftest's: `--port-conf FILE` or `--daemon SOCKET` (one of them), `--lcore N`
//! (EAL main lcore, default the profile's), `--file-prefix P` (EAL prefix, default `rdpp_PID`), `--socket PATH`
//! (override the memif socket), `--timeout S` (give up after S seconds of no progress: connect, exchange, the run;
//! default 60), `--poll-sleep US` (with `--daemon`: sleep US microseconds after each turn of a traffic loop that
//! found no completion and could post nothing, instead of spinning: for an application sharing its core with a
//! daemon worker). perftest's `-e`/`--events` (alias `--use_event`) works with `--daemon` only: a turn that moved
//! nothing arms the CQs, looks at them once more and sleeps on the completion channel (`perftest::daemon`).
//!
//! `--data_validation` (the side that checks needs it; the source always fills its region with the pattern, the
//! sink starts zeroed): WRITE, the server checks its region after the run; READ, the client checks what it read;
//! SEND, the server checks every receive; FETCH_AND_ADD latency, the client checks every returned value.

use std::ffi::{OsStr, OsString};
use std::net::TcpStream;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::time::Duration;

use roce_dp::{Cqe, SendWr};

use super::exchange::{self, BwReport, Dest, Exchange, Mtu, Role, SysData, TestKind, Verb};
use super::params::{AtomicType, Params, RunLength};
use super::report::{self, Banner, Results};
use super::traffic::{check_read, client_traffic, passive_server, pingpong, BwSide};

/// Our flags, taken out of the command line before perftest's are parsed.
#[derive(Debug, Default)]
pub(super) struct Ours {
    pub(super) port_conf: Option<PathBuf>,
    daemon: Option<PathBuf>,
    pub(super) lcore: Option<String>,
    pub(super) socket: Option<String>,
    file_prefix: Option<String>,
    timeout: Option<u64>,
    poll_sleep: Option<u64>,
    /// `--event-moderation COUNT:US`.
    moderation: Option<(u16, u16)>,
}

/// Takes our flags out of the command line (the rest goes to perftest's parser). Arguments are taken as the OS
/// gave them: a path that is not UTF-8 is a path (`--port-conf`, `--daemon`), and any other value that is not
/// UTF-8 is refused in one line (`std::env::args` panicked on it).
fn split_ours(args: Vec<OsString>) -> Result<(Ours, Vec<OsString>), String> {
    let mut ours = Ours::default();
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        // `--name=VALUE` splits at the first `=` whatever VALUE's bytes are.
        let bytes = a.as_bytes();
        let (name, inline) = match bytes.iter().position(|&b| b == b'=') {
            Some(i) if bytes.starts_with(b"--") => {
                (String::from_utf8_lossy(&bytes[..i]).into_owned(), Some(OsStr::from_bytes(&bytes[i + 1..]).to_owned()))
            }
            _ => (String::from_utf8_lossy(bytes).into_owned(), None),
        };
        if !matches!(
            name.as_str(),
            "--port-conf"
                | "--daemon"
                | "--lcore"
                | "--file-prefix"
                | "--socket"
                | "--timeout"
                | "--poll-sleep"
                | "--event-moderation"
        ) {
            rest.push(a);
            continue;
        }
        // An empty value is no value (as clap's own flags take it): `--port-conf ''` said ": cannot read: No such
        // file or directory", naming neither the flag nor the file.
        let raw = match inline.or_else(|| it.next()) {
            Some(v) if !v.is_empty() => v,
            _ => return Err(format!("{name} needs a value")),
        };
        if let "--port-conf" | "--daemon" = name.as_str() {
            let path = Some(PathBuf::from(raw));
            if name == "--port-conf" {
                ours.port_conf = path;
            } else {
                ours.daemon = path;
            }
            continue;
        }
        let v = raw.into_string().map_err(|v| format!("{name} {v:?}: not valid UTF-8"))?;
        match name.as_str() {
            "--lcore" => ours.lcore = Some(v),
            "--file-prefix" => {
                roce_dp::dpdk::check_file_prefix(&v).map_err(|e| format!("--file-prefix {e}"))?;
                ours.file_prefix = Some(v);
            }
            "--socket" => ours.socket = Some(v),
            "--poll-sleep" => {
                // Bounded: a nap of hours after every idle turn would stall the run past any timeout.
                let us = v.parse().ok().filter(|us| *us <= MAX_POLL_SLEEP_US);
                let why = format!("--poll-sleep {v:?}: not a number of microseconds in 0..={MAX_POLL_SLEEP_US}");
                ours.poll_sleep = Some(us.ok_or(why)?);
            }
            "--event-moderation" => ours.moderation = Some(parse_moderation(&v)?),
            _ => {
                // Bounded as the other tools' --timeout: a larger one overflowed the accept's deadline (a panic).
                let max = crate::MAX_SECONDS;
                let s = v.parse().ok().filter(|s| (1..=max).contains(s));
                ours.timeout = Some(s.ok_or_else(|| format!("--timeout {v:?}: not a number of seconds in 1..={max}"))?);
            }
        }
    }
    Ok((ours, rest))
}

/// The longest `--poll-sleep`, in microseconds (one second).
const MAX_POLL_SLEEP_US: u64 = 1_000_000;

/// `COUNT:US` of `--event-moderation`, both 1-65535.
fn parse_moderation(v: &str) -> Result<(u16, u16), String> {
    let bad = || {
        format!(
            "--event-moderation {v:?}: give COUNT:US, a completion count and a period in microseconds, both 1-65535"
        )
    };
    let (c, us) = v.split_once(':').ok_or_else(bad)?;
    let (c, us) = (c.parse::<u16>().map_err(|_| bad())?, us.parse::<u16>().map_err(|_| bad())?);
    if c == 0 || us == 0 {
        return Err(bad());
    }
    Ok((c, us))
}

/// The main of one tool: never returns.
pub fn main(test: TestKind) -> ! {
    let args: Vec<OsString> = std::env::args_os().collect();
    let name = test.tool_name();
    let (ours, rest) = match split_ours(args) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("{name}: {e} (see --help)");
            std::process::exit(2);
        }
    };
    let p = Params::parse_from_or_exit(test, rest);
    let prefix = ours.file_prefix.clone().unwrap_or_else(|| format!("rdpp_{}", std::process::id()));
    let r = run(test, &p, &ours, &prefix);
    crate::remove_runtime_dir(&prefix);
    match r {
        Ok(()) => std::process::exit(0),
        Err(Fail(code, msg)) => {
            eprintln!("{name}: {msg}");
            std::process::exit(code);
        }
    }
}

fn run(test: TestKind, p: &Params, ours: &Ours, prefix: &str) -> Result<(), Fail> {
    roce_dp::dpdk::signal::stop_on_signals();
    let timeout = Duration::from_secs(ours.timeout.unwrap_or(60));
    // A JSON file that cannot be created fails now, not after the whole run (as rdp-sim's --trace and --plot), once
    // the command line is known to be good.
    let json_file = || match &p.out_json_file {
        Some(f) => std::fs::File::create(f).map(drop).map_err(|e| bad(format!("--out_json_file {}: {e}", f.display()))),
        None => Ok(()),
    };
    match (&ours.port_conf, &ours.daemon) {
        (Some(_), Some(_)) => Err(bad("--daemon SOCKET and --port-conf FILE exclude each other: give one")),
        (Some(_), None) if ours.poll_sleep.is_some() => {
            Err(bad("--poll-sleep US goes with --daemon SOCKET (an embedded engine must poll its port)"))
        }
        (Some(_), None) if p.use_event => Err(bad(
            "-e/--events needs --daemon SOCKET: with --port-conf the engine runs in this tool's own loop, which \
             must poll its port (nothing else would wake it)",
        )),
        _ if ours.moderation.is_some() && !(ours.daemon.is_some() && p.use_event) => Err(bad(
            "--event-moderation COUNT:US goes with --daemon SOCKET and -e/--events (it moderates the completion \
             events the tool sleeps on)",
        )),
        (None, Some(_)) if p.use_event && ours.poll_sleep.is_some() => {
            Err(bad("-e/--events and --poll-sleep US exclude each other: sleep on completion events or nap, not both"))
        }
        (None, Some(sock)) => {
            let nap = Duration::from_micros(ours.poll_sleep.unwrap_or(0));
            json_file()?;
            super::daemon::run(test, p, sock, timeout, nap, ours.moderation)
        }
        (None, None) => Err(bad("--port-conf FILE.toml or --daemon SOCKET is required (see --help)")),
        (Some(_), None) => {
            json_file()?;
            super::embedded::run(test, p, ours, prefix, timeout)
        }
    }
}

/// Exit status and one line.
pub(super) struct Fail(pub(super) i32, pub(super) String);

pub(super) fn bad(msg: impl Into<String>) -> Fail {
    Fail(2, msg.into())
}

pub(super) fn err(msg: impl std::fmt::Display) -> Fail {
    Fail(1, msg.to_string())
}

/// The byte `i` of a message on QP `q`.
fn pattern(q: usize, i: usize) -> u8 {
    ((i as u64).wrapping_mul(0x9e37_79b9) >> 7) as u8 ^ (q as u8).wrapping_mul(131) ^ 0xa5
}

pub(super) fn fill(q: usize, buf: &mut [u8], size: usize) {
    for chunk in buf.chunks_mut(size.max(1)) {
        for (i, b) in chunk.iter_mut().enumerate() {
            *b = pattern(q, i);
        }
    }
}

pub(super) fn first_bad(q: usize, buf: &[u8]) -> Option<usize> {
    buf.iter().enumerate().position(|(i, b)| *b != pattern(q, i))
}

/// One local QP as the exchange and the traffic loops see it (the backend keeps its own objects, by index).
pub(super) struct Local {
    pub(super) qpn: u32,
    pub(super) psn: u32,
    pub(super) rkey: u32,
    /// The region's address (what the peer's RDMA requests name).
    pub(super) va: u64,
    /// Message slots in the region (send server: the receive depth; otherwise 1).
    pub(super) slots: u64,
}

/// What a backend returns for a new QP.
pub(super) struct NewQp {
    pub(super) qpn: u32,
    pub(super) rkey: u32,
    pub(super) va: u64,
}

/// Where the RoCE traffic goes: what the session flow and the traffic loops need from a backend. QPs are named by
/// their index in creation order; each has its own CQ (send and receive) and one region with every access right;
/// offsets are into that region.
pub(super) trait Nic {
    /// The port's MTU in bytes.
    fn port_mtu(&self) -> u32;
    /// Our GID (IPv4-mapped).
    fn gid(&self) -> [u8; 16];
    /// Creates the next QP (in INIT, all access rights) with a CQ and a zeroed `region_len`-byte region.
    fn add_qp(&mut self, p: &Params, region_len: usize) -> Result<NewQp, Fail>;
    /// Brings the data path up before the records are swapped (embedded: waits for the port's link).
    fn start(&mut self, timeout: Duration) -> Result<(), Fail>;
    /// Moves every QP to RTR and RTS towards its peer in `remote`.
    fn connect(&mut self, qps: &[Local], remote: &[Dest], mtu: Mtu, p: &Params, timeout: Duration) -> Result<(), Fail>;
    /// Posts a send WR of QP `q` with one SGE: `len` bytes at `offset` of its region.
    fn post_send(&mut self, q: usize, wr: &SendWr, offset: u64, len: u32) -> Result<(), Fail>;
    /// [`post_send`](Self::post_send) of one WR of a batch that ends with [`flush_sends`](Self::flush_sends): the
    /// data path may take it only then (through roce-dpd: one publish of the ring's tail per batch).
    fn stage_send(&mut self, q: usize, wr: &SendWr, offset: u64, len: u32) -> Result<(), Fail> {
        self.post_send(q, wr, offset, len)
    }
    /// Hands QP `q`'s staged send WRs to the data path.
    fn flush_sends(&mut self, _q: usize) {}
    /// Posts a receive of QP `q` into `len` bytes at `offset` of its region.
    fn post_recv(&mut self, q: usize, wr_id: u64, offset: u64, len: u32) -> Result<(), Fail>;
    /// Completions of QP `q`'s CQ.
    fn poll_cq(&mut self, q: usize, out: &mut [Cqe]) -> Result<usize, Fail>;
    /// QP `q`'s region.
    fn mem(&mut self, q: usize) -> &[u8];
    /// QP `q`'s region, writable.
    fn mem_mut(&mut self, q: usize) -> &mut [u8];
    /// One turn of the data path inside a traffic loop; true if it moved frames.
    fn step(&mut self) -> bool;
    /// The traffic loop ended: send what its last turn left pending (a backend whose step sends before it
    /// receives holds the last ACKs and posts until the next step).
    fn flush(&mut self) {}
    /// `streak` turns of a traffic loop in a row moved nothing.
    fn idle(&mut self, streak: u32);
    /// One turn while the tool waits for something else (the out-of-band exchange, the passive side's teardown).
    fn wait(&mut self);
    /// A count that moves while RoCE requests arrive: the passive side's "no traffic for N s".
    fn rx_activity(&mut self) -> u64;
    /// An error once the data path is gone (cheap enough for every check of a loop).
    fn check_alive(&mut self) -> Result<(), Fail>;
    /// QP `q`'s counters for the line of a failed completion, e.g. ` (retry_timeouts=1 ...)`.
    fn failure_detail(&mut self, q: usize) -> String;
}

/// The counters a failed completion's line shows.
pub(super) const DETAIL_COUNTERS: [&str; 5] =
    ["retry_timeouts", "rewinds", "nak_psn_seq_rcvd", "acks_rcvd", "retransmitted_packets"];

/// ` (name=value ...)` of the [`DETAIL_COUNTERS`] among `counters`.
pub(super) fn detail<'a>(counters: impl Iterator<Item = (&'a str, u64)>) -> String {
    let mut v = [None; DETAIL_COUNTERS.len()];
    for (n, val) in counters {
        if let Some(i) = DETAIL_COUNTERS.iter().position(|&d| d == n) {
            v[i] = Some(val);
        }
    }
    let parts: Vec<String> =
        DETAIL_COUNTERS.iter().zip(v).filter_map(|(n, val)| val.map(|x| format!("{n}={x}"))).collect();
    if parts.is_empty() {
        String::new()
    } else {
        format!(" ({})", parts.join(" "))
    }
}

/// The RC connection of `l` towards `r`, with perftest's READ/atomic depths ([`exchange::rd_atomic_depths`]).
pub(super) fn rc_connect(l: &Local, r: &Dest, mtu: Mtu, p: &Params) -> crate::RcConnect {
    let (max_rd_atomic, max_dest_rd_atomic) = exchange::rd_atomic_depths(p.test, out_reads(p), r);
    crate::RcConnect {
        qpn: l.qpn,
        sq_psn: l.psn,
        dest_qpn: r.qpn,
        rq_psn: r.psn,
        path_mtu: mtu.bytes(),
        timeout: p.qp_timeout,
        max_rd_atomic,
        max_dest_rd_atomic,
    }
}

/// The outstanding READ/atomic requests this side accepts and announces in its QP records: `-o`, else 16.
pub(super) fn out_reads(p: &Params) -> u8 {
    p.out_reads.map_or(16, |o| o.min(u32::from(exchange::MAX_OUT_READS)) as u8)
}

/// The most a send BW receiver's region takes per QP with many or large receives.
const RECV_REGION: u64 = 32 << 20;

fn create_qps<N: Nic>(
    nic: &mut N,
    p: &Params,
    test: TestKind,
    size: u64,
    client: bool,
    sys: SysData,
) -> Result<Vec<Local>, Fail> {
    let pingpong = matches!(test, TestKind::SendLat | TestKind::WriteLat);
    // send_lat/write_lat: the first half receives (the peer writes there), the second half sends.
    // Receive slots of a send BW receiver: one per posted receive up to RECV_REGION (more receives share them,
    // as perftest's do; the pattern is the same in every message, so validation still holds).
    let slots = match test {
        TestKind::SendBw if !client || p.duplex => u64::from(p.rx_depth.max(1)).min((RECV_REGION / size).max(1)),
        _ if pingpong => 2,
        _ => 1,
    };
    let mut v = Vec::new();
    for q in 0..p.num_qps as usize {
        let n = nic.add_qp(p, sys.region_len(size, slots) as usize)?;
        // The source of the data holds the pattern; the sink starts zeroed, so validation sees what arrived.
        if pingpong {
            fill(q, &mut nic.mem_mut(q)[size as usize..2 * size as usize], size as usize);
        } else if client != (test.verb() == Verb::Read) {
            fill(q, nic.mem_mut(q), size as usize);
        }
        let psn = (n.qpn.wrapping_mul(2_654_435_761) ^ std::process::id()) & 0xff_ffff;
        v.push(Local { qpn: n.qpn, psn, rkey: n.rkey, va: n.va, slots });
    }
    Ok(v)
}

/// What a session printed and measured, for the lines after the backend's teardown.
pub(super) struct Outcome {
    banner: Banner,
    results: Results,
    validated: u64,
}

impl Outcome {
    /// The data validation line and `--out_json`.
    pub(super) fn print_end(&self, p: &Params) -> Result<(), Fail> {
        if p.data_validation && self.validated > 0 {
            println!(" Data validation: {} bytes verified", self.validated);
        }
        out_json(p, &self.banner, &self.results)
    }
}

/// Everything from the connected out-of-band stream to the result table, on any backend.
pub(super) fn session<N: Nic>(
    nic: &mut N,
    test: TestKind,
    p: &Params,
    stream: TcpStream,
    timeout: Duration,
) -> Result<Outcome, Fail> {
    let client = p.is_client();
    let role = if client { Role::Client } else { Role::Server };
    // Shut down to end a blocked exchange step when the data path goes away (see `polling`).
    let abort = stream.try_clone().map_err(|e| err(format!("out-of-band socket: {e}")))?;
    let mut ex = Exchange::tcp(stream, role, timeout);
    let port_mtu = Mtu::from_bytes(nic.port_mtu()).unwrap_or(Mtu::Mtu1024);
    // perftest's set_mtu: a requested MTU above the port's active one is lowered to it, said on stdout so.
    let mtu = match p.mtu {
        Some(m) if m > port_mtu => {
            println!("Requested mtu is higher than active mtu ");
            println!("Changing to active mtu - {}", port_mtu as u8);
            port_mtu
        }
        m => m.unwrap_or(port_mtu),
    };
    let n = polling(nic, &abort, || ex.setup(SysData::default(), mtu, p.mtu.is_some()))?.map_err(err)?;
    if n.mtu > port_mtu {
        return Err(err(format!("path MTU {} is above the port's {}", n.mtu.bytes(), port_mtu.bytes())));
    }
    let max_size = p.sizes.iter().copied().max().unwrap_or(1);
    let qps = create_qps(nic, p, test, max_size, client, n.sys)?;
    let out_reads = u32::from(out_reads(p));
    let gid = nic.gid();
    let mine: Vec<Dest> = qps.iter().map(|q| record(q.qpn, q.psn, q.rkey, q.va, gid, out_reads)).collect();
    // The data path runs from here on: a peer such as Linux rxe resolves our MAC (ARP) while it moves its QP to
    // RTR, between the record exchange and the next hand-shake, so the port must answer while we wait on TCP.
    nic.start(timeout)?;
    let remote = polling(nic, &abort, || ex.exchange_dests(test, &mine))?.map_err(err)?;
    exchange::check_gid_compatibility(&mine[0], &remote[0]).map_err(err)?;
    exchange::check_peer_depth(test, &remote).map_err(err)?;
    let banner = print_banner(test, p, n.mtu, out_reads, &mine, &remote);
    nic.connect(&qps, &remote, n.mtu, p, timeout)?;
    polling(nic, &abort, || ex.connected(test, &mine[0]))?.map_err(err)?;
    let mut validated = 0u64;
    let iters = match p.run {
        RunLength::Iterations(n) => n,
        _ => 0,
    };
    let results = if !test.is_bw() {
        let rtt = report::rtt_factor(test);
        let mut rows = Vec::new();
        if matches!(test, TestKind::SendLat | TestKind::WriteLat) {
            for &size in &p.sizes {
                let mut rec = report::LatRecorder::new();
                let (q, first, r) = (&qps[0], &mine[0], &remote[0]);
                pingpong(nic, &mut ex, &abort, test, client, q, first, r, size, iters, timeout, &mut rec)?;
                rows.extend(rec.stats(size, iters, rtt));
            }
            let first = mine[0];
            polling(nic, &abort, move || ex.finish(test, &first, &BwReport::default(), false))?.map_err(err)?;
        } else if client {
            for &size in &p.sizes {
                let mut rec = report::LatRecorder::new();
                client_traffic(nic, &ex, test, p, &qps, &remote, size, iters, timeout, Some(&mut rec))?;
                rows.extend(rec.stats(size, iters, rtt));
                if p.data_validation && test.verb() == Verb::Atomic && p.atomic_type == AtomicType::FetchAndAdd {
                    validated += 8 * iters * qps.len() as u64; // each returned value checked in client_traffic
                }
                validated += check_read(nic, test, p, &qps, size)?;
            }
            let first = mine[0];
            polling(nic, &abort, move || ex.finish(test, &first, &BwReport::default(), false))?.map_err(err)?;
        } else {
            let (_, v) = passive_server(nic, ex, &abort, test, p, &mine[0], timeout)?;
            validated += v;
        }
        if !rows.is_empty() {
            println!("{}", report::RESULT_FMT_LAT);
            for l in &rows {
                println!("{}", report::lat_line(l));
            }
            println!("{}", report::RESULT_LINE);
        }
        Results::Lat(rows)
    } else {
        // perftest prints the header once the QPs are connected, then a row per message size as each ends.
        println!("{}", report::bw_header(p.report_gbits));
        let sender = client || p.duplex;
        let receiver = test == TestKind::SendBw && (!client || p.duplex);
        let mut rows = Vec::new();
        if !sender && !receiver {
            // write/read/atomic server: the client does everything, then sends its report.
            let (r, v) = passive_server(nic, ex, &abort, test, p, &mine[0], timeout)?;
            validated += v;
            if let Some(r) = r {
                println!("{}", report::bw_line(&r, p.report_gbits));
                rows.push(r);
            }
        } else {
            let infinite = matches!(p.run, RunLength::Infinitely(_));
            let mut last = BwReport::default();
            for &size in &p.sizes {
                let mut side = BwSide::new(test, p, &qps, &remote, size, sender, receiver);
                side.post_receives(nic)?;
                polling(nic, &abort, || ex.start_run(test, &mine[0], p.duplex))?.map_err(err)?;
                let mine_r = side.run(nic, &ex, timeout)?;
                validated += side.validated + check_read(nic, test, p, &qps, size)?;
                last = mine_r;
                if infinite {
                    rows.extend(side.periods.iter().copied());
                    break;
                }
                let peer =
                    polling(nic, &abort, || ex.end_run(test, &mine[0], &mine_r, p.duplex, p.all))?.map_err(err)?;
                // -b: each side measured its own direction; perftest prints the sum of both reports.
                let row = match peer {
                    Some(r) if p.duplex => BwReport {
                        bw_peak: mine_r.bw_peak + r.bw_peak,
                        bw_avg: mine_r.bw_avg + r.bw_avg,
                        msg_rate: mine_r.msg_rate + r.msg_rate,
                        ..mine_r
                    },
                    _ => mine_r,
                };
                println!("{}", report::bw_line(&row, p.report_gbits));
                rows.push(row);
            }
            let first = mine[0];
            polling(nic, &abort, move || ex.finish(test, &first, &last, p.duplex))?.map_err(err)?;
        }
        println!("{}", report::RESULT_LINE);
        Results::Bw(rows)
    };
    Ok(Outcome { banner, results, validated })
}

/// Our QP record for the exchange (RoCE: no LID, no SRQ).
pub(super) fn record(qpn: u32, psn: u32, rkey: u32, vaddr: u64, gid: [u8; 16], out_reads: u32) -> Dest {
    Dest { lid: 0, out_reads: out_reads as u16, qpn, psn, rkey, vaddr, gid, srqn: 0 }
}

/// perftest's banner and the local/remote address lines, printed once the records are swapped.
pub(super) fn print_banner(
    test: TestKind,
    p: &Params,
    mtu: Mtu,
    out_reads: u32,
    mine: &[Dest],
    remote: &[Dest],
) -> Banner {
    let banner = Banner::new(
        p,
        p.ib_dev.as_deref().unwrap_or("rdp0"),
        mtu,
        p.gid_index.unwrap_or(1),
        if test.verb() == Verb::Read { out_reads } else { 0 },
    );
    for l in banner.lines().into_iter().chain(report::addresses(test, mine, remote)) {
        println!("{l}");
    }
    banner
}

/// `--out_json` / `--out_json_file`: the rows as printed.
pub(super) fn out_json(p: &Params, banner: &Banner, results: &Results) -> Result<(), Fail> {
    if p.out_json || p.out_json_file.is_some() {
        let j = report::json(banner, results, p.report_gbits);
        match &p.out_json_file {
            Some(f) => std::fs::write(f, &j).map_err(|e| err(format!("--out_json_file {}: {e}", f.display())))?,
            None => print!("{j}"),
        }
    }
    Ok(())
}

/// Runs a blocking out-of-band step on a scoped thread while this thread keeps the data path going (embedded:
/// ARP, ND and any RoCE frame the peer sends meanwhile) and watches that it stays: if it goes, `abort` (the
/// exchange's socket) is shut down so that the step ends, and the backend's error is returned.
pub(super) fn polling<N: Nic, T: Send>(
    nic: &mut N,
    abort: &TcpStream,
    step: impl FnOnce() -> T + Send,
) -> Result<T, Fail> {
    std::thread::scope(|sc| {
        let h = sc.spawn(step);
        let mut gone = None;
        while !h.is_finished() {
            nic.wait();
            if gone.is_none() {
                if let Err(f) = nic.check_alive() {
                    let _ = abort.shutdown(std::net::Shutdown::Both);
                    gone = Some(f);
                }
            }
        }
        let v = match h.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        };
        match gone {
            Some(f) => Err(f),
            None => Ok(v),
        }
    })
}

/// Drives a traffic loop: a turn of the data path, then `app` (post, poll), until `app` says stop or fails; `app`
/// returns (go on, did work), and turns that did nothing let the backend back off ([`Nic::idle`]).
pub(super) fn drive<N: Nic>(
    nic: &mut N,
    mut app: impl FnMut(&mut N) -> Result<(bool, bool), Fail>,
) -> Result<(), Fail> {
    let mut streak = 0u32;
    loop {
        let moved = nic.step();
        let (go_on, busy) = match app(nic) {
            Ok(r) => r,
            Err(f) => {
                nic.flush();
                return Err(f);
            }
        };
        if !go_on {
            nic.flush();
            return Ok(());
        }
        if moved || busy {
            streak = 0;
        } else {
            streak = streak.saturating_add(1);
            nic.idle(streak);
        }
    }
}
