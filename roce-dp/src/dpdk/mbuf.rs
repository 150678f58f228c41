//! Owned packet buffers and fixed-size bursts of them.

use std::ptr::NonNull;

use super::error::{DpdkError, Result};
use super::mempool::Mempool;

/// The largest burst moved per rx/tx call.
pub const BURST: usize = 32;

/// One packet mbuf, owned: freed (`rte_pktmbuf_free`) on drop.
///
/// Data accessors see the first segment only (`data_len` bytes at `buf_addr + data_off`); this layer sizes pools
/// so that every frame fits one segment ([`data_room_for`](super::data_room_for)) and [`Mbuf::nb_segs`] lets
/// callers check. An `Mbuf` must not outlive its [`Mempool`]'s EAL (the pool itself is never freed while mbufs
/// are out).
#[repr(transparent)]
pub struct Mbuf(NonNull<dpdk_sys::rte_mbuf>);

// SAFETY: an Mbuf is the only reference to its buffer (refcount handling goes through DPDK's atomics), and
// freeing it back to its pool is thread-safe, so moving it to another thread is sound.
unsafe impl Send for Mbuf {}

impl Mbuf {
    /// Allocate an empty mbuf from `pool` (`ENOBUFS` when the pool is empty).
    pub fn alloc(pool: &Mempool) -> Result<Mbuf> {
        // SAFETY: the pool is alive (borrowed).
        let m = unsafe { dpdk_sys::rte_pktmbuf_alloc_(pool.as_ptr()) };
        NonNull::new(m).map(Mbuf).ok_or(DpdkError::new("rte_pktmbuf_alloc", libc::ENOBUFS))
    }

    /// Take ownership of a raw mbuf.
    ///
    /// # Safety
    /// `m` must be a valid packet mbuf that nothing else will free or use.
    pub unsafe fn from_raw(m: NonNull<dpdk_sys::rte_mbuf>) -> Mbuf {
        Mbuf(m)
    }

    /// Give up ownership; the caller must free the mbuf (or hand it to a PMD).
    pub fn into_raw(self) -> NonNull<dpdk_sys::rte_mbuf> {
        let m = self.0;
        std::mem::forget(self);
        m
    }

    fn raw(&self) -> &dpdk_sys::rte_mbuf {
        // SAFETY: self owns a valid mbuf; shared access matches &self.
        unsafe { self.0.as_ref() }
    }

    /// Bytes of data in the first segment.
    pub fn len(&self) -> usize {
        usize::from(self.raw().data_len)
    }

    /// Whether the first segment holds no data.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of data in the whole packet (all segments).
    pub fn pkt_len(&self) -> usize {
        self.raw().pkt_len as usize
    }

    /// Number of segments.
    pub fn nb_segs(&self) -> u16 {
        self.raw().nb_segs
    }

    /// The port the mbuf was received on.
    pub fn port(&self) -> u16 {
        self.raw().port
    }

    /// Free bytes before the data in the first segment.
    pub fn headroom(&self) -> usize {
        usize::from(self.raw().data_off)
    }

    /// Free bytes after the data (single-segment mbufs).
    pub fn tailroom(&self) -> usize {
        let m = self.raw();
        usize::from(m.buf_len).saturating_sub(usize::from(m.data_off) + usize::from(m.data_len))
    }

    fn data_ptr(&self) -> *mut u8 {
        let m = self.raw();
        // SAFETY: buf_addr + data_off stays within the mbuf's buffer (data_off <= buf_len), as rte_pktmbuf_mtod.
        unsafe { m.buf_addr.cast::<u8>().add(usize::from(m.data_off)) }
    }

    /// The first segment's data.
    pub fn data(&self) -> &[u8] {
        // SAFETY: data_len bytes from the data pointer lie in the mbuf's buffer, which self owns and which lives
        // as long as self; &self forbids mutation meanwhile.
        unsafe { std::slice::from_raw_parts(self.data_ptr(), self.len()) }
    }

    /// The first segment's data, writable, if it is this mbuf's own ([`Mbuf::data_exclusive`]); `None` for a clone's
    /// shared data or an external buffer (whose bytes another holder reads, or which may not be writable at all).
    pub fn data_mut(&mut self) -> Option<&mut [u8]> {
        if !self.data_exclusive() {
            return None;
        }
        // SAFETY: as data(); the data is this mbuf's alone (direct, one reference: its own buffer from its pool,
        // which is writable) and &mut self makes the access exclusive.
        Some(unsafe { std::slice::from_raw_parts_mut(self.data_ptr(), self.len()) })
    }

    /// Whether the data is this mbuf's own to write: a direct mbuf (not attached to another mbuf's buffer, as a
    /// clone is, nor to an external buffer, as some PMDs deliver frames) with one reference. A clone's reference
    /// count is 1 while the mbuf whose data it shares has 2, so the count alone does not say it.
    pub fn data_exclusive(&self) -> bool {
        // SAFETY: self owns a valid mbuf.
        unsafe { dpdk_sys::rdp_mbuf_data_exclusive(self.0.as_ptr()) != 0 }
    }

    /// A clone from `pool` (`rte_pktmbuf_clone`): a second mbuf attached to this one's data (this one's reference
    /// count goes up); `ENOBUFS` when the pool is empty.
    pub fn clone_in(&mut self, pool: &Mempool) -> Result<Mbuf> {
        // SAFETY: self owns a valid mbuf and the pool is alive; the clone takes a reference to self's buffer, which
        // DPDK's reference counts keep until both are freed.
        let m = unsafe { dpdk_sys::rte_pktmbuf_clone_(self.0.as_ptr(), pool.as_ptr()) };
        NonNull::new(m).map(Mbuf).ok_or(DpdkError::new("rte_pktmbuf_clone", libc::ENOBUFS))
    }

    /// Makes a read-only copy of `bytes` this empty mbuf's data, in an external buffer (as PMDs that receive into
    /// memory of their own deliver frames): pages of its own, mapped read-only, so that a write through the mbuf
    /// faults, unmapped with the last mbuf attached to them. For tests of code that must not write received data
    /// it does not own. `EINVAL` unless this mbuf is empty, direct and single-referenced and `bytes` fits an mbuf;
    /// the errno of the mapping otherwise.
    pub fn attach_read_only_copy(&mut self, bytes: &[u8]) -> Result<()> {
        let fits = u16::try_from(bytes.len()).ok().filter(|_| self.data_exclusive() && self.nb_segs() == 1);
        let Some(len) = fits.filter(|_| self.pkt_len() == 0) else {
            return Err(DpdkError::new("rte_pktmbuf_attach_extbuf", libc::EINVAL));
        };
        // SAFETY: self owns a valid direct mbuf with one reference and no data (checked); `bytes` is readable for
        // `len` bytes during the call (it is copied); the copy's pages belong to the buffer, which DPDK frees with
        // the last mbuf attached to it.
        match unsafe { dpdk_sys::rdp_pktmbuf_attach_ro_copy(self.0.as_ptr(), bytes.as_ptr().cast(), len) } {
            0 => Ok(()),
            e => Err(DpdkError::new("rte_pktmbuf_attach_extbuf", -e)),
        }
    }

    /// Grow the data by `n` bytes at the end; the new bytes (stale contents: whatever the buffer last held), or
    /// `None` if there is not enough tailroom.
    pub fn append(&mut self, n: u16) -> Option<&mut [u8]> {
        // SAFETY: self owns a valid mbuf; rte_pktmbuf_append checks the tailroom.
        let p = unsafe { dpdk_sys::rte_pktmbuf_append_(self.0.as_ptr(), n) };
        // SAFETY: on success p points to n bytes inside the buffer that self owns exclusively.
        (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), usize::from(n)) })
    }

    /// The free bytes after the data of a single-segment mbuf (stale contents), to be filled and then committed
    /// with [`Mbuf::extend`]; empty for a multi-segment mbuf. The per-frame alternative to [`Mbuf::append`] +
    /// [`Mbuf::trim`] when the final length is known only after writing: no call into the C shim.
    pub fn spare_mut(&mut self) -> &mut [u8] {
        if self.nb_segs() != 1 {
            return &mut [];
        }
        let (len, room) = (self.len(), self.tailroom());
        // SAFETY: the tailroom lies inside the mbuf's buffer (data_off + data_len + tailroom = buf_len), which self
        // owns exclusively (&mut self); the slice starts right after the data.
        unsafe { std::slice::from_raw_parts_mut(self.data_ptr().add(len), room) }
    }

    /// Grow the data of a single-segment mbuf by `n` bytes at the end (bytes written through
    /// [`Mbuf::spare_mut`]); false (and no change) if the tailroom is shorter or the mbuf has several segments.
    pub fn extend(&mut self, n: u16) -> bool {
        if self.nb_segs() != 1 || usize::from(n) > self.tailroom() {
            return false;
        }
        // SAFETY: self owns the mbuf exclusively; a single-segment mbuf's data and packet lengths move together,
        // and the check above keeps the data inside the buffer (what rte_pktmbuf_append does for this case).
        let m = unsafe { self.0.as_mut() };
        m.data_len += n;
        m.pkt_len += u32::from(n);
        true
    }

    /// Grow the data by `n` bytes at the front; the new bytes, or `None` if there is not enough headroom.
    pub fn prepend(&mut self, n: u16) -> Option<&mut [u8]> {
        // SAFETY: self owns a valid mbuf; rte_pktmbuf_prepend checks the headroom.
        let p = unsafe { dpdk_sys::rte_pktmbuf_prepend_(self.0.as_ptr(), n) };
        // SAFETY: on success p points to n bytes inside the buffer that self owns exclusively.
        (!p.is_null()).then(|| unsafe { std::slice::from_raw_parts_mut(p.cast::<u8>(), usize::from(n)) })
    }

    /// Drop `n` bytes from the front; false (and no change) if the first segment is shorter.
    pub fn adj(&mut self, n: u16) -> bool {
        // SAFETY: self owns a valid mbuf; rte_pktmbuf_adj checks the length.
        !unsafe { dpdk_sys::rte_pktmbuf_adj_(self.0.as_ptr(), n) }.is_null()
    }

    /// Drop `n` bytes from the end; false (and no change) if the last segment is shorter.
    pub fn trim(&mut self, n: u16) -> bool {
        // SAFETY: self owns a valid mbuf; rte_pktmbuf_trim checks the length.
        unsafe { dpdk_sys::rte_pktmbuf_trim_(self.0.as_ptr(), n) == 0 }
    }

    /// Copy the data of every segment, in order, into `out` (cleared first): a multi-segment frame made contiguous.
    pub fn copy_segments(&self, out: &mut Vec<u8>) {
        out.clear();
        let mut seg: *const dpdk_sys::rte_mbuf = self.0.as_ptr();
        while !seg.is_null() {
            // SAFETY: seg is this mbuf or a segment chained from it (owned together with it, valid while self is);
            // its data_len bytes at buf_addr + data_off lie inside its buffer.
            unsafe {
                let m = &*seg;
                let p = m.buf_addr.cast::<u8>().add(usize::from(m.data_off));
                out.extend_from_slice(std::slice::from_raw_parts(p, usize::from(m.data_len)));
                seg = m.next;
            }
        }
    }

    /// Append `tail` (with all its segments) after this mbuf's last segment, as `rte_pktmbuf_chain` does: the
    /// packet then holds both, `pkt_len` and `nb_segs` summed. What PMDs hand over for a frame larger than one
    /// mbuf (memif, rx scatter); tests build such frames with it. Gives `tail` back when the chain would pass
    /// 65535 segments.
    pub fn chain(&mut self, tail: Mbuf) -> std::result::Result<(), Mbuf> {
        let segs = u32::from(self.nb_segs()) + u32::from(tail.nb_segs());
        let Ok(segs) = u16::try_from(segs) else { return Err(tail) };
        let add = tail.raw().pkt_len;
        let tail = tail.into_raw();
        // SAFETY: self owns its mbuf and every segment chained from it exclusively (&mut self); the walk follows
        // `next` to the last segment, which becomes tail's predecessor. tail's ownership moved into the chain
        // (into_raw above): it is freed with the head from now on.
        unsafe {
            let head = self.0.as_ptr();
            let mut last = head;
            while !(*last).next.is_null() {
                last = (*last).next;
            }
            (*last).next = tail.as_ptr();
            (*head).nb_segs = segs;
            (*head).pkt_len = (*head).pkt_len.wrapping_add(add);
        }
        Ok(())
    }

    /// The reference count (1 unless the mbuf was cloned by DPDK code).
    pub fn refcnt(&self) -> u16 {
        // SAFETY: self owns a valid mbuf.
        unsafe { dpdk_sys::rte_mbuf_refcnt_read_(self.0.as_ptr()) }
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: self owns the mbuf and is never used again.
        unsafe { dpdk_sys::rte_pktmbuf_free_(self.0.as_ptr()) }
    }
}

/// Up to [`BURST`] owned mbufs in a fixed array: what rx fills and tx drains. Remaining mbufs are freed in one
/// `rte_pktmbuf_free_bulk` on drop or [`Burst::clear`].
pub struct Burst {
    len: usize,
    /// Invariant: `pkts[..len]` are valid mbufs owned by this burst; the rest are unspecified.
    pkts: [*mut dpdk_sys::rte_mbuf; BURST],
}

// SAFETY: a Burst owns its mbufs exactly as an Mbuf does (see Mbuf's Send).
unsafe impl Send for Burst {}

impl Default for Burst {
    fn default() -> Self {
        Self::new()
    }
}

impl Burst {
    /// An empty burst.
    pub const fn new() -> Self {
        Self { len: 0, pkts: [std::ptr::null_mut(); BURST] }
    }

    /// Number of mbufs held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no mbuf is held.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Free slots.
    pub fn room(&self) -> usize {
        BURST - self.len
    }

    /// Add an mbuf at the end; gives it back if the burst is full.
    pub fn push(&mut self, m: Mbuf) -> std::result::Result<(), Mbuf> {
        if self.len == BURST {
            return Err(m);
        }
        self.pkts[self.len] = m.into_raw().as_ptr();
        self.len += 1;
        Ok(())
    }

    /// The held mbufs.
    pub fn as_slice(&self) -> &[Mbuf] {
        // SAFETY: pkts[..len] are valid non-null mbuf pointers (invariant) and Mbuf is a repr(transparent)
        // NonNull<rte_mbuf>, which has the same layout as *mut rte_mbuf.
        unsafe { std::slice::from_raw_parts(self.pkts.as_ptr().cast::<Mbuf>(), self.len) }
    }

    /// The held mbufs, writable.
    pub fn as_mut_slice(&mut self) -> &mut [Mbuf] {
        // SAFETY: as as_slice(), exclusive through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.pkts.as_mut_ptr().cast::<Mbuf>(), self.len) }
    }

    /// Take all mbufs out, in order (any the iterator does not yield are freed when it drops).
    pub fn drain(&mut self) -> Drain<'_> {
        let n = std::mem::replace(&mut self.len, 0);
        Drain { pkts: &self.pkts[..n], pos: 0 }
    }

    /// Take the last mbuf out.
    pub fn pop(&mut self) -> Option<Mbuf> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        // SAFETY: pkts[len] (the old last entry) is a valid owned mbuf (invariant); len no longer covers it, so it
        // is handed out exactly once.
        Some(unsafe { Mbuf::from_raw(NonNull::new_unchecked(self.pkts[self.len])) })
    }

    /// Fill the free slots with new mbufs from `pool` in one bulk allocation (all or nothing); how many were added.
    pub fn alloc_bulk(&mut self, pool: &Mempool) -> usize {
        let mp = pool.as_ptr();
        // SAFETY: rte_pktmbuf_alloc_bulk either stores exactly n valid, freshly allocated mbufs into the n slots
        // and returns 0, or stores none and returns an error; fill_with's contract holds either way.
        unsafe {
            self.fill_with(
                |slots, n| {
                    if n > 0 && dpdk_sys::rte_pktmbuf_alloc_bulk_(mp, slots, u32::from(n)) == 0 {
                        n
                    } else {
                        0
                    }
                },
            )
        }
    }

    /// Free every held mbuf.
    pub fn clear(&mut self) {
        if self.len > 0 {
            // SAFETY: pkts[..len] are owned mbufs; after the call len is 0, so none is used again.
            unsafe { dpdk_sys::rte_pktmbuf_free_bulk_(self.pkts.as_mut_ptr(), self.len as u32) };
            self.len = 0;
        }
    }

    /// Empties the burst without freeing anything and returns how many mbufs it held: the caller now owns them
    /// and takes each exactly once with [`Burst::take_released`] (in place: no copy of the burst).
    pub(crate) fn release(&mut self) -> usize {
        std::mem::replace(&mut self.len, 0)
    }

    /// Mbuf `i` of those the last [`Burst::release`] handed over.
    ///
    /// # Safety
    /// `i` is below the count `release` returned, each `i` is taken at most once, and nothing was stored in the
    /// burst since (no push, fill or allocation).
    pub(crate) unsafe fn take_released(&self, i: usize) -> Mbuf {
        // SAFETY: by the caller's contract pkts[i] still holds a valid mbuf the burst gave up, taken only now.
        unsafe { Mbuf::from_raw(NonNull::new_unchecked(self.pkts[i])) }
    }

    /// Fill the free slots from `fill` (e.g. `rte_eth_rx_burst_`), which receives a pointer to the first free slot
    /// and the number of free slots, and returns how many mbufs it stored there.
    ///
    /// # Safety
    /// `fill` must store exactly the returned number of valid mbufs, each owned by nobody else, at the start of the
    /// slots it was given.
    pub(crate) unsafe fn fill_with(&mut self, fill: impl FnOnce(*mut *mut dpdk_sys::rte_mbuf, u16) -> u16) -> usize {
        let room = self.room() as u16;
        // SAFETY: the pointer addresses `room` free slots inside self.pkts.
        let got = usize::from(fill(unsafe { self.pkts.as_mut_ptr().add(self.len) }, room)).min(usize::from(room));
        self.len += got;
        got
    }

    /// Hand the first mbufs to `take` (e.g. `rte_eth_tx_burst_`), which returns how many it took ownership of;
    /// the rest move to the front.
    ///
    /// # Safety
    /// `take` must take ownership of exactly the returned number of mbufs, from the front, and leave the rest alone.
    pub(crate) unsafe fn take_with(&mut self, take: impl FnOnce(*mut *mut dpdk_sys::rte_mbuf, u16) -> u16) -> usize {
        let sent = usize::from(take(self.pkts.as_mut_ptr(), self.len as u16)).min(self.len);
        if sent < self.len {
            self.pkts.copy_within(sent..self.len, 0);
        }
        self.len -= sent;
        sent
    }
}

impl Drop for Burst {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The iterator of [`Burst::drain`]: yields owned mbufs; frees the ones not taken when dropped.
pub struct Drain<'a> {
    /// Owned mbufs (the burst's length was already reset); `pkts[pos..]` are not handed out yet.
    pkts: &'a [*mut dpdk_sys::rte_mbuf],
    pos: usize,
}

impl Iterator for Drain<'_> {
    type Item = Mbuf;

    fn next(&mut self) -> Option<Mbuf> {
        let p = *self.pkts.get(self.pos)?;
        self.pos += 1;
        // SAFETY: every entry of pkts is a valid mbuf owned by this Drain, handed out at most once (pos advances).
        Some(unsafe { Mbuf::from_raw(NonNull::new_unchecked(p)) })
    }
}

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        self.for_each(drop);
    }
}
