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
        let mut b = [0u8; HEADER_LEN];
        b[field::OPCODE] = self.opcode.0;
        b[field::FLAGS] = (u8::from(self.solicited) * SE)
            | (u8::from(self.mig_req) * MIG)
            | ((self.pad & 3) << 4)
            | (self.tver & 0x0f);
        b[field::PKEY.start..field::PKEY.end].copy_from_slice(&self.pkey.to_be_bytes());
        let qp =
            (u32::from((u8::from(self.fecn) * FECN) | (u8::from(self.becn) * BECN)) << 24) | (self.dest_qp & 0xff_ffff);
        b[field::FECN_BECN..field::DEST_QP.end].copy_from_slice(&qp.to_be_bytes());
        let psn = (u32::from(u8::from(self.ack_req) * ACK_REQ) << 24) | (self.psn.value() & 0xff_ffff);
        b[field::ACK_REQ..field::PSN.end].copy_from_slice(&psn.to_be_bytes());
        packet.buffer.as_mut()[..HEADER_LEN].copy_from_slice(&b);
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

#[cfg(test)]
mod tests {
    use super::*;

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
