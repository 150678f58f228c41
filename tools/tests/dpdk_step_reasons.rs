//! The reason a DPDK tool quotes after a failed setup step (`...; DPDK: REASON`) is what DPDK logged during that
//! step: session 16 found `roce-dpd` quoting the first failure-worded line of the whole captured log, so a harmless
//! line from EAL's start stood for a later step's failure. Runs `roce-dpd` up to its port's configure step, which
//! fails before any worker polls (EAL without hugepages; `net_af_packet` on the loopback interface, which has one
//! tx queue, for two workers); and `rdp-porttest` up to a failed probe or MTU. Needs root (a packet socket), as every
//! DPDK tier does.

#![cfg(feature = "dpdk")]

use std::process::Command;

#[test]
fn a_failed_configure_quotes_what_dpdk_said_during_configure() {
    let conf = std::env::temp_dir().join(format!("rdp-step-reason-{}.toml", std::process::id()));
    // lib.eal at debug level logs "EAL: lib.rcu log level changed from disabled to error" (and "open shared lib
    // .../librte_net_failsafe...") while EAL starts: failure words, but nothing failed.
    std::fs::write(
        &conf,
        format!(
            "[port]\ndriver = \"af_packet\"\niface = \"lo\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n[eal]\n\
             no_huge_mb = 256\nextra = [\"--log-level=lib.eal:debug\"]\n[worker]\nworkers = 2\nidle = \"sleep\"\n\
             [daemon]\nsocket = \"/tmp/rdp-step-reason-{}.sock\"\nworker_lcores = \"0,1\"\n",
            std::process::id()
        ),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_roce-dpd")).arg("--config").arg(&conf).output().unwrap();
    let _ = std::fs::remove_file(&conf);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    // ethdev's own line for the refused queue count, which has no failure word: the one line configure logged.
    assert_eq!(
        err,
        "roce-dpd: configure net_af_packet0 (net_af_packet): rte_eth_dev_configure failed: Invalid argument; DPDK: \
         Ethdev port_id=0 nb_tx_queues=2 > 1\n"
    );
}

/// `rdp-porttest` with lib.eal at debug level (harmless failure-worded lines while EAL starts) and a setup step
/// that fails after EAL: its error, then `; DPDK: ` and what DPDK logged during that step only, or nothing after
/// the error when DPDK logged nothing then. Session 17: rdp-porttest still quoted the first failure-worded line of
/// the whole captured log, here `EAL: lib.rcu log level changed from disabled to error` for both.
#[test]
fn rdp_porttest_quotes_only_what_dpdk_said_during_the_failed_step() {
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_rdp-porttest"))
            .args(args)
            .args(["--frames", "1", "--eal=--log-level=lib.eal:debug"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(2), "stderr: {err}");
        err
    };
    // The probe of an interface that does not exist: net_af_packet's own line.
    assert_eq!(
        run(&["af-packet", "--iface", "rdpnosuch0"]),
        "rdp-porttest: rte_vdev_init failed: No such device \
         (net_af_packet0,iface=rdpnosuch0,framesz=8192,blocksz=8192,framecnt=512,qpairs=1); DPDK: \
         rte_pmd_init_internals(): net_af_packet0: ioctl failed (SIOCGIFINDEX):No such device\n"
    );
    // net_ring has no MTU to set, and DPDK logs nothing about it.
    assert_eq!(
        run(&["ring", "--mtu", "9000"]),
        "rdp-porttest: rte_eth_dev_set_mtu failed: Operation not supported (ring a: 1 rx/tx queue pair(s), mtu 9000)\n"
    );
}

/// A port whose probe failed while EAL started (a memif socket another server holds): the lookup by name fails, and
/// the reason is what DPDK logged about that device's probe, not the first failure-worded line since EAL's start.
/// Session 17: `roce-dpd`, `rdp-nic` and the perftest tools quoted `EAL: lib.rcu log level changed from disabled to
/// error` (lib.eal at debug level) for it. The holder is `rdp-porttest memif --role server`, which only waits
/// (not polling) for a client.
#[test]
fn a_port_whose_probe_failed_quotes_that_probes_reason() {
    let id = std::process::id();
    let sock = std::env::temp_dir().join(format!("rdp-step-probe-{id}.sock"));
    let _ = std::fs::remove_file(&sock);
    let mut holder = Command::new(env!("CARGO_BIN_EXE_rdp-porttest"))
        .args(["memif", "--role", "server", "--link-timeout", "30", "--socket"])
        .arg(&sock)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    // memif's socket is in the abstract namespace (DPDK 22.11's default): /proc/net/unix lists it as `@PATH`.
    let listening = || {
        let want = format!("@{}", sock.display());
        std::fs::read_to_string("/proc/net/unix").unwrap().lines().any(|l| l.ends_with(&want))
    };
    while !listening() {
        assert!(t0.elapsed() < std::time::Duration::from_secs(20), "the holder never listened on {sock:?}");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let conf = std::env::temp_dir().join(format!("rdp-step-probe-{id}.toml"));
    std::fs::write(
        &conf,
        format!(
            "[port]\ndriver = \"memif\"\nrole = \"server\"\nsocket = \"{}\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n\
             [eal]\nlcores = \"0\"\nno_huge_mb = 256\nextra = [\"--log-level=lib.eal:debug\"]\n[worker]\nidle = \"sleep\"\n\
             [daemon]\nsocket = \"/tmp/rdp-step-probe-{id}-d.sock\"\n",
            sock.display()
        ),
    )
    .unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_roce-dpd")).arg("--config").arg(&conf).output().unwrap();
    // SAFETY: kill with the pid of a child this test started and has not reaped.
    unsafe { libc::kill(holder.id() as i32, libc::SIGTERM) };
    holder.wait().unwrap();
    let _ = std::fs::remove_file(&conf);
    let _ = std::fs::remove_file(&sock);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "stderr: {err}");
    assert_eq!(
        err,
        format!(
            "roce-dpd: port net_memif0: rte_eth_dev_get_port_by_name failed: No such device; DPDK: \
             memif_socket_create(): Failed to setup socket {}: Address already in use\n",
            sock.display()
        )
    );
}

/// Session 18: roce-dpd made its mempool before its net_ring port, so a pool that took the EAL's memory up to the
/// last few hundred KiB left none for the port's ethdev data, and DPDK aborted the process (rte_panic "Cannot
/// allocate ethdev shared data" in rte_eth_dev_allocate: a stack dump, status 134) instead of one line. Here pools
/// from 600 mbufs under the largest the profile's validation lets through (256 MiB / the least bytes an mbuf takes)
/// up to it, in steps of 50: each daemon serves (and is stopped) or fails with one line; none is killed by a
/// signal. Old code (MTU 4096): 58600 and 58650 aborted.
#[test]
fn a_mempool_that_takes_the_eals_last_memory_is_one_line_not_an_abort() {
    use std::io::Read;
    let id = std::process::id();
    let profile = |n: u64| {
        format!(
            "[port]\ndriver = \"net_ring\"\n[net]\nmac = \"02:00:00:00:00:01\"\nipv4 = \"10.0.0.1\"\nmtu = 4096\n[eal]\n\
             lcores = \"0\"\nno_huge_mb = 256\n[worker]\nidle = \"sleep\"\n[mempool]\nmbufs = {n}\n[daemon]\n\
             socket = \"/tmp/rdp-step-pool-{id}.sock\"\n"
        )
    };
    let room = roce_dp::config::Profile::parse("t.toml", &profile(4096)).unwrap().pool_data_room();
    let most = (256u64 << 20) / roce_dp::config::mbuf_pool_bytes(room.into());
    let conf = std::env::temp_dir().join(format!("rdp-step-pool-{id}.toml"));
    let log = std::env::temp_dir().join(format!("rdp-step-pool-{id}.log"));
    for n in (most - 600..=most).step_by(50) {
        std::fs::write(&conf, profile(n)).unwrap();
        let out = std::fs::File::create(&log).unwrap();
        let mut d = Command::new(env!("CARGO_BIN_EXE_roce-dpd"))
            .arg("--config")
            .arg(&conf)
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        let t0 = std::time::Instant::now();
        let status = loop {
            if let Some(s) = d.try_wait().unwrap() {
                break s;
            }
            let said = std::fs::read_to_string(&log).unwrap_or_default();
            if said.contains("roce-dpd: serving") || t0.elapsed() > std::time::Duration::from_secs(30) {
                // SAFETY: kill with the pid of a child this test started and has not reaped.
                unsafe { libc::kill(d.id() as i32, libc::SIGTERM) };
                break d.wait().unwrap();
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        };
        let mut said = String::new();
        std::fs::File::open(&log).unwrap().read_to_string(&mut said).unwrap();
        assert!(status.code().is_some(), "mbufs {n}: roce-dpd was killed ({status}): {said}");
        if !said.contains("roce-dpd: serving") {
            assert_eq!(status.code(), Some(2), "mbufs {n}: {said}");
            assert!(said.starts_with("roce-dpd: ") && said.lines().count() == 1, "mbufs {n}: {said}");
        }
    }
    let _ = std::fs::remove_file(&conf);
    let _ = std::fs::remove_file(&log);
}
