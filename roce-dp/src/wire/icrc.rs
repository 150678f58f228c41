//! The RoCEv2 invariant CRC (ROCE-NOTES §1.7; rxe `rxe_icrc.c`, scapy `BTH.compute_icrc`).
//!
//! ICRC = CRC-32 (IEEE, as zlib) over: 8 bytes of 0xFF (the masked LRH of InfiniBand), the IP header with the
//! variant fields set to all ones (IPv4: TOS, TTL, header checksum; IPv6: traffic class, flow label, hop limit),
//! the UDP header with the checksum set to all ones, the BTH with byte 4 (FECN, BECN, reserved) set to all ones,
//! then the rest of the packet (extension headers, payload, pad). It is stored little-endian in the last 4 bytes.
//!
//! The 8 x 0xFF prefix is folded into the initial state ([`LRH_SEED`]), and the masked headers are copied into one
//! stack buffer, so a packet is hashed in two `update` calls with no allocation. IPv4 options, if any, are covered
//! unmasked (rxe never sends them).

use super::{bth, ipv4, ipv6, opcode::hdr_len, udp, Error};
use crc32fast::Hasher;

/// `crc32(&[0xff; 8])`: the CRC state after the masked LRH. Its complement is rxe's seed 0xdebb20e3, which works
/// on the uncomplemented register.
pub const LRH_SEED: u32 = 0x2144_df1c;

/// The longest masked header prefix: IPv4 with 40 bytes of options, UDP, BTH.
pub const MAX_PSEUDO_LEN: usize = 60 + udp::HEADER_LEN + bth::HEADER_LEN;

/// Copies IP + UDP + BTH from the start of `pkt` into `out` with the variant fields masked, and returns how many
/// bytes it covers. `pkt` starts at the IP header. `Truncated` if `pkt` is too short, `BadIpHeader` if the version
/// is neither 4 nor 6 or IHL < 5.
#[inline]
pub fn masked_headers(pkt: &[u8], out: &mut [u8; MAX_PSEUDO_LEN]) -> Result<usize, Error> {
    let first = *pkt.first().ok_or(Error::Truncated)?;
    let ip_len = match first >> 4 {
        4 => {
            let ihl = usize::from(first & 0x0f) * 4;
            if ihl < ipv4::HEADER_LEN {
                return Err(Error::BadIpHeader);
            }
            ihl
        }
        6 => ipv6::HEADER_LEN,
        _ => return Err(Error::BadIpHeader),
    };
    let n = ip_len + udp::HEADER_LEN + hdr_len::BTH;
    if pkt.len() < n {
        return Err(Error::Truncated);
    }
    out[..n].copy_from_slice(&pkt[..n]);
    if first >> 4 == 4 {
        out[ipv4::field::DSCP_ECN] = 0xff;
        out[ipv4::field::TTL] = 0xff;
        out[ipv4::field::CHECKSUM].fill(0xff);
    } else {
        // Traffic class (low nibble of byte 0, high nibble of byte 1) and the 20-bit flow label.
        out[0] |= 0x0f;
        out[1..4].fill(0xff);
        out[ipv6::field::HOP_LIMIT] = 0xff;
    }
    out[ip_len + udp::field::CHECKSUM.start..ip_len + udp::field::CHECKSUM.end].fill(0xff);
    out[ip_len + udp::HEADER_LEN + bth::field::FECN_BECN] = 0xff;
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
        Icrc { hasher: Hasher::new_with_initial(LRH_SEED) }
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
#[inline]
pub fn compute(pkt: &[u8]) -> Result<u32, Error> {
    let mut c = Icrc::new();
    let n = c.update_headers(pkt)?;
    c.update(&pkt[n..]);
    Ok(c.finish())
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
    let (body, _) = split(pkt)?;
    let v = compute(body)?;
    let at = body.len();
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
