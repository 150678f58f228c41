//! rte_ring, used here to build net_ring ports (two rings cross-connect two ports in one process).

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use super::eal::Eal;
use super::error::{DpdkError, Result};
use super::mbuf::Burst;

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
        Self::with_flags(eal, name, count, dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ)
    }

    /// As [`Ring::new`], but several threads may enqueue at once (e.g. the tx queues of one net_ring port, each
    /// owned by its own worker, all feeding the peer's single rx queue); one consumer.
    pub fn new_mp(eal: &Eal, name: &str, count: u32) -> Result<Ring> {
        Self::with_flags(eal, name, count, dpdk_sys::RING_F_SC_DEQ)
    }

    fn with_flags(eal: &Eal, name: &str, count: u32, flags: u32) -> Result<Ring> {
        const OP: &str = "rte_ring_create";
        let cname = CString::new(name).map_err(|_| DpdkError::new(OP, libc::EINVAL))?;
        // SAFETY: EAL is initialised (eal exists); cname is NUL-terminated and DPDK copies it.
        let ptr = unsafe { dpdk_sys::rte_ring_create(cname.as_ptr(), count, dpdk_sys::SOCKET_ID_ANY, flags) };
        let ptr = NonNull::new(ptr).ok_or_else(|| DpdkError::from_rte_errno(OP))?;
        Ok(Ring(Arc::new(RingInner { ptr, _eal: eal.clone() })))
    }

    /// Move mbufs from the front of `burst` onto the ring; those that did not fit stay in `burst`. Returns how
    /// many moved. Single producer: one thread at a time may enqueue.
    pub fn enqueue_burst(&self, burst: &mut Burst) -> usize {
        let r = self.as_ptr();
        // SAFETY: the ring is alive (self); it takes ownership of exactly the first `ret` mbuf pointers.
        unsafe { burst.take_with(|pkts, n| dpdk_sys::rte_ring_enqueue_burst_(r, pkts.cast(), u32::from(n)) as u16) }
    }

    /// Move mbufs from the ring into the free slots of `burst`; returns how many arrived. Single consumer.
    pub fn dequeue_burst(&self, burst: &mut Burst) -> usize {
        let r = self.as_ptr();
        // SAFETY: the ring only ever holds owned mbuf pointers (enqueue_burst); it writes at most n of them.
        unsafe { burst.fill_with(|slots, n| dpdk_sys::rte_ring_dequeue_burst_(r, slots.cast(), u32::from(n)) as u16) }
    }

    /// Entries on the ring.
    pub fn count(&self) -> u32 {
        // SAFETY: the ring is alive (self).
        unsafe { dpdk_sys::rte_ring_count_(self.as_ptr()) }
    }

    /// The raw ring pointer.
    pub fn as_ptr(&self) -> *mut dpdk_sys::rte_ring {
        self.0.ptr.as_ptr()
    }
}

impl Drop for RingInner {
    fn drop(&mut self) {
        // Mbufs still on the ring (frames nobody received) go back to their pool first.
        let mut b = Burst::new();
        loop {
            // SAFETY: the ring is alive until the free below and only ever holds owned mbuf pointers.
            let got = unsafe {
                b.fill_with(|slots, n| {
                    dpdk_sys::rte_ring_dequeue_burst_(self.ptr.as_ptr(), slots.cast(), u32::from(n)) as u16
                })
            };
            if got == 0 {
                break;
            }
            b.clear();
        }
        // SAFETY: last clone: every port made from this ring (each holding a clone) is closed already.
        unsafe { dpdk_sys::rte_ring_free(self.ptr.as_ptr()) }
    }
}
