//! Rings across two processes sharing a sealed memfd: an honest peer (order and content of a million entries each
//! way) and a hostile one (random bytes over a QP's rings and side tables, random indices, attempts to resize the
//! region) while this process reads the queues as the daemon would, with PROT_NONE guard pages around the region
//! so that any access outside it would crash the test.
//!
//! `harness = false`: the binary is its own child. `ROCE_SHM_ROLE` selects a child role; without it, `main` runs
//! the tests and spawns itself (`std::env::current_exe()`) for the peer, passing the memfd by inheritance.
//!
//! Run: `cargo test -p roce-dp --no-default-features --test shm_ring`.

use std::os::fd::AsRawFd;
use std::process::{Command, ExitStatus};
use std::sync::Arc;

use roce_dp::ctrl::abi::{region_kind, RegionHeader, RingDesc, Sge, TableDesc, Wqe, WqeLimits};
use roce_dp::ctrl::ring::{heap_ring, heap_table, RingError};
use roce_dp::ctrl::shm::{Backing, ShmRegion};
use roce_dp::ctrl::wq::{SendQueueReader, SendQueueWriter, WqError};
use roce_dp::sim::SimRng;
use roce_dp::{SendWr, WrOpcode};

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

fn spawn(role: &str, region: &ShmRegion, seed: u64) -> std::process::Child {
    let mut cmd = Command::new(std::env::current_exe().expect("current_exe"));
    let fd = region.share_with_child(&mut cmd);
    cmd.env(ROLE, role).env(FD, fd.to_string()).env(SEED, seed.to_string());
    cmd.spawn().expect("spawn child")
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
    let end = QP_AT + h.region_len as usize;
    let sq = at(h.sq);
    let (head_at, tail_at, slots_at) = (sq.offset as usize, sq.offset as usize + 128, sq.offset as usize + 256);
    // Phase 1: honest indices (the tail never runs more than `capacity` ahead of the daemon's head), hostile
    // contents: a mix of valid WQEs and WQEs with random fields, garbage in the side tables.
    let mut tail = 0u32;
    let mut posted = 0u32;
    while posted < 20_000 {
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
    // Phase 2: anything goes.
    for round in 0..200_000u32 {
        match rng.below(8) {
            // Random words anywhere in the QP region (header, indices, WQEs, tables).
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
    let total = QP_AT + h.region_len as usize + PAGE;
    let mut region = ShmRegion::create("roce-dp-hostile", total, Backing::Pages).unwrap();
    region.write(QP_AT, h).unwrap();
    // Guard pages in this process's mapping: any read or write outside the QP region kills the test.
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
                }
                Err(WqError::Wqe { error, .. }) => {
                    assert!(!corrupt);
                    assert!(!error.to_string().is_empty());
                    refused += 1;
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
    assert_eq!(honest_seen, honest_posted);
    assert!(honest_seen > 0);
    println!(
        "  hostile child: {accepted} WQEs passed validation, {refused} refused with a typed error, ring corrupt: \
         {corrupt}; bystander QP: {honest_seen} WQEs intact"
    );
    // Phase 1 of the child posts 20000 WQEs with honest indices, each only when the daemon's published head shows
    // room, so at most one ring's worth (64) can still be unread when phase 2 starts scribbling on the indices.
    let phase1_seen = 20_000 - u64::from(h.sq.capacity);
    assert!(accepted + refused >= phase1_seen, "the reader missed phase-1 WQEs: {accepted} + {refused}");
    assert!(accepted > 1000 && refused > 1000);
    assert!(corrupt, "phase 2's random tails were not detected");
}

fn main() {
    match std::env::var(ROLE).as_deref() {
        Ok("echo") => return child_echo(),
        Ok("hostile") => return child_hostile(),
        Ok(other) => panic!("unknown {ROLE} {other}"),
        Err(_) => {}
    }
    let tests: [(&str, fn()); 2] = [
        ("two_processes_a_million_each_way_in_order", two_processes_a_million_each_way_in_order),
        (
            "hostile_process_gets_typed_errors_and_nothing_outside_is_touched",
            hostile_process_gets_typed_errors_and_nothing_outside_is_touched,
        ),
    ];
    // Honour a name filter as the default harness does (`cargo test --test shm_ring NAME`).
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let mut ran = 0;
    for (name, f) in tests {
        if !filter.is_empty() && !filter.iter().any(|p| name.contains(p.as_str())) {
            continue;
        }
        println!("test {name} ...");
        f();
        println!("test {name} ... ok");
        ran += 1;
    }
    println!("test result: ok. {ran} passed");
}
