//! The daemon's guard against SIGBUS from clients' shared memory.
//!
//! The seals every shared region carries fix its size (no SIGBUS past a shrunk end), not its pages: the process
//! at the other end may punch a hole in the memfd (`fallocate(FALLOC_FL_PUNCH_HOLE)`, or `madvise(MADV_REMOVE)` on
//! its own mapping). On shmem pages the next access finds a fresh zero page. On hugetlbfs the hole takes the
//! page's reservation with it, and when the huge-page pool has no free page left, the daemon's next access to that
//! page is SIGBUS — which would kill the daemon and every session with it. The seals that forbid punching
//! (`F_SEAL_WRITE`, `F_SEAL_FUTURE_WRITE`) also forbid the writable mappings both sides need, so the daemon cannot
//! rule the hole out; it survives it instead, as Wayland compositors survive clients' shm buffers:
//!
//! - [`install`] puts a SIGBUS handler in place (once per process; the daemon's server does it when it starts).
//! - Every shared mapping the process makes afterwards is registered ([`register`], from `shm.rs`), with its
//!   granule (4 KiB, or 2 MiB on hugetlbfs) and its owner: the session whose thread made it ([`set_owner`]).
//! - A fault inside a registered mapping replaces the granule around the faulting address with private anonymous
//!   zero memory (`mmap(MAP_FIXED)`), marks the mapping poisoned and returns: the access is retried on the new page,
//!   so the worker carries on, reading zeros and writing into memory no other process sees. Only the client that
//!   punched the hole loses data, its own.
//! - The daemon's control thread sees [`poisoned_count`] move, takes the owners with [`take_poisoned`] and closes
//!   their sessions (which reclaims, and so unmaps, everything they held).
//! - A SIGBUS anywhere else, or one sent by `kill`, goes to the disposition that was there before (Rust's
//!   stack-overflow handler, or the default action: the process dies as it would have without the guard).
//!
//! The handler reads the registry without locks (atomics only) and calls only `mmap` and `sigaction`. A mapping is
//! unregistered before it is unmapped, and an access to a mapping happens only while its region is alive, so the
//! mapping a fault lands in cannot be unmapped under the handler.

#![allow(unsafe_code)]

use core::cell::Cell;
use core::ptr;
use core::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

/// Mappings the registry holds at once. More than a process may have (`vm.max_map_count`, 65530 by default).
pub const SLOTS: usize = 1 << 16;

const CLEAN: u8 = 0;
const POISONED: u8 = 1;
const REPORTED: u8 = 2;

struct Slot {
    /// 0 while the slot is free; written last when a mapping is registered, first when it is unregistered.
    len: AtomicUsize,
    start: AtomicUsize,
    granule: AtomicUsize,
    owner: AtomicU32,
    state: AtomicU8,
}

#[allow(clippy::declare_interior_mutable_const)]
const FREE_SLOT: Slot = Slot {
    len: AtomicUsize::new(0),
    start: AtomicUsize::new(0),
    granule: AtomicUsize::new(0),
    owner: AtomicU32::new(0),
    state: AtomicU8::new(CLEAN),
};

static TABLE: [Slot; SLOTS] = [FREE_SLOT; SLOTS];
/// Slots below this index have been used (the handler scans only these).
static HIGH: AtomicUsize = AtomicUsize::new(0);
/// Freed slots, and the lock registration takes (never taken by the handler).
static FREE: Mutex<Vec<u32>> = Mutex::new(Vec::new());
static INSTALLED: AtomicBool = AtomicBool::new(false);
/// Pages replaced so far.
static REPLACED: AtomicU64 = AtomicU64::new(0);
/// The SIGBUS disposition before [`install`].
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

thread_local! {
    static OWNER: Cell<u32> = const { Cell::new(0) };
}

/// Why the guard could not be installed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InstallError(pub i32);

impl core::fmt::Display for InstallError {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "sigaction(SIGBUS): {}", std::io::Error::from_raw_os_error(self.0))
    }
}

impl std::error::Error for InstallError {}

/// Installs the SIGBUS handler for this process (idempotent). Mappings made before it are not guarded.
pub fn install() -> Result<(), InstallError> {
    static LOCK: Mutex<()> = Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    if INSTALLED.load(Ordering::Acquire) {
        return Ok(());
    }
    // SAFETY: an all-zero sigaction is a valid value (SIG_DFL, empty mask); sigaction overwrites `old`.
    let mut old: libc::sigaction = unsafe { core::mem::zeroed() };
    // SAFETY: a query (null new action) with a valid out-pointer.
    if unsafe { libc::sigaction(libc::SIGBUS, ptr::null(), &mut old) } != 0 {
        return Err(InstallError(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)));
    }
    // The previous disposition is known before the handler can run and chain to it.
    let _ = PREVIOUS.set(old);
    // SAFETY: as above.
    let mut act: libc::sigaction = unsafe { core::mem::zeroed() };
    act.sa_sigaction = on_sigbus as *const () as usize;
    // SA_ONSTACK: on the thread's alternate stack where it has one (Rust's threads do), as the handler chained to
    // may need it (a stack overflow).
    act.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
    // SAFETY: act is a valid action whose handler has the SA_SIGINFO signature.
    if unsafe { libc::sigaction(libc::SIGBUS, &act, ptr::null_mut()) } != 0 {
        return Err(InstallError(std::io::Error::last_os_error().raw_os_error().unwrap_or(0)));
    }
    INSTALLED.store(true, Ordering::Release);
    Ok(())
}

/// Whether [`install`] has run in this process.
pub fn installed() -> bool {
    INSTALLED.load(Ordering::Acquire)
}

/// Mappings registered from this thread from now on belong to `owner` (a session id; 0 = none).
pub fn set_owner(owner: u32) {
    OWNER.with(|o| o.set(owner));
}

/// Pages the handler has replaced since the process started.
pub fn poisoned_count() -> u64 {
    REPLACED.load(Ordering::Acquire)
}

/// The owners of mappings poisoned since the last call (each once; owner 0 included if a mapping without an owner
/// was poisoned).
pub fn take_poisoned() -> Vec<u32> {
    let high = HIGH.load(Ordering::Acquire).min(SLOTS);
    let mut out = Vec::new();
    for s in &TABLE[..high] {
        if s.state.compare_exchange(POISONED, REPORTED, Ordering::AcqRel, Ordering::Relaxed).is_ok() {
            let o = s.owner.load(Ordering::Relaxed);
            if !out.contains(&o) {
                out.push(o);
            }
        }
    }
    out
}

/// A registered mapping; unregisters it when dropped (drop it before unmapping).
#[derive(Debug)]
pub struct Guard(u32);

impl Guard {
    /// Whether a fault replaced a page of the mapping.
    pub fn poisoned(&self) -> bool {
        TABLE[self.0 as usize].state.load(Ordering::Acquire) != CLEAN
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = &TABLE[self.0 as usize];
        s.len.store(0, Ordering::Release);
        s.state.store(CLEAN, Ordering::Release);
        FREE.lock().unwrap_or_else(|p| p.into_inner()).push(self.0);
    }
}

/// Registers the mapping `[start, start + len)` made of `granule`-sized pages (a power of two; the mapping starts on
/// one). `Ok(None)` if the guard is not installed; `Err(())` if the registry is full.
#[allow(clippy::result_unit_err)]
pub fn register(start: *mut u8, len: usize, granule: usize) -> Result<Option<Guard>, ()> {
    if !installed() || len == 0 {
        return Ok(None);
    }
    debug_assert!(granule.is_power_of_two() && (start as usize).is_multiple_of(granule));
    let mut free = FREE.lock().unwrap_or_else(|p| p.into_inner());
    let i = match free.pop() {
        Some(i) => i as usize,
        None => {
            let i = HIGH.load(Ordering::Relaxed);
            if i >= SLOTS {
                return Err(());
            }
            i
        }
    };
    let s = &TABLE[i];
    s.start.store(start as usize, Ordering::Relaxed);
    s.granule.store(granule, Ordering::Relaxed);
    s.owner.store(OWNER.with(Cell::get), Ordering::Relaxed);
    s.state.store(CLEAN, Ordering::Relaxed);
    s.len.store(len, Ordering::Release);
    if i >= HIGH.load(Ordering::Relaxed) {
        HIGH.store(i + 1, Ordering::Release);
    }
    Ok(Some(Guard(i as u32)))
}

/// The registered mapping holding `addr`, if any.
fn find(addr: usize) -> Option<&'static Slot> {
    let high = HIGH.load(Ordering::Acquire).min(SLOTS);
    TABLE[..high].iter().find(|s| {
        let len = s.len.load(Ordering::Acquire);
        let start = s.start.load(Ordering::Relaxed);
        // A slot being re-registered meanwhile: its length read again, so start and len are one registration's.
        len != 0 && addr.wrapping_sub(start) < len && s.len.load(Ordering::Acquire) == len
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // si_code > 0: raised by the kernel for a fault (a `kill` has SI_USER or SI_QUEUE, <= 0, and no address).
    if code > 0 {
        if let Some(s) = find(addr) {
            let granule = s.granule.load(Ordering::Relaxed);
            let page = addr & !(granule - 1);
            // SAFETY: [page, page + granule) lies inside a registered shared mapping that is still mapped (a
            // mapping is unregistered before it is unmapped, and the faulting thread is using it): replacing those
            // pages with fresh private memory touches nothing else of this process. mmap is a plain system call.
            let p = unsafe {
                libc::mmap(
                    page as *mut libc::c_void,
                    granule,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                    -1,
                    0,
                )
            };
            if p != libc::MAP_FAILED {
                let _ = s.state.compare_exchange(CLEAN, POISONED, Ordering::AcqRel, Ordering::Relaxed);
                REPLACED.fetch_add(1, Ordering::AcqRel);
                return;
            }
        }
    }
    chain(sig, code, info, ctx);
}

/// Hands the signal to the disposition [`install`] replaced.
fn chain(sig: libc::c_int, code: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    let prev = PREVIOUS.get().map_or(libc::SIG_DFL, |p| p.sa_sigaction);
    if prev == libc::SIG_DFL || prev == libc::SIG_IGN {
        // Back to the default action and return: the faulting access runs again and the process dies of SIGBUS,
        // as it would have without the guard (the kernel delivers a fault's SIGBUS even when it is ignored).
        // SAFETY: an all-zero sigaction is SIG_DFL with an empty mask.
        let dfl: libc::sigaction = unsafe { core::mem::zeroed() };
        // SAFETY: a valid action; sigaction is async-signal-safe.
        unsafe { libc::sigaction(sig, &dfl, ptr::null_mut()) };
        if code <= 0 {
            // A SIGBUS sent by kill: deliver it again, now with the default action.
            // SAFETY: raise is async-signal-safe.
            unsafe { libc::raise(sig) };
        }
        return;
    }
    let flags = PREVIOUS.get().map_or(0, |p| p.sa_flags);
    if flags & libc::SA_SIGINFO != 0 {
        // SAFETY: the previous handler was installed with SA_SIGINFO, so it has this signature.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { core::mem::transmute::<usize, _>(prev) };
        f(sig, info, ctx);
    } else {
        // SAFETY: a handler installed without SA_SIGINFO has this signature.
        let f: extern "C" fn(libc::c_int) = unsafe { core::mem::transmute::<usize, _>(prev) };
        f(sig);
    }
}
