//! The extension transport headers that follow the BTH: RETH, AETH, AtomicETH, AtomicAckETH, ImmDt, IETH, DETH,
//! FETH and the CNP's 16 reserved bytes (layouts as `rxe_hdr.h`; ROCE-NOTES §4.1). Which of them a packet carries,
//! and where, is decided by the opcode table ([`OpInfo`]).

use super::opcode::{flags as f, hdr_len, OpInfo};
use super::{arr, be24, be32, be64, put_be24, AethRepr, AtomicEthRepr, DethRepr, Error, ExtRepr, Field, RethRepr};

#[inline(always)]
fn get_u8(b: &[u8], at: usize) -> u8 {
    b[at]
}
#[inline(always)]
fn put_u8(b: &mut [u8], at: usize, v: u8) {
    b[at] = v;
}
#[inline(always)]
fn put_be32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
#[inline(always)]
fn put_be64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}
#[inline(always)]
fn put_arr<const N: usize>(b: &mut [u8], at: usize, v: [u8; N]) {
    b[at..at + N].copy_from_slice(&v);
}

/// Defines a fixed-size header view: the smoltcp `Packet` shape (`new_unchecked`, `new_checked`, `check_len`,
/// `into_inner`), a `Field` constant, a getter and a setter per field.
macro_rules! ext_header {
    (
        $(#[$doc:meta])* $name:ident, $len:expr,
        { $( $(#[$fdoc:meta])* $konst:ident, $get:ident, $set:ident : $ty:ty = $rd:ident / $wr:ident @ $at:literal .. $end:literal ;)* }
    ) => {
        packet_view! {
            $(#[$doc])*
            $name
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Header length.
            pub const LEN: usize = $len;
            $(
                #[doc = concat!("Byte range of the field read by [`", stringify!($get), "`](Self::", stringify!($get), ").")]
                pub const $konst: Field = $at..$end;
            )*

            /// `Err(Truncated)` if the buffer is shorter than the header; after `Ok`, no accessor panics.
            #[inline]
            pub fn check_len(&self) -> Result<(), Error> {
                if self.buffer.as_ref().len() < $len {
                    return Err(Error::Truncated);
                }
                Ok(())
            }

            $(
                $(#[$fdoc])*
                #[inline]
                pub fn $get(&self) -> $ty {
                    $rd(self.buffer.as_ref(), $at)
                }
            )*
        }

        impl<T: AsRef<[u8]> + AsMut<[u8]>> $name<T> {
            $(
                #[doc = concat!("Sets the field read by [`", stringify!($get), "`](Self::", stringify!($get), ").")]
                #[inline]
                pub fn $set(&mut self, v: $ty) {
                    $wr(self.buffer.as_mut(), $at, v)
                }
            )*
        }
    };
}

ext_header! {
    /// RDMA Extended Transport Header (16 bytes).
    RethPacket, hdr_len::RETH, {
        /// Remote virtual address.
        VA, va, set_va: u64 = be64 / put_be64 @ 0..8;
        /// Remote key.
        RKEY, rkey, set_rkey: u32 = be32 / put_be32 @ 8..12;
        /// DMA length.
        DMA_LEN, dma_len, set_dma_len: u32 = be32 / put_be32 @ 12..16;
    }
}

ext_header! {
    /// ACK Extended Transport Header (4 bytes).
    AethPacket, hdr_len::AETH, {
        /// Syndrome.
        SYNDROME, syndrome, set_syndrome: u8 = get_u8 / put_u8 @ 0..1;
        /// Message sequence number (24 bits; setter masks).
        MSN, msn, set_msn: u32 = be24 / put_be24 @ 1..4;
    }
}

ext_header! {
    /// Atomic Extended Transport Header (28 bytes).
    AtomicEthPacket, hdr_len::ATOMIC_ETH, {
        /// Remote virtual address.
        VA, va, set_va: u64 = be64 / put_be64 @ 0..8;
        /// Remote key.
        RKEY, rkey, set_rkey: u32 = be32 / put_be32 @ 8..12;
        /// Swap (CMP_SWAP) or add (FETCH_ADD) value.
        SWAP_ADD, swap_add, set_swap_add: u64 = be64 / put_be64 @ 12..20;
        /// Compare value.
        COMPARE, compare, set_compare: u64 = be64 / put_be64 @ 20..28;
    }
}

ext_header! {
    /// Atomic ACK Extended Transport Header (8 bytes).
    AtomicAckEthPacket, hdr_len::ATOMIC_ACK_ETH, {
        /// Original remote data.
        ORIG, orig, set_orig: u64 = be64 / put_be64 @ 0..8;
    }
}

ext_header! {
    /// Immediate data (4 bytes, opaque).
    ImmDtPacket, hdr_len::IMM_DT, {
        /// The immediate, as the 4 bytes read big-endian.
        IMM, imm, set_imm: u32 = be32 / put_be32 @ 0..4;
    }
}

ext_header! {
    /// Invalidate Extended Transport Header (4 bytes).
    IethPacket, hdr_len::IETH, {
        /// R_Key to invalidate.
        RKEY, rkey, set_rkey: u32 = be32 / put_be32 @ 0..4;
    }
}

ext_header! {
    /// Datagram Extended Transport Header (8 bytes; byte 4 reserved).
    DethPacket, hdr_len::DETH, {
        /// Queue key.
        QKEY, qkey, set_qkey: u32 = be32 / put_be32 @ 0..4;
        /// Reserved byte.
        RSVD, rsvd, set_rsvd: u8 = get_u8 / put_u8 @ 4..5;
        /// Source QP (24 bits; setter masks).
        SRC_QP, src_qp, set_src_qp: u32 = be24 / put_be24 @ 5..8;
    }
}

ext_header! {
    /// FLUSH Extended Transport Header (4 bytes).
    FethPacket, hdr_len::FETH, {
        /// The raw 32 bits.
        RAW, raw, set_raw: u32 = be32 / put_be32 @ 0..4;
    }
}

impl<T: AsRef<[u8]>> FethPacket<T> {
    /// Placement type (bits 3-0, as rxe's `FETH_PLT_MASK`).
    #[inline]
    pub fn placement_type(&self) -> u8 {
        (self.raw() & 0x0f) as u8
    }

    /// Selectivity level (bits 5-4, as rxe's `FETH_SEL_MASK`).
    #[inline]
    pub fn selectivity(&self) -> u8 {
        ((self.raw() >> 4) & 3) as u8
    }
}

ext_header! {
    /// The 16 reserved bytes that follow the BTH in a RoCEv2 CNP (opcode 0x81; ROCE-NOTES §3.3).
    CnpPacket, hdr_len::CNP_RSVD, {
        /// The reserved bytes (sent as zeros).
        RESERVED, reserved, set_reserved: [u8; 16] = arr / put_arr @ 0..16;
    }
}

/// Parse / emit / buffer_len for a Repr whose fields map one to one onto a header view.
macro_rules! ext_repr {
    ($repr:ident, $packet:ident, { $($field:ident : $get:ident / $set:ident),* $(,)? }) => {
        impl $repr {
            #[doc = concat!("Reads a [`", stringify!($packet), "`] (`Err(Truncated)` if short).")]
            #[inline]
            pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &$packet<&T>) -> Result<$repr, Error> {
                packet.check_len()?;
                Ok($repr { $($field: packet.$get()),* })
            }

            /// Header length.
            #[inline]
            pub const fn buffer_len(&self) -> usize {
                $packet::<&[u8]>::LEN
            }

            /// Writes the header (the buffer must hold [`buffer_len`](Self::buffer_len) bytes).
            #[inline]
            pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut $packet<T>) {
                $(packet.$set(self.$field);)*
            }
        }
    };
}

ext_repr!(RethRepr, RethPacket, { va: va / set_va, rkey: rkey / set_rkey, len: dma_len / set_dma_len });
ext_repr!(AethRepr, AethPacket, { syndrome: syndrome / set_syndrome, msn: msn / set_msn });
ext_repr!(AtomicEthRepr, AtomicEthPacket, {
    va: va / set_va, rkey: rkey / set_rkey, swap_add: swap_add / set_swap_add, compare: compare / set_compare,
});

impl DethRepr {
    /// Reads a [`DethPacket`] (`Err(Truncated)` if short); the reserved byte is ignored.
    #[inline]
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &DethPacket<&T>) -> Result<DethRepr, Error> {
        packet.check_len()?;
        Ok(DethRepr { qkey: packet.qkey(), src_qp: packet.src_qp() })
    }

    /// Header length.
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        hdr_len::DETH
    }

    /// Writes the header, reserved byte zero.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut DethPacket<T>) {
        packet.set_qkey(self.qkey);
        packet.set_rsvd(0);
        packet.set_src_qp(self.src_qp);
    }
}

/// The slice of `bth` at `off` (offset from the BTH start, as in the opcode table).
#[inline(always)]
fn at(bth: &[u8], off: u8) -> &[u8] {
    &bth[usize::from(off)..]
}

impl ExtRepr {
    /// Reads the extension headers `info` says follow the BTH. `bth` starts at the BTH; `Err(Truncated)` if it is
    /// shorter than `info.hdr_len`.
    pub fn parse(info: &OpInfo, bth: &[u8]) -> Result<ExtRepr, Error> {
        if bth.len() < usize::from(info.hdr_len) {
            return Err(Error::Truncated);
        }
        let o = &info.off;
        let mut e = ExtRepr::default();
        // Every offset + length below is within hdr_len (opcode table invariant), so nothing here can fail.
        if info.any(f::RETH) {
            e.reth = Some(RethRepr::parse(&RethPacket::new_unchecked(at(bth, o.reth)))?);
        }
        if info.any(f::AETH) {
            e.aeth = Some(AethRepr::parse(&AethPacket::new_unchecked(at(bth, o.aeth)))?);
        }
        if info.any(f::ATOMIC_ETH) {
            e.atomic_eth = Some(AtomicEthRepr::parse(&AtomicEthPacket::new_unchecked(at(bth, o.atomic_eth)))?);
        }
        if info.any(f::ATOMIC_ACK_ETH) {
            e.atomic_ack = Some(AtomicAckEthPacket::new_checked(at(bth, o.atomic_ack_eth))?.orig());
        }
        if info.any(f::IMM_DT) {
            e.imm = Some(ImmDtPacket::new_checked(at(bth, o.imm_dt))?.imm());
        }
        if info.any(f::IETH) {
            e.ieth = Some(IethPacket::new_checked(at(bth, o.ieth))?.rkey());
        }
        if info.any(f::DETH) {
            e.deth = Some(DethRepr::parse(&DethPacket::new_unchecked(at(bth, o.deth)))?);
        }
        if info.any(f::FETH) {
            e.feth = Some(FethPacket::new_checked(at(bth, o.feth))?.raw());
        }
        Ok(e)
    }

    /// Writes the extension headers `info` says follow the BTH into `bth[12..info.hdr_len]` (a required header
    /// that is `None` is written as zeros; headers the opcode does not carry are ignored). `Err(BufferTooSmall)` if
    /// `bth` is shorter than `info.hdr_len`.
    pub fn emit(&self, info: &OpInfo, bth: &mut [u8]) -> Result<(), Error> {
        let end = usize::from(info.hdr_len);
        if bth.len() < end {
            return Err(Error::BufferTooSmall);
        }
        // Zero first: covers absent headers, the DETH reserved byte and the CNP reserved bytes in one memset.
        bth[hdr_len::BTH..end].fill(0);
        let o = &info.off;
        let m = |off: u8| usize::from(off);
        if let (true, Some(r)) = (info.any(f::RETH), self.reth) {
            r.emit(&mut RethPacket::new_unchecked(&mut bth[m(o.reth)..]));
        }
        if let (true, Some(a)) = (info.any(f::AETH), self.aeth) {
            a.emit(&mut AethPacket::new_unchecked(&mut bth[m(o.aeth)..]));
        }
        if let (true, Some(a)) = (info.any(f::ATOMIC_ETH), self.atomic_eth) {
            a.emit(&mut AtomicEthPacket::new_unchecked(&mut bth[m(o.atomic_eth)..]));
        }
        if let (true, Some(v)) = (info.any(f::ATOMIC_ACK_ETH), self.atomic_ack) {
            AtomicAckEthPacket::new_unchecked(&mut bth[m(o.atomic_ack_eth)..]).set_orig(v);
        }
        if let (true, Some(v)) = (info.any(f::IMM_DT), self.imm) {
            ImmDtPacket::new_unchecked(&mut bth[m(o.imm_dt)..]).set_imm(v);
        }
        if let (true, Some(v)) = (info.any(f::IETH), self.ieth) {
            IethPacket::new_unchecked(&mut bth[m(o.ieth)..]).set_rkey(v);
        }
        if let (true, Some(d)) = (info.any(f::DETH), self.deth) {
            d.emit(&mut DethPacket::new_unchecked(&mut bth[m(o.deth)..]));
        }
        if let (true, Some(v)) = (info.any(f::FETH), self.feth) {
            FethPacket::new_unchecked(&mut bth[m(o.feth)..]).set_raw(v);
        }
        Ok(())
    }

    /// This value with only the headers `info` carries kept (what a parse of the emitted bytes returns, given
    /// that required `None` headers come back as zeros).
    pub fn normalized(&self, info: &OpInfo) -> ExtRepr {
        let keep = |bit: u32| info.any(bit);
        ExtRepr {
            reth: keep(f::RETH).then(|| self.reth.unwrap_or_default()),
            aeth: keep(f::AETH).then(|| self.aeth.unwrap_or_default()),
            atomic_eth: keep(f::ATOMIC_ETH).then(|| self.atomic_eth.unwrap_or_default()),
            atomic_ack: keep(f::ATOMIC_ACK_ETH).then(|| self.atomic_ack.unwrap_or_default()),
            imm: keep(f::IMM_DT).then(|| self.imm.unwrap_or_default()),
            ieth: keep(f::IETH).then(|| self.ieth.unwrap_or_default()),
            deth: keep(f::DETH).then(|| self.deth.unwrap_or_default()),
            feth: keep(f::FETH).then(|| self.feth.unwrap_or_default()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::Opcode;

    #[test]
    fn reth_aeth_vectors() {
        // rc_write_4k.pcap WRITE_FIRST RETH: va 0x55ca1e0eb000, rkey 0x2059, len 4096.
        let b = [0, 0, 0x55, 0xca, 0x1e, 0x0e, 0xb0, 0, 0, 0, 0x20, 0x59, 0, 0, 0x10, 0];
        let r = RethRepr::parse(&RethPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(r, RethRepr { va: 0x55ca_1e0e_b000, rkey: 0x2059, len: 4096 });
        let mut out = [0xa5u8; 16];
        r.emit(&mut RethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, b);
        let a = AethRepr::parse(&AethPacket::new_checked(&[0x60, 0, 0, 3][..]).unwrap()).unwrap();
        assert_eq!(a, AethRepr::nak(crate::wire::NakCode::PsnSeqErr, 3));
        assert_eq!(RethPacket::new_checked(&b[..15]).err(), Some(Error::Truncated));
        assert_eq!(RethPacket::<&[u8]>::DMA_LEN, 12..16);
    }

    #[test]
    fn deth_feth_cnp() {
        let b = [0x11, 0x11, 0x11, 0x11, 0xee, 0x00, 0x00, 0x12];
        let d = DethRepr::parse(&DethPacket::new_checked(&b[..]).unwrap()).unwrap();
        assert_eq!(d, DethRepr { qkey: 0x1111_1111, src_qp: 0x12 });
        let mut out = [0xa5u8; 8];
        d.emit(&mut DethPacket::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x11, 0x11, 0x11, 0x11, 0, 0, 0, 0x12]);
        let fe = FethPacket::new_checked(&[0, 0, 0, 0x21][..]).unwrap();
        assert_eq!((fe.placement_type(), fe.selectivity()), (1, 2));
        assert_eq!(CnpPacket::new_checked(&[0u8; 16][..]).unwrap().reserved(), [0; 16]);
        assert_eq!(CnpPacket::new_checked(&[0u8; 15][..]).err(), Some(Error::Truncated));
    }

    #[test]
    fn every_opcode_ext_round_trip_and_fills_every_byte() {
        let full = ExtRepr {
            reth: Some(RethRepr { va: 0x0102_0304_0506_0708, rkey: 0x0a0b_0c0d, len: 0x1000 }),
            aeth: Some(AethRepr { syndrome: 0x1f, msn: 0x00ab_cdef }),
            atomic_eth: Some(AtomicEthRepr { va: 8, rkey: 9, swap_add: 10, compare: 11 }),
            atomic_ack: Some(0xdead_beef_0000_0001),
            imm: Some(0x1234_5678),
            ieth: Some(0x8765_4321),
            deth: Some(DethRepr { qkey: 0x1111_1111, src_qp: 0x22 }),
            feth: Some(0x21),
        };
        for v in 0..=255u8 {
            let Some(info) = Opcode(v).info() else { continue };
            let n = usize::from(info.hdr_len);
            for e in [full, ExtRepr::default()] {
                let mut buf = [0xa5u8; 64];
                e.emit(info, &mut buf[..n]).unwrap();
                assert!(buf[12..n].iter().all(|&b| b != 0xa5), "{} left a byte unwritten", info.name);
                assert!(buf[n..].iter().all(|&b| b == 0xa5), "{} wrote past hdr_len", info.name);
                assert_eq!(ExtRepr::parse(info, &buf[..n]), Ok(e.normalized(info)), "{}", info.name);
                for k in 0..n {
                    assert_eq!(ExtRepr::parse(info, &buf[..k]), Err(Error::Truncated));
                }
                assert_eq!(e.emit(info, &mut buf[..n - 1]), Err(Error::BufferTooSmall));
            }
        }
    }
}
