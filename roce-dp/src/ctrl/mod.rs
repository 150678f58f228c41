//! The application control plane's shared-memory data path: the ABI of the entries applications and the daemon
//! exchange ([`abi`]), the single-producer single-consumer rings that carry them ([`ring`]), the memfd regions the
//! rings live in ([`shm`]) and the daemon-side work-queue readers that validate what applications post ([`wq`]).
//!
//! Trust: the daemon treats every byte in shared memory as hostile. Indices are masked and checked, entries are
//! copied out before they are validated, and nothing read from shared memory is ever used as a pointer or offset.
//! `unsafe` is confined to `ring.rs` and `shm.rs`.

pub mod abi;
pub mod ring;
#[cfg(target_os = "linux")]
pub mod shm;
pub mod wq;
