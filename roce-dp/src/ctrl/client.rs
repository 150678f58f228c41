//! The client library: what an application links to use the soft NIC that `roce-dpd` runs, as it would use a NIC
//! through libibverbs (re-exported as `roce_dp::client`).
//!
//! A whole application: a SEND of "hello" between two QPs, checked on arrival. It runs as a doctest against the
//! in-process daemon of [`loopback`](super::loopback); against `roce-dpd --config conf/daemon-ring.toml` it runs as
//! it is with `socket = "/run/roce-dpd.sock"` (the two QPs meet through the daemon's port). Two applications do the
//! same with one QP each, exchanging QPN, PSN and [`Device::gid`] out of band (perftest's tools do it over TCP).
//!
//! ```
//! use roce_dp::client::{Device, QpInit, Remote};
//! use roce_dp::{AccessFlags, Cqe, SendWr, WcStatus, WrOpcode};
//! # fn main() -> Result<(), roce_dp::client::Error> {
//! # let socket = std::env::temp_dir().join(format!("roce-dp-doc-{}.sock", std::process::id()));
//! # let _daemon = roce_dp::ctrl::loopback::LoopbackDaemon::start(
//! #     roce_dp::ctrl::loopback::LoopbackConfig::new(&socket)).expect("loopback daemon");
//! let dev = Device::open(&socket)?;                             // the config's [daemon] socket; ABI checked here
//! let pd = dev.alloc_pd()?;
//! let mut mr = pd.reg_mr(1 << 20, AccessFlags::ALL)?;         // a buffer in shared memory the daemon maps too
//! let mut cq = dev.create_cq(256)?;
//! let mut a = dev.create_qp(&pd, &cq, &cq, QpInit::default())?;
//! let mut b = dev.create_qp(&pd, &cq, &cq, QpInit::default())?;
//! // Each side gives the other its QPN, first PSN and GID (here both sides are ours).
//! let (psn_a, psn_b) = (0x1234, 0x5678);
//! for (qp, peer_qpn, peer_psn, psn) in [(&a, b.qpn(), psn_b, psn_a), (&b, a.qpn(), psn_a, psn_b)] {
//!     qp.to_init(AccessFlags::ALL)?;
//!     let peer = Remote { qpn: peer_qpn, psn: peer_psn, gid: dev.gid(), mac: None };   // MAC: ARP
//!     qp.to_rtr(&peer, dev.info().mtu)?;                        // path MTU: the port's
//!     qp.to_rts(psn)?;
//! }
//! b.post_recv(7, &[mr.sge(4096, 64)])?;                        // the receive first: a SEND needs one
//! mr.as_mut_slice()[..5].copy_from_slice(b"hello");
//! a.post_send(&SendWr::new(1, WrOpcode::Send), &[mr.sge(0, 5)])?;   // an index publish, no system call
//! let mut wc = [Cqe::EMPTY; 2];
//! let mut n = 0;
//! while n < 2 {
//!     n += cq.poll(&mut wc[n..])?;                              // the send's and the receive's completions
//! }
//! assert!(wc.iter().all(|c| c.status == WcStatus::Success), "{wc:?}");
//! let recv = wc.iter().find(|c| c.wr_id == 7).expect("the receive completed");
//! assert_eq!(recv.byte_len, 5);
//! assert_eq!(&mr.as_slice()[4096..4101], b"hello");
//! # Ok(()) }
//! ```
//!
//! Only the slow path (open, PD, MR, CQ, QP, modify, query, destroy) talks to the daemon over its socket
//! ([`super::proto`]); posting and polling touch only the shared rings. Objects are destroyed when dropped; one
//! dropped while another still uses it (a PD before its QPs or MRs, a CQ before its QPs, a completion channel
//! before its CQs, which verbs refuses with EBUSY) is destroyed when its last user is. When the daemon goes away, the next control call fails with
//! [`Error::DaemonGone`], and so do [`Cq::poll`] once it has found its ring empty for a while and a post that
//! finds its queue full, each after a look at the socket (without blocking): never a hang. A daemon that does not answer (stopped, stuck, or another program's
//! socket) makes a control call fail with [`Error::Timeout`] after [`DEFAULT_CALL_TIMEOUT`] (or what
//! [`Device::set_call_timeout`] says); a signal that interrupts the wait is retried.
//!
//! # Threads
//! [`Device`] is `Send` and `Sync`: control calls from several threads take turns on the session's socket. [`Cq`],
//! [`Qp`] and [`Mr`] are `Send`, not `Sync`: one thread at a time polls a CQ ([`Cq::poll`] takes `&mut self`) or
//! posts on a QP; to poll a CQ in one thread and create QPs on it in another, keep it behind a mutex held only for
//! the poll or the creation. A [`Qp`] may be dropped on any thread while another polls its CQs: what the two share
//! (the CQ's records of destroyed QPs, the ring's indices) is atomics or behind the library's own mutex, so there is
//! no data race. A poll running while the drop runs may still return completions of the QP (their order is
//! unspecified, as with verbs); a poll that starts after the drop returned returns none of them
//! (`roce-dp/tests/audit_client.rs`).
//!
//! ```compile_fail
//! fn sync<T: Sync>() {}
//! sync::<roce_dp::client::Cq>(); // two threads may not poll one CQ at once
//! ```
//!
//! # Completion channels: sleeping instead of polling
//! As with `ibv_create_comp_channel` / `ibv_req_notify_cq` / `ibv_get_cq_event` / `ibv_ack_cq_events`: a
//! [`CompChannel`] ([`Device::create_comp_channel`]) is a descriptor the application can block on, or put into its
//! own `epoll`/`poll` set ([`CompChannel::as_fd`]); a CQ made with [`Device::create_cq_with_channel`] signals it
//! once per [`Cq::req_notify`] (arm), when a completion arrives after the arm: any completion, or with
//! `solicited_only` only a receive of a message sent with the solicited-event bit ([`SendWr::solicited`]) or a
//! failed completion (IB semantics). [`CompChannel::get_cq_event`] waits (with or without a timeout) and names the
//! CQ; [`Cq::ack_events`] counts what was handled. An event is a hint to poll: arm again before the next sleep.
//! The pattern that loses no wake-up (the re-poll after arming catches a completion that arrived before the arm
//! was seen):
//!
//! ```no_run
//! # use roce_dp::client::{Device, Error};
//! # fn main() -> Result<(), Error> {
//! # let dev = Device::open("/run/roce-dpd.sock")?;
//! let ch = dev.create_comp_channel()?;
//! let mut cq = dev.create_cq_with_channel(256, &ch)?;
//! let mut wc = [roce_dp::Cqe::EMPTY; 16];
//! loop {
//!     let n = cq.poll(&mut wc)?;
//!     if n > 0 { /* handle wc[..n] */ continue; }
//!     cq.req_notify(false)?;             // 1. arm
//!     if cq.poll(&mut wc)? > 0 { /* 2. re-poll: handle, then loop */ continue; }
//!     if let Some(_cq) = ch.get_cq_event(None)? {   // 3. sleep until the daemon signals
//!         cq.ack_events(1);
//!     }
//! }
//! # }
//! ```
//!
//! How it works: the CQ region has a notification block ([`abi::CqNotify`](super::abi::CqNotify)). `req_notify`
//! stores an arm word (a new 31-bit sequence number and the solicited-only bit) and then a SeqCst fence; the
//! daemon's worker, after publishing CQEs into an armed CQ's ring, issues a SeqCst fence and loads the arm word: by
//! the fences, either the worker sees the arm or the client's re-poll sees the CQEs, so no completion slips
//! between the last poll and the sleep. When the arm's sequence is new (and the batch answers it), the worker
//! records it as answered (its own copy, and the block's `fired` word), and sends one byte on the channel's
//! socket: one system call on that edge, none per CQE otherwise. `get_cq_event` drains the socket, then compares
//! each of its CQs' `fired` word with the last one it reported, so it can name the CQ(s) that fired; spurious
//! wake-ups are possible (poll and find nothing), lost ones are not.
//!
//! The channel is a `SOCK_SEQPACKET` socket pair the daemon makes (one pair per channel; the client gets its end
//! with the reply), not an eventfd the client makes and passes: an eventfd's file description is shared with the
//! client, which could clear `O_NONBLOCK` and fill the counter to its maximum, and the worker's next `write`
//! would block forever. A send with `MSG_DONTWAIT | MSG_NOSIGNAL` cannot block or raise SIGPIPE whatever the
//! client does with its end, and the daemon never has to check what kind of descriptor a client handed it. A full
//! socket queue only drops the byte (the end is readable anyway). The daemon's end closes when the session ends:
//! a waiting client sees end-of-stream ([`Error::DaemonGone`]) when the daemon stops or dies.

// Two `unsafe` calls: attaching the client side of a ring region the daemon just sent (one per CQ and QP).
#![allow(unsafe_code)]

use core::fmt;
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::abi::ABI_VERSION;
use super::proto::{Conn, ProtoError, Request, Response};
pub use super::proto::{DeviceInfo, ErrorCode, ModifyQp, StatRecord};
use super::ring::{NotifyView, RingError};
use super::shm::{self, Backing, ClientCqRegion, ClientQpRegion, ShmError, ShmRegion};
use super::wq::WqError;
pub use crate::engine::QpInfo;
use crate::mr::AccessFlags;
use crate::qp::{QpAttr, QpState};
use crate::verbs::{Cqe, SendWr, Sge};

/// What went wrong, with a message a user can act on. `{:?}` prints that message too (what `fn main() ->
/// Result<(), Error>` and `unwrap` show: one line naming the problem and what to do, not the variant's fields);
/// `{:#?}` puts the variant's name before it.
pub enum Error {
    /// Nothing listens on the socket.
    DaemonAbsent {
        /// The socket path.
        path: PathBuf,
    },
    /// The path exists but is not a socket (a typo, or a file where the daemon's socket should be).
    NotASocket {
        /// The path.
        path: PathBuf,
    },
    /// The path can name no Unix socket: empty, or longer than a socket address holds ([`MAX_SOCKET_PATH`]).
    BadSocketPath {
        /// The path.
        path: PathBuf,
    },
    /// The socket exists but this user may not connect to it.
    PermissionDenied {
        /// The socket path.
        path: PathBuf,
    },
    /// The daemon and this library disagree on the shared-memory ABI (the daemon's one-line explanation).
    AbiMismatch(String),
    /// The daemon stopped, restarted or closed the connection.
    DaemonGone {
        /// The socket path.
        path: PathBuf,
        /// What the daemon said, or how the connection ended.
        reason: String,
    },
    /// The daemon did not answer a control call in time ([`Device::set_call_timeout`]): it is stopped
    /// (SIGSTOP), stuck, or the socket is another program's. The session stays open: a late answer is discarded.
    Timeout {
        /// The socket path.
        path: PathBuf,
        /// The request that got no answer.
        request: &'static str,
        /// How long the call waited.
        waited: Duration,
    },
    /// The daemon refused the request.
    Refused {
        /// Category.
        code: ErrorCode,
        /// The daemon's message.
        msg: String,
    },
    /// A shared region could not be created or mapped here.
    Shm(ShmError),
    /// The send or receive queue is full (poll completions first).
    QueueFull,
    /// A work request the library refuses to post (too many SGEs, bad lengths).
    BadRequest(WqError),
    /// The daemon answered something this library cannot use, or corrupted a ring of shared memory.
    Protocol(String),
    /// [`Cq::req_notify`] or [`Cq::set_event_moderation`] on a CQ made without a completion channel.
    NoChannel {
        /// The CQ's handle.
        cq: u32,
    },
    /// [`Cq::set_event_moderation`] with a count but no period, or a period but no count.
    BadModeration {
        /// The count asked for.
        count: u16,
        /// The period asked for, in microseconds.
        period_us: u16,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::DaemonAbsent { path } => write!(
                f,
                "no roce-dpd listening on {}: start it with `roce-dpd --config conf/NAME.toml` (its [daemon] socket)",
                path.display()
            ),
            Error::NotASocket { path } => write!(
                f,
                "{} is not a socket: give the socket roce-dpd listens on (its config's [daemon] socket)",
                path.display()
            ),
            Error::BadSocketPath { path } if path.as_os_str().is_empty() => f.write_str(
                "the socket path is empty: give the socket roce-dpd listens on (its config's [daemon] socket)",
            ),
            Error::BadSocketPath { path } => write!(
                f,
                "{} is {} bytes long: a Unix socket path holds at most {MAX_SOCKET_PATH}, so no roce-dpd listens there \
                 (give its config's [daemon] socket)",
                path.display(),
                path.as_os_str().len()
            ),
            Error::PermissionDenied { path } => write!(
                f,
                "permission denied on {}: the daemon's socket is owner-only by default; run as its user or set \
                 [daemon] socket_mode",
                path.display()
            ),
            Error::AbiMismatch(msg) => f.write_str(msg),
            Error::DaemonGone { path, reason } => {
                write!(
                    f,
                    "roce-dpd on {} is gone ({reason}): every QP of this process is lost; reopen the device",
                    path.display()
                )
            }
            Error::Timeout { path, request, waited } => write!(
                f,
                "roce-dpd on {} did not answer {request} within {:.1} s: is it stopped (SIGSTOP) or stuck, or is that \
                 socket another program's? (the limit: Device::set_call_timeout)",
                path.display(),
                waited.as_secs_f64()
            ),
            Error::Refused { msg, .. } => write!(f, "roce-dpd refused: {msg}"),
            Error::Shm(e) => write!(f, "{e}"),
            Error::QueueFull => f.write_str("work queue full: poll completions before posting more"),
            Error::BadRequest(e) => write!(f, "work request refused: {e}"),
            Error::Protocol(what) => write!(f, "unexpected answer from roce-dpd: {what}"),
            Error::NoChannel { cq } => {
                write!(f, "CQ {cq} has no completion channel to notify: create it with Device::create_cq_with_channel")
            }
            Error::BadModeration { count, period_us } => write!(
                f,
                "CQ event moderation count {count} with period {period_us} us: give both a count (>= 1) and a \
                 period (1-65535 us; a count alone could hold an event forever), or 0 and 0 to turn it off"
            ),
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            let variant = match self {
                Error::DaemonAbsent { .. } => "DaemonAbsent",
                Error::NotASocket { .. } => "NotASocket",
                Error::BadSocketPath { .. } => "BadSocketPath",
                Error::PermissionDenied { .. } => "PermissionDenied",
                Error::AbiMismatch(_) => "AbiMismatch",
                Error::DaemonGone { .. } => "DaemonGone",
                Error::Timeout { .. } => "Timeout",
                Error::Refused { code, .. } => return write!(f, "Refused({code:?}): {self}"),
                Error::Shm(_) => "Shm",
                Error::QueueFull => "QueueFull",
                Error::BadRequest(_) => "BadRequest",
                Error::Protocol(_) => "Protocol",
                Error::NoChannel { .. } => "NoChannel",
                Error::BadModeration { .. } => "BadModeration",
            };
            write!(f, "{variant}: {self}")
        } else {
            fmt::Display::fmt(self, f)
        }
    }
}

impl std::error::Error for Error {}

impl From<ShmError> for Error {
    fn from(e: ShmError) -> Error {
        Error::Shm(e)
    }
}

fn wq_err(e: WqError) -> Error {
    match e {
        WqError::Ring(RingError::Full) => Error::QueueFull,
        // The daemon's index, not the application's WR: the QP's ring is unusable from now on.
        WqError::Ring(e @ RingError::Corrupt { .. }) => Error::Protocol(format!("work queue: {e}")),
        e => Error::BadRequest(e),
    }
}

/// The longest path a Unix socket address holds (`sun_path` is 108 bytes with its terminating NUL); `roce-dpd`
/// refuses a longer `[daemon] socket` too.
pub const MAX_SOCKET_PATH: usize = 107;

/// How long a control call waits for the daemon's answer unless the application says otherwise
/// ([`Device::open_with_timeout`], [`Device::set_call_timeout`]). A `ModifyQp` that resolves the peer's MAC takes up
/// to the daemon's resolution timeout (3 s); everything else answers in microseconds.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(10);

struct Inner {
    conn: Mutex<Conn>,
    /// The control-call timeout, in microseconds.
    timeout_us: std::sync::atomic::AtomicU64,
    seq: AtomicU32,
    /// The oldest request sent whose answer has not been read (changed only under `conn`'s lock, by
    /// [`Inner::settle`]): the daemon answers in order, so an answer to request N says that those before N are
    /// answered (or their answers lost).
    answered: AtomicU32,
    info: DeviceInfo,
    path: PathBuf,
    gone: Mutex<Option<String>>,
    regions: AtomicU32,
    checking: AtomicBool,
    /// The last call timed out and no answer came since: destroying objects on drop then only sends the request
    /// (dropping a device with many objects must not wait one timeout per object).
    stalled: AtomicBool,
    /// Destroys the daemon refused as busy because something of this session still used the object (a PD dropped
    /// before its QPs or MRs, a CQ before its QPs, a channel before its CQs: verbs' EBUSY, which a drop cannot
    /// return). Retried after each destroy that succeeds, so the object goes with its last user instead of
    /// staying, and counting against the session's limits, until the session ends. A QP's destroy (which no
    /// honest daemon refuses as busy) keeps its CQ records, so that the retry's answer settles them too. Put here
    /// by [`Inner::settle`] whichever call reads the refusal: a refusal that came after its call timed out too.
    deferred: Mutex<Vec<(Request, Destroying)>>,
    /// Destroys sent on drop and not answered yet (changed only under `conn`'s lock): each answer settles its QP's
    /// CQ records with its tails, or defers a busy one ([`Inner::settle`]), whichever call reads it, before that
    /// call lets go of the connection.
    destroying: Mutex<Vec<PendingDestroy>>,
}

/// A QP destroy's QP number and its CQs' records (the send CQ's first); `None` for other destroys.
type Destroying = Option<(u32, Vec<Arc<StaleQps>>)>;

/// A destroy waiting for its answer: the request's sequence number, the request, and for a QP's its number and its
/// CQs' records (the send CQ's first).
struct PendingDestroy {
    seq: u32,
    q: Request,
    qp: Destroying,
}

impl Inner {
    fn gone(&self, reason: String) -> Error {
        let mut g = self.gone.lock().expect("gone");
        let reason = g.get_or_insert(reason).clone();
        Error::DaemonGone { path: self.path.clone(), reason }
    }

    fn proto(&self, e: ProtoError) -> Error {
        match e {
            ProtoError::Io(None) => self.gone("the daemon closed the connection".into()),
            ProtoError::Io(Some(e)) => self.gone(e.to_string()),
            ProtoError::Partial(e, n) => self.gone(format!("a request was cut after {n} bytes ({e})")),
            ProtoError::Shm(ShmError::Os { op, errno }) => {
                self.gone(format!("{op}: {}", std::io::Error::from_raw_os_error(errno)))
            }
            e => Error::Protocol(e.to_string()),
        }
    }

    fn timeout(&self) -> Duration {
        Duration::from_micros(self.timeout_us.load(Ordering::Relaxed))
    }

    /// One request, its answer and the descriptors that came with it, waiting at most the call timeout for the
    /// answer ([`Error::Timeout`]; a late answer is recognised by its sequence number and discarded).
    fn call(&self, q: &Request, fds: &[std::os::fd::BorrowedFd<'_>]) -> Result<(Response, Vec<OwnedFd>), Error> {
        self.call_fds(q, fds).map(|(r, fds, _)| (r, fds))
    }

    /// [`call`](Self::call), also saying whether descriptors the answer carried were lost for lack of room in
    /// this process's descriptor table (RLIMIT_NOFILE).
    fn call_fds(
        &self,
        q: &Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
    ) -> Result<(Response, Vec<OwnedFd>, bool), Error> {
        self.call_as(q, fds, None)
    }

    /// [`call_fds`](Self::call_fds), of a destroy on drop when `destroying` is `Some` (naming a QP's number and CQ
    /// records for a QP's): registered under its sequence number once the request went, so that its answer
    /// settles the records, or defers a busy refusal, whenever it comes.
    fn call_as(
        &self,
        q: &Request,
        fds: &[std::os::fd::BorrowedFd<'_>],
        destroying: Option<Destroying>,
    ) -> Result<(Response, Vec<OwnedFd>, bool), Error> {
        if let Some(r) = self.gone.lock().expect("gone").clone() {
            return Err(Error::DaemonGone { path: self.path.clone(), reason: r });
        }
        let waited = self.timeout();
        let timed_out = || Error::Timeout { path: self.path.clone(), request: q.name(), waited };
        // Another thread's call holds the connection for at most its own timeout.
        let mut conn = self.conn.lock().expect("conn");
        let deadline = Instant::now() + waited;
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = conn.send_request(seq, q, fds) {
            // The daemon may have said why before it closed the socket (an answer read here still settles).
            if let Some(f) = conn.try_recv_response().ok().flatten() {
                self.settle(f.seq, &f.msg);
                if let Some(why) = notice(&f.msg) {
                    return Err(self.gone(why));
                }
                // Its refusal of this very request, sent before it read it: roce-dpd out of descriptors answers a
                // new session's Hello after waiting for it at most 100 ms, then closes. A client slower than that
                // to send its Hello got "gone (Broken pipe)" instead of the daemon's line.
                if let (true, Response::Error { code, msg }) = (f.seq == seq, f.msg) {
                    return Err(Error::Refused { code, msg });
                }
            }
            // The socket's send timeout (the call timeout) ran out: a request this small only waits when the
            // daemon has stopped reading.
            if let ProtoError::Io(Some(io)) = &e {
                if io.kind() == std::io::ErrorKind::WouldBlock {
                    return Err(timed_out());
                }
            }
            return Err(self.proto(e));
        }
        // Registered once the request went (under the connection's lock, so before any read of its answer): a
        // request that did not go has none to wait for.
        if let Some(d) = destroying {
            self.register(seq, q, d);
        }
        // Past the deadline: only what is already here, without waiting (see below).
        let mut late = false;
        loop {
            let next = if late { conn.try_recv_response() } else { conn.recv_response_until(Some(deadline)) };
            let Some(f) = next.map_err(|e| self.proto(e))? else {
                self.stalled.store(true, Ordering::Relaxed);
                return Err(timed_out());
            };
            self.stalled.store(false, Ordering::Relaxed);
            let in_order = self.settle(f.seq, &f.msg);
            match f.msg {
                Response::Shutdown { .. } | Response::Closed { .. } => {
                    return Err(self.gone(notice(&f.msg).unwrap_or_default()))
                }
                // Another request's answer (a late one): the wait for this one goes on until its deadline, which
                // only a look at the socket checked (a daemon that always had more of them to send kept the call
                // reading past it, for as long as it sent them). Past the deadline (a thread descheduled while
                // the answers came), the call still reads what is already here without waiting, and takes its own
                // answer if it comes next after late answers to earlier requests, each in order: at most as many
                // as requests went unanswered before this one, so a daemon with endless answers to send cannot
                // keep it reading. Anything else there ends the call.
                _ if f.seq != seq => {
                    if late || Instant::now() >= deadline {
                        if !in_order {
                            self.stalled.store(true, Ordering::Relaxed);
                            return Err(timed_out());
                        }
                        late = true;
                    }
                    continue;
                }
                Response::Error { code: ErrorCode::Abi, msg } => return Err(Error::AbiMismatch(msg)),
                Response::Error { code: ErrorCode::ShuttingDown, msg } => return Err(self.gone(msg)),
                Response::Error { code, msg } => return Err(Error::Refused { code, msg }),
                r => return Ok((r, f.fds, f.fds_lost)),
            }
        }
    }

    /// Data-path liveness check: without blocking, has the daemon closed the socket or sent its notice?
    fn check_alive(&self) -> Result<(), Error> {
        if let Some(r) = self.gone.lock().expect("gone").clone() {
            return Err(Error::DaemonGone { path: self.path.clone(), reason: r });
        }
        if self.checking.swap(true, Ordering::Acquire) {
            return Ok(());
        }
        // Never blocks: half a frame from a broken daemon stays buffered instead of making the poll wait for the
        // rest.
        let r = match self.conn.try_lock() {
            Ok(mut conn) => match conn.try_recv_response() {
                Ok(Some(Frame { msg, .. })) if notice(&msg).is_some() => {
                    Err(self.gone(notice(&msg).unwrap_or_default()))
                }
                // A late answer (a call that timed out): a QP destroy's still settles its records.
                Ok(Some(f)) => {
                    self.settle(f.seq, &f.msg);
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(e) => Err(self.proto(e)),
            },
            Err(_) => Ok(()),
        };
        self.checking.store(false, Ordering::Release);
        r
    }

    /// Destroys a daemon object on drop (errors only matter while the daemon lives; then they are bugs).
    fn destroy(&self, q: Request) {
        self.destroy_as(q, None)
    }

    /// Destroys QP `qpn` on drop. Until its answer comes, every completion of it in `cqs` (its CQs' records, the
    /// send CQ's first) is skipped: the daemon may still write some (it has not read the request yet, or it is not
    /// answering and the request only goes); the answer then says where they end ([`Response::QpDestroyed`]).
    fn destroy_qp(&self, qpn: u32, cqs: &[Arc<StaleQps>]) {
        for s in cqs {
            s.destroying(qpn);
        }
        self.destroy_as(Request::DestroyQp { qpn }, Some((qpn, cqs.to_vec())));
    }

    fn destroy_as(&self, q: Request, destroying: Destroying) {
        if self.gone.lock().expect("gone").is_some() {
            return;
        }
        if self.stalled.load(Ordering::Relaxed) {
            // The daemon is not answering: say it without waiting (its answer, if it comes, settles a QP destroy's
            // records and is otherwise discarded; what it does not destroy it reclaims when the session ends).
            let conn = self.conn.lock().expect("conn");
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            if conn.send_request(seq, &q, &[]).is_ok() {
                self.register(seq, &q, destroying);
            }
            return;
        }
        // A busy refusal is deferred by `settle`, which reads it (here, or later if this call times out).
        if self.call_as(&q, &[], Some(destroying)).is_ok() {
            self.retry_deferred();
        }
    }

    /// Registers a destroy sent on drop as request `seq` (called under `conn`'s lock, before any read of its
    /// answer).
    fn register(&self, seq: u32, q: &Request, qp: Destroying) {
        self.pending_destroys().push(PendingDestroy { seq, q: q.clone(), qp });
    }

    fn pending_destroys(&self) -> std::sync::MutexGuard<'_, Vec<PendingDestroy>> {
        self.destroying.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A frame read from the daemon (called under `conn`'s lock): the answer to a registered QP destroy settles
    /// its CQs' records with the tails it carries; a busy refusal of a registered destroy (a QP's too) goes to
    /// `deferred`, to be retried, also when it came after its call timed out. Any other answer to a QP's destroy
    /// (a refusal: the QP was not destroyed; it goes when the session ends) leaves its completions skipped. The
    /// daemon answers a session's requests in order, so an answer to a later request says that an earlier
    /// destroy's answer was lost (a daemon that answered it under another sequence number, or a frame that could
    /// not be read): the QP's completions are then those before the rings' tails now, as the daemon wrote none of
    /// it after it handled the destroy, and its records do not skip a later QP of the same number for the rest of
    /// the session. An answer to a request never sent (a sequence number not given yet) says nothing of any.
    ///
    /// Returns whether the frame answers the oldest request still unanswered or a later one that went (in the
    /// daemon's order: the answers before it were lost), and so moves [`Inner::answered`] on.
    fn settle(&self, seq: u32, msg: &Response) -> bool {
        if notice(msg).is_some() {
            return false;
        }
        let oldest = self.answered.load(Ordering::Relaxed);
        let sent = before(seq, self.seq.load(Ordering::Relaxed));
        let in_order = !before(seq, oldest) && sent;
        if in_order {
            self.answered.store(seq.wrapping_add(1), Ordering::Relaxed);
        }
        // An answer to a request never sent settles no destroy: settle_destroys takes every destroy sent up to
        // `seq`, so a daemon answering a request from the future would end a destroyed QP's skipping while it
        // could still write completions of it.
        if sent {
            self.settle_destroys(seq, msg);
        }
        in_order
    }

    /// [`settle`](Self::settle)'s part for destroys sent on drop; `seq` is a request that went.
    fn settle_destroys(&self, seq: u32, msg: &Response) {
        let done: Vec<PendingDestroy> = {
            let mut p = self.pending_destroys();
            if p.is_empty() {
                return;
            }
            // Those sent up to `seq` (before: the test's arguments were swapped, so an answer settled the destroys
            // sent after it, whose answers were still to come, and kept those before it waiting).
            let (done, waiting) = std::mem::take(&mut *p).into_iter().partition(|d| !after(d.seq, seq));
            *p = waiting;
            done
        };
        for d in done {
            let tails = match *msg {
                Response::QpDestroyed { send_tail, recv_tail } if d.seq == seq => [Some(send_tail), Some(recv_tail)],
                Response::Error { code: ErrorCode::Busy, .. } if d.seq == seq => {
                    self.deferred().push((d.q, d.qp));
                    continue;
                }
                _ if d.seq == seq => continue,
                _ => [None, None],
            };
            if let Some((qpn, cqs)) = &d.qp {
                for (s, tail) in cqs.iter().zip(tails) {
                    s.destroyed(*qpn, tail);
                }
            }
        }
    }

    fn deferred(&self) -> std::sync::MutexGuard<'_, Vec<(Request, Destroying)>> {
        self.deferred.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Retries the destroys refused as busy (see `deferred`), as long as each round frees something: a QP's
    /// destroy can free its CQ, whose destroy can free its channel.
    fn retry_deferred(&self) {
        loop {
            let pending = std::mem::take(&mut *self.deferred());
            if pending.is_empty() {
                return;
            }
            let mut progress = false;
            for (q, destroying) in pending {
                // Registered again: its answer settles a QP's records; a busy refusal defers it again (settle).
                progress |= self.call_as(&q, &[], Some(destroying)).is_ok();
            }
            if !progress {
                return;
            }
        }
    }
}

use super::proto::Frame;

/// A device's information before its `Hello` is answered.
const NO_INFO: DeviceInfo = DeviceInfo { abi: 0, pid: 0, mac: [0; 6], ipv4: None, ipv6: None, mtu: 0, hugetlb: false };

/// An open device: the session with the daemon.
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device").field("path", &self.inner.path).field("info", &self.inner.info).finish()
    }
}

impl Device {
    /// Connects to the daemon's socket and opens the device (the shared-memory ABI versions must agree). Every
    /// control call, this one included, waits at most [`DEFAULT_CALL_TIMEOUT`] for the daemon's answer
    /// ([`Error::Timeout`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Device, Error> {
        Self::open_with_timeout(path.as_ref(), DEFAULT_CALL_TIMEOUT)
    }

    /// [`open`](Self::open) with another control-call timeout (for this call and every later one; see
    /// [`set_call_timeout`](Self::set_call_timeout)).
    pub fn open_with_timeout(path: impl AsRef<Path>, timeout: Duration) -> Result<Device, Error> {
        Self::open_inner(path.as_ref(), ABI_VERSION, timeout)
    }

    /// [`open`](Self::open) claiming another ABI version: for tests of the daemon's mismatch answer.
    #[doc(hidden)]
    pub fn open_as(path: &Path, abi: u32) -> Result<Device, Error> {
        Self::open_inner(path, abi, DEFAULT_CALL_TIMEOUT)
    }

    /// How long each control call (PD, MR, CQ, QP, modify, query, destroy, statistics) waits for the daemon's
    /// answer before it fails with [`Error::Timeout`]; at least 1 ms. Posting and polling never wait on the daemon.
    pub fn set_call_timeout(&self, timeout: Duration) {
        let t = timeout.max(Duration::from_millis(1));
        self.inner.timeout_us.store(u64::try_from(t.as_micros()).unwrap_or(u64::MAX), Ordering::Relaxed);
        let _ = self.inner.conn.lock().expect("conn").socket().set_write_timeout(Some(t));
    }

    /// The control-call timeout.
    pub fn call_timeout(&self) -> Duration {
        self.inner.timeout()
    }

    fn open_inner(path: &Path, abi: u32, timeout: Duration) -> Result<Device, Error> {
        let timeout = timeout.max(Duration::from_millis(1));
        // connect(2) refuses these with EINVAL, which said "roce-dpd on  is gone ... reopen the device".
        let len = path.as_os_str().len();
        if len == 0 || len > MAX_SOCKET_PATH {
            return Err(Error::BadSocketPath { path: path.to_owned() });
        }
        let sock = UnixStream::connect(path).map_err(|e| match e.raw_os_error() {
            Some(libc::EACCES | libc::EPERM) => Error::PermissionDenied { path: path.to_owned() },
            Some(libc::ENOENT | libc::ECONNREFUSED | libc::ENOTSOCK) => match std::fs::metadata(path) {
                Ok(m) if !m.file_type().is_socket() => Error::NotASocket { path: path.to_owned() },
                _ => Error::DaemonAbsent { path: path.to_owned() },
            },
            _ => Error::DaemonGone { path: path.to_owned(), reason: format!("connect: {e}") },
        })?;
        Self::open_on(sock, path, abi, timeout)
    }

    /// The session on `sock`, connected to the daemon's socket `path`: its Hello.
    fn open_on(sock: UnixStream, path: &Path, abi: u32, timeout: Duration) -> Result<Device, Error> {
        // Bounds the send of a request too (a daemon that stopped reading); EINTR is retried.
        sock.set_write_timeout(Some(timeout))
            .map_err(|e| Error::DaemonGone { path: path.to_owned(), reason: format!("SO_SNDTIMEO: {e}") })?;
        let mut inner = Inner {
            conn: Mutex::new(Conn::new(sock)),
            timeout_us: std::sync::atomic::AtomicU64::new(u64::try_from(timeout.as_micros()).unwrap_or(u64::MAX)),
            seq: AtomicU32::new(1),
            answered: AtomicU32::new(1),
            info: NO_INFO,
            path: path.to_owned(),
            gone: Mutex::new(None),
            regions: AtomicU32::new(0),
            checking: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            deferred: Mutex::new(Vec::new()),
            destroying: Mutex::new(Vec::new()),
        };
        match inner.call(&Request::Hello { abi }, &[])? {
            (Response::Hello(info), _) => inner.info = info,
            (r, _) => return Err(Error::Protocol(format!("{r:?} to Hello"))),
        }
        Ok(Device { inner: Arc::new(inner) })
    }

    /// What the daemon told us: addresses, MTU, memory backing.
    pub fn info(&self) -> DeviceInfo {
        self.inner.info
    }

    /// The port's GID: the IPv4-mapped address if it has IPv4, else its IPv6 address.
    pub fn gid(&self) -> [u8; 16] {
        match (self.inner.info.ipv4, self.inner.info.ipv6) {
            (Some(a), _) => std::net::Ipv4Addr::from(a).to_ipv6_mapped().octets(),
            (None, Some(a)) => a,
            (None, None) => [0; 16],
        }
    }

    /// Allocates a protection domain.
    pub fn alloc_pd(&self) -> Result<Pd, Error> {
        match self.inner.call(&Request::AllocPd, &[])? {
            (Response::Pd { pd }, _) => Ok(Pd { dev: self.inner.clone(), pd }),
            (r, _) => Err(Error::Protocol(format!("{r:?} to AllocPd"))),
        }
    }

    /// Creates a completion queue of at least `depth` entries (polling only).
    pub fn create_cq(&self, depth: u32) -> Result<Cq, Error> {
        self.make_cq(depth, None)
    }

    /// Creates a completion queue of at least `depth` entries that signals `channel` when armed
    /// ([`Cq::req_notify`]).
    pub fn create_cq_with_channel(&self, depth: u32, channel: &CompChannel) -> Result<Cq, Error> {
        self.make_cq(depth, Some(channel))
    }

    fn make_cq(&self, depth: u32, channel: Option<&CompChannel>) -> Result<Cq, Error> {
        let q = Request::CreateCq { depth, channel: channel.map(|c| c.inner.id) };
        let (r, mut fds, lost) = self.inner.call_fds(&q, &[])?;
        let Response::Cq { cq } = r else { return Err(Error::Protocol(format!("{r:?} to CreateCq"))) };
        let guard = Guard(&self.inner, Some(Request::DestroyCq { cq }));
        let fd = answer_fd(fds.pop(), lost, "CreateCq answer without its region")?;
        // SAFETY: the daemon sent this region for this new CQ; this is its only ClientCqRegion in the process.
        let region = unsafe { ClientCqRegion::open(fd)? };
        guard.disarm();
        let channel = channel.map(|c| {
            let entry = ChanCq { handle: cq, notify: region.notify.clone(), reported: 0, events: 0, acked: 0 };
            c.inner.state().cqs.push(entry);
            c.inner.clone()
        });
        let stale =
            Arc::new(StaleQps { tail: region.cq.tail_view(), any: AtomicBool::new(false), qps: Mutex::default() });
        Ok(Cq { dev: self.inner.clone(), cq, region, empty_polls: 0, channel, arm_seq: 0, stale })
    }

    /// Creates a completion channel (`ibv_create_comp_channel`): see the module documentation.
    pub fn create_comp_channel(&self) -> Result<CompChannel, Error> {
        let (r, mut fds, lost) = self.inner.call_fds(&Request::CreateCompChannel, &[])?;
        let Response::Channel { channel } = r else {
            return Err(Error::Protocol(format!("{r:?} to CreateCompChannel")));
        };
        let guard = Guard(&self.inner, Some(Request::DestroyCompChannel { channel }));
        let fd = answer_fd(fds.pop(), lost, "CreateCompChannel answer without its socket")?;
        // Blocking: a wait is one `recv` (see `get_cq_event`); the reads that must not wait say so.
        shm::channel_blocking(fd.as_fd())?;
        guard.disarm();
        let state = Mutex::new(ChannelState { cqs: Vec::new(), ready: VecDeque::new() });
        let (timeo_us, waiters) = (AtomicU64::new(0), AtomicU32::new(0));
        let inner = ChannelInner { dev: self.inner.clone(), id: channel, fd, state, timeo_us, waiters };
        Ok(CompChannel { inner: Arc::new(inner) })
    }

    /// Creates an RC QP in the RESET state whose completions go to `send_cq` and `recv_cq`.
    pub fn create_qp(&self, pd: &Pd, send_cq: &Cq, recv_cq: &Cq, init: QpInit) -> Result<Qp, Error> {
        let q = Request::CreateQp {
            pd: pd.pd,
            send_cq: send_cq.cq,
            recv_cq: recv_cq.cq,
            sq_depth: init.sq_depth,
            rq_depth: init.rq_depth,
            max_send_sge: init.max_send_sge,
            max_recv_sge: init.max_recv_sge,
            max_inline: init.max_inline,
        };
        let (r, mut fds, lost) = self.inner.call_fds(&q, &[])?;
        let Response::Qp { qpn } = r else { return Err(Error::Protocol(format!("{r:?} to CreateQp"))) };
        let guard = Guard(&self.inner, Some(Request::DestroyQp { qpn }));
        let fd = answer_fd(fds.pop(), lost, "CreateQp answer without its region")?;
        // SAFETY: the daemon sent this region for this new QP; this is its only ClientQpRegion in the process.
        let region = unsafe { ClientQpRegion::open(fd)? };
        guard.disarm();
        let mut cqs = vec![send_cq.stale.clone()];
        if recv_cq.cq != send_cq.cq {
            cqs.push(recv_cq.stale.clone());
        }
        Ok(Qp { dev: self.inner.clone(), qpn, region, cqs })
    }

    /// Every counter of the daemon (see [`super::proto`]'s statistics section).
    pub fn stats(&self) -> Result<Vec<StatRecord>, Error> {
        let (mut all, total) = match self.inner.call(&Request::Stats, &[])? {
            (Response::Stats(v), _) => return Ok(v),
            // A daemon claiming more records than any daemon has (16 workers x 4096 QPs x ~50 counters is ~3.3
            // million) is not believed: it could make us allocate without bound, one small page at a time.
            (Response::StatsPage { total, recs }, _) if !recs.is_empty() && total <= MAX_STAT_RECORDS => {
                (recs, total as usize)
            }
            (r, _) => return Err(Error::Protocol(format!("{} to Stats", short(&r)))),
        };
        // The rest of the daemon's snapshot, page by page; every page must move on and agree on the total.
        while all.len() < total {
            let first = all.len() as u32;
            match self.inner.call(&Request::StatsFrom { first }, &[])? {
                (Response::StatsPage { total: t, recs }, _)
                    if t as usize == total && !recs.is_empty() && recs.len() <= total - all.len() =>
                {
                    all.extend(recs)
                }
                (r, _) => return Err(Error::Protocol(format!("{} to StatsFrom {first} of {total}", short(&r)))),
            }
        }
        Ok(all)
    }

    /// Closes the connection without destroying anything, as the kernel does when the process dies: for tests of
    /// the daemon's reclaim.
    #[doc(hidden)]
    pub fn abandon(&self) {
        let _ = self.inner.conn.lock().expect("conn").socket().shutdown(std::net::Shutdown::Both);
    }

    /// Without blocking: an error if the daemon has closed the connection or announced its shutdown.
    pub fn check_alive(&self) -> Result<(), Error> {
        self.inner.check_alive()
    }
}

/// The most statistics records [`Device::stats`] takes from a daemon in pages.
pub const MAX_STAT_RECORDS: u32 = 1 << 22;

/// A response for an error message: its kind and, for statistics, only the record count (not megabytes of them).
fn short(r: &Response) -> String {
    match r {
        Response::Stats(v) => format!("Stats ({} records)", v.len()),
        Response::StatsPage { total, recs } => format!("StatsPage ({} of {total} records)", recs.len()),
        r => format!("{r:?}"),
    }
}

/// Destroys a half-made object if creation fails after the daemon made it.
struct Guard<'a>(&'a Inner, Option<Request>);

impl Guard<'_> {
    fn disarm(mut self) {
        self.1 = None;
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        if let Some(q) = self.1.take() {
            self.0.destroy(q);
        }
    }
}

/// A protection domain.
pub struct Pd {
    dev: Arc<Inner>,
    pd: u32,
}

impl Pd {
    /// The handle.
    pub fn handle(&self) -> u32 {
        self.pd
    }

    /// Allocates a `len`-byte buffer in shared memory (memfd; huge pages when the daemon is configured so) and
    /// registers it with `access`.
    pub fn reg_mr(&self, len: usize, access: AccessFlags) -> Result<Mr, Error> {
        let backing = if self.dev.info.hugetlb { Backing::Hugetlb } else { Backing::Pages };
        let n = self.dev.regions.fetch_add(1, Ordering::Relaxed);
        let mut region = ShmRegion::create(&format!("roce-dp-mr-{}-{n}", std::process::id()), len.max(1), backing)?;
        let va = region.as_mut_slice().as_mut_ptr() as u64;
        let q = Request::RegMr { pd: self.pd, va, len: len as u64, offset: 0, access: access.0 };
        let (r, _) = self.dev.call(&q, &[region.fd()])?;
        let Response::Mr { lkey, rkey } = r else { return Err(Error::Protocol(format!("{r:?} to RegMr"))) };
        Ok(Mr { dev: self.dev.clone(), region, lkey, rkey, va, len })
    }
}

impl Drop for Pd {
    fn drop(&mut self) {
        self.dev.destroy(Request::DeallocPd { pd: self.pd });
    }
}

/// A registered buffer in memory shared with the daemon.
pub struct Mr {
    dev: Arc<Inner>,
    region: ShmRegion,
    lkey: u32,
    rkey: u32,
    va: u64,
    len: usize,
}

impl Mr {
    /// The buffer (the daemon writes into it what work requests and peers with its rkey put there).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        let len = self.len;
        &mut self.region.as_mut_slice()[..len]
    }

    /// The buffer, read-only.
    pub fn as_slice(&mut self) -> &[u8] {
        self.as_mut_slice()
    }

    /// Local key.
    pub fn lkey(&self) -> u32 {
        self.lkey
    }

    /// Remote key (give it to the peer).
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The buffer's address (what SGEs and a peer's remote address use).
    pub fn addr(&self) -> u64 {
        self.va
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for a zero-length region.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// An SGE for `len` bytes at `offset` of this region.
    pub fn sge(&self, offset: usize, len: u32) -> Sge {
        // Wrapping: an offset past the region is the daemon's to refuse (LOC_PROT_ERR), not a panic here.
        Sge { addr: self.va.wrapping_add(offset as u64), len, lkey: self.lkey }
    }
}

impl Drop for Mr {
    fn drop(&mut self) {
        self.dev.destroy(Request::DeregMr { lkey: self.lkey });
    }
}

/// A completion queue: its ring is polled without system calls.
pub struct Cq {
    dev: Arc<Inner>,
    cq: u32,
    region: ClientCqRegion,
    empty_polls: u32,
    /// The completion channel it signals, if any.
    channel: Option<Arc<ChannelInner>>,
    /// The last arm sequence written (0: never armed).
    arm_seq: u32,
    /// Destroyed QPs whose completions may still be in the ring.
    stale: Arc<StaleQps>,
}

/// The QPs of a CQ destroyed while completions of theirs may still wait in its ring, each with the ring index
/// before which the daemon wrote them. libmlx5's `ibv_destroy_qp` cleans the QP's CQEs out of its CQs' buffers
/// (`__mlx5_cq_clean`), so an application never polls a completion of a destroyed QP, whose number may by then be
/// another QP's; the daemon drops those it has not delivered, and the library skips those already in the ring
/// (the ring's slots are the daemon's to write, so they are skipped as polled, not moved). A poll costs one load of
/// `any` while no destroyed QP is pending.
///
/// The index is the one the daemon's worker had reached when it destroyed the QP, carried in the destroy's answer
/// ([`Response::QpDestroyed`]), not the ring's tail as the library sees it when the answer comes: by then another
/// thread's QP may have been given the same number (numbers come back once the worker's range wraps) and have
/// completions in the ring, which are not the destroyed QP's. From the drop until the answer is read, every
/// completion of the QP is skipped (`None`): the daemon may still write some, before it reads the request or while
/// it does not answer (the drop then only sends it), and no other QP can have its number before the answer, which
/// comes ahead of any later creation's on the session's socket.
struct StaleQps {
    /// The daemon's index in the ring (None: no shared ring, nothing to skip).
    tail: Option<super::ring::TailView>,
    /// Whether `qps` holds any (changed under its lock).
    any: AtomicBool,
    /// (QP number, the ring index before which its completions are; `None`: its destroy is not answered yet).
    qps: Mutex<Vec<(u32, Option<u32>)>>,
}

impl StaleQps {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<(u32, Option<u32>)>> {
        self.qps.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// QP `qpn` is being destroyed: every completion of it is skipped until [`destroyed`](Self::destroyed).
    fn destroying(&self, qpn: u32) {
        let Some(view) = &self.tail else { return };
        let mut qps = self.lock();
        let read = view.released();
        qps.retain(|&(q, u)| q != qpn && pending(read, u));
        qps.push((qpn, None));
        self.any.store(true, Ordering::Relaxed);
    }

    /// The daemon destroyed QP `qpn` when its worker had written up to ring index `until` (the destroy's answer;
    /// `None`: its answer was lost, and the ring's tail now is used): its completions are those before it. The
    /// daemon published them before it answered, so an index beyond the ring's tail now (a broken daemon's) counts
    /// as the tail: it would skip the completions of a later QP of the number for up to 2^31 entries. Only the
    /// part of the ring not read yet can hold any: nothing is kept when that part ends before `until`, and the
    /// records the polls have read past (or an earlier one of the same number, which this one covers) are
    /// forgotten here too, so a CQ that is never polled (a receive CQ of QPs that only write, say) does not grow a
    /// record for each QP destroyed, and a CQ not polled for a while keeps at most one per QP number.
    fn destroyed(&self, qpn: u32, until: Option<u32>) {
        let Some(view) = &self.tail else { return };
        let mut qps = self.lock();
        let tail = view.load();
        let until = until.filter(|&u| !before(tail, u)).unwrap_or(tail);
        // Under the lock, so no poll of ours retires records meanwhile: the polls have handed back at most what
        // the daemon had written, and a poll running now only takes the head further.
        let read = view.released();
        qps.retain(|&(q, u)| q != qpn && pending(read, u));
        if before(read, until) {
            qps.push((qpn, Some(until)));
        }
        self.any.store(!qps.is_empty(), Ordering::Relaxed);
    }
}

/// Whether a record still matters to a ring read up to index `read`: its destroy is not answered yet, or the
/// ring holds unread entries before its index.
#[inline]
fn pending(read: u32, until: Option<u32>) -> bool {
    until.is_none_or(|u| before(read, u))
}

/// Whether request sequence number `seq` comes after `than` (free-running, like ring indices).
#[inline]
fn after(seq: u32, than: u32) -> bool {
    before(than, seq)
}

/// Whether free-running ring index `i` comes before `until` (their signed distance is positive).
#[inline]
fn before(i: u32, until: u32) -> bool {
    (until.wrapping_sub(i) as i32) > 0
}

/// Empty polls between two looks at the control socket.
const ALIVE_CHECK_EVERY: u32 = 1 << 14;

impl Cq {
    /// The handle.
    pub fn handle(&self) -> u32 {
        self.cq
    }

    /// Up to `out.len()` completions. After many empty polls in a row it looks (one non-blocking `recv`) whether
    /// the daemon is still there, so a caller spinning on an empty queue gets [`Error::DaemonGone`] instead of
    /// spinning forever.
    pub fn poll(&mut self, out: &mut [Cqe]) -> Result<usize, Error> {
        let n = if self.stale.any.load(Ordering::Relaxed) {
            self.poll_skipping_stale(out)
        } else {
            self.region.cq.poll(out)
        };
        let n = n.map_err(|e| Error::Protocol(format!("completion ring: {e}")))?;
        if n > 0 {
            self.empty_polls = 0;
            return Ok(n);
        }
        self.empty_polls += 1;
        if self.empty_polls >= ALIVE_CHECK_EVERY {
            self.empty_polls = 0;
            self.dev.check_alive()?;
        }
        Ok(0)
    }
}

impl Cq {
    /// A poll that skips the completions of destroyed QPs written before their destroy ([`StaleQps`]), and
    /// forgets each such QP once the ring is read past its index.
    fn poll_skipping_stale(&mut self, out: &mut [Cqe]) -> Result<usize, WqError> {
        let mut qps = self.stale.lock();
        let n = self.region.cq.poll_skipping(out, |i, c| qps.iter().any(|&(q, u)| q == c.qpn && pending(i, u)))?;
        let head = self.region.cq.head_index();
        qps.retain(|&(_, u)| pending(head, u));
        if qps.is_empty() {
            self.stale.any.store(false, Ordering::Relaxed);
        }
        Ok(n)
    }

    /// Arms the CQ (`ibv_req_notify_cq`): its channel is signalled once when a completion arrives after this call
    /// (with `solicited_only`, a solicited receive or a failed completion). Poll again after arming before
    /// sleeping (module documentation). No system call: a store into the shared region and a fence.
    pub fn req_notify(&mut self, solicited_only: bool) -> Result<(), Error> {
        if self.channel.is_none() {
            return Err(Error::NoChannel { cq: self.cq });
        }
        self.arm_seq = super::abi::next_arm_seq(self.arm_seq);
        self.region.notify.set_arm(super::abi::arm_word(self.arm_seq, solicited_only));
        // Pairs with the worker's fence after it publishes CQEs (no lost wake-up).
        std::sync::atomic::fence(Ordering::SeqCst);
        Ok(())
    }

    /// Event moderation (`ibv_modify_cq` with `cq_count` and `cq_period`): after an arm, the daemon holds the
    /// event until `count` completions were written into this CQ, counted from the first held one, or until
    /// `period_us` microseconds after it, whichever comes first; a solicited-only arm is not moderated. `(0, 0)`
    /// turns it off (the event comes with the arm's first completion, the default). Fewer events cost fewer
    /// wake-ups when completions come in runs; the caller's queues must then hold enough work that a held event
    /// does not starve them. [`Error::BadModeration`] for a count without a period or a period without a count;
    /// [`Error::NoChannel`] on a CQ without a completion channel.
    pub fn set_event_moderation(&mut self, count: u16, period_us: u16) -> Result<(), Error> {
        if self.channel.is_none() {
            return Err(Error::NoChannel { cq: self.cq });
        }
        if (count == 0) != (period_us == 0) {
            return Err(Error::BadModeration { count, period_us });
        }
        self.region.notify.set_moderation(super::abi::moderation_word(count, period_us));
        Ok(())
    }

    /// How many destroyed QPs this CQ keeps a record of, whose completions a poll is still to skip (for tests).
    #[doc(hidden)]
    pub fn destroyed_qps_pending(&self) -> usize {
        self.stale.lock().len()
    }

    /// Completions waiting in the ring now, without taking any (the re-check after arming, for callers that poll
    /// elsewhere). Those of a QP destroyed since they were written count too, until a poll skips them.
    pub fn pending(&mut self) -> Result<u32, Error> {
        self.region.cq.pending().map_err(|e| Error::Protocol(format!("completion ring: {e}")))
    }

    /// Acknowledges `n` events [`CompChannel::get_cq_event`] returned for this CQ (`ibv_ack_cq_events`). Only
    /// counted: destroying the CQ does not wait for it.
    pub fn ack_events(&self, n: u32) {
        self.with_entry(|e| e.acked += u64::from(n));
    }

    /// Events returned for this CQ so far and how many were acknowledged.
    pub fn events(&self) -> (u64, u64) {
        let mut r = (0, 0);
        self.with_entry(|e| r = (e.events, e.acked));
        r
    }

    fn with_entry(&self, f: impl FnOnce(&mut ChanCq)) {
        if let Some(ch) = &self.channel {
            if let Some(e) = ch.state().cqs.iter_mut().find(|e| e.handle == self.cq) {
                f(e);
            }
        }
    }
}

impl Drop for Cq {
    fn drop(&mut self) {
        self.dev.destroy(Request::DestroyCq { cq: self.cq });
        if let Some(ch) = self.channel.take() {
            let mut st = ch.state();
            st.cqs.retain(|e| e.handle != self.cq);
            st.ready.retain(|&h| h != self.cq);
        }
    }
}

/// A completion channel (`ibv_comp_channel`): see the module documentation. Destroyed (in the daemon) when it and
/// every CQ made with it are dropped.
pub struct CompChannel {
    inner: Arc<ChannelInner>,
}

struct ChannelInner {
    dev: Arc<Inner>,
    id: u32,
    /// Our end of the channel's socket pair (blocking; the reads that must not wait pass `MSG_DONTWAIT`).
    fd: OwnedFd,
    state: Mutex<ChannelState>,
    /// The receive timeout set on `fd` (see [`shm::channel_recv_wait`]).
    timeo_us: AtomicU64,
    /// Threads inside a wait. The receive timeout belongs to the socket, not to a thread: only a thread that waits
    /// alone may set it and `recv` under it (another thread's setting, between this one's and its `recv`, could
    /// turn a timed wait into one without a limit); the others wait by `poll` and take by a non-blocking `recv`.
    waiters: AtomicU32,
}

struct ChannelState {
    cqs: Vec<ChanCq>,
    /// CQs found fired and not returned yet.
    ready: VecDeque<u32>,
}

/// A CQ of a channel, as the channel sees it.
struct ChanCq {
    handle: u32,
    notify: NotifyView,
    /// The daemon's `fired` sequence when this CQ was last returned.
    reported: u32,
    events: u64,
    acked: u64,
}

impl ChannelInner {
    fn state(&self) -> std::sync::MutexGuard<'_, ChannelState> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        self.dev.destroy(Request::DestroyCompChannel { channel: self.id });
    }
}

impl CompChannel {
    /// The handle.
    pub fn handle(&self) -> u32 {
        self.inner.id
    }

    /// Waits for an event, at most `timeout` (`None`: until one comes), and returns the handle of a CQ that fired
    /// (`ibv_get_cq_event`); `Ok(None)` when the time ran out. Several CQs that fired come back one per call.
    /// [`Error::DaemonGone`] when the daemon closed the channel (it stopped or died). `Some(Duration::ZERO)` only
    /// looks (after the descriptor polled readable in an `epoll` set).
    pub fn get_cq_event(&self, timeout: Option<Duration>) -> Result<Option<u32>, Error> {
        // A timeout past the clock's range waits as `None` does (Instant + Duration::MAX panicked).
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        let ch = &self.inner;
        let gone = |e: shm::ShmError| ch.dev.gone(e.to_string());
        // Look at the CQs' `fired` words first and take messages off the socket only by a wait, one per wake-up: a
        // wake-up costs one blocking `recv` (with the socket's receive timeout; a `poll` and a `recv` until session
        // 16). No wake-up is lost: the daemon stores `fired` before it sends, so a message that arrives after a look
        // is there for the `recv`; messages left behind by CQs found without waiting only make a later wait return
        // early (its look finds nothing new and it waits again), and before `Ok(None)` every waiting message is
        // taken, so an `epoll` user is not woken again for nothing. If the `recv` comes back empty before the time
        // is up (a signal, or an application that made the descriptor non-blocking again), the rest of the wait is
        // a `poll` as before; so is every wait of a thread that is not waiting alone (see `ChannelInner::waiters`).
        let mut drained = false;
        loop {
            {
                let mut st = ch.state();
                let ChannelState { cqs, ready } = &mut *st;
                for e in cqs.iter_mut() {
                    let fired = e.notify.fired();
                    if fired != e.reported {
                        e.reported = fired;
                        e.events += 1;
                        if !ready.contains(&e.handle) {
                            ready.push_back(e.handle);
                        }
                    }
                }
                if let Some(h) = ready.pop_front() {
                    return Ok(Some(h));
                }
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            let closed = if left == Some(Duration::ZERO) {
                if drained {
                    return Ok(None);
                }
                drained = true;
                shm::channel_drain(ch.fd.as_fd()).map_err(gone)?.1
            } else {
                let alone = Waiting::enter(&ch.waiters);
                let got = if alone.0 {
                    shm::channel_recv_wait(ch.fd.as_fd(), left, &ch.timeo_us).map_err(gone)?
                } else {
                    shm::RecvWait::Empty
                };
                drop(alone);
                match got {
                    shm::RecvWait::Took => false,
                    shm::RecvWait::Closed => true,
                    shm::RecvWait::Empty if deadline.is_some_and(|d| Instant::now() >= d) => false,
                    shm::RecvWait::Empty => {
                        let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
                        shm::channel_wait(ch.fd.as_fd(), left).map_err(gone)?
                            && shm::channel_take(ch.fd.as_fd(), 1).map_err(gone)?.1
                    }
                }
            };
            if closed {
                ch.dev.check_alive()?;
                return Err(ch.dev.gone("it closed the completion channel".into()));
            }
        }
    }
}

/// A thread inside a channel wait; `.0`: it is the only one (see `ChannelInner::waiters`).
struct Waiting<'a>(bool, &'a AtomicU32);

impl<'a> Waiting<'a> {
    fn enter(waiters: &'a AtomicU32) -> Self {
        Waiting(waiters.fetch_add(1, Ordering::AcqRel) == 0, waiters)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.1.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AsFd for CompChannel {
    /// Readable when an event may be waiting (or the daemon closed the channel): for `epoll`/`poll`; then call
    /// [`get_cq_event`](CompChannel::get_cq_event) with `Some(Duration::ZERO)`. The descriptor is blocking (a
    /// wait is one `recv`); reading it yourself would take wake-ups from `get_cq_event`.
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.inner.fd.as_fd()
    }
}

impl AsRawFd for CompChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.inner.fd.as_raw_fd()
    }
}

/// Queue sizes of a new QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpInit {
    /// Send queue depth (rounded up to a power of two).
    pub sq_depth: u32,
    /// Receive queue depth (rounded up to a power of two).
    pub rq_depth: u32,
    /// SGEs per send WR.
    pub max_send_sge: u8,
    /// SGEs per receive WR.
    pub max_recv_sge: u8,
    /// Bytes of inline data per send WR ([`Qp::post_send_inline`]); 0: none. The daemon rounds it up to a multiple
    /// of [`INLINE_ALIGN`](super::abi::INLINE_ALIGN) (see [`Qp::max_inline`]) and refuses more than
    /// [`MAX_INLINE_DATA`](super::abi::MAX_INLINE_DATA).
    pub max_inline: u32,
}

impl Default for QpInit {
    fn default() -> Self {
        QpInit { sq_depth: 128, rq_depth: 128, max_send_sge: 4, max_recv_sge: 4, max_inline: 0 }
    }
}

/// The peer of a connection, as learnt out of band.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Remote {
    /// Its QP number.
    pub qpn: u32,
    /// Its first send PSN (our expected receive PSN).
    pub psn: u32,
    /// Its GID (IPv4-mapped or IPv6).
    pub gid: [u8; 16],
    /// Its MAC; `None`: the daemon resolves it with ARP / neighbour discovery.
    pub mac: Option<[u8; 6]>,
}

/// An RC queue pair: posting is a write into the shared ring and an index publish.
pub struct Qp {
    dev: Arc<Inner>,
    qpn: u32,
    region: ClientQpRegion,
    /// Its send and receive CQs' records of destroyed QPs (one when they are the same CQ).
    cqs: Vec<Arc<StaleQps>>,
}

impl Qp {
    /// The QP number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Any attribute change (`ibv_modify_qp`).
    pub fn modify(&self, m: &ModifyQp) -> Result<(), Error> {
        match self.dev.call(&Request::ModifyQp { qpn: self.qpn, m: *m }, &[])? {
            (Response::Ok, _) => Ok(()),
            (r, _) => Err(Error::Protocol(format!("{r:?} to ModifyQp"))),
        }
    }

    /// RESET -> INIT, granting the peer `access`.
    pub fn to_init(&self, access: AccessFlags) -> Result<(), Error> {
        let attr = QpAttr { state: Some(QpState::Init), access: Some(access), ..QpAttr::default() };
        self.modify(&ModifyQp { attr, ..ModifyQp::default() })
    }

    /// INIT -> RTR towards `r` with path MTU `mtu` (16 outstanding READ/atomics accepted, RNR timer 0.01 ms).
    pub fn to_rtr(&self, r: &Remote, mtu: u32) -> Result<(), Error> {
        let attr = QpAttr {
            state: Some(QpState::Rtr),
            path_mtu: Some(mtu),
            dest_qpn: Some(r.qpn),
            rq_psn: Some(r.psn),
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(1),
            ..QpAttr::default()
        };
        self.modify(&ModifyQp { attr, gid: Some(r.gid), mac: r.mac })
    }

    /// RTR -> RTS with first send PSN `psn` (ACK timeout 4.096 us * 2^14, 7 retries, RNR retries infinite).
    pub fn to_rts(&self, psn: u32) -> Result<(), Error> {
        let attr = QpAttr {
            state: Some(QpState::Rts),
            sq_psn: Some(psn),
            timeout: Some(14),
            retry_cnt: Some(7),
            rnr_retry: Some(7),
            max_rd_atomic: Some(16),
            ..QpAttr::default()
        };
        self.modify(&ModifyQp { attr, ..ModifyQp::default() })
    }

    /// A snapshot of the QP (`ibv_query_qp`).
    pub fn query(&self) -> Result<QpInfo, Error> {
        match self.dev.call(&Request::QueryQp { qpn: self.qpn }, &[])? {
            (Response::QpInfo(q), _) => Ok(q),
            (r, _) => Err(Error::Protocol(format!("{r:?} to QueryQp"))),
        }
    }

    /// Posts a send work request (no system call). The payload is read from the SGEs' registered regions when the
    /// daemon's worker takes the WR, so the buffer must stay as it is until the WR completes; `wr.inline` is
    /// ignored here (for data copied at post time use [`post_send_inline`](Self::post_send_inline)).
    #[inline]
    pub fn post_send(&mut self, wr: &SendWr, sgl: &[Sge]) -> Result<(), Error> {
        self.region.sq.post(wr, sgl).map_err(|e| self.post_err(e))
    }

    /// Writes a send work request into the ring without telling the daemon yet: it sees the WR, with every WR
    /// staged before it, at the next [`publish_sends`](Self::publish_sends), [`post_send`](Self::post_send) or
    /// [`post_send_inline`](Self::post_send_inline), or when the QP is dropped. A batch of WRs then costs one index
    /// store (one transfer of the ring's tail to the worker) instead of one per WR, as a chain of WRs given to one
    /// `ibv_post_send`. Staged WRs take room in the ring: a ring full of them stays full until they are published.
    #[inline]
    pub fn stage_send(&mut self, wr: &SendWr, sgl: &[Sge]) -> Result<(), Error> {
        self.region.sq.stage(wr, sgl).map_err(|e| self.post_err(e))
    }

    /// Publishes the staged send WRs ([`stage_send`](Self::stage_send)); nothing if none is staged.
    #[inline]
    pub fn publish_sends(&mut self) {
        self.region.sq.publish();
    }

    /// Send WRs staged and not yet published.
    #[inline]
    pub fn staged_sends(&self) -> u32 {
        self.region.sq.staged()
    }

    /// Posts a SEND or WRITE (with or without immediate) whose payload `data` is copied into the send ring's
    /// inline area now (`IBV_SEND_INLINE`): `data` need not be in a registered region, and the caller may reuse it
    /// as soon as this returns. At most [`max_inline`](Self::max_inline) bytes (else [`Error::BadRequest`]).
    pub fn post_send_inline(&mut self, wr: &SendWr, data: &[u8]) -> Result<(), Error> {
        self.region.sq.post_inline(wr, data).map_err(|e| self.post_err(e))
    }

    /// Inline bytes per send WR this QP has (what [`QpInit::max_inline`] asked for, rounded up by the daemon).
    pub fn max_inline(&self) -> u32 {
        self.region.header.sq_inline.per_slot
    }

    /// Posts a receive work request (no system call).
    pub fn post_recv(&mut self, wr_id: u64, sgl: &[Sge]) -> Result<(), Error> {
        self.region.rq.post(wr_id, sgl).map_err(|e| self.post_err(e))
    }
}

impl Qp {
    /// A post's error: a full queue is [`Error::QueueFull`] while the daemon lives, [`Error::DaemonGone`] once it
    /// has gone (its worker no longer empties the ring, so an application that retries a full queue without
    /// polling would retry for ever); the look at the socket never blocks and costs nothing on a post that fits.
    #[cold]
    #[inline(never)]
    fn post_err(&self, e: WqError) -> Error {
        match wq_err(e) {
            Error::QueueFull => self.dev.check_alive().err().unwrap_or(Error::QueueFull),
            e => e,
        }
    }
}

impl Drop for Qp {
    fn drop(&mut self) {
        self.dev.destroy_qp(self.qpn, &self.cqs);
    }
}

/// The descriptor an answer carried (a CQ's or QP's region, a channel's socket): if it was lost because this
/// process's descriptor table is full, an error saying so (the object is destroyed again by the caller's guard);
/// if the daemon sent none, a protocol error naming `missing`.
fn answer_fd(fd: Option<OwnedFd>, lost: bool, missing: &str) -> Result<OwnedFd, Error> {
    match fd {
        Some(fd) => Ok(fd),
        None if lost => Err(Error::Shm(ShmError::Os {
            op: "receiving the daemon's descriptor (this process is out of file descriptors: close some, or raise \
                 its limit, ulimit -n)",
            errno: libc::EMFILE,
        })),
        None => Err(Error::Protocol(missing.into())),
    }
}

/// What the daemon's unsolicited notice says, as the reason of [`Error::DaemonGone`].
fn notice(msg: &Response) -> Option<String> {
    match msg {
        Response::Shutdown { reason } => Some(format!("it is shutting down: {reason}")),
        Response::Closed { reason } => Some(format!("it closed this session: {reason}")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_returned_from_main_prints_its_one_line() {
        // The module example's `fn main() -> Result<(), Error>` prints `Error: {e:?}`: it printed
        // `DaemonAbsent { path: "/run/..." }`, without the line saying what to do.
        let e = Device::open("/run/roce-dp-no-such-daemon.sock").unwrap_err();
        assert_eq!(
            format!("{e:?}"),
            "no roce-dpd listening on /run/roce-dp-no-such-daemon.sock: start it with `roce-dpd --config \
             conf/NAME.toml` (its [daemon] socket)"
        );
        assert_eq!(format!("{e:#?}"), format!("DaemonAbsent: {e}"));
        let e = Error::Refused { code: ErrorCode::Exhausted, msg: "x".into() };
        assert_eq!(format!("{e:#?}"), "Refused(Exhausted): roce-dpd refused: x");
    }

    /// A fake daemon for the late-answer tests: AllocPd #2 goes unanswered until the test says go (the sender
    /// returned); then the `late` answers (`Pd { pd: seq }` each, in that order) go out together and the receiver
    /// returned hears it. An AllocPd whose sequence number is in `late` is not answered again; any other at once.
    #[allow(clippy::type_complexity)]
    fn late_answers_daemon(
        tag: &str,
        late: &'static [u32],
    ) -> (
        Device,
        std::path::PathBuf,
        std::sync::mpsc::Sender<()>,
        std::sync::mpsc::Receiver<()>,
        std::thread::JoinHandle<()>,
    ) {
        use std::os::unix::net::UnixListener;
        use std::sync::mpsc;
        let path = std::env::temp_dir().join(format!("roce-dp-client-{tag}-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let l = UnixListener::bind(&path).unwrap();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let (sent_tx, sent_rx) = mpsc::channel::<()>();
        let daemon = std::thread::spawn(move || {
            let mut c = Conn::new(l.accept().unwrap().0);
            while let Ok(f) = c.recv_request() {
                match f.msg {
                    Request::Hello { .. } => {
                        let info = DeviceInfo { abi: ABI_VERSION, pid: 1, mtu: 1024, ..NO_INFO };
                        c.send_response(f.seq, &Response::Hello(info), &[]).unwrap();
                    }
                    Request::AllocPd if f.seq == 2 => {
                        go_rx.recv().unwrap();
                        for &seq in late {
                            c.send_response(seq, &Response::Pd { pd: seq }, &[]).unwrap();
                        }
                        sent_tx.send(()).unwrap();
                    }
                    Request::AllocPd if late.contains(&f.seq) => {}
                    Request::AllocPd => c.send_response(f.seq, &Response::Pd { pd: f.seq }, &[]).unwrap(),
                    _ => c.send_response(f.seq, &Response::Ok, &[]).unwrap(),
                }
            }
        });
        let dev = Device::open(&path).unwrap();
        (dev, path, go_tx, sent_rx, daemon)
    }

    /// Session 17 review: a call whose thread looked at the socket only past its deadline (descheduled while the
    /// answers came) found the late answer to an earlier, timed-out request first and returned `Timeout`, though
    /// its own answer was already there behind it. Played without timing: the daemon sends the late answer to
    /// AllocPd #2 and the answer to #3 before #3 is sent, and #3's deadline is its start (a timeout of 0, which
    /// only this test can set). Now it reads what is already there and takes its answer. Old code: `Timeout`.
    #[test]
    fn a_call_past_its_deadline_takes_its_answer_already_there_behind_a_late_one() {
        let (dev, path, go_tx, sent_rx, daemon) = late_answers_daemon("late", &[2, 3]);
        dev.set_call_timeout(Duration::from_millis(1));
        assert!(matches!(dev.alloc_pd(), Err(Error::Timeout { request: "AllocPd", .. })));
        go_tx.send(()).unwrap();
        sent_rx.recv().unwrap();
        dev.inner.timeout_us.store(0, Ordering::Relaxed);
        let pd = dev.alloc_pd().expect("its answer was there");
        assert_eq!(pd.handle(), 3);
        dev.set_call_timeout(Duration::from_secs(5));
        drop((pd, dev));
        daemon.join().unwrap();
        let _ = std::fs::remove_file(path);
    }

    #[test]
    fn a_path_that_can_name_no_socket_says_so() {
        // connect(2) refuses both with EINVAL, which was reported as a daemon that went away ("roce-dpd on  is gone
        // (connect: Invalid argument (os error 22)): every QP of this process is lost; reopen the device").
        let e = Device::open("").unwrap_err();
        assert_eq!(
            format!("{e:#?}"),
            "BadSocketPath: the socket path is empty: give the socket roce-dpd listens on (its config's [daemon] \
             socket)"
        );
        let long = format!("/tmp/{}", "s".repeat(MAX_SOCKET_PATH - 4));
        let e = Device::open(&long).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "{long} is 108 bytes long: a Unix socket path holds at most 107, so no roce-dpd listens there (give \
                 its config's [daemon] socket)"
            )
        );
        // The longest path a socket can have is still looked up (nothing listens there).
        let e = Device::open(&long[..MAX_SOCKET_PATH]).unwrap_err();
        assert!(matches!(e, Error::DaemonAbsent { .. }), "{e:#?}");
    }

    /// Session 18: roce-dpd out of descriptors answers a new session's Hello after waiting for it at most 100 ms,
    /// then closes the connection. A client slower than that to send its Hello (a loaded machine) found the socket
    /// closed when it sent, and `Device::open` said "roce-dpd ... is gone (Broken pipe ...)" though the daemon's
    /// line was already there to read. Played without timing: the daemon's end answers request 1 and closes before
    /// the Hello goes. Now the refusal is returned. Old code: `DaemonGone`.
    #[test]
    fn a_refusal_sent_before_the_hello_was_read_is_returned_not_a_broken_pipe() {
        let (client, daemon) = UnixStream::pair().unwrap();
        let c = Conn::new(daemon);
        let line = "a new session: roce-dpd is out of file descriptors (RLIMIT_NOFILE 128): ...";
        c.send_response(1, &Response::Error { code: ErrorCode::Exhausted, msg: line.into() }, &[]).unwrap();
        drop(c);
        let path = std::path::Path::new("/run/roce-dpd-test.sock");
        match Device::open_on(client, path, ABI_VERSION, Duration::from_secs(1)) {
            Err(Error::Refused { code: ErrorCode::Exhausted, msg }) => assert_eq!(msg, line),
            r => panic!("expected the daemon's refusal, got {:?}", r.map(|_| ())),
        }
    }

    /// The bookkeeping of the oldest unanswered request against a daemon that answers out of order, twice, and
    /// to a request never sent: a call past its deadline reads a late answer to an earlier request, then a
    /// duplicate of it, and ends with `Timeout` there (not reading on, not taking the answer to a request never
    /// sent, not hanging); the next call skips the stale frames still buffered and takes its own answer only.
    #[test]
    fn answers_out_of_order_twice_or_to_requests_never_sent_are_not_taken() {
        // #2 times out; its answer comes late, twice, then an answer to #9 (never sent), then #3's.
        let (dev, path, go_tx, sent_rx, daemon) = late_answers_daemon("hostile", &[2, 2, 9, 3]);
        dev.set_call_timeout(Duration::from_millis(1));
        assert!(matches!(dev.alloc_pd(), Err(Error::Timeout { request: "AllocPd", .. })));
        go_tx.send(()).unwrap();
        sent_rx.recv().unwrap();
        // #3 looks only past its deadline: #2's late answer (in order), then its duplicate (not): Timeout.
        dev.inner.timeout_us.store(0, Ordering::Relaxed);
        assert!(matches!(dev.alloc_pd(), Err(Error::Timeout { request: "AllocPd", .. })));
        // #4 reads the answers to #9 and #3 still buffered, discards them, and takes its own.
        dev.set_call_timeout(Duration::from_secs(5));
        let pd = dev.alloc_pd().expect("its own answer");
        assert_eq!(pd.handle(), 4);
        drop((pd, dev));
        daemon.join().unwrap();
        let _ = std::fs::remove_file(path);
    }
}
