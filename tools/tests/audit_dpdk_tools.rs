//! Session 11's audit of the DPDK tools' command lines (`rdp-nic`, `rdp-porttest`, and the `--file-prefix` every
//! DPDK tool takes): bad values (zero, huge, negative, not numbers) give one line naming the flag and exit 2
//! before DPDK starts (so these run in tier 1, without EAL), and nothing outside the tool's own runtime directory
//! is touched. Found: `--file-prefix /some/dir` (or `../..`) made each tool remove that directory recursively on
//! exit (`/var/run/dpdk` joined with an absolute path is that path: `--file-prefix /` named the root); `--timeout`
//! past the clock's range and `--seconds` negative, NaN or infinite panicked; `--inject-loss` outside 0-100 was
//! clamped silently (NaN to 0); `--window 0` waited for the timeout; `--socket`/`--iface` values with ',' changed
//! the vdev's devargs string.

#![cfg(feature = "dpdk")]

use std::path::PathBuf;
use std::process::{Command, Output};

fn run(exe: &str, args: &[&str]) -> Output {
    Command::new(exe).args(args).output().unwrap_or_else(|e| panic!("run {exe}: {e}"))
}

/// Exit status 2, nothing on stdout, one line on stderr starting with `prefix` and holding every `parts`.
fn one_line(o: &Output, prefix: &str, parts: &[&str]) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert!(err.ends_with('\n') && err.lines().count() == 1, "not one line: {err:?}");
    assert!(err.starts_with(prefix), "{err}");
    for p in parts {
        assert!(err.contains(p), "{p:?} not in {err}");
    }
    assert!(o.stdout.is_empty(), "stdout: {}", String::from_utf8_lossy(&o.stdout));
}

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rdp-audit-dpdk-{}-{name}", std::process::id()))
}

fn profile(name: &str, text: &str) -> String {
    let p = temp(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_owned()
}

const NIC: &str = env!("CARGO_BIN_EXE_rdp-nic");
const PORTTEST: &str = env!("CARGO_BIN_EXE_rdp-porttest");

#[test]
fn a_file_prefix_naming_another_directory_is_refused_and_that_directory_kept() {
    // A directory with a file in it, named by an absolute path and by a relative one climbing out of
    // /var/run/dpdk: both are what the tools' exit cleanup joined onto /var/run/dpdk and removed.
    let canary = temp("canary");
    std::fs::create_dir_all(&canary).unwrap();
    std::fs::write(canary.join("keep"), "x").unwrap();
    let abs = canary.to_str().unwrap().to_owned();
    let rel = format!("../../..{abs}");
    let conf = profile(
        "prefix.toml",
        "[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n[daemon]\nsocket = \"/run/rdp-audit-x.sock\"\n",
    );
    for prefix in [abs.as_str(), rel.as_str()] {
        let pf = format!("--file-prefix={prefix}");
        for (exe, tool, args) in [
            (NIC, "rdp-nic", vec!["ring", "--iters", "1", &pf]),
            (PORTTEST, "rdp-porttest", vec!["ring", "--frames", "1", &pf]),
            (env!("CARGO_BIN_EXE_roce-dpd"), "roce-dpd", vec!["--config", &conf, &pf]),
            (env!("CARGO_BIN_EXE_rdp_write_bw"), "rdp_write_bw", vec!["--port-conf", &conf, &pf]),
        ] {
            let o = run(exe, &args);
            one_line(&o, &format!("{tool}: "), &["--file-prefix", &format!("{prefix:?} is not a plain name")]);
            assert_eq!(std::fs::read_to_string(canary.join("keep")).ok().as_deref(), Some("x"), "{tool} {prefix}");
        }
    }
    // (`/`, `..` and the like are refused the same way: roce-dp's unit test `file_prefix_is_one_plain_name`. Never
    // hand them to a binary here: a regression would remove `/` or `/var/run`.)
    std::fs::remove_dir_all(&canary).unwrap();
    let _ = std::fs::remove_file(&conf);
}

#[test]
fn rdp_nic_numbers_out_of_range_are_one_line() {
    let conf = profile(
        "nic.toml",
        "[port]\ndriver = \"memif\"\nrole = \"client\"\nsocket = \"/run/rdp-audit-nic.sock\"\n[net]\n\
         ipv4 = \"10.0.0.2\"\nmtu = 1024\n",
    );
    let client = |extra: &[&str]| {
        let mut a = vec!["client", "--profile", &conf];
        a.extend_from_slice(extra);
        run(NIC, &a)
    };
    // The deadline is now + --timeout: past the clock's range it panicked (exit 101) before anything else.
    for t in ["18446744073709551615", "31536001", "0", "-1", "x"] {
        one_line(&client(&[&format!("--timeout={t}")]), "rdp-nic: ", &["--timeout"]);
    }
    // --seconds went to Duration::from_secs_f64 (panics on negative, NaN, infinite, too large).
    for s in ["-1", "NaN", "inf", "1e300", "0", "x"] {
        one_line(&client(&["--raw", "bw", &format!("--seconds={s}")]), "rdp-nic: ", &["--seconds"]);
    }
    // A loss percentage outside 0-100 was clamped without a word (NaN became 0).
    for l in ["150", "-5", "NaN", "x"] {
        one_line(&run(NIC, &["ring", &format!("--inject-loss={l}")]), "rdp-nic: ", &["--inject-loss"]);
    }
    for (flag, v) in [("--iters", "1000000001"), ("--iters", "0"), ("--oob-port", "0"), ("--oob-port", "65536")] {
        one_line(&client(&[&format!("{flag}={v}")]), "rdp-nic: ", &[flag]);
    }
    // --socket and --iface override the profile's values inside the devargs string: checked as they are, before
    // the out-of-band connection (no server listens on port 1: the run would wait for --timeout otherwise).
    let o = client(&["--oob-port", "1", "--timeout", "30", "--socket", "/run/x.sock,role=server"]);
    one_line(&o, "rdp-nic: --socket \"/run/x.sock,role=server\" contains ','", &[]);
    let o = client(&["--oob-port", "1", "--timeout", "30", "--iface", "vp0,qpairs=4"]);
    one_line(&o, "rdp-nic: --iface \"vp0,qpairs=4\" contains ','", &[]);
    // --ipv4 replaces the profile's net.ipv4: the same rule (no unspecified, broadcast or multicast address).
    for a in ["0.0.0.0", "255.255.255.255", "224.0.0.1"] {
        let o = client(&["--oob-port", "1", "--timeout", "30", "--ipv4", a]);
        one_line(&o, &format!("rdp-nic: --ipv4 \"{a}\" is not a host's own address"), &[]);
    }
    let _ = std::fs::remove_file(&conf);
}

#[test]
fn rdp_porttest_numbers_and_devargs_out_of_range_are_one_line() {
    for (flag, v) in [
        ("--timeout", "18446744073709551615"),
        ("--timeout", "0"),
        ("--link-timeout", "18446744073709551615"),
        ("--seconds", "-1"),
        ("--seconds", "NaN"),
        ("--seconds", "inf"),
        ("--window", "0"),
        ("--frames", "0"),
        ("--frames", "18446744073709551615"),
        ("--rto-ms", "0"),
        ("--stop-grace-ms", "18446744073709551615"),
    ] {
        one_line(&run(PORTTEST, &["ring", &format!("{flag}={v}")]), "rdp-porttest: ", &[flag]);
    }
    let o = run(PORTTEST, &["memif", "--role", "server", "--socket", "/run/x.sock,role=client"]);
    one_line(&o, "rdp-porttest: ", &["--socket", "contains ','"]);
    let o = run(PORTTEST, &["af-packet", "--iface", "vp0,framesz=64"]);
    one_line(&o, "rdp-porttest: ", &["--iface", "contains ','"]);
}

#[test]
fn an_lcore_this_machine_lacks_is_named_before_eal() {
    // Ring modes have no profile to check: --lcore went to EAL as it was, whose refusal named no flag.
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let want = format!("--lcore: lcore 999 is not an online CPU here (online: {})", online.trim());
    one_line(&run(NIC, &["ring", "--lcore", "999"]), &format!("rdp-nic: {want}"), &[]);
    one_line(&run(PORTTEST, &["ring", "--lcore", "999"]), &format!("rdp-porttest: {want}"), &[]);
}
