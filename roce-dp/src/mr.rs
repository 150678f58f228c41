//! Protection domains and memory regions.
//!
//! A memory region is a byte range the engine may read or write on behalf of local work requests (through its
//! lkey) or remote requests (through its rkey). Keys are `index << 8 | generation`, as rxe builds them: lookup is an
//! array index and a stale key (from a deregistered or re-registered slot) fails on its 8-bit generation. Every
//! access is bounds-checked against the region.
//!
//! A region's bytes are either owned by the engine (allocated once at registration, never per packet; applications
//! embedding the engine read and write them through [`MrTable::bytes`] / [`MrTable::bytes_mut`]) or live in a
//! client's shared memory ([`MrTable::register_shared`]: the daemon maps the client's memfd and copies in and out
//! through the bounds-checked [`ShmBytes`](crate::ctrl::shm::ShmBytes), so no `unsafe` is needed here). The owned
//! case stays a plain slice copy; the shared case is one branch away.

use crate::wire::PayloadCopy;
use core::fmt;

/// Access rights of a memory region (and of a QP for remote operations).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct AccessFlags(pub u32);

impl AccessFlags {
    /// No remote access; local read only.
    pub const NONE: AccessFlags = AccessFlags(0);
    /// The local HCA may write (receive buffers, READ and atomic result buffers).
    pub const LOCAL_WRITE: AccessFlags = AccessFlags(1);
    /// Remote RDMA WRITE.
    pub const REMOTE_WRITE: AccessFlags = AccessFlags(2);
    /// Remote RDMA READ.
    pub const REMOTE_READ: AccessFlags = AccessFlags(4);
    /// Remote atomics.
    pub const REMOTE_ATOMIC: AccessFlags = AccessFlags(8);
    /// Everything.
    pub const ALL: AccessFlags = AccessFlags(15);

    /// True if every right in `other` is granted.
    #[inline]
    pub const fn contains(self, other: AccessFlags) -> bool {
        self.0 & other.0 == other.0
    }
    /// Union.
    #[inline]
    pub const fn union(self, other: AccessFlags) -> AccessFlags {
        AccessFlags(self.0 | other.0)
    }
}

impl core::ops::BitOr for AccessFlags {
    type Output = AccessFlags;
    fn bitor(self, rhs: AccessFlags) -> AccessFlags {
        self.union(rhs)
    }
}

impl fmt::Debug for AccessFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (bit, name) in [(1, "LOCAL_WRITE"), (2, "REMOTE_WRITE"), (4, "REMOTE_READ"), (8, "REMOTE_ATOMIC")] {
            if self.0 & bit != 0 {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        if first {
            f.write_str("NONE")?;
        }
        Ok(())
    }
}

/// A protection domain handle.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Pd(pub u32);

/// Keys of a registered region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MrKeys {
    /// Local key (used in local SGEs).
    pub lkey: u32,
    /// Remote key (sent to the peer for RDMA/atomic access).
    pub rkey: u32,
}

/// Why an access to a region was refused. The engine turns these into NAKs (remote access) or completion errors
/// (local protection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessError {
    /// No live region has this key (never registered, deregistered, or invalidated).
    BadKey,
    /// The region belongs to another protection domain.
    WrongPd,
    /// The region does not grant the right asked for.
    NotPermitted,
    /// The range is not inside the region.
    OutOfBounds,
}

struct Mr {
    pd: Pd,
    va: u64,
    access: AccessFlags,
    /// False once invalidated (SEND_WITH_INV / local invalidate): the keys stop working but the slot stays until
    /// deregistration.
    valid: bool,
    key: u32,
    mem: Mem,
}

/// Where a region's bytes live.
enum Mem {
    /// Owned by the engine.
    Owned(Box<[u8]>),
    /// A window of a client's shared region (the daemon).
    #[cfg(target_os = "linux")]
    Shared(crate::ctrl::shm::ShmBytes),
}

impl Mem {
    #[inline]
    fn len(&self) -> usize {
        match self {
            Mem::Owned(b) => b.len(),
            #[cfg(target_os = "linux")]
            Mem::Shared(s) => s.len(),
        }
    }
}

/// All memory regions of an engine, indexed by key.
pub struct MrTable {
    slots: Vec<Option<Mr>>,
    /// Next generation per slot (the low 8 bits of the key).
    gens: Vec<u8>,
    free: Vec<u32>,
    max: usize,
}

/// A region of `len` bytes at `va` is within the limits (not over [`MAX_MR_LEN`], no address overflow).
fn fits(va: u64, len: usize) -> bool {
    range_refusal(va, len as u64).is_none()
}

/// Why a region of `len` bytes at `va` is outside the limits, for the user; `None` if it is within them.
pub fn range_refusal(va: u64, len: u64) -> Option<&'static str> {
    const _: () = assert!(MAX_MR_LEN == 1 << 32, "the message below names the limit");
    if len > MAX_MR_LEN {
        Some("region larger than 4 GiB, the most one region may hold (register several)")
    } else if va.checked_add(len).is_none() {
        Some("address + length of the region overflow 64 bits")
    } else {
        None
    }
}

/// Largest region accepted (the IBA maximum message is 2^31 bytes; a region may be larger but the engine keeps it
/// bounded so a bad request cannot make it allocate without limit).
pub const MAX_MR_LEN: u64 = 1 << 32;

impl MrTable {
    /// A table for up to `max` regions.
    pub fn new(max: usize) -> MrTable {
        MrTable { slots: Vec::new(), gens: Vec::new(), free: Vec::new(), max: max.min(1 << 24) }
    }

    /// Registers a zero-filled region of `len` bytes at virtual address `va`.
    pub fn register(&mut self, pd: Pd, va: u64, len: usize, access: AccessFlags) -> Option<MrKeys> {
        if !fits(va, len) {
            return None;
        }
        self.insert(pd, va, access, Mem::Owned(vec![0u8; len].into_boxed_slice()))
    }

    /// Registers a region whose bytes are `mem` (a window of a client's shared memory), at the client's virtual
    /// address `va`.
    #[cfg(target_os = "linux")]
    pub fn register_shared(
        &mut self,
        pd: Pd,
        va: u64,
        mem: crate::ctrl::shm::ShmBytes,
        access: AccessFlags,
    ) -> Option<MrKeys> {
        fits(va, mem.len()).then(|| self.insert(pd, va, access, Mem::Shared(mem)))?
    }

    /// Registers a shared region under a key another table chose (`index << 8 | generation`): the daemon's workers
    /// keep one region under the same key in each of their engines, so a client's lkey and rkey mean the same on
    /// every worker. `None` if the key's slot is taken or beyond the table's limit, or the range overflows.
    #[cfg(target_os = "linux")]
    pub fn register_shared_at(
        &mut self,
        key: u32,
        pd: Pd,
        va: u64,
        mem: crate::ctrl::shm::ShmBytes,
        access: AccessFlags,
    ) -> Option<MrKeys> {
        let idx = key >> 8;
        let i = idx as usize;
        if i >= self.max || !fits(va, mem.len()) {
            return None;
        }
        while self.slots.len() <= i {
            // Slots skipped on the way are free for this table's own registrations.
            self.free.push(self.slots.len() as u32);
            self.slots.push(None);
            self.gens.push(1);
        }
        if self.slots[i].is_some() {
            return None;
        }
        self.free.retain(|&f| f != idx);
        self.gens[i] = (key as u8).wrapping_add(1);
        self.slots[i] = Some(Mr { pd, va, access, valid: true, key, mem: Mem::Shared(mem) });
        Some(MrKeys { lkey: key, rkey: key })
    }

    fn insert(&mut self, pd: Pd, va: u64, access: AccessFlags, mem: Mem) -> Option<MrKeys> {
        let idx = match self.free.pop() {
            Some(i) => i,
            None => {
                if self.slots.len() >= self.max {
                    return None;
                }
                self.slots.push(None);
                self.gens.push(1);
                (self.slots.len() - 1) as u32
            }
        };
        let i = idx as usize;
        let gen = self.gens[i];
        self.gens[i] = gen.wrapping_add(1);
        let key = (idx << 8) | u32::from(gen);
        self.slots[i] = Some(Mr { pd, va, access, valid: true, key, mem });
        Some(MrKeys { lkey: key, rkey: key })
    }

    /// Deregisters the region with this key. Returns false if there was none.
    pub fn deregister(&mut self, key: u32) -> bool {
        let i = (key >> 8) as usize;
        match self.slots.get(i) {
            Some(Some(mr)) if mr.key == key => {
                self.slots[i] = None;
                self.free.push(i as u32);
                true
            }
            _ => false,
        }
    }

    /// Invalidates a region's keys (remote invalidate / local invalidate) if it belongs to `pd`.
    pub fn invalidate(&mut self, key: u32, pd: Pd) -> Result<(), AccessError> {
        let mr = self.lookup_mut(key)?;
        if mr.pd != pd {
            return Err(AccessError::WrongPd);
        }
        mr.valid = false;
        Ok(())
    }

    /// Invalidates a region's keys on a peer's request (SEND with Invalidate): as [`MrTable::invalidate`], and the
    /// region must grant some remote right. A region registered for local use only has no rkey a peer could hold
    /// (keys are guessable `index << 8 | generation` values), so a peer cannot revoke it.
    pub fn invalidate_remote(&mut self, key: u32, pd: Pd) -> Result<(), AccessError> {
        let remote = AccessFlags::REMOTE_READ.0 | AccessFlags::REMOTE_WRITE.0 | AccessFlags::REMOTE_ATOMIC.0;
        if self.lookup(key)?.access.0 & remote == 0 {
            return Err(AccessError::NotPermitted);
        }
        self.invalidate(key, pd)
    }

    #[inline]
    fn lookup(&self, key: u32) -> Result<&Mr, AccessError> {
        match self.slots.get((key >> 8) as usize) {
            Some(Some(mr)) if mr.key == key && mr.valid => Ok(mr),
            _ => Err(AccessError::BadKey),
        }
    }

    #[inline]
    fn lookup_mut(&mut self, key: u32) -> Result<&mut Mr, AccessError> {
        match self.slots.get_mut((key >> 8) as usize) {
            Some(Some(mr)) if mr.key == key && mr.valid => Ok(mr),
            _ => Err(AccessError::BadKey),
        }
    }

    /// Checks that `[va, va + len)` lies in the region `key` of `pd` with rights `need`; returns the offset of `va`
    /// inside the region.
    #[inline]
    pub fn check(&self, key: u32, pd: Pd, va: u64, len: u64, need: AccessFlags) -> Result<usize, AccessError> {
        let mr = self.lookup(key)?;
        check_mr(mr, pd, va, len, need)
    }

    /// [`check`](Self::check) that gives, for a read of the range, where its bytes are: the checks made once for
    /// a range read whole right after (a packet's payload), [`read_span`](Self::read_span) not repeating them.
    #[inline(always)]
    pub(crate) fn check_span(
        &self,
        key: u32,
        pd: Pd,
        va: u64,
        len: u64,
        need: AccessFlags,
    ) -> Result<MrSpan, AccessError> {
        let off = check_mr(self.lookup(key)?, pd, va, len, need)?;
        Ok(MrSpan { slot: key >> 8, off })
    }

    /// Copies `dst.len()` bytes from where [`check_span`](Self::check_span) found the range (its length at most the
    /// range's). The span comes from a check made in the same call of the engine, with the table unchanged since:
    /// the key, PD, rights and range are not checked again; the copy stays bounded by the region's bytes.
    #[inline(always)]
    pub(crate) fn read_span(&self, span: MrSpan, dst: &mut [u8], copy: &mut PayloadCopy) -> Result<(), AccessError> {
        match self.slots.get(span.slot as usize) {
            Some(Some(mr)) => mem_read(&mr.mem, span.off, dst, copy),
            _ => Err(AccessError::BadKey),
        }
    }

    /// Copies `dst.len()` bytes out of the region at `va` (local or remote read).
    #[inline(always)]
    pub fn read(&self, key: u32, pd: Pd, va: u64, dst: &mut [u8], need: AccessFlags) -> Result<(), AccessError> {
        self.read_copy(key, pd, va, dst, need, &mut PayloadCopy::plain())
    }

    /// [`read`](Self::read) into a frame's payload, copied through `copy` (hashed as it is copied when the frame's
    /// emitter asks for it).
    #[inline(always)]
    pub(crate) fn read_copy(
        &self,
        key: u32,
        pd: Pd,
        va: u64,
        dst: &mut [u8],
        need: AccessFlags,
        copy: &mut PayloadCopy,
    ) -> Result<(), AccessError> {
        let mr = self.lookup(key)?;
        let off = check_start(mr, pd, va, need)?;
        // The end of the range is checked by the access itself, once: the slice `get`s (owned) or `ShmBytes::read`
        // (shared) refuse `off + len` past the region's length, which is check_mr's `va + len <= mr.va + len`.
        mem_read(&mr.mem, off, dst, copy)
    }

    /// Copies `src` into the region at `va`.
    #[inline(always)]
    pub fn write(&mut self, key: u32, pd: Pd, va: u64, src: &[u8], need: AccessFlags) -> Result<(), AccessError> {
        let mr = self.lookup_mut(key)?;
        let off = check_start(mr, pd, va, need)?;
        // The end of the range: checked once, by the access (as in `read`).
        match &mut mr.mem {
            Mem::Owned(b) => {
                let dst = b.get_mut(off..).and_then(|r| r.get_mut(..src.len())).ok_or(AccessError::OutOfBounds)?;
                crate::copy::copy_bytes(dst, src)
            }
            #[cfg(target_os = "linux")]
            Mem::Shared(s) => {
                if !s.write(off, src) {
                    return Err(AccessError::OutOfBounds);
                }
            }
        }
        Ok(())
    }

    /// Executes an 8-byte atomic at `va` (native byte order of the region's u64, as a NIC's host memory is): `f`
    /// maps the original value to the new one. Returns the original value.
    pub fn atomic(&mut self, key: u32, pd: Pd, va: u64, f: impl Fn(u64) -> u64) -> Result<u64, AccessError> {
        let mr = self.lookup_mut(key)?;
        let off = check_mr(mr, pd, va, 8, AccessFlags::REMOTE_ATOMIC)?;
        match &mut mr.mem {
            Mem::Owned(b) => {
                let cell: &mut [u8; 8] = (&mut b[off..off + 8]).try_into().map_err(|_| AccessError::OutOfBounds)?;
                let orig = u64::from_le_bytes(*cell);
                *cell = f(orig).to_le_bytes();
                Ok(orig)
            }
            #[cfg(target_os = "linux")]
            Mem::Shared(s) => s.atomic(off, f).ok_or(AccessError::OutOfBounds),
        }
    }

    /// The whole region's bytes (application access through its lkey); `None` for a shared region (its owner
    /// reads its own mapping).
    pub fn bytes(&self, lkey: u32) -> Option<&[u8]> {
        match &self.lookup(lkey).ok()?.mem {
            Mem::Owned(b) => Some(&b[..]),
            #[cfg(target_os = "linux")]
            Mem::Shared(_) => None,
        }
    }

    /// The whole region's bytes, writable (application access through its lkey); `None` for a shared region.
    pub fn bytes_mut(&mut self, lkey: u32) -> Option<&mut [u8]> {
        match &mut self.lookup_mut(lkey).ok()?.mem {
            Mem::Owned(b) => Some(&mut b[..]),
            #[cfg(target_os = "linux")]
            Mem::Shared(_) => None,
        }
    }

    /// The region's virtual address and length.
    pub fn extent(&self, lkey: u32) -> Option<(u64, usize)> {
        self.lookup(lkey).ok().map(|m| (m.va, m.mem.len()))
    }

    /// Live regions (registered and not yet deregistered).
    pub fn len(&self) -> usize {
        self.slots.iter().filter(|s| s.is_some()).count()
    }

    /// True when no region is registered.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Where [`MrTable::check_span`] found a range: the region's slot and the range's offset in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct MrSpan {
    slot: u32,
    off: usize,
}

/// Copies `dst.len()` bytes of `mem` from `off`, within its length.
#[inline(always)]
fn mem_read(mem: &Mem, off: usize, dst: &mut [u8], copy: &mut PayloadCopy) -> Result<(), AccessError> {
    match mem {
        Mem::Owned(b) => {
            let src = b.get(off..).and_then(|r| r.get(..dst.len())).ok_or(AccessError::OutOfBounds)?;
            copy.copy(dst, src)
        }
        #[cfg(target_os = "linux")]
        Mem::Shared(s) => {
            // A piece next in a frame's hashed payload is hashed as it is copied out of the client's memory.
            if let Some(c) = copy.register_for(dst) {
                if let Some(v) = s.read_hashing(off, dst, c) {
                    copy.piece_hashed(dst, v);
                    return Ok(());
                }
            }
            if !s.read(off, dst) {
                return Err(AccessError::OutOfBounds);
            }
            copy.written(dst);
        }
    }
    Ok(())
}

/// The checks of [`check_mr`] but the end of the range: the PD, the rights, `va` not below the region; returns the
/// offset of `va` inside the region. For an access whose own bounds check is the end check (`MrTable::read` and
/// `write`).
#[inline(always)]
fn check_start(mr: &Mr, pd: Pd, va: u64, need: AccessFlags) -> Result<usize, AccessError> {
    if mr.pd != pd {
        return Err(AccessError::WrongPd);
    }
    if !mr.access.contains(need) {
        return Err(AccessError::NotPermitted);
    }
    let off = va.checked_sub(mr.va).ok_or(AccessError::OutOfBounds)?;
    usize::try_from(off).map_err(|_| AccessError::OutOfBounds)
}

#[inline]
fn check_mr(mr: &Mr, pd: Pd, va: u64, len: u64, need: AccessFlags) -> Result<usize, AccessError> {
    if mr.pd != pd {
        return Err(AccessError::WrongPd);
    }
    if !mr.access.contains(need) {
        return Err(AccessError::NotPermitted);
    }
    let end = va.checked_add(len).ok_or(AccessError::OutOfBounds)?;
    if va < mr.va || end > mr.va + mr.mem.len() as u64 {
        return Err(AccessError::OutOfBounds);
    }
    Ok((va - mr.va) as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    #[cfg_attr(miri, ignore)] // memfd
    fn shared_region_under_a_given_key() {
        use crate::ctrl::shm::{Backing, ShmRegion};
        let region = std::sync::Arc::new(ShmRegion::create("roce-dp-mr-at", 8192, Backing::Pages).unwrap());
        let win = || region.window(0, 4096).unwrap();
        let mut t = MrTable::new(16);
        // Slot 5, generation 3: the slots before it are free for the table's own registrations.
        let k = t.register_shared_at(5 << 8 | 3, Pd(1), 0x1000, win(), AccessFlags::ALL).unwrap();
        assert_eq!((k.lkey, k.rkey), (0x503, 0x503));
        assert!(t.check(0x503, Pd(1), 0x1000, 4096, AccessFlags::REMOTE_WRITE).is_ok());
        assert_eq!(t.check(0x503, Pd(2), 0x1000, 8, AccessFlags::NONE), Err(AccessError::WrongPd));
        assert!(t.register_shared_at(5 << 8 | 9, Pd(1), 0, win(), AccessFlags::ALL).is_none(), "slot taken");
        assert!(t.register_shared_at(16 << 8 | 1, Pd(1), 0, win(), AccessFlags::ALL).is_none(), "beyond max");
        let own: Vec<u32> = (0..5).map(|_| t.register(Pd(1), 0, 8, AccessFlags::NONE).unwrap().lkey >> 8).collect();
        let mut sorted = own.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, [0, 1, 2, 3, 4], "own registrations fill the skipped slots, never slot 5");
        // The next generation of slot 5 follows the given key's.
        assert!(t.deregister(0x503));
        assert_eq!(t.register(Pd(1), 0, 8, AccessFlags::NONE).unwrap().lkey, 0x504);
    }

    #[test]
    fn keys_carry_a_generation() {
        let mut t = MrTable::new(4);
        let pd = Pd(1);
        let k1 = t.register(pd, 0x1000, 64, AccessFlags::ALL).unwrap();
        assert_eq!(k1.lkey >> 8, 0);
        assert!(t.deregister(k1.lkey));
        let k2 = t.register(pd, 0x1000, 64, AccessFlags::ALL).unwrap();
        assert_eq!(k2.lkey >> 8, 0, "slot reused");
        assert_ne!(k1.lkey, k2.lkey, "generation differs");
        assert_eq!(t.check(k1.rkey, pd, 0x1000, 1, AccessFlags::NONE), Err(AccessError::BadKey));
        assert_eq!(t.check(k2.rkey, pd, 0x1000, 64, AccessFlags::REMOTE_WRITE), Ok(0));
        assert!(!t.deregister(k1.lkey));
    }

    #[test]
    fn bounds_pd_and_rights_are_checked() {
        let mut t = MrTable::new(4);
        let k = t.register(Pd(1), 0x1000, 64, AccessFlags::REMOTE_READ).unwrap().rkey;
        assert_eq!(t.check(k, Pd(1), 0x1000, 64, AccessFlags::REMOTE_READ), Ok(0));
        assert_eq!(t.check(k, Pd(1), 0x103f, 1, AccessFlags::REMOTE_READ), Ok(63));
        assert_eq!(t.check(k, Pd(1), 0x1000, 65, AccessFlags::REMOTE_READ), Err(AccessError::OutOfBounds));
        assert_eq!(t.check(k, Pd(1), 0x0fff, 1, AccessFlags::REMOTE_READ), Err(AccessError::OutOfBounds));
        assert_eq!(t.check(k, Pd(1), u64::MAX, 2, AccessFlags::REMOTE_READ), Err(AccessError::OutOfBounds));
        assert_eq!(t.check(k, Pd(2), 0x1000, 1, AccessFlags::REMOTE_READ), Err(AccessError::WrongPd));
        assert_eq!(t.check(k, Pd(1), 0x1000, 1, AccessFlags::REMOTE_WRITE), Err(AccessError::NotPermitted));
        let mut buf = [0u8; 8];
        assert_eq!(t.read(k, Pd(1), 0x1040, &mut buf, AccessFlags::REMOTE_READ), Err(AccessError::OutOfBounds));
        t.invalidate(k, Pd(1)).unwrap();
        assert_eq!(t.check(k, Pd(1), 0x1000, 1, AccessFlags::REMOTE_READ), Err(AccessError::BadKey));
    }

    /// `read` and `write` (whose end check is the access's own) refuse exactly what `check` refuses, with the
    /// same error, for ranges around both edges of the region and ones whose end overflows.
    #[test]
    fn read_and_write_bounds_equal_check() {
        let mut t = MrTable::new(1);
        let k = t.register(Pd(1), 0x1000, 64, AccessFlags::ALL).unwrap().rkey;
        let vas = [0, 0x0fff, 0x1000, 0x1001, 0x1020, 0x103f, 0x1040, 0x1041, u64::MAX - 8, u64::MAX];
        for va in vas {
            for len in [0usize, 1, 2, 31, 63, 64, 65] {
                let want = t.check(k, Pd(1), va, len as u64, AccessFlags::REMOTE_WRITE).map(|_| ());
                let mut buf = vec![0u8; len];
                assert_eq!(t.read(k, Pd(1), va, &mut buf, AccessFlags::REMOTE_READ), want, "read {va:#x}+{len}");
                assert_eq!(t.write(k, Pd(1), va, &buf, AccessFlags::REMOTE_WRITE), want, "write {va:#x}+{len}");
            }
        }
    }

    #[test]
    fn atomics_return_the_original() {
        let mut t = MrTable::new(1);
        let k = t.register(Pd(0), 0, 16, AccessFlags::ALL).unwrap().rkey;
        assert_eq!(t.atomic(k, Pd(0), 8, |v| v + 5), Ok(0));
        assert_eq!(t.atomic(k, Pd(0), 8, |v| v + 5), Ok(5));
        assert_eq!(t.atomic(k, Pd(0), 12, |v| v), Err(AccessError::OutOfBounds));
    }

    #[test]
    #[cfg(target_os = "linux")]
    #[cfg_attr(miri, ignore = "memfd and mmap are system calls Miri does not emulate")]
    fn shared_regions_copy_through_the_client_mapping() {
        use crate::ctrl::shm::{Backing, ShmRegion};
        use std::sync::Arc;
        // The client's buffer, and the daemon's mapping of the same memfd.
        let mut client = ShmRegion::create("roce-dp-mr-test", 3 * 4096, Backing::Pages).unwrap();
        let daemon = Arc::new(ShmRegion::map(client.fd().try_clone_to_owned().unwrap()).unwrap());
        assert!(daemon.window(4096, 8193).is_none(), "window past the mapping");
        let mut t = MrTable::new(4);
        let va = 0x7f00_0000_1000;
        let k = t.register_shared(Pd(3), va, daemon.window(4096, 8000).unwrap(), AccessFlags::ALL).unwrap().rkey;
        assert_eq!(t.extent(k), Some((va, 8000)));
        assert!(t.bytes(k).is_none(), "shared bytes are the client's to read");
        // Every copy size class (system memcpy below 2 KiB, the chunked copy above).
        for (off, n) in [(0usize, 1usize), (7, 63), (100, 2048), (1, 5000), (8000 - 3000, 3000)] {
            let src: Vec<u8> = (0..n).map(|i| (i * 7 + off) as u8).collect();
            t.write(k, Pd(3), va + off as u64, &src, AccessFlags::REMOTE_WRITE).unwrap();
            assert_eq!(&client.as_mut_slice()[4096 + off..4096 + off + n], &src[..], "{off}+{n}");
            let mut back = vec![0u8; n];
            t.read(k, Pd(3), va + off as u64, &mut back, AccessFlags::REMOTE_READ).unwrap();
            assert_eq!(back, src);
        }
        // The client writes, the daemon reads.
        client.as_mut_slice()[4096 + 16..4096 + 24].copy_from_slice(&41u64.to_le_bytes());
        assert_eq!(t.atomic(k, Pd(3), va + 16, |v| v + 1), Ok(41));
        assert_eq!(u64::from_le_bytes(client.as_mut_slice()[4096 + 16..4096 + 24].try_into().unwrap()), 42);
        // Bounds, PD and alignment hold; nothing before or after the window is touched.
        let mut b = [0u8; 2];
        assert_eq!(t.read(k, Pd(3), va + 7999, &mut b, AccessFlags::NONE), Err(AccessError::OutOfBounds));
        assert_eq!(t.write(k, Pd(4), va, &b, AccessFlags::NONE), Err(AccessError::WrongPd));
        assert_eq!(t.atomic(k, Pd(3), va + 12, |v| v), Err(AccessError::OutOfBounds), "misaligned");
        let c = client.as_mut_slice();
        assert!(c[..4096].iter().all(|&x| x == 0) && c[4096 + 8000..].iter().all(|&x| x == 0));
        assert!(t.deregister(k));
        assert!(t.is_empty());
    }
}
