//! UDP headers (RFC 768). RoCEv2 sends checksum 0 (no checksum) over IPv4; the ICRC protects the payload.

use super::{be16, Error};

/// Field ranges, from the start of the header.
pub mod field {
    use crate::wire::Field;
    /// Source port.
    pub const SRC_PORT: Field = 0..2;
    /// Destination port.
    pub const DST_PORT: Field = 2..4;
    /// Length (header + payload).
    pub const LENGTH: Field = 4..6;
    /// Checksum.
    pub const CHECKSUM: Field = 6..8;
}

/// Length of a UDP header.
pub const HEADER_LEN: usize = 8;

packet_view! {
    /// A read/write view of a UDP datagram.
    Packet
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// `Truncated` if the buffer is shorter than the header or the length field; `LengthMismatch` if the length
    /// field is below 8.
    #[inline]
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(Error::Truncated);
        }
        let l = usize::from(self.len());
        if l < HEADER_LEN {
            return Err(Error::LengthMismatch);
        }
        if len < l {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Source port.
    #[inline]
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SRC_PORT.start)
    }

    /// Destination port.
    #[inline]
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DST_PORT.start)
    }

    /// Length field.
    #[inline]
    pub fn len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH.start)
    }

    /// True if the length field says there is no payload.
    #[inline]
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) <= HEADER_LEN
    }

    /// Checksum field (0 = none).
    #[inline]
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM.start)
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// The payload, as the length field says.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..usize::from(self.len())]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the source port.
    #[inline]
    pub fn set_src_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::SRC_PORT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the destination port.
    #[inline]
    pub fn set_dst_port(&mut self, v: u16) {
        self.buffer.as_mut()[field::DST_PORT].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the length field.
    #[inline]
    pub fn set_len(&mut self, v: u16) {
        self.buffer.as_mut()[field::LENGTH].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets the checksum field.
    #[inline]
    pub fn set_checksum(&mut self, v: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&v.to_be_bytes());
    }
}

/// A UDP header's ports (length and checksum are derived).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Repr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl Repr {
    /// Reads the ports of a datagram whose lengths check out.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<Repr, Error> {
        packet.check_len()?;
        Ok(Repr { src_port: packet.src_port(), dst_port: packet.dst_port() })
    }

    /// Header length.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header for a payload of `payload_len` bytes, with checksum 0 (as rxe does). `Err(Unencodable)`
    /// if the length does not fit 16 bits.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>, payload_len: usize) -> Result<(), Error> {
        let len = u16::try_from(HEADER_LEN + payload_len).map_err(|_| Error::Unencodable)?;
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len(len);
        packet.set_checksum(0);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static BYTES: [u8; 12] = [0xc8, 0xa1, 0x12, 0xb7, 0x00, 0x0c, 0x00, 0x00, 1, 2, 3, 4];

    #[test]
    fn deconstruct_construct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        assert_eq!((p.src_port(), p.dst_port(), p.len(), p.checksum()), (0xc8a1, 4791, 12, 0));
        assert_eq!(p.payload(), &[1, 2, 3, 4]);
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r, Repr { src_port: 0xc8a1, dst_port: 4791 });
        let mut out = [0xa5u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut out[..]), 4).unwrap();
        assert_eq!(out[..8], BYTES[..8]);
    }

    #[test]
    fn impossible_len() {
        for n in 0..12 {
            assert_eq!(Packet::new_checked(&BYTES[..n]).err(), Some(Error::Truncated));
        }
        let mut b = BYTES;
        b[5] = 7;
        assert_eq!(Packet::new_checked(&b[..]).err(), Some(Error::LengthMismatch));
        let r = Repr::default();
        assert_eq!(r.emit(&mut Packet::new_unchecked(&mut b[..]), 65528), Err(Error::Unencodable));
    }
}
