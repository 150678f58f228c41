//! A client that punches a hole in its hugetlbfs memory region while the huge-page pool is empty must not kill the
//! daemon. The seals on a shared memfd fix its size, not its pages: `madvise(MADV_REMOVE)` on the client's own
//! mapping (or `fallocate(FALLOC_FL_PUNCH_HOLE)`) frees a huge page and its reservation, and with no free page in
//! the pool the daemon's next access to it was SIGBUS: the daemon and every session with it died (the README's
//! threat model listed it as open until session 11). Now the daemon's SIGBUS guard (`ctrl::sigbus`) puts zeros
//! there, closes that one session with a one-line reason, and the others carry on.
//!
//! The test sizes the kernel's huge-page pool (root; it gives back what it took, also when it fails), so it is the
//! only test in this binary: cargo runs test binaries one at a time. Outside CI, as a user who is not root, it
//! says that it cannot run and passes; under CI (`CI` set) it fails instead.

#![cfg(target_os = "linux")]

use std::time::{Duration, Instant};

use roce_dp::client::Error;
use roce_dp::ctrl::loopback::{wait_cqe, LoopPair, LoopbackConfig, LoopbackDaemon};
use roce_dp::ctrl::shm::{Backing, HUGEPAGE_SIZE};
use roce_dp::{SendWr, WcStatus, WrOpcode};

const POOL: &str = "/sys/kernel/mm/hugepages/hugepages-2048kB";

fn read(file: &str) -> u64 {
    let s = std::fs::read_to_string(format!("{POOL}/{file}")).unwrap_or_else(|e| panic!("{POOL}/{file}: {e}"));
    s.trim().parse().unwrap_or_else(|e| panic!("{POOL}/{file}: {s:?}: {e}"))
}

fn set_pages(n: u64) {
    std::fs::write(format!("{POOL}/nr_hugepages"), n.to_string()).unwrap_or_else(|e| panic!("nr_hugepages {n}: {e}"));
}

/// Pages neither in use nor reserved.
fn available() -> u64 {
    read("free_hugepages").saturating_sub(read("resv_hugepages"))
}

/// Gives the pool back its size at the start, however the test ends.
struct Restore(u64);

impl Drop for Restore {
    fn drop(&mut self) {
        set_pages(self.0);
    }
}

fn sock(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("roce-dp-sigbus-{}-{tag}.sock", std::process::id()))
}

const NAME: &str = "a_hole_punched_in_a_hugetlbfs_region_with_an_empty_pool_closes_only_that_session";

/// The daemon and its clients run in a child process (this binary again, for this test alone), so that the daemon
/// dying of SIGBUS is a test failure like any other and the pool is given back whatever happened.
#[test]
fn a_hole_punched_in_a_hugetlbfs_region_with_an_empty_pool_closes_only_that_session() {
    if std::env::var_os("ROCE_DP_SIGBUS_CHILD").is_some() {
        scenario();
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(
            std::env::var_os("CI").is_none(),
            "this test sizes the huge-page pool and must run as root under CI (scripts/test.sh runs it so)"
        );
        eprintln!("audit_sigbus: NOT RUN: needs root to size the huge-page pool (scripts/test.sh runs it as root)");
        return;
    }
    let before = read("nr_hugepages");
    let restore = Restore(before);
    // Each session: a CQ region, two QP regions and a 2 MiB memory region, one huge page each; room to spare.
    set_pages(before + 12);
    assert!(available() >= 8, "the pool did not grow to 8 free pages: {} available", available());
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", NAME, "--nocapture"])
        .env("ROCE_DP_SIGBUS_CHILD", "1")
        .output()
        .expect("run the scenario");
    drop(restore);
    assert_eq!(read("nr_hugepages"), before, "the pool is back to its size");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the process holding the daemon: {:?}\n{said}", out.status);
}

/// Two sessions on a daemon with hugetlbfs backing; one punches a hole in its region and empties the pool.
fn scenario() {
    let cfg = LoopbackConfig { backing: Backing::Hugetlb, ..LoopbackConfig::new(sock("d")) };
    let d = LoopbackDaemon::start(cfg).expect("daemon starts");
    let mut hostile = LoopPair::open(d.path(), HUGEPAGE_SIZE, 16, 1024).expect("hostile session");
    let mut bystander = LoopPair::open(d.path(), HUGEPAGE_SIZE, 16, 1024).expect("bystander session");
    assert!(hostile.dev.info().hugetlb, "the daemon told the client to use huge pages");
    // The hostile client's buffer holds data (its page is in), then the client drops the page and its reservation.
    hostile.mr.as_mut_slice()[..4096].fill(0x5a);
    let buf = hostile.mr.as_mut_slice();
    // SAFETY: the client's own shared mapping of its buffer; nothing reads it afterwards.
    let rc = unsafe { libc::madvise(buf.as_mut_ptr().cast(), buf.len(), libc::MADV_REMOVE) };
    assert_eq!(rc, 0, "madvise(MADV_REMOVE): {}", std::io::Error::last_os_error());
    // No page left to fill the hole: the pool shrinks to what is in use or reserved.
    set_pages(read("nr_hugepages") - available());
    assert_eq!(available(), 0, "the pool still has a free page");

    // The daemon's worker reads the hole (the WRITE's source) and writes into it (its target).
    let wr = SendWr::new(1, WrOpcode::RdmaWrite).remote(hostile.mr.addr() + 8192, hostile.mr.rkey());
    hostile.a.post_send(&wr, &[hostile.mr.sge(0, 4096)]).expect("post");
    // The session is closed with the reason (the daemon process, this test, is alive to see it).
    let until = Instant::now() + Duration::from_secs(3);
    let why = loop {
        match hostile.dev.check_alive() {
            Err(Error::DaemonGone { reason, .. }) => break reason,
            Err(e) => panic!("the hostile session ended otherwise: {e}"),
            Ok(()) => {}
        }
        let _ = hostile.cq.poll(&mut [roce_dp::Cqe::EMPTY; 4]);
        assert!(Instant::now() < until, "the hostile session was not closed within 3 s");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(why.contains("closed this session") && why.contains("vanished"), "{why}");
    assert!(!why.contains('\n'), "one line: {why}");
    let msg = Error::DaemonGone { path: d.path().into(), reason: why }.to_string();
    assert!(msg.contains("hole was punched") && msg.contains("huge-page pool"), "{msg}");

    // Its resources are reclaimed; the other session carries on, every byte verified.
    let until = Instant::now() + Duration::from_secs(1);
    while d.sessions() != 1 {
        assert!(Instant::now() < until, "the hostile session was not reclaimed within 1 s ({} open)", d.sessions());
        std::thread::sleep(Duration::from_millis(5));
    }
    for (i, b) in bystander.mr.as_mut_slice()[..4096].iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let wr = SendWr::new(7, WrOpcode::RdmaWrite).remote(bystander.mr.addr() + 65536, bystander.mr.rkey());
    bystander.a.post_send(&wr, &[bystander.mr.sge(0, 4096)]).expect("bystander post");
    let c = wait_cqe(&mut bystander.cq, Duration::from_secs(3)).expect("bystander poll").expect("bystander completion");
    assert_eq!((c.wr_id, c.status), (7, WcStatus::Success));
    let m = bystander.mr.as_mut_slice();
    assert!(m[65536..65536 + 4096].iter().enumerate().all(|(i, &b)| b == (i % 251) as u8), "bystander's bytes");
    let stats = bystander.dev.stats().expect("stats");
    let replaced = stats.iter().find(|r| r.scope == "daemon" && r.name == "shm_pages_replaced").expect("counter");
    assert!(replaced.value >= 1, "shm_pages_replaced {}", replaced.value);
    drop(hostile);
    drop(bystander);
    drop(d);
}
