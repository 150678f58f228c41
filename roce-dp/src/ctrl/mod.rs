//! The application control plane's shared-memory data path: the ABI of the entries applications and the daemon
//! exchange ([`abi`]), the single-producer single-consumer rings that carry them ([`ring`]), the memfd regions the
//! rings live in ([`shm`]) and the daemon-side work-queue readers that validate what applications post ([`wq`]).
//!
//! Trust: the daemon treats every byte in shared memory as hostile. Indices are masked and checked, entries are
//! copied out before they are validated, and nothing read from shared memory is ever used as a pointer or offset.
//! `unsafe` is confined to `ring.rs` and `shm.rs`.
//!
//! # Checking the unsafe code
//! The ring, ABI and work-queue unit tests use heap memory and run under Miri (the shm tests, which need
//! memfd/mmap, are ignored there), and under ThreadSanitizer:
//! ```text
//! cargo +nightly miri test -p roce-dp --no-default-features --lib ctrl::
//! RUSTFLAGS=-Zsanitizer=thread cargo +nightly test -Zbuild-std --target x86_64-unknown-linux-gnu \
//!     -p roce-dp --no-default-features --lib ctrl::
//! ```
//! Neither toolchain is installed on the build machine yet, so neither has been run.

pub mod abi;
pub mod ring;
#[cfg(target_os = "linux")]
pub mod shm;
pub mod wq;
