//! The `rdp_*_bw` tools on an engine embedded in the process, on the DPDK port of a profile (`--port-conf`).
//!
//! Flow: perftest flags ([`Params`]) -> EAL and port from the profile -> QPs, CQs, regions -> the perftest 4.5
//! out-of-band exchange over the kernel's TCP (server listens on `-p`, client connects to HOST) -> QPs to RTS
//! towards the peer's IPv4-mapped GID (MAC from the profile's static neighbours, else ARP through the data path)
//! -> traffic -> teardown exchange -> perftest's table (and `--out_json`).
//!
//! Implemented: all eight tests: the BW tests (client posts, `-Q` signals every Qth WR and the last; the send
//! server keeps receives posted; the write/read/atomic server waits for the client's report; `-b` makes both
//! sides post, and receive in send BW); read_lat and atomic_lat (one WR in flight, client-only loop,
//! HdrHistogram); send_lat and write_lat (ping-pong, write_lat polling the last byte as perftest); `-a` (a row per
//! size), `-D` and `-f` (BW), `--run_infinitely` (BW, until SIGINT/SIGTERM), `-q`, `-t`, `-r`, `-m`, `-u`, `-N`,
//! `--report_gbits`, `--out_json`, `--out_json_file`, `--data_validation` (not for send_lat/write_lat, nor with
//! `-b`). The BW peak is perftest's ([`PeakMeter`]).
//!
//! Flags of ours, before or among perftest's: `--port-conf FILE` (or `--daemon SOCKET`: [`super::daemon`]),
//! `--lcore N` (EAL main lcore, default the profile's), `--file-prefix P` (EAL prefix, default `rdpp_PID`),
//! `--socket PATH` (override the memif socket), `--timeout S` (give up after S seconds of no progress: connect, exchange, the run; default 60).
//!
//! `--data_validation` (the side that checks needs it; the source always fills its region with the pattern, the
//! sink starts zeroed): WRITE, the server checks its region after the run; READ, the client checks what it read;
//! SEND, the server checks every receive; FETCH_AND_ADD latency, the client checks every returned value.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use roce_dp::config::{Driver, Profile};
use roce_dp::dpdk::{self, choose_offloads, Eal, Mempool, Port, PortConfig, Worker, WorkerConfig};
use roce_dp::neigh::NeighIp;
use roce_dp::wire::{IpAddrs, MacAddr};
use roce_dp::{
    AccessFlags, CqId, Cqe, Engine, EngineConfig, LocalIp, MrKeys, PeerAddr, QpAttr, QpCaps, QpState, SendWr, Sge,
    WcOpcode, WcStatus, WrOpcode,
};

use super::exchange::{self, BwReport, Dest, Exchange, Mtu, PeerActivity, Role, SysData, TestKind, Verb};
use super::params::{AtomicType, Params, RunLength};
use super::report::{self, Banner, PeakMeter, Results};

/// Our flags, taken out of the command line before perftest's are parsed.
#[derive(Debug, Default)]
struct Ours {
    port_conf: Option<PathBuf>,
    daemon: Option<PathBuf>,
    lcore: Option<String>,
    file_prefix: Option<String>,
    socket: Option<String>,
    timeout: Option<u64>,
}

fn split_ours(args: Vec<String>) -> Result<(Ours, Vec<String>), String> {
    let mut ours = Ours::default();
    let mut rest = Vec::new();
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        let (name, inline) = match a.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_owned(), Some(v.to_owned())),
            _ => (a.clone(), None),
        };
        if !matches!(name.as_str(), "--port-conf" | "--daemon" | "--lcore" | "--file-prefix" | "--socket" | "--timeout")
        {
            rest.push(a);
            continue;
        }
        let v = match inline.or_else(|| it.next()) {
            Some(v) => v,
            None => return Err(format!("{name} needs a value")),
        };
        match name.as_str() {
            "--port-conf" => ours.port_conf = Some(PathBuf::from(v)),
            "--daemon" => ours.daemon = Some(PathBuf::from(v)),
            "--lcore" => ours.lcore = Some(v),
            "--file-prefix" => ours.file_prefix = Some(v),
            "--socket" => ours.socket = Some(v),
            _ => ours.timeout = Some(v.parse().map_err(|_| format!("--timeout {v:?}: not a number of seconds"))?),
        }
    }
    Ok((ours, rest))
}

/// The main of one tool: never returns.
pub fn main(test: TestKind) -> ! {
    let args: Vec<String> = std::env::args().collect();
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
    let _ = std::fs::remove_dir_all(Path::new("/var/run/dpdk").join(&prefix));
    match r {
        Ok(()) => std::process::exit(0),
        Err(Fail(code, msg)) => {
            eprintln!("{name}: {msg}");
            std::process::exit(code);
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

/// One local QP.
struct Qp {
    qpn: u32,
    cq: CqId,
    mr: MrKeys,
    va: u64,
    psn: u32,
    /// Message slots in the region (send server: the receive depth; otherwise 1).
    slots: u64,
}

fn ipv4_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// The DPDK side; fields drop in order: the port before the pool it receives into, both before the EAL.
struct Port_ {
    port: Port,
    pool: Mempool,
    _eal: Eal,
    profile: Profile,
    mac: MacAddr,
    memif: bool,
}

fn setup_port(ours: &Ours, prefix: &str, client: bool, timeout: Duration) -> Result<Port_, Fail> {
    let path = ours.port_conf.as_ref().ok_or_else(|| bad("--port-conf FILE.toml is required (see --help)"))?;
    let mut prof = Profile::load(path).map_err(|e| bad(e.0))?;
    if let Some(s) = &ours.socket {
        prof.port.socket = Some(s.clone());
    }
    if prof.port.driver == Driver::NetRing {
        return Err(bad(format!("{}: net_ring profiles are for rdp-nic ring", path.display())));
    }
    let args = prof.eal_args("rdp-perf", ours.lcore.as_deref(), prefix);
    let argv = args.to_vec();
    let eal = Eal::init_with_log(argv, Path::new("/dev/null")).map_err(|e| bad(format!("EAL: {e}")))?;
    let room = prof.pool_data_room();
    let (rx_desc, tx_desc) = (prof.port.rx_desc.unwrap_or(1024), prof.port.tx_desc.unwrap_or(1024));
    let n = prof.mempool.mbufs.unwrap_or_else(|| dpdk::pool_size(1, rx_desc.into(), tx_desc.into(), 1, 256, 1024));
    let pool = Mempool::new(&eal, "rdpp_pool", n, 256, room).map_err(|e| bad(format!("mempool: {e}")))?;
    let name = match prof.vdev() {
        Some((name, _)) => name,
        None => prof.port.pci.clone().unwrap_or_default(),
    };
    let mut port = Port::by_name(&eal, &name).map_err(|e| bad(format!("port {name}: {e}")))?;
    let info = port.info().map_err(|e| bad(e.to_string()))?;
    let (_rx, tx_offloads) = choose_offloads(&info);
    let conf = PortConfig { rx_desc, tx_desc, tx_offloads, ..PortConfig::default() };
    port.configure(&conf, &pool).map_err(|e| bad(format!("configure {name}: {e}")))?;
    let memif = prof.port.driver == Driver::Memif;
    // A memif client starts once the server's socket exists.
    let until = Instant::now() + if client && memif { timeout } else { Duration::ZERO };
    loop {
        match port.start() {
            Ok(()) => break,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
            Err(e) => return Err(bad(format!("start {name}: {e}"))),
        }
    }
    let mac = match prof.mac() {
        Some(m) => m,
        None => MacAddr(port.mac().map_err(|e| bad(e.to_string()))?),
    };
    Ok(Port_ { port, pool, _eal: eal, profile: prof, mac, memif })
}

/// The most a send BW receiver's region takes per QP with many or large receives.
const RECV_REGION: u64 = 32 << 20;

fn create_qps(
    e: &mut Engine,
    p: &Params,
    test: TestKind,
    size: u64,
    client: bool,
    sys: SysData,
) -> Result<Vec<Qp>, Fail> {
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
        let pd = e.alloc_pd();
        let depth = p.tx_depth.max(p.rx_depth).max(1);
        let cq = e.create_cq(depth * 2 + 16).map_err(|x| err(format!("create_cq: {x}")))?;
        let va = (u64::from(client) + 1) << 40 | (q as u64) << 32;
        let len = sys.region_len(size, slots) as usize;
        let mr = e.reg_mr(pd, va, len, AccessFlags::ALL).map_err(|x| err(format!("reg_mr: {x}")))?;
        let caps = QpCaps { max_send_wr: p.tx_depth.max(1), max_recv_wr: p.rx_depth.max(1), ..QpCaps::default() };
        let qpn = e.create_qp(pd, cq, cq, caps).map_err(|x| err(format!("create_qp: {x}")))?;
        let init = QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() };
        e.modify_qp(qpn, &init).map_err(|x| err(format!("modify_qp INIT: {x}")))?;
        // The source of the data holds the pattern; the sink starts zeroed, so validation sees what arrived.
        if pingpong {
            let send_area = size as usize..2 * size as usize;
            fill(q, &mut e.mr_bytes_mut(mr.lkey).expect("own MR")[send_area], size as usize);
        } else if client != (test.verb() == Verb::Read) {
            fill(q, e.mr_bytes_mut(mr.lkey).expect("own MR"), size as usize);
        }
        let psn = (qpn.wrapping_mul(2_654_435_761) ^ std::process::id()) & 0xff_ffff;
        v.push(Qp { qpn, cq, mr, va, psn, slots });
    }
    Ok(v)
}

fn connect_qp(e: &mut Engine, l: &Qp, r: &Dest, mtu: Mtu, p: &Params, peer: PeerAddr) -> Result<(), Fail> {
    let c = crate::RcConnect {
        qpn: l.qpn,
        sq_psn: l.psn,
        dest_qpn: r.qpn,
        rq_psn: r.psn,
        path_mtu: mtu.bytes(),
        timeout: p.qp_timeout,
    };
    crate::connect_rc(e, &c, peer).map_err(err)
}

const NO_CQE: Cqe = Cqe::EMPTY;

/// How long a memif side waits after the peer's link-down before stopping its port: DPDK 22.11's memif segfaults
/// (eal-intr-thread, or this thread) when a process tears its port down while the peer's disconnect is still being
/// handled (README, "DPDK 22.11 behaviour").
const MEMIF_SETTLE: Duration = Duration::from_millis(500);

/// Runs a blocking out-of-band step on a scoped thread while this thread keeps the data path polled (ARP, ND,
/// and any RoCE frame the peer sends meanwhile).
fn polling<T: Send>(w: &mut Worker<'_>, step: impl FnOnce() -> T + Send) -> T {
    std::thread::scope(|sc| {
        let h = sc.spawn(step);
        while !h.is_finished() {
            w.poll();
        }
        match h.join() {
            Ok(v) => v,
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

fn run(test: TestKind, p: &Params, ours: &Ours, prefix: &str) -> Result<(), Fail> {
    roce_dp::dpdk::signal::stop_on_signals();
    let timeout = Duration::from_secs(ours.timeout.unwrap_or(60).max(1));
    match (&ours.port_conf, &ours.daemon) {
        (Some(_), Some(_)) => return Err(bad("--daemon SOCKET and --port-conf FILE exclude each other: give one")),
        (None, Some(sock)) => return super::daemon::run(test, p, sock, timeout),
        (None, None) => return Err(bad("--port-conf FILE.toml or --daemon SOCKET is required (see --help)")),
        (Some(_), None) => {}
    }
    // The server's port exists (memif: its socket) before it accepts; the client connects first, then starts.
    let (mut s, stream) = if let Some(host) = &p.host {
        let st = exchange::connect(host, p.port, timeout.min(Duration::from_secs(5)), timeout).map_err(err)?;
        (setup_port(ours, prefix, true, timeout)?, st)
    } else {
        let s = setup_port(ours, prefix, false, timeout)?;
        let listener = exchange::listen(p.port).map_err(err)?;
        for l in report::waiting_lines() {
            println!("{l}");
        }
        (s, exchange::accept(&listener, Some(timeout), timeout).map_err(err)?)
    };
    let r = session(test, p, &mut s, stream, timeout);
    if r.is_err() && s.memif {
        // memif: the peer's disconnect must be handled before this side stops its port. The server waits for it;
        // the client only if it comes soon (the peer went first), else the server is waiting for the client.
        let wait = if p.is_client() { Duration::from_millis(300) } else { Duration::from_secs(3) };
        if s.port.wait_link_down(wait).is_ok() {
            std::thread::sleep(MEMIF_SETTLE);
        }
    }
    r
}

/// Everything after the port is up and the exchange connected: on an error the caller lets memif settle.
fn session(test: TestKind, p: &Params, s: &mut Port_, stream: TcpStream, timeout: Duration) -> Result<(), Fail> {
    let client = p.is_client();
    let role = if client { Role::Client } else { Role::Server };
    let mut ex = Exchange::new(stream, role, timeout);
    let port_mtu = Mtu::from_bytes(s.profile.net.mtu).unwrap_or(Mtu::Mtu1024);
    let n = ex.setup(SysData::default(), p.mtu.unwrap_or(port_mtu), p.mtu.is_some()).map_err(err)?;
    if n.mtu > port_mtu {
        return Err(err(format!("path MTU {} is above the port's {}", n.mtu.bytes(), port_mtu.bytes())));
    }
    let my_ip = s.profile.ipv4().ok_or_else(|| bad("the profile needs net.ipv4"))?;
    let ecfg = EngineConfig {
        local_mac: s.mac,
        local_ip: LocalIp { v4: Some(my_ip), v6: None },
        qpn_base: 0x100,
        ..EngineConfig::default()
    };
    let mut engine = Engine::new(ecfg);
    let max_size = p.sizes.iter().copied().max().unwrap_or(1);
    let qps = create_qps(&mut engine, p, test, max_size, client, n.sys)?;
    let out_reads = p.out_reads.unwrap_or(16);
    let mine: Vec<Dest> =
        qps.iter().map(|q| record(q.qpn, q.psn, q.mr.rkey, q.va, ipv4_gid(my_ip), out_reads)).collect();
    // The data path runs from here on: a peer such as Linux rxe resolves our MAC (ARP) while it moves its QP to
    // RTR, between the record exchange and the next hand-shake, so the port must answer while we wait on TCP.
    let q = s.port.queue_pair(0).ok_or_else(|| err("port has no queue 0"))?;
    let wcfg = WorkerConfig::default();
    let mut w = Worker::new(engine, q, &s.pool, s.profile.net.mtu, wcfg).map_err(|e| err(e.to_string()))?;
    for nb in &s.profile.net.neighbours {
        if let (Ok(ip), Some(mac)) = (nb.ip.parse::<std::net::Ipv4Addr>(), roce_dp::config::parse_mac(&nb.mac)) {
            w.neigh.add_static(NeighIp::V4(ip.octets()), mac);
        }
    }
    s.port.wait_link_up(timeout.min(Duration::from_secs(10))).map_err(|e| err(format!("link: {e}")))?;
    let remote = polling(&mut w, || ex.exchange_dests(test, &mine)).map_err(err)?;
    exchange::check_gid_compatibility(&mine[0], &remote[0]).map_err(err)?;
    let gid = remote[0].gid;
    if gid[..12] != ipv4_gid([0; 4])[..12] {
        return Err(err("the peer's GID is not an IPv4-mapped address (use its RoCEv2 IPv4 GID index, -x)"));
    }
    let peer_ip: [u8; 4] = gid[12..].try_into().expect("4 bytes");
    let banner = print_banner(test, p, n.mtu, out_reads, &mine, &remote);
    let mac = w
        .resolve(NeighIp::V4(peer_ip), timeout.min(Duration::from_secs(10)))
        .ok_or_else(|| err(format!("no ARP answer from {}", std::net::Ipv4Addr::from(peer_ip))))?;
    let peer = PeerAddr { ip: IpAddrs::V4 { src: my_ip, dst: peer_ip }, mac };
    for (l, r) in qps.iter().zip(&remote) {
        connect_qp(&mut w.engine, l, r, n.mtu, p, peer)?;
    }
    polling(&mut w, || ex.connected(test, &mine[0])).map_err(err)?;
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
                pingpong(&mut w, &mut ex, test, client, &qps[0], &mine[0], &remote[0], size, iters, timeout, &mut rec)?;
                rows.extend(rec.stats(size, iters, rtt));
            }
            let first = mine[0];
            polling(&mut w, move || ex.finish(test, &first, &BwReport::default(), false)).map_err(err)?;
        } else if client {
            for &size in &p.sizes {
                let mut rec = report::LatRecorder::new();
                client_traffic(&mut w, &ex, test, p, &qps, &remote, size, iters, timeout, Some(&mut rec))?;
                rows.extend(rec.stats(size, iters, rtt));
                if p.data_validation && test.verb() == Verb::Atomic && p.atomic_type == AtomicType::FetchAndAdd {
                    validated += 8 * iters * qps.len() as u64; // each returned value checked in client_traffic
                }
                validated += check_read(&w, test, p, &qps, size)?;
            }
            let first = mine[0];
            polling(&mut w, move || ex.finish(test, &first, &BwReport::default(), false)).map_err(err)?;
        } else {
            let (_, v) = passive_server(&mut w, ex, test, p, &qps, &mine[0], timeout)?;
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
            let (r, v) = passive_server(&mut w, ex, test, p, &qps, &mine[0], timeout)?;
            validated += v;
            if let Some(r) = r {
                println!("{}", report::bw_line(&r, p.report_gbits));
                rows.push(r);
            }
        } else {
            let infinite = matches!(p.run, RunLength::Infinitely(_));
            let mut last = BwReport::default();
            for &size in &p.sizes {
                let (rposted, periods) = (vec![0; qps.len()], Vec::new());
                let (send, recv, remote) = (sender, receiver, &remote[..]);
                let mut side = BwSide { test, p, qps: &qps, remote, size, send, recv, rposted, validated: 0, periods };
                side.post_receives(&mut w)?;
                polling(&mut w, || ex.start_run(test, &mine[0], p.duplex)).map_err(err)?;
                let mine_r = side.run(&mut w, &ex, timeout)?;
                validated += side.validated + check_read(&w, test, p, &qps, size)?;
                last = mine_r;
                if infinite {
                    rows.extend(side.periods.iter().copied());
                    break;
                }
                let peer = polling(&mut w, || ex.end_run(test, &mine[0], &mine_r, p.duplex, p.all)).map_err(err)?;
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
            polling(&mut w, move || ex.finish(test, &first, &last, p.duplex)).map_err(err)?;
        }
        println!("{}", report::RESULT_LINE);
        Results::Bw(rows)
    };
    drop(w);
    if s.memif {
        if client {
            std::thread::sleep(Duration::from_millis(200));
        } else {
            let _ = s.port.wait_link_down(Duration::from_secs(5));
            // Let EAL's interrupt thread finish handling the peer's disconnect before the port is stopped (it
            // segfaults in librte_net_memif otherwise, now and then: dmesg "eal-intr-thread ... segfault").
            std::thread::sleep(MEMIF_SETTLE);
        }
    }
    let _ = s.port.stop();
    if p.data_validation && validated > 0 {
        println!(" Data validation: {validated} bytes verified");
    }
    out_json(p, &banner, &results)
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
            Some(f) => std::fs::write(f, &j).map_err(|e| err(format!("{}: {e}", f.display())))?,
            None => print!("{j}"),
        }
    }
    Ok(())
}

/// READ with `--data_validation`: the client checks what it read into each QP's region; returns the bytes checked.
fn check_read(w: &Worker<'_>, test: TestKind, p: &Params, qps: &[Qp], size: u64) -> Result<u64, Fail> {
    if !(p.data_validation && p.is_client() && test.verb() == Verb::Read) {
        return Ok(0);
    }
    for (i, q) in qps.iter().enumerate() {
        let mem = w.engine.mr_bytes(q.mr.lkey).expect("own MR");
        if let Some(at) = first_bad(i, &mem[..size as usize]) {
            return Err(err(format!("data validation: READ of {size} bytes on QP {i}: byte {at} differs")));
        }
    }
    Ok(size * qps.len() as u64)
}

#[allow(clippy::too_many_arguments)]
fn client_traffic(
    w: &mut Worker<'_>,
    ex: &Exchange<std::net::TcpStream>,
    test: TestKind,
    p: &Params,
    qps: &[Qp],
    remote: &[Dest],
    size: u64,
    iters: u64,
    timeout: Duration,
    mut lat: Option<&mut report::LatRecorder>,
) -> Result<Duration, Fail> {
    let cas = p.atomic_type == AtomicType::CmpAndSwap;
    let opcode = match test.verb() {
        Verb::Write => WrOpcode::RdmaWrite,
        Verb::Read => WrOpcode::RdmaRead,
        Verb::Atomic if cas => WrOpcode::AtomicCmpSwp,
        Verb::Atomic => WrOpcode::AtomicFetchAdd,
        Verb::Send => WrOpcode::Send,
    };
    // Latency: one WR in flight, each timed from post to completion.
    let depth = if lat.is_some() { 1 } else { u64::from(p.tx_depth.max(1)) };
    let mut posted_at = Instant::now();
    let mut posted = vec![0u64; qps.len()];
    let mut done = vec![0u64; qps.len()];
    let mut cqes = [NO_CQE; 32];
    let start = Instant::now();
    let mut last_progress = start;
    let mut last_check = start;
    let mut failure: Option<String> = None;
    let total = iters * qps.len() as u64;
    let mut completed = 0u64;
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut spins = 0u64;
    w.run(&stop, |w| {
        let mut busy = false;
        for (i, q) in qps.iter().enumerate() {
            while posted[i] < iters && posted[i] - done[i] < depth {
                let mut wr = SendWr::new(posted[i], opcode).remote(remote[i].vaddr, remote[i].rkey);
                wr.compare_add = u64::from(!cas); // FETCH_AND_ADD adds 1; CMP_AND_SWAP swaps 0 for 0
                posted_at = Instant::now();
                let sge = Sge { addr: q.va, len: size as u32, lkey: q.mr.lkey };
                if let Err(e) = w.engine.post_send(q.qpn, &wr, &[sge]) {
                    failure = Some(format!("post_send: {e}"));
                    return (false, true);
                }
                posted[i] += 1;
                busy = true;
            }
            let k = w.engine.poll_cq(q.cq, &mut cqes);
            for c in &cqes[..k] {
                if c.status != WcStatus::Success {
                    let n = w.engine.qp_counters(q.qpn).unwrap_or_default();
                    failure = Some(format!(
                        "completion with error {:?} on QP {:#x} (retry_timeouts={} rewinds={} nak_psn_seq_rcvd={} \
                         acks_rcvd={} retransmitted_packets={})",
                        c.status,
                        q.qpn,
                        n.retry_timeouts,
                        n.rewinds,
                        n.nak_psn_seq_rcvd,
                        n.acks_rcvd,
                        n.retransmitted_packets
                    ));
                    return (false, true);
                }
                if let Some(rec) = lat.as_deref_mut() {
                    rec.record(posted_at.elapsed());
                    if p.data_validation && opcode == WrOpcode::AtomicFetchAdd {
                        let mem = w.engine.mr_bytes(q.mr.lkey).expect("own MR");
                        let v = u64::from_le_bytes(mem[..8].try_into().expect("8 bytes"));
                        if v != done[i] {
                            failure = Some(format!("data validation: FETCH_AND_ADD {} returned {v}", done[i]));
                            return (false, true);
                        }
                    }
                }
                done[i] += 1;
                completed += 1;
            }
            if k > 0 {
                busy = true;
                last_progress = Instant::now();
            }
        }
        if completed == total {
            return (false, busy);
        }
        spins += 1;
        if spins.is_multiple_of(1024) {
            let now = Instant::now();
            if now.duration_since(last_check) > Duration::from_millis(20) {
                last_check = now;
                if ex.peer_gone() {
                    failure = Some("the peer closed the out-of-band connection mid-run".into());
                    return (false, busy);
                }
                if now.duration_since(last_progress) > timeout {
                    failure = Some(format!("no completion for {} s ({completed}/{total} done)", timeout.as_secs()));
                    return (false, busy);
                }
            }
        }
        (true, busy)
    });
    match failure {
        Some(f) => Err(err(f)),
        None => Ok(start.elapsed()),
    }
}

/// One side's part in a BW run of one message size: it posts WRs (the client, and both sides with `-b`), keeps
/// receives posted (send BW: the server, and both sides with `-b`), or both, for `-n` iterations, `-D` seconds
/// or until interrupted (`--run_infinitely`).
struct BwSide<'a> {
    test: TestKind,
    p: &'a Params,
    qps: &'a [Qp],
    remote: &'a [Dest],
    size: u64,
    send: bool,
    recv: bool,
    /// Receives posted per QP.
    rposted: Vec<u64>,
    /// Payload bytes checked (`--data_validation`, received SENDs).
    validated: u64,
    /// `--run_infinitely`: one report per period, as printed.
    periods: Vec<BwReport>,
}

impl BwSide<'_> {
    /// Iterations per QP, or `None` for a timed run.
    fn limit(&self) -> Option<u64> {
        match self.p.run {
            RunLength::Iterations(n) => Some(n),
            _ => None,
        }
    }

    fn post_recv(&mut self, e: &mut Engine, i: usize) -> Result<(), String> {
        let q = &self.qps[i];
        let k = self.rposted[i];
        let sge = Sge { addr: q.va + (k % q.slots) * self.size, len: self.size as u32, lkey: q.mr.lkey };
        e.post_recv(q.qpn, k, &[sge]).map_err(|x| format!("post_recv: {x}"))?;
        self.rposted[i] += 1;
        Ok(())
    }

    /// The receives before the run (before the barrier that lets the peer send): up to the RX depth.
    fn post_receives(&mut self, w: &mut Worker<'_>) -> Result<(), Fail> {
        if !self.recv {
            return Ok(());
        }
        let depth = u64::from(self.p.rx_depth.max(1));
        let first = self.limit().map_or(depth, |n| n.min(depth));
        for i in 0..self.qps.len() {
            while self.rposted[i] < first {
                self.post_recv(&mut w.engine, i).map_err(err)?;
            }
        }
        Ok(())
    }

    /// One received SEND on QP `i`: checks it (`--data_validation`) and posts the next receive.
    fn received(&mut self, e: &mut Engine, i: usize, c: &Cqe) -> Result<(), String> {
        let q = &self.qps[i];
        if self.p.data_validation {
            if u64::from(c.byte_len) != self.size {
                return Err(format!("data validation: SEND of {} bytes, expected {}", c.byte_len, self.size));
            }
            let off = ((c.wr_id % q.slots) * self.size) as usize;
            let mem = e.mr_bytes(q.mr.lkey).expect("own MR");
            if let Some(at) = first_bad(i, &mem[off..off + self.size as usize]) {
                return Err(format!("data validation: SEND {} on QP {i}: byte {at} differs", c.wr_id));
            }
            self.validated += self.size;
        }
        if self.limit().is_none_or(|n| self.rposted[i] < n) {
            self.post_recv(e, i)?;
        }
        Ok(())
    }

    /// A timed figure as perftest reports it in duration mode: `count` messages in `elapsed`, no peak.
    fn timed(&self, count: u64, elapsed: Duration, factor: u64) -> BwReport {
        let secs = elapsed.as_secs_f64().max(1e-9);
        let msgs = (count * factor) as f64;
        BwReport {
            size: self.size,
            iters: count,
            bw_peak: 0.0,
            bw_avg: self.size as f64 * msgs / secs / 1_048_576.0,
            msg_rate: msgs / secs / 1e6,
        }
    }

    /// Runs the traffic; returns this side's report (iterations: first post to last completion, or first to last
    /// receive on a receive-only side; duration: what completed between the margins; infinitely: the last period).
    fn run(
        &mut self,
        w: &mut Worker<'_>,
        ex: &Exchange<std::net::TcpStream>,
        timeout: Duration,
    ) -> Result<BwReport, Fail> {
        let (p, qps, size, limit) = (self.p, self.qps, self.size, self.limit());
        let cas = p.atomic_type == AtomicType::CmpAndSwap;
        let opcode = match self.test.verb() {
            Verb::Write => WrOpcode::RdmaWrite,
            Verb::Read => WrOpcode::RdmaRead,
            Verb::Atomic if cas => WrOpcode::AtomicCmpSwp,
            Verb::Atomic => WrOpcode::AtomicFetchAdd,
            Verb::Send => WrOpcode::Send,
        };
        let depth = u64::from(p.tx_depth.max(1));
        let cq_mod = u64::from(p.cq_mod.max(1));
        let n = qps.len();
        let (mut posted, mut done, mut got) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
        let mut peak = (self.send && !p.no_peak).then(PeakMeter::new);
        let start = Instant::now();
        let ns = |t: Instant| u64::try_from(t.duration_since(start).as_nanos()).unwrap_or(u64::MAX);
        let (mut first_post, mut last_done, mut first_recv, mut last_recv) = (None, None, None, None);
        // Timed runs: the window being measured, the messages counted in it, when it ends.
        let (mut window_from, mut window_count, mut window_to) = (None::<Instant>, 0u64, None::<Instant>);
        let (mut next_period, period) = match p.run {
            RunLength::Infinitely(s) => (Duration::from_secs(u64::from(s)), Duration::from_secs(u64::from(s))),
            _ => (Duration::MAX, Duration::MAX),
        };
        // -b without SEND: perftest doubles the figures of each period (both directions on one side's clock).
        let factor = if p.duplex && self.test != TestKind::SendBw { 2 } else { 1 };
        let mut cqes = [NO_CQE; 32];
        let mut failure: Option<Fail> = None;
        let (mut last_progress, mut last_check) = (start, start);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let mut spins = 0u64;
        w.run(&stop, |w| {
            let now = Instant::now();
            let el = now.duration_since(start);
            let mut ending = false;
            match p.run {
                RunLength::Iterations(_) => {}
                RunLength::Duration { secs, margin } => {
                    let (from, to) = (u64::from(margin), u64::from(secs - margin));
                    if window_from.is_none() && el >= Duration::from_secs(from) {
                        window_from = Some(now);
                    }
                    if window_to.is_none() && el >= Duration::from_secs(to) {
                        window_to = Some(now);
                    }
                    ending = el >= Duration::from_secs(u64::from(secs));
                }
                RunLength::Infinitely(_) => {
                    window_from.get_or_insert(start);
                    if el >= next_period {
                        let r = self.timed(window_count, now.duration_since(window_from.unwrap_or(start)), factor);
                        println!("{}", report::bw_line(&r, p.report_gbits));
                        self.periods.push(r);
                        window_from = Some(now);
                        window_count = 0;
                        next_period += period;
                    }
                }
            }
            if ending {
                return (false, false);
            }
            let counting = window_from.is_some() && window_to.is_none();
            let mut busy = false;
            for (i, q) in qps.iter().enumerate() {
                while self.send && limit.is_none_or(|l| posted[i] < l) && posted[i] - done[i] < depth {
                    let k = posted[i];
                    let mut wr = SendWr::new(k, opcode).remote(self.remote[i].vaddr, self.remote[i].rkey);
                    // perftest's CQ moderation: every cq_mod-th WR of a QP is signaled, and the last one.
                    wr.signaled = k % cq_mod == cq_mod - 1 || limit == Some(k + 1);
                    wr.compare_add = u64::from(!cas); // FETCH_AND_ADD adds 1; CMP_AND_SWAP swaps 0 for 0
                    let sge = Sge { addr: q.va, len: size as u32, lkey: q.mr.lkey };
                    if let Err(e) = w.engine.post_send(q.qpn, &wr, &[sge]) {
                        failure = Some(err(format!("post_send: {e}")));
                        return (false, true);
                    }
                    let t = Instant::now();
                    first_post.get_or_insert(t);
                    if let Some(m) = peak.as_mut() {
                        m.post(ns(t));
                    }
                    posted[i] += 1;
                    busy = true;
                }
                let k = w.engine.poll_cq(q.cq, &mut cqes);
                if k == 0 {
                    continue;
                }
                let t = Instant::now();
                busy = true;
                last_progress = t;
                for c in &cqes[..k] {
                    if c.status != WcStatus::Success {
                        failure = Some(err(format!("completion with error {:?} on QP {:#x}", c.status, q.qpn)));
                        return (false, true);
                    }
                    if c.opcode == WcOpcode::Recv {
                        first_recv.get_or_insert(t);
                        got[i] += 1;
                        if !self.send && counting {
                            window_count += 1;
                        }
                        if let Err(e) = self.received(&mut w.engine, i, c) {
                            failure = Some(err(e));
                            return (false, true);
                        }
                        // After the handling, so that a batch polled at once still spans some time.
                        last_recv = Some(Instant::now());
                        continue;
                    }
                    // A signaled completion covers every earlier WR of the QP.
                    let upto = c.wr_id + 1;
                    let delta = upto.saturating_sub(done[i]);
                    done[i] = done[i].max(upto);
                    last_done = Some(t);
                    if counting {
                        window_count += delta;
                    }
                    if let Some(m) = peak.as_mut() {
                        m.complete(done.iter().sum(), ns(t));
                    }
                }
            }
            if let Some(l) = limit {
                let sent = !self.send || done.iter().all(|&d| d >= l);
                let received = !self.recv || got.iter().all(|&g| g >= l);
                if sent && received {
                    return (false, busy);
                }
            }
            spins += 1;
            if spins.is_multiple_of(256) && now.duration_since(last_check) > Duration::from_millis(20) {
                last_check = now;
                if roce_dp::dpdk::signal::stop_requested() {
                    if !matches!(p.run, RunLength::Infinitely(_)) {
                        failure = Some(Fail(130, "interrupted".into()));
                    }
                    return (false, busy);
                }
                match ex.peer_activity() {
                    PeerActivity::Gone => {
                        failure = Some(err("the peer closed the out-of-band connection mid-run"));
                        return (false, busy);
                    }
                    // A receive-only side of a timed run ends when the sender moves on to the teardown.
                    PeerActivity::Sent if !self.send && limit.is_none() => return (false, busy),
                    _ => {}
                }
                if now.duration_since(last_progress) > timeout {
                    let (d, g): (u64, u64) = (done.iter().sum(), got.iter().sum());
                    failure = Some(err(format!(
                        "no completion for {} s ({d} sends and {g} receives completed)",
                        timeout.as_secs()
                    )));
                    return (false, busy);
                }
            }
            (true, busy)
        });
        if let Some(f) = failure {
            return Err(f);
        }
        let end = Instant::now();
        Ok(match p.run {
            RunLength::Iterations(iters) => {
                let (a, b) = if self.send { (first_post, last_done) } else { (first_recv, last_recv) };
                let elapsed = match (a, b) {
                    (Some(a), Some(b)) => b.duration_since(a),
                    _ => Duration::ZERO,
                };
                let pk = peak.as_ref().map_or(0.0, |m| m.mibs(size));
                report::bw_report(size, iters, p.num_qps, false, elapsed, pk)
            }
            RunLength::Duration { .. } => {
                let from = window_from.unwrap_or(start);
                self.timed(window_count, window_to.unwrap_or(end).duration_since(from), 1)
            }
            RunLength::Infinitely(_) => self.periods.last().copied().unwrap_or_else(|| self.timed(0, period, 1)),
        })
    }
}

/// The side that only waits (write/read/atomic BW server without `-b`, read/atomic latency server): the peer runs
/// the test and then the teardown, which this side waits for on a thread (as long as RoCE traffic keeps coming,
/// up to `timeout` without any), while this thread keeps the data path going. Returns the peer's report (BW)
/// and the bytes checked (`--data_validation`: the WRITE server's region).
fn passive_server(
    w: &mut Worker<'_>,
    mut ex: Exchange<std::net::TcpStream>,
    test: TestKind,
    p: &Params,
    qps: &[Qp],
    first: &Dest,
    timeout: Duration,
) -> Result<(Option<BwReport>, u64), Fail> {
    let size = p.sizes.iter().copied().max().unwrap_or(0);
    let iters = match p.run {
        RunLength::Iterations(n) => n,
        _ => 0,
    };
    let first = *first;
    let zero = BwReport { size, iters, ..BwReport::default() };
    // The teardown comes when the client is done, however long that takes; the traffic shows it is alive.
    ex.set_timeout(None).map_err(err)?;
    let th = std::thread::spawn(move || ex.finish(test, &first, &zero, false));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut failure = None;
    let mut seen = w.stats.rx_roce;
    let mut last_progress = Instant::now();
    let mut spins = 0u64;
    w.run(&stop, |w| {
        spins += 1;
        if !spins.is_multiple_of(256) {
            return (true, false);
        }
        if th.is_finished() {
            return (false, false);
        }
        let now = Instant::now();
        if w.stats.rx_roce != seen {
            seen = w.stats.rx_roce;
            last_progress = now;
        } else if now.duration_since(last_progress) > timeout {
            failure = Some(err(format!("no RoCE traffic and no teardown from the peer for {} s", timeout.as_secs())));
            return (false, false);
        }
        if roce_dp::dpdk::signal::stop_requested() {
            failure = Some(Fail(130, "interrupted".into()));
            return (false, false);
        }
        (true, false)
    });
    if let Some(f) = failure {
        return Err(f);
    }
    let peer = th.join().map_err(|_| err("exchange thread panicked"))?.map_err(err)?;
    let mut validated = 0;
    if p.data_validation && test == TestKind::WriteBw {
        for (i, q) in qps.iter().enumerate() {
            let mem = w.engine.mr_bytes(q.mr.lkey).expect("own MR");
            if let Some(at) = first_bad(i, &mem[..size as usize]) {
                return Err(err(format!("data validation: WRITE on QP {i}: byte {at} differs")));
            }
            validated += size;
        }
    }
    Ok((peer, validated))
}

/// send_lat / write_lat: one message each way per iteration; the side that posts first is perftest's
/// ([`TestKind::client_posts_first`]), the other answers each message it received. Each side times from its post
/// to the peer's next message. Region layout (both tests): the receive area at offset 0 (the address in our QP
/// record, which a peer writes to as given), the send area at `size`. write_lat sees a message land by its last
/// byte, the [`exchange::latency_marker`] the sender put there, as perftest polls memory. Each size begins with
/// [`Exchange::start_run`] once the first receives are posted (send_lat's per-size barrier).
#[allow(clippy::too_many_arguments)]
fn pingpong(
    w: &mut Worker<'_>,
    ex: &mut Exchange<std::net::TcpStream>,
    test: TestKind,
    client: bool,
    q: &Qp,
    first: &Dest,
    r: &Dest,
    size: u64,
    iters: u64,
    timeout: Duration,
    rec: &mut report::LatRecorder,
) -> Result<(), Fail> {
    let send = test == TestKind::SendLat;
    let leader = client == test.client_posts_first();
    let last = size as usize - 1;
    let recv_sge = Sge { addr: q.va, len: size as u32, lkey: q.mr.lkey };
    let mut recv_posted = 0u64;
    if send {
        while recv_posted < iters.min(16) {
            w.engine.post_recv(q.qpn, recv_posted, &[recv_sge]).map_err(|x| err(format!("post_recv: {x}")))?;
            recv_posted += 1;
        }
    }
    polling(w, || ex.start_run(test, first, false)).map_err(err)?;
    // k: messages we posted; got: the peer's messages that arrived; awaiting: our last post is not timed yet.
    let (mut k, mut got, mut send_out, mut awaiting) = (0u64, 0u64, 0u32, false);
    let mut t0 = Instant::now();
    let mut last_progress = Instant::now();
    let mut failure = None;
    let mut cqes = [NO_CQE; 8];
    let stop = std::sync::atomic::AtomicBool::new(false);
    let mut spins = 0u64;
    w.run(&stop, |w| {
        let n = w.engine.poll_cq(q.cq, &mut cqes);
        let before = got;
        for c in &cqes[..n] {
            if c.status != WcStatus::Success {
                failure = Some(format!("completion with error {:?}", c.status));
                return (false, true);
            }
            if c.opcode == WcOpcode::Recv {
                got += 1;
                if recv_posted < iters {
                    if let Err(x) = w.engine.post_recv(q.qpn, recv_posted, &[recv_sge]) {
                        failure = Some(format!("post_recv: {x}"));
                        return (false, true);
                    }
                    recv_posted += 1;
                }
            } else {
                send_out -= 1;
            }
        }
        if !send && got < iters && w.engine.mr_bytes(q.mr.lkey).expect("own MR")[last] == exchange::latency_marker(got)
        {
            got += 1;
        }
        if got > before {
            last_progress = Instant::now();
            if awaiting {
                rec.record(t0.elapsed());
                awaiting = false;
            }
        }
        // The leader posts message k once the peer answered all before it; the follower once message k arrived.
        let may_post = if leader { got == k } else { got > k };
        if k < iters && send_out == 0 && may_post {
            let mem = w.engine.mr_bytes_mut(q.mr.lkey).expect("own MR");
            mem[size as usize + last] = exchange::latency_marker(k);
            let op = if send { WrOpcode::Send } else { WrOpcode::RdmaWrite };
            let wr = SendWr::new(k, op).remote(r.vaddr, r.rkey);
            let sge = Sge { addr: q.va + size, len: size as u32, lkey: q.mr.lkey };
            if let Err(x) = w.engine.post_send(q.qpn, &wr, &[sge]) {
                failure = Some(format!("post_send: {x}"));
                return (false, true);
            }
            t0 = Instant::now();
            send_out += 1;
            k += 1;
            awaiting = true;
        }
        if k == iters && got == iters && send_out == 0 {
            return (false, n > 0);
        }
        spins += 1;
        if spins.is_multiple_of(1024) {
            let now = Instant::now();
            if ex.peer_gone() {
                failure = Some("the peer closed the out-of-band connection mid-run".into());
                return (false, true);
            }
            if now.duration_since(last_progress) > timeout {
                failure = Some(format!("no progress for {} s ({got}/{iters} messages in, {k} out)", timeout.as_secs()));
                return (false, true);
            }
        }
        (true, n > 0)
    });
    match failure {
        Some(f) => Err(err(f)),
        None => Ok(()),
    }
}
