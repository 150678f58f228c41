//! `--daemon SOCKET`: the `rdp_*_bw` tools with their RoCE traffic through a running roce-dpd (the client
//! library, [`roce_dp::client`]) instead of an engine embedded in the tool. The out-of-band perftest exchange is
//! the same TCP exchange as with `--port-conf`; the QP records carry the daemon's GID, our QPNs and PSNs, and the
//! rkeys and addresses of our shared-memory regions.
//!
//! Implemented: rdp_write_bw and rdp_read_bw with `-n` iterations, `-s`/`-a`, `-q`, `-t`, `-Q`, `-m`,
//! `--report_gbits`, `--data_validation` (WRITE: the server checks its region; READ: the client checks what it
//! read). Not yet: SEND, atomics, the latency tests, `-b`, `-D`, `--run_infinitely`: each refused with one line.

use std::path::Path;
use std::time::{Duration, Instant};

use roce_dp::client::{Cq, Device, Mr, Pd, Qp, QpInit, Remote};
use roce_dp::{AccessFlags, Cqe, SendWr, WcStatus, WrOpcode};

use super::exchange::{self, BwReport, Dest, Exchange, Mtu, Role, SysData, TestKind, Verb};
use super::params::{Params, RunLength};
use super::report::{self, PeakMeter};
use super::run::{bad, err, fill, first_bad, out_json, print_banner, record, Fail};

/// One QP of ours in the daemon, with everything it needs (dropped QP first, PD last).
struct DQp {
    qp: Qp,
    cq: Cq,
    mr: Mr,
    _pd: Pd,
    psn: u32,
}

fn supported(test: TestKind, p: &Params) -> Result<u64, Fail> {
    if !matches!(test, TestKind::WriteBw | TestKind::ReadBw) {
        return Err(bad(format!(
            "--daemon: {} is not supported yet (rdp_write_bw, rdp_read_bw are)",
            test.tool_name()
        )));
    }
    if p.duplex {
        return Err(bad("--daemon: -b is not supported yet"));
    }
    match p.run {
        RunLength::Iterations(n) => Ok(n),
        _ => Err(bad("--daemon: only -n ITERATIONS runs are supported yet (not -D, --run_infinitely)")),
    }
}

/// The whole run of one tool through roce-dpd on `sock`.
pub(super) fn run(test: TestKind, p: &Params, sock: &Path, timeout: Duration) -> Result<(), Fail> {
    let iters = supported(test, p)?;
    let client = p.is_client();
    let dev = Device::open(sock).map_err(|e| Fail(2, e.to_string()))?;
    let stream = if let Some(host) = &p.host {
        exchange::connect(host, p.port, timeout.min(Duration::from_secs(5)), timeout).map_err(err)?
    } else {
        let listener = exchange::listen(p.port).map_err(err)?;
        for l in report::waiting_lines() {
            println!("{l}");
        }
        exchange::accept(&listener, Some(timeout), timeout).map_err(err)?
    };
    let mut ex = Exchange::new(stream, if client { Role::Client } else { Role::Server }, timeout);
    let port_mtu = Mtu::from_bytes(dev.info().mtu).unwrap_or(Mtu::Mtu1024);
    let n = ex.setup(SysData::default(), p.mtu.unwrap_or(port_mtu), p.mtu.is_some()).map_err(err)?;
    if n.mtu > port_mtu {
        return Err(err(format!("path MTU {} is above the daemon port's {}", n.mtu.bytes(), port_mtu.bytes())));
    }
    let size = p.sizes.iter().copied().max().unwrap_or(1);
    let mut qps = Vec::new();
    for q in 0..p.num_qps as usize {
        let pd = dev.alloc_pd().map_err(err)?;
        let depth = p.tx_depth.max(p.rx_depth).max(1);
        let cq = dev.create_cq(depth * 2 + 16).map_err(err)?;
        let mut mr = pd.reg_mr(n.sys.region_len(size, 1) as usize, AccessFlags::ALL).map_err(err)?;
        let init = QpInit { sq_depth: p.tx_depth.max(1), rq_depth: p.rx_depth.max(1), ..QpInit::default() };
        let qp = dev.create_qp(&pd, &cq, &cq, init).map_err(err)?;
        qp.to_init(AccessFlags::ALL).map_err(err)?;
        // The source of the data holds the pattern; the sink starts zeroed (a fresh region).
        if client != (test.verb() == Verb::Read) {
            fill(q, mr.as_mut_slice(), size as usize);
        }
        let psn = (qp.qpn().wrapping_mul(2_654_435_761) ^ std::process::id()) & 0xff_ffff;
        qps.push(DQp { qp, cq, mr, _pd: pd, psn });
    }
    let out_reads = p.out_reads.unwrap_or(16);
    let mine: Vec<Dest> =
        qps.iter().map(|q| record(q.qp.qpn(), q.psn, q.mr.rkey(), q.mr.addr(), dev.gid(), out_reads)).collect();
    let remote = ex.exchange_dests(test, &mine).map_err(err)?;
    exchange::check_gid_compatibility(&mine[0], &remote[0]).map_err(err)?;
    let banner = print_banner(test, p, n.mtu, out_reads, &mine, &remote);
    for (l, r) in qps.iter().zip(&remote) {
        let to = Remote { qpn: r.qpn, psn: r.psn, gid: r.gid, mac: None };
        l.qp.to_rtr(&to, n.mtu.bytes()).map_err(|e| err(format!("QP to RTR: {e}")))?;
        l.qp.to_rts(l.psn).map_err(|e| err(format!("QP to RTS: {e}")))?;
    }
    ex.connected(test, &mine[0]).map_err(err)?;
    println!("{}", report::bw_header(p.report_gbits));
    let mut validated = 0u64;
    let mut rows = Vec::new();
    if client {
        let mut last = BwReport::default();
        for &size in &p.sizes {
            ex.start_run(test, &mine[0], false).map_err(err)?;
            let r = traffic(&mut qps, &remote, test, p, size, iters, &ex, timeout)?;
            if p.data_validation && test.verb() == Verb::Read {
                for (i, q) in qps.iter_mut().enumerate() {
                    if let Some(at) = first_bad(i, &q.mr.as_slice()[..size as usize]) {
                        return Err(err(format!("data validation: READ of {size} bytes on QP {i}: byte {at} differs")));
                    }
                    validated += size;
                }
            }
            ex.end_run(test, &mine[0], &r, false, p.all).map_err(err)?;
            println!("{}", report::bw_line(&r, p.report_gbits));
            rows.push(r);
            last = r;
        }
        ex.finish(test, &mine[0], &last, false).map_err(err)?;
    } else {
        // The client does everything, then sends its report; meanwhile watch that the daemon stays.
        let zero = BwReport { size, iters, ..BwReport::default() };
        ex.set_timeout(None).map_err(err)?;
        let first = mine[0];
        let th = std::thread::spawn(move || ex.finish(test, &first, &zero, false));
        while !th.is_finished() {
            dev.check_alive().map_err(|e| Fail(2, e.to_string()))?;
            std::thread::sleep(Duration::from_millis(50));
        }
        let peer = th.join().map_err(|_| err("exchange thread panicked"))?.map_err(err)?;
        if p.data_validation && test == TestKind::WriteBw {
            for (i, q) in qps.iter_mut().enumerate() {
                if let Some(at) = first_bad(i, &q.mr.as_slice()[..size as usize]) {
                    return Err(err(format!("data validation: WRITE on QP {i}: byte {at} differs")));
                }
                validated += size;
            }
        }
        if let Some(r) = peer {
            println!("{}", report::bw_line(&r, p.report_gbits));
            rows.push(r);
        }
    }
    println!("{}", report::RESULT_LINE);
    if p.data_validation && validated > 0 {
        println!(" Data validation: {validated} bytes verified");
    }
    out_json(p, &banner, &report::Results::Bw(rows))
}

/// The client's run of one size: `-t` WRs in flight per QP, every `-Q`th signaled and the last.
#[allow(clippy::too_many_arguments)]
fn traffic(
    qps: &mut [DQp],
    remote: &[Dest],
    test: TestKind,
    p: &Params,
    size: u64,
    iters: u64,
    ex: &Exchange<std::net::TcpStream>,
    timeout: Duration,
) -> Result<BwReport, Fail> {
    let opcode = if test.verb() == Verb::Read { WrOpcode::RdmaRead } else { WrOpcode::RdmaWrite };
    let depth = u64::from(p.tx_depth.max(1));
    let cq_mod = u64::from(p.cq_mod.max(1)).min(depth);
    let (mut posted, mut done) = (vec![0u64; qps.len()], vec![0u64; qps.len()]);
    let mut cqes = [Cqe::EMPTY; 32];
    let start = Instant::now();
    let ns = |t: Instant| t.duration_since(start).as_nanos() as u64;
    let mut peak = PeakMeter::new();
    let (mut first_post, mut last_done) = (None::<Instant>, None::<Instant>);
    let mut last_progress = start;
    let mut spins = 0u64;
    loop {
        for (i, q) in qps.iter_mut().enumerate() {
            while posted[i] < iters && posted[i] - done[i] < depth {
                let k = posted[i];
                let mut wr = SendWr::new(k, opcode).remote(remote[i].vaddr, remote[i].rkey);
                wr.signaled = k % cq_mod == cq_mod - 1 || k + 1 == iters;
                let sge = q.mr.sge(0, size as u32);
                q.qp.post_send(&wr, &[sge]).map_err(|e| err(format!("post_send: {e}")))?;
                let t = Instant::now();
                first_post.get_or_insert(t);
                peak.post(ns(t));
                posted[i] += 1;
            }
            let k = q.cq.poll(&mut cqes).map_err(|e| Fail(2, e.to_string()))?;
            if k == 0 {
                continue;
            }
            let t = Instant::now();
            last_progress = t;
            for c in &cqes[..k] {
                if c.status != WcStatus::Success {
                    return Err(err(format!("completion with error {:?} on QP {:#x}", c.status, q.qp.qpn())));
                }
                // A signaled completion covers every earlier WR of the QP.
                done[i] = done[i].max(c.wr_id + 1);
                last_done = Some(t);
            }
            peak.complete(done.iter().sum(), ns(t));
        }
        if done.iter().all(|&d| d >= iters) {
            break;
        }
        spins += 1;
        if spins.is_multiple_of(1024) {
            if roce_dp::dpdk::signal::stop_requested() {
                return Err(Fail(130, "interrupted".into()));
            }
            if ex.peer_gone() {
                return Err(err("the peer closed the out-of-band connection mid-run"));
            }
            if last_progress.elapsed() > timeout {
                let d: u64 = done.iter().sum();
                return Err(err(format!("no completion for {} s ({d} WRs completed)", timeout.as_secs())));
            }
        }
    }
    let elapsed = match (first_post, last_done) {
        (Some(a), Some(b)) => b.duration_since(a),
        _ => Duration::ZERO,
    };
    Ok(report::bw_report(size, iters, p.num_qps, false, elapsed, peak.mibs(size)))
}
