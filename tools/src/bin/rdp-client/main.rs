//! rdp-client: an application of `roce_dp::client` (the library that talks to `roce-dpd`). Two processes, each
//! with its own session, PD, buffer, CQ and RC QP, connect their QPs through the daemon(s) and run SEND, WRITE,
//! READ, FETCH_ADD and CMP_SWP with every byte verified.
//!
//! `rdp-client passive --daemon /run/roce-dpd.sock --oob /tmp/x.sock` (start it first) and
//! `rdp-client active --daemon /run/roce-dpd.sock --oob /tmp/x.sock --op all --size 4096 --iters 100` (with
//! `--inline N`, SEND and WRITE payloads are posted inline from a buffer that is not registered and is overwritten
//! right after each post).
//! The active side posts the work; the passive side checks what landed in its buffer, fills what the active side
//! READs and checks the atomics' counter, when told over the out-of-band Unix socket (which also carries the QP
//! numbers, PSNs, GIDs, rkeys and addresses).
//!
//! Output: `CHECK ok|FAIL ...` lines; exit 0 if every check passed, 1 if one failed, 2 with one line on stderr when
//! the setup fails (daemon absent, permission denied, ABI mismatch, ...). `open` only opens the device (and with
//! `--abi-version` claims another shared-memory ABI) to show those errors.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand, ValueEnum};
use roce_dp::client::{Cq, Device, Mr, Pd, Qp, QpInit, Remote};
use roce_dp::{AccessFlags, Cqe, SendWr, WcOpcode, WcStatus, WrOpcode};

#[derive(Parser)]
#[command(name = "rdp-client", version, about = "Verified RDMA between two roce-dpd clients")]
struct Cli {
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand)]
enum Mode {
    /// Open the device and print what the daemon says (or the one-line error).
    Open {
        #[command(flatten)]
        c: Common,
        /// Also print the daemon's counters, one `STAT scope id name value` line each.
        #[arg(long)]
        stats: bool,
    },
    /// The side whose buffer is written, read and counted on; start it first.
    Passive {
        #[command(flatten)]
        c: Common,
    },
    /// The side that posts the work.
    Active {
        #[command(flatten)]
        c: Common,
        /// Operation.
        #[arg(long, value_enum, default_value = "all")]
        op: Op,
        /// Message size (atomics: 8).
        #[arg(long, default_value_t = 4096, value_parser = clap::value_parser!(u32).range(1..=(1 << 20)))]
        size: u32,
        /// Messages per operation.
        #[arg(long, default_value_t = 100, value_parser = roce_dp_tools::whole_arg::<1, { u64::MAX }>)]
        iters: u64,
        /// SEND and WRITE payloads go inline (copied into the send ring at post time from a buffer that is not
        /// registered, and overwritten right after posting); the QP asks for this many inline bytes (>= --size).
        #[arg(long, default_value_t = 0)]
        inline: u32,
    },
}

#[derive(clap::Args)]
struct Common {
    /// The daemon's socket.
    #[arg(long, default_value = "/run/roce-dpd.sock")]
    daemon: PathBuf,
    /// Out-of-band Unix socket between the two clients (the passive side listens).
    #[arg(long)]
    oob: Option<PathBuf>,
    /// Give up after this many seconds without progress (no peer, no answer, no completion), 1 s to a year.
    #[arg(long, default_value_t = 30, value_parser = roce_dp_tools::whole_arg::<1, { roce_dp_tools::MAX_SECONDS }>)]
    timeout: u64,
    /// Bytes of the registered buffer (at least the default: a 1 MiB message slot and the atomics' words). With a
    /// daemon on hugetlbfs backing it is rounded up to 2 MiB pages.
    #[arg(long, default_value_t = BUF_LEN)]
    buffer: usize,
    /// Tests only: claim this shared-memory ABI version when opening the device.
    #[arg(long, hide = true)]
    abi_version: Option<u32>,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum, Debug)]
enum Op {
    Send,
    Write,
    Read,
    Fadd,
    Cswap,
    All,
}

struct Fail(String);

impl<E: std::fmt::Display> From<E> for Fail {
    fn from(e: E) -> Fail {
        Fail(e.to_string())
    }
}

/// Buffer layout: message slot at 0 (up to 1 MiB), the atomics' counter / result words past it.
const ATOMIC_OFF: usize = 1 << 20;
const BUF_LEN: usize = ATOMIC_OFF + 4096;

fn main() -> ExitCode {
    let cli: Cli = match roce_dp_tools::parse_cli("rdp-client") {
        Ok(c) => c,
        Err(code) => return code,
    };
    let r = match &cli.mode {
        Mode::Open { c, stats } => open(c).and_then(|d| {
            let i = d.info();
            println!(
                "rdp-client: roce-dpd pid {} ABI v{} mtu {} mac {} gid {}",
                i.pid,
                i.abi,
                i.mtu,
                roce_dp::wire::MacAddr(i.mac),
                std::net::Ipv6Addr::from(d.gid())
            );
            if *stats {
                for r in d.stats()? {
                    println!("STAT {} {:#x} {} {}", r.scope, r.id, r.name, r.value);
                }
            }
            Ok(true)
        }),
        Mode::Passive { c } => passive(c),
        Mode::Active { c, op, size, iters, inline } => active(c, *op, *size, *iters, *inline),
    };
    match r {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(Fail(msg)) => {
            eprintln!("rdp-client: {msg}");
            ExitCode::from(2)
        }
    }
}

fn check(label: &str, pass: bool, what: impl std::fmt::Display) -> bool {
    println!("CHECK {} {label}: {what}", if pass { "ok  " } else { "FAIL" });
    pass
}

fn open(c: &Common) -> Result<Device, Fail> {
    Ok(match c.abi_version {
        Some(v) => Device::open_as(&c.daemon, v)?,
        None => Device::open(&c.daemon)?,
    })
}

struct Node {
    dev: Device,
    _pd: Pd,
    mr: Mr,
    cq: Cq,
    qp: Qp,
    psn: u32,
    /// `--timeout`: the longest wait for one completion.
    timeout: Duration,
}

fn node(c: &Common, psn: u32, max_inline: u32) -> Result<Node, Fail> {
    let dev = open(c)?;
    let pd = dev.alloc_pd()?;
    let mr = pd.reg_mr(c.buffer.max(BUF_LEN), AccessFlags::ALL)?;
    let cq = dev.create_cq(256)?;
    let qp = dev.create_qp(
        &pd,
        &cq,
        &cq,
        QpInit { sq_depth: 64, rq_depth: 64, max_send_sge: 2, max_recv_sge: 2, max_inline },
    )?;
    qp.to_init(AccessFlags::ALL)?;
    Ok(Node { dev, _pd: pd, mr, cq, qp, psn, timeout: Duration::from_secs(c.timeout) })
}

/// What one side tells the other.
fn my_line(n: &Node) -> String {
    format!("QP {} {} {} {} {}", n.qp.qpn(), n.psn, std::net::Ipv6Addr::from(n.dev.gid()), n.mr.rkey(), n.mr.addr())
}

struct Peer {
    r: Remote,
    rkey: u32,
    addr: u64,
}

fn parse_peer(l: &str) -> Option<Peer> {
    let mut it = l.split_whitespace();
    (it.next()? == "QP").then_some(())?;
    let qpn = it.next()?.parse().ok()?;
    let psn = it.next()?.parse().ok()?;
    let gid: std::net::Ipv6Addr = it.next()?.parse().ok()?;
    let rkey = it.next()?.parse().ok()?;
    let addr = it.next()?.parse().ok()?;
    Some(Peer { r: Remote { qpn, psn, gid: gid.octets(), mac: None }, rkey, addr })
}

/// The longest out-of-band line either side sends is the QP line (under 100 bytes); anything past this is garbage.
const MAX_OOB_LINE: usize = 1024;

/// The out-of-band connection to the other client, which is not trusted: a line is read up to [`MAX_OOB_LINE`]
/// bytes (an endless line would otherwise grow without bound) and within --timeout (no answer would otherwise
/// block for ever).
struct Oob {
    r: BufReader<UnixStream>,
    w: UnixStream,
    timeout: u64,
}

impl Oob {
    fn new(s: UnixStream, timeout: u64) -> Result<Oob, Fail> {
        let t = Some(Duration::from_secs(timeout));
        s.set_read_timeout(t)?;
        s.set_write_timeout(t)?;
        Ok(Oob { r: BufReader::new(s.try_clone()?), w: s, timeout })
    }
    fn io(&self, e: std::io::Error) -> Fail {
        match e.kind() {
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => {
                Fail(format!("out-of-band: the other client sent or took nothing within --timeout {} s", self.timeout))
            }
            _ => Fail(format!("out-of-band: {e}")),
        }
    }
    fn send(&mut self, l: &str) -> Result<(), Fail> {
        writeln!(self.w, "{l}").map_err(|e| self.io(e))
    }
    fn line(&mut self) -> Result<String, Fail> {
        let mut l = Vec::new();
        let limit = MAX_OOB_LINE as u64 + 1;
        let n = (&mut self.r).take(limit).read_until(b'\n', &mut l).map_err(|e| self.io(e))?;
        if n == 0 {
            return Err(Fail("out-of-band: the other client closed the connection".into()));
        }
        if l.last() != Some(&b'\n') && n > MAX_OOB_LINE {
            return Err(Fail(format!("out-of-band: a line longer than {MAX_OOB_LINE} bytes from the other client")));
        }
        let l = String::from_utf8(l).map_err(|_| Fail("out-of-band: a line that is not UTF-8".into()))?;
        Ok(l.trim_end().to_owned())
    }
}

/// The first `len` bytes of the message slot (the buffer is never smaller), for a length the other client named; a
/// clear error if they do not fit.
fn span(len: usize) -> Result<std::ops::Range<usize>, Fail> {
    if len > ATOMIC_OFF {
        return Err(Fail(format!("out-of-band: length {len} is more than the {ATOMIC_OFF}-byte message slot")));
    }
    Ok(0..len)
}

fn oob_path(c: &Common) -> Result<&PathBuf, Fail> {
    c.oob.as_ref().ok_or_else(|| Fail("--oob PATH is needed between the passive and the active side".into()))
}

fn connect(n: &Node, oob: &mut Oob, mtu: u32) -> Result<Peer, Fail> {
    oob.send(&my_line(n))?;
    let l = oob.line()?;
    let p = parse_peer(&l).ok_or_else(|| Fail(format!("out-of-band: bad QP line {l:?}")))?;
    n.qp.to_rtr(&p.r, mtu)?;
    n.qp.to_rts(n.psn)?;
    Ok(p)
}

/// The next completion (or an error after --timeout without one / when the daemon is gone). The wait counts from
/// this call: a run longer than --timeout goes on as long as each completion comes in time.
fn wait(n: &mut Node) -> Result<Cqe, Fail> {
    let mut out = [Cqe::EMPTY; 1];
    let deadline = Instant::now() + n.timeout;
    loop {
        if n.cq.poll(&mut out)? == 1 {
            return Ok(out[0]);
        }
        if Instant::now() > deadline {
            return Err(Fail(format!("no completion within --timeout {} s", n.timeout.as_secs())));
        }
        std::thread::yield_now();
    }
}

fn pattern(k: u64, buf: &mut [u8]) {
    let mut x = k.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in buf {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
}

fn first_diff(k: u64, buf: &[u8]) -> Option<usize> {
    let mut want = vec![0u8; buf.len()];
    pattern(k, &mut want);
    buf.iter().zip(&want).position(|(a, b)| a != b)
}

/// Removes the out-of-band socket this process bound when dropped (every way out of [`passive`]) or at
/// [`now`](Unlink::now), whichever comes first.
struct Unlink<'a>(Option<&'a std::path::Path>);

impl Unlink<'_> {
    fn now(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Unlink<'_> {
    fn drop(&mut self) {
        self.now();
    }
}

fn passive(c: &Common) -> Result<bool, Fail> {
    let path = oob_path(c)?;
    // A socket left by an earlier run is replaced; anything else there is the user's file and stays.
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_socket() => {
            let _ = std::fs::remove_file(path);
        }
        Ok(_) => {
            return Err(Fail(format!(
                "--oob {}: that path exists and is not a socket (give a new path for the out-of-band socket)",
                path.display()
            )))
        }
        Err(_) => {}
    }
    let l = UnixListener::bind(path).map_err(|e| Fail(format!("out-of-band listen on {}: {e}", path.display())))?;
    let mut unlink = Unlink(Some(path));
    let mut n = node(c, 0x2000, 0)?;
    // Wait for the active side at most --timeout (a blocking accept would wait for ever).
    l.set_nonblocking(true)?;
    let until = Instant::now() + Duration::from_secs(c.timeout);
    let s = loop {
        match l.accept() {
            Ok((s, _)) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < until => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                return Err(Fail(format!(
                    "no active side connected to {} within --timeout {} s (run `rdp-client active --oob {}`)",
                    path.display(),
                    c.timeout,
                    path.display()
                )));
            }
            Err(e) => return Err(Fail(format!("out-of-band accept: {e}"))),
        }
    };
    s.set_nonblocking(false)?;
    unlink.now();
    let mut oob = Oob::new(s, c.timeout)?;
    let mtu = n.dev.info().mtu;
    connect(&n, &mut oob, mtu)?;
    let mut ok = true;
    let mut verified = 0u64;
    loop {
        let l = oob.line()?;
        let w: Vec<&str> = l.split_whitespace().collect();
        let num = |i: usize| w.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        match w.first().copied() {
            // The next SEND will be message k of `len` bytes: post a receive for it.
            Some("RECV") => {
                let len = span(num(2) as usize)?.end as u32;
                n.qp.post_recv(num(1), &[n.mr.sge(0, len)])?;
                oob.send("READY")?;
            }
            Some("CHECKRECV") => {
                let (k, len) = (num(1), num(2) as usize);
                let r = span(len)?;
                let cqe = wait(&mut n)?;
                let good = cqe.status == WcStatus::Success && cqe.opcode == WcOpcode::Recv && cqe.wr_id == k;
                let diff = first_diff(k, &n.mr.as_slice()[r]);
                let pass = good && cqe.byte_len as usize == len && diff.is_none();
                verified += if pass { len as u64 } else { 0 };
                oob.send(&format!(
                    "{} {:?} {} diff={diff:?}",
                    if pass { "OK" } else { "BAD" },
                    cqe.status,
                    cqe.byte_len
                ))?;
                ok &= pass;
            }
            Some("CHECK") => {
                let (k, len) = (num(1), num(2) as usize);
                let r = span(len)?;
                let diff = first_diff(k, &n.mr.as_slice()[r]);
                verified += if diff.is_none() { len as u64 } else { 0 };
                oob.send(&format!("{} diff={diff:?}", if diff.is_none() { "OK" } else { "BAD" }))?;
                ok &= diff.is_none();
            }
            Some("FILL") => {
                let (k, len) = (num(1), num(2) as usize);
                let r = span(len)?;
                pattern(k, &mut n.mr.as_mut_slice()[r]);
                oob.send("OK")?;
            }
            Some("SET") => {
                n.mr.as_mut_slice()[ATOMIC_OFF..ATOMIC_OFF + 8].copy_from_slice(&num(1).to_le_bytes());
                oob.send("OK")?;
            }
            Some("COUNTER") => {
                let v = u64::from_le_bytes(n.mr.as_slice()[ATOMIC_OFF..ATOMIC_OFF + 8].try_into().expect("8 bytes"));
                let pass = v == num(1);
                ok &= check("passive counter", pass, format!("{v} (expected {})", num(1)));
                oob.send(if pass { "OK" } else { "BAD" })?;
            }
            Some("DONE") => break,
            _ => return Err(Fail(format!("out-of-band: unexpected {l:?}"))),
        }
    }
    ok &= check("passive", ok, format!("{verified} bytes received and verified"));
    Ok(ok)
}

fn active(c: &Common, op: Op, size: u32, iters: u64, inline: u32) -> Result<bool, Fail> {
    let path = oob_path(c)?;
    // Checked before the passive side is waited for: the daemon refused it only at QP creation.
    if inline > roce_dp::ctrl::abi::MAX_INLINE_DATA {
        let max = roce_dp::ctrl::abi::MAX_INLINE_DATA;
        return Err(Fail(format!("--inline {inline}: more than the {max} bytes a send WQE can carry inline")));
    }
    if inline > 0 && size > inline {
        return Err(Fail(format!("--inline {inline}: --size {size} does not fit (give --inline >= --size)")));
    }
    // The passive side may still be starting: wait for its socket at most --timeout.
    let until = Instant::now() + Duration::from_secs(c.timeout);
    let s = loop {
        match UnixStream::connect(path) {
            Ok(s) => break s,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                return Err(Fail(format!(
                    "no passive side listening on {} within --timeout {} s ({e}): start `rdp-client passive --oob {}` first",
                    path.display(),
                    c.timeout,
                    path.display()
                )))
            }
        }
    };
    let mut oob = Oob::new(s, c.timeout)?;
    let mut n = node(c, 0x1000, inline)?;
    // The inline payload's buffer: plain memory, not a registered region.
    let mut plain = vec![0u8; if inline > 0 { size as usize } else { 0 }];
    let mtu = n.dev.info().mtu;
    let p = connect(&n, &mut oob, mtu)?;
    let ops: Vec<Op> = if op == Op::All { vec![Op::Send, Op::Write, Op::Read, Op::Fadd, Op::Cswap] } else { vec![op] };
    let mut ok = true;
    let len = size as usize;
    for op in ops {
        let t0 = Instant::now();
        let mut verified = 0u64;
        let mut failure: Option<String> = None;
        let mut counter = 0u64;
        if matches!(op, Op::Fadd | Op::Cswap) {
            counter = 1000;
            oob.send(&format!("SET {counter}"))?;
            oob.line()?;
        }
        for k in 0..iters {
            let wr_id = (k << 8) | op as u64;
            let r: Result<(), String> = (|| -> Result<(), Fail> {
                match op {
                    Op::Send => {
                        oob.send(&format!("RECV {wr_id} {len}"))?;
                        oob.line()?;
                        let wr = SendWr::new(wr_id, WrOpcode::Send);
                        if inline > 0 {
                            pattern(wr_id, &mut plain);
                            n.qp.post_send_inline(&wr, &plain)?;
                            plain.fill(0xa5); // copied at post time: reusing the buffer changes nothing
                        } else {
                            pattern(wr_id, &mut n.mr.as_mut_slice()[..len]);
                            n.qp.post_send(&wr, &[n.mr.sge(0, size)])?;
                        }
                        expect(&mut n, wr_id, WcOpcode::Send)?;
                        oob.send(&format!("CHECKRECV {wr_id} {len}"))?;
                        let a = oob.line()?;
                        if !a.starts_with("OK") {
                            return Err(Fail(format!("message {k}: passive says {a}")));
                        }
                    }
                    Op::Write => {
                        let wr = SendWr::new(wr_id, WrOpcode::RdmaWrite).remote(p.addr, p.rkey);
                        if inline > 0 {
                            pattern(wr_id, &mut plain);
                            n.qp.post_send_inline(&wr, &plain)?;
                            plain.fill(0xa5);
                        } else {
                            pattern(wr_id, &mut n.mr.as_mut_slice()[..len]);
                            n.qp.post_send(&wr, &[n.mr.sge(0, size)])?;
                        }
                        expect(&mut n, wr_id, WcOpcode::RdmaWrite)?;
                        oob.send(&format!("CHECK {wr_id} {len}"))?;
                        let a = oob.line()?;
                        if !a.starts_with("OK") {
                            return Err(Fail(format!("message {k}: passive says {a}")));
                        }
                    }
                    Op::Read => {
                        oob.send(&format!("FILL {wr_id} {len}"))?;
                        oob.line()?;
                        n.mr.as_mut_slice()[..len].fill(0);
                        let wr = SendWr::new(wr_id, WrOpcode::RdmaRead).remote(p.addr, p.rkey);
                        n.qp.post_send(&wr, &[n.mr.sge(0, size)])?;
                        expect(&mut n, wr_id, WcOpcode::RdmaRead)?;
                        if let Some(d) = first_diff(wr_id, &n.mr.as_slice()[..len]) {
                            return Err(Fail(format!("message {k}: READ data differs at byte {d}")));
                        }
                    }
                    Op::Fadd | Op::Cswap => {
                        let (opcode, wop) = if op == Op::Fadd {
                            (WrOpcode::AtomicFetchAdd, WcOpcode::FetchAdd)
                        } else {
                            (WrOpcode::AtomicCmpSwp, WcOpcode::CompSwap)
                        };
                        let mut wr = SendWr::new(wr_id, opcode).remote(p.addr + ATOMIC_OFF as u64, p.rkey);
                        let next = if op == Op::Fadd {
                            wr.compare_add = k + 1;
                            counter + k + 1
                        } else {
                            wr.compare_add = counter;
                            wr.swap = counter.wrapping_mul(3).wrapping_add(1);
                            wr.swap
                        };
                        n.mr.as_mut_slice()[ATOMIC_OFF..ATOMIC_OFF + 8].fill(0xee);
                        n.qp.post_send(&wr, &[n.mr.sge(ATOMIC_OFF, 8)])?;
                        expect(&mut n, wr_id, wop)?;
                        let got =
                            u64::from_le_bytes(n.mr.as_slice()[ATOMIC_OFF..ATOMIC_OFF + 8].try_into().expect("8"));
                        if got != counter {
                            return Err(Fail(format!("message {k}: original value {got}, expected {counter}")));
                        }
                        counter = next;
                    }
                    Op::All => unreachable!("expanded above"),
                }
                Ok(())
            })()
            .map_err(|f| f.0);
            if let Err(e) = &r {
                if e.starts_with("roce-dpd on ") {
                    return Err(Fail(e.clone()));
                }
            }
            match r {
                Ok(()) => verified += if matches!(op, Op::Fadd | Op::Cswap) { 8 } else { u64::from(size) },
                Err(e) => {
                    failure = Some(e);
                    break;
                }
            }
        }
        if failure.is_none() && matches!(op, Op::Fadd | Op::Cswap) {
            oob.send(&format!("COUNTER {counter}"))?;
            if oob.line()? != "OK" {
                failure = Some(format!("the passive side's counter is not {counter}"));
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let what = match &failure {
            None => format!(
                "{iters} x {} B, {verified} bytes verified, {:.1} us per op{}",
                if matches!(op, Op::Fadd | Op::Cswap) { 8 } else { size },
                secs * 1e6 / iters as f64,
                if inline > 0 && matches!(op, Op::Send | Op::Write) { " (inline)" } else { "" }
            ),
            Some(e) => e.clone(),
        };
        ok &= check(&format!("{op:?}").to_lowercase(), failure.is_none(), what);
        if failure.is_some() {
            break;
        }
    }
    oob.send("DONE")?;
    Ok(ok)
}

/// The next completion must be `wr_id`'s, successful, of opcode `op`.
fn expect(n: &mut Node, wr_id: u64, op: WcOpcode) -> Result<(), Fail> {
    let c = wait(n)?;
    if c.status == WcStatus::WrFlushErr {
        // The QP went to the error state: if the daemon is stopping, its notice follows the flush; say that.
        let until = Instant::now() + Duration::from_secs(1);
        while Instant::now() < until {
            n.dev.check_alive()?;
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    if c.wr_id != wr_id || c.status != WcStatus::Success || c.opcode != op {
        return Err(Fail(format!(
            "completion {:#x} {:?} {:?}, expected {wr_id:#x} Success {op:?}",
            c.wr_id, c.status, c.opcode
        )));
    }
    Ok(())
}
