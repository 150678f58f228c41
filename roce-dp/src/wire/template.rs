//! A per-flow header template for the transmit fast path.
//!
//! The Ethernet, IP and UDP headers of a QP's frames never change except for the lengths, the IPv4 identification
//! and the IPv4 checksum. [`HeaderTemplate`] serialises them once (when the QP connects) and [`HeaderTemplate::emit`]
//! copies them and patches those fields, instead of building every header from a `RoceRepr` per packet. The bytes
//! are exactly what [`emit_frame`](super::emit_frame) writes for the same headers (tested below).

use super::opcode::{flags as f, hdr_len, OpInfo};
use super::{crc, icrc, ipv4, ipv6, udp, BthRepr, Error, ExtRepr, IpAddrs, Opcode, Psn, RoceRepr, TxBth};

/// Longest prefix: Ethernet with an 802.1Q tag, IPv6, UDP.
const MAX_PREFIX: usize = 18 + ipv6::HEADER_LEN + udp::HEADER_LEN;

/// The stored prefix, rounded up to whole 16-byte vectors so that copying it is a few vector moves.
const STORED: usize = MAX_PREFIX.next_multiple_of(16);

/// Payloads from this many bytes are hashed as they are copied into the frame ([`PayloadCopy`]), when the CPU runs
/// [`crc`]'s kernel: below, the header and payload passes cost more than the one pass after the copy.
pub const FUSED_FROM: usize = 512;

/// How a frame's payload is copied in by the payload closure of [`HeaderTemplate::emit_with_fused`]: pieces copied with
/// [`copy`](Self::copy) one after the other from the payload's first byte are hashed for the ICRC as they are
/// copied (one pass over the bytes, [`crc::update_copy`]); anything else (a piece written
/// directly, out of order, or a payload left as it was) is hashed from the frame after the closure, as every
/// payload is when the emitter does not fuse. So a closure that ignores it still gets a right ICRC. But a byte must
/// not change once it was copied with `copy` or reported with [`written`](Self::written): the hash of it stands,
/// and a closure that writes over such a piece (then goes on in order to the payload's end) gets a wrong ICRC.
#[derive(Debug)]
pub struct PayloadCopy {
    /// The ICRC register, while every piece so far was hashed in order (None: not hashing, or given up).
    crc: Option<u32>,
    /// The register after the headers, where a pass over the payload starts if the hashing gave up.
    start: u32,
    /// The address where the next piece must start for the hashing to go on, and the bytes hashed so far.
    next: usize,
    hashed: usize,
}

impl PayloadCopy {
    /// Copies without hashing (the ICRC pass covers the payload after).
    #[inline(always)]
    pub fn plain() -> PayloadCopy {
        PayloadCopy { crc: None, start: 0, next: 0, hashed: 0 }
    }

    /// Hashing from `crc` (the register after the headers) as pieces of the payload at address `payload` are
    /// copied in.
    fn hashing(crc: u32, payload: usize) -> PayloadCopy {
        PayloadCopy { crc: Some(crc), start: crc, next: payload, hashed: 0 }
    }

    /// Copies `src` into `dst` (equal lengths; panics otherwise), a piece of the payload.
    #[inline(always)]
    pub fn copy(&mut self, dst: &mut [u8], src: &[u8]) {
        match self.crc {
            None => crate::copy::copy_bytes(dst, src),
            Some(c) => self.copy_hashing(c, dst, src),
        }
    }

    #[inline(never)]
    fn copy_hashing(&mut self, c: u32, dst: &mut [u8], src: &[u8]) {
        if dst.as_ptr() as usize == self.next {
            let v = crc::update_copy(c, src, dst);
            self.advance(dst.len(), v);
        } else {
            self.crc = None;
            crate::copy::copy_bytes(dst, src);
        }
    }

    /// `n` more bytes hashed in order, `crc` the register after them.
    #[inline]
    fn advance(&mut self, n: usize, crc: u32) {
        self.crc = Some(crc);
        self.next += n;
        self.hashed += n;
    }

    /// Whether pieces copied through it are being hashed (the emitter fuses, and nothing broke the order yet).
    pub fn is_hashing(&self) -> bool {
        self.crc.is_some()
    }

    /// For a copier that hashes as it copies by other means (out of shared memory): the register to go on from if
    /// the hashing goes on and `dst` is the next piece; then [`piece_hashed`](Self::piece_hashed) gives its result.
    #[inline]
    pub fn register_for(&self, dst: &[u8]) -> Option<u32> {
        self.crc.filter(|_| dst.as_ptr() as usize == self.next)
    }

    /// The register after the piece `dst` that a copier hashed from [`register_for`](Self::register_for)'s.
    #[inline]
    pub fn piece_hashed(&mut self, dst: &[u8], crc: u32) {
        match self.register_for(dst) {
            Some(_) => self.advance(dst.len(), crc),
            None => self.crc = None,
        }
    }

    /// A piece of the payload written by other means (from shared memory): hashed where it lies, in its turn.
    #[inline]
    pub fn written(&mut self, dst: &[u8]) {
        match self.register_for(dst) {
            Some(c) => self.advance(dst.len(), crc::update(c, dst)),
            None => self.crc = None,
        }
    }

    /// The register after the whole `payload`: the hashing's, if it covered the payload in order, else a pass over
    /// the payload where it lies now, from the register after the headers.
    fn finish(&self, payload: &[u8]) -> u32 {
        match self.crc {
            Some(c) if self.hashed == payload.len() && self.next == payload.as_ptr() as usize + payload.len() => c,
            _ => crc::update(self.start, payload),
        }
    }
}

/// Pre-serialised Ethernet + IP + UDP headers of one flow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeaderTemplate {
    bytes: [u8; STORED],
    eth_len: u8,
    ip_len: u8,
    v4: bool,
    /// IPv4: one's-complement sum of the header words with total length, identification and checksum zeroed.
    csum_partial: u32,
    /// The ICRC of the flow's ACKs by table (None if the template could not be built).
    ack_icrc: Option<icrc::AckIcrc>,
    /// The ICRC's initial-register correction for the fields it masks that the template fixes (IPv4: TOS, TTL,
    /// UDP checksum, BTH byte 4 without FECN/BECN; IPv6: all of them). The IPv4 header checksum has no share: its
    /// bytes hold the masked value (all ones, from `bytes`) during the pass and are written after it.
    icrc_fix: u32,
    /// The flow's BTH words (P_Key, destination QP; opcode, flags and PSN zero): see [`bth`](Self::bth).
    bth: TxBth,
    /// The IP header's first four bytes, little-endian (IPv4: the total length zero, set per frame).
    ip_head: u32,
    /// The 8 bytes before the IP header (the end of the Ethernet header), put back after an ICRC pass that used
    /// them for the masked LRH.
    before_ip: [u8; icrc::LRH_LEN],
}

impl HeaderTemplate {
    /// The template for the Ethernet, IP and UDP fields of `repr` (BTH, extension headers, IP identification and
    /// lengths are supplied per frame).
    pub fn new(repr: &RoceRepr) -> HeaderTemplate {
        let mut scratch = [0u8; MAX_PREFIX + hdr_len::BTH + hdr_len::AETH + hdr_len::ICRC];
        let probe =
            RoceRepr { bth: BthRepr { opcode: Opcode::RC_ACKNOWLEDGE, ..repr.bth }, ext: ExtRepr::default(), ..*repr };
        let n = super::emit_frame(&mut scratch, &probe, 0, |_| ()).unwrap_or(0);
        let eth_len = repr.eth.buffer_len();
        let (ip_len, v4) = match repr.ip.addrs {
            IpAddrs::V4 { .. } => (ipv4::HEADER_LEN, true),
            IpAddrs::V6 { .. } => (ipv6::HEADER_LEN, false),
        };
        let mut bytes = [0u8; STORED];
        let plen = eth_len + ip_len + udp::HEADER_LEN;
        if n >= plen {
            bytes[..plen].copy_from_slice(&scratch[..plen]);
        }
        let mut csum_partial = 0u32;
        if v4 {
            let h = &mut bytes[eth_len..eth_len + ip_len];
            h[ipv4::field::LENGTH].fill(0);
            h[ipv4::field::IDENT].fill(0);
            h[ipv4::field::CHECKSUM].fill(0);
            for w in h.chunks_exact(2) {
                csum_partial += u32::from(u16::from_be_bytes([w[0], w[1]]));
            }
            // The header checksum's bytes hold the ICRC's masked value (all ones) until the pass is done: the
            // checksum is stored after it, and the pass's correction has no per-frame share for it.
            h[ipv4::field::CHECKSUM].fill(0xff);
        }
        let ack_icrc = scratch.get(eth_len..n.saturating_sub(hdr_len::ICRC)).and_then(icrc::AckIcrc::new);
        let h = &bytes[eth_len..];
        let udp_csum = |at: usize| [h[at + udp::field::CHECKSUM.start], h[at + udp::field::CHECKSUM.start + 1]];
        // The checksum bytes are all ones during the pass: [0xff, 0xff] leaves their share out (each share is of
        // the complement).
        let icrc_fix = if v4 {
            icrc::v4_fix(h[ipv4::field::DSCP_ECN], h[ipv4::field::TTL], [0xff; 2], udp_csum(ipv4::HEADER_LEN), 0)
        } else {
            icrc::v6_fix([h[0], h[1], h[2], h[3]], h[ipv6::field::HOP_LIMIT], udp_csum(ipv6::HEADER_LEN), 0)
        };
        let bth = TxBth::new(&BthRepr {
            opcode: Opcode(0),
            solicited: false,
            pad: 0,
            ack_req: false,
            psn: Psn::new(0),
            ..repr.bth
        });
        let ip_head = u32::from_le_bytes([bytes[eth_len], bytes[eth_len + 1], bytes[eth_len + 2], bytes[eth_len + 3]]);
        let mut before_ip = [0u8; icrc::LRH_LEN];
        before_ip.copy_from_slice(&bytes[eth_len - icrc::LRH_LEN..eth_len]);
        HeaderTemplate {
            bytes,
            ip_head,
            before_ip,
            eth_len: eth_len as u8,
            ip_len: ip_len as u8,
            v4,
            csum_partial,
            ack_icrc,
            icrc_fix,
            bth,
        }
    }

    /// The BTH words of the flow (`repr.bth`'s P_Key, MigReq, TVer, FECN, BECN and destination QP), for a packet to
    /// set its opcode, SE, AckReq and PSN into ([`TxBth::with`]).
    #[inline(always)]
    pub fn bth(&self) -> TxBth {
        self.bth
    }

    /// The BTH words of one packet of the flow: [`bth`](Self::bth)`.with(opcode, solicited, ack_req, psn)`, the
    /// fields ORed into the template's words (built with them zero).
    #[inline(always)]
    pub fn packet_bth(&self, opcode: Opcode, solicited: bool, ack_req: bool, psn: Psn) -> TxBth {
        self.bth.with_cleared(opcode, solicited, ack_req, psn)
    }

    /// Bytes of Ethernet + IP + UDP.
    #[inline]
    pub fn prefix_len(&self) -> usize {
        usize::from(self.eth_len) + usize::from(self.ip_len) + udp::HEADER_LEN
    }

    /// Total frame length for `opcode` and a payload of `payload_len` bytes (pad and ICRC included).
    #[inline]
    pub fn frame_len(&self, opcode: Opcode, payload_len: usize) -> usize {
        let hdr = opcode.info().map_or(hdr_len::BTH, |i| usize::from(i.hdr_len));
        self.prefix_len() + hdr + payload_len + (payload_len.wrapping_neg() & 3) + hdr_len::ICRC
    }

    /// Writes a whole frame into `buf[..n]` and returns `n`: the template's headers with lengths, `ident` (IPv4)
    /// and the IPv4 checksum patched, then BTH (pad computed), extension headers, the payload from `fill`, pad and
    /// ICRC — the same bytes as `emit_frame` for the same headers. Same errors as `emit_frame`.
    #[inline]
    pub fn emit(
        &self,
        buf: &mut [u8],
        bth: &BthRepr,
        ext: &ExtRepr,
        payload_len: usize,
        ident: u16,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, Error> {
        self.emit_with(buf, TxBth::new(bth), payload_len, ident, |info, tp| ext.emit(info, tp), fill)
    }

    /// [`emit`](Self::emit) with the BTH as its words (the pad count is set here) and the extension headers written
    /// by `ext(info, bth_and_ext)` (the opcode's table entry and the bytes from the BTH to the payload, the BTH
    /// already written) instead of from an [`ExtRepr`]. `ext` writes only after the BTH's 12 bytes: the ICRC may be
    /// computed from the BTH words given here, not from the bytes (`emit_with_fused`).
    #[inline]
    pub fn emit_with(
        &self,
        buf: &mut [u8],
        bth: TxBth,
        payload_len: usize,
        ident: u16,
        ext: impl FnOnce(&OpInfo, &mut [u8]) -> Result<(), Error>,
        fill: impl FnOnce(&mut [u8]),
    ) -> Result<usize, Error> {
        let h = self.headers(buf, bth, payload_len, ident, ext)?;
        fill(&mut buf[h.hdr_end..h.hdr_end + payload_len]);
        self.finish(buf, &h)
    }

    /// [`emit_with`](Self::emit_with) for a payload that `fill(payload, copy)` copies in through `copy`: where the
    /// frame is prepared for the ICRC pass and the CPU runs [`crc`]'s kernel, the pieces it copies with
    /// [`PayloadCopy::copy`] are hashed as they are copied, after the headers' CRC (one pass over the payload's
    /// bytes instead of a copy then a CRC; the headers of an IPv4 frame with a BTH alone or a RETH hashed from the
    /// template's words and the packet's fields, see `head_crc`, so `ext` must not write over the BTH, as for
    /// `emit_with`); else as `emit_with`. For long payloads ([`FUSED_FROM`]): out of line.
    #[inline(never)]
    pub fn emit_with_fused(
        &self,
        buf: &mut [u8],
        bth: TxBth,
        payload_len: usize,
        ident: u16,
        ext: impl FnOnce(&OpInfo, &mut [u8]) -> Result<(), Error>,
        fill: impl FnOnce(&mut [u8], &mut PayloadCopy),
    ) -> Result<usize, Error> {
        let h = self.headers(buf, bth, payload_len, ident, ext)?;
        if !h.prepared || !crc::kernel_available() {
            fill(&mut buf[h.hdr_end..h.hdr_end + payload_len], &mut PayloadCopy::plain());
            return self.finish(buf, &h);
        }
        // The headers' pass, with the masked LRH in front (in the 8 bytes before the IP header) when that makes
        // them whole 16-byte blocks (`crc::update_short` then has no partial block to move: one multiplication
        // less; crc32fast, on CPUs without this path's features, hashes whole blocks faster too).
        let eth_len = usize::from(self.eth_len);
        let lrh = (h.hdr_end - eth_len) % 16 == 16 - icrc::LRH_LEN;
        // `head_crc` has the masked LRH as a value; only the pass over the stored bytes needs it in the frame.
        let head = match self.head_crc(buf, &h) {
            Some(v) => v,
            None => {
                let start = if lrh { eth_len - icrc::LRH_LEN } else { eth_len };
                if lrh {
                    buf[start..eth_len].copy_from_slice(&[0xff; icrc::LRH_LEN]);
                }
                icrc::compute_prepared(&buf[start..h.hdr_end], lrh)
            }
        };
        let (payload, tail) = buf[h.hdr_end..].split_at_mut(payload_len);
        let mut copy = PayloadCopy::hashing(head, payload.as_ptr() as usize);
        fill(payload, &mut copy);
        let crc = copy.finish(payload);
        // Pad and ICRC as one 4-byte store of zeros at the pad (the ICRC is written over it below).
        tail[..hdr_len::ICRC].fill(0);
        let pad = h.n - h.hdr_end - payload_len - hdr_len::ICRC;
        let v = if pad > 0 { crc::update(crc, &tail[..pad]) } else { crc };
        buf[eth_len..eth_len + 4].copy_from_slice(&h.first4.to_le_bytes());
        buf[eth_len - icrc::LRH_LEN..eth_len].copy_from_slice(&self.before_ip);
        Ok(self.seal(buf, &h, v))
    }

    /// The frame's headers up to the payload, `h.hdr_end` (see [`Headers`]).
    #[inline(always)]
    fn headers(
        &self,
        buf: &mut [u8],
        bth: TxBth,
        payload_len: usize,
        ident: u16,
        ext: impl FnOnce(&OpInfo, &mut [u8]) -> Result<(), Error>,
    ) -> Result<Headers, Error> {
        let opcode = bth.opcode();
        let info = opcode.info().ok_or(Error::UnknownOpcode(opcode.0))?;
        if payload_len > 0 && !info.any(f::PAYLOAD) {
            return Err(Error::Unencodable);
        }
        let hdr = usize::from(info.hdr_len);
        let pad = payload_len.wrapping_neg() & 3;
        let prefix = self.prefix_len();
        let n = prefix + hdr + payload_len + pad + hdr_len::ICRC;
        let (eth_len, ip_len) = (usize::from(self.eth_len), usize::from(self.ip_len));
        let l4_len = n - eth_len - ip_len;
        if n - eth_len > 0xffff {
            return Err(Error::Unencodable);
        }
        let buf = buf.get_mut(..n).ok_or(Error::BufferTooSmall)?;
        // A fixed-size copy (a few vector moves, no memcpy call) when the frame is that long: the bytes past the
        // prefix are all written again below.
        match buf.first_chunk_mut::<STORED>() {
            Some(head) => *head = self.bytes,
            None => copy_prefix(buf, &self.bytes[..prefix]),
        }
        let fix = self.icrc_fix;
        // The ICRC pass with the template's correction (not an ACK the table gives, nor a frame with FECN/BECN,
        // which the correction leaves out) is prepared as the headers are written, so that the CRC's loads find
        // these stores done: the correction XORed into the IP header's first four bytes, and for a packet 8 bytes
        // short of whole 16-byte blocks the masked LRH in the 8 bytes before it (`icrc::compute_prepared`). Both
        // are put back after the pass.
        // Only the flag here: the table stays in the template until an ACK's pass reads it.
        let ack = opcode == Opcode::RC_ACKNOWLEDGE && self.ack_icrc.is_some();
        let prepared = !ack && !bth.ecn_marked();
        // (n - eth_len - ICRC) % 16 == 8, with n - eth_len the covered bytes plus the ICRC.
        let with_lrh = prepared && (n - eth_len) % 16 == (16 - icrc::LRH_LEN + hdr_len::ICRC) % 16;
        let first4: u32;
        let mut csum = [0xff; 2];
        {
            let ip = &mut buf[eth_len..eth_len + ip_len];
            if self.v4 {
                let total = (n - eth_len) as u16;
                first4 = self.ip_head | u32::from(total.swap_bytes()) << 16;
                ip[ipv4::field::IDENT].copy_from_slice(&ident.to_be_bytes());
                let mut sum = self.csum_partial + u32::from(total) + u32::from(ident);
                sum = (sum & 0xffff) + (sum >> 16);
                sum = (sum & 0xffff) + (sum >> 16);
                csum = (!(sum as u16)).to_be_bytes();
            } else {
                first4 = self.ip_head;
                ip[ipv6::field::LENGTH].copy_from_slice(&(l4_len as u16).to_be_bytes());
            }
            let head = if prepared { first4 ^ fix } else { first4 };
            ip[..4].copy_from_slice(&head.to_le_bytes());
        }
        if with_lrh {
            buf[eth_len - icrc::LRH_LEN..eth_len].copy_from_slice(&[0xff; icrc::LRH_LEN]);
        }
        let l4 = eth_len + ip_len;
        buf[l4 + udp::field::LENGTH.start..l4 + udp::field::LENGTH.end].copy_from_slice(&(l4_len as u16).to_be_bytes());
        let tp = &mut buf[prefix..];
        let bth = bth.with_pad(pad as u8);
        tp[..hdr_len::BTH].copy_from_slice(&bth.bytes());
        ext(info, &mut tp[..hdr])?;
        let hdr_end = prefix + hdr;
        Ok(Headers {
            n,
            ident,
            l4_len: l4_len as u16,
            bth,
            hdr_end,
            pay_end: hdr_end + payload_len,
            first4,
            csum,
            prepared,
            with_lrh,
            ack,
            ecn_marked: bth.ecn_marked(),
        })
    }

    /// The ICRC register after the covered headers of a prepared IPv4 frame with the masked LRH in front (its BTH
    /// alone or with a RETH: 48 or 64 bytes from 8 bytes before the IP header), as [`icrc::compute_prepared`] of
    /// those bytes gives it, but without reading the bytes [`headers`](Self::headers) has just stored: the words
    /// are built from the template and the packet's fields (the BTH from `h.bth`, so an `ext` closure must not write
    /// over the BTH), and the RETH's read back as one 8-byte and two 4-byte loads, each within one store of its
    /// writer (the engine's `TxExt` stores the RETH as one 16-byte copy, `ExtRepr::emit` as 8, 4 and 4 bytes), so
    /// each is served by that store. A load of bytes that several earlier stores
    /// wrote cannot take them from those stores: it waits until they, and every store before them (the previous
    /// frame's payload copy included), have reached the cache. On the Emerald Rapids machine of session 22 this gave
    /// a 4 KiB WRITE +2-4% (64 KiB and 64 B unchanged: bench/RESULTS.md). None for other frames (IPv6, other
    /// extension headers, a frame not prepared): they take the pass over the stored bytes.
    #[inline(always)]
    fn head_crc(&self, buf: &[u8], h: &Headers) -> Option<u32> {
        let eth = usize::from(self.eth_len);
        let hdr = h.hdr_end - eth - usize::from(self.ip_len) - udp::HEADER_LEN;
        let reth = hdr == hdr_len::BTH + hdr_len::RETH && h.bth.opcode().info().is_some_and(|i| i.any(f::RETH));
        if !(self.v4 && h.prepared && self.ip_len == 20 && (hdr == hdr_len::BTH || reth)) {
            return None;
        }
        let bth_at = h.hdr_end - hdr;
        debug_assert!(buf[bth_at..bth_at + hdr_len::BTH] == h.bth.bytes(), "ext wrote over the BTH");
        let t = |o: usize| u64::from_le_bytes(self.bytes[eth + o..eth + o + 8].try_into().expect("8 bytes"));
        let (bth0, bth8) = h.bth.le_words();
        let w = [
            !0,
            (t(0) & !0xffff_ffff_ffff) | u64::from(h.first4 ^ self.icrc_fix) | u64::from(h.ident.swap_bytes()) << 32,
            t(8),
            t(16),
            (t(24) & 0xffff_0000) | u64::from(h.l4_len.swap_bytes()) | (bth0 & 0xffff_ffff) << 32,
            (bth0 >> 32) | u64::from(bth8) << 32,
        ];
        if hdr == hdr_len::BTH {
            return Some(crc::update_words(0, w));
        }
        let r = h.hdr_end - hdr_len::RETH;
        let va = u64::from_le_bytes(buf[r..r + 8].try_into().expect("8 bytes"));
        let rkey = u32::from_le_bytes(buf[r + 8..r + 12].try_into().expect("4 bytes"));
        let len = u32::from_le_bytes(buf[r + 12..r + 16].try_into().expect("4 bytes"));
        Some(crc::update_words(0, [w[0], w[1], w[2], w[3], w[4], w[5], va, u64::from(rkey) | u64::from(len) << 32]))
    }

    /// After the payload: pad, the ICRC pass and the IPv4 checksum.
    #[inline(always)]
    fn finish(&self, buf: &mut [u8], h: &Headers) -> Result<usize, Error> {
        let Headers { n, prepared, with_lrh, ack, first4, .. } = *h;
        let eth_len = usize::from(self.eth_len);
        let fix = self.icrc_fix;
        // Pad and ICRC as one 4-byte store of zeros at the pad (the ICRC is written over it below).
        buf[h.pay_end..h.pay_end + hdr_len::ICRC].fill(0);
        let at = n - hdr_len::ICRC;
        let v = if prepared {
            let start = if with_lrh { eth_len - icrc::LRH_LEN } else { eth_len };
            let v = icrc::compute_prepared(&buf[start..at], with_lrh);
            buf[eth_len..eth_len + 4].copy_from_slice(&first4.to_le_bytes());
            if with_lrh {
                buf[start..eth_len].copy_from_slice(&self.before_ip);
            }
            v
        } else {
            let ip = &buf[eth_len..at];
            match self.ack_icrc.as_ref().filter(|_| ack).and_then(|a| a.compute(ip)) {
                Some(v) => v,
                // FECN/BECN (BTH byte 4) are not in the template's correction.
                None if h.ecn_marked => icrc::compute(ip)?,
                None => icrc::compute_with_fix(ip, fix),
            }
        };
        Ok(self.seal(buf, h, v))
    }

    /// Writes the ICRC `v` and the IPv4 checksum; the frame's length.
    #[inline(always)]
    fn seal(&self, buf: &mut [u8], h: &Headers, v: u32) -> usize {
        let n = h.n;
        buf[n - hdr_len::ICRC..n].copy_from_slice(&v.to_le_bytes());
        if self.v4 {
            let c = usize::from(self.eth_len) + ipv4::field::CHECKSUM.start;
            buf[c..c + 2].copy_from_slice(&h.csum);
        }
        n
    }
}

/// What [`HeaderTemplate::emit_with`]'s header part leaves for the rest: the frame's length, where the payload
/// starts, the IP header's first four bytes as the frame has them (the preparation XORed the ICRC correction into
/// them), the IPv4 checksum to write after the pass, and how the pass goes.
#[derive(Clone, Copy)]
struct Headers {
    n: usize,
    /// The IPv4 identification, the UDP length and the BTH (pad set) as written.
    ident: u16,
    l4_len: u16,
    bth: TxBth,
    hdr_end: usize,
    pay_end: usize,
    first4: u32,
    csum: [u8; 2],
    prepared: bool,
    with_lrh: bool,
    ack: bool,
    ecn_marked: bool,
}

/// The prefix of a frame shorter than [`STORED`] (an ACK). Out of line: inlined, the compiler merges it with the
/// fixed-size copy into one variable-length `memcpy` call.
#[cold]
#[inline(never)]
fn copy_prefix(buf: &mut [u8], prefix: &[u8]) {
    buf[..prefix.len()].copy_from_slice(prefix);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{
        emit_frame, AethRepr, AtomicEthRepr, Ecn, EthRepr, IpRepr, MacAddr, RethRepr, VlanTag, ROCE_UDP_PORT,
    };

    /// A flow over IPv4 or IPv6 (with `flow_label`), with or without an 802.1Q tag.
    fn flow(v6: bool, vlan: bool, flow_label: u32) -> RoceRepr {
        RoceRepr {
            eth: EthRepr {
                dst: MacAddr([2, 0, 0, 0, 0, 2]),
                src: MacAddr([2, 0, 0, 0, 0, 1]),
                vlan: vlan.then_some(VlanTag { pcp: 5, dei: false, vid: 100 }),
            },
            ip: IpRepr {
                addrs: if v6 {
                    IpAddrs::V6 { src: [0xfe; 16], dst: [0x20; 16] }
                } else {
                    IpAddrs::V4 { src: [10, 0, 0, 1], dst: [10, 0, 0, 2] }
                },
                dscp: 26,
                ecn: Ecn::Ect0,
                ttl: 64,
                ident: 0,
                dont_frag: !v6,
                flow_label: if v6 { flow_label } else { 0 },
            },
            udp_src: 0xc123,
            udp_dst: ROCE_UDP_PORT,
            bth: BthRepr { dest_qp: 0x11, ..BthRepr::default() },
            ext: ExtRepr::default(),
        }
    }

    #[test]
    fn same_bytes_as_emit_frame() {
        let ext = ExtRepr {
            reth: Some(RethRepr { va: 0x1234_5678_9abc, rkey: 0x20bb, len: 70_000 }),
            aeth: Some(AethRepr::ack(9)),
            atomic_eth: Some(AtomicEthRepr { va: 8, rkey: 3, swap_add: 5, compare: 6 }),
            atomic_ack: Some(77),
            imm: Some(0xdead_beef),
            ieth: Some(0x4321),
            ..ExtRepr::default()
        };
        let mut checked = 0;
        for (v6, vlan) in [(false, false), (false, true), (true, false), (true, true)] {
            let repr = flow(v6, vlan, 0xabcde);
            let t = HeaderTemplate::new(&repr);
            for op in 0..=255u8 {
                let Some(info) = Opcode(op).info() else { continue };
                let lens: &[usize] = if info.any(f::PAYLOAD) { &[0, 1, 3, 64, 1021, 4096] } else { &[0] };
                for &len in lens {
                    for ident in [0u16, 1, 0xfffe, 0xffff, 0x8000] {
                        let bth = BthRepr {
                            opcode: Opcode(op),
                            psn: Psn::new(0xfffff0 + len as u32),
                            ack_req: (len + usize::from(ident)) % 2 == 0,
                            ..repr.bth
                        };
                        let e = ext.normalized(info);
                        let full = RoceRepr { bth, ext: e, ip: IpRepr { ident, ..repr.ip }, ..repr };
                        let fill = |d: &mut [u8]| d.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8 ^ 0x5a);
                        let mut a = vec![0xa5u8; 4300];
                        let mut b = vec![0x3cu8; 4300];
                        let na = emit_frame(&mut a, &full, len, fill).unwrap();
                        let nb = t.emit(&mut b, &bth, &e, len, ident, fill).unwrap();
                        assert_eq!(na, nb);
                        assert_eq!(t.frame_len(Opcode(op), len), na);
                        assert_eq!(a[..na], b[..nb], "op {op:#x} len {len} v6 {v6} vlan {vlan} ident {ident}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 500);
    }

    /// `emit_with_fused` writes the bytes `emit` writes, whatever the payload closure does with the `PayloadCopy`:
    /// the whole payload in one copy, pieces in order, pieces out of order (the hashing gives up), the payload
    /// written directly, a piece written then reported with `written`; IPv4/IPv6, tagged or not, ECN-marked frames
    /// (not prepared: never hashed while copied), every pad length.
    #[test]
    fn fused_emit_same_bytes_as_emit() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 9) as u8).collect();
        let mut hashed_runs = 0;
        for (v6, vlan) in [(false, false), (false, true), (true, false), (true, true)] {
            let repr = flow(v6, vlan, 0);
            let t = HeaderTemplate::new(&repr);
            let reth = ExtRepr { reth: Some(RethRepr { va: 0x1000, rkey: 0x2201, len: 9000 }), ..ExtRepr::default() };
            for (op, ext) in [
                (Opcode::RC_RDMA_WRITE_FIRST, reth),
                (Opcode::RC_RDMA_WRITE_MIDDLE, ExtRepr::default()),
                (Opcode::RC_SEND_ONLY, ExtRepr::default()),
                (Opcode::RC_RDMA_READ_RESPONSE_LAST, ExtRepr { aeth: Some(AethRepr::ack(3)), ..ExtRepr::default() }),
            ] {
                for len in [FUSED_FROM, FUSED_FROM + 1, FUSED_FROM + 2, FUSED_FROM + 3, 1000, 4093, 4094, 4095, 4096] {
                    for becn in [false, true] {
                        for mode in 0..5 {
                            let bth =
                                BthRepr { opcode: op, psn: Psn::new(77), becn, ack_req: len % 2 == 0, ..repr.bth };
                            let piece = &src[3..3 + len];
                            let mut want = vec![0x11u8; 4300];
                            let nw = t.emit(&mut want, &bth, &ext, len, 9, |d| d.copy_from_slice(piece)).unwrap();
                            let mut got = vec![0x22u8; 4300];
                            let mut seen_hashing = false;
                            let e = |info: &OpInfo, tp: &mut [u8]| ext.emit(info, tp);
                            let ng = t
                                .emit_with_fused(&mut got, TxBth::new(&bth), len, 9, e, |d, c| {
                                    seen_hashing = c.is_hashing();
                                    let (a, b) = d.split_at_mut(len / 3);
                                    let (sa, sb) = piece.split_at(len / 3);
                                    match mode {
                                        0 => c.copy(d, piece),
                                        1 => {
                                            c.copy(a, sa);
                                            c.copy(b, sb);
                                        }
                                        2 => {
                                            c.copy(b, sb);
                                            c.copy(a, sa);
                                        }
                                        3 => d.copy_from_slice(piece),
                                        _ => {
                                            c.copy(a, sa);
                                            b.copy_from_slice(sb);
                                            c.written(b);
                                        }
                                    }
                                })
                                .unwrap();
                            assert_eq!(
                                (ng, &got[..ng]),
                                (nw, &want[..nw]),
                                "{op:?} {len} v6 {v6} vlan {vlan} becn {becn} mode {mode}"
                            );
                            assert_eq!(seen_hashing, !becn && crc::kernel_available(), "{op:?} {len} becn {becn}");
                            hashed_runs += usize::from(seen_hashing);
                        }
                    }
                }
            }
        }
        assert!(hashed_runs > 0 || !crc::kernel_available());
    }

    /// The extension headers `info`'s opcode carries, with random fields.
    fn random_ext(rnd: &mut impl FnMut() -> u64, info: &OpInfo) -> ExtRepr {
        ExtRepr {
            reth: Some(RethRepr { va: rnd(), rkey: rnd() as u32, len: rnd() as u32 }),
            aeth: Some(AethRepr { syndrome: rnd() as u8, msn: rnd() as u32 & 0xff_ffff }),
            imm: Some(rnd() as u32),
            ieth: Some(rnd() as u32),
            ..ExtRepr::default()
        }
        .normalized(info)
    }

    /// A xorshift64 generator (test inputs).
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// Randomized differential check of the transmit path over many flows: random MACs, VLAN tag or none, IPv4 or
    /// IPv6 with random addresses, DSCP, ECN (CE too), TTL, DF and flow label, random UDP ports, P_Key, MigReq,
    /// FECN/BECN and destination QP; per frame every opcode with random SE, AckReq, PSN, IPv4 identification,
    /// extension headers and payload lengths (every residue of 16, so that both sides of the masked-LRH trick are
    /// taken, and lengths up to 4 KiB). Each frame [`HeaderTemplate::emit_with`] writes (the BTH from the template's
    /// words, as the engine builds it) must be the bytes of `emit_frame`, carry the ICRC of the spec's formulation
    /// (`icrc`'s test reference: the masked fields written out by hand) and leave the buffer past the frame as it was.
    #[test]
    fn random_flows_give_emit_frame_bytes_and_the_spec_icrc() {
        let mut rnd = xorshift(0x243f_6a88_85a3_08d3);
        let ops: Vec<Opcode> = (0..=255u8).map(Opcode).filter(|o| o.info().is_some()).collect();
        let (mut frames, mut with_lrh, mut marked, mut acks) = (0, 0, 0, 0);
        for flow in 0..400 {
            let mut r = rnd();
            let mut bit = |n: u32| {
                let v = r & ((1 << n) - 1);
                r >>= n;
                v
            };
            let v6 = bit(1) == 1;
            let mac = |x: u64| MacAddr(x.to_be_bytes()[2..].try_into().unwrap());
            let ecn = [Ecn::NotEct, Ecn::Ect1, Ecn::Ect0, Ecn::Ce][bit(2) as usize];
            let vlan = (bit(1) == 1).then(|| VlanTag { pcp: bit(3) as u8, dei: bit(1) == 1, vid: bit(12) as u16 });
            let (fecn, becn, mig_req) = (bit(3) == 0, bit(3) == 0, bit(1) == 1);
            let (dscp, dont_frag) = (bit(6) as u8, bit(1) == 1);
            let repr = RoceRepr {
                eth: EthRepr { dst: mac(rnd()), src: mac(rnd()), vlan },
                ip: IpRepr {
                    addrs: if v6 {
                        let (a, b) = (u128::from(rnd()) << 64 | u128::from(rnd()), u128::from(rnd()));
                        IpAddrs::V6 { src: a.to_be_bytes(), dst: (a ^ b).to_be_bytes() }
                    } else {
                        let a = rnd();
                        IpAddrs::V4 { src: (a as u32).to_be_bytes(), dst: ((a >> 32) as u32).to_be_bytes() }
                    },
                    dscp,
                    ecn,
                    ttl: rnd() as u8,
                    ident: 0,
                    dont_frag,
                    flow_label: if v6 { rnd() as u32 & 0xf_ffff } else { 0 },
                },
                udp_src: rnd() as u16,
                udp_dst: if flow % 5 == 0 { rnd() as u16 } else { ROCE_UDP_PORT },
                bth: BthRepr {
                    opcode: Opcode(0),
                    pkey: if flow % 3 == 0 { 0xffff } else { rnd() as u16 },
                    mig_req,
                    fecn,
                    becn,
                    dest_qp: rnd() as u32 & 0xff_ffff,
                    ..BthRepr::default()
                },
                ext: ExtRepr::default(),
            };
            let t = HeaderTemplate::new(&repr);
            for _ in 0..40 {
                let op = ops[(rnd() % ops.len() as u64) as usize];
                let info = op.info().unwrap();
                let len = match (info.any(f::PAYLOAD), rnd() % 4) {
                    (false, _) => 0,
                    (true, 0) => (rnd() % 4097) as usize,
                    (true, _) => (rnd() % 97) as usize,
                };
                let (solicited, ack_req, psn, ident) =
                    (rnd() & 1 == 1, rnd() & 1 == 1, Psn::new(rnd() as u32), rnd() as u16);
                let ext = ExtRepr {
                    reth: Some(RethRepr { va: rnd(), rkey: rnd() as u32, len: rnd() as u32 }),
                    aeth: Some(AethRepr { syndrome: rnd() as u8, msn: rnd() as u32 & 0xff_ffff }),
                    atomic_eth: Some(AtomicEthRepr { va: rnd(), rkey: rnd() as u32, swap_add: rnd(), compare: rnd() }),
                    atomic_ack: Some(rnd()),
                    imm: Some(rnd() as u32),
                    ieth: Some(rnd() as u32),
                    ..ExtRepr::default()
                }
                .normalized(info);
                let bth = BthRepr { opcode: op, solicited, ack_req, psn, ..repr.bth };
                let full = RoceRepr { bth, ext, ip: IpRepr { ident, ..repr.ip }, ..repr };
                let seed = rnd();
                let fill = |d: &mut [u8]| {
                    let mut g = xorshift(seed | 1);
                    d.iter_mut().for_each(|b| *b = g() as u8);
                };
                let mut want = vec![0u8; 4400];
                let n = emit_frame(&mut want, &full, len, fill).unwrap();
                let junk: Vec<u8> = (0..4400).map(|_| rnd() as u8).collect();
                let mut got = junk.clone();
                let words = t.bth().with(op, solicited, ack_req, psn);
                let m = t.emit_with(&mut got, words, len, ident, |i, tp| ext.emit(i, tp), fill).unwrap();
                let what = format!("flow {flow} op {:#x} len {len} v6 {v6} vlan {} ecn {ecn:?}", op.0, vlan.is_some());
                assert_eq!(m, n, "{what}");
                assert_eq!(got[..n], want[..n], "{what}");
                assert_eq!(got[n..], junk[n..], "{what}: bytes past the frame");
                let eth = repr.eth.buffer_len();
                assert_eq!(icrc::tests::reference(&got[eth..n - 4]).to_le_bytes(), got[n - 4..n], "{what}: ICRC");
                frames += 1;
                with_lrh += usize::from((n - eth - 4) % 16 == 8);
                marked += usize::from(fecn || becn);
                acks += usize::from(op == Opcode::RC_ACKNOWLEDGE);
            }
        }
        assert!(
            frames == 16_000 && with_lrh > 500 && marked > 2000 && acks > 100,
            "{frames} {with_lrh} {marked} {acks}"
        );
    }

    /// `emit_with_fused` over random flows (IPv4/IPv6, tagged or not, ECN-marked or not), payload-carrying opcodes
    /// and payload lengths (every residue of 16, up to 4 KiB), the payload copied in random pieces in order (some
    /// reported with `written` instead), in reverse order, or directly: the bytes of `emit_with` for the same
    /// frame, the spec's ICRC, and the buffer past the frame as it was.
    #[test]
    fn random_fused_emits_equal_emit_with() {
        let mut rnd = xorshift(0x1319_8a2e_0370_7344);
        let ops: Vec<Opcode> =
            (0..=255u8).map(Opcode).filter(|o| o.info().is_some_and(|i| i.any(f::PAYLOAD))).collect();
        let src: Vec<u8> = (0..4200).map(|_| rnd() as u8).collect();
        let (mut frames, mut hashed) = (0, 0);
        for f in 0..120 {
            let (v6, vlan) = (rnd() & 1 == 1, rnd() & 1 == 1);
            let mut repr = flow(v6, vlan, rnd() as u32 & 0xf_ffff);
            repr.ip.ttl = rnd() as u8;
            repr.ip.dscp = rnd() as u8 & 0x3f;
            repr.udp_src = rnd() as u16;
            repr.bth.dest_qp = rnd() as u32 & 0xff_ffff;
            let t = HeaderTemplate::new(&repr);
            for _ in 0..30 {
                let op = ops[(rnd() % ops.len() as u64) as usize];
                let info = op.info().unwrap();
                let len = match rnd() % 3 {
                    0 => (rnd() % 4097) as usize,
                    1 => FUSED_FROM + (rnd() % 64) as usize,
                    _ => (rnd() % 600) as usize,
                };
                let (becn, ack_req, psn, ident) =
                    (rnd() & 3 == 0, rnd() & 1 == 1, Psn::new(rnd() as u32), rnd() as u16);
                let ext = random_ext(&mut rnd, info);
                let bth = TxBth::new(&BthRepr { opcode: op, becn, ack_req, psn, ..repr.bth });
                let off = (rnd() % 64) as usize;
                let piece = &src[off..off + len];
                let junk: Vec<u8> = (0..4400).map(|_| rnd() as u8).collect();
                let mut want = junk.clone();
                let n = t.emit_with(&mut want, bth, len, ident, |i, tp| ext.emit(i, tp), |d| d.copy_from_slice(piece));
                let n = n.unwrap();
                let mut cuts: Vec<usize> = (0..rnd() % 6).map(|_| (rnd() % (len as u64 + 1)) as usize).collect();
                cuts.push(0);
                cuts.push(len);
                cuts.sort_unstable();
                let (mode, pick) = (rnd() % 4, rnd());
                let mut got = junk.clone();
                let mut was_hashing = false;
                let fill = |d: &mut [u8], c: &mut PayloadCopy| {
                    was_hashing = c.is_hashing();
                    let mut pieces: Vec<_> = cuts.windows(2).map(|w| w[0]..w[1]).collect();
                    if mode == 1 {
                        pieces.reverse();
                    }
                    for (k, r) in pieces.into_iter().enumerate() {
                        match mode {
                            2 => d[r.clone()].copy_from_slice(&piece[r]),
                            _ if pick >> (k % 64) & 1 == 1 => {
                                d[r.clone()].copy_from_slice(&piece[r.clone()]);
                                c.written(&d[r]);
                            }
                            _ => c.copy(&mut d[r.clone()], &piece[r]),
                        }
                    }
                };
                let m = t.emit_with_fused(&mut got, bth, len, ident, |i, tp| ext.emit(i, tp), fill).unwrap();
                let what = format!("flow {f} op {:#x} len {len} v6 {v6} vlan {vlan} becn {becn} cuts {cuts:?}", op.0);
                assert_eq!(m, n, "{what}");
                let diff = (0..n).find(|&i| got[i] != want[i]);
                assert_eq!(diff, None, "{what}: first byte unlike emit_with's");
                assert!(got[n..] == junk[n..], "{what}: bytes past the frame");
                let eth = repr.eth.buffer_len();
                assert_eq!(icrc::tests::reference(&got[eth..n - 4]).to_le_bytes(), got[n - 4..n], "{what}: ICRC");
                frames += 1;
                hashed += usize::from(was_hashing);
            }
        }
        assert!(frames == 3600 && (hashed > 1000 || !crc::kernel_available()), "{frames} {hashed}");
    }

    /// `head_crc` (the headers' ICRC register from the template and the packet's fields as values) against the
    /// pass over the header bytes the frame holds, for random flows (IPv4 and IPv6, tagged or not, every opcode,
    /// FECN/BECN, random fields): equal wherever it answers, and it answers for every prepared IPv4 frame whose
    /// extension headers are none or a RETH.
    #[test]
    fn head_crc_equals_the_pass_over_the_stored_headers() {
        let mut rnd = xorshift(0xa409_3822_299f_31d0);
        let ops: Vec<Opcode> = (0..=255u8).map(Opcode).filter(|o| o.info().is_some()).collect();
        let (mut answered, mut with_reth) = (0, 0);
        for _ in 0..300 {
            let (v6, vlan) = (rnd() & 3 == 0, rnd() & 1 == 1);
            let mut repr = flow(v6, vlan, rnd() as u32 & 0xf_ffff);
            repr.ip.ttl = rnd() as u8;
            repr.ip.dscp = rnd() as u8 & 0x3f;
            repr.ip.dont_frag = rnd() & 1 == 1;
            repr.udp_src = rnd() as u16;
            repr.bth.dest_qp = rnd() as u32 & 0xff_ffff;
            repr.bth.pkey = rnd() as u16;
            let t = HeaderTemplate::new(&repr);
            for _ in 0..40 {
                let op = ops[(rnd() % ops.len() as u64) as usize];
                let info = op.info().unwrap();
                let len = if info.any(f::PAYLOAD) { (rnd() % 4097) as usize } else { 0 };
                let ext = random_ext(&mut rnd, info);
                let (becn, fecn) = (rnd() & 7 == 0, rnd() & 7 == 0);
                let b = BthRepr {
                    opcode: op,
                    becn,
                    fecn,
                    ack_req: rnd() & 1 == 1,
                    psn: Psn::new(rnd() as u32),
                    ..repr.bth
                };
                let bth = TxBth::new(&b);
                let mut buf: Vec<u8> = (0..4400).map(|_| rnd() as u8).collect();
                let h = t.headers(&mut buf, bth, len, rnd() as u16, |i, tp| ext.emit(i, tp)).unwrap();
                let eth = repr.eth.buffer_len();
                let hdr = usize::from(info.hdr_len);
                let expect_some = !v6
                    && h.prepared
                    && (hdr == hdr_len::BTH || (hdr == hdr_len::BTH + hdr_len::RETH && info.any(f::RETH)));
                let what = format!("op {:#x} len {len} v6 {v6} vlan {vlan} becn {becn} fecn {fecn}", op.0);
                match t.head_crc(&buf, &h) {
                    Some(v) => {
                        assert!(expect_some, "{what}: answered for a frame it does not build");
                        buf[eth - icrc::LRH_LEN..eth].fill(0xff);
                        assert_eq!(v, icrc::compute_prepared(&buf[eth - icrc::LRH_LEN..h.hdr_end], true), "{what}");
                        answered += 1;
                        with_reth += usize::from(hdr > hdr_len::BTH);
                    }
                    None => assert!(!expect_some, "{what}: no answer for a frame it builds"),
                }
            }
        }
        assert!(answered > 300 && with_reth > 50, "{answered} answered, {with_reth} with a RETH");
    }

    #[test]
    fn errors_match_emit_frame() {
        let t = HeaderTemplate::new(&RoceRepr { udp_dst: ROCE_UDP_PORT, ..RoceRepr::default() });
        let bth = BthRepr { opcode: Opcode::RC_ACKNOWLEDGE, ..BthRepr::default() };
        assert_eq!(t.emit(&mut [0u8; 200], &bth, &ExtRepr::default(), 4, 0, |_| ()), Err(Error::Unencodable));
        assert_eq!(t.emit(&mut [0u8; 40], &bth, &ExtRepr::default(), 0, 0, |_| ()), Err(Error::BufferTooSmall));
        let bad = BthRepr { opcode: Opcode(0x15), ..bth };
        assert_eq!(t.emit(&mut [0u8; 200], &bad, &ExtRepr::default(), 0, 0, |_| ()), Err(Error::UnknownOpcode(0x15)));
        let big = BthRepr { opcode: Opcode::RC_SEND_ONLY, ..bth };
        assert_eq!(
            t.emit(&mut vec![0u8; 70_000], &big, &ExtRepr::default(), 66_000, 0, |_| ()),
            Err(Error::Unencodable)
        );
    }
}
