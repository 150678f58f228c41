//! The RoCEv2 invariant CRC (ROCE-NOTES §1.7; rxe `rxe_icrc.c`, scapy `BTH.compute_icrc`).
//!
//! ICRC = CRC-32 (IEEE, as zlib) over: 8 bytes of 0xFF (the masked LRH of InfiniBand), the IP header with the
//! variant fields set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit),
//! the UDP header with the checksum set to all ones, the BTH with byte 4 (FECN, BECN, reserved) set to all ones,
//! then the rest of the packet (extension headers, payload, pad). It is stored little-endian in the last 4 bytes.
//!
//! [`compute`] hashes the packet where it lies in one pass, no copy, no allocation: the masked fields' differences
//! from the packet's bytes enter as a correction of the initial CRC register (see there). The streaming [`Icrc`]
//! folds the masked LRH into the initial state ([`LRH_SEED`]) and hashes a masked copy of the headers.
//!
//! IPv4 options, if any, are covered unmasked (rxe never sends them).
//!
//! [`AckIcrc`] gives the ICRC of a flow's RC ACKNOWLEDGE frames without a CRC pass: the CRC register is linear
//! over GF(2), so it is the flow's constant share XOR a table entry per byte in which the flow's ACKs differ.

use super::{bth, ipv4, ipv6, opcode::hdr_len, udp, Error};
use crc32fast::Hasher;
use std::sync::OnceLock;

/// A hasher after the masked LRH. crc32fast detects the CPU's CRC kernel (PCLMULQDQ, or VPCLMULQDQ on AVX2) each
/// time a `Hasher` is made; cloning one made once skips that per packet.
#[inline]
fn seeded() -> Hasher {
    static PROTO: OnceLock<Hasher> = OnceLock::new();
    PROTO.get_or_init(|| Hasher::new_with_initial(LRH_SEED)).clone()
}

/// `crc32(&[0xff; 8])`: the CRC state after the masked LRH. Its complement is rxe's seed 0xdebb20e3, which works
/// on the uncomplemented register.
pub const LRH_SEED: u32 = 0x2144_df1c;

/// The longest masked header prefix: IPv4 with 40 bytes of options, UDP, BTH.
pub const MAX_PSEUDO_LEN: usize = 60 + udp::HEADER_LEN + bth::HEADER_LEN;

/// Copies IP + UDP + BTH from the start of `pkt` into `out` with the variant fields masked, and returns how many
/// bytes they cover. `pkt` starts at the IP header. `Truncated` if `pkt` is too short, `BadIpHeader` if the
/// version is neither 4 nor 6 or IHL < 5.
#[inline]
pub fn masked_headers(pkt: &[u8], out: &mut [u8; MAX_PSEUDO_LEN]) -> Result<usize, Error> {
    let first = *pkt.first().ok_or(Error::Truncated)?;
    let ip_len = match first >> 4 {
        4 if first & 0x0f >= 5 => usize::from(first & 0x0f) * 4,
        6 => ipv6::HEADER_LEN,
        _ => return Err(Error::BadIpHeader),
    };
    let n = ip_len + udp::HEADER_LEN + hdr_len::BTH;
    let m = out.get_mut(..n).ok_or(Error::Truncated)?;
    m.copy_from_slice(pkt.get(..n).ok_or(Error::Truncated)?);
    if first >> 4 == 4 {
        for i in [ipv4::field::DSCP_ECN, ipv4::field::TTL, ipv4::field::CHECKSUM.start, ipv4::field::CHECKSUM.start + 1]
        {
            m[i] = 0xff;
        }
    } else {
        m[0] |= 0x0f;
        for i in [1, 2, 3, ipv6::field::HOP_LIMIT] {
            m[i] = 0xff;
        }
    }
    for i in [ip_len + udp::field::CHECKSUM.start, ip_len + udp::field::CHECKSUM.start + 1] {
        m[i] = 0xff;
    }
    m[ip_len + udp::HEADER_LEN + bth::field::FECN_BECN] = 0xff;
    Ok(n)
}

/// An ICRC in progress, for packets whose bytes are not contiguous (e.g. chained mbufs): feed the headers with
/// [`update_headers`](Icrc::update_headers), then every remaining byte up to (not including) the ICRC with
/// [`update`](Icrc::update).
#[derive(Clone)]
pub struct Icrc {
    hasher: Hasher,
}

impl Default for Icrc {
    fn default() -> Self {
        Self::new()
    }
}

impl Icrc {
    /// Starts after the masked LRH.
    #[inline]
    pub fn new() -> Icrc {
        Icrc { hasher: seeded() }
    }

    /// Hashes the masked IP + UDP + BTH at the start of `pkt` (see [`masked_headers`]); returns the number of bytes
    /// of `pkt` consumed.
    #[inline]
    pub fn update_headers(&mut self, pkt: &[u8]) -> Result<usize, Error> {
        let mut buf = [0u8; MAX_PSEUDO_LEN];
        let n = masked_headers(pkt, &mut buf)?;
        self.hasher.update(&buf[..n]);
        Ok(n)
    }

    /// Hashes unmasked bytes (extension headers, payload, pad).
    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.hasher.update(bytes);
    }

    /// The ICRC value (store with `to_le_bytes`).
    #[inline]
    pub fn finish(self) -> u32 {
        self.hasher.finalize()
    }
}

/// The ICRC of `pkt`: from the start of the IP header to the end of the pad, ICRC excluded.
///
/// One CRC pass over the packet where it lies, from a corrected initial register instead of over masked bytes:
/// the CRC register is linear over GF(2), so hashing the unmasked packet from the register `R ^ E` gives the
/// masked packet's CRC from `R` when `E` is the register that the masked bytes' differences would leave after
/// hashing zeros up to their offset (`UNSHIFT`: one table entry per masked byte, the first four bytes XORed in
/// directly). `R` is the state after the masked LRH ([`LRH_SEED`]). So nothing is copied or written before the
/// CRC's vector loads (a staged copy of the headers ORed with a mask cost a store-to-load forwarding stall and a
/// second CRC call per packet: ~2x the time of a plain CRC of the same bytes on this project's machine). IPv4 with
/// options (rxe never sends them) takes the two-call path of [`Icrc`].
#[inline]
pub fn compute(pkt: &[u8]) -> Result<u32, Error> {
    let fix = match pkt.first() {
        Some(0x45) => {
            let h: &[u8; V4_HEAD] = pkt.first_chunk().ok_or(Error::Truncated)?;
            let at = |i: usize| h[V4_AT[i]];
            v4_fix(h[ipv4::field::DSCP_ECN], at(0), [at(1), at(2)], [at(3), at(4)], at(5))
        }
        Some(b) if b >> 4 == 6 => {
            let h: &[u8; V6_HEAD] = pkt.first_chunk().ok_or(Error::Truncated)?;
            let at = |i: usize| h[V6_AT[i]];
            v6_fix([h[0], h[1], h[2], h[3]], at(0), [at(1), at(2)], at(3))
        }
        _ => return compute_masked(pkt),
    };
    Ok(compute_with_fix(pkt, fix))
}

/// [`compute`] for IPv4 with options, or anything that is not a RoCE IP packet (`update_headers` returns the
/// error): the two-call path of [`Icrc`]. Out of line, so the common path saves no registers for it.
#[cold]
#[inline(never)]
fn compute_masked(pkt: &[u8]) -> Result<u32, Error> {
    let mut c = Icrc::new();
    let n = c.update_headers(pkt)?;
    c.update(&pkt[n..]);
    Ok(c.finish())
}

/// The ICRC of `pkt` (IP header to the end of the pad) whose masked fields give the initial-register correction
/// `fix` ([`v4_fix`], [`v6_fix`]): one CRC pass where the packet lies. A sender that wrote the masked fields
/// itself knows them without reading them back (the header template: [`v4_fix`] of its own values).
#[inline]
pub fn compute_with_fix(pkt: &[u8], fix: u32) -> u32 {
    super::crc::update(LRH_SEED ^ fix, pkt)
}

/// Bytes of the masked LRH the ICRC starts with.
pub const LRH_LEN: usize = 8;

/// The ICRC of a packet its sender prepared in place as it wrote the headers (done early, so that the CRC's loads
/// find those stores done), without making a `Hasher` (crc32fast detects the CPU's kernel in every
/// `Hasher::new_with_initial`, ~37 instructions a packet): the CRC XORs the packet's first four bytes
/// (little-endian) into its register before anything else, so a correction of the initial register is the same
/// XORed into those bytes, and a clone of the prototype hasher (from [`LRH_SEED`]) does the rest. `span` is the
/// packet with the correction of the initial register already XORed into its first four bytes, preceded by the masked
/// LRH (8 x 0xFF, which a zero CRC state turns into [`LRH_SEED`]) when `with_lrh`. The sender puts the bytes back
/// afterwards. crc32fast folds 16 bytes at a time, ends a partial block with a byte shuffle (~30 instructions
/// against ~10 for a whole block), and below 128 bytes runs its serial fold-by-1 kernel (~147 instructions for 120
/// bytes against ~80 for 128 in its fold-by-4 one): the LRH makes a packet 8 bytes short of whole blocks (a 64-byte
/// WRITE's 120) whole. Where the CPU has AVX-512 and VPCLMULQDQ (since session 21), a span takes this project's
/// kernels instead ([`crc::update_short`](super::crc::update_short) up to 511 bytes, the general one above), and the
/// reasoning about crc32fast above holds only without those features.
#[inline]
pub fn compute_prepared(span: &[u8], with_lrh: bool) -> u32 {
    let from = if with_lrh { 0 } else { LRH_SEED };
    if let Some(v) = super::crc::update_short(from, span).or_else(|| super::crc::update_long(from, span)) {
        return v;
    }
    let mut c = seeded();
    if with_lrh {
        c.reset();
    }
    c.update(span);
    c.finalize()
}

/// Where a received frame's IP header starts for [`rx_prepare`]: Ethernet II without a tag.
const RX_L3: usize = super::ethernet::HEADER_LEN;

/// Where [`rx_prepare`]'s span starts: the masked LRH's 8 bytes before the IP header (the source MAC address and
/// the EtherType), of which it writes the first 4 (the source MAC address's first 4 bytes).
pub const RX_START: usize = RX_L3 - LRH_LEN;

/// The span offsets (from [`RX_START`]) of the bytes whose differences from the masked span (8 x 0xFF, then the
/// packet with its variant fields all ones) the 4 bytes that [`rx_prepare`] writes cancel: the source MAC
/// address's last two bytes, then IPv4's masked bytes (TOS, then [`V4_AT`]), then IPv6's (the first four, then
/// [`V6_AT`]). The EtherType's two are fixed per IP version ([`RX_ETHERTYPE_V4`], [`RX_ETHERTYPE_V6`]).
const RX_AT: [usize; 17] = {
    let l = LRH_LEN;
    [
        4,
        5,
        l + ipv4::field::DSCP_ECN,
        l + V4_AT[0],
        l + V4_AT[1],
        l + V4_AT[2],
        l + V4_AT[3],
        l + V4_AT[4],
        l + V4_AT[5],
        l,
        l + 1,
        l + 2,
        l + 3,
        l + V6_AT[0],
        l + V6_AT[1],
        l + V6_AT[2],
        l + V6_AT[3],
    ]
};

/// `RX_UNSHIFT[k][b]`: the share in [`rx_prepare`]'s correction of the byte `b` at span offset `RX_AT[k]`: the raw
/// register that hashing `RX_AT[k]` zero bytes turns into the byte's difference from its masked value, `!b` (IPv6's
/// first byte: `!b & 0x0f`, its version nibble is covered as it is). Indexed by the byte as received, so that a
/// share is one load.
static RX_UNSHIFT: [[u32; 256]; RX_AT.len()] = {
    let mut t = [[0u32; 256]; RX_AT.len()];
    let mut k = 0;
    while k < RX_AT.len() {
        let u = unshift_table(RX_AT[k]);
        let mask = if k == RX_V6_FIRST { 0x0f } else { 0xff };
        let mut b = 0;
        while b < 256 {
            t[k][b] = u[!b & mask];
            b += 1;
        }
        k += 1;
    }
    t
};

/// The index in [`RX_AT`] of IPv6's first byte.
const RX_V6_FIRST: usize = 9;

/// The entry of [`RX_UNSHIFT`] table `K` for the byte `b`.
#[inline(always)]
fn rx_unshift<const K: usize>(b: u8) -> u32 {
    RX_UNSHIFT[K][usize::from(b)]
}

/// The share of an EtherType's two bytes (span offsets 6 and 7) in [`rx_prepare`]'s correction.
const fn rx_ethertype(t: u16) -> u32 {
    let [hi, lo] = t.to_be_bytes();
    unshift_table(6)[!hi as usize] ^ unshift_table(7)[!lo as usize]
}
const RX_ETHERTYPE_V4: u32 = rx_ethertype(super::ethernet::ethertype::IPV4);
const RX_ETHERTYPE_V6: u32 = rx_ethertype(super::ethernet::ethertype::IPV6);

/// A received frame prepared by [`rx_prepare`] for its in-place ICRC pass: what it overwrote, and where the
/// covered bytes end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxPrepared {
    /// The frame's bytes `RX_START..RX_START + 4` before [`rx_prepare`] wrote them.
    saved: [u8; 4],
    /// The end of the bytes the ICRC covers (the stored ICRC's offset in the frame).
    end: usize,
    /// The frame is Ethernet II without a tag carrying IPv4 without options (else IPv6), its total length at least
    /// a UDP header, a BTH and an ICRC past the IP header and within the frame: what the preparation checked.
    v4: bool,
}

impl RxPrepared {
    /// True if the IP packet (header to ICRC) that a parse of the prepared frame found, `ip_len` bytes from the
    /// end of an untagged Ethernet header, is the span this preparation is for.
    #[inline(always)]
    pub fn covers(&self, ip_len: usize) -> bool {
        self.end + hdr_len::ICRC == RX_L3 + ip_len
    }

    /// For a frame prepared as untagged IPv4 without options: its IPv4 total length, as the preparation read and
    /// checked it (at least the headers up to the BTH and an ICRC, within the frame).
    #[inline(always)]
    pub(crate) fn v4_total_len(&self) -> Option<usize> {
        self.v4.then_some(self.end + hdr_len::ICRC - RX_L3)
    }
}

/// Prepares a received frame in its own buffer for an ICRC pass as cheap as the transmit side's ([`compute_prepared`]:
/// a clone of the prototype hasher, no `Hasher::new_with_initial`, and 8 more bytes that make a packet 8 bytes short of
/// whole 16-byte blocks, such as a 64-byte WRITE's 120, whole, above crc32fast's 128-byte threshold for its fast
/// kernel; with AVX-512 and VPCLMULQDQ the pass is `crc::update_short`'s, for which whole blocks save the partial
/// block's multiplication): the pass hashes from [`RX_START`], the 8 bytes before the IP header where the masked LRH
/// would be, and the four bytes written here (over the source MAC address's first four) make its result the ICRC. The
/// CRC register is linear over GF(2): the differences of the span's bytes from the masked span (the source MAC
/// address's last two bytes and the EtherType against 0xff, each masked field against its all-ones value) each act as a
/// register term (one table load each), and the first four bytes, XORed straight into the register, cancel their sum.
/// Nothing the parse reads is written (it reads no source MAC address byte), so the parse runs between this store and
/// the CRC's loads (the store is done by then: no store-to-load forwarding stall, which made the same pass with the CRC
/// right after the store no faster than [`verify`]), and the frame's header bytes stay as received meanwhile. Check
/// with [`rx_check`]; put the bytes back with [`rx_restore`].
///
/// None (nothing written) unless the frame is Ethernet II without a tag carrying IPv4 without options or IPv6,
/// with room for UDP, a BTH and an ICRC and the IP packet within the frame; other frames take [`verify`].
#[inline(always)]
pub fn rx_prepare(frame: &mut [u8]) -> Option<RxPrepared> {
    const V4: usize = RX_L3 + V4_HEAD;
    const V6: usize = RX_L3 + V6_HEAD;
    let h: &[u8; V4] = frame.first_chunk()?;
    let mac = rx_unshift::<0>(h[10]) ^ rx_unshift::<1>(h[11]);
    let ip_len;
    let v4;
    let sum = match (u16::from_be_bytes([h[12], h[13]]), h[RX_L3]) {
        (super::ethernet::ethertype::IPV4, 0x45) => {
            let ip = &h[RX_L3..];
            ip_len = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
            if ip_len < V4_HEAD + hdr_len::ICRC {
                return None;
            }
            v4 = true;
            RX_ETHERTYPE_V4
                ^ rx_unshift::<2>(ip[ipv4::field::DSCP_ECN])
                ^ rx_unshift::<3>(ip[V4_AT[0]])
                ^ rx_unshift::<4>(ip[V4_AT[1]])
                ^ rx_unshift::<5>(ip[V4_AT[2]])
                ^ rx_unshift::<6>(ip[V4_AT[3]])
                ^ rx_unshift::<7>(ip[V4_AT[4]])
                ^ rx_unshift::<8>(ip[V4_AT[5]])
        }
        (super::ethernet::ethertype::IPV6, b) if b >> 4 == 6 => {
            let h: &[u8; V6] = frame.first_chunk()?;
            let ip = &h[RX_L3..];
            ip_len = ipv6::HEADER_LEN + usize::from(u16::from_be_bytes([ip[4], ip[5]]));
            if ip_len < V6_HEAD + hdr_len::ICRC {
                return None;
            }
            v4 = false;
            RX_ETHERTYPE_V6
                ^ rx_unshift::<RX_V6_FIRST>(ip[0])
                ^ rx_unshift::<10>(ip[1])
                ^ rx_unshift::<11>(ip[2])
                ^ rx_unshift::<12>(ip[3])
                ^ rx_unshift::<13>(ip[V6_AT[0]])
                ^ rx_unshift::<14>(ip[V6_AT[1]])
                ^ rx_unshift::<15>(ip[V6_AT[2]])
                ^ rx_unshift::<16>(ip[V6_AT[3]])
        }
        _ => return None,
    };
    if RX_L3 + ip_len > frame.len() {
        return None;
    }
    let end = RX_L3 + ip_len - hdr_len::ICRC;
    let w: &mut [u8; 4] = frame.get_mut(RX_START..RX_START + 4)?.try_into().ok()?;
    let saved = *w;
    *w = (!(sum ^ mac)).to_le_bytes();
    Some(RxPrepared { saved, end, v4 })
}

/// True if the frame that [`rx_prepare`] prepared (`p`) holds the right ICRC: one pass of the prototype hasher
/// from [`RX_START`] to the stored ICRC ([`compute_prepared`]).
#[inline]
pub fn rx_check(frame: &[u8], p: &RxPrepared) -> bool {
    match (frame.get(RX_START..p.end), frame.get(p.end..p.end + hdr_len::ICRC)) {
        (Some(span), Some(&[a, b, c, d])) => compute_prepared(span, true) == u32::from_le_bytes([a, b, c, d]),
        _ => false,
    }
}

/// Puts back the bytes [`rx_prepare`] wrote.
#[inline]
pub fn rx_restore(frame: &mut [u8], p: RxPrepared) {
    if let Some(w) = frame.get_mut(RX_START..RX_START + 4) {
        w.copy_from_slice(&p.saved);
    }
}

/// The ICRC check of a whole received frame in its own buffer ([`rx_prepare`], [`rx_check`], [`rx_restore`]):
/// None if the frame is not of a shape that [`rx_prepare`] takes. The frame's bytes are as before when it returns.
pub fn verify_in_place(frame: &mut [u8]) -> Option<bool> {
    let p = rx_prepare(frame)?;
    let ok = rx_check(frame, &p);
    rx_restore(frame, p);
    Some(ok)
}

/// The correction of the initial CRC register for an IPv4 packet without options whose masked fields hold these
/// values: TOS (DSCP and ECN), TTL, header checksum, UDP checksum and BTH byte 4 (FECN, BECN), each as on the
/// wire. Linear in each field: a sender can XOR the shares of the fields it knows in advance once, and add the
/// per-packet ones (the header checksum) with [`v4_checksum_fix`].
#[inline(always)]
pub fn v4_fix(tos: u8, ttl: u8, checksum: [u8; 2], udp_checksum: [u8; 2], bth_b4: u8) -> u32 {
    (u32::from(!tos) << 8)
        ^ unshift::<0>(!ttl)
        ^ v4_checksum_fix(checksum)
        ^ unshift::<3>(!udp_checksum[0])
        ^ unshift::<4>(!udp_checksum[1])
        ^ unshift::<5>(!bth_b4)
}

/// The IPv4 header checksum's share of [`v4_fix`].
#[inline(always)]
pub fn v4_checksum_fix(checksum: [u8; 2]) -> u32 {
    unshift::<1>(!checksum[0]) ^ unshift::<2>(!checksum[1])
}

/// [`v4_fix`] for IPv6: the first four bytes (version kept; traffic class and flow label masked), the hop limit,
/// the UDP checksum and BTH byte 4.
#[inline(always)]
pub fn v6_fix(first4: [u8; 4], hop_limit: u8, udp_checksum: [u8; 2], bth_b4: u8) -> u32 {
    // The first four bytes XOR into the register.
    (!u32::from_le_bytes(first4) & 0xffff_ff0f)
        ^ unshift::<6>(!hop_limit)
        ^ unshift::<7>(!udp_checksum[0])
        ^ unshift::<8>(!udp_checksum[1])
        ^ unshift::<9>(!bth_b4)
}

/// IPv4 (no options) + UDP + BTH: the bytes [`compute`] reads the masked fields from.
const V4_HEAD: usize = ipv4::HEADER_LEN + udp::HEADER_LEN + hdr_len::BTH;
/// IPv6 + UDP + BTH.
const V6_HEAD: usize = ipv6::HEADER_LEN + udp::HEADER_LEN + hdr_len::BTH;

/// The masked bytes past the first four, IPv4 without options: TTL, header checksum, UDP checksum, BTH byte 4.
const V4_AT: [usize; 6] = {
    let u = ipv4::HEADER_LEN;
    [
        ipv4::field::TTL,
        ipv4::field::CHECKSUM.start,
        ipv4::field::CHECKSUM.start + 1,
        u + udp::field::CHECKSUM.start,
        u + udp::field::CHECKSUM.start + 1,
        u + udp::HEADER_LEN + bth::field::FECN_BECN,
    ]
};

/// The same for IPv6: hop limit, UDP checksum, BTH byte 4.
const V6_AT: [usize; 4] = {
    let u = ipv6::HEADER_LEN;
    [
        ipv6::field::HOP_LIMIT,
        u + udp::field::CHECKSUM.start,
        u + udp::field::CHECKSUM.start + 1,
        u + udp::HEADER_LEN + bth::field::FECN_BECN,
    ]
};

/// `UNSHIFT[k][v]`: the raw CRC register that hashing `UNSHIFT_AT[k]` zero bytes turns into `v` (the register
/// whose every bit but the low byte's is zero). XORed into the initial register, it acts as `v` XORed into the
/// packet's byte at that offset ([`compute`]). The offsets are [`V4_AT`] then [`V6_AT`].
static UNSHIFT: [[u32; 256]; 10] = {
    let at = [V4_AT[0], V4_AT[1], V4_AT[2], V4_AT[3], V4_AT[4], V4_AT[5], V6_AT[0], V6_AT[1], V6_AT[2], V6_AT[3]];
    let mut t = [[0u32; 256]; 10];
    let mut k = 0;
    while k < 10 {
        t[k] = unshift_table(at[k]);
        k += 1;
    }
    t
};

/// The table of [`UNSHIFT`] for offset `at`: entry `v` is the raw register that hashing `at` zero bytes turns into
/// `v`.
const fn unshift_table(at: usize) -> [u32; 256] {
    // Linear in `v`: the register for each bit, then every byte value as the XOR of its bits'.
    let mut bits = [0u32; 8];
    let mut b = 0;
    while b < 8 {
        let mut r = 1u32 << b;
        let mut n = 0;
        while n < at {
            r = unstep(r);
            n += 1;
        }
        bits[b] = r;
        b += 1;
    }
    byte_table(&bits)
}

/// The table of a map linear over GF(2) in a byte: entry `v` is the XOR of `bits[b]` for each bit `b` set in `v`.
const fn byte_table(bits: &[u32; 8]) -> [u32; 256] {
    let mut t = [0u32; 256];
    let mut v = 0;
    while v < 256 {
        let mut b = 0;
        while b < 8 {
            if v & (1 << b) != 0 {
                t[v] ^= bits[b];
            }
            b += 1;
        }
        v += 1;
    }
    t
}

/// The entry of [`UNSHIFT`] table `K` for the difference `v`.
#[inline(always)]
fn unshift<const K: usize>(v: u8) -> u32 {
    UNSHIFT[K][usize::from(v)]
}

/// `STEP[i]`: the raw register after one zero byte from the register `i` (`i < 256`), the byte-wise CRC table.
const STEP: [u32; 256] = {
    let mut t = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        t[i] = step(0, i as u8);
        i += 1;
    }
    t
};

/// `UNSTEP[STEP[i] >> 24] == i`: the top bytes of the table's entries are all different (the polynomial's degree-32
/// term), so a step is invertible.
const UNSTEP: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        t[(STEP[i] >> 24) as usize] = i as u8;
        i += 1;
    }
    t
};

/// The raw register that one zero byte turns into `r`: a zero byte maps `x` to `STEP[x & 0xff] ^ (x >> 8)`, whose
/// top byte is `STEP[x & 0xff]`'s.
const fn unstep(r: u32) -> u32 {
    let i = UNSTEP[(r >> 24) as usize];
    ((r ^ STEP[i as usize]) << 8) | i as u32
}

/// The reflected CRC-32 polynomial (IEEE 802.3, as zlib).
const POLY: u32 = 0xedb8_8320;

/// Byte `b` through the raw (uncomplemented) CRC register `r`.
const fn step(mut r: u32, b: u8) -> u32 {
    r ^= b as u32;
    let mut i = 0;
    while i < 8 {
        r = (r >> 1) ^ (POLY & (r & 1).wrapping_neg());
        i += 1;
    }
    r
}

/// Distances from the end of an ACK's covered bytes (IP + UDP + BTH + AETH; the AETH's last byte is 1) of the
/// bytes in which a flow's ACKs differ: the AETH 4..1, the PSN 7..5 and, IPv4 (20-byte header), the
/// identification 40, 39.
const ACK_DIST: [usize; 9] = [1, 2, 3, 4, 5, 6, 7, 39, 40];

/// `ACK_SHARE[k][v]`: the raw CRC register after byte `v` followed by `ACK_DIST[k] - 1` zero bytes, from a zero
/// register. The register is linear over GF(2) in its initial value and the bytes, so a byte's share in the final
/// register is this entry, XORed onto the share of all the other bytes.
static ACK_SHARE: [[u32; 256]; ACK_DIST.len()] = {
    let mut t = [[0u32; 256]; ACK_DIST.len()];
    let mut k = 0;
    while k < ACK_DIST.len() {
        let mut bits = [0u32; 8];
        let mut bit = 0;
        while bit < 8 {
            let mut r = step(0, 1 << bit);
            let mut z = 1;
            while z < ACK_DIST[k] {
                r = step(r, 0);
                z += 1;
            }
            bits[bit] = r;
            bit += 1;
        }
        t[k] = byte_table(&bits);
        k += 1;
    }
    t
};

/// The share of byte `v` at distance `ACK_DIST[K]` (see [`ACK_SHARE`]).
#[inline(always)]
fn ack_share<const K: usize>(v: u8) -> u32 {
    ACK_SHARE[K][usize::from(v)]
}

/// BTH bytes 0..8 as a big-endian u64 without the masked FECN/BECN byte: what [`AckIcrc`] compares.
const BTH_CMP: u64 = 0xffff_ffff_00ff_ffff;

/// The ICRC of a flow's ACKs (RC ACKNOWLEDGE: IP, UDP, BTH, AETH) without hashing: the ACKs of one flow share
/// every covered byte but the IPv4 identification, the PSN and the AETH (and the masked ones), so the final CRC
/// register is the flow's constant share XOR one table entry per such byte (9 loads, IPv4; 7, IPv6) — a
/// fraction of a CRC pass over 44 or 64 bytes. Made once per header template from its ACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AckIcrc {
    /// The raw register after the flow's ACK with the differing bytes zeroed.
    reg: u32,
    /// The ACK's BTH bytes 0..8 (masked with [`BTH_CMP`]) and AckReq byte, which an ACK must match.
    bth: u64,
    ack_req: u8,
    /// IP + UDP + BTH + AETH: 44 (IPv4 without options) or 64 (IPv6) bytes.
    len: u8,
}

impl AckIcrc {
    /// From an ACK of the flow (`pkt`: IP header to AETH, ICRC excluded; IPv4 without options or IPv6). None for
    /// any other shape.
    pub fn new(pkt: &[u8]) -> Option<AckIcrc> {
        let mut m = [0u8; MAX_PSEUDO_LEN + hdr_len::AETH];
        let h = masked_headers(pkt, (&mut m[..MAX_PSEUDO_LEN]).try_into().ok()?).ok()?;
        let len = h + hdr_len::AETH;
        let v4 = match len {
            44 => true,
            64 => false,
            _ => return None,
        };
        if pkt.len() != len
            || bth::Packet::new_unchecked(&pkt[h - bth::HEADER_LEN..]).opcode() != super::Opcode::RC_ACKNOWLEDGE
        {
            return None;
        }
        m[h..len].copy_from_slice(&pkt[h..len]);
        for d in ACK_DIST {
            if d < 8 || v4 {
                m[len - d] = 0;
            }
        }
        let (bth, ack_req) = Self::bth_key(&pkt[h - bth::HEADER_LEN..h]);
        let mut c = Hasher::new_with_initial(LRH_SEED);
        c.update(&m[..len]);
        Some(AckIcrc { reg: !c.finalize(), bth, ack_req, len: len as u8 })
    }

    /// The compared part of a BTH.
    #[inline(always)]
    fn bth_key(b: &[u8]) -> (u64, u8) {
        let w = u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]);
        (w & BTH_CMP, b[bth::field::ACK_REQ])
    }

    /// The ICRC of `pkt` (IP header to AETH, ICRC excluded) if it is an ACK of this flow: same length, same BTH
    /// but for the masked byte and the PSN. The caller guarantees the IP and UDP headers are the flow's but for
    /// the IPv4 identification and the masked fields (a header template writes them so). None otherwise: then use
    /// [`compute`].
    #[inline]
    pub fn compute(&self, pkt: &[u8]) -> Option<u32> {
        let pkt: &[u8; 64] = match pkt.len() {
            44 if self.len == 44 => {
                let p: &[u8; 44] = pkt.try_into().ok()?;
                return self.finish::<44>(p, ack_share::<8>(p[4]) ^ ack_share::<7>(p[5]));
            }
            64 if self.len == 64 => pkt.try_into().ok()?,
            _ => return None,
        };
        self.finish::<64>(pkt, 0)
    }

    /// The ICRC of an ACK of `N` bytes given the share of its IP identification.
    #[inline(always)]
    fn finish<const N: usize>(&self, p: &[u8; N], ident: u32) -> Option<u32> {
        let b = N - hdr_len::AETH - bth::HEADER_LEN;
        if Self::bth_key(&p[b..b + 9]) != (self.bth, self.ack_req) {
            return None;
        }
        let r = self.reg
            ^ ident
            ^ ack_share::<6>(p[N - 7])
            ^ ack_share::<5>(p[N - 6])
            ^ ack_share::<4>(p[N - 5])
            ^ ack_share::<3>(p[N - 4])
            ^ ack_share::<2>(p[N - 3])
            ^ ack_share::<1>(p[N - 2])
            ^ ack_share::<0>(p[N - 1]);
        Some(!r)
    }
}

/// Splits an IP-to-ICRC slice into covered bytes and the stored ICRC.
#[inline]
fn split(pkt: &[u8]) -> Result<(&[u8], u32), Error> {
    let at = pkt.len().checked_sub(hdr_len::ICRC).ok_or(Error::Truncated)?;
    let (body, tail) = pkt.split_at(at);
    Ok((body, u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]])))
}

/// The ICRC stored in the last 4 bytes of `pkt` (IP header to ICRC inclusive).
#[inline]
pub fn stored(pkt: &[u8]) -> Result<u32, Error> {
    split(pkt).map(|(_, v)| v)
}

/// True if the last 4 bytes of `pkt` (IP header to ICRC inclusive) hold the right ICRC.
#[inline]
pub fn verify(pkt: &[u8]) -> Result<bool, Error> {
    let (body, stored) = split(pkt)?;
    Ok(compute(body)? == stored)
}

/// Computes the ICRC of `pkt` (IP header to ICRC inclusive) and writes it into the last 4 bytes.
#[inline]
pub fn fill(pkt: &mut [u8]) -> Result<(), Error> {
    let at = pkt.len().checked_sub(hdr_len::ICRC).ok_or(Error::Truncated)?;
    let v = compute(&pkt[..at])?;
    pkt[at..].copy_from_slice(&v.to_le_bytes());
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    #[test]
    fn seed_is_the_masked_lrh() {
        assert_eq!(crc32fast::hash(&[0xff; 8]), LRH_SEED);
        assert_eq!(!LRH_SEED, 0xdebb_20e3);
    }

    /// The single pass equals plain crc32 over 8 x 0xFF + masked headers + rest (scapy's formulation).
    #[test]
    fn equals_prefix_formulation() {
        let mut pkt = [0u8; 20 + 8 + 12 + 16];
        pkt[0] = 0x45;
        for (i, b) in pkt.iter_mut().enumerate().skip(1) {
            *b = (i * 37) as u8;
        }
        let mut masked = [0u8; MAX_PSEUDO_LEN];
        let n = masked_headers(&pkt, &mut masked).unwrap();
        assert_eq!(n, 40);
        let mut h = Hasher::new();
        h.update(&[0xff; 8]);
        h.update(&masked[..n]);
        h.update(&pkt[n..]);
        assert_eq!(compute(&pkt).unwrap(), h.finalize());
        assert_eq!([1, 8, 10, 11, 26, 27, 32].map(|i| masked[i]), [0xff; 7]);
    }

    /// A xorshift32 generator from `seed` (test inputs).
    fn xorshift(mut x: u32) -> impl FnMut() -> u32 {
        move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        }
    }

    /// The straightforward ICRC (scapy's formulation): CRC-32 over 8 x 0xFF, the packet with the variant fields
    /// set to all ones (written out by hand here), the rest.
    pub(crate) fn reference(pkt: &[u8]) -> u32 {
        let mut m = pkt.to_vec();
        let ip = if m[0] >> 4 == 4 {
            for i in [1, 8, 10, 11] {
                m[i] = 0xff;
            }
            usize::from(m[0] & 0x0f) * 4
        } else {
            m[0] |= 0x0f;
            for i in [1, 2, 3, 7] {
                m[i] = 0xff;
            }
            40
        };
        for i in [ip + 6, ip + 7, ip + 12] {
            m[i] = 0xff;
        }
        let mut h = Hasher::new();
        h.update(&[0xff; 8]);
        h.update(&m);
        h.finalize()
    }

    /// `compute` (one CRC pass from a corrected register; the two-call path for IPv4 options) equals the
    /// reference for random packets of every layout (IPv4 with IHL 5..15, IPv6 with any traffic class and flow
    /// label), every length from the shortest to 300 bytes and random lengths up to 9000 (odd tails, both sides
    /// of crc32fast's kernel thresholds), random bytes in every masked field; `fill` and `verify` agree; a packet
    /// shorter than its headers is `Truncated`.
    #[test]
    fn compute_equals_the_reference_for_every_layout() {
        let mut rnd = xorshift(0x1234_5678);
        let mut lens: Vec<usize> = (0..=300).collect();
        lens.extend([1023, 1024, 1025, 2047, 2048, 2049, 4096, 4136, 4152, 4156, 8999, 9000]);
        for _ in 0..150 {
            lens.push(40 + rnd() as usize % 8961);
        }
        let firsts: Vec<u8> = (0x45..=0x4f).chain([0x60, 0x6f, 0x6a]).collect();
        let mut checked = 0;
        for &len in &lens {
            for &first in &firsts {
                let mut pkt: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
                if pkt.is_empty() {
                    assert_eq!(compute(&pkt), Err(Error::Truncated));
                    continue;
                }
                pkt[0] = first;
                let ip = if first >> 4 == 4 { usize::from(first & 0x0f) * 4 } else { 40 };
                if len < ip + 20 {
                    assert_eq!(compute(&pkt), Err(Error::Truncated), "len {len} first {first:#x}");
                    continue;
                }
                let want = reference(&pkt);
                assert_eq!(compute(&pkt), Ok(want), "len {len} first {first:#x}");
                // All ones and all zeros in the masked fields as well.
                for fill_with in [0u8, 0xff] {
                    let mut q = pkt.clone();
                    let masked: &[usize] = if first >> 4 == 4 { &[1, 8, 10, 11] } else { &[1, 2, 3, 7] };
                    for &i in masked.iter().chain(&[ip + 6, ip + 7, ip + 12]) {
                        q[i] = fill_with;
                    }
                    assert_eq!(compute(&q), Ok(reference(&q)), "len {len} first {first:#x} fields {fill_with:#x}");
                }
                let mut framed = pkt.clone();
                framed.extend([0; 4]);
                fill(&mut framed).unwrap();
                assert_eq!(stored(&framed), Ok(want));
                assert_eq!(verify(&framed), Ok(true));
                checked += 1;
            }
        }
        assert!(checked > 4000, "{checked}");
    }

    /// A span prepared as the template does (the correction XORed into the packet's first four bytes, the masked LRH
    /// before it or not) gives `compute_with_fix`'s value.
    #[test]
    fn prepared_equals_compute_with_fix() {
        let mut rnd = xorshift(0xbb67_ae85);
        for len in (4..200).chain([1016, 1024, 4136, 4152]) {
            let pkt: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
            let fix = rnd();
            let want = compute_with_fix(&pkt, fix);
            let mut span = vec![0xff; LRH_LEN];
            span.extend_from_slice(&pkt);
            let head = u32::from_le_bytes([pkt[0], pkt[1], pkt[2], pkt[3]]) ^ fix;
            span[LRH_LEN..LRH_LEN + 4].copy_from_slice(&head.to_le_bytes());
            assert_eq!(compute_prepared(&span, true), want, "len {len} with the LRH");
            assert_eq!(compute_prepared(&span[LRH_LEN..], false), want, "len {len}");
        }
    }

    /// A random Ethernet frame around an IP packet of `ip_len` bytes (header to ICRC) with a good ICRC: random MAC
    /// addresses, `ethertype`, first byte `first`, the IP length field set, random bytes elsewhere (every masked
    /// field, ECN and FECN/BECN included), `extra` bytes of Ethernet padding after the packet.
    fn frame(rnd: &mut impl FnMut() -> u32, ethertype: u16, first: u8, ip_len: usize, extra: usize) -> Vec<u8> {
        let mut f: Vec<u8> = (0..RX_L3 + ip_len + extra).map(|_| rnd() as u8).collect();
        f[12..14].copy_from_slice(&ethertype.to_be_bytes());
        f[RX_L3] = first;
        if first >> 4 == 4 {
            f[RX_L3 + 2..RX_L3 + 4].copy_from_slice(&(ip_len as u16).to_be_bytes());
        } else {
            f[RX_L3 + 4..RX_L3 + 6].copy_from_slice(&((ip_len - 40) as u16).to_be_bytes());
        }
        // Too short for the headers: no ICRC to fill (the in-place check refuses such a frame).
        let _ = fill(&mut f[RX_L3..RX_L3 + ip_len]);
        f
    }

    /// The in-place receive check ([`verify_in_place`]: the correction written over the source MAC address, the
    /// span from 8 bytes before the IP header) equals [`verify`] for IPv4 and IPv6 frames of every length from the
    /// shortest to 300 bytes (both sides of 16-byte blocks and of crc32fast's 128-byte kernel threshold) and longer
    /// ones up to 9000, with and without Ethernet padding, random bytes in every masked field (ECN CE, FECN/BECN);
    /// any single bit flipped outside the masked fields and the bytes it overwrites is rejected, and the frame's
    /// bytes are the same after every call, good ICRC or bad.
    #[test]
    fn in_place_receive_check_equals_verify() {
        let mut rnd = xorshift(0x510e_527f);
        let mut lens: Vec<usize> = (0..=300).collect();
        lens.extend([1023, 1024, 1025, 4096, 4136, 4152, 4156, 8999, 9000]);
        let mut checked = 0;
        for &ip_len in &lens {
            for (ethertype, first) in [(0x0800u16, 0x45u8), (0x86dd, 0x60), (0x86dd, 0x6b)] {
                let min = if first == 0x45 { V4_HEAD } else { V6_HEAD } + hdr_len::ICRC;
                if ip_len < min.max(if first == 0x45 { 20 } else { 40 }) {
                    // Too short for UDP + BTH + ICRC (a length field that says so): not prepared, untouched.
                    if ip_len >= if first == 0x45 { 20 } else { 40 } {
                        let mut f = frame(&mut rnd, ethertype, first, ip_len, 60);
                        let before = f.clone();
                        assert_eq!(verify_in_place(&mut f), None, "ip_len {ip_len}");
                        assert_eq!(f, before);
                    }
                    continue;
                }
                for extra in [0, 1, 7] {
                    let mut f = frame(&mut rnd, ethertype, first, ip_len, extra);
                    let before = f.clone();
                    assert_eq!(verify_in_place(&mut f), Some(true), "ip_len {ip_len} first {first:#x} extra {extra}");
                    assert_eq!(f, before, "restored");
                    // A flipped bit: rejected unless it is in a masked field or the four bytes the check overwrites
                    // (which it accepts, as `verify` does); the bytes restored either way.
                    let at = RX_START + rnd() as usize % (f.len() - RX_START);
                    let bit = 1u8 << (rnd() % 8);
                    f[at] ^= bit;
                    let flipped = f.clone();
                    let want = at < RX_START + 4 || verify(&f[RX_L3..RX_L3 + ip_len]) == Ok(true);
                    let got = verify_in_place(&mut f);
                    assert_eq!(f, flipped, "restored after a flip at {at}");
                    if !(12..RX_L3 + 6).contains(&at) {
                        // Not the EtherType, version or IP length (which change the shape or the span): the same
                        // answer as `verify`.
                        assert_eq!(got, Some(want), "ip_len {ip_len} first {first:#x} flip {bit:#x} at {at}");
                    }
                    if at >= RX_L3 + ip_len {
                        assert_eq!(got, Some(true), "Ethernet padding is not covered");
                    } else if (RX_L3 + ip_len - hdr_len::ICRC..RX_L3 + ip_len).contains(&at) {
                        assert_eq!(got, Some(false), "a flip in the ICRC");
                    }
                    checked += 1;
                }
            }
        }
        assert!(checked > 2000, "{checked}");
    }

    /// ECN-marked frames (IPv4 TOS ECN = CE, BTH FECN/BECN set; every value of the masked bytes) check as good, and
    /// the masked bytes changed after the ICRC was computed still do (they are not covered), in place as by
    /// `verify`.
    #[test]
    fn in_place_receive_check_ignores_masked_fields() {
        let mut rnd = xorshift(0x9b05_688c);
        for (ethertype, first, ip) in [(0x0800u16, 0x45u8, 20usize), (0x86dd, 0x60, 40)] {
            let mut f = frame(&mut rnd, ethertype, first, 124, 0);
            let masked: Vec<usize> = if first == 0x45 { vec![1, 8, 10, 11] } else { vec![1, 2, 3, 7] }
                .into_iter()
                .chain([ip + 6, ip + 7, ip + 12])
                .map(|i| RX_L3 + i)
                .collect();
            for v in 0..=255u8 {
                for &i in &masked {
                    f[i] = v;
                }
                if first == 0x60 {
                    f[RX_L3] = 0x60 | (v & 0x0f);
                }
                let before = f.clone();
                assert_eq!(verify_in_place(&mut f), Some(true), "first {first:#x} masked bytes {v:#x}");
                assert_eq!(f, before);
            }
            // CE in the IPv4 TOS / IPv6 traffic class and FECN + BECN in the BTH, then a payload bit: rejected.
            f[RX_L3 + 1] |= 0x03;
            f[RX_L3 + ip + 12] |= 0xc0;
            assert_eq!(verify_in_place(&mut f), Some(true));
            f[RX_L3 + ip + 40] ^= 0x10;
            assert_eq!(verify_in_place(&mut f), Some(false));
        }
    }

    /// Frames the in-place check does not take (802.1Q tag, IPv4 options, not IP, a bad version, an IP length past
    /// the frame or too short for UDP + BTH + ICRC, frames shorter than Ethernet + IP + UDP + BTH, random bytes):
    /// None, nothing written, no panic.
    #[test]
    fn in_place_receive_check_refuses_other_frames_untouched() {
        let mut rnd = xorshift(0x1f83_d9ab);
        let good = frame(&mut rnd, 0x0800, 0x45, 124, 0);
        let good6 = frame(&mut rnd, 0x86dd, 0x60, 144, 0);
        let mut cases: Vec<Vec<u8>> = Vec::new();
        for n in 0..good.len() {
            cases.push(good[..n].to_vec());
        }
        for n in 0..good6.len() {
            cases.push(good6[..n].to_vec());
        }
        let mut vlan = good.clone();
        vlan.splice(12..12, [0x81, 0x00, 0x00, 0x05]);
        cases.push(vlan);
        let mut options = good.clone();
        options[RX_L3] = 0x46;
        cases.push(options);
        for (at, v) in [(12, 0x08), (13, 0x06), (RX_L3, 0x44), (RX_L3, 0x65), (RX_L3, 0x55)] {
            let mut f = good.clone();
            f[at] = v;
            cases.push(f);
        }
        let mut f6 = good6.clone();
        f6[RX_L3] = 0x45;
        cases.push(f6);
        for len in [0u16, 1, 43, 125, 0xffff] {
            let mut f = good.clone();
            f[RX_L3 + 2..RX_L3 + 4].copy_from_slice(&len.to_be_bytes());
            cases.push(f);
        }
        for len in [0u16, 23, 105, 0xffff] {
            let mut f = good6.clone();
            f[RX_L3 + 4..RX_L3 + 6].copy_from_slice(&len.to_be_bytes());
            cases.push(f);
        }
        for _ in 0..2000 {
            let n = rnd() as usize % 200;
            cases.push((0..n).map(|_| rnd() as u8).collect());
        }
        for mut f in cases {
            let before = f.clone();
            let got = verify_in_place(&mut f);
            assert_eq!(f, before, "untouched");
            let shape_ok = f.len() >= RX_L3 + 4
                && ((f[12..14] == [0x08, 0x00] && f[RX_L3] == 0x45)
                    || (f[12..14] == [0x86, 0xdd] && f[RX_L3] >> 4 == 6));
            if !shape_ok {
                assert_eq!(got, None, "{f:02x?}");
            } else if let Some(ok) = got {
                // Taken: a length field within the frame; the same answer as `verify` over the span it gives.
                let ip_len = if f[RX_L3] == 0x45 {
                    usize::from(u16::from_be_bytes([f[RX_L3 + 2], f[RX_L3 + 3]]))
                } else {
                    40 + usize::from(u16::from_be_bytes([f[RX_L3 + 4], f[RX_L3 + 5]]))
                };
                assert_eq!(Ok(ok), verify(&f[RX_L3..RX_L3 + ip_len]));
            }
        }
        let mut g = good.clone();
        assert_eq!(verify_in_place(&mut g), Some(true));
        let mut g6 = good6.clone();
        assert_eq!(verify_in_place(&mut g6), Some(true));
    }

    /// `unstep` undoes one zero byte through the register for any register.
    #[test]
    fn unstep_inverts_a_zero_byte() {
        let mut rnd = xorshift(0x9e37_79b9);
        for _ in 0..10_000 {
            let x = rnd();
            assert_eq!(step(unstep(x), 0), x);
            assert_eq!(unstep(step(x, 0)), x);
        }
    }

    /// The streaming form (chained buffers) gives the same value however the rest is split.
    #[test]
    fn streaming_equals_compute() {
        let mut pkt: Vec<u8> = (0..700u32).map(|i| (i * 7 + 3) as u8).collect();
        pkt[0] = 0x45;
        let whole = compute(&pkt).unwrap();
        for split in [40usize, 41, 100, 128, 129, 699, 700] {
            let mut c = Icrc::new();
            let n = c.update_headers(&pkt[..split.max(40)]).unwrap();
            assert_eq!(n, 40);
            c.update(&pkt[n..split.max(n)]);
            c.update(&pkt[split.max(n)..]);
            assert_eq!(c.finish(), whole, "split {split}");
        }
    }

    /// The ACK tables give the plain CRC's value for random ACKs of random flows (IPv4 and IPv6): random
    /// identification, PSN, AETH and masked bytes; any other byte of the BTH or a different length is refused.
    #[test]
    fn ack_tables_equal_compute() {
        let mut rnd = xorshift(0x9e37_79b9);
        for flow in 0..200 {
            let v4 = flow % 2 == 0;
            let len = if v4 { 44 } else { 64 };
            let mut pkt: Vec<u8> = (0..len).map(|_| rnd() as u8).collect();
            pkt[0] = if v4 { 0x45 } else { 0x60 | (pkt[0] & 0x0f) };
            let b = len - hdr_len::AETH - bth::HEADER_LEN;
            pkt[b] = super::super::Opcode::RC_ACKNOWLEDGE.0;
            let a = AckIcrc::new(&pkt).expect("an ACK");
            assert_eq!(a.compute(&pkt), Some(compute(&pkt).unwrap()));
            let udp = len - hdr_len::AETH - bth::HEADER_LEN - udp::HEADER_LEN;
            let masked: &[usize] = if v4 { &[1, 8, 10, 11] } else { &[0, 1, 2, 3, 7] };
            for _ in 0..50 {
                let mut p = pkt.clone();
                let mut varied = vec![b + 4, b + 9, b + 10, b + 11, len - 4, len - 3, len - 2, len - 1];
                varied.extend(masked.iter().copied());
                varied.extend([udp + 6, udp + 7]);
                if v4 {
                    varied.extend([4, 5]);
                }
                for i in varied {
                    p[i] = if i == 0 { 0x60 | (rnd() as u8 & 0x0f) } else { rnd() as u8 };
                }
                assert_eq!(a.compute(&p), Some(compute(&p).unwrap()), "v4 {v4} flow {flow}");
                let mut q = p.clone();
                let i = b + [0, 1, 2, 3, 5, 6, 7, 8][rnd() as usize % 8];
                q[i] ^= 1 << (rnd() % 8);
                assert_eq!(a.compute(&q), None, "BTH byte {} changed", i - b);
                assert_eq!(a.compute(&p[..len - 1]), None);
            }
        }
        let mut write = vec![0x45u8; 60];
        write[28] = super::super::Opcode::RC_RDMA_WRITE_ONLY.0;
        assert_eq!(AckIcrc::new(&write), None);
        assert_eq!(AckIcrc::new(&write[..44]), None);
    }

    #[test]
    fn short_or_bad_input_is_an_error() {
        assert_eq!(compute(&[]), Err(Error::Truncated));
        assert_eq!(compute(&[0x45; 39]), Err(Error::Truncated));
        assert_eq!(compute(&[0x44; 64]), Err(Error::BadIpHeader));
        assert_eq!(compute(&[0x55; 64]), Err(Error::BadIpHeader));
        assert_eq!(compute(&[0x60; 59]), Err(Error::Truncated));
        assert!(compute(&[0x60; 60]).is_ok());
        assert_eq!(verify(&[0; 3]), Err(Error::Truncated));
        let mut p = [0x46u8; 70];
        fill(&mut p).unwrap();
        assert_eq!(verify(&p), Ok(true));
        p[69] ^= 1;
        assert_eq!(verify(&p), Ok(false));
    }
}
