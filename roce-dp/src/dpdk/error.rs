//! `DpdkError`: which DPDK call failed and its errno, shown with DPDK's own error text.

use std::ffi::CStr;
use std::fmt;

/// A failed DPDK call: `op` names the step (usually the C function), `errno` is the positive error number DPDK
/// reported (from the negative return value or from `rte_errno`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DpdkError {
    /// The step that failed, e.g. `"rte_eal_init"` or `"rte_eth_dev_start"`.
    pub op: &'static str,
    /// The positive errno (0 when DPDK failed without setting one, as a second primary process does).
    pub errno: i32,
}

/// Result type of the DPDK layer.
pub type Result<T> = std::result::Result<T, DpdkError>;

impl DpdkError {
    /// An error with an explicit errno.
    pub fn new(op: &'static str, errno: i32) -> Self {
        Self { op, errno: errno.abs() }
    }

    /// An error whose errno is the calling thread's current `rte_errno`.
    pub fn from_rte_errno(op: &'static str) -> Self {
        // SAFETY: reads the thread-local rte_errno; no preconditions.
        Self::new(op, unsafe { dpdk_sys::rte_errno_() })
    }

    /// DPDK's text for the errno (`rte_strerror`: libc's text, or DPDK's own for its 1000+ codes).
    pub fn text(&self) -> String {
        if self.errno == 0 {
            return "unknown error (rte_errno 0)".to_owned();
        }
        // SAFETY: rte_strerror accepts any int and returns a NUL-terminated string in static or thread-local
        // storage, valid until the next call on this thread; it is copied out at once.
        let text = unsafe { CStr::from_ptr(dpdk_sys::rte_strerror(self.errno)) };
        text.to_string_lossy().into_owned()
    }
}

/// Map a DPDK return code that is `-errno` on failure (ethdev, vdev, ring).
pub(crate) fn check(op: &'static str, ret: i32) -> Result<i32> {
    if ret >= 0 {
        Ok(ret)
    } else {
        Err(DpdkError::new(op, -ret))
    }
}

impl fmt::Display for DpdkError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.op, self.text())
    }
}

impl std::error::Error for DpdkError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_uses_rte_strerror() {
        let e = DpdkError::new("rte_eal_init", -libc::EINVAL);
        assert_eq!(e.errno, libc::EINVAL);
        assert_eq!(e.to_string(), "rte_eal_init failed: Invalid argument");
    }

    #[test]
    fn display_dpdk_specific_errno_and_zero() {
        // E_RTE_SECONDARY (1001) has DPDK's own text.
        let e = DpdkError::new("rte_mempool_create", 1001);
        assert!(e.to_string().starts_with("rte_mempool_create failed: "), "{e}");
        assert!(!e.text().contains("Unknown error"), "{e}");
        assert_eq!(DpdkError::new("x", 0).to_string(), "x failed: unknown error (rte_errno 0)");
    }

    #[test]
    fn check_maps_negative_returns() {
        assert_eq!(check("op", 3), Ok(3));
        assert_eq!(check("op", -libc::ENODEV), Err(DpdkError { op: "op", errno: libc::ENODEV }));
    }
}
