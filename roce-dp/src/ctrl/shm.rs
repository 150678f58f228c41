//! Shared memory regions: a sealed memfd mapped `MAP_SHARED`, unmapped on drop.
//!
//! The creating side ([`ShmRegion::create`]) sizes the memfd and seals it against shrinking and growing before
//! anyone else sees it; the other side ([`ShmRegion::map`]) refuses a descriptor without those seals. This matters
//! because the peer is not trusted: a peer that could `ftruncate` a region shorter would turn every access of ours
//! past the new end into SIGBUS. With the seals the size read by `fstat` at map time holds for the mapping's life.
//!
//! Descriptors travel to the other process by inheritance ([`ShmRegion::share_with_child`] plus
//! [`ShmRegion::open_inherited`]); the daemon will pass them over its Unix socket (SCM_RIGHTS) instead.
//!
//! Hugepage backing ([`Backing::Hugetlb`], `MFD_HUGETLB`) rounds the size up to 2 MiB and fails with
//! [`ShmError::NoHugepages`] when the kernel's pool has too few free pages.

#![allow(unsafe_code)]

use core::fmt;
use core::mem::size_of;
use core::ptr::{self, NonNull};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::sync::Arc;

use super::abi::{RingDesc, TableDesc};
use super::ring::{Consumer, LayoutError, Pod, Producer, SlotTable};

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
}

impl fmt::Display for ShmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ShmError::Os { op, errno } => write!(f, "{op}: {}", std::io::Error::from_raw_os_error(errno)),
            ShmError::NoHugepages { bytes } => write!(
                f,
                "no free hugepages for a {} MiB region: reserve some (echo N > /proc/sys/vm/nr_hugepages) or \
                 disable hugepage backing",
                bytes >> 20
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
        }
    }
}

impl std::error::Error for ShmError {}

impl From<LayoutError> for ShmError {
    fn from(e: LayoutError) -> ShmError {
        ShmError::Layout(e)
    }
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
            flags |= libc::MFD_HUGETLB;
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
        Self::mmap(fd, size).map_err(|e| match e {
            ShmError::Os { errno: libc::ENOMEM, .. } if backing == Backing::Hugetlb => {
                ShmError::NoHugepages { bytes: size }
            }
            e => e,
        })
    }

    /// Maps a region received from the peer. Its size is `fstat`'s; it must carry the shrink and grow seals.
    pub fn map(fd: OwnedFd) -> Result<ShmRegion, ShmError> {
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
        let size = usize::try_from(st.st_size).map_err(|_| ShmError::BadSize(0))?;
        if size == 0 {
            return Err(ShmError::BadSize(0));
        }
        Self::mmap(fd, size)
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

    fn mmap(fd: OwnedFd, size: usize) -> Result<ShmRegion, ShmError> {
        // SAFETY: a fresh shared mapping of our descriptor at an address the kernel picks; nothing is aliased.
        let p = unsafe {
            libc::mmap(ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or(ShmError::Os { op: "mmap", errno: libc::EINVAL })?;
        Ok(ShmRegion { ptr, len: size, fd })
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

    /// Makes the region's descriptor survive `exec` in the child `cmd` spawns (FD_CLOEXEC is cleared in the child
    /// only, between fork and exec, so other children of this process do not inherit it). Returns the descriptor
    /// number the child sees.
    pub fn share_with_child(&self, cmd: &mut Command) -> RawFd {
        let fd = self.fd.as_raw_fd();
        // SAFETY: the closure runs in the forked child before exec; it only calls fcntl, which is
        // async-signal-safe, allocates nothing and takes no locks.
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

    fn ring_span<T: Pod>(&self, desc: RingDesc) -> Result<(NonNull<u8>, usize), ShmError> {
        if desc.entry_size as usize != size_of::<T>() {
            return Err(ShmError::OutOfRange { offset: desc.offset, len: self.len });
        }
        let bytes = super::ring::ring_bytes(desc.capacity, size_of::<T>()).ok_or(ShmError::BadSize(0))?;
        Ok((self.span(desc.offset, bytes)?, bytes))
    }
}

impl Drop for ShmRegion {
    fn drop(&mut self) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ctrl::abi::{region_kind, Cqe, RegionHeader};

    #[test]
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
    fn hugetlb_works_or_says_why() {
        let free: usize = std::fs::read_to_string("/proc/meminfo")
            .unwrap()
            .lines()
            .find_map(|l| l.strip_prefix("HugePages_Free:"))
            .map_or(0, |v| v.trim().parse().unwrap());
        let r = ShmRegion::create("roce-dp-huge", 1 << 20, Backing::Hugetlb);
        if free >= 1 {
            let r = r.unwrap();
            assert_eq!(r.len(), HUGEPAGE_SIZE);
        } else {
            let e = r.unwrap_err();
            assert_eq!(e, ShmError::NoHugepages { bytes: HUGEPAGE_SIZE }, "{e}");
            assert!(e.to_string().contains("nr_hugepages"));
        }
    }

    #[test]
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
