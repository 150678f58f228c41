//! Reading pcap and pcapng captures (with the `pcap-file` crate), frame by frame.

use pcap_file::pcapng::blocks::interface_description::{InterfaceDescriptionBlock, InterfaceDescriptionOption};
use pcap_file::pcapng::{Block, PcapNgReader};
use pcap_file::{DataLink, PcapError};
use std::fs::File;
use std::io::{BufReader, ErrorKind, Read, Seek, SeekFrom};
use std::path::Path;

/// One captured frame.
#[derive(Debug, Clone, Copy)]
pub struct CapturedFrame<'a> {
    /// Capture time in seconds (absolute as recorded; `None` for pcapng simple packet blocks).
    pub time: Option<f64>,
    /// True if `data` is an Ethernet frame: captured on Ethernet, or rebuilt as one from a Linux cooked (SLL,
    /// SLL2: `tcpdump -i any`) or raw IP capture ([`Link`]). Other link types are counted, not decoded.
    pub ethernet: bool,
    /// The frame bytes as captured (as an Ethernet frame when `ethernet`).
    pub data: &'a [u8],
    /// The frame's length on the wire as the capture records it (counted as `data` is); more than `data.len()`
    /// when the capture kept only the first bytes of the frame (a snapshot length, `tcpdump -s N`).
    pub orig_len: usize,
    /// The link type when the frame is not decoded (`ethernet` false): the pcapng interface's, or `None` for a
    /// packet naming an interface the file never described.
    pub link: Option<u32>,
}

/// The link types whose frames are decoded: Ethernet as it is, the others rebuilt as Ethernet frames (no
/// destination MAC; the Linux cooked header's address as the source) so that the same decoder reads them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Link {
    /// `LINKTYPE_ETHERNET` (1).
    Ethernet,
    /// `LINKTYPE_LINUX_SLL` (113): a 16-byte Linux cooked header (`tcpdump -i any`).
    LinuxSll,
    /// `LINKTYPE_LINUX_SLL2` (276): its 20-byte successor (tcpdump 4.99 `-i any`).
    LinuxSll2,
    /// `LINKTYPE_RAW` (101, the IP version from the first nibble), `LINKTYPE_IPV4` (228), `LINKTYPE_IPV6` (229).
    RawIp(Option<u16>),
}

impl Link {
    /// The decodable link type of a pcap/pcapng link type number, if it is one.
    pub fn from_linktype(v: u32) -> Option<Link> {
        Some(match v {
            1 => Link::Ethernet,
            113 => Link::LinuxSll,
            276 => Link::LinuxSll2,
            101 => Link::RawIp(None),
            228 => Link::RawIp(Some(0x0800)),
            229 => Link::RawIp(Some(0x86dd)),
            _ => return None,
        })
    }
}

/// A link type number as pcap-file names it (`LINUX_SLL`, `IEEE802_11`, `Unknown(300)`).
pub fn link_name(v: u32) -> String {
    format!("{:?}", DataLink::from(v))
}

/// `data` of link type `link` as an Ethernet frame (borrowed, or rebuilt in `buf`), and its original length.
fn as_ethernet<'a>(link: Link, data: &'a [u8], orig_len: usize, buf: &'a mut Vec<u8>) -> (&'a [u8], usize) {
    // (header length, EtherType, source MAC) of the link header.
    let (hdr, ethertype, src) = match link {
        Link::Ethernet => return (data, orig_len),
        Link::LinuxSll if data.len() >= 16 => (16, [data[14], data[15]], (data[4..6] == [0, 6]).then(|| &data[6..12])),
        Link::LinuxSll2 if data.len() >= 20 => (20, [data[0], data[1]], (data[11] == 6).then(|| &data[12..18])),
        Link::RawIp(t) => {
            let t = t.unwrap_or(if data.first().is_some_and(|b| b >> 4 == 6) { 0x86dd } else { 0x0800 });
            (0, t.to_be_bytes(), None)
        }
        // Shorter than its link header: an empty frame, which the decoder calls truncated.
        _ => return (&data[..0], 0),
    };
    buf.clear();
    buf.extend_from_slice(&[0; 6]);
    buf.extend_from_slice(src.unwrap_or(&[0; 6]));
    buf.extend_from_slice(&ethertype);
    buf.extend_from_slice(&data[hdr..]);
    let orig = orig_len.saturating_sub(hdr) + 14;
    (buf, orig.max(buf.len()))
}

/// Hands one frame of link type `link` to `f` (as an Ethernet frame).
fn deliver(
    link: Link,
    time: Option<f64>,
    data: &[u8],
    orig_len: usize,
    buf: &mut Vec<u8>,
    f: &mut impl FnMut(CapturedFrame<'_>),
) {
    let (data, orig_len) = as_ethernet(link, data, orig_len.max(data.len()), buf);
    f(CapturedFrame { time, ethernet: true, data, orig_len, link: None });
}

/// Why a capture could not be read (one line).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadError(pub String);

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ReadError {}

fn err(e: impl std::fmt::Display) -> ReadError {
    ReadError(e.to_string())
}

/// pcap-file's errors in words a user can act on ("Need more bytes" / "Error reading bytes" say little).
fn pcap_err(e: PcapError) -> ReadError {
    match e {
        PcapError::IncompleteBuffer => ReadError("truncated capture file".into()),
        PcapError::IoError(io) if io.kind() == ErrorKind::UnexpectedEof => {
            ReadError("truncated capture file (ends inside a record)".into())
        }
        PcapError::IoError(io) => ReadError(format!("read error: {io}")),
        other => ReadError(format!("corrupt capture file: {other}")),
    }
}

/// Seconds for a pcapng timestamp. pcap-file 2.0 hands the raw 64-bit count over as nanoseconds whatever the
/// interface's `if_tsresol` says, so rescale it here (default resolution: microseconds).
fn pcapng_seconds(raw_units: u128, tsresol: Option<u8>) -> f64 {
    let r = tsresol.unwrap_or(6);
    let unit = if r & 0x80 == 0 { 10f64.powi(-i32::from(r)) } else { 2f64.powi(-i32::from(r & 0x7f)) };
    raw_units as f64 * unit
}

/// Calls `f` for every frame of the pcap or pcapng file at `path`, in file order. Errors (unreadable file,
/// unknown format, corrupt records) are one-line reasons; frames before a corrupt record have been delivered.
pub fn for_each_frame(path: &Path, mut f: impl FnMut(CapturedFrame<'_>)) -> Result<(), ReadError> {
    let mut file = File::open(path).map_err(err)?;
    let mut magic = [0u8; 4];
    file.read_exact(&mut magic).map_err(|e| match e.kind() {
        ErrorKind::UnexpectedEof => ReadError("not a pcap/pcapng file (shorter than 4 bytes)".into()),
        _ => err(e),
    })?;
    file.seek(SeekFrom::Start(0)).map_err(err)?;
    let rd = BufReader::with_capacity(1 << 16, file);
    match magic {
        [0x0a, 0x0d, 0x0d, 0x0a] => pcapng_frames(rd, &mut f),
        [0xa1, 0xb2, 0xc3, 0xd4] | [0xd4, 0xc3, 0xb2, 0xa1] | [0xa1, 0xb2, 0x3c, 0x4d] | [0x4d, 0x3c, 0xb2, 0xa1] => {
            pcap_frames(rd, &mut f)
        }
        _ => Err(ReadError(format!(
            "not a pcap/pcapng file (magic {:02x}{:02x}{:02x}{:02x})",
            magic[0], magic[1], magic[2], magic[3]
        ))),
    }
}

/// The largest captured length a pcap record may claim (Wireshark's `WTAP_MAX_PACKET_SIZE_STANDARD`): more is a
/// corrupt length field, refused before anything is read or allocated for it.
pub const MAX_RECORD: u32 = 262_144;

/// Reads `buf.len()` bytes, or fewer at the end of the file: returns how many it got.
fn read_full(rd: &mut impl Read, buf: &mut [u8]) -> Result<usize, ReadError> {
    let mut got = 0;
    while got < buf.len() {
        match rd.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(ReadError(format!("read error: {e}"))),
        }
    }
    Ok(got)
}

/// pcap (libpcap's format, microsecond or nanosecond, either byte order), record by record. The snapshot length
/// in the file header is not a limit the records are held to: `tcpdump -s 160` writes records whose original
/// length exceeds it (their captured length is cut to it), and some writers store a snapshot length smaller
/// than their records; Wireshark reads both, and so do we. A record whose captured length is longer than its
/// original length is taken as captured.
fn pcap_frames(mut rd: impl Read, f: &mut impl FnMut(CapturedFrame<'_>)) -> Result<(), ReadError> {
    let mut h = [0u8; 24];
    if read_full(&mut rd, &mut h)? < h.len() {
        return Err(ReadError("truncated capture file (ends inside the pcap file header)".into()));
    }
    let magic = [h[0], h[1], h[2], h[3]];
    let (big, nanos) = match magic {
        [0xa1, 0xb2, 0xc3, 0xd4] => (true, false),
        [0xd4, 0xc3, 0xb2, 0xa1] => (false, false),
        [0xa1, 0xb2, 0x3c, 0x4d] => (true, true),
        _ => (false, true),
    };
    let u32_at = |b: &[u8], at: usize| {
        let w = [b[at], b[at + 1], b[at + 2], b[at + 3]];
        if big {
            u32::from_be_bytes(w)
        } else {
            u32::from_le_bytes(w)
        }
    };
    // The low 16 bits are the link type; the upper bits may carry the FCS length (pcap-linktype.txt).
    let link = u32_at(&h, 20) & 0xffff;
    let link = Link::from_linktype(link).ok_or_else(|| {
        ReadError(format!(
            "unsupported link type {} (Ethernet, Linux cooked and raw IP captures are decoded)",
            link_name(link)
        ))
    })?;
    let mut data = Vec::new();
    let mut ether = Vec::new();
    let mut n = 0u64;
    loop {
        n += 1;
        let mut r = [0u8; 16];
        match read_full(&mut rd, &mut r)? {
            0 => return Ok(()),
            16 => {}
            _ => return Err(ReadError(format!("truncated capture file (ends inside the header of record {n})"))),
        }
        let (secs, frac, caplen, orig) = (u32_at(&r, 0), u32_at(&r, 4), u32_at(&r, 8), u32_at(&r, 12));
        if caplen > MAX_RECORD {
            return Err(ReadError(format!(
                "corrupt capture file: record {n} claims {caplen} captured bytes (more than {MAX_RECORD})"
            )));
        }
        data.resize(caplen as usize, 0);
        let got = read_full(&mut rd, &mut data)?;
        if got < data.len() {
            return Err(ReadError(format!(
                "truncated capture file (ends inside record {n}: {got} of its {caplen} bytes)"
            )));
        }
        let time = f64::from(secs) + f64::from(frac) * if nanos { 1e-9 } else { 1e-6 };
        let orig_len = (orig as usize).max(data.len());
        deliver(link, Some(time), &data, orig_len, &mut ether, f);
    }
}

/// (link type, `if_tsresol`) of a pcapng interface.
fn interface(i: &InterfaceDescriptionBlock<'_>) -> (u32, Option<u8>) {
    let tsresol = i.options.iter().find_map(|o| match o {
        InterfaceDescriptionOption::IfTsResol(v) => Some(*v),
        _ => None,
    });
    (u32::from(i.linktype), tsresol)
}

fn pcapng_frames(rd: impl Read, f: &mut impl FnMut(CapturedFrame<'_>)) -> Result<(), ReadError> {
    let mut r = PcapNgReader::new(rd).map_err(pcap_err)?;
    // The interfaces of the current section, in order (packets name them by index).
    let mut ifaces: Vec<(u32, Option<u8>)> = r.interfaces().iter().map(interface).collect();
    let mut ether = Vec::new();
    while let Some(b) = r.next_block() {
        let (id, raw_time, orig_len, data) = match b.map_err(pcap_err)? {
            Block::SectionHeader(_) => {
                ifaces.clear();
                continue;
            }
            Block::InterfaceDescription(i) => {
                ifaces.push(interface(&i));
                continue;
            }
            Block::EnhancedPacket(p) => (p.interface_id as usize, Some(p.timestamp.as_nanos()), p.original_len, p.data),
            Block::Packet(p) => (usize::from(p.interface_id), Some(u128::from(p.timestamp)), p.original_len, p.data),
            Block::SimplePacket(p) => (0, None, p.original_len, p.data),
            _ => continue,
        };
        let iface = ifaces.get(id).copied();
        let time = raw_time.map(|t| pcapng_seconds(t, iface.and_then(|i| i.1)));
        match iface.and_then(|i| Link::from_linktype(i.0)) {
            Some(link) => deliver(link, time, &data, orig_len as usize, &mut ether, f),
            None => {
                f(CapturedFrame { time, ethernet: false, data: &data, orig_len: data.len(), link: iface.map(|i| i.0) })
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pcapng_resolutions() {
        assert_eq!(pcapng_seconds(1_500_000, None), 1.5);
        assert_eq!(pcapng_seconds(1_500_000_000, Some(9)), 1.5);
        assert_eq!(pcapng_seconds(3 << 20, Some(0x80 | 20)), 3.0);
    }
}
