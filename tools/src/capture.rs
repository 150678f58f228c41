//! Reading pcap and pcapng captures (with the `pcap-file` crate), frame by frame.

use pcap_file::pcap::PcapReader;
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
    /// True if the link type is Ethernet (other link types are counted, not decoded).
    pub ethernet: bool,
    /// The frame bytes as captured.
    pub data: &'a [u8],
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

fn pcap_frames(rd: impl Read, f: &mut impl FnMut(CapturedFrame<'_>)) -> Result<(), ReadError> {
    let mut r = PcapReader::new(rd).map_err(pcap_err)?;
    let link = r.header().datalink;
    if link != DataLink::ETHERNET {
        return Err(ReadError(format!("unsupported link type {link:?} (only Ethernet captures are decoded)")));
    }
    let ethernet = true;
    while let Some(p) = r.next_packet() {
        let p = p.map_err(pcap_err)?;
        f(CapturedFrame { time: Some(p.timestamp.as_secs_f64()), ethernet, data: &p.data });
    }
    Ok(())
}

/// (is Ethernet, `if_tsresol`) of a pcapng interface.
fn interface(i: &InterfaceDescriptionBlock<'_>) -> (bool, Option<u8>) {
    let tsresol = i.options.iter().find_map(|o| match o {
        InterfaceDescriptionOption::IfTsResol(v) => Some(*v),
        _ => None,
    });
    (i.linktype == DataLink::ETHERNET, tsresol)
}

fn pcapng_frames(rd: impl Read, f: &mut impl FnMut(CapturedFrame<'_>)) -> Result<(), ReadError> {
    let mut r = PcapNgReader::new(rd).map_err(pcap_err)?;
    // The interfaces of the current section, in order (packets name them by index).
    let mut ifaces: Vec<(bool, Option<u8>)> = r.interfaces().iter().map(interface).collect();
    while let Some(b) = r.next_block() {
        let (id, raw_time, data) = match b.map_err(pcap_err)? {
            Block::SectionHeader(_) => {
                ifaces.clear();
                continue;
            }
            Block::InterfaceDescription(i) => {
                ifaces.push(interface(&i));
                continue;
            }
            Block::EnhancedPacket(p) => (p.interface_id as usize, Some(p.timestamp.as_nanos()), p.data),
            Block::Packet(p) => (usize::from(p.interface_id), Some(u128::from(p.timestamp)), p.data),
            Block::SimplePacket(p) => (0, None, p.data),
            _ => continue,
        };
        let (ethernet, tsresol) = ifaces.get(id).copied().unwrap_or((false, None));
        let time = raw_time.map(|t| pcapng_seconds(t, tsresol));
        f(CapturedFrame { time, ethernet, data: &data });
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
