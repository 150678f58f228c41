/* Definitions for shim.h: each is a plain call to the static-inline DPDK function it wraps (docs in shim.h). */
/* rdp_park_interrupt_thread uses the interrupt-instance API, experimental in 22.11; nothing else here does. */
#define ALLOW_EXPERIMENTAL_API
#include "shim.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

uint16_t rte_eth_rx_burst_(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **rx_pkts, uint16_t nb_pkts)
{
	return rte_eth_rx_burst(port_id, queue_id, rx_pkts, nb_pkts);
}

uint16_t rte_eth_tx_burst_(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **tx_pkts, uint16_t nb_pkts)
{
	return rte_eth_tx_burst(port_id, queue_id, tx_pkts, nb_pkts);
}

struct rte_mbuf *rte_pktmbuf_alloc_(struct rte_mempool *mp)
{
	return rte_pktmbuf_alloc(mp);
}

int rte_pktmbuf_alloc_bulk_(struct rte_mempool *mp, struct rte_mbuf **mbufs, unsigned int count)
{
	return rte_pktmbuf_alloc_bulk(mp, mbufs, count);
}

void rte_pktmbuf_free_(struct rte_mbuf *m)
{
	rte_pktmbuf_free(m);
}

void rte_pktmbuf_free_bulk_(struct rte_mbuf **mbufs, unsigned int count)
{
	rte_pktmbuf_free_bulk(mbufs, count);
}

void *rte_pktmbuf_mtod_(struct rte_mbuf *m)
{
	return rte_pktmbuf_mtod(m, void *);
}

char *rte_pktmbuf_append_(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_append(m, len);
}

char *rte_pktmbuf_prepend_(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_prepend(m, len);
}

char *rte_pktmbuf_adj_(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_adj(m, len);
}

int rte_pktmbuf_trim_(struct rte_mbuf *m, uint16_t len)
{
	return rte_pktmbuf_trim(m, len);
}

uint16_t rte_mbuf_refcnt_read_(const struct rte_mbuf *m)
{
	return rte_mbuf_refcnt_read(m);
}

uint16_t rte_mbuf_refcnt_update_(struct rte_mbuf *m, int16_t value)
{
	return rte_mbuf_refcnt_update(m, value);
}

void rte_mbuf_refcnt_set_(struct rte_mbuf *m, uint16_t new_value)
{
	rte_mbuf_refcnt_set(m, new_value);
}

int rdp_mbuf_data_exclusive(const struct rte_mbuf *m)
{
	return RTE_MBUF_DIRECT(m) && rte_mbuf_refcnt_read(m) == 1;
}

struct rte_mbuf *rte_pktmbuf_clone_(struct rte_mbuf *m, struct rte_mempool *mp)
{
	return rte_pktmbuf_clone(m, mp);
}

/* An external buffer of rdp_pktmbuf_attach_ro_copy: its shared info block and its pages. */
struct rdp_ro_buf {
	struct rte_mbuf_ext_shared_info shinfo;
	void *pages;
	size_t size;
};

/* Called by DPDK when the last mbuf attached to the buffer lets go of it. */
static void rdp_ro_buf_free(void *addr, void *opaque)
{
	struct rdp_ro_buf *b = opaque;

	(void)addr;
	munmap(b->pages, b->size);
	free(b);
}

int rdp_pktmbuf_attach_ro_copy(struct rte_mbuf *m, const void *bytes, uint16_t len)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	size_t size = ((size_t)len + page) / page * page;
	struct rdp_ro_buf *b;
	void *p;
	int e;

	p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -errno;
	memcpy(p, bytes, len);
	b = calloc(1, sizeof(*b));
	if (b == NULL || mprotect(p, size, PROT_READ) != 0) {
		e = b == NULL ? ENOMEM : errno;
		free(b);
		munmap(p, size);
		return -e;
	}
	b->pages = p;
	b->size = size;
	b->shinfo.free_cb = rdp_ro_buf_free;
	b->shinfo.fcb_opaque = b;
	rte_mbuf_ext_refcnt_set(&b->shinfo, 1);
	rte_pktmbuf_attach_extbuf(m, p, RTE_BAD_IOVA, len, &b->shinfo);
	m->data_len = len;
	m->pkt_len = len;
	return 0;
}

unsigned int rte_lcore_id_(void)
{
	return rte_lcore_id();
}

uint64_t rte_get_tsc_cycles_(void)
{
	return rte_get_tsc_cycles();
}

uint64_t rte_get_tsc_hz_(void)
{
	return rte_get_tsc_hz();
}

int rte_errno_(void)
{
	return rte_errno;
}

void rte_errno_set_(int value)
{
	rte_errno = value;
}

unsigned int rte_ring_enqueue_burst_(struct rte_ring *r, void *const *obj_table, unsigned int n)
{
	return rte_ring_enqueue_burst(r, obj_table, n, NULL);
}

unsigned int rte_ring_dequeue_burst_(struct rte_ring *r, void **obj_table, unsigned int n)
{
	return rte_ring_dequeue_burst(r, obj_table, n, NULL);
}

unsigned int rte_ring_count_(const struct rte_ring *r)
{
	return rte_ring_count(r);
}

/* The burst guard (see shim.h). */

#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>

/* The burst size the port layer uses (roce-dp's BURST): its slots are cleared without a memset call. */
#define RDP_GUARD_BURST 32

/* Non-NULL while this thread runs a guarded burst: where the handler jumps; guard_port is that burst's port. */
static __thread __attribute__((tls_model("initial-exec"))) sigjmp_buf *guard_jump;
static __thread __attribute__((tls_model("initial-exec"))) uint16_t guard_port;
static struct sigaction guard_previous;
static atomic_int guard_installed;
static atomic_uint_fast64_t guard_faults;
/* Test aid: every port counts as down (see shim.h). */
static volatile sig_atomic_t guard_test_link_down;

/* Whether port's link is down: memif_disconnect marks the link down before it unmaps or frees anything, so a fault
 * under a burst of a port whose link is up (or unknown) is not the disconnect's but a bug, and must kill as it would
 * have. Called from the handler, on the thread the fault interrupted inside a burst of this port (which holds no
 * lock): rte_eth_dev_is_valid_port reads the port array, rte_eth_link_get_nowait on a valid port of a primary
 * process reads the link word (memif's link_update does nothing there); neither logs nor locks. */
static int guard_link_down(uint16_t port)
{
	struct rte_eth_link link = { 0 };

	if (guard_test_link_down)
		return 1;
	if (!rte_eth_dev_is_valid_port(port) || rte_eth_link_get_nowait(port, &link) != 0)
		return 0;
	return link.link_status == RTE_ETH_LINK_DOWN;
}

static void guard_handler(int sig, siginfo_t *si, void *uc)
{
	sigjmp_buf *jb = guard_jump;

	/* si_code > 0: a fault the kernel raised (kill and sigqueue send SI_USER, SI_QUEUE, SI_TKILL: <= 0). */
	if (jb != NULL && si->si_code > 0 && guard_link_down(guard_port)) {
		guard_jump = NULL;
		atomic_fetch_add_explicit(&guard_faults, 1, memory_order_relaxed);
		siglongjmp(*jb, 1);
	}
	/* Not ours: what was there before decides (Rust's stack-overflow handler returns after restoring the default
	 * action when the address is not a guard page; the fault then repeats and kills, as it would have). For a
	 * fault SIG_IGN counts as SIG_DFL: the kernel never lets a fault be ignored (it forces the default action), and
	 * returning without changing the action would fault again for ever. A sent SIGSEGV does not come again: under
	 * SIG_IGN it is dropped, under SIG_DFL sent again (pending until this handler returns). sa_handler and
	 * sa_sigaction share storage: SIG_DFL and SIG_IGN are checked first, whatever the flags. */
	if (guard_previous.sa_handler == SIG_IGN && si->si_code <= 0)
		return;
	if (guard_previous.sa_handler == SIG_DFL || guard_previous.sa_handler == SIG_IGN) {
		signal(sig, SIG_DFL);
		if (si->si_code <= 0)
			raise(sig);
	} else if (guard_previous.sa_flags & SA_SIGINFO) {
		guard_previous.sa_sigaction(sig, si, uc);
	} else {
		guard_previous.sa_handler(sig);
	}
}

int rdp_burst_guard_install(void)
{
	struct sigaction sa;
	int expected = 0;

	if (!atomic_compare_exchange_strong(&guard_installed, &expected, 1))
		return 0;
	memset(&sa, 0, sizeof(sa));
	sa.sa_sigaction = guard_handler;
	/* SA_ONSTACK: Rust's threads have an alternate signal stack (a stack overflow must still reach its handler). */
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	if (sigaction(SIGSEGV, &sa, &guard_previous) != 0) {
		int e = errno;
		atomic_store(&guard_installed, 0);
		return -e;
	}
	return 0;
}

/* The jump lands here with SIGSEGV still blocked (the handler's mask: sigsetjmp(.., 0) saves no mask, which keeps
 * the guarded burst free of a sigprocmask call); unblock it for the next fault. */
static void guard_unblock(void)
{
	sigset_t s;

	sigemptyset(&s);
	sigaddset(&s, SIGSEGV);
	pthread_sigmask(SIG_UNBLOCK, &s, NULL);
}

uint16_t rdp_burst_guarded(rdp_burst_fn burst, uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts,
			   uint16_t nb_pkts, int rx, int *faulted)
{
	sigjmp_buf jb;
	uint16_t n;

	/* rx: the PMD stores each received mbuf as it completes it, so after a fault the leading non-NULL slots are
	 * whole frames. A full burst's slots are cleared with stores inlined here (a constant size): the libc memset
	 * call cost an empty poll (most polls of a ping-pong) a few nanoseconds. */
	if (rx) {
		if (nb_pkts == RDP_GUARD_BURST)
			__builtin_memset(pkts, 0, sizeof(*pkts) * RDP_GUARD_BURST);
		else
			memset(pkts, 0, sizeof(*pkts) * nb_pkts);
	}
	if (sigsetjmp(jb, 0) != 0) {
		guard_unblock();
		*faulted = 1;
		if (!rx)
			return nb_pkts;
		for (n = 0; n < nb_pkts && pkts[n] != NULL; n++)
			;
		return n;
	}
	guard_port = port_id;
	guard_jump = &jb;
	/* The port layer's bursts are called inline (no call through the pointer into the wrapper). */
	if (burst == rte_eth_rx_burst_)
		n = rte_eth_rx_burst(port_id, queue_id, pkts, nb_pkts);
	else if (burst == rte_eth_tx_burst_)
		n = rte_eth_tx_burst(port_id, queue_id, pkts, nb_pkts);
	else
		n = burst(port_id, queue_id, pkts, nb_pkts);
	guard_jump = NULL;
	return n;
}

/* Test aid (see shim.h). */
static volatile const char *test_fault_at;

void rdp_burst_guard_test_set_fault_(const void *at)
{
	test_fault_at = at;
}

void rdp_burst_guard_test_set_link_down_(int down)
{
	guard_test_link_down = down != 0;
}

uint16_t rdp_burst_guard_test_burst_(uint16_t port_id, uint16_t queue_id, struct rte_mbuf **pkts, uint16_t nb_pkts)
{
	uint16_t i;
	char c;

	(void)port_id;
	for (i = 0; i < queue_id && i < nb_pkts; i++)
		pkts[i] = (struct rte_mbuf *)(uintptr_t)(0x1000 + i);
	c = *test_fault_at;
	(void)c;
	return i;
}

uint64_t rdp_burst_guard_faults(void)
{
	return atomic_load_explicit(&guard_faults, memory_order_relaxed);
}

/* --- parking EAL's interrupt thread before rte_eal_cleanup (see shim.h) --- */

#include <rte_interrupts.h>
#include <sys/eventfd.h>
#include <time.h>

static atomic_int park_state;

/* Runs on EAL's interrupt thread and never returns: that thread does nothing else until the process exits. */
static void park_callback(void *arg)
{
	(void)arg;
	atomic_store(&park_state, 1);
	for (;;)
		pause();
}

/* A new eventfd and an EXT interrupt handle on it (flags: RTE_INTR_INSTANCE_F_*); NULL and -errno in *err if not. */
static struct rte_intr_handle *eventfd_handle(uint32_t flags, int *efd, int *err)
{
	struct rte_intr_handle *h;

	*efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (*efd < 0) {
		*err = -errno;
		return NULL;
	}
	h = rte_intr_instance_alloc(flags);
	if (h == NULL) {
		*err = -ENOMEM;
	} else if (rte_intr_type_set(h, RTE_INTR_HANDLE_EXT) != 0 || rte_intr_fd_set(h, *efd) != 0) {
		rte_intr_instance_free(h);
		h = NULL;
		*err = -EINVAL;
	}
	if (h == NULL)
		close(*efd);
	return h;
}

/* Register cb on a new eventfd handle; 0 (the eventfd in *efd) or -errno. EAL keeps its own copy of the handle, so
 * ours is freed; the eventfd stays open while the source is registered (for the rest of the process). -EPIPE means
 * registered but the interrupt thread was not told to rebuild its wait list: the eventfd stays too. */
static int register_eventfd(uint32_t flags, rte_intr_callback_fn cb, int *efd)
{
	int rc = 0;
	struct rte_intr_handle *h = eventfd_handle(flags, efd, &rc);

	if (h == NULL)
		return rc;
	rc = rte_intr_callback_register(h, cb, NULL);
	rte_intr_instance_free(h);
	if (rc < 0 && rc != -EPIPE)
		close(*efd);
	return rc < 0 ? rc : 0;
}

static uint64_t monotonic_ms(void)
{
	struct timespec t;

	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

int rdp_park_interrupt_thread(unsigned int timeout_ms)
{
	uint64_t one = 1, until;
	int efd, rc;

	if (atomic_load(&park_state))
		return 0;
	/* Private: EAL's copy of the handle in ordinary memory, not in the memory cleanup unmaps. */
	rc = register_eventfd(RTE_INTR_INSTANCE_F_PRIVATE, park_callback, &efd);
	if (rc < 0)
		return rc;
	if (write(efd, &one, sizeof(one)) != (ssize_t)sizeof(one))
		return -errno;
	until = monotonic_ms() + timeout_ms;
	while (!atomic_load(&park_state)) {
		if (monotonic_ms() >= until)
			return -ETIMEDOUT;
		usleep(100);
	}
	return 0;
}

int rdp_interrupt_thread_parked(void)
{
	return atomic_load(&park_state);
}

int rdp_test_register_shared_source_(void)
{
	int efd;

	/* The callback is never called (nothing writes the eventfd); park_callback is only a function to name. */
	return register_eventfd(RTE_INTR_INSTANCE_F_SHARED, park_callback, &efd);
}
