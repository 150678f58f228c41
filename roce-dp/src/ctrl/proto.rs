//! The control protocol between applications (the client library, [`crate::client`]) and the daemon `roce-dpd`,
//! over a Unix stream socket. It carries only the slow path: opening the device, protection domains, memory
//! registration, CQ and QP creation, QP state changes, queries and statistics. Work requests and completions never
//! cross the socket: they go through the shared-memory rings whose memfds the replies carry.
//!
//! # Framing
//! Every message is one frame, little-endian:
//!
//! | offset | field | |
//! |---|---|---|
//! | 0 | `len: u32` | bytes after this field (12 + body), at most [`MAX_FRAME`] |
//! | 4 | `version: u16` | [`PROTO_VERSION`]; a frame of another version is refused with one line |
//! | 6 | `kind: u16` | the message ([`Request`] kinds below 0x100, [`Response`] kinds from 0x100) |
//! | 8 | `seq: u32` | set by the client, echoed in the reply; 0 in the daemon's notices |
//! | 12 | `nfds: u8` | descriptors sent with this frame (SCM_RIGHTS, attached to its first byte), at most 8 |
//! | 13 | 3 bytes | zero |
//! | 16 | body | the message's fields in order: integers little-endian, `Option` as a 0/1 byte then the value, strings and lists as a `u32` count then the items |
//!
//! The socket is strictly request/reply: the client sends one request and reads frames until the reply with its
//! `seq`; the only unsolicited frames are [`Response::Shutdown`] (the daemon is stopping) and [`Response::Closed`]
//! (the daemon closed this session), both with seq 0, after which the daemon closes the socket.
//!
//! # Session
//! 1. `Hello { abi }` first: the daemon compares the client's shared-memory [`ABI_VERSION`](super::abi::ABI_VERSION)
//!    with its own and answers [`Response::Hello`] (addresses, MTU, memory backing) or an [`ErrorCode::Abi`]
//!    error naming both versions, then closes. Any other first request is refused.
//! 2. Objects: PDs, MRs (the client's memfd travels with `RegMr`), CQs and QPs (their ring regions travel back
//!    with the reply), completion channels (the client's end of the channel's socket travels back with the reply;
//!    a CQ names its channel at `CreateCq`). Every handle belongs to the session that made it; using another session's handle is
//!    [`ErrorCode::NotFound`] (indistinguishable from a handle that does not exist).
//! 3. End: the socket closing (the process exiting, killed or not) moves the session's QPs to the error state and
//!    frees everything it owned.
//!
//! # Statistics
//! `Stats` returns flat [`StatRecord`]s `(scope, id, name, value)`: scope `daemon` (id 0: sessions, objects and
//! ring counters summed over the workers, `workers`), `port` (id = port), `worker` (id = worker index: the worker
//! loop's counters and its own `qps`, `cqs`, `wqes_posted`, ...), `engine` (id = worker: the engine's cause-named
//! counters) and `qp` (id = QPN: the QP's counters, `state`, `rate_kbps`, `client`, `worker`). A tool such as `roce-stat` sends `Hello` then
//! `Stats` on a fresh connection and prints or diffs the records; new counters appear without a protocol change.
//! Records that do not fit one frame ([`MAX_FRAME`]: ~200 000 records, ~5 000 QPs) come in pages: `Stats` then
//! answers the first [`Response::StatsPage`] of a snapshot the session keeps, and `StatsFrom { first }` the next
//! ones, until `total` records have come ([`Device::stats`](super::client::Device::stats) does this). A single
//! frame of them would have been refused by the client as out of range.

use core::fmt;
use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use super::shm::{self, ShmError};
use crate::engine::QpInfo;
use crate::mr::AccessFlags;
use crate::qp::{QpAttr, QpState};

/// Version of this framing and of the messages; bumped on any change (2: `CreateQp` carries `max_inline`; 3:
/// completion channels, `CreateCq` carries the channel; 4: statistics in pages, `StatsFrom` and `StatsPage`; 5: the
/// `Closed` notice; 6: `DestroyQp` is answered [`Response::QpDestroyed`] with its CQ rings' tails).
pub const PROTO_VERSION: u16 = 6;

/// Largest frame accepted (statistics of many QPs are the big ones).
pub const MAX_FRAME: usize = 8 << 20;

const HEADER: usize = 16;

/// Why a request failed (the daemon's answer), with a message the user can act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum ErrorCode {
    /// A malformed or unexpected frame.
    Protocol = 1,
    /// Shared-memory ABI or protocol version mismatch.
    Abi = 2,
    /// No such object in this session.
    NotFound = 3,
    /// A bad argument (size, state transition, attribute).
    Invalid = 4,
    /// Out of QPs, CQs, MRs or memory.
    Exhausted = 5,
    /// The object is still in use.
    Busy = 6,
    /// The peer's MAC could not be resolved (no ARP/ND answer).
    Unresolved = 7,
    /// The daemon is shutting down.
    ShuttingDown = 8,
    /// A system call failed in the daemon.
    Os = 9,
}

impl ErrorCode {
    fn from_u16(v: u16) -> ErrorCode {
        [
            ErrorCode::Protocol,
            ErrorCode::Abi,
            ErrorCode::NotFound,
            ErrorCode::Invalid,
            ErrorCode::Exhausted,
            ErrorCode::Busy,
            ErrorCode::Unresolved,
            ErrorCode::ShuttingDown,
            ErrorCode::Os,
        ]
        .into_iter()
        .find(|c| *c as u16 == v)
        .unwrap_or(ErrorCode::Protocol)
    }
}

/// QP attributes of a `ModifyQp`: the verbs attributes, the peer's GID (IPv4-mapped `::ffff:a.b.c.d` or IPv6) and
/// its MAC (resolved by the daemon with ARP / neighbour discovery when absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModifyQp {
    /// Everything but `peer` (ignored: the daemon builds it from `gid` and `mac`).
    pub attr: QpAttr,
    /// The peer's GID (RTR).
    pub gid: Option<[u8; 16]>,
    /// The peer's (or the next hop's) MAC; `None`: the daemon resolves it.
    pub mac: Option<[u8; 6]>,
}

/// A request from the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// Open the device: the client's shared-memory ABI version.
    Hello {
        /// [`super::abi::ABI_VERSION`] of the client.
        abi: u32,
    },
    /// Allocate a protection domain.
    AllocPd,
    /// Free a protection domain (it must have no MRs or QPs).
    DeallocPd {
        /// Handle.
        pd: u32,
    },
    /// Register `len` bytes at `offset` of the memfd sent with this frame, which the client maps at `va`.
    RegMr {
        /// Protection domain.
        pd: u32,
        /// The client's address of the first byte.
        va: u64,
        /// Length.
        len: u64,
        /// Offset in the memfd.
        offset: u64,
        /// [`AccessFlags`] bits.
        access: u32,
    },
    /// Deregister.
    DeregMr {
        /// The region's lkey.
        lkey: u32,
    },
    /// Create a CQ of at least `depth` entries.
    CreateCq {
        /// Depth (rounded up to a power of two).
        depth: u32,
        /// The completion channel its events go to (`None`: polling only).
        channel: Option<u32>,
    },
    /// Create a completion channel: the daemon answers [`Response::Channel`] with the client's end of its socket.
    CreateCompChannel,
    /// Destroy a completion channel (no CQ may use it).
    DestroyCompChannel {
        /// Handle.
        channel: u32,
    },
    /// Destroy a CQ (no QP may use it).
    DestroyCq {
        /// Handle.
        cq: u32,
    },
    /// Create an RC QP.
    CreateQp {
        /// Protection domain.
        pd: u32,
        /// CQ of send completions.
        send_cq: u32,
        /// CQ of receive completions.
        recv_cq: u32,
        /// Send queue depth.
        sq_depth: u32,
        /// Receive queue depth.
        rq_depth: u32,
        /// SGEs per send WR.
        max_send_sge: u8,
        /// SGEs per receive WR.
        max_recv_sge: u8,
        /// Inline bytes per send WR (0: none; the daemon rounds up to a multiple of 64, at most
        /// [`MAX_INLINE_DATA`](super::abi::MAX_INLINE_DATA)).
        max_inline: u32,
    },
    /// Modify a QP.
    ModifyQp {
        /// QP number.
        qpn: u32,
        /// What to change.
        m: ModifyQp,
    },
    /// Query a QP.
    QueryQp {
        /// QP number.
        qpn: u32,
    },
    /// Destroy a QP.
    DestroyQp {
        /// QP number.
        qpn: u32,
    },
    /// Every counter of the daemon: [`Response::Stats`] when they fit one frame, else the first
    /// [`Response::StatsPage`] of a snapshot this session keeps for [`Request::StatsFrom`].
    Stats,
    /// The records of the session's statistics snapshot from index `first` on (after a `Stats` answered with a
    /// page).
    StatsFrom {
        /// Index of the first record wanted.
        first: u32,
    },
}

/// What the daemon tells a client at `Hello`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// The daemon's [`super::abi::ABI_VERSION`].
    pub abi: u32,
    /// The daemon's process id.
    pub pid: u32,
    /// The port's MAC.
    pub mac: [u8; 6],
    /// The port's IPv4 address (GID `::ffff:a.b.c.d`).
    pub ipv4: Option<[u8; 4]>,
    /// The port's IPv6 address.
    pub ipv6: Option<[u8; 16]>,
    /// The port's path MTU.
    pub mtu: u32,
    /// Back memory-region buffers with huge pages (`[daemon] backing = "hugetlbfs"`).
    pub hugetlb: bool,
}

/// One counter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StatRecord {
    /// `daemon`, `port`, `worker`, `engine` or `qp`.
    pub scope: String,
    /// Port, worker or QP number (0 for `daemon`).
    pub id: u32,
    /// Counter name.
    pub name: String,
    /// Value.
    pub value: u64,
}

/// A reply (or the shutdown notice).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Response {
    /// The request failed.
    Error {
        /// Category.
        code: ErrorCode,
        /// One line for the user.
        msg: String,
    },
    /// Device opened.
    Hello(DeviceInfo),
    /// Done, nothing to return.
    Ok,
    /// A protection domain.
    Pd {
        /// Handle.
        pd: u32,
    },
    /// A memory region's keys.
    Mr {
        /// Local key.
        lkey: u32,
        /// Remote key.
        rkey: u32,
    },
    /// A CQ; its ring region's memfd comes with the frame.
    Cq {
        /// Handle.
        cq: u32,
    },
    /// A QP; its ring region's memfd comes with the frame.
    Qp {
        /// QP number.
        qpn: u32,
    },
    /// A QP was destroyed: its send and receive CQ rings' tails (the producer's free-running index) when the worker
    /// destroyed it. Every completion of the QP the daemon wrote into a ring is before that ring's tail, and none
    /// of a later QP with the same number (numbers come back after the worker's range wraps) is: the client
    /// library skips this QP's completions before the tail and no others (see [`super::client`]'s `StaleQps`).
    QpDestroyed {
        /// The send CQ ring's tail.
        send_tail: u32,
        /// The receive CQ ring's tail (the same as `send_tail` when the QP has one CQ).
        recv_tail: u32,
    },
    /// A QP snapshot.
    QpInfo(QpInfo),
    /// Counters.
    Stats(Vec<StatRecord>),
    /// Part of a snapshot of counters too large for one frame ([`MAX_FRAME`]): `total` records in all, these from
    /// the index the request named; the next page is `StatsFrom { first: first + recs.len() }`.
    StatsPage {
        /// Records in the whole snapshot.
        total: u32,
        /// This page's records.
        recs: Vec<StatRecord>,
    },
    /// A completion channel; the client's end of its socket comes with the frame.
    Channel {
        /// Handle.
        channel: u32,
    },
    /// Unsolicited: the daemon is stopping (every QP of the session was moved to the error state and flushed).
    Shutdown {
        /// Why.
        reason: String,
    },
    /// Unsolicited: the daemon closed this session (and reclaims everything it held), the daemon carrying on.
    Closed {
        /// Why.
        reason: String,
    },
}

/// A protocol failure on one side.
#[derive(Debug)]
pub enum ProtoError {
    /// The socket failed or closed (`None`: end of stream).
    Io(Option<std::io::Error>),
    /// Writing a frame failed after its first `n` bytes went out: the stream is out of step.
    Partial(std::io::Error, usize),
    /// Descriptor passing failed.
    Shm(ShmError),
    /// A frame that does not parse.
    Malformed(&'static str),
    /// The peer speaks another protocol version.
    Version {
        /// The peer's version.
        peer: u16,
    },
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Io(None) => f.write_str("the peer closed the control socket"),
            ProtoError::Io(Some(e)) => write!(f, "control socket: {e}"),
            ProtoError::Partial(e, n) => write!(f, "control socket: {e} after {n} bytes of a frame"),
            ProtoError::Shm(e) => write!(f, "{e}"),
            ProtoError::Malformed(what) => write!(f, "malformed control message: {what}"),
            ProtoError::Version { peer } => {
                write!(f, "control protocol v{peer} on the other side, this side speaks v{PROTO_VERSION}")
            }
        }
    }
}

impl std::error::Error for ProtoError {}

impl From<std::io::Error> for ProtoError {
    fn from(e: std::io::Error) -> ProtoError {
        ProtoError::Io(Some(e))
    }
}

impl From<ShmError> for ProtoError {
    fn from(e: ShmError) -> ProtoError {
        ProtoError::Shm(e)
    }
}

// ------------------------------------------------------------------------------------------------ encoding

#[derive(Default)]
struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, v: &[u8]) {
        self.0.extend_from_slice(v);
    }
    fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.bytes(s.as_bytes());
    }
    fn opt<T>(&mut self, v: Option<T>, f: impl FnOnce(&mut Self, T)) {
        match v {
            Some(x) => {
                self.u8(1);
                f(self, x);
            }
            None => self.u8(0),
        }
    }
}

struct Reader<'a>(&'a [u8]);

type R<T> = Result<T, ProtoError>;

impl Reader<'_> {
    fn take(&mut self, n: usize) -> R<&[u8]> {
        if self.0.len() < n {
            return Err(ProtoError::Malformed("frame body too short"));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn arr<const N: usize>(&mut self) -> R<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }
    fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> R<u16> {
        Ok(u16::from_le_bytes(self.arr()?))
    }
    fn u32(&mut self) -> R<u32> {
        Ok(u32::from_le_bytes(self.arr()?))
    }
    fn u64(&mut self) -> R<u64> {
        Ok(u64::from_le_bytes(self.arr()?))
    }
    fn str(&mut self) -> R<String> {
        let n = self.u32()? as usize;
        String::from_utf8(self.take(n)?.to_vec()).map_err(|_| ProtoError::Malformed("string is not UTF-8"))
    }
    fn opt<T>(&mut self, f: impl FnOnce(&mut Self) -> R<T>) -> R<Option<T>> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(f(self)?)),
            _ => Err(ProtoError::Malformed("option flag is not 0 or 1")),
        }
    }
    fn end(&self) -> R<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Malformed("trailing bytes after the message"))
        }
    }
}

const STATES: [QpState; 7] =
    [QpState::Reset, QpState::Init, QpState::Rtr, QpState::Rts, QpState::Sqd, QpState::Sqe, QpState::Err];

fn state_code(s: QpState) -> u8 {
    STATES.iter().position(|&x| x == s).unwrap_or(0) as u8
}

fn state_from(c: u8) -> R<QpState> {
    STATES.get(usize::from(c)).copied().ok_or(ProtoError::Malformed("unknown QP state"))
}

fn put_modify(w: &mut Writer, m: &ModifyQp) {
    let a = &m.attr;
    w.opt(a.state, |w, s| w.u8(state_code(s)));
    w.opt(a.access, |w, x| w.u32(x.0));
    w.opt(a.path_mtu, Writer::u32);
    w.opt(a.dest_qpn, Writer::u32);
    w.opt(a.rq_psn, Writer::u32);
    w.opt(a.max_dest_rd_atomic, Writer::u8);
    w.opt(a.min_rnr_timer, Writer::u8);
    w.opt(a.sq_psn, Writer::u32);
    w.opt(a.timeout, Writer::u8);
    w.opt(a.retry_cnt, Writer::u8);
    w.opt(a.rnr_retry, Writer::u8);
    w.opt(a.max_rd_atomic, Writer::u8);
    w.opt(a.dscp, Writer::u8);
    w.opt(a.ttl, Writer::u8);
    w.opt(m.gid, |w, g| w.bytes(&g));
    w.opt(m.mac, |w, g| w.bytes(&g));
}

fn get_modify(r: &mut Reader<'_>) -> R<ModifyQp> {
    let attr = QpAttr {
        state: r.opt(|r| state_from(r.u8()?))?,
        access: r.opt(|r| Ok(AccessFlags(r.u32()? & AccessFlags::ALL.0)))?,
        path_mtu: r.opt(Reader::u32)?,
        dest_qpn: r.opt(Reader::u32)?,
        rq_psn: r.opt(Reader::u32)?,
        max_dest_rd_atomic: r.opt(Reader::u8)?,
        min_rnr_timer: r.opt(Reader::u8)?,
        sq_psn: r.opt(Reader::u32)?,
        timeout: r.opt(Reader::u8)?,
        retry_cnt: r.opt(Reader::u8)?,
        rnr_retry: r.opt(Reader::u8)?,
        max_rd_atomic: r.opt(Reader::u8)?,
        dscp: r.opt(Reader::u8)?,
        ttl: r.opt(Reader::u8)?,
        ..QpAttr::default()
    };
    Ok(ModifyQp { attr, gid: r.opt(Reader::arr)?, mac: r.opt(Reader::arr)? })
}

impl Request {
    /// The request's name, for messages ("AllocPd").
    pub fn name(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "Hello",
            Request::AllocPd => "AllocPd",
            Request::DeallocPd { .. } => "DeallocPd",
            Request::RegMr { .. } => "RegMr",
            Request::DeregMr { .. } => "DeregMr",
            Request::CreateCq { .. } => "CreateCq",
            Request::DestroyCq { .. } => "DestroyCq",
            Request::CreateQp { .. } => "CreateQp",
            Request::ModifyQp { .. } => "ModifyQp",
            Request::QueryQp { .. } => "QueryQp",
            Request::DestroyQp { .. } => "DestroyQp",
            Request::Stats => "Stats",
            Request::StatsFrom { .. } => "StatsFrom",
            Request::CreateCompChannel => "CreateCompChannel",
            Request::DestroyCompChannel { .. } => "DestroyCompChannel",
        }
    }

    fn encode(&self, w: &mut Writer) -> u16 {
        match self {
            Request::Hello { abi } => {
                w.u32(*abi);
                1
            }
            Request::AllocPd => 2,
            Request::DeallocPd { pd } => {
                w.u32(*pd);
                3
            }
            Request::RegMr { pd, va, len, offset, access } => {
                w.u32(*pd);
                w.u64(*va);
                w.u64(*len);
                w.u64(*offset);
                w.u32(*access);
                4
            }
            Request::DeregMr { lkey } => {
                w.u32(*lkey);
                5
            }
            Request::CreateCq { depth, channel } => {
                w.u32(*depth);
                w.opt(*channel, Writer::u32);
                6
            }
            Request::DestroyCq { cq } => {
                w.u32(*cq);
                7
            }
            Request::CreateQp { pd, send_cq, recv_cq, sq_depth, rq_depth, max_send_sge, max_recv_sge, max_inline } => {
                for v in [*pd, *send_cq, *recv_cq, *sq_depth, *rq_depth] {
                    w.u32(v);
                }
                w.u8(*max_send_sge);
                w.u8(*max_recv_sge);
                w.u32(*max_inline);
                8
            }
            Request::ModifyQp { qpn, m } => {
                w.u32(*qpn);
                put_modify(w, m);
                9
            }
            Request::QueryQp { qpn } => {
                w.u32(*qpn);
                10
            }
            Request::DestroyQp { qpn } => {
                w.u32(*qpn);
                11
            }
            Request::Stats => 12,
            Request::CreateCompChannel => 13,
            Request::DestroyCompChannel { channel } => {
                w.u32(*channel);
                14
            }
            Request::StatsFrom { first } => {
                w.u32(*first);
                15
            }
        }
    }

    fn decode(kind: u16, r: &mut Reader<'_>) -> R<Request> {
        let q = match kind {
            1 => Request::Hello { abi: r.u32()? },
            2 => Request::AllocPd,
            3 => Request::DeallocPd { pd: r.u32()? },
            4 => Request::RegMr { pd: r.u32()?, va: r.u64()?, len: r.u64()?, offset: r.u64()?, access: r.u32()? },
            5 => Request::DeregMr { lkey: r.u32()? },
            6 => Request::CreateCq { depth: r.u32()?, channel: r.opt(Reader::u32)? },
            7 => Request::DestroyCq { cq: r.u32()? },
            8 => Request::CreateQp {
                pd: r.u32()?,
                send_cq: r.u32()?,
                recv_cq: r.u32()?,
                sq_depth: r.u32()?,
                rq_depth: r.u32()?,
                max_send_sge: r.u8()?,
                max_recv_sge: r.u8()?,
                max_inline: r.u32()?,
            },
            9 => Request::ModifyQp { qpn: r.u32()?, m: get_modify(r)? },
            10 => Request::QueryQp { qpn: r.u32()? },
            11 => Request::DestroyQp { qpn: r.u32()? },
            12 => Request::Stats,
            13 => Request::CreateCompChannel,
            14 => Request::DestroyCompChannel { channel: r.u32()? },
            15 => Request::StatsFrom { first: r.u32()? },
            _ => return Err(ProtoError::Malformed("unknown request kind")),
        };
        r.end()?;
        Ok(q)
    }
}

impl Response {
    fn encode(&self, w: &mut Writer) -> u16 {
        match self {
            Response::Error { code, msg } => {
                w.u16(*code as u16);
                w.str(msg);
                0x100
            }
            Response::Hello(d) => {
                w.u32(d.abi);
                w.u32(d.pid);
                w.bytes(&d.mac);
                w.opt(d.ipv4, |w, a| w.bytes(&a));
                w.opt(d.ipv6, |w, a| w.bytes(&a));
                w.u32(d.mtu);
                w.u8(u8::from(d.hugetlb));
                0x101
            }
            Response::Ok => 0x102,
            Response::Pd { pd } => {
                w.u32(*pd);
                0x103
            }
            Response::Mr { lkey, rkey } => {
                w.u32(*lkey);
                w.u32(*rkey);
                0x104
            }
            Response::Cq { cq } => {
                w.u32(*cq);
                0x105
            }
            Response::Qp { qpn } => {
                w.u32(*qpn);
                0x106
            }
            Response::QpInfo(q) => {
                w.u8(state_code(q.state));
                for v in [q.qpn, q.path_mtu, q.dest_qpn, q.sq_psn, q.rq_psn, q.sq_outstanding, q.rq_posted] {
                    w.u32(v);
                }
                0x107
            }
            Response::Stats(recs) => {
                put_stats(w, recs);
                0x108
            }
            Response::StatsPage { total, recs } => {
                w.u32(*total);
                put_stats(w, recs);
                0x10b
            }
            Response::Shutdown { reason } => {
                w.str(reason);
                0x109
            }
            Response::Channel { channel } => {
                w.u32(*channel);
                0x10a
            }
            Response::Closed { reason } => {
                w.str(reason);
                0x10c
            }
            Response::QpDestroyed { send_tail, recv_tail } => {
                w.u32(*send_tail);
                w.u32(*recv_tail);
                0x10d
            }
        }
    }

    fn decode(kind: u16, r: &mut Reader<'_>) -> R<Response> {
        let v = match kind {
            0x100 => Response::Error { code: ErrorCode::from_u16(r.u16()?), msg: r.str()? },
            0x101 => Response::Hello(DeviceInfo {
                abi: r.u32()?,
                pid: r.u32()?,
                mac: r.arr()?,
                ipv4: r.opt(Reader::arr)?,
                ipv6: r.opt(Reader::arr)?,
                mtu: r.u32()?,
                hugetlb: r.u8()? != 0,
            }),
            0x102 => Response::Ok,
            0x103 => Response::Pd { pd: r.u32()? },
            0x104 => Response::Mr { lkey: r.u32()?, rkey: r.u32()? },
            0x105 => Response::Cq { cq: r.u32()? },
            0x106 => Response::Qp { qpn: r.u32()? },
            0x107 => Response::QpInfo(QpInfo {
                state: state_from(r.u8()?)?,
                qpn: r.u32()?,
                path_mtu: r.u32()?,
                dest_qpn: r.u32()?,
                sq_psn: r.u32()?,
                rq_psn: r.u32()?,
                sq_outstanding: r.u32()?,
                rq_posted: r.u32()?,
            }),
            0x108 => Response::Stats(get_stats(r)?),
            0x10b => Response::StatsPage { total: r.u32()?, recs: get_stats(r)? },
            0x109 => Response::Shutdown { reason: r.str()? },
            0x10a => Response::Channel { channel: r.u32()? },
            0x10c => Response::Closed { reason: r.str()? },
            0x10d => Response::QpDestroyed { send_tail: r.u32()?, recv_tail: r.u32()? },
            _ => return Err(ProtoError::Malformed("unknown response kind")),
        };
        r.end()?;
        Ok(v)
    }
}

fn put_stats(w: &mut Writer, recs: &[StatRecord]) {
    w.u32(recs.len() as u32);
    for s in recs {
        w.str(&s.scope);
        w.u32(s.id);
        w.str(&s.name);
        w.u64(s.value);
    }
}

fn get_stats(r: &mut Reader<'_>) -> R<Vec<StatRecord>> {
    let n = r.u32()? as usize;
    // Each record takes at least 20 bytes: a bogus count cannot make us allocate.
    let mut v = Vec::with_capacity(n.min(r.0.len() / 20));
    for _ in 0..n {
        v.push(StatRecord { scope: r.str()?, id: r.u32()?, name: r.str()?, value: r.u64()? });
    }
    Ok(v)
}

/// Bytes a record takes in a `Stats` or `StatsPage` body.
fn stat_len(s: &StatRecord) -> usize {
    4 + s.scope.len() + 4 + 4 + s.name.len() + 8
}

/// Room for records in one statistics frame: [`MAX_FRAME`] less the header and the counts, with a margin.
pub const STATS_PAGE_BYTES: usize = MAX_FRAME - 4096;

/// How many records from the start of `recs` fit in `budget` bytes of a statistics frame (at least one, so that
/// paging always moves on; a single record is far below any budget).
pub fn stats_page_len(recs: &[StatRecord], budget: usize) -> usize {
    let mut used = 0;
    for (i, s) in recs.iter().enumerate() {
        used += stat_len(s);
        if used > budget {
            return i.max(1);
        }
    }
    recs.len()
}

// ------------------------------------------------------------------------------------------------ the socket

/// A frame as received: its sequence number, message and descriptors.
pub struct Frame<T> {
    /// Request id (0 for notices).
    pub seq: u32,
    /// The message.
    pub msg: T,
    /// Descriptors that came with it.
    pub fds: Vec<OwnedFd>,
    /// The frame's descriptors were sent but could not be received: this process's descriptor table is full
    /// (RLIMIT_NOFILE). `fds` is empty then.
    pub fds_lost: bool,
}

struct RawFrame {
    kind: u16,
    seq: u32,
    body: Vec<u8>,
    fds: Vec<OwnedFd>,
    fds_lost: bool,
}

/// How long a read waits for a whole frame.
#[derive(Clone, Copy)]
enum Wait {
    /// Until it comes.
    Block,
    /// Until this instant.
    Until(std::time::Instant),
    /// Not at all: only what the socket holds now.
    Never,
}

/// One end of the control socket: frames out with their descriptors, frames in with theirs.
pub struct Conn {
    sock: UnixStream,
    buf: Vec<u8>,
    fds: Vec<OwnedFd>,
    /// Descriptors sent to us were lost (our descriptor table was full): the next frame that announces more
    /// descriptors than arrived gets none and [`Frame::fds_lost`], instead of breaking the connection.
    fds_lost: bool,
}

impl Conn {
    /// Wraps a connected socket.
    pub fn new(sock: UnixStream) -> Conn {
        Conn { sock, buf: Vec::new(), fds: Vec::new(), fds_lost: false }
    }

    /// The socket.
    pub fn socket(&self) -> &UnixStream {
        &self.sock
    }

    fn send_frame(&self, kind: u16, seq: u32, body: &[u8], fds: &[BorrowedFd<'_>]) -> R<()> {
        let mut f = Vec::with_capacity(HEADER + body.len());
        f.extend_from_slice(&((HEADER - 4 + body.len()) as u32).to_le_bytes());
        f.extend_from_slice(&PROTO_VERSION.to_le_bytes());
        f.extend_from_slice(&kind.to_le_bytes());
        f.extend_from_slice(&seq.to_le_bytes());
        f.extend_from_slice(&[fds.len() as u8, 0, 0, 0]);
        f.extend_from_slice(body);
        // A signal that interrupts `sendmsg` sent nothing (a stream socket reports a partial send as a count), so
        // the call is simply made again: an application without SA_RESTART must not lose its session to a signal.
        let n = loop {
            match shm::send_with_fds(&self.sock, &f, fds) {
                Err(ShmError::Os { errno: libc::EINTR, .. }) => continue,
                r => break r?,
            }
        };
        // A stream socket may take part of a large frame; the rest goes without descriptors (`write_all` retries
        // EINTR itself).
        (&self.sock).write_all(&f[n..]).map_err(|e| ProtoError::Partial(e, n))?;
        Ok(())
    }

    /// Sends a request.
    pub fn send_request(&self, seq: u32, q: &Request, fds: &[BorrowedFd<'_>]) -> R<()> {
        let mut w = Writer::default();
        let kind = q.encode(&mut w);
        self.send_frame(kind, seq, &w.0, fds)
    }

    /// Sends a response.
    pub fn send_response(&self, seq: u32, r: &Response, fds: &[BorrowedFd<'_>]) -> R<()> {
        let mut w = Writer::default();
        let kind = r.encode(&mut w);
        self.send_frame(kind, seq, &w.0, fds)
    }

    /// Reads the next frame (blocking).
    fn recv_frame(&mut self) -> R<RawFrame> {
        Ok(self.recv_frame_wait(Wait::Block)?.expect("a blocking read returns a frame or an error"))
    }

    /// Reads the next frame, waiting as `wait` says: `None` when no whole frame came in time (what did come stays
    /// buffered for the next read). A signal (EINTR) never ends the wait early nor fails it.
    fn recv_frame_wait(&mut self, wait: Wait) -> R<Option<RawFrame>> {
        loop {
            if self.buf.len() >= HEADER {
                let len = u32::from_le_bytes(self.buf[..4].try_into().expect("4 bytes")) as usize;
                if !(HEADER - 4..=MAX_FRAME).contains(&len) {
                    return Err(ProtoError::Malformed("frame length out of range"));
                }
                let version = u16::from_le_bytes([self.buf[4], self.buf[5]]);
                if version != PROTO_VERSION {
                    return Err(ProtoError::Version { peer: version });
                }
                if self.buf.len() >= len + 4 {
                    let kind = u16::from_le_bytes([self.buf[6], self.buf[7]]);
                    let seq = u32::from_le_bytes(self.buf[8..12].try_into().expect("4 bytes"));
                    let nfds = usize::from(self.buf[12]);
                    let fds_lost = nfds > self.fds.len() && std::mem::take(&mut self.fds_lost);
                    if nfds > self.fds.len() && !fds_lost {
                        return Err(ProtoError::Malformed("frame announces descriptors that did not come"));
                    }
                    let body = self.buf[HEADER..len + 4].to_vec();
                    self.buf.drain(..len + 4);
                    let fds = if fds_lost { Vec::new() } else { self.fds.drain(..nfds).collect() };
                    return Ok(Some(RawFrame { kind, seq, body, fds, fds_lost }));
                }
            }
            // Without blocking past the deadline: wait for the socket to be readable (or closed) first; a read
            // after that returns at once, with what is there.
            match wait {
                Wait::Block => {}
                Wait::Never if !shm::readable_or_closed(&self.sock) => return Ok(None),
                Wait::Never => {}
                Wait::Until(deadline) => {
                    while !shm::readable_or_closed(&self.sock) {
                        let left = deadline.saturating_duration_since(std::time::Instant::now());
                        if left.is_zero() {
                            return Ok(None);
                        }
                        // Any fd: a `poll` for POLLIN; a signal only makes it return early, and the loop waits on.
                        shm::channel_wait(self.sock.as_fd(), Some(left))?;
                    }
                }
            }
            let mut chunk = [0u8; 16 * 1024];
            let (n, lost) = match shm::recv_with_fds(&self.sock, &mut chunk, &mut self.fds) {
                Err(ShmError::Os { errno: libc::EINTR, .. }) => continue,
                r => r?,
            };
            self.fds_lost |= lost;
            if n == 0 {
                return Err(ProtoError::Io(None));
            }
            if self.fds.len() > shm::MAX_FDS {
                return Err(ProtoError::Malformed("too many descriptors queued"));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Receives the next request (daemon side).
    pub fn recv_request(&mut self) -> R<Frame<Request>> {
        let RawFrame { kind, seq, body, fds, fds_lost } = self.recv_frame()?;
        let msg = Request::decode(kind, &mut Reader(&body))?;
        Ok(Frame { seq, msg, fds, fds_lost })
    }

    /// Receives the next response or notice (client side).
    pub fn recv_response(&mut self) -> R<Frame<Response>> {
        let RawFrame { kind, seq, body, fds, fds_lost } = self.recv_frame()?;
        let msg = Response::decode(kind, &mut Reader(&body))?;
        Ok(Frame { seq, msg, fds, fds_lost })
    }

    /// Receives the next response or notice, waiting at most until `deadline` (`None`: forever): `Ok(None)` when
    /// no whole frame came by then (part of one stays buffered, so a later read goes on where this one stopped).
    pub fn recv_response_until(&mut self, deadline: Option<std::time::Instant>) -> R<Option<Frame<Response>>> {
        let wait = deadline.map_or(Wait::Block, Wait::Until);
        self.recv_frame_wait(wait)?.map(Self::response).transpose()
    }

    /// Without blocking: the next response or notice if a whole one is here (reading what the socket has now),
    /// else `Ok(None)`. Half a frame never makes it wait for the rest.
    pub fn try_recv_response(&mut self) -> R<Option<Frame<Response>>> {
        self.recv_frame_wait(Wait::Never)?.map(Self::response).transpose()
    }

    fn response(RawFrame { kind, seq, body, fds, fds_lost }: RawFrame) -> R<Frame<Response>> {
        let msg = Response::decode(kind, &mut Reader(&body))?;
        Ok(Frame { seq, msg, fds, fds_lost })
    }

    /// Without blocking: has the peer closed the socket or sent a frame (or has one been buffered already)?
    pub fn readable_or_closed(&self) -> bool {
        !self.buf.is_empty() || shm::readable_or_closed(&self.sock)
    }
}

impl AsFd for Conn {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.sock.as_fd()
    }
}

/// Writes a frame with any header values (seq 1) and no descriptors: for tests that play a foreign or broken peer
/// (another protocol version, descriptors announced but not sent).
#[doc(hidden)]
pub fn send_raw_frame(sock: &UnixStream, version: u16, kind: u16, nfds: u8, body: &[u8]) -> std::io::Result<()> {
    let mut f = Vec::new();
    f.extend_from_slice(&((HEADER - 4 + body.len()) as u32).to_le_bytes());
    f.extend_from_slice(&version.to_le_bytes());
    f.extend_from_slice(&kind.to_le_bytes());
    f.extend_from_slice(&[1, 0, 0, 0, nfds, 0, 0, 0]);
    f.extend_from_slice(body);
    (&*sock).write_all(&f)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 300 000 counters (~7 500 QPs' worth) do not fit one frame: the receiver refuses such a frame as out of
    /// range, which is what a client got before statistics came in pages. Paged with the daemon's budget, every
    /// page's frame fits, decodes to what was sent, and the pages together are the list, in order.
    #[test]
    fn statistics_too_large_for_one_frame_go_in_pages_that_each_fit() {
        let recs: Vec<StatRecord> = (0..300_000u32)
            .map(|i| StatRecord {
                scope: "qp".into(),
                id: 0x100 + i / 40,
                name: format!("a_counter_name_{}", i % 40),
                value: u64::from(i) << 20,
            })
            .collect();
        let mut w = Writer::default();
        Response::Stats(recs.clone()).encode(&mut w);
        assert!(HEADER - 4 + w.0.len() > MAX_FRAME, "the test's records fit one frame");
        let (mut first, mut pages, mut got) = (0, 0, Vec::new());
        while first < recs.len() {
            let n = stats_page_len(&recs[first..], STATS_PAGE_BYTES);
            assert!(n > 0);
            let page = Response::StatsPage { total: recs.len() as u32, recs: recs[first..first + n].to_vec() };
            let mut w = Writer::default();
            let kind = page.encode(&mut w);
            assert!(HEADER - 4 + w.0.len() <= MAX_FRAME, "page {pages}: {} bytes", w.0.len());
            let back = Response::decode(kind, &mut Reader(&w.0)).unwrap();
            let Response::StatsPage { total, recs: r } = back else { panic!("not a page") };
            assert_eq!(total as usize, recs.len());
            got.extend(r);
            first += n;
            pages += 1;
        }
        assert!(pages >= 2, "{pages}");
        assert!(got == recs, "the pages differ from the list");
        // A budget below one record still moves on one record at a time.
        assert_eq!(stats_page_len(&recs[..3], 1), 1);
        assert_eq!(stats_page_len(&[], 100), 0);
    }

    fn requests() -> Vec<Request> {
        let m = ModifyQp {
            attr: QpAttr {
                state: Some(QpState::Rtr),
                access: Some(AccessFlags::ALL),
                path_mtu: Some(1024),
                dest_qpn: Some(0x123),
                rq_psn: Some(77),
                max_dest_rd_atomic: Some(16),
                min_rnr_timer: Some(1),
                timeout: Some(14),
                ..QpAttr::default()
            },
            gid: Some([0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1]),
            mac: None,
        };
        vec![
            Request::Hello { abi: 1 },
            Request::AllocPd,
            Request::DeallocPd { pd: 3 },
            Request::RegMr { pd: 1, va: 0x7f00_0000_0000, len: 1 << 20, offset: 4096, access: 15 },
            Request::DeregMr { lkey: 0x101 },
            Request::CreateCq { depth: 100, channel: None },
            Request::CreateCq { depth: 64, channel: Some(7) },
            Request::CreateCompChannel,
            Request::DestroyCompChannel { channel: 7 },
            Request::DestroyCq { cq: 2 },
            Request::CreateQp {
                pd: 1,
                send_cq: 0,
                recv_cq: 1,
                sq_depth: 64,
                rq_depth: 32,
                max_send_sge: 4,
                max_recv_sge: 1,
                max_inline: 256,
            },
            Request::ModifyQp { qpn: 0x100, m },
            Request::QueryQp { qpn: 0x100 },
            Request::DestroyQp { qpn: 0x100 },
            Request::Stats,
            Request::StatsFrom { first: 77 },
        ]
    }

    fn responses() -> Vec<Response> {
        vec![
            Response::Error { code: ErrorCode::Abi, msg: "daemon speaks v2".into() },
            Response::Hello(DeviceInfo {
                abi: 1,
                pid: 42,
                mac: [2, 0, 0, 0, 0, 1],
                ipv4: Some([10, 0, 0, 1]),
                ipv6: None,
                mtu: 4096,
                hugetlb: true,
            }),
            Response::Ok,
            Response::Pd { pd: 9 },
            Response::Mr { lkey: 1, rkey: 2 },
            Response::Cq { cq: 3 },
            Response::Qp { qpn: 0x101 },
            Response::QpInfo(QpInfo {
                qpn: 0x101,
                state: QpState::Rts,
                path_mtu: 1024,
                dest_qpn: 5,
                sq_psn: 6,
                rq_psn: 7,
                sq_outstanding: 8,
                rq_posted: 9,
            }),
            Response::Stats(vec![StatRecord { scope: "qp".into(), id: 0x100, name: "tx_packets".into(), value: 5 }]),
            Response::StatsPage {
                total: 9,
                recs: vec![StatRecord { scope: "engine".into(), id: 1, name: "rx_frames".into(), value: 6 }],
            },
            Response::Shutdown { reason: "SIGTERM".into() },
            Response::Channel { channel: 4 },
            Response::Closed { reason: "a page vanished".into() },
            Response::QpDestroyed { send_tail: 7, recv_tail: u32::MAX },
        ]
    }

    #[test]
    fn every_message_round_trips_over_a_socket_with_descriptors() {
        let (a, b) = UnixStream::pair().unwrap();
        let (a, mut b) = (Conn::new(a), Conn::new(b));
        let region = shm::ShmRegion::create("roce-dp-proto", 4096, shm::Backing::Pages).unwrap();
        for (i, q) in requests().iter().enumerate() {
            let fds: Vec<_> = if i % 3 == 0 { vec![region.fd()] } else { vec![] };
            a.send_request(i as u32 + 1, q, &fds).unwrap();
        }
        for (i, q) in requests().iter().enumerate() {
            let f = b.recv_request().unwrap();
            assert_eq!((&f.msg, f.seq, f.fds.len()), (q, i as u32 + 1, usize::from(i % 3 == 0)));
        }
        for r in responses() {
            b.send_response(7, &r, &[]).unwrap();
            assert_eq!(a_recv(&a), r);
        }
    }

    fn a_recv(a: &Conn) -> Response {
        let mut c = Conn::new(a.socket().try_clone().unwrap());
        c.recv_response().unwrap().msg
    }

    #[test]
    fn bad_frames_are_errors_not_panics() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = Conn::new(b);
        let other = PROTO_VERSION + 1;
        send_raw_frame(&a, other, 1, 0, &1u32.to_le_bytes()).unwrap();
        let e = b.recv_request().err().unwrap();
        assert!(matches!(e, ProtoError::Version { peer } if peer == other), "{e}");
        assert!(e.to_string().contains(&format!("v{other}")) && e.to_string().contains(&format!("v{PROTO_VERSION}")));
        // Truncated bodies, trailing bytes, unknown kinds, option flags.
        for (kind, body) in [(1u16, vec![1u8]), (1, vec![1, 0, 0, 0, 9]), (77, vec![]), (9, vec![0, 1, 0, 0, 7])] {
            let (a, b) = UnixStream::pair().unwrap();
            let mut b = Conn::new(b);
            let mut f = Vec::new();
            f.extend_from_slice(&((HEADER - 4 + body.len()) as u32).to_le_bytes());
            f.extend_from_slice(&PROTO_VERSION.to_le_bytes());
            f.extend_from_slice(&kind.to_le_bytes());
            f.extend_from_slice(&[0; 8]);
            f.extend_from_slice(&body);
            (&a).write_all(&f).unwrap();
            assert!(matches!(b.recv_request(), Err(ProtoError::Malformed(_))), "kind {kind} body {body:?}");
        }
        // A frame announcing a descriptor that did not come; a huge length.
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = Conn::new(b);
        send_raw_frame(&a, PROTO_VERSION, 2, 1, &[]).unwrap();
        assert!(matches!(b.recv_request(), Err(ProtoError::Malformed(_))));
        let (a, b) = UnixStream::pair().unwrap();
        let mut b = Conn::new(b);
        (&a).write_all(&[0xff; 16]).unwrap();
        assert!(matches!(b.recv_request(), Err(ProtoError::Malformed(_))));
        drop(a);
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(matches!(Conn::new(b).recv_request(), Err(ProtoError::Io(None))));
    }
}
