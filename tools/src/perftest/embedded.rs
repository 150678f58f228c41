//! `--port-conf FILE`: the tools' QPs in an engine embedded in the process, on the DPDK port the profile
//! describes (memif, af_packet, a PCI NIC), polled by the tool's own thread ([`Worker`]).

use std::net::TcpStream;
use std::time::{Duration, Instant};

use roce_dp::config::{Driver, HostView, Profile};
use roce_dp::dpdk::{self, choose_offloads, Eal, Mempool, Port, PortConfig, Worker, WorkerConfig};
use roce_dp::neigh::NeighIp;
use roce_dp::wire::{IpAddrs, MacAddr};
use roce_dp::{AccessFlags, CqId, Cqe, Engine, EngineConfig, LocalIp, PeerAddr, QpAttr, QpCaps, QpState, SendWr, Sge};

use super::exchange::{self, Dest, Mtu, TestKind};
use super::params::Params;
use super::report;
use super::run::{bad, detail, err, rc_connect, session, Fail, Local, NewQp, Nic, Ours};
use crate::{dpdk_lookup, dpdk_step};

fn ipv4_gid(ip: [u8; 4]) -> [u8; 16] {
    let mut g = [0u8; 16];
    g[10] = 0xff;
    g[11] = 0xff;
    g[12..].copy_from_slice(&ip);
    g
}

/// The DPDK side; fields drop in order: the port before the pool it receives into, both before the EAL.
struct Port_ {
    port: Port,
    pool: Mempool,
    _eal: Eal,
    profile: Profile,
    mac: MacAddr,
    memif: bool,
}

/// The profile of `--port-conf`, checked against this machine (before the client connects to its server, so that a
/// profile naming hardware this machine lacks fails here and not after the peer's exchange began).
fn checked_profile(ours: &Ours) -> Result<Profile, Fail> {
    let path = ours.port_conf.as_ref().ok_or_else(|| bad("--port-conf FILE.toml is required (see --help)"))?;
    let mut prof = Profile::load(path).map_err(|e| bad(e.0))?;
    if let Some(s) = &ours.socket {
        // It goes into the same devargs string as the profile's socket: checked the same way.
        roce_dp::config::check_socket(s).map_err(|why| bad(format!("--socket {why}")))?;
        prof.port.socket = Some(s.clone());
    }
    if prof.port.driver == Driver::NetRing {
        return Err(bad(format!("{}: net_ring profiles are for rdp-nic ring", path.display())));
    }
    let lcores = ours.lcore.as_deref().map(|l| ("--lcore", l));
    prof.check_host(&path.display().to_string(), lcores, &HostView::default()).map_err(|e| bad(e.0))?;
    Ok(prof)
}

fn setup_port(test: TestKind, ours: &Ours, prefix: &str, client: bool, timeout: Duration) -> Result<Port_, Fail> {
    let prof = checked_profile(ours)?;
    let args = prof.eal_args("rdp-perf", ours.lcore.as_deref(), prefix);
    let argv = args.to_vec();
    // DPDK's log is kept (not shown): a failing step quotes its explanation (a vdev's probe fails inside
    // rte_eal_init with only a log line to say why, e.g. a memif socket another server holds).
    let eal = dpdk_step(|| Eal::init_captured(argv)).map_err(|e| bad(format!("EAL: {e}")))?;
    let room = prof.pool_data_room();
    let (rx_desc, tx_desc) = (prof.port.rx_desc.unwrap_or(1024), prof.port.tx_desc.unwrap_or(1024));
    let n = prof.mempool.mbufs.unwrap_or_else(|| dpdk::pool_size(1, rx_desc.into(), tx_desc.into(), 1, 256, 1024));
    let pool = dpdk_step(|| Mempool::new(&eal, "rdpp_pool", n, 256, room))
        .map_err(|e| bad(format!("mempool of {n} x {room} B ([mempool] mbufs, data_room): {e}")))?;
    let name = match prof.vdev() {
        Some((name, _)) => name,
        None => prof.port.pci.clone().unwrap_or_default(),
    };
    let mut port = dpdk_lookup(&name, || Port::by_name(&eal, &name)).map_err(|e| bad(format!("port {name}: {e}")))?;
    let info = dpdk_step(|| port.info()).map_err(|e| bad(format!("port {name}: {e}")))?;
    let (_rx, tx_offloads) = choose_offloads(&info);
    let conf = PortConfig { rx_desc, tx_desc, tx_offloads, ..PortConfig::default() };
    dpdk_step(|| port.configure(&conf, &pool)).map_err(|e| bad(format!("configure {name}: {e}")))?;
    let memif = prof.port.driver == Driver::Memif;
    // A memif client starts once the server's socket exists.
    let until = Instant::now() + if client && memif { timeout } else { Duration::ZERO };
    loop {
        match dpdk_step(|| port.start()) {
            Ok(()) => break,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(50)),
            Err(e) if memif && prof.port.role.as_deref() == Some("client") => {
                let e = e.error;
                // A memif client starts only once a memif server listens on its socket: DPDK says "Operation not
                // permitted", which names neither.
                let sock = prof.port.socket.as_deref().unwrap_or("");
                return Err(bad(format!(
                    "start {name}: {e}: no memif server on {sock} (this profile's role is client: start the side \
                     whose profile has role = \"server\" first)"
                )));
            }
            Err(e) => return Err(bad(format!("start {name}: {e}"))),
        }
    }
    // Started: this thread polls the port on EAL's main lcore.
    crate::claim_lcores(test.tool_name(), [eal.main_lcore()]);
    let mac = match prof.mac() {
        Some(m) => m,
        None => MacAddr(dpdk_step(|| port.mac()).map_err(|e| bad(format!("port {name}: {e}")))?),
    };
    Ok(Port_ { port, pool, _eal: eal, profile: prof, mac, memif })
}

/// The whole run of one tool on the port of `ours.port_conf`.
pub(super) fn run(test: TestKind, p: &Params, ours: &Ours, prefix: &str, timeout: Duration) -> Result<(), Fail> {
    // The server's port exists (memif: its socket) before it accepts; the client connects first, then starts.
    let (mut s, stream) = if let Some(host) = &p.host {
        checked_profile(ours)?;
        let st = exchange::connect(host, p.port, timeout.min(Duration::from_secs(5)), timeout).map_err(err)?;
        (setup_port(test, ours, prefix, true, timeout)?, st)
    } else {
        let s = setup_port(test, ours, prefix, false, timeout)?;
        let listener = exchange::listen(p.port).map_err(err)?;
        for l in report::waiting_lines() {
            println!("{l}");
        }
        (s, exchange::accept(&listener, Some(timeout), timeout).map_err(err)?)
    };
    let r = run_session(test, p, &mut s, stream, timeout);
    if r.is_err() && s.memif {
        // memif: the peer's disconnect must be handled before this side stops its port. The server waits for it;
        // the client only if it comes soon (the peer went first), else the server is waiting for the client.
        let wait = if p.is_client() { Duration::from_millis(300) } else { Duration::from_secs(3) };
        let _ = s.port.wait_peer_gone(wait);
    }
    r
}

/// Everything after the port is up and the exchange connected: on an error the caller lets memif settle.
fn run_session(test: TestKind, p: &Params, s: &mut Port_, stream: TcpStream, timeout: Duration) -> Result<(), Fail> {
    let client = p.is_client();
    let out = {
        let mut nic = Embedded::new(s, client)?;
        session(&mut nic, test, p, stream, timeout)?
    };
    if s.memif {
        if client {
            std::thread::sleep(Duration::from_millis(200));
        } else {
            // Link down, then EAL's interrupt thread done handling the peer's disconnect: DPDK 22.11's memif
            // segfaults (eal-intr-thread, or this thread) when the port is stopped meanwhile (README, "DPDK 22.11
            // behaviour").
            let _ = s.port.wait_peer_gone(Duration::from_secs(5));
        }
    }
    let _ = s.port.stop();
    out.print_end(p)
}

/// One QP of the embedded engine.
struct EQp {
    qpn: u32,
    cq: CqId,
    lkey: u32,
    va: u64,
}

/// The engine and the worker that polls it on queue 0 of the port.
struct Embedded<'p> {
    w: Worker<'p>,
    port: &'p Port,
    qps: Vec<EQp>,
    client: bool,
    my_ip: [u8; 4],
    mtu: u32,
}

impl<'p> Embedded<'p> {
    fn new(s: &'p Port_, client: bool) -> Result<Self, Fail> {
        let my_ip = s.profile.ipv4().ok_or_else(|| bad("the profile needs net.ipv4"))?;
        let ecfg = EngineConfig {
            local_mac: s.mac,
            local_ip: LocalIp { v4: Some(my_ip), v6: None },
            qpn_base: 0x100,
            ..EngineConfig::default()
        };
        let q = s.port.queue_pair(0).ok_or_else(|| err("port has no queue 0"))?;
        let mtu = s.profile.net.mtu;
        let mut w = dpdk_step(|| Worker::new(Engine::new(ecfg), q, &s.pool, mtu, WorkerConfig::default()))
            .map_err(|e| err(format!("worker: {e}")))?;
        for nb in &s.profile.net.neighbours {
            if let (Ok(ip), Some(mac)) = (nb.ip.parse::<std::net::Ipv4Addr>(), roce_dp::config::parse_mac(&nb.mac)) {
                w.neigh.add_static(NeighIp::V4(ip.octets()), mac);
            }
        }
        Ok(Embedded { w, port: &s.port, qps: Vec::new(), client, my_ip, mtu })
    }
}

impl Nic for Embedded<'_> {
    fn port_mtu(&self) -> u32 {
        self.mtu
    }

    fn gid(&self) -> [u8; 16] {
        ipv4_gid(self.my_ip)
    }

    fn add_qp(&mut self, p: &Params, region_len: usize) -> Result<NewQp, Fail> {
        let e = &mut self.w.engine;
        let pd = e.alloc_pd();
        let depth = p.tx_depth.max(p.rx_depth).max(1);
        let cq = e.create_cq(depth * 2 + 16).map_err(|x| err(format!("create_cq: {x}")))?;
        let va = (u64::from(self.client) + 1) << 40 | (self.qps.len() as u64) << 32;
        let mr = e.reg_mr(pd, va, region_len, AccessFlags::ALL).map_err(|x| err(format!("reg_mr: {x}")))?;
        let caps = QpCaps { max_send_wr: p.tx_depth.max(1), max_recv_wr: p.rx_depth.max(1), ..QpCaps::default() };
        let qpn = e.create_qp(pd, cq, cq, caps).map_err(|x| err(format!("create_qp: {x}")))?;
        let init = QpAttr { state: Some(QpState::Init), access: Some(AccessFlags::ALL), ..QpAttr::default() };
        e.modify_qp(qpn, &init).map_err(|x| err(format!("modify_qp INIT: {x}")))?;
        self.qps.push(EQp { qpn, cq, lkey: mr.lkey, va });
        Ok(NewQp { qpn, rkey: mr.rkey, va })
    }

    fn start(&mut self, timeout: Duration) -> Result<(), Fail> {
        let t = timeout.min(Duration::from_secs(10));
        self.port.wait_link_up(t).map(|_| ()).map_err(|e| err(format!("link: {e}")))
    }

    fn connect(&mut self, qps: &[Local], remote: &[Dest], mtu: Mtu, p: &Params, timeout: Duration) -> Result<(), Fail> {
        let gid = remote[0].gid;
        if gid[..12] != ipv4_gid([0; 4])[..12] {
            return Err(err("the peer's GID is not an IPv4-mapped address (use its RoCEv2 IPv4 GID index, -x)"));
        }
        let peer_ip: [u8; 4] = gid[12..].try_into().expect("4 bytes");
        let mac = self
            .w
            .resolve(NeighIp::V4(peer_ip), timeout.min(Duration::from_secs(10)))
            .ok_or_else(|| err(format!("no ARP answer from {}", std::net::Ipv4Addr::from(peer_ip))))?;
        let peer = PeerAddr { ip: IpAddrs::V4 { src: self.my_ip, dst: peer_ip }, mac };
        for (l, r) in qps.iter().zip(remote) {
            crate::connect_rc(&mut self.w.engine, &rc_connect(l, r, mtu, p), peer).map_err(err)?;
        }
        Ok(())
    }

    fn post_send(&mut self, q: usize, wr: &SendWr, offset: u64, len: u32) -> Result<(), Fail> {
        let l = &self.qps[q];
        let sge = Sge { addr: l.va + offset, len, lkey: l.lkey };
        self.w.engine.post_send(l.qpn, wr, &[sge]).map_err(|e| err(format!("post_send: {e}")))
    }

    fn post_recv(&mut self, q: usize, wr_id: u64, offset: u64, len: u32) -> Result<(), Fail> {
        let l = &self.qps[q];
        let sge = Sge { addr: l.va + offset, len, lkey: l.lkey };
        self.w.engine.post_recv(l.qpn, wr_id, &[sge]).map_err(|e| err(format!("post_recv: {e}")))
    }

    fn poll_cq(&mut self, q: usize, out: &mut [Cqe]) -> Result<usize, Fail> {
        Ok(self.w.engine.poll_cq(self.qps[q].cq, out))
    }

    fn mem(&mut self, q: usize) -> &[u8] {
        self.w.engine.mr_bytes(self.qps[q].lkey).expect("own MR")
    }

    fn mem_mut(&mut self, q: usize) -> &mut [u8] {
        self.w.engine.mr_bytes_mut(self.qps[q].lkey).expect("own MR")
    }

    /// Sends what the application posted and the ACKs the last step's frames queued in one burst, then receives
    /// (`Worker::poll_tx_first`): a latency test's reply WRITE leaves with the ACK of the WRITE it answers.
    fn step(&mut self) -> bool {
        self.w.poll_tx_first() > 0
    }

    fn flush(&mut self) {
        self.w.flush_tx();
    }

    /// The tool's thread busy-polls its port, as perftest polls its NIC.
    fn idle(&mut self, _streak: u32) {}

    fn wait(&mut self) {
        self.w.poll();
    }

    fn rx_activity(&mut self) -> u64 {
        self.w.stats.rx_roce
    }

    fn check_alive(&mut self) -> Result<(), Fail> {
        Ok(())
    }

    fn failure_detail(&mut self, q: usize) -> String {
        let c = self.w.engine.qp_counters(self.qps[q].qpn).unwrap_or_default();
        detail(c.iter())
    }
}
