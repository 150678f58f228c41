//! Rings across two processes sharing a sealed memfd: an honest peer (order and content of a million entries each
//! way), a client process that gets its QP and CQ regions over a Unix socket and posts and completes work requests,
//! a client killed with SIGKILL mid-stream, and a hostile one (random bytes over a QP's rings and side tables,
//! random indices, attempts to resize the region) while this process reads the queues as the daemon would, with
//! PROT_NONE guard pages around the region so that any access outside it would crash the test.
//!
//! `harness = false`: the binary is its own child. `ROCE_SHM_ROLE` selects a child role; without it, `main` runs
//! the tests and spawns itself (`std::env::current_exe()`) for the peer, passing the memfd by inheritance.
//!
//! Run: `cargo test -p roce-dp --no-default-features --test shm_ring`.

mod own_main;

use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::process::{Command, ExitStatus};
use std::sync::Arc;

use roce_dp::ctrl::abi::{self, region_kind, RegionHeader, RingDesc, Sge, TableDesc, Wqe, WqeLimits};
use roce_dp::ctrl::ring::{heap_ring, heap_table, RingError};
use roce_dp::ctrl::shm::{
    inherit_fd, open_memfds, recv_with_fds, send_with_fds, Backing, ClientCqRegion, ClientQpRegion, DaemonCqRegion,
    DaemonQpRegion, QpRegionCaps, ShmRegion,
};
use roce_dp::ctrl::wq::{SendQueueReader, SendQueueWriter, WqError};
use roce_dp::sim::SimRng;
use roce_dp::{Cqe, SendWr, WcOpcode, WcStatus, WrOpcode};

const ROLE: &str = "ROCE_SHM_ROLE";
const FD: &str = "ROCE_SHM_FD";
const SEED: &str = "ROCE_SHM_SEED";
const PAGE: usize = 4096;

/// Entries each way in the two-process test.
const N: u64 = 1_000_000;
const CAP: u32 = 1024;

/// The two rings of the echo test: parent -> child at `TO_CHILD`, child -> parent at `TO_PARENT`.
const TO_CHILD: RingDesc = RingDesc { offset: 0, capacity: CAP, entry_size: 8 };
const TO_PARENT: RingDesc = RingDesc { offset: 16384, capacity: CAP, entry_size: 8 };

/// A child process that is killed (and reaped) if the test panics before waiting for it, so no peer is left
/// spinning on the shared cores.
struct ChildGuard(std::process::Child);

impl std::ops::Deref for ChildGuard {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn spawn(role: &str, region: &ShmRegion, seed: u64) -> ChildGuard {
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    let fd = region.share_with_child(&mut cmd);
    cmd.env(ROLE, role).env(FD, fd.to_string()).env(SEED, seed.to_string());
    ChildGuard(cmd.spawn().expect("spawn child"))
}

fn env_u64(name: &str) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("{name} not set"))
}

fn transform(v: u64) -> u64 {
    v.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0xa5a5
}

/// Child role "echo": pops each value the parent sends and pushes `transform(value)` back.
fn child_echo() {
    let region = Arc::new(ShmRegion::open_inherited(env_u64(FD) as i32).expect("map inherited region"));
    // SAFETY: this process is the only consumer of TO_CHILD and the only producer of TO_PARENT.
    let (mut rx, mut tx) =
        unsafe { (region.consumer::<u64>(TO_CHILD).unwrap(), region.producer::<u64>(TO_PARENT).unwrap()) };
    let mut pending: Option<u64> = None;
    let mut done = 0u64;
    while done < N {
        if pending.is_none() {
            pending = rx.pop().unwrap();
        }
        if let Some(v) = pending {
            match tx.push(transform(v)) {
                Ok(()) => {
                    pending = None;
                    done += 1;
                    if done.is_multiple_of(64) || rx.len_cached() == 0 {
                        tx.publish();
                        rx.release();
                    }
                }
                Err(RingError::Full) => {
                    tx.publish();
                    rx.release();
                    std::thread::yield_now();
                }
                Err(e) => panic!("child: {e}"),
            }
        } else {
            tx.publish();
            rx.release();
            std::thread::yield_now();
        }
    }
    tx.publish();
}

fn two_processes_a_million_each_way_in_order() {
    let region = Arc::new(ShmRegion::create("roce-dp-echo", 32768, Backing::Pages).unwrap());
    let mut child = spawn("echo", &region, 0);
    // SAFETY: the child is the only other party; this process is the only producer of TO_CHILD and the only
    // consumer of TO_PARENT.
    let (mut tx, mut rx) =
        unsafe { (region.producer::<u64>(TO_CHILD).unwrap(), region.consumer::<u64>(TO_PARENT).unwrap()) };
    let (mut sent, mut got) = (0u64, 0u64);
    while got < N {
        let mut progress = false;
        while sent < N && tx.push(sent).is_ok() {
            sent += 1;
            progress = true;
        }
        tx.publish();
        while let Some(v) = rx.pop().unwrap() {
            assert_eq!(v, transform(got), "entry {got} from the child");
            got += 1;
            progress = true;
        }
        rx.release();
        if !progress {
            std::thread::yield_now();
        }
    }
    assert_eq!(rx.sync(), Ok(0), "nothing beyond the N entries");
    assert!(child.wait().unwrap().success(), "echo child failed");
}

/// The QP region of the hostile test sits between two PROT_NONE guard pages of this process's mapping.
const QP_AT: usize = PAGE;

fn at(d: RingDesc) -> RingDesc {
    RingDesc { offset: d.offset + QP_AT as u64, ..d }
}

fn tat(d: TableDesc) -> TableDesc {
    TableDesc { offset: d.offset + QP_AT as u64, ..d }
}

fn qp_header() -> RegionHeader {
    RegionHeader::qp(64, 64, 4, 4, 256).unwrap()
}

/// The CQ of the hostile test follows the QP region (inside the same guard pages).
fn cq_header() -> RegionHeader {
    RegionHeader::cq(64).unwrap()
}

fn cq_ring() -> RingDesc {
    let h = cq_header();
    RingDesc { offset: h.sq.offset + (QP_AT as u64 + qp_header().region_len), ..h.sq }
}

/// Child role "hostile": scribbles over everything it can see of the QP region for a bounded number of rounds.
fn child_hostile() {
    let mut region = ShmRegion::open_inherited(env_u64(FD) as i32).expect("map inherited region");
    let mut rng = SimRng::new(env_u64(SEED));
    // The region must not be resizable by us (the daemon would get SIGBUS past a shrunk end).
    // SAFETY: plain syscall on the region's descriptor.
    let r = unsafe { libc::ftruncate(region.fd().as_raw_fd(), 0) };
    assert_eq!(r, -1, "hostile child could shrink the region");
    let h: RegionHeader = region.read(QP_AT).expect("header");
    h.check(region_kind::QP, region.len() - QP_AT).expect("the daemon's header is valid");
    let start = QP_AT;
    let end = QP_AT + h.region_len as usize + cq_header().region_len as usize;
    let cq = cq_ring();
    let (cq_head_at, cq_tail_at) = (cq.offset as usize, cq.offset as usize + 128);
    let sq = at(h.sq);
    let (head_at, tail_at, slots_at) = (sq.offset as usize, sq.offset as usize + 128, sq.offset as usize + 256);
    // Phase 1: honest indices (the tail never runs more than `capacity` ahead of the daemon's head), hostile
    // contents: a mix of valid WQEs and WQEs with random fields, garbage in the side tables.
    let mut tail = 0u32;
    let mut posted = 0u32;
    while posted < 20_000 {
        // An honest CQ consumer meanwhile: everything the daemon completed is taken.
        let cq_tail: u32 = region.read(cq_tail_at).unwrap();
        region.write(cq_head_at, cq_tail).unwrap();
        let head: u32 = region.read(head_at).unwrap();
        if tail.wrapping_sub(head) >= sq.capacity {
            std::thread::yield_now();
            continue;
        }
        let slot = slots_at + (tail & (sq.capacity - 1)) as usize * 64;
        let sge = roce_dp::Sge { addr: rng.next_u64(), len: rng.below(1 << 20) as u32, lkey: rng.next_u64() as u32 };
        let mut wqe = Wqe::encode(&SendWr::new(u64::from(tail), WrOpcode::Send), &[sge], 0);
        match rng.below(4) {
            0 => wqe.opcode = rng.next_u64() as u8,
            1 => wqe.num_sge = rng.next_u64() as u8,
            2 => wqe.flags = rng.next_u64() as u8,
            _ => {}
        }
        region.write(slot, wqe).unwrap();
        let t = tat(h.sq_sges);
        let off = t.offset as usize + rng.below(u64::from(sq.capacity) * u64::from(t.per_slot)) as usize * 16;
        region.write(off, Sge { addr: rng.next_u64(), len: u32::MAX, lkey: rng.next_u64() as u32 }).unwrap();
        tail = tail.wrapping_add(1);
        region.write(tail_at, tail).unwrap();
        posted += 1;
    }
    // Phase 2: anything goes, the CQ ring (whose head is ours to write) included.
    for round in 0..200_000u32 {
        match rng.below(8) {
            // Random words anywhere in the QP and CQ regions (headers, indices, WQEs, tables, CQEs).
            0..=3 => {
                let off = start + (rng.below(((end - start) / 8) as u64) as usize) * 8;
                region.write(off, rng.next_u64()).unwrap();
            }
            // A random or near-plausible tail of the send queue.
            4 => {
                let v = if rng.below(2) == 0 { rng.next_u64() as u32 } else { tail.wrapping_add(round % 80) };
                region.write(tail_at, v).unwrap();
            }
            // A whole WQE of random bytes in a random slot.
            5 => {
                let slot = slots_at + rng.below(u64::from(sq.capacity)) as usize * 64;
                for k in 0..8 {
                    region.write(slot + 8 * k, rng.next_u64()).unwrap();
                }
            }
            // Huge lengths / foreign keys in the side SGE table.
            6 => {
                let t = tat(h.sq_sges);
                let n = u64::from(sq.capacity) * u64::from(t.per_slot);
                let off = t.offset as usize + rng.below(n) as usize * 16;
                region.write(off, Sge { addr: rng.next_u64(), len: u32::MAX, lkey: rng.next_u64() as u32 }).unwrap();
            }
            _ => std::thread::yield_now(),
        }
    }
}

fn hostile_process_gets_typed_errors_and_nothing_outside_is_touched() {
    let h = qp_header();
    let total = QP_AT + h.region_len as usize + cq_header().region_len as usize + PAGE;
    let mut region = ShmRegion::create("roce-dp-hostile", total, Backing::Pages).unwrap();
    region.write(QP_AT, h).unwrap();
    // Guard pages in this process's mapping: any read or write outside the QP and CQ regions kills the test.
    // SAFETY: both ranges are whole pages inside our mapping; nothing in this process uses them.
    unsafe {
        let base = region.as_ptr().as_ptr();
        assert_eq!(libc::mprotect(base.cast(), PAGE, libc::PROT_NONE), 0);
        assert_eq!(libc::mprotect(base.add(total - PAGE).cast(), PAGE, libc::PROT_NONE), 0);
    }
    let region = Arc::new(region);
    let limits = WqeLimits { max_sge: 4, max_inline: 256 };
    // SAFETY: the daemon side (this process) is the only consumer of the send queue; it never writes the tables.
    let mut hostile = unsafe {
        SendQueueReader::new(
            region.consumer::<Wqe>(at(h.sq)).unwrap(),
            Some(region.table::<Sge>(tat(h.sq_sges), h.sq.capacity).unwrap()),
            Some(region.table::<u8>(tat(h.sq_inline), h.sq.capacity).unwrap()),
            limits,
        )
        .unwrap()
    };
    // SAFETY: this process is the only producer of the CQ ring.
    let mut cq = unsafe { region.producer::<abi::Cqe>(cq_ring()).unwrap() };
    let (mut cq_pushed, mut cq_full, mut cq_corrupt) = (0u64, 0u64, false);
    let mut complete = |c: abi::Cqe| match cq.push_publish(c) {
        Ok(()) => cq_pushed += 1,
        Err(RingError::Full) => cq_full += 1,
        Err(RingError::Corrupt { .. }) => cq_corrupt = true,
    };
    // A bystander QP of another (honest) client, served by the same loop.
    let (p, c) = heap_ring::<Wqe>(64);
    let (sw, sr) = heap_table::<Sge>(64, 3);
    let (iw, ir) = heap_table::<u8>(64, 256);
    let mut honest_w = SendQueueWriter::new(p, Some(sw), Some(iw), limits).unwrap();
    let mut honest_r = SendQueueReader::new(c, Some(sr), Some(ir), limits).unwrap();

    let seed = std::env::var(SEED).ok().and_then(|s| s.parse().ok()).unwrap_or(0x0bad_c0de_u64);
    let mut child = spawn("hostile", &region, seed);
    let mut inline = [0u8; 256];
    let (mut accepted, mut refused, mut corrupt) = (0u64, 0u64, false);
    let (mut honest_posted, mut honest_seen) = (0u64, 0u64);
    let status: ExitStatus = loop {
        let exited = child.try_wait().unwrap();
        for _ in 0..64 {
            match hostile.poll(&mut inline) {
                Ok(None) => break,
                Ok(Some(req)) => {
                    assert!(!corrupt, "reader kept going after corrupt indices");
                    assert!(req.sges.as_slice().len() <= 4 && req.inline_len <= 256);
                    assert!(req.sges.total_len() <= 1 << 31);
                    accepted += 1;
                    let done = Cqe {
                        wr_id: req.wr.wr_id,
                        status: WcStatus::Success,
                        opcode: WcOpcode::Send,
                        qpn: 0x11,
                        byte_len: req.sges.total_len() as u32,
                        imm: None,
                        invalidated_rkey: None,
                        solicited: false,
                    };
                    complete(abi::Cqe::from(&done));
                }
                Err(WqError::Wqe { wr_id, error, .. }) => {
                    assert!(!corrupt);
                    assert!(!error.to_string().is_empty());
                    refused += 1;
                    complete(abi::Cqe::refused(wr_id, 0x11, WcOpcode::Send, &error));
                }
                Err(WqError::Ring(RingError::Corrupt { .. })) => {
                    corrupt = true;
                    break;
                }
                Err(e) => panic!("unexpected {e}"),
            }
        }
        let _ = hostile.sync();
        // The bystander's traffic is untouched: every WQE comes back exactly as posted, in order.
        let wr = SendWr::new(honest_posted, WrOpcode::Send);
        let sge = roce_dp::Sge { addr: honest_posted << 12, len: 64, lkey: 7 };
        if honest_w.post(&wr, &[sge]).is_ok() {
            honest_posted += 1;
        }
        while let Some(req) = honest_r.poll(&mut inline).unwrap() {
            assert_eq!(req.wr.wr_id, honest_seen);
            assert_eq!(req.sges.as_slice(), &[roce_dp::Sge { addr: honest_seen << 12, len: 64, lkey: 7 }]);
            honest_seen += 1;
        }
        honest_r.sync().unwrap();
        if let Some(s) = exited {
            break s;
        }
        std::thread::yield_now();
    };
    assert!(status.success(), "hostile child failed its own checks: {status}");
    // The daemon's CQ producer reads the client-written head on its next refresh.
    if let Err(RingError::Corrupt { .. }) = cq.sync() {
        cq_corrupt = true;
    }
    assert_eq!(honest_seen, honest_posted);
    assert!(honest_seen > 0);
    println!(
        "  hostile child: {accepted} WQEs passed validation, {refused} refused with a typed error, ring corrupt: \
         {corrupt}; CQ: {cq_pushed} CQEs delivered, {cq_full} found it full, corrupt head detected: {cq_corrupt}; \
         bystander QP: {honest_seen} WQEs intact"
    );
    assert!(cq_pushed > 1000, "phase 1 completions reach the CQ the child drains");
    assert!(cq_corrupt, "the CQ head scribbled in phase 2 was not detected");
    // Phase 1 of the child posts 20000 WQEs with honest indices, each only when the daemon's published head shows
    // room, so at most one ring's worth (64) can still be unread when phase 2 starts scribbling on the indices.
    let phase1_seen = 20_000 - u64::from(h.sq.capacity);
    assert!(accepted + refused >= phase1_seen, "the reader missed phase-1 WQEs: {accepted} + {refused}");
    assert!(accepted > 1000 && refused > 1000);
    assert!(corrupt, "phase 2's random tails were not detected");
}

/// Work requests the client of the daemon test posts (sends and receives alternating).
const M: u64 = 100_000;
/// Outstanding requests the client allows (below the CQ depth, so the CQ never overflows).
const WINDOW: u64 = 32;
const CLIENT_CAPS: QpRegionCaps =
    QpRegionCaps { sq_depth: 64, rq_depth: 64, max_send_sge: 4, max_recv_sge: 4, max_inline: 64 };

/// The bytes work request `i` carries (what its completion must report).
fn wr_len(i: u64) -> u32 {
    (i % 5) as u32 * 100 + (i % 3) as u32
}

/// The SGEs of work request `i`: 1 to 4 of them adding up to `wr_len(i)`.
fn wr_sgl(i: u64) -> Vec<roce_dp::Sge> {
    let n = 1 + (i % 4) as u32;
    let len = wr_len(i);
    (0..n)
        .map(|k| roce_dp::Sge {
            addr: i << 16 | u64::from(k) << 8,
            len: len / n + u32::from(k == 0) * (len % n),
            lkey: 9,
        })
        .collect()
}

/// Receives the socket (inherited) and the QP and CQ regions (over the socket).
fn client_connect() -> (UnixStream, ClientQpRegion, ClientCqRegion) {
    // SAFETY: FD names the socket the parent made inheritable for us; nothing else in this process owns it.
    let sock = UnixStream::from(unsafe { OwnedFd::from_raw_fd(env_u64(FD) as i32) });
    let mut fds = Vec::new();
    let (n, _) = recv_with_fds(&sock, &mut [0u8; 16], &mut fds).expect("regions from the daemon");
    assert!(n > 0 && fds.len() == 2, "expected a QP and a CQ region");
    let cq = fds.pop().unwrap();
    let qp = fds.pop().unwrap();
    // SAFETY: one client side per region in this process.
    unsafe { (sock, ClientQpRegion::open(qp).expect("open QP region"), ClientCqRegion::open(cq).expect("open CQ")) }
}

/// Child role "client": posts M work requests (even: send, odd: receive; every 7th send inline) keeping WINDOW
/// outstanding, and checks every completion.
fn child_client() {
    let (_sock, mut qp, mut cq) = client_connect();
    let (mut posted, mut completed) = (0u64, 0u64);
    let (mut next_send, mut next_recv) = (0u64, 1u64);
    let payload = [0x5au8; 64];
    let mut out = [abi::Cqe::default().decode().unwrap(); 16];
    while completed < M {
        while posted < M && posted - completed < WINDOW {
            let i = posted;
            if i % 2 == 1 {
                qp.rq.post(i, &wr_sgl(i)).unwrap();
            } else if i % 7 == 0 {
                qp.sq.post_inline(&SendWr::new(i, WrOpcode::Send), &payload[..(wr_len(i) as usize).min(64)]).unwrap();
            } else {
                qp.sq.post(&SendWr::new(i, WrOpcode::Send), &wr_sgl(i)).unwrap();
            }
            posted += 1;
        }
        let n = cq.cq.poll(&mut out).unwrap();
        for c in &out[..n] {
            assert_eq!(c.status, WcStatus::Success);
            let expect = if c.wr_id % 2 == 1 {
                assert_eq!((c.opcode, c.wr_id), (WcOpcode::Recv, next_recv), "receive completions in order");
                next_recv += 2;
                wr_len(c.wr_id)
            } else {
                assert_eq!((c.opcode, c.wr_id), (WcOpcode::Send, next_send), "send completions in order");
                next_send += 2;
                if c.wr_id % 7 == 0 {
                    wr_len(c.wr_id).min(64)
                } else {
                    wr_len(c.wr_id)
                }
            };
            assert_eq!(c.byte_len, expect, "byte_len of wr {}", c.wr_id);
        }
        completed += n as u64;
        if n == 0 {
            std::thread::yield_now();
        }
    }
}

fn spawn_client(role: &str) -> (UnixStream, ChildGuard, DaemonQpRegion, DaemonCqRegion) {
    let (daemon_sock, client_sock) = UnixStream::pair().unwrap();
    let qp = DaemonQpRegion::create("roce-dp-it-qp", CLIENT_CAPS, Backing::Pages).unwrap();
    let cq = DaemonCqRegion::create("roce-dp-it-cq", 64, Backing::Pages).unwrap();
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    let fd = inherit_fd(&mut cmd, client_sock.as_fd());
    let child = ChildGuard(cmd.env(ROLE, role).env(FD, fd.to_string()).spawn().unwrap());
    drop(client_sock);
    send_with_fds(&daemon_sock, b"qp+cq", &[qp.fd(), cq.fd()]).unwrap();
    (daemon_sock, child, qp, cq)
}

/// One pass of the daemon's worker over the QP: every valid send WQE completes with its length, every receive WQE
/// completes as if a message of its buffer's size arrived. Returns completions pushed.
fn serve(qp: &mut DaemonQpRegion, cq: &mut DaemonCqRegion) -> u64 {
    let mut inline = [0u8; 64];
    let mut n = 0;
    let mut complete = |wr_id: u64, opcode: WcOpcode, byte_len: u32| {
        let c = Cqe {
            wr_id,
            status: WcStatus::Success,
            opcode,
            qpn: 0x11,
            byte_len,
            imm: None,
            invalidated_rkey: None,
            solicited: false,
        };
        cq.cq.push(abi::Cqe::from(&c)).expect("the client keeps the CQ from overflowing");
        n += 1;
    };
    while let Some(req) = qp.sq.poll(&mut inline).unwrap() {
        let len = if req.wr.inline { req.inline_len } else { req.sges.total_len() as u32 };
        complete(req.wr.wr_id, WcOpcode::Send, len);
    }
    while let Some((wr_id, sges)) = qp.rq.poll().unwrap() {
        complete(wr_id, WcOpcode::Recv, sges.total_len() as u32);
    }
    qp.sq.release();
    qp.rq.sync().unwrap();
    cq.cq.publish();
    n
}

fn daemon_and_client_processes_post_and_complete() {
    let (_sock, mut child, mut qp, mut cq) = spawn_client("client");
    let mut done = 0;
    while done < M {
        let n = serve(&mut qp, &mut cq);
        done += n;
        if n == 0 {
            std::thread::yield_now();
        }
    }
    assert!(child.wait().unwrap().success(), "client failed its checks");
    println!("  {M} work requests posted by the client process, validated and completed through the rings");
}

/// Mappings of this process of memfds called `name`.
fn mapped(name: &str) -> usize {
    let want = format!("/memfd:{name} (deleted)");
    std::fs::read_to_string("/proc/self/maps").unwrap().lines().filter(|l| l.ends_with(want.as_str())).count()
}

/// Child role "poster": posts sends forever (until killed), never polling its CQ beyond what frees the window.
fn child_poster() {
    let (_sock, mut qp, mut cq) = client_connect();
    let mut out = [abi::Cqe::default().decode().unwrap(); 16];
    let (mut posted, mut completed) = (0u64, 0u64);
    loop {
        if posted - completed < WINDOW {
            qp.sq.post(&SendWr::new(posted, WrOpcode::Send), &wr_sgl(posted)).unwrap();
            posted += 1;
        }
        completed += cq.cq.poll(&mut out).unwrap() as u64;
    }
}

fn client_killed_mid_stream_leaves_the_daemon_side_sound() {
    let (sock, mut child, mut qp, mut cq) = spawn_client("poster");
    let mut done = 0;
    while done < 5_000 {
        done += serve(&mut qp, &mut cq);
        std::thread::yield_now();
    }
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    assert!(!status.success());
    // What the client left in its rings is drained and then the queue is simply empty: no hang, no error.
    let left = serve(&mut qp, &mut cq);
    assert!(left <= WINDOW, "at most the client's window was outstanding, got {left}");
    assert_eq!(serve(&mut qp, &mut cq), 0);
    // The daemon learns of the death from its socket: end of stream.
    let mut fds = Vec::new();
    assert_eq!(recv_with_fds(&sock, &mut [0u8; 8], &mut fds), Ok((0, false)), "EOF on the client's socket");
    // Reclaiming the client's queues releases everything this process held of them.
    assert_eq!(open_memfds("roce-dp-it-qp") + open_memfds("roce-dp-it-cq"), 2);
    assert_eq!(mapped("roce-dp-it-qp") + mapped("roce-dp-it-cq"), 2);
    drop((qp, cq));
    assert_eq!(open_memfds("roce-dp-it-qp") + open_memfds("roce-dp-it-cq"), 0, "memfds closed");
    assert_eq!(mapped("roce-dp-it-qp") + mapped("roce-dp-it-cq"), 0, "regions unmapped");
    println!("  client SIGKILLed after {done} completions; {left} WQEs drained afterwards; socket EOF seen");
}

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("echo") => return child_echo(),
        Ok("hostile") => return child_hostile(),
        Ok("client") => return child_client(),
        Ok("poster") => return child_poster(),
        Ok(other) => panic!("unknown {ROLE} {other}"),
        Err(_) => {}
    }
    let tests: [(&str, fn()); 4] = [
        ("two_processes_a_million_each_way_in_order", two_processes_a_million_each_way_in_order),
        (
            "hostile_process_gets_typed_errors_and_nothing_outside_is_touched",
            hostile_process_gets_typed_errors_and_nothing_outside_is_touched,
        ),
        ("daemon_and_client_processes_post_and_complete", daemon_and_client_processes_post_and_complete),
        (
            "client_killed_mid_stream_leaves_the_daemon_side_sound",
            client_killed_mid_stream_leaves_the_daemon_side_sound,
        ),
    ];
    own_main::run_tests(&tests);
}
