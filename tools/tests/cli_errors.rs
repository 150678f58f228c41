//! What a new user typing the documented commands wrong gets: one line on stderr naming what was wrong, exit
//! status 2, from each tool (the built binaries). Bad arguments, a missing subcommand or required flag, a wrong
//! file given as `--cc-config`, an output file that cannot be created, perftest flags roce-dp does not take, an
//! out-of-band peer that never comes, and port profiles naming a PCI device, an interface or an lcore this machine
//! does not have (checked before DPDK starts, so neither root nor a NIC is needed here).

use std::path::PathBuf;
use std::process::{Command, Output};

use roce_dp::ctrl::loopback::{LoopbackConfig, LoopbackDaemon};

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rdp-cli-test-{}-{name}", std::process::id()))
}

fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe).args(args).output().unwrap_or_else(|e| panic!("run {exe}: {e}"))
}

/// The run failed with status 2, nothing on stdout, and exactly `want` (one line) on stderr.
fn one_line(o: &Output, want: &str) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(err, format!("{want}\n"), "stdout: {}", String::from_utf8_lossy(&o.stdout));
    assert!(o.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&o.stdout));
}

/// How the tools' PCI hint lists this machine's devices: `lspci -D` where pciutils is installed (an `lspci` on
/// $PATH), else `ls /sys/bus/pci/devices` (session 15: the hint named lspci on machines without it).
fn pci_list_hint() -> &'static str {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|d| d.join("lspci").is_file()) {
        "lspci -D lists them"
    } else {
        "ls /sys/bus/pci/devices lists them"
    }
}

#[test]
fn rdp_sim_bad_arguments_and_files_are_one_line() {
    let sim = env!("CARGO_BIN_EXE_rdp-sim");
    one_line(&run(sim, &["--op", "foo"]), "rdp-sim: invalid value 'foo' for '--op <OP>' (see --help)");
    // A negative number is the flag's value, refused by that flag (clap took "-0.1" for a flag "-0" before).
    one_line(
        &run(sim, &["--size", "-1"]),
        "rdp-sim: invalid value '-1' for '--size <SIZE>': -1 is negative: give a whole number, 0 or more (see --help)",
    );
    one_line(&run(sim, &["--incast", "2", "--pmax", "-0.1"]), "rdp-sim: --pmax -0.1 is not a probability in 0..1");
    one_line(&run(sim, &["--loss", "-0.5"]), "rdp-sim: --loss -0.5 is not a probability in 0..1");
    one_line(
        &run(sim, &["--seed", "x"]),
        "rdp-sim: invalid value 'x' for '--seed <SEED>': not a whole number: give one, 0 or more (see --help)",
    );
    // A port profile given where the congestion-control file goes: toml's several-line excerpt becomes one line.
    let conf = temp("profile-as-cc.toml");
    std::fs::write(&conf, "# a port profile\n[port]\ndriver = \"net_ring\"\n").unwrap();
    let conf_s = conf.to_str().unwrap();
    one_line(
        &run(sim, &["--incast", "2", "--cc-config", conf_s]),
        &format!(
            "rdp-sim: --cc-config {conf_s}: line 2: unknown field `port`, expected one of `algorithm`, `np_enabled`, \
             `line_rate_mbps`, `dcqcn`"
        ),
    );
    let _ = std::fs::remove_file(&conf);
    // An output file that cannot be created: refused before the run, not after it.
    let plot = "/nonexistent-rdp-dir/x.svg";
    one_line(
        &run(sim, &["--incast", "2", "--duration-ms", "0.1", "--plot", plot]),
        &format!("rdp-sim: --plot {plot}: No such file or directory (os error 2)"),
    );
    // --help says what rdp-sim is (not the package's description).
    let o = run(sim, &["--help"]);
    assert!(o.status.success());
    assert!(String::from_utf8_lossy(&o.stdout).starts_with("Run RoCEv2 RC traffic between two roce-dp engines"));
}

#[test]
fn roce_dump_and_roce_stat_usage_errors_are_one_line() {
    let dump = env!("CARGO_BIN_EXE_roce-dump");
    one_line(&run(dump, &[]), "roce-dump: the following required arguments were not provided: <FILE> (see --help)");
    one_line(&run(dump, &["--bogus", "x.pcap"]), "roce-dump: unexpected argument '--bogus' found (see --help)");
    let stat = env!("CARGO_BIN_EXE_roce-stat");
    one_line(&run(stat, &["--bogus"]), "roce-stat: unexpected argument '--bogus' found (see --help)");
    // --socket defaults to rdp-client's default; a path that is a plain file is named as not a socket.
    let help = String::from_utf8_lossy(&run(stat, &["--help"]).stdout).into_owned();
    assert!(help.contains("[default: /run/roce-dpd.sock]"), "{help}");
    let file = temp("not-a-socket");
    std::fs::write(&file, b"x").unwrap();
    let o = run(stat, &["--socket", file.to_str().unwrap()]);
    std::fs::remove_file(&file).unwrap();
    one_line(
        &o,
        &format!(
            "roce-stat: {} is not a socket: give the socket roce-dpd listens on (its config's [daemon] socket)",
            file.display()
        ),
    );
}

/// `rdp-sim ... | head -1` and `rdp-sim > /dev/full`: `println!` panicked (exit 101, a backtrace) when stdout could
/// not be written. A reader that went away ends the run quietly with SIGPIPE's status, any other error in one line.
#[test]
fn rdp_sim_with_a_stdout_that_cannot_be_written_does_not_panic() {
    let sim = env!("CARGO_BIN_EXE_rdp-sim");
    let args = ["--msgs", "10"];
    let (r, w) = std::io::pipe().expect("pipe");
    drop(r);
    let o = Command::new(sim).args(args).stdout(w).output().expect("run rdp-sim");
    assert_eq!((o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned()), (Some(141), String::new()));
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let o = Command::new(sim).args(args).stdout(full).output().expect("run rdp-sim");
    one_line(&o, "rdp-sim: writing to stdout: No space left on device (os error 28)");
}

/// A socket path longer than a Unix socket address holds was reported as a daemon that went away ("roce-dpd on ...
/// is gone (connect: path must be shorter than SUN_LEN): every QP of this process is lost; reopen the device").
#[test]
fn a_daemon_socket_path_no_socket_can_have_is_named() {
    let stat = env!("CARGO_BIN_EXE_roce-stat");
    let long = format!("/tmp/{}", "s".repeat(195));
    one_line(
        &run(stat, &["--socket", &long]),
        &format!(
            "roce-stat: {long} is 200 bytes long: a Unix socket path holds at most 107, so no roce-dpd listens there \
             (give its config's [daemon] socket)"
        ),
    );
}

/// A negative number is refused by the flag it was given to. clap took `-1` for an unknown flag and said only
/// "unexpected argument '-1' found", naming no flag (rdp-sim was fixed in session 11; the others were not).
#[test]
fn a_negative_value_names_its_flag_in_every_tool() {
    let stat = env!("CARGO_BIN_EXE_roce-stat");
    one_line(
        &run(stat, &["--watch", "-1"]),
        "roce-stat: invalid value '-1' for '--watch <SECS>': not in (0, 31536000] seconds (see --help)",
    );
    let client = env!("CARGO_BIN_EXE_rdp-client");
    one_line(
        &run(client, &["active", "--oob", "/nonexistent-rdp-dir/x", "--size", "-1"]),
        "rdp-client: invalid value '-1' for '--size <SIZE>': -1 is not in 1..=1048576 (see --help)",
    );
    one_line(
        &run(client, &["passive", "--timeout", "-5"]),
        "rdp-client: invalid value '-5' for '--timeout <TIMEOUT>': -5 is negative: give a whole number, \
         1..=31536000 (see --help)",
    );
}

/// Session 18: a negative or fractional value of a flag that takes a whole number of 64 bits (`--timeout`,
/// `--iters`) got clap's "invalid digit found in string", which said neither that it was negative nor what the flag
/// takes. Now it says so, with the range.
#[cfg(feature = "dpdk")]
#[test]
fn a_negative_or_fractional_whole_number_says_what_is_wrong_and_the_range() {
    let nic = env!("CARGO_BIN_EXE_rdp-nic");
    for (v, why) in [
        ("-1", "-1 is negative: give a whole number, 1..=31536000"),
        ("1.5", "not a whole number: give one, 1..=31536000"),
        ("0", "0 is not in 1..=31536000"),
    ] {
        one_line(
            &run(nic, &["--timeout", v, "ring"]),
            &format!("rdp-nic: invalid value '{v}' for '--timeout <TIMEOUT>': {why} (see --help)"),
        );
    }
    one_line(
        &run(nic, &["--iters", "-5", "ring"]),
        "rdp-nic: invalid value '-5' for '--iters <ITERS>': -5 is negative: give a whole number, 1..=1000000000 (see \
         --help)",
    );
}

/// An atomic run moves 8 bytes per operation whatever `--size` says (`--help`: "atomics always 8"), but its report
/// said `Atomic 4096 B` (the default --size) and its JSON `"size":4096`.
#[test]
fn rdp_sim_reports_the_size_an_atomic_run_moves() {
    let sim = env!("CARGO_BIN_EXE_rdp-sim");
    for extra in [&[][..], &["--size", "65536"][..]] {
        let mut args = vec!["--op", "atomic", "--msgs", "10"];
        args.extend_from_slice(extra);
        let o = run(sim, &args);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.starts_with("rdp-sim: Atomic 8 B x 10 msgs x 1 QPs,"), "{out}");
        args.push("--json");
        let o = run(sim, &args);
        let first = String::from_utf8_lossy(&o.stdout).lines().next().unwrap_or_default().to_owned();
        let j: serde_json::Value = serde_json::from_str(&first).expect("JSON report");
        assert_eq!(j["size"], 8, "{first}");
    }
}

#[test]
fn rdp_sim_refuses_a_run_of_no_messages() {
    let sim = env!("CARGO_BIN_EXE_rdp-sim");
    one_line(
        &run(sim, &["--op", "write", "--msgs", "0"]),
        "rdp-sim: invalid value '0' for '--msgs <MSGS>': 0 is not in 1..=4294967295 (see --help)",
    );
}

/// Runs `exe args` with at most 4 GB of address space and 60 s: a refusal must come at once, and a regression that
/// starts the run instead must fail the test, not exhaust the machine's memory or hang it.
fn run_bounded(exe: &str, args: &[&str]) -> Output {
    let mut child = Command::new("sh")
        .args(["-c", "ulimit -v 4000000 && exec \"$0\" \"$@\"", exe])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {exe}: {e}"));
    let t0 = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(60) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{exe} {args:?} still running after 60 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn rdp_sim_refuses_flags_it_would_ignore_and_runs_it_could_not_finish() {
    let sim = env!("CARGO_BIN_EXE_rdp-sim");
    let cases: &[(&[&str], &str)] = &[
        // A flag of the other mode would be ignored: the run would not be the one asked for.
        (&["--incast", "2", "--loss", "0.5"], "rdp-sim: --loss applies to the two-node run, not to --incast"),
        (&["--incast", "2", "--mtu", "3"], "rdp-sim: --mtu applies to the two-node run, not to --incast"),
        (&["--link-gbps", "25"], "rdp-sim: --link-gbps applies to the incast only: add --incast N"),
        (&["--dcqcn", "on", "--msgs", "3"], "rdp-sim: --dcqcn applies to the incast only: add --incast N"),
        (
            &[
                "--incast",
                "2",
                "--dcqcn-preset",
                "ns3",
                "--cc-config",
                concat!(env!("CARGO_MANIFEST_DIR"), "/../conf/dcqcn.toml"),
            ],
            "rdp-sim: --dcqcn-preset and --cc-config both give the DCQCN parameters: give one of them",
        ),
        // Rates below 1 Mb/s (the simulators' unit) and sample periods below 1 ns (0: nothing sampled).
        (&["--gbps", "0.0001"], "rdp-sim: --gbps 0.0001 must be in [0.001, 1600]"),
        (&["--incast", "2", "--link-gbps", "1e-9"], "rdp-sim: --link-gbps 0.000000001 must be in [0.001, 1600]"),
        (
            &["--incast", "2", "--sample-us", "0.0001"],
            "rdp-sim: --hop-delay-us must be in [0, 1e6] and --sample-us in [0.001, 1e6]",
        ),
        // Memory: trace samples of every flow, message slots and work queues.
        (
            &["--incast", "8", "--duration-ms", "100", "--sample-us", "0.001"],
            "rdp-sim: --incast 8 x (--duration-ms 100 / --sample-us 0.001) = 800000008 trace samples (limit \
             10000000): raise --sample-us",
        ),
        (
            &["--qps", "16384", "--depth", "4096", "--size", "0", "--msgs", "1"],
            "rdp-sim: --qps x (--size x --depth + --depth work-queue entries) needs 33 GiB of simulated \
             memory (limit 8)",
        ),
        // Real time: flows x virtual time, payload to write and check, frames.
        (
            &["--incast", "1000", "--duration-ms", "60"],
            "rdp-sim: --incast 1000 x --duration-ms 60 = 60000 flow-milliseconds to simulate (limit 50000)",
        ),
        (
            &["--size", "2147483648", "--depth", "1", "--msgs", "4294967295"],
            "rdp-sim: --size 2147483648 x --msgs 4294967295 x --qps 1 = 8589934590 GiB of payload to move and \
             verify (limit 16 GiB)",
        ),
        (
            &["--size", "0", "--msgs", "200000000"],
            "rdp-sim: --msgs 200000000 x --qps 1 x 1 frame(s) per message = 200000000 frames, more than \
             --frame-limit 100000000",
        ),
        (
            &["--time-limit-ms", "0"],
            "rdp-sim: invalid value '0' for '--time-limit-ms <TIME_LIMIT_MS>': 0 is less than 1 (see --help)",
        ),
    ];
    for (args, want) in cases {
        one_line(&run_bounded(sim, args), want);
    }
    // Losses that keep a run going (every frame lost, retried for ever): it stops at --frame-limit, FAIL.
    let o = run_bounded(sim, &["--loss", "1", "--rxe-retry", "--timeout", "1", "--frame-limit", "100000"]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(out.contains("failure: frame limit of 100000 frames reached"), "{out}");
    assert!(out.lines().last().unwrap().starts_with("result: status=FAIL completed=0/1000 "), "{out}");
    // A congestion-control value of the wrong type or range names its key, not only its line.
    let conf = temp("bad-value.toml");
    std::fs::write(&conf, "[dcqcn]\nrp_gd = 11\n  np_cnp_dscp=300 # x\n").unwrap();
    let conf_s = conf.to_str().unwrap();
    one_line(
        &run_bounded(sim, &["--incast", "2", "--cc-config", conf_s]),
        &format!("rdp-sim: --cc-config {conf_s}: line 3: dcqcn.np_cnp_dscp: invalid value: integer `300`, expected u8"),
    );
    let _ = std::fs::remove_file(&conf);
    // A device that never ends is not read to its end; one output file for two outputs is refused.
    one_line(
        &run_bounded(sim, &["--incast", "2", "--cc-config", "/dev/zero"]),
        "rdp-sim: --cc-config /dev/zero: longer than 1048576 bytes: not a congestion-control file",
    );
    let out = temp("same.out");
    let out_s = out.to_str().unwrap();
    one_line(
        &run_bounded(sim, &["--incast", "2", "--trace", out_s, "--plot", out_s]),
        "rdp-sim: --trace and --plot name the same file: the plot would overwrite the trace",
    );
    assert!(!out.exists(), "refused before any file is made");
}

#[test]
fn rdp_client_without_a_command_or_a_peer_says_what_to_do() {
    let client = env!("CARGO_BIN_EXE_rdp-client");
    one_line(&run(client, &[]), "rdp-client: a command is needed: open, passive or active (see --help)");
    // The active side with no passive side: gives up after --timeout, naming the command to start first.
    let oob = temp("no-passive.sock");
    let oob_s = oob.to_str().unwrap();
    one_line(
        &run(client, &["active", "--oob", oob_s, "--timeout", "1"]),
        &format!(
            "rdp-client: no passive side listening on {oob_s} within --timeout 1 s (No such file or directory (os \
             error 2)): start `rdp-client passive --oob {oob_s}` first"
        ),
    );
    // The passive side with a daemon but no active side: gives up after --timeout (it used to wait for ever).
    let d = LoopbackDaemon::start(LoopbackConfig::new(temp("daemon.sock"))).expect("loopback daemon starts");
    let oob = temp("no-active.sock");
    let oob_s = oob.to_str().unwrap();
    let daemon = temp("daemon.sock");
    let o = run(client, &["passive", "--daemon", daemon.to_str().unwrap(), "--oob", oob_s, "--timeout", "1"]);
    one_line(
        &o,
        &format!(
            "rdp-client: no active side connected to {oob_s} within --timeout 1 s (run `rdp-client active --oob \
             {oob_s}`)"
        ),
    );
    assert!(!oob.exists(), "the out-of-band socket is removed");
    drop(d);
}

#[cfg(feature = "dpdk")]
mod dpdk_tools {
    use super::*;

    /// A profile in a temporary file; returns its path.
    fn profile(name: &str, text: &str) -> String {
        let p = temp(name);
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_owned()
    }

    #[test]
    fn perftest_flags_roce_dp_does_not_take_are_named() {
        let bw = env!("CARGO_BIN_EXE_rdp_write_bw");
        one_line(
            &run(bw, &["-R", "127.0.0.1"]),
            "rdp_write_bw: perftest's -R/--rdma_cm is not supported by roce-dp: the QPs connect through perftest's \
             TCP exchange (the default without -R)",
        );
        one_line(
            &run(bw, &["--port-conf", "x.toml", "--tclass=96"]),
            "rdp_write_bw: perftest's --tclass is not supported by roce-dp: the engine sends DSCP 0 with ECT(0)",
        );
        let lat = env!("CARGO_BIN_EXE_rdp_read_lat");
        one_line(
            &run(lat, &["-I", "64"]),
            "rdp_read_lat: perftest's -I/--inline_size is not supported by roce-dp: no inline sends in these tools \
             (`rdp-client active --inline N` shows the daemon's inline path)",
        );
        // A typo is still clap's line.
        one_line(&run(bw, &["--sise", "8"]), "rdp_write_bw: unexpected argument '--sise' found (see --help)");
    }

    /// Output files no tool can create, and why: `NAME` in a directory that does not exist, and a directory.
    fn unwritable_files(name: &str) -> [(String, &'static str); 2] {
        [
            (format!("/nonexistent-rdp-dir/{name}"), "No such file or directory (os error 2)"),
            (std::env::temp_dir().to_str().unwrap().to_owned(), "Is a directory (os error 21)"),
        ]
    }

    /// `--out_json_file` in a directory that does not exist, or naming a directory: the run went to its end (a
    /// whole benchmark) and then failed with exit 1 on a line that named no flag. Refused before it starts now.
    #[test]
    fn an_out_json_file_that_cannot_be_created_fails_before_the_run() {
        let bw = env!("CARGO_BIN_EXE_rdp_write_bw");
        for (file, why) in unwritable_files("r.json") {
            let file = file.as_str();
            // No daemon listens on the socket: the old code reached that refusal first, without a word about the file.
            one_line(
                &run(bw, &["--daemon", "/nonexistent-rdp-dir/d.sock", "--out_json_file", file]),
                &format!("rdp_write_bw: --out_json_file {file}: {why}"),
            );
        }
    }

    /// `--daemon ''`: "roce-dpd on  is gone (connect: Invalid argument (os error 22)): every QP of this process is
    /// lost; reopen the device", before any QP existed; `--port-conf ''`: ": cannot read: No such file or directory".
    /// An empty value is no value, as for clap's flags.
    #[test]
    fn an_empty_value_of_our_perftest_flags_is_named() {
        let bw = env!("CARGO_BIN_EXE_rdp_write_bw");
        for flag in ["--daemon", "--port-conf", "--socket", "--lcore", "--timeout"] {
            one_line(&run(bw, &[flag, ""]), &format!("rdp_write_bw: {flag} needs a value (see --help)"));
            one_line(&run(bw, &[&format!("{flag}=")]), &format!("rdp_write_bw: {flag} needs a value (see --help)"));
        }
    }

    /// `rdp-nic client` checked its profile against the machine (net_ring, lcores, devices) only once its server
    /// had answered: without one it waited `--timeout` and then said "127.0.0.1:18515: Connection refused (os
    /// error 111)", whatever was wrong with the profile. The profile is checked first now, and a server that never
    /// comes is named with what to start.
    #[test]
    fn rdp_nic_client_checks_its_profile_before_waiting_for_its_server() {
        let nic = env!("CARGO_BIN_EXE_rdp-nic");
        let oob = temp("rdp-nic-oob.sock");
        let oob_s = oob.to_str().unwrap();
        let ring = profile("nic-ring.toml", "[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.9.0.1\"\nmtu = 4096\n");
        let t0 = std::time::Instant::now();
        one_line(
            &run(nic, &["client", "--profile", &ring, "--oob-unix", oob_s, "--timeout", "3"]),
            &format!("rdp-nic: {ring}: net_ring profiles are for the ring mode"),
        );
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        let memif = profile(
            "nic-memif.toml",
            "[port]\ndriver = \"memif\"\nrole = \"client\"\nsocket = \"/run/rdp-cli-test.sock\"\n[net]\n\
             ipv4 = \"10.9.0.2\"\nmtu = 4096\n[eal]\nlcores = \"0\"\n",
        );
        one_line(
            &run(nic, &["client", "--profile", &memif, "--lcore", "999", "--oob-unix", oob_s, "--timeout", "3"]),
            &format!("rdp-nic: {memif}: --lcore: lcore 999 is not an online CPU here (online: {})", online.trim()),
        );
        assert!(t0.elapsed() < std::time::Duration::from_secs(3), "{:?}: waited for a server", t0.elapsed());
        one_line(
            &run(nic, &["client", "--profile", &memif, "--oob-unix", oob_s, "--timeout", "1"]),
            &format!(
                "rdp-nic: no rdp-nic server on {oob_s} within --timeout 1 s (No such file or directory (os error 2)): \
                 start `rdp-nic server --profile FILE` first with the same --oob-unix"
            ),
        );
        let _ = std::fs::remove_file(&ring);
        let _ = std::fs::remove_file(&memif);
    }

    /// `rdp-porttest --dpdk-log FILE` that cannot be opened: "open DPDK log file failed: No such file or directory
    /// (EAL args: -l 0 --no-huge ...)", naming no flag.
    #[test]
    fn rdp_porttest_names_a_dpdk_log_it_cannot_open() {
        let pt = env!("CARGO_BIN_EXE_rdp-porttest");
        for (file, why) in unwritable_files("dpdk.log") {
            one_line(&run(pt, &["ring", "--dpdk-log", &file]), &format!("rdp-porttest: --dpdk-log {file}: {why}"));
        }
    }

    /// `roce-dpd --config FILE --check`: a configuration checked on the machine it is for without taking the port
    /// (there was no way to check one short of starting the daemon).
    #[test]
    fn roce_dpd_check_validates_a_config_and_starts_nothing() {
        let dpd = env!("CARGO_BIN_EXE_roce-dpd");
        let sock = temp("check.sock");
        let sock_s = sock.to_str().unwrap();
        let base = "[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.9.0.1\"\nmtu = 1024\n[eal]\nlcores = \"0\"\n";
        let good = profile("check-good.toml", &format!("{base}[daemon]\nsocket = \"{sock_s}\"\nsocket_mode = 0o660\n"));
        let t0 = std::time::Instant::now();
        let o = run(dpd, &["--config", &good, "--check"]);
        assert_eq!(o.status.code(), Some(0), "{}", String::from_utf8_lossy(&o.stderr));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout),
            format!(
                "roce-dpd: {good}: ok: would serve {sock_s} (mode 660) on net_ring 10.9.0.1 mtu 1024 (memfd backing), \
                 worker lcore 0; nothing started\n"
            )
        );
        assert!(o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
        assert!(!sock.exists(), "--check created the socket");
        assert!(t0.elapsed() < std::time::Duration::from_secs(5), "{:?}", t0.elapsed());
        // --socket is checked as a start checks it.
        one_line(
            &run(dpd, &["--config", &good, "--check", "--socket", "/nonexistent-rdp-dir/d.sock"]),
            "roce-dpd: socket /nonexistent-rdp-dir/d.sock: the directory /nonexistent-rdp-dir does not exist (create it, \
             or give a socket path in one that does)",
        );
        // What the machine lacks, as a start says it.
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        let bad = profile(
            "check-bad.toml",
            &format!(
                "{base}[worker]\nworkers = 2\nidle = \"sleep\"\n[daemon]\nsocket = \"{sock_s}\"\nworker_lcores = \"0,997\"\n"
            ),
        );
        one_line(
            &run(dpd, &["--config", &bad, "--check"]),
            &format!(
                "roce-dpd: {bad}: daemon.worker_lcores: lcore 997 is not an online CPU here (online: {})",
                online.trim()
            ),
        );
        let _ = std::fs::remove_file(&good);
        let _ = std::fs::remove_file(&bad);
    }

    /// `rdp-nic --socket ''` and `--iface ''` passed the override checks and went to DPDK as `socket=` / `iface=`
    /// (a server started EAL and waited for a link). The client checks its profile before looking for its server,
    /// so this runs no DPDK on the old checks either.
    #[test]
    fn rdp_nic_refuses_an_empty_socket_or_interface_override() {
        let nic = env!("CARGO_BIN_EXE_rdp-nic");
        let oob = temp("rdp-nic-empty-oob.sock");
        let oob_s = oob.to_str().unwrap();
        let memif = profile(
            "nic-empty-memif.toml",
            "[port]\ndriver = \"memif\"\nrole = \"client\"\nsocket = \"/run/rdp-cli-test.sock\"\n[net]\n\
             ipv4 = \"10.9.0.2\"\nmtu = 4096\n[eal]\nlcores = \"0\"\n",
        );
        let base = ["client", "--profile", memif.as_str(), "--oob-unix", oob_s, "--timeout", "1"];
        one_line(
            &run(nic, &[&base[..], &["--socket", ""]].concat()),
            "rdp-nic: --socket \"\" is empty: memif needs the path of its control socket",
        );
        one_line(
            &run(nic, &[&base[..], &["--iface", ""]].concat()),
            "rdp-nic: --iface \"\" is not a Linux interface name (at most 15 bytes, no '/' or ':')",
        );
        let _ = std::fs::remove_file(&memif);
    }

    /// The DPDK tools' side of a_negative_value_names_its_flag_in_every_tool.
    #[test]
    fn a_negative_value_names_its_flag_in_the_dpdk_tools() {
        let bw = env!("CARGO_BIN_EXE_rdp_write_bw");
        one_line(
            &run(bw, &["--daemon", "/nonexistent.sock", "-s", "-1"]),
            "rdp_write_bw: invalid value '-1' for '--size <SIZE>': \"-1\" is not a message size (bytes, or with a K or \
             M suffix) (see --help)",
        );
        one_line(
            &run(bw, &["--daemon", "/nonexistent.sock", "-D", "-1"]),
            "rdp_write_bw: invalid value '-1' for '--duration <DURATION>': -1 is not in 1..=4294967295 (see --help)",
        );
        let nic = env!("CARGO_BIN_EXE_rdp-nic");
        one_line(
            &run(nic, &["client", "--profile", "/nonexistent.toml", "--size", "-1"]),
            "rdp-nic: invalid value '-1' for '--size <SIZE>': -1 is not in 1..=16777216 (see --help)",
        );
        let pt = env!("CARGO_BIN_EXE_rdp-porttest");
        one_line(
            &run(pt, &["ring", "--seconds", "-0.5"]),
            "rdp-porttest: invalid value '-0.5' for '--seconds <SECONDS>': not in (0, 31536000] seconds (see --help)",
        );
    }

    /// Arguments that are not UTF-8 (a file name in another encoding): `std::env::args` panicked with a backtrace.
    #[test]
    fn perftest_tools_take_arguments_that_are_not_utf8() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let bw = env!("CARGO_BIN_EXE_rdp_write_bw");
        let run_os = |args: &[&OsStr]| Command::new(bw).args(args).output().expect("run rdp_write_bw");
        let path = OsStr::from_bytes(b"/nonexistent-rdp-dir/\xff.toml");
        // A path is a path: the profile or the daemon's socket is looked for under that name.
        let o = run_os(&[OsStr::new("--port-conf"), path]);
        one_line(
            &o,
            "rdp_write_bw: /nonexistent-rdp-dir/\u{fffd}.toml: cannot read: No such file or directory (os error 2)",
        );
        let mut eq = b"--daemon=".to_vec();
        eq.extend_from_slice(b"/nonexistent-rdp-dir/\xff.sock");
        let o = run_os(&[OsStr::from_bytes(&eq)]);
        one_line(
            &o,
            "rdp_write_bw: no roce-dpd listening on /nonexistent-rdp-dir/\u{fffd}.sock: start it with `roce-dpd \
             --config conf/NAME.toml` (its [daemon] socket)",
        );
        // Any other value is refused by name; perftest's own flags and the host by clap's line.
        let o = run_os(&[OsStr::new("--timeout"), OsStr::from_bytes(b"\xff")]);
        one_line(&o, "rdp_write_bw: --timeout \"\\xFF\": not valid UTF-8 (see --help)");
        let o = run_os(&[OsStr::new("--port-conf"), OsStr::new("x.toml"), OsStr::from_bytes(b"\xff")]);
        one_line(&o, "rdp_write_bw: invalid UTF-8 was detected in one or more arguments (see --help)");
    }

    #[test]
    fn event_moderation_takes_count_and_period_and_goes_with_daemon_and_events() {
        let bw = env!("CARGO_BIN_EXE_rdp_write_bw");
        for v in ["4", "0:100", "4:0", "70000:10", "4:x", ":"] {
            one_line(
                &run(bw, &["--daemon", "/nonexistent.sock", "-e", "--event-moderation", v, "127.0.0.1"]),
                &format!(
                    "rdp_write_bw: --event-moderation {v:?}: give COUNT:US, a completion count and a period in \
                     microseconds, both 1-65535 (see --help)"
                ),
            );
        }
        let want = "rdp_write_bw: --event-moderation COUNT:US goes with --daemon SOCKET and -e/--events (it moderates \
                    the completion events the tool sleeps on)";
        one_line(&run(bw, &["--daemon", "/nonexistent.sock", "--event-moderation", "4:100", "127.0.0.1"]), want);
        one_line(&run(bw, &["--port-conf", "x.toml", "--event-moderation=4:100", "127.0.0.1"]), want);
    }

    #[test]
    fn profiles_naming_hardware_this_machine_lacks_fail_before_dpdk() {
        let bw = env!("CARGO_BIN_EXE_rdp_write_bw");
        // No such PCI device (domain fffe: none on any machine this runs on), mlx5 and ice; the client checks its
        // profile before connecting to a server (none listens here).
        let lat = env!("CARGO_BIN_EXE_rdp_read_lat");
        for (exe, tool, driver, extra) in [
            (bw, "rdp_write_bw", "mlx5", &[][..]),
            (bw, "rdp_write_bw", "ice", &[][..]),
            (lat, "rdp_read_lat", "ice", &["-p", "1", "127.0.0.1"][..]),
        ] {
            let p = profile(
                &format!("{tool}-{driver}.toml"),
                &format!(
                    "[port]\ndriver = \"{driver}\"\npci = \"fffe:ff:1f.7\"\n[net]\nipv4 = \"10.9.0.1\"\nmtu = 4096\n"
                ),
            );
            let mut args = vec!["--port-conf", &p];
            args.extend_from_slice(extra);
            one_line(
                &run(exe, &args),
                &format!(
                    "{tool}: {p}: port.pci: no PCI device fffe:ff:1f.7 on this machine ({}; set port.pci to the NIC \
                     port's address)",
                    pci_list_hint()
                ),
            );
            let _ = std::fs::remove_file(&p);
        }
        // No such interface in this network namespace.
        let p = profile(
            "afp.toml",
            "[port]\ndriver = \"af_packet\"\niface = \"rdpnoif9\"\nframesz = 8192\nblocksz = 8192\n[net]\n\
             ipv4 = \"10.9.0.1\"\nmtu = 4096\n",
        );
        one_line(
            &run(bw, &["--port-conf", &p]),
            &format!(
                "rdp_write_bw: {p}: port.iface: no network interface \"rdpnoif9\" in this network namespace (ip link \
                 lists them)"
            ),
        );
        // An lcore beyond the machine's CPUs, from the profile and from --lcore.
        let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
        let online = online.trim();
        let p = profile(
            "lcore.toml",
            "[port]\ndriver = \"memif\"\nrole = \"server\"\nsocket = \"/run/rdp-cli-test.sock\"\n[net]\n\
             ipv4 = \"10.9.0.1\"\nmtu = 4096\n[eal]\nlcores = \"1000\"\n",
        );
        one_line(
            &run(bw, &["--port-conf", &p]),
            &format!("rdp_write_bw: {p}: eal.lcores: lcore 1000 is not an online CPU here (online: {online})"),
        );
        one_line(
            &run(bw, &["--port-conf", &p, "--lcore", "999"]),
            &format!("rdp_write_bw: {p}: --lcore: lcore 999 is not an online CPU here (online: {online})"),
        );
        let _ = std::fs::remove_file(&p);
        // roce-dpd: the same check, on the daemon's worker lcores.
        let p = profile(
            "daemon.toml",
            "[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.9.0.1\"\nmtu = 4096\n[worker]\nworkers = 2\n\
             idle = \"sleep\"\n[daemon]\nsocket = \"/run/rdp-cli-test-d.sock\"\nworker_lcores = \"0,998\"\n",
        );
        one_line(
            &run(env!("CARGO_BIN_EXE_roce-dpd"), &["--config", &p]),
            &format!("roce-dpd: {p}: daemon.worker_lcores: lcore 998 is not an online CPU here (online: {online})"),
        );
        let _ = std::fs::remove_file(&p);
        // roce-dpd's socket: --socket as relative as [daemon] socket may not be (it was served as given), and one
        // in a directory that does not exist (bind said "No such file or directory" once EAL and the port were up).
        let p = profile(
            "daemon-sock.toml",
            "[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.9.0.1\"\nmtu = 4096\n[eal]\nlcores = \"998\"\n\
             [daemon]\nsocket = \"/run/rdp-cli-test-no-dir/d.sock\"\n",
        );
        let dpd = env!("CARGO_BIN_EXE_roce-dpd");
        one_line(
            &run(dpd, &["--config", &p, "--socket", "d.sock"]),
            "roce-dpd: --socket d.sock: not an absolute path (e.g. /run/roce-dpd.sock)",
        );
        one_line(
            &run(dpd, &["--config", &p]),
            "roce-dpd: socket /run/rdp-cli-test-no-dir/d.sock: the directory /run/rdp-cli-test-no-dir does not exist \
             (create it, or give a socket path in one that does)",
        );
        // A trailing '/': Path reads /run/d.sock/ as d.sock in /run, bind as a directory that is not there.
        one_line(
            &run(dpd, &["--config", &p, "--socket", "/run/rdp-cli-test-d.sock/"]),
            "roce-dpd: socket /run/rdp-cli-test-d.sock/: names a directory, not a file (give the socket's file name \
             after the last '/')",
        );
        // A directory where the socket would be: refused by the server after EAL and the port were up.
        one_line(
            &run(dpd, &["--config", &p, "--socket", "/run"]),
            "roce-dpd: socket /run: exists and is not a socket: refusing to replace it (give another path)",
        );
        let long = format!("/run/{}.sock", "x".repeat(103));
        one_line(
            &run(dpd, &["--config", &p, "--socket", &long]),
            &format!(
                "roce-dpd: socket {long}: 113 bytes, longer than a Unix socket path can be (107): give a shorter one"
            ),
        );
        let _ = std::fs::remove_file(&p);
    }
}

/// With $PATH unset the PCI hint looked for lspci in the current directory only: an `lspci` file there made it
/// name lspci, and an installed one was never found. Now it looks where a shell would ($PATH unset: roce-dp's
/// DEFAULT_PATH) and never in the current directory.
#[cfg(feature = "dpdk")]
#[test]
fn the_pci_hint_without_path_looks_in_the_system_directories() {
    use std::os::unix::fs::PermissionsExt;
    let dirs = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"];
    let installed = dirs.iter().any(|d| std::path::Path::new(d).join("lspci").is_file());
    let (hint, cwd) =
        (if installed { "lspci -D lists them" } else { "ls /sys/bus/pci/devices lists them" }, temp("cwd"));
    std::fs::create_dir_all(&cwd).unwrap();
    if !installed {
        // A file named lspci where the tool runs is no pciutils.
        std::fs::write(cwd.join("lspci"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(cwd.join("lspci"), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let p = temp("pci.toml");
    std::fs::write(
        &p,
        "[port]\ndriver = \"ice\"\npci = \"0000:fe:1f.7\"\n[net]\nipv4 = \"10.9.0.1\"\nmtu = 4096\n[daemon]\n\
         socket = \"/run/rdp-cli-test-pci.sock\"\n",
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_roce-dpd"))
        .arg("--config")
        .arg(&p)
        .env_remove("PATH")
        .current_dir(&cwd)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&cwd);
    let _ = std::fs::remove_file(&p);
    one_line(
        &o,
        &format!(
            "roce-dpd: {}: port.pci: no PCI device 0000:fe:1f.7 on this machine ({hint}; set port.pci to the NIC \
             port's address)",
            p.display()
        ),
    );
}

/// `scripts/run.sh`'s own path (it runs the README's main job; its argument errors come before root, setup and the
/// build, so no root is needed here).
fn run_sh() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/run.sh")
}

/// Session 15: `scripts/run.sh HOST` was not refused: the words went to both sides, so the server ran as a client
/// of HOST and the client was given two hosts (run.sh adds 127.0.0.1), each failing after its timeout. A word that
/// is no option's value is now refused in one line before anything runs; an option's value is not. Old run.sh: not
/// refused (past the loop it stops at the root check, or runs setup and the build as root).
#[test]
fn run_sh_refuses_a_host_in_one_line() {
    let want = |w: &str| {
        format!(
            "run.sh: {w} looks like a HOST, which is run.sh's own (the client connects to 127.0.0.1; both sides run \
             here, over memif); against another machine run rdp_write_bw by hand (README: perftest-compatible tools)"
        )
    };
    let sh = run_sh();
    let sh = sh.to_str().unwrap();
    for args in [
        &["10.0.0.2"][..],
        &["-s", "4096", "10.0.0.2"],
        &["--data_validation", "10.0.0.2"],
        &["-s4096", "10.0.0.2"],
        &["--size=4096", "-ab", "10.0.0.2"],
        &["-p", "3000", "10.0.0.2"],
        &["--timeout", "9", "-e", "10.0.0.2", "-n", "5"],
    ] {
        let o = run("bash", &[&[sh][..], args].concat());
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert_eq!(err, format!("{}\n", want("10.0.0.2")), "{args:?}");
    }
}

/// run.sh as a user who is not root: it stops at its root check (one line), so a spelling that gets there was
/// not refused by the argument loop, and nothing is set up, built or run.
fn run_sh_unprivileged(args: &[&str]) -> Output {
    let sh = run_sh();
    let sh = sh.to_str().unwrap();
    let uid = run("id", &["-u"]);
    if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
        run("setpriv", &[&["--reuid=65534", "--regid=65534", "--clear-groups", "bash", sh][..], args].concat())
    } else {
        run("bash", &[&[sh][..], args].concat())
    }
}

/// Session 15's review of run.sh's HOST check: a cluster of short options whose last takes a value (`-bs 4096`,
/// which rdp_write_bw's clap reads as -b -s 4096) had its value refused as a HOST, and a HOST after `--` (clap's end
/// of options) was passed to both sides. Old run.sh: "-bs 4096" and "-en 5" refused as HOSTs; "-- 10.0.0.2" not
/// refused.
#[test]
fn run_sh_reads_short_option_clusters_and_the_end_of_options_as_clap_does() {
    for args in [
        &["-bs", "4096"][..],
        &["-en", "5", "--report_gbits"],
        &["-s", "4096", "-n", "100"],
        &["--size", "4096", "-a", "-F", "-D", "2"],
        &["-s4096", "-ab", "-s=64"],
        &["-s", "4096", "--"],
    ] {
        let o = run_sh_unprivileged(args);
        one_line(&o, "run.sh: run as root (DPDK needs /var/run/dpdk)");
    }
    let host = "run.sh: 10.0.0.2 looks like a HOST, which is run.sh's own (the client connects to 127.0.0.1; both \
                sides run here, over memif); against another machine run rdp_write_bw by hand (README: \
                perftest-compatible tools)";
    for args in
        [&["--", "10.0.0.2"][..], &["-s", "64", "--", "10.0.0.2"], &["-bs", "64", "10.0.0.2"], &["-ab", "10.0.0.2"]]
    {
        one_line(&run_sh_unprivileged(args), host);
    }
    // -p ending a cluster takes the next word (run.sh's port, not passed on); with none, it says so.
    one_line(
        &run_sh_unprivileged(&["-s", "64", "-Fp"]),
        "run.sh: -Fp needs a value (see target/release/rdp_write_bw --help)",
    );
    for args in [&["-Fp", "3000"][..], &["-Fp3000"], &["-Fp=3000", "-s", "64"]] {
        one_line(&run_sh_unprivileged(args), "run.sh: run as root (DPDK needs /var/run/dpdk)");
    }
    // --help after other options is run.sh's help too (it was only read as the first argument: the rest went on
    // to the root check, or as root to a run).
    for args in [&["--help"][..], &["-s", "64", "--help"], &["-n", "100", "-h"]] {
        let o = run_sh_unprivileged(args);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && out.starts_with("# The README's main-job command"), "{args:?}: {o:?}");
    }
}

/// run.sh tells an option's value from a HOST by its list of rdp_write_bw's options that take no value: it must be
/// the tool's (an option added without a value and missing from the list would take the word after it for its
/// value; one given a value and left in the list would have its value refused as a HOST).
#[test]
fn run_sh_knows_which_rdp_write_bw_options_take_no_value() {
    let help = run(env!("CARGO_BIN_EXE_rdp_write_bw"), &["--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    let mut tool: Vec<String> = Vec::new();
    for line in help.lines() {
        let t = line.trim();
        if let Some(alias) = t.strip_prefix("[alias: ").and_then(|a| a.strip_suffix(']')) {
            tool.push(alias.to_owned());
        } else if line.starts_with("  -") || line.starts_with("      --") {
            // clap's option lines: "-a, --all", "--report_gbits", "-s, --size <SIZE>"; roce-dp's own (after the
            // options) have a value and a description on the line.
            if !t.contains('<') && !t.contains("  ") {
                tool.extend(t.split(", ").map(str::to_owned));
            }
        }
    }
    let sh = std::fs::read_to_string(run_sh()).unwrap();
    let list = sh.split("flags=\"").nth(1).and_then(|r| r.split('"').next()).expect("run.sh's flags=\"...\"");
    let mut ours: Vec<String> = list.split_whitespace().map(str::to_owned).collect();
    tool.sort();
    ours.sort();
    assert!(tool.len() >= 18, "{tool:?}");
    assert_eq!(ours, tool);
}
