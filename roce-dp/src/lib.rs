//! roce-dp: a user-space RoCEv2 soft-NIC.
//!
//! The protocol core is sans-IO: it is fed frames (byte slices plus ECN metadata), time (as an argument) and work
//! requests; it writes frames into buffers the caller provides and returns completions and its next deadline. It
//! never reads a clock, sleeps, allocates per packet or touches DPDK, so the whole protocol is testable
//! deterministically in a simulator. The DPDK layer (feature `dpdk`) is a thin driver around it.

#![deny(unsafe_code)]

#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod time;
pub mod wire;

pub use time::{Duration, Instant};
