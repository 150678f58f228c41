//! The RoCEv2 invariant CRC (ROCE-NOTES §1.7; rxe `rxe_icrc.c`, scapy `BTH.compute_icrc`).
//!
//! ICRC = CRC-32 (IEEE, as zlib) over: 8 bytes of 0xFF (the masked LRH of InfiniBand), the IP header with the
//! variant fields set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit),
//! the UDP header with the checksum set to all ones, the BTH with byte 4 (FECN, BECN, reserved) set to all ones,
//! then the rest of the packet (extension headers, payload, pad). It is stored little-endian in the last 4 bytes.
//!
//! [`compute`] hashes the 8 x 0xFF prefix as zeros and 4 x 0xFF from a zero CRC register (the same value; see
//! there), so that each `update` covers a multiple of 16 bytes; the first bytes are ORed with a precomputed mask
//! into a stack buffer and hashed, then the rest of the packet in place: one pass, at most two `update` calls, no
//! allocation. The streaming [`Icrc`] folds the prefix into the initial state ([`LRH_SEED`]). (Masking in place in the packet was measured slower: byte stores right before the CRC's
//! vector loads defeat store-to-load forwarding.)
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

/// Which [`HEAD_MASKS`] entry applies to the packet starting at `pkt` (an IP header), and the length of its
/// IP + UDP + BTH. `Truncated` if `pkt` is shorter than that, `BadIpHeader` if the version is neither 4 nor 6 or
/// IHL < 5.
#[inline(always)]
fn layout(pkt: &[u8]) -> Result<(&'static [u8; HEAD_BLOCK], usize), Error> {
    let first = *pkt.first().ok_or(Error::Truncated)?;
    let (k, ip_len) = match first >> 4 {
        4 if first & 0x0f >= 5 => (usize::from(first & 0x0f) - 5, usize::from(first & 0x0f) * 4),
        6 => (11, ipv6::HEADER_LEN),
        _ => return Err(Error::BadIpHeader),
    };
    let len = ip_len + udp::HEADER_LEN + hdr_len::BTH;
    if pkt.len() < len {
        return Err(Error::Truncated);
    }
    Ok((&HEAD_MASKS[k], len))
}

/// Copies IP + UDP + BTH from the start of `pkt` into `out` with the variant fields masked, and returns how many
/// bytes they cover. `pkt` starts at the IP
/// header. `Truncated` if `pkt` is too short, `BadIpHeader` if the version is neither 4 nor 6 or IHL < 5.
#[inline]
pub fn masked_headers(pkt: &[u8], out: &mut [u8; MAX_PSEUDO_LEN]) -> Result<usize, Error> {
    mask_into(pkt, out)
}

/// [`masked_headers`] into any buffer of at least [`MAX_PSEUDO_LEN`] bytes.
#[inline(always)]
fn mask_into(pkt: &[u8], out: &mut [u8]) -> Result<usize, Error> {
    let (mask, n) = layout(pkt)?;
    for ((o, &p), &k) in out[..n].iter_mut().zip(&pkt[..n]).zip(mask) {
        *o = p | k;
    }
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

/// Bytes hashed from the stack copy in [`compute`]: the masked headers plus the bytes after them up to this size,
/// so a small packet is one CRC call and a large one starts with a block long enough for the folding path.
const HEAD_BLOCK: usize = 128;

/// OR-masks over the first [`HEAD_BLOCK`] bytes: one per IPv4 IHL (5..=15), then IPv6.
static HEAD_MASKS: [[u8; HEAD_BLOCK]; 12] = {
    let mut t = [[0u8; HEAD_BLOCK]; 12];
    let mut k = 0;
    while k < 12 {
        let ip = if k < 11 { (k + 5) * 4 } else { ipv6::HEADER_LEN };
        let m = &mut t[k];
        if k < 11 {
            m[ipv4::field::DSCP_ECN] = 0xff;
            m[ipv4::field::TTL] = 0xff;
            m[ipv4::field::CHECKSUM.start] = 0xff;
            m[ipv4::field::CHECKSUM.start + 1] = 0xff;
        } else {
            m[0] = 0x0f;
            m[1] = 0xff;
            m[2] = 0xff;
            m[3] = 0xff;
            m[ipv6::field::HOP_LIMIT] = 0xff;
        }
        m[ip + udp::field::CHECKSUM.start] = 0xff;
        m[ip + udp::field::CHECKSUM.start + 1] = 0xff;
        m[ip + udp::HEADER_LEN + bth::field::FECN_BECN] = 0xff;
        k += 1;
    }
    t
};

/// A hasher whose CRC register starts at zero (crc32fast keeps the complement of the register).
#[inline]
fn zero_register() -> Hasher {
    static PROTO: OnceLock<Hasher> = OnceLock::new();
    PROTO.get_or_init(|| Hasher::new_with_initial(!0)).clone()
}

/// Room for the zero run, the 4 x 0xFF, and a [`HEAD_BLOCK`] of masked bytes.
const STAGE: usize = 16 + 4 + HEAD_BLOCK;

/// The ICRC of `pkt`: from the start of the IP header to the end of the pad, ICRC excluded.
///
/// CRC-32 from the register 0xFFFFFFFF over 8 x 0xFF equals CRC-32 from register 0 over 4 x 0x00 then 4 x 0xFF
/// (the initial register only XORs into the first four bytes), and zero bytes leave a zero register unchanged. So
/// the masked LRH is hashed as `0^z ++ FF FF FF FF` from a zero register, with `z` (0..=15) chosen so that every
/// `update` call covers a multiple of 16 bytes: crc32fast's folding kernels then never fall back to their
/// byte-at-a-time tail. The first bytes are copied into that stack block with fixed-size (vector) copies and the
/// header part ORed with a precomputed mask, whole vectors at a time (byte stores right before the CRC's vector
/// loads would stall store-to-load forwarding), then hashed, then the rest of the packet in place.
#[inline]
pub fn compute(pkt: &[u8]) -> Result<u32, Error> {
    let (mask, hdr_end) = layout(pkt)?;
    let mut buf = [0u8; STAGE];
    // Bytes of `pkt` staged in `buf`: all of a short packet; else so many that the rest is a multiple of 16.
    let head =
        if pkt.len() >= HEAD_BLOCK { HEAD_BLOCK - 16 + ((pkt.len() - (HEAD_BLOCK - 16)) & 15) } else { pkt.len() };
    let z = (16 - ((4 + head) & 15)) & 15;
    let at = z + 4;
    buf[z..at].copy_from_slice(&[0xff; 4]);
    let stage: &mut [u8; HEAD_BLOCK] = (&mut buf[at..at + HEAD_BLOCK]).try_into().expect("HEAD_BLOCK bytes");
    if let Some(p) = pkt.first_chunk::<HEAD_BLOCK>() {
        *stage = *p;
    } else {
        // A short packet (`layout` checked it holds at least IP + UDP + BTH, i.e. 40 bytes): two overlapping
        // fixed-size copies cover it, a few vector moves instead of a `memcpy` call. Bytes past the packet are
        // not hashed.
        let n = pkt.len();
        if n >= 64 {
            copy_ends::<64>(stage, pkt);
        } else {
            copy_ends::<32>(stage, pkt);
        }
    }
    // The mask is zero past the header prefix: 40 bytes for IPv4 without options (the common case, three vector
    // ORs), at most MAX_PSEUDO_LEN (IPv4 with options, IPv6).
    or_mask::<0, 48>(stage, mask);
    if hdr_end > 48 {
        or_mask::<48, { MAX_PSEUDO_LEN - 48 }>(stage, mask);
    }
    let mut h = zero_register();
    h.update(&buf[..at + head]);
    if pkt.len() > head {
        h.update(&pkt[head..]);
    }
    Ok(h.finalize())
}

/// ORs `mask[AT..AT + N]` into `stage[AT..AT + N]` (fixed-size arrays: whole-vector operations).
#[inline(always)]
fn or_mask<const AT: usize, const N: usize>(stage: &mut [u8; HEAD_BLOCK], mask: &[u8; HEAD_BLOCK]) {
    let s: &mut [u8; N] = (&mut stage[AT..AT + N]).try_into().expect("in the block");
    let m: &[u8; N] = (&mask[AT..AT + N]).try_into().expect("in the block");
    for (s, m) in s.iter_mut().zip(m) {
        *s |= *m;
    }
}

/// Copies `src` (`N..=2N` bytes, at most `HEAD_BLOCK`) to the start of `dst` as its first and its last `N` bytes.
#[inline(always)]
fn copy_ends<const N: usize>(dst: &mut [u8; HEAD_BLOCK], src: &[u8]) {
    let n = src.len();
    if let (Some(a), Some(b)) = (src.first_chunk::<N>(), src.last_chunk::<N>()) {
        if let Some(d) = dst.first_chunk_mut::<N>() {
            *d = *a;
        }
        if let Some(d) = dst.get_mut(n - N..n).and_then(|d| d.first_chunk_mut::<N>()) {
            *d = *b;
        }
    }
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
        let mut bit = 0;
        while bit < 8 {
            let mut r = step(0, 1 << bit);
            let mut z = 1;
            while z < ACK_DIST[k] {
                r = step(r, 0);
                z += 1;
            }
            let mut v = 0;
            while v < 256 {
                if v & (1 << bit) != 0 {
                    t[k][v] ^= r;
                }
                v += 1;
            }
            bit += 1;
        }
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
mod tests {
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

    /// `compute` (table masks over a 128-byte head) equals the scapy formulation with the masks written out by
    /// hand, for IPv4 with and without options and IPv6, across the 128-byte boundary.
    #[test]
    fn head_masks_match_the_written_out_masks() {
        let mut x = 0x1234_5678u32;
        for len in [40usize, 41, 60, 61, 63, 64, 65, 80, 127, 128, 129, 300, 1100] {
            for first in [0x45u8, 0x46, 0x4f, 0x60, 0x6f] {
                let mut pkt: Vec<u8> = (0..len)
                    .map(|_| {
                        x ^= x << 13;
                        x ^= x >> 17;
                        x ^= x << 5;
                        x as u8
                    })
                    .collect();
                pkt[0] = first;
                let v4 = first >> 4 == 4;
                let ip = if v4 { usize::from(first & 0x0f) * 4 } else { 40 };
                if len < ip + 20 {
                    assert_eq!(compute(&pkt), Err(Error::Truncated));
                    continue;
                }
                let mut m = pkt.clone();
                if v4 {
                    for i in [1, 8, 10, 11] {
                        m[i] = 0xff;
                    }
                } else {
                    m[0] |= 0x0f;
                    for i in [1, 2, 3, 7] {
                        m[i] = 0xff;
                    }
                }
                for i in [ip + 6, ip + 7, ip + 12] {
                    m[i] = 0xff;
                }
                let mut h = Hasher::new();
                h.update(&[0xff; 8]);
                h.update(&m);
                assert_eq!(compute(&pkt), Ok(h.finalize()), "len {len} first {first:#x}");
            }
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
        let mut x = 0x9e37_79b9u32;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
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
