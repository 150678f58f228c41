//! The Base Transport Header (12 bytes; layout as `rxe_hdr.h` `struct rxe_bth`).
//!
//! ```text
//! 0: opcode | 1: SE M PadCnt(2) TVer(4) | 2-3: P_Key
//! 4: FECN BECN resv6 | 5-7: DestQP | 8: AckReq resv7 | 9-11: PSN
//! ```

use super::{be16, be24, opcode::hdr_len, put_be24, BthRepr, Error, Opcode, Psn, DEFAULT_PKEY};

/// Field ranges, from the start of the BTH.
pub mod field {
    use crate::wire::Field;
    /// Opcode.
    pub const OPCODE: usize = 0;
    /// SE (bit 7), MigReq (bit 6), PadCnt (bits 5-4), TVer (bits 3-0).
    pub const FLAGS: usize = 1;
    /// Partition key.
    pub const PKEY: Field = 2..4;
    /// FECN (bit 7), BECN (bit 6), 6 reserved bits. The ICRC masks this whole byte.
    pub const FECN_BECN: usize = 4;
    /// Destination QP.
    pub const DEST_QP: Field = 5..8;
    /// AckReq (bit 7), 7 reserved bits.
    pub const ACK_REQ: usize = 8;
    /// Packet sequence number.
    pub const PSN: Field = 9..12;
}

/// Length of the BTH.
pub const HEADER_LEN: usize = hdr_len::BTH;

const SE: u8 = 0x80;
const MIG: u8 = 0x40;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ACK_REQ: u8 = 0x80;

packet_view! {
    /// A read/write view of a BTH (and whatever follows it in the buffer).
    Packet
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// `Err(Truncated)` if the buffer is shorter than 12 bytes.
    #[inline]
    pub fn check_len(&self) -> Result<(), Error> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            return Err(Error::Truncated);
        }
        Ok(())
    }

    /// Opcode.
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }

    /// Solicited event.
    #[inline]
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }

    /// MigReq.
    #[inline]
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG != 0
    }

    /// Pad count.
    #[inline]
    pub fn pad(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] >> 4) & 3
    }

    /// Transport header version.
    #[inline]
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & 0x0f
    }

    /// Partition key.
    #[inline]
    pub fn pkey(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PKEY.start)
    }

    /// FECN.
    #[inline]
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & FECN != 0
    }

    /// BECN.
    #[inline]
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::FECN_BECN] & BECN != 0
    }

    /// Destination QP.
    #[inline]
    pub fn dest_qp(&self) -> u32 {
        be24(self.buffer.as_ref(), field::DEST_QP.start)
    }

    /// AckReq.
    #[inline]
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & ACK_REQ != 0
    }

    /// PSN.
    #[inline]
    pub fn psn(&self) -> Psn {
        Psn::new(be24(self.buffer.as_ref(), field::PSN.start))
    }
}

impl<'a, T: AsRef<[u8]> + ?Sized> Packet<&'a T> {
    /// Everything after the BTH (extension headers, payload, pad, ICRC).
    #[inline]
    pub fn payload(&self) -> &'a [u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the opcode.
    #[inline]
    pub fn set_opcode(&mut self, op: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = op.0;
    }

    /// Sets SE, MigReq, PadCnt and TVer (values masked to their widths).
    #[inline]
    pub fn set_flags(&mut self, solicited: bool, mig_req: bool, pad: u8, tver: u8) {
        let mut b = ((pad & 3) << 4) | (tver & 0x0f);
        if solicited {
            b |= SE;
        }
        if mig_req {
            b |= MIG;
        }
        self.buffer.as_mut()[field::FLAGS] = b;
    }

    /// Sets the partition key.
    #[inline]
    pub fn set_pkey(&mut self, v: u16) {
        self.buffer.as_mut()[field::PKEY].copy_from_slice(&v.to_be_bytes());
    }

    /// Sets FECN and BECN (reserved bits zero) and the destination QP (24 bits).
    #[inline]
    pub fn set_ecn_dest_qp(&mut self, fecn: bool, becn: bool, qp: u32) {
        let b = self.buffer.as_mut();
        b[field::FECN_BECN] = if fecn { FECN } else { 0 } | if becn { BECN } else { 0 };
        put_be24(b, field::DEST_QP.start, qp);
    }

    /// Sets AckReq (reserved bits zero) and the PSN.
    #[inline]
    pub fn set_ack_req_psn(&mut self, ack_req: bool, psn: Psn) {
        let b = self.buffer.as_mut();
        b[field::ACK_REQ] = if ack_req { ACK_REQ } else { 0 };
        put_be24(b, field::PSN.start, psn.value());
    }
}

impl BthRepr {
    /// Validates a BTH: length (`Truncated`), TVer 0 (`BadBthVersion`), opcode in the table (`UnknownOpcode`).
    /// Reserved bits are ignored.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&T>) -> Result<BthRepr, Error> {
        // One 12-byte read, then fields from the array: no per-field bounds checks on the receive path.
        Self::from_bytes(packet.buffer.as_ref().first_chunk::<HEADER_LEN>().ok_or(Error::Truncated)?)
    }

    /// [`parse`](Self::parse) of the 12 bytes of a BTH.
    #[inline(always)]
    pub(crate) fn from_bytes(b: &[u8; HEADER_LEN]) -> Result<BthRepr, Error> {
        if b[field::FLAGS] & 0x0f != 0 {
            return Err(Error::BadBthVersion);
        }
        let opcode = Opcode(b[field::OPCODE]);
        if opcode.info().is_none() {
            return Err(Error::UnknownOpcode(opcode.0));
        }
        Ok(Self::decode(b))
    }

    /// The fields of 12 BTH bytes that [`from_bytes`](Self::from_bytes) accepted (no check of its own: TVer is
    /// taken as 0).
    #[inline(always)]
    pub(crate) fn decode(b: &[u8; HEADER_LEN]) -> BthRepr {
        let flags = b[field::FLAGS];
        BthRepr {
            opcode: Opcode(b[field::OPCODE]),
            solicited: flags & SE != 0,
            mig_req: flags & MIG != 0,
            pad: (flags >> 4) & 3,
            tver: 0,
            pkey: u16::from_be_bytes([b[2], b[3]]),
            fecn: b[field::FECN_BECN] & FECN != 0,
            becn: b[field::FECN_BECN] & BECN != 0,
            dest_qp: u32::from_be_bytes([0, b[5], b[6], b[7]]),
            ack_req: b[field::ACK_REQ] & ACK_REQ != 0,
            psn: Psn::new(u32::from_be_bytes([0, b[9], b[10], b[11]])),
        }
    }

    /// Header length (12).
    #[inline]
    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes all 12 bytes (reserved bits zero; `dest_qp` masked to 24 bits). The buffer must hold 12 bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        // Built in registers and stored as one 12-byte write (the same bytes as the five setters).
        packet.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&TxBth::new(self).bytes());
    }

    /// The BTH of a RoCEv2 CNP to `dest_qp` (the QP that sent the CE-marked packets): opcode 0x81, BECN set,
    /// default P_Key, PSN 0 (as scapy's `cnp()`; ROCE-NOTES §3.3).
    pub const fn cnp(dest_qp: u32) -> BthRepr {
        BthRepr {
            opcode: Opcode::CNP,
            solicited: false,
            mig_req: false,
            pad: 0,
            tver: 0,
            pkey: DEFAULT_PKEY,
            fecn: false,
            becn: true,
            dest_qp: dest_qp & 0x00ff_ffff,
            ack_req: false,
            psn: Psn::new(0),
        }
    }
}

/// A BTH as the transmit path builds it: its wire bytes as two big-endian words (bytes 0..8, bytes 8..12). A QP
/// keeps the words of the fields that never change for it (P_Key, destination QP; the header template's
/// [`bth`](super::HeaderTemplate::bth)) and each packet sets its opcode, SE, AckReq and PSN into a copy with
/// [`with`](Self::with): a few masks and ORs, instead of a [`BthRepr`] of eleven fields copied through the
/// transmit plan and packed field by field per frame. The pad count is set by the template from the payload length.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TxBth {
    hi: u64,
    lo: u32,
}

impl TxBth {
    /// Bit of the opcode's lowest bit in `hi`.
    const OPCODE_AT: u32 = 56;
    /// SE in `hi`.
    const SE_BIT: u64 = (SE as u64) << 48;
    /// PadCnt in `hi`.
    const PAD_AT: u32 = 52;
    /// FECN and BECN in `hi`.
    const ECN_BITS: u64 = ((FECN | BECN) as u64) << 24;
    /// AckReq in `lo`.
    const ACK_REQ_BIT: u32 = (ACK_REQ as u32) << 24;

    /// The words of `repr` (reserved bits zero, `dest_qp` and the PSN masked to 24 bits, pad and TVer to their
    /// widths): the bytes [`BthRepr::emit`] writes.
    #[inline(always)]
    pub fn new(repr: &BthRepr) -> TxBth {
        let flags = (u8::from(repr.solicited) * SE)
            | (u8::from(repr.mig_req) * MIG)
            | ((repr.pad & 3) << 4)
            | (repr.tver & 0x0f);
        let ecn = (u8::from(repr.fecn) * FECN) | (u8::from(repr.becn) * BECN);
        let hi = (u64::from(repr.opcode.0) << Self::OPCODE_AT)
            | (u64::from(flags) << 48)
            | (u64::from(repr.pkey) << 32)
            | (u64::from(ecn) << 24)
            | u64::from(repr.dest_qp & 0xff_ffff);
        let lo = (u32::from(u8::from(repr.ack_req) * ACK_REQ) << 24) | (repr.psn.value() & 0xff_ffff);
        TxBth { hi, lo }
    }

    /// These words with the opcode, SE, AckReq and PSN of one packet (the other fields kept).
    #[inline(always)]
    pub fn with(self, opcode: Opcode, solicited: bool, ack_req: bool, psn: Psn) -> TxBth {
        let hi = (self.hi & !((0xff << Self::OPCODE_AT) | Self::SE_BIT))
            | (u64::from(opcode.0) << Self::OPCODE_AT)
            | (u64::from(solicited) * Self::SE_BIT);
        let lo = (self.lo & 0x7f00_0000) | (u32::from(ack_req) * Self::ACK_REQ_BIT) | (psn.value() & 0xff_ffff);
        TxBth { hi, lo }
    }

    /// [`with`](Self::with) of words whose opcode, SE, AckReq and PSN are zero (a header template's, see
    /// [`HeaderTemplate::packet_bth`](super::HeaderTemplate::packet_bth)): the fields ORed in, nothing to clear.
    #[inline(always)]
    pub(crate) fn with_cleared(self, opcode: Opcode, solicited: bool, ack_req: bool, psn: Psn) -> TxBth {
        debug_assert_eq!(self.with(Opcode(0), false, false, Psn::new(0)), self);
        let hi = self.hi | (u64::from(opcode.0) << Self::OPCODE_AT) | (u64::from(solicited) * Self::SE_BIT);
        let lo = self.lo | (u32::from(ack_req) * Self::ACK_REQ_BIT) | (psn.value() & 0xff_ffff);
        TxBth { hi, lo }
    }

    /// These words with PadCnt `pad` (masked to 2 bits).
    #[inline(always)]
    pub fn with_pad(self, pad: u8) -> TxBth {
        let hi = (self.hi & !(3 << Self::PAD_AT)) | (u64::from(pad & 3) << Self::PAD_AT);
        TxBth { hi, ..self }
    }

    /// The opcode.
    #[inline(always)]
    pub fn opcode(self) -> Opcode {
        Opcode((self.hi >> Self::OPCODE_AT) as u8)
    }

    /// AckReq.
    #[inline(always)]
    pub fn ack_req(self) -> bool {
        self.lo & Self::ACK_REQ_BIT != 0
    }

    /// FECN or BECN set.
    #[inline(always)]
    pub fn ecn_marked(self) -> bool {
        self.hi & Self::ECN_BITS != 0
    }

    /// The 12 wire bytes as little-endian words: bytes 0..8 and 8..12 (what [`bytes`](Self::bytes) gives, as
    /// values).
    #[inline(always)]
    pub fn le_words(self) -> (u64, u32) {
        (self.hi.swap_bytes(), self.lo.swap_bytes())
    }

    /// The 12 wire bytes.
    #[inline(always)]
    pub fn bytes(self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[..8].copy_from_slice(&self.hi.to_be_bytes());
        b[8..].copy_from_slice(&self.lo.to_be_bytes());
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `TxBth`: `new` packs every field as the setters do, `with` replaces the four per-packet fields whatever
    /// they held and keeps the others, `with_pad` replaces the pad; the accessors read them back.
    #[test]
    fn tx_words_are_the_setters_bytes() {
        let mut x = 0x1357_9bdfu32;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let setters = |r: &BthRepr| {
            let mut b = [0u8; HEADER_LEN];
            let mut p = Packet::new_unchecked(&mut b[..]);
            p.set_opcode(r.opcode);
            p.set_flags(r.solicited, r.mig_req, r.pad, r.tver);
            p.set_pkey(r.pkey);
            p.set_ecn_dest_qp(r.fecn, r.becn, r.dest_qp);
            p.set_ack_req_psn(r.ack_req, r.psn);
            b
        };
        let random = |rnd: &mut dyn FnMut() -> u32| {
            let v = rnd();
            BthRepr {
                opcode: Opcode(v as u8),
                solicited: v & 0x100 != 0,
                mig_req: v & 0x200 != 0,
                pad: (v >> 10) as u8,
                tver: (v >> 14) as u8,
                pkey: rnd() as u16,
                fecn: v & 0x4_0000 != 0,
                becn: v & 0x8_0000 != 0,
                dest_qp: rnd(),
                ack_req: v & 0x10_0000 != 0,
                psn: Psn::new(rnd()),
            }
        };
        for _ in 0..5000 {
            let base = random(&mut rnd);
            let w = TxBth::new(&base);
            assert_eq!(w.bytes(), setters(&base));
            let mut b = [0u8; HEADER_LEN];
            base.emit(&mut Packet::new_unchecked(&mut b[..]));
            assert_eq!(b, setters(&base));
            assert_eq!((w.opcode(), w.ack_req(), w.ecn_marked()), (base.opcode, base.ack_req, base.fecn || base.becn));
            let p = random(&mut rnd);
            let got = w.with(p.opcode, p.solicited, p.ack_req, p.psn).with_pad(p.pad);
            let want = BthRepr {
                opcode: p.opcode,
                solicited: p.solicited,
                ack_req: p.ack_req,
                psn: p.psn,
                pad: p.pad,
                ..base
            };
            assert_eq!(got.bytes(), setters(&want));
        }
    }

    /// rc_write_4k.pcap, first WRITE_FIRST: dest QP 0x2f, PSN 0xdab31a.
    static BYTES: [u8; 12] = [0x06, 0x00, 0xff, 0xff, 0x00, 0x00, 0x00, 0x2f, 0x00, 0xda, 0xb3, 0x1a];

    #[test]
    fn deconstruct_construct() {
        let p = Packet::new_checked(&BYTES[..]).unwrap();
        let r = BthRepr::parse(&p).unwrap();
        assert_eq!(r.opcode, Opcode::RC_RDMA_WRITE_FIRST);
        assert_eq!((r.dest_qp, r.psn.value(), r.pkey, r.ack_req, r.pad), (0x2f, 0xdab31a, 0xffff, false, 0));
        let mut out = [0xa5u8; 12];
        r.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, BYTES);

        let all = BthRepr {
            opcode: Opcode::RC_SEND_LAST,
            solicited: true,
            mig_req: true,
            pad: 3,
            fecn: true,
            becn: true,
            ack_req: true,
            dest_qp: 0xabcdef,
            psn: Psn::new(0xffffff),
            ..r
        };
        all.emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x02, 0xf0, 0xff, 0xff, 0xc0, 0xab, 0xcd, 0xef, 0x80, 0xff, 0xff, 0xff]);
        assert_eq!(BthRepr::parse(&Packet::new_unchecked(&out[..])), Ok(all));
    }

    #[test]
    fn rejections() {
        for n in 0..12 {
            assert_eq!(BthRepr::parse(&Packet::new_unchecked(&BYTES[..n])), Err(Error::Truncated));
        }
        let mut b = BYTES;
        b[1] = 1;
        assert_eq!(BthRepr::parse(&Packet::new_unchecked(&b[..])), Err(Error::BadBthVersion));
        b[1] = 0;
        b[0] = 0x15;
        assert_eq!(BthRepr::parse(&Packet::new_unchecked(&b[..])), Err(Error::UnknownOpcode(0x15)));
    }

    #[test]
    fn cnp_bth() {
        let mut out = [0xa5u8; 12];
        BthRepr::cnp(0x123456).emit(&mut Packet::new_unchecked(&mut out[..]));
        assert_eq!(out, [0x81, 0x00, 0xff, 0xff, 0x40, 0x12, 0x34, 0x56, 0x00, 0x00, 0x00, 0x00]);
    }
}
