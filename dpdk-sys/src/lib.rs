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

#[cfg(test)]
#[path = "../build/version.rs"]
mod version;

#[cfg(test)]
mod tests {
    use super::version::check_version;

    #[test]
    fn accepts_22_11_and_later_lts_only() {
        assert_eq!(check_version("22.11.11"), Ok(()));
        assert_eq!(check_version("23.11.0"), Ok(()));
        assert_eq!(check_version("24.11.2\n"), Ok(()));
        assert!(check_version("21.11.9").unwrap_err().contains("not a supported release"));
        assert!(check_version("23.07.0").unwrap_err().contains("not a supported release"));
        assert!(check_version("dpdk").unwrap_err().contains("cannot parse"));
    }

    #[test]
    fn built_against_a_supported_version() {
        assert_eq!(check_version(super::DPDK_VERSION), Ok(()));
    }
}
