//! Session 11: the `rdp_*` tools (as processes, on an in-process loopback daemon through `--daemon`) against a broken
//! or hostile out-of-band peer, and against each other where perftest's behaviour is what is checked. The rule
//! (README, threat model): one clear line on stderr, a non-zero exit within the timeout, never a panic or a hang.

mod common;

use common::{wait_child as finish, Running};
use roce_dp::ctrl::loopback::{LoopbackConfig, LoopbackDaemon};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rdp-perf-audit-{}-{name}", std::process::id()))
}

fn daemon(tag: &str, mtu: u32) -> LoopbackDaemon {
    let mut cfg = LoopbackConfig::new(temp(&format!("{tag}.sock")));
    cfg.mtu = mtu;
    LoopbackDaemon::start(cfg).expect("loopback daemon starts")
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The tool as a process on the daemon `d`, its output read as it runs.
fn tool(name: &str, d: &LoopbackDaemon, port: u16, args: &[&str]) -> Running {
    let exe = match name {
        "rdp_write_bw" => env!("CARGO_BIN_EXE_rdp_write_bw"),
        "rdp_send_bw" => env!("CARGO_BIN_EXE_rdp_send_bw"),
        "rdp_read_lat" => env!("CARGO_BIN_EXE_rdp_read_lat"),
        "rdp_read_bw" => env!("CARGO_BIN_EXE_rdp_read_bw"),
        other => panic!("{other}"),
    };
    Command::new(exe)
        .args(["--daemon", d.path().to_str().unwrap(), "-p", &port.to_string()])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the tool")
        .into()
}

/// Connects to the tool's exchange port once it listens.
fn connect(port: u16) -> TcpStream {
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => return s,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("the tool never listened on {port}: {e}"),
        }
    }
}

/// Exit 1 and exactly one line on stderr, `TOOL: ...` containing `want`.
#[track_caller]
fn one_line(o: &Output, tool: &str, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(&format!("{tool}: ")) && err.contains(want), "want {want:?}: {err}");
}

#[test]
fn a_silent_a_garbage_and_a_trickling_client_each_end_the_server_in_one_line() {
    let d = daemon("hostile", 1024);
    // Silent: connects and says nothing.
    let port = free_port();
    let t0 = Instant::now();
    let srv = tool("rdp_write_bw", &d, port, &["--timeout", "2"]);
    let s = connect(port);
    let o = finish(srv, 20, "silent client");
    drop(s);
    one_line(&o, "rdp_write_bw", "peer sent nothing for 2.0 s during the version exchange");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
    // Garbage, forever.
    let port = free_port();
    let srv = tool("rdp_write_bw", &d, port, &["--timeout", "2"]);
    let mut s = connect(port);
    let writer = std::thread::spawn(move || while s.write_all(&[0xa5; 4096]).is_ok() {});
    let o = finish(srv, 20, "garbage client");
    writer.join().unwrap();
    one_line(&o, "rdp_write_bw", "peer sent a malformed version message");
    // A valid version, then a byte every 700 ms: the 4-byte cycle buffer takes longer than the 2 s timeout.
    let port = free_port();
    let t0 = Instant::now();
    let srv = tool("rdp_write_bw", &d, port, &["--timeout", "2"]);
    let mut s = connect(port);
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"6.06");
    s.write_all(&v).unwrap();
    let trickle = std::thread::spawn(move || {
        let mut buf = [0u8; 16];
        let _ = s.read_exact(&mut buf);
        while s.write_all(&[0x10]).is_ok() {
            std::thread::sleep(Duration::from_millis(700));
        }
    });
    let o = finish(srv, 20, "trickling client");
    trickle.join().unwrap();
    one_line(&o, "rdp_write_bw", "peer sent only");
    assert!(t0.elapsed() < Duration::from_secs(8), "{:?}", t0.elapsed());
}

/// A fake server: accepts one client and runs `f` on the connection.
fn fake_server(f: impl FnOnce(TcpStream) + Send + 'static) -> (u16, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (port, std::thread::spawn(move || f(l.accept().unwrap().0)))
}

/// Answers a client's setup as perftest 4.5 would (version, sys data, MTU 1024).
fn answer_setup(s: &mut TcpStream) {
    let mut buf = [0u8; 16];
    s.read_exact(&mut buf).unwrap();
    let mut v = [0u8; 16];
    v[..4].copy_from_slice(b"6.06");
    s.write_all(&v).unwrap();
    for n in [4096i32, 64] {
        s.read_exact(&mut buf[..4]).unwrap();
        s.write_all(&n.to_be_bytes()).unwrap();
    }
    s.read_exact(&mut buf[..2]).unwrap();
    s.write_all(b"3\0").unwrap();
}

#[test]
fn a_silent_a_vanishing_and_a_lying_server_each_end_the_client_in_one_line() {
    let d = daemon("servers", 1024);
    let (port, t) = fake_server(|s| {
        std::thread::sleep(Duration::from_secs(4));
        drop(s);
    });
    let t0 = Instant::now();
    let o = finish(tool("rdp_write_bw", &d, port, &["--timeout", "2", "127.0.0.1"]), 20, "silent server");
    one_line(&o, "rdp_write_bw", "peer sent nothing for 2.0 s during the version exchange");
    assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    t.join().unwrap();
    let (port, t) = fake_server(drop);
    let o = finish(tool("rdp_write_bw", &d, port, &["--timeout", "2", "127.0.0.1"]), 20, "vanishing server");
    one_line(&o, "rdp_write_bw", "peer closed the connection during the version exchange");
    t.join().unwrap();
    // A record for QP 0 at 10.0.0.2 (the loopback daemon is 10.0.0.1).
    let (port, t) = fake_server(|mut s| {
        answer_setup(&mut s);
        let mut gid = String::new();
        for b in [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 2] {
            gid.push_str(&format!("{b:02x}:"));
        }
        let rec = format!("0000:0001:000000:123456:00001000:00007f0000000000:{gid}00000000:\0");
        assert_eq!(rec.len(), 108);
        let mut buf = [0u8; 108];
        for _ in 0..2 {
            if s.read_exact(&mut buf).is_err() || s.write_all(rec.as_bytes()).is_err() {
                return;
            }
        }
        let _ = s.read(&mut buf);
    });
    let o = finish(tool("rdp_write_bw", &d, port, &["--timeout", "2", "127.0.0.1"]), 20, "lying server");
    one_line(&o, "rdp_write_bw", "QPN 0x0 is a management QP (QP0/QP1), not an RC QP");
    t.join().unwrap();
}

/// `-m` above the port's MTU (the daemon's path MTU 1024): perftest says "Requested mtu is higher than active mtu"
/// and "Changing to active mtu" and runs at the port's MTU. Both tools with `-m 4096` on a 1024 port.
#[test]
fn an_mtu_above_the_ports_runs_at_the_ports_as_perftest() {
    let d = daemon("mtu", 1024);
    let port = free_port();
    let args = ["-m", "4096", "-s", "4096", "-n", "50", "--timeout", "10"];
    let srv = tool("rdp_write_bw", &d, port, &args);
    let cl = tool("rdp_write_bw", &d, port, &[&args[..], &["127.0.0.1"]].concat());
    let (c, s) = (finish(cl, 30, "client"), finish(srv, 30, "server"));
    for (o, who) in [(&c, "client"), (&s, "server")] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{who}: {}{out}", String::from_utf8_lossy(&o.stderr));
        let lines: Vec<&str> = out.lines().collect();
        let at = lines.iter().position(|l| *l == "Requested mtu is higher than active mtu ").expect(who);
        assert_eq!(lines[at + 1], "Changing to active mtu - 3", "{who}");
        assert!(lines.contains(&" Mtu             : 1024[B]"), "{who}: {out}");
        assert!(lines.iter().any(|l| l.starts_with(" 4096       50  ")), "{who}: {out}");
    }
}

/// A second client while a test runs (perftest listens for one client, then closes its listening socket): it is
/// refused at once, and the running test ends as it would have. Checked during a `-D 2` write_bw.
#[test]
fn a_second_connection_during_a_run_is_refused_and_the_run_goes_on() {
    let d = daemon("second", 1024);
    let port = free_port();
    let args = ["-s", "4096", "-D", "2", "-f", "0", "--timeout", "10"];
    let srv = tool("rdp_write_bw", &d, port, &args);
    let cl = tool("rdp_write_bw", &d, port, &[&args[..], &["127.0.0.1"]].concat());
    std::thread::sleep(Duration::from_millis(1200));
    let r = TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(2));
    assert_eq!(r.err().map(|e| e.kind()), Some(std::io::ErrorKind::ConnectionRefused));
    let (c, s) = (finish(cl, 30, "client"), finish(srv, 30, "server"));
    for (o, who) in [(&c, "client"), (&s, "server")] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{who}: {}{out}", String::from_utf8_lossy(&o.stderr));
        assert!(out.lines().any(|l| l.starts_with(" 4096       ")), "{who}: {out}");
    }
}

/// A read_bw server whose records accept no outstanding READ (OUT 0), at the loopback daemon's own address: the
/// client refuses it in one line at the records. Before, the client connected its QP towards it and failed when
/// its READs' retries ran out, naming a completion error. And `-o 1` on the server runs, its banner says so.
#[test]
fn a_read_peer_accepting_no_reads_is_refused_and_o_1_runs() {
    let d = daemon("out0", 1024);
    let (port, t) = fake_server(|mut s| {
        answer_setup(&mut s);
        let mut gid = String::new();
        for b in [0u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 10, 0, 0, 1] {
            gid.push_str(&format!("{b:02x}:"));
        }
        let rec = format!("0000:0000:000777:123456:00001000:00007f0000000000:{gid}00000000:\0");
        let mut buf = [0u8; 108];
        while s.read_exact(&mut buf).is_ok() && s.write_all(rec.as_bytes()).is_ok() {}
    });
    let o = finish(tool("rdp_read_bw", &d, port, &["--timeout", "3", "-n", "100", "127.0.0.1"]), 30, "client");
    one_line(&o, "rdp_read_bw", "QP 0x777 accepts no outstanding READ/atomic request (OUT 0)");
    t.join().unwrap();
    let port = free_port();
    let srv = tool("rdp_read_bw", &d, port, &["-o", "1", "-s", "4096", "-n", "200", "--timeout", "10"]);
    let cl = tool("rdp_read_bw", &d, port, &["-s", "4096", "-n", "200", "--timeout", "10", "127.0.0.1"]);
    let (c, s) = (finish(cl, 30, "client"), finish(srv, 30, "server"));
    for (o, who, out) in [(&c, "client", 16), (&s, "server", 1)] {
        let text = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{who}: {}{text}", String::from_utf8_lossy(&o.stderr));
        assert!(text.contains(&format!(" Outstand reads  : {out}\n")), "{who}: {text}");
        assert!(text.lines().any(|l| l.starts_with(" 4096       200  ")), "{who}: {text}");
    }
}

/// `--run_infinitely -b` ended by SIGINT to the client (README: a row every -D seconds until SIGINT/SIGTERM, then
/// the teardown and exit 0): the server, also sending, sees the client's teardown and ends too; both exit 0 with
/// their rows. Before, the server never read the teardown: write_bw's ended in RetryExcErr and its client in "peer
/// sent nothing for 5.0 s", send_bw's in "no completion for 5 s" and "peer closed the connection".
#[test]
fn run_infinitely_bidirectional_ends_on_sigint_to_one_side() {
    let d = daemon("inf", 1024);
    for test in ["rdp_write_bw", "rdp_send_bw"] {
        let port = free_port();
        let args = ["--run_infinitely", "-D", "1", "-b", "-s", "4096", "--timeout", "5"];
        let srv = tool(test, &d, port, &args);
        let cl = tool(test, &d, port, &[&args[..], &["127.0.0.1"]].concat());
        std::thread::sleep(Duration::from_millis(3500));
        let kill = Command::new("kill").args(["-INT", &cl.id().to_string()]).status().unwrap();
        assert!(kill.success());
        let (c, s) = (finish(cl, 30, "client"), finish(srv, 30, "server"));
        for (o, who) in [(&c, "client"), (&s, "server")] {
            let out = String::from_utf8_lossy(&o.stdout);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(0), "{test} {who}: {err}{out}");
            assert!(out.lines().filter(|l| l.starts_with(" 4096       ")).count() >= 2, "{test} {who}: {out}");
        }
    }
}

/// `-q N` through a daemon whose QP limit is above its PD limit (here 400 QPs, 256 PDs a session): perftest's QPs
/// share one PD, and so do the tools' now. Before, each QP had a PD of its own and `-q 300` was refused at the
/// 257th: "this session already has 256 protection domains".
#[test]
fn many_qps_share_one_pd() {
    let mut cfg = LoopbackConfig::new(temp("pd.sock"));
    cfg.limits.qps = 400;
    let d = LoopbackDaemon::start(cfg).expect("loopback daemon starts");
    let port = free_port();
    let args = ["-q", "300", "-s", "64", "-n", "5", "--timeout", "20"];
    let srv = tool("rdp_write_bw", &d, port, &args);
    let cl = tool("rdp_write_bw", &d, port, &[&args[..], &["127.0.0.1"]].concat());
    let (c, s) = (finish(cl, 60, "client"), finish(srv, 60, "server"));
    let errs = format!("client: {} server: {}", String::from_utf8_lossy(&c.stderr), String::from_utf8_lossy(&s.stderr));
    for (o, who) in [(&c, "client"), (&s, "server")] {
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{who}: {errs}");
        assert!(out.contains(" Number of qps   : 300\t\t"), "{who}: {out}");
    }
}
