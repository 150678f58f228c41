//! Port profiles (`conf/*.toml`): which DPDK port a soft NIC runs on, its addresses, path MTU, EAL and worker
//! settings. Parsed with serde + toml and validated; every error is one line naming the file, the key and the
//! problem.
//!
//! ```toml
//! [port]
//! driver = "af_packet"        # memif | af_packet | af_xdp | net_ring | mlx5 | ice
//! iface = "veth0"
//! framesz = 8192              # af_packet: 4 KiB frames need framesz = blocksz = 8192 (and veth MTU 9000)
//! blocksz = 8192
//! [net]
//! ipv4 = "10.0.0.1"
//! mtu = 4096                  # RoCE path MTU: 256, 512, 1024, 2048 or 4096
//! neighbours = [{ ip = "10.0.0.2", mac = "02:00:00:00:00:02" }]
//! [eal]
//! lcores = "0"
//! [worker]
//! idle = "busy"
//! ```
//! Mempool and mbuf sizes are derived from the path MTU (and af_packet's frame size) unless given. Values that go
//! into a DPDK devargs string (`port.socket`, `port.iface`) must leave it as it is ([`devarg_value_problem`]), and
//! af_packet's ring geometry must be one the kernel and DPDK's mbuf sizing take ([`AF_PACKET_MAX_FRAMESZ`]).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use serde::Deserialize;

use crate::engine::MAX_HEADER_BYTES;
use crate::qp::PATH_MTUS;
use crate::wire::MacAddr;

/// The largest frame DPDK 22.11's af_xdp PMD receives: 2048-byte umem frames minus XDP's 256-byte headroom
/// (measured: 2 KiB RoCE frames are dropped and counted in imissed).
pub const AF_XDP_MAX_FRAME: u32 = 2048 - 256;

/// DPDK's default mbuf headroom (RTE_PKTMBUF_HEADROOM in Debian's build).
pub const MBUF_HEADROOM: u32 = 128;

/// A whole profile.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// The port.
    pub port: PortSection,
    /// Addresses and MTU.
    pub net: NetSection,
    /// EAL options.
    #[serde(default)]
    pub eal: EalSection,
    /// Worker options.
    #[serde(default)]
    pub worker: WorkerSection,
    /// Mempool sizing (derived when absent).
    #[serde(default)]
    pub mempool: MempoolSection,
    /// The appliance `roce-dpd` (its socket and memory); other tools ignore it.
    #[serde(default)]
    pub daemon: Option<DaemonSection>,
}

/// What backs the shared regions of `roce-dpd` (its rings and the clients' buffers).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum DaemonBacking {
    /// Ordinary memfd pages.
    #[default]
    Memfd,
    /// memfd with MFD_HUGETLB (2 MiB pages from the kernel's pool).
    Hugetlbfs,
}

/// `[daemon]`: the control socket and shared memory of `roce-dpd`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DaemonSection {
    /// Path of the Unix socket applications connect to.
    pub socket: String,
    /// Its permission bits (default 0o600: the daemon's user only; 0o660 lets its group in): TOML's octal `0o600`,
    /// or a string of octal digits (`"0600"`).
    #[serde(default = "socket_mode", deserialize_with = "de_socket_mode")]
    pub socket_mode: u32,
    /// Backing of the shared regions.
    #[serde(default)]
    pub backing: DaemonBacking,
    /// The workers' lcores, one per `[worker] workers`, comma-separated (`"1,0"`: worker 0, the EAL main lcore, on
    /// 1; worker 1 on 0). Optional with one worker (default: the profile's `[eal] lcores`). An lcore may appear
    /// twice only when the workers back off when idle (`[worker] idle` other than `busy`).
    pub worker_lcores: Option<String>,
    /// Largest queue depth a client may ask for.
    #[serde(default = "max_depth")]
    pub max_depth: u32,
    /// Queue pairs one session (one open device) may hold at once (default 256).
    #[serde(default = "session_max_qps")]
    pub session_max_qps: u32,
    /// Completion queues one session may hold (default 512; each is a memfd the daemon keeps open).
    #[serde(default = "session_max_cqs")]
    pub session_max_cqs: u32,
    /// Memory regions one session may hold (default 1024; each is a memfd the daemon keeps mapped).
    #[serde(default = "session_max_mrs")]
    pub session_max_mrs: u32,
    /// Protection domains one session may hold (default 256, as QPs: the perftest tools take one PD per QP).
    #[serde(default = "session_max_pds")]
    pub session_max_pds: u32,
    /// Completion channels one session may hold (default 64; each is a socket pair).
    #[serde(default = "session_max_channels")]
    pub session_max_channels: u32,
    /// Bytes one session may have registered at once, over all its MRs (default 1 TiB: each MR is a window of
    /// the client's memory the daemon maps, so this bounds the daemon's address space a client can take).
    #[serde(default = "session_max_mr_bytes")]
    pub session_max_mr_bytes: u64,
}

impl DaemonSection {
    /// The per-session limits (`session_max_*`).
    pub fn limits(&self) -> crate::ctrl::SessionLimits {
        crate::ctrl::SessionLimits {
            qps: self.session_max_qps,
            cqs: self.session_max_cqs,
            mrs: self.session_max_mrs,
            pds: self.session_max_pds,
            channels: self.session_max_channels,
            mr_bytes: self.session_max_mr_bytes,
        }
    }

    /// `worker_lcores` as numbers (`None` if absent; `Err` names what does not parse).
    pub fn lcores(&self) -> Option<Result<Vec<u32>, String>> {
        let l = self.worker_lcores.as_ref()?;
        Some(
            l.split(',')
                .map(|x| match x.trim().parse::<u32>() {
                    Ok(n) if n < 1024 => Ok(n),
                    _ => Err(format!("{l:?}: {x:?} is not an lcore number (comma-separated lcores, one per worker)")),
                })
                .collect(),
        )
    }
}

/// Bounds of `[daemon] session_max_mr_bytes`: 1 MiB, and 64 TiB (half of x86-64's 128 TiB user address space).
/// The most mbufs a DPDK mempool holds: its ring (the default handler's) has `rte_align32pow2(n + 1)` slots and a
/// ring at most `RTE_RING_SZ_MASK` (2^31 - 1), so at most 2^30 slots.
pub const MAX_MBUFS: u32 = (1 << 30) - 1;

/// The least memory one mbuf takes in a DPDK 22.11 pool (`rte_mempool_calc_obj_size`): its object header (one 64 B
/// cache line), the `rte_mbuf` (two) and the data room, in whole cache lines (DPDK may add lines to spread the
/// objects over memory channels).
pub fn mbuf_pool_bytes(data_room: u32) -> u64 {
    64 + (128 + u64::from(data_room)).div_ceil(64) * 64
}

/// DPDK's limit for `--no-huge -m`: one 4 KiB memseg per page, in one list of at most `INT_MAX` (2^31 - 1) entries
/// (`rte_fbarray_init`): "Cannot allocate memseg list" past it.
pub const MAX_NO_HUGE_MB: u32 = ((i32::MAX as u64 * 4096) >> 20) as u32;

/// The EAL's memory without hugepages when `eal.no_huge_mb` is not given.
pub const DEFAULT_NO_HUGE_MB: u32 = 512;

/// This machine's memory in MiB (`MemTotal` of /proc/meminfo), if it can be read.
pub fn machine_mib() -> Option<u64> {
    let m = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb =
        m.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
    Some(kb >> 10)
}

const MIN_SESSION_MR_BYTES: u64 = 1 << 20;
const MAX_SESSION_MR_BYTES: u64 = 1 << 46;

fn socket_mode() -> u32 {
    0o600
}

/// `[daemon] socket_mode`: an integer, or a string of octal digits as chmod takes them (`"0600"`, `"600"`, `"0o600"`).
fn de_socket_mode<'de, D: serde::Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    struct Mode;
    impl serde::de::Visitor<'_> for Mode {
        type Value = u32;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a mode such as 0o600 or \"0600\"")
        }
        fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::custom(format!("{v} is not a mode (write 0o600 or \"0600\")")))
        }
        fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u32, E> {
            u32::try_from(v).map_err(|_| E::custom(format!("{v} is not a mode (write 0o600 or \"0600\")")))
        }
        fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<u32, E> {
            let digits = v.strip_prefix("0o").unwrap_or(v);
            match u32::from_str_radix(digits, 8) {
                Ok(m) if !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()) => Ok(m),
                _ => Err(E::custom(format!("{v:?} is not an octal mode (write 0o600 or \"0600\")"))),
            }
        }
    }
    d.deserialize_any(Mode)
}

/// `[daemon] socket_mode` as written in `text`, when it is a plain decimal integer of three digits 0-7 (`600`,
/// `440`): a mode written as chmod takes it, which TOML reads as decimal (600 = 0o1130, 440 = 0o670). Those digits.
fn decimal_mode_digits(text: &str) -> Option<String> {
    #[derive(Deserialize)]
    struct File {
        daemon: Option<Daemon>,
    }
    #[derive(Deserialize)]
    struct Daemon {
        socket_mode: Option<toml::Spanned<toml::Value>>,
    }
    let f: File = toml::from_str(text).ok()?;
    let raw = text.get(f.daemon?.socket_mode?.span())?.trim();
    let digits: String = raw.strip_prefix('+').unwrap_or(raw).chars().filter(|&c| c != '_').collect();
    (digits.len() == 3 && digits.bytes().all(|b| (b'0'..=b'7').contains(&b))).then_some(digits)
}
fn max_depth() -> u32 {
    4096
}
fn session_max_qps() -> u32 {
    crate::ctrl::SessionLimits::default().qps
}
fn session_max_cqs() -> u32 {
    crate::ctrl::SessionLimits::default().cqs
}
fn session_max_mrs() -> u32 {
    crate::ctrl::SessionLimits::default().mrs
}
fn session_max_pds() -> u32 {
    crate::ctrl::SessionLimits::default().pds
}
fn session_max_channels() -> u32 {
    crate::ctrl::SessionLimits::default().channels
}
fn session_max_mr_bytes() -> u64 {
    crate::ctrl::SessionLimits::default().mr_bytes
}

/// The DPDK driver of the port.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Driver {
    /// net_memif (shared-memory packet interface between two processes).
    Memif,
    /// net_af_packet on a kernel interface.
    AfPacket,
    /// net_af_xdp on a kernel interface (veth: MTU <= 3542).
    AfXdp,
    /// Two net_ring ports cross-connected in one process (tests).
    NetRing,
    /// NVIDIA ConnectX (mlx5 PMD, bifurcated: stays on its kernel driver).
    Mlx5,
    /// Intel E810 (ice PMD on vfio-pci).
    Ice,
}

impl Driver {
    /// The name a profile gives it (`driver = "..."`).
    pub fn name(self) -> &'static str {
        match self {
            Driver::Memif => "memif",
            Driver::AfPacket => "af_packet",
            Driver::AfXdp => "af_xdp",
            Driver::NetRing => "net_ring",
            Driver::Mlx5 => "mlx5",
            Driver::Ice => "ice",
        }
    }
}

/// `[port]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PortSection {
    /// The driver.
    pub driver: Driver,
    /// memif: `server` or `client`.
    pub role: Option<String>,
    /// memif: the control socket path.
    pub socket: Option<String>,
    /// memif: zero-copy on the client (needs `--single-file-segments`).
    #[serde(default)]
    pub zero_copy: bool,
    /// af_packet / af_xdp: the kernel interface.
    pub iface: Option<String>,
    /// af_packet: frame size (>= the largest frame + 64; 8192 for 4 KiB MTU).
    pub framesz: Option<u32>,
    /// af_packet: block size (a multiple of framesz).
    pub blocksz: Option<u32>,
    /// af_packet: frames in the ring.
    pub framecnt: Option<u32>,
    /// mlx5 / ice: PCI address `DDDD:BB:DD.F`.
    pub pci: Option<String>,
    /// mlx5 / ice: extra devargs after the PCI address (e.g. `txq_inline_max=256`).
    pub devargs: Option<String>,
    /// Rx/tx descriptors per queue.
    pub rx_desc: Option<u16>,
    /// Tx descriptors per queue.
    pub tx_desc: Option<u16>,
}

/// A static neighbour.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Neighbour {
    /// IPv4 or IPv6 address.
    pub ip: String,
    /// MAC `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
}

/// `[net]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct NetSection {
    /// The port's MAC (default: what the driver reports).
    pub mac: Option<String>,
    /// The port's IPv4 address.
    pub ipv4: Option<String>,
    /// The port's IPv6 address.
    pub ipv6: Option<String>,
    /// RoCE path MTU.
    pub mtu: u32,
    /// Static neighbours (no ARP/ND needed for them).
    #[serde(default)]
    pub neighbours: Vec<Neighbour>,
}

/// `[eal]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct EalSection {
    /// `-l`: the first is the main lcore.
    pub lcores: Option<String>,
    /// `--no-huge -m MiB` (default 512 unless `hugepages`).
    pub no_huge_mb: Option<u32>,
    /// Use hugepages (`--in-memory`).
    #[serde(default)]
    pub hugepages: bool,
    /// Extra EAL arguments.
    #[serde(default)]
    pub extra: Vec<String>,
}

/// `[worker]`.
#[derive(Clone, Debug, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct WorkerSection {
    /// Workers on the port (each on its own lcore; >1 uses the software dispatcher on vdevs).
    #[serde(default = "one")]
    pub workers: u32,
    /// Burst size (1..=32).
    #[serde(default = "burst")]
    pub burst: u32,
    /// `busy`, `pause`, `yield` or `sleep`.
    #[serde(default = "busy")]
    pub idle: String,
    /// Empty polls before backing off.
    #[serde(default = "idle_after")]
    pub idle_after: u32,
    /// Sleep length for `idle = "sleep"` (µs).
    #[serde(default = "sleep_us")]
    pub sleep_us: u32,
}

fn one() -> u32 {
    1
}
fn burst() -> u32 {
    32
}
fn busy() -> String {
    "busy".into()
}
fn idle_after() -> u32 {
    1000
}
fn sleep_us() -> u32 {
    50
}

impl Default for WorkerSection {
    fn default() -> Self {
        Self { workers: 1, burst: 32, idle: busy(), idle_after: idle_after(), sleep_us: sleep_us() }
    }
}

/// `[mempool]`.
#[derive(Clone, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct MempoolSection {
    /// Mbufs in the pool (default: derived from queues and descriptors).
    pub mbufs: Option<u32>,
    /// Data room per mbuf, headroom included (default: derived from the MTU).
    pub data_room: Option<u32>,
}

/// A profile error: `file: key: problem` on one line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// Parse a MAC `aa:bb:cc:dd:ee:ff`.
pub fn parse_mac(s: &str) -> Option<MacAddr> {
    let mut m = [0u8; 6];
    let mut parts = s.split(':');
    for b in &mut m {
        let p = parts.next()?;
        if p.len() != 2 {
            return None;
        }
        *b = u8::from_str_radix(p, 16).ok()?;
    }
    parts.next().is_none().then_some(MacAddr(m))
}

fn valid_pci(s: &str) -> bool {
    // DDDD:BB:DD.F
    let b = s.as_bytes();
    b.len() == 12
        && b[4] == b':'
        && b[7] == b':'
        && b[10] == b'.'
        && s.char_indices().all(|(i, c)| matches!(i, 4 | 7 | 10) || c.is_ascii_hexdigit())
        && (b'0'..=b'7').contains(&b[11])
}

/// Why `v` cannot be a value in a DPDK devargs string (`net_memif0,role=server,socket=VALUE`), if it cannot: a `,`
/// would end the value and start a key of its own (`socket=/x.sock,role=client` switches the role), `=` and the
/// brackets of kvargs lists change how DPDK splits it, and control characters or whitespace have no place in a
/// socket path or an interface name (a NUL cut the EAL argument short). `None` when it is fine.
pub fn devarg_value_problem(v: &str) -> Option<String> {
    if let Some(c) = v.chars().find(|c| matches!(c, ',' | '=' | '[' | ']' | ';')) {
        return Some(format!("{v:?} contains {c:?}, which would change the DPDK devargs string it goes into"));
    }
    if v.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Some(format!("{v:?} contains whitespace or a control character"));
    }
    None
}

/// The longest memif socket path DPDK 22.11 keeps whole: a Unix socket address holds 108 bytes, and memif's
/// default abstract socket starts with a NUL and ends with one (a longer path is silently cut, so two long paths
/// could name one socket).
pub const MAX_MEMIF_SOCKET: usize = 106;

/// The longest Linux interface name (IFNAMSIZ - 1).
pub const MAX_IFACE: usize = 15;

/// Checks a memif socket path (`port.socket`, or a tool's `--socket` override): a devargs value
/// ([`devarg_value_problem`]) of at most [`MAX_MEMIF_SOCKET`] bytes.
pub fn check_socket(v: &str) -> Result<(), String> {
    // A tool's empty `--socket ''` reached DPDK as `socket=` (a profile's empty one is "missing" before this).
    if v.is_empty() {
        return Err("\"\" is empty: memif needs the path of its control socket".into());
    }
    if let Some(why) = devarg_value_problem(v) {
        return Err(why);
    }
    if v.len() > MAX_MEMIF_SOCKET {
        return Err(format!(
            "{v:?} is {} bytes long: memif keeps at most {MAX_MEMIF_SOCKET} of a socket path (a Unix socket address)",
            v.len()
        ));
    }
    Ok(())
}

/// Checks a kernel interface name (`port.iface`, or a tool's `--iface` override): a devargs value that Linux
/// accepts as a name (at most [`MAX_IFACE`] bytes, no `/` or `:`, not `.` or `..`).
pub fn check_iface(v: &str) -> Result<(), String> {
    if let Some(why) = devarg_value_problem(v) {
        return Err(why);
    }
    if v.is_empty() || v.len() > MAX_IFACE || v.contains(['/', ':']) || v == "." || v == ".." {
        return Err(format!("{v:?} is not a Linux interface name (at most {MAX_IFACE} bytes, no '/' or ':')"));
    }
    Ok(())
}

/// af_packet's ring geometry (the kernel's PACKET_RX_RING rules, and DPDK 22.11's: it parses the values with
/// atoi and copies each received frame into one mbuf of `framesz - 32` bytes): frames are a multiple of 16
/// bytes (TPACKET_ALIGNMENT), blocks a multiple of the page size, and the frame count a whole number of blocks.
const AF_PACKET_ALIGN: u32 = 16;
/// The page size the kernel wants af_packet blocks to be a multiple of (x86-64).
const AF_PACKET_PAGE: u32 = 4096;
/// The largest framesz whose mbuf (`framesz - 32` bytes plus the headroom) fits DPDK's 16-bit data room.
pub const AF_PACKET_MAX_FRAMESZ: u32 = (65535 - MBUF_HEADROOM + 32) / AF_PACKET_ALIGN * AF_PACKET_ALIGN;
/// The most bytes one af_packet ring (rx, and again tx) may take: `framecnt * framesz`.
pub const AF_PACKET_MAX_RING: u64 = 1 << 30;

/// Checks af_packet's `framesz`, `blocksz` and `framecnt` (defaults 2048, 4096, 512) for a port whose largest frame
/// is `frame` bytes; `(key, problem)`.
fn check_af_packet_ring(
    framesz: u32,
    blocksz: u32,
    framecnt: u32,
    frame: u32,
    mtu: u32,
) -> Result<(), (&'static str, String)> {
    let fs = framesz;
    if fs < frame + 64 {
        return Err((
            "port.framesz",
            format!("{fs} is too small for {frame}-byte frames (MTU {mtu}): use framesz = blocksz = 8192"),
        ));
    }
    if fs > AF_PACKET_MAX_FRAMESZ || !fs.is_multiple_of(AF_PACKET_ALIGN) {
        return Err((
            "port.framesz",
            format!(
                "{fs} must be a multiple of {AF_PACKET_ALIGN} and at most {AF_PACKET_MAX_FRAMESZ} (each frame is \
                 copied into one mbuf of framesz - 32 bytes)"
            ),
        ));
    }
    let bs = blocksz;
    if bs < fs || !bs.is_multiple_of(fs) {
        return Err(("port.blocksz", format!("{bs} must be a multiple of framesz ({fs})")));
    }
    if !bs.is_multiple_of(AF_PACKET_PAGE) || bs > i32::MAX as u32 {
        return Err((
            "port.blocksz",
            format!("{bs} must be a multiple of the page size ({AF_PACKET_PAGE}) below 2^31 (the kernel's rule)"),
        ));
    }
    let per_block = bs / fs;
    if framecnt == 0 || !framecnt.is_multiple_of(per_block) {
        return Err((
            "port.framecnt",
            format!(
                "{framecnt} must be a whole number of blocks: a non-zero multiple of blocksz / framesz ({per_block})"
            ),
        ));
    }
    let ring = u64::from(framecnt) * u64::from(fs);
    if ring > AF_PACKET_MAX_RING {
        return Err((
            "port.framecnt",
            format!("{framecnt} frames of {fs} bytes take {ring} bytes per ring (rx and tx each; at most {AF_PACKET_MAX_RING})"),
        ));
    }
    Ok(())
}

/// An `[eal] extra` argument that takes what the tools set themselves: the lcores (`-l`, `-c`, `--lcores`: they come
/// from `eal.lcores` or `--lcore`, and the tools claim and check exactly those) and the runtime directory
/// (`--file-prefix`: each tool names it and removes it on exit, so a second one was left behind in /var/run/dpdk).
/// EAL took the last of each without a word.
fn eal_extra_problem(a: &str) -> Option<String> {
    let name = a.split_once('=').map_or(a, |(n, _)| n);
    let lcores = matches!(name, "--lcores" | "-l" | "-c")
        || (a.len() > 2 && (a.starts_with("-l") || a.starts_with("-c")) && !a.starts_with("--"));
    if lcores {
        return Some(format!("{a:?} sets the lcores, which are the tools' own: give them in eal.lcores (or --lcore)"));
    }
    if name == "--file-prefix" {
        return Some(format!(
            "{a:?} sets the runtime directory, which is the tools' own (each removes its own on exit): give \
             --file-prefix P on the command line"
        ));
    }
    None
}

/// Checks a port's own IPv4 address (`net.ipv4`, or a tool's `--ipv4` override): not unspecified, broadcast,
/// multicast or loopback (no host answers ARP for the first three, frames from them are not a host's, and every peer
/// refuses a loopback GID: [`crate::wire::gid_not_unicast`]).
pub fn check_own_ipv4(ip: Ipv4Addr) -> Result<(), String> {
    if ip.is_unspecified() || ip.is_broadcast() || ip.is_multicast() || ip.is_loopback() {
        return Err(format!(
            "\"{ip}\" is not a host's own address on a network (unspecified, broadcast, multicast or loopback)"
        ));
    }
    Ok(())
}

/// The longest profile [`Profile::load`] reads (the shipped ones are under 4 KiB).
pub const MAX_PROFILE_BYTES: u64 = 1 << 20;

/// A TOML error in `text` as one line: `line N: KEY: problem`, where KEY is the dotted key of the line the error is
/// on (`daemon.max_depth`, `dcqcn.rp_gd`) when toml's own message does not name it: a value of the wrong type or
/// range ("invalid type: string \"4096\", expected u32") says nothing of whose it is. toml's own text quotes the
/// line and marks the column over several lines; only its first line is kept. Shared by the port profiles and
/// `rdp-sim --cc-config`.
pub fn toml_error(text: &str, e: &toml::de::Error) -> String {
    let msg = e.message().lines().next().unwrap_or("syntax error").trim();
    let Some(before) = e.span().and_then(|s| text.get(..s.start.min(text.len()))) else {
        return msg.to_owned();
    };
    let line = before.matches('\n').count() + 1;
    // A bare key (`max_depth`, `np_cnp_dscp`): not a continuation line of an array, not a table header.
    let bare = |k: &str| !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || "_-.".contains(c));
    let key = text.lines().nth(line - 1).and_then(|l| l.split_once('=')).map(|(k, _)| k.trim()).filter(|k| bare(k));
    let Some(key) = key.filter(|k| !msg.contains(*k)) else {
        return format!("line {line}: {msg}");
    };
    // The table the line is in: the last `[name]` header above it.
    let table =
        before.lines().filter_map(|l| l.trim().strip_prefix('[')?.split_once(']')).next_back().map(|(t, _)| t.trim());
    match table {
        Some(t) if bare(t) => format!("line {line}: {t}.{key}: {msg}"),
        _ => format!("line {line}: {key}: {msg}"),
    }
}

/// Whether the TOML `text` has a `port` table, however written (`[port]`, `[ port ]`, `port.driver = ...`,
/// `port = { ... }`). A text that is no TOML at all: whether a line opens one.
fn has_port_table(text: &str) -> bool {
    match text.parse::<toml::Table>() {
        Ok(t) => t.contains_key("port"),
        Err(_) => text.lines().any(|l| {
            let l: String = l.chars().filter(|c| !c.is_whitespace()).collect();
            l.starts_with("[port]") || l.starts_with("port.") || l.starts_with("port=")
        }),
    }
}

/// Whether `m` can be a station's own address: not group (multicast, broadcast) and not all zero.
fn unicast(m: MacAddr) -> bool {
    m.0[0] & 1 == 0 && m.0 != [0; 6]
}

impl Profile {
    /// Read and validate `path` (at most [`MAX_PROFILE_BYTES`]: `/dev/zero` or a FIFO someone keeps writing to is
    /// refused instead of read until memory runs out).
    pub fn load(path: &Path) -> Result<Profile, ConfigError> {
        use std::io::Read;
        let name = path.display().to_string();
        let cannot = |e: std::io::Error| ConfigError(format!("{name}: cannot read: {e}"));
        let mut text = String::new();
        std::fs::File::open(path)
            .and_then(|f| f.take(MAX_PROFILE_BYTES + 1).read_to_string(&mut text))
            .map_err(cannot)?;
        if text.len() as u64 > MAX_PROFILE_BYTES {
            return Err(ConfigError(format!(
                "{name}: longer than {} KiB: not a port profile",
                MAX_PROFILE_BYTES >> 10
            )));
        }
        Self::parse(&name, &text)
    }

    /// Parse and validate `text`; `name` prefixes errors.
    pub fn parse(name: &str, text: &str) -> Result<Profile, ConfigError> {
        let p: Profile = toml::from_str(text).map_err(|e| {
            // A file with no [port] table is another kind of file (conf/dcqcn.toml, say): say so, not only which
            // of its keys a profile does not know.
            let hint = if has_port_table(text) {
                ""
            } else {
                " (this file has no [port] table: not a port profile, see conf/README.md)"
            };
            ConfigError(format!("{name}: {}{hint}", toml_error(text, &e)))
        })?;
        if let (Some(d), Some(digits)) = (&p.daemon, decimal_mode_digits(text)) {
            // Refused whatever its value as decimal: 600 (0o1130) is no mode, but 440 (0o670) is one nobody meant.
            return Err(ConfigError(format!(
                "{name}: daemon.socket_mode: {digits} is decimal ({:#o}); TOML reads a mode in octal only with the 0o \
                 prefix: write socket_mode = 0o{digits} (or the string \"0{digits}\")",
                d.socket_mode
            )));
        }
        p.validate().map_err(|(key, why)| ConfigError(format!("{name}: {key}: {why}")))?;
        Ok(p)
    }

    /// Check everything serde cannot; `(key, problem)`.
    fn validate(&self) -> Result<(), (&'static str, String)> {
        let port = &self.port;
        let need = |v: &Option<String>, key: &'static str, what: &str| match v {
            Some(s) if !s.is_empty() => Ok(()),
            _ => Err((key, format!("missing ({what})"))),
        };
        match port.driver {
            Driver::Memif => {
                need(&port.role, "port.role", "memif needs role = \"server\" or \"client\"")?;
                if !matches!(port.role.as_deref(), Some("server" | "client")) {
                    return Err(("port.role", "must be \"server\" or \"client\"".into()));
                }
                need(&port.socket, "port.socket", "memif needs the control socket path")?;
                if port.zero_copy && port.role.as_deref() != Some("client") {
                    return Err((
                        "port.zero_copy",
                        "memif zero-copy is a client-side mode (DPDK's memif server always copies); set it on the \
                         client's profile"
                            .into(),
                    ));
                }
            }
            Driver::AfPacket | Driver::AfXdp => need(&port.iface, "port.iface", "the kernel interface to attach to")?,
            Driver::Mlx5 | Driver::Ice => {
                need(&port.pci, "port.pci", "the NIC's PCI address, DDDD:BB:DD.F")?;
                if !port.pci.as_deref().is_some_and(valid_pci) {
                    return Err((
                        "port.pci",
                        format!("{:?} is not a PCI address DDDD:BB:DD.F", port.pci.as_deref().unwrap_or("")),
                    ));
                }
            }
            Driver::NetRing => {}
        }
        // A key the driver does not use is refused rather than ignored: `iface` on a memif port or `pci` on an
        // af_packet one is a profile written for another port (or a typo for the right driver).
        let name = port.driver.name();
        if port.driver != Driver::Memif && (port.role.is_some() || port.socket.is_some() || port.zero_copy) {
            return Err((
                "port.role",
                format!("role/socket/zero_copy are memif keys; driver {name} does not use them"),
            ));
        }
        if !matches!(port.driver, Driver::AfPacket | Driver::AfXdp) && port.iface.is_some() {
            return Err(("port.iface", format!("iface is an af_packet/af_xdp key; driver {name} does not use it")));
        }
        if !matches!(port.driver, Driver::Mlx5 | Driver::Ice) {
            if port.pci.is_some() {
                return Err(("port.pci", format!("pci is an mlx5/ice key; driver {name} does not use it")));
            }
            if port.devargs.is_some() {
                return Err(("port.devargs", format!("devargs is an mlx5/ice key; driver {name} does not use it")));
            }
        }
        if let Some(v) = &port.socket {
            check_socket(v).map_err(|why| ("port.socket", why))?;
        }
        if let Some(v) = &port.iface {
            check_iface(v).map_err(|why| ("port.iface", why))?;
        }
        if let Some(v) = &port.devargs {
            // Several key=value pairs are what devargs is for; it is one EAL argument, so only a NUL (which cut it
            // short) or other control characters are refused.
            if v.chars().any(char::is_control) {
                return Err(("port.devargs", format!("{v:?} contains a control character")));
            }
        }
        let n = &self.net;
        if !PATH_MTUS.contains(&n.mtu) {
            return Err(("net.mtu", format!("{} is not a RoCE path MTU (256, 512, 1024, 2048, 4096)", n.mtu)));
        }
        if let Some(m) = &n.mac {
            match parse_mac(m) {
                None => return Err(("net.mac", format!("{m:?} is not a MAC aa:bb:cc:dd:ee:ff"))),
                Some(mac) if !unicast(mac) => {
                    return Err((
                        "net.mac",
                        format!("{m:?} is a group (multicast/broadcast) or zero MAC, not a port's own"),
                    ))
                }
                Some(_) => {}
            }
        }
        if let Some(a) = &n.ipv4 {
            let ip = a.parse::<Ipv4Addr>().map_err(|_| ("net.ipv4", format!("{a:?} is not an IPv4 address")))?;
            check_own_ipv4(ip).map_err(|why| ("net.ipv4", why))?;
        }
        if let Some(a) = &n.ipv6 {
            let ip = a.parse::<Ipv6Addr>().map_err(|_| ("net.ipv6", format!("{a:?} is not an IPv6 address")))?;
            if ip.is_unspecified() || ip.is_multicast() || ip.is_loopback() {
                let why =
                    format!("{a:?} is not a host's own address on a network (unspecified, multicast or loopback)");
                return Err(("net.ipv6", why));
            }
        }
        if n.ipv4.is_none() && n.ipv6.is_none() {
            return Err(("net.ipv4", "missing (the port needs an IPv4 or IPv6 address)".into()));
        }
        let own = [n.ipv4.as_deref(), n.ipv6.as_deref()].map(|a| a.and_then(|a| a.parse::<std::net::IpAddr>().ok()));
        for (i, nb) in n.neighbours.iter().enumerate() {
            let Ok(ip) = nb.ip.parse::<std::net::IpAddr>() else {
                return Err(("net.neighbours.ip", format!("{:?} is not an IP address", nb.ip)));
            };
            // Taken without a word before: the port's own address (its frames to itself would go out to that MAC)
            // and an address listed twice (the later entry silently won).
            if own.contains(&Some(ip)) {
                return Err((
                    "net.neighbours.ip",
                    format!("{:?} is this port's own address, not a neighbour's", nb.ip),
                ));
            }
            if n.neighbours[..i].iter().any(|o| o.ip.parse::<std::net::IpAddr>() == Ok(ip)) {
                return Err(("net.neighbours.ip", format!("{:?} is listed twice", nb.ip)));
            }
            match parse_mac(&nb.mac) {
                None => return Err(("net.neighbours.mac", format!("{:?} is not a MAC aa:bb:cc:dd:ee:ff", nb.mac))),
                // A QP's frames to a group MAC would go to every host of the segment.
                Some(mac) if !unicast(mac) => {
                    return Err((
                        "net.neighbours.mac",
                        format!("{:?} is a group (multicast/broadcast) or zero MAC, not one host's", nb.mac),
                    ))
                }
                Some(_) => {}
            }
        }
        let frame = self.max_frame();
        if port.driver == Driver::AfPacket {
            let (fs, bs, fc) =
                (port.framesz.unwrap_or(2048), port.blocksz.unwrap_or(4096), port.framecnt.unwrap_or(512));
            check_af_packet_ring(fs, bs, fc, frame, n.mtu)?;
        } else if port.framesz.is_some() || port.blocksz.is_some() || port.framecnt.is_some() {
            return Err((
                "port.framesz",
                format!("framesz/blocksz/framecnt are af_packet keys; driver {} does not use them", port.driver.name()),
            ));
        }
        if port.driver == Driver::AfXdp && frame > AF_XDP_MAX_FRAME {
            return Err((
                "net.mtu",
                format!(
                    "{} needs {frame}-byte frames; DPDK 22.11's af_xdp has 2 KiB umem frames (at most {AF_XDP_MAX_FRAME} B): use 1024",
                    n.mtu
                ),
            ));
        }
        if let Some(room) = self.mempool.data_room {
            let need = self.data_room();
            if room < need {
                return Err((
                    "mempool.data_room",
                    format!("{room} is too small: the frame needs {need} (headroom {MBUF_HEADROOM} included)"),
                ));
            }
            if room > 65535 {
                return Err(("mempool.data_room", format!("{room} exceeds 65535")));
            }
        }
        // A descriptor count DPDK's queue setup refuses (0, 1000 on memif, 65535) failed inside DPDK, naming no key.
        // Powers of two from 64 suit every PMD here (ice: multiples of 32; mlx5 and memif: powers of two);
        // `rte_eth_dev_adjust_nb_rx_tx_desc` then clamps to the device's own limits.
        for (key, n) in [("port.rx_desc", port.rx_desc), ("port.tx_desc", port.tx_desc)] {
            if let Some(n) = n.filter(|n| !(n.is_power_of_two() && (64..=16384).contains(n))) {
                return Err((key, format!("{n} is not a power of two from 64 to 16384 (default 1024)")));
            }
        }
        if let Some(m) = self.mempool.mbufs {
            self.check_pool_memory(m)?;
            let (rx, tx) = (u32::from(port.rx_desc.unwrap_or(1024)), u32::from(port.tx_desc.unwrap_or(1024)));
            let least = rx + tx + 2 * 32;
            if m < least {
                return Err((
                    "mempool.mbufs",
                    format!(
                        "{m} is fewer than the rx and tx descriptors ({rx} + {tx}) plus two bursts ({least}): the \
                         port could hold every mbuf and the worker have none to send with"
                    ),
                ));
            }
        }
        let w = &self.worker;
        if w.sleep_us > 10_000 {
            return Err((
                "worker.sleep_us",
                format!("{} is above 10000 (a worker asleep longer fires its QPs' timers that much late)", w.sleep_us),
            ));
        }
        if !(1..=32).contains(&w.burst) {
            return Err(("worker.burst", format!("{} is not in 1..=32", w.burst)));
        }
        if !(1..=16).contains(&w.workers) {
            return Err(("worker.workers", format!("{} is not in 1..=16", w.workers)));
        }
        if !matches!(w.idle.as_str(), "busy" | "pause" | "yield" | "sleep") {
            return Err(("worker.idle", format!("{:?} is not busy, pause, yield or sleep", w.idle)));
        }
        if self.eal.no_huge_mb == Some(0) {
            return Err(("eal.no_huge_mb", "0: EAL needs memory for the mempool (default 512)".into()));
        }
        // Before: a value past DPDK's limit failed inside rte_eal_init ("Cannot allocate memseg list"), one past the
        // machine's memory when the pool was touched, neither naming the key.
        if let Some(mb) = self.eal.no_huge_mb {
            if mb > MAX_NO_HUGE_MB {
                return Err((
                    "eal.no_huge_mb",
                    format!(
                        "{mb} MiB is more than DPDK takes without hugepages ({MAX_NO_HUGE_MB} MiB: one 4 KiB memseg \
                         per page, at most 2^31 - 1 of them)"
                    ),
                ));
            }
            if let Some(total) = machine_mib().filter(|&t| u64::from(mb) > t) {
                return Err((
                    "eal.no_huge_mb",
                    format!("{mb} MiB is more than this machine's memory ({total} MiB, MemTotal in /proc/meminfo)"),
                ));
            }
        }
        if let Some(a) = self.eal.extra.iter().find(|a| a.chars().any(char::is_control)) {
            return Err(("eal.extra", format!("{a:?} contains a control character")));
        }
        if let Some(why) = self.eal.extra.iter().find_map(|a| eal_extra_problem(a)) {
            return Err(("eal.extra", why));
        }
        if self.eal.hugepages && self.eal.no_huge_mb.is_some() {
            return Err(("eal.no_huge_mb", "cannot be combined with hugepages = true".into()));
        }
        if let Some(d) = &self.daemon {
            if !d.socket.starts_with('/') {
                return Err(("daemon.socket", format!("{:?} is not an absolute path", d.socket)));
            }
            if d.socket_mode > 0o777 || d.socket_mode & 0o600 != 0o600 {
                return Err((
                    "daemon.socket_mode",
                    format!("{:#o} must be 0o600..=0o777 with owner rw", d.socket_mode),
                ));
            }
            match d.lcores() {
                None if w.workers > 1 => {
                    return Err((
                        "daemon.worker_lcores",
                        format!("missing: {} workers need one lcore each, e.g. \"1,0\"", w.workers),
                    ))
                }
                None => {}
                Some(Err(e)) => return Err(("daemon.worker_lcores", e)),
                Some(Ok(l)) if l.len() != w.workers as usize => {
                    return Err((
                        "daemon.worker_lcores",
                        format!("{} lcores for worker.workers = {}: give one per worker", l.len(), w.workers),
                    ))
                }
                Some(Ok(l)) => {
                    let twice = l.iter().enumerate().find(|(i, c)| l[..*i].contains(c));
                    if let (Some((_, c)), "busy") = (twice, w.idle.as_str()) {
                        return Err((
                            "daemon.worker_lcores",
                            format!(
                                "lcore {c} twice with worker.idle = \"busy\": two busy-polling workers on one core \
                                 (give each its own lcore, or set worker.idle to sleep, yield or pause)"
                            ),
                        ));
                    }
                }
            }
            if !(1..=1 << 16).contains(&d.max_depth) {
                return Err(("daemon.max_depth", format!("{} is not in 1..=65536", d.max_depth)));
            }
            for (key, v) in [
                ("daemon.session_max_qps", d.session_max_qps),
                ("daemon.session_max_cqs", d.session_max_cqs),
                ("daemon.session_max_mrs", d.session_max_mrs),
                ("daemon.session_max_pds", d.session_max_pds),
                ("daemon.session_max_channels", d.session_max_channels),
            ] {
                if !(1..=1 << 16).contains(&v) {
                    return Err((key, format!("{v} is not in 1..=65536 (objects one client session may hold)")));
                }
            }
            if !(MIN_SESSION_MR_BYTES..=MAX_SESSION_MR_BYTES).contains(&d.session_max_mr_bytes) {
                return Err((
                    "daemon.session_max_mr_bytes",
                    format!(
                        "{} is not in {MIN_SESSION_MR_BYTES}..={MAX_SESSION_MR_BYTES} (bytes one client session may \
                         have registered: 1 MiB to 64 TiB)",
                        d.session_max_mr_bytes
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `mempool.mbufs = m` against what a DPDK pool holds and the memory it can come from: the EAL's (`--no-huge
    /// -m`, `eal.no_huge_mb`) or, with hugepages, the machine's. Before, 4294967295 passed and failed inside
    /// `rte_pktmbuf_pool_create` ("Cannot allocate memory") without naming the key.
    fn check_pool_memory(&self, m: u32) -> Result<(), (&'static str, String)> {
        if m > MAX_MBUFS {
            return Err((
                "mempool.mbufs",
                format!(
                    "{m} is more than a DPDK mempool holds ({MAX_MBUFS}: its ring has a power-of-two number of \
                     slots, at most 2^30)"
                ),
            ));
        }
        let room = u32::from(self.pool_data_room());
        let each = mbuf_pool_bytes(room);
        let need = u64::from(m) * each;
        let need_mib = need.div_ceil(1 << 20);
        let (have, whose) = if self.eal.hugepages {
            match machine_mib() {
                Some(t) => (t, format!("this machine's memory ({t} MiB, MemTotal in /proc/meminfo)")),
                None => return Ok(()),
            }
        } else {
            let mb = self.eal.no_huge_mb.unwrap_or(DEFAULT_NO_HUGE_MB);
            let given = if self.eal.no_huge_mb.is_some() { "" } else { ", the default" };
            (u64::from(mb), format!("the EAL's memory (eal.no_huge_mb = {mb} MiB{given})"))
        };
        if need > have << 20 {
            return Err((
                "mempool.mbufs",
                format!(
                    "{m} mbufs of {room} B data room take at least {need_mib} MiB ({each} B each in the pool), more \
                     than {whose}: lower mempool.mbufs{}",
                    if self.eal.hugepages { "" } else { " or raise eal.no_huge_mb" }
                ),
            ));
        }
        Ok(())
    }

    /// The largest frame: path MTU plus the most header bytes the engine writes.
    pub fn max_frame(&self) -> u32 {
        self.net.mtu + MAX_HEADER_BYTES as u32
    }

    /// The minimum mbuf data room (headroom included) for this port: one frame per mbuf; af_packet copies each
    /// frame into an mbuf of framesz - 32 bytes.
    pub fn data_room(&self) -> u32 {
        let mut payload = self.max_frame().max(2048);
        if self.port.driver == Driver::AfPacket {
            payload = payload.max(self.port.framesz.unwrap_or(2048) - 32);
        }
        payload + MBUF_HEADROOM
    }

    /// The data room to create the pool with (configured or derived).
    pub fn pool_data_room(&self) -> u16 {
        self.mempool.data_room.unwrap_or_else(|| self.data_room()).min(65535) as u16
    }

    /// The vdev `(name, args)` for vdev drivers, with the socket/iface given (overrides allowed by callers).
    pub fn vdev(&self) -> Option<(String, String)> {
        let p = &self.port;
        let frame = self.max_frame();
        Some(match p.driver {
            Driver::Memif => {
                // One memif buffer per frame: 22.11's copy mode mangles frames chained over several buffers.
                let bsize = frame.max(2048).next_power_of_two();
                let mut a = format!("role={},socket={},bsize={bsize}", p.role.as_deref()?, p.socket.as_deref()?);
                if p.zero_copy {
                    a.push_str(",zero-copy=yes");
                }
                ("net_memif0".into(), a)
            }
            Driver::AfPacket => (
                "net_af_packet0".into(),
                format!(
                    "iface={},framesz={},blocksz={},framecnt={},qpairs=1",
                    p.iface.as_deref()?,
                    p.framesz.unwrap_or(2048),
                    p.blocksz.unwrap_or(4096),
                    p.framecnt.unwrap_or(512)
                ),
            ),
            Driver::AfXdp => {
                ("net_af_xdp0".into(), format!("iface={},start_queue=0,queue_count=1", p.iface.as_deref()?))
            }
            Driver::NetRing | Driver::Mlx5 | Driver::Ice => return None,
        })
    }

    /// The EAL `-a` allow-list entry for PCI drivers (`pci[,devargs]`).
    pub fn pci_allow(&self) -> Option<String> {
        let pci = self.port.pci.as_deref()?;
        Some(match self.port.devargs.as_deref() {
            Some(d) if !d.is_empty() => format!("{pci},{d}"),
            _ => pci.to_owned(),
        })
    }

    /// The configured IPv4 address.
    pub fn ipv4(&self) -> Option<[u8; 4]> {
        self.net.ipv4.as_deref()?.parse::<Ipv4Addr>().ok().map(|a| a.octets())
    }

    /// The configured IPv6 address.
    pub fn ipv6(&self) -> Option<[u8; 16]> {
        self.net.ipv6.as_deref()?.parse::<Ipv6Addr>().ok().map(|a| a.octets())
    }

    /// The configured MAC.
    pub fn mac(&self) -> Option<MacAddr> {
        parse_mac(self.net.mac.as_deref()?)
    }
}

/// Where [`Profile::check_host`] looks: the real `/sys` and `/proc`, or a test's copy of the files it reads.
#[derive(Clone, Debug)]
pub struct HostView {
    /// `/sys` (PCI devices, online CPUs, hugepage pools).
    pub sys: std::path::PathBuf,
    /// `/proc/self/net/dev`: the interfaces of this process's network namespace.
    pub net_dev: std::path::PathBuf,
    /// Where commands are looked for (`$PATH`, or [`DEFAULT_PATH`] when it is unset), for hints that name one:
    /// `lspci` is pciutils', not installed everywhere. Only its absolute directories count.
    pub path: std::ffi::OsString,
}

/// Where [`HostView`] looks for commands when `$PATH` is unset (it looked in the current directory only then).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

impl Default for HostView {
    fn default() -> Self {
        Self {
            sys: "/sys".into(),
            net_dev: "/proc/self/net/dev".into(),
            path: std::env::var_os("PATH").unwrap_or_else(|| DEFAULT_PATH.into()),
        }
    }
}

/// Parses a DPDK `-l` list (`"0"`, `"1,0"`, `"0-3,6"`) into its ranges, unexpanded (a profile's `0-4294967295`
/// is two numbers, not four billion); `None` for forms it does not check (`@`, groups).
fn lcore_ranges(s: &str) -> Option<Vec<std::ops::RangeInclusive<u32>>> {
    s.split(',')
        .map(|part| {
            let part = part.trim();
            match part.split_once('-') {
                Some((a, b)) => Some(a.trim().parse::<u32>().ok()?..=b.trim().parse::<u32>().ok()?),
                None => part.parse().ok().map(|n| n..=n),
            }
        })
        .collect()
}

/// [`lcore_ranges`] expanded: for the machine's own list of online CPUs.
fn lcore_list(s: &str) -> Option<Vec<u32>> {
    Some(lcore_ranges(s)?.into_iter().flatten().collect())
}

impl HostView {
    /// Checks an EAL `-l` list (`"0"`, `"1,0"`, `"0-3"`) against this machine's online CPUs: the first lcore that is
    /// not one, as the tail of a one-line error. A list that is not one (`""`, `"1@2"`, `"a"`) or has a range
    /// running backwards (`"3-1"`) is refused as such: EAL said only "invalid core list syntax", naming no key. A
    /// machine whose CPU list cannot be read is not judged.
    pub fn check_lcores(&self, list: &str) -> Result<(), String> {
        let Some(want) = lcore_ranges(list) else {
            return Err(format!(
                "{list:?} is not an lcore list (EAL's -l: lcore numbers and low-high ranges, e.g. \"1\", \"0,1\", \"2-3\")"
            ));
        };
        if let Some(r) = want.iter().find(|r| r.is_empty()) {
            return Err(format!("{list:?}: the range {}-{} runs backwards (write it low-high)", r.start(), r.end()));
        }
        if let Some((online, cpus)) = self.online_cpus() {
            // Lazily: each range stops at its first offline lcore, after at most as many as there are CPUs.
            if let Some(l) = want.into_iter().flatten().find(|l| !cpus.contains(l)) {
                return Err(format!("lcore {l} is not an online CPU here (online: {online})"));
            }
        }
        Ok(())
    }

    fn online_cpus(&self) -> Option<(String, Vec<u32>)> {
        let s = std::fs::read_to_string(self.sys.join("devices/system/cpu/online")).ok()?;
        let s = s.trim().to_owned();
        let l = lcore_list(&s)?;
        Some((s, l))
    }

    fn iface_exists(&self, iface: &str) -> Option<bool> {
        let text = std::fs::read_to_string(&self.net_dev).ok()?;
        Some(text.lines().skip(2).any(|l| l.split(':').next().is_some_and(|n| n.trim() == iface)))
    }

    /// Whether `cmd` is an executable file in one of [`path`](Self::path)'s absolute directories (an empty or
    /// relative entry would name the current directory: a file there says nothing of what is installed).
    fn has_command(&self, cmd: &str) -> bool {
        use std::os::unix::fs::PermissionsExt;
        std::env::split_paths(&self.path)
            .filter(|d| d.is_absolute())
            .any(|d| std::fs::metadata(d.join(cmd)).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
    }

    /// How to list this machine's PCI addresses: `lspci -D` where pciutils is installed, else the sysfs directory
    /// every Linux has.
    fn pci_list_hint(&self) -> String {
        if self.has_command("lspci") {
            "lspci -D lists them".into()
        } else {
            format!("ls {} lists them", self.sys.join("bus/pci/devices").display())
        }
    }

    /// The 2 MiB pages `MFD_HUGETLB | MFD_HUGE_2MB` regions can still take: the pool's free pages not reserved,
    /// and the surplus pages the kernel may still add to the pool when it runs out (`nr_overcommit_hugepages`
    /// less `surplus_hugepages`: a mapping that finds the pool empty has the kernel allocate them, if memory
    /// allows; Documentation/admin-guide/mm/hugetlbpage.rst).
    fn free_2mb_hugepages(&self) -> Option<u64> {
        let dir = self.sys.join("kernel/mm/hugepages/hugepages-2048kB");
        let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok()?.trim().parse::<u64>().ok();
        let free = read("free_hugepages")?.saturating_sub(read("resv_hugepages").unwrap_or(0));
        let surplus =
            read("nr_overcommit_hugepages").unwrap_or(0).saturating_sub(read("surplus_hugepages").unwrap_or(0));
        Some(free.saturating_add(surplus))
    }

    fn free_hugepages(&self) -> Option<u64> {
        let dir = std::fs::read_dir(self.sys.join("kernel/mm/hugepages")).ok()?;
        Some(
            dir.filter_map(Result::ok)
                .filter_map(|e| std::fs::read_to_string(e.path().join("free_hugepages")).ok())
                .filter_map(|s| s.trim().parse::<u64>().ok())
                .sum(),
        )
    }
}

impl Profile {
    /// Checks, before DPDK starts, that what the profile names exists here: the PCI device (and, for mlx5 and ice,
    /// that it sits on the driver DPDK needs), the kernel interface (in this network namespace), every lcore
    /// (`lcores`: the caller's `-l` list, else `[eal] lcores`; `key` names where it came from), and free
    /// hugepages when `[eal] hugepages = true`. One line `name: key: problem` naming what is missing, instead of
    /// EAL's bare "Invalid argument" or a port lookup's "No such device". What cannot be read is not judged.
    pub fn check_host(&self, name: &str, lcores: Option<(&str, &str)>, host: &HostView) -> Result<(), ConfigError> {
        let fail = |key: &str, why: String| Err(ConfigError(format!("{name}: {key}: {why}")));
        let p = &self.port;
        if let (Some(pci), Driver::Mlx5 | Driver::Ice) = (p.pci.as_deref(), p.driver) {
            let dev = host.sys.join("bus/pci/devices").join(pci);
            if !dev.exists() {
                return fail(
                    "port.pci",
                    format!(
                        "no PCI device {pci} on this machine ({}; set port.pci to the NIC port's address)",
                        host.pci_list_hint()
                    ),
                );
            }
            let driver = std::fs::read_link(dev.join("driver"))
                .ok()
                .and_then(|l| l.file_name().map(|n| n.to_string_lossy().into_owned()));
            let user_space = |d: &str| matches!(d, "vfio-pci" | "uio_pci_generic" | "igb_uio");
            match (p.driver, driver.as_deref()) {
                (Driver::Ice, Some(d)) if user_space(d) => {}
                (Driver::Ice, d) => {
                    return fail(
                        "port.pci",
                        format!(
                            "{pci} is on {}, not vfio-pci: bind it first (modprobe vfio-pci; dpdk-devbind.py -b vfio-pci \
                             {pci}{})",
                            d.map_or("no driver".to_owned(), |d| format!("the kernel's {d} driver")),
                            if host.has_command("dpdk-devbind.py") {
                                ""
                            } else {
                                "; dpdk-devbind.py is not installed here: apt-get install dpdk"
                            }
                        ),
                    )
                }
                (_, Some("mlx5_core")) => {}
                (_, d) => {
                    return fail(
                        "port.pci",
                        format!(
                            "{pci} is on {}, not mlx5_core: mlx5 runs beside its kernel driver (modprobe mlx5_core; do not bind it to vfio-pci)",
                            d.unwrap_or("no driver")
                        ),
                    )
                }
            }
        }
        if let (Some(iface), Driver::AfPacket | Driver::AfXdp) = (p.iface.as_deref(), p.driver) {
            if host.iface_exists(iface) == Some(false) {
                return fail(
                    "port.iface",
                    format!("no network interface {iface:?} in this network namespace (ip link lists them)"),
                );
            }
        }
        let (key, list) = lcores.unwrap_or(("eal.lcores", self.eal.lcores.as_deref().unwrap_or("0")));
        if let Err(why) = host.check_lcores(list) {
            return fail(key, why);
        }
        if self.eal.hugepages && host.free_hugepages() == Some(0) {
            return fail(
                "eal.hugepages",
                "true, but no hugepage is free on this machine: reserve some (scripts/setup.sh --hugepages N) or \
                 remove hugepages = true to run on ordinary pages"
                    .into(),
            );
        }
        Ok(())
    }

    /// What the profile asks for that this machine cannot give now but may later, so the program runs and says so
    /// at startup (one line each, `name: key: problem`): `[daemon] backing = "hugetlbfs"` with the 2 MiB pool empty
    /// (its memfds are made, but mapping one reserves its pages and fails, so every CQ, QP and client buffer is
    /// refused, each with one line, until pages are reserved; the daemon need not restart then). What cannot be
    /// read is not judged.
    pub fn host_warnings(&self, name: &str, host: &HostView) -> Vec<String> {
        let mut v = Vec::new();
        let huge = self.daemon.as_ref().is_some_and(|d| d.backing == DaemonBacking::Hugetlbfs);
        if huge && host.free_2mb_hugepages() == Some(0) {
            v.push(format!(
                "{name}: daemon.backing: \"hugetlbfs\", but no 2 MiB hugepage is free on this machine: every CQ, QP and \
                 client buffer is refused until some are (as root: scripts/setup.sh --hugepages N, or echo N > \
                 /proc/sys/vm/nr_hugepages), or set backing = \"memfd\""
            ));
        }
        v
    }
}

#[cfg(feature = "dpdk")]
impl Profile {
    /// EAL arguments for this profile: `lcores` (the caller's choice, else the profile's, else "0"), the run's
    /// `--file-prefix`, memory (`--in-memory` with hugepages, else `--no-huge -m N --no-shconf`), the PCI device
    /// allow-list or the vdev, and the profile's extra arguments.
    pub fn eal_args(&self, program: &str, lcores: Option<&str>, prefix: &str) -> crate::dpdk::EalArgs {
        let lcores = lcores.map(str::to_owned).or_else(|| self.eal.lcores.clone()).unwrap_or_else(|| "0".into());
        let mut args = crate::dpdk::EalArgs::new(program, &lcores);
        args.file_prefix = Some(prefix.to_owned());
        if self.eal.hugepages {
            args.in_memory = true;
        } else {
            args.no_huge_mb = Some(self.eal.no_huge_mb.unwrap_or(DEFAULT_NO_HUGE_MB));
            args.no_shconf = true;
        }
        if let Some(a) = self.pci_allow() {
            args.no_pci = false;
            args.extra.extend(["-a".to_owned(), a]);
        }
        if let Some((name, vargs)) = self.vdev() {
            args.vdevs.push(format!("{name},{vargs}"));
        }
        args.extra.extend(self.eal.extra.iter().cloned());
        // memif zero-copy exports the mempool's memory to the peer, which DPDK only does from one file per memory
        // segment list: without this the vdev's probe fails and EAL reports no port at all.
        if self.port.zero_copy && !args.extra.iter().any(|a| a == "--single-file-segments") {
            args.extra.push("--single-file-segments".into());
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n";

    fn err(text: &str) -> String {
        Profile::parse("t.toml", text).unwrap_err().0
    }

    #[test]
    fn daemon_worker_lcores_one_per_worker() {
        let d = |workers: u32, idle: &str, lcores: Option<&str>| {
            let l = lcores.map(|l| format!("worker_lcores = \"{l}\"\n")).unwrap_or_default();
            format!("{BASE}[worker]\nworkers = {workers}\nidle = \"{idle}\"\n[daemon]\nsocket = \"/run/x.sock\"\n{l}")
        };
        let ok = Profile::parse("t.toml", &d(2, "sleep", Some("1,0"))).unwrap();
        assert_eq!(ok.daemon.unwrap().lcores(), Some(Ok(vec![1, 0])));
        assert!(Profile::parse("t.toml", &d(1, "busy", None)).is_ok());
        assert!(Profile::parse("t.toml", &d(2, "sleep", Some("1, 1"))).is_ok(), "idle workers may share a core");
        for (text, want) in [
            (d(2, "sleep", None), "t.toml: daemon.worker_lcores: missing: 2 workers need one lcore each"),
            (d(2, "sleep", Some("1")), "t.toml: daemon.worker_lcores: 1 lcores for worker.workers = 2"),
            (d(1, "busy", Some("x")), "t.toml: daemon.worker_lcores: \"x\": \"x\" is not an lcore number"),
            (d(2, "busy", Some("1,1")), "t.toml: daemon.worker_lcores: lcore 1 twice with worker.idle = \"busy\""),
        ] {
            let e = err(&text);
            assert!(e.starts_with(want) && !e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn eal_extra_may_not_take_the_lcores_or_the_runtime_directory() {
        let with = |a: &str| Profile::parse("t.toml", &format!("{BASE}[eal]\nextra = [{a:?}]\n")).map_err(|e| e.0);
        for a in ["-l", "-l0", "-c", "-c0x3", "--lcores", "--lcores=0@1"] {
            assert_eq!(
                with(a),
                Err(format!(
                    "t.toml: eal.extra: {a:?} sets the lcores, which are the tools' own: give them in eal.lcores (or \
                     --lcore)"
                ))
            );
        }
        for a in ["--file-prefix", "--file-prefix=x"] {
            assert!(with(a).unwrap_err().starts_with(&format!("t.toml: eal.extra: {a:?} sets the runtime directory")));
        }
        // What the README suggests, and other EAL options, stay.
        for a in ["--log-level=pmd.net.memif:info", "--legacy-mem", "--log-level", "-d"] {
            assert!(with(a).is_ok(), "{a}");
        }
    }

    #[test]
    fn a_neighbour_at_the_ports_own_address_or_listed_twice_is_refused() {
        let nb = |list: &str| format!("{BASE}neighbours = [{list}]\n");
        let m2 = "mac = \"02:00:00:00:00:02\"";
        let m3 = "mac = \"02:00:00:00:00:03\"";
        assert_eq!(
            err(&nb(&format!("{{ ip = \"10.0.0.1\", {m2} }}"))),
            "t.toml: net.neighbours.ip: \"10.0.0.1\" is this port's own address, not a neighbour's"
        );
        assert_eq!(
            err(&nb(&format!("{{ ip = \"10.0.0.2\", {m2} }}, {{ ip = \"10.0.0.2\", {m3} }}"))),
            "t.toml: net.neighbours.ip: \"10.0.0.2\" is listed twice"
        );
        Profile::parse("t.toml", &nb(&format!("{{ ip = \"10.0.0.2\", {m2} }}, {{ ip = \"10.0.0.3\", {m3} }}")))
            .unwrap();
    }

    #[test]
    fn a_descriptor_count_dpdk_refuses_names_its_key() {
        for key in ["rx_desc", "tx_desc"] {
            for n in [0, 1, 32, 1000, 32768, 65535] {
                let text = BASE.replace("[net]", &format!("{key} = {n}\n[net]"));
                assert_eq!(
                    err(&text),
                    format!("t.toml: port.{key}: {n} is not a power of two from 64 to 16384 (default 1024)")
                );
            }
            for n in [64, 512, 4096, 16384] {
                let text = BASE.replace("[net]", &format!("{key} = {n}\n[net]"));
                Profile::parse("t.toml", &text).unwrap();
            }
        }
    }

    #[test]
    fn an_lcore_list_eal_cannot_read_names_its_key() {
        // EAL refused these in rte_eal_init with "invalid core list syntax", naming no key or flag.
        let host = HostView::default();
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        assert!(host.check_lcores("0").is_ok(), "{online}");
        for list in ["", " ", "1@2", "a", "1,", "-1", "0-"] {
            let p = Profile::parse("t.toml", &format!("{BASE}[eal]\nlcores = {list:?}\n"))
                .expect("syntax is the host check's");
            let e = p.check_host("t.toml", None, &host).unwrap_err().0;
            assert_eq!(
                e,
                format!(
                    "t.toml: eal.lcores: {list:?} is not an lcore list (EAL's -l: lcore numbers and low-high ranges, \
                     e.g. \"1\", \"0,1\", \"2-3\")"
                )
            );
        }
        let p = Profile::parse("t.toml", &format!("{BASE}[eal]\nlcores = \"1-0\"\n")).unwrap();
        assert_eq!(
            p.check_host("t.toml", None, &host).unwrap_err().0,
            "t.toml: eal.lcores: \"1-0\": the range 1-0 runs backwards (write it low-high)"
        );
        // A tool's override is judged the same way, under its own name.
        let p = Profile::parse("t.toml", BASE).unwrap();
        let e = p.check_host("t.toml", Some(("--lcore", "x")), &host).unwrap_err().0;
        assert!(e.starts_with("t.toml: --lcore: \"x\" is not an lcore list"), "{e}");
    }

    #[test]
    fn a_loopback_address_is_no_ports_own() {
        // A port on 127.0.0.1 or ::1 was taken: its GID is one every peer refuses (the perftest tools' record check,
        // roce-dpd's RTR), so nothing could ever connect to it.
        let e = err(&BASE.replace("10.0.0.1", "127.0.0.1"));
        assert_eq!(
            e,
            "t.toml: net.ipv4: \"127.0.0.1\" is not a host's own address on a network (unspecified, broadcast, \
             multicast or loopback)"
        );
        let e = err(&BASE.replace("[net]\n", "[net]\nipv6 = \"::1\"\n"));
        assert_eq!(
            e,
            "t.toml: net.ipv6: \"::1\" is not a host's own address on a network (unspecified, multicast or loopback)"
        );
        assert_eq!(check_own_ipv4(Ipv4Addr::new(127, 1, 2, 3)).map_err(|e| e.contains("loopback")), Err(true));
    }

    #[test]
    fn an_empty_socket_or_interface_override_is_refused() {
        // A tool's `--socket ''` / `--iface ''` passed these checks and reached DPDK (`socket=`, `iface=`).
        assert_eq!(check_socket(""), Err("\"\" is empty: memif needs the path of its control socket".into()));
        assert_eq!(
            check_iface(""),
            Err(format!("\"\" is not a Linux interface name (at most {MAX_IFACE} bytes, no '/' or ':')"))
        );
        assert_eq!((check_socket("/run/m.sock"), check_iface("vp0")), (Ok(()), Ok(())));
    }

    #[test]
    fn every_profile_in_conf_loads_and_validates() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf");
        let mut n = 0;
        for e in std::fs::read_dir(&dir).expect("conf/ exists") {
            let path = e.unwrap().path();
            // conf/dcqcn.toml is the congestion-control parameter file, not a port profile (tools/tests/dcqcn.rs
            // checks it).
            if path.extension().is_some_and(|x| x == "toml") && !path.ends_with("dcqcn.toml") {
                let p = Profile::load(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(p.data_room() >= p.max_frame() + MBUF_HEADROOM, "{}", path.display());
                n += 1;
            }
        }
        assert_eq!(n, 13, "the port profiles in conf/ (every .toml but dcqcn.toml): one added or lost?");
    }

    #[test]
    fn a_socket_mode_written_without_0o_says_so() {
        let d = |mode: &str| format!("{BASE}[daemon]\nsocket = \"/run/x.sock\"\nsocket_mode = {mode}\n");
        // 400-511 written so were taken as decimal without a word: 440 (meant 0o440) became 0o670, group rwx.
        for (mode, octal) in
            [("440", "0o670"), ("420", "0o644"), ("432", "0o660"), ("504", "0o770"), ("4_4_0", "0o670")]
        {
            let digits = mode.replace('_', "");
            assert_eq!(
                err(&d(mode)),
                format!(
                    "t.toml: daemon.socket_mode: {digits} is decimal ({octal}); TOML reads a mode in octal only with \
                     the 0o prefix: write socket_mode = 0o{digits} (or the string \"0{digits}\")"
                )
            );
        }
        // It said "0o1130 must be 0o600..=0o777 with owner rw" of a file that says 600.
        assert_eq!(
            err(&d("600")),
            "t.toml: daemon.socket_mode: 600 is decimal (0o1130); TOML reads a mode in octal only with the 0o \
             prefix: write socket_mode = 0o600 (or the string \"0600\")"
        );
        assert!(err(&d("660")).ends_with("write socket_mode = 0o660 (or the string \"0660\")"));
        // The octal literal, and the string forms, of the same digits.
        for mode in ["0o644", "\"0644\"", "\"644\"", "\"0o644\"", "0o0644"] {
            assert_eq!(Profile::parse("t.toml", &d(mode)).unwrap().daemon.unwrap().socket_mode, 0o644, "{mode}");
        }
        assert_eq!(
            err(&d("\"rw-r--r--\"")),
            "t.toml: line 8: daemon.socket_mode: \"rw-r--r--\" is not an octal mode (write 0o600 or \"0600\")"
        );
        assert!(err(&d("\"0680\"")).ends_with("\"0680\" is not an octal mode (write 0o600 or \"0600\")"));
        assert!(err(&d("-1")).ends_with("-1 is not a mode (write 0o600 or \"0600\")"));
        assert_eq!(Profile::parse("t.toml", &d("0o660")).unwrap().daemon.unwrap().socket_mode, 0o660);
        // 384 is 0o600 in decimal: a valid mode, whatever the notation.
        assert_eq!(Profile::parse("t.toml", &d("384")).unwrap().daemon.unwrap().socket_mode, 0o600);
        assert_eq!(err(&d("0o400")), "t.toml: daemon.socket_mode: 0o400 must be 0o600..=0o777 with owner rw");
        assert_eq!(err(&d("800")), "t.toml: daemon.socket_mode: 0o1440 must be 0o600..=0o777 with owner rw");
    }

    #[test]
    fn a_value_of_the_wrong_type_names_its_key() {
        // The line alone (`line 5: invalid type: string "1024", expected u32`) made the user find the key.
        let e = err(&BASE.replace("mtu = 1024", "mtu = \"1024\""));
        assert_eq!(e, "t.toml: line 5: net.mtu: invalid type: string \"1024\", expected u32");
        let e = err(&format!("{BASE}[eal]\nlcores = 1\n"));
        assert_eq!(e, "t.toml: line 7: eal.lcores: invalid type: integer `1`, expected a string");
        let e = err(&format!("{BASE}[daemon]\nsocket = \"/run/x.sock\"\n  max_depth=-1 # x\n"));
        assert_eq!(e, "t.toml: line 8: daemon.max_depth: invalid value: integer `-1`, expected u32");
        // Keys toml's message names already, and lines that are no `key = value`, stay as they were.
        assert!(err(&format!("{BASE}bogus = 1\n")).starts_with("t.toml: line 6: unknown field `bogus`"));
        let e = err(&format!("{BASE}[eal]\nextra = [\n  \"-a\",\n  {{ a = 1 }},\n]\n"));
        assert_eq!(e, "t.toml: line 9: invalid type: map, expected a string");
    }

    /// Session 14: `roce-dpd --config conf/dcqcn.toml` said only "unknown field `algorithm`", as if one key were
    /// wrong in a port profile.
    #[test]
    fn a_file_that_is_no_port_profile_says_so() {
        let dcqcn = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/dcqcn.toml")).unwrap();
        let e = err(&dcqcn);
        assert!(e.starts_with("t.toml: line "), "{e}");
        assert!(e.ends_with("(this file has no [port] table: not a port profile, see conf/README.md)"), "{e}");
        assert!(!err(&format!("{BASE}bogus = 1\n")).contains("not a port profile"));
        // A port table written any way TOML allows is one: a profile with an error elsewhere is not told otherwise.
        for port in
            ["[ port ]\ndriver = \"net_ring\"\n", "port.driver = \"net_ring\"\n", "port = { driver = \"net_ring\" }\n"]
        {
            let e = err(&format!("{port}[net]\nipv4 = \"10.0.0.1\"\nmtu = \"1024\"\n"));
            assert!(e.contains("mtu") && !e.contains("not a port profile"), "{port:?}: {e}");
        }
        // Not TOML at all (a JSON file), with no port table: still told.
        assert!(err("{\"dcqcn\": 1}\n").ends_with("not a port profile, see conf/README.md)"));
    }

    #[test]
    fn errors_are_one_line_naming_file_and_key() {
        let e = err(&format!("{BASE}bogus = 1\n"));
        assert!(e.starts_with("t.toml: line 6: unknown field `bogus`"), "{e}");
        assert!(!e.contains('\n'));
        let e = err("[port]\ndriver = \"af_packet\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n");
        assert_eq!(e, "t.toml: port.iface: missing (the kernel interface to attach to)");
        let e = err(&BASE.replace("1024", "9000"));
        assert!(e.starts_with("t.toml: net.mtu: 9000 is not a RoCE path MTU"), "{e}");
        let e = err(&BASE.replace("net_ring", "tap"));
        assert!(e.starts_with("t.toml: line 2: port.driver: unknown variant `tap`"), "{e}");
        let e = err(&format!("{BASE}[mempool]\ndata_room = 1024\n"));
        assert!(e.starts_with("t.toml: mempool.data_room: 1024 is too small"), "{e}");
        let e = err("[port]\ndriver = \"mlx5\"\npci = \"3b:00.0\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 4096\n");
        assert!(e.starts_with("t.toml: port.pci: \"3b:00.0\" is not a PCI address"), "{e}");
        let e = err(&BASE.replace("10.0.0.1", "10.0.0"));
        assert_eq!(e, "t.toml: net.ipv4: \"10.0.0\" is not an IPv4 address");
        let e = err("[port]\ndriver = \"af_packet\"\niface = \"v0\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 4096\n");
        assert!(e.starts_with("t.toml: port.framesz: 2048 is too small for 4210-byte frames"), "{e}");
        let e = err("[port]\ndriver = \"memif\"\nrole = \"server\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n");
        assert!(e.starts_with("t.toml: port.socket: missing"), "{e}");
    }

    #[test]
    fn sizes_follow_the_mtu() {
        let p = Profile::parse("t", &BASE.replace("1024", "4096")).unwrap();
        assert_eq!(p.max_frame(), 4096 + MAX_HEADER_BYTES as u32);
        assert_eq!(p.data_room(), p.max_frame() + 128);
        let a = Profile::parse(
            "t",
            "[port]\ndriver = \"af_packet\"\niface = \"v0\"\nframesz = 8192\nblocksz = 8192\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 4096\n",
        )
        .unwrap();
        assert_eq!(a.data_room(), 8160 + 128);
        assert!(a.vdev().unwrap().1.contains("framesz=8192,blocksz=8192"));
    }

    #[test]
    fn host_check_names_what_the_machine_lacks() {
        // A fake /sys and /proc/self/net/dev: CPUs 0-1, one PCI device on ice, one on mlx5_core, one on vfio-pci,
        // interface veth0, no free hugepage.
        let root = std::env::temp_dir().join(format!("roce-dp-hostview-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let sys = root.join("sys");
        std::fs::create_dir_all(sys.join("devices/system/cpu")).unwrap();
        std::fs::write(sys.join("devices/system/cpu/online"), "0-1\n").unwrap();
        for (pci, drv) in [("0000:5e:00.0", "ice"), ("0000:3b:00.0", "mlx5_core"), ("0000:5e:00.1", "vfio-pci")] {
            let dev = sys.join("bus/pci/devices").join(pci);
            std::fs::create_dir_all(&dev).unwrap();
            std::os::unix::fs::symlink(format!("../../../bus/pci/drivers/{drv}"), dev.join("driver")).unwrap();
        }
        std::fs::create_dir_all(sys.join("kernel/mm/hugepages/hugepages-2048kB")).unwrap();
        std::fs::write(sys.join("kernel/mm/hugepages/hugepages-2048kB/free_hugepages"), "0\n").unwrap();
        let net_dev = root.join("net_dev");
        std::fs::write(&net_dev, "Inter-|   Receive\n face |bytes\n    lo: 0 0\n veth0: 1 2\n").unwrap();
        // A $PATH without lspci (pciutils not installed) and dpdk-devbind.py (Debian's dpdk package), and one with
        // both.
        let (bin, no_bin) = (root.join("bin"), root.join("no-bin"));
        for d in [&bin, &no_bin] {
            std::fs::create_dir_all(d).unwrap();
        }
        for cmd in ["lspci", "dpdk-devbind.py"] {
            std::fs::write(bin.join(cmd), "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(bin.join(cmd), std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
        }
        let host = HostView { sys, net_dev, path: bin.into_os_string() };
        let nic = |driver: &str, pci: &str, eal: &str| {
            Profile::parse(
                "t.toml",
                &format!("[port]\ndriver = \"{driver}\"\npci = \"{pci}\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 4096\n[eal]\n{eal}"),
            )
            .unwrap()
        };
        let check = |p: &Profile, l: Option<(&str, &str)>| p.check_host("t.toml", l, &host).map_err(|e| e.0);
        assert_eq!(
            check(&nic("ice", "0000:5e:00.2", ""), None).unwrap_err(),
            "t.toml: port.pci: no PCI device 0000:5e:00.2 on this machine (lspci -D lists them; set port.pci to the \
             NIC port's address)"
        );
        // Session 15: without pciutils the hint named a command the machine lacks; it names the sysfs directory.
        let bare = HostView { path: no_bin.into_os_string(), ..host.clone() };
        assert_eq!(
            nic("ice", "0000:5e:00.2", "").check_host("t.toml", None, &bare).unwrap_err().0,
            format!(
                "t.toml: port.pci: no PCI device 0000:5e:00.2 on this machine (ls {}/bus/pci/devices lists them; set \
                 port.pci to the NIC port's address)",
                host.sys.display()
            )
        );
        // Nor is dpdk-devbind.py everywhere (setup.sh installs libdpdk-dev, not the dpdk package that has it).
        assert_eq!(
            nic("ice", "0000:5e:00.0", "").check_host("t.toml", None, &bare).unwrap_err().0,
            "t.toml: port.pci: 0000:5e:00.0 is on the kernel's ice driver, not vfio-pci: bind it first (modprobe \
             vfio-pci; dpdk-devbind.py -b vfio-pci 0000:5e:00.0; dpdk-devbind.py is not installed here: apt-get \
             install dpdk)"
        );
        assert_eq!(
            check(&nic("ice", "0000:5e:00.0", ""), None).unwrap_err(),
            "t.toml: port.pci: 0000:5e:00.0 is on the kernel's ice driver, not vfio-pci: bind it first (modprobe \
             vfio-pci; dpdk-devbind.py -b vfio-pci 0000:5e:00.0)"
        );
        assert_eq!(
            check(&nic("mlx5", "0000:5e:00.1", ""), None).unwrap_err(),
            "t.toml: port.pci: 0000:5e:00.1 is on vfio-pci, not mlx5_core: mlx5 runs beside its kernel driver \
             (modprobe mlx5_core; do not bind it to vfio-pci)"
        );
        assert_eq!(check(&nic("ice", "0000:5e:00.1", "lcores = \"0-1\""), None), Ok(()));
        assert_eq!(check(&nic("mlx5", "0000:3b:00.0", "lcores = \"1\""), None), Ok(()));
        assert_eq!(
            check(&nic("mlx5", "0000:3b:00.0", "lcores = \"2\""), None).unwrap_err(),
            "t.toml: eal.lcores: lcore 2 is not an online CPU here (online: 0-1)"
        );
        assert_eq!(
            check(&nic("mlx5", "0000:3b:00.0", ""), Some(("--lcore", "0,3"))).unwrap_err(),
            "t.toml: --lcore: lcore 3 is not an online CPU here (online: 0-1)"
        );
        assert_eq!(
            check(&nic("mlx5", "0000:3b:00.0", "hugepages = true"), None).unwrap_err(),
            "t.toml: eal.hugepages: true, but no hugepage is free on this machine: reserve some (scripts/setup.sh \
             --hugepages N) or remove hugepages = true to run on ordinary pages"
        );
        let afp = |iface: &str| {
            Profile::parse(
                "t.toml",
                &format!("[port]\ndriver = \"af_xdp\"\niface = \"{iface}\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n"),
            )
            .unwrap()
        };
        assert_eq!(check(&afp("veth0"), None), Ok(()));
        assert_eq!(
            check(&afp("veth1"), None).unwrap_err(),
            "t.toml: port.iface: no network interface \"veth1\" in this network namespace (ip link lists them)"
        );
        assert_eq!(lcore_list("0-3,6"), Some(vec![0, 1, 2, 3, 6]));
        assert_eq!(lcore_list("1@2"), None, "forms it does not check are left to EAL");

        // Session 15: a daemon profile asking for hugetlbfs backing with the 2 MiB pool empty started without a
        // word, then refused every CQ, QP and client buffer. One warning line now; none for memfd backing, for a
        // pool with free pages, or for a pool that cannot be read; free pages all reserved count as none.
        let daemon = |backing: &str| {
            Profile::parse(
                "d.toml",
                &format!(
                    "[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 4096\n[daemon]\n\
                     socket = \"/run/x.sock\"\nbacking = \"{backing}\"\n"
                ),
            )
            .unwrap()
        };
        let (huge, memfd) = (daemon("hugetlbfs"), daemon("memfd"));
        let warned =
            ["d.toml: daemon.backing: \"hugetlbfs\", but no 2 MiB hugepage is free on this machine: every CQ, QP and \
             client buffer is refused until some are (as root: scripts/setup.sh --hugepages N, or echo N > \
             /proc/sys/vm/nr_hugepages), or set backing = \"memfd\""
                .to_owned()];
        assert_eq!(huge.host_warnings("d.toml", &host), warned);
        assert!(memfd.host_warnings("d.toml", &host).is_empty());
        assert!(nic("ice", "0000:5e:00.1", "").host_warnings("t.toml", &host).is_empty());
        let pool = host.sys.join("kernel/mm/hugepages/hugepages-2048kB");
        std::fs::write(pool.join("free_hugepages"), "3\n").unwrap();
        assert!(huge.host_warnings("d.toml", &host).is_empty());
        std::fs::write(pool.join("resv_hugepages"), "3\n").unwrap();
        assert_eq!(huge.host_warnings("d.toml", &host), warned);
        // Session 15's review: a pool allowed to grow (nr_overcommit_hugepages) gives mappings surplus pages when
        // it is empty, so it is not empty for them; once the surplus reaches that limit, it is.
        std::fs::write(pool.join("nr_overcommit_hugepages"), "4\n").unwrap();
        std::fs::write(pool.join("surplus_hugepages"), "1\n").unwrap();
        assert!(huge.host_warnings("d.toml", &host).is_empty(), "3 surplus pages can still come");
        std::fs::write(pool.join("surplus_hugepages"), "4\n").unwrap();
        assert_eq!(huge.host_warnings("d.toml", &host), warned);
        std::fs::remove_dir_all(&pool).unwrap();
        assert!(huge.host_warnings("d.toml", &host).is_empty(), "a pool that cannot be read is not judged");
        let _ = std::fs::remove_dir_all(&root);
    }

    #[test]
    fn session_limits_default_and_are_checked() {
        let d = format!("{BASE}[daemon]\nsocket = \"/run/x.sock\"\n");
        let p = Profile::parse("t.toml", &d).unwrap();
        assert_eq!(p.daemon.unwrap().limits(), crate::ctrl::SessionLimits::default());
        let p = Profile::parse("t.toml", &format!("{d}session_max_qps = 8\nsession_max_channels = 2\n")).unwrap();
        let l = p.daemon.unwrap().limits();
        assert_eq!((l.qps, l.channels, l.cqs), (8, 2, 512));
        assert_eq!(
            err(&format!("{d}session_max_mrs = 0\n")),
            "t.toml: daemon.session_max_mrs: 0 is not in 1..=65536 (objects one client session may hold)"
        );
        // 1 TiB by default; 1 MiB and 64 TiB are the bounds.
        assert_eq!(crate::ctrl::SessionLimits::default().mr_bytes, 1 << 40);
        for ok in [1u64 << 20, 1 << 46] {
            let p = Profile::parse("t.toml", &format!("{d}session_max_mr_bytes = {ok}\n")).unwrap();
            assert_eq!(p.daemon.unwrap().limits().mr_bytes, ok);
        }
        for bad in [0u64, (1 << 20) - 1, (1 << 46) + 1] {
            assert_eq!(
                err(&format!("{d}session_max_mr_bytes = {bad}\n")),
                format!(
                    "t.toml: daemon.session_max_mr_bytes: {bad} is not in 1048576..=70368744177664 (bytes one client \
                     session may have registered: 1 MiB to 64 TiB)"
                )
            );
        }
    }

    #[test]
    fn mac_parsing() {
        assert_eq!(parse_mac("02:00:00:00:00:0a"), Some(MacAddr([2, 0, 0, 0, 0, 10])));
        assert_eq!(parse_mac("02:00:00:00:00"), None);
        assert_eq!(parse_mac("02:00:00:00:00:0a:01"), None);
        assert!(valid_pci("0000:3b:00.1") && !valid_pci("0000:3b:00.8"));
    }
}
