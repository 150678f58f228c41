//! roce-stat end to end: the built binary against an in-process daemon (`roce_dp::ctrl::loopback`: the control
//! server and the appliance on one loopback engine, no DPDK) after known transfers, its text parsed line by line,
//! its `--json` parsed as JSON, `--watch` deltas summed and stopped with SIGINT; and the one-line errors for a
//! daemon that is absent, a socket this user may not open, and a daemon of another ABI or protocol version.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use roce_dp::ctrl::loopback::{wait_cqe, LoopPair, LoopbackConfig, LoopbackDaemon};
use roce_dp::ctrl::proto::{self, Conn, ErrorCode, Response};
use roce_dp::{SendWr, WcStatus, WrOpcode};

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-stat-test-{}-{tag}.sock", std::process::id()))
}

fn daemon(tag: &str) -> LoopbackDaemon {
    LoopbackDaemon::start(LoopbackConfig::new(sock(tag))).expect("loopback daemon starts")
}

fn roce_stat(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_roce-stat")).args(args).output().expect("run roce-stat")
}

fn text(b: &[u8]) -> String {
    String::from_utf8(b.to_vec()).expect("utf-8 output")
}

/// `n` WRITEs of `len` bytes from the pair's QP a into its own buffer through QP b; every byte checked.
fn writes(p: &mut LoopPair, n: u32, len: u32, seed: u8) {
    let half = p.mr.len() / 2;
    for i in 0..n {
        let data: Vec<u8> = (0..len).map(|k| (k as u8).wrapping_mul(7).wrapping_add(seed ^ i as u8)).collect();
        p.mr.as_mut_slice()[..len as usize].copy_from_slice(&data);
        let wr = SendWr::new(u64::from(i), WrOpcode::RdmaWrite).remote(p.mr.addr() + half as u64, p.mr.rkey());
        p.a.post_send(&wr, &[p.mr.sge(0, len)]).unwrap();
        let c = wait_cqe(&mut p.cq, Duration::from_secs(10)).unwrap().expect("WRITE completes");
        assert_eq!((c.wr_id, c.status), (u64::from(i), WcStatus::Success));
        assert_eq!(&p.mr.as_slice()[half..half + len as usize], &data[..]);
    }
}

/// Text output: `SCOPE ID: name value ...` -> {(scope, id): {name: value}}.
/// One `roce-stat --socket PATH` snapshot (must succeed): its text and the counters parsed from it.
fn snapshot(path: &str) -> (String, Stats) {
    let o = roce_stat(&["--socket", path]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    let m = parse(&out);
    (out, m)
}

/// One counter of a parsed snapshot.
fn stat<'m>(m: &'m Stats, scope: &str, id: &str, name: &str) -> Option<&'m str> {
    m.get(&(scope.to_string(), id.to_string())).and_then(|c| c.get(name)).map(String::as_str)
}

type Stats = HashMap<(String, String), HashMap<String, String>>;

fn parse(out: &str) -> HashMap<(String, String), HashMap<String, String>> {
    let mut m = HashMap::new();
    for line in out.lines() {
        let (head, rest) = line.split_once(": ").unwrap_or_else(|| (line.trim_end_matches(':'), ""));
        let (scope, id) = head.split_once(' ').unwrap_or_else(|| panic!("no `SCOPE ID:` in {line:?}"));
        let words: Vec<&str> = rest.split_whitespace().collect();
        assert!(words.len().is_multiple_of(2), "odd name/value list: {line:?}");
        let kv = words.chunks(2).map(|c| (c[0].to_string(), c[1].to_string())).collect();
        assert!(m.insert((scope.to_string(), id.to_string()), kv).is_none(), "object twice: {line:?}");
    }
    m
}

fn qp_id(qpn: u32) -> String {
    format!("{qpn:#08x}")
}

#[test]
fn snapshot_and_json_show_every_scope_and_the_qps_counters() {
    let d = daemon("snap");
    let mut p = LoopPair::open(d.path(), 64 * 1024, 32, 1024).unwrap();
    // 10 WRITEs of 4096 bytes at MTU 1024: 40 request packets from a, 40 accepted by b, 40960 payload bytes.
    writes(&mut p, 10, 4096, 1);
    let path = d.path().to_str().unwrap();

    let (out, m) = snapshot(path);
    let get = |scope: &str, id: &str, name: &str| stat(&m, scope, id, name);
    for (name, want) in [("qps", "2"), ("cqs", "1"), ("mrs", "1"), ("pds", "1")] {
        assert_eq!(get("daemon", "0", name), Some(want), "daemon {name}\n{out}");
    }
    assert_eq!(get("daemon", "0", "wqes_posted"), Some("10"), "{out}");
    for scope in ["port", "worker", "engine"] {
        assert!(m.contains_key(&(scope.to_string(), "0".to_string())), "no {scope} 0 line\n{out}");
    }
    let (a, b) = (qp_id(p.a.qpn()), qp_id(p.b.qpn()));
    assert_eq!(get("qp", &a, "state"), Some("RTS"), "{out}");
    assert_eq!(get("qp", &b, "state"), Some("RTS"), "{out}");
    assert_eq!(get("qp", &a, "client"), get("qp", &b, "client"), "one session owns both");
    assert!(get("qp", &a, "rate_kbps").is_some(), "DCQCN rate shown\n{out}");
    assert_eq!(get("qp", &a, "tx_packets"), Some("40"), "{out}");
    assert_eq!(get("qp", &b, "rx_packets"), Some("40"), "{out}");
    assert_eq!(get("qp", &b, "rx_bytes"), Some("40960"), "{out}");
    assert_eq!(get("qp", &a, "send_completions"), Some("10"), "{out}");
    // Zero counters are left out by default and shown with --all (CNPs: none on a lossless loopback).
    assert_eq!(get("qp", &a, "cnp_rcvd"), None, "{out}");
    assert_eq!(get("engine", "0", "rx_drop_icrc"), None, "{out}");
    let all = parse(&text(&roce_stat(&["--socket", path, "--all"]).stdout));
    let q = &all[&("qp".to_string(), a.clone())];
    assert_eq!((q["cnp_rcvd"].as_str(), q["cnp_sent"].as_str(), q["tx_packets"].as_str()), ("0", "0", "40"));

    let o = roce_stat(&["--socket", path, "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("--json is JSON");
    assert_eq!(v["pid"], std::process::id());
    assert_eq!(v["socket"], path);
    let objs = v["objects"].as_array().unwrap();
    let find = |scope: &str, id: u32| {
        objs.iter().find(|x| x["scope"] == scope && x["id"] == id).unwrap_or_else(|| panic!("no {scope} {id}: {v}"))
    };
    let qa = &find("qp", p.a.qpn())["counters"];
    assert_eq!(
        (qa["tx_packets"].as_u64(), qa["state"].as_u64(), qa["cnp_rcvd"].as_u64()),
        (Some(40), Some(3), Some(0))
    );
    assert_eq!(find("qp", p.b.qpn())["counters"]["rx_bytes"], 40960);
    assert_eq!(find("daemon", 0)["counters"]["qps"], 2);
    for scope in ["port", "worker", "engine"] {
        assert!(find(scope, 0)["counters"].as_object().is_some_and(|c| !c.is_empty()), "{scope}");
    }
}

#[test]
fn two_workers_show_a_line_each_and_every_qps_worker() {
    let d = LoopbackDaemon::start(LoopbackConfig { workers: 2, ..LoopbackConfig::new(sock("2w")) }).unwrap();
    // Each pair's two QPs share a CQ, so they stay together: the first pair on worker 0, the second on worker 1.
    let mut p0 = LoopPair::open(d.path(), 64 * 1024, 32, 1024).unwrap();
    let mut p1 = LoopPair::open(d.path(), 64 * 1024, 32, 1024).unwrap();
    writes(&mut p0, 2, 4096, 3);
    writes(&mut p1, 3, 4096, 4);
    let path = d.path().to_str().unwrap();
    let (out, m) = snapshot(path);
    let get = |scope: &str, id: &str, name: &str| stat(&m, scope, id, name);
    assert_eq!((get("daemon", "0", "workers"), get("daemon", "0", "qps")), (Some("2"), Some("4")), "{out}");
    for (w, pair, writes) in [("0", &p0, "2"), ("1", &p1, "3")] {
        assert_eq!(get("worker", w, "qps"), Some("2"), "{out}");
        assert_eq!(get("worker", w, "wqes_posted"), Some(writes), "{out}");
        assert!(get("engine", w, "rx_frames").is_some(), "engine {w}\n{out}");
        for qpn in [pair.a.qpn(), pair.b.qpn()] {
            // `worker` is an identity field: shown in the text even when it is 0.
            assert_eq!(get("qp", &qp_id(qpn), "worker"), Some(w), "{out}");
        }
    }
    // --json: each QP's counters begin with its session and its worker (tier 9 greps them in that order).
    let json = text(&roce_stat(&["--socket", path, "--json"]).stdout);
    let v: serde_json::Value = serde_json::from_str(&json).expect("--json is JSON");
    for (w, pair) in [(0, &p0), (1, &p1)] {
        let q = v["objects"].as_array().unwrap().iter().find(|x| x["scope"] == "qp" && x["id"] == pair.a.qpn());
        let c = &q.expect("qp object")["counters"];
        assert_eq!(c["worker"], w);
        let head = format!(
            "\"scope\":\"qp\",\"id\":{},\"counters\":{{\"client\":{},\"worker\":{w},",
            pair.a.qpn(),
            c["client"]
        );
        assert!(json.contains(&head), "{head} in {json}");
    }
}

#[test]
fn watch_prints_deltas_until_sigint() {
    let d = daemon("watch");
    let mut p = LoopPair::open(d.path(), 64 * 1024, 32, 1024).unwrap();
    writes(&mut p, 3, 1024, 2);
    for json in [false, true] {
        let mut args = vec!["--socket", d.path().to_str().unwrap(), "--watch", "0.2"];
        if json {
            args.push("--json");
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_roce-stat"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Its first line comes after its first snapshot (text: the header; JSON: the first interval), so the
        // WRITEs below fall inside the watch however slowly the tool starts on a loaded machine.
        let lines = line_reader(child.stdout.take().unwrap());
        let mut out = lines.recv_timeout(Duration::from_secs(30)).expect("roce-stat --watch prints its first line");
        out.push('\n');
        // 25 WRITEs of 2048 bytes (50 packets from a) and a second session that comes and goes while it watches.
        writes(&mut p, 25, 2048, 3);
        let other = LoopPair::open(d.path(), 4096, 4, 1024).unwrap();
        let other_qpn = other.a.qpn();
        std::thread::sleep(Duration::from_millis(500));
        drop(other);
        std::thread::sleep(Duration::from_millis(500));
        let status = interrupt(&mut child, 5, "roce-stat --watch did not stop on SIGINT", || {
            std::thread::sleep(Duration::from_millis(20))
        });
        out.extend(lines.iter().map(|l| l + "\n"));
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err).unwrap();
        assert_eq!(status.code(), Some(0), "exit 0 on SIGINT; stderr {err}");
        let a = p.a.qpn();
        let (mut tx, mut new, mut gone) = (0u64, false, false);
        if json {
            for line in out.lines() {
                let v: serde_json::Value = serde_json::from_str(line).expect("one JSON object per interval");
                assert!(v["interval_s"].as_f64().unwrap() > 0.1);
                for o in v["objects"].as_array().unwrap() {
                    if o["scope"] == "qp" && o["id"] == a {
                        tx += o["delta"]["tx_packets"].as_u64().unwrap();
                        assert!(o["rate"]["tx_packets"].as_f64().is_some());
                    }
                    if o["scope"] == "qp" && o["id"] == other_qpn {
                        new |= o["status"] == "new";
                        gone |= o["status"] == "gone";
                    }
                }
            }
        } else {
            let (ida, ido) = (format!("qp {}:", qp_id(a)), format!("qp {}:", qp_id(other_qpn)));
            let mut blocks = 0;
            for line in out.lines() {
                if line.starts_with("--- ") {
                    blocks += 1;
                    continue;
                }
                if blocks > 0 && line.starts_with(&ida) {
                    let w: Vec<&str> = line.split_whitespace().collect();
                    if let Some(i) = w.iter().position(|x| *x == "tx_packets") {
                        tx += w[i + 1].strip_prefix('+').expect("delta with +").parse::<u64>().unwrap();
                        assert!(w[i + 2].ends_with("/s)"), "{line}");
                    }
                }
                new |= blocks > 0 && line.starts_with(&ido) && line.contains(": new");
                gone |= blocks > 0 && line == format!("{ido} gone");
            }
            assert!(blocks >= 3, "several intervals in 1.3 s at 0.2 s:\n{out}");
        }
        assert_eq!(tx, 50, "deltas add up to the 50 packets sent while watching (json {json}):\n{out}");
        assert!(new && gone, "the second session's QP appears and goes (json {json}):\n{out}");
    }
}

/// The lines of a child's output as they come, from a thread (the channel ends at end of file).
fn line_reader(r: impl Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(r).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// A SIGINT that arrives while `--watch` still waits for the daemon (here: the first Stats answer, which a stepped
/// daemon gives only when stepped) stops the watch with exit 0, also when the parent ignores SIGINT, as a
/// background job of a non-interactive shell does. The handler used to be installed after the first snapshot, so
/// such a signal was lost and the watch ran on (the rare "did not stop on SIGINT" under load), or killed the tool.
#[test]
fn watch_stops_on_a_sigint_that_comes_while_the_daemon_is_slow() {
    let (mut d, mut st) = LoopbackDaemon::start_stepped(LoopbackConfig::new(sock("slow"))).unwrap();
    let path = d.path().to_str().unwrap().to_string();
    // `trap '' INT` then exec: the tool starts with SIGINT ignored, as in `scripts/test.sh &`.
    let mut child = Command::new("sh")
        .args(["-c", "trap '' INT; exec \"$0\" \"$@\"", env!("CARGO_BIN_EXE_roce-stat")])
        .args(["--socket", &path, "--watch", "0.1"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The session exists from the accept on; Hello is answered without the worker, Stats waits for a step.
    let until = Instant::now() + Duration::from_secs(30);
    while d.sessions() == 0 {
        if Instant::now() >= until {
            let _ = child.kill();
            panic!("roce-stat never connected");
        }
        assert!(child.try_wait().unwrap().is_none(), "roce-stat exited before it connected");
        std::thread::sleep(Duration::from_millis(5));
    }
    std::thread::sleep(Duration::from_millis(100));
    let status = interrupt(&mut child, 10, "roce-stat --watch did not stop on a SIGINT sent while it waited", || {
        st.step();
        std::thread::yield_now();
    });
    let o = child.wait_with_output().unwrap();
    assert_eq!(status.code(), Some(0), "exit 0 on SIGINT ({status}); stderr {}", text(&o.stderr));
    assert!(text(&o.stdout).starts_with("roce-stat: roce-dpd pid "), "{}", text(&o.stdout));
    let close = std::thread::spawn(move || d.shutdown("test done"));
    while !close.is_finished() {
        st.step();
        std::thread::yield_now();
    }
}

fn one_line_error(o: &Output) -> String {
    assert_eq!(o.status.code(), Some(2), "exit 2; stdout {}; stderr {}", text(&o.stdout), text(&o.stderr));
    let err = text(&o.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(err.starts_with("roce-stat: "), "{err}");
    err
}

/// A fake daemon that accepts one connection on `path` and answers its first frame with `answer`.
fn fake_daemon(path: &Path, answer: impl FnOnce(&Conn) + Send + 'static) -> std::thread::JoinHandle<()> {
    let _ = std::fs::remove_file(path);
    let l = UnixListener::bind(path).unwrap();
    std::thread::spawn(move || {
        let (s, _) = l.accept().unwrap();
        let mut c = Conn::new(s);
        let _ = c.recv_request();
        answer(&c);
    })
}

#[test]
fn absent_forbidden_and_foreign_daemons_are_one_line_errors() {
    let e = one_line_error(&roce_stat(&["--socket", sock("absent").to_str().unwrap()]));
    assert!(e.contains("no roce-dpd listening on") && e.contains("absent"), "{e}");

    // Owner-only socket, other user. As root (which may open any socket) the tool runs as nobody.
    let d = daemon("perm");
    let path = d.path().to_str().unwrap();
    let o = if libc_uid() == 0 {
        // A copy nobody can execute whatever the permissions on the way to target/.
        let dir = std::env::temp_dir().join(format!("roce-stat-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("roce-stat");
        std::fs::copy(env!("CARGO_BIN_EXE_roce-stat"), &exe).unwrap();
        use std::os::unix::fs::PermissionsExt;
        for p in [&dir, &exe] {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        // The copy's write descriptor can live on for a moment in a child that another test thread forked while
        // it was open (until that child execs): exec then fails with ETXTBSY ("Text file busy", exit 126).
        let mut tries = 0;
        let o = loop {
            let o = Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(&exe)
                .args(["--socket", path])
                .output()
                .expect("setpriv (util-linux) runs roce-stat as nobody");
            tries += 1;
            if o.status.code() != Some(126) || !text(&o.stderr).contains("Text file busy") || tries == 50 {
                break o;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        std::fs::remove_dir_all(&dir).unwrap();
        o
    } else {
        std::fs::set_permissions(d.path(), std::os::unix::fs::PermissionsExt::from_mode(0o000)).unwrap();
        roce_stat(&["--socket", path])
    };
    let e = one_line_error(&o);
    assert!(e.contains("permission denied on") && e.contains("socket_mode"), "{e}");
    drop(d);

    // A daemon of another shared-memory ABI: its refusal, as roce-dpd words it, is passed on in one line.
    let p = sock("abi");
    let h = fake_daemon(&p, |c| {
        let msg = "shared-memory ABI mismatch: roce-dpd speaks v7, the application's library v1: rebuild".into();
        c.send_response(1, &Response::Error { code: ErrorCode::Abi, msg }, &[]).unwrap();
    });
    let e = one_line_error(&roce_stat(&["--socket", p.to_str().unwrap()]));
    assert!(e.contains("ABI mismatch") && e.contains("v7"), "{e}");
    h.join().unwrap();
    // A daemon speaking another control-protocol version.
    let h = fake_daemon(&p, |c| proto::send_raw_frame(c.socket(), proto::PROTO_VERSION + 1, 0x101, 0, &[]).unwrap());
    let e = one_line_error(&roce_stat(&["--socket", p.to_str().unwrap()]));
    assert!(e.contains(&format!("v{}", proto::PROTO_VERSION + 1)), "{e}");
    h.join().unwrap();
    let _ = std::fs::remove_file(&p);

    // Bad arguments.
    let e = one_line_error(&roce_stat(&["--socket", "/x", "--watch", "0"]));
    assert!(e.contains("--watch"), "{e}");
    let e = one_line_error(&roce_stat(&["--bogus"]));
    assert!(e.contains("--bogus") && e.contains("--help"), "{e}");
}

fn libc_uid() -> u32 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    let l = s.lines().find(|l| l.starts_with("Uid:")).unwrap();
    l.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Sends SIGINT to `child` and waits up to `secs` for it to exit, calling `tick` between looks; kills it and fails
/// with `what` if it does not stop.
fn interrupt(
    child: &mut std::process::Child,
    secs: u64,
    what: &str,
    mut tick: impl FnMut(),
) -> std::process::ExitStatus {
    let sent = Command::new("kill").args(["-INT", &child.id().to_string()]).status().unwrap();
    assert!(sent.success());
    let until = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        if Instant::now() >= until {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}");
        }
        tick();
    }
}

/// The README's example (`roce-stat` after 10 WRITEs of 4 KiB at MTU 1024 between two QPs of one session) is what
/// the tool prints for that run: every counter the README shows, with its value (the worker's loop counts, which
/// depend on timing, only by name), and no scope or QP the README does not show.
#[test]
fn the_readme_example_is_what_roce_stat_prints() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).unwrap();
    let start = readme.find("$ roce-stat --socket /run/roce-dpd.sock ").expect("the README's example");
    let block: Vec<&str> = readme[start..].lines().skip(1).take_while(|l| !l.starts_with('$')).collect();
    let want = parse(&block.join("\n"));
    assert_eq!(want.len(), 6, "{block:?}");
    let d = daemon("readme");
    let mut p = LoopPair::open(d.path(), 64 * 1024, 32, 1024).unwrap();
    writes(&mut p, 10, 4096, 1);
    let (out, got) = snapshot(d.path().to_str().unwrap());
    assert_eq!(got.keys().collect::<std::collections::BTreeSet<_>>(), want.keys().collect(), "{out}");
    for (obj, counters) in &want {
        for (name, v) in counters {
            let have = got[obj].get(name).unwrap_or_else(|| panic!("{obj:?} has no {name}\n{out}"));
            if obj.0 != "worker" {
                assert_eq!(have, v, "{obj:?} {name}\n{out}");
            }
        }
    }
}

/// `roce-stat | head` and `roce-stat > /dev/full`: a stdout that cannot be written panicked (`println!`: exit 101 and
/// a backtrace). A reader that went away now ends it quietly with SIGPIPE's status, any other error with one line.
#[test]
fn a_stdout_that_cannot_be_written_is_no_panic() {
    let d = daemon("stdout");
    let path = d.path().to_str().unwrap().to_owned();
    for json in [false, true] {
        let (r, w) = std::io::pipe().expect("pipe");
        drop(r);
        let mut args = vec!["--socket", path.as_str()];
        if json {
            args.push("--json");
        }
        let o = Command::new(env!("CARGO_BIN_EXE_roce-stat"))
            .args(&args)
            .stdout(w)
            .stderr(Stdio::piped())
            .output()
            .expect("run roce-stat");
        assert_eq!((o.status.code(), text(&o.stderr)), (Some(141), String::new()), "--json {json}");
    }
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let o = Command::new(env!("CARGO_BIN_EXE_roce-stat"))
        .args(["--socket", &path])
        .stdout(full)
        .stderr(Stdio::piped())
        .output()
        .expect("run roce-stat");
    assert_eq!(o.status.code(), Some(2));
    assert_eq!(text(&o.stderr), "roce-stat: writing to stdout: No space left on device (os error 28)\n");
}
