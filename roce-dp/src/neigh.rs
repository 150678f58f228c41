//! What a soft NIC on a DPDK port must do without a kernel: classify received frames (RoCE, ARP, IPv6 neighbour
//! discovery, other), answer ARP and neighbour solicitations for its own addresses, resolve peers, and keep a
//! small neighbour table (learned entries plus static ones from the port profile).
//!
//! Pure frame code, no DPDK: the data path ([`crate::dpdk::Worker`]) calls [`classify`] on every received frame
//! and hands ARP/ND frames to [`Neighbours::handle`], which may write a reply into a transmit buffer.

use crate::time::{Duration, Instant};
use crate::wire::ipv4::checksum;
use crate::wire::{MacAddr, ROCE_UDP_PORT};

/// Ethertypes this module looks at.
const ETH_IPV4: u16 = 0x0800;
const ETH_ARP: u16 = 0x0806;
const ETH_IPV6: u16 = 0x86dd;
const ETH_VLAN: u16 = 0x8100;
/// ICMPv6 types of neighbour discovery.
const ND_NS: u8 = 135;
const ND_NA: u8 = 136;
/// Flags of a neighbour advertisement (RFC 4861 §4.4): Solicited, Override.
const NA_SOLICITED: u8 = 0x40;
const NA_OVERRIDE: u8 = 0x20;
/// Length of an ARP frame for IPv4 over Ethernet (14 + 28), before padding.
pub const ARP_FRAME_LEN: usize = 42;
/// Length of our NS/NA frames: Ethernet 14 + IPv6 40 + ICMPv6 24 + one link-layer address option 8.
pub const ND_FRAME_LEN: usize = 86;
/// Frames shorter than this are padded (Ethernet minimum without FCS).
const MIN_FRAME: usize = 60;

/// The Ethernet broadcast address.
pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);

/// What a received frame is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameKind {
    /// RoCEv2 (IPv4 or IPv6, UDP destination port 4791) for BTH destination QP `dest_qp` (0 if the BTH is cut).
    Roce {
        /// The BTH destination QP.
        dest_qp: u32,
    },
    /// ARP.
    Arp,
    /// IPv6 neighbour solicitation or advertisement.
    Nd,
    /// Anything else (counted and dropped).
    Other,
}

fn be16(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_be_bytes([*b.get(at)?, *b.get(at + 1)?]))
}

/// The longest priority-tagged ARP/ND frame [`Neighbours::handle`] takes, untagged (a standard Ethernet frame
/// without its FCS; ND messages are far shorter).
const UNTAG_MAX: usize = 1514;

/// Classify an Ethernet frame (optionally 802.1Q-tagged) by looking at as few bytes as possible.
pub fn classify(frame: &[u8]) -> FrameKind {
    let Some(mut ethertype) = be16(frame, 12) else { return FrameKind::Other };
    let mut l3 = 14;
    if ethertype == ETH_VLAN {
        let Some(t) = be16(frame, 16) else { return FrameKind::Other };
        ethertype = t;
        l3 = 18;
    }
    let (proto, l4) = match ethertype {
        ETH_ARP => return FrameKind::Arp,
        ETH_IPV4 => {
            let Some(&vihl) = frame.get(l3) else { return FrameKind::Other };
            let Some(&proto) = frame.get(l3 + 9) else { return FrameKind::Other };
            (proto, l3 + usize::from(vihl & 0x0f) * 4)
        }
        ETH_IPV6 => {
            let Some(&next) = frame.get(l3 + 6) else { return FrameKind::Other };
            (next, l3 + 40)
        }
        _ => return FrameKind::Other,
    };
    match proto {
        17 if be16(frame, l4 + 2) == Some(ROCE_UDP_PORT) => {
            // BTH: 8 bytes after the UDP header; destination QP in bytes 5..8.
            let b = l4 + 8;
            let dest_qp = match frame.get(b + 5..b + 8) {
                Some(q) => u32::from_be_bytes([0, q[0], q[1], q[2]]),
                None => 0,
            };
            FrameKind::Roce { dest_qp }
        }
        58 if ethertype == ETH_IPV6 && matches!(frame.get(l4), Some(&ND_NS) | Some(&ND_NA)) => FrameKind::Nd,
        _ => FrameKind::Other,
    }
}

/// Neighbour counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NeighStats {
    /// ARP frames received.
    pub arp_rx: u64,
    /// ARP requests for our address answered.
    pub arp_replies: u64,
    /// ARP requests sent (resolving a peer).
    pub arp_requests: u64,
    /// ND frames received.
    pub nd_rx: u64,
    /// Neighbour advertisements sent (answers to solicitations for our address).
    pub nd_adverts: u64,
    /// Neighbour solicitations sent (resolving a peer).
    pub nd_solicits: u64,
    /// Entries learned from received frames.
    pub learned: u64,
    /// Solicitations not sent because the same target was solicited too recently ([`Neighbours::solicit_at`]).
    pub solicits_limited: u64,
    /// ARP/ND frames ignored (malformed, or not for us).
    pub ignored: u64,
}

/// An IP address of a neighbour.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NeighIp {
    /// IPv4.
    V4([u8; 4]),
    /// IPv6.
    V6([u8; 16]),
}

/// The neighbour table and the ARP/ND responder of one port.
#[derive(Clone, Debug)]
pub struct Neighbours {
    mac: MacAddr,
    v4: Option<[u8; 4]>,
    v6: Option<[u8; 16]>,
    /// (address, MAC, static). Small: linear search.
    table: Vec<(NeighIp, MacAddr, bool)>,
    /// Targets being solicited: (address, when last solicited, the wait before the next solicitation).
    pending: Vec<(NeighIp, Instant, Duration)>,
    /// Counters.
    pub stats: NeighStats,
}

/// Most learned entries kept (the oldest learned one is replaced beyond this).
const MAX_LEARNED: usize = 256;

/// Solicitation backoff per target ([`Neighbours::solicit_at`]): the second solicitation may follow the first after
/// [`SOLICIT_FIRST_GAP`], each next one after twice the previous gap, at most [`SOLICIT_MAX_GAP`] (Linux's ARP
/// probes are 1 s apart). A target not solicited for [`SOLICIT_FORGET`] starts again at the first gap.
pub const SOLICIT_FIRST_GAP: Duration = Duration::from_millis(20);
/// The longest gap between two solicitations of one target.
pub const SOLICIT_MAX_GAP: Duration = Duration::from_millis(1000);
/// After this long without a solicitation, a target's backoff starts over.
pub const SOLICIT_FORGET: Duration = Duration::from_millis(5000);
/// Targets whose backoff is remembered (the oldest is forgotten beyond this).
const MAX_PENDING: usize = 64;

impl Neighbours {
    /// A responder for a port with MAC `mac` and the given addresses.
    pub fn new(mac: MacAddr, v4: Option<[u8; 4]>, v6: Option<[u8; 16]>) -> Self {
        Self { mac, v4, v6, table: Vec::new(), pending: Vec::new(), stats: NeighStats::default() }
    }

    /// Add a static entry (never replaced by learning).
    pub fn add_static(&mut self, ip: NeighIp, mac: MacAddr) {
        self.table.retain(|e| e.0 != ip);
        self.table.push((ip, mac, true));
    }

    /// The MAC of `ip`, if known.
    pub fn lookup(&self, ip: NeighIp) -> Option<MacAddr> {
        self.table.iter().find(|e| e.0 == ip).map(|e| e.1)
    }

    fn learn(&mut self, ip: NeighIp, mac: MacAddr) {
        if mac.0[0] & 1 != 0 || mac == MacAddr::default() {
            return; // multicast or zero: not a neighbour's address
        }
        if ip == NeighIp::V4([0; 4]) || ip == NeighIp::V6([0; 16]) {
            return; // an ARP probe's sender (RFC 5227: zero so that no cache learns it), or ::
        }
        if let Some(e) = self.table.iter_mut().find(|e| e.0 == ip) {
            if !e.2 && e.1 != mac {
                e.1 = mac;
                self.stats.learned += 1;
            }
            return;
        }
        if self.table.iter().filter(|e| !e.2).count() >= MAX_LEARNED {
            if let Some(i) = self.table.iter().position(|e| !e.2) {
                self.table.remove(i);
            }
        }
        self.table.push((ip, mac, false));
        self.stats.learned += 1;
        self.pending.retain(|e| e.0 != ip);
    }

    /// Handle a received ARP or ND frame: learn the sender, and if it asks for our address write the reply into
    /// `out` and return its length (`out` must hold at least 86 bytes). A frame tagged for a VLAN (VID 1-4095) is
    /// ignored: the port has no VLAN and its answers carry no tag (an untagged answer would go to another network).
    /// A priority tag (VID 0: IEEE 802.1Q's PCP without a VLAN, as PFC-configured RoCE hosts send) belongs to the
    /// untagged network, as in the engine's receive path and Linux: the frame is handled as if untagged and the
    /// answer goes out untagged.
    pub fn handle(&mut self, frame: &[u8], out: &mut [u8]) -> Option<usize> {
        let kind = classify(frame);
        match kind {
            FrameKind::Arp => self.stats.arp_rx += 1,
            FrameKind::Nd => self.stats.nd_rx += 1,
            _ => {
                self.stats.ignored += 1;
                return None;
            }
        }
        if be16(frame, 12) == Some(ETH_VLAN) {
            return self.handle_tagged(kind, frame, out);
        }
        self.handle_untagged(kind, frame, out)
    }

    /// A tagged ARP/ND frame: a priority tag's frame handled without its tag (copied into a stack buffer), a VLAN's
    /// ignored.
    fn handle_tagged(&mut self, kind: FrameKind, frame: &[u8], out: &mut [u8]) -> Option<usize> {
        // The tag's VID (its low 12 bits); `classify` saw the ethertype after it, so the tag is whole.
        let vid = be16(frame, 14).map_or(1, |t| t & 0x0fff);
        if vid != 0 || frame.len() - 4 > UNTAG_MAX {
            self.stats.ignored += 1;
            return None;
        }
        let n = frame.len() - 4;
        let mut untagged = [0u8; UNTAG_MAX];
        untagged[..12].copy_from_slice(&frame[..12]);
        untagged[12..n].copy_from_slice(&frame[16..]);
        self.handle_untagged(kind, &untagged[..n], out)
    }

    fn handle_untagged(&mut self, kind: FrameKind, frame: &[u8], out: &mut [u8]) -> Option<usize> {
        if kind == FrameKind::Arp {
            self.handle_arp(frame, out)
        } else {
            self.handle_nd(frame, out)
        }
    }

    fn handle_arp(&mut self, frame: &[u8], out: &mut [u8]) -> Option<usize> {
        let Some(a) = frame.get(14..ARP_FRAME_LEN) else {
            self.stats.ignored += 1;
            return None;
        };
        // htype 1 (Ethernet), ptype IPv4, hlen 6, plen 4.
        if a[0..6] != [0, 1, 8, 0, 6, 4] {
            self.stats.ignored += 1;
            return None;
        }
        let oper = u16::from_be_bytes([a[6], a[7]]);
        let sha = MacAddr(a[8..14].try_into().expect("6"));
        let spa: [u8; 4] = a[14..18].try_into().expect("4");
        let tpa: [u8; 4] = a[24..28].try_into().expect("4");
        let for_us = self.v4 == Some(tpa);
        if for_us || self.lookup(NeighIp::V4(spa)).is_some() {
            self.learn(NeighIp::V4(spa), sha);
        }
        if oper == 1 && for_us {
            self.stats.arp_replies += 1;
            return Some(write_arp(out, 2, self.mac, tpa, sha, spa, sha));
        }
        if !for_us {
            self.stats.ignored += 1;
        }
        None
    }

    fn handle_nd(&mut self, frame: &[u8], out: &mut [u8]) -> Option<usize> {
        // Untagged (see `handle`).
        let (Some(ip), Some(icmp)) = (frame.get(14..54), frame.get(54..)) else {
            self.stats.ignored += 1;
            return None;
        };
        let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
        let src: [u8; 16] = ip[8..24].try_into().expect("16");
        let dst: [u8; 16] = ip[24..40].try_into().expect("16");
        // RFC 4861: hop limit 255, code 0, at least 24 bytes, valid checksum.
        if ip[7] != 255 || plen < 24 || icmp.len() < plen || icmp[1] != 0 || icmp6_sum(&src, &dst, &icmp[..plen]) != 0 {
            self.stats.ignored += 1;
            return None;
        }
        let icmp = &icmp[..plen];
        let target: [u8; 16] = icmp[8..24].try_into().expect("16");
        // The link-layer address option: source (1) in an NS, target (2) in an NA.
        let want_opt = if icmp[0] == ND_NS { 1 } else { 2 };
        let mut lladdr = None;
        let mut opts = &icmp[24..];
        while opts.len() >= 8 {
            let len = usize::from(opts[1]) * 8;
            if len == 0 || len > opts.len() {
                break;
            }
            if opts[0] == want_opt && len >= 8 {
                lladdr = Some(MacAddr(opts[2..8].try_into().expect("6")));
            }
            opts = &opts[len..];
        }
        // RFC 4861 §7.2.3: an NS whose target is not ours is discarded (nothing learned, as an ARP request for
        // another host); §7.1.1: one from the unspecified address (duplicate address detection) carries no
        // link-layer address option; §7.2.4: a DAD NS for our address is answered to all-nodes, Solicited clear.
        if icmp[0] == ND_NS && self.v6 == Some(target) {
            if src == [0; 16] {
                if lladdr.is_some() {
                    self.stats.ignored += 1;
                    return None;
                }
                self.stats.nd_adverts += 1;
                let all_nodes = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
                let mac = MacAddr([0x33, 0x33, 0, 0, 0, 1]);
                return Some(write_nd(out, ND_NA, NA_OVERRIDE, self.mac, mac, target, all_nodes, target));
            }
            if let Some(mac) = lladdr {
                self.learn(NeighIp::V6(src), mac);
            }
            let dst_mac = lladdr.or_else(|| frame.get(6..12).map(|m| MacAddr(m.try_into().expect("6"))))?;
            self.stats.nd_adverts += 1;
            return Some(write_nd(out, ND_NA, NA_SOLICITED | NA_OVERRIDE, self.mac, dst_mac, target, src, target));
        }
        if let (ND_NA, Some(mac)) = (icmp[0], lladdr) {
            self.learn(NeighIp::V6(target), mac);
            return None;
        }
        self.stats.ignored += 1;
        None
    }

    /// [`solicit`](Self::solicit), rate-limited per target: at `now`, writes a solicitation for `ip` only if the
    /// backoff allows one (the first at once, the next after [`SOLICIT_FIRST_GAP`], then gaps doubling up to
    /// [`SOLICIT_MAX_GAP`]); else `None`, counted in `solicits_limited`. However often a caller asks while a peer
    /// does not answer, the segment sees a few broadcasts (8 in 3 s), and the first answer still comes fast.
    pub fn solicit_at(&mut self, ip: NeighIp, now: Instant, out: &mut [u8]) -> Option<usize> {
        let i = match self.pending.iter().position(|e| e.0 == ip) {
            Some(i) => {
                let (_, last, gap) = self.pending[i];
                let since = now.saturating_since(last);
                if since >= SOLICIT_FORGET {
                    self.pending[i].2 = SOLICIT_FIRST_GAP;
                } else if since >= gap {
                    self.pending[i].2 = Duration(gap.as_nanos().saturating_mul(2)).min(SOLICIT_MAX_GAP);
                } else {
                    self.stats.solicits_limited += 1;
                    return None;
                }
                i
            }
            None => {
                if self.pending.len() >= MAX_PENDING {
                    self.pending.remove(0);
                }
                self.pending.push((ip, now, SOLICIT_FIRST_GAP));
                self.pending.len() - 1
            }
        };
        self.pending[i].1 = now;
        self.solicit(ip, out)
    }

    /// Write a request resolving `ip` (ARP request, or NS to the solicited-node multicast address) into `out`
    /// (>= 86 bytes); None if we have no address of that family to send from. No rate limit: what sends on a
    /// caller's every ask uses [`solicit_at`](Self::solicit_at).
    pub fn solicit(&mut self, ip: NeighIp, out: &mut [u8]) -> Option<usize> {
        match ip {
            NeighIp::V4(tpa) => {
                let spa = self.v4?;
                self.stats.arp_requests += 1;
                Some(write_arp(out, 1, self.mac, spa, MacAddr::default(), tpa, BROADCAST))
            }
            NeighIp::V6(target) => {
                let src = self.v6?;
                let mut snm = [0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, 0, 0, 0];
                snm[13..16].copy_from_slice(&target[13..16]);
                let mac = MacAddr([0x33, 0x33, 0xff, target[13], target[14], target[15]]);
                self.stats.nd_solicits += 1;
                Some(write_nd(out, ND_NS, 0, self.mac, mac, src, snm, target))
            }
        }
    }
}

/// An ARP frame (oper 1 request, 2 reply) from (`sha`, `spa`) to (`tha`, `tpa`), sent to `eth_dst`. Padded to 60.
fn write_arp(
    out: &mut [u8],
    oper: u16,
    sha: MacAddr,
    spa: [u8; 4],
    tha: MacAddr,
    tpa: [u8; 4],
    eth_dst: MacAddr,
) -> usize {
    let f = &mut out[..MIN_FRAME];
    f.fill(0);
    f[0..6].copy_from_slice(&eth_dst.0);
    f[6..12].copy_from_slice(&sha.0);
    f[12..14].copy_from_slice(&ETH_ARP.to_be_bytes());
    f[14..20].copy_from_slice(&[0, 1, 8, 0, 6, 4]);
    f[20..22].copy_from_slice(&oper.to_be_bytes());
    f[22..28].copy_from_slice(&sha.0);
    f[28..32].copy_from_slice(&spa);
    f[32..38].copy_from_slice(&tha.0);
    f[38..42].copy_from_slice(&tpa);
    MIN_FRAME
}

/// An NS or NA frame (with `flags` in the first byte after the checksum: an NA's R/S/O) from `src_mac`/`src` to
/// `dst_mac`/`dst` about `target`, with our link-layer address option.
#[allow(clippy::too_many_arguments)]
fn write_nd(
    out: &mut [u8],
    kind: u8,
    flags: u8,
    src_mac: MacAddr,
    dst_mac: MacAddr,
    src: [u8; 16],
    dst: [u8; 16],
    target: [u8; 16],
) -> usize {
    let f = &mut out[..ND_FRAME_LEN];
    f.fill(0);
    f[0..6].copy_from_slice(&dst_mac.0);
    f[6..12].copy_from_slice(&src_mac.0);
    f[12..14].copy_from_slice(&ETH_IPV6.to_be_bytes());
    let ip = &mut f[14..54];
    ip[0] = 0x60;
    ip[4..6].copy_from_slice(&32u16.to_be_bytes());
    ip[6] = 58;
    ip[7] = 255;
    ip[8..24].copy_from_slice(&src);
    ip[24..40].copy_from_slice(&dst);
    let icmp = &mut f[54..86];
    icmp[0] = kind;
    icmp[4] = flags;
    icmp[8..24].copy_from_slice(&target);
    icmp[24] = if kind == ND_NS { 1 } else { 2 };
    icmp[25] = 1;
    icmp[26..32].copy_from_slice(&src_mac.0);
    let sum = icmp6_sum(&src, &dst, icmp);
    icmp[2..4].copy_from_slice(&sum.to_be_bytes());
    ND_FRAME_LEN
}

/// The ICMPv6 checksum over the pseudo-header and `msg` (0 when `msg` holds a correct checksum).
fn icmp6_sum(src: &[u8; 16], dst: &[u8; 16], msg: &[u8]) -> u16 {
    let mut buf = Vec::with_capacity(40 + msg.len() + 1);
    buf.extend_from_slice(src);
    buf.extend_from_slice(dst);
    buf.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    buf.extend_from_slice(&[0, 0, 0, 58]);
    buf.extend_from_slice(msg);
    if buf.len() % 2 == 1 {
        buf.push(0);
    }
    checksum(&buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAC_A: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xa]);
    const MAC_B: MacAddr = MacAddr([2, 0, 0, 0, 0, 0xb]);
    const V6_A: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa];
    const V6_B: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0xb];

    #[test]
    fn arp_resolve_round_trip() {
        let mut a = Neighbours::new(MAC_A, Some([10, 0, 0, 1]), None);
        let mut b = Neighbours::new(MAC_B, Some([10, 0, 0, 2]), None);
        let (mut req, mut rep) = ([0u8; 128], [0u8; 128]);
        let n = a.solicit(NeighIp::V4([10, 0, 0, 2]), &mut req).unwrap();
        assert_eq!(n, 60);
        assert_eq!(&req[0..6], &[0xff; 6]);
        assert_eq!(classify(&req[..n]), FrameKind::Arp);
        let m = b.handle(&req[..n], &mut rep).expect("b answers a request for its address");
        assert_eq!(&rep[0..6], &MAC_A.0, "reply goes to the requester");
        assert_eq!(b.lookup(NeighIp::V4([10, 0, 0, 1])), Some(MAC_A), "b learned a from the request");
        assert!(a.handle(&rep[..m], &mut req).is_none(), "a reply needs no answer");
        assert_eq!(a.lookup(NeighIp::V4([10, 0, 0, 2])), Some(MAC_B));
        assert_eq!((a.stats.arp_requests, b.stats.arp_replies, a.stats.arp_rx), (1, 1, 1));
    }

    #[test]
    fn arp_for_someone_else_is_ignored_and_not_learned() {
        let mut b = Neighbours::new(MAC_B, Some([10, 0, 0, 2]), None);
        let mut a = Neighbours::new(MAC_A, Some([10, 0, 0, 1]), None);
        let mut req = [0u8; 128];
        let n = a.solicit(NeighIp::V4([10, 0, 0, 9]), &mut req).unwrap();
        assert!(b.handle(&req[..n], &mut [0u8; 128]).is_none());
        assert_eq!(b.lookup(NeighIp::V4([10, 0, 0, 1])), None);
        assert_eq!(b.stats.ignored, 1);
        // Truncated and wrong hardware type.
        assert!(b.handle(&req[..30], &mut [0u8; 128]).is_none());
        req[15] = 6;
        assert!(b.handle(&req[..n], &mut [0u8; 128]).is_none());
    }

    #[test]
    fn static_entries_win_over_learning() {
        let mut b = Neighbours::new(MAC_B, Some([10, 0, 0, 2]), None);
        b.add_static(NeighIp::V4([10, 0, 0, 1]), MacAddr([2, 9, 9, 9, 9, 9]));
        let mut a = Neighbours::new(MAC_A, Some([10, 0, 0, 1]), None);
        let mut req = [0u8; 128];
        let n = a.solicit(NeighIp::V4([10, 0, 0, 2]), &mut req).unwrap();
        assert!(b.handle(&req[..n], &mut [0u8; 128]).is_some());
        assert_eq!(b.lookup(NeighIp::V4([10, 0, 0, 1])), Some(MacAddr([2, 9, 9, 9, 9, 9])));
    }

    #[test]
    fn nd_solicit_and_advert_round_trip() {
        let mut a = Neighbours::new(MAC_A, None, Some(V6_A));
        let mut b = Neighbours::new(MAC_B, None, Some(V6_B));
        let (mut ns, mut na) = ([0u8; 128], [0u8; 128]);
        let n = a.solicit(NeighIp::V6(V6_B), &mut ns).unwrap();
        assert_eq!(classify(&ns[..n]), FrameKind::Nd);
        assert_eq!(&ns[0..6], &[0x33, 0x33, 0xff, 0x12, 0x34, 0xb], "solicited-node multicast MAC");
        assert_eq!(icmp6_sum(&V6_A, &ns[38..54].try_into().unwrap(), &ns[54..86]), 0);
        let m = b.handle(&ns[..n], &mut na).expect("b advertises its address");
        assert_eq!(&na[0..6], &MAC_A.0);
        assert_eq!(na[54], ND_NA);
        assert_eq!(b.lookup(NeighIp::V6(V6_A)), Some(MAC_A));
        assert!(a.handle(&na[..m], &mut ns).is_none());
        assert_eq!(a.lookup(NeighIp::V6(V6_B)), Some(MAC_B));
        // A corrupted checksum is ignored.
        let n = a.solicit(NeighIp::V6(V6_B), &mut ns).unwrap();
        ns[60] ^= 1;
        assert!(b.handle(&ns[..n], &mut na).is_none());
        assert_eq!(b.stats.ignored, 1);
    }

    #[test]
    fn classify_roce_and_others() {
        use crate::wire::{self, BthRepr, EthRepr, ExtRepr, IpAddrs, IpRepr, RoceRepr};
        let repr = RoceRepr {
            eth: EthRepr { dst: MAC_B, src: MAC_A, vlan: None },
            ip: IpRepr { addrs: IpAddrs::V4 { src: [10, 0, 0, 1], dst: [10, 0, 0, 2] }, ttl: 64, ..IpRepr::default() },
            udp_src: 0xc000,
            udp_dst: ROCE_UDP_PORT,
            bth: BthRepr { dest_qp: 0x12_3456, ..BthRepr::default() },
            ext: ExtRepr::default(),
        };
        let mut buf = [0u8; 256];
        let n = wire::emit_frame(&mut buf, &repr, 16, |d| d.fill(1)).unwrap();
        assert_eq!(classify(&buf[..n]), FrameKind::Roce { dest_qp: 0x12_3456 });
        let mut v = buf;
        v[23] = 6; // TCP
        assert_eq!(classify(&v[..n]), FrameKind::Other);
        assert_eq!(classify(&buf[..10]), FrameKind::Other);
        let mut ipx = buf;
        ipx[12] = 0x88;
        assert_eq!(classify(&ipx[..n]), FrameKind::Other);
    }
}
