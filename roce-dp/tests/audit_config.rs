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
    HostView { sys, net_dev }
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
    // A reversed range names no lcore: nothing here to judge (EAL refuses it with its own message).
    assert_eq!(check("1-0"), Ok(()));
}
