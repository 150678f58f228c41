//! roce-dump's decoding and formatting: one line (or JSON object) per RoCE frame, other frames counted, and the
//! summary line `frames=N roce=N icrc_ok=N icrc_bad=N malformed=N` (and `snapped=N` when the capture cut frames
//! short: their headers are decoded, their ICRC cannot be checked).

use roce_dp::wire::{
    parse_frame, AethKind, Error, EthernetFrame, IpAddrs, NakCode, RoceFrame, ETHERNET_HEADER_LEN, ROCE_UDP_PORT,
};
use std::fmt::Write as _;
use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Output options.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Add Ethernet/IP details and a hex dump of the headers.
    pub verbose: bool,
    /// One JSON object per frame instead of text.
    pub json: bool,
}

/// Frame counts. A frame is RoCE when it is UDP to port 4791 (or cannot be told apart from it because it is
/// broken before the UDP header); RoCE frames are well formed (with a good or bad ICRC) or malformed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Summary {
    /// All frames in the capture.
    pub frames: u64,
    /// RoCE frames (well formed or not).
    pub roce: u64,
    /// Well-formed RoCE frames with a good ICRC.
    pub icrc_ok: u64,
    /// Well-formed RoCE frames with a bad ICRC.
    pub icrc_bad: u64,
    /// Malformed RoCE frames.
    pub malformed: u64,
    /// RoCE frames the capture kept only the first bytes of (a snapshot length): their headers decoded when
    /// captured whole, the ICRC not checked. Not an error.
    pub snapped: u64,
}

impl Summary {
    /// 0 if every RoCE frame is well formed with a good ICRC, else 1.
    pub fn exit_code(&self) -> i32 {
        if self.malformed == 0 && self.icrc_bad == 0 {
            0
        } else {
            1
        }
    }
}

impl std::fmt::Display for Summary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "frames={} roce={} icrc_ok={} icrc_bad={} malformed={}",
            self.frames, self.roce, self.icrc_ok, self.icrc_bad, self.malformed
        )?;
        if self.snapped > 0 {
            write!(f, " snapped={}", self.snapped)?;
        }
        Ok(())
    }
}

/// What a frame is.
// A short-lived return value: boxing the big variant would allocate per frame.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Verdict<'a> {
    /// Not RoCE (not IP, not UDP, another port, or a non-Ethernet link).
    Other,
    /// A well-formed RoCE frame.
    Roce(RoceFrame<'a>),
    /// A RoCE frame that failed to parse.
    Malformed(Error),
}

/// True unless the frame is positively something other than UDP to 4791: a frame broken before its UDP header
/// counts as (malformed) RoCE only if what can be read of it points that way.
fn may_be_roce(frame: &[u8]) -> bool {
    let Ok(eth) = EthernetFrame::new_checked(frame) else { return true };
    let l3 = eth.payload();
    let (proto, l4) = match eth.payload_ethertype() {
        0x0800 => {
            let ihl = usize::from(l3.first().map_or(5, |b| b & 0x0f)) * 4;
            (l3.get(9).copied(), l3.get(ihl.max(20)..))
        }
        0x86dd => (l3.get(6).copied(), l3.get(40..)),
        _ => return false,
    };
    match (proto, l4) {
        (Some(p), _) if p != 17 => false,
        (_, Some(u)) if u.len() >= 4 => u16::from_be_bytes([u[2], u[3]]) == ROCE_UDP_PORT,
        _ => true,
    }
}

/// Classifies one Ethernet frame.
pub fn classify(frame: &[u8]) -> Verdict<'_> {
    match parse_frame(frame) {
        Ok(f) => Verdict::Roce(f),
        Err(Error::NotIp | Error::NotUdp | Error::NotRoce) => Verdict::Other,
        Err(e) if may_be_roce(frame) => Verdict::Malformed(e),
        Err(_) => Verdict::Other,
    }
}

fn ip_port(addrs: &IpAddrs, src: bool, port: u16) -> String {
    match *addrs {
        IpAddrs::V4 { src: s, dst: d } => format!("{}:{port}", Ipv4Addr::from(if src { s } else { d })),
        IpAddrs::V6 { src: s, dst: d } => format!("[{}]:{port}", Ipv6Addr::from(if src { s } else { d })),
    }
}

fn ip_str(addrs: &IpAddrs, src: bool) -> String {
    match *addrs {
        IpAddrs::V4 { src: s, dst: d } => Ipv4Addr::from(if src { s } else { d }).to_string(),
        IpAddrs::V6 { src: s, dst: d } => Ipv6Addr::from(if src { s } else { d }).to_string(),
    }
}

/// The NAK code's name.
pub fn nak_name(c: NakCode) -> &'static str {
    match c {
        NakCode::PsnSeqErr => "PSN_SEQ_ERR",
        NakCode::InvalidRequest => "INVALID_REQUEST",
        NakCode::RemoteAccessErr => "REMOTE_ACCESS_ERR",
        NakCode::RemoteOpErr => "REMOTE_OP_ERR",
        NakCode::InvalidRdRequest => "INVALID_RD_REQUEST",
    }
}

/// The AETH decoded: (kind, detail name, detail value), e.g. ("ACK", "credits", 31).
fn aeth_parts(kind: AethKind) -> (&'static str, Option<(&'static str, String)>) {
    match kind {
        AethKind::Ack { credits } => ("ACK", Some(("credits", credits.to_string()))),
        AethKind::RnrNak { timer } => ("RNR_NAK", Some(("timer", timer.to_string()))),
        AethKind::Nak(c) => ("NAK", Some(("code", nak_name(c).to_string()))),
        AethKind::Reserved(_) => ("RESERVED", None),
    }
}

fn hex(out: &mut String, bytes: &[u8]) {
    for b in bytes {
        let _ = write!(out, "{b:02x}");
    }
}

fn b(v: bool) -> u8 {
    u8::from(v)
}

/// Appends the text line(s) for a well-formed RoCE frame (no trailing newline). `raw` is the frame as captured;
/// shorter than the frame when the capture cut it (a snapshot length): then `icrc=snapped caplen=N`.
pub fn format_text(out: &mut String, ts: f64, f: &RoceFrame<'_>, raw: &[u8], verbose: bool) {
    let r = &f.repr;
    let bt = &r.bth;
    let _ = write!(
        out,
        "{ts:.6} {} -> {} {} dqp={:#08x} psn={:#08x} ackreq={} se={} m={} pad={}",
        ip_port(&r.ip.addrs, true, r.udp_src),
        ip_port(&r.ip.addrs, false, r.udp_dst),
        bt.opcode.name(),
        bt.dest_qp,
        bt.psn.value(),
        b(bt.ack_req),
        b(bt.solicited),
        b(bt.mig_req),
        bt.pad,
    );
    if bt.fecn {
        out.push_str(" fecn=1");
    }
    if bt.becn {
        out.push_str(" becn=1");
    }
    let e = &r.ext;
    if let Some(d) = e.deth {
        let _ = write!(out, " deth{{qkey={:#010x} sqp={:#08x}}}", d.qkey, d.src_qp);
    }
    if let Some(v) = e.feth {
        let _ = write!(out, " feth{{plt={} sel={} raw={v:#010x}}}", v & 0x0f, (v >> 4) & 3);
    }
    if let Some(x) = e.reth {
        let _ = write!(out, " reth{{va={:#x} rkey={:#x} len={}}}", x.va, x.rkey, x.len);
    }
    if let Some(a) = e.atomic_eth {
        let _ = write!(
            out,
            " atomic{{va={:#x} rkey={:#x} swap_add={:#x} compare={:#x}}}",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = e.aeth {
        let (kind, detail) = aeth_parts(a.kind());
        let _ = write!(out, " aeth{{{kind} syn={:#04x}", a.syndrome);
        if let Some((k, v)) = detail {
            let _ = write!(out, " {k}={v}");
        }
        let _ = write!(out, " msn={}}}", a.msn);
    }
    if let Some(v) = e.atomic_ack {
        let _ = write!(out, " atomic_ack{{orig={v:#x}}}");
    }
    if let Some(v) = e.imm {
        let _ = write!(out, " imm={v:#010x}");
    }
    if let Some(v) = e.ieth {
        let _ = write!(out, " ieth{{rkey={v:#x}}}");
    }
    let _ = write!(out, " len={} ecn={:02b} icrc=", f.payload.len(), r.ip.ecn.bits());
    match snapped(f, raw) {
        Some(n) => {
            let _ = write!(out, "snapped caplen={n}");
        }
        None => out.push_str(if f.icrc_ok { "ok" } else { "BAD" }),
    }
    if verbose {
        let _ = write!(out, "\n    eth {} -> {}", r.eth.src, r.eth.dst);
        if let Some(v) = r.eth.vlan {
            let _ = write!(out, " vlan{{vid={} pcp={} dei={}}}", v.vid, v.pcp, b(v.dei));
        }
        match r.ip.addrs {
            IpAddrs::V4 { .. } => {
                let _ = write!(
                    out,
                    " ipv4{{ttl={} dscp={} id={:#06x} df={}}}",
                    r.ip.ttl,
                    r.ip.dscp,
                    r.ip.ident,
                    b(r.ip.dont_frag)
                );
            }
            IpAddrs::V6 { .. } => {
                let _ = write!(out, " ipv6{{hlim={} dscp={} flow={:#07x}}}", r.ip.ttl, r.ip.dscp, r.ip.flow_label);
            }
        }
        let _ = write!(out, " pkey={:#06x}", bt.pkey);
        // The ICRC as stored, when the capture kept it.
        if let Some(icrc) = raw_icrc(raw, f) {
            let _ = write!(out, " icrc={icrc:#010x}");
        }
        out.push_str("\n    hdr ");
        hex(out, &raw[..r.payload_offset().min(raw.len())]);
    }
}

/// `Some(captured bytes)` when `raw` (as captured) is shorter than the frame `f` decodes.
fn snapped(f: &RoceFrame<'_>, raw: &[u8]) -> Option<usize> {
    let whole = f.repr.payload_offset() + f.payload.len() + usize::from(f.repr.bth.pad) + 4;
    (raw.len() < whole).then_some(raw.len())
}

/// The ICRC as stored (little-endian) in the frame: the 4 bytes after the payload and pad (`None` when the
/// capture cut the frame before them).
fn raw_icrc(raw: &[u8], f: &RoceFrame<'_>) -> Option<u32> {
    let at = f.repr.payload_offset() + f.payload.len() + usize::from(f.repr.bth.pad);
    raw.get(at..at + 4).map(|t| u32::from_le_bytes([t[0], t[1], t[2], t[3]]))
}

/// A JSON string literal (escapes quotes, backslashes and control characters).
pub fn json_str(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Appends the JSON object for a well-formed RoCE frame. 64-bit values (VAs, atomic operands) are hex strings so
/// JSON readers with 53-bit numbers keep them exact.
pub fn format_json(out: &mut String, ts: f64, f: &RoceFrame<'_>, raw: &[u8], verbose: bool) {
    let r = &f.repr;
    let bt = &r.bth;
    let _ = write!(out, "{{\"ts\":{ts:.6},\"src\":");
    json_str(out, &ip_str(&r.ip.addrs, true));
    let _ = write!(out, ",\"sport\":{},\"dst\":", r.udp_src);
    json_str(out, &ip_str(&r.ip.addrs, false));
    let _ = write!(out, ",\"dport\":{},\"opcode\":", r.udp_dst);
    json_str(out, bt.opcode.name());
    let _ = write!(
        out,
        ",\"opcode_num\":{},\"dqp\":{},\"psn\":{},\"ackreq\":{},\"se\":{},\"m\":{},\"pad\":{},\"fecn\":{},\"becn\":{},\"pkey\":{}",
        bt.opcode.0,
        bt.dest_qp,
        bt.psn.value(),
        bt.ack_req,
        bt.solicited,
        bt.mig_req,
        bt.pad,
        bt.fecn,
        bt.becn,
        bt.pkey
    );
    let e = &r.ext;
    if let Some(d) = e.deth {
        let _ = write!(out, ",\"deth\":{{\"qkey\":{},\"sqp\":{}}}", d.qkey, d.src_qp);
    }
    if let Some(v) = e.feth {
        let _ = write!(out, ",\"feth\":{v}");
    }
    if let Some(x) = e.reth {
        let _ = write!(out, ",\"reth\":{{\"va\":\"{:#x}\",\"rkey\":{},\"len\":{}}}", x.va, x.rkey, x.len);
    }
    if let Some(a) = e.atomic_eth {
        let _ = write!(
            out,
            ",\"atomic\":{{\"va\":\"{:#x}\",\"rkey\":{},\"swap_add\":\"{:#x}\",\"compare\":\"{:#x}\"}}",
            a.va, a.rkey, a.swap_add, a.compare
        );
    }
    if let Some(a) = e.aeth {
        let (kind, detail) = aeth_parts(a.kind());
        let _ = write!(out, ",\"aeth\":{{\"kind\":\"{kind}\",\"syndrome\":{}", a.syndrome);
        if let Some((k, v)) = detail {
            let _ = write!(out, ",\"{k}\":");
            if k == "code" {
                json_str(out, &v);
            } else {
                out.push_str(&v);
            }
        }
        let _ = write!(out, ",\"msn\":{}}}", a.msn);
    }
    if let Some(v) = e.atomic_ack {
        let _ = write!(out, ",\"atomic_ack\":\"{v:#x}\"");
    }
    if let Some(v) = e.imm {
        let _ = write!(out, ",\"imm\":{v}");
    }
    if let Some(v) = e.ieth {
        let _ = write!(out, ",\"ieth\":{v}");
    }
    let _ = write!(out, ",\"len\":{},\"ecn\":{},\"icrc_ok\":", f.payload.len(), r.ip.ecn.bits());
    match snapped(f, raw) {
        Some(n) => {
            let _ = write!(out, "null,\"caplen\":{n}");
        }
        None => {
            let _ = write!(out, "{}", f.icrc_ok);
        }
    }
    if verbose {
        let _ = write!(out, ",\"eth_src\":\"{}\",\"eth_dst\":\"{}\"", r.eth.src, r.eth.dst);
        if let Some(v) = r.eth.vlan {
            let _ = write!(out, ",\"vlan\":{{\"vid\":{},\"pcp\":{},\"dei\":{}}}", v.vid, v.pcp, v.dei);
        }
        let _ = write!(
            out,
            ",\"ttl\":{},\"dscp\":{},\"ip_id\":{},\"df\":{},\"flow_label\":{},\"icrc\":{},\"hdr\":\"",
            r.ip.ttl,
            r.ip.dscp,
            r.ip.ident,
            r.ip.dont_frag,
            r.ip.flow_label,
            raw_icrc(raw, f).map_or("null".to_string(), |v| v.to_string())
        );
        hex(out, &raw[..r.payload_offset().min(raw.len())]);
        out.push('"');
    }
    out.push('}');
}

/// The longest frame a snapped frame is rebuilt to (an IPv6 jumbo-less datagram in a VLAN-tagged Ethernet frame):
/// a capture's original-length field cannot make roce-dump allocate more.
const MAX_FRAME: usize = 65_535 + 40 + 18;

/// The headers a RoCE frame cannot do without (Ethernet with any VLAN tag, IPv4 without options or IPv6, UDP,
/// BTH), judged from the captured bytes.
fn base_headers(data: &[u8]) -> usize {
    let tagged = data.get(12..14) == Some(&[0x81, 0x00]);
    let eth = if tagged { 18 } else { ETHERNET_HEADER_LEN };
    let ip = if data.get(eth - 2..eth) == Some(&[0x86, 0xdd]) { 40 } else { 20 };
    eth + ip + 8 + 12
}

/// Decodes frames one by one and writes their lines; [`finish`](Dumper::finish) writes the summary.
pub struct Dumper<W: Write> {
    out: W,
    opts: Options,
    summary: Summary,
    t0: Option<f64>,
    last: f64,
    line: String,
    /// A snapped frame rebuilt to its original length (zeros after what was captured).
    whole: Vec<u8>,
}

impl<W: Write> Dumper<W> {
    /// A dumper writing to `out`.
    pub fn new(out: W, opts: Options) -> Dumper<W> {
        Dumper {
            out,
            opts,
            summary: Summary::default(),
            t0: None,
            last: 0.0,
            line: String::with_capacity(512),
            whole: Vec::new(),
        }
    }

    /// Handles one captured frame (`time` in seconds; timestamps print relative to the first frame). `orig_len`
    /// is the frame's length on the wire as the capture records it: more than `data.len()` when the capture kept
    /// only its first bytes (`tcpdump -s N`, Wireshark's "packet size limited during capture"). Such a frame's
    /// headers are decoded as Wireshark does, its ICRC is not checked (`icrc=snapped caplen=N`), and it counts
    /// as `snapped`, not as an error; one cut inside its headers is a `SNAPPED` line.
    pub fn frame(&mut self, time: Option<f64>, ethernet: bool, data: &[u8], orig_len: usize) -> io::Result<()> {
        self.summary.frames += 1;
        if let Some(t) = time {
            let t0 = *self.t0.get_or_insert(t);
            self.last = t - t0;
        }
        let ts = self.last;
        let n = self.summary.frames;
        let snapped = orig_len > data.len();
        let frame: &[u8] = if snapped {
            // Rebuilt to its original length so that the IP and UDP lengths agree with it; the parser reads only
            // the headers, which must have been captured (checked below), and the ICRC, which is not reported.
            self.whole.clear();
            self.whole.extend_from_slice(data);
            self.whole.resize(orig_len.min(MAX_FRAME).max(data.len()), 0);
            &self.whole
        } else {
            data
        };
        let verdict = if ethernet { classify(frame) } else { Verdict::Other };
        let cut = match &verdict {
            Verdict::Roce(f) => snapped && f.repr.payload_offset() > data.len(),
            Verdict::Malformed(_) => snapped && data.len() < base_headers(data),
            Verdict::Other => false,
        };
        self.line.clear();
        match verdict {
            Verdict::Other => return Ok(()),
            _ if cut => {
                self.summary.roce += 1;
                self.summary.snapped += 1;
                let len = data.len();
                if self.opts.json {
                    let _ = write!(
                        self.line,
                        "{{\"ts\":{ts:.6},\"frame\":{n},\"snapped\":\"the capture cut the RoCE headers\",\"caplen\":{len},\"len\":{orig_len}}}"
                    );
                } else {
                    let _ = write!(
                        self.line,
                        "{ts:.6} SNAPPED frame={n} caplen={len} len={orig_len} reason=\"the capture cut the RoCE headers\""
                    );
                }
            }
            Verdict::Roce(f) => {
                self.summary.roce += 1;
                if snapped {
                    self.summary.snapped += 1;
                } else if f.icrc_ok {
                    self.summary.icrc_ok += 1;
                } else {
                    self.summary.icrc_bad += 1;
                }
                if self.opts.json {
                    format_json(&mut self.line, ts, &f, data, self.opts.verbose);
                } else {
                    format_text(&mut self.line, ts, &f, data, self.opts.verbose);
                }
            }
            Verdict::Malformed(e) => {
                self.summary.roce += 1;
                self.summary.malformed += 1;
                if self.opts.json {
                    let _ = write!(self.line, "{{\"ts\":{ts:.6},\"frame\":{n},\"malformed\":");
                    json_str(&mut self.line, &e.to_string());
                    self.line.push('}');
                } else {
                    let _ = write!(self.line, "{ts:.6} MALFORMED frame={n} reason=\"{e}\"");
                }
                if self.opts.verbose && !self.opts.json {
                    self.line.push_str("\n    raw ");
                    hex(&mut self.line, &data[..data.len().min(ETHERNET_HEADER_LEN + 80)]);
                }
            }
        }
        self.line.push('\n');
        self.out.write_all(self.line.as_bytes())
    }

    /// The counts so far.
    pub fn summary(&self) -> Summary {
        self.summary
    }

    /// Writes the summary line, flushes, and returns the counts.
    pub fn finish(mut self) -> io::Result<Summary> {
        writeln!(self.out, "{}", self.summary)?;
        self.out.flush()?;
        Ok(self.summary)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roce_dp::wire::{
        emit_frame, AethRepr, BthRepr, DethRepr, Ecn, EthRepr, ExtRepr, IpRepr, MacAddr, Opcode, Psn, RethRepr,
        RoceRepr, VlanTag,
    };

    fn repr(op: Opcode) -> RoceRepr {
        RoceRepr {
            eth: EthRepr { dst: MacAddr([2, 0, 0, 0, 0, 2]), src: MacAddr([2, 0, 0, 0, 0, 1]), vlan: None },
            ip: IpRepr {
                addrs: IpAddrs::V4 { src: [10, 50, 0, 1], dst: [10, 50, 0, 2] },
                ttl: 64,
                dont_frag: true,
                ident: 0x1234,
                ..IpRepr::default()
            },
            udp_src: 49320,
            udp_dst: ROCE_UDP_PORT,
            bth: BthRepr { opcode: op, dest_qp: 0x2f, psn: Psn::new(0xdab31a), ..BthRepr::default() },
            ext: ExtRepr::default(),
        }
    }

    fn frame(r: &RoceRepr, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; 2048];
        let n = emit_frame(&mut buf, r, len, |p| p.fill(0x11)).unwrap();
        buf.truncate(n);
        buf
    }

    fn text(buf: &[u8], verbose: bool) -> String {
        let Verdict::Roce(f) = classify(buf) else { panic!("not RoCE") };
        let mut s = String::new();
        format_text(&mut s, 0.001234, &f, buf, verbose);
        s
    }

    #[test]
    fn write_first_line() {
        let mut r = repr(Opcode::RC_RDMA_WRITE_FIRST);
        r.ext.reth = Some(RethRepr { va: 0x55c4_cf0e_2000, rkey: 0x20bb, len: 4096 });
        assert_eq!(
            text(&frame(&r, 1024), false),
            "0.001234 10.50.0.1:49320 -> 10.50.0.2:4791 RC_RDMA_WRITE_FIRST dqp=0x00002f psn=0xdab31a ackreq=0 se=0 \
             m=0 pad=0 reth{va=0x55c4cf0e2000 rkey=0x20bb len=4096} len=1024 ecn=00 icrc=ok"
        );
    }

    #[test]
    fn aeth_kinds_and_flags() {
        let mut r = repr(Opcode::RC_ACKNOWLEDGE);
        r.bth.ack_req = true;
        r.ext.aeth = Some(AethRepr::nak(NakCode::PsnSeqErr, 3));
        let s = text(&frame(&r, 0), false);
        assert!(s.contains(" ackreq=1 ") && s.contains(" aeth{NAK syn=0x60 code=PSN_SEQ_ERR msn=3} len=0 "), "{s}");
        r.ext.aeth = Some(AethRepr::rnr_nak(14, 5));
        assert!(text(&frame(&r, 0), false).contains(" aeth{RNR_NAK syn=0x2e timer=14 msn=5} "));
        r.ext.aeth = Some(AethRepr::ack(1));
        assert!(text(&frame(&r, 0), false).contains(" aeth{ACK syn=0x1f credits=31 msn=1} "));
        let mut c = repr(Opcode::CNP);
        c.bth = BthRepr::cnp(0x11);
        c.ip.ecn = Ecn::Ce;
        let s = text(&frame(&c, 0), false);
        assert!(
            s.contains(" CNP dqp=0x000011 psn=0x000000 ") && s.contains(" becn=1 ") && s.contains(" ecn=11 "),
            "{s}"
        );
    }

    #[test]
    fn ud_ipv6_vlan_verbose() {
        let mut r = repr(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE);
        let mut src = [0u8; 16];
        src[..2].copy_from_slice(&[0xfe, 0x80]);
        src[15] = 1;
        r.ip.addrs = IpAddrs::V6 { src, dst: src };
        r.eth.vlan = Some(VlanTag { pcp: 3, dei: false, vid: 100 });
        r.ext.deth = Some(DethRepr { qkey: 0x1111_1111, src_qp: 0x12 });
        r.ext.imm = Some(0xdead_beef);
        let s = text(&frame(&r, 5), true);
        let lines: Vec<&str> = s.lines().collect();
        assert_eq!(lines.len(), 3, "{s}");
        assert!(lines[0].starts_with("0.001234 [fe80::1]:49320 -> [fe80::1]:4791 UD_SEND_ONLY_WITH_IMMEDIATE "), "{s}");
        assert!(lines[0].contains(" pad=3 deth{qkey=0x11111111 sqp=0x000012} imm=0xdeadbeef len=5 "), "{s}");
        assert!(lines[1].contains("vlan{vid=100 pcp=3 dei=0} ipv6{hlim=64 dscp=0 flow=0x00000}"), "{s}");
        // Header hex: 18 (tagged Ethernet) + 40 + 8 + 12 + 8 + 4 bytes.
        assert_eq!(lines[2].trim_start().strip_prefix("hdr ").unwrap().len(), 2 * (18 + 40 + 8 + 24));
    }

    #[test]
    fn json_object() {
        let mut r = repr(Opcode::RC_RDMA_READ_REQUEST);
        r.ext.reth = Some(RethRepr { va: u64::MAX, rkey: 7, len: 4096 });
        let buf = frame(&r, 0);
        let Verdict::Roce(f) = classify(&buf) else { panic!() };
        let mut s = String::new();
        format_json(&mut s, 1.5, &f, &buf, true);
        assert!(s.starts_with("{\"ts\":1.500000,\"src\":\"10.50.0.1\",\"sport\":49320,\"dst\":\"10.50.0.2\""), "{s}");
        assert!(s.contains(",\"opcode\":\"RC_RDMA_READ_REQUEST\",\"opcode_num\":12,\"dqp\":47,\"psn\":14332698,"));
        assert!(s.contains(",\"reth\":{\"va\":\"0xffffffffffffffff\",\"rkey\":7,\"len\":4096},"), "{s}");
        assert!(s.contains(",\"icrc_ok\":true,") && s.ends_with("\"}"), "{s}");
        let mut j = String::new();
        json_str(&mut j, "a\"b\\c\n");
        assert_eq!(j, r#""a\"b\\c\u000a""#);
    }

    #[test]
    fn dumper_counts_and_summary() {
        let good = frame(&repr(Opcode::RC_SEND_ONLY), 64);
        let mut bad_icrc = good.clone();
        *bad_icrc.last_mut().unwrap() ^= 1;
        let mut malformed = good.clone();
        malformed[43] = 0x01; // BTH version 1
        let mut tcp = good.clone();
        tcp[23] = 6;
        let mut other_udp = good.clone();
        other_udp[37] = 0x35;
        let mut out = Vec::new();
        let mut d = Dumper::new(&mut out, Options::default());
        for (i, f) in [&good, &bad_icrc, &malformed, &tcp, &other_udp, &good[..20].to_vec()].iter().enumerate() {
            d.frame(Some(100.0 + i as f64), true, f, f.len()).unwrap();
        }
        d.frame(None, false, &good, good.len()).unwrap();
        let s = d.finish().unwrap();
        assert_eq!(s, Summary { frames: 7, roce: 4, icrc_ok: 1, icrc_bad: 1, malformed: 2, snapped: 0 });
        assert_eq!(s.exit_code(), 1);
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(
            lines[0].starts_with("0.000000 ") && lines[1].starts_with("1.000000 ") && lines[1].ends_with("icrc=BAD")
        );
        assert_eq!(lines[2], "2.000000 MALFORMED frame=3 reason=\"bad BTH transport version\"");
        assert_eq!(lines[3], "5.000000 MALFORMED frame=6 reason=\"truncated frame\"");
        assert_eq!(lines[4], "frames=7 roce=4 icrc_ok=1 icrc_bad=1 malformed=2");
        assert_eq!(Summary::default().exit_code(), 0);
    }
}
