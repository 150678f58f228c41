//! Shared memory regions: a sealed memfd mapped `MAP_SHARED`, unmapped on drop.
//!
//! The creating side ([`ShmRegion::create`]) sizes the memfd and seals it against shrinking and growing before
//! anyone else sees it; the other side ([`ShmRegion::map`]) refuses a descriptor without those seals. This matters
//! because the peer is not trusted: a peer that could `ftruncate` a region shorter would turn every access of ours
//! past the new end into SIGBUS. With the seals the size read by `fstat` at map time holds for the mapping's life.
//!
//! Descriptors travel to the other process over a Unix socket ([`send_with_fds`] / [`recv_with_fds`], SCM_RIGHTS)
//! or by inheritance ([`ShmRegion::share_with_child`] plus [`ShmRegion::open_inherited`]).
//!
//! Hugepage backing ([`Backing::Hugetlb`], `MFD_HUGETLB | MFD_HUGE_2MB`: 2 MiB pages whatever the kernel's default
//! huge page size) rounds the size up to 2 MiB. The pages are reserved when the region is mapped (the kernel's
//! hugetlb reservation for shared mappings), so a region that maps never faults for want of a page later;
//! `create` fails with [`ShmError::NoHugepages`] when the pool has too few free pages.

#![allow(unsafe_code)]

use core::fmt;
use core::mem::size_of;
use core::ptr::{self, NonNull};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;

use super::abi::{self, region_kind, AbiError, RegionHeader, RingDesc, TableDesc, WqeLimits};
use super::ring::{Consumer, LayoutError, NotifyView, Pod, Producer, SlotTable};
use super::wq::{CqReader, RecvQueueReader, RecvQueueWriter, SendQueueReader, SendQueueWriter, WqError};

/// Size of a huge page used with [`Backing::Hugetlb`] (the kernel default on x86-64).
pub const HUGEPAGE_SIZE: usize = 2 << 20;

/// Seals a region carries: its size is fixed and the seal set itself is closed.
const SEALS: libc::c_int = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// What backs a region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    /// Ordinary shmem pages (size rounded up to 4 KiB).
    Pages,
    /// Huge pages from the hugetlbfs pool (size rounded up to [`HUGEPAGE_SIZE`]).
    Hugetlb,
}

/// Why a region could not be created or mapped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShmError {
    /// A system call failed.
    Os {
        /// The call.
        op: &'static str,
        /// Its errno.
        errno: i32,
    },
    /// Hugepage backing was asked for but the pool has too few free pages.
    NoHugepages {
        /// Bytes requested (rounded to huge pages).
        bytes: usize,
        /// 2 MiB pages free and not reserved when it failed (`free_hugepages - resv_hugepages` in sysfs).
        free: u64,
    },
    /// The descriptor lacks the size seals (or is not a memfd at all): refusing to map memory the peer can shrink.
    NotSealed {
        /// The seals it has (`F_GET_SEALS`), or -1 if it cannot carry seals.
        seals: i32,
    },
    /// A size of zero, or too large for this machine.
    BadSize(usize),
    /// A ring or table that does not fit in the region.
    OutOfRange {
        /// Its offset.
        offset: u64,
        /// The region length.
        len: usize,
    },
    /// A ring or table layout problem.
    Layout(LayoutError),
    /// Descriptor passing failed: too many descriptors, or the control data was truncated (every descriptor that
    /// did arrive is closed).
    Fds(&'static str),
    /// The region's header is not one this library can use (ABI version, kind, geometry).
    Abi(AbiError),
    /// Side tables too small for the queue limits (a layout bug).
    Wq(WqError),
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ShmError::Os { op, errno } => write!(f, "{op}: {}", std::io::Error::from_raw_os_error(errno)),
            ShmError::NoHugepages { bytes, free } => write!(
                f,
                "not enough free 2 MiB hugepages for a {} MiB region ({} needed, {free} free): reserve more as root \
                 (scripts/setup.sh --hugepages N, or echo N > /proc/sys/vm/nr_hugepages) or set the daemon's \
                 [daemon] backing = \"memfd\"",
                bytes >> 20,
                bytes / HUGEPAGE_SIZE
            ),
            ShmError::NotSealed { seals } => write!(
                f,
                "shared-memory descriptor is not a memfd sealed against resizing (seals {seals:#x}); refusing to map it"
            ),
            ShmError::BadSize(n) => write!(f, "shared region size {n} is zero or too large"),
            ShmError::OutOfRange { offset, len } => {
                write!(f, "ring or table at offset {offset} does not fit in the {len}-byte region")
            }
            ShmError::Layout(e) => write!(f, "{e}"),
            ShmError::Fds(what) => write!(f, "descriptor passing: {what}"),
            ShmError::Abi(e) => write!(f, "{e}"),
            ShmError::Wq(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ShmError {}

impl From<AbiError> for ShmError {
    fn from(e: AbiError) -> ShmError {
        ShmError::Abi(e)
    }
}

impl From<WqError> for ShmError {
    fn from(e: WqError) -> ShmError {
        ShmError::Wq(e)
    }
}

impl From<LayoutError> for ShmError {
    fn from(e: LayoutError) -> ShmError {
        ShmError::Layout(e)
    }
}

/// The granule of a mapping of the file `st` describes: the page size for memfd pages, the huge page size on
/// hugetlbfs (whose mappings must start and end at huge page boundaries).
fn granule(st: &libc::stat) -> u64 {
    u64::try_from(st.st_blksize).ok().filter(|b| b.is_power_of_two() && *b >= 4096).unwrap_or(4096)
}

/// 2 MiB pages in the kernel's pool that are neither in use nor reserved (0 if sysfs cannot be read).
pub fn hugepages_available() -> u64 {
    let read = |f: &str| {
        std::fs::read_to_string(format!("/sys/kernel/mm/hugepages/hugepages-2048kB/{f}"))
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    read("free_hugepages").saturating_sub(read("resv_hugepages"))
}

/// This process's descriptor limit (RLIMIT_NOFILE's soft value; 0 if it cannot be read), for messages.
pub fn nofile_limit() -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: r is a valid out-pointer for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } != 0 {
        return 0;
    }
    r.rlim_cur
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

fn os(op: &'static str) -> ShmError {
    ShmError::Os { op, errno: errno() }
}

/// A memfd mapped read-write and shared, unmapped on drop.
pub struct ShmRegion {
    ptr: NonNull<u8>,
    len: usize,
    fd: OwnedFd,
    /// The mapping's entry in the SIGBUS guard's registry, in a process that installed the guard (the daemon).
    guard: Option<super::sigbus::Guard>,
}

// SAFETY: the region hands out only raw pointers and volatile copies; it has no interior state besides the
// mapping, which any thread may access and which lives until drop.
unsafe impl Send for ShmRegion {}
// SAFETY: as above; the `&self` methods only read (volatile) or hand out pointers whose use is `unsafe`.
unsafe impl Sync for ShmRegion {}

impl ShmRegion {
    /// Creates a sealed memfd of at least `len` bytes (zero-filled) named `name` (shown in /proc/PID/maps) and maps it.
    pub fn create(name: &str, len: usize, backing: Backing) -> Result<ShmRegion, ShmError> {
        let page = if backing == Backing::Hugetlb { HUGEPAGE_SIZE } else { 4096 };
        let size = len.checked_next_multiple_of(page).filter(|&n| n > 0 && n <= isize::MAX as usize);
        let size = size.ok_or(ShmError::BadSize(len))?;
        let cname = CString::new(name.replace('\0', "?")).map_err(|_| ShmError::BadSize(len))?;
        let mut flags = libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING;
        if backing == Backing::Hugetlb {
            flags |= libc::MFD_HUGETLB | libc::MFD_HUGE_2MB;
        }
        // SAFETY: cname is NUL-terminated and outlives the call.
        let raw = unsafe { libc::memfd_create(cname.as_ptr(), flags) };
        if raw < 0 {
            return Err(os("memfd_create"));
        }
        // SAFETY: memfd_create returned a fresh descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            return Err(os("ftruncate"));
        }
        // SAFETY: plain syscall on our descriptor.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, SEALS) } != 0 {
            return Err(os("fcntl(F_ADD_SEALS)"));
        }
        Self::mmap(fd, size, page).map_err(|e| match e {
            ShmError::Os { errno: libc::ENOMEM, .. } if backing == Backing::Hugetlb => {
                ShmError::NoHugepages { bytes: size, free: hugepages_available() }
            }
            e => e,
        })
    }

    /// Maps a region received from the peer. Its size is `fstat`'s; it must carry the shrink and grow seals.
    pub fn map(fd: OwnedFd) -> Result<ShmRegion, ShmError> {
        let st = Self::sealed_stat(&fd)?;
        let size = usize::try_from(st.st_size).map_err(|_| ShmError::BadSize(0))?;
        Self::mmap(fd, size, granule(&st) as usize)
    }

    /// Maps only the pages of a peer's region that hold `len` bytes at `offset` (a memory registration's window)
    /// and returns the mapping with the window's offset inside it; `Ok(Err(size))` if the window does not fit the
    /// descriptor's `size`. The same seals as [`map`](Self::map) are required, so the peer cannot shrink the file
    /// under the mapping (a shrink would turn the daemon's accesses into SIGBUS). Mapping the whole descriptor, as
    /// `map` does, let a client make the daemon map a huge sparse memfd (terabytes of address space for a window
    /// of a few bytes at its end) until the daemon's own allocations failed.
    #[allow(clippy::type_complexity)]
    pub fn map_window(fd: OwnedFd, offset: u64, len: u64) -> Result<Result<(ShmRegion, usize), u64>, ShmError> {
        let st = Self::sealed_stat(&fd)?;
        let size = u64::try_from(st.st_size).map_err(|_| ShmError::BadSize(0))?;
        let Some(end) = offset.checked_add(len).filter(|&e| e <= size) else { return Ok(Err(size)) };
        let page = granule(&st);
        let start = offset & !(page - 1);
        let stop = end.max(offset + 1).next_multiple_of(page).min(size.next_multiple_of(page));
        let map_len = usize::try_from(stop - start).map_err(|_| ShmError::BadSize(usize::MAX))?;
        let map_off = libc::off_t::try_from(start).map_err(|_| ShmError::BadSize(usize::MAX))?;
        // SAFETY: a fresh shared mapping of our descriptor at an address the kernel picks; nothing is aliased.
        let p = unsafe {
            libc::mmap(
                ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                map_off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        Ok(Ok((ShmRegion::guarded(p, map_len, fd, page as usize)?, (offset - start) as usize)))
    }

    /// `fstat` of a peer's descriptor, which must carry the shrink and grow seals and have a non-zero size.
    fn sealed_stat(fd: &OwnedFd) -> Result<libc::stat, ShmError> {
        // SAFETY: plain syscall on a descriptor we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        let need = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW;
        if seals < 0 || seals & need != need {
            return Err(ShmError::NotSealed { seals });
        }
        // SAFETY: an all-zero stat is a valid value; fstat overwrites it.
        let mut st: libc::stat = unsafe { core::mem::zeroed() };
        // SAFETY: st is a valid out-pointer for the duration of the call.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(os("fstat"));
        }
        if st.st_size <= 0 {
            return Err(ShmError::BadSize(0));
        }
        Ok(st)
    }

    /// Reopens a region descriptor inherited from the parent (see [`share_with_child`](Self::share_with_child))
    /// through `/proc/self/fd/N`, then [`map`](Self::map)s it. Fails cleanly if `fd` is not open.
    pub fn open_inherited(fd: RawFd) -> Result<ShmRegion, ShmError> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{fd}"))
            .map_err(|e| ShmError::Os { op: "open(/proc/self/fd/N)", errno: e.raw_os_error().unwrap_or(0) })?;
        Self::map(OwnedFd::from(file))
    }

    fn mmap(fd: OwnedFd, size: usize, granule: usize) -> Result<ShmRegion, ShmError> {
        // SAFETY: a fresh shared mapping of our descriptor at an address the kernel picks; nothing is aliased.
        let p = unsafe {
            libc::mmap(ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        ShmRegion::guarded(p, size, fd, granule)
    }

    /// The region for the fresh mapping `p` of `len` bytes, registered with the SIGBUS guard where the process
    /// installed it ([`super::sigbus`]); unmapped again if the registry is full.
    fn guarded(p: *mut libc::c_void, len: usize, fd: OwnedFd, granule: usize) -> Result<ShmRegion, ShmError> {
        let Some(ptr) = NonNull::new(p.cast::<u8>()) else {
            return Err(ShmError::Os { op: "mmap", errno: libc::EINVAL });
        };
        match super::sigbus::register(ptr.as_ptr(), len, granule) {
            Ok(guard) => Ok(ShmRegion { ptr, len, fd, guard }),
            Err(()) => {
                // SAFETY: our own fresh mapping of `len` bytes, not handed out.
                unsafe { libc::munmap(p, len) };
                Err(ShmError::Os { op: "mmap (the SIGBUS guard's registry is full)", errno: libc::ENOMEM })
            }
        }
    }

    /// Whether a page of this mapping vanished under it (a hole the peer punched, with no page left to fill it)
    /// and the SIGBUS guard replaced it with private zeros ([`super::sigbus`]). Always false without the guard.
    pub fn poisoned(&self) -> bool {
        self.guard.as_ref().is_some_and(super::sigbus::Guard::poisoned)
    }

    /// Base address of the mapping (page aligned).
    pub fn as_ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Always false (regions are never empty); for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The memfd.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Makes the region's descriptor survive `exec` in the child `cmd` spawns; see [`inherit_fd`].
    pub fn share_with_child(&self, cmd: &mut Command) -> RawFd {
        inherit_fd(cmd, self.fd.as_fd())
    }

    /// Bounds-checked pointer to `offset .. offset + len`.
    fn span(&self, offset: u64, len: usize) -> Result<NonNull<u8>, ShmError> {
        let out = ShmError::OutOfRange { offset, len: self.len };
        let start = usize::try_from(offset).map_err(|_| out)?;
        if start.checked_add(len).is_none_or(|end| end > self.len) {
            return Err(out);
        }
        // SAFETY: start + len <= self.len: inside the mapping.
        Ok(unsafe { self.ptr.add(start) })
    }

    /// A volatile copy of the `T` at `offset` (for headers; `None` if it does not fit or is misaligned).
    pub fn read<T: Pod>(&self, offset: usize) -> Option<T> {
        let p = self.span(offset as u64, size_of::<T>()).ok()?.cast::<T>();
        if !p.as_ptr().is_aligned() {
            return None;
        }
        // SAFETY: in bounds and aligned (checked); T is Pod, so any bytes the peer left are a valid T.
        Some(unsafe { ptr::read_volatile(p.as_ptr()) })
    }

    /// Writes `value` at `offset` (for headers; `None` if it does not fit or is misaligned).
    pub fn write<T: Pod>(&mut self, offset: usize, value: T) -> Option<()> {
        let p = self.span(offset as u64, size_of::<T>()).ok()?.cast::<T>();
        if !p.as_ptr().is_aligned() {
            return None;
        }
        // SAFETY: in bounds and aligned (checked); &mut self excludes other writers through this region in-process.
        unsafe { ptr::write_volatile(p.as_ptr(), value) };
        Some(())
    }

    /// Attaches the producer half of the ring `desc` describes; the half keeps the region mapped.
    ///
    /// # Safety
    /// No other producer of this ring exists in this process (or in any process this side trusts).
    pub unsafe fn producer<T: Pod>(self: &Arc<Self>, desc: RingDesc) -> Result<Producer<T>, ShmError> {
        let (base, len) = self.ring_span::<T>(desc)?;
        // SAFETY: [base, base + len) is inside the mapping, which the owner keeps alive; uniqueness is the
        // caller's promise.
        Ok(unsafe { Producer::attach(base, len, desc.capacity, Some(self.clone()))? })
    }

    /// Attaches the consumer half of the ring `desc` describes; the half keeps the region mapped.
    ///
    /// # Safety
    /// No other consumer of this ring exists in this process (or in any process this side trusts).
    pub unsafe fn consumer<T: Pod>(self: &Arc<Self>, desc: RingDesc) -> Result<Consumer<T>, ShmError> {
        let (base, len) = self.ring_span::<T>(desc)?;
        // SAFETY: as in `producer`.
        Ok(unsafe { Consumer::attach(base, len, desc.capacity, Some(self.clone()))? })
    }

    /// Attaches a view of the side table `desc` describes, for a ring of `capacity` slots.
    ///
    /// # Safety
    /// Within this process only the owning ring's producer side writes through a view of this table.
    pub unsafe fn table<T: Pod>(self: &Arc<Self>, desc: TableDesc, capacity: u32) -> Result<SlotTable<T>, ShmError> {
        if desc.elem_size as usize != size_of::<T>() {
            return Err(ShmError::OutOfRange { offset: desc.offset, len: self.len });
        }
        let bytes = SlotTable::<T>::bytes(capacity, desc.per_slot).ok_or(ShmError::BadSize(0))?;
        let base = self.span(desc.offset, bytes)?;
        // SAFETY: inside the mapping (span), kept alive by the owner; writer discipline is the caller's promise.
        Ok(unsafe { SlotTable::attach(base, bytes, capacity, desc.per_slot, Some(self.clone()))? })
    }

    /// A view of the CQ notification block at `offset`; the view keeps the region mapped.
    pub fn notify(self: &Arc<Self>, offset: u64) -> Result<NotifyView, ShmError> {
        let len = size_of::<abi::CqNotify>();
        let base = self.span(offset, len)?;
        // SAFETY: inside the mapping (span), kept alive by the owner.
        Ok(unsafe { NotifyView::attach(base, len, self.clone())? })
    }

    fn ring_span<T: Pod>(&self, desc: RingDesc) -> Result<(NonNull<u8>, usize), ShmError> {
        if desc.entry_size as usize != size_of::<T>() {
            return Err(ShmError::OutOfRange { offset: desc.offset, len: self.len });
        }
        let bytes = super::ring::ring_bytes(desc.capacity, size_of::<T>()).ok_or(ShmError::BadSize(0))?;
        Ok((self.span(desc.offset, bytes)?, bytes))
    }
}

impl ShmRegion {
    /// The whole mapping as bytes, for the process that created the region and hands it to the daemon as a memory
    /// region's buffer (the client library's `Mr`).
    ///
    /// The daemon writes into the mapping only where the application asked it to (receive buffers, READ and atomic
    /// results, the targets of a peer's WRITE it granted an rkey for), exactly as a NIC's DMA does: the verbs
    /// contract, not the borrow checker, keeps the application from reading those bytes before the completion.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is `len` bytes, readable and writable, alive for &mut self; this process holds the
        // only Rust reference to it. The daemon process may store into it concurrently (see above): plain bytes,
        // every bit pattern valid, so at worst the application reads a torn value it was told not to read yet.
        unsafe { core::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// A window of `len` bytes at `offset` for the daemon's memory regions; `None` if it does not fit.
    pub fn window(self: &Arc<Self>, offset: usize, len: usize) -> Option<ShmBytes> {
        offset.checked_add(len).filter(|&end| end <= self.len)?;
        Some(ShmBytes { region: self.clone(), offset, len })
    }
}

/// A bounds-checked window into a client's shared region: the bytes of a memory region the daemon registered on
/// the client's behalf (the engine's `MrTable` keeps one per shared region).
///
/// The client may change these bytes at any time (as an application may change memory a NIC is reading): the
/// daemon never forms a reference into them, copies in and out through raw pointers after checking the range
/// against the window, and never uses what it reads as an index or a length. So a racing or hostile client can
/// corrupt only its own payload, never make the daemon touch memory outside the mapping.
#[derive(Clone)]
pub struct ShmBytes {
    region: Arc<ShmRegion>,
    offset: usize,
    len: usize,
}

impl fmt::Debug for ShmBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmBytes")
            .field("region", &self.region)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl ShmBytes {
    /// Length of the window.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// True for an empty window.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Pointer to `off .. off + n` of the window, if it lies inside.
    #[inline]
    fn at(&self, off: usize, n: usize) -> Option<*mut u8> {
        off.checked_add(n).filter(|&end| end <= self.len)?;
        // SAFETY: offset + len <= region.len (checked in `window`) and off + n <= len: inside the mapping.
        Some(unsafe { self.region.ptr.as_ptr().add(self.offset + off) })
    }

    /// Copies `dst.len()` bytes at `off` out of the window; false (nothing copied) if the range is not inside.
    #[inline]
    pub fn read(&self, off: usize, dst: &mut [u8]) -> bool {
        let Some(src) = self.at(off, dst.len()) else { return false };
        // SAFETY: src .. src + dst.len() is inside the mapping (checked), which the Arc keeps alive; dst is a
        // distinct local buffer. The client may write the source concurrently: bytes, any value is valid.
        unsafe { copy_in(dst, src) };
        true
    }

    /// [`read`](Self::read) hashed as it is copied ([`crc::update_copy_shared`](crate::wire::crc::update_copy_shared)):
    /// the CRC of the bytes copied, continuing from `crc`; None, nothing copied, if the range is not inside or the
    /// CRC kernel does not take it (the caller reads, then hashes its copy).
    #[inline]
    pub fn read_hashing(&self, off: usize, dst: &mut [u8], crc: u32) -> Option<u32> {
        let src = self.at(off, dst.len())?;
        // SAFETY: as in `read`: the range is inside the mapping, which the Arc keeps alive for the call, and `dst`
        // is a distinct local buffer; the client may write the source meanwhile (each byte is read once, and the
        // CRC is that of the bytes copied).
        unsafe { crate::wire::crc::update_copy_shared(crc, src, dst) }
    }

    /// Copies `src` into the window at `off`; false (nothing copied) if the range is not inside.
    #[inline]
    pub fn write(&self, off: usize, src: &[u8]) -> bool {
        let Some(dst) = self.at(off, src.len()) else { return false };
        // SAFETY: as in `read`, with the roles swapped; nothing in this process holds a reference into the window.
        unsafe { copy_out(dst, src) };
        true
    }

    /// An 8-byte atomic at `off` (8-byte aligned inside the mapping): `f` maps the original little-endian value to
    /// the new one, applied with a compare-and-swap loop so a concurrent client atomic is not lost. Returns the
    /// original value, or `None` if the range is outside or misaligned.
    pub fn atomic(&self, off: usize, f: impl Fn(u64) -> u64) -> Option<u64> {
        let p = self.at(off, 8)?;
        if !(p as usize).is_multiple_of(8) {
            return None;
        }
        // SAFETY: in bounds and 8-byte aligned (checked); AtomicU64 has u64's layout, and the mapping lives as long
        // as the Arc. Other processes access it only through atomics or plain loads and stores of bytes.
        let cell = unsafe { &*p.cast::<core::sync::atomic::AtomicU64>() };
        let mut cur = cell.load(core::sync::atomic::Ordering::Acquire);
        loop {
            let new = u64::from_le(f(u64::from_le(cur))).to_le();
            match cell.compare_exchange_weak(
                cur,
                new,
                core::sync::atomic::Ordering::AcqRel,
                core::sync::atomic::Ordering::Acquire,
            ) {
                Ok(_) => return Some(u64::from_le(cur)),
                Err(seen) => cur = seen,
            }
        }
    }
}

/// Copies `dst.len()` bytes from `src` with the choice of `copy::copy_bytes`: the system memcpy, except for a
/// mid-sized block in glibc's slow `rep movsb` window (`copy::wants_chunked`), which goes in 64-byte chunks. (Until
/// session 6 every block of 2 KiB-512 KiB took the chunk loop: slower than memcpy outside that window.)
///
/// # Safety
/// `src .. src + dst.len()` is readable and does not overlap `dst`.
#[inline]
unsafe fn copy_in(dst: &mut [u8], src: *const u8) {
    let n = dst.len();
    if !crate::copy::wants_chunked(dst.as_ptr(), src, n) {
        // SAFETY: the caller's contract.
        unsafe { ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), n) };
        return;
    }
    let mut chunks = dst.chunks_exact_mut(64);
    let mut at = src;
    for c in &mut chunks {
        // SAFETY: at .. at + 64 is inside the caller's readable range (n - 64 * i >= 64 here).
        let v: [u8; 64] = unsafe { at.cast::<[u8; 64]>().read_unaligned() };
        c.copy_from_slice(&v);
        // No instruction: keeps LLVM from turning the loop back into the memcpy call it exists to avoid.
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        // SAFETY: stays within (or one past) the range.
        at = unsafe { at.add(64) };
    }
    let rest = chunks.into_remainder();
    // SAFETY: the last `rest.len()` bytes of the caller's range.
    unsafe { ptr::copy_nonoverlapping(at, rest.as_mut_ptr(), rest.len()) };
}

/// Copies `src` to `dst` (the chunking of [`copy_in`]).
///
/// # Safety
/// `dst .. dst + src.len()` is writable and does not overlap `src`.
#[inline]
unsafe fn copy_out(dst: *mut u8, src: &[u8]) {
    let n = src.len();
    if !crate::copy::wants_chunked(dst, src.as_ptr(), n) {
        // SAFETY: the caller's contract.
        unsafe { ptr::copy_nonoverlapping(src.as_ptr(), dst, n) };
        return;
    }
    let mut chunks = src.chunks_exact(64);
    let mut at = dst;
    for c in &mut chunks {
        let v: [u8; 64] = c.try_into().expect("64-byte chunk");
        // SAFETY: at .. at + 64 is inside the caller's writable range.
        unsafe { at.cast::<[u8; 64]>().write_unaligned(v) };
        core::sync::atomic::compiler_fence(core::sync::atomic::Ordering::SeqCst);
        // SAFETY: stays within (or one past) the range.
        at = unsafe { at.add(64) };
    }
    let rest = chunks.remainder();
    // SAFETY: the last `rest.len()` bytes of the caller's range.
    unsafe { ptr::copy_nonoverlapping(rest.as_ptr(), at, rest.len()) };
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
        // Out of the SIGBUS guard's registry before the address range can be reused.
        drop(self.guard.take());
        // SAFETY: the mapping was made by `mmap` with this length; every ring half and table view holds an Arc of
        // the region (or promised, in their unsafe constructors, not to outlive it), so nothing uses it any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

impl fmt::Debug for ShmRegion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShmRegion").field("fd", &self.fd.as_raw_fd()).field("len", &self.len).finish()
    }
}

/// Queue sizes of a QP region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpRegionCaps {
    /// Send queue depth (rounded up to a power of two).
    pub sq_depth: u32,
    /// Receive queue depth (rounded up to a power of two).
    pub rq_depth: u32,
    /// SGEs per send WQE (at most 32).
    pub max_send_sge: u8,
    /// SGEs per receive WQE (at most 32).
    pub max_recv_sge: u8,
    /// Inline bytes per send WQE.
    pub max_inline: u32,
}

/// Creates a sealed region laid out by `header` and writes the header into it.
fn create_region(name: &str, header: &RegionHeader, backing: Backing) -> Result<Arc<ShmRegion>, ShmError> {
    let mut region = ShmRegion::create(name, header.region_len as usize, backing)?;
    region.write(0, *header).ok_or(ShmError::BadSize(region.len()))?;
    Ok(Arc::new(region))
}

/// Maps a region from the daemon and checks its header (client side).
fn open_region(fd: OwnedFd, kind: u32) -> Result<(Arc<ShmRegion>, RegionHeader), ShmError> {
    let region = ShmRegion::map(fd)?;
    let header: RegionHeader = region.read(0).ok_or(ShmError::BadSize(region.len()))?;
    header.check(kind, region.len())?;
    Ok((Arc::new(region), header))
}

fn limits(h: &RegionHeader) -> WqeLimits {
    // per_slot of the SGE table is max_send_sge - 1 <= 31 (checked by RegionHeader::check on the client, made by
    // RegionHeader::qp on the daemon).
    WqeLimits { max_sge: (h.sq_sges.per_slot + 1).min(abi::MAX_WQE_SGE as u32) as u8, max_inline: h.sq_inline.per_slot }
}

fn recv_max_sge(h: &RegionHeader) -> u8 {
    (h.rq_sges.per_slot + 1).min(abi::MAX_WQE_SGE as u32) as u8
}

/// A side table if the layout has one.
///
/// # Safety
/// As [`ShmRegion::table`].
unsafe fn opt_table<T: Pod>(r: &Arc<ShmRegion>, d: TableDesc, cap: u32) -> Result<Option<SlotTable<T>>, ShmError> {
    if d.per_slot == 0 {
        return Ok(None);
    }
    // SAFETY: forwarded contract.
    Ok(Some(unsafe { r.table(d, cap)? }))
}

/// The daemon's side of a QP's shared region: readers of its send and receive queues. The daemon keeps `header`
/// (its own copy: the one in shared memory is the client's to scribble on).
pub struct DaemonQpRegion {
    /// The layout, as the daemon made it.
    pub header: RegionHeader,
    /// Send queue reader.
    pub sq: SendQueueReader,
    /// Receive queue reader.
    pub rq: RecvQueueReader,
    region: Arc<ShmRegion>,
}

impl DaemonQpRegion {
    /// Creates the region (sealed memfd named `name`) and attaches the readers.
    pub fn create(name: &str, caps: QpRegionCaps, backing: Backing) -> Result<DaemonQpRegion, ShmError> {
        let h = RegionHeader::qp(caps.sq_depth, caps.rq_depth, caps.max_send_sge, caps.max_recv_sge, caps.max_inline)?;
        let r = create_region(name, &h, backing)?;
        // SAFETY: the region was created by this call and nobody else in this process has it, so these are the
        // only consumer halves and table views; the producer side belongs to the client process.
        let (sq, rq) = unsafe {
            let sq = SendQueueReader::new(
                r.consumer(h.sq)?,
                opt_table(&r, h.sq_sges, h.sq.capacity)?,
                opt_table(&r, h.sq_inline, h.sq.capacity)?,
                limits(&h),
            )?;
            let rq =
                RecvQueueReader::new(r.consumer(h.rq)?, opt_table(&r, h.rq_sges, h.rq.capacity)?, recv_max_sge(&h))?;
            (sq, rq)
        };
        Ok(DaemonQpRegion { header: h, sq, rq, region: r })
    }

    /// The region's memfd, to send to the client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }
}

/// The client's side of a QP's shared region: writers of its send and receive queues.
pub struct ClientQpRegion {
    /// The layout, as checked at open.
    pub header: RegionHeader,
    /// Send queue writer.
    pub sq: SendQueueWriter,
    /// Receive queue writer.
    pub rq: RecvQueueWriter,
}

impl ClientQpRegion {
    /// Maps the QP region the daemon sent, checks its header (magic, ABI version, geometry) and attaches writers.
    ///
    /// # Safety
    /// No other `ClientQpRegion` of this QP exists in this process (each ring has one producer).
    pub unsafe fn open(fd: OwnedFd) -> Result<ClientQpRegion, ShmError> {
        let (r, h) = open_region(fd, region_kind::QP)?;
        // SAFETY: the header passed `check` (every ring and table inside the mapping); producer uniqueness is the
        // caller's promise.
        let (sq, rq) = unsafe {
            let sq = SendQueueWriter::new(
                r.producer(h.sq)?,
                opt_table(&r, h.sq_sges, h.sq.capacity)?,
                opt_table(&r, h.sq_inline, h.sq.capacity)?,
                limits(&h),
            )?;
            let rq =
                RecvQueueWriter::new(r.producer(h.rq)?, opt_table(&r, h.rq_sges, h.rq.capacity)?, recv_max_sge(&h))?;
            (sq, rq)
        };
        Ok(ClientQpRegion { header: h, sq, rq })
    }
}

/// The daemon's side of a CQ's shared region: the completion ring's producer.
pub struct DaemonCqRegion {
    /// The layout, as the daemon made it.
    pub header: RegionHeader,
    /// Completion ring (push [`abi::Cqe`]s, then publish).
    pub cq: Producer<abi::Cqe>,
    /// The notification block (the client's arm word is hostile input).
    pub notify: NotifyView,
    region: Arc<ShmRegion>,
}

impl DaemonCqRegion {
    /// Creates the region and attaches the producer.
    pub fn create(name: &str, depth: u32, backing: Backing) -> Result<DaemonCqRegion, ShmError> {
        let h = RegionHeader::cq(depth)?;
        let r = create_region(name, &h, backing)?;
        // SAFETY: fresh region created by this call: the only producer in this process.
        let cq = unsafe { r.producer(h.sq)? };
        let notify = r.notify(h.notify)?;
        Ok(DaemonCqRegion { header: h, cq, notify, region: r })
    }

    /// The region's memfd, to send to the client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.region.fd()
    }
}

/// The client's side of a CQ's shared region.
pub struct ClientCqRegion {
    /// The layout, as checked at open.
    pub header: RegionHeader,
    /// Completion reader.
    pub cq: CqReader,
    /// The notification block (arm word ours, `fired` the daemon's).
    pub notify: NotifyView,
}

impl ClientCqRegion {
    /// Maps the CQ region the daemon sent, checks its header and attaches the reader.
    ///
    /// # Safety
    /// No other `ClientCqRegion` of this CQ exists in this process (the ring has one consumer).
    pub unsafe fn open(fd: OwnedFd) -> Result<ClientCqRegion, ShmError> {
        let (r, h) = open_region(fd, region_kind::CQ)?;
        // SAFETY: header checked; consumer uniqueness is the caller's promise.
        let cq = CqReader::new(unsafe { r.consumer(h.sq)? });
        let notify = r.notify(h.notify)?;
        Ok(ClientCqRegion { header: h, cq, notify })
    }
}

/// Makes `fd` survive `exec` in the child `cmd` spawns: FD_CLOEXEC is cleared in the child only, between fork and
/// exec, so other children of this process do not inherit it. Returns the descriptor number the child sees. `fd`
/// must stay open until `cmd` is spawned.
pub fn inherit_fd(cmd: &mut Command, fd: BorrowedFd<'_>) -> RawFd {
    let fd = fd.as_raw_fd();
    // SAFETY: the closure runs in the forked child before exec; it only calls fcntl, which is async-signal-safe,
    // allocates nothing and takes no locks.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    };
    fd
}

/// Descriptors this process holds on memfds called `name` (from /proc/self/fd; 0 if it cannot be read): a leak
/// check for tests and statistics.
pub fn open_memfds(name: &str) -> usize {
    let want = format!("/memfd:{name} (deleted)");
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else { return 0 };
    dir.filter_map(|e| std::fs::read_link(e.ok()?.path()).ok()).filter(|t| t.to_str() == Some(want.as_str())).count()
}

/// Without blocking: `true` if `sock` has data to read or the peer closed it (end of stream or an error),
/// `false` if nothing is waiting. One `recv(MSG_PEEK | MSG_DONTWAIT)`; nothing is consumed.
pub fn readable_or_closed(sock: &UnixStream) -> bool {
    let mut b = 0u8;
    // SAFETY: b is a valid one-byte buffer for the call; MSG_PEEK leaves the data in the socket.
    let n = unsafe { libc::recv(sock.as_raw_fd(), (&mut b as *mut u8).cast(), 1, libc::MSG_PEEK | libc::MSG_DONTWAIT) };
    n >= 0 || !matches!(errno(), libc::EAGAIN | libc::EINTR)
}

/// A completion channel's socket pair (`AF_UNIX`, `SOCK_SEQPACKET`, both non-blocking): the daemon's end, which it
/// only ever sends on ([`channel_signal`]; its read side is shut, so the client cannot queue anything there), and
/// the client's end, which becomes readable when the daemon signals and reports end-of-stream when the daemon's
/// end closes (the daemon died, or reclaimed the session).
pub fn channel_pair() -> Result<(OwnedFd, OwnedFd), ShmError> {
    let mut fds = [0 as libc::c_int; 2];
    let ty = libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK;
    // SAFETY: fds is a valid two-element out-array for the call.
    if unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, fds.as_mut_ptr()) } != 0 {
        return Err(os("socketpair"));
    }
    // SAFETY: socketpair returned two fresh descriptors that nothing else owns.
    let (daemon, client) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // SAFETY: plain syscall on our descriptor.
    if unsafe { libc::shutdown(daemon.as_raw_fd(), libc::SHUT_RD) } != 0 {
        return Err(os("shutdown(SHUT_RD)"));
    }
    Ok((daemon, client))
}

/// Signals a completion channel (daemon side): one 1-byte message, `MSG_DONTWAIT | MSG_NOSIGNAL`, so no state of
/// the peer's end (a full queue, a closed end, any flag the client set on its own descriptor) can make it block
/// or raise SIGPIPE. Returns whether the message was queued; a full queue still leaves the client's end readable.
pub fn channel_signal(fd: BorrowedFd<'_>) -> bool {
    let b = 1u8;
    // SAFETY: b is a valid one-byte buffer for the call.
    let n = unsafe { libc::send(fd.as_raw_fd(), (&b as *const u8).cast(), 1, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    n == 1
}

/// Consumes every message waiting on a channel's client end without blocking: how many there were, and whether
/// the daemon's end is closed (end of stream).
pub fn channel_drain(fd: BorrowedFd<'_>) -> Result<(usize, bool), ShmError> {
    channel_take(fd, usize::MAX)
}

/// Consumes at most `max` messages waiting on a channel's client end without blocking (after a wait that found
/// it readable, one `recv` instead of a second that only answers "nothing more"): how many it took, and whether the
/// daemon's end is closed.
pub fn channel_take(fd: BorrowedFd<'_>, max: usize) -> Result<(usize, bool), ShmError> {
    let mut n = 0;
    while n < max {
        let mut b = [0u8; 8];
        // SAFETY: b is a valid buffer of b.len() bytes for the call.
        let r = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), libc::MSG_DONTWAIT) };
        match r {
            0 => return Ok((n, true)),
            r if r > 0 => n += 1,
            _ => match errno() {
                libc::EAGAIN => return Ok((n, false)),
                libc::EINTR => {}
                libc::ECONNRESET | libc::EPIPE => return Ok((n, true)),
                _ => return Err(os("recv(completion channel)")),
            },
        }
    }
    Ok((n, false))
}

/// Waits until a channel's client end is readable or closed, at most `timeout` (`None`: no limit). Returns false
/// when the time ran out (or a signal interrupted the wait).
pub fn channel_wait(fd: BorrowedFd<'_>, timeout: Option<std::time::Duration>) -> Result<bool, ShmError> {
    let ms = match timeout {
        None => -1,
        // Round up so that a short timeout still sleeps.
        Some(t) => libc::c_int::try_from(t.as_micros().div_ceil(1000)).unwrap_or(libc::c_int::MAX),
    };
    let mut p = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    // SAFETY: p is one valid pollfd for the call.
    let r = unsafe { libc::poll(&mut p, 1, ms) };
    if r < 0 {
        return if errno() == libc::EINTR { Ok(false) } else { Err(os("poll(completion channel)")) };
    }
    Ok(r > 0)
}

/// Makes a channel's client end blocking (the pair is made non-blocking; the client end's reads that must not block
/// pass `MSG_DONTWAIT`), for [`channel_recv_wait`]: one `recv` both waits for and takes a wake-up.
pub fn channel_blocking(fd: BorrowedFd<'_>) -> Result<(), ShmError> {
    // SAFETY: plain fcntl calls on a descriptor we hold.
    let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) } < 0 {
        return Err(os("fcntl(completion channel)"));
    }
    Ok(())
}

/// What [`channel_recv_wait`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecvWait {
    /// It took one message.
    Took,
    /// Nothing came in time (or a signal interrupted the wait, or the end is non-blocking after all).
    Empty,
    /// The daemon's end is closed.
    Closed,
}

/// Waits at most `timeout` (`None`: no limit) for a message on a channel's client end made blocking by
/// [`channel_blocking`] and takes it: one `recv` with the socket's receive timeout instead of a `poll` and a
/// `recv` per wake-up. The timeout is rounded up to whole milliseconds (as `poll`'s was), so that a caller waiting
/// the rest of a fixed period (a little less each time) asks for the same one; `timeo_us` caches the one set on
/// the socket (microseconds + 1, 0: none set yet), which is set again only when it changes.
pub fn channel_recv_wait(
    fd: BorrowedFd<'_>,
    timeout: Option<std::time::Duration>,
    timeo_us: &std::sync::atomic::AtomicU64,
) -> Result<RecvWait, ShmError> {
    use std::sync::atomic::Ordering;
    // SO_RCVTIMEO's zero means no limit; a limit rounds up to whole milliseconds, at least one.
    let ms = |t: std::time::Duration| u64::try_from(t.as_micros().div_ceil(1000)).unwrap_or(u64::MAX / 1000);
    let us = timeout.map_or(0, |t| ms(t).clamp(1, u64::MAX / 1000) * 1000);
    if timeo_us.load(Ordering::Relaxed) != us.saturating_add(1) {
        let tv = libc::timeval {
            tv_sec: libc::time_t::try_from(us / 1_000_000).unwrap_or(libc::time_t::MAX),
            tv_usec: (us % 1_000_000) as libc::suseconds_t,
        };
        // SAFETY: tv is a valid timeval of the size passed.
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        if r != 0 {
            return Err(os("setsockopt(SO_RCVTIMEO, completion channel)"));
        }
        timeo_us.store(us.saturating_add(1), Ordering::Relaxed);
    }
    let mut b = [0u8; 8];
    // SAFETY: b is a valid buffer of b.len() bytes for the call.
    let r = unsafe { libc::recv(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len(), 0) };
    Ok(match r {
        0 => RecvWait::Closed,
        r if r > 0 => RecvWait::Took,
        _ => match errno() {
            libc::EAGAIN | libc::EINTR => RecvWait::Empty,
            libc::ECONNRESET | libc::EPIPE => RecvWait::Closed,
            _ => return Err(os("recv(completion channel)")),
        },
    })
}

/// The most descriptors one message may carry.
pub const MAX_FDS: usize = 8;

/// Control-message buffer, aligned for `cmsghdr`, large enough for [`MAX_FDS`] descriptors.
#[repr(C, align(8))]
struct CmsgBuf([u8; 64]);

const _: () = assert!(size_of::<libc::cmsghdr>() + MAX_FDS * size_of::<RawFd>() <= 64);

/// Sends `data` (at least one byte) with up to [`MAX_FDS`] descriptors in one `sendmsg` (SCM_RIGHTS).
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> Result<usize, ShmError> {
    if fds.len() > MAX_FDS {
        return Err(ShmError::Fds("more descriptors than MAX_FDS in one message"));
    }
    sendmsg_fds(sock, data, fds)
}

fn sendmsg_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> Result<usize, ShmError> {
    if data.is_empty() {
        return Err(ShmError::Fds("a message carrying descriptors needs at least one data byte"));
    }
    let mut iov = libc::iovec { iov_base: data.as_ptr().cast_mut().cast(), iov_len: data.len() };
    // Big enough for the test that sends more than MAX_FDS on purpose.
    let mut cbuf = [0u64; 32];
    // SAFETY: an all-zero msghdr is valid (no name, no iov, no control); the fields are set below.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        let payload = (fds.len() * size_of::<RawFd>()) as libc::c_uint;
        // SAFETY: pure arithmetic on the length.
        let (space, len) = unsafe { (libc::CMSG_SPACE(payload) as usize, libc::CMSG_LEN(payload) as usize) };
        if space > size_of_val(&cbuf) {
            return Err(ShmError::Fds("too many descriptors for the control buffer"));
        }
        msg.msg_control = cbuf.as_mut_ptr().cast();
        msg.msg_controllen = space as _;
        // SAFETY: msg_control points at `space` zeroed, 8-aligned bytes, so CMSG_FIRSTHDR returns its start (not
        // null) and CMSG_DATA .. + payload lies inside it; the descriptors are written unaligned-safe.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = len as _;
            let d = libc::CMSG_DATA(c).cast::<RawFd>();
            for (i, fd) in fds.iter().enumerate() {
                d.add(i).write_unaligned(fd.as_raw_fd());
            }
        }
    }
    // SAFETY: msg points at iov, data and cbuf, all alive for the call.
    let n = unsafe { libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(os("sendmsg"));
    }
    Ok(n as usize)
}

/// Receives into `buf` and appends the descriptors that came with the message to `fds` (close-on-exec set).
/// A message whose descriptors did not all fit (more than [`MAX_FDS`]) is an error and every descriptor of it is
/// closed: a peer cannot make this process leak descriptors. Returns the data bytes (0 at end of stream) and
/// whether descriptors of the message were lost because this process could not install them (its descriptor
/// table full: RLIMIT_NOFILE): the data is intact then, and only the descriptors are missing.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> Result<(usize, bool), ShmError> {
    let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
    let mut cbuf = CmsgBuf([0; 64]);
    // SAFETY: an all-zero msghdr is valid; the fields are set below.
    let mut msg: libc::msghdr = unsafe { core::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.0.as_mut_ptr().cast();
    msg.msg_controllen = size_of::<CmsgBuf>() as _;
    // SAFETY: msg points at iov (over buf) and cbuf, alive and writable for the call.
    let n = unsafe { libc::recvmsg(sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(os("recvmsg"));
    }
    // Take ownership of every descriptor the kernel installed before judging anything, so none can leak.
    let mut got = Vec::new();
    // SAFETY: the kernel filled msg_control/msg_controllen with well-formed control messages inside cbuf;
    // CMSG_FIRSTHDR/CMSG_NXTHDR walk them within msg_controllen, and each SCM_RIGHTS payload holds
    // (cmsg_len - CMSG_LEN(0)) / 4 descriptors that are now open in this process and owned by nobody else.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let bytes = ((*c).cmsg_len as usize).saturating_sub(libc::CMSG_LEN(0) as usize);
                let d = libc::CMSG_DATA(c).cast::<RawFd>();
                for i in 0..bytes / size_of::<RawFd>() {
                    got.push(OwnedFd::from_raw_fd(d.add(i).read_unaligned()));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    // The control buffer's room: a truncation with fewer descriptors than that was not for lack of room but
    // because the kernel could not install them here (EMFILE: it installs what it can and sets MSG_CTRUNC).
    // SAFETY: CMSG_LEN only computes a size.
    let room = (size_of::<CmsgBuf>() - unsafe { libc::CMSG_LEN(0) } as usize) / size_of::<RawFd>();
    let truncated = msg.msg_flags & libc::MSG_CTRUNC != 0;
    if got.len() > MAX_FDS || (truncated && got.len() >= room) {
        return Err(ShmError::Fds("the peer sent more descriptors than MAX_FDS; all of them were closed"));
    }
    if truncated {
        // The descriptors that did arrive belong to a message that cannot be served whole: close them.
        return Ok((n as usize, true));
    }
    fds.extend(got);
    Ok((n as usize, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctrl::abi::{region_kind, Cqe, RegionHeader};

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn create_is_zeroed_sealed_and_shared_between_mappings() {
        let mut a = ShmRegion::create("roce-dp-test", 10_000, Backing::Pages).unwrap();
        assert_eq!(a.len(), 12_288);
        assert_eq!(a.read::<u64>(8192), Some(0));
        assert_eq!(a.write(8192, 0x1122_3344_5566_7788u64), Some(()));
        // A second mapping of the same memfd (as the peer process would make) sees the write.
        let dup = a.fd().try_clone_to_owned().unwrap();
        let b = ShmRegion::map(dup).unwrap();
        assert_eq!(b.len(), a.len());
        assert_eq!(b.read::<u64>(8192), Some(0x1122_3344_5566_7788));
        assert_eq!(b.read::<u64>(a.len() - 4), None, "out of bounds");
        assert_eq!(b.read::<u64>(3), None, "misaligned");
        // The seals hold: nobody can shrink (SIGBUS for the other side) or grow it.
        // SAFETY: plain syscalls on a descriptor we own.
        unsafe {
            assert_eq!(libc::ftruncate(b.fd().as_raw_fd(), 4096), -1);
            assert_eq!(errno(), libc::EPERM);
            assert_eq!(libc::ftruncate(b.fd().as_raw_fd(), 1 << 20), -1);
            assert_eq!(errno(), libc::EPERM);
            assert_eq!(libc::fcntl(b.fd().as_raw_fd(), libc::F_GET_SEALS), SEALS);
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn map_window_maps_the_windows_pages_at_their_file_offset() {
        // A 1 MiB sealed region with a known byte at every offset; windows at unaligned offsets, at the end, and
        // of length 0 read what the file holds there, and writes land at the same file offsets.
        let r = ShmRegion::create("window-test", 1 << 20, Backing::Pages).unwrap();
        let file = std::fs::File::from(r.fd().try_clone_to_owned().unwrap());
        let bytes: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
        std::os::unix::fs::FileExt::write_all_at(&file, &bytes, 0).unwrap();
        for (off, len) in [(0u64, 4096u64), (6000, 5000), (4095, 2), ((1 << 20) - 7, 7), (8192, 0), (12345, 0)] {
            let fd = r.fd().try_clone_to_owned().unwrap();
            let (m, at) = ShmRegion::map_window(fd, off, len).unwrap().unwrap();
            assert!(m.len() <= (len as usize).next_multiple_of(4096) + 4096, "{off} {len}: {} mapped", m.len());
            let w = Arc::new(m).window(at, len as usize).expect("the window fits its mapping");
            let mut got = vec![0u8; len as usize];
            assert!(w.read(0, &mut got));
            assert_eq!(got, bytes[off as usize..(off + len) as usize], "{off} {len}");
            if len > 0 {
                assert!(w.write(len as usize - 1, &[0xee]));
                let mut b = [0u8];
                std::os::unix::fs::FileExt::read_exact_at(&file, &mut b, off + len - 1).unwrap();
                assert_eq!(b[0], 0xee, "{off} {len}");
                std::os::unix::fs::FileExt::write_all_at(&file, &bytes[(off + len - 1) as usize..][..1], off + len - 1)
                    .unwrap();
            }
        }
        for (off, len) in [(0u64, (1 << 20) + 1), (1 << 20, 1), (u64::MAX, 2)] {
            let fd = r.fd().try_clone_to_owned().unwrap();
            assert_eq!(ShmRegion::map_window(fd, off, len).unwrap().err(), Some(1 << 20), "{off} {len}");
        }
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn map_refuses_unsealed_descriptors() {
        // An ordinary file: cannot carry seals at all.
        let f = std::fs::File::open("/proc/self/exe").unwrap();
        assert_eq!(ShmRegion::map(OwnedFd::from(f)).unwrap_err(), ShmError::NotSealed { seals: -1 });
        // A memfd without seals (what a hostile client might send).
        let name = CString::new("unsealed").unwrap();
        // SAFETY: name is NUL-terminated.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        assert!(raw >= 0);
        // SAFETY: fresh descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: plain syscall on our descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        let e = ShmRegion::map(fd).unwrap_err();
        assert_eq!(e, ShmError::NotSealed { seals: 0 });
        assert!(e.to_string().contains("refusing"));
        assert_eq!(ShmRegion::create("x", 0, Backing::Pages).unwrap_err(), ShmError::BadSize(0));
        assert!(matches!(ShmRegion::open_inherited(999_999), Err(ShmError::Os { .. })));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn regions_travel_over_a_unix_socket() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut r1 = ShmRegion::create("roce-dp-pass1", 4096, Backing::Pages).unwrap();
        let r2 = ShmRegion::create("roce-dp-pass2", 8192, Backing::Pages).unwrap();
        r1.write(64, 0xfeed_u64).unwrap();
        assert_eq!(send_with_fds(&a, b"qp", &[r1.fd(), r2.fd()]), Ok(2));
        let mut buf = [0u8; 16];
        let mut fds = Vec::new();
        assert_eq!(recv_with_fds(&b, &mut buf, &mut fds), Ok((2, false)));
        assert_eq!(&buf[..2], b"qp");
        assert_eq!(fds.len(), 2);
        let m2 = ShmRegion::map(fds.pop().unwrap()).unwrap();
        let m1 = ShmRegion::map(fds.pop().unwrap()).unwrap();
        assert_eq!((m1.len(), m2.len()), (4096, 8192));
        assert_eq!(m1.read::<u64>(64), Some(0xfeed));
        // Plain data without descriptors.
        assert_eq!(send_with_fds(&a, b"x", &[]), Ok(1));
        assert_eq!(recv_with_fds(&b, &mut buf, &mut fds), Ok((1, false)));
        assert!(fds.is_empty());
        let nine: Vec<_> = (0..9).map(|_| r1.fd()).collect();
        assert!(matches!(send_with_fds(&a, b"x", &nine), Err(ShmError::Fds(_))));
        assert!(matches!(send_with_fds(&a, b"", &[r1.fd()]), Err(ShmError::Fds(_))));
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn a_flood_of_descriptors_is_refused_and_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        let r = ShmRegion::create("roce-dp-flood", 4096, Backing::Pages).unwrap();
        assert_eq!(open_memfds("roce-dp-flood"), 1);
        let many: Vec<_> = (0..20).map(|_| r.fd()).collect();
        assert_eq!(sendmsg_fds(&a, b"flood", &many), Ok(5));
        let mut fds = Vec::new();
        let e = recv_with_fds(&b, &mut [0u8; 8], &mut fds).unwrap_err();
        assert!(matches!(e, ShmError::Fds(_)), "{e}");
        assert!(fds.is_empty());
        assert_eq!(open_memfds("roce-dp-flood"), 1, "every received descriptor was closed");
    }

    const CAPS: QpRegionCaps =
        QpRegionCaps { sq_depth: 32, rq_depth: 16, max_send_sge: 4, max_recv_sge: 2, max_inline: 64 };

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn qp_and_cq_regions_daemon_and_client_sides() {
        use crate::verbs::{self, SendWr, WcOpcode, WcStatus, WrOpcode};
        let mut dq = DaemonQpRegion::create("roce-dp-qp", CAPS, Backing::Pages).unwrap();
        let mut dc = DaemonCqRegion::create("roce-dp-cqr", 8, Backing::Pages).unwrap();
        // SAFETY: one client side per region in this test.
        let (mut client_qp, mut client_cq) = unsafe {
            (
                ClientQpRegion::open(dq.fd().try_clone_to_owned().unwrap()).unwrap(),
                ClientCqRegion::open(dc.fd().try_clone_to_owned().unwrap()).unwrap(),
            )
        };
        assert_eq!(client_qp.header, dq.header);
        let sgl: Vec<verbs::Sge> = (0..4).map(|i| verbs::Sge { addr: i << 12, len: 10, lkey: 3 }).collect();
        client_qp.sq.post(&SendWr::new(1, WrOpcode::Send), &sgl).unwrap();
        client_qp.sq.post_inline(&SendWr::new(2, WrOpcode::Send), b"hello").unwrap();
        client_qp.rq.post(3, &sgl[..2]).unwrap();
        let mut inline = [0u8; 64];
        let a = dq.sq.poll(&mut inline).unwrap().unwrap();
        assert_eq!((a.wr.wr_id, a.sges.as_slice()), (1, &sgl[..]));
        let b = dq.sq.poll(&mut inline).unwrap().unwrap();
        assert_eq!((b.wr.wr_id, &inline[..b.inline_len as usize]), (2, &b"hello"[..]));
        let (id, r) = dq.rq.poll().unwrap().unwrap();
        assert_eq!((id, r.as_slice()), (3, &sgl[..2]));
        let done = verbs::Cqe {
            wr_id: 1,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            qpn: 7,
            byte_len: 40,
            imm: None,
            invalidated_rkey: None,
            solicited: false,
        };
        dc.cq.push_publish(abi::Cqe::from(&done)).unwrap();
        let mut out = [done; 2];
        assert_eq!(client_cq.cq.poll(&mut out), Ok(1));
        assert_eq!(out[0], done);
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn client_refuses_foreign_abi_and_wrong_kind() {
        let dq = DaemonQpRegion::create("roce-dp-qp-abi", CAPS, Backing::Pages).unwrap();
        // A daemon of another ABI version: simulated by rewriting the version in a copy of the region's header.
        let mut other = ShmRegion::map(dq.fd().try_clone_to_owned().unwrap()).unwrap();
        other.write(8, 99u32).unwrap();
        // SAFETY: the open fails before attaching anything.
        let e = unsafe { ClientQpRegion::open(dq.fd().try_clone_to_owned().unwrap()) }.err().unwrap();
        assert_eq!(e, ShmError::Abi(AbiError::Version { daemon: 99, library: abi::ABI_VERSION }));
        let msg = e.to_string();
        assert!(msg.contains("v99") && msg.contains("rebuild") && !msg.contains('\n'), "{msg}");
        let dc = DaemonCqRegion::create("roce-dp-cq-kind", 8, Backing::Pages).unwrap();
        // SAFETY: the open fails before attaching anything.
        let e = unsafe { ClientQpRegion::open(dc.fd().try_clone_to_owned().unwrap()) }.err().unwrap();
        assert!(matches!(e, ShmError::Abi(AbiError::Kind { .. })), "{e}");
    }

    /// An unsealed memfd of `pages` 4 KiB pages, for making faults (a peer's region is always sealed).
    fn unsealed(pages: usize) -> OwnedFd {
        // SAFETY: the name is NUL-terminated; the descriptor is fresh and ours.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"roce-dp-sigbus".as_ptr(), libc::MFD_CLOEXEC)) };
        // SAFETY: plain syscall on our descriptor.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), (pages * 4096) as libc::off_t) }, 0);
        fd
    }

    /// The SIGBUS guard (sigbus.rs): a fault in a registered mapping reads zeros and is reported to the mapping's
    /// owner; the rest of the mapping is still the file's. A file truncated under a mapping is the simplest fault to
    /// make; the hole in a hugetlbfs region the guard exists for is tests/audit_sigbus.rs.
    #[test]
    #[cfg_attr(miri, ignore = "memfd, mmap and signals are system calls Miri does not emulate")]
    fn a_fault_in_a_guarded_mapping_reads_zeros_and_is_reported() {
        use crate::ctrl::sigbus;
        sigbus::install().unwrap();
        sigbus::set_owner(4242);
        let fd = unsealed(3);
        let mut r = ShmRegion::mmap(fd.try_clone().unwrap(), 3 * 4096, 4096).unwrap();
        sigbus::set_owner(0);
        assert!(r.guard.is_some(), "registered");
        assert_eq!(r.write(0, 0x1111u64), Some(()));
        assert_eq!(r.write(4096, 0x2222u64), Some(()));
        assert!(!r.poisoned());
        let before = sigbus::poisoned_count();
        // SAFETY: plain syscall on our descriptor: pages 1 and 2 of the mapping are now past the file's end.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 4096) }, 0);
        assert_eq!(r.read::<u64>(4096), Some(0), "the vanished page reads zeros");
        assert!(r.poisoned());
        assert_eq!(sigbus::poisoned_count(), before + 1);
        assert_eq!(r.read::<u64>(0), Some(0x1111), "the page still in the file is the file's");
        assert_eq!(r.write(8192, 7u64), Some(()), "a write into another vanished page");
        assert_eq!(r.read::<u64>(8192), Some(7));
        assert_eq!(sigbus::poisoned_count(), before + 2);
        assert!(sigbus::take_poisoned().contains(&4242), "reported to its owner");
        assert!(!sigbus::take_poisoned().contains(&4242), "once");
        drop(r);
    }

    /// A SIGBUS outside every registered mapping is not swallowed: the process dies of it as without the guard
    /// (checked in a child: this test binary run again for this test alone).
    #[test]
    #[cfg_attr(miri, ignore = "memfd, mmap and signals are system calls Miri does not emulate")]
    fn a_fault_outside_guarded_mappings_still_kills_the_process() {
        use std::os::unix::process::ExitStatusExt;
        const NAME: &str = "ctrl::shm::tests::a_fault_outside_guarded_mappings_still_kills_the_process";
        if std::env::var_os("ROCE_DP_SIGBUS_CHILD").is_some() {
            crate::ctrl::sigbus::install().unwrap();
            let fd = unsealed(2);
            // SAFETY: a fresh shared mapping of our descriptor, not registered with the guard.
            let p = unsafe { libc::mmap(ptr::null_mut(), 8192, libc::PROT_READ, libc::MAP_SHARED, fd.as_raw_fd(), 0) };
            assert_ne!(p, libc::MAP_FAILED);
            // SAFETY: plain syscall on our descriptor.
            assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), 0) }, 0);
            // SAFETY: inside the mapping; past the file's end, so this is the SIGBUS under test.
            let v = unsafe { ptr::read_volatile(p.cast::<u64>()) };
            println!("survived the fault, read {v}");
            std::process::exit(0);
        }
        let out = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", NAME, "--test-threads", "1", "--nocapture"])
            .env("ROCE_DP_SIGBUS_CHILD", "1")
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.signal(), Some(libc::SIGBUS), "{:?}: {said}", out.status);
        assert!(!said.contains("survived"), "{said}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn hugetlb_works_or_says_why() {
        let free = hugepages_available();
        let r = ShmRegion::create("roce-dp-huge", 1 << 20, Backing::Hugetlb);
        if free >= 1 {
            let r = r.unwrap();
            assert_eq!(r.len(), HUGEPAGE_SIZE);
        } else {
            let e = r.unwrap_err();
            assert!(matches!(e, ShmError::NoHugepages { bytes: HUGEPAGE_SIZE, .. }), "{e}");
            assert!(e.to_string().contains("setup.sh --hugepages N"), "{e}");
        }
        // More pages than the pool has free (the pool may grow meanwhile; it will not grow by a thousand pages).
        let want = (free as usize + 1000) * HUGEPAGE_SIZE;
        let e = ShmRegion::create("roce-dp-huge-big", want, Backing::Hugetlb)
            .map(|_| ())
            .expect_err("a region beyond the pool");
        assert!(matches!(e, ShmError::NoHugepages { bytes, .. } if bytes == want), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("hugepages") && msg.contains("nr_hugepages") && !msg.contains('\n'), "{msg}");
    }

    #[test]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn rings_from_a_header_layout() {
        let h = RegionHeader::cq(64).unwrap();
        let mut region = ShmRegion::create("roce-dp-cq", h.region_len as usize, Backing::Pages).unwrap();
        region.write(0, h).unwrap();
        let region = Arc::new(region);
        assert_eq!(region.read::<RegionHeader>(0).unwrap().check(region_kind::CQ, region.len()), Ok(()));
        // SAFETY: one producer and one consumer of this ring.
        let (mut p, mut c) = unsafe { (region.producer::<Cqe>(h.sq).unwrap(), region.consumer::<Cqe>(h.sq).unwrap()) };
        drop(region); // the halves keep the mapping alive
        let cqe = Cqe { wr_id: 5, qpn: 9, ..Cqe::default() };
        p.push_publish(cqe).unwrap();
        assert_eq!(c.pop(), Ok(Some(cqe)));
        // Descriptors are checked against the region: a ring past its end and a wrong entry type are refused.
        let r2 = Arc::new(ShmRegion::create("roce-dp-small", 4096, Backing::Pages).unwrap());
        let big = RegionHeader::cq(256).unwrap().sq;
        // SAFETY: the attach fails before any access.
        let e = unsafe { r2.consumer::<Cqe>(big) }.err();
        assert_eq!(e, Some(ShmError::OutOfRange { offset: 128, len: 4096 }), "ring larger than the region");
        // SAFETY: as above.
        assert!(unsafe { r2.consumer::<u64>(RingDesc { offset: 128, capacity: 4, entry_size: 32 }) }.is_err());
    }
}
