//! The appliance's control plane and its shared-memory data path: the ABI of the entries applications and the daemon
//! exchange ([`abi`]), the single-producer single-consumer rings that carry them ([`ring`]), the memfd regions the
//! rings live in ([`shm`]) and the daemon-side work-queue readers that validate what applications post ([`wq`]).
//!
//! Trust: the daemon treats every byte in shared memory as hostile. Indices are masked and checked, entries are
//! copied out before they are validated, and nothing read from shared memory is ever used as a pointer or offset.
//! `unsafe` is confined to `ring.rs`, `shm.rs` and `sigbus.rs` (the daemon's guard against a client punching holes
//! in shared memory) and two calls in `client.rs` that attach a ring region's client side.
//!
//! # Pieces and who uses them
//! - Daemon: [`shm::DaemonQpRegion`] / [`shm::DaemonCqRegion`] create a sealed memfd per QP and CQ with its
//!   [`abi::RegionHeader`], keep their own copy of the layout, and send the descriptors with
//!   [`shm::send_with_fds`]. The owning worker drains each QP's send ring with [`wq::SendQueueReader::poll_to`],
//!   which validates each WQE straight into the engine's next send-queue slot (`Engine::post_sends_with`, the
//!   engine's own checks after it), and its receive ring with [`wq::RecvQueueReader::poll_into`] into `post_recv`;
//!   completions go back with [`abi::Cqe::from`] into the CQ ring. A refused WQE ([`wq::WqError::Wqe`]) completes
//!   with [`abi::Cqe::refused`] (LocQpOpErr, `vendor_err` naming the reason) and moves the QP to the error state;
//!   corrupt indices ([`ring::RingError::Corrupt`], sticky) do the same for the whole queue.
//! - Client library: [`shm::recv_with_fds`], then [`shm::ClientQpRegion::open`] / [`shm::ClientCqRegion::open`]
//!   (magic, ABI version and geometry checked; a version mismatch is a one-line [`abi::AbiError::Version`]), then
//!   `post`/`post_inline` (one Release store each) and [`wq::CqReader::poll`]. A CQ region also holds a
//!   notification block ([`abi::CqNotify`], [`ring::NotifyView`]): the client's arm word and the daemon's answer,
//!   for completion channels ([`client`]).
//!
//! - Control plane: [`proto`] (the versioned request/reply framing on the daemon's Unix socket, descriptors passed
//!   with SCM_RIGHTS), [`daemon`] (the daemon's socket server, which routes each command to the worker owning its
//!   object, and the per-worker [`daemon::Appliance`] that feeds its engine from its QPs' rings and its CQ rings
//!   from its engine) and [`client`] (the application library, re-exported as `roce_dp::client`). Inline payload
//!   goes into the send-queue slot's inline area at post time (`SendQueueWriter::post_inline`) and is copied out
//!   once by the worker, at most `max_inline` bytes. Memory regions live in the client's shared memory: the daemon maps the
//!   client's memfd and the engine copies through [`shm::ShmBytes`]. Each session has its own PDs, so the engine's
//!   per-PD key check refuses another client's lkeys and rkeys; a session's socket closing reclaims everything.
//!
//! # Checking the unsafe code
//! The ring, ABI and work-queue unit tests use heap memory and run under Miri (the shm tests, which need
//! memfd/mmap, are ignored there), and under ThreadSanitizer:
//! ```text
//! cargo +nightly miri test -p roce-dp --no-default-features --lib ctrl::
//! RUSTFLAGS=-Zsanitizer=thread cargo +nightly test -Zbuild-std --target x86_64-unknown-linux-gnu \
//!     -p roce-dp --no-default-features --lib ctrl::
//! ```
//! Neither toolchain is installed on the build machine yet, so neither has been run. Valgrind's memcheck is, and
//! finds nothing (every ring and table access inside its allocation):
//! ```text
//! cargo test -p roce-dp --no-default-features --lib --no-run   # then, with the printed binary:
//! valgrind --error-exitcode=9 -q target/debug/deps/roce_dp-HASH ctrl:: --skip two_threads --test-threads 1
//! ```
//! `tests/shm_ring.rs` puts PROT_NONE guard pages around the region a hostile process scribbles on.

pub mod abi;
#[cfg(target_os = "linux")]
pub mod client;
#[cfg(target_os = "linux")]
pub mod daemon;
#[cfg(target_os = "linux")]
pub mod loopback;
#[cfg(target_os = "linux")]
pub mod proto;
pub mod ring;
#[cfg(target_os = "linux")]
pub mod shm;
#[cfg(target_os = "linux")]
pub mod sigbus;
pub mod wq;

/// What one session may hold at once (`[daemon] session_max_*`), as a device's `max_qp`, `max_cq`, `max_mr`,
/// `max_pd` attributes bound what verbs may create: one application cannot take every QP of the daemon, nor
/// exhaust its file descriptors (each CQ, QP and MR is a memfd the daemon keeps, each channel a socket).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionLimits {
    /// Queue pairs.
    pub qps: u32,
    /// Completion queues.
    pub cqs: u32,
    /// Memory regions.
    pub mrs: u32,
    /// Protection domains.
    pub pds: u32,
    /// Completion channels.
    pub channels: u32,
    /// Bytes of memory registered at once (the sum of the session's MR lengths: each is a window of the client's
    /// memfd the daemon maps, i.e. the daemon's address space; verbs caps the same with RLIMIT_MEMLOCK).
    pub mr_bytes: u64,
}

impl Default for SessionLimits {
    /// The defaults of the daemon's config (`roce_dp::config::DaemonSection`).
    fn default() -> Self {
        SessionLimits { qps: 256, cqs: 512, mrs: 1024, pds: 256, channels: 64, mr_bytes: 1 << 40 }
    }
}
