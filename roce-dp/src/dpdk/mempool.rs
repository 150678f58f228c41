//! Packet-mbuf pools.

use std::ffi::CString;
use std::ptr::NonNull;
use std::sync::Arc;

use super::eal::Eal;
use super::error::{DpdkError, Result};
use super::mbuf::Mbuf;

/// A pool of packet mbufs (`rte_pktmbuf_pool_create`). Cheap to clone; freed when the last clone drops.
///
/// Ports keep a clone of the pool their rx queues fill from. If mbufs from the pool are still alive when the
/// last clone drops, the pool is deliberately leaked instead of freed, so those mbufs stay valid.
#[derive(Clone)]
pub struct Mempool(Arc<PoolInner>);

struct PoolInner {
    ptr: NonNull<dpdk_sys::rte_mempool>,
    data_room: u16,
    _eal: Eal,
}

// SAFETY: rte_mempool get/put are thread-safe (the default ring handler is multi-producer/multi-consumer; the
// per-lcore caches are only used from the EAL thread owning that lcore); the pointer itself is never mutated.
unsafe impl Send for PoolInner {}
// SAFETY: as above: every operation through a shared reference is a thread-safe DPDK call.
unsafe impl Sync for PoolInner {}

impl Mempool {
    /// Create a pool named `name` (unique in the process) of `n` mbufs with a per-lcore cache of `cache` and
    /// `data_room` bytes per mbuf (headroom included: see [`data_room_for`]), on any NUMA socket.
    pub fn new(eal: &Eal, name: &str, n: u32, cache: u32, data_room: u16) -> Result<Mempool> {
        const OP: &str = "rte_pktmbuf_pool_create";
        let cname = CString::new(name).map_err(|_| DpdkError::new(OP, libc::EINVAL))?;
        // SAFETY: EAL is initialised (eal exists); cname is NUL-terminated and DPDK copies it.
        let ptr = unsafe {
            dpdk_sys::rte_pktmbuf_pool_create(cname.as_ptr(), n, cache, 0, data_room, dpdk_sys::SOCKET_ID_ANY)
        };
        let ptr = NonNull::new(ptr).ok_or_else(|| DpdkError::from_rte_errno(OP))?;
        Ok(Mempool(Arc::new(PoolInner { ptr, data_room, _eal: eal.clone() })))
    }

    /// The raw pool pointer (for queue setup and the shim's alloc calls).
    pub fn as_ptr(&self) -> *mut dpdk_sys::rte_mempool {
        self.0.ptr.as_ptr()
    }

    /// Bytes of data room per mbuf, headroom included.
    pub fn data_room(&self) -> u16 {
        self.0.data_room
    }

    /// Free mbufs in the pool (including per-lcore caches).
    pub fn avail(&self) -> u32 {
        // SAFETY: the pool is alive (self holds it).
        unsafe { dpdk_sys::rte_mempool_avail_count(self.as_ptr()) }
    }

    /// Mbufs currently allocated from the pool.
    pub fn in_use(&self) -> u32 {
        // SAFETY: the pool is alive (self holds it).
        unsafe { dpdk_sys::rte_mempool_in_use_count(self.as_ptr()) }
    }

    /// Allocate one mbuf (empty, default headroom).
    pub fn alloc(&self) -> Result<Mbuf> {
        Mbuf::alloc(self)
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // SAFETY: the pool is alive until the free below; no other handle exists (this is the last clone).
        let in_use = unsafe { dpdk_sys::rte_mempool_in_use_count(self.ptr.as_ptr()) };
        if in_use == 0 {
            // SAFETY: no mbuf from the pool is alive and no port references it (ports hold a clone), so freeing
            // it cannot invalidate anything.
            unsafe { dpdk_sys::rte_mempool_free(self.ptr.as_ptr()) };
        }
    }
}

/// Data room (headroom included) for mbufs that must hold `max_frame` bytes in one segment, or `None` if that does
/// not fit DPDK's 16-bit `data_room_size`.
pub fn data_room_for(max_frame: u32) -> Option<u16> {
    u16::try_from(max_frame.checked_add(dpdk_sys::RTE_PKTMBUF_HEADROOM)?).ok()
}

/// A pool size that cannot run dry: every rx and tx descriptor of every queue holding an mbuf, plus each lcore's
/// cache and one burst in flight per queue, plus `extra` for the application; rounded up to `2^k - 1` (the size
/// rte_mempool stores most efficiently).
pub fn pool_size(queues: u32, rx_desc: u32, tx_desc: u32, lcores: u32, cache: u32, extra: u32) -> u32 {
    let burst = super::mbuf::BURST as u32;
    let need = queues * (rx_desc + tx_desc + burst) + lcores * cache + extra;
    (need + 1).next_power_of_two() - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_room_includes_headroom() {
        assert_eq!(data_room_for(2048), Some(2048 + 128));
        assert_eq!(data_room_for(8192), Some(8320)); // af_packet with framesz=8192 needs >= 8160
        assert_eq!(data_room_for(65535), None);
        assert_eq!(data_room_for(u32::MAX), None);
    }

    #[test]
    fn pool_size_covers_rings_caches_and_bursts() {
        // 1 queue pair, 1024 + 1024 descriptors, 1 lcore with a 256 cache, 512 extra: 2848 -> 4095.
        assert_eq!(pool_size(1, 1024, 1024, 1, 256, 512), 4095);
        // Exactly 2^k - 1 stays.
        assert_eq!(pool_size(1, 0, 0, 0, 0, 31), 63);
        for q in 1..8 {
            let n = pool_size(q, 512, 512, 2, 64, 0);
            assert!(n >= q * (512 + 512 + 32) + 128 && (n + 1).is_power_of_two());
        }
    }
}
