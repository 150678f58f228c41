//! A single-producer single-consumer ring in memory shared with another, untrusted, process.
//!
//! # Layout
//! A ring occupies [`ring_bytes`]`(capacity, size_of::<T>())` bytes at a 128-byte aligned address: a [`RingCtrl`]
//! (the consumer's `head` and the producer's `tail`, each a `u32` on its own cache-line pair) followed by
//! `capacity` entries of `T`. `capacity` is a power of two; indices run freely over all of `u32` and are masked
//! with `capacity - 1` on every slot access (DPDK `rte_ring`, io_uring), so `tail - head` (wrapping) is the number
//! of entries in the ring and the full/empty cases need no spare slot.
//!
//! # Discipline
//! Each half keeps its own index locally and a *cached* copy of the far index (rtrb): `push`/`pop` touch only the
//! slot and the local index while the cache says there is room or data, and reload the far index (Acquire) only
//! when it does not. Publication is explicit and batched as in io_uring: [`Producer::sync`] stores the tail
//! (Release, after the slot writes) and [`Consumer::sync`] stores the head (Release, after the slot reads) and both
//! refresh their cache. A half reads its *own* index from shared memory exactly once, when it attaches; after that
//! the local copy is the truth, so the peer scribbling on it changes nothing on this side.
//!
//! # The peer is hostile
//! The far index is checked on every load: a tail claiming more than `capacity` entries past the head the consumer
//! last handed back (entries read but not handed back count), or a head or tail that moves backwards, is
//! [`RingError::Corrupt`] (sticky: the half refuses all further work, and the caller turns it into a QP error). No index from shared memory ever reaches a pointer computation unmasked. Entries are copied
//! out of the ring with a volatile read into a local `T` *before* anyone looks at them, so a peer rewriting the
//! slot concurrently cannot change a value after it was validated (TOCTOU). Entry types implement [`Pod`]: every
//! bit pattern is a valid value, so garbage in the ring is a value to validate, never undefined behaviour.
//!
//! Strictly, a volatile read that races with the peer's plain stores is a data race under the Rust memory model
//! (the open "atomic memcpy" question, RFC 3301); every shared-memory transport (io_uring, virtio, DPDK memif) does
//! the same and the outcome on real hardware is a torn but valid `Pod` value, which validation handles. Likewise
//! the `&AtomicU32` views of head and tail are taken through a `&RingCtrl` that spans the padding bytes, which a
//! hostile peer may write; nothing here reads them.

#![allow(unsafe_code)]

use core::fmt;
use core::mem::{align_of, offset_of, size_of};
use core::ptr::{self, NonNull};
use core::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use crossbeam_utils::CachePadded;

/// The control block at the start of every ring.
#[repr(C)]
pub struct RingCtrl {
    /// Consumer index: the next entry to read. Stored only by the consumer; free-running (masked on use).
    pub head: CachePadded<AtomicU32>,
    /// Producer index: the next entry to write. Stored only by the producer; free-running (masked on use).
    pub tail: CachePadded<AtomicU32>,
}

// head and tail never share a cache line (nor the adjacent-line prefetch pair on x86-64).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const _: () = {
    assert!(offset_of!(RingCtrl, head) == 0);
    assert!(offset_of!(RingCtrl, tail) == 128);
    assert!(size_of::<RingCtrl>() == 256);
    assert!(align_of::<RingCtrl>() == 128);
};

/// Alignment required of a ring's base address.
pub const RING_ALIGN: usize = align_of::<RingCtrl>();

/// The largest capacity (indices must stay comparable in modulo-2^32 arithmetic).
pub const MAX_CAPACITY: u32 = 1 << 30;

/// The most bytes of new entries a consumer prefetches after reloading the producer's index.
pub const PREFETCH_BYTES: usize = 1024;

/// A cache-line prefetch hint (nothing on other architectures).
#[inline(always)]
fn prefetch_line(p: *const u8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: PREFETCHT0 is in every x86-64 CPU (SSE); it reads nothing architecturally and never faults, whatever
    // the address.
    unsafe {
        core::arch::x86_64::_mm_prefetch::<{ core::arch::x86_64::_MM_HINT_T0 }>(p.cast());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Whether a `T` is copied to and from its slot as 8-byte words (the WQEs and CQEs: whole words, 8-aligned).
const fn by_words<T>() -> bool {
    size_of::<T>().is_multiple_of(8) && align_of::<T>() >= 8
}

/// Writes `value` into `slot` with one volatile 8-byte store per word when `T` is made of whole words: a
/// volatile store of the struct is one store per field (13 for a WQE, bytes among them), each from a stack copy
/// of the value (session 15: ~26 instructions per posted WQE, against 8 stores).
///
/// # Safety
/// `slot` is valid for writes of a `T` and aligned for it.
#[inline(always)]
unsafe fn store<T: Pod>(slot: *mut T, value: T) {
    if !by_words::<T>() {
        // SAFETY: the caller's contract.
        unsafe { ptr::write_volatile(slot, value) };
        return;
    }
    let src = (&raw const value).cast::<u64>();
    let dst = slot.cast::<u64>();
    for i in 0..size_of::<T>() / 8 {
        // SAFETY: word i < size / 8 of both: in bounds; `value` has no padding (Pod), so every word is initialised;
        // both are 8-aligned (align_of::<T>() >= 8, and `slot` is aligned for T).
        unsafe { ptr::write_volatile(dst.add(i), src.add(i).read()) };
    }
}

/// Copies the `T` in `slot` out with one volatile 8-byte load per word when `T` is made of whole words (see
/// [`store`]). The copy is what gets validated: each word of the slot is read once.
///
/// # Safety
/// `slot` is valid for reads of a `T` and aligned for it.
#[inline(always)]
unsafe fn load<T: Pod>(slot: *const T) -> T {
    if !by_words::<T>() {
        // SAFETY: the caller's contract; T is Pod, so any bytes form a valid T.
        return unsafe { ptr::read_volatile(slot) };
    }
    let mut v = core::mem::MaybeUninit::<T>::uninit();
    let dst = v.as_mut_ptr().cast::<u64>();
    let src = slot.cast::<u64>();
    for i in 0..size_of::<T>() / 8 {
        // SAFETY: as in `store`, with the slot read and the local copy written.
        unsafe { dst.add(i).write(ptr::read_volatile(src.add(i))) };
    }
    // SAFETY: every byte of `v` was written (size_of::<T>() / 8 whole words); T is Pod: any bytes are a valid T.
    unsafe { v.assume_init() }
}

/// Types that may live in shared memory and be read back from a hostile peer.
///
/// # Safety
/// Implementors are `#[repr(C)]` (or primitive) types with no padding bytes, no pointers or references, and for
/// which every bit pattern is a valid value (integers and arrays of integers only: no `bool`, `char`, enums).
pub unsafe trait Pod: Copy + 'static {}

// SAFETY: primitive integers: no padding, every bit pattern valid.
unsafe impl Pod for u8 {}
// SAFETY: as above.
unsafe impl Pod for u16 {}
// SAFETY: as above.
unsafe impl Pod for u32 {}
// SAFETY: as above.
unsafe impl Pod for u64 {}

// The ABI types: each is #[repr(C)] with integer (or nested Pod) fields only, and abi.rs asserts at compile time
// that its size equals the sum of its fields' sizes, i.e. there is no padding.
// SAFETY: see above.
unsafe impl Pod for super::abi::Sge {}
// SAFETY: see above.
unsafe impl Pod for super::abi::Wqe {}
// SAFETY: see above.
unsafe impl Pod for super::abi::RecvWqe {}
// SAFETY: see above.
unsafe impl Pod for super::abi::Cqe {}
// SAFETY: see above.
unsafe impl Pod for super::abi::RingDesc {}
// SAFETY: see above.
unsafe impl Pod for super::abi::TableDesc {}
// SAFETY: see above (`reserved: [u64; 3]` is an array of integers).
unsafe impl Pod for super::abi::RegionHeader {}

/// Bytes a ring of `capacity` entries of `entry_size` bytes occupies (control block included), or `None` on
/// overflow.
pub const fn ring_bytes(capacity: u32, entry_size: usize) -> Option<usize> {
    match (capacity as usize).checked_mul(entry_size) {
        Some(n) => n.checked_add(size_of::<RingCtrl>()),
        None => None,
    }
}

/// Why a ring operation did not happen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingError {
    /// The ring is full (push only): retry after the consumer made room.
    Full,
    /// The peer published an impossible index: `head`/`tail` as last read, `local` this side's index. Sticky.
    Corrupt {
        /// What was wrong.
        what: &'static str,
        /// The index read from shared memory.
        peer: u32,
        /// This side's own index at the time.
        local: u32,
    },
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RingError::Full => f.write_str("ring is full"),
            RingError::Corrupt { what, peer, local } => {
                write!(f, "ring corrupted by the peer: {what} (peer index {peer}, local index {local})")
            }
        }
    }
}

impl std::error::Error for RingError {}

/// Why memory cannot hold a ring.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// Capacity zero, not a power of two, or above [`MAX_CAPACITY`].
    BadCapacity(u32),
    /// The base address is not aligned to [`RING_ALIGN`] (or to the entry type).
    Misaligned(usize),
    /// The memory is shorter than the ring (`need`, `have`).
    TooShort {
        /// Bytes the ring needs.
        need: usize,
        /// Bytes provided.
        have: usize,
    },
}

impl fmt::Display for LayoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayoutError::BadCapacity(c) => {
                write!(f, "ring capacity {c} is not a power of two in 1..={MAX_CAPACITY}")
            }
            LayoutError::Misaligned(a) => write!(f, "ring memory at {a:#x} is not {RING_ALIGN}-byte aligned"),
            LayoutError::TooShort { need, have } => write!(f, "ring needs {need} bytes, the memory has {have}"),
        }
    }
}

impl std::error::Error for LayoutError {}

/// Something that keeps the ring memory mapped (an `Arc` of the region), held by each half.
pub type Owner = Arc<dyn Send + Sync>;

/// Pointers into one ring's memory, checked once at attach.
struct Raw<T> {
    ctrl: NonNull<RingCtrl>,
    slots: NonNull<T>,
    mask: u32,
    _owner: Option<Owner>,
}

impl<T: Pod> Raw<T> {
    /// # Safety
    /// `base .. base + len` is readable and writable memory that stays mapped for as long as the returned value
    /// (and anything made from it) lives, unless `owner` keeps it mapped.
    unsafe fn new(base: NonNull<u8>, len: usize, capacity: u32, owner: Option<Owner>) -> Result<Self, LayoutError> {
        if capacity == 0 || !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
            return Err(LayoutError::BadCapacity(capacity));
        }
        let addr = base.as_ptr().addr();
        if !addr.is_multiple_of(RING_ALIGN) || !RING_ALIGN.is_multiple_of(align_of::<T>()) {
            return Err(LayoutError::Misaligned(addr));
        }
        let need = ring_bytes(capacity, size_of::<T>()).ok_or(LayoutError::BadCapacity(capacity))?;
        if len < need {
            return Err(LayoutError::TooShort { need, have: len });
        }
        // SAFETY: need <= len, so the control block and the slots that follow are inside the caller's memory.
        let slots = unsafe { base.add(size_of::<RingCtrl>()) }.cast::<T>();
        Ok(Raw { ctrl: base.cast(), slots, mask: capacity - 1, _owner: owner })
    }

    #[inline]
    fn capacity(&self) -> u32 {
        self.mask + 1
    }

    #[inline]
    fn head(&self) -> &AtomicU32 {
        // SAFETY: ctrl points at a live, aligned RingCtrl for our lifetime (constructor contract); its fields are
        // only ever accessed atomically (by us) or by the peer process, and AtomicU32 permits shared access.
        unsafe { &self.ctrl.as_ref().head }
    }

    #[inline]
    fn tail(&self) -> &AtomicU32 {
        // SAFETY: as in `head`.
        unsafe { &self.ctrl.as_ref().tail }
    }

    /// The slot of free-running index `index`; always in bounds because of the mask.
    #[inline]
    fn slot(&self, index: u32) -> *mut T {
        // SAFETY: (index & mask) < capacity and the constructor checked that `capacity` slots fit in the memory.
        unsafe { self.slots.as_ptr().add((index & self.mask) as usize) }
    }
}

/// A view of a CQ's notification block ([`CqNotify`](super::abi::CqNotify)) in shared memory: the client's arm
/// word and the daemon's answer. Both sides only ever load and store the two words atomically; a value the peer
/// wrote is just a number to compare.
#[derive(Clone)]
pub struct NotifyView {
    ptr: NonNull<super::abi::CqNotify>,
    _owner: Owner,
}

// SAFETY: the view holds a pointer to three atomics in a mapping its owner keeps alive; atomics may be shared and
// accessed from any thread.
unsafe impl Send for NotifyView {}
// SAFETY: as above (every access is an atomic load or store).
unsafe impl Sync for NotifyView {}

impl NotifyView {
    /// A view of the block at `base`.
    ///
    /// # Safety
    /// `base .. base + len` is readable and writable memory that `owner` keeps mapped.
    pub unsafe fn attach(base: NonNull<u8>, len: usize, owner: Owner) -> Result<NotifyView, LayoutError> {
        let need = size_of::<super::abi::CqNotify>();
        if len < need {
            return Err(LayoutError::TooShort { need, have: len });
        }
        if !base.as_ptr().addr().is_multiple_of(RING_ALIGN) {
            return Err(LayoutError::Misaligned(base.as_ptr().addr()));
        }
        Ok(NotifyView { ptr: base.cast(), _owner: owner })
    }

    /// A zeroed block on the heap (tests).
    pub fn heap() -> NotifyView {
        let mem = Arc::new(HeapMem::new(size_of::<super::abi::CqNotify>()));
        // SAFETY: fresh zeroed memory of the block's size, aligned to RING_ALIGN, kept alive by the owner.
        unsafe { NotifyView::attach(mem.base(), mem.len(), mem.clone()).expect("heap notify block") }
    }

    fn block(&self) -> &super::abi::CqNotify {
        // SAFETY: in bounds and aligned (checked at attach), kept mapped by the owner; the fields are atomics,
        // valid for any bit pattern, and only ever accessed atomically here.
        unsafe { self.ptr.as_ref() }
    }

    /// The arm word (daemon side: hostile, any value).
    #[inline]
    pub fn arm(&self) -> u32 {
        self.block().arm.load(Ordering::Relaxed)
    }

    /// Stores the arm word (client side). The caller orders it before its re-poll with a SeqCst fence.
    #[inline]
    pub fn set_arm(&self, word: u32) {
        self.block().arm.store(word, Ordering::Relaxed);
    }

    /// The sequence the daemon answered last (client side).
    #[inline]
    pub fn fired(&self) -> u32 {
        self.block().fired.load(Ordering::Acquire)
    }

    /// Records the answered sequence (daemon side), before the channel is signalled.
    #[inline]
    pub fn set_fired(&self, seq: u32) {
        self.block().fired.store(seq, Ordering::Release);
    }

    /// The moderation word (daemon side: hostile, any value).
    #[inline]
    pub fn moderation(&self) -> u32 {
        self.block().moderation.load(Ordering::Relaxed)
    }

    /// Stores the moderation word (client side).
    #[inline]
    pub fn set_moderation(&self, word: u32) {
        self.block().moderation.store(word, Ordering::Relaxed);
    }
}

/// A look at a ring's indices from outside its consumer half, from any thread: the client library reads a CQ ring's
/// tail when it destroys a QP, to know which completions the daemon wrote before the destroy, and the head its own
/// polls handed back, to know which of those are still to be read. Keeps the mapping alive like the halves do; the
/// tail is the peer's (hostile: just a number to compare).
#[derive(Clone)]
pub struct TailView {
    ctrl: NonNull<RingCtrl>,
    _owner: Owner,
}

// SAFETY: a pointer to a ring's control block in a mapping its owner keeps alive; the view only loads its indices
// atomically, which any thread may do.
unsafe impl Send for TailView {}
// SAFETY: as above.
unsafe impl Sync for TailView {}

impl TailView {
    /// The producer's index now (Acquire: the entries before it are written).
    #[inline]
    pub fn load(&self) -> u32 {
        // SAFETY: ctrl points at a live, aligned RingCtrl (checked when the consumer attached) that the owner keeps
        // mapped; its fields are atomics, valid for any bit pattern and only accessed atomically.
        unsafe { self.ctrl.as_ref() }.tail.load(Ordering::Acquire)
    }

    /// The consumer's index as its half last handed it back ([`Consumer::release`], at the end of each poll): at
    /// most the index of the next entry it will read, so every entry before it has been read.
    #[inline]
    pub fn released(&self) -> u32 {
        // SAFETY: as in `load`.
        unsafe { self.ctrl.as_ref() }.head.load(Ordering::Acquire)
    }
}

/// Zeroes a ring's indices. Call it once on fresh memory before either half attaches (a new memfd is zero already).
///
/// # Safety
/// `base` points at writable memory of at least `size_of::<RingCtrl>()` bytes aligned to [`RING_ALIGN`], and no
/// half is attached to the ring yet.
pub unsafe fn init(base: NonNull<u8>) {
    let ctrl = base.cast::<RingCtrl>();
    // SAFETY: the caller guarantees a live, aligned RingCtrl-sized block; atomics are valid for any bit pattern.
    let ctrl = unsafe { ctrl.as_ref() };
    ctrl.head.store(0, Ordering::Relaxed);
    ctrl.tail.store(0, Ordering::Release);
}

/// Zeroed heap memory aligned for rings: for rings inside one process (tests, benchmarks), where [`heap_ring`] and
/// [`heap_table`] give safe constructors.
pub struct HeapMem {
    ptr: NonNull<u8>,
    layout: std::alloc::Layout,
}

// SAFETY: plain owned heap memory; all access goes through ring halves whose own contracts order it.
unsafe impl Send for HeapMem {}
// SAFETY: as above (HeapMem itself only hands out its base pointer).
unsafe impl Sync for HeapMem {}

impl HeapMem {
    /// `len` zeroed bytes aligned to [`RING_ALIGN`] (panics if `len` is zero or allocation fails).
    pub fn new(len: usize) -> HeapMem {
        let layout = std::alloc::Layout::from_size_align(len.max(1), RING_ALIGN).expect("ring memory layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        HeapMem { ptr, layout }
    }

    /// Base address.
    pub fn base(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.layout.size()
    }

    /// Never true; for clippy.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The ring control block at the start of this memory, for tests that play a hostile peer.
    #[cfg(test)]
    pub(crate) fn ctrl(&self) -> &RingCtrl {
        assert!(self.len() >= size_of::<RingCtrl>());
        // SAFETY: at least a RingCtrl's bytes (asserted), aligned to RING_ALIGN, live as long as self; the fields
        // are atomics, valid for any bit pattern and only ever accessed atomically.
        unsafe { self.ptr.cast::<RingCtrl>().as_ref() }
    }
}

impl Drop for HeapMem {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout; the owners (ring halves) are gone.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// A new ring of `capacity` entries on the heap: its two halves (each keeps the memory alive). Panics if the
/// capacity is not a power of two in 1..=[`MAX_CAPACITY`].
pub fn heap_ring<T: Pod>(capacity: u32) -> (Producer<T>, Consumer<T>) {
    let len = ring_bytes(capacity, size_of::<T>()).expect("ring size overflows");
    let mem = Arc::new(HeapMem::new(len));
    let owner: Owner = mem.clone();
    // SAFETY: fresh memory of `len` bytes kept alive by the owner in each half; these are its only two halves.
    unsafe {
        let p = Producer::attach(mem.base(), len, capacity, Some(owner.clone())).expect("heap ring layout");
        let c = Consumer::attach(mem.base(), len, capacity, Some(owner)).expect("heap ring layout");
        (p, c)
    }
}

/// A new side table on the heap: a writer view and a reader view (for the producer and consumer side).
pub fn heap_table<T: Pod>(capacity: u32, per_slot: u32) -> (SlotTable<T>, SlotTable<T>) {
    let len = SlotTable::<T>::bytes(capacity, per_slot).expect("table size overflows");
    let mem = Arc::new(HeapMem::new(len));
    let owner: Owner = mem.clone();
    // SAFETY: fresh memory kept alive by the owner in each view; only the first view is used for writing (by
    // contract of this function's callers: producer side gets the first).
    unsafe {
        let w = SlotTable::attach(mem.base(), len, capacity, per_slot, Some(owner.clone())).expect("table layout");
        let r = SlotTable::attach(mem.base(), len, capacity, per_slot, Some(owner)).expect("table layout");
        (w, r)
    }
}

/// The writing half of a ring.
pub struct Producer<T: Pod> {
    raw: Raw<T>,
    /// Next index to write (local truth; published by `sync`).
    tail: u32,
    /// Tail as last published.
    published: u32,
    /// Consumer head as last observed (validated).
    cached_head: u32,
    corrupt: Option<RingError>,
    /// Loads of the consumer's head (each one a cache-line transfer when the consumer is busy).
    reloads: u64,
}

// SAFETY: the producer owns the ring's write side: there is exactly one per ring (the `attach` contract), it has no
// interior shared state in this process besides the shared-memory ring itself, and the mapping lives as long as it
// (contract or owner). Moving it to another thread keeps a single writer.
unsafe impl<T: Pod> Send for Producer<T> {}

impl<T: Pod> Producer<T> {
    /// Attaches the producer half to the ring at `base`. The producer's own index (tail) is read once, now.
    ///
    /// # Safety
    /// `base .. base + len` is readable and writable shared memory that stays mapped for as long as the producer
    /// lives (or `owner` keeps it mapped), and no other producer for this ring exists in any process that this
    /// side trusts (a hostile peer producing as well can only corrupt the entries, not this process's memory).
    pub unsafe fn attach(
        base: NonNull<u8>,
        len: usize,
        capacity: u32,
        owner: Option<Owner>,
    ) -> Result<Producer<T>, LayoutError> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::new(base, len, capacity, owner)? };
        let tail = raw.tail().load(Ordering::Relaxed);
        let cached_head = tail.wrapping_sub(capacity); // pessimistic: "full" until the first refresh
        Ok(Producer { raw, tail, published: tail, cached_head, corrupt: None, reloads: 0 })
    }

    /// Ring capacity.
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.raw.capacity()
    }

    /// Entries pushed but not yet published with [`sync`](Self::sync).
    #[inline]
    pub fn pending(&self) -> u32 {
        self.tail.wrapping_sub(self.published)
    }

    /// Reloads the consumer's head and checks it: it must not move backwards nor past our tail.
    fn refresh(&mut self) -> Result<(), RingError> {
        if let Some(e) = self.corrupt {
            return Err(e);
        }
        let head = self.raw.head().load(Ordering::Acquire);
        self.reloads += 1;
        // Valid heads lie in cached_head ..= tail (wrapping).
        if head.wrapping_sub(self.cached_head) > self.tail.wrapping_sub(self.cached_head) {
            let e = RingError::Corrupt {
                what: "consumer head outside [previous head, tail]",
                peer: head,
                local: self.tail,
            };
            self.corrupt = Some(e);
            return Err(e);
        }
        self.cached_head = head;
        Ok(())
    }

    /// How many times this half loaded the consumer's head (only when its cache said "full", or in `sync`).
    pub fn reloads(&self) -> u64 {
        self.reloads
    }

    /// Free slots according to the cached head (no shared-memory access).
    #[inline]
    pub fn free_cached(&self) -> u32 {
        self.capacity() - self.tail.wrapping_sub(self.cached_head)
    }

    /// Checks that the next slot is free (reloading the consumer's head if the cache says it is not): `Ok` means
    /// the slot of [`next_index`](Self::next_index), and its side-table slots, may be written now. Side tables must
    /// be written only after this, or they could overwrite data of an entry the consumer has not read yet.
    #[inline]
    pub fn reserve(&mut self) -> Result<(), RingError> {
        if let Some(e) = self.corrupt {
            return Err(e);
        }
        if self.free_cached() == 0 {
            self.refresh()?;
            if self.free_cached() == 0 {
                return Err(RingError::Full);
            }
        }
        Ok(())
    }

    /// Writes `value` into the next slot. It becomes visible to the consumer at the next [`sync`](Self::sync).
    #[inline]
    pub fn push(&mut self, value: T) -> Result<(), RingError> {
        self.reserve()?;
        // SAFETY: the slot pointer is in bounds (masked); the slot is free (tail - head < capacity by the check
        // above), so a well-behaved consumer is not reading it; a hostile one reading it only gets bytes.
        unsafe { store(self.raw.slot(self.tail), value) };
        self.tail = self.tail.wrapping_add(1);
        Ok(())
    }

    /// The slot index the next [`push`](Self::push) writes (for side tables indexed like the ring).
    #[inline]
    pub fn next_index(&self) -> u32 {
        self.tail
    }

    /// Publishes every pushed entry (Release: the slot writes happen before the consumer can see the tail) and
    /// refreshes the cached head. Returns the free slots.
    pub fn sync(&mut self) -> Result<u32, RingError> {
        self.publish();
        self.refresh()?;
        Ok(self.free_cached())
    }

    /// Publishes every pushed entry without reading the consumer's index.
    #[inline]
    pub fn publish(&mut self) {
        if self.published != self.tail {
            self.raw.tail().store(self.tail, Ordering::Release);
            self.published = self.tail;
        }
    }

    /// Stores an arbitrary tail without writing entries: for tests that play a hostile producer.
    #[doc(hidden)]
    pub fn publish_raw_tail(&mut self, tail: u32) {
        self.raw.tail().store(tail, Ordering::Release);
    }

    /// Writes `value` into the slot of free-running index `index`, free or not: for tests that play a producer
    /// rewriting entries while the consumer reads them.
    #[cfg(test)]
    pub(crate) fn store_raw(&mut self, index: u32, value: T) {
        // SAFETY: the slot pointer is in bounds (masked) and aligned; a consumer reading it concurrently copies out
        // whatever bytes it finds (a Pod value), which is what the tests want to provoke.
        unsafe { store(self.raw.slot(index), value) };
    }

    /// Pushes and publishes at once (the one-WQE post).
    #[inline]
    pub fn push_publish(&mut self, value: T) -> Result<(), RingError> {
        self.push(value)?;
        self.publish();
        Ok(())
    }
}

impl<T: Pod> Drop for Producer<T> {
    fn drop(&mut self) {
        // As io_uring's SubmissionQueue: whatever was pushed is handed over.
        self.publish();
    }
}

/// The reading half of a ring.
pub struct Consumer<T: Pod> {
    raw: Raw<T>,
    /// Next index to read (local truth; published by `sync`).
    head: u32,
    /// Head as last published.
    published: u32,
    /// Producer tail as last observed (validated).
    cached_tail: u32,
    corrupt: Option<RingError>,
    /// Loads of the producer's tail.
    reloads: u64,
}

// SAFETY: as for Producer: one consumer per ring, no shared in-process state, the mapping outlives it.
unsafe impl<T: Pod> Send for Consumer<T> {}

impl<T: Pod> Consumer<T> {
    /// Attaches the consumer half to the ring at `base`. The consumer's own index (head) is read once, now.
    ///
    /// # Safety
    /// As [`Producer::attach`], with "consumer" for "producer".
    pub unsafe fn attach(
        base: NonNull<u8>,
        len: usize,
        capacity: u32,
        owner: Option<Owner>,
    ) -> Result<Consumer<T>, LayoutError> {
        // SAFETY: forwarded contract.
        let raw = unsafe { Raw::new(base, len, capacity, owner)? };
        let head = raw.head().load(Ordering::Relaxed);
        Ok(Consumer { raw, head, published: head, cached_tail: head, corrupt: None, reloads: 0 })
    }

    /// Ring capacity.
    #[inline]
    pub fn capacity(&self) -> u32 {
        self.raw.capacity()
    }

    /// Reloads the producer's tail and checks it: at most `capacity` entries ahead of the head this half last
    /// handed back (the producer writes no slot before it is handed back, so entries read since then count
    /// against the capacity: a tail ahead of our own head by up to `capacity` let a producer that writes as the
    /// consumer reads keep one poll reading for ever), never behind our head, never backwards.
    fn refresh(&mut self) -> Result<(), RingError> {
        if let Some(e) = self.corrupt {
            return Err(e);
        }
        let tail = self.raw.tail().load(Ordering::Acquire);
        self.reloads += 1;
        // published <= head <= cached tail, all within `capacity` (checked here each time the tail is taken).
        let written = tail.wrapping_sub(self.published);
        let avail = tail.wrapping_sub(self.head);
        let what = if written > self.capacity() {
            Some("producer tail claims more entries than the ring holds")
        } else if avail > written || avail < self.cached_tail.wrapping_sub(self.head) {
            Some("producer tail moved backwards")
        } else {
            None
        };
        if let Some(what) = what {
            let e = RingError::Corrupt { what, peer: tail, local: self.head };
            self.corrupt = Some(e);
            return Err(e);
        }
        self.prefetch(self.cached_tail, tail);
        self.cached_tail = tail;
        Ok(())
    }

    /// Asks the CPU to fetch the slots of free-running indices `from .. to` (the entries a reload just found) into
    /// this core's cache, at most [`PREFETCH_BYTES`] of them. The producer wrote them on its core, so each is a
    /// cross-core transfer; requested together they overlap, instead of one stall per entry as they are popped.
    /// Only a hint: the indices are masked like every slot access, and a prefetch never faults.
    #[inline]
    fn prefetch(&self, from: u32, to: u32) {
        let size = size_of::<T>().max(1);
        let per_line = (64 / size).max(1) as u32;
        let n = to.wrapping_sub(from).min((PREFETCH_BYTES / size).max(1) as u32);
        let mut i = 0;
        while i < n {
            prefetch_line(self.raw.slot(from.wrapping_add(i)).cast::<u8>());
            i += per_line;
        }
    }

    /// How many times this half loaded the producer's tail (only when its cache said "empty", or in `sync`).
    pub fn reloads(&self) -> u64 {
        self.reloads
    }

    /// The free-running index of the next entry to read.
    #[inline]
    pub fn head_index(&self) -> u32 {
        self.head
    }

    /// A view of the producer's index for other threads ([`TailView`]); `None` for a ring attached without an owner
    /// that keeps its memory mapped.
    pub fn tail_view(&self) -> Option<TailView> {
        Some(TailView { ctrl: self.raw.ctrl, _owner: self.raw._owner.clone()? })
    }

    /// Entries available according to the cached tail (no shared-memory access).
    #[inline]
    pub fn len_cached(&self) -> u32 {
        self.cached_tail.wrapping_sub(self.head)
    }

    /// Whether a [`pop`](Self::pop) would find an entry: the cached tail when it says so (no shared-memory
    /// access), else the producer's tail reloaded and checked. A corrupt ring answers true, so that the caller's
    /// next pop reports the error.
    #[inline]
    pub fn has_entries(&mut self) -> bool {
        self.len_cached() > 0 || self.refresh().is_err() || self.len_cached() > 0
    }

    /// Copies the next entry out of the ring, with the index it had (for side tables indexed like the ring).
    /// `Ok(None)` when the ring is empty. The slot is handed back to the producer at the next
    /// [`sync`](Self::sync) or [`release`](Self::release), so side-table data of the entry stays put until then.
    #[inline]
    pub fn pop_indexed(&mut self) -> Result<Option<(u32, T)>, RingError> {
        if let Some(e) = self.corrupt {
            return Err(e);
        }
        if self.len_cached() == 0 {
            self.refresh()?;
            if self.len_cached() == 0 {
                return Ok(None);
            }
        }
        let index = self.head;
        // SAFETY: the slot pointer is in bounds (masked) and aligned; T is Pod, so whatever bytes the peer left (or
        // is writing right now) form a valid T. The copy is what gets validated, never the slot.
        let value = unsafe { load(self.raw.slot(index)) };
        self.head = index.wrapping_add(1);
        Ok(Some((index, value)))
    }

    /// Copies the next entry out of the ring; `Ok(None)` when it is empty.
    #[inline]
    pub fn pop(&mut self) -> Result<Option<T>, RingError> {
        Ok(self.pop_indexed()?.map(|(_, v)| v))
    }

    /// Pops up to `out.len()` entries; returns how many.
    pub fn pop_batch(&mut self, out: &mut [T]) -> Result<usize, RingError> {
        let mut n = 0;
        while n < out.len() {
            match self.pop()? {
                Some(v) => out[n] = v,
                None => break,
            }
            n += 1;
        }
        Ok(n)
    }

    /// Hands the consumed slots back to the producer (Release: our reads of them happen before) and refreshes
    /// the cached tail. Returns the entries available.
    pub fn sync(&mut self) -> Result<u32, RingError> {
        self.release();
        self.refresh()?;
        Ok(self.len_cached())
    }

    /// Stores an arbitrary head: for tests that play a hostile consumer.
    #[doc(hidden)]
    pub fn publish_raw_head(&mut self, head: u32) {
        self.raw.head().store(head, Ordering::Release);
    }

    /// Hands the consumed slots back without reading the producer's index.
    #[inline]
    pub fn release(&mut self) {
        if self.published != self.head {
            self.raw.head().store(self.head, Ordering::Release);
            self.published = self.head;
        }
    }
}

impl<T: Pod> Drop for Consumer<T> {
    fn drop(&mut self) {
        self.release();
    }
}

/// Per-slot side storage beside a ring (extra SGEs, inline data): `per_slot` elements for each of the ring's
/// `capacity` slots, addressed by the ring index of the entry they belong to (masked, so a hostile index stays in
/// the table). Either side may hold a view; the producer writes a slot before pushing its entry, the consumer
/// copies it out after popping the entry and before releasing it.
pub struct SlotTable<T: Pod> {
    base: NonNull<T>,
    per_slot: u32,
    mask: u32,
    _owner: Option<Owner>,
}

// SAFETY: a view of shared memory that outlives it (contract or owner); it writes only through &mut self, and the
// ring protocol (one producer, one consumer) decides which side touches which slot.
unsafe impl<T: Pod> Send for SlotTable<T> {}

impl<T: Pod> SlotTable<T> {
    /// Bytes a table of `capacity * per_slot` elements of `T` occupies, or `None` on overflow.
    pub const fn bytes(capacity: u32, per_slot: u32) -> Option<usize> {
        match (capacity as usize).checked_mul(per_slot as usize) {
            Some(n) => n.checked_mul(size_of::<T>()),
            None => None,
        }
    }

    /// Attaches a view of the table at `base`.
    ///
    /// # Safety
    /// `base .. base + len` is readable and writable shared memory that stays mapped for as long as the view lives
    /// (or `owner` keeps it mapped), and within this process only the ring's producer side writes through a view.
    pub unsafe fn attach(
        base: NonNull<u8>,
        len: usize,
        capacity: u32,
        per_slot: u32,
        owner: Option<Owner>,
    ) -> Result<SlotTable<T>, LayoutError> {
        if capacity == 0 || !capacity.is_power_of_two() || capacity > MAX_CAPACITY {
            return Err(LayoutError::BadCapacity(capacity));
        }
        let addr = base.as_ptr().addr();
        if !addr.is_multiple_of(align_of::<T>()) {
            return Err(LayoutError::Misaligned(addr));
        }
        let need = Self::bytes(capacity, per_slot).ok_or(LayoutError::BadCapacity(capacity))?;
        if len < need {
            return Err(LayoutError::TooShort { need, have: len });
        }
        Ok(SlotTable { base: base.cast(), per_slot, mask: capacity - 1, _owner: owner })
    }

    /// Elements per slot.
    #[inline]
    pub fn per_slot(&self) -> u32 {
        self.per_slot
    }

    /// Pointer to the first element of the slot of ring index `index`, and the slot length.
    #[inline]
    fn slot(&self, index: u32) -> *mut T {
        let at = (index & self.mask) as usize * self.per_slot as usize;
        // SAFETY: (index & mask) < capacity, so at + per_slot <= capacity * per_slot, checked against len at attach.
        unsafe { self.base.as_ptr().add(at) }
    }

    /// Writes `src` (at most `per_slot` elements; `None` otherwise) into the slot of ring index `index`.
    pub fn write(&mut self, index: u32, src: &[T]) -> Option<()> {
        if src.len() > self.per_slot as usize {
            return None;
        }
        let p = self.slot(index);
        for (i, v) in src.iter().enumerate() {
            // SAFETY: i < src.len() <= per_slot: inside the slot.
            unsafe { ptr::write_volatile(p.add(i), *v) };
        }
        Some(())
    }

    /// Writes element `k` (`None` if `k >= per_slot`) of the slot of ring index `index`.
    #[inline]
    pub fn set(&mut self, index: u32, k: usize, value: T) -> Option<()> {
        if k >= self.per_slot as usize {
            return None;
        }
        // SAFETY: k < per_slot: inside the slot.
        unsafe { ptr::write_volatile(self.slot(index).add(k), value) };
        Some(())
    }

    /// Copies element `k` (`None` if `k >= per_slot`) of the slot of ring index `index`.
    #[inline]
    pub fn get(&self, index: u32, k: usize) -> Option<T> {
        if k >= self.per_slot as usize {
            return None;
        }
        // SAFETY: k < per_slot: inside the slot; T is Pod, any bytes are a valid T.
        Some(unsafe { ptr::read_volatile(self.slot(index).add(k)) })
    }

    /// Copies the first `dst.len()` (at most `per_slot`; `None` otherwise) elements of the slot of ring index
    /// `index` into `dst`.
    pub fn read(&self, index: u32, dst: &mut [T]) -> Option<()> {
        if dst.len() > self.per_slot as usize {
            return None;
        }
        let p = self.slot(index);
        for (i, d) in dst.iter_mut().enumerate() {
            // SAFETY: i < dst.len() <= per_slot: inside the slot; T is Pod, any bytes are a valid T.
            *d = unsafe { ptr::read_volatile(p.add(i)) };
        }
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(cap: u32, mem: &HeapMem) -> (Producer<u64>, Consumer<u64>) {
        // SAFETY: mem outlives the halves in every test; one producer and one consumer.
        unsafe {
            (
                Producer::attach(mem.base(), mem.len(), cap, None).unwrap(),
                Consumer::attach(mem.base(), mem.len(), cap, None).unwrap(),
            )
        }
    }

    #[test]
    fn layout_checks() {
        let mem = HeapMem::new(ring_bytes(8, 8).unwrap());
        for bad in [0, 3, 12, MAX_CAPACITY * 2] {
            // SAFETY: memory valid; the attach fails before use.
            let r = unsafe { Producer::<u64>::attach(mem.base(), mem.len(), bad, None) };
            assert_eq!(r.err(), Some(LayoutError::BadCapacity(bad)));
        }
        // SAFETY: as above.
        let r = unsafe { Consumer::<u64>::attach(mem.base(), mem.len(), 16, None) };
        assert_eq!(r.err(), Some(LayoutError::TooShort { need: 256 + 128, have: 256 + 64 }));
        // SAFETY: one byte in is still inside the allocation; the attach fails on alignment.
        let r = unsafe { Consumer::<u64>::attach(mem.base().add(8), mem.len() - 8, 4, None) };
        assert!(matches!(r.err(), Some(LayoutError::Misaligned(_))));
    }

    #[test]
    fn fifo_full_empty_and_wraparound() {
        let mem = HeapMem::new(ring_bytes(4, 8).unwrap());
        // Start near the u32 wrap so the free-running indices overflow during the test.
        mem.ctrl().head.store(u32::MAX - 5, Ordering::Relaxed);
        mem.ctrl().tail.store(u32::MAX - 5, Ordering::Relaxed);
        let (mut p, mut c) = pair(4, &mem);
        let mut next_in = 0u64;
        let mut next_out = 0u64;
        for round in 0..20 {
            for _ in 0..4 {
                p.push(next_in).unwrap();
                next_in += 1;
            }
            assert_eq!(p.push(99), Err(RingError::Full), "round {round}");
            assert_eq!(c.pop(), Ok(None), "unpublished entries are invisible");
            assert_eq!(p.sync(), Ok(0));
            let mut out = [0u64; 3];
            assert_eq!(c.pop_batch(&mut out), Ok(3));
            assert_eq!(out, [next_out, next_out + 1, next_out + 2]);
            next_out += 3;
            assert_eq!(p.push(99), Err(RingError::Full), "slots come back only at the consumer's sync");
            assert_eq!(c.sync(), Ok(1));
            assert_eq!(c.pop(), Ok(Some(next_out)));
            next_out += 1;
            assert_eq!(c.pop(), Ok(None));
            c.release();
        }
        assert!(mem.ctrl().tail.load(Ordering::Relaxed) < 100, "indices wrapped");
    }

    #[test]
    fn far_index_is_loaded_only_when_the_cache_runs_out() {
        let mem = HeapMem::new(ring_bytes(8, 8).unwrap());
        let (mut p, mut c) = pair(8, &mem);
        for i in 0..8 {
            p.push(i).unwrap();
        }
        assert_eq!(p.reloads(), 1, "one load: the first push found the pessimistic cache full");
        assert_eq!(p.push(8), Err(RingError::Full));
        assert_eq!(p.reloads(), 2);
        p.publish();
        for i in 0..8 {
            assert_eq!(c.pop(), Ok(Some(i)));
        }
        assert_eq!(c.reloads(), 1, "one load of the tail served all 8 entries");
        assert_eq!(c.pop(), Ok(None));
        assert_eq!(c.reloads(), 2);
        c.release();
        for i in 0..8 {
            p.push(i).unwrap();
        }
        assert_eq!(p.reloads(), 3, "one load of the head freed all 8 slots");
    }

    #[test]
    fn slot_table_masks_and_bounds() {
        let mem = HeapMem::new(SlotTable::<u32>::bytes(4, 3).unwrap());
        // SAFETY: mem outlives the views.
        let mut w = unsafe { SlotTable::<u32>::attach(mem.base(), mem.len(), 4, 3, None).unwrap() };
        // SAFETY: as above.
        let r = unsafe { SlotTable::<u32>::attach(mem.base(), mem.len(), 4, 3, None).unwrap() };
        assert_eq!(w.write(1, &[1, 2, 3]), Some(()));
        assert_eq!(w.write(1, &[1, 2, 3, 4]), None);
        let mut d = [0u32; 2];
        assert_eq!(r.read(5 + 4 * 1000, &mut d), Some(()), "index is masked");
        assert_eq!(d, [1, 2]);
        assert_eq!((r.get(1, 2), r.get(1, 3)), (Some(3), None));
        assert_eq!((w.set(9, 0, 7), w.set(1, 3, 7)), (Some(()), None));
        assert_eq!(r.get(1, 0), Some(7));
        assert_eq!(r.read(1, &mut [0u32; 4]), None);
    }

    #[test]
    fn corrupt_tail_is_detected_and_sticky() {
        let mem = HeapMem::new(ring_bytes(8, 8).unwrap());
        let (mut p, mut c) = pair(8, &mem);
        p.push_publish(7).unwrap();
        assert_eq!(c.pop(), Ok(Some(7)));
        mem.ctrl().tail.store(1 + 9, Ordering::Release); // claims 9 entries in a ring of 8
        let e = c.pop().unwrap_err();
        assert!(matches!(e, RingError::Corrupt { peer: 10, local: 1, .. }), "{e:?}");
        mem.ctrl().tail.store(2, Ordering::Release); // plausible again: still refused
        assert_eq!(c.pop(), Err(e));
        assert_eq!(c.sync(), Err(e));
    }

    #[test]
    fn has_entries_uses_the_cache_and_reports_corruption() {
        let mem = HeapMem::new(ring_bytes(8, 8).unwrap());
        let (mut p, mut c) = pair(8, &mem);
        assert!(!c.has_entries());
        assert_eq!(c.reloads(), 1, "an empty cache reloads the tail");
        p.push(1).unwrap();
        assert!(!c.has_entries(), "an unpublished entry is invisible");
        p.push(2).unwrap();
        p.publish();
        assert!(c.has_entries());
        let loads = c.reloads();
        assert!(c.has_entries() && c.has_entries());
        assert_eq!(c.reloads(), loads, "the cached tail answers while it says there is more");
        assert_eq!((c.pop(), c.pop()), (Ok(Some(1)), Ok(Some(2))));
        mem.ctrl().tail.store(2 + 9, Ordering::Release); // claims 9 entries in a ring of 8
        assert!(c.has_entries(), "a corrupt ring answers true");
        assert!(matches!(c.pop(), Err(RingError::Corrupt { peer: 11, local: 2, .. })));
        assert!(c.has_entries(), "and keeps answering true (sticky)");
    }

    /// The producer may write only the slots the consumer handed back: entries the consumer has read but not yet
    /// released still count. A tail up to `capacity` past the consumer's *own* head but past the released head
    /// plus `capacity` is a producer overwriting slots it was not given (and, refreshed as each batch is read,
    /// kept one poll of the client library's reading for ever): corrupt. The released head plus `capacity` is
    /// still fine, and so is any tail once the slots are released.
    #[test]
    fn tail_past_the_released_slots_is_corrupt() {
        // A full ring of 8 whose entries the consumer has read, the first `released` of them handed back.
        let read_all = |released: u64| {
            let (mut p, mut c) = heap_ring::<u64>(8);
            for i in 0..8 {
                p.push(i).unwrap();
            }
            p.publish();
            for i in 0..8 {
                if i == released {
                    c.release();
                }
                assert_eq!(c.pop(), Ok(Some(i)));
            }
            (p, c)
        };
        // None handed back: the producer has no free slot. A tail of 8 + 8 is "8 more" from the consumer's own
        // head, but 16 entries from the released one.
        let (mut p, mut c) = read_all(8);
        p.publish_raw_tail(16);
        let e = c.pop().unwrap_err();
        let what = "producer tail claims more entries than the ring holds";
        assert!(matches!(e, RingError::Corrupt { what: w, peer: 16, local: 8 } if w == what), "{e:?}");
        // Four handed back: a tail of 12 is fine, 13 is not.
        let (mut p, mut c) = read_all(4);
        p.publish_raw_tail(12);
        for i in 0..4 {
            assert_eq!(c.pop(), Ok(Some(i)), "slots 0..4 again, as the producer left them");
        }
        assert_eq!(c.pop(), Ok(None));
        p.publish_raw_tail(13);
        assert!(matches!(c.pop(), Err(RingError::Corrupt { peer: 13, local: 12, .. })));
    }

    /// Session 16 review of the released-head check: a well-behaved producer on another thread, free-running
    /// indices crossing the u32 wrap, and a consumer that reads in runs and hands its slots back only now and then
    /// (many entries read but not yet released, the producer waiting on them): never taken for corrupt, every entry
    /// in order.
    #[test]
    fn a_producer_writing_only_released_slots_is_never_corrupt_across_the_wrap() {
        const N: u64 = if cfg!(miri) { 2_000 } else { 200_000 };
        let mem = HeapMem::new(ring_bytes(8, 8).unwrap());
        mem.ctrl().head.store(u32::MAX - 50, Ordering::Relaxed);
        mem.ctrl().tail.store(u32::MAX - 50, Ordering::Relaxed);
        let (mut p, mut c) = pair(8, &mem);
        std::thread::scope(|sc| {
            sc.spawn(move || {
                let mut next = 0u64;
                while next < N {
                    match p.push(next) {
                        Ok(()) => next += 1,
                        Err(RingError::Full) => {
                            p.publish();
                            std::thread::yield_now();
                        }
                        Err(e) => panic!("producer: {e:?}"),
                    }
                    if next.is_multiple_of(3) {
                        p.publish();
                    }
                }
                p.publish();
            });
            let mut want = 0u64;
            let mut since_release = 0u32;
            while want < N {
                match c.pop() {
                    Ok(Some(v)) => {
                        assert_eq!(v, want);
                        want += 1;
                        since_release += 1;
                        // Hand slots back in varying runs (up to the whole ring).
                        if since_release > (want % 8) as u32 {
                            c.release();
                            since_release = 0;
                        }
                    }
                    Ok(None) => {
                        c.release();
                        since_release = 0;
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("consumer at {want}: {e:?}"),
                }
            }
        });
        assert!(c.head < u32::MAX - 50, "the indices wrapped");
    }

    #[test]
    fn tail_moving_backwards_is_corrupt() {
        let mem = HeapMem::new(ring_bytes(8, 8).unwrap());
        let (mut p, mut c) = pair(8, &mem);
        for i in 0..5 {
            p.push(i).unwrap();
        }
        p.publish();
        assert_eq!(c.pop(), Ok(Some(0)));
        assert_eq!(c.sync(), Ok(4));
        mem.ctrl().tail.store(3, Ordering::Release);
        assert!(matches!(c.sync(), Err(RingError::Corrupt { what: "producer tail moved backwards", .. })));
    }

    #[test]
    fn corrupt_head_is_detected_by_the_producer() {
        let mem = HeapMem::new(ring_bytes(4, 8).unwrap());
        let (mut p, _c) = pair(4, &mem);
        for i in 0..4 {
            p.push(i).unwrap();
        }
        mem.ctrl().head.store(4000, Ordering::Release); // consumed more than was produced
        assert!(matches!(p.sync(), Err(RingError::Corrupt { peer: 4000, .. })));
        assert!(matches!(p.push(1), Err(RingError::Corrupt { .. })));
    }

    #[test]
    fn own_index_scribbled_by_the_peer_is_ignored() {
        let mem = HeapMem::new(ring_bytes(4, 8).unwrap());
        let (mut p, mut c) = pair(4, &mem);
        p.push_publish(1).unwrap();
        assert_eq!(c.pop(), Ok(Some(1)));
        c.release();
        // The peer rewrites the consumer's published head; the consumer keeps its own index.
        mem.ctrl().head.store(12345, Ordering::Relaxed);
        p.push_publish(2).unwrap(); // room according to the producer's cache: no reload yet
        assert_eq!(c.pop(), Ok(Some(2)));
        assert_eq!(c.pop(), Ok(None));
        assert_eq!(c.len_cached(), 0);
        // The producer, on reloading, sees the impossible head and refuses (as it should).
        assert!(matches!(p.sync(), Err(RingError::Corrupt { peer: 12345, .. })));
    }

    #[test]
    fn two_threads_two_million_in_order() {
        // Miri runs the same interleavings far slower: fewer entries there.
        const N: u64 = if cfg!(miri) { 2_000 } else { 2_000_000 };
        let (mut p, mut c) = heap_ring::<u64>(256);
        let producer = std::thread::spawn(move || {
            let mut i = 0u64;
            while i < N {
                // Mix single publishes and batches.
                match p.push(i.wrapping_mul(0x9e37_79b9_7f4a_7c15)) {
                    Ok(()) => {
                        i += 1;
                        if i.is_multiple_of(7) {
                            p.publish();
                        }
                    }
                    Err(RingError::Full) => {
                        p.sync().unwrap();
                        std::thread::yield_now();
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            p.publish();
        });
        let mut expect = 0u64;
        let mut buf = [0u64; 32];
        while expect < N {
            let n = c.pop_batch(&mut buf).unwrap();
            for v in &buf[..n] {
                assert_eq!(*v, expect.wrapping_mul(0x9e37_79b9_7f4a_7c15), "entry {expect}");
                expect += 1;
            }
            if n == 0 {
                c.sync().unwrap();
                std::thread::yield_now();
            } else {
                c.release();
            }
        }
        producer.join().unwrap();
        assert_eq!(c.sync(), Ok(0));
    }
}
