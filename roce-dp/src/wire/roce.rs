//! Whole RoCEv2 frames: Ethernet (+802.1Q) | IPv4/IPv6 | UDP 4791 | BTH | extension headers | payload | pad | ICRC.

use super::ethernet::{ethertype, Frame as EthernetFrame, HEADER_LEN as ETHERNET_HEADER_LEN};
use super::ipv4::{self, Packet as Ipv4Packet, Repr as Ipv4Repr};
use super::ipv6::{self, Packet as Ipv6Packet, Repr as Ipv6Repr};
use super::opcode::OpInfo;
use super::opcode::{flags as f, hdr_len};
use super::udp::{self, Packet as UdpPacket, Repr as UdpRepr};
use super::{icrc, BthPacket, BthRepr, Error, EthRepr, ExtRepr, IpAddrs, IpRepr, RoceFrame, RoceRepr, ROCE_UDP_PORT};
use super::{AethPacket, AethRepr, AtomicAckEthPacket, AtomicEthPacket, AtomicEthRepr, IethPacket, ImmDtPacket};
use super::{RethPacket, RethRepr};

/// Pad bytes after a payload of `payload_len` bytes (to a multiple of 4).
#[inline]
const fn pad_for(payload_len: usize) -> usize {
    payload_len.wrapping_neg() & 3
}

/// What every parse of a frame establishes: the receive path's view, the IP packet (header to ICRC) and the UDP
/// source port.
struct Core<'a> {
    rx: RxFrame<'a>,
    ip_pkt: &'a [u8],
    udp_src: u16,
}

/// The common frame (Ethernet II without a tag, IPv4 without options) checked from one fixed-size read of its
/// first 54 bytes: every check of [`parse_core`] on the same values, without a bounds check per field. None when
/// the frame is of another shape or fails any check; [`parse_core`] then runs the general path, which names the
/// error.
///
/// `known_total`: the IPv4 total length when [`icrc::rx_prepare`] prepared this frame as that shape (it checked
/// the EtherType, the version and header length byte, and that the total length covers the headers to the BTH and
/// an ICRC within the frame): those checks are not made again.
#[inline(always)]
fn parse_core_ipv4(frame: &[u8], known_total: Option<usize>) -> Option<Core<'_>> {
    const L3: usize = ETHERNET_HEADER_LEN;
    const L4: usize = L3 + ipv4::HEADER_LEN;
    const TP: usize = L4 + udp::HEADER_LEN;
    let h = frame.first_chunk::<{ TP + hdr_len::BTH }>()?;
    let ip: &[u8; ipv4::HEADER_LEN] = h[L3..L4].try_into().ok()?;
    if cfg!(fuzzing) {
        return None;
    }
    let total = match known_total {
        Some(t) => t,
        None => {
            if u16::from_be_bytes([h[12], h[13]]) != ethertype::IPV4 || ip[0] != 0x45 {
                return None;
            }
            let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            // Room for UDP and a BTH.
            if total < TP + hdr_len::BTH - L3 || frame.len() - L3 < total {
                return None;
            }
            total
        }
    };
    let flg = u16::from_be_bytes([ip[6], ip[7]]);
    // No fragment, UDP, a good checksum.
    if flg & 0x3fff != 0 || ip[9] != ipv4::PROTO_UDP {
        return None;
    }
    if !ipv4::header_checksum_ok(ip) {
        return None;
    }
    let udp_len = usize::from(u16::from_be_bytes([h[L4 + 4], h[L4 + 5]]));
    if u16::from_be_bytes([h[L4 + 2], h[L4 + 3]]) != ROCE_UDP_PORT || udp_len != total - ipv4::HEADER_LEN {
        return None;
    }
    let bth: &[u8; hdr_len::BTH] = h[TP..].try_into().ok()?;
    let b = BthRepr::from_bytes(bth).ok()?;
    let info = b.opcode.info()?;
    let hdr = usize::from(info.hdr_len);
    let ip_pkt = &frame[L3..L3 + total];
    let tp = &ip_pkt[TP - L3..];
    let body = tp.len().checked_sub(hdr + hdr_len::ICRC)?;
    let pad = usize::from(b.pad);
    let shape_ok = if info.any(f::PAYLOAD) { pad <= body } else { pad == 0 && body == 0 };
    if !shape_ok {
        return None;
    }
    let (hdrs, rest) = tp.split_at(hdr);
    let udp_src = u16::from_be_bytes([h[L4], h[L4 + 1]]);
    Some(Core { rx: RxFrame { bth, ip: RxIp::V4(ip), info, hdrs, payload: &rest[..body - pad] }, ip_pkt, udp_src })
}

/// The checks of [`parse_frame`] up to (not including) the ICRC.
#[inline(always)]
fn parse_core(frame: &[u8]) -> Result<Core<'_>, Error> {
    match parse_core_ipv4(frame, None) {
        Some(c) => Ok(c),
        None => parse_core_general(frame),
    }
}

/// [`parse_core`] for any shape, each header through its view.
#[inline]
fn parse_core_general(frame: &[u8]) -> Result<Core<'_>, Error> {
    let eth = EthernetFrame::new_checked(frame)?;
    let l3 = eth.payload();
    let (ip, ip_pkt, l4) = match eth.payload_ethertype() {
        ethertype::IPV4 => {
            let p = Ipv4Packet::new_unchecked(l3);
            let r = Ipv4Repr::parse(&p)?;
            if r.protocol != ipv4::PROTO_UDP {
                return Err(Error::NotUdp);
            }
            // The parse checked the header's length: its fixed part is there.
            let ip = RxIp::V4(l3.first_chunk().ok_or(Error::Truncated)?);
            (ip, &l3[..usize::from(p.total_len())], p.payload())
        }
        ethertype::IPV6 => {
            let p = Ipv6Packet::new_unchecked(l3);
            let r = Ipv6Repr::parse(&p)?;
            if r.next_header != ipv4::PROTO_UDP {
                return Err(Error::NotUdp);
            }
            let ip = RxIp::V6(l3.first_chunk().ok_or(Error::Truncated)?);
            (ip, &l3[..ipv6::HEADER_LEN + r.payload_len], p.payload())
        }
        _ => return Err(Error::NotIp),
    };

    if l4.len() < udp::HEADER_LEN {
        return Err(Error::Truncated);
    }
    let u = UdpPacket::new_unchecked(l4);
    if u.dst_port() != ROCE_UDP_PORT {
        return Err(Error::NotRoce);
    }
    if usize::from(u.len()) != l4.len() {
        return Err(Error::LengthMismatch);
    }
    let tp = &l4[udp::HEADER_LEN..];
    let b = BthRepr::parse(&BthPacket::new_unchecked(tp))?;
    let info = b.opcode.info().ok_or(Error::UnknownOpcode(b.opcode.0))?;
    // The parse checked that the 12 bytes are there.
    let bth = tp.first_chunk().ok_or(Error::Truncated)?;
    let hdr = usize::from(info.hdr_len);
    let body = tp.len().checked_sub(hdr + hdr_len::ICRC).ok_or(Error::Truncated)?;
    let pad = usize::from(b.pad);
    if !info.any(f::PAYLOAD) {
        if pad != 0 {
            return Err(Error::BadPadCount);
        }
        if body != 0 {
            return Err(Error::LengthMismatch);
        }
    } else if pad > body {
        return Err(Error::BadPadCount);
    }
    let (hdrs, rest) = tp.split_at(hdr);
    Ok(Core { rx: RxFrame { bth, ip, info, hdrs, payload: &rest[..body - pad] }, ip_pkt, udp_src: u.src_port() })
}

/// Parse a whole Ethernet frame. Ok even when the ICRC is bad: `icrc_ok` says. Err for anything malformed.
///
/// Checks, in order: Ethernet (+ one 802.1Q tag) length, EtherType IPv4/IPv6 (`NotIp`); the IP header
/// (`Truncated`, `BadIpHeader` for a bad version, IHL < 5, fragment or IPv4 header checksum, `LengthMismatch`);
/// protocol UDP (`NotUdp`); destination port 4791 (`NotRoce`); UDP length equal to the IP payload length
/// (`LengthMismatch`); BTH version 0 (`BadBthVersion`) and opcode in the table (`UnknownOpcode`); room for the
/// extension headers and the ICRC (`Truncated`); pad count 0 and no payload for opcodes without payload, and pad
/// no longer than the payload (`BadPadCount`, or `LengthMismatch` for trailing bytes). Ethernet padding after the
/// IP packet is ignored.
pub fn parse_frame(frame: &[u8]) -> Result<RoceFrame<'_>, Error> {
    let c = parse_core(frame)?;
    let eth_repr = EthRepr::parse(&EthernetFrame::new_unchecked(frame))?;
    let ext = ExtRepr::parse(c.rx.info, c.rx.hdrs)?;
    let icrc_ok = icrc::verify(c.ip_pkt)?;
    let repr =
        RoceRepr { eth: eth_repr, ip: c.rx.ip(), udp_src: c.udp_src, udp_dst: ROCE_UDP_PORT, bth: c.rx.bth(), ext };
    Ok(RoceFrame { repr, payload: c.rx.payload, icrc_ok })
}

/// The receive fast path: the checks of [`parse_frame`] in the same order, then the ICRC (`Err(BadIcrc)`), into an
/// [`RxFrame`] that keeps the extension headers as bytes and decodes one only when asked (no Ethernet addresses,
/// no [`ExtRepr`] with every header's slot).
#[inline]
pub fn parse_rx(frame: &[u8]) -> Result<RxFrame<'_>, Error> {
    parse_rx_prepared(frame, None)
}

/// [`parse_rx`] of a frame that [`icrc::rx_prepare`] prepared (`prep`, if it did) for the in-place ICRC pass: the
/// same checks and result; the ICRC by [`icrc::rx_check`] when `prep` covers the IP packet the parse found, else
/// by [`icrc::verify`]. The parse reads none of the bytes the preparation wrote.
#[inline(always)]
pub fn parse_rx_prepared<'a>(frame: &'a [u8], prep: Option<&icrc::RxPrepared>) -> Result<RxFrame<'a>, Error> {
    let c = parse_core(frame)?;
    rx_icrc(frame, prep, c)
}

/// [`parse_rx_prepared`] for a caller that passes only the preparation of `frame` itself (the engine's in-place
/// receive path): the checks [`icrc::rx_prepare`] made of an IPv4 frame are not made again.
#[inline(always)]
pub(crate) fn parse_rx_own<'a>(frame: &'a [u8], prep: Option<&icrc::RxPrepared>) -> Result<RxFrame<'a>, Error> {
    if let Some(p) = prep {
        if let Some(c) = p.v4_total_len().and_then(|total| parse_core_ipv4(frame, Some(total))) {
            // The span is the one the preparation covers (same total length): no `covers` test.
            return if icrc::rx_check(frame, p) { Ok(c.rx) } else { Err(Error::BadIcrc) };
        }
    }
    parse_rx_prepared(frame, prep)
}

/// The ICRC check of a frame that parsed as `c`, prepared by `prep` (if any).
#[inline(always)]
fn rx_icrc<'a>(frame: &'a [u8], prep: Option<&icrc::RxPrepared>, c: Core<'a>) -> Result<RxFrame<'a>, Error> {
    let ok = match prep {
        Some(p) if p.covers(c.ip_pkt.len()) => icrc::rx_check(frame, p),
        _ => icrc::verify(c.ip_pkt)?,
    };
    if !ok {
        return Err(Error::BadIcrc);
    }
    Ok(c.rx)
}

/// The IP header of a received frame: its fixed part as bytes, read by [`RxFrame::ip`].
#[derive(Clone, Copy, Debug)]
enum RxIp<'a> {
    /// IPv4 (the 20 bytes before any options).
    V4(&'a [u8; ipv4::HEADER_LEN]),
    /// IPv6.
    V6(&'a [u8; ipv6::HEADER_LEN]),
}

/// A received frame as the engine's receive path sees it ([`parse_rx`]): a view of the checked frame, whose header
/// fields are read from its bytes when asked (the BTH by [`bth`](Self::bth), the IP part by [`ip`](Self::ip), each
/// extension header by its accessor; inlined, only the fields a caller uses are read), the opcode's table entry
/// and the payload.
#[derive(Clone, Copy, Debug)]
pub struct RxFrame<'a> {
    /// BTH bytes (checked: TVer 0, opcode in the table).
    bth: &'a [u8; hdr_len::BTH],
    /// IP header bytes (checked: version, length, checksum, no fragment).
    ip: RxIp<'a>,
    /// The opcode's table entry.
    pub info: &'static OpInfo,
    /// BTH + extension headers (`info.hdr_len` bytes).
    hdrs: &'a [u8],
    /// Payload bytes (pad and ICRC excluded).
    pub payload: &'a [u8],
}

impl RxFrame<'_> {
    /// The BTH.
    #[inline(always)]
    pub fn bth(&self) -> BthRepr {
        BthRepr::decode(self.bth)
    }
    /// IP addresses, ECN and the other IP fields.
    #[inline(always)]
    pub fn ip(&self) -> IpRepr {
        match self.ip {
            RxIp::V4(h) => {
                let tos = h[1];
                IpRepr {
                    addrs: IpAddrs::V4 { src: [h[12], h[13], h[14], h[15]], dst: [h[16], h[17], h[18], h[19]] },
                    dscp: tos >> 2,
                    ecn: super::Ecn::from_bits(tos),
                    ttl: h[8],
                    ident: u16::from_be_bytes([h[4], h[5]]),
                    dont_frag: h[6] & 0x40 != 0,
                    flow_label: 0,
                }
            }
            RxIp::V6(h) => {
                let p = Ipv6Packet::new_unchecked(&h[..]);
                IpRepr {
                    addrs: IpAddrs::V6 { src: p.src_addr(), dst: p.dst_addr() },
                    dscp: p.dscp(),
                    ecn: p.ecn(),
                    ttl: p.hop_limit(),
                    ident: 0,
                    dont_frag: false,
                    flow_label: p.flow_label(),
                }
            }
        }
    }
    /// The header at `off` (from the BTH start) if the opcode carries `flag`.
    #[inline]
    fn ext(&self, flag: u32, off: u8) -> Option<&[u8]> {
        if self.info.any(flag) {
            self.hdrs.get(usize::from(off)..)
        } else {
            None
        }
    }
    /// RETH, if the opcode carries one.
    #[inline]
    pub fn reth(&self) -> Option<RethRepr> {
        RethRepr::parse(&RethPacket::new_unchecked(self.ext(f::RETH, self.info.off.reth)?)).ok()
    }
    /// AETH, if the opcode carries one.
    #[inline]
    pub fn aeth(&self) -> Option<AethRepr> {
        AethRepr::parse(&AethPacket::new_unchecked(self.ext(f::AETH, self.info.off.aeth)?)).ok()
    }
    /// AtomicETH, if the opcode carries one.
    #[inline]
    pub fn atomic_eth(&self) -> Option<AtomicEthRepr> {
        AtomicEthRepr::parse(&AtomicEthPacket::new_unchecked(self.ext(f::ATOMIC_ETH, self.info.off.atomic_eth)?)).ok()
    }
    /// AtomicAckETH's original remote data, if the opcode carries one.
    #[inline]
    pub fn atomic_ack(&self) -> Option<u64> {
        Some(AtomicAckEthPacket::new_checked(self.ext(f::ATOMIC_ACK_ETH, self.info.off.atomic_ack_eth)?).ok()?.orig())
    }
    /// Immediate data, if the opcode carries it.
    #[inline]
    pub fn imm(&self) -> Option<u32> {
        Some(ImmDtPacket::new_checked(self.ext(f::IMM_DT, self.info.off.imm_dt)?).ok()?.imm())
    }
    /// IETH's R_Key, if the opcode carries one.
    #[inline]
    pub fn ieth(&self) -> Option<u32> {
        Some(IethPacket::new_checked(self.ext(f::IETH, self.info.off.ieth)?).ok()?.rkey())
    }
    /// Every extension header, as [`parse_frame`] gives them.
    pub fn ext_repr(&self) -> ExtRepr {
        ExtRepr::parse(self.info, self.hdrs).unwrap_or_default()
    }
}

/// Same as [`parse_frame`], but a bad ICRC is `Err(Error::BadIcrc)`.
pub fn parse_frame_checked(frame: &[u8]) -> Result<RoceFrame<'_>, Error> {
    let f = parse_frame(frame)?;
    if !f.icrc_ok {
        return Err(Error::BadIcrc);
    }
    Ok(f)
}

/// IP header length and EtherType for these addresses.
#[inline]
const fn ip_layout(addrs: &IpAddrs) -> (usize, u16) {
    match addrs {
        IpAddrs::V4 { .. } => (ipv4::HEADER_LEN, ethertype::IPV4),
        IpAddrs::V6 { .. } => (ipv6::HEADER_LEN, ethertype::IPV6),
    }
}

impl RoceRepr {
    /// Bytes from the start of the frame to the first payload byte (Ethernet, IP, UDP, BTH and the extension
    /// headers of the opcode; BTH only for an opcode outside the table).
    #[inline]
    pub fn payload_offset(&self) -> usize {
        let hdr = self.bth.opcode.info().map_or(hdr_len::BTH, |i| usize::from(i.hdr_len));
        self.eth.buffer_len() + ip_layout(&self.ip.addrs).0 + udp::HEADER_LEN + hdr
    }
}

/// Total frame length for these headers and a payload of `payload_len` bytes (pad and ICRC included). For an
/// opcode outside the table the BTH alone is counted ([`emit_frame`] rejects such a repr). Ethernet minimum-size
/// padding is not included (the NIC adds it).
#[inline]
pub fn frame_len(repr: &RoceRepr, payload_len: usize) -> usize {
    repr.payload_offset().saturating_add(payload_len).saturating_add(pad_for(payload_len) + hdr_len::ICRC)
}

/// Write the whole frame into `buf[..n]` and return `n`: Ethernet (+VLAN), IPv4 (total length, checksum computed;
/// DF as repr) or IPv6 (payload length), UDP (length, checksum 0), BTH with pad = (-payload_len) & 3 (overriding
/// `repr.bth.pad`), extension headers as the opcode table says (a required header that is `None` in `repr.ext` is
/// written as zeros), then `fill(&mut buf[payload])` writes the payload, pad bytes zeroed, ICRC appended.
///
/// Errors: `BufferTooSmall` if `buf` is short, `UnknownOpcode` for an opcode outside the table, `Unencodable` for a
/// payload on an opcode that carries none or a frame too long for the IP/UDP length fields. Other fields are masked
/// to their widths. No allocation, no panic.
pub fn emit_frame(
    buf: &mut [u8],
    repr: &RoceRepr,
    payload_len: usize,
    fill: impl FnOnce(&mut [u8]),
) -> Result<usize, Error> {
    let op = repr.bth.opcode;
    let info = op.info().ok_or(Error::UnknownOpcode(op.0))?;
    if payload_len > 0 && !info.any(f::PAYLOAD) {
        return Err(Error::Unencodable);
    }
    let n = frame_len(repr, payload_len);
    let buf = buf.get_mut(..n).ok_or(Error::BufferTooSmall)?;
    let eth_len = repr.eth.buffer_len();
    let (ip_len, ethertype) = ip_layout(&repr.ip.addrs);
    let hdr = usize::from(info.hdr_len);
    let pad = pad_for(payload_len);
    let l4_len = n - eth_len - ip_len;
    let ip = &repr.ip;

    let (eth_buf, ip_buf) = buf.split_at_mut(eth_len);
    match ip.addrs {
        IpAddrs::V4 { src, dst } => Ipv4Repr {
            src,
            dst,
            dscp: ip.dscp,
            ecn: ip.ecn,
            ttl: ip.ttl,
            ident: ip.ident,
            dont_frag: ip.dont_frag,
            protocol: ipv4::PROTO_UDP,
            payload_len: l4_len,
        }
        .emit(&mut Ipv4Packet::new_unchecked(&mut ip_buf[..ip_len]))?,
        IpAddrs::V6 { src, dst } => Ipv6Repr {
            src,
            dst,
            dscp: ip.dscp,
            ecn: ip.ecn,
            flow_label: ip.flow_label,
            hop_limit: ip.ttl,
            next_header: ipv4::PROTO_UDP,
            payload_len: l4_len,
        }
        .emit(&mut Ipv6Packet::new_unchecked(&mut ip_buf[..ip_len]))?,
    }
    repr.eth.emit(&mut EthernetFrame::new_unchecked(eth_buf), ethertype);

    let l4 = &mut ip_buf[ip_len..];
    UdpRepr { src_port: repr.udp_src, dst_port: repr.udp_dst }
        .emit(&mut UdpPacket::new_unchecked(&mut l4[..udp::HEADER_LEN]), l4_len - udp::HEADER_LEN)?;
    let tp = &mut l4[udp::HEADER_LEN..];
    BthRepr { pad: pad as u8, ..repr.bth }.emit(&mut BthPacket::new_unchecked(&mut tp[..hdr_len::BTH]));
    repr.ext.emit(info, &mut tp[..hdr])?;
    let (payload, tail) = tp[hdr..].split_at_mut(payload_len);
    fill(payload);
    tail[..pad].fill(0);
    icrc::fill(ip_buf)?;
    Ok(n)
}

/// The UDP source port Linux rxe uses for an RC/UC QP pair (the same in both directions): a hash of the product
/// of the two QPNs folded to 14 bits, over 0xC000 (rxe-peer README "rxe wire facts"; `rdma_calc_flow_label` and
/// `rdma_flow_label_to_udp_sport` in the kernel).
pub const fn rxe_udp_sport(lqpn: u32, rqpn: u32) -> u16 {
    let mut v = (lqpn as u64) * (rqpn as u64);
    v ^= v >> 20;
    v ^= v >> 40;
    let fl = (v & 0xf_ffff) as u32;
    0xc000 | (((fl & 0x3fff) ^ (fl >> 14)) as u16)
}

/// The UDP source port Linux rxe uses for a UD QP: 0xC000 + `hash_32(qpn, 14)` (golden-ratio multiplicative hash;
/// rxe-peer README "rxe wire facts").
pub const fn rxe_ud_udp_sport(qpn: u32) -> u16 {
    0xc000 + ((qpn.wrapping_mul(0x61c8_8647) >> 18) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        AethRepr, AtomicEthRepr, DethRepr, Ecn, EthRepr, MacAddr, Opcode, Psn, RethRepr, VlanTag, DEFAULT_PKEY,
    };

    fn full_ext() -> ExtRepr {
        ExtRepr {
            reth: Some(RethRepr { va: 0x55c4_cf0e_2000, rkey: 0x20bb, len: 4096 }),
            aeth: Some(AethRepr::ack(7)),
            atomic_eth: Some(AtomicEthRepr { va: 0x1000, rkey: 0x77, swap_add: 1, compare: 2 }),
            atomic_ack: Some(0x0102_0304_0506_0708),
            imm: Some(0xcafe_f00d),
            ieth: Some(0x4321),
            deth: Some(DethRepr { qkey: 0x1111_1111, src_qp: 0x12 }),
            feth: Some(0x21),
        }
    }

    fn repr(op: Opcode, v6: bool, vlan: bool) -> RoceRepr {
        let addrs = if v6 {
            IpAddrs::V6 { src: [0xfe; 16], dst: [0x20; 16] }
        } else {
            IpAddrs::V4 { src: [10, 50, 0, 1], dst: [10, 50, 0, 2] }
        };
        RoceRepr {
            eth: EthRepr {
                dst: MacAddr([0x52, 0x54, 0, 0x50, 0, 2]),
                src: MacAddr([0x52, 0x54, 0, 0x50, 0, 1]),
                vlan: vlan.then_some(VlanTag { pcp: 3, dei: false, vid: 42 }),
            },
            ip: IpRepr {
                addrs,
                dscp: 26,
                ecn: Ecn::Ect0,
                ttl: 64,
                ident: if v6 { 0 } else { 0x1234 },
                dont_frag: !v6,
                flow_label: if v6 { 0x12345 } else { 0 },
            },
            udp_src: rxe_udp_sport(0x11, 0x12),
            udp_dst: ROCE_UDP_PORT,
            bth: BthRepr {
                opcode: op,
                solicited: true,
                mig_req: false,
                pad: 0,
                tver: 0,
                pkey: DEFAULT_PKEY,
                fecn: false,
                becn: op == Opcode::CNP,
                dest_qp: 0x00ab_cdef,
                ack_req: true,
                psn: Psn::new(0x00ff_fffe),
            },
            ext: full_ext().normalized(op.info().unwrap()),
        }
    }

    fn payload_byte(i: usize) -> u8 {
        (i as u8).wrapping_mul(7).wrapping_add(1)
    }

    #[test]
    fn every_opcode_round_trips_and_writes_every_byte() {
        for v in 0..=255u8 {
            let op = Opcode(v);
            let Some(info) = op.info() else {
                let r = repr(Opcode::RC_SEND_ONLY, false, false);
                let r = RoceRepr { bth: BthRepr { opcode: op, ..r.bth }, ..r };
                assert_eq!(emit_frame(&mut [0u8; 256], &r, 0, |_| ()), Err(Error::UnknownOpcode(v)));
                continue;
            };
            let lens: &[usize] = if info.any(f::PAYLOAD) { &[0, 1, 2, 3, 4, 61, 1024] } else { &[0] };
            for (&len, (v6, vlan)) in
                lens.iter().zip([(false, false), (true, true), (false, true), (true, false)].iter().cycle())
            {
                let r = repr(op, *v6, *vlan);
                let n = frame_len(&r, len);
                let mut buf = vec![0xa5u8; n + 8];
                let written = emit_frame(&mut buf, &r, len, |p| {
                    assert_eq!(p.len(), len);
                    for (i, b) in p.iter_mut().enumerate() {
                        *b = payload_byte(i);
                    }
                })
                .unwrap();
                assert_eq!(written, n);
                assert!(buf[n..].iter().all(|&b| b == 0xa5), "{} wrote past n", info.name);
                // Every byte written: re-emit into a 0x5a buffer; any byte left as filler would differ.
                let mut buf2 = vec![0x5au8; n];
                emit_frame(&mut buf2, &r, len, |p| {
                    for (i, b) in p.iter_mut().enumerate() {
                        *b = payload_byte(i);
                    }
                })
                .unwrap();
                assert_eq!(buf[..n], buf2[..], "{} left a byte unwritten", info.name);

                let f = parse_frame_checked(&buf[..n]).unwrap_or_else(|e| panic!("{} len {len}: {e}", info.name));
                let mut expect = r;
                expect.bth.pad = pad_for(len) as u8;
                assert_eq!(f.repr, expect, "{}", info.name);
                assert_eq!(f.payload.len(), len);
                assert!(f.payload.iter().enumerate().all(|(i, &b)| b == payload_byte(i)));
                assert_eq!(r.payload_offset() + len + pad_for(len) + 4, n);

                // Every truncation is rejected, without panic.
                for k in 0..n {
                    assert!(parse_frame(&buf[..k]).is_err(), "{} truncated to {k} parsed", info.name);
                }
                // A buffer one byte short is rejected, untouched.
                let mut short = vec![0xa5u8; n - 1];
                assert_eq!(emit_frame(&mut short, &r, len, |_| ()), Err(Error::BufferTooSmall));
                assert!(short.iter().all(|&b| b == 0xa5));
            }
        }
    }

    #[test]
    fn emit_rejections() {
        let r = repr(Opcode::RC_ACKNOWLEDGE, false, false);
        assert_eq!(emit_frame(&mut [0u8; 256], &r, 1, |_| ()), Err(Error::Unencodable));
        let w = repr(Opcode::RC_SEND_ONLY, false, false);
        let mut big = vec![0u8; 70_000];
        assert_eq!(emit_frame(&mut big, &w, 65_500, |_| ()), Err(Error::Unencodable));
        assert_eq!(frame_len(&w, usize::MAX), usize::MAX);
        assert_eq!(emit_frame(&mut big, &w, usize::MAX, |_| ()), Err(Error::BufferTooSmall));
    }

    #[test]
    fn required_none_headers_are_zero_and_cnp_layout() {
        let mut r = repr(Opcode::CNP, false, false);
        r.bth = BthRepr::cnp(0x42);
        r.ext = ExtRepr::default();
        let mut buf = [0xa5u8; 128];
        let n = emit_frame(&mut buf, &r, 0, |_| ()).unwrap();
        assert_eq!(n, 14 + 20 + 8 + 12 + 16 + 4);
        assert!(buf[54..70].iter().all(|&b| b == 0));
        let f = parse_frame_checked(&buf[..n]).unwrap();
        assert!(f.repr.bth.becn && f.repr.bth.opcode == Opcode::CNP && f.payload.is_empty());

        let mut w = repr(Opcode::RC_RDMA_WRITE_FIRST, false, false);
        w.ext = ExtRepr::default();
        let n = emit_frame(&mut buf, &w, 4, |p| p.fill(9)).unwrap();
        assert_eq!(parse_frame(&buf[..n]).unwrap().repr.ext.reth, Some(RethRepr::default()));
    }

    #[test]
    fn parse_rejections_are_typed() {
        let r = repr(Opcode::RC_SEND_ONLY, false, false);
        let mut good = [0u8; 128];
        let n = emit_frame(&mut good, &r, 5, |p| p.fill(1)).unwrap();
        let good = &good[..n];
        let with = |at: usize, v: u8| {
            let mut b = good.to_vec();
            b[at] = v;
            b
        };
        let fix_csum = |mut b: Vec<u8>| {
            Ipv4Packet::new_unchecked(&mut b[14..34]).fill_checksum();
            b
        };
        assert_eq!(parse_frame(&with(12, 0x88)).err(), Some(Error::NotIp));
        assert_eq!(parse_frame(&with(23, 6)).err(), Some(Error::BadIpHeader)); // stale checksum
        assert_eq!(parse_frame(&fix_csum(with(23, 6))).err(), Some(Error::NotUdp));
        assert_eq!(parse_frame(&fix_csum(with(20, 0x20))).err(), Some(Error::BadIpHeader)); // MF
        assert_eq!(parse_frame(&with(37, 0xb8)).err(), Some(Error::NotRoce));
        assert_eq!(parse_frame(&with(39, good[39] + 1)).err(), Some(Error::LengthMismatch));
        assert_eq!(parse_frame(&with(43, 0x01)).err(), Some(Error::BadBthVersion));
        assert_eq!(parse_frame(&with(42, 0x15)).err(), Some(Error::UnknownOpcode(0x15)));
        assert_eq!(parse_frame(&with(43, 0x80)).err(), None); // pad 0: the pad bytes become payload, still well formed
        assert!(!parse_frame(&with(n - 1, good[n - 1] ^ 1)).unwrap().icrc_ok);
        assert_eq!(parse_frame_checked(&with(n - 1, good[n - 1] ^ 1)).err(), Some(Error::BadIcrc));

        // Pad on an opcode without payload; trailing bytes on an ACK.
        let a = repr(Opcode::RC_ACKNOWLEDGE, false, false);
        let mut ack = [0u8; 128];
        let m = emit_frame(&mut ack, &a, 0, |_| ()).unwrap();
        let mut b = ack[..m].to_vec();
        b[43] = 0x10;
        assert_eq!(parse_frame(&b).err(), Some(Error::BadPadCount));
        // An empty SEND with pad 1: the pad exceeds the payload.
        let s = repr(Opcode::RC_SEND_ONLY, false, false);
        let mut e = [0u8; 128];
        let m = emit_frame(&mut e, &s, 0, |_| ()).unwrap();
        e[43] = 0x10;
        assert_eq!(parse_frame(&e[..m]).err(), Some(Error::BadPadCount));
        // Ethernet padding after a short frame is ignored.
        let mut padded = good.to_vec();
        padded.extend_from_slice(&[0; 20]);
        assert_eq!(parse_frame(&padded).unwrap(), parse_frame(good).unwrap());
        // Two 802.1Q tags: not IP.
        let mut qinq = with(12, 0x81);
        qinq[13] = 0;
        qinq[16] = 0x81;
        qinq[17] = 0;
        assert_eq!(parse_frame(&qinq).err(), Some(Error::NotIp));
    }

    /// The captures are IPv4 only: sweep every bit of an IPv6 frame (and a tagged IPv4 one) from the IP header to
    /// the ICRC. Only traffic class, flow label, hop limit, UDP checksum and BTH byte 4 (IPv4: TOS, TTL, header
    /// checksum, UDP checksum, BTH byte 4) may change without breaking the ICRC.
    #[test]
    fn icrc_bit_sweep_ipv6_and_vlan() {
        for (v6, vlan) in [(true, false), (false, true)] {
            let r = repr(Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE, v6, vlan);
            let mut buf = [0u8; 256];
            let n = emit_frame(&mut buf, &r, 13, |p| p.fill(0x3c)).unwrap();
            let l3 = r.eth.buffer_len();
            let ip = if v6 { 40 } else { 20 };
            let mut pkt = buf[l3..n].to_vec();
            for off in 0..pkt.len() {
                for bit in 0..8u8 {
                    let masked = match off {
                        0 if v6 => bit < 4,
                        1..=3 | 7 if v6 => true,
                        1 | 8 | 10 | 11 if !v6 => true,
                        o => o == ip + 6 || o == ip + 7 || o == ip + 12,
                    };
                    pkt[off] ^= 1 << bit;
                    let ok = icrc::verify(&pkt) == Ok(true);
                    assert_eq!(ok, masked, "v6={v6} byte {off} bit {bit}");
                    pkt[off] ^= 1 << bit;
                }
            }
        }
    }

    /// Calls `f` with every truncation of `frame` and with `frame` with each single bit flipped.
    fn each_mutation(frame: &mut [u8], name: &str, mut f: impl FnMut(&[u8], &str)) {
        for k in 0..frame.len() {
            f(&frame[..k], &format!("{name} truncated to {k}"));
        }
        for bit in 0..frame.len() * 8 {
            frame[bit / 8] ^= 1 << (bit % 8);
            f(frame, &format!("{name} bit {bit} flipped"));
            frame[bit / 8] ^= 1 << (bit % 8);
        }
    }

    /// `parse_rx` agrees with `parse_frame_checked` on every opcode and layout, every truncation and every
    /// single-bit flip: the same verdict, the same error, and on success the same BTH, IP part, payload and
    /// extension headers (each accessor against `parse_frame`'s `ExtRepr`).
    #[test]
    fn parse_rx_agrees_with_parse_frame() {
        let agree = |b: &[u8], what: &str| {
            let (a, r) = (parse_frame_checked(b), parse_rx(b));
            match (&a, &r) {
                (Ok(a), Ok(r)) => {
                    assert_eq!((a.repr.bth, a.repr.ip, a.payload), (r.bth(), r.ip(), r.payload), "{what}");
                    let e = a.repr.ext;
                    assert_eq!(r.ext_repr(), e, "{what}");
                    assert_eq!((r.reth(), r.aeth(), r.atomic_eth()), (e.reth, e.aeth, e.atomic_eth), "{what}");
                    assert_eq!((r.atomic_ack(), r.imm(), r.ieth()), (e.atomic_ack, e.imm, e.ieth), "{what}");
                }
                (Err(x), Err(y)) => assert_eq!(x, y, "{what}"),
                _ => panic!("{what}: parse_frame_checked {:?} vs parse_rx {:?}", a.is_ok(), r.is_ok()),
            }
        };
        let mut ok = 0;
        for v in 0..=255u8 {
            let Some(info) = Opcode(v).info() else { continue };
            let len = if info.any(f::PAYLOAD) { 61 } else { 0 };
            for (v6, vlan) in [(false, false), (true, true)] {
                let r = repr(Opcode(v), v6, vlan);
                let mut buf = vec![0u8; frame_len(&r, len)];
                let n = emit_frame(&mut buf, &r, len, |p| p.fill(0x3c)).unwrap();
                assert!(parse_rx(&buf[..n]).is_ok(), "{}", info.name);
                ok += 1;
                each_mutation(&mut buf[..n], info.name, agree);
            }
        }
        assert!(ok > 60);
    }

    /// The IPv4 fast path accepts only what the general path accepts, with the same result, and takes every
    /// well-formed untagged IPv4 frame (each opcode; every truncation and single-bit flip of them).
    #[test]
    fn ipv4_fast_path_equals_general_path() {
        let same = |b: &[u8], what: &str| {
            let Some(c) = parse_core_ipv4(b, None) else { return false };
            let g = parse_core_general(b).unwrap_or_else(|e| panic!("{what}: fast path took a frame rejected: {e}"));
            assert_eq!((c.rx.bth(), c.rx.ip(), c.rx.info.name), (g.rx.bth(), g.rx.ip(), g.rx.info.name), "{what}");
            assert_eq!((c.rx.hdrs, c.rx.payload, c.ip_pkt, c.udp_src), (g.rx.hdrs, g.rx.payload, g.ip_pkt, g.udp_src));
            true
        };
        for v in 0..=255u8 {
            let Some(info) = Opcode(v).info() else { continue };
            let r = repr(Opcode(v), false, false);
            for len in if info.any(f::PAYLOAD) { &[0usize, 1, 61][..] } else { &[0][..] } {
                let mut buf = vec![0u8; frame_len(&r, *len) + 3];
                let n = emit_frame(&mut buf, &r, *len, |p| p.fill(0x3c)).unwrap();
                assert!(same(&buf[..n], info.name), "{} len {len}: not on the fast path", info.name);
                assert!(same(&buf, info.name), "{}: Ethernet padding", info.name);
                each_mutation(&mut buf[..n], info.name, |b, what| {
                    same(b, what);
                });
            }
        }
    }

    /// The engine's in-place receive parse (`parse_rx_own`, which skips the checks `rx_prepare` made of an IPv4
    /// frame) gives what `parse_rx_prepared` gives for the same prepared frame: every opcode and layout, every
    /// truncation and single-bit flip (both verdicts, the same error, the same fields and bytes).
    #[test]
    fn own_prepared_parse_equals_prepared_parse() {
        let mut checked = 0;
        let mut fast = 0;
        let mut same = |b: &[u8], what: &str| {
            let mut g = b.to_vec();
            let prep = icrc::rx_prepare(&mut g);
            let own = format!("{:?}", parse_rx_own(&g, prep.as_ref()));
            assert_eq!(own, format!("{:?}", parse_rx_prepared(&g, prep.as_ref())), "{what}");
            checked += 1;
            fast += usize::from(prep.is_some_and(|p| p.v4_total_len().is_some()));
        };
        for v in 0..=255u8 {
            let Some(info) = Opcode(v).info() else { continue };
            let len = if info.any(f::PAYLOAD) { 61 } else { 0 };
            for (v6, vlan) in [(false, false), (true, false), (false, true)] {
                let r = repr(Opcode(v), v6, vlan);
                let mut buf = vec![0u8; frame_len(&r, len)];
                let n = emit_frame(&mut buf, &r, len, |p| p.fill(0x3c)).unwrap();
                same(&buf[..n], info.name);
                each_mutation(&mut buf[..n], info.name, &mut same);
            }
        }
        assert!(checked > 100_000 && fast > 10_000, "{checked} frames, {fast} prepared as IPv4");
    }

    #[test]
    fn rxe_sports() {
        // QPN 0x2f on both sides (rc_write_4k): 0x2f * 0x2f = 0x8a1, no high bits to fold.
        assert_eq!(rxe_udp_sport(0x2f, 0x2f), 0xc8a1);
        assert_eq!(rxe_udp_sport(0x11, 0x12), rxe_udp_sport(0x12, 0x11));
        assert_eq!(rxe_ud_udp_sport(0x12), 0xf806);
        assert_eq!(rxe_udp_sport(0xff_ffff, 0xff_ffff) & 0xc000, 0xc000);
    }
}
