//! Session 12's audit of the client library as an application uses it (README "The appliance: roce-dpd and the
//! client library"): API misuse (objects dropped in an order verbs refuses, addresses past a region, posts on QPs
//! in RESET, INIT and ERR, a region deregistered under outstanding WRs, zero and huge sizes) must give the
//! application a clear error or completion, never a panic, a hang, a silent loss or a leak in the daemon.
//!
//! The daemon is `ctrl::loopback` in this process.

#![cfg(target_os = "linux")]

use std::path::PathBuf;
use std::time::Duration;

use roce_dp::client::{Device, QpInit};
use roce_dp::ctrl::loopback::{wait_cqe, LoopPair, LoopbackConfig, LoopbackDaemon};
use roce_dp::{AccessFlags, SendWr, WcStatus, WrOpcode};

fn sock(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("roce-dp-audit-client-{}-{tag}.sock", std::process::id()))
}

fn daemon(tag: &str) -> LoopbackDaemon {
    LoopbackDaemon::start(LoopbackConfig::new(sock(tag))).expect("loopback daemon")
}

/// A daemon-scope counter.
fn daemon_stat(dev: &Device, name: &str) -> u64 {
    let recs = dev.stats().expect("statistics");
    recs.iter().find(|r| r.scope == "daemon" && r.name == name).map_or(0, |r| r.value)
}

/// `ibv_dealloc_pd`, `ibv_destroy_cq` and `ibv_destroy_comp_channel` fail with EBUSY while something uses the
/// object; the library destroys on drop, which cannot return that. A PD, CQ or channel dropped before its users
/// must go when its last user does: before, the daemon's refusal was ignored and the object stayed until the
/// session ended, each such drop order leaking one against the session's limits (256 PDs by default), so an
/// application that made and dropped its objects in a loop ran out ("Exhausted") with nothing alive.
#[test]
fn objects_dropped_before_their_users_go_with_their_last_user() {
    let d = daemon("order");
    let dev = Device::open(d.path()).unwrap();
    let keep = dev.alloc_pd().unwrap();
    for round in 0..3 {
        let ch = dev.create_comp_channel().unwrap();
        let pd = dev.alloc_pd().unwrap();
        let mr = pd.reg_mr(4096, AccessFlags::ALL).unwrap();
        let cq = dev.create_cq_with_channel(16, &ch).unwrap();
        let qp = dev.create_qp(&pd, &cq, &cq, QpInit::default()).unwrap();
        // Every object before its users.
        drop(ch);
        drop(pd);
        drop(cq);
        assert_eq!((daemon_stat(&dev, "pds"), daemon_stat(&dev, "cqs")), (2, 1), "round {round}: still in use");
        drop(mr);
        assert_eq!(daemon_stat(&dev, "mrs"), 0, "round {round}");
        assert_eq!(daemon_stat(&dev, "pds"), 2, "round {round}: the QP still uses the PD");
        drop(qp);
        for name in ["qps", "cqs", "mrs"] {
            assert_eq!(daemon_stat(&dev, name), 0, "round {round}: {name} left after the last user went");
        }
        assert_eq!(daemon_stat(&dev, "pds"), 1, "round {round}: only the PD still held");
    }
    // The channels went too: a new one and a CQ on it work, and the session's count of them is back to one.
    let ch = dev.create_comp_channel().unwrap();
    let cq = dev.create_cq_with_channel(16, &ch).unwrap();
    drop((cq, ch, keep));
    for name in ["pds", "cqs", "qps", "mrs"] {
        assert_eq!(daemon_stat(&dev, name), 0, "{name}");
    }
}

/// `Mr::sge` with an offset past the region (a computed offset gone wrong) is an SGE the daemon refuses with a
/// completion error, not a panic of the application (an overflowing add: a panic in a debug build).
#[test]
fn an_sge_offset_past_the_region_is_refused_by_the_daemon_not_a_panic() {
    let d = daemon("sgeoff");
    let mut p = LoopPair::open(d.path(), 4096, 8, 1024).unwrap();
    for offset in [usize::MAX, usize::MAX - 4095, 1 << 63] {
        let sge = std::panic::catch_unwind(|| p.mr.sge(offset, 8)).expect("Mr::sge panicked");
        let wr = SendWr::new(offset as u64, WrOpcode::RdmaWrite).remote(p.mr.addr(), p.mr.rkey());
        p.a.post_send(&wr, &[sge]).expect("posted: the daemon checks the address");
        let c = wait_cqe(&mut p.cq, Duration::from_secs(5)).unwrap().expect("a completion");
        assert_eq!((c.wr_id, c.status), (offset as u64, WcStatus::LocProtErr), "{c:?}");
        // The QP went to ERR: a fresh pair for the next offset.
        p = LoopPair::open(d.path(), 4096, 8, 1024).unwrap();
    }
}
