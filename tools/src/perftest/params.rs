//! perftest's command line for the eight tools: the same short and long flags, the same defaults per test
//! (`perftest_parameters.h`: size 65536 BW / 2 latency / 8 atomic, 5000 iterations for write BW and 1000
//! otherwise, TX depth 128 BW / 1 latency, RX depth 512 send / 1 RDMA, CQ moderation 100, `-u` 14, port 18515),
//! and the same clamping of the depths to the iteration count that perftest's banner shows.
//!
//! Flags perftest only accepts in some tests (`-A` atomic, `-o` read/atomic, `-b`/`-N`/`-Q`/`--report_gbits`/
//! `--run_infinitely` BW, `-r` send) are refused in the others with one line, as is a connection type other than
//! RC (the engine is RC only).

use super::exchange::{Mtu, TestKind, Verb, DEFAULT_PORT};
use clap::error::ErrorKind;
use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};
use std::ffi::OsString;
use std::path::PathBuf;

/// perftest's smallest and largest iteration counts (`MIN_ITER`, `MAX_ITER`).
pub const MIN_ITERS: u64 = 5;
/// See [`MIN_ITERS`].
pub const MAX_ITERS: u64 = 100_000_000;
/// The largest size `-a` runs (2^23; it starts at 2).
pub const MAX_ALL_SIZE_LOG2: u32 = 23;
/// The largest `-s` (perftest: `UINT_MAX / 2`).
pub const MAX_SIZE: u64 = (1 << 31) - 1;
/// perftest signals every WR (CQ moderation 1) for messages above this size unless `-Q` is given, `-a` runs or
/// `-e` sleeps on events (`MSG_SIZE_CQ_MOD_LIMIT`; "we disable cq_mod for large message size to prevent from
/// incorrect BW calculation").
pub const CQ_MOD_SIZE_LIMIT: u64 = 8192;

/// `-A`: the atomic operation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum AtomicType {
    /// Compare and swap.
    #[value(name = "CMP_AND_SWAP")]
    CmpAndSwap,
    /// Fetch and add (perftest's default).
    #[value(name = "FETCH_AND_ADD")]
    FetchAndAdd,
}

impl AtomicType {
    /// As perftest spells it (flag value and test title).
    pub fn name(self) -> &'static str {
        match self {
            AtomicType::CmpAndSwap => "CMP_AND_SWAP",
            AtomicType::FetchAndAdd => "FETCH_AND_ADD",
        }
    }
}

/// The raw command line (shared by the eight tools; what a test does not accept is refused after parsing).
/// roce-dp's own flags, taken off the command line before perftest's are parsed (tools/src/perftest/run.rs).
const ROCE_DP_FLAGS: &str = "roce-dp options (one of the first two is required):
  --port-conf FILE      run an engine in this process on the DPDK port of a profile (conf/*.toml)
  --daemon SOCKET       run the QPs in a running roce-dpd, through its Unix socket
  --lcore N             EAL main lcore (--port-conf; default: the profile's)
  --file-prefix P       EAL file prefix (--port-conf; default rdpp_PID)
  --socket PATH         memif socket path, overriding the profile's
  --poll-sleep US       with --daemon: sleep US (0-1000000) microseconds when a traffic loop turn moved nothing
  --event-moderation N:US  with --daemon and -e: each CQ's event waits for N completions or US microseconds
                        after the first (ibv_modify_cq's cq_count / cq_period; both >= 1, up to 65535)
  --timeout S           give up after S (1-31536000) seconds without progress (connect, exchange, run; default 60)";

#[derive(Parser, Debug, Clone)]
#[command(
    version,
    allow_negative_numbers = true,
    about = "perftest-compatible RoCEv2 test (server without HOST, client with HOST)",
    after_help = ROCE_DP_FLAGS
)]
struct Cli {
    /// Server's management address (client mode); without it we are the server.
    host: Option<String>,
    /// TCP port of the out-of-band exchange.
    /// (1-65535: port 0 would have the server listen on a port the kernel picks, which no client knows.)
    #[arg(short = 'p', long = "port", default_value_t = DEFAULT_PORT, value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// Device name (accepted for compatibility; shown in the banner).
    #[arg(short = 'd', long = "ib-dev")]
    ib_dev: Option<String>,
    /// Port number on the device (accepted for compatibility).
    #[arg(short = 'i', long = "ib-port", default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=3))]
    ib_port: u8,
    /// GID index of the RoCE address.
    #[arg(short = 'x', long = "gid-index", value_parser = clap::value_parser!(u32).range(0..=64))]
    gid_index: Option<u32>,
    /// Path MTU in bytes (256, 512, 1024, 2048, 4096); default: the port's, then the smaller of both sides.
    #[arg(short = 'm', long = "mtu", value_parser = parse_mtu)]
    mtu: Option<Mtu>,
    /// Connection type (only RC).
    #[arg(short = 'c', long = "connection", default_value = "RC")]
    connection: String,
    /// Message size in bytes, 1 to 2^31-1; as perftest, a K or M suffix multiplies by 1024 or 1024^2 and 0x
    /// reads hex (default 65536 in BW tests, 2 in latency tests, 8 in atomic tests).
    #[arg(short = 's', long = "size", conflicts_with = "all", value_parser = parse_size)]
    size: Option<u64>,
    /// Run all sizes from 2 to 2^23 bytes.
    #[arg(short = 'a', long = "all")]
    all: bool,
    /// Iterations (default 5000 in write BW, 1000 in the others).
    #[arg(short = 'n', long = "iters", conflicts_with = "duration", value_parser = crate::whole_arg::<MIN_ITERS, MAX_ITERS>)]
    iters: Option<u64>,
    /// Number of QPs.
    #[arg(short = 'q', long = "qp", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16384))]
    qp: u32,
    /// Send queue depth (default 128 in BW tests, 1 in latency tests; at most the iterations).
    #[arg(short = 't', long = "tx-depth", value_parser = clap::value_parser!(u32).range(1..=15000))]
    tx_depth: Option<u32>,
    /// Receive queue depth (send tests; default 512, at most the iterations).
    #[arg(short = 'r', long = "rx-depth", value_parser = clap::value_parser!(u32).range(1..=16384))]
    rx_depth: Option<u32>,
    /// Run for this many seconds instead of a number of iterations.
    #[arg(short = 'D', long = "duration", conflicts_with = "all", value_parser = clap::value_parser!(u32).range(1..))]
    duration: Option<u32>,
    /// Duration mode: seconds left out of the measurement at the start and at the end (default: a quarter of -D).
    #[arg(short = 'f', long = "margin", requires = "duration")]
    margin: Option<u32>,
    /// QP local ACK timeout exponent: 4.096 us * 2^N.
    #[arg(short = 'u', long = "qp-timeout", default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..=31))]
    qp_timeout: u8,
    /// Outstanding RDMA READs / atomics each side accepts (read and atomic tests; default 16, at most 128).
    #[arg(short = 'o', long = "outs", value_parser = clap::value_parser!(u32).range(1..=128))]
    outs: Option<u32>,
    /// Atomic operation (atomic tests).
    #[arg(short = 'A', long = "atomic_type", value_enum)]
    atomic_type: Option<AtomicType>,
    /// Bidirectional: both sides send (BW tests).
    #[arg(short = 'b', long = "bidirectional")]
    bidirectional: bool,
    /// Do not fail when the CPU frequency cannot be pinned (accepted; we time with the TSC/clock).
    #[arg(short = 'F', long = "CPU-freq")]
    cpu_freq: bool,
    /// Do not compute the peak bandwidth (BW tests).
    #[arg(short = 'N', long = "noPeak")]
    no_peak: bool,
    /// Request a completion every N sends (BW tests; default 100, or 1 for messages above 8 KiB without -a or -e, as
    /// perftest; at most the send queue depth).
    #[arg(short = 'Q', long = "cq-mod", value_parser = clap::value_parser!(u32).range(1..=1024))]
    cq_mod: Option<u32>,
    /// Report Gb/s instead of MiB/s (BW tests).
    #[arg(long = "report_gbits")]
    report_gbits: bool,
    /// Run until interrupted, printing a result every duration (BW tests).
    #[arg(long = "run_infinitely", conflicts_with_all = ["all", "iters"])]
    run_infinitely: bool,
    /// Also print the results as JSON.
    #[arg(long = "out_json")]
    out_json: bool,
    /// Write the JSON results to this file (implies --out_json).
    #[arg(long = "out_json_file")]
    out_json_file: Option<PathBuf>,
    /// Verify every payload byte (ours; perftest has no equivalent in 4.5).
    #[arg(long = "data_validation")]
    data_validation: bool,
    /// Sleep on CQ events (default poll). With --daemon only; not in write_lat (its receiver polls memory).
    #[arg(short = 'e', long = "events", visible_alias = "use_event")]
    events: bool,
}

/// `-s` as perftest reads it: a trailing `K` or `M` multiplies by 1024 or 1024^2, the number is C's `strtol(s, NULL,
/// 0)` (decimal, `0x` hex, a leading `0` octal); 1 to 2^31-1 ("Message Size should be between 1 and 2147483647").
/// Where perftest's `strtol` would stop at the first stray character and use what came before, this refuses it.
fn parse_size(s: &str) -> Result<u64, String> {
    let (digits, factor) = match s.strip_suffix('K') {
        Some(d) => (d, 1024),
        None => s.strip_suffix('M').map_or((s, 1), |d| (d, 1024 * 1024)),
    };
    let n = if let Some(h) = digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else if digits.len() > 1 && digits.starts_with('0') {
        u64::from_str_radix(&digits[1..], 8)
    } else {
        digits.parse::<u64>()
    };
    let n = n.map_err(|_| format!("{s:?} is not a message size (bytes, or with a K or M suffix)"))?;
    n.checked_mul(factor)
        .filter(|v| (1..=MAX_SIZE).contains(v))
        .ok_or_else(|| format!("message size {s} is out of range: it should be between 1 and {MAX_SIZE}"))
}

fn parse_mtu(s: &str) -> Result<Mtu, String> {
    s.parse::<u32>().ok().and_then(Mtu::from_bytes).ok_or_else(|| "the MTU must be 256, 512, 1024, 2048 or 4096".into())
}

/// Iterations or time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunLength {
    /// A number of iterations per size.
    Iterations(u64),
    /// Seconds (`-D`), of which `margin` at each end are not measured (`-f`; perftest: a quarter of them).
    Duration {
        /// Whole run, seconds.
        secs: u32,
        /// Warm-up and cool-down, seconds each.
        margin: u32,
    },
    /// `--run_infinitely`: a result every this many seconds until interrupted.
    Infinitely(u32),
}

/// A test's settings after defaults and checks.
#[derive(Clone, Debug, PartialEq)]
pub struct Params {
    /// Which test.
    pub test: TestKind,
    /// The server's address: `Some` makes us the client.
    pub host: Option<String>,
    /// TCP port of the exchange.
    pub port: u16,
    /// `-d` (banner only).
    pub ib_dev: Option<String>,
    /// `-i`.
    pub ib_port: u8,
    /// `-x`.
    pub gid_index: Option<u32>,
    /// `-m`: a forced MTU (the exchange then refuses a peer that cannot use it).
    pub mtu: Option<Mtu>,
    /// Message sizes to run (one, or 2..2^23 with `-a`).
    pub sizes: Vec<u64>,
    /// `-a`.
    pub all: bool,
    /// Iterations, duration or forever.
    pub run: RunLength,
    /// `-q`.
    pub num_qps: u32,
    /// Send queue depth after perftest's clamping to the iteration count.
    pub tx_depth: u32,
    /// Receive queue depth after clamping (used by the send tests).
    pub rx_depth: u32,
    /// Completion moderation after clamping to the TX depth (BW tests).
    pub cq_mod: u32,
    /// `-u`.
    pub qp_timeout: u8,
    /// `-o` (read/atomic tests); `None`: the device's maximum.
    pub out_reads: Option<u32>,
    /// `-A` (atomic tests; FETCH_AND_ADD by default).
    pub atomic_type: AtomicType,
    /// `-b`.
    pub duplex: bool,
    /// `-F`.
    pub cpu_freq_ignore: bool,
    /// `-N`.
    pub no_peak: bool,
    /// `--report_gbits`.
    pub report_gbits: bool,
    /// `--out_json` (or `--out_json_file`).
    pub out_json: bool,
    /// `--out_json_file`.
    pub out_json_file: Option<PathBuf>,
    /// `--data_validation`.
    pub data_validation: bool,
    /// `-e` / `--events`: the traffic loops sleep on a completion channel when a turn moved nothing.
    pub use_event: bool,
}

impl Params {
    /// True when a host was given.
    pub fn is_client(&self) -> bool {
        self.host.is_some()
    }

    /// Parses `args` (the first is the program name) for `test`. Errors are clap's (help and version included).
    pub fn try_parse_from<I, T>(test: TestKind, args: I) -> Result<Params, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut cmd = Cli::command().name(test.tool_name()).bin_name(test.tool_name());
        let m = cmd.try_get_matches_from_mut(args)?;
        let cli = Cli::from_arg_matches(&m).map_err(|e| e.format(&mut cmd))?;
        from_cli(test, cli).map_err(|msg| cmd.error(ErrorKind::ArgumentConflict, msg))
    }

    /// Parses the process's arguments; on a bad command line prints one line (`TOOL: reason`) to stderr and
    /// exits with status 2; `--help` and `--version` print and exit 0.
    pub fn parse_or_exit(test: TestKind) -> Params {
        Params::parse_from_or_exit(test, std::env::args_os())
    }

    /// [`Params::parse_or_exit`] on the given arguments (the first is the program name).
    pub fn parse_from_or_exit<I, T>(test: TestKind, args: I) -> Params
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        match Params::try_parse_from(test, args) {
            Ok(p) => p,
            Err(e) => {
                if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                    e.exit();
                }
                eprintln!("{}", one_line_error(test, &e));
                std::process::exit(2);
            }
        }
    }
}

/// A clap error as one line: `rdp_write_bw: unexpected argument '--foo' found (see --help)`.
pub fn one_line_error(test: TestKind, e: &clap::Error) -> String {
    use clap::error::{ContextKind, ContextValue};
    if e.kind() == ErrorKind::UnknownArgument {
        if let Some(ContextValue::String(arg)) = e.get(ContextKind::InvalidArg) {
            let flag = arg.split_once('=').map_or(arg.as_str(), |(f, _)| f);
            if let Some((names, why)) = PERFTEST_ONLY.iter().find(|(names, _)| names.split('/').any(|n| n == flag)) {
                // A flag and its alias are named together (`-R/--rdma_cm`); one of a group, alone.
                let shown = if names.split('/').count() <= 2 { names } else { flag };
                return format!("{}: perftest's {shown} is not supported by roce-dp: {why}", test.tool_name());
            }
        }
    }
    format!("{}: {} (see --help)", test.tool_name(), crate::clap_error_line(e, &Cli::command()))
}

/// perftest flags the tools do not take, and why: a perftest user gets that instead of "unexpected argument".
const PERFTEST_ONLY: &[(&str, &str)] = &[
    ("-R/--rdma_cm", "the QPs connect through perftest's TCP exchange (the default without -R)"),
    ("-z/--comm_rdma_cm", "the exchange runs over TCP (perftest's default)"),
    ("-l/--post_list", "every WR is posted on its own"),
    (
        "-I/--inline_size",
        "no inline sends in these tools (`rdp-client active --inline N` shows the daemon's inline path)",
    ),
    ("-S/--sl", "RoCE has no service level; the engine sends DSCP 0 with ECT(0)"),
    ("--tclass", "the engine sends DSCP 0 with ECT(0)"),
    ("-w/--limit_bw", "no bandwidth limit or check"),
    ("-y/--limit_msgrate", "no message-rate limit or check"),
    ("--cpu_util", "no CPU utilisation report"),
    ("--use-srq", "no shared receive queues"),
    ("--odp", "no on-demand paging: every region is registered whole"),
    ("--write_with_imm", "rdp_write_bw posts plain RDMA WRITEs"),
    ("--dont_xchg_versions", "the version and MTU exchange always runs"),
    ("-g/--mcg", "no multicast: RC only"),
    ("-M/--MGID", "no multicast: RC only"),
    ("-O/--dualport", "one port per soft NIC"),
    (
        "-B/--source_mac/-E/--dest_mac/-J/--dest_ip/-j/--source_ip/-K/--dest_port/-k/--source_port/-Y/--ethertype/\
         -Z/--server/-P/--client/-v/--mac_fwd/-G/--use_rss/--tcp/--remote_mac/--local_mac/--remote_ip/--local_ip/\
         --remote_port/--local_port/--promiscuous/--sniffer/--raw_mcast/--raw_ipv6/--flows/--flows_burst/--vlan_en/\
         --vlan_pcp/--typical_pkt_size/--connectionless/--disable_fcs",
        "raw Ethernet and UD tests (raw_ethernet_*) are not implemented",
    ),
    (
        "-C/--report-cycles/-H/--report-histogrm/-U/--report-unsorted/--output",
        "the latency and BW tests print perftest's summary table, in microseconds and MiB/s or Gb/s",
    ),
    ("-T/--tos", "a ToS is for rdma_cm QPs (-R), which these tools do not use; the engine sends DSCP 0 with ECT(0)"),
    ("-W/--report-counters", "no device counters here: roce-stat prints roce-dpd's"),
    ("-X/--vector", "one completion channel per tool (-e)"),
    ("--retry_count", "the QPs retry 7 times, perftest's default"),
    ("--pkey_index", "one partition, P_Key 0xffff"),
    ("--dlid", "RoCE has no LIDs"),
    ("--force-link", "the link is always Ethernet"),
    ("--rate_limit/--rate_limit_type/--rate_units/--burst_size", "no rate limiter: DCQCN paces the QPs"),
    (
        "--use_cuda_bus_id/--use_cuda_dmabuf/--use_neuron/--use_neuron_dmabuf/--use_hl/--use_mlu/--use_null_mr/\
         --use-null-mr/--mmap-offset/--payload_file_path/--mr_per_qp/--inline_recv/--recv_post_list",
        "every QP has one region of host memory, filled by the tool",
    ),
    (
        "--latency_gap/--reply_every/--perform_warm_up/--wait_destroy/--flow_label/--use_old_post_send/--ipv6-addr/\
         --use_ooo/--disable_pcie_relaxed/--no_lock/--no_ddp/--congest_type/--unsolicited_write/--aes_xts/\
         --encrypt_on_tx/--sig_before/--aes_block_size/--kek_path/--credentials_path/--data_enc_keys_number/\
         --data_enc_key_app_path/--log_dci_streams/--log_active_dci_streams/--use_exp/--verb_type/--use_res_domain",
        "not implemented in these tools",
    ),
    ("-L/--hop_limit", "the engine sends TTL/hop limit 64"),
    ("--report-both", "each side prints its own report"),
    ("--report-per-port", "one port per soft NIC"),
    ("--reversed", "the client sends"),
    ("--ipv6", "the GID follows the profile's address"),
    ("--use_hugepages", "the profile's [eal] hugepages decides"),
    ("--mmap", "regions are allocated by the tool"),
    ("--use_cuda", "no GPU memory"),
    ("--use_rocm", "no GPU memory"),
    ("--bind_source_ip", "the exchange connects from any local address"),
];

fn from_cli(test: TestKind, c: Cli) -> Result<Params, String> {
    let verb = test.verb();
    let bw = test.is_bw();
    let kind = if bw { "BW" } else { "latency" };
    let refuse = |flag: &str, only: &str| Err(format!("{flag} is only available in {only} tests"));
    if !c.connection.eq_ignore_ascii_case("RC") {
        return Err(format!("connection type {:?} is not supported: roce-dp runs RC only", c.connection));
    }
    if c.atomic_type.is_some() && verb != Verb::Atomic {
        return refuse("-A/--atomic_type", "atomic");
    }
    if c.outs.is_some() && !matches!(verb, Verb::Read | Verb::Atomic) {
        return refuse("-o/--outs", "read and atomic");
    }
    if c.rx_depth.is_some() && verb != Verb::Send {
        return refuse("-r/--rx-depth", "send");
    }
    if !bw {
        for (set, flag) in [
            (c.bidirectional, "-b/--bidirectional"),
            (c.no_peak, "-N/--noPeak"),
            (c.cq_mod.is_some(), "-Q/--cq-mod"),
            (c.report_gbits, "--report_gbits"),
            (c.run_infinitely, "--run_infinitely"),
        ] {
            if set {
                return refuse(flag, "BW");
            }
        }
        if c.qp > 1 {
            return Err(format!("-q/--qp {} is not available in {kind} tests (one QP)", c.qp));
        }
    }
    if verb == Verb::Atomic {
        if c.size.is_some_and(|s| s != 8) {
            return Err("the message size of atomic tests is always 8 bytes".into());
        }
        if c.all {
            return Err("-a/--all is not available in atomic tests (the size is always 8)".into());
        }
    }
    let size = c.size.unwrap_or(match (verb, bw) {
        (Verb::Atomic, _) => 8,
        (_, true) => 65536,
        (_, false) => 2,
    });
    let sizes = if c.all { (1..=MAX_ALL_SIZE_LOG2).map(|i| 1u64 << i).collect() } else { vec![size] };
    let run = if c.run_infinitely {
        RunLength::Infinitely(c.duration.unwrap_or(5))
    } else if let Some(secs) = c.duration {
        let margin = c.margin.unwrap_or(secs / 4);
        if secs <= 2 * margin {
            return Err(format!("-D {secs} must be longer than twice the margin -f {margin}"));
        }
        RunLength::Duration { secs, margin }
    } else {
        RunLength::Iterations(c.iters.unwrap_or(if test == TestKind::WriteBw { 5000 } else { 1000 }))
    };
    // perftest shrinks the queues to the iteration count (its banner shows "TX depth : 20" with -n 20).
    let clamp = |depth: u32| match run {
        RunLength::Iterations(n) => depth.min(u32::try_from(n).unwrap_or(u32::MAX)),
        _ => depth,
    };
    let tx_depth = clamp(c.tx_depth.unwrap_or(if bw { 128 } else { 1 }));
    let mut rx_depth = clamp(c.rx_depth.unwrap_or(if verb == Verb::Send { 512 } else { 1 }));
    // perftest's work-around of an odd receive depth in send tests (not with -a or --run_infinitely).
    if verb == Verb::Send && rx_depth % 2 == 1 && !c.all && !c.run_infinitely {
        rx_depth += 1;
    }
    let large = size > CQ_MOD_SIZE_LIMIT && !c.all && !c.events;
    let cq_mod = c.cq_mod.unwrap_or(if large { 1 } else { 100 }).min(tx_depth);
    // perftest measures no peak in duration mode, and none above 20000 iterations (its search is quadratic).
    let no_peak = c.no_peak || !matches!(run, RunLength::Iterations(n) if n <= 20_000);
    if !test.is_bw() && !matches!(run, RunLength::Iterations(_)) {
        return Err("-D is not implemented for the latency tests in roce-dp (BW tests only)".into());
    }
    if c.events && verb == Verb::Write && !bw {
        // perftest 4.5 refuses -e with every WRITE test; roce-dp accepts it in write_bw, whose client waits for
        // send completions like the other BW clients.
        return Err("Events feature not available on WRITE latency test: its receiver polls the buffer's last \
                    byte, and no completion arrives to wake it"
            .into());
    }
    if c.bidirectional && c.data_validation {
        return Err("--data_validation cannot tell our bytes from the peer's with -b; use one or the other".into());
    }
    Ok(Params {
        test,
        host: c.host,
        port: c.port,
        ib_dev: c.ib_dev,
        ib_port: c.ib_port,
        gid_index: c.gid_index,
        mtu: c.mtu,
        sizes,
        all: c.all,
        run,
        num_qps: c.qp,
        tx_depth,
        rx_depth,
        cq_mod,
        qp_timeout: c.qp_timeout,
        out_reads: c.outs,
        atomic_type: c.atomic_type.unwrap_or(AtomicType::FetchAndAdd),
        duplex: c.bidirectional,
        cpu_freq_ignore: c.cpu_freq,
        no_peak,
        report_gbits: c.report_gbits,
        out_json: c.out_json || c.out_json_file.is_some(),
        out_json_file: c.out_json_file,
        data_validation: c.data_validation,
        use_event: c.events,
    })
}
