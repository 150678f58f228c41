//! Raw bindings to the system DPDK (found with pkg-config; 22.11 LTS or a later LTS).
//!
//! Generated at build time by bindgen, allowlist-only (see `build.rs` for the list), plus the C shim in
//! `csrc/shim.h`: exported wrappers for DPDK's static-inline hot-path functions, named with a trailing underscore
//! (`rte_eth_rx_burst_`, `rte_pktmbuf_alloc_`, `rte_errno_`, ...). Nothing here is safe to call without reading the
//! DPDK documentation of the wrapped function; the safe layer is `roce_dp::dpdk`.

#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, missing_docs, unreachable_pub)]
#![allow(clippy::all, clippy::undocumented_unsafe_blocks, clippy::unnecessary_safety_comment)]
#![allow(unsafe_op_in_unsafe_fn)]

include!(concat!(env!("OUT_DIR"), "/bindings.rs"));

/// The libdpdk version (`pkg-config --modversion libdpdk`) these bindings were generated from.
pub const DPDK_VERSION: &str = env!("DPDK_SYS_DPDK_VERSION");
