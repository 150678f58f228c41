//! IPv6 headers (RFC 8200). Extension headers are not supported: RoCEv2 puts UDP right after the fixed header.

use super::{arr, be16, be32, Ecn, Error};

/// Field ranges, from the start of the header.
pub mod field {
    use crate::wire::Field;
    /// Version (4 bits), traffic class (8 bits: DSCP + ECN), flow label (20 bits).
    pub const VER_TC_FLOW: Field = 0..4;
    /// Payload length.
    pub const LENGTH: Field = 4..6;
    /// Next header.
    pub const NXT_HDR: usize = 6;
    /// Hop limit.
    pub const HOP_LIMIT: usize = 7;
    /// Source address.
    pub const SRC_ADDR: Field = 8..24;
    /// Destination address.
    pub const DST_ADDR: Field = 24..40;
}

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;

packet_view! {
    /// A read/write view of an IPv6 packet.
    Packet
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// `Err(Truncated)` unless the buffer holds the header and the payload length it announces.
    #[inline]
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || len < HEADER_LEN + usize::from(self.payload_len()) {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    #[inline]
    fn word0(&self) -> u32 {
        be32(self.buffer.as_ref(), field::VER_TC_FLOW.start)
    }

    /// IP version (6 for a valid packet).
    #[inline]
    pub fn version(&self) -> u8 {
        (self.word0() >> 28) as u8
    }

    /// Traffic class (DSCP << 2 | ECN).
    #[inline]
    pub fn traffic_class(&self) -> u8 {
        (self.word0() >> 20) as u8
    }

    /// DSCP.
    #[inline]
    pub fn dscp(&self) -> u8 {
        self.traffic_class() >> 2
    }

    /// ECN codepoint.
    #[inline]
    pub fn ecn(&self) -> Ecn {
        Ecn::from_bits(self.traffic_class())
    }

    /// Flow label (20 bits).
    #[inline]
    pub fn flow_label(&self) -> u32 {
        self.word0() & 0x000f_ffff
    }

    /// Payload length.
    #[inline]
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// Next header.
    #[inline]
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NXT_HDR]
    }

    /// Hop limit.
    #[inline]
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    /// Source address.
    #[inline]
    pub fn src_addr(&self) -> [u8; 16] {
        arr(self.buffer.as_ref(), field::SRC_ADDR.start)
    }

    /// Destination address.
    #[inline]
    pub fn dst_addr(&self) -> [u8; 16] {
        arr(self.buffer.as_ref(), field::DST_ADDR.start)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload (Ethernet padding excluded).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + usize::from(self.payload_len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 6, the traffic class and the flow label (masked to 20 bits).
    #[inline]
    pub fn set_version_tc_flow(&mut self, dscp: u8, ecn: Ecn, flow_label: u32) {
        let tc = ((dscp & 0x3f) << 2) | ecn.bits();
        let w = (6u32 << 28) | (u32::from(tc) << 20) | (flow_label & 0x000f_ffff);
        self.buffer.as_mut()[field::VER_TC_FLOW].copy_from_slice(&w.to_be_bytes());
    }

    /// Sets the payload length.
    #[inline]
    pub fn set_payload_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the next header.
    #[inline]
    pub fn set_next_header(&mut self, v: u8) {
        self.buffer.as_mut()[field::NXT_HDR] = v;
    }

    /// Sets the hop limit.
    #[inline]
    pub fn set_hop_limit(&mut self, v: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = v;
    }

    /// Sets the source address.
    #[inline]
    pub fn set_src_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::SRC_ADDR].copy_from_slice(&a);
    }

    /// Sets the destination address.
    #[inline]
    pub fn set_dst_addr(&mut self, a: [u8; 16]) {
        self.buffer.as_mut()[field::DST_ADDR].copy_from_slice(&a);
    }
}

/// A validated IPv6 header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source address.
    pub src: [u8; 16],
    /// Destination address.
    pub dst: [u8; 16],
    /// DSCP.
    pub dscp: u8,
    /// ECN codepoint.
    pub ecn: Ecn,
    /// Flow label (20 bits).
    pub flow_label: u32,
    /// Hop limit.
    pub hop_limit: u8,
    /// Next header.
    pub next_header: u8,
    /// Payload length.
    pub payload_len: usize,
}

impl Repr {
    /// Validates a packet: lengths (`Truncated`) and version 6 (`BadIpHeader`).
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr, Error> {
        packet.check_len()?;
        if packet.version() != 6 {
            return Err(Error::BadIpHeader);
        }
        Ok(Repr {
            src: packet.src_addr(),
            dst: packet.dst_addr(),
            dscp: packet.dscp(),
            ecn: packet.ecn(),
            flow_label: packet.flow_label(),
            hop_limit: packet.hop_limit(),
            next_header: packet.next_header(),
            payload_len: usize::from(packet.payload_len()),
        })
    }

    /// Header length when emitted.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 40-byte header. `Err(Unencodable)` if the payload exceeds 65535 bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) -> Result<(), Error> {
        let len = u16::try_from(self.payload_len).map_err(|_| Error::Unencodable)?;
        packet.set_version_tc_flow(self.dscp, self.ecn, self.flow_label);
        packet.set_payload_len(len);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src);
        packet.set_dst_addr(self.dst);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn repr() -> Repr {
        let mut src = [0u8; 16];
        src[..2].copy_from_slice(&[0xfe, 0x80]);
        src[15] = 1;
        Repr {
            src,
            dst: [0x20; 16],
            dscp: 26,
            ecn: Ecn::Ect0,
            flow_label: 0xabcde,
            hop_limit: 64,
            next_header: 17,
            payload_len: 8,
        }
    }

    #[test]
    fn emit_into_a5_and_parse_back() {
        let mut b = [0xa5u8; 48];
        repr().emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        assert_eq!(&b[..8], &[0x66, 0xaa, 0xbc, 0xde, 0x00, 0x08, 17, 64]);
        let p = Packet::new_checked(&b[..]).unwrap();
        assert_eq!((p.traffic_class(), p.flow_label()), ((26 << 2) | 2, 0xabcde));
        assert_eq!(Repr::parse(&p), Ok(repr()));
        assert_eq!(p.payload(), &[0xa5; 8]);
    }

    #[test]
    fn rejections() {
        let mut b = [0u8; 48];
        repr().emit(&mut Packet::new_unchecked(&mut b[..])).unwrap();
        for n in 0..48 {
            assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..n])), Err(Error::Truncated), "len {n}");
        }
        b[0] = 0x46;
        assert_eq!(Repr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadIpHeader));
        let r = Repr { payload_len: 65536, ..repr() };
        assert_eq!(r.emit(&mut Packet::new_unchecked(&mut b[..])), Err(Error::Unencodable));
    }
}
