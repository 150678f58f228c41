/* Definitions for shim.h: each is a plain call to the static-inline DPDK function it wraps (docs in shim.h). */
#include "shim.h"

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
