//! RoCEv2 wire formats: Ethernet (+802.1Q), IPv4/IPv6, UDP 4791, the IBA transport headers, ICRC.
//!
//! # Contract
//! - Parsing never panics and never reads out of bounds, on any bytes. Every rejection is an [`Error`] value with a
//!   cause that callers count.
//! - `*Repr` types are validated values; frames are parsed into a [`RoceFrame`] (headers by value, payload borrowed
//!   from the input) and emitted from a [`RoceRepr`] into a caller-provided buffer, with the payload written by the
//!   caller through a closure (so the DPDK layer can build frames straight in mbufs).
//! - The opcode table ([`opcode`]) decides which extension headers follow the BTH.
//!
//! # Layout
//! - Whole frames: [`parse_frame`], [`parse_frame_checked`], [`frame_len`], [`emit_frame`] (in `roce.rs`).
//! - One module per header, smoltcp style (a `Packet<T: AsRef<[u8]>>` view with `field` ranges, `check_len`,
//!   getters and setters, plus `parse`/`emit`/`buffer_len` on the Repr): [`ethernet`], [`ipv4`], [`ipv6`],
//!   [`udp`], [`bth`], and [`ext`] for RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH, FETH and the CNP.
//! - [`icrc`]: the invariant CRC, also for the DPDK layer (contiguous or chained buffers).
//! - A view's accessors never panic once its `check_len` (or `new_checked`) returned `Ok`; emitting uses
//!   `new_unchecked` on a buffer sized by `buffer_len` / [`frame_len`].

/// Defines a smoltcp-style zero-copy view `$name<T: AsRef<[u8]>>` with `new_unchecked`, `new_checked` (which calls
/// the view's own `check_len`) and `into_inner`.
macro_rules! packet_view {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking it (accessors may panic until `check_len` passes).
            #[inline]
            pub const fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer and runs `check_len`; after `Ok`, no accessor panics.
            #[inline]
            pub fn new_checked(buffer: T) -> Result<Self, $crate::wire::Error> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// The inner buffer.
            #[inline]
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

pub mod bth;
pub mod crc;
pub mod ethernet;
pub mod ext;
pub mod icrc;
pub mod ipv4;
pub mod ipv6;
pub mod opcode;
pub mod psn;
mod roce;
pub mod template;
pub mod udp;

/// Why a GID (an IPv4-mapped or IPv6 address, as RoCEv2 carries it) names no RoCE port a QP can be connected to:
/// unspecified, broadcast, multicast or loopback; `None` for a unicast address. The perftest tools' check of a
/// peer's QP record and `roce-dpd`'s of a client's RTR both use it.
pub fn gid_not_unicast(gid: [u8; 16]) -> Option<&'static str> {
    let gid = std::net::Ipv6Addr::from(gid);
    match gid.to_ipv4_mapped() {
        Some(v4) if v4.is_unspecified() => Some("unspecified"),
        Some(v4) if v4.is_broadcast() => Some("the broadcast address"),
        Some(v4) if v4.is_multicast() => Some("a multicast address"),
        Some(v4) if v4.is_loopback() => Some("a loopback address"),
        Some(_) => None,
        None if gid.is_unspecified() => Some("unspecified"),
        None if gid.is_multicast() => Some("a multicast address"),
        None if gid.is_loopback() => Some("a loopback address"),
        None => None,
    }
}

pub use bth::{Packet as BthPacket, TxBth};
pub use ethernet::{Frame as EthernetFrame, HEADER_LEN as ETHERNET_HEADER_LEN};
pub use ext::{
    AethPacket, AtomicAckEthPacket, AtomicEthPacket, CnpPacket, DethPacket, FethPacket, IethPacket, ImmDtPacket,
    RethPacket,
};
pub use ipv4::{Packet as Ipv4Packet, Repr as Ipv4Repr, HEADER_LEN as IPV4_HEADER_LEN};
pub use ipv6::{Packet as Ipv6Packet, Repr as Ipv6Repr, HEADER_LEN as IPV6_HEADER_LEN};
pub use opcode::{flags as op, hdr_len, OpInfo, Opcode};
pub use psn::Psn;
pub(crate) use roce::parse_rx_own;
pub use roce::{
    emit_frame, frame_len, parse_frame, parse_frame_checked, parse_rx, parse_rx_prepared, rxe_ud_udp_sport,
    rxe_udp_sport, RxFrame,
};
pub use template::{HeaderTemplate, PayloadCopy};
pub use udp::{Packet as UdpPacket, Repr as UdpRepr, HEADER_LEN as UDP_HEADER_LEN};

use core::fmt;
use core::ops::Range;

/// A byte range of a header field, relative to the start of its header.
pub type Field = Range<usize>;

/// Reads the `N` bytes at `at..at + N`. Callers index only after `check_len`.
#[inline(always)]
pub(crate) fn arr<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[at..at + N]);
    a
}

/// Reads a big-endian u16 at `at`.
#[inline(always)]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(arr(b, at))
}

/// Reads a big-endian u32 at `at`.
#[inline(always)]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(arr(b, at))
}

/// Reads a big-endian u64 at `at`.
#[inline(always)]
pub(crate) fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(arr(b, at))
}

/// Reads the big-endian 24-bit value at `at..at + 3`.
#[inline(always)]
pub(crate) fn be24(b: &[u8], at: usize) -> u32 {
    let a: [u8; 3] = arr(b, at);
    u32::from_be_bytes([0, a[0], a[1], a[2]])
}

/// Writes the low 24 bits of `v` big-endian at `at..at + 3`.
#[inline(always)]
pub(crate) fn put_be24(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
}

/// The IANA UDP destination port of RoCEv2.
pub const ROCE_UDP_PORT: u16 = 4791;
/// Default P_Key (full membership, default partition).
pub const DEFAULT_PKEY: u16 = 0xffff;

/// Why a frame was rejected. Each variant is a counted drop reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// The buffer ends before a header or the length a header announces.
    Truncated,
    /// EtherType is neither IPv4 nor IPv6 (after an optional 802.1Q tag).
    NotIp,
    /// IPv4 header is malformed (version, IHL < 5, options where not allowed, fragment).
    BadIpHeader,
    /// IP protocol / IPv6 next header is not UDP.
    NotUdp,
    /// UDP destination port is not 4791.
    NotRoce,
    /// IP or UDP length fields disagree with each other or with the frame.
    LengthMismatch,
    /// BTH transport header version is not 0.
    BadBthVersion,
    /// The BTH opcode is not in the table.
    UnknownOpcode(u8),
    /// Pad count is not allowed for this opcode (non-zero without payload) or exceeds the payload.
    BadPadCount,
    /// The frame's ICRC does not match its contents.
    BadIcrc,
    /// The output buffer is too small for the frame to emit.
    BufferTooSmall,
    /// A value cannot be encoded (e.g. a payload too long for the IP length field).
    Unencodable,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Truncated => f.write_str("truncated frame"),
            Error::NotIp => f.write_str("not IPv4/IPv6"),
            Error::BadIpHeader => f.write_str("malformed IP header"),
            Error::NotUdp => f.write_str("not UDP"),
            Error::NotRoce => f.write_str("not UDP port 4791"),
            Error::LengthMismatch => f.write_str("IP/UDP length mismatch"),
            Error::BadBthVersion => f.write_str("bad BTH transport version"),
            Error::UnknownOpcode(op) => write!(f, "unknown BTH opcode {op:#04x}"),
            Error::BadPadCount => f.write_str("bad pad count"),
            Error::BadIcrc => f.write_str("bad ICRC"),
            Error::BufferTooSmall => f.write_str("output buffer too small"),
            Error::Unencodable => f.write_str("value cannot be encoded"),
        }
    }
}

impl std::error::Error for Error {}

/// A 48-bit Ethernet MAC address.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct MacAddr(pub [u8; 6]);

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.0;
        write!(f, "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}", m[0], m[1], m[2], m[3], m[4], m[5])
    }
}

/// An 802.1Q tag (PFC classes use the PCP).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct VlanTag {
    /// Priority code point (0..=7).
    pub pcp: u8,
    /// Drop eligible indicator.
    pub dei: bool,
    /// VLAN identifier (0..=4095).
    pub vid: u16,
}

/// The Ethernet part of a RoCEv2 frame.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct EthRepr {
    /// Destination MAC.
    pub dst: MacAddr,
    /// Source MAC.
    pub src: MacAddr,
    /// Optional 802.1Q tag.
    pub vlan: Option<VlanTag>,
}

/// The IP ECN codepoint (RFC 3168).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub enum Ecn {
    /// 00: not ECN-capable.
    #[default]
    NotEct,
    /// 01: ECN-capable, ECT(1).
    Ect1,
    /// 10: ECN-capable, ECT(0).
    Ect0,
    /// 11: congestion experienced.
    Ce,
}

impl Ecn {
    /// From the two low bits of the TOS / traffic-class byte.
    #[inline]
    pub const fn from_bits(b: u8) -> Ecn {
        match b & 3 {
            0 => Ecn::NotEct,
            1 => Ecn::Ect1,
            2 => Ecn::Ect0,
            _ => Ecn::Ce,
        }
    }
    /// The two-bit codepoint.
    #[inline]
    pub const fn bits(self) -> u8 {
        match self {
            Ecn::NotEct => 0,
            Ecn::Ect1 => 1,
            Ecn::Ect0 => 2,
            Ecn::Ce => 3,
        }
    }
}

/// Source and destination IP addresses.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum IpAddrs {
    /// IPv4.
    V4 {
        /// Source address.
        src: [u8; 4],
        /// Destination address.
        dst: [u8; 4],
    },
    /// IPv6.
    V6 {
        /// Source address.
        src: [u8; 16],
        /// Destination address.
        dst: [u8; 16],
    },
}

impl Default for IpAddrs {
    fn default() -> Self {
        IpAddrs::V4 { src: [0; 4], dst: [0; 4] }
    }
}

/// The IP part of a RoCEv2 frame. Lengths and the IPv4 checksum are not stored: they are derived when emitting and
/// validated when parsing.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct IpRepr {
    /// Addresses (and so the IP version).
    pub addrs: IpAddrs,
    /// DSCP (6 bits).
    pub dscp: u8,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// IPv4 TTL or IPv6 hop limit.
    pub ttl: u8,
    /// IPv4 identification (0 for IPv6).
    pub ident: u16,
    /// IPv4 don't-fragment bit.
    pub dont_frag: bool,
    /// IPv6 flow label (20 bits; 0 for IPv4).
    pub flow_label: u32,
}

/// The Base Transport Header.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct BthRepr {
    /// Opcode.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// MigReq.
    pub mig_req: bool,
    /// Pad count (0..=3): bytes of padding after the payload. Computed by [`emit_frame`] from the payload length.
    pub pad: u8,
    /// Transport header version (0).
    pub tver: u8,
    /// Partition key.
    pub pkey: u16,
    /// Forward ECN (IB).
    pub fecn: bool,
    /// Backward ECN: set in a CNP.
    pub becn: bool,
    /// Destination QP (24 bits).
    pub dest_qp: u32,
    /// AckReq.
    pub ack_req: bool,
    /// Packet sequence number.
    pub psn: Psn,
}

impl Default for BthRepr {
    fn default() -> Self {
        BthRepr {
            opcode: Opcode::RC_SEND_ONLY,
            solicited: false,
            mig_req: false,
            pad: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: false,
            dest_qp: 0,
            ack_req: false,
            psn: Psn::new(0),
        }
    }
}

/// RDMA Extended Transport Header.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// DMA length of the whole message.
    pub len: u32,
}

/// Decoded AETH syndrome.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum AethKind {
    /// ACK with a credit count (0x1f = unlimited / not advertised).
    Ack {
        /// Credit code (low 5 bits).
        credits: u8,
    },
    /// RNR NAK with the RNR timer code (IBTA RNR timer table).
    RnrNak {
        /// Timer code (low 5 bits).
        timer: u8,
    },
    /// NAK with a code.
    Nak(NakCode),
    /// Reserved syndrome values (type 0b10, bit 7 set, or undefined NAK codes).
    Reserved(u8),
}

/// NAK codes (AETH syndrome 0x60 | code).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub enum NakCode {
    /// 0: PSN sequence error.
    PsnSeqErr,
    /// 1: invalid request.
    InvalidRequest,
    /// 2: remote access error.
    RemoteAccessErr,
    /// 3: remote operational error.
    RemoteOpErr,
    /// 4: invalid RD request.
    InvalidRdRequest,
}

impl NakCode {
    /// The low 5 syndrome bits.
    pub const fn code(self) -> u8 {
        match self {
            NakCode::PsnSeqErr => 0,
            NakCode::InvalidRequest => 1,
            NakCode::RemoteAccessErr => 2,
            NakCode::RemoteOpErr => 3,
            NakCode::InvalidRdRequest => 4,
        }
    }
}

/// ACK Extended Transport Header.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct AethRepr {
    /// Raw syndrome byte.
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Syndrome of an ACK that advertises no end-to-end credits (what rxe sends).
    pub const ACK_UNLIMITED: u8 = 0x1f;

    /// Decodes the syndrome.
    pub const fn kind(&self) -> AethKind {
        let s = self.syndrome;
        if s & 0x80 != 0 {
            return AethKind::Reserved(s);
        }
        match (s >> 5) & 3 {
            0 => AethKind::Ack { credits: s & 0x1f },
            1 => AethKind::RnrNak { timer: s & 0x1f },
            3 => match s & 0x1f {
                0 => AethKind::Nak(NakCode::PsnSeqErr),
                1 => AethKind::Nak(NakCode::InvalidRequest),
                2 => AethKind::Nak(NakCode::RemoteAccessErr),
                3 => AethKind::Nak(NakCode::RemoteOpErr),
                4 => AethKind::Nak(NakCode::InvalidRdRequest),
                _ => AethKind::Reserved(s),
            },
            _ => AethKind::Reserved(s),
        }
    }

    /// An ACK syndrome (no credits advertised).
    pub const fn ack(msn: u32) -> AethRepr {
        AethRepr { syndrome: Self::ACK_UNLIMITED, msn: msn & 0x00ff_ffff }
    }
    /// A NAK syndrome.
    pub const fn nak(code: NakCode, msn: u32) -> AethRepr {
        AethRepr { syndrome: 0x60 | code.code(), msn: msn & 0x00ff_ffff }
    }
    /// An RNR NAK syndrome with the RNR timer code.
    pub const fn rnr_nak(timer: u8, msn: u32) -> AethRepr {
        AethRepr { syndrome: 0x20 | (timer & 0x1f), msn: msn & 0x00ff_ffff }
    }
}

/// Atomic Extended Transport Header.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct AtomicEthRepr {
    /// Remote virtual address (8-byte aligned).
    pub va: u64,
    /// Remote key.
    pub rkey: u32,
    /// Swap value (CMP_SWAP) or add value (FETCH_ADD).
    pub swap_add: u64,
    /// Compare value (CMP_SWAP).
    pub compare: u64,
}

/// Datagram Extended Transport Header.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct DethRepr {
    /// Queue key.
    pub qkey: u32,
    /// Source QP (24 bits).
    pub src_qp: u32,
}

/// The extension headers present in a packet. Which ones must be present is given by the opcode table; parse fills
/// exactly those, emit writes exactly those (a required one that is `None` is written as zeros).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct ExtRepr {
    /// RETH.
    pub reth: Option<RethRepr>,
    /// AETH.
    pub aeth: Option<AethRepr>,
    /// AtomicETH.
    pub atomic_eth: Option<AtomicEthRepr>,
    /// AtomicAckETH: original remote data.
    pub atomic_ack: Option<u64>,
    /// Immediate data (opaque, as the 4 bytes on the wire read big-endian).
    pub imm: Option<u32>,
    /// IETH: R_Key to invalidate.
    pub ieth: Option<u32>,
    /// DETH.
    pub deth: Option<DethRepr>,
    /// FETH (raw 32 bits).
    pub feth: Option<u32>,
}

/// All headers of a RoCEv2 frame up to and including the extension headers.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, Debug)]
pub struct RoceRepr {
    /// Ethernet.
    pub eth: EthRepr,
    /// IPv4 / IPv6.
    pub ip: IpRepr,
    /// UDP source port (flow entropy).
    pub udp_src: u16,
    /// UDP destination port (4791).
    pub udp_dst: u16,
    /// BTH.
    pub bth: BthRepr,
    /// Extension headers.
    pub ext: ExtRepr,
}

/// A parsed RoCEv2 frame: validated headers, the payload (without pad) borrowed from the input, and the ICRC
/// verdict.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoceFrame<'a> {
    /// Headers.
    pub repr: RoceRepr,
    /// Payload bytes (pad and ICRC excluded).
    pub payload: &'a [u8],
    /// True if the ICRC matched.
    pub icrc_ok: bool,
}
