//! The C shim is compiled and linked, and its EAL-independent wrappers behave (no EAL is initialised here).

use std::ffi::CStr;

#[test]
fn errno_round_trip_and_strerror() {
    // SAFETY: rte_errno is thread-local; setting and reading it has no preconditions.
    let got = unsafe {
        dpdk_sys::rte_errno_set_(libc_einval());
        dpdk_sys::rte_errno_()
    };
    assert_eq!(got, libc_einval());
    // SAFETY: rte_strerror returns a NUL-terminated string for any value.
    let text = unsafe { CStr::from_ptr(dpdk_sys::rte_strerror(got)) };
    assert_eq!(text.to_str().unwrap(), "Invalid argument");
}

#[test]
fn lcore_id_is_any_outside_eal_threads() {
    // SAFETY: reads a thread-local variable; valid on any thread.
    assert_eq!(unsafe { dpdk_sys::rte_lcore_id_() }, dpdk_sys::LCORE_ID_ANY);
}

#[test]
fn tsc_advances() {
    // SAFETY: rdtsc has no preconditions.
    let (a, b) = unsafe { (dpdk_sys::rte_get_tsc_cycles_(), dpdk_sys::rte_get_tsc_cycles_()) };
    assert!(b >= a);
}

#[test]
fn mbuf_layout_fields_exist() {
    // The layer reads these fields directly; bindgen's compile-time layout asserts check their offsets.
    let m = dpdk_sys::rte_mbuf::default();
    assert_eq!((m.data_len, m.pkt_len, m.data_off, m.nb_segs), (0, 0, 0, 0));
}

/// EINVAL on Linux (no libc dependency in this crate).
fn libc_einval() -> i32 {
    22
}
