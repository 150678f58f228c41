//! perftest's flags and defaults for the eight tools, and one-line refusals of what perftest would refuse.

use roce_dp_tools::perftest::exchange::{Mtu, TestKind};
use roce_dp_tools::perftest::params::{one_line_error, AtomicType, Params, RunLength};
use roce_dp_tools::perftest::report::{json, Banner, Results};

fn parse(test: TestKind, args: &str) -> Result<Params, String> {
    let argv = std::iter::once(test.tool_name()).chain(args.split_whitespace());
    Params::try_parse_from(test, argv).map_err(|e| one_line_error(test, &e))
}

fn ok(test: TestKind, args: &str) -> Params {
    parse(test, args).unwrap_or_else(|e| panic!("{test:?} {args:?}: {e}"))
}

fn err(test: TestKind, args: &str) -> String {
    match parse(test, args) {
        Ok(p) => panic!("{test:?} {args:?} parsed: {p:?}"),
        Err(e) => {
            assert!(!e.contains('\n'), "not one line: {e}");
            assert!(e.starts_with(&format!("{}: ", test.tool_name())), "{e}");
            e
        }
    }
}

#[test]
fn defaults_per_test_as_perftest() {
    // (test, size, iters, tx depth, rx depth)
    let table = [
        (TestKind::SendBw, 65536, 1000, 128, 512),
        (TestKind::WriteBw, 65536, 5000, 128, 1),
        (TestKind::ReadBw, 65536, 1000, 128, 1),
        (TestKind::AtomicBw, 8, 1000, 128, 1),
        (TestKind::SendLat, 2, 1000, 1, 512),
        (TestKind::WriteLat, 2, 1000, 1, 1),
        (TestKind::ReadLat, 2, 1000, 1, 1),
        (TestKind::AtomicLat, 8, 1000, 1, 1),
    ];
    for (test, size, iters, tx, rx) in table {
        let p = ok(test, "");
        assert_eq!(p.sizes, vec![size], "{test:?}");
        assert_eq!(p.run, RunLength::Iterations(iters), "{test:?}");
        assert_eq!((p.tx_depth, p.rx_depth), (tx, rx), "{test:?}");
        assert_eq!(p.port, 18515);
        assert_eq!(p.qp_timeout, 14);
        assert_eq!(p.num_qps, 1);
        // perftest signals every WR above 8 KiB (MSG_SIZE_CQ_MOD_LIMIT) unless -Q: the 64 KiB BW tests.
        let cq_mod = match (test.is_bw(), size > 8192) {
            (true, true) => 1,
            (true, false) => 100,
            (false, _) => 1,
        };
        assert_eq!(p.cq_mod, cq_mod, "{test:?}");
        assert_eq!(p.atomic_type, AtomicType::FetchAndAdd);
        assert_eq!(p.mtu, None);
        assert!(!p.is_client());
        assert!(!p.duplex && !p.report_gbits && !p.out_json && !p.data_validation && !p.all);
    }
}

#[test]
fn depths_clamp_to_iterations_as_the_captured_banners_show() {
    // rc_write_4k: "-s 4096 -n 20" printed "TX depth : 20" and "CQ Moderation : 20".
    let p = ok(TestKind::WriteBw, "10.50.0.2 -s 4096 -n 20");
    assert_eq!((p.tx_depth, p.cq_mod), (20, 20));
    assert_eq!(p.host.as_deref(), Some("10.50.0.2"));
    // drop5: "-n 25" -> 25 / 25.
    let p = ok(TestKind::WriteBw, "-s 4096 -n 25");
    assert_eq!((p.tx_depth, p.cq_mod), (25, 25));
    // rc_send_4k server: "RX depth : 20".
    assert_eq!(ok(TestKind::SendBw, "-n 20").rx_depth, 20);
    assert_eq!(ok(TestKind::SendLat, "-s 64 -n 20").rx_depth, 20);
    // Latency: TX depth 1.
    assert_eq!(ok(TestKind::WriteLat, "-s 64 -n 20").tx_depth, 1);
    // Duration mode does not clamp.
    let p = ok(TestKind::SendBw, "-D 3");
    assert_eq!((p.run, p.tx_depth, p.rx_depth), (RunLength::Duration { secs: 3, margin: 0 }, 128, 512));
}

#[test]
fn every_flag_of_the_issue_parses() {
    let p = ok(
        TestKind::ReadBw,
        "host1 -s 4096 -n 50 -q 4 -t 64 -m 4096 -x 1 -p 18600 -u 17 -o 8 -b -F -N -Q 10 \
         --report_gbits --out_json --out_json_file /tmp/r.json -d rdp0 -i 1 -c RC",
    );
    assert_eq!(p.host.as_deref(), Some("host1"));
    assert_eq!(p.sizes, vec![4096]);
    assert_eq!(p.run, RunLength::Iterations(50));
    assert_eq!((p.num_qps, p.tx_depth, p.cq_mod), (4, 50, 10));
    assert_eq!(p.mtu, Some(Mtu::Mtu4096));
    assert_eq!((p.gid_index, p.port, p.qp_timeout, p.out_reads), (Some(1), 18600, 17, Some(8)));
    assert!(p.duplex && p.cpu_freq_ignore && p.no_peak && p.report_gbits && p.out_json);
    assert!(ok(TestKind::ReadBw, "--data_validation").data_validation);
    assert_eq!(p.out_json_file.as_deref(), Some(std::path::Path::new("/tmp/r.json")));
    assert_eq!(p.ib_dev.as_deref(), Some("rdp0"));
    // Long forms.
    let p = ok(TestKind::AtomicBw, "--size=8 --iters=100 --qp=2 --tx-depth=16 --atomic_type=CMP_AND_SWAP --mtu=1024");
    assert_eq!(p.atomic_type, AtomicType::CmpAndSwap);
    assert_eq!((p.num_qps, p.tx_depth), (2, 16));
    // --out_json_file alone implies JSON.
    assert!(ok(TestKind::SendLat, "--out_json_file x.json").out_json);
    // -a: 2 .. 2^23.
    let p = ok(TestKind::WriteLat, "-a");
    assert_eq!(p.sizes.len(), 23);
    assert_eq!((p.sizes[0], p.sizes[22]), (2, 1 << 23));
    let p = ok(TestKind::WriteBw, "--run_infinitely -D 2");
    assert_eq!(p.run, RunLength::Infinitely(2));
    assert_eq!(ok(TestKind::WriteBw, "--run_infinitely").run, RunLength::Infinitely(5));
    assert_eq!(ok(TestKind::SendBw, "-r 64 -n 1000").rx_depth, 64);
    // -D: perftest's margin is a quarter of the duration unless -f says otherwise; no peak in duration mode.
    let p = ok(TestKind::WriteBw, "-D 5");
    assert_eq!(p.run, RunLength::Duration { secs: 5, margin: 1 });
    assert!(p.no_peak);
    assert_eq!(ok(TestKind::SendBw, "-D 5 -f 2").run, RunLength::Duration { secs: 5, margin: 2 });
    // perftest skips the peak above 20000 iterations.
    assert!(!ok(TestKind::WriteBw, "-n 20000").no_peak);
    assert!(ok(TestKind::WriteBw, "-n 20001").no_peak);
    assert_eq!(ok(TestKind::WriteBw, "-Q 7").cq_mod, 7);
}

#[test]
fn bad_input_is_one_line() {
    let e = err(TestKind::WriteBw, "--bogus");
    assert!(e.contains("--bogus"), "{e}");
    let e = err(TestKind::WriteBw, "-m 1500");
    assert!(e.contains("256, 512, 1024, 2048 or 4096"), "{e}");
    let e = err(TestKind::WriteBw, "-c UD");
    assert!(e.contains("RC only"), "{e}");
    let e = err(TestKind::WriteBw, "-A CMP_AND_SWAP");
    assert!(e.contains("-A/--atomic_type is only available in atomic tests"), "{e}");
    let e = err(TestKind::AtomicBw, "-A XOR");
    assert!(e.contains("XOR"), "{e}");
    let e = err(TestKind::AtomicLat, "-s 16");
    assert!(e.contains("always 8"), "{e}");
    err(TestKind::AtomicBw, "-a");
    let e = err(TestKind::WriteLat, "-q 2");
    assert!(e.contains("-q/--qp 2 is not available in latency tests"), "{e}");
    for flag in ["-b", "-N", "--report_gbits", "--run_infinitely", "-Q 4"] {
        let e = err(TestKind::SendLat, flag);
        assert!(e.contains("only available in BW tests"), "{flag}: {e}");
    }
    err(TestKind::WriteBw, "-o 4");
    err(TestKind::WriteBw, "-r 4");
    let e = err(TestKind::WriteBw, "-n 4");
    assert!(e.contains("5..=100000000"), "{e}");
    err(TestKind::WriteBw, "-t 15001");
    err(TestKind::SendBw, "-r 16385");
    err(TestKind::WriteBw, "-Q 1025");
    err(TestKind::WriteBw, "-x 65");
    err(TestKind::WriteBw, "-s 0");
    err(TestKind::WriteBw, "-s 4096 -a");
    err(TestKind::WriteBw, "-n 100 -D 5");
    let e = err(TestKind::WriteBw, "-D 4 -f 2");
    assert!(e.contains("twice the margin"), "{e}");
    err(TestKind::WriteBw, "-f 1");
    let e = err(TestKind::ReadLat, "-D 3");
    assert!(e.contains("latency tests"), "{e}");
    let e = err(TestKind::WriteBw, "-b --data_validation");
    assert!(e.contains("-b"), "{e}");
    err(TestKind::WriteBw, "-u 32");
    err(TestKind::WriteBw, "-q 0");
    err(TestKind::WriteBw, "-s abc");
    err(TestKind::WriteBw, "host1 host2");
}

#[test]
fn events_as_perftest_except_write_bw() {
    for test in [TestKind::WriteBw, TestKind::SendBw, TestKind::ReadBw, TestKind::AtomicBw] {
        assert!(!ok(test, "").use_event);
        assert!(ok(test, "-e").use_event, "{test:?}");
    }
    for test in [TestKind::SendLat, TestKind::ReadLat, TestKind::AtomicLat] {
        assert!(ok(test, "--events").use_event, "{test:?}");
        assert!(ok(test, "--use_event").use_event, "{test:?}");
    }
    // perftest 4.5: "Events feature not available on WRITE verb"; its receiver polls memory.
    let e = err(TestKind::WriteLat, "-e");
    assert!(e.contains("Events feature not available on WRITE latency test"), "{e}");
    let text = Params::try_parse_from(TestKind::SendBw, ["rdp_send_bw", "--help"]).unwrap_err().render().to_string();
    assert!(text.contains("-e, --events") && text.contains("Sleep on CQ events"), "{text}");
}

#[test]
fn help_names_the_tool() {
    let e = Params::try_parse_from(TestKind::ReadLat, ["rdp_read_lat", "--help"]).unwrap_err();
    assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
    let text = e.render().to_string();
    assert!(text.contains("rdp_read_lat"), "{text}");
    assert!(text.contains("--report_gbits") && text.contains("--data_validation"), "{text}");
}

/// In a child process (re-running this test binary): parse the arguments in RDP_PARAMS_CHILD and print them.
#[test]
fn child_parse_from_or_exit() {
    let Ok(args) = std::env::var("RDP_PARAMS_CHILD") else { return };
    let p = Params::parse_from_or_exit(TestKind::WriteBw, args.split_whitespace());
    println!("parsed iters={:?}", p.run);
}

fn run_child(args: &str) -> std::process::Output {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_parse_from_or_exit", "--nocapture", "--test-threads=1"])
        .env("RDP_PARAMS_CHILD", args)
        .output()
        .unwrap()
}

#[test]
fn a_bad_command_line_exits_2_with_one_line() {
    let out = run_child("rdp_write_bw --bogus");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(lines, ["rdp_write_bw: unexpected argument '--bogus' found (see --help)"], "{err}");
    let out = run_child("rdp_write_bw -n 20");
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("parsed iters=Iterations(20)"));
    // --help prints the usage and succeeds.
    let out = run_child("rdp_write_bw --help");
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage: rdp_write_bw"));
}

// ============================================================================ session 11: perftest's parser and banner
// What perftest_parameters.c/.h do with these flags (the parser, `force_dependecies`, `ctx_print_test_info`); each
// test failed on the code before session 11.

/// perftest reads `-s` with a K or M suffix (x1024, x1024^2) through `strtol(.., 0)` (so 0x is hex), and takes
/// 1 to UINT_MAX/2 = 2^31-1. Before: `-s 64K`, `-s 1M`, `-s 0x1000` were refused ("invalid digit"), and 2^31 was
/// accepted.
#[test]
fn size_takes_perftests_suffixes_and_range() {
    for (arg, size) in [
        ("1", 1u64),
        ("64K", 65536),
        ("1M", 1 << 20),
        ("8M", 1 << 23),
        ("0x1000", 4096),
        ("2147483647", (1 << 31) - 1),
        ("2097151K", 2_097_151 * 1024),
    ] {
        assert_eq!(ok(TestKind::WriteBw, &format!("-s {arg}")).sizes, vec![size], "-s {arg}");
    }
    for arg in ["0", "2147483648", "2048M", "2097152K", "0K", "18446744073709551615M"] {
        let e = err(TestKind::WriteBw, &format!("-s {arg}"));
        assert!(e.contains("should be between 1 and 2147483647"), "-s {arg}: {e}");
    }
    for arg in ["64KB", "1G", "abc", "+-1", "0xZZ", "K"] {
        let e = err(TestKind::ReadBw, &format!("-s {arg}"));
        assert!(e.contains("is not a message size"), "-s {arg}: {e}");
    }
}

/// perftest signals every WR of messages above 8 KiB unless `-Q` is given, `-a` runs or `-e` sleeps on events
/// (`MSG_SIZE_CQ_MOD_LIMIT`), and its banner says so: `ib_write_bw` at its default 64 KiB shows "CQ Moderation
/// : 1". Before: 100, so the default BW run signalled one WR in 100 where perftest signals each.
#[test]
fn cq_moderation_is_one_above_8_kib_as_perftest() {
    for (test, args, want) in [
        (TestKind::WriteBw, "", 1),
        (TestKind::ReadBw, "", 1),
        (TestKind::SendBw, "", 1),
        (TestKind::AtomicBw, "", 100),
        (TestKind::WriteBw, "-s 8192", 100),
        (TestKind::WriteBw, "-s 8193", 1),
        (TestKind::WriteBw, "-s 64K -Q 50", 50),
        (TestKind::WriteBw, "-a", 100),
        (TestKind::SendBw, "-e", 100),
        (TestKind::WriteBw, "-s 4096 -n 20", 20),
    ] {
        let p = ok(test, args);
        assert_eq!(p.cq_mod, want, "{test:?} {args}");
        let banner = Banner::new(&p, "rdp0", Mtu::Mtu1024, 1, 1).lines();
        assert!(banner.contains(&format!(" CQ Moderation   : {want}")), "{test:?} {args}: {banner:?}");
    }
}

/// perftest rounds an odd receive depth of a send test up to even (a work-around it applies to every run that
/// is not `-a` or `--run_infinitely`); its banner shows the rounded depth.
#[test]
fn odd_receive_depths_of_send_tests_round_up_as_perftest() {
    for (test, args, want) in [
        (TestKind::SendBw, "-n 5", 6),
        (TestKind::SendBw, "-r 7", 8),
        (TestKind::SendBw, "-r 8", 8),
        (TestKind::SendLat, "-n 5", 6),
        (TestKind::SendBw, "-a -n 5", 5),
        (TestKind::SendBw, "--run_infinitely -r 7", 7),
    ] {
        assert_eq!(ok(test, args).rx_depth, want, "{test:?} {args}");
    }
}

/// With `-b` perftest's title says "Bidirectional", and both sides show their TX depth (both send) and, in send
/// tests, their RX depth (both receive). Before: the plain title, and each side only its one-way line.
#[test]
fn bidirectional_banners_as_perftest() {
    let lines = |test: TestKind, args: &str| Banner::new(&ok(test, args), "rdp0", Mtu::Mtu1024, 1, 1).lines();
    let server = lines(TestKind::WriteBw, "-b");
    assert_eq!(server[1], "                    RDMA_Write Bidirectional BW Test");
    assert!(server.contains(&" TX depth        : 128".to_string()), "{server:?}");
    let client = lines(TestKind::SendBw, "-b -n 1000 host");
    assert_eq!(client[1], "                    Send Bidirectional BW Test");
    let depths: Vec<&String> = client.iter().filter(|l| l.contains(" depth ")).collect();
    assert_eq!(depths, [" TX depth        : 128", " RX depth        : 512"], "{client:?}");
    let server = lines(TestKind::SendBw, "-b -n 1000");
    let depths: Vec<&String> = server.iter().filter(|l| l.contains(" depth ")).collect();
    assert_eq!(depths, [" TX depth        : 128", " RX depth        : 512"], "{server:?}");
    // One way, as the captured perftest 4.5 banners: the server of a write test shows no depth.
    let one_way = lines(TestKind::WriteBw, "");
    assert_eq!(one_way[1], "                    RDMA_Write BW Test");
    assert!(!one_way.iter().any(|l| l.contains(" depth ")), "{one_way:?}");
    let p = ok(TestKind::ReadBw, "-b");
    let j = json(&Banner::new(&p, "rdp0", Mtu::Mtu1024, 1, 1), &Results::Bw(vec![]), false);
    assert!(j.contains("\"test\": \"RDMA_Read Bidirectional BW Test\""), "{j}");
}

/// Every option of perftest's parser (4.5's getopt string and long options, and HEAD's) is either taken or refused
/// in one line naming it as perftest's and saying why; before, 60-odd of them (-C, -H, -U, -T, -W, -X,
/// --latency_gap, --retry_count, the raw Ethernet ones...) were a bare "unexpected argument", and -j/-k were named
/// --source_mac/--num_of_qps_in_srq, which they are not.
#[test]
fn every_perftest_option_is_taken_or_refused_by_name() {
    const OPTSTRING: &str = "w:y:p:d:i:m:s:n:t:u:S:x:c:q:I:o:M:r:Q:A:l:D:f:B:T:L:E:J:j:K:k:X:W:aFegzRvhbNVCHUOZP";
    const TAKEN_SHORT: &str = "pdimsntuxcqorQADfaFebNVh";
    const TAKEN_LONG: &[&str] = &[
        "port",
        "ib-dev",
        "ib-port",
        "mtu",
        "size",
        "iters",
        "tx-depth",
        "qp-timeout",
        "gid-index",
        "connection",
        "qp",
        "outs",
        "rx-depth",
        "cq-mod",
        "atomic_type",
        "duration",
        "margin",
        "all",
        "CPU-freq",
        "events",
        "bidirectional",
        "noPeak",
        "version",
        "help",
        "run_infinitely",
        "report_gbits",
        "out_json",
        "out_json_file",
    ];
    const PERFTEST_LONG: &[&str] = &[
        "sl",
        "inline_size",
        "MGID",
        "mcg",
        "post_list",
        "rdma_cm",
        "comm_rdma_cm",
        "dualport",
        "hop_limit",
        "tos",
        "report-cycles",
        "report-histogrm",
        "report-unsorted",
        "source_mac",
        "dest_mac",
        "dest_ip",
        "source_ip",
        "dest_port",
        "source_port",
        "ethertype",
        "limit_bw",
        "limit_msgrate",
        "server",
        "client",
        "mac_fwd",
        "use_rss",
        "report-counters",
        "vector",
        "force-link",
        "remote_mac",
        "local_mac",
        "remote_ip",
        "local_ip",
        "remote_port",
        "local_port",
        "use-srq",
        "use-null-mr",
        "report-both",
        "reversed",
        "pkey_index",
        "inline_recv",
        "tcp",
        "burst_size",
        "typical_pkt_size",
        "rate_limit",
        "rate_limit_type",
        "rate_units",
        "output",
        "cpu_util",
        "latency_gap",
        "flow_label",
        "retry_count",
        "dont_xchg_versions",
        "payload_file_path",
        "use_cuda",
        "use_cuda_bus_id",
        "use_cuda_dmabuf",
        "use_rocm",
        "use_neuron",
        "use_neuron_dmabuf",
        "use_hl",
        "use_mlu",
        "mmap",
        "mmap-offset",
        "ipv6",
        "ipv6-addr",
        "raw_ipv6",
        "report-per-port",
        "odp",
        "use_hugepages",
        "use_old_post_send",
        "promiscuous",
        "sniffer",
        "raw_mcast",
        "mr_per_qp",
        "dlid",
        "tclass",
        "wait_destroy",
        "flows",
        "flows_burst",
        "reply_every",
        "perform_warm_up",
        "vlan_en",
        "vlan_pcp",
        "recv_post_list",
        "use_ooo",
        "disable_pcie_relaxed",
        "congest_type",
        "bind_source_ip",
        "write_with_imm",
        "no_ddp",
        "unsolicited_write",
        "connectionless",
        "no_lock",
        "disable_fcs",
        "aes_xts",
        "encrypt_on_tx",
        "sig_before",
        "aes_block_size",
        "kek_path",
        "credentials_path",
        "data_enc_keys_number",
        "data_enc_key_app_path",
        "log_dci_streams",
        "log_active_dci_streams",
        "use_exp",
        "verb_type",
        "use_res_domain",
    ];
    let refused = |flag: String, arg: String| {
        for test in [TestKind::SendLat, TestKind::WriteBw] {
            let e = err(test, &arg);
            let want = format!("{}: perftest's ", test.tool_name());
            assert!(e.starts_with(&want) && e.contains(" is not supported by roce-dp: "), "{arg}: {e}");
            let named = e[want.len()..].split(' ').next().unwrap();
            assert!(named.split('/').any(|n| n == flag), "{arg}: names {named}: {e}");
        }
    };
    for c in OPTSTRING.chars().filter(|c| c.is_ascii_alphabetic() && !TAKEN_SHORT.contains(*c)) {
        refused(format!("-{c}"), format!("-{c} 1"));
    }
    for name in PERFTEST_LONG {
        assert!(!TAKEN_LONG.contains(name));
        refused(format!("--{name}"), format!("--{name}=1"));
    }
}

/// `-o` takes what a QP can hold: 1 to 128 (the engine's and rxe's maximum), default 16.
#[test]
fn outstanding_reads_range() {
    assert_eq!(ok(TestKind::ReadBw, "-o 128").out_reads, Some(128));
    assert_eq!(ok(TestKind::ReadBw, "").out_reads, None);
    let e = err(TestKind::ReadBw, "-o 129");
    assert!(e.contains("1..=128"), "{e}");
    err(TestKind::AtomicLat, "-o 0");
}

/// `-p 0` made the server listen on a port the kernel picked, which no client could know: it waited out its
/// timeout. Refused in one line; 1 and 65535 are ports.
#[test]
fn port_zero_is_refused() {
    let e = err(TestKind::WriteBw, "-p 0");
    assert!(e.contains("-p") || e.contains("--port"), "{e}");
    assert!(e.contains("1..=65535"), "{e}");
    assert_eq!(ok(TestKind::WriteBw, "-p 1").port, 1);
    assert_eq!(ok(TestKind::WriteBw, "-p 65535").port, 65535);
}
