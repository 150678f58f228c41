//! Session-10 audit: the daemon's descriptors against RLIMIT_NOFILE. Every CQ and QP region is a memfd, every
//! memory region keeps the client's memfd open, every completion channel is a socket and every session a socket:
//! under a low limit (`ulimit -n`), the request that finds the table full must get one clear Exhausted line naming
//! the limit, never a crash of the daemon or a broken other session. The daemon is a loopback daemon in a child
//! process (this binary, spawned again) that lowers its own RLIMIT_NOFILE to 128 once started.
#![cfg(target_os = "linux")]

mod own_main;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use roce_dp::client::{Device, Error, QpInit};
use roce_dp::ctrl::loopback::{wait_cqe, LoopPair, LoopbackConfig, LoopbackDaemon};
use roce_dp::ctrl::proto::ErrorCode;
use roce_dp::{AccessFlags, SendWr, WcStatus, WrOpcode};

const ROLE: &str = "ROCE_FDS_ROLE";
const SOCK: &str = "ROCE_FDS_SOCK";
const LIMIT: u64 = 128;

fn child_daemon() {
    let path = PathBuf::from(std::env::var_os(SOCK).unwrap());
    let d = LoopbackDaemon::start(LoopbackConfig::new(path)).expect("child daemon starts");
    let lim = libc::rlimit { rlim_cur: LIMIT, rlim_max: LIMIT };
    // SAFETY: plain system call with a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    println!("ready {}", std::process::id());
    let mut b = [0u8; 64];
    while std::io::stdin().read(&mut b).is_ok_and(|n| n > 0) {}
    drop(d);
}

struct Daemon {
    child: Child,
    path: PathBuf,
}

impl Daemon {
    fn start(tag: &str) -> Daemon {
        let path = std::env::temp_dir().join(format!("roce-dp-audit-fds-{}-{tag}.sock", std::process::id()));
        let mut child = Command::new(std::env::current_exe().unwrap())
            .env(ROLE, "daemon")
            .env(SOCK, &path)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn the daemon");
        let mut l = String::new();
        BufReader::new(child.stdout.take().unwrap()).read_line(&mut l).unwrap();
        assert!(l.starts_with("ready"), "{l:?}");
        Daemon { child, path }
    }
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.path);
    }
}

fn transfer(p: &mut LoopPair, k: u64) {
    let wr = SendWr::new(k, WrOpcode::RdmaWrite).remote(p.mr.addr() + 4096, p.mr.rkey());
    p.a.post_send(&wr, &[p.mr.sge(0, 4096)]).unwrap();
    let c = wait_cqe(&mut p.cq, Duration::from_secs(10)).unwrap().expect("a completion");
    assert_eq!(c.status, WcStatus::Success);
}

/// The daemon's Exhausted line for a full descriptor table, naming the limit.
#[track_caller]
fn out_of_fds<T>(r: Result<T, Error>, what: &str) {
    match r.map(|_| "Ok") {
        Err(Error::Refused { code: ErrorCode::Exhausted, msg })
            if msg.contains(&format!("roce-dpd is out of file descriptors (RLIMIT_NOFILE {LIMIT})"))
                && !msg.contains('\n') => {}
        r => panic!("{what}: expected the daemon's out-of-descriptors line, got {r:?}"),
    }
}

/// With RLIMIT_NOFILE at 128, one session takes CQs (a memfd each), memory regions (the client's memfd, kept
/// open by the daemon) and completion channels until the daemon's table is full. From then on each such request
/// of that session gets one Exhausted line naming the limit (verbs' ENOMEM past a device limit), a new session's
/// open gets the same line at once, and the daemon and the other session carry on; when the hog goes, its
/// descriptors are free again. Before: the memory registration that found the table full closed the asking
/// session (its memfd was lost in recvmsg and the daemon took that for a protocol violation: "the daemon closed
/// the connection"), a new session waited in the listen backlog until its 10 s call timeout, and a QP region's
/// failure was reported as Invalid.
fn a_full_descriptor_table_is_one_exhausted_line_for_the_session_that_asked() {
    let mut d = Daemon::start("full");
    let mut a = LoopPair::open(&d.path, 1 << 16, 16, 1024).expect("session A");
    transfer(&mut a, 1);
    let b = Device::open(&d.path).expect("session B");
    let pd = b.alloc_pd().unwrap();
    let (mut cqs, mut mrs, mut chans) = (Vec::new(), Vec::new(), Vec::new());
    // Fill the table; then every kind of request in turn until three in a row are refused.
    let mut refused_in_a_row = 0;
    let mut refusals = 0;
    for i in 0..1000 {
        let r = match i % 3 {
            0 => b.create_cq(8).map(|c| cqs.push(c)),
            1 => pd.reg_mr(4096, AccessFlags::ALL).map(|m| mrs.push(m)),
            _ => b.create_comp_channel().map(|c| chans.push(c)),
        };
        match r {
            Ok(()) => refused_in_a_row = 0,
            Err(e) => {
                out_of_fds::<()>(Err(e), &format!("request {i}"));
                refused_in_a_row += 1;
                refusals += 1;
                if refused_in_a_row == 3 {
                    break;
                }
            }
        }
    }
    assert_eq!(refused_in_a_row, 3, "the table never filled ({} CQs, {} MRs)", cqs.len(), mrs.len());
    assert!(cqs.len() + mrs.len() + chans.len() > 20, "{refusals} refusals");
    // A QP needs a region (a memfd) too.
    out_of_fds(b.create_qp(&pd, &cqs[0], &cqs[0], QpInit::default()), "CreateQp");
    // B's session is still there and answers what needs no descriptor.
    assert!(b.stats().is_ok());
    // A new session is told at once, not left to time out.
    let t = Instant::now();
    out_of_fds(Device::open(&d.path), "a new session");
    assert!(t.elapsed() < Duration::from_secs(5), "the refusal took {:?}", t.elapsed());
    // The other session and the daemon carry on.
    transfer(&mut a, 2);
    assert!(a.dev.stats().is_ok());
    assert!(d.alive(), "the daemon died");
    // The hog goes: its descriptors are free again.
    drop((cqs, mrs, chans, pd, b));
    let until = Instant::now() + Duration::from_secs(5);
    let c = loop {
        match Device::open(&d.path) {
            Ok(c) => break c,
            Err(_) if Instant::now() < until => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("no new session after the hog left: {e}"),
        }
    };
    let _cq = c.create_cq(8).expect("a CQ after the hog left");
    transfer(&mut a, 3);
    assert!(d.alive());
}

fn main() {
    if std::env::var(ROLE).as_deref() == Ok("daemon") {
        return child_daemon();
    }
    own_main::run_tests(&[(
        "a_full_descriptor_table_is_one_exhausted_line_for_the_session_that_asked",
        a_full_descriptor_table_is_one_exhausted_line_for_the_session_that_asked,
    )]);
}
