/*
 * roce-dp dpdk-sys C shim: exported wrappers for DPDK's static-inline (and TLS) hot-path API.
 *
 * bindgen cannot bind `static inline` functions or the per-thread `rte_errno`, so each one the project uses gets an
 * exported wrapper here with the same signature and a trailing underscore (rte_eth_rx_burst -> rte_eth_rx_burst_).
 * build.rs compiles this file with the raw `pkg-config --cflags libdpdk` flags and allowlists `rte_.*_` for bindgen.
 *
 * To add one: declare it below with a one-line doc comment, define it in shim.c as a plain call to the original.
 * These calls are not inlined into Rust (no cross-language LTO with Debian's clang), so wrap per-burst functions
 * rather than per-byte ones; per-packet field reads (data_len, buf_addr + data_off) are done in Rust.
 */
#ifndef ROCE_DP_DPDK_SHIM_H
#define ROCE_DP_DPDK_SHIM_H

#include <stdint.h>

#include <rte_config.h>
#include <rte_cycles.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>
#include <rte_ring.h>

/** Receive up to nb_pkts packets from queue queue_id of port port_id into rx_pkts; returns how many were received. */
uint16_t rte_eth_rx_burst_(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts, uint16_t nb_pkts);

/** Queue up to nb_pkts packets for transmission on queue queue_id of port port_id; returns how many the PMD took
 * (the caller still owns the rest). */
uint16_t rte_eth_tx_burst_(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts, uint16_t nb_pkts);

/** Allocate one packet mbuf from mp (data_off = headroom, length 0); NULL when the pool is empty. */
struct rte_mbuf *rte_pktmbuf_alloc_(struct rte_mempool *mp);

/** Allocate count packet mbufs from mp into mbufs, all or nothing; 0 on success, -ENOENT when not enough are free. */
int rte_pktmbuf_alloc_bulk_(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count);

/** Free a packet mbuf and all its segments back to their pools (drops one reference; NULL is ignored). */
void rte_pktmbuf_free_(struct rte_mbuf *m);

/** Free count packet mbufs (NULL entries are skipped); batches the returns per pool. */
void rte_pktmbuf_free_bulk_(struct rte_mbuf **mbufs, unsigned int count);

/** Pointer to the first data byte of the first segment: buf_addr + data_off (rte_pktmbuf_mtod). */
void *rte_pktmbuf_mtod_(struct rte_mbuf *m);

/** Grow the data at its end by len bytes (last segment); pointer to the new bytes, NULL if there is no tailroom. */
char *rte_pktmbuf_append_(struct rte_mbuf *m, uint16_t len);

/** Grow the data at its front by len bytes (first segment); pointer to the new start, NULL if there is no headroom. */
char *rte_pktmbuf_prepend_(struct rte_mbuf *m, uint16_t len);

/** Remove len bytes from the front of the first segment; pointer to the new start, NULL if the segment is shorter. */
char *rte_pktmbuf_adj_(struct rte_mbuf *m, uint16_t len);

/** Remove len bytes from the end of the last segment; 0 on success, -1 if the segment is shorter. */
int rte_pktmbuf_trim_(struct rte_mbuf *m, uint16_t len);

/** Read the mbuf's reference count. */
uint16_t rte_mbuf_refcnt_read_(const struct rte_mbuf *m);

/** Add value (may be negative) to the mbuf's reference count atomically; returns the new count. */
uint16_t rte_mbuf_refcnt_update_(struct rte_mbuf *m, int16_t value);

/** Set the mbuf's reference count (only while no other thread can see the mbuf). */
void rte_mbuf_refcnt_set_(struct rte_mbuf *m, uint16_t new_value);

/** Whether the mbuf's data is its own to write: a direct mbuf (RTE_MBUF_DIRECT: its own buffer, not attached to
 * another mbuf's or to an external one) with one reference (what virtio's can_push asks before writing headers). */
int rdp_mbuf_data_exclusive(const struct rte_mbuf *m);

/** Clone m (rte_pktmbuf_clone): a new mbuf from mp attached to m's data, m's reference count raised; NULL when mp
 * is empty. */
struct rte_mbuf *rte_pktmbuf_clone_(struct rte_mbuf *m, struct rte_mempool *mp);

/** Test aid: make a read-only copy of the len bytes at bytes the data of the direct, empty, single-reference mbuf
 * m, in an external buffer (as PMDs that receive into memory of their own deliver frames): pages of their own,
 * mapped read-only (a write through the mbuf faults), unmapped with the last mbuf attached to them. 0, or -errno
 * (mmap, mprotect, or -ENOMEM for the shared info block). */
int rdp_pktmbuf_attach_ro_copy(struct rte_mbuf *m, const void *bytes, uint16_t len);

/** The calling thread's EAL lcore id; LCORE_ID_ANY (UINT32_MAX) on a thread EAL does not know. */
unsigned int rte_lcore_id_(void);

/** The current TSC value (rte_get_tsc_cycles: rdtsc on x86, no serialisation). */
uint64_t rte_get_tsc_cycles_(void);

/** TSC ticks per second as EAL measured them at init (0 before rte_eal_init). */
uint64_t rte_get_tsc_hz_(void);

/** The calling thread's rte_errno (DPDK's per-thread error number, set by failing API calls). */
int rte_errno_(void);

/** Set the calling thread's rte_errno (e.g. to 0 before a call that may fail without setting it). */
void rte_errno_set_(int value);

/** Enqueue up to n object pointers onto ring r; returns how many were enqueued (the caller keeps the rest). */
unsigned int rte_ring_enqueue_burst_(struct rte_ring *r, void *const *obj_table, unsigned int n);

/** Dequeue up to n object pointers from ring r into obj_table; returns how many were dequeued. */
unsigned int rte_ring_dequeue_burst_(struct rte_ring *r, void **obj_table, unsigned int n);

/** Entries currently in ring r. */
unsigned int rte_ring_count_(const struct rte_ring *r);


/*
 * The burst guard (memif). DPDK 22.11's memif PMD handles its peer's disconnect on the EAL interrupt thread:
 * memif_disconnect unmaps the shared regions and frees their descriptors while a worker may be inside
 * rx_burst/tx_burst reading them, and the worker dies of SIGSEGV (three times in one day of this project's test and
 * benchmark runs, when a peer was killed or stopped). A guarded burst runs the PMD's burst under a sigsetjmp point;
 * the guard's SIGSEGV handler, when the faulting thread is inside a guarded burst of a port whose link is down
 * (memif_disconnect marks it down before it unmaps anything), jumps back to it and the burst ends early: rx returns
 * the mbufs the PMD had already stored whole (the one it was filling is lost), tx reports every packet taken (the PMD
 * may have freed some: taking them back could free twice; the rest are lost). Any other SIGSEGV, including one inside
 * a guarded burst of a port whose link is up (a bug, not the disconnect), goes to the handler that was installed
 * before (Rust's stack-overflow handler, or the default, also when that was SIG_IGN: the process dies as it would
 * have). The port is down after such a fault; the PMD resets its queues when the peer connects again.
 */

/** Install the guard's SIGSEGV handler (once per process; later calls do nothing). 0, or -errno from sigaction. */
int rdp_burst_guard_install(void);

/** A burst function: rte_eth_rx_burst_ or rte_eth_tx_burst_ (or the test aid below). */
typedef uint16_t (*rdp_burst_fn)(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts);

/** burst(port_id, queue_id, pkts, nb_pkts) under the guard; rx says which kind (what a fault returns: rx the leading
 * stored mbufs, tx nb_pkts); *faulted is set to 1 after a fault and left alone otherwise. The port layer calls it
 * with rte_eth_rx_burst_ / rte_eth_tx_burst_ on memif ports. */
uint16_t rdp_burst_guarded(rdp_burst_fn burst, uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts,
			   uint16_t nb_pkts, int rx, int *faulted);

/** How many guarded bursts a fault has cut short in this process. */
uint64_t rdp_burst_guard_faults(void);

/** Test aid: the address rdp_burst_guard_test_burst_ reads (a PROT_NONE page makes it fault). */
void rdp_burst_guard_test_set_fault_(const void *at);

/** Test aid: down != 0 makes every port count as down to the guard (the test burst runs without an EAL, on no
 * port); 0 asks DPDK again. */
void rdp_burst_guard_test_set_link_down_(int down);

/** Test aid, a burst function: stores queue_id fake mbuf pointers (0x1000 + i, never dereferenced) into pkts, then
 * reads the byte set by rdp_burst_guard_test_set_fault_ and returns how many it stored. */
uint16_t rdp_burst_guard_test_burst_(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts);

/*
 * Parking EAL's interrupt thread. rte_eal_cleanup (22.11) unmaps DPDK's memory while the interrupt thread still runs,
 * and, once an alarm has been set in the process, the cleanup itself wakes that thread (unregistering the alarm
 * source writes its pipe), which then reads every registered source's handle to rebuild its wait list. A PMD that leaves a source registered with its handle in
 * DPDK memory (memif's listening socket, after its port is closed) makes that read fault: SIGSEGV in eal-intr-thread,
 * rte_intr_fd_get. Called just before rte_eal_cleanup, this registers an eventfd source whose callback never
 * returns and fires it: the thread then sits in that callback until the process exits, and reads nothing.
 */

/** Park the interrupt thread; 0 once it is parked (at once if it already was), -ETIMEDOUT if it did not take the
 * event within timeout_ms (the source stays armed: the thread parks when it gets to it, maybe during cleanup), or
 * -errno. Only before rte_eal_cleanup, once nothing needs interrupts any more. */
int rdp_park_interrupt_thread(unsigned int timeout_ms);

/** 1 once rdp_park_interrupt_thread parked the thread. */
int rdp_interrupt_thread_parked(void);

/** Test aid: register an interrupt source whose handle is in DPDK memory (RTE_INTR_INSTANCE_F_SHARED) and is never
 * unregistered, as memif leaves its listening socket's. 0 or -errno. */
int rdp_test_register_shared_source_(void);

#endif /* ROCE_DP_DPDK_SHIM_H */
