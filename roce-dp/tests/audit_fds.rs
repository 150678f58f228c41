//! Session-10 audit: the daemon's descriptors against RLIMIT_NOFILE. Every CQ and QP region is a memfd, every
//! memory region keeps the client's memfd open, every completion channel is a socket and every session a socket:
//! under a low limit (`ulimit -n`), the request that finds the table full must get one clear Exhausted line naming
//! the limit, never a crash of the daemon or a broken other session. The daemon is a loopback daemon in a child
//! process (this binary, spawned again) that lowers its own RLIMIT_NOFILE to 128 once started. The client's side
//! too: a client process whose own table is full gets one line saying so, and the daemon's object is destroyed.
#![cfg(target_os = "linux")]

mod own_main;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use roce_dp::client::{CompChannel, Cq, Device, Error, Mr, Pd, QpInit};
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

/// What a session holds of the daemon's descriptors: CQs (a memfd each), memory regions (the client's memfd) and
/// completion channels (a socket).
type Hog = (Vec<Cq>, Vec<Mr>, Vec<CompChannel>);

/// Session `b` fills the daemon's descriptor table: every kind of request in turn until three in a row are refused
/// (each with the out-of-descriptors line).
fn fill_the_table(b: &Device, pd: &Pd) -> Hog {
    let (mut cqs, mut mrs, mut chans) = (Vec::new(), Vec::new(), Vec::new());
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
    (cqs, mrs, chans)
}

/// CPU time (user + system) thread `name` of process `pid` has used so far.
fn thread_cpu(pid: u32, name: &str) -> Duration {
    // SAFETY: plain sysconf query.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap().max(1);
    for t in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap().flatten() {
        if std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim_end() == name) {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap();
            // After the ")" closing the name: state is field 3, utime and stime are fields 14 and 15.
            let rest = &stat[stat.rfind(')').unwrap() + 2..];
            let f: Vec<u64> = rest.split(' ').skip(11).take(2).map(|v| v.parse().unwrap()).collect();
            return Duration::from_millis((f[0] + f[1]) * 1000 / hz);
        }
    }
    panic!("process {pid} has no thread {name}")
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
    let (cqs, mrs, chans) = fill_the_table(&b, &pd);
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

/// Session 18 (a flake of the test above under load: "a new session: ... did not answer Hello within 10.0 s"). The
/// accept thread took accept(2)'s EMFILE for a connection waiting, but the kernel reserves the new descriptor before
/// it looks at the queue: with the table full and nobody connecting, the thread spun at full speed giving up its
/// spare descriptor and opening it again, and each time any other thread of the daemon (a session making a CQ)
/// could take the slot in between. Then the spare could not be opened again, and no new session was answered while
/// the table stayed full: it waited in the listen backlog until its call timeout. Now the thread waits for a
/// connection (poll) before it gives up the spare. Here, with the table full: the accept thread uses next to no CPU
/// while nobody connects, 300 more requests that need a descriptor are all refused (none gets the spare's slot),
/// and new sessions are still told at once. Old code: the accept thread used about a core, and requests took the
/// spare's slot, leaving new sessions unanswered.
fn a_full_table_keeps_the_spare_descriptor_for_new_sessions() {
    let mut d = Daemon::start("spare");
    let b = Device::open(&d.path).expect("session B");
    let pd = b.alloc_pd().unwrap();
    let hog = fill_the_table(&b, &pd);
    let pid = d.child.id();
    let (t0, cpu0) = (Instant::now(), thread_cpu(pid, "roce-dpd-accept"));
    std::thread::sleep(Duration::from_millis(1000));
    let (wall, cpu) = (t0.elapsed(), thread_cpu(pid, "roce-dpd-accept") - cpu0);
    assert!(cpu < wall / 10, "the accept thread used {cpu:?} of CPU in {wall:?} with nobody connecting");
    for i in 0..300 {
        let r = match i % 3 {
            0 => b.create_cq(8).map(drop),
            1 => pd.reg_mr(4096, AccessFlags::ALL).map(drop),
            _ => b.create_comp_channel().map(drop),
        };
        out_of_fds(r, &format!("request {i} with the table full"));
    }
    for i in 0..3 {
        let t = Instant::now();
        out_of_fds(Device::open(&d.path), &format!("new session {i}"));
        assert!(t.elapsed() < Duration::from_secs(5), "the refusal took {:?}", t.elapsed());
    }
    assert!(d.alive(), "the daemon died");
    drop((hog, pd, b));
}

/// The client's side (in a child: it lowers its own limit): with its descriptor table full, a CQ, QP or channel
/// whose descriptor the answer carried cannot be received; the call fails with one line saying this process is out
/// of descriptors (EMFILE), not "answer without its region" (a protocol error for a resource shortage), the object
/// the daemon made for it is destroyed again, and with one descriptor free the same call works.
fn child_client() {
    use std::os::fd::{AsRawFd, OwnedFd};
    let path = PathBuf::from(std::env::var_os(SOCK).unwrap());
    let dev = Device::open(&path).expect("the client's session");
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(8).unwrap();
    let lim = libc::rlimit { rlim_cur: LIMIT, rlim_max: LIMIT };
    // SAFETY: plain system call with a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) }, 0);
    // Fill the table with copies of stdin.
    let mut fill: Vec<OwnedFd> = Vec::new();
    loop {
        // SAFETY: dup of an open descriptor; the result is owned here.
        let fd = unsafe { libc::dup(std::io::stdin().as_raw_fd()) };
        if fd < 0 {
            break;
        }
        // SAFETY: fd is a new descriptor nobody else owns.
        fill.push(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) });
    }
    let daemon_cqs = |dev: &Device| {
        let s = dev.stats().unwrap();
        s.iter().find(|r| r.scope == "daemon" && r.name == "cqs").map_or(0, |r| r.value)
    };
    let before = daemon_cqs(&dev);
    let expect_emfile = |r: Result<(), Error>, what: &str| match r {
        Err(e @ Error::Shm(roce_dp::ctrl::shm::ShmError::Os { errno: libc::EMFILE, .. })) => {
            let msg = e.to_string();
            assert!(msg.contains("this process is out of file descriptors") && !msg.contains('\n'), "{what}: {msg}");
        }
        r => panic!("{what}: expected this process's out-of-descriptors error, got {r:?}"),
    };
    expect_emfile(dev.create_cq(8).map(drop), "CreateCq");
    expect_emfile(dev.create_qp(&pd, &cq, &cq, QpInit::default()).map(drop), "CreateQp");
    expect_emfile(dev.create_comp_channel().map(drop), "CreateCompChannel");
    assert_eq!(daemon_cqs(&dev), before, "the CQ made for the failed call was not destroyed");
    fill.pop();
    let _cq = dev.create_cq(8).expect("a CQ with one descriptor free");
    assert_eq!(daemon_cqs(&dev), before + 1);
    println!("client ok");
}

fn this_process_out_of_descriptors_is_one_clear_line_and_leaks_nothing() {
    let path = std::env::temp_dir().join(format!("roce-dp-audit-fds-{}-client.sock", std::process::id()));
    let d = LoopbackDaemon::start(LoopbackConfig::new(&path)).expect("daemon");
    let out = Command::new(std::env::current_exe().unwrap())
        .env(ROLE, "client")
        .env(SOCK, &path)
        .stdin(Stdio::null())
        .output()
        .expect("spawn the client");
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && text.contains("client ok"), "{text}");
    drop(d);
}

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("daemon") => return child_daemon(),
        Ok("client") => return child_client(),
        _ => {}
    }
    own_main::run_tests(&[
        (
            "a_full_descriptor_table_is_one_exhausted_line_for_the_session_that_asked",
            a_full_descriptor_table_is_one_exhausted_line_for_the_session_that_asked,
        ),
        (
            "a_full_table_keeps_the_spare_descriptor_for_new_sessions",
            a_full_table_keeps_the_spare_descriptor_for_new_sessions,
        ),
        (
            "this_process_out_of_descriptors_is_one_clear_line_and_leaks_nothing",
            this_process_out_of_descriptors_is_one_clear_line_and_leaks_nothing,
        ),
    ]);
}
