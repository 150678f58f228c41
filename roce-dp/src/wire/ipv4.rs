//! IPv4 headers (RFC 791). Options are accepted and skipped; fragments are rejected (RoCEv2 is never fragmented:
//! rxe sets DF).

use super::{arr, be16, Ecn, Error};

/// Field ranges, from the start of the header.
pub mod field {
    use crate::wire::Field;
    /// Version (high nibble) and IHL (low nibble, in 32-bit words).
    pub const VER_IHL: usize = 0;
    /// DSCP (high 6 bits) and ECN (low 2 bits): the TOS byte.
    pub const DSCP_ECN: usize = 1;
    /// Total length (header + payload).
    pub const LENGTH: Field = 2..4;
    /// Identification.
    pub const IDENT: Field = 4..6;
    /// Flags (reserved, DF, MF) and fragment offset.
    pub const FLG_OFF: Field = 6..8;
    /// Time to live.
    pub const TTL: usize = 8;
    /// Protocol.
    pub const PROTOCOL: usize = 9;
    /// Header checksum.
    pub const CHECKSUM: Field = 10..12;
    /// Source address.
    pub const SRC_ADDR: Field = 12..16;
    /// Destination address.
    pub const DST_ADDR: Field = 16..20;
}

/// Length of an IPv4 header without options.
pub const HEADER_LEN: usize = 20;
/// The UDP protocol number.
pub const PROTO_UDP: u8 = 17;

const DF: u16 = 0x4000;
const MF: u16 = 0x2000;
const FRAG_OFFSET: u16 = 0x1fff;

/// The RFC 1071 Internet checksum of `data` (even length), complemented: write it as is into the checksum field,
/// or run it over a header that already holds one and expect 0.
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    // The common header (no options) as five fixed words: no loop, no call.
    if let Some(h) = data.first_chunk::<HEADER_LEN>().filter(|_| data.len() == HEADER_LEN) {
        let w = |i: usize| u64::from(u32::from_be_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
        let mut sum = w(0) + w(4) + w(8) + w(12) + w(16);
        sum = (sum & 0xffff) + ((sum >> 16) & 0xffff) + (sum >> 32);
        sum = (sum & 0xffff) + (sum >> 16);
        sum = (sum & 0xffff) + (sum >> 16);
        return !(sum as u16);
    }
    checksum_any(data)
}

/// True if the header `h` (no options) holds a good checksum: [`checksum`] over it is 0. Summed in the
/// machine's byte order, without a byte swap per word: the one's-complement sum of the words with their bytes
/// swapped is the sum with its bytes swapped (RFC 1071 §2 (B), byte order independence), and the good sum,
/// 0xFFFF, is the same either way round.
#[inline(always)]
pub fn header_checksum_ok(h: &[u8; HEADER_LEN]) -> bool {
    let w = |i: usize| u64::from(u32::from_ne_bytes([h[i], h[i + 1], h[i + 2], h[i + 3]]));
    let mut sum = w(0) + w(4) + w(8) + w(12) + w(16);
    sum = (sum & 0xffff) + ((sum >> 16) & 0xffff) + (sum >> 32);
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum == 0xffff
}

#[inline(never)]
fn checksum_any(data: &[u8]) -> u16 {
    let mut sum: u64 = 0;
    let mut words = data.chunks_exact(4);
    for w in &mut words {
        sum += u64::from(u32::from_be_bytes([w[0], w[1], w[2], w[3]]));
    }
    for w in words.remainder().chunks(2) {
        sum += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
    }
    while sum >> 16 != 0 {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

packet_view! {
    /// A read/write view of an IPv4 packet.
    Packet
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Checks that the buffer holds the header (options included) and the total length it announces
    /// (`Truncated`), that IHL >= 5 (`BadIpHeader`) and that the total length covers the header
    /// (`LengthMismatch`). After `Ok`, no getter panics and [`payload`](Packet::payload) is in bounds.
    #[inline]
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let hl = self.header_len();
        if hl < HEADER_LEN {
            return Err(Error::BadIpHeader);
        }
        let total = usize::from(self.total_len());
        if len < hl || len < total {
            return Err(Error::Truncated);
        }
        if total < hl {
            return Err(Error::LengthMismatch);
        }
        Ok(())
    }

    /// IP version (4 for a valid packet).
    #[inline]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL x 4).
    #[inline]
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }

    /// DSCP.
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    /// ECN codepoint.
    #[inline]
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.buffer.as_ref()[field::DSCP_ECN])
    }

    /// Total length.
    #[inline]
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Identification.
    #[inline]
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), field::IDENT.start)
    }

    /// Don't-fragment flag.
    #[inline]
    pub fn dont_frag(&self) -> bool {
        be16(self.buffer.as_ref(), field::FLG_OFF.start) & DF != 0
    }

    /// More-fragments flag.
    #[inline]
    pub fn more_frags(&self) -> bool {
        be16(self.buffer.as_ref(), field::FLG_OFF.start) & MF != 0
    }

    /// Fragment offset, in 8-byte units.
    #[inline]
    pub fn frag_offset(&self) -> u16 {
        be16(self.buffer.as_ref(), field::FLG_OFF.start) & FRAG_OFFSET
    }

    /// Time to live.
    #[inline]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    /// Protocol.
    #[inline]
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }

    /// Header checksum.
    #[inline]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM.start)
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> [u8; 4] {
        arr(self.buffer.as_ref(), field::SRC_ADDR.start)
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> [u8; 4] {
        arr(self.buffer.as_ref(), field::DST_ADDR.start)
    }

    /// True if the header checksum is valid (options included).
    #[inline]
    pub fn verify_checksum(&self) -> bool {
        checksum(&self.buffer.as_ref()[..self.header_len()]) == 0
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload: from the end of the header to the total length (Ethernet padding excluded).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[self.header_len()..usize::from(self.total_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and the header length (a multiple of 4, 20..=60).
    #[inline]
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    /// Sets DSCP and ECN (the TOS byte).
    #[inline]
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: Ecn) {
        self.buffer.as_mut()[field::DSCP_ECN] = ((dscp & 0x3f) << 2) | ecn.bits();
    }

    /// Sets the total length.
    #[inline]
    pub fn set_total_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the identification.
    #[inline]
    pub fn set_ident(&mut self, v: u16) {
        self.buffer.as_mut()[field::IDENT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the flags and fragment offset to "not fragmented", with DF as given.
    #[inline]
    pub fn set_unfragmented(&mut self, dont_frag: bool) {
        let v = if dont_frag { DF } else { 0 };
        self.buffer.as_mut()[field::FLG_OFF].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the time to live.
    #[inline]
    pub fn set_ttl(&mut self, v: u8) {
        self.buffer.as_mut()[field::TTL] = v;
    }

    /// Sets the protocol.
    #[inline]
    pub fn set_protocol(&mut self, v: u8) {
        self.buffer.as_mut()[field::PROTOCOL] = v;
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a);
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: [u8; 4]) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a);
    }

    /// Computes and writes the header checksum.
    #[inline]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let c = checksum(&self.buffer.as_ref()[..self.header_len()]);
        self.set_checksum(c);
    }
}

/// A validated IPv4 header (options are not kept).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source address.
    pub src: [u8; 4],
    /// Destination address.
    pub dst: [u8; 4],
    /// DSCP.
    pub dscp: u8,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// Time to live.
    pub ttl: u8,
    /// Identification.
    pub ident: u16,
    /// Don't-fragment flag.
    pub dont_frag: bool,
    /// Protocol.
    pub protocol: u8,
    /// Payload length (total length minus header length).
    pub payload_len: usize,
}

impl Repr {
    /// Validates a packet: lengths ([`Packet::check_len`]), version 4, no fragmentation and a good header
    /// checksum (all three `BadIpHeader`; the ICRC masks the checksum, so it is the only guard of the header).
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr, Error> {
        packet.check_len()?;
        // The fixed 20 bytes read once; the fields come from the array, without a bounds check each.
        let b = packet.buffer.as_ref();
        let h = *b.first_chunk::<HEADER_LEN>().ok_or(Error::Truncated)?;
        let hl = usize::from(h[field::VER_IHL] & 0x0f) * 4;
        // Under cargo-fuzz (`cfg(fuzzing)`) the checksum is not checked, so the fuzzer reaches the layers behind it.
        let csum_ok = cfg!(fuzzing) || if hl == HEADER_LEN { checksum(&h) == 0 } else { packet.verify_checksum() };
        let flg = u16::from_be_bytes([h[6], h[7]]);
        if h[field::VER_IHL] >> 4 != 4 || flg & (MF | FRAG_OFFSET) != 0 || !csum_ok {
            return Err(Error::BadIpHeader);
        }
        let tos = h[field::DSCP_ECN];
        Ok(Repr {
            src: [h[12], h[13], h[14], h[15]],
            dst: [h[16], h[17], h[18], h[19]],
            dscp: tos >> 2,
            ecn: Ecn::from_bits(tos),
            ttl: h[field::TTL],
            ident: u16::from_be_bytes([h[4], h[5]]),
            dont_frag: flg & DF != 0,
            protocol: h[field::PROTOCOL],
            payload_len: usize::from(u16::from_be_bytes([h[2], h[3]])) - hl,
        })
    }

    /// Header length when emitted (no options).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 20-byte header, checksum included. `Err(Unencodable)` if the total length exceeds 65535.
    /// The buffer must hold [`buffer_len`](Self::buffer_len) bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<(), Error> {
        let total = u16::try_from(HEADER_LEN + self.payload_len).map_err(|_| Error::Unencodable)?;
        packet.set_version_and_header_len(HEADER_LEN);
        packet.set_dscp_ecn(self.dscp, self.ecn);
        packet.set_total_len(total);
        packet.set_ident(self.ident);
        packet.set_unfragmented(self.dont_frag);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src);
        packet.set_dst_addr(self.dst);
        packet.fill_checksum();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed 20-byte fast path equals the general loop, carries included.
    #[test]
    fn checksum_fast_path_equals_general() {
        let mut x = 0x9e37_79b9u32;
        for k in 0..2000 {
            let mut h = [0u8; HEADER_LEN];
            for b in &mut h {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = x as u8;
            }
            if k % 3 == 0 {
                h[..12].fill(0xff);
            }
            if k == 1 {
                h.fill(0xff);
            }
            assert_eq!(checksum(&h), checksum_any(&h), "{h:02x?}");
        }
    }

    /// `header_checksum_ok` (native byte order) accepts exactly the headers whose `checksum` is 0: random headers
    /// with their checksum set right (then one bit flipped, or the checksum off by one), all-zero and all-ones
    /// words, sums needing every carry.
    #[test]
    fn header_check_in_native_order_agrees_with_the_checksum() {
        let mut x = 0x2545_f491u32;
        let (mut good, mut bad) = (0, 0);
        for k in 0..20_000u32 {
            let mut h = [0u8; HEADER_LEN];
            for b in &mut h {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                *b = x as u8;
            }
            match k % 4 {
                0 => h[..18].fill(0xff),
                1 => h[..18].fill(0),
                _ => {}
            }
            if k % 2 == 0 {
                h[10..12].fill(0);
                let c = checksum(&h);
                h[10..12].copy_from_slice(&c.to_be_bytes());
                if k % 6 == 0 {
                    h[(x % 20) as usize] ^= 1 << ((x >> 8) % 8);
                } else if k % 10 == 0 {
                    h[11] = h[11].wrapping_add(1);
                }
            }
            let want = checksum(&h) == 0;
            assert_eq!(header_checksum_ok(&h), want, "{h:02x?}");
            if want {
                good += 1;
            } else {
                bad += 1;
            }
        }
        assert!(good > 5000 && bad > 5000, "{good} {bad}");
        assert!(header_checksum_ok(&HDR_WITH_CSUM));
    }

    /// [`HDR`] with its checksum.
    const HDR_WITH_CSUM: [u8; 20] = [
        0x45, 0x00, 0x00, 0x30, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x14, 0x23, 0x0a, 0x32, 0x00, 0x02, 0x0a, 0x32,
        0x00, 0x01,
    ];

    /// An rxe IPv4 header (rc_write_4k.pcap, an ACK): DF, TTL 64, UDP, checksum valid.
    static HDR: [u8; 20] = [
        0x45, 0x00, 0x00, 0x30, 0x12, 0x34, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0x0a, 0x32, 0x00, 0x02, 0x0a, 0x32,
        0x00, 0x01,
    ];

    fn repr() -> Repr {
        Repr {
            src: [10, 50, 0, 2],
            dst: [10, 50, 0, 1],
            dscp: 0,
            ecn: Ecn::NotEct,
            ttl: 64,
            ident: 0x1234,
            dont_frag: true,
            protocol: PROTO_UDP,
            payload_len: 28,
        }
    }

    fn packet_bytes() -> [u8; 48] {
        let mut b = [0u8; 48];
        b[..20].copy_from_slice(&HDR);
        let c = checksum(&b[..20]);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        b
    }

    #[test]
    fn parse_and_emit_into_a5() {
        let bytes = packet_bytes();
        let p = Packet::new_checked(&bytes[..]).unwrap();
        assert!(p.verify_checksum());
        assert_eq!(Repr::parse(&p), Ok(repr()));
        assert_eq!(p.payload().len(), 28);
        let mut out = [0xa5u8; 20];
        repr().emit(&mut Packet::new_unchecked(&mut out[..])).unwrap();
        assert_eq!(out, bytes[..20]);
    }

    #[test]
    fn rejections() {
        let good = packet_bytes();
        for n in 0..48 {
            assert_eq!(Repr::parse(&Packet::new_unchecked(&good[..n])), Err(Error::Truncated), "len {n}");
        }
        let mut b = good;
        b[6] = 0x20; // MF
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadIpHeader));
        let mut b = good;
        b[0] = 0x44; // IHL 4
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadIpHeader));
        let mut b = good;
        b[3] = 0x10; // total length 16 < header
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::LengthMismatch));
        let mut b = good;
        b[8] = 63; // TTL changed, checksum stale
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadIpHeader));
        let r = Repr { payload_len: 65516, ..repr() };
        assert_eq!(r.emit(&mut Packet::new_unchecked(&mut [0u8; 20][..])), Err(Error::Unencodable));
    }

    #[test]
    fn options_are_skipped() {
        // IHL 6: one 4-byte option (NOPs), total 24 + 4 payload.
        let mut b = [0u8; 28];
        b[..20].copy_from_slice(&HDR);
        b[0] = 0x46;
        b[3] = 28;
        b[20..24].fill(1);
        let c = checksum(&b[..24]);
        b[10..12].copy_from_slice(&c.to_be_bytes());
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!(Repr::parse(&p).unwrap().payload_len, 4);
        assert_eq!(p.payload().len(), 4);
    }
}
