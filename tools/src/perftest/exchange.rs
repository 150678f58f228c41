//! perftest 4.5's out-of-band exchange (TCP, port 18515), byte for byte, in both roles.
//!
//! Every step is a fixed-size swap with no framing: the client writes its bytes then reads the peer's; the server
//! reads then writes. The sequence, as captured between two perftest 4.5 peers (exchange version "6.06", see
//! `shared/rxe-peer/README.md` and the pcaps in `shared/vectors/rxe/`):
//!
//! 1. version: 16 bytes, `"6.06"` NUL-padded;
//! 2. cycle buffer, then cache line size: 4 bytes each, big-endian int32; both sides keep the larger;
//! 3. MTU: 2 bytes, the ASCII digit of the `ibv_mtu` enum and a NUL; both sides keep the smaller;
//! 4. 108-byte destination records ([`Dest`]): before the traffic 2q+1 of them for write/read/atomic BW, 2q+2 for
//!    send BW and the latency tests (q = number of QPs; captured with q = 1: 3 and 4), in three calls:
//!    [`Exchange::exchange_dests`], [`Exchange::connected`] (once the QPs are at RTS) and [`Exchange::start_run`]
//!    (right before the traffic of each message size);
//! 5. after each size [`Exchange::end_run`] (reports with `-b`, a barrier between `-a` sizes), then the
//!    teardown, which depends on the test ([`Exchange::finish`]): BW reports as five separate 8-byte swaps, a
//!    record, and `"done\0"` written by each side.
//!
//! The functions here block on an `impl Read + Write`; the caller sets the socket's read/write timeouts
//! ([`connect`] and [`accept`] do), and a timeout, a closed connection or malformed bytes from the peer end the
//! exchange with one [`ExchangeError`] line. Nothing here panics on what the peer sends.

use std::fmt;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// The exchange version we speak (perftest 4.5-0.x prints and sends "6.06").
pub const VERSION: &str = "6.06";
/// Peer versions whose exchange is known to be byte-identical to ours. Newer perftest (HEAD) sends fewer
/// records before the traffic and adds a parameter negotiation, so it is refused rather than half-understood.
pub const COMPATIBLE_VERSIONS: &[&str] = &[VERSION];
/// Size of the version message.
pub const VERSION_LEN: usize = 16;
/// Size of a destination record with a GID (perftest's `KEY_MSG_SIZE_GID`), trailing NUL included.
pub const DEST_LEN: usize = 108;
/// Size of the BW report exchanged by write/read/atomic BW: size, iterations, peak, average, message rate.
pub const REPORT_LEN: usize = 40;
/// The last message of each side (written, never read: perftest closes right after writing it).
pub const DONE: &[u8; 5] = b"done\0";
/// perftest's default TCP port.
pub const DEFAULT_PORT: u16 = 18515;
/// Default timeout for every read and write of the exchange.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// Which side of the exchange we are: the client is the one given a host name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Connects; writes first in every step.
    Client,
    /// Listens; reads first in every step.
    Server,
}

/// The eight perftest tests.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TestKind {
    /// ib_send_bw
    SendBw,
    /// ib_write_bw
    WriteBw,
    /// ib_read_bw
    ReadBw,
    /// ib_atomic_bw
    AtomicBw,
    /// ib_send_lat
    SendLat,
    /// ib_write_lat
    WriteLat,
    /// ib_read_lat
    ReadLat,
    /// ib_atomic_lat
    AtomicLat,
}

/// The operation a test measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verb {
    /// SEND / RECV.
    Send,
    /// RDMA WRITE.
    Write,
    /// RDMA READ.
    Read,
    /// FETCH_AND_ADD or CMP_AND_SWAP.
    Atomic,
}

impl TestKind {
    /// All eight, in the order of the issue.
    pub const ALL: [TestKind; 8] = [
        TestKind::SendBw,
        TestKind::WriteBw,
        TestKind::ReadBw,
        TestKind::AtomicBw,
        TestKind::SendLat,
        TestKind::WriteLat,
        TestKind::ReadLat,
        TestKind::AtomicLat,
    ];

    /// The operation measured.
    pub fn verb(self) -> Verb {
        match self {
            TestKind::SendBw | TestKind::SendLat => Verb::Send,
            TestKind::WriteBw | TestKind::WriteLat => Verb::Write,
            TestKind::ReadBw | TestKind::ReadLat => Verb::Read,
            TestKind::AtomicBw | TestKind::AtomicLat => Verb::Atomic,
        }
    }

    /// True for the bandwidth tests.
    pub fn is_bw(self) -> bool {
        matches!(self, TestKind::SendBw | TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw)
    }

    /// Our binary's name, e.g. `rdp_write_bw`.
    pub fn tool_name(self) -> &'static str {
        match self {
            TestKind::SendBw => "rdp_send_bw",
            TestKind::WriteBw => "rdp_write_bw",
            TestKind::ReadBw => "rdp_read_bw",
            TestKind::AtomicBw => "rdp_atomic_bw",
            TestKind::SendLat => "rdp_send_lat",
            TestKind::WriteLat => "rdp_write_lat",
            TestKind::ReadLat => "rdp_read_lat",
            TestKind::AtomicLat => "rdp_atomic_lat",
        }
    }

    /// send_lat / write_lat: whether the client posts the first message (perftest 4.5: send_lat's client; in
    /// write_lat the server writes first and its client waits for that write). The other side answers each one.
    pub fn client_posts_first(self) -> bool {
        self != TestKind::WriteLat
    }

    /// Destination records exchanged before the traffic starts, with `num_qps` QPs (non-duplex; `-b` adds one
    /// for write/read/atomic BW). Captured with one QP: 3 for write/read/atomic BW, 4 for the others.
    pub fn records_before_traffic(self, num_qps: usize, duplex: bool) -> usize {
        let extra = match self {
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw => usize::from(duplex),
            _ => 1,
        };
        2 * num_qps + 1 + extra
    }
}

/// One side's QP description, as perftest's 108-byte record carries it (`struct pingpong_dest` with a GID).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Dest {
    /// InfiniBand LID (0 on RoCE).
    pub lid: u16,
    /// Outstanding RDMA READ/atomic requests this side accepts (perftest sends 1 for send/write tests).
    pub out_reads: u16,
    /// Queue pair number (24 bits).
    pub qpn: u32,
    /// First PSN this side sends (24 bits).
    pub psn: u32,
    /// Remote key of the test buffer (0 in send tests).
    pub rkey: u32,
    /// Address of the test buffer.
    pub vaddr: u64,
    /// The RoCE GID (for RoCEv2 over IPv4, `::ffff:a.b.c.d`).
    pub gid: [u8; 16],
    /// Shared receive queue number (0 without SRQ).
    pub srqn: u32,
}

impl Dest {
    /// The 108-byte record: `%04x:%04x:%06x:%06x:%08x:%016llx:` + 16 × `%02x:` + `%08x:` + NUL.
    /// Fails if the QPN or PSN does not fit 24 bits (the record has six hex digits for each).
    pub fn encode(&self) -> Result<[u8; DEST_LEN], ExchangeError> {
        for (name, v) in [("QPN", self.qpn), ("PSN", self.psn)] {
            if v > 0xff_ffff {
                return Err(ExchangeError::Local(format!("{name} {v:#x} does not fit 24 bits")));
            }
        }
        let mut s = format!(
            "{:04x}:{:04x}:{:06x}:{:06x}:{:08x}:{:016x}:",
            self.lid, self.out_reads, self.qpn, self.psn, self.rkey, self.vaddr
        );
        for b in self.gid {
            s.push_str(&format!("{b:02x}:"));
        }
        s.push_str(&format!("{:08x}:", self.srqn));
        let mut out = [0u8; DEST_LEN];
        // Always 107 characters given the widths above; the last byte stays NUL.
        out[..s.len()].copy_from_slice(s.as_bytes());
        Ok(out)
    }

    /// Parses a 108-byte record. Every field must have exactly its width in hex digits, every separator must be
    /// there, and the record must end with the NUL; anything else is an error naming the field.
    pub fn decode(buf: &[u8]) -> Result<Dest, String> {
        if buf.len() != DEST_LEN {
            return Err(format!("record is {} bytes, expected {DEST_LEN}", buf.len()));
        }
        if buf[DEST_LEN - 1] != 0 {
            return Err("record does not end with NUL".into());
        }
        let mut pos = 0;
        let mut field = |name: &str, width: usize| -> Result<u64, String> {
            let digits = &buf[pos..pos + width];
            if buf[pos + width] != b':' {
                return Err(format!("no ':' after {name} at byte {}", pos + width));
            }
            let text = std::str::from_utf8(digits).map_err(|_| format!("{name} is not ASCII"))?;
            if !text.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(format!("{name} {text:?} is not {width} hex digits"));
            }
            pos += width + 1;
            u64::from_str_radix(text, 16).map_err(|e| format!("{name}: {e}"))
        };
        // The widths bound every value to its type, so the narrowing below cannot lose bits.
        let lid = field("LID", 4)? as u16;
        let out_reads = field("OUT_READS", 4)? as u16;
        let qpn = field("QPN", 6)? as u32;
        let psn = field("PSN", 6)? as u32;
        let rkey = field("RKEY", 8)? as u32;
        let vaddr = field("VADDR", 16)?;
        let mut gid = [0u8; 16];
        for (i, g) in gid.iter_mut().enumerate() {
            *g = field(&format!("GID[{i}]"), 2)? as u8;
        }
        let srqn = field("SRQN", 8)? as u32;
        debug_assert_eq!(pos, DEST_LEN - 1);
        Ok(Dest { lid, out_reads, qpn, psn, rkey, vaddr, gid, srqn })
    }
}

/// perftest's GID check before connecting: both GIDs IPv4-mapped (RoCEv2 over IPv4) or neither.
pub fn check_gid_compatibility(local: &Dest, remote: &Dest) -> Result<(), ExchangeError> {
    let v4 = |d: &Dest| d.gid[..10].iter().all(|&b| b == 0) && d.gid[10..12] == [0xff, 0xff];
    if v4(local) == v4(remote) {
        return Ok(());
    }
    let kind = |d: &Dest| if v4(d) { "IPv4-mapped" } else { "IPv6" };
    Err(ExchangeError::Malformed {
        step: "QP record",
        why: format!("GID types differ (ours {}, the peer's {}): use the same IP version", kind(local), kind(remote)),
    })
}

/// What a peer's QP record must name for our QPs to connect to it (perftest checks none of it; a broken or hostile
/// peer's record is refused here in one line instead of QPs sent towards nowhere until their retries run out):
/// not QP 0 or 1 (the InfiniBand management QPs, never an RC QP), and a GID that is a unicast address: not
/// unspecified, multicast, broadcast or loopback, IPv4-mapped or IPv6.
pub fn check_peer_record(d: &Dest) -> Result<(), ExchangeError> {
    let bad = |why: String| Err(ExchangeError::Malformed { step: "QP record", why });
    if d.qpn <= 1 {
        return bad(format!("QPN {:#x} is a management QP (QP0/QP1), not an RC QP", d.qpn));
    }
    let gid = std::net::Ipv6Addr::from(d.gid);
    match roce_dp::wire::gid_not_unicast(d.gid) {
        Some(why) => bad(format!("GID {gid} is {why}, not the address of a RoCE port")),
        None => Ok(()),
    }
}

/// The most outstanding READ/atomic requests a QP takes each way (the engine's limit, and Linux rxe's
/// `RXE_MAX_QP_RD_ATOM`).
pub const MAX_OUT_READS: u8 = 128;

/// A QP's READ/atomic depths as perftest sets them (`ctx_modify_qp_to_rtr`/`_rts`), in read and atomic tests:
/// (initiator depth, responder resources) = (the peer's announced `out_reads`, ours); each side announces its
/// `-o` (or the default) and accepts that many, and issues no more than the peer accepts. Other tests issue no
/// READ or atomic: 16 each way.
pub fn rd_atomic_depths(test: TestKind, ours: u8, peer: &Dest) -> (u8, u8) {
    match test.verb() {
        Verb::Read | Verb::Atomic => {
            (peer.out_reads.clamp(1, u16::from(MAX_OUT_READS)) as u8, ours.clamp(1, MAX_OUT_READS))
        }
        Verb::Send | Verb::Write => (16, 16),
    }
}

/// In a read or atomic test, a peer whose records accept no outstanding READ/atomic request (OUT 0) cannot be
/// read from: one line, before any QP is connected (perftest would move the QP to RTS with an initiator depth of
/// 0 and wait for ever).
pub fn check_peer_depth(test: TestKind, remote: &[Dest]) -> Result<(), ExchangeError> {
    if !matches!(test.verb(), Verb::Read | Verb::Atomic) {
        return Ok(());
    }
    match remote.iter().find(|d| d.out_reads == 0) {
        Some(d) => Err(ExchangeError::Malformed {
            step: "QP record",
            why: format!("QP {:#x} accepts no outstanding READ/atomic request (OUT 0)", d.qpn),
        }),
        None => Ok(()),
    }
}

/// `ibv_mtu`: the path MTU as perftest exchanges it (an enum value 1..=5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mtu {
    /// 256 bytes (enum 1).
    Mtu256 = 1,
    /// 512 bytes (enum 2).
    Mtu512 = 2,
    /// 1024 bytes (enum 3).
    Mtu1024 = 3,
    /// 2048 bytes (enum 4).
    Mtu2048 = 4,
    /// 4096 bytes (enum 5).
    Mtu4096 = 5,
}

impl Mtu {
    /// From a size in bytes (256, 512, 1024, 2048 or 4096).
    pub fn from_bytes(bytes: u32) -> Option<Mtu> {
        Some(match bytes {
            256 => Mtu::Mtu256,
            512 => Mtu::Mtu512,
            1024 => Mtu::Mtu1024,
            2048 => Mtu::Mtu2048,
            4096 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// From the `ibv_mtu` enum value.
    pub fn from_enum(v: u8) -> Option<Mtu> {
        Some(match v {
            1 => Mtu::Mtu256,
            2 => Mtu::Mtu512,
            3 => Mtu::Mtu1024,
            4 => Mtu::Mtu2048,
            5 => Mtu::Mtu4096,
            _ => return None,
        })
    }

    /// Size in bytes.
    pub fn bytes(self) -> u32 {
        128 << (self as u32)
    }
}

/// The system data both sides agree on (both keep the larger value).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SysData {
    /// Buffer alignment (perftest: the page size, 4096).
    pub cycle_buffer: u32,
    /// Cache line size (64).
    pub cache_line: u32,
}

impl Default for SysData {
    fn default() -> Self {
        SysData { cycle_buffer: 4096, cache_line: 64 }
    }
}

/// The last byte of write_lat message `k` (from 0), which the receiver polls for, as perftest 4.5 writes it: the
/// message's number counted from 1, as a byte (message 255 ends in 0). A peer writes a message to the address in
/// our QP record as given.
pub fn latency_marker(k: u64) -> u8 {
    (k + 1) as u8
}

/// The largest cycle buffer [`SysData::region_len`] makes room for (perftest uses the page size: 4 KiB, 64 KiB).
pub const MAX_WALKED_CYCLE: u64 = 1 << 20;

impl SysData {
    /// Bytes a QP's registered region needs so that a perftest peer's accesses stay inside it: `slots` messages of
    /// `size` (receive slots of a send server), and at least what a perftest 4.5 BW client walks through. For
    /// messages of at most half the cycle buffer, perftest moves its remote address by the size rounded up to the
    /// cache line after every post and wraps once it reaches the base plus the cycle buffer, so it touches up to
    /// `cycle_buffer + size` bytes of ours (a 64 B write_bw/read_bw against a 64 B region ended in a remote access
    /// error at Linux rxe's client). The peer's cycle buffer counts up to [`MAX_WALKED_CYCLE`] only: a peer that
    /// claims more cannot make us allocate it (its accesses beyond are refused by the responder's rkey checks).
    pub fn region_len(&self, size: u64, slots: u64) -> u64 {
        let cycle = u64::from(self.cycle_buffer).min(MAX_WALKED_CYCLE);
        let walked = if size <= cycle / 2 { cycle + size } else { size };
        (slots.max(1) * size).max(walked).max(8)
    }
}

/// What a BW test reports to its peer: perftest's `struct bw_report_data` fields, in this order on the wire,
/// each 8 bytes big-endian (the doubles as their IEEE-754 bits), each swapped on its own.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct BwReport {
    /// Message size in bytes.
    pub size: u64,
    /// Iterations.
    pub iters: u64,
    /// Peak bandwidth, MiB/s (perftest sends the MB/s figure it prints, 2^20-based).
    pub bw_peak: f64,
    /// Average bandwidth, MiB/s.
    pub bw_avg: f64,
    /// Message rate, Mpps.
    pub msg_rate: f64,
}

impl BwReport {
    /// The 40 bytes on the wire.
    pub fn encode(&self) -> [u8; REPORT_LEN] {
        let mut out = [0u8; REPORT_LEN];
        let words = [self.size, self.iters, self.bw_peak.to_bits(), self.bw_avg.to_bits(), self.msg_rate.to_bits()];
        for (chunk, w) in out.chunks_exact_mut(8).zip(words) {
            chunk.copy_from_slice(&w.to_be_bytes());
        }
        out
    }

    /// From the 40 bytes on the wire (any bit pattern is accepted: perftest's server sends uninitialised memory).
    pub fn decode(buf: &[u8; REPORT_LEN]) -> BwReport {
        let w = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&buf[i * 8..i * 8 + 8]);
            u64::from_be_bytes(b)
        };
        BwReport {
            size: w(0),
            iters: w(1),
            bw_peak: f64::from_bits(w(2)),
            bw_avg: f64::from_bits(w(3)),
            msg_rate: f64::from_bits(w(4)),
        }
    }
}

/// Why the exchange failed: one line, suitable as the tool's last word.
#[derive(Debug)]
pub enum ExchangeError {
    /// Could not reach the server.
    Connect {
        /// host:port as given.
        addr: String,
        /// The socket error.
        err: io::Error,
    },
    /// Could not listen or accept.
    Listen {
        /// The port.
        port: u16,
        /// The socket error, or a timeout.
        err: io::Error,
    },
    /// The peer sent nothing for the whole timeout.
    Timeout {
        /// The step we were waiting for.
        step: &'static str,
        /// The timeout.
        after: Duration,
    },
    /// The peer sent part of a message and not the rest within the timeout (a byte now and then).
    Slow {
        /// The step we were waiting for.
        step: &'static str,
        /// Bytes of the message that came.
        got: usize,
        /// Bytes of the message.
        want: usize,
        /// The timeout.
        after: Duration,
    },
    /// The peer closed (or reset) the connection.
    PeerClosed {
        /// The step we were in.
        step: &'static str,
    },
    /// Another socket error.
    Io {
        /// The step we were in.
        step: &'static str,
        /// The error.
        err: io::Error,
    },
    /// The peer speaks another perftest exchange version.
    Version {
        /// The peer's version string.
        theirs: String,
    },
    /// `-m` forced an MTU the peer cannot use.
    Mtu {
        /// Our forced MTU.
        forced: Mtu,
        /// The peer's MTU.
        peer: Mtu,
    },
    /// The peer sent bytes that do not parse.
    Malformed {
        /// The step.
        step: &'static str,
        /// What is wrong.
        why: String,
    },
    /// Our own input cannot be sent (e.g. a QPN above 24 bits).
    Local(String),
}

impl fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // perftest's "Couldn't connect to HOST:PORT", and what to do: a refusal means nothing listens there.
            ExchangeError::Connect { addr, err } if err.kind() == io::ErrorKind::ConnectionRefused => write!(
                f,
                "couldn't connect to {addr}: {err}: no server listens there; start the server first (the same \
                 command without the host argument), or give its port with -p"
            ),
            ExchangeError::Connect { addr, err } => write!(f, "couldn't connect to {addr}: {err}"),
            ExchangeError::Listen { port, err } => write!(f, "couldn't listen for a client on TCP port {port}: {err}"),
            ExchangeError::Timeout { step, after } => {
                write!(f, "peer sent nothing for {:.1} s during the {step} exchange", after.as_secs_f64())
            }
            ExchangeError::Slow { step, got, want, after } => write!(
                f,
                "peer sent only {got} of the {want} bytes of its {step} message in {:.1} s",
                after.as_secs_f64()
            ),
            ExchangeError::PeerClosed { step } => {
                write!(f, "peer closed the connection during the {step} exchange (did it exit?)")
            }
            ExchangeError::Io { step, err } => write!(f, "socket error during the {step} exchange: {err}"),
            ExchangeError::Version { theirs } => write!(
                f,
                "peer speaks perftest exchange version {theirs:?}, we speak {VERSION:?} (perftest 4.5); \
                 only {COMPATIBLE_VERSIONS:?} are compatible"
            ),
            ExchangeError::Mtu { forced, peer } => {
                write!(f, "MTU mismatch: -m {} was requested but the peer's MTU is {}", forced.bytes(), peer.bytes())
            }
            ExchangeError::Malformed { step, why } => write!(f, "peer sent a malformed {step} message: {why}"),
            ExchangeError::Local(why) => write!(f, "cannot send our parameters: {why}"),
        }
    }
}

impl std::error::Error for ExchangeError {}

fn io_error(step: &'static str, err: io::Error, timeout: Duration) -> ExchangeError {
    match err.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => ExchangeError::Timeout { step, after: timeout },
        ErrorKind::UnexpectedEof
        | ErrorKind::ConnectionReset
        | ErrorKind::ConnectionAborted
        | ErrorKind::BrokenPipe => ExchangeError::PeerClosed { step },
        _ => ExchangeError::Io { step, err },
    }
}

/// What `setup` settled with the peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// The peer's version string.
    pub peer_version: String,
    /// max of both sides.
    pub sys: SysData,
    /// min of both sides.
    pub mtu: Mtu,
}

/// One side of the exchange over a connected stream.
pub struct Exchange<S> {
    stream: S,
    role: Role,
    /// The timeout the caller set on the stream: also the most one message of the peer may take to arrive whole
    /// (`Duration::MAX`: none).
    timeout: Duration,
    /// The TCP socket under `stream` (a clone, [`Exchange::tcp`]): its read timeout is cut to what is left of a
    /// message's deadline before each read, so that a peer trickling a message in ends the step on time.
    deadline_socket: Option<TcpStream>,
}

impl<S: Read + Write> Exchange<S> {
    /// Wraps a connected stream. `timeout` is the read/write timeout the caller set on it (used in messages).
    pub fn new(stream: S, role: Role, timeout: Duration) -> Self {
        Exchange { stream, role, timeout, deadline_socket: None }
    }

    /// Our role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The underlying stream.
    pub fn into_inner(self) -> S {
        self.stream
    }

    fn write_all(&mut self, step: &'static str, mine: &[u8]) -> Result<(), ExchangeError> {
        self.stream.write_all(mine).and_then(|()| self.stream.flush()).map_err(|e| io_error(step, e, self.timeout))
    }

    /// Reads one message of the peer. The whole message must arrive within the timeout, not each byte: a peer
    /// that sends a byte now and then (a broken or hostile one) ends the step when the timeout has passed since
    /// the message began, as a silent one does (over TCP to the millisecond; over another stream, whose read
    /// timeout this cannot shorten, by the end of the read that passes it).
    fn read_exact(&mut self, step: &'static str, theirs: &mut [u8]) -> Result<(), ExchangeError> {
        let deadline = Instant::now().checked_add(self.timeout);
        let want = theirs.len();
        let (timeout, mut got) = (self.timeout, 0);
        let late = |got| match got {
            0 => ExchangeError::Timeout { step, after: timeout },
            _ => ExchangeError::Slow { step, got, want, after: timeout },
        };
        while got < want {
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(late(got));
                }
                if let Some(sock) = &self.deadline_socket {
                    sock.set_read_timeout(Some(left)).map_err(|err| ExchangeError::Io { step, err })?;
                }
            }
            match self.stream.read(&mut theirs[got..]) {
                Ok(0) => return Err(ExchangeError::PeerClosed { step }),
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => return Err(late(got)),
                Err(e) => return Err(io_error(step, e, timeout)),
            }
        }
        Ok(())
    }

    /// One fixed-size swap: the client writes then reads, the server reads then writes.
    fn swap(&mut self, step: &'static str, mine: &[u8], theirs: &mut [u8]) -> Result<(), ExchangeError> {
        match self.role {
            Role::Client => {
                self.write_all(step, mine)?;
                self.read_exact(step, theirs)
            }
            Role::Server => {
                self.read_exact(step, theirs)?;
                self.write_all(step, mine)
            }
        }
    }

    /// Step 1: swaps version strings; an incompatible peer is an error (after the swap, so the peer sees ours).
    pub fn exchange_versions(&mut self) -> Result<String, ExchangeError> {
        let mut mine = [0u8; VERSION_LEN];
        mine[..VERSION.len()].copy_from_slice(VERSION.as_bytes());
        let mut theirs = [0u8; VERSION_LEN];
        self.swap("version", &mine, &mut theirs)?;
        let end = theirs
            .iter()
            .position(|&b| b == 0)
            .ok_or_else(|| ExchangeError::Malformed { step: "version", why: "no NUL in the 16 bytes".into() })?;
        let text = &theirs[..end];
        if text.is_empty() || !text.iter().all(|c| c.is_ascii_graphic()) {
            return Err(ExchangeError::Malformed {
                step: "version",
                why: format!("not a version string: {:02x?}", &theirs[..]),
            });
        }
        let theirs = String::from_utf8_lossy(text).into_owned();
        if !COMPATIBLE_VERSIONS.contains(&theirs.as_str()) {
            return Err(ExchangeError::Version { theirs });
        }
        Ok(theirs)
    }

    fn swap_i32(&mut self, step: &'static str, mine: u32) -> Result<u32, ExchangeError> {
        let mine = i32::try_from(mine).map_err(|_| ExchangeError::Local(format!("{step} {mine} exceeds i32")))?;
        let mut theirs = [0u8; 4];
        self.swap(step, &mine.to_be_bytes(), &mut theirs)?;
        let v = i32::from_be_bytes(theirs);
        u32::try_from(v)
            .ok()
            .filter(|&v| v > 0)
            .ok_or_else(|| ExchangeError::Malformed { step, why: format!("{v} is not a positive size") })
    }

    /// Step 2: cycle buffer then cache line size; both sides keep the larger of each.
    pub fn exchange_sys_data(&mut self, local: SysData) -> Result<SysData, ExchangeError> {
        let cycle = self.swap_i32("cycle buffer", local.cycle_buffer)?;
        let line = self.swap_i32("cache line", local.cache_line)?;
        Ok(SysData { cycle_buffer: cycle.max(local.cycle_buffer), cache_line: line.max(local.cache_line) })
    }

    /// Step 3: MTU; both keep the smaller. If `forced` (the user gave `-m`) and the peer's is smaller: error.
    pub fn exchange_mtu(&mut self, local: Mtu, forced: bool) -> Result<Mtu, ExchangeError> {
        let mine = [b'0' + local as u8, 0];
        let mut theirs = [0u8; 2];
        self.swap("MTU", &mine, &mut theirs)?;
        let peer = match theirs {
            [d @ b'1'..=b'5', 0] => Mtu::from_enum(d - b'0'),
            _ => None,
        }
        .ok_or_else(|| ExchangeError::Malformed {
            step: "MTU",
            why: format!("expected an ibv_mtu digit 1-5 and NUL, got {theirs:02x?}"),
        })?;
        if forced && peer < local {
            return Err(ExchangeError::Mtu { forced: local, peer });
        }
        Ok(local.min(peer))
    }

    /// Steps 1-3.
    pub fn setup(&mut self, sys: SysData, mtu: Mtu, mtu_forced: bool) -> Result<Negotiated, ExchangeError> {
        let peer_version = self.exchange_versions()?;
        let sys = self.exchange_sys_data(sys)?;
        let mtu = self.exchange_mtu(mtu, mtu_forced)?;
        Ok(Negotiated { peer_version, sys, mtu })
    }

    /// One destination record each way (perftest's `ctx_hand_shake`).
    pub fn hand_shake(&mut self, mine: &Dest) -> Result<Dest, ExchangeError> {
        let out = mine.encode()?;
        let mut theirs = [0u8; DEST_LEN];
        self.swap("QP record", &out, &mut theirs)?;
        Dest::decode(&theirs).map_err(|why| ExchangeError::Malformed { step: "QP record", why })
    }

    /// The records that carry the QPs' parameters: one per QP, then (send BW only) one more, then one per QP
    /// again. Returns the peer's QPs as the second round carried them ([`check_peer_record`]: each names an RC QP
    /// and a unicast GID); the caller then moves its QPs to RTR/RTS.
    pub fn exchange_dests(&mut self, test: TestKind, mine: &[Dest]) -> Result<Vec<Dest>, ExchangeError> {
        let first = mine.first().ok_or_else(|| ExchangeError::Local("no QP to describe".into()))?;
        for d in mine {
            self.hand_shake(d)?;
        }
        if test == TestKind::SendBw {
            self.hand_shake(first)?;
        }
        let theirs = mine.iter().map(|d| self.hand_shake(d)).collect::<Result<Vec<Dest>, _>>()?;
        theirs.iter().try_for_each(check_peer_record)?;
        Ok(theirs)
    }

    /// The barrier(s) once our QPs are at RTR/RTS: one for write/read/atomic BW and send latency, two for the
    /// other latency tests, none for send BW (its post-connect record is inside [`Exchange::exchange_dests`]).
    pub fn connected(&mut self, test: TestKind, first: &Dest) -> Result<(), ExchangeError> {
        let n = match test {
            TestKind::SendBw => 0,
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw | TestKind::SendLat => 1,
            TestKind::WriteLat | TestKind::ReadLat | TestKind::AtomicLat => 2,
        };
        for _ in 0..n {
            self.hand_shake(first)?;
        }
        Ok(())
    }

    /// The barrier right before the traffic of one run (one message size): send BW and send latency sync here,
    /// once the receives of the size are posted (ib_send_lat -a: one record before every size, captured);
    /// write/read/atomic BW only with `-b`; the other latency tests never (-a runs their sizes back to back).
    pub fn start_run(&mut self, test: TestKind, first: &Dest, duplex: bool) -> Result<(), ExchangeError> {
        let sync = match test {
            TestKind::SendBw | TestKind::SendLat => true,
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw => duplex,
            _ => false,
        };
        if sync {
            self.hand_shake(first)?;
        }
        Ok(())
    }

    /// [`Exchange::connected`] then [`Exchange::start_run`]: everything between the QP records and the traffic
    /// of a single-size run.
    pub fn ready(&mut self, test: TestKind, first: &Dest, duplex: bool) -> Result<(), ExchangeError> {
        self.connected(test, first)?;
        self.start_run(test, first, duplex)
    }

    /// After the traffic of one run: with `-b` the BW reports are swapped (returns the peer's); with `-a`
    /// (`all`) send BW, and duplex write/read/atomic BW, sync once more before the next size. Nothing for the
    /// latency tests. The `-a`, `-b` and `-D` sequences are as captured between two perftest 4.5 peers
    /// (tools/tests/vectors/perftest-4.5/).
    pub fn end_run(
        &mut self,
        test: TestKind,
        first: &Dest,
        report: &BwReport,
        duplex: bool,
        all: bool,
    ) -> Result<Option<BwReport>, ExchangeError> {
        match test {
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw if duplex => {
                if all {
                    self.hand_shake(first)?;
                }
                self.exchange_bw_reports(report).map(Some)
            }
            TestKind::SendBw => {
                let peer = if duplex { Some(self.exchange_bw_reports(report)?) } else { None };
                if all {
                    self.hand_shake(first)?;
                }
                Ok(peer)
            }
            _ => Ok(None),
        }
    }

    /// Swaps BW reports (write/read/atomic BW, and duplex runs) and returns the peer's. Each 8-byte field is a
    /// swap of its own (as captured: the server answers every field before the client sends the next), so a
    /// server that read all 40 bytes first would deadlock against perftest.
    pub fn exchange_bw_reports(&mut self, mine: &BwReport) -> Result<BwReport, ExchangeError> {
        let mine = mine.encode();
        let mut theirs = [0u8; REPORT_LEN];
        for (m, t) in mine.chunks_exact(8).zip(theirs.chunks_exact_mut(8)) {
            self.swap("BW report", m, t)?;
        }
        Ok(BwReport::decode(&theirs))
    }

    /// The teardown after the last run; consumes the exchange and closes the connection.
    ///
    /// * write/read/atomic BW without `-b`: a record, the reports, a record, `"done\0"`;
    /// * the other BW runs, and send/read/atomic latency: a record, `"done\0"`;
    /// * write latency: nothing.
    ///
    /// The write/read/atomic BW server waits here for the whole of the client's run (set a long enough
    /// timeout). `report` is ours (a server that measured nothing sends zeros; perftest's sends garbage).
    /// Returns the peer's report when reports are swapped here: the write/read/atomic BW server prints the
    /// client's.
    pub fn finish(
        mut self,
        test: TestKind,
        first: &Dest,
        report: &BwReport,
        duplex: bool,
    ) -> Result<Option<BwReport>, ExchangeError> {
        let mut peer = None;
        match test {
            TestKind::WriteBw | TestKind::ReadBw | TestKind::AtomicBw if !duplex => {
                self.hand_shake(first)?;
                peer = Some(self.exchange_bw_reports(report)?);
            }
            TestKind::WriteLat => return Ok(None),
            _ => {}
        }
        self.hand_shake(first)?;
        // perftest writes "done" and closes without reading the peer's; so do we. By now everything has been
        // exchanged, and the peer may already have closed (perftest does right after its own "done"), so a
        // refused write is not a failure.
        match self.write_all("done", DONE) {
            Ok(()) | Err(ExchangeError::PeerClosed { .. }) => Ok(peer),
            Err(e) => Err(e),
        }
    }
}

impl Exchange<TcpStream> {
    /// [`Exchange::new`] on a TCP connection, with each of the peer's messages held to the timeout to the
    /// millisecond (the socket's read timeout is cut to what is left of it before each read).
    pub fn tcp(stream: TcpStream, role: Role, timeout: Duration) -> Self {
        let deadline_socket = stream.try_clone().ok();
        Exchange { stream, role, timeout, deadline_socket }
    }

    /// Changes the read/write timeout of the connection (e.g. for the server's wait through the client's run,
    /// which lasts as long as the test; `None` waits forever, as perftest).
    pub fn set_timeout(&mut self, timeout: Option<Duration>) -> Result<(), ExchangeError> {
        let t = timeout.filter(|t| !t.is_zero());
        let io = |err| ExchangeError::Io { step: "setup", err };
        self.stream.set_read_timeout(t).map_err(io)?;
        self.stream.set_write_timeout(t).map_err(io)?;
        self.timeout = t.unwrap_or(Duration::MAX);
        Ok(())
    }

    /// True if the peer has closed or reset the connection, without blocking: for a side that runs traffic
    /// while the exchange is idle, so that a peer that exits mid-run ends the run instead of a wait for ACKs.
    /// Pending bytes (the peer already in the teardown) are left unread and count as alive.
    pub fn peer_gone(&self) -> bool {
        self.peer_activity() == PeerActivity::Gone
    }

    /// What the peer did on the idle connection, without blocking or reading: nothing, sent bytes (it moved on
    /// to the next step of the exchange, e.g. a receiving side learns that the sender's timed run is over), or
    /// closed it.
    pub fn peer_activity(&self) -> PeerActivity {
        if self.stream.set_nonblocking(true).is_err() {
            return PeerActivity::Gone;
        }
        let a = match self.stream.peek(&mut [0u8; 1]) {
            Ok(0) => PeerActivity::Gone,
            Ok(_) => PeerActivity::Sent,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => PeerActivity::Quiet,
            Err(_) => PeerActivity::Gone,
        };
        if self.stream.set_nonblocking(false).is_err() {
            return PeerActivity::Gone;
        }
        a
    }
}

/// See [`Exchange::peer_activity`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerActivity {
    /// Nothing to read, connection open.
    Quiet,
    /// Bytes are waiting to be read.
    Sent,
    /// Closed or reset.
    Gone,
}

/// Connects to the server's management address, retrying while it refuses until `retry` has passed (the
/// server may start a moment later), and sets `timeout` as the read/write timeout of the exchange (a perftest
/// peer may take seconds between two steps: ib_write_bw -a registers 16 MiB before its first record, 6 s in
/// the TCG guest).
pub fn connect(host: &str, port: u16, retry: Duration, timeout: Duration) -> Result<TcpStream, ExchangeError> {
    let timeout = timeout.max(Duration::from_millis(1));
    let addr = format!("{host}:{port}");
    let fail = |err| ExchangeError::Connect { addr: addr.clone(), err };
    let addrs: Vec<SocketAddr> = (host, port).to_socket_addrs().map_err(fail)?.collect();
    let deadline = Instant::now() + retry.max(Duration::from_millis(1));
    let mut last = io::Error::new(ErrorKind::NotFound, "no address");
    loop {
        for a in &addrs {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            match TcpStream::connect_timeout(a, left) {
                Ok(s) => {
                    s.set_read_timeout(Some(timeout)).map_err(fail)?;
                    s.set_write_timeout(Some(timeout)).map_err(fail)?;
                    s.set_nodelay(true).map_err(fail)?;
                    return Ok(s);
                }
                Err(e) => last = e,
            }
        }
        if Instant::now() >= deadline || last.kind() != ErrorKind::ConnectionRefused {
            return Err(fail(last));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Listens for the client on TCP `port` on all addresses (IPv6 and IPv4 where the host allows, else IPv4), as
/// perftest's server does.
pub fn listen(port: u16) -> Result<TcpListener, ExchangeError> {
    TcpListener::bind((std::net::Ipv6Addr::UNSPECIFIED, port))
        .or_else(|_| TcpListener::bind((std::net::Ipv4Addr::UNSPECIFIED, port)))
        .map_err(|err| ExchangeError::Listen { port, err })
}

/// Accepts one client on `listener` (perftest listens on all addresses, port 18515 by default), waiting at most
/// `accept_timeout` (`None`: forever, as perftest), and sets `timeout` on the connection.
pub fn accept(
    listener: &TcpListener,
    accept_timeout: Option<Duration>,
    timeout: Duration,
) -> Result<TcpStream, ExchangeError> {
    let timeout = timeout.max(Duration::from_millis(1));
    let port = listener.local_addr().map(|a| a.port()).unwrap_or(0);
    let fail = |err| ExchangeError::Listen { port, err };
    let stream = match accept_timeout {
        None => listener.accept().map_err(fail)?.0,
        Some(t) => {
            listener.set_nonblocking(true).map_err(fail)?;
            let deadline = Instant::now() + t;
            let r = loop {
                match listener.accept() {
                    Ok((s, _)) => break Ok(s),
                    Err(e) if e.kind() == ErrorKind::WouldBlock && Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        break Err(io::Error::new(ErrorKind::TimedOut, "no client connected in time"))
                    }
                    Err(e) => break Err(e),
                }
            };
            listener.set_nonblocking(false).map_err(fail)?;
            r.map_err(fail)?
        }
    };
    stream.set_nonblocking(false).map_err(fail)?;
    stream.set_read_timeout(Some(timeout)).map_err(fail)?;
    stream.set_write_timeout(Some(timeout)).map_err(fail)?;
    stream.set_nodelay(true).map_err(fail)?;
    Ok(stream)
}
