//! Session 9's audit of port-profile validation edge cases beyond `hostile_config.rs`'s mutations: lcore lists
//! whose ranges are huge or reversed, checked against the machine (`Profile::check_host`) before DPDK starts.
//! The rule (README, Configuration): one line `FILE: key: problem`, and the check must cost no more than the list
//! it reads: an lcore range of four billion is one offline lcore, not a four-billion-entry list in memory.

use roce_dp::config::{HostView, Profile};

/// A fake /sys with CPUs 0-1 online.
fn host(tag: &str) -> HostView {
    let root = std::env::temp_dir().join(format!("roce-dp-audit-config-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let sys = root.join("sys");
    std::fs::create_dir_all(sys.join("devices/system/cpu")).unwrap();
    std::fs::write(sys.join("devices/system/cpu/online"), "0-1\n").unwrap();
    let net_dev = root.join("net_dev");
    std::fs::write(&net_dev, "Inter-|   Receive\n face |bytes\n    lo: 0 0\n").unwrap();
    HostView { sys, net_dev, path: std::env::var_os("PATH").unwrap_or_default() }
}

fn profile(lcores: &str) -> Profile {
    let text = format!(
        "[port]\ndriver = \"memif\"\nrole = \"server\"\nsocket = \"/run/x.sock\"\n[net]\nipv4 = \"10.0.0.1\"\n\
         mtu = 1024\n[eal]\nlcores = \"{lcores}\"\n"
    );
    Profile::parse("t.toml", &text).unwrap_or_else(|e| panic!("{lcores}: {}", e.0))
}

#[test]
fn huge_and_reversed_lcore_ranges_are_checked_without_expanding_them() {
    let h = host("ranges");
    let check = |l: &str| profile(l).check_host("t.toml", None, &h).map_err(|e| e.0);
    assert_eq!(check("0-1"), Ok(()));
    for (list, bad) in [("0-4294967295", 2), ("1,2-4000000000", 2), ("4294967295", 4294967295u32), ("0-1,7-9", 7)] {
        assert_eq!(
            check(list),
            Err(format!("t.toml: eal.lcores: lcore {bad} is not an online CPU here (online: 0-1)")),
            "{list}"
        );
    }
    // The caller's -l list is checked the same way.
    let e = profile("0").check_host("t.toml", Some(("--lcores", "1-4294967295")), &h).unwrap_err().0;
    assert_eq!(e, "t.toml: --lcores: lcore 2 is not an online CPU here (online: 0-1)");
    // A reversed range: EAL refused it with "invalid core list syntax", naming no key; it is refused here now.
    assert_eq!(
        check("1-0"),
        Err("t.toml: eal.lcores: \"1-0\": the range 1-0 runs backwards (write it low-high)".into())
    );
}

// ------------------------------------------------------------------------------------------------ session 11
//
// Session 11's audit of the DPDK data-path layer's profile keys: values that go into a DPDK devargs string
// (`--vdev=net_memif0,role=server,socket=VALUE,bsize=N`), af_packet's ring geometry against the kernel's
// PACKET_RX_RING rules and DPDK's mbuf sizing, and addresses a port cannot own. Expected behaviour from the
// outside: DPDK's kvargs split a devargs string at ',' into key=value pairs (so a value holding ',' adds keys of
// its own), the kernel wants af_packet frames to be multiples of 16 bytes (TPACKET_ALIGNMENT), blocks multiples of
// the page size, and the frame count a whole number of blocks, and DPDK copies each af_packet frame into one mbuf
// of framesz - 32 bytes, whose data room is 16 bits.

/// DPDK's kvargs view of a devargs string: `key=value` pairs split at ','.
fn kvargs(args: &str) -> Vec<(String, String)> {
    args.split(',')
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k.to_owned(), v.to_owned())
        })
        .collect()
}

/// `s` as a TOML basic string (every character that is not plain printable ASCII as `\uXXXX`).
fn toml_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            ' '..='~' => out.push(c),
            c => out.push_str(&format!("\\u{:04X}", c as u32)),
        }
    }
    out.push('"');
    out
}

fn memif(socket: &str) -> Result<Profile, String> {
    let text = format!(
        "[port]\ndriver = \"memif\"\nrole = \"server\"\nsocket = {}\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n",
        toml_str(socket)
    );
    Profile::parse("t.toml", &text).map_err(|e| e.0)
}

fn af_packet(iface: &str, ring: &str) -> Result<Profile, String> {
    let text = format!(
        "[port]\ndriver = \"af_packet\"\niface = {}\n{ring}\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 4096\n",
        toml_str(iface)
    );
    Profile::parse("t.toml", &text).map_err(|e| e.0)
}

#[test]
fn socket_and_iface_values_cannot_change_the_devargs_string() {
    // Each of these, taken as it was, turned the memif server into a client, asked for zero-copy, or changed bsize.
    for (bad, c) in [
        ("/run/x.sock,role=client", ','),
        ("/run/x.sock,zero-copy=yes", ','),
        ("/run/x.sock,bsize=64", ','),
        ("/run/a=b.sock", '='),
        ("/run/[x].sock", '['),
    ] {
        let e = memif(bad).unwrap_err();
        assert_eq!(
            e,
            format!(
                "t.toml: port.socket: {bad:?} contains {c:?}, which would change the DPDK devargs string it goes into"
            ),
        );
    }
    for bad in ["/run/x\0.sock", "/run/x y.sock", "/run/x\n.sock"] {
        let e = memif(bad).unwrap_err();
        assert!(e.starts_with("t.toml: port.socket: ") && e.contains("whitespace or a control character"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }
    // memif cuts a socket path past 106 bytes silently (its abstract address): refused instead.
    let long = format!("/run/{}", "s".repeat(102));
    assert_eq!(long.len(), 107);
    let e = memif(&long).unwrap_err();
    assert!(e.starts_with("t.toml: port.socket: ") && e.contains("107 bytes long"), "{e}");
    assert!(memif(&long[..106]).is_ok());
    // af_packet: the interface goes into `iface=VALUE,framesz=...`; a name with ',' re-sized the ring.
    let ring = "framesz = 8192\nblocksz = 8192";
    let e = af_packet("vp0,framesz=2048", ring).unwrap_err();
    assert!(e.starts_with("t.toml: port.iface: \"vp0,framesz=2048\" contains ','"), "{e}");
    for bad in ["averyveryverylongname", "a/b", "a:1", "..", "vp 0"] {
        let e = af_packet(bad, ring).unwrap_err();
        assert!(e.starts_with("t.toml: port.iface: ") && !e.contains('\n'), "{bad}: {e}");
    }
    // The property behind it: whatever socket path a profile is accepted with, its devargs string splits into
    // exactly role, socket and bsize, and socket is that path.
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    let alphabet: Vec<char> = "/._-az09,=[] \t;:@%".chars().collect();
    for _ in 0..3000 {
        let len = 1 + (rng % 24) as usize;
        let mut path = String::from("/");
        for _ in 0..len {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            path.push(alphabet[(rng % alphabet.len() as u64) as usize]);
        }
        let Ok(p) = memif(&path) else { continue };
        let (name, args) = p.vdev().unwrap();
        assert_eq!(name, "net_memif0");
        let kv = kvargs(&args);
        let keys: Vec<&str> = kv.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["role", "socket", "bsize"], "{path:?} -> {args}");
        assert_eq!(kv[1].1, path);
    }
}

#[test]
fn af_packet_ring_geometry_follows_the_kernel_and_the_mbuf() {
    let ring =
        |fs: u32, bs: u32, fc: u32| af_packet("vp0", &format!("framesz = {fs}\nblocksz = {bs}\nframecnt = {fc}"));
    // Every accepted geometry is one the kernel takes and whose frames fit one mbuf of a 16-bit data room.
    let sizes = [4280u32, 4288, 4304, 8192, 8200, 12288, 16384, 65424, 65440, 65536, 1 << 20];
    let mut accepted = 0;
    for &fs in &sizes {
        for bs in [fs, 2 * fs, 4096 * 3, 8192, 65536, 1 << 21, u32::MAX / fs * fs] {
            for fc in [0u32, 1, 2, 3, 512, 513, 4096, 1 << 20] {
                let Ok(p) = ring(fs, bs, fc) else { continue };
                accepted += 1;
                assert_eq!(fs % 16, 0, "{fs}/{bs}/{fc}: TPACKET_ALIGNMENT");
                assert_eq!(bs % 4096, 0, "{fs}/{bs}/{fc}: blocks are whole pages");
                assert!(bs % fs == 0 && bs <= i32::MAX as u32, "{fs}/{bs}/{fc}");
                let per_block = bs / fs;
                assert!(fc > 0 && fc % per_block == 0, "{fs}/{bs}/{fc}: a whole number of blocks");
                assert!(u64::from(fc) * u64::from(fs) <= 1 << 30, "{fs}/{bs}/{fc}: ring memory");
                // DPDK refuses an rx queue whose mbufs hold less than framesz - 32 bytes after the headroom.
                let room = u32::from(p.pool_data_room());
                assert!(room == p.data_room() && room >= fs - 32 + 128, "{fs}/{bs}/{fc}: data room {room}");
                let kv = kvargs(&p.vdev().unwrap().1);
                assert_eq!(kv[1], ("framesz".to_owned(), fs.to_string()));
            }
        }
    }
    assert!(accepted > 20, "{accepted}");
    // The refusals, each one line naming the key.
    for (fs, bs, fc, key, want) in [
        (4096, 8192, 512, "port.framesz", "4096 is too small for 4210-byte frames (MTU 4096)"),
        (4280, 8560, 512, "port.framesz", "4280 must be a multiple of 16 and at most 65424"),
        (65536, 65536, 512, "port.framesz", "65536 must be a multiple of 16 and at most 65424"),
        (4288, 12864, 3, "port.blocksz", "12864 must be a multiple of the page size (4096)"),
        (8192, 12288, 512, "port.blocksz", "12288 must be a multiple of framesz (8192)"),
        (
            8192,
            16384,
            513,
            "port.framecnt",
            "513 must be a whole number of blocks: a non-zero multiple of blocksz / framesz (2)",
        ),
        (8192, 8192, 0, "port.framecnt", "0 must be a whole number of blocks"),
        (16384, 16384, 1 << 20, "port.framecnt", "1048576 frames of 16384 bytes take 17179869184 bytes per ring"),
    ] {
        let e = ring(fs, bs, fc).unwrap_err();
        assert!(e.starts_with(&format!("t.toml: {key}: {want}")) && !e.contains('\n'), "{fs}/{bs}/{fc}: {e}");
    }
    // The shipped af_packet profiles still load.
    let conf = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf");
    for f in ["af-packet.toml", "rxe-peer.toml"] {
        Profile::load(&conf.join(f)).unwrap_or_else(|e| panic!("{}", e.0));
    }
}

#[test]
fn addresses_a_port_cannot_own_and_starving_pools_are_refused() {
    let base = |net: &str, extra: &str| {
        Profile::parse("t.toml", &format!("[port]\ndriver = \"net_ring\"\n[net]\nmtu = 1024\n{net}\n{extra}"))
            .map_err(|e| e.0)
    };
    assert!(base("ipv4 = \"10.0.0.1\"\nmac = \"02:00:00:00:00:01\"", "").is_ok());
    for (net, key) in [
        ("ipv4 = \"10.0.0.1\"\nmac = \"ff:ff:ff:ff:ff:ff\"", "net.mac"),
        ("ipv4 = \"10.0.0.1\"\nmac = \"01:00:5e:00:00:01\"", "net.mac"),
        ("ipv4 = \"10.0.0.1\"\nmac = \"00:00:00:00:00:00\"", "net.mac"),
        ("ipv4 = \"0.0.0.0\"", "net.ipv4"),
        ("ipv4 = \"255.255.255.255\"", "net.ipv4"),
        ("ipv4 = \"224.0.0.1\"", "net.ipv4"),
        ("ipv6 = \"::\"", "net.ipv6"),
        ("ipv6 = \"ff02::1\"", "net.ipv6"),
        (
            "ipv4 = \"10.0.0.1\"\nneighbours = [{ ip = \"10.0.0.2\", mac = \"ff:ff:ff:ff:ff:ff\" }]",
            "net.neighbours.mac",
        ),
    ] {
        let e = base(net, "").unwrap_err();
        assert!(e.starts_with(&format!("t.toml: {key}: ")) && !e.contains('\n'), "{net}: {e}");
    }
    let ip = "ipv4 = \"10.0.0.1\"";
    // A pool smaller than the descriptors that can hold its mbufs leaves the worker nothing to send with.
    let e = base(ip, "[mempool]\nmbufs = 100").unwrap_err();
    assert_eq!(
        e,
        "t.toml: mempool.mbufs: 100 is fewer than the rx and tx descriptors (1024 + 1024) plus two bursts (2112): \
         the port could hold every mbuf and the worker have none to send with"
    );
    assert!(base(ip, "[mempool]\nmbufs = 2112").is_ok());
    // An idle worker asleep for an hour fires its QPs' timers an hour late.
    let e = base(ip, "[worker]\nidle = \"sleep\"\nsleep_us = 4000000000").unwrap_err();
    assert!(e.starts_with("t.toml: worker.sleep_us: 4000000000 is above 10000"), "{e}");
    let e = base(ip, "[eal]\nno_huge_mb = 0").unwrap_err();
    assert!(e.starts_with("t.toml: eal.no_huge_mb: 0"), "{e}");
    let e = base(ip, "[eal]\nextra = [\"--log-level=x\\u0000y\"]").unwrap_err();
    assert!(e.starts_with("t.toml: eal.extra: ") && e.contains("control character"), "{e}");
}

/// A key the port's driver does not use is refused with one line naming it and the driver, not ignored: `iface` on
/// a memif port, `pci`/`devargs` on a vdev, are a profile written for another port (or for another driver).
/// Session 11: `iface`, `pci` and `devargs` were ignored without a word on drivers that do not use them.
#[test]
fn keys_of_another_driver_are_refused_not_ignored() {
    let port = |driver: &str, keys: &str| {
        Profile::parse(
            "t.toml",
            &format!("[port]\ndriver = \"{driver}\"\n{keys}\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n"),
        )
        .map_err(|e| e.0)
    };
    let own = [
        ("memif", "role = \"server\"\nsocket = \"/run/x.sock\""),
        ("af_packet", "iface = \"vp0\""),
        ("af_xdp", "iface = \"vx0\""),
        ("net_ring", ""),
        ("mlx5", "pci = \"0000:3b:00.0\"\ndevargs = \"txq_inline_max=128\""),
        ("ice", "pci = \"0000:5e:00.0\""),
    ];
    for (driver, keys) in own {
        assert!(port(driver, keys).is_ok(), "{driver} with its own keys: {:?}", port(driver, keys));
    }
    let foreign = [
        ("iface = \"vp0\"", "port.iface", &["memif", "net_ring", "mlx5", "ice"][..]),
        ("pci = \"0000:3b:00.0\"", "port.pci", &["memif", "af_packet", "af_xdp", "net_ring"][..]),
        ("devargs = \"txq_inline_max=128\"", "port.devargs", &["memif", "af_packet", "af_xdp", "net_ring"][..]),
        ("socket = \"/run/x.sock\"", "port.role", &["af_packet", "af_xdp", "net_ring", "mlx5", "ice"][..]),
        ("framesz = 2048", "port.framesz", &["memif", "af_xdp", "net_ring", "mlx5", "ice"][..]),
    ];
    for (key, named, drivers) in foreign {
        for &driver in drivers {
            let mine = own.iter().find(|o| o.0 == driver).expect("driver").1;
            // The driver's own keys, minus one the foreign key would repeat.
            let mine: String =
                mine.lines().filter(|l| l.split(' ').next() != key.split(' ').next()).collect::<Vec<_>>().join("\n");
            let e = port(driver, &format!("{mine}\n{key}")).expect_err(&format!("{key} on {driver}"));
            assert!(e.starts_with(&format!("t.toml: {named}: ")), "{key} on {driver}: {e}");
            assert!(
                e.contains(&format!("driver {driver} does not use")) && !e.contains('\n'),
                "{key} on {driver}: {e}"
            );
        }
    }
}

/// A profile path that never ends (`/dev/zero`) or is too long to be a profile is one line, read no further than
/// 1 MiB; it was read until memory ran out (session 11, left open by the congestion-control audit).
#[test]
fn a_profile_that_never_ends_is_refused_after_a_mebibyte() {
    let e = Profile::load(std::path::Path::new("/dev/zero")).unwrap_err().0;
    assert_eq!(e, "/dev/zero: longer than 1024 KiB: not a port profile");
    let big = std::env::temp_dir().join(format!("roce-dp-big-{}.toml", std::process::id()));
    let mut text = String::from("[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n");
    std::fs::write(&big, &text).unwrap();
    let ok = Profile::load(&big);
    assert!(ok.is_ok(), "{ok:?}");
    while text.len() <= 1 << 20 {
        text.push_str("# padding padding padding padding padding padding padding padding padding padding\n");
    }
    std::fs::write(&big, &text).unwrap();
    let e = Profile::load(&big).unwrap_err().0;
    assert!(e.ends_with("longer than 1024 KiB: not a port profile"), "{e}");
    let _ = std::fs::remove_file(&big);
}

/// memif zero-copy (session 12): `zero_copy = true` only ever works on the client, and DPDK's memif probe refuses it
/// unless EAL runs with `--single-file-segments`. The profile key used to add `zero-copy=yes` alone: the probe
/// failed and the tools said `rte_eth_dev_get_port_by_name failed: No such device`, naming neither cause. Now the
/// EAL argument follows the key (once, even if `eal.extra` already has it), and a server is refused by name.
#[cfg(feature = "dpdk")]
#[test]
fn memif_zero_copy_brings_its_eal_argument_and_is_client_only() {
    let text = |role: &str, extra: &str| {
        format!(
            "[port]\ndriver = \"memif\"\nrole = \"{role}\"\nsocket = \"/run/x.sock\"\nzero_copy = true\n[net]\n\
             ipv4 = \"10.0.0.2\"\nmtu = 4096\n[eal]\n{extra}\n"
        )
    };
    let sfs = |p: &Profile| {
        let args = p.eal_args("t", None, "pfx").to_vec();
        assert!(args.iter().any(|a| a.starts_with("--vdev=net_memif0,") && a.ends_with(",zero-copy=yes")), "{args:?}");
        args.iter().filter(|a| *a == "--single-file-segments").count()
    };
    let client = Profile::parse("t.toml", &text("client", "")).unwrap_or_else(|e| panic!("{}", e.0));
    assert_eq!(sfs(&client), 1);
    let given = Profile::parse("t.toml", &text("client", "extra = [\"--single-file-segments\"]")).unwrap();
    assert_eq!(sfs(&given), 1);
    // Copy mode adds nothing.
    let copy = memif("/run/x.sock").unwrap();
    assert!(!copy.eal_args("t", None, "pfx").to_vec().iter().any(|a| a == "--single-file-segments"));
    let err = Profile::parse("t.toml", &text("server", "")).map(|_| ()).unwrap_err().0;
    assert!(err.starts_with("t.toml: port.zero_copy: memif zero-copy is a client-side mode"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

/// Session 18: `mempool.mbufs = 4294967295` and `eal.no_huge_mb = 99999999` passed validation and failed inside DPDK
/// (`rte_pktmbuf_pool_create failed: Cannot allocate memory`; `rte_eal_init failed ... Cannot allocate memseg
/// list`), naming no key. Now each is one line naming the key and the limit: a pool holds at most 2^30 - 1 mbufs
/// (its ring), must fit the EAL's memory (no_huge_mb, default 512 MiB; an mbuf of 2176 B data room takes at least
/// 2368 B in the pool), and no_huge_mb is at most this machine's memory (and DPDK's 2^31 - 1 pages of 4 KiB).
#[test]
fn pools_and_eal_memory_past_what_dpdk_or_the_machine_has_are_refused_naming_the_key() {
    let p = |extra: &str| {
        Profile::parse(
            "t.toml",
            &format!("[port]\ndriver = \"net_ring\"\n[net]\nipv4 = \"10.0.0.1\"\nmtu = 1024\n{extra}"),
        )
        .map_err(|e| e.0)
    };
    let e = p("[mempool]\nmbufs = 4294967295").unwrap_err();
    assert_eq!(
        e,
        "t.toml: mempool.mbufs: 4294967295 is more than a DPDK mempool holds (1073741823: its ring has a power-of-two \
         number of slots, at most 2^30)"
    );
    // MTU 1024: the data room is 2048 + 128 B, 2368 B in the pool; 512 MiB holds 226719 of them.
    let e = p("[mempool]\nmbufs = 226720").unwrap_err();
    assert_eq!(
        e,
        "t.toml: mempool.mbufs: 226720 mbufs of 2176 B data room take at least 513 MiB (2368 B each in the pool), \
         more than the EAL's memory (eal.no_huge_mb = 512 MiB, the default): lower mempool.mbufs or raise \
         eal.no_huge_mb"
    );
    assert!(p("[mempool]\nmbufs = 226719").is_ok());
    let e = p("[mempool]\nmbufs = 200000\n[eal]\nno_huge_mb = 256").unwrap_err();
    assert!(e.starts_with("t.toml: mempool.mbufs: 200000 mbufs of 2176 B") && e.contains("= 256 MiB)"), "{e}");
    assert!(p("[mempool]\nmbufs = 200000\n[eal]\nno_huge_mb = 1024").is_ok());
    let e = p("[eal]\nno_huge_mb = 99999999").unwrap_err();
    assert_eq!(
        e,
        "t.toml: eal.no_huge_mb: 99999999 MiB is more than DPDK takes without hugepages (8388607 MiB: one 4 KiB memseg \
         per page, at most 2^31 - 1 of them)"
    );
    // This machine's memory, read here from /proc/meminfo.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .unwrap()
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap();
    let total = kb / 1024;
    let e = p(&format!("[eal]\nno_huge_mb = {}", total + 1)).unwrap_err();
    assert_eq!(
        e,
        format!(
            "t.toml: eal.no_huge_mb: {} MiB is more than this machine's memory ({total} MiB, MemTotal in \
             /proc/meminfo)",
            total + 1
        )
    );
    assert!(p(&format!("[eal]\nno_huge_mb = {}", total.min(8192))).is_ok());
    // With hugepages the pool comes from the machine's memory.
    let e = p("[mempool]\nmbufs = 1000000000\n[eal]\nhugepages = true").unwrap_err();
    assert!(e.contains("more than this machine's memory") && e.ends_with("lower mempool.mbufs"), "{e}");
}
