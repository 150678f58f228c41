//! roce-stat: the counters of a running `roce-dpd`, as `rdma statistic` and rxe's hw_counters show a NIC's.
//!
//! `roce-stat --socket PATH` opens the daemon's socket (as any client does: ABI version checked), asks for every
//! counter (the control protocol's `Stats` request) and prints one line per object, `SCOPE ID: name value ...`:
//! the daemon (sessions and objects, WQEs moved through the rings), each port, each worker, each worker's engine
//! (the cause-named drop and transmit counters) and each QP (its session, state, DCQCN rate in kb/s, CNPs sent and
//! received, every cause-named counter). Counters that are zero are left out unless `--all`; the identity fields
//! of a QP (`client`, `worker`, `state`, `rate_kbps`), a port's link (`link up|down`, `speed_mbps`) and the object
//! counts of the daemon and of each worker always show.
//!
//! `--json` prints one JSON object instead (`{"pid":..,"socket":..,"objects":[{"scope","id","counters":{..}}]}`).
//! `--watch SECS` prints, every SECS seconds until SIGINT or SIGTERM (then exit 0), what changed: counters as
//! `name +delta (rate/s)`, gauges (object counts, QP state and rate) as their current value, QPs that appeared
//! (`new`) or went away (`gone`); with `--json`, one JSON object per interval (JSON lines).
//!
//! Exit status: 0, or 2 with one line on stderr (daemon absent, permission denied on its socket, ABI or protocol
//! mismatch, the daemon went away during --watch, bad arguments).

// The clap help texts are these doc comments, and `[daemon]` in them is the config's TOML section, not a link.
#![allow(rustdoc::broken_intra_doc_links)]

use roce_dp_tools::{out, outln};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use roce_dp::client::{Device, StatRecord};

#[derive(Parser)]
#[command(name = "roce-stat", version, about = "Counters of a running roce-dpd (ports, workers, engines, QPs)")]
struct Cli {
    /// The daemon's socket (its config's [daemon] socket; the same default as rdp-client's --daemon).
    #[arg(long, default_value = "/run/roce-dpd.sock")]
    socket: PathBuf,
    /// Machine-readable output (one JSON object; one per interval with --watch).
    #[arg(long)]
    json: bool,
    /// Every SECS seconds, print what changed (deltas and rates) until interrupted.
    #[arg(long, value_name = "SECS", value_parser = roce_dp_tools::seconds_arg)]
    watch: Option<f64>,
    /// Show counters that are zero (or, with --watch, unchanged) too.
    #[arg(long)]
    all: bool,
}

/// Set by SIGINT/SIGTERM: stop watching, exit 0.
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_sig: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// Values that are states or levels, not running totals: printed as they are, never as deltas.
fn is_gauge(scope: &str, name: &str) -> bool {
    match scope {
        "daemon" => matches!(name, "sessions_with_objects" | "qps" | "cqs" | "mrs" | "pds" | "workers"),
        "worker" => matches!(name, "qps" | "cqs"),
        "qp" => matches!(name, "client" | "worker" | "state" | "rate_kbps"),
        "port" => matches!(name, "link" | "speed_mbps"),
        _ => false,
    }
}

/// Order of the scopes in the output.
fn scope_rank(scope: &str) -> u8 {
    match scope {
        "daemon" => 0,
        "port" => 1,
        "worker" => 2,
        "engine" => 3,
        "qp" => 4,
        _ => 5,
    }
}

/// QP state names, by the number the daemon reports (`QpState as u8`).
const STATES: [&str; 7] = ["RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"];

/// An object's counters in the daemon's order.
type Counters = Vec<(String, u64)>;

/// Objects keyed by (scope rank, scope, id).
type Snapshot = BTreeMap<(u8, String, u32), Counters>;

fn snapshot(records: Vec<StatRecord>) -> Snapshot {
    let mut s = Snapshot::new();
    for r in records {
        s.entry((scope_rank(&r.scope), r.scope, r.id)).or_default().push((r.name, r.value));
    }
    s
}

fn object_name(scope: &str, id: u32) -> String {
    if scope == "qp" {
        format!("qp {id:#08x}")
    } else {
        format!("{} {id}", text_name(scope))
    }
}

/// A scope or counter name as the daemon sent it, for the text output: one word of printable ASCII. Anything else
/// (a space, a newline, a terminal escape, non-ASCII) is written as `\u{..}`, so a broken or hostile daemon can
/// neither split an object's line nor reach the terminal (`--json` escapes names as JSON does).
fn text_name(name: &str) -> std::borrow::Cow<'_, str> {
    if name.bytes().all(|b| b.is_ascii_graphic() && b != b'\\') {
        return name.into();
    }
    let mut o = String::with_capacity(name.len() + 8);
    for c in name.chars() {
        if c.is_ascii_graphic() && c != '\\' {
            o.push(c);
        } else {
            let _ = write!(o, "\\u{{{:x}}}", u32::from(c));
        }
    }
    o.into()
}

fn value_text(scope: &str, name: &str, v: u64) -> String {
    if scope == "qp" && name == "state" {
        STATES.get(v as usize).map_or_else(|| v.to_string(), |s| (*s).to_string())
    } else if scope == "port" && name == "link" {
        (if v == 0 { "down" } else { "up" }).to_string()
    } else {
        v.to_string()
    }
}

fn print_snapshot(s: &Snapshot, all: bool) -> String {
    let mut out = String::new();
    for ((_, scope, id), counters) in s {
        let _ = write!(out, "{}:", object_name(scope, *id));
        let mut shown = false;
        for (name, v) in counters {
            if all || *v != 0 || is_gauge(scope, name) {
                let _ = write!(out, " {} {}", text_name(name), value_text(scope, name, *v));
                shown = true;
            }
        }
        if !shown {
            out.push_str(" (every counter 0: --all shows them)");
        }
        out.push('\n');
    }
    out
}

fn json_str(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    roce_dp_tools::dump::json_str(&mut o, s);
    o
}

fn json_object(scope: &str, id: u32, fields: &str) -> String {
    format!("{{\"scope\":{},\"id\":{id},{fields}}}", json_str(scope))
}

fn json_map<'a>(kv: impl Iterator<Item = (&'a str, String)>) -> String {
    let items: Vec<String> = kv.map(|(k, v)| format!("{}:{v}", json_str(k))).collect();
    format!("{{{}}}", items.join(","))
}

fn json_snapshot(s: &Snapshot, dev: &Device, socket: &str) -> String {
    let objects: Vec<String> = s
        .iter()
        .map(|((_, scope, id), c)| {
            let counters = json_map(c.iter().map(|(n, v)| (n.as_str(), v.to_string())));
            json_object(scope, *id, &format!("\"counters\":{counters}"))
        })
        .collect();
    format!("{{\"pid\":{},\"socket\":{},\"objects\":[{}]}}", dev.info().pid, json_str(socket), objects.join(","))
}

/// What changed between two snapshots `secs` apart, as text (`--watch`).
fn print_delta(old: &Snapshot, new: &Snapshot, secs: f64, all: bool) -> String {
    let mut out = String::new();
    for (key, counters) in new {
        let (_, scope, id) = key;
        let prev = old.get(key);
        let mut line = String::new();
        for (name, v) in counters {
            if is_gauge(scope, name) {
                let was = prev.and_then(|p| p.iter().find(|(n, _)| n == name)).map(|(_, v)| *v);
                if all || was != Some(*v) || name == "state" {
                    let _ = write!(line, " {} {}", text_name(name), value_text(scope, name, *v));
                }
                continue;
            }
            let was = prev.and_then(|p| p.iter().find(|(n, _)| n == name)).map_or(0, |(_, v)| *v);
            let d = v.saturating_sub(was);
            if all || d != 0 {
                let _ = write!(line, " {} +{d} ({:.0}/s)", text_name(name), d as f64 / secs);
            }
        }
        if prev.is_none() {
            let _ = writeln!(out, "{}: new{line}", object_name(scope, *id));
        } else if !line.is_empty() {
            let _ = writeln!(out, "{}:{line}", object_name(scope, *id));
        }
    }
    for (_, scope, id) in old.keys().filter(|k| !new.contains_key(*k)) {
        let _ = writeln!(out, "{}: gone", object_name(scope, *id));
    }
    out
}

/// What changed between two snapshots, as one JSON line (`--watch --json`).
fn json_delta(old: &Snapshot, new: &Snapshot, secs: f64) -> String {
    let mut objects = Vec::new();
    for (key, counters) in new {
        let (_, scope, id) = key;
        let prev = old.get(key);
        let was = |name: &str| prev.and_then(|p| p.iter().find(|(n, _)| n == name)).map_or(0, |(_, v)| *v);
        let deltas = json_map(counters.iter().map(|(n, v)| {
            let d = if is_gauge(scope, n) { *v } else { v.saturating_sub(was(n)) };
            (n.as_str(), d.to_string())
        }));
        let rates = json_map(
            counters
                .iter()
                .filter(|(n, _)| !is_gauge(scope, n))
                .map(|(n, v)| (n.as_str(), format!("{:.3}", v.saturating_sub(was(n)) as f64 / secs))),
        );
        let status = if prev.is_none() { "new" } else { "live" };
        objects.push(json_object(scope, *id, &format!("\"status\":\"{status}\",\"delta\":{deltas},\"rate\":{rates}")));
    }
    for (_, scope, id) in old.keys().filter(|k| !new.contains_key(*k)) {
        objects.push(json_object(scope, *id, "\"status\":\"gone\""));
    }
    format!("{{\"interval_s\":{secs:.3},\"objects\":[{}]}}", objects.join(","))
}

/// Parses the command line: --help/--version exit 0, bad arguments one line and exit 2.
fn main() -> ExitCode {
    let cli = match roce_dp_tools::parse_cli::<Cli>("roce-stat") {
        Ok(c) => c,
        Err(code) => return code,
    };
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("roce-stat: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(cli: &Cli) -> Result<(), String> {
    if cli.watch.is_some() {
        // Before anything that can block (connecting, the first Stats request): a SIGINT or SIGTERM that arrives
        // while the daemon is slow to answer must still stop the watch. Installed any later, such a signal took
        // the inherited disposition: death by signal, or nothing at all where it is ignored (a background job of
        // a non-interactive shell starts with SIGINT ignored), and the watch never stopped.
        for sig in [libc::SIGINT, libc::SIGTERM] {
            // SAFETY: on_signal only stores to an atomic, which is async-signal-safe.
            unsafe { libc::signal(sig, on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t) };
        }
    }
    let dev = Device::open(&cli.socket).map_err(|e| e.to_string())?;
    let socket = cli.socket.display().to_string();
    let mut prev = snapshot(dev.stats().map_err(|e| e.to_string())?);
    let Some(secs) = cli.watch else {
        if cli.json {
            outln!("{}", json_snapshot(&prev, &dev, &socket));
        } else {
            out!("{}", print_snapshot(&prev, cli.all));
        }
        return Ok(());
    };
    if !cli.json {
        outln!("roce-stat: roce-dpd pid {} on {socket}, every {secs} s (Ctrl-C stops)", dev.info().pid);
        out!("{}", print_snapshot(&prev, cli.all));
    }
    if STOP.load(Ordering::SeqCst) {
        return Ok(());
    }
    let mut t_prev = Instant::now();
    let interval = Duration::from_secs_f64(secs);
    loop {
        let until = t_prev + interval;
        while Instant::now() < until {
            if STOP.load(Ordering::SeqCst) {
                return Ok(());
            }
            std::thread::sleep((until - Instant::now()).min(Duration::from_millis(50)));
        }
        if STOP.load(Ordering::SeqCst) {
            return Ok(());
        }
        let now_snap = snapshot(dev.stats().map_err(|e| e.to_string())?);
        let t = Instant::now();
        let dt = (t - t_prev).as_secs_f64();
        if cli.json {
            outln!("{}", json_delta(&prev, &now_snap, dt));
        } else {
            outln!("--- {dt:.3} s");
            out!("{}", print_delta(&prev, &now_snap, dt, cli.all));
        }
        prev = now_snap;
        t_prev = t;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Session 12: names came from the daemon and were printed raw, so a name with a space, newline or terminal
    /// escape broke the one-line-per-object text format (and reached the terminal).
    #[test]
    fn hostile_names_stay_one_printable_word_per_field() {
        let rec = |scope: &str, name: &str, value| StatRecord { scope: scope.into(), id: 1, name: name.into(), value };
        let s = snapshot(vec![
            rec("port", "rx ok\nqp 0x000001: state RTS\u{1b}[2J", 5),
            rec("wor ker\\", "tx_bursts", 7),
            rec("port", "déjà", 1),
        ]);
        let text = print_snapshot(&s, true);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\u{1b}') && text.is_ascii(), "{text}");
        assert!(
            text.contains(
                "port 1: rx\\u{20}ok\\u{a}qp\\u{20}0x000001:\\u{20}state\\u{20}RTS\\u{1b}[2J 5 d\\u{e9}j\\u{e0} 1"
            ),
            "{text}"
        );
        assert!(text.contains("wor\\u{20}ker\\u{5c} 1: tx_bursts 7"), "{text}");
        let delta = print_delta(&Snapshot::new(), &s, 1.0, true);
        assert_eq!(delta.lines().count(), 2, "{delta}");
        assert!(delta.is_ascii() && !delta.contains('\u{1b}'), "{delta}");
        // Ordinary names are unchanged.
        assert_eq!(text_name("rx_bursts"), "rx_bursts");
    }

    /// Session 13: a port whose link is down must say so (a zero counter is left out of the text), and --watch
    /// names the change of the link as it happens, not as a delta.
    #[test]
    fn a_down_link_is_shown_and_its_changes_watched() {
        let rec = |name: &str, value| StatRecord { scope: "port".into(), id: 0, name: name.into(), value };
        let down = snapshot(vec![rec("ipackets", 0), rec("link", 0), rec("speed_mbps", 0)]);
        assert_eq!(print_snapshot(&down, false), "port 0: link down speed_mbps 0\n");
        let up = snapshot(vec![rec("ipackets", 5), rec("link", 1), rec("speed_mbps", 10000)]);
        assert_eq!(print_snapshot(&up, false), "port 0: ipackets 5 link up speed_mbps 10000\n");
        assert_eq!(print_delta(&up, &down, 1.0, false), "port 0: link down speed_mbps 0\n");
        assert_eq!(print_delta(&down, &up, 1.0, false), "port 0: ipackets +5 (5/s) link up speed_mbps 10000\n");
        assert!(json_delta(&up, &down, 1.0).contains("\"delta\":{\"ipackets\":0,\"link\":0,\"speed_mbps\":0}"));
    }

    /// Session 14: an object whose counters were all zero printed as a bare `engine 0:`, as if cut short.
    #[test]
    fn an_object_with_every_counter_zero_says_so() {
        let rec = |name: &str| StatRecord { scope: "engine".into(), id: 0, name: name.into(), value: 0 };
        let s = snapshot(vec![rec("rx_frames"), rec("tx_frames")]);
        assert_eq!(print_snapshot(&s, false), "engine 0: (every counter 0: --all shows them)\n");
        assert_eq!(print_snapshot(&s, true), "engine 0: rx_frames 0 tx_frames 0\n");
    }
}
