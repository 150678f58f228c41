//! Shared code for the roce-dp command-line tools.

pub mod capture;
pub mod dump;
pub mod incast;
pub mod perftest;

use roce_dp::{Engine, PeerAddr, QpAttr, QpState};

/// One side of an RC connection as the tools set it up: the peer's QPN and first PSN, ours, the path MTU (bytes)
/// and the local ACK timeout exponent.
#[derive(Clone, Copy, Debug)]
pub struct RcConnect {
    /// Our QP.
    pub qpn: u32,
    /// Our first send PSN.
    pub sq_psn: u32,
    /// The peer's QP.
    pub dest_qpn: u32,
    /// The peer's first send PSN (our expected receive PSN).
    pub rq_psn: u32,
    /// Path MTU in bytes.
    pub path_mtu: u32,
    /// Local ACK timeout exponent (4.096 us * 2^t).
    pub timeout: u8,
    /// READ/atomic requests this QP may have outstanding (its initiator depth: at most the peer's responder
    /// resources).
    pub max_rd_atomic: u8,
    /// READ/atomic requests of the peer this QP holds resources for (its responder resources).
    pub max_dest_rd_atomic: u8,
}

/// The RTR and RTS attributes of an RC connection: the READ/atomic depths of `c`, retry_cnt and rnr_retry 7,
/// min_rnr_timer 1 (RTR without the peer's address: the caller adds it, or the daemon builds it from the GID).
pub fn rc_attrs(c: &RcConnect) -> (QpAttr, QpAttr) {
    let rtr = QpAttr {
        state: Some(QpState::Rtr),
        path_mtu: Some(c.path_mtu),
        dest_qpn: Some(c.dest_qpn),
        rq_psn: Some(c.rq_psn),
        max_dest_rd_atomic: Some(c.max_dest_rd_atomic),
        min_rnr_timer: Some(1),
        ..QpAttr::default()
    };
    let rts = QpAttr {
        state: Some(QpState::Rts),
        sq_psn: Some(c.sq_psn),
        timeout: Some(c.timeout),
        retry_cnt: Some(7),
        rnr_retry: Some(7),
        max_rd_atomic: Some(c.max_rd_atomic),
        ..QpAttr::default()
    };
    (rtr, rts)
}

/// INIT -> RTR -> RTS towards `peer` with [`rc_attrs`]. Errors name the step.
pub fn connect_rc(e: &mut Engine, c: &RcConnect, peer: PeerAddr) -> Result<(), String> {
    let (rtr, rts) = rc_attrs(c);
    let rtr = QpAttr { peer: Some(peer), ..rtr };
    e.modify_qp(c.qpn, &rtr).map_err(|x| format!("modify_qp RTR: {x}"))?;
    e.modify_qp(c.qpn, &rts).map_err(|x| format!("modify_qp RTS: {x}"))
}

/// Writes `args` to stdout for a tool's report ([`out!`], [`outln!`]), never panicking as `print!` does when stdout
/// cannot be written: a reader that went away (`roce-stat --json | head -c 100`) ends the process quietly with status
/// 141, as SIGPIPE's default action would (the tools keep Rust's ignored SIGPIPE: a write to a socket whose peer went
/// must be an error, not a death), and any other error (`> /dev/full`) with one line naming stdout and status 2.
pub fn write_stdout(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    if let Err(e) = std::io::stdout().lock().write_fmt(args) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(128 + libc::SIGPIPE);
        }
        let exe = std::env::args_os().next().map(std::path::PathBuf::from).unwrap_or_default();
        let tool = exe.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "roce-dp".into());
        eprintln!("{tool}: writing to stdout: {e}");
        std::process::exit(2);
    }
}

/// `print!` through [`write_stdout`].
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::write_stdout(format_args!($($t)*)) };
}

/// `println!` through [`write_stdout`].
#[macro_export]
macro_rules! outln {
    () => { $crate::write_stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::write_stdout(format_args!("{}\n", format_args!($($t)*))) };
}

/// The longest wait or run a tool's `--timeout`/`--seconds` may ask for: a year. Larger values would overflow the
/// deadline (`Instant + Duration` panics past the clock's range) and mean "never" anyway.
pub const MAX_SECONDS: u64 = 365 * 24 * 3600;

/// clap's parser for a duration in seconds given as a decimal (`--seconds 0.5`): finite, above 0 and at most
/// [`MAX_SECONDS`] (a negative, NaN or infinite value made `Duration::from_secs_f64` panic).
pub fn seconds_arg(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= MAX_SECONDS as f64 => Ok(v),
        Ok(_) => Err(format!("not in (0, {MAX_SECONDS}] seconds")),
        Err(_) => Err("not a number of seconds".into()),
    }
}

/// clap's parser for a whole number in `LO..=HI` (`--timeout 30`, `--iters 1000`). clap's own for a `u64` said only
/// "invalid digit found in string" for `-1` (and for `1.5`), not that the value was negative or what it may be.
pub fn whole_arg<const LO: u64, const HI: u64>(s: &str) -> Result<u64, String> {
    let range = if HI == u64::MAX { format!("{LO} or more") } else { format!("{LO}..={HI}") };
    match s.parse::<u64>() {
        Ok(v) if (LO..=HI).contains(&v) => Ok(v),
        Ok(v) if HI == u64::MAX => Err(format!("{v} is less than {LO}")),
        Ok(v) => Err(format!("{v} is not in {range}")),
        Err(_) if s.starts_with('-') && s[1..].parse::<f64>().is_ok() => {
            Err(format!("{s} is negative: give a whole number, {range}"))
        }
        Err(_) => Err(format!("not a whole number: give one, {range}")),
    }
}

/// clap's parser for a percentage (`--inject-loss 5`): a finite number in 0..=100 (out-of-range values were
/// silently clamped, NaN taken as 0).
pub fn percent_arg(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=100.0).contains(&v) => Ok(v),
        Ok(_) => Err("not a percentage in 0..=100".into()),
        Err(_) => Err("not a number".into()),
    }
}

/// clap's parser for `--file-prefix`: a plain name ([`roce_dp::dpdk::check_file_prefix`]), since each tool removes
/// `/var/run/dpdk/<prefix>` recursively when it exits.
#[cfg(feature = "dpdk")]
pub fn file_prefix_arg(s: &str) -> Result<String, String> {
    roce_dp::dpdk::check_file_prefix(s).map(|()| s.to_owned())
}

/// Removes the EAL runtime directory of `prefix` (`/var/run/dpdk/<prefix>`) when the tool exits; nothing for a
/// prefix that is not a plain name (the tools refuse those before EAL starts).
#[cfg(feature = "dpdk")]
pub fn remove_runtime_dir(prefix: &str) {
    if let Some(dir) = roce_dp::dpdk::runtime_dir_of(prefix) {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// A line DPDK prints on a step that succeeds ([`dpdk_explanation`]).
fn is_noise(line: &str) -> bool {
    const NOISE: &[&str] = &[
        "Failed to register mp action callback",
        "multiq qdisc",
        "Disabling rte flow support",
        "Failed to send start req to secondary",
    ];
    NOISE.iter().any(|n| line.contains(n))
}

/// DPDK's own explanation of a failure: the first line of its output that reports one, minus known noise: lines
/// DPDK prints on a probe or start that succeeds (memif without multi-process support; net_tap on a kernel without
/// the multiq qdisc, which then runs without rte_flow; net_tap's start with no secondary process), which would
/// otherwise stand for every later step's failure.
pub fn dpdk_explanation(log: &str) -> Option<String> {
    log.lines()
        .map(str::trim)
        .find(|l| reports_failure(l))
        .map(|l| l.strip_prefix("rdp-porttest: ").unwrap_or(l).to_owned())
}

/// A line of DPDK's output that reports a failure (a failure word, and not known noise).
fn reports_failure(line: &str) -> bool {
    const WORDS: &[&str] = &["fail", "error", "invalid", "unrecognized", "cannot", "not supported", "too large"];
    let l = line.to_ascii_lowercase();
    !is_noise(line) && WORDS.iter().any(|w| l.contains(w))
}

/// DPDK's reason for the failed probe of device `name` (a vdev's name or a PCI address) while EAL started, from
/// the whole captured `log`: the first line reporting a failure that names the device (the driver's own, e.g.
/// net_af_packet's `rte_pmd_init_internals(): net_af_packet0: ioctl failed ...`), or when that is EAL's bus code
/// reporting it (`vdev_probe(): failed to initialize net_memif0 device`) and the driver's lines just before it report
/// a failure (noise skipped), the nearest of those: the driver's cause (memif's `memif_socket_create(): Failed to setup socket ...: Address
/// already in use`). Failure-worded lines elsewhere in EAL's start (at debug level, `EAL: lib.rcu log level changed
/// from disabled to error`; `EAL: Module /sys/module/vfio not found! error 2`) never stand for it.
pub fn probe_explanation(log: &str, name: &str) -> Option<String> {
    if name.is_empty() {
        return None;
    }
    // EAL's bus code, which reports a probe's failure after the driver said why: `EAL: ...`, `vdev_probe(): ...`.
    let bus = |l: &str| l.starts_with("EAL:") || l.starts_with("vdev_probe()");
    let lines: Vec<&str> = log.lines().map(str::trim).collect();
    let at = lines.iter().position(|l| l.contains(name) && reports_failure(l))?;
    let cause = bus(lines[at])
        .then(|| {
            let before = lines[..at].iter().rev();
            before.take_while(|l| !bus(l) && (is_noise(l) || reports_failure(l))).find(|l| !is_noise(l))
        })
        .flatten();
    Some(cause.unwrap_or(&lines[at]).to_string())
}

/// DPDK's reason for the failure of one step, from what it logged during that step only: the first line reporting a
/// failure ([`dpdk_explanation`]), else the step's one line if it logged exactly one besides known noise (e.g.
/// ethdev's `Ethdev port_id=0 nb_tx_queues=2 > 1`, which has no failure word).
pub fn step_explanation(step_log: &str) -> Option<String> {
    dpdk_explanation(step_log).or_else(|| {
        let mut lines = step_log.lines().map(str::trim).filter(|l| !l.is_empty() && !is_noise(l));
        match (lines.next(), lines.next()) {
            (Some(only), None) => Some(only.to_owned()),
            _ => None,
        }
    })
}

/// A DPDK setup step's error with DPDK's reason for it ([`dpdk_step`]); shows as `ERROR; DPDK: REASON`, or as the
/// error alone when DPDK logged no reason (or logs to the terminal).
#[derive(Debug)]
pub struct DpdkFailure<E> {
    /// The step's own error.
    pub error: E,
    /// `"; DPDK: REASON"`, or empty.
    pub says: String,
}

impl<E: std::fmt::Display> std::fmt::Display for DpdkFailure<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}{}", self.error, self.says)
    }
}

/// Where a DPDK setup step began in DPDK's captured log.
#[cfg(feature = "dpdk")]
#[derive(Clone, Copy, Debug)]
struct DpdkMark(u64);

#[cfg(feature = "dpdk")]
impl DpdkMark {
    /// The end of the log now.
    fn now() -> DpdkMark {
        DpdkMark(roce_dp::dpdk::captured_log_mark())
    }

    /// [`step_explanation`] of what DPDK logged from this mark on.
    fn step_says(self) -> Option<String> {
        step_explanation(&roce_dp::dpdk::captured_log_since(self.0))
    }
}

/// `"; DPDK: WHY"`, or empty.
#[cfg(feature = "dpdk")]
fn says(why: Option<String>) -> String {
    why.map(|why| format!("; DPDK: {why}")).unwrap_or_default()
}

/// Runs one DPDK setup step (EAL init, configure, start); if it fails, its error comes with what DPDK logged during
/// this step ([`step_explanation`] of the captured log after a mark taken just before it, see
/// [`roce_dp::dpdk::Eal::init_captured`]), never with an earlier step's harmless line.
#[cfg(feature = "dpdk")]
pub fn dpdk_step<T, E>(step: impl FnOnce() -> Result<T, E>) -> Result<T, DpdkFailure<E>> {
    let mark = DpdkMark::now();
    step().map_err(|error| DpdkFailure { error, says: says(mark.step_says()) })
}

/// [`dpdk_step`] for the lookup of port `name` (a vdev's name or a PCI address), which fails because the device's
/// probe during EAL's start did: the reason is what DPDK logged about that probe ([`probe_explanation`]), unless
/// the lookup itself logged one.
#[cfg(feature = "dpdk")]
pub fn dpdk_lookup<T, E>(name: &str, step: impl FnOnce() -> Result<T, E>) -> Result<T, DpdkFailure<E>> {
    let mark = DpdkMark::now();
    step().map_err(|error| {
        let why = mark.step_says().or_else(|| probe_explanation(&roce_dp::dpdk::captured_log(), name));
        DpdkFailure { error, says: says(why) }
    })
}

/// Claims `lcores` for this process across processes ([`roce_dp::dpdk::claim_lcore`]: an advisory lock per lcore
/// that the kernel drops when the process ends) and prints `TOOL: warning: lcore N is also polled by pid P (NAME):
/// ...` for each one another process already holds: two pollers pinned to one core each run at about half speed.
#[cfg(feature = "dpdk")]
pub fn claim_lcores(tool: &str, lcores: impl IntoIterator<Item = u32>) {
    for lcore in lcores {
        if let Some(w) = roce_dp::dpdk::claim_lcore(lcore) {
            eprintln!("{tool}: warning: {w}");
        }
    }
}

/// Parses the command line: `--help` / `--version` print and exit 0 (`Err(SUCCESS)`); bad arguments print one line
/// `TOOL: what (see --help)` and exit 2.
pub fn parse_cli<C: clap::Parser>(tool: &str) -> Result<C, std::process::ExitCode> {
    parse_cli_matches(tool).map(|(c, _)| c)
}

/// [`parse_cli`], also returning clap's matches (which flags were given on the command line).
pub fn parse_cli_matches<C: clap::Parser>(tool: &str) -> Result<(C, clap::ArgMatches), std::process::ExitCode> {
    use clap::error::ErrorKind;
    let parsed = negative_numbers(C::command())
        .try_get_matches()
        .and_then(|m| C::from_arg_matches(&m).map(|c| (c, m)).map_err(|e| e.format(&mut C::command())));
    match parsed {
        Ok(c) => Ok(c),
        Err(e) if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            let _ = e.print();
            Err(std::process::ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("{tool}: {} (see --help)", clap_error_line(&e, &C::command()));
            Err(std::process::ExitCode::from(2))
        }
    }
}

/// `cmd` and its subcommands taking `-1` as a flag's value (`--size -1`: "invalid value '-1' for '--size <SIZE>'"),
/// not as an unknown flag (clap's "unexpected argument '-1' found" named no flag); the setting is per command.
fn negative_numbers(cmd: clap::Command) -> clap::Command {
    cmd.allow_negative_numbers(true).mut_subcommands(negative_numbers)
}

/// A clap error as one line, without clap's `error: ` prefix: its first line, with the arguments clap lists on the
/// lines after a trailing colon ("the following required arguments were not provided:") joined onto it; a
/// missing subcommand (clap prints the whole help then) names the subcommands of `cmd`.
pub fn clap_error_line(e: &clap::Error, cmd: &clap::Command) -> String {
    use clap::error::ErrorKind;
    if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
        let subs: Vec<&str> = cmd.get_subcommands().map(|s| s.get_name()).filter(|n| *n != "help").collect();
        return match subs.as_slice() {
            [] => "arguments missing".to_owned(),
            [s @ .., last] => format!("a command is needed: {} or {last}", s.join(", ")),
        };
    }
    let text = e.render().to_string();
    let mut lines = text.lines();
    let first = lines.next().unwrap_or("bad arguments").trim();
    let mut line = first.strip_prefix("error: ").unwrap_or(first).to_owned();
    if line.ends_with(':') {
        let listed: Vec<&str> = lines.map(str::trim).take_while(|l| !l.is_empty()).collect();
        line.pop();
        if !listed.is_empty() {
            line = format!("{line}: {}", listed.join(", "));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::{dpdk_explanation, probe_explanation, step_explanation};

    /// What DPDK 22.11 printed for `rdp-nic -v tap` on this project's VM (kernel 6.1 without sch_multiq): both tap
    /// ports probed and started, the run passed.
    const TAP_OK: &str = "EAL: Detected CPU lcores: 2
EAL: Detected NUMA nodes: 1
EAL: Detected shared linkage of DPDK
EAL: Physical addresses are unavailable, selecting IOVA as VA mode.
EAL: Selected IOVA mode 'VA'
tap_nl_dump_ext_ack(): Specified qdisc kind is unknown
qdisc_create_multiq(): Could not add multiq qdisc (2): No such file or directory
eth_dev_tap_create(): rdptap0: failed to create multiq qdisc.
eth_dev_tap_create():  Disabling rte flow support: No such file or directory(2)
tap_nl_dump_ext_ack(): Specified qdisc kind is unknown
qdisc_create_multiq(): Could not add multiq qdisc (2): No such file or directory
eth_dev_tap_create(): rdptap1: failed to create multiq qdisc.
eth_dev_tap_create():  Disabling rte flow support: No such file or directory(2)
tap_mp_req_on_rxtx(): Failed to send start req to secondary 95
tap_mp_req_on_rxtx(): Failed to send start req to secondary 95
";

    /// A successful probe explains nothing: otherwise every later failure of `rdp-nic tap` (configure, start) on such
    /// a kernel would quote net_tap's multiq warning as DPDK's reason (`...; DPDK: eth_dev_tap_create(): rdptap0:
    /// failed to create multiq qdisc.`). A failure logged after it is what is quoted, past memif's probe noise too.
    #[test]
    fn lines_of_a_probe_that_succeeded_are_no_explanation() {
        assert_eq!(dpdk_explanation(TAP_OK), None);
        let failed = format!("{TAP_OK}memif_connect_client(): Failed to connect socket: /run/x.sock.\n");
        assert_eq!(
            dpdk_explanation(&failed).as_deref(),
            Some("memif_connect_client(): Failed to connect socket: /run/x.sock.")
        );
        let memif = "EAL: Selected IOVA mode 'VA'
rte_pmd_memif_probe(): Failed to register mp action callback: Operation not supported
memif_socket_create(): Failed to setup socket /run/m.sock: Address already in use
";
        assert_eq!(
            dpdk_explanation(memif).as_deref(),
            Some("memif_socket_create(): Failed to setup socket /run/m.sock: Address already in use")
        );
        assert_eq!(
            dpdk_explanation("rdp-porttest: unrecognized option '--bogus'\n").as_deref(),
            Some("unrecognized option '--bogus'")
        );
    }

    /// A step's log: its first failure line; else its one line (ethdev's refusal of a queue count has no failure
    /// word); else nothing (several lines, none a failure, explain nothing).
    #[test]
    fn a_step_is_explained_by_its_failure_line_or_its_only_line() {
        assert_eq!(step_explanation(""), None);
        assert_eq!(
            step_explanation("Ethdev port_id=0 nb_tx_queues=2 > 1\n").as_deref(),
            Some("Ethdev port_id=0 nb_tx_queues=2 > 1")
        );
        let noisy = "tap_mp_req_on_rxtx(): Failed to send start req to secondary 95\nport 0 up\n";
        assert_eq!(step_explanation(noisy).as_deref(), Some("port 0 up"));
        assert_eq!(step_explanation("a\nb\n"), None);
        assert_eq!(step_explanation("a\nb: Invalid argument\nc failed\n").as_deref(), Some("b: Invalid argument"));
    }

    /// A device's failed probe during EAL's start: the driver's cause just before EAL's line naming the device
    /// (memif's probe noise between skipped), or that line alone; failure-worded lines of EAL's start elsewhere,
    /// and another device's failure, are not its reason; a device no line names has none.
    #[test]
    fn a_failed_probe_is_explained_by_the_lines_about_that_device() {
        let log = "EAL: lib.rcu log level changed from disabled to error
EAL: Module /sys/module/vfio not found! error 2 (No such file or directory)
EAL: Main lcore 1 is ready (tid=7fd82d0e9980;cpuset=[1])
rte_pmd_memif_probe(): Failed to register mp action callback: Operation not supported
memif_socket_create(): Failed to setup socket /run/m.sock: Address already in use
vdev_probe(): failed to initialize net_memif0 device
EAL: Bus (vdev) probe failed.
rte_pmd_init_internals(): net_af_packet0: ioctl failed (SIOCGIFINDEX):No such device
vdev_probe(): failed to initialize net_af_packet0 device
";
        assert_eq!(
            probe_explanation(log, "net_memif0").as_deref(),
            Some("memif_socket_create(): Failed to setup socket /run/m.sock: Address already in use")
        );
        assert_eq!(
            probe_explanation(log, "net_af_packet0").as_deref(),
            Some("rte_pmd_init_internals(): net_af_packet0: ioctl failed (SIOCGIFINDEX):No such device")
        );
        let alone = "EAL: lib.rcu log level changed from disabled to error\nEAL: probe of 0000:03:00.0 said hello\n\
                     EAL: Requested device 0000:03:00.0 cannot be used\n";
        assert_eq!(
            probe_explanation(alone, "0000:03:00.0").as_deref(),
            Some("EAL: Requested device 0000:03:00.0 cannot be used")
        );
        assert_eq!(probe_explanation(log, "net_ring0"), None);
        assert_eq!(probe_explanation(log, ""), None);
    }
}
