//! The traffic loops of the eight tools, generic over the backend ([`Nic`]): the BW tests' sides ([`BwSide`]),
//! the read/atomic latency client ([`client_traffic`]), the send/write latency ping-pong ([`pingpong`]) and the
//! side that only waits for the peer's teardown ([`passive_server`]).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use roce_dp::{Cqe, SendWr, WcOpcode, WcStatus, WrOpcode};

use super::exchange::{self, BwReport, Dest, Exchange, PeerActivity, TestKind, Verb};
use super::params::{AtomicType, Params, RunLength};
use super::report::{self, PeakMeter};
use super::run::{drive, err, first_bad, polling, Fail, Local, Nic};

/// How often a loop looks at the clock-driven checks (signals, the peer, the daemon, the timeout).
const CHECK_EVERY: Duration = Duration::from_millis(20);

/// perftest's CQ moderation (`-Q N`) for one QP: which of its WRs, counted from its first, is signaled: the N-th,
/// the 2N-th, ... (`k % N == N - 1` for the k-th from 0), by a countdown instead of a division per WR (a 64-bit
/// `%` was ~24 instructions a WR of the BW loop, session 18).
#[derive(Clone, Copy, Debug)]
struct CqModeration {
    /// `-Q`, at least 1.
    every: u32,
    /// WRs to post before the next signaled one.
    left: u32,
}

impl CqModeration {
    fn new(cq_mod: u32) -> CqModeration {
        let every = cq_mod.max(1);
        CqModeration { every, left: every - 1 }
    }

    /// Whether the next WR is signaled.
    #[inline(always)]
    fn next(&mut self) -> bool {
        if self.left == 0 {
            self.left = self.every - 1;
            true
        } else {
            self.left -= 1;
            false
        }
    }
}

fn opcode(test: TestKind, atomic: AtomicType) -> WrOpcode {
    match test.verb() {
        Verb::Write => WrOpcode::RdmaWrite,
        Verb::Read => WrOpcode::RdmaRead,
        Verb::Atomic if atomic == AtomicType::CmpAndSwap => WrOpcode::AtomicCmpSwp,
        Verb::Atomic => WrOpcode::AtomicFetchAdd,
        Verb::Send => WrOpcode::Send,
    }
}

/// A failed completion as one line, with the QP's counters.
fn failed<N: Nic>(nic: &mut N, i: usize, q: &Local, c: &Cqe) -> Fail {
    err(format!("completion with error {:?} on QP {:#x}{}", c.status, q.qpn, nic.failure_detail(i)))
}

/// The checks of a loop that runs traffic: the backend is still there, and so is the peer's exchange socket.
fn still_there<N: Nic>(nic: &mut N, ex: &Exchange<TcpStream>) -> Result<(), Fail> {
    nic.check_alive()?;
    if ex.peer_gone() {
        return Err(err("the peer closed the out-of-band connection mid-run"));
    }
    Ok(())
}

/// READ with `--data_validation`: the client checks what it read into each QP's region; returns the bytes checked.
pub(super) fn check_read<N: Nic>(
    nic: &mut N,
    test: TestKind,
    p: &Params,
    qps: &[Local],
    size: u64,
) -> Result<u64, Fail> {
    if !(p.data_validation && p.is_client() && test.verb() == Verb::Read) {
        return Ok(0);
    }
    for i in 0..qps.len() {
        if let Some(at) = first_bad(i, &nic.mem(i)[..size as usize]) {
            return Err(err(format!("data validation: READ of {size} bytes on QP {i}: byte {at} differs")));
        }
    }
    Ok(size * qps.len() as u64)
}

/// The read/atomic latency client: one WR in flight per QP, each timed from post to completion into `lat`
/// (FETCH_AND_ADD with `--data_validation`: each returned value checked).
#[allow(clippy::too_many_arguments)]
pub(super) fn client_traffic<N: Nic>(
    nic: &mut N,
    ex: &Exchange<TcpStream>,
    test: TestKind,
    p: &Params,
    qps: &[Local],
    remote: &[Dest],
    size: u64,
    iters: u64,
    timeout: Duration,
    mut lat: Option<&mut report::LatRecorder>,
) -> Result<Duration, Fail> {
    let cas = p.atomic_type == AtomicType::CmpAndSwap;
    let opcode = opcode(test, p.atomic_type);
    // Latency: one WR in flight, each timed from post to completion.
    let depth = if lat.is_some() { 1 } else { u64::from(p.tx_depth.max(1)) };
    let mut posted_at = Instant::now();
    let mut posted = vec![0u64; qps.len()];
    let mut done = vec![0u64; qps.len()];
    let mut cqes = [Cqe::EMPTY; 32];
    let start = Instant::now();
    let mut last_progress = start;
    let mut last_check = start;
    let total = iters * qps.len() as u64;
    let mut completed = 0u64;
    let mut spins = 0u64;
    drive(nic, |nic| {
        let mut busy = false;
        for (i, q) in qps.iter().enumerate() {
            while posted[i] < iters && posted[i] - done[i] < depth {
                let mut wr = SendWr::new(posted[i], opcode).remote(remote[i].vaddr, remote[i].rkey);
                wr.compare_add = u64::from(!cas); // FETCH_AND_ADD adds 1; CMP_AND_SWAP swaps 0 for 0
                posted_at = Instant::now();
                nic.post_send(i, &wr, 0, size as u32)?;
                posted[i] += 1;
                busy = true;
            }
            let k = nic.poll_cq(i, &mut cqes)?;
            for c in &cqes[..k] {
                if c.status != WcStatus::Success {
                    return Err(failed(nic, i, q, c));
                }
                if let Some(rec) = lat.as_deref_mut() {
                    rec.record(posted_at.elapsed());
                    if p.data_validation && opcode == WrOpcode::AtomicFetchAdd {
                        let v = u64::from_le_bytes(nic.mem(i)[..8].try_into().expect("8 bytes"));
                        if v != done[i] {
                            return Err(err(format!("data validation: FETCH_AND_ADD {} returned {v}", done[i])));
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
            return Ok((false, busy));
        }
        spins += 1;
        if spins.is_multiple_of(1024) {
            let now = Instant::now();
            if now.duration_since(last_check) > CHECK_EVERY {
                last_check = now;
                still_there(nic, ex)?;
                if now.duration_since(last_progress) > timeout {
                    let s = timeout.as_secs();
                    return Err(err(format!("no completion for {s} s ({completed}/{total} done)")));
                }
            }
        }
        Ok((true, busy))
    })?;
    Ok(start.elapsed())
}

/// One side's part in a BW run of one message size: it posts WRs (the client, and both sides with `-b`), keeps
/// receives posted (send BW: the server, and both sides with `-b`), or both, for `-n` iterations, `-D` seconds
/// or until interrupted (`--run_infinitely`).
pub(super) struct BwSide<'a> {
    test: TestKind,
    p: &'a Params,
    qps: &'a [Local],
    remote: &'a [Dest],
    size: u64,
    send: bool,
    recv: bool,
    /// Receives posted per QP.
    rposted: Vec<u64>,
    /// Payload bytes checked (`--data_validation`, received SENDs).
    pub(super) validated: u64,
    /// `--run_infinitely`: one report per period, as printed.
    pub(super) periods: Vec<BwReport>,
}

impl<'a> BwSide<'a> {
    pub(super) fn new(
        test: TestKind,
        p: &'a Params,
        qps: &'a [Local],
        remote: &'a [Dest],
        size: u64,
        send: bool,
        recv: bool,
    ) -> Self {
        let rposted = vec![0; qps.len()];
        BwSide { test, p, qps, remote, size, send, recv, rposted, validated: 0, periods: Vec::new() }
    }

    /// Iterations per QP, or `None` for a timed run.
    fn limit(&self) -> Option<u64> {
        match self.p.run {
            RunLength::Iterations(n) => Some(n),
            _ => None,
        }
    }

    fn post_recv<N: Nic>(&mut self, nic: &mut N, i: usize) -> Result<(), Fail> {
        let k = self.rposted[i];
        let off = (k % self.qps[i].slots) * self.size;
        nic.post_recv(i, k, off, self.size as u32)?;
        self.rposted[i] += 1;
        Ok(())
    }

    /// The receives before the run (before the barrier that lets the peer send): up to the RX depth.
    pub(super) fn post_receives<N: Nic>(&mut self, nic: &mut N) -> Result<(), Fail> {
        if !self.recv {
            return Ok(());
        }
        let depth = u64::from(self.p.rx_depth.max(1));
        let first = self.limit().map_or(depth, |n| n.min(depth));
        for i in 0..self.qps.len() {
            while self.rposted[i] < first {
                self.post_recv(nic, i)?;
            }
        }
        Ok(())
    }

    /// One received SEND on QP `i`: checks it (`--data_validation`) and posts the next receive.
    fn received<N: Nic>(&mut self, nic: &mut N, i: usize, c: &Cqe) -> Result<(), Fail> {
        if self.p.data_validation {
            if u64::from(c.byte_len) != self.size {
                return Err(err(format!("data validation: SEND of {} bytes, expected {}", c.byte_len, self.size)));
            }
            let off = ((c.wr_id % self.qps[i].slots) * self.size) as usize;
            if let Some(at) = first_bad(i, &nic.mem(i)[off..off + self.size as usize]) {
                return Err(err(format!("data validation: SEND {} on QP {i}: byte {at} differs", c.wr_id)));
            }
            self.validated += self.size;
        }
        if self.limit().is_none_or(|n| self.rposted[i] < n) {
            self.post_recv(nic, i)?;
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
    pub(super) fn run<N: Nic>(
        &mut self,
        nic: &mut N,
        ex: &Exchange<TcpStream>,
        timeout: Duration,
    ) -> Result<BwReport, Fail> {
        let (p, qps, size, limit) = (self.p, self.qps, self.size, self.limit());
        let cas = p.atomic_type == AtomicType::CmpAndSwap;
        let opcode = opcode(self.test, p.atomic_type);
        let depth = u64::from(p.tx_depth.max(1));
        let n = qps.len();
        let (mut posted, mut done, mut got) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
        let mut moderation = vec![CqModeration::new(p.cq_mod); n];
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
        let mut cqes = [Cqe::EMPTY; 32];
        let (mut last_progress, mut last_check) = (start, start);
        let mut spins = 0u64;
        drive(nic, |nic| {
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
                return Ok((false, false));
            }
            let counting = window_from.is_some() && window_to.is_none();
            let mut busy = false;
            // Every post of this pass is stamped with the pass's clock reading, taken before them (one reading
            // per pass, not per WR: ~50-60 ns each on a VM's clock). A stamp no later than the post makes the
            // first post's time and the peak's runs conservative: never a shorter interval than the real one.
            let pass_ns = ns(now);
            for (i, q) in qps.iter().enumerate() {
                while self.send && limit.is_none_or(|l| posted[i] < l) && posted[i] - done[i] < depth {
                    let k = posted[i];
                    let mut wr = SendWr::new(k, opcode).remote(self.remote[i].vaddr, self.remote[i].rkey);
                    // perftest's CQ moderation: every cq_mod-th WR of a QP is signaled, and the last one.
                    wr.signaled = moderation[i].next() || limit == Some(k + 1);
                    wr.compare_add = u64::from(!cas); // FETCH_AND_ADD adds 1; CMP_AND_SWAP swaps 0 for 0
                    nic.stage_send(i, &wr, 0, size as u32)?;
                    first_post.get_or_insert(now);
                    if let Some(m) = peak.as_mut() {
                        m.post(pass_ns);
                    }
                    posted[i] += 1;
                    busy = true;
                }
                nic.flush_sends(i);
                let k = nic.poll_cq(i, &mut cqes)?;
                if k == 0 {
                    continue;
                }
                let t = Instant::now();
                busy = true;
                last_progress = t;
                for c in &cqes[..k] {
                    if c.status != WcStatus::Success {
                        return Err(failed(nic, i, q, c));
                    }
                    if c.opcode == WcOpcode::Recv {
                        first_recv.get_or_insert(t);
                        got[i] += 1;
                        if !self.send && counting {
                            window_count += 1;
                        }
                        self.received(nic, i, c)?;
                        // After the handling, so that a batch polled at once still spans some time.
                        last_recv = Some(Instant::now());
                        continue;
                    }
                    // A signaled completion covers every earlier WR of the QP. One naming a WR this loop never
                    // posted (a broken or hostile daemon) would count work that was not done: refused.
                    if c.wr_id >= posted[i] {
                        return Err(err(format!(
                            "a send completion on QP {:#x} names WR {} but only {} were posted (the backend is \
                             broken)",
                            q.qpn, c.wr_id, posted[i]
                        )));
                    }
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
                    return Ok((false, busy));
                }
            }
            spins += 1;
            if spins.is_multiple_of(256) && now.duration_since(last_check) > CHECK_EVERY {
                last_check = now;
                if roce_dp::dpdk::signal::stop_requested() {
                    if !matches!(p.run, RunLength::Infinitely(_)) {
                        return Err(Fail(130, "interrupted".into()));
                    }
                    return Ok((false, busy));
                }
                nic.check_alive()?;
                match ex.peer_activity() {
                    PeerActivity::Gone => return Err(err("the peer closed the out-of-band connection mid-run")),
                    // A receive-only side of a timed run ends when the sender moves on to the teardown, and so does
                    // a side of an infinite run whose peer was interrupted (with -b both send: before, the side
                    // still sending never read the peer's teardown, and both ended in errors at the timeout).
                    PeerActivity::Sent
                        if (!self.send && limit.is_none()) || matches!(p.run, RunLength::Infinitely(_)) =>
                    {
                        return Ok((false, busy))
                    }
                    _ => {}
                }
                if now.duration_since(last_progress) > timeout {
                    let (d, g): (u64, u64) = (done.iter().sum(), got.iter().sum());
                    return Err(err(format!(
                        "no completion for {} s ({d} sends and {g} receives completed)",
                        timeout.as_secs()
                    )));
                }
            }
            Ok((true, busy))
        })?;
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
/// up to `timeout` without any), while this thread keeps the data path going and watches it. Returns the peer's
/// report (BW) and the bytes checked (`--data_validation`: the WRITE server's region). `abort` is the exchange's
/// socket, shut down to end the thread's wait when this side gives up.
pub(super) fn passive_server<N: Nic>(
    nic: &mut N,
    mut ex: Exchange<TcpStream>,
    abort: &TcpStream,
    test: TestKind,
    p: &Params,
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
    let mut seen = nic.rx_activity();
    let mut last_progress = Instant::now();
    let mut last_check = last_progress;
    let failure = loop {
        nic.wait();
        if th.is_finished() {
            break None;
        }
        let now = Instant::now();
        if now.duration_since(last_check) < CHECK_EVERY {
            continue;
        }
        last_check = now;
        let a = nic.rx_activity();
        if a != seen {
            seen = a;
            last_progress = now;
        } else if now.duration_since(last_progress) > timeout {
            let s = timeout.as_secs();
            break Some(err(format!("no RoCE traffic and no teardown from the peer for {s} s")));
        }
        if let Err(f) = nic.check_alive() {
            break Some(f);
        }
        if roce_dp::dpdk::signal::stop_requested() {
            break Some(Fail(130, "interrupted".into()));
        }
    };
    if let Some(f) = failure {
        let _ = abort.shutdown(std::net::Shutdown::Both);
        return Err(f);
    }
    let peer = th.join().map_err(|_| err("exchange thread panicked"))?.map_err(err)?;
    let mut validated = 0;
    if p.data_validation && test == TestKind::WriteBw {
        for i in 0..p.num_qps as usize {
            if let Some(at) = first_bad(i, &nic.mem(i)[..size as usize]) {
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
pub(super) fn pingpong<N: Nic>(
    nic: &mut N,
    ex: &mut Exchange<TcpStream>,
    abort: &TcpStream,
    test: TestKind,
    client: bool,
    q: &Local,
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
    let mut recv_posted = 0u64;
    if send {
        while recv_posted < iters.min(16) {
            nic.post_recv(0, recv_posted, 0, size as u32)?;
            recv_posted += 1;
        }
    }
    polling(nic, abort, || ex.start_run(test, first, false))?.map_err(err)?;
    // k: messages we posted; got: the peer's messages that arrived; awaiting: our last post is not timed yet.
    let (mut k, mut got, mut send_out, mut awaiting) = (0u64, 0u64, 0u32, false);
    let mut t0 = Instant::now();
    let mut last_progress = Instant::now();
    let mut cqes = [Cqe::EMPTY; 8];
    let mut spins = 0u64;
    drive(nic, |nic| {
        let n = nic.poll_cq(0, &mut cqes)?;
        let before = got;
        for c in &cqes[..n] {
            if c.status != WcStatus::Success {
                return Err(failed(nic, 0, q, c));
            }
            if c.opcode == WcOpcode::Recv {
                got += 1;
                if recv_posted < iters {
                    nic.post_recv(0, recv_posted, 0, size as u32)?;
                    recv_posted += 1;
                }
            } else {
                send_out -= 1;
            }
        }
        if !send && got < iters && nic.mem(0)[last] == exchange::latency_marker(got) {
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
            nic.mem_mut(0)[size as usize + last] = exchange::latency_marker(k);
            let op = if send { WrOpcode::Send } else { WrOpcode::RdmaWrite };
            let wr = SendWr::new(k, op).remote(r.vaddr, r.rkey);
            nic.post_send(0, &wr, size, size as u32)?;
            t0 = Instant::now();
            send_out += 1;
            k += 1;
            awaiting = true;
        }
        if k == iters && got == iters && send_out == 0 {
            return Ok((false, n > 0));
        }
        spins += 1;
        if spins.is_multiple_of(1024) {
            let now = Instant::now();
            still_there(nic, ex)?;
            if now.duration_since(last_progress) > timeout {
                let s = timeout.as_secs();
                return Err(err(format!("no progress for {s} s ({got}/{iters} messages in, {k} out)")));
            }
        }
        Ok((true, n > 0))
    })
}

#[cfg(test)]
mod tests {
    use super::CqModeration;

    /// The countdown signals exactly the WRs that perftest's `k % cq_mod == cq_mod - 1` does, for every `-Q` from
    /// 0 (taken as 1) to 130 and for the largest, over several rounds.
    #[test]
    fn cq_moderation_signals_every_nth_wr_as_perftest() {
        for q in (0..=130).chain([u32::MAX]) {
            let every = u64::from(q.max(1));
            let mut m = CqModeration::new(q);
            for k in 0..1000u64 {
                assert_eq!(m.next(), k % every == every - 1, "-Q {q}, WR {k}");
            }
        }
    }
}
