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
