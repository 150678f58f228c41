//! The DPDK port layer (feature `dpdk`): a thin, RAII wrapper over `dpdk-sys`.
//!
//! * [`Eal`]: the DPDK environment, initialised once per process from a `Vec<String>` of EAL arguments; the last
//!   clone to drop runs `rte_eal_cleanup`. Everything below holds a clone, so cleanup always runs last.
//! * [`Mempool`]: a packet-mbuf pool, freed on drop (unless mbufs from it are still out).
//! * [`Mbuf`]: one owned packet buffer, freed on drop; [`Burst`]: up to [`BURST`] of them for rx/tx bursts.
//! * [`Port`]: an ethdev port (a vdev such as net_memif or net_af_packet, a ring pair, or a PCI NIC): configure N
//!   rx/tx queues, start/stop, link, stats, MTU, capabilities; stopped and closed on drop.
//! * [`DpdkError`]: `{ op, errno }`, displayed with DPDK's `rte_strerror` text.
//!
//! Nothing here needs an EAL under `cargo test`: the pure parts (argument building, error text, pool sizing) are
//! unit-tested; the parts that talk to DPDK are exercised by `rdp-porttest` in `scripts/test.sh` tiers 2-4.
//!
//! Safety model: every `unsafe` block calls into DPDK with pointers this layer owns (an mbuf it allocated or
//! received, a pool or ring it created, a port id it validated) and says so in its `// SAFETY:` note.

#![allow(unsafe_code)]

mod eal;
mod error;
mod lcore_claim;
mod mbuf;
mod mempool;
mod port;
mod ring;
pub mod signal;
mod worker;

pub use eal::{
    captured_log, captured_log_mark, captured_log_since, check_file_prefix, runtime_dir_of, Eal, EalArgs,
    MAX_FILE_PREFIX, RUNTIME_ROOT,
};
pub use error::{DpdkError, Result};
pub use lcore_claim::{claim_dir, claim_lcore, claim_lcore_in};
pub use mbuf::{Burst, Drain, Mbuf, BURST};
pub use mempool::{data_room_for, pool_size, Mempool};
pub use port::{
    guard_faults, offload_names, FlowDest, FlowError, FlowRule, Link, Port, PortConfig, PortInfo, PortStats, QueuePair,
    RoceMatch,
};
pub use ring::Ring;
pub use worker::{
    choose_offloads, register_thread, Clock, Dispatch, Idle, Worker, WorkerConfig, WorkerStats, QPN_STRIDE,
};

/// The DPDK version the bindings were built against (`pkg-config --modversion libdpdk`).
pub const DPDK_VERSION: &str = dpdk_sys::DPDK_VERSION;

/// The calling thread's EAL lcore id, or `None` on a thread EAL does not know.
pub fn lcore_id() -> Option<u32> {
    // SAFETY: reads a thread-local variable; valid on any thread, before or after rte_eal_init.
    let id = unsafe { dpdk_sys::rte_lcore_id_() };
    (id != u32::MAX).then_some(id)
}

/// The current TSC value (not serialising).
#[inline]
pub fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions; inlined here instead of a call into the C shim (it runs once per poll).
    return unsafe { std::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    // SAFETY: reads the cycle counter; no preconditions.
    return unsafe { dpdk_sys::rte_get_tsc_cycles_() };
}

/// TSC ticks per second as EAL measured them (0 before [`Eal::init`]).
pub fn tsc_hz() -> u64 {
    // SAFETY: reads a value EAL set at init (0 before); no preconditions.
    unsafe { dpdk_sys::rte_get_tsc_hz_() }
}
