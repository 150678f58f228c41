//! Session 12's audit of the tools built on the client library (rdp-client, roce-stat, the perftest tools with
//! `--daemon`): each flag's error path is one line and exit 2, never a panic (exit 101); a daemon that goes away is
//! one line and exit 2; a run longer than `--timeout` that keeps making progress is not cut short. The daemon is an
//! in-process `ctrl::loopback` one.

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use roce_dp::ctrl::loopback::{LoopbackConfig, LoopbackDaemon};

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rdp-audit-client-tools-{}-{name}", std::process::id()))
}

fn daemon(tag: &str) -> LoopbackDaemon {
    LoopbackDaemon::start(LoopbackConfig::new(temp(&format!("{tag}.sock")))).expect("loopback daemon")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Runs `exe` with `args`, killing it (and failing) after `secs`.
fn run_bounded(exe: &str, args: &[&str], secs: u64) -> Output {
    let child = Command::new(exe)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("spawn {exe}: {e}"));
    common::wait_child(child, secs, &format!("{exe} {args:?}"))
}

/// Exit 2, one line on stderr starting with `prefix`: that line.
fn one_line_error(o: &Output, prefix: &str) -> String {
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "exit 2 (not a panic's 101); stderr {err:?}");
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with(prefix), "{err:?}");
    err
}

// ============================================================================ rdp-client

/// `--timeout` of a huge number of seconds was taken as it was and added to the clock: the active side panicked
/// ("overflow when adding duration to instant", exit 101) before it did anything; `--timeout 0` gave up at once.
/// Now both are refused in one line naming the flag and its range, as rdp-nic's and rdp-porttest's are.
#[test]
fn rdp_client_timeout_out_of_range_is_one_line() {
    let exe = env!("CARGO_BIN_EXE_rdp-client");
    let oob = temp("never.oob");
    for t in ["18446744073709551615", "31536001", "0"] {
        for mode in ["active", "passive"] {
            let o = run_bounded(exe, &[mode, "--oob", oob.to_str().unwrap(), "--timeout", t], 20);
            let e = one_line_error(&o, "rdp-client: ");
            assert!(e.contains("--timeout") && e.contains(t), "{mode} --timeout {t}: {e}");
        }
    }
}

/// `rdp-client active --inline 99999` waited for its passive side (up to --timeout), connected to the daemon and
/// was refused only when it created its QP; now it is refused at once, naming the flag and the limit.
#[test]
fn rdp_client_inline_beyond_the_wqe_is_refused_before_anything() {
    let exe = env!("CARGO_BIN_EXE_rdp-client");
    let oob = temp("never-inline.oob");
    let t0 = std::time::Instant::now();
    let o = run_bounded(exe, &["active", "--oob", oob.to_str().unwrap(), "--timeout", "10", "--inline", "99999"], 20);
    let e = one_line_error(&o, "rdp-client: ");
    assert!(e.contains("--inline 99999: more than the 1024 bytes a send WQE can carry inline"), "{e}");
    assert!(t0.elapsed() < std::time::Duration::from_secs(5), "refused after {:?}", t0.elapsed());
}

/// A passive and an active rdp-client on `d`, with `args` for the active side; their outputs.
fn rdp_client_pair(d: &LoopbackDaemon, tag: &str, timeout: &str, args: &[&str]) -> (Output, Output) {
    let exe = env!("CARGO_BIN_EXE_rdp-client");
    let oob = temp(&format!("{tag}.oob"));
    let sock = d.path().to_str().unwrap().to_string();
    let common = ["--daemon", &sock, "--oob", oob.to_str().unwrap(), "--timeout", timeout];
    let passive = Command::new(exe)
        .arg("passive")
        .args(common)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn passive");
    let active = Command::new(exe)
        .arg("active")
        .args(common)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn active");
    let a = common::wait_child(active, 120, "rdp-client active");
    let p = common::wait_child(passive, 30, "rdp-client passive");
    (a, p)
}

/// `--timeout` is the longest wait for the peer, an answer or a completion ("nothing within --timeout seconds ends
/// the run", README). The wait for a completion counted from the start of the run instead, so a verified run
/// longer than --timeout failed ("no completion before --timeout", exit 2) while every completion came in
/// microseconds. Shown with --timeout 1 and a run of several seconds.
#[test]
fn rdp_client_runs_longer_than_its_timeout_while_completions_come() {
    let d = daemon("long");
    // A run of a few seconds with a 1 s timeout: start from 2000 WRITEs, doubled until a run lasts 1.5 s (the
    // out-of-band check of each WRITE dominates; the machine's load changes its speed).
    let mut iters = 2000u64;
    let (a, p) = loop {
        let n = iters.to_string();
        let t0 = Instant::now();
        let (a, p) = rdp_client_pair(&d, "long", "1", &["--op", "write", "--size", "64", "--iters", &n]);
        let took = t0.elapsed();
        let out = text(&a.stdout);
        assert_eq!(a.status.code(), Some(0), "{iters} WRITEs in {took:?}: {out}{}", text(&a.stderr));
        assert!(out.contains(&format!("CHECK ok   write: {iters} x 64 B")), "{out}");
        if took > Duration::from_millis(1500) {
            break (a, p);
        }
        assert!(iters < 1 << 20, "{iters} WRITEs took only {took:?}");
        iters *= 2;
    };
    drop(a);
    assert_eq!(p.status.code(), Some(0), "{}", text(&p.stderr));
    let mut s = String::new();
    let _ = p.stdout.as_slice().read_to_string(&mut s);
    assert!(s.contains("CHECK ok   passive"), "{s}");
}

// ============================================================================ roce-stat

/// `--watch` took any positive finite number: one past what a `Duration` holds (1e30) panicked the tool after its
/// first snapshot ("cannot convert float seconds to Duration", exit 101), one a `Duration` holds but the clock
/// cannot reach (1e18 s) panicked at the first deadline. Now the interval is checked with the flag, as the
/// other tools' seconds are: (0, one year], else one line.
#[test]
fn roce_stat_watch_interval_out_of_range_is_one_line() {
    let d = daemon("watchrange");
    let path = d.path().to_str().unwrap();
    let exe = env!("CARGO_BIN_EXE_roce-stat");
    for v in ["1e30", "1e18", "31536001", "0", "-1", "inf", "NaN"] {
        let o = run_bounded(exe, &["--socket", path, &format!("--watch={v}")], 20);
        let e = one_line_error(&o, "roce-stat: ");
        assert!(e.contains("--watch"), "--watch {v}: {e}");
        assert!(o.stdout.is_empty(), "--watch {v}: refused before anything is printed: {}", text(&o.stdout));
    }
}

/// `--watch` whose daemon stops: one line naming it and exit 2 (README: "the daemon went away during --watch"),
/// text and JSON alike, within a few intervals; what was printed before stays whole lines (JSON: each a value).
#[test]
fn roce_stat_watch_whose_daemon_stops_says_so_in_one_line() {
    for json in [false, true] {
        let mut d = daemon(&format!("watchgone-{json}"));
        let path = d.path().to_str().unwrap().to_string();
        let mut args = vec!["--socket", path.as_str(), "--watch", "0.1"];
        if json {
            args.push("--json");
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_roce-stat"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Its first line comes after its first snapshot (JSON: after the first interval).
        let mut stdout = child.stdout.take().unwrap();
        let mut first = [0u8; 1];
        stdout.read_exact(&mut first).expect("roce-stat --watch prints");
        std::thread::sleep(Duration::from_millis(250));
        let t0 = Instant::now();
        d.shutdown("test over");
        let o = common::wait_child(child, 10, "roce-stat --watch after the daemon stopped");
        assert!(t0.elapsed() < Duration::from_secs(5), "took {:?}", t0.elapsed());
        let e = one_line_error(&o, "roce-stat: ");
        assert!(e.contains(&path) && e.contains("gone") && e.contains("test over"), "{e}");
        let mut out = vec![first[0]];
        stdout.read_to_end(&mut out).unwrap();
        let out = text(&out);
        assert!(out.ends_with('\n'), "{out:?}");
        if json {
            for l in out.lines() {
                serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}"));
            }
        }
    }
}

/// `--json` is one JSON value and the text one line per object of `name value` pairs in every state: a daemon
/// without sessions, QPs in RESET, INIT and ERR (a WR posted in RESET: refused, LOC_QP_OP_ERR), 250 QPs. The QPs'
/// counters are the daemon's own (as the library reads them), and the QP states read as the README names them.
#[test]
fn roce_stat_json_and_text_hold_in_every_state() {
    use roce_dp::client::{Device, QpInit};
    use roce_dp::{AccessFlags, SendWr, WrOpcode};
    let d = daemon("states");
    let path = d.path().to_str().unwrap().to_string();
    let exe = env!("CARGO_BIN_EXE_roce-stat");
    let check = |what: &str| -> serde_json::Value {
        let o = run_bounded(exe, &["--socket", &path, "--json"], 30);
        assert_eq!(o.status.code(), Some(0), "{what}: {}", text(&o.stderr));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(text(&o.stdout).lines().count(), 1, "{what}: one line");
        let t = run_bounded(exe, &["--socket", &path, "--all"], 30);
        assert_eq!(t.status.code(), Some(0), "{what}: {}", text(&t.stderr));
        let out = text(&t.stdout);
        assert_eq!(out.lines().count(), v["objects"].as_array().unwrap().len(), "{what}: a line per object\n{out}");
        for l in out.lines() {
            let (obj, rest) = l.split_once(": ").unwrap_or_else(|| panic!("{what}: {l}"));
            assert!(obj.split(' ').count() == 2, "{what}: {l}");
            assert_eq!(rest.split(' ').count() % 2, 0, "{what}: name value pairs: {l}");
        }
        v
    };
    let v = check("no session");
    assert!(v["objects"].as_array().unwrap().iter().all(|o| o["scope"] != "qp"), "{v}");

    let dev = Device::open(d.path()).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mr = pd.reg_mr(4096, AccessFlags::ALL).unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let small = QpInit { sq_depth: 4, rq_depth: 4, ..QpInit::default() };
    let mut qps: Vec<_> = (0..250).map(|_| dev.create_qp(&pd, &cq, &cq, small).unwrap()).collect();
    qps[1].to_init(AccessFlags::ALL).unwrap();
    qps[2].post_send(&SendWr::new(9, WrOpcode::Send), &[mr.sge(0, 8)]).unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while qps[2].query().unwrap().state != roce_dp::QpState::Err {
        assert!(Instant::now() < until, "the WR posted in RESET never errored its QP");
        std::thread::sleep(Duration::from_millis(5));
    }
    let v = check("250 QPs");
    let objs = v["objects"].as_array().unwrap();
    assert_eq!(objs.iter().filter(|o| o["scope"] == "qp").count(), 250);
    let lib = dev.stats().unwrap();
    for (i, want) in [(0, "RESET"), (1, "INIT"), (2, "ERR")] {
        let qpn = qps[i].qpn();
        let o = objs.iter().find(|o| o["scope"] == "qp" && o["id"] == qpn).expect("the QP's object");
        for r in lib.iter().filter(|r| r.scope == "qp" && r.id == qpn) {
            assert_eq!(o["counters"][&r.name], r.value, "qp {qpn:#x} {}", r.name);
        }
        let t = text(&run_bounded(exe, &["--socket", &path], 30).stdout);
        let line = t.lines().find(|l| l.starts_with(&format!("qp {qpn:#08x}:"))).expect("the QP's line");
        assert!(line.contains(&format!(" state {want}")), "{line}");
    }
    drop(qps);
}

// ============================================================================ perftest tools with --daemon

/// The perftest tools' own `--timeout` took any number of seconds: a server with --daemon and a huge one panicked
/// at its accept's deadline ("overflow when adding duration to instant", exit 101) after printing its banner, and
/// 0 was quietly 1. `--poll-sleep` took any number of microseconds, so a typo made the client nap for days after
/// every idle turn, past every timeout. Both are bounded now and refused in one line, before anything is printed.
#[test]
fn perftest_daemon_timeout_and_poll_sleep_out_of_range_are_one_line() {
    let d = daemon("pt");
    let path = d.path().to_str().unwrap();
    let exe = env!("CARGO_BIN_EXE_rdp_write_bw");
    for (flag, v) in [
        ("--timeout", "18446744073709551615"),
        ("--timeout", "31536001"),
        ("--timeout", "0"),
        ("--poll-sleep", "18446744073709551615"),
        ("--poll-sleep", "1000001"),
    ] {
        let o = run_bounded(exe, &["--daemon", path, flag, v], 20);
        let e = one_line_error(&o, "rdp_write_bw: ");
        assert!(e.contains(&format!("{flag} \"{v}\"")), "{flag} {v}: {e}");
        assert!(o.stdout.is_empty(), "{flag} {v}: {}", text(&o.stdout));
    }
    // The bounds themselves are taken: a server that then waits 1 s for its client, in one line (exit 1).
    let o = run_bounded(exe, &["--daemon", path, "--timeout", "1", "--poll-sleep", "1000000", "-p", "18599"], 20);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert_eq!(
        text(&o.stderr),
        "rdp_write_bw: couldn't listen for a client on TCP port 18599: no client connected in time\n"
    );
}

/// `rdp-client passive --oob PATH` removed whatever was at PATH before it bound its socket there: a typo naming
/// one of the user's files deleted it. And a passive side that failed after binding (no daemon, say) left its
/// socket file behind. Now only a socket (an earlier run's) is replaced, anything else is refused in one line and
/// kept, and the socket goes with the passive side however it ends.
#[test]
fn rdp_client_passive_keeps_a_file_at_its_oob_path_and_leaves_no_socket() {
    let exe = env!("CARGO_BIN_EXE_rdp-client");
    let file = temp("precious.txt");
    std::fs::write(&file, b"the user's notes\n").unwrap();
    let absent = temp("absent-daemon.sock");
    let o = run_bounded(exe, &["passive", "--oob", file.to_str().unwrap(), "--daemon", absent.to_str().unwrap()], 20);
    assert_eq!(std::fs::read(&file).ok().as_deref(), Some(&b"the user's notes\n"[..]), "the file is kept");
    let e = one_line_error(&o, "rdp-client: ");
    assert!(e.contains("--oob") && e.contains("not a socket"), "{e}");
    std::fs::remove_file(&file).unwrap();

    let oob = temp("left.oob");
    let o = run_bounded(exe, &["passive", "--oob", oob.to_str().unwrap(), "--daemon", absent.to_str().unwrap()], 20);
    let e = one_line_error(&o, "rdp-client: ");
    assert!(e.contains("no roce-dpd listening"), "{e}");
    assert!(!oob.exists(), "the passive side left its socket {} behind", oob.display());
    // A socket left by an earlier run (one that was killed) is replaced.
    let stale = std::os::unix::net::UnixListener::bind(&oob).unwrap();
    drop(stale);
    let o = run_bounded(exe, &["passive", "--oob", oob.to_str().unwrap(), "--daemon", absent.to_str().unwrap()], 20);
    assert!(one_line_error(&o, "rdp-client: ").contains("no roce-dpd listening"));
    assert!(!oob.exists());
}
