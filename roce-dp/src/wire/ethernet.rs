//! Ethernet II frames with an optional single 802.1Q tag (the PCP selects the PFC class).

use super::{arr, be16, Error, EthRepr, MacAddr, VlanTag};

/// Field ranges, from the start of the frame.
pub mod field {
    use crate::wire::Field;
    /// Destination MAC.
    pub const DST: Field = 0..6;
    /// Source MAC.
    pub const SRC: Field = 6..12;
    /// EtherType (or TPID 0x8100 when tagged).
    pub const ETHERTYPE: Field = 12..14;
    /// 802.1Q tag control information (PCP, DEI, VID), when tagged.
    pub const TCI: Field = 14..16;
    /// The inner EtherType, when tagged.
    pub const INNER_ETHERTYPE: Field = 16..18;
}

/// Length of an untagged Ethernet header.
pub const HEADER_LEN: usize = 14;
/// Length of an 802.1Q-tagged Ethernet header.
pub const VLAN_HEADER_LEN: usize = 18;

/// EtherType values this stack uses.
pub mod ethertype {
    /// IPv4.
    pub const IPV4: u16 = 0x0800;
    /// IPv6.
    pub const IPV6: u16 = 0x86dd;
    /// 802.1Q tag protocol identifier.
    pub const VLAN: u16 = 0x8100;
}

packet_view! {
    /// A read/write view of an Ethernet frame.
    Frame
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// `Err(Truncated)` if the buffer is shorter than the header; after `Ok`, no getter panics.
    #[inline]
    pub fn check_len(&self) -> Result<(), Error> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN || (self.ethertype() == ethertype::VLAN && len < VLAN_HEADER_LEN) {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Destination MAC.
    #[inline]
    pub fn dst_addr(&self) -> MacAddr {
        MacAddr(arr(self.buffer.as_ref(), field::DST.start))
    }

    /// Source MAC.
    #[inline]
    pub fn src_addr(&self) -> MacAddr {
        MacAddr(arr(self.buffer.as_ref(), field::SRC.start))
    }

    /// The outer EtherType (0x8100 when tagged).
    #[inline]
    pub fn ethertype(&self) -> u16 {
        be16(self.buffer.as_ref(), field::ETHERTYPE.start)
    }

    /// True when the frame carries an 802.1Q tag.
    #[inline]
    pub fn has_vlan(&self) -> bool {
        self.ethertype() == ethertype::VLAN
    }

    /// The 802.1Q tag, if any.
    #[inline]
    pub fn vlan(&self) -> Option<VlanTag> {
        if !self.has_vlan() {
            return None;
        }
        let tci = be16(self.buffer.as_ref(), field::TCI.start);
        Some(VlanTag { pcp: (tci >> 13) as u8, dei: tci & 0x1000 != 0, vid: tci & 0x0fff })
    }

    /// The EtherType of the payload (the inner one when tagged).
    #[inline]
    pub fn payload_ethertype(&self) -> u16 {
        if self.has_vlan() {
            be16(self.buffer.as_ref(), field::INNER_ETHERTYPE.start)
        } else {
            self.ethertype()
        }
    }

    /// Header length: 14, or 18 when tagged.
    #[inline]
    pub fn header_len(&self) -> usize {
        if self.has_vlan() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Frame<&'a T> {
    /// The bytes after the header.
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    /// Sets the destination MAC.
    #[inline]
    pub fn set_dst_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.0);
    }

    /// Sets the source MAC.
    #[inline]
    pub fn set_src_addr(&mut self, a: MacAddr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.0);
    }

    /// Sets the outer EtherType.
    #[inline]
    pub fn set_ethertype(&mut self, t: u16) {
        self.buffer.as_mut()[field::ETHERTYPE].copy_from_slice(&t.to_be_bytes());
    }

    /// Writes the 802.1Q TCI (the TPID is [`set_ethertype`](Self::set_ethertype)`(0x8100)`). PCP and VID are
    /// masked to their widths.
    #[inline]
    pub fn set_vlan_tci(&mut self, tag: VlanTag) {
        let tci = (u16::from(tag.pcp & 7) << 13) | (u16::from(tag.dei) << 12) | (tag.vid & 0x0fff);
        self.buffer.as_mut()[field::TCI].copy_from_slice(&tci.to_be_bytes());
    }

    /// Sets the inner EtherType of a tagged frame.
    #[inline]
    pub fn set_inner_ethertype(&mut self, t: u16) {
        self.buffer.as_mut()[field::INNER_ETHERTYPE].copy_from_slice(&t.to_be_bytes());
    }

    /// The bytes after the header, mutably.
    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let h = self.header_len();
        &mut self.buffer.as_mut()[h..]
    }
}

impl EthRepr {
    /// Reads the addresses and tag (`Err(Truncated)` if the header is incomplete).
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(frame: &Frame<&T>) -> Result<EthRepr, Error> {
        frame.check_len()?;
        Ok(EthRepr { dst: frame.dst_addr(), src: frame.src_addr(), vlan: frame.vlan() })
    }

    /// Header length: 14, or 18 with a tag.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        if self.vlan.is_some() {
            VLAN_HEADER_LEN
        } else {
            HEADER_LEN
        }
    }

    /// Writes the header with the payload EtherType `ethertype`. The buffer must hold [`buffer_len`](Self::buffer_len)
    /// bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>, ethertype: u16) {
        frame.set_dst_addr(self.dst);
        frame.set_src_addr(self.src);
        match self.vlan {
            Some(tag) => {
                frame.set_ethertype(ethertype::VLAN);
                frame.set_vlan_tci(tag);
                frame.set_inner_ethertype(ethertype);
            }
            None => frame.set_ethertype(ethertype),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static TAGGED: [u8; 18] =
        [0x52, 0x54, 0x00, 0x50, 0x00, 0x02, 0x52, 0x54, 0x00, 0x50, 0x00, 0x01, 0x81, 0x00, 0xa0, 0x64, 0x08, 0x00];

    fn repr() -> EthRepr {
        EthRepr {
            dst: MacAddr([0x52, 0x54, 0, 0x50, 0, 2]),
            src: MacAddr([0x52, 0x54, 0, 0x50, 0, 1]),
            vlan: Some(VlanTag { pcp: 5, dei: false, vid: 100 }),
        }
    }

    #[test]
    fn deconstruct_tagged() {
        let f = Frame::new_checked(&TAGGED[..]).unwrap();
        assert_eq!(f.vlan(), Some(VlanTag { pcp: 5, dei: false, vid: 100 }));
        assert_eq!(f.payload_ethertype(), ethertype::IPV4);
        assert_eq!(f.header_len(), 18);
        assert_eq!(EthRepr::parse(&f), Ok(repr()));
        assert!(f.payload().is_empty());
    }

    #[test]
    fn construct_into_a5() {
        let mut buf = [0xa5u8; 18];
        let r = repr();
        assert_eq!(r.buffer_len(), 18);
        r.emit(&mut Frame::new_unchecked(&mut buf[..]), ethertype::IPV4);
        assert_eq!(buf, TAGGED);
    }

    #[test]
    fn untagged_and_impossible_len() {
        let mut buf = [0xa5u8; 14];
        let r = EthRepr { vlan: None, ..repr() };
        r.emit(&mut Frame::new_unchecked(&mut buf[..]), ethertype::IPV6);
        let f = Frame::new_checked(&buf[..]).unwrap();
        assert_eq!((f.vlan(), f.payload_ethertype(), EthRepr::parse(&f)), (None, ethertype::IPV6, Ok(r)));
        for n in 0..18 {
            assert_eq!(Frame::new_checked(&TAGGED[..n]).err(), if n < 18 { Some(Error::Truncated) } else { None });
        }
        assert_eq!(Frame::new_checked(&buf[..13]).err(), Some(Error::Truncated));
    }
}
