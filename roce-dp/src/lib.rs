//! roce-dp: a user-space RoCEv2 soft-NIC.
//!
//! The protocol core is sans-IO: it is fed frames (byte slices plus metadata), time (as an argument) and work
//! requests; it writes frames into buffers the caller provides and returns completions and its next deadline. It
//! never reads a clock, sleeps, allocates per packet or touches DPDK, so the whole protocol is testable
//! deterministically in a simulator ([`sim`]). The DPDK layer (feature `dpdk`) is a thin driver around it.

#![deny(unsafe_code)]

pub mod cc;
#[cfg(target_os = "linux")]
pub use ctrl::client;
pub mod config;
pub mod copy;
pub mod ctrl;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod engine;
pub mod mr;
pub mod neigh;
pub mod qp;
pub mod sim;
pub mod stats;
pub mod steer;
pub mod time;
pub mod verbs;
pub mod wire;

pub use cc::{CcAlgorithm, CcConfig, CcState, DcqcnConfig};
pub use engine::{AckPolicy, Engine, EngineConfig, PostSendsStop, QpInfo, RxMeta, SendSlot};
pub use mr::{AccessFlags, MrKeys, Pd};
pub use qp::{LocalIp, PeerAddr, QpAttr, QpCaps, QpState, VerbsError};
pub use stats::{EngineStats, QpCounters};
pub use time::{Duration, Instant};
pub use verbs::{CqId, Cqe, SendWr, Sge, WcOpcode, WcStatus, WrOpcode};
