//! The BTH opcode catalogue: one table saying, for every opcode, which extension headers follow the BTH, where they
//! sit and what class of operation it is. Every `check_*` in the engine and every parser decision consults this
//! table, in the manner of rxe's `rxe_opcode.c`, instead of long `match` statements.

use core::fmt;

/// Sizes of the headers that can follow the UDP header.
pub mod hdr_len {
    /// Base Transport Header.
    pub const BTH: usize = 12;
    /// RDMA Extended Transport Header (VA, R_Key, DMA length).
    pub const RETH: usize = 16;
    /// ACK Extended Transport Header (syndrome, MSN).
    pub const AETH: usize = 4;
    /// Atomic Extended Transport Header (VA, R_Key, swap/add, compare).
    pub const ATOMIC_ETH: usize = 28;
    /// Atomic ACK Extended Transport Header (original remote data).
    pub const ATOMIC_ACK_ETH: usize = 8;
    /// Immediate data.
    pub const IMM_DT: usize = 4;
    /// Invalidate Extended Transport Header (R_Key to invalidate).
    pub const IETH: usize = 4;
    /// Datagram Extended Transport Header (Q_Key, source QP).
    pub const DETH: usize = 8;
    /// FLUSH Extended Transport Header.
    pub const FETH: usize = 4;
    /// The 16 reserved bytes after the BTH of a CNP.
    pub const CNP_RSVD: usize = 16;
    /// Invariant CRC.
    pub const ICRC: usize = 4;
}

/// Class and header flags of an opcode (bit set in [`OpInfo::flags`]).
pub mod flags {
    /// Carries a RETH.
    pub const RETH: u32 = 1 << 0;
    /// Carries an AETH.
    pub const AETH: u32 = 1 << 1;
    /// Carries an AtomicETH.
    pub const ATOMIC_ETH: u32 = 1 << 2;
    /// Carries an AtomicAckETH.
    pub const ATOMIC_ACK_ETH: u32 = 1 << 3;
    /// Carries ImmDt.
    pub const IMM_DT: u32 = 1 << 4;
    /// Carries an IETH.
    pub const IETH: u32 = 1 << 5;
    /// Carries a DETH.
    pub const DETH: u32 = 1 << 6;
    /// Carries a FETH.
    pub const FETH: u32 = 1 << 7;
    /// Carries the CNP's 16 reserved bytes.
    pub const CNP_RSVD: u32 = 1 << 8;
    /// May carry a payload.
    pub const PAYLOAD: u32 = 1 << 9;
    /// A request (requester -> responder).
    pub const REQ: u32 = 1 << 10;
    /// A response (responder -> requester): ACK, atomic ACK or READ response.
    pub const RESP: u32 = 1 << 11;
    /// Part of a SEND.
    pub const SEND: u32 = 1 << 12;
    /// Part of an RDMA WRITE.
    pub const WRITE: u32 = 1 << 13;
    /// A READ request or READ response.
    pub const READ: u32 = 1 << 14;
    /// An atomic request or atomic ACK.
    pub const ATOMIC: u32 = 1 << 15;
    /// First packet of a message (ONLY packets have FIRST and LAST).
    pub const FIRST: u32 = 1 << 16;
    /// Middle packet of a message.
    pub const MIDDLE: u32 = 1 << 17;
    /// Last packet of a message (ONLY packets have FIRST and LAST).
    pub const LAST: u32 = 1 << 18;
    /// Consumes a receive WQE at the responder (SEND, WRITE with immediate).
    pub const RWR: u32 = 1 << 19;
    /// The plain ACK opcode (ACKNOWLEDGE).
    pub const ACK: u32 = 1 << 20;
    /// FLUSH request.
    pub const FLUSH: u32 = 1 << 21;
    /// ATOMIC_WRITE request.
    pub const ATOMIC_WRITE: u32 = 1 << 22;
    /// Reliable Connection transport.
    pub const RC: u32 = 1 << 24;
    /// Unreliable Connection transport.
    pub const UC: u32 = 1 << 25;
    /// Unreliable Datagram transport.
    pub const UD: u32 = 1 << 26;
    /// Congestion Notification Packet (RoCEv2 Annex A17).
    pub const CNP: u32 = 1 << 27;
    /// FIRST | LAST.
    pub const ONLY: u32 = FIRST | LAST;
}

use flags as f;

/// Offsets (from the start of the BTH) of the extension headers an opcode carries; 0 means absent.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HdrOffsets {
    /// DETH offset.
    pub deth: u8,
    /// FETH offset.
    pub feth: u8,
    /// RETH offset.
    pub reth: u8,
    /// AtomicETH offset.
    pub atomic_eth: u8,
    /// AETH offset.
    pub aeth: u8,
    /// AtomicAckETH offset.
    pub atomic_ack_eth: u8,
    /// ImmDt offset.
    pub imm_dt: u8,
    /// IETH offset.
    pub ieth: u8,
    /// CNP reserved bytes offset.
    pub cnp_rsvd: u8,
}

/// What the table knows about one opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo {
    /// The IBTA / rxe name, e.g. `RC_RDMA_WRITE_FIRST`.
    pub name: &'static str,
    /// [`flags`] bits.
    pub flags: u32,
    /// Length of BTH plus all extension headers (payload starts here).
    pub hdr_len: u8,
    /// Where each extension header sits.
    pub off: HdrOffsets,
}

impl OpInfo {
    /// True if every bit of `mask` is set.
    #[inline]
    pub const fn has(&self, mask: u32) -> bool {
        self.flags & mask == mask
    }
    /// True if any bit of `mask` is set.
    #[inline]
    pub const fn any(&self, mask: u32) -> bool {
        self.flags & mask != 0
    }
}

/// Lays the extension headers out in wire order after the BTH: DETH, FETH, RETH, AtomicETH, AETH, AtomicAckETH,
/// ImmDt, IETH, CNP reserved.
const fn info(name: &'static str, flags: u32) -> OpInfo {
    let mut off = HdrOffsets {
        deth: 0,
        feth: 0,
        reth: 0,
        atomic_eth: 0,
        aeth: 0,
        atomic_ack_eth: 0,
        imm_dt: 0,
        ieth: 0,
        cnp_rsvd: 0,
    };
    let mut at = hdr_len::BTH;
    if flags & f::DETH != 0 {
        off.deth = at as u8;
        at += hdr_len::DETH;
    }
    if flags & f::FETH != 0 {
        off.feth = at as u8;
        at += hdr_len::FETH;
    }
    if flags & f::RETH != 0 {
        off.reth = at as u8;
        at += hdr_len::RETH;
    }
    if flags & f::ATOMIC_ETH != 0 {
        off.atomic_eth = at as u8;
        at += hdr_len::ATOMIC_ETH;
    }
    if flags & f::AETH != 0 {
        off.aeth = at as u8;
        at += hdr_len::AETH;
    }
    if flags & f::ATOMIC_ACK_ETH != 0 {
        off.atomic_ack_eth = at as u8;
        at += hdr_len::ATOMIC_ACK_ETH;
    }
    if flags & f::IMM_DT != 0 {
        off.imm_dt = at as u8;
        at += hdr_len::IMM_DT;
    }
    if flags & f::IETH != 0 {
        off.ieth = at as u8;
        at += hdr_len::IETH;
    }
    if flags & f::CNP_RSVD != 0 {
        off.cnp_rsvd = at as u8;
        at += hdr_len::CNP_RSVD;
    }
    OpInfo { name, flags, hdr_len: at as u8, off }
}

/// A BTH opcode. Unknown values are kept (they parse as "unknown opcode" drops, never as panics).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

macro_rules! opcodes {
    ($( $(#[$doc:meta])* $name:ident = $val:expr, $flags:expr; )*) => {
        impl Opcode {
            $( $(#[$doc])* pub const $name: Opcode = Opcode($val); )*
        }
        const TABLE: [Option<OpInfo>; 256] = {
            let mut t: [Option<OpInfo>; 256] = [None; 256];
            $( t[$val as usize] = Some(info(stringify!($name), $flags)); )*
            t
        };
    };
}

const RC_SEND: u32 = f::RC | f::REQ | f::SEND | f::PAYLOAD | f::RWR;
const RC_WRITE: u32 = f::RC | f::REQ | f::WRITE | f::PAYLOAD;
const RC_READ_RESP: u32 = f::RC | f::RESP | f::READ | f::PAYLOAD;
const UC_SEND: u32 = f::UC | f::REQ | f::SEND | f::PAYLOAD | f::RWR;
const UC_WRITE: u32 = f::UC | f::REQ | f::WRITE | f::PAYLOAD;

opcodes! {
    /// RC SEND First.
    RC_SEND_FIRST = 0x00, RC_SEND | f::FIRST;
    /// RC SEND Middle.
    RC_SEND_MIDDLE = 0x01, RC_SEND | f::MIDDLE;
    /// RC SEND Last.
    RC_SEND_LAST = 0x02, RC_SEND | f::LAST;
    /// RC SEND Last with Immediate.
    RC_SEND_LAST_WITH_IMMEDIATE = 0x03, RC_SEND | f::LAST | f::IMM_DT;
    /// RC SEND Only.
    RC_SEND_ONLY = 0x04, RC_SEND | f::ONLY;
    /// RC SEND Only with Immediate.
    RC_SEND_ONLY_WITH_IMMEDIATE = 0x05, RC_SEND | f::ONLY | f::IMM_DT;
    /// RC RDMA WRITE First.
    RC_RDMA_WRITE_FIRST = 0x06, RC_WRITE | f::FIRST | f::RETH;
    /// RC RDMA WRITE Middle.
    RC_RDMA_WRITE_MIDDLE = 0x07, RC_WRITE | f::MIDDLE;
    /// RC RDMA WRITE Last.
    RC_RDMA_WRITE_LAST = 0x08, RC_WRITE | f::LAST;
    /// RC RDMA WRITE Last with Immediate (consumes a receive WQE).
    RC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x09, RC_WRITE | f::LAST | f::IMM_DT | f::RWR;
    /// RC RDMA WRITE Only.
    RC_RDMA_WRITE_ONLY = 0x0a, RC_WRITE | f::ONLY | f::RETH;
    /// RC RDMA WRITE Only with Immediate (consumes a receive WQE).
    RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x0b, RC_WRITE | f::ONLY | f::RETH | f::IMM_DT | f::RWR;
    /// RC RDMA READ Request.
    RC_RDMA_READ_REQUEST = 0x0c, f::RC | f::REQ | f::READ | f::ONLY | f::RETH;
    /// RC RDMA READ Response First.
    RC_RDMA_READ_RESPONSE_FIRST = 0x0d, RC_READ_RESP | f::FIRST | f::AETH;
    /// RC RDMA READ Response Middle (no AETH).
    RC_RDMA_READ_RESPONSE_MIDDLE = 0x0e, RC_READ_RESP | f::MIDDLE;
    /// RC RDMA READ Response Last.
    RC_RDMA_READ_RESPONSE_LAST = 0x0f, RC_READ_RESP | f::LAST | f::AETH;
    /// RC RDMA READ Response Only.
    RC_RDMA_READ_RESPONSE_ONLY = 0x10, RC_READ_RESP | f::ONLY | f::AETH;
    /// RC Acknowledge (ACK, NAK or RNR NAK by AETH syndrome).
    RC_ACKNOWLEDGE = 0x11, f::RC | f::RESP | f::ACK | f::ONLY | f::AETH;
    /// RC Atomic Acknowledge.
    RC_ATOMIC_ACKNOWLEDGE = 0x12, f::RC | f::RESP | f::ATOMIC | f::ONLY | f::AETH | f::ATOMIC_ACK_ETH;
    /// RC Compare & Swap.
    RC_COMPARE_SWAP = 0x13, f::RC | f::REQ | f::ATOMIC | f::ONLY | f::ATOMIC_ETH;
    /// RC Fetch & Add.
    RC_FETCH_ADD = 0x14, f::RC | f::REQ | f::ATOMIC | f::ONLY | f::ATOMIC_ETH;
    /// RC SEND Last with Invalidate.
    RC_SEND_LAST_WITH_INVALIDATE = 0x16, RC_SEND | f::LAST | f::IETH;
    /// RC SEND Only with Invalidate.
    RC_SEND_ONLY_WITH_INVALIDATE = 0x17, RC_SEND | f::ONLY | f::IETH;
    /// RC FLUSH (FETH + RETH, no payload).
    RC_FLUSH = 0x1c, f::RC | f::REQ | f::FLUSH | f::ONLY | f::FETH | f::RETH;
    /// RC ATOMIC WRITE (RETH + 8-byte payload).
    RC_ATOMIC_WRITE = 0x1d, f::RC | f::REQ | f::ATOMIC_WRITE | f::ONLY | f::RETH | f::PAYLOAD;

    /// UC SEND First.
    UC_SEND_FIRST = 0x20, UC_SEND | f::FIRST;
    /// UC SEND Middle.
    UC_SEND_MIDDLE = 0x21, UC_SEND | f::MIDDLE;
    /// UC SEND Last.
    UC_SEND_LAST = 0x22, UC_SEND | f::LAST;
    /// UC SEND Last with Immediate.
    UC_SEND_LAST_WITH_IMMEDIATE = 0x23, UC_SEND | f::LAST | f::IMM_DT;
    /// UC SEND Only.
    UC_SEND_ONLY = 0x24, UC_SEND | f::ONLY;
    /// UC SEND Only with Immediate.
    UC_SEND_ONLY_WITH_IMMEDIATE = 0x25, UC_SEND | f::ONLY | f::IMM_DT;
    /// UC RDMA WRITE First.
    UC_RDMA_WRITE_FIRST = 0x26, UC_WRITE | f::FIRST | f::RETH;
    /// UC RDMA WRITE Middle.
    UC_RDMA_WRITE_MIDDLE = 0x27, UC_WRITE | f::MIDDLE;
    /// UC RDMA WRITE Last.
    UC_RDMA_WRITE_LAST = 0x28, UC_WRITE | f::LAST;
    /// UC RDMA WRITE Last with Immediate.
    UC_RDMA_WRITE_LAST_WITH_IMMEDIATE = 0x29, UC_WRITE | f::LAST | f::IMM_DT | f::RWR;
    /// UC RDMA WRITE Only.
    UC_RDMA_WRITE_ONLY = 0x2a, UC_WRITE | f::ONLY | f::RETH;
    /// UC RDMA WRITE Only with Immediate.
    UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE = 0x2b, UC_WRITE | f::ONLY | f::RETH | f::IMM_DT | f::RWR;

    /// UD SEND Only.
    UD_SEND_ONLY = 0x64, f::UD | f::REQ | f::SEND | f::PAYLOAD | f::RWR | f::ONLY | f::DETH;
    /// UD SEND Only with Immediate.
    UD_SEND_ONLY_WITH_IMMEDIATE = 0x65, f::UD | f::REQ | f::SEND | f::PAYLOAD | f::RWR | f::ONLY | f::DETH | f::IMM_DT;

    /// RoCEv2 Congestion Notification Packet.
    CNP = 0x81, f::CNP | f::CNP_RSVD;
}

impl Opcode {
    /// The table entry, or `None` for an opcode this stack does not know.
    #[inline]
    pub const fn info(self) -> Option<&'static OpInfo> {
        TABLE[self.0 as usize].as_ref()
    }

    /// The name, or `UNKNOWN` for an opcode outside the table.
    pub const fn name(self) -> &'static str {
        match self.info() {
            Some(i) => i.name,
            None => "UNKNOWN",
        }
    }

    /// The flags, or 0 for an unknown opcode.
    #[inline]
    pub const fn flags(self) -> u32 {
        match self.info() {
            Some(i) => i.flags,
            None => 0,
        }
    }

    /// True if every bit of `mask` is set for this opcode.
    #[inline]
    pub const fn has(self, mask: u32) -> bool {
        mask != 0 && self.flags() & mask == mask
    }
}

impl fmt::Debug for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}({:#04x})", self.name(), self.0)
    }
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KNOWN: &[u8] = &[
        0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f, 0x10, 0x11,
        0x12, 0x13, 0x14, 0x16, 0x17, 0x1c, 0x1d, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a,
        0x2b, 0x64, 0x65, 0x81,
    ];

    #[test]
    fn walks_all_256_values() {
        let mut known = 0;
        for v in 0..=255u8 {
            let op = Opcode(v);
            match op.info() {
                Some(i) => {
                    known += 1;
                    assert!(KNOWN.contains(&v), "{v:#x} should be unknown");
                    // Exactly one transport.
                    let t = i.flags & (f::RC | f::UC | f::UD | f::CNP);
                    assert_eq!(t.count_ones(), 1, "{}", i.name);
                    // The transport bits agree with the opcode's top three bits.
                    let expect = match v >> 5 {
                        0 => f::RC,
                        1 => f::UC,
                        3 => f::UD,
                        4 => f::CNP,
                        _ => 0,
                    };
                    assert_eq!(t, expect, "{}", i.name);
                    // Requests and responses are disjoint; every non-CNP op is one of them.
                    assert!(!(i.has(f::REQ) && i.has(f::RESP)), "{}", i.name);
                    assert!(i.any(f::REQ | f::RESP | f::CNP), "{}", i.name);
                    // Position flags: ONLY, FIRST, MIDDLE or LAST, never MIDDLE with FIRST/LAST.
                    if i.any(f::MIDDLE) {
                        assert!(!i.any(f::FIRST | f::LAST), "{}", i.name);
                    }
                    // hdr_len is BTH plus the sum of the carried headers.
                    let mut len = hdr_len::BTH;
                    for (bit, l) in [
                        (f::RETH, hdr_len::RETH),
                        (f::AETH, hdr_len::AETH),
                        (f::ATOMIC_ETH, hdr_len::ATOMIC_ETH),
                        (f::ATOMIC_ACK_ETH, hdr_len::ATOMIC_ACK_ETH),
                        (f::IMM_DT, hdr_len::IMM_DT),
                        (f::IETH, hdr_len::IETH),
                        (f::DETH, hdr_len::DETH),
                        (f::FETH, hdr_len::FETH),
                        (f::CNP_RSVD, hdr_len::CNP_RSVD),
                    ] {
                        if i.has(bit) {
                            len += l;
                        }
                    }
                    assert_eq!(i.hdr_len as usize, len, "{}", i.name);
                    assert!(i.name.starts_with(["RC_", "UC_", "UD_", "CNP"][(t.trailing_zeros() - 24) as usize]));
                }
                None => {
                    assert!(!KNOWN.contains(&v), "{v:#x} missing");
                    assert_eq!(op.flags(), 0);
                    assert_eq!(op.name(), "UNKNOWN");
                }
            }
        }
        assert_eq!(known, KNOWN.len());
    }

    #[test]
    fn header_offsets_match_rxe_layout() {
        let w = Opcode::RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!((w.off.reth, w.off.imm_dt, w.hdr_len), (12, 28, 32));
        let a = Opcode::RC_ATOMIC_ACKNOWLEDGE.info().unwrap();
        assert_eq!((a.off.aeth, a.off.atomic_ack_eth, a.hdr_len), (12, 16, 24));
        let c = Opcode::RC_COMPARE_SWAP.info().unwrap();
        assert_eq!((c.off.atomic_eth, c.hdr_len), (12, 40));
        let m = Opcode::RC_RDMA_READ_RESPONSE_MIDDLE.info().unwrap();
        assert_eq!((m.off.aeth, m.hdr_len), (0, 12));
        let u = Opcode::UD_SEND_ONLY_WITH_IMMEDIATE.info().unwrap();
        assert_eq!((u.off.deth, u.off.imm_dt, u.hdr_len), (12, 20, 24));
        let n = Opcode::CNP.info().unwrap();
        assert_eq!((n.off.cnp_rsvd, n.hdr_len), (12, 28));
        assert_eq!(Opcode::RC_SEND_ONLY_WITH_INVALIDATE.info().unwrap().off.ieth, 12);
        let fl = Opcode::RC_FLUSH.info().unwrap();
        assert_eq!((fl.off.feth, fl.off.reth, fl.hdr_len), (12, 16, 32));
    }

    #[test]
    fn classes() {
        assert!(Opcode::RC_SEND_ONLY.has(f::SEND | f::FIRST | f::LAST | f::RWR));
        assert!(Opcode::RC_RDMA_WRITE_LAST_WITH_IMMEDIATE.has(f::RWR));
        assert!(!Opcode::RC_RDMA_WRITE_LAST.has(f::RWR));
        assert!(Opcode::RC_RDMA_READ_REQUEST.has(f::REQ | f::READ));
        assert!(!Opcode::RC_RDMA_READ_REQUEST.has(f::PAYLOAD));
        assert!(Opcode::RC_RDMA_READ_RESPONSE_FIRST.has(f::RESP | f::READ | f::AETH));
        assert!(!Opcode(0x15).has(f::RC));
        assert_eq!(format!("{:?}", Opcode(0x0a)), "RC_RDMA_WRITE_ONLY(0x0a)");
    }
}
