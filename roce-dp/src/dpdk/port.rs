//! Ethernet ports: configure, start, stop, link, stats, MTU, capabilities, rx/tx bursts.

use std::cell::Cell;
use std::ffi::{CStr, CString};
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use super::eal::Eal;
use super::error::{check, DpdkError, Result};
use super::mbuf::Burst;
use super::mempool::Mempool;
use super::ring::Ring;

/// How to configure a port ([`Port::configure`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// Number of rx queues (each filled from the same pool).
    pub rx_queues: u16,
    /// Number of tx queues.
    pub tx_queues: u16,
    /// Descriptors per rx queue (adjusted to the device's limits).
    pub rx_desc: u16,
    /// Descriptors per tx queue (adjusted to the device's limits).
    pub tx_desc: u16,
    /// MTU to set after configuring; `None` keeps the device's default (memif: 1500 is also its maximum).
    pub mtu: Option<u16>,
    /// `RTE_ETH_RX_OFFLOAD_*` bits to enable (must be in [`PortInfo::rx_offload_capa`]).
    pub rx_offloads: u64,
    /// `RTE_ETH_TX_OFFLOAD_*` bits to enable (must be in [`PortInfo::tx_offload_capa`]).
    pub tx_offloads: u64,
}

impl Default for PortConfig {
    fn default() -> Self {
        Self { rx_queues: 1, tx_queues: 1, rx_desc: 1024, tx_desc: 1024, mtu: None, rx_offloads: 0, tx_offloads: 0 }
    }
}

/// What the driver reports about a port (`rte_eth_dev_info_get`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortInfo {
    /// Driver name, e.g. `net_memif`.
    pub driver: String,
    /// Most rx queues the device supports.
    pub max_rx_queues: u16,
    /// Most tx queues the device supports.
    pub max_tx_queues: u16,
    /// Smallest MTU.
    pub min_mtu: u16,
    /// Largest MTU.
    pub max_mtu: u16,
    /// Largest frame the device receives (memif: 1518).
    pub max_rx_pktlen: u32,
    /// Smallest rx buffer (mbuf data room minus headroom) the driver accepts.
    pub min_rx_bufsize: u32,
    /// Supported `RTE_ETH_RX_OFFLOAD_*` bits.
    pub rx_offload_capa: u64,
    /// Supported `RTE_ETH_TX_OFFLOAD_*` bits.
    pub tx_offload_capa: u64,
}

/// Link state (`rte_eth_link_get_nowait`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Link {
    /// Whether the link is up (memif: connected to its peer).
    pub up: bool,
    /// Speed in Mbit/s (0 if unknown).
    pub speed_mbps: u32,
    /// Full duplex.
    pub full_duplex: bool,
}

/// Basic port counters (`rte_eth_stats_get`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    /// Frames received.
    pub ipackets: u64,
    /// Frames sent.
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent.
    pub obytes: u64,
    /// Frames dropped by the device because no rx descriptor was free.
    pub imissed: u64,
    /// Erroneous frames received.
    pub ierrors: u64,
    /// Failed transmissions.
    pub oerrors: u64,
    /// Rx failures because the mempool was empty.
    pub rx_nombuf: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Idle,
    Configured,
    Started,
}

/// An ethdev port. Stopped and closed on drop (and its vdev removed, if this layer created one).
///
/// `Send` (a worker thread may own it) but not `Sync`: rx/tx bursts on one queue must not run concurrently.
pub struct Port {
    id: u16,
    state: State,
    /// The vdev name when this layer created the device (removed on drop).
    vdev: Option<CString>,
    /// Pools the rx queues fill from; they must outlive the port.
    pools: Vec<Mempool>,
    /// Rings behind a net_ring port; they must outlive the port.
    rings: Vec<Ring>,
    eal: Eal,
    /// Queues configured (rx, tx).
    queues: (u16, u16),
    /// Queue pairs handed out by [`Port::queue_pair`] (bit q).
    taken: Cell<u64>,
    /// Bursts run under the shim's burst guard (memif: see [`guard_faults`]).
    guarded: bool,
    _not_sync: PhantomData<Cell<()>>,
}

/// How many rx/tx bursts a SIGSEGV inside the PMD cut short in this process: DPDK 22.11's memif PMD unmaps its
/// shared regions on the EAL interrupt thread when its peer disconnects, possibly while a worker is inside a burst
/// reading them. Bursts on memif ports run under a guard (dpdk-sys's `rdp_burst_guarded`) whose SIGSEGV
/// handler ends such a burst early instead of letting the process die, when the port's link is down at the fault
/// (the PMD marks it down before it unmaps anything): rx keeps the frames the PMD had stored whole, tx counts its
/// whole burst as sent (at most a burst of mbufs is lost per fault). Any other SIGSEGV, also one under a burst of a
/// port whose link is up (a bug, not the disconnect), is left to the handler installed before (or the default
/// action): the process dies at the faulting instruction, as without the guard.
pub fn guard_faults() -> u64 {
    // SAFETY: reads an atomic counter in the shim.
    unsafe { dpdk_sys::rdp_burst_guard_faults() }
}

/// One rx (`rx`) or tx burst of `n` mbuf slots at `pkts` on `(id, queue)`, under the burst guard when `guarded`:
/// how many mbufs the PMD stored (rx) or took (tx; after a fault inside a guarded burst, all `n`).
///
/// # Safety
/// As `rte_eth_rx_burst` / `rte_eth_tx_burst`: a valid, started port whose queue is used by this thread only; for
/// rx `pkts` has room for `n` mbuf pointers, for tx it holds `n` owned mbufs.
#[inline]
unsafe fn burst_raw(rx: bool, guarded: bool, id: u16, queue: u16, pkts: *mut *mut dpdk_sys::rte_mbuf, n: u16) -> u16 {
    let plain = if rx { dpdk_sys::rte_eth_rx_burst_ } else { dpdk_sys::rte_eth_tx_burst_ };
    if guarded {
        let mut faulted = 0;
        // SAFETY: as the caller promised; the guard only adds its jump point (see guard_faults), and after a
        // fault a tx burst reports all n taken, so none is ever given back twice.
        unsafe { dpdk_sys::rdp_burst_guarded(Some(plain), id, queue, pkts, n, i32::from(rx), &mut faulted) }
    } else {
        // SAFETY: as the caller promised.
        unsafe { plain(id, queue, pkts, n) }
    }
}

/// Rx queue `q` and tx queue `q` of a started port, owned by one thread (a worker): DPDK allows bursts on
/// different queues of one port from different threads at once, never on the same queue. Borrows the port, so the
/// port outlives it; [`Port::queue_pair`] hands each pair out once.
pub struct QueuePair<'p> {
    port: u16,
    queue: u16,
    /// Whether rx queue `queue` exists (a port with fewer rx than tx queues: workers past the rx queues get their
    /// frames from a software dispatcher instead).
    has_rx: bool,
    /// Bursts under the burst guard (the port's [`Port`] field).
    guarded: bool,
    _port: PhantomData<&'p ()>,
}

// SAFETY: a QueuePair is the only handle on its queue pair (Port::queue_pair hands each out once), and ethdev
// rx/tx bursts on distinct queues are thread-safe; the borrowed port outlives it.
unsafe impl Send for QueuePair<'_> {}

impl QueuePair<'_> {
    /// The port id.
    pub fn port_id(&self) -> u16 {
        self.port
    }

    /// The queue index (rx and tx).
    pub fn queue(&self) -> u16 {
        self.queue
    }

    /// Whether this pair has an rx queue.
    pub fn has_rx(&self) -> bool {
        self.has_rx
    }

    /// Receive into the free slots of `burst`; how many frames arrived (0 without an rx queue).
    #[inline]
    pub fn rx_burst(&mut self, burst: &mut Burst) -> usize {
        self.rx_burst_max(burst, usize::MAX)
    }

    /// As [`QueuePair::rx_burst`], at most `max` frames.
    #[inline]
    pub fn rx_burst_max(&mut self, burst: &mut Burst, max: usize) -> usize {
        if !self.has_rx {
            return 0;
        }
        let (id, q, g) = (self.port, self.queue, self.guarded);
        let max = u16::try_from(max).unwrap_or(u16::MAX);
        // SAFETY: as Port::rx_burst (the PMD stores at most n.min(max) mbufs); &mut self and the
        // one-handle-per-queue rule make this the queue's only user.
        unsafe { burst.fill_with(|slots, n| burst_raw(true, g, id, q, slots, n.min(max))) }
    }

    /// Transmit from the front of `burst`; unsent mbufs stay in it. How many were sent.
    #[inline]
    pub fn tx_burst(&mut self, burst: &mut Burst) -> usize {
        let (id, q, g) = (self.port, self.queue, self.guarded);
        // SAFETY: as Port::tx_burst; this handle is the queue's only user.
        unsafe { burst.take_with(|pkts, n| burst_raw(false, g, id, q, pkts, n)) }
    }
}

impl Port {
    /// The port with id `id`.
    pub fn from_id(eal: &Eal, id: u16) -> Result<Port> {
        // SAFETY: EAL is initialised; any id is accepted.
        if unsafe { dpdk_sys::rte_eth_dev_is_valid_port(id) } == 0 {
            return Err(DpdkError::new("rte_eth_dev_is_valid_port", libc::ENODEV));
        }
        Ok(Self::wrap(eal, id, None, Vec::new()))
    }

    /// The port named `name` (e.g. `net_memif0`, or a PCI address).
    pub fn by_name(eal: &Eal, name: &str) -> Result<Port> {
        const OP: &str = "rte_eth_dev_get_port_by_name";
        let id = port_id_by_name(OP, name)?;
        Ok(Self::wrap(eal, id, None, Vec::new()))
    }

    /// Create the virtual device `name` (its driver is the name without the trailing number, e.g. `net_memif0`)
    /// with driver arguments `args` (e.g. `role=server,socket=/run/x.sock`) and return its port.
    pub fn vdev(eal: &Eal, name: &str, args: &str) -> Result<Port> {
        const OP: &str = "rte_vdev_init";
        let cname = CString::new(name).map_err(|_| DpdkError::new(OP, libc::EINVAL))?;
        let cargs = CString::new(args).map_err(|_| DpdkError::new(OP, libc::EINVAL))?;
        // Drivers fail with -errno or with a plain -1 after a failed system call (memif: bind, af_packet: ioctl),
        // leaving rte_errno or errno as the only hint; clear both first so a stale value is not reported.
        // SAFETY: writes the thread-local rte_errno.
        unsafe { dpdk_sys::rte_errno_set_(0) };
        set_errno(0);
        // SAFETY: EAL is initialised; both strings are NUL-terminated and copied by DPDK.
        let ret = unsafe { dpdk_sys::rte_vdev_init(cname.as_ptr(), cargs.as_ptr()) };
        let os_errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
        if ret != 0 {
            // SAFETY: reads the thread-local rte_errno.
            let rte_errno = unsafe { dpdk_sys::rte_errno_() };
            let errno = match ret {
                -1 if rte_errno > 0 => rte_errno,
                -1 if os_errno > 0 => os_errno,
                -1 => libc::ENODEV,
                r => -r,
            };
            return Err(DpdkError::new(OP, errno));
        }
        match port_id_by_name("rte_eth_dev_get_port_by_name", name) {
            Ok(id) => Ok(Self::wrap(eal, id, Some(cname), Vec::new())),
            Err(e) => {
                // SAFETY: the device was created above and has no port we could use; remove it again.
                unsafe { dpdk_sys::rte_vdev_uninit(cname.as_ptr()) };
                Err(e)
            }
        }
    }

    /// A net_ring port named `name` whose rx queue `q` receives from `rx[q]` and whose tx queue `q` transmits into
    /// `tx[q]`. Two such ports with the rings swapped are cross-connected: what one sends on queue `q`, the other
    /// receives on queue `q`. Configure the port with as many queues as rings.
    pub fn from_rings(eal: &Eal, name: &str, rx: &[Ring], tx: &[Ring]) -> Result<Port> {
        const OP: &str = "rte_eth_from_rings";
        let cname = CString::new(name).map_err(|_| DpdkError::new(OP, libc::EINVAL))?;
        let mut rxr: Vec<_> = rx.iter().map(Ring::as_ptr).collect();
        let mut txr: Vec<_> = tx.iter().map(Ring::as_ptr).collect();
        let too_many = |_| DpdkError::new(OP, libc::EINVAL);
        let (nrx, ntx) = (u32::try_from(rxr.len()).map_err(too_many)?, u32::try_from(txr.len()).map_err(too_many)?);
        // SAFETY: EAL is initialised; the arrays hold nrx and ntx valid rings, which the returned Port keeps alive
        // (DPDK stores the pointers); the name is NUL-terminated. Returns the port id or -1 with rte_errno.
        let ret =
            unsafe { dpdk_sys::rte_eth_from_rings(cname.as_ptr(), rxr.as_mut_ptr(), nrx, txr.as_mut_ptr(), ntx, 0) };
        let id = u16::try_from(ret).map_err(|_| DpdkError::from_rte_errno(OP))?;
        Ok(Self::wrap(eal, id, None, rx.iter().chain(tx).cloned().collect()))
    }

    /// A net_ring port with one rx queue (from `rx`) and `tx_queues` tx queues that all enqueue into `tx`, which
    /// must then be a multi-producer ring ([`Ring::new_mp`]) when several threads send.
    pub fn from_rings_tx(eal: &Eal, name: &str, rx: &Ring, tx: &Ring, tx_queues: u16) -> Result<Port> {
        let txs = vec![tx.clone(); usize::from(tx_queues.max(1))];
        Self::from_rings(eal, name, std::slice::from_ref(rx), &txs)
    }

    fn wrap(eal: &Eal, id: u16, vdev: Option<CString>, rings: Vec<Ring>) -> Port {
        let mut port = Port {
            id,
            state: State::Idle,
            vdev,
            pools: Vec::new(),
            rings,
            eal: eal.clone(),
            queues: (0, 0),
            taken: Cell::new(0),
            guarded: false,
            _not_sync: PhantomData,
        };
        // memif is the PMD whose peer's disconnect can unmap memory under a burst (see guard_faults). If the
        // handler cannot be installed the bursts run unguarded, as before.
        // SAFETY: installs a process-wide SIGSEGV handler that chains to the previous one.
        port.guarded =
            port.info().is_ok_and(|i| i.driver == "net_memif") && unsafe { dpdk_sys::rdp_burst_guard_install() } == 0;
        port
    }

    /// The port id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// The device name (`rte_eth_dev_get_name_by_port`).
    pub fn name(&self) -> String {
        let mut buf = [0 as std::ffi::c_char; dpdk_sys::RTE_ETH_NAME_MAX_LEN as usize];
        // SAFETY: buf has RTE_ETH_NAME_MAX_LEN bytes as the API requires; the id is valid while self exists.
        let ret = unsafe { dpdk_sys::rte_eth_dev_get_name_by_port(self.id, buf.as_mut_ptr()) };
        if ret != 0 {
            return format!("port{}", self.id);
        }
        // SAFETY: on success DPDK wrote a NUL-terminated name into buf.
        unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
    }

    /// Driver capabilities and limits.
    pub fn info(&self) -> Result<PortInfo> {
        let i = self.raw_info()?;
        let driver = if i.driver_name.is_null() {
            String::new()
        } else {
            // SAFETY: checked non-null; the driver name is a static string of the PMD.
            unsafe { CStr::from_ptr(i.driver_name) }.to_string_lossy().into_owned()
        };
        Ok(PortInfo {
            driver,
            max_rx_queues: i.max_rx_queues,
            max_tx_queues: i.max_tx_queues,
            min_mtu: i.min_mtu,
            max_mtu: i.max_mtu,
            max_rx_pktlen: i.max_rx_pktlen,
            min_rx_bufsize: i.min_rx_bufsize,
            rx_offload_capa: i.rx_offload_capa,
            tx_offload_capa: i.tx_offload_capa,
        })
    }

    fn raw_info(&self) -> Result<dpdk_sys::rte_eth_dev_info> {
        let mut info = MaybeUninit::<dpdk_sys::rte_eth_dev_info>::zeroed();
        // SAFETY: info is writable storage of the right type; the port id is valid while self exists.
        check("rte_eth_dev_info_get", unsafe { dpdk_sys::rte_eth_dev_info_get(self.id, info.as_mut_ptr()) })?;
        // SAFETY: zero-initialised (a valid bit pattern for this plain C struct) and filled by DPDK.
        Ok(unsafe { info.assume_init() })
    }

    /// Configure queues, descriptors, offloads and MTU; rx queues fill from `pool`. The port must be stopped.
    pub fn configure(&mut self, conf: &PortConfig, pool: &Mempool) -> Result<()> {
        if self.state == State::Started {
            return Err(DpdkError::new("rte_eth_dev_configure", libc::EBUSY));
        }
        // SAFETY: rte_eth_conf is a plain C struct for which all-zero is the documented default configuration.
        let mut eth_conf: dpdk_sys::rte_eth_conf = unsafe { std::mem::zeroed() };
        eth_conf.rxmode.offloads = conf.rx_offloads;
        eth_conf.txmode.offloads = conf.tx_offloads;
        // SAFETY: the port id is valid; eth_conf is fully initialised and only read by DPDK.
        let ret = unsafe { dpdk_sys::rte_eth_dev_configure(self.id, conf.rx_queues, conf.tx_queues, &eth_conf) };
        check("rte_eth_dev_configure", ret)?;
        self.state = State::Configured;
        let (mut rx_desc, mut tx_desc) = (conf.rx_desc, conf.tx_desc);
        // SAFETY: the port id is valid; both pointers are to live u16s.
        let ret = unsafe { dpdk_sys::rte_eth_dev_adjust_nb_rx_tx_desc(self.id, &mut rx_desc, &mut tx_desc) };
        check("rte_eth_dev_adjust_nb_rx_tx_desc", ret)?;
        if let Some(mtu) = conf.mtu {
            // SAFETY: the port id is valid and the port is configured, not started.
            check("rte_eth_dev_set_mtu", unsafe { dpdk_sys::rte_eth_dev_set_mtu(self.id, mtu) })?;
        }
        // SAFETY: the port id is valid.
        let socket = unsafe { dpdk_sys::rte_eth_dev_socket_id(self.id) };
        let socket = u32::try_from(socket).unwrap_or(dpdk_sys::SOCKET_ID_ANY as u32);
        for q in 0..conf.rx_queues {
            // SAFETY: valid port and queue index; NULL rxconf means the driver's defaults; the pool is alive and
            // kept alive by self.pools for as long as the port exists.
            let ret = unsafe {
                dpdk_sys::rte_eth_rx_queue_setup(self.id, q, rx_desc, socket, std::ptr::null(), pool.as_ptr())
            };
            check("rte_eth_rx_queue_setup", ret)?;
        }
        for q in 0..conf.tx_queues {
            // SAFETY: valid port and queue index; NULL txconf means the driver's defaults.
            let ret = unsafe { dpdk_sys::rte_eth_tx_queue_setup(self.id, q, tx_desc, socket, std::ptr::null()) };
            check("rte_eth_tx_queue_setup", ret)?;
        }
        self.pools.push(pool.clone());
        self.queues = (conf.rx_queues, conf.tx_queues);
        Ok(())
    }

    /// Tx queue `q` (and rx queue `q` if configured) for one worker thread; `None` if tx queue `q` is not
    /// configured or was handed out already. Do not call [`Port::rx_burst`]/[`Port::tx_burst`] on a queue that
    /// was handed out.
    pub fn queue_pair(&self, q: u16) -> Option<QueuePair<'_>> {
        let bit = 1u64.checked_shl(u32::from(q))?;
        if q >= self.queues.1 || self.taken.get() & bit != 0 {
            return None;
        }
        self.taken.set(self.taken.get() | bit);
        Some(QueuePair {
            port: self.id,
            queue: q,
            has_rx: q < self.queues.0,
            guarded: self.guarded,
            _port: PhantomData,
        })
    }

    /// Start the port (after [`Port::configure`]).
    pub fn start(&mut self) -> Result<()> {
        // SAFETY: the port id is valid; DPDK checks the configuration state itself.
        check("rte_eth_dev_start", unsafe { dpdk_sys::rte_eth_dev_start(self.id) })?;
        self.state = State::Started;
        Ok(())
    }

    /// Stop the port. memif: make sure the peer no longer polls first (see `rdp-porttest`'s stop handshake).
    pub fn stop(&mut self) -> Result<()> {
        if self.state != State::Started {
            return Ok(());
        }
        // SAFETY: the port id is valid and the port is started.
        check("rte_eth_dev_stop", unsafe { dpdk_sys::rte_eth_dev_stop(self.id) })?;
        self.state = State::Configured;
        Ok(())
    }

    /// Whether the port is started.
    pub fn is_started(&self) -> bool {
        self.state == State::Started
    }

    /// Receive all frames without a matching destination MAC too.
    pub fn enable_promiscuous(&mut self) -> Result<()> {
        // SAFETY: the port id is valid.
        check("rte_eth_promiscuous_enable", unsafe { dpdk_sys::rte_eth_promiscuous_enable(self.id) }).map(drop)
    }

    /// The current link state, without waiting.
    pub fn link(&self) -> Result<Link> {
        let mut link = dpdk_sys::rte_eth_link::default();
        // SAFETY: the port id is valid; link is writable storage of the right type.
        check("rte_eth_link_get_nowait", unsafe { dpdk_sys::rte_eth_link_get_nowait(self.id, &mut link) })?;
        Ok(Link { up: link.link_status() != 0, speed_mbps: link.link_speed, full_duplex: link.link_duplex() != 0 })
    }

    /// Poll the link every 10 ms until it is up; `ETIMEDOUT` after `timeout`.
    pub fn wait_link_up(&self, timeout: Duration) -> Result<Link> {
        self.wait_link(true, timeout)
    }

    /// Poll the link every 10 ms until it is down (memif: the peer disconnected); `ETIMEDOUT` after `timeout`.
    pub fn wait_link_down(&self, timeout: Duration) -> Result<Link> {
        self.wait_link(false, timeout)
    }

    /// Wait for the peer to be gone, so that this port can be stopped and closed safely (memif): the link down
    /// within `timeout`, then EAL's interrupt thread done handling the disconnect ([`Eal::interrupt_barrier`], at
    /// most one more second). `ETIMEDOUT` if either did not happen in time (op "wait for link down" or "wait for
    /// the interrupt thread").
    pub fn wait_peer_gone(&self, timeout: Duration) -> Result<Link> {
        let link = self.wait_link(false, timeout)?;
        if !self.eal.interrupt_barrier(Duration::from_secs(1)) {
            return Err(DpdkError::new("wait for the interrupt thread", libc::ETIMEDOUT));
        }
        Ok(link)
    }

    fn wait_link(&self, up: bool, timeout: Duration) -> Result<Link> {
        let start = Instant::now();
        loop {
            let link = self.link()?;
            if link.up == up {
                return Ok(link);
            }
            if start.elapsed() >= timeout {
                return Err(DpdkError::new(
                    if up { "wait for link up" } else { "wait for link down" },
                    libc::ETIMEDOUT,
                ));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Port counters.
    pub fn stats(&self) -> Result<PortStats> {
        let mut s = dpdk_sys::rte_eth_stats::default();
        // SAFETY: the port id is valid; s is writable storage of the right type.
        check("rte_eth_stats_get", unsafe { dpdk_sys::rte_eth_stats_get(self.id, &mut s) })?;
        Ok(PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets,
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed,
            ierrors: s.ierrors,
            oerrors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    /// Reset the port counters.
    pub fn reset_stats(&self) -> Result<()> {
        // SAFETY: the port id is valid.
        check("rte_eth_stats_reset", unsafe { dpdk_sys::rte_eth_stats_reset(self.id) }).map(drop)
    }

    /// The current MTU.
    pub fn mtu(&self) -> Result<u16> {
        let mut mtu = 0u16;
        // SAFETY: the port id is valid; mtu is a live u16.
        check("rte_eth_dev_get_mtu", unsafe { dpdk_sys::rte_eth_dev_get_mtu(self.id, &mut mtu) })?;
        Ok(mtu)
    }

    /// Set the MTU (most drivers want the port stopped).
    pub fn set_mtu(&mut self, mtu: u16) -> Result<()> {
        // SAFETY: the port id is valid.
        check("rte_eth_dev_set_mtu", unsafe { dpdk_sys::rte_eth_dev_set_mtu(self.id, mtu) }).map(drop)
    }

    /// The port's MAC address.
    pub fn mac(&self) -> Result<[u8; 6]> {
        let mut addr = dpdk_sys::rte_ether_addr::default();
        // SAFETY: the port id is valid; addr is writable storage of the right type.
        check("rte_eth_macaddr_get", unsafe { dpdk_sys::rte_eth_macaddr_get(self.id, &mut addr) })?;
        Ok(addr.addr_bytes)
    }

    /// Receive into the free slots of `burst` from rx queue `queue`; returns how many frames arrived.
    #[inline]
    pub fn rx_burst(&self, queue: u16, burst: &mut Burst) -> usize {
        let (id, g) = (self.id, self.guarded);
        // SAFETY: the port is valid and (when the caller configured the queue) the PMD writes at most `n` owned
        // mbufs to the slots it is given and returns their number, as fill_with requires. Port is !Sync, so no
        // other thread polls this queue through this Port.
        unsafe { burst.fill_with(|slots, n| burst_raw(true, g, id, queue, slots, n)) }
    }

    /// Transmit `burst` on tx queue `queue`; the mbufs the PMD did not take stay in `burst` (at the front).
    /// Returns how many were sent.
    #[inline]
    pub fn tx_burst(&self, queue: u16, burst: &mut Burst) -> usize {
        let (id, g) = (self.id, self.guarded);
        // SAFETY: the PMD takes ownership of exactly the first `ret` mbufs, as take_with requires; Port is !Sync.
        unsafe { burst.take_with(|pkts, n| burst_raw(false, g, id, queue, pkts, n)) }
    }

    /// The EAL this port belongs to.
    pub fn eal(&self) -> &Eal {
        &self.eal
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port id is valid until closed here; after close neither the id nor the vdev is used again.
        unsafe {
            if self.state == State::Started {
                dpdk_sys::rte_eth_dev_stop(self.id);
            }
            dpdk_sys::rte_eth_dev_close(self.id);
            if let Some(name) = &self.vdev {
                dpdk_sys::rte_vdev_uninit(name.as_ptr());
            }
        }
        // Pools and rings (and the EAL handle) drop after the port is closed.
        self.rings.clear();
        self.pools.clear();
    }
}

/// An rte_flow rule on a port; destroyed on drop (before the port closes: it borrows the port).
pub struct FlowRule<'p> {
    port: u16,
    flow: std::ptr::NonNull<dpdk_sys::rte_flow>,
    _port: PhantomData<&'p Port>,
}

impl Drop for FlowRule<'_> {
    fn drop(&mut self) {
        let mut err = dpdk_sys::rte_flow_error::default();
        // SAFETY: the flow was created on this port, which outlives the rule (borrow); destroyed once.
        unsafe { dpdk_sys::rte_flow_destroy(self.port, self.flow.as_ptr(), &mut err) };
    }
}

/// What a RoCEv2 steering rule matches ([`Port::roce_flow`]): Ethernet / IPv4 or IPv6 / UDP destination port
/// 4791, and optionally the peer's address and the UDP source port (the flow entropy the peer picked for one QP
/// pair: rxe and roce-dp derive it from the two QPNs, [`crate::wire::rxe_udp_sport`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RoceMatch {
    /// IPv6 instead of IPv4.
    pub ipv6: bool,
    /// The peer's address (IPv4 in the first 4 bytes), or any.
    pub src_ip: Option<[u8; 16]>,
    /// The UDP source port, or any.
    pub udp_src: Option<u16>,
}

/// Where a steering rule sends the frames it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowDest<'a> {
    /// One rx queue (`RTE_FLOW_ACTION_TYPE_QUEUE`).
    Queue(u16),
    /// RSS over these rx queues on the IPv4/IPv6 UDP 4-tuple (`RTE_FLOW_ACTION_TYPE_RSS`, the PMD's default hash
    /// and key).
    Rss(&'a [u16]),
}

/// A refused rte_flow call: the errno and the PMD's own explanation (`rte_flow_error.message`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlowError {
    /// The call and its errno.
    pub err: DpdkError,
    /// The PMD's message, if it gave one.
    pub message: Option<String>,
}

impl std::fmt::Display for FlowError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.message {
            // Some PMDs repeat strerror as their message (net_ring): say it once.
            Some(m) if *m != self.err.text() => write!(f, "{} ({m})", self.err),
            _ => write!(f, "{}", self.err),
        }
    }
}

impl std::error::Error for FlowError {}

impl Port {
    /// Install an `rte_flow` ingress rule sending the RoCEv2 frames `m` matches to `dest`. Fails with the driver's
    /// errno and message where the PMD refuses it (net_ring, memif, af_packet: no rte_flow at all; net_tap on a
    /// kernel without cls_flower/act_skbedit), in which case a software dispatcher must steer instead.
    pub fn roce_flow(&self, m: &RoceMatch, dest: FlowDest<'_>) -> std::result::Result<FlowRule<'_>, FlowError> {
        let flow = self.roce_flow_call(m, dest, true)?;
        // With `create`, Ok holds the new flow.
        flow.ok_or(FlowError { err: DpdkError::new("rte_flow_create", libc::EINVAL), message: None })
    }

    /// Ask the PMD whether it would accept the rule ([`Port::roce_flow`]) without installing it.
    pub fn validate_roce_flow(&self, m: &RoceMatch, dest: FlowDest<'_>) -> std::result::Result<(), FlowError> {
        self.roce_flow_call(m, dest, false).map(drop)
    }

    /// Steer all RoCEv2-over-IPv4 frames to `queues` with RSS ([`Port::roce_flow`] with no source match).
    pub fn steer_roce(&self, queues: &[u16]) -> std::result::Result<FlowRule<'_>, FlowError> {
        self.roce_flow(&RoceMatch { ipv6: false, src_ip: None, udp_src: None }, FlowDest::Rss(queues))
    }

    fn roce_flow_call(
        &self,
        m: &RoceMatch,
        dest: FlowDest<'_>,
        create: bool,
    ) -> std::result::Result<Option<FlowRule<'_>>, FlowError> {
        use dpdk_sys as d;
        let mut attr = d::rte_flow_attr::default();
        attr.set_ingress(1);
        let udp_spec = d::rte_flow_item_udp {
            hdr: d::rte_udp_hdr {
                dst_port: crate::wire::ROCE_UDP_PORT.to_be(),
                src_port: m.udp_src.unwrap_or(0).to_be(),
                ..Default::default()
            },
        };
        let udp_mask = d::rte_flow_item_udp {
            hdr: d::rte_udp_hdr {
                dst_port: 0xffff,
                src_port: if m.udp_src.is_some() { 0xffff } else { 0 },
                ..Default::default()
            },
        };
        let mut ip4_spec = d::rte_flow_item_ipv4::default();
        let mut ip4_mask = d::rte_flow_item_ipv4::default();
        let mut ip6_spec = d::rte_flow_item_ipv6::default();
        let mut ip6_mask = d::rte_flow_item_ipv6::default();
        if let Some(a) = m.src_ip {
            if m.ipv6 {
                ip6_spec.hdr.src_addr = a;
                ip6_mask.hdr.src_addr = [0xff; 16];
            } else {
                ip4_spec.hdr.src_addr = u32::from_ne_bytes([a[0], a[1], a[2], a[3]]);
                ip4_mask.hdr.src_addr = u32::MAX;
            }
        }
        let null = std::ptr::null();
        let item = |t, spec: *const std::ffi::c_void, mask: *const std::ffi::c_void| d::rte_flow_item {
            type_: t,
            spec,
            last: null,
            mask,
        };
        let ip = match (m.ipv6, m.src_ip.is_some()) {
            (false, false) => item(d::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_IPV4, null, null),
            (false, true) => item(
                d::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_IPV4,
                (&ip4_spec as *const d::rte_flow_item_ipv4).cast(),
                (&ip4_mask as *const d::rte_flow_item_ipv4).cast(),
            ),
            (true, false) => item(d::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_IPV6, null, null),
            (true, true) => item(
                d::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_IPV6,
                (&ip6_spec as *const d::rte_flow_item_ipv6).cast(),
                (&ip6_mask as *const d::rte_flow_item_ipv6).cast(),
            ),
        };
        let pattern = [
            item(d::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_ETH, null, null),
            ip,
            item(
                d::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_UDP,
                (&udp_spec as *const d::rte_flow_item_udp).cast(),
                (&udp_mask as *const d::rte_flow_item_udp).cast(),
            ),
            item(d::rte_flow_item_type_RTE_FLOW_ITEM_TYPE_END, null, null),
        ];
        let queue = d::rte_flow_action_queue { index: if let FlowDest::Queue(q) = dest { q } else { 0 } };
        let rss_queues: &[u16] = if let FlowDest::Rss(q) = dest { q } else { &[] };
        let rss = d::rte_flow_action_rss {
            func: d::rte_eth_hash_function_RTE_ETH_HASH_FUNCTION_DEFAULT,
            level: 0,
            types: u64::from(if m.ipv6 { d::RTE_ETH_RSS_NONFRAG_IPV6_UDP } else { d::RTE_ETH_RSS_NONFRAG_IPV4_UDP }),
            key_len: 0,
            queue_num: rss_queues.len() as u32,
            key: null.cast(),
            queue: rss_queues.as_ptr(),
        };
        let action = match dest {
            FlowDest::Queue(_) => d::rte_flow_action {
                type_: d::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_QUEUE,
                conf: (&queue as *const d::rte_flow_action_queue).cast(),
            },
            FlowDest::Rss(_) => d::rte_flow_action {
                type_: d::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_RSS,
                conf: (&rss as *const d::rte_flow_action_rss).cast(),
            },
        };
        let actions =
            [action, d::rte_flow_action { type_: d::rte_flow_action_type_RTE_FLOW_ACTION_TYPE_END, conf: null }];
        let mut err = d::rte_flow_error::default();
        // SAFETY: the port id is valid; attr, the END-terminated pattern and action arrays and everything they
        // point to (specs, masks, the queue/RSS confs and the caller's queue list) live until the call returns;
        // DPDK copies what it keeps.
        let ret = unsafe { d::rte_flow_validate(self.id, &attr, pattern.as_ptr(), actions.as_ptr(), &mut err) };
        if ret < 0 {
            return Err(flow_error("rte_flow_validate", -ret, &err));
        }
        if !create {
            return Ok(None);
        }
        // SAFETY: as above.
        let flow = unsafe { d::rte_flow_create(self.id, &attr, pattern.as_ptr(), actions.as_ptr(), &mut err) };
        match std::ptr::NonNull::new(flow) {
            Some(flow) => Ok(Some(FlowRule { port: self.id, flow, _port: PhantomData })),
            // SAFETY: reads the thread-local rte_errno.
            None => Err(flow_error("rte_flow_create", unsafe { d::rte_errno_() }, &err)),
        }
    }
}

/// A [`FlowError`] from an rte_flow call's errno and error structure.
fn flow_error(op: &'static str, errno: i32, err: &dpdk_sys::rte_flow_error) -> FlowError {
    let message = (!err.message.is_null()).then(|| {
        // SAFETY: non-null; PMDs set `message` to a NUL-terminated string (a literal or one kept in the port's
        // private data) that outlives the call; it is copied out at once.
        unsafe { CStr::from_ptr(err.message) }.to_string_lossy().into_owned()
    });
    FlowError { err: DpdkError::new(op, errno), message }
}

/// Set the calling thread's C `errno`.
fn set_errno(value: i32) {
    // SAFETY: __errno_location returns this thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = value };
}

fn port_id_by_name(op: &'static str, name: &str) -> Result<u16> {
    let cname = CString::new(name).map_err(|_| DpdkError::new(op, libc::EINVAL))?;
    let mut id = 0u16;
    // SAFETY: cname is NUL-terminated; id is a live u16.
    check(op, unsafe { dpdk_sys::rte_eth_dev_get_port_by_name(cname.as_ptr(), &mut id) })?;
    Ok(id)
}

/// Names of the offload bits set in `bits`, for printing capabilities (`rx` selects the rx table).
pub fn offload_names(rx: bool, bits: u64) -> Vec<&'static str> {
    const RX: &[(u32, &str)] = &[
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_VLAN_STRIP, "vlan_strip"),
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_IPV4_CKSUM, "ipv4_cksum"),
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_UDP_CKSUM, "udp_cksum"),
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_TCP_CKSUM, "tcp_cksum"),
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_TCP_LRO, "tcp_lro"),
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_SCATTER, "scatter"),
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_TIMESTAMP, "timestamp"),
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_KEEP_CRC, "keep_crc"),
        (dpdk_sys::RTE_ETH_RX_OFFLOAD_RSS_HASH, "rss_hash"),
    ];
    const TX: &[(u32, &str)] = &[
        (dpdk_sys::RTE_ETH_TX_OFFLOAD_VLAN_INSERT, "vlan_insert"),
        (dpdk_sys::RTE_ETH_TX_OFFLOAD_IPV4_CKSUM, "ipv4_cksum"),
        (dpdk_sys::RTE_ETH_TX_OFFLOAD_UDP_CKSUM, "udp_cksum"),
        (dpdk_sys::RTE_ETH_TX_OFFLOAD_TCP_CKSUM, "tcp_cksum"),
        (dpdk_sys::RTE_ETH_TX_OFFLOAD_TCP_TSO, "tcp_tso"),
        (dpdk_sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS, "multi_segs"),
        (dpdk_sys::RTE_ETH_TX_OFFLOAD_MBUF_FAST_FREE, "mbuf_fast_free"),
    ];
    let table = if rx { RX } else { TX };
    table.iter().filter(|(bit, _)| bits & u64::from(*bit) != 0).map(|(_, n)| *n).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offload_names_pick_set_bits() {
        let bits = u64::from(dpdk_sys::RTE_ETH_RX_OFFLOAD_UDP_CKSUM | dpdk_sys::RTE_ETH_RX_OFFLOAD_SCATTER);
        assert_eq!(offload_names(true, bits), ["udp_cksum", "scatter"]);
        assert_eq!(offload_names(false, 0), Vec::<&str>::new());
        assert_eq!(offload_names(false, u64::from(dpdk_sys::RTE_ETH_TX_OFFLOAD_MULTI_SEGS)), ["multi_segs"]);
    }

    #[test]
    fn default_config_is_one_queue_pair() {
        let c = PortConfig::default();
        assert_eq!((c.rx_queues, c.tx_queues, c.mtu), (1, 1, None));
    }
}

/// The burst guard's mechanism with the shim's test burst (no EAL needed): a fault inside a guarded burst of a port
/// whose link is down ends the burst as documented and the process lives on; a fault anywhere else still kills.
#[cfg(test)]
mod guard_tests {
    use std::ptr;

    /// A page that faults on any access.
    fn prot_none_page() -> *const u8 {
        // SAFETY: a fresh anonymous mapping; nothing else refers to it. Leaked on purpose (test process).
        let p = unsafe {
            libc::mmap(ptr::null_mut(), 4096, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0)
        };
        assert_ne!(p, libc::MAP_FAILED);
        p.cast()
    }

    /// The test burst under the guard: `stored` fake mbufs written, then a read of the fault address.
    fn guarded<const N: usize>(stored: u16, rx: bool, pkts: &mut [*mut dpdk_sys::rte_mbuf; N]) -> (u16, i32) {
        let mut faulted = 0;
        assert!(usize::from(stored) <= N);
        // SAFETY: the test burst writes at most `stored` (<= N) slots of `pkts` and reads the address set by
        // rdp_burst_guard_test_set_fault_ (a PROT_NONE page, or a readable byte).
        let n = unsafe {
            dpdk_sys::rdp_burst_guarded(
                Some(dpdk_sys::rdp_burst_guard_test_burst_),
                0,
                stored,
                pkts.as_mut_ptr(),
                N as u16,
                i32::from(rx),
                &mut faulted,
            )
        };
        (n, faulted)
    }

    /// Runs test `name` of this binary again in a child (with RDP_GUARD_CHILD set, the test's child half) and
    /// checks that the child dies of SIGSEGV within 10 s (a hang is killed and fails the test).
    fn child_dies_of_sigsegv(name: &str) {
        child_ends(name, Some(libc::SIGSEGV));
    }

    /// As [`child_dies_of_sigsegv`], for a child that ends by signal `signal`, or (None) exits with status 0.
    fn child_ends(name: &str, signal: Option<i32>) {
        use std::os::unix::process::ExitStatusExt;
        use std::time::{Duration, Instant};
        let test = format!("dpdk::port::guard_tests::{name}");
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", &test, "--test-threads", "1", "--nocapture"])
            .env("RDP_GUARD_CHILD", "1")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let until = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = child.try_wait().unwrap() {
                break Some(s);
            }
            if Instant::now() > until {
                child.kill().unwrap();
                child.wait().unwrap();
                break None;
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let out = child.wait_with_output().unwrap();
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        let status = status.unwrap_or_else(|| panic!("{name}: the child still ran after 10 s (hung): {said}"));
        assert_eq!(status.signal(), signal, "{name}: {status:?} {said}");
        assert!(signal.is_some() || status.success(), "{name}: {status:?} {said}");
    }

    #[test]
    fn a_fault_inside_a_guarded_burst_ends_the_burst_and_the_process_lives() {
        // SAFETY: installs the chaining SIGSEGV handler; every port counts as down (the disconnect's state: the
        // test burst runs on no port).
        unsafe {
            assert_eq!(dpdk_sys::rdp_burst_guard_install(), 0);
            dpdk_sys::rdp_burst_guard_test_set_link_down_(1);
        }
        let before = super::guard_faults();
        let page = prot_none_page();
        // SAFETY: stores the address the test burst reads.
        unsafe { dpdk_sys::rdp_burst_guard_test_set_fault_(page.cast()) };
        let mut pkts = [ptr::null_mut(); 8];
        // rx: the three mbufs stored before the fault are returned, the slots after them cleared.
        assert_eq!(guarded(3, true, &mut pkts), (3, 1));
        assert_eq!(pkts.map(|p| p as usize), [0x1000, 0x1001, 0x1002, 0, 0, 0, 0, 0]);
        // A full burst (BURST slots: cleared by the shim's inlined stores, not a memset call) whose slots hold stale
        // pointers from an earlier burst: only the mbufs stored before the fault come back, the rest are cleared.
        let mut full = [0xdead_usize as *mut dpdk_sys::rte_mbuf; crate::dpdk::BURST];
        assert_eq!(guarded(4, true, &mut full), (4, 1));
        assert_eq!(full[..5].iter().map(|p| *p as usize).collect::<Vec<_>>(), [0x1000, 0x1001, 0x1002, 0x1003, 0]);
        assert!(full[4..].iter().all(|p| p.is_null()));
        // tx: every packet counts as taken. A second fault is caught too (SIGSEGV was unblocked after the first).
        assert_eq!(guarded(2, false, &mut pkts), (8, 1));
        assert_eq!(guarded(0, true, &mut pkts), (0, 1));
        assert!(super::guard_faults() >= before + 3);
        // No fault: the burst's own count, nothing flagged.
        let byte = 7u8;
        // SAFETY: a readable byte that outlives the calls below.
        unsafe { dpdk_sys::rdp_burst_guard_test_set_fault_((&raw const byte).cast()) };
        assert_eq!(guarded(5, true, &mut pkts), (5, 0));
        assert_eq!(guarded(5, false, &mut pkts), (5, 0));
    }

    /// With the guard installed, a SIGSEGV outside a guarded burst still ends the process by the signal (checked
    /// in a child: this test binary again, running only this test with RDP_GUARD_CHILD set).
    #[test]
    fn a_fault_outside_a_guarded_burst_still_kills() {
        if std::env::var_os("RDP_GUARD_CHILD").is_some() {
            // SAFETY: installs the handler, then reads a PROT_NONE page outside any guarded burst: the process is
            // meant to die here.
            unsafe {
                assert_eq!(dpdk_sys::rdp_burst_guard_install(), 0);
                ptr::read_volatile(prot_none_page());
            }
            std::process::exit(0);
        }
        child_dies_of_sigsegv("a_fault_outside_a_guarded_burst_still_kills");
    }

    /// A fault inside a guarded burst of a port whose link is not down is not the memif disconnect (which marks the
    /// link down before it unmaps anything) but a bug in or under the burst: it kills as it did before the guard,
    /// at the faulting instruction. It used to be swallowed, the burst cut short and counted, and the process went
    /// on (roce-dpd reported it nowhere). Here the port (0, no EAL) is not a valid port: its link is not known down.
    #[test]
    fn a_fault_inside_a_guarded_burst_of_a_port_whose_link_is_not_down_still_kills() {
        if std::env::var_os("RDP_GUARD_CHILD").is_some() {
            // SAFETY: installs the handler and points the test burst at a PROT_NONE page; the burst is meant to kill.
            unsafe {
                assert_eq!(dpdk_sys::rdp_burst_guard_install(), 0);
                dpdk_sys::rdp_burst_guard_test_set_fault_(prot_none_page().cast());
            }
            let mut pkts = [ptr::null_mut(); 8];
            let r = guarded(3, true, &mut pkts);
            println!("the fault was swallowed: {r:?}");
            std::process::exit(0);
        }
        child_dies_of_sigsegv("a_fault_inside_a_guarded_burst_of_a_port_whose_link_is_not_down_still_kills");
    }

    /// SIGSEGV ignored before the guard was installed: a fault outside a guarded burst still kills (the kernel never
    /// lets a fault be ignored). The guard's handler used to return for SIG_IGN, so the instruction faulted again
    /// for ever: the process hung at 100% CPU.
    #[test]
    fn a_fault_with_sigsegv_ignored_before_the_guard_still_kills() {
        if std::env::var_os("RDP_GUARD_CHILD").is_some() {
            // SAFETY: ignores SIGSEGV, installs the handler (it chains to SIG_IGN), then reads a PROT_NONE page
            // outside any guarded burst: the process is meant to die here.
            unsafe {
                libc::signal(libc::SIGSEGV, libc::SIG_IGN);
                assert_eq!(dpdk_sys::rdp_burst_guard_install(), 0);
                ptr::read_volatile(prot_none_page());
            }
            std::process::exit(0);
        }
        child_dies_of_sigsegv("a_fault_with_sigsegv_ignored_before_the_guard_still_kills");
    }

    /// A SIGSEGV sent with kill (or raise) while the default action was in place before the guard still kills: the
    /// handler used to reset the default action and return, and a sent signal, unlike a fault, does not come again,
    /// so the process lived on.
    #[test]
    fn a_sent_sigsegv_with_the_default_action_before_the_guard_still_kills() {
        if std::env::var_os("RDP_GUARD_CHILD").is_some() {
            // SAFETY: the default action for SIGSEGV (Rust's handler replaced), the guard installed over it, then
            // SIGSEGV sent to this thread: the process is meant to die here.
            unsafe {
                libc::signal(libc::SIGSEGV, libc::SIG_DFL);
                assert_eq!(dpdk_sys::rdp_burst_guard_install(), 0);
                libc::raise(libc::SIGSEGV);
            }
            std::process::exit(0);
        }
        child_dies_of_sigsegv("a_sent_sigsegv_with_the_default_action_before_the_guard_still_kills");
    }

    /// A SIGSEGV sent with kill (or raise) while it was ignored before the guard is still ignored (only a fault
    /// cannot be ignored), and stays ignored.
    #[test]
    fn a_sent_sigsegv_ignored_before_the_guard_is_still_ignored() {
        if std::env::var_os("RDP_GUARD_CHILD").is_some() {
            // SAFETY: SIGSEGV ignored, the guard installed over it, then SIGSEGV sent to this thread twice.
            unsafe {
                libc::signal(libc::SIGSEGV, libc::SIG_IGN);
                assert_eq!(dpdk_sys::rdp_burst_guard_install(), 0);
                libc::raise(libc::SIGSEGV);
                libc::raise(libc::SIGSEGV);
            }
            std::process::exit(0);
        }
        child_ends("a_sent_sigsegv_ignored_before_the_guard_is_still_ignored", None);
    }
}
