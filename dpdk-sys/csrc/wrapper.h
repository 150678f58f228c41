/* Everything bindgen sees: the public DPDK headers the project uses plus the shim. Bindings are allowlist-only
 * (see build.rs), so adding a header here does not by itself add items to the bindings. */
#include <rte_config.h>
#include <rte_version.h>
#include <rte_eal.h>
#include <rte_alarm.h>
#include <rte_errno.h>
#include <rte_log.h>
#include <rte_lcore.h>
#include <rte_cycles.h>
#include <rte_mempool.h>
#include <rte_mbuf.h>
#include <rte_ring.h>
#include <rte_ethdev.h>
#include <rte_ether.h>
#include <rte_bus_vdev.h>
#include <rte_eth_ring.h>

#include "shim.h"
