//! rte_ring, used here to build net_ring ports (two rings cross-connect two ports in one process).

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use super::eal::Eal;
use super::error::{DpdkError, Result};

/// An `rte_ring` of mbuf pointers (single producer, single consumer). Cheap to clone; freed with the last clone.
/// A net_ring [`Port`](super::Port) made from rings keeps clones of them.
#[derive(Clone)]
pub struct Ring(Arc<RingInner>);

struct RingInner {
    ptr: NonNull<dpdk_sys::rte_ring>,
    _eal: Eal,
}

// SAFETY: the ring is only used through DPDK (net_ring's enqueue/dequeue, each end by one port queue), and freed
// once, by the last clone, after every port using it is closed.
unsafe impl Send for RingInner {}
// SAFETY: as above; the pointer is never mutated.
unsafe impl Sync for RingInner {}

impl Ring {
    /// Create a ring named `name` (unique in the process) with `count` slots (a power of two; one stays empty).
    pub fn new(eal: &Eal, name: &str, count: u32) -> Result<Ring> {
        const OP: &str = "rte_ring_create";
        let cname = CString::new(name).map_err(|_| DpdkError::new(OP, libc::EINVAL))?;
        let flags = dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ;
        // SAFETY: EAL is initialised (eal exists); cname is NUL-terminated and DPDK copies it.
        let ptr = unsafe { dpdk_sys::rte_ring_create(cname.as_ptr(), count, dpdk_sys::SOCKET_ID_ANY, flags) };
        let ptr = NonNull::new(ptr).ok_or_else(|| DpdkError::from_rte_errno(OP))?;
        Ok(Ring(Arc::new(RingInner { ptr, _eal: eal.clone() })))
    }

    /// The raw ring pointer.
    pub fn as_ptr(&self) -> *mut dpdk_sys::rte_ring {
        self.0.ptr.as_ptr()
    }
}

impl Drop for RingInner {
    fn drop(&mut self) {
        // SAFETY: last clone: every port made from this ring (each holding a clone) is closed already.
        unsafe { dpdk_sys::rte_ring_free(self.ptr.as_ptr()) }
    }
}
