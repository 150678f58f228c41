//! Work queues and completion queues over the rings: the client side writes WQEs (extra SGEs and inline payload
//! into the slot's side tables first), the daemon side reads each one back, validates it and writes it into the
//! engine's send-queue slot (`Engine::post_sends_with`), or hands out a [`SendRequest`] or a receive SGE list ready
//! for `Engine::post_send` / `post_recv`; completions go the other way.
//!
//! The readers never trust the writer: ring indices are checked by the ring ([`RingError::Corrupt`]), each WQE is
//! copied out and then validated ([`WqeError`]), side-table reads are bounded by the already validated `num_sge`
//! and `inline_len`. What the daemon still has to check itself is whether each SGE's lkey belongs to the posting
//! client (the engine's per-PD key check).

use core::fmt;

use super::abi::{Cqe, CqeError, RecvWqe, SendRequest, Sge, SgeList, Wqe, WqeError, WqeLimits};
use super::ring::{Consumer, Producer, RingError, SlotTable};
use crate::engine::SendSlot;
use crate::verbs::{self, SendWr};

/// Why a work-queue operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WqError {
    /// The ring is full (writers) or its indices are corrupt (readers: the QP must go to the error state).
    Ring(RingError),
    /// A WQE the reader refuses (the QP must go to the error state; complete `wr_id` with
    /// [`Cqe::refused`]), or that a writer refuses to post.
    Wqe {
        /// Ring index of the WQE.
        index: u32,
        /// Its `wr_id` as read.
        wr_id: u64,
        /// What is wrong.
        error: WqeError,
    },
    /// The side tables given to a constructor are too small for the limits.
    Geometry(&'static str),
    /// A CQE the client cannot decode.
    Cqe(CqeError),
}

impl fmt::Display for WqError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WqError::Ring(e) => write!(f, "{e}"),
            WqError::Wqe { index, wr_id, error } => write!(f, "WQE {index} (wr_id {wr_id:#x}): {error}"),
            WqError::Geometry(what) => write!(f, "work queue side table too small: {what}"),
            WqError::Cqe(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for WqError {}

impl From<RingError> for WqError {
    fn from(e: RingError) -> WqError {
        WqError::Ring(e)
    }
}

fn check_tables(
    max_sge: u8,
    sges: Option<&SlotTable<Sge>>,
    max_inline: u32,
    inline: Option<&SlotTable<u8>>,
) -> Result<(), WqError> {
    if max_sge > 1 && sges.is_none_or(|t| t.per_slot() < u32::from(max_sge) - 1) {
        return Err(WqError::Geometry("SGE table holds fewer than max_sge - 1 SGEs per slot"));
    }
    if max_inline > 0 && inline.is_none_or(|t| t.per_slot() < max_inline) {
        return Err(WqError::Geometry("inline area holds fewer than max_inline bytes per slot"));
    }
    Ok(())
}

/// The error for the WQE at ring index `index` (its `wr_id` as read) that the reader refuses (out of the per-WR
/// path). By value, not the WQE by reference: a reference made the worker's loop keep each WQE's copy on the
/// stack (eight stores a WR) for this path alone.
#[cold]
#[inline(never)]
fn refused(index: u32, wr_id: u64, error: WqeError) -> WqError {
    WqError::Wqe { index, wr_id, error }
}

/// SGE `k` (k >= 1) of ring slot `index` from the side table (zero if there is none; the constructors make sure
/// there is one whenever `max_sge > 1`, and decoding asks only for k < num_sge <= max_sge <= per_slot + 1).
fn ext_sge(table: Option<&SlotTable<Sge>>, index: u32, k: usize) -> Sge {
    table.and_then(|t| t.get(index, k - 1)).unwrap_or_default()
}

/// Writes SGEs 2..n of `sgl` into the side-table slot of ring index `index`: the slot of the WQE about to be pushed,
/// which the caller reserved; the table is long enough for max_sge (constructor check).
fn write_ext(table: Option<&mut SlotTable<Sge>>, index: u32, sgl: &[verbs::Sge]) {
    if let Some(t) = table {
        for (k, s) in sgl.iter().enumerate().skip(1) {
            let _ = t.set(index, k - 1, (*s).into());
        }
    }
}

/// The daemon's reader of a QP's send queue.
pub struct SendQueueReader {
    ring: Consumer<Wqe>,
    sges: Option<SlotTable<Sge>>,
    inline: Option<SlotTable<u8>>,
    limits: WqeLimits,
}

impl SendQueueReader {
    /// A reader over the send ring and its side tables (views of the same region), validating against `limits`.
    pub fn new(
        ring: Consumer<Wqe>,
        sges: Option<SlotTable<Sge>>,
        inline: Option<SlotTable<u8>>,
        limits: WqeLimits,
    ) -> Result<SendQueueReader, WqError> {
        check_tables(limits.max_sge, sges.as_ref(), limits.max_inline, inline.as_ref())?;
        Ok(SendQueueReader { ring, sges, inline, limits })
    }

    /// Validates the next request into `req` (in place: no copy of its 512-byte SGE list); `Ok(false)` if the
    /// queue is empty. Inline payload is copied into `inline_out[..req.inline_len]` (give it `max_inline` bytes).
    /// The slot goes back to the client at the next [`sync`](Self::sync) or [`release`](Self::release).
    ///
    /// Inlined, with the validation, into the worker's ring loop (the per-WR path: one copy of the WQE out of the
    /// ring, its checks, the stores of `req`); the inline payload's copy and the error's construction stay out of
    /// line.
    #[inline(always)]
    pub fn poll_into(&mut self, req: &mut SendRequest, inline_out: &mut [u8]) -> Result<bool, WqError> {
        let Some((index, wqe)) = self.ring.pop_indexed()? else {
            return Ok(false);
        };
        if let Err(error) = wqe.decode_into(self.limits, req, |k| ext_sge(self.sges.as_ref(), index, k)) {
            return Err(refused(index, wqe.wr_id, error));
        }
        if req.inline_len > 0 {
            self.read_inline(index, wqe.wr_id, req.inline_len, inline_out)?;
        }
        Ok(true)
    }

    /// Validates the next request straight into the engine's send-queue slot `slot` (the source of
    /// `Engine::post_sends_with`): the WR, its SGEs, and its inline payload copied out of the ring's inline area
    /// into the slot's. `Ok(Some(n))`: `n` SGEs, or with `wr.inline` `n` bytes of inline payload; `Ok(None)` if
    /// the queue is empty. The same checks as [`poll_into`](Self::poll_into) (at most `slot.sges.len()` SGEs and
    /// `slot.inline.len()` inline bytes besides the QP's limits), and as there the slot goes back to the client at
    /// the next [`release`](Self::release).
    #[inline(always)]
    pub fn poll_to(&mut self, slot: SendSlot<'_>) -> Result<Option<u32>, WqError> {
        let Some((index, wqe)) = self.ring.pop_indexed()? else {
            return Ok(None);
        };
        let d = match wqe.decode_to(self.limits, slot.wr, slot.sges, |k| ext_sge(self.sges.as_ref(), index, k)) {
            Ok(d) => d,
            Err(error) => return Err(refused(index, wqe.wr_id, error)),
        };
        if d.inline_len > 0 {
            self.read_inline(index, wqe.wr_id, d.inline_len, slot.inline)?;
            return Ok(Some(d.inline_len));
        }
        Ok(Some(u32::from(d.num_sge)))
    }

    /// The inline payload of slot `index` (`len` bytes, validated against `max_inline`) into `out`.
    #[inline(never)]
    fn read_inline(&self, index: u32, wr_id: u64, len: u32, out: &mut [u8]) -> Result<(), WqError> {
        let max = u32::try_from(out.len()).unwrap_or(u32::MAX);
        let Some(dst) = out.get_mut(..len as usize) else {
            return Err(refused(index, wr_id, WqeError::InlineTooLong { len, max }));
        };
        // Cannot fail: len <= max_inline <= per_slot (checked by decode and at construction).
        let _ = self.inline.as_ref().and_then(|t| t.read(index, dst));
        Ok(())
    }

    /// Whether [`poll_into`](Self::poll_into) has something to say: a WQE waits, or the ring is corrupt (the
    /// cached tail, reloaded from shared memory only when it says the queue is empty).
    #[inline]
    pub fn has_work(&mut self) -> bool {
        self.ring.has_entries()
    }

    /// [`poll_into`](Self::poll_into) returning the request by value.
    pub fn poll(&mut self, inline_out: &mut [u8]) -> Result<Option<SendRequest>, WqError> {
        let mut req = SendRequest::default();
        Ok(self.poll_into(&mut req, inline_out)?.then_some(req))
    }

    /// Hands consumed slots back and reloads the client's tail; returns the WQEs waiting.
    pub fn sync(&mut self) -> Result<u32, WqError> {
        Ok(self.ring.sync()?)
    }

    /// Hands consumed slots back.
    pub fn release(&mut self) {
        self.ring.release();
    }
}

/// The daemon's reader of a QP's receive queue.
pub struct RecvQueueReader {
    ring: Consumer<RecvWqe>,
    sges: Option<SlotTable<Sge>>,
    max_sge: u8,
}

impl RecvQueueReader {
    /// A reader over the receive ring and its SGE table.
    pub fn new(ring: Consumer<RecvWqe>, sges: Option<SlotTable<Sge>>, max_sge: u8) -> Result<Self, WqError> {
        check_tables(max_sge, sges.as_ref(), 0, None)?;
        Ok(RecvQueueReader { ring, sges, max_sge })
    }

    /// Validates the next receive request, filling `sges` in place; its `wr_id`, or `Ok(None)` if the queue is
    /// empty.
    pub fn poll_into(&mut self, sges: &mut SgeList) -> Result<Option<u64>, WqError> {
        let Some((index, wqe)) = self.ring.pop_indexed()? else {
            return Ok(None);
        };
        let r = wqe.decode_into(self.max_sge, sges, |k| ext_sge(self.sges.as_ref(), index, k));
        r.map(Some).map_err(|error| WqError::Wqe { index, wr_id: wqe.wr_id, error })
    }

    /// Whether [`poll_into`](Self::poll_into) has something to say (see [`SendQueueReader::has_work`]).
    #[inline]
    pub fn has_work(&mut self) -> bool {
        self.ring.has_entries()
    }

    /// Hands consumed slots back.
    #[inline]
    pub fn release(&mut self) {
        self.ring.release();
    }

    /// [`poll_into`](Self::poll_into) returning `(wr_id, sges)` by value.
    pub fn poll(&mut self) -> Result<Option<(u64, SgeList)>, WqError> {
        let mut sges = SgeList::EMPTY;
        Ok(self.poll_into(&mut sges)?.map(|id| (id, sges)))
    }

    /// Hands consumed slots back and reloads the client's tail; returns the WQEs waiting.
    pub fn sync(&mut self) -> Result<u32, WqError> {
        Ok(self.ring.sync()?)
    }
}

/// The client's writer of a QP's send queue.
pub struct SendQueueWriter {
    ring: Producer<Wqe>,
    sges: Option<SlotTable<Sge>>,
    inline: Option<SlotTable<u8>>,
    limits: WqeLimits,
}

impl SendQueueWriter {
    /// A writer over the send ring and its side tables.
    pub fn new(
        ring: Producer<Wqe>,
        sges: Option<SlotTable<Sge>>,
        inline: Option<SlotTable<u8>>,
        limits: WqeLimits,
    ) -> Result<SendQueueWriter, WqError> {
        check_tables(limits.max_sge, sges.as_ref(), limits.max_inline, inline.as_ref())?;
        Ok(SendQueueWriter { ring, sges, inline, limits })
    }

    fn refuse(&self, wr: &SendWr, error: WqeError) -> WqError {
        WqError::Wqe { index: self.ring.next_index(), wr_id: wr.wr_id, error }
    }

    /// Posts `wr` with `sgl` and publishes it (one Release store): the daemon may pick it up at once.
    #[inline]
    pub fn post(&mut self, wr: &SendWr, sgl: &[verbs::Sge]) -> Result<(), WqError> {
        self.stage(wr, sgl)?;
        self.ring.publish();
        Ok(())
    }

    /// Writes `wr` with `sgl` into the ring without publishing it: the daemon sees it, with every WQE staged
    /// before it, at the next [`publish`](Self::publish) or [`post`](Self::post). A batch of WRs then costs one
    /// store of the tail, and one transfer of its cache line to the polling worker, instead of one per WR (as
    /// `ibv_post_send` with a chain of WRs rings one doorbell). Staged WQEs count against the ring's room: a ring
    /// full of them stays full until they are published.
    ///
    /// Inlined into the application's loop (the per-WR path of a batch): the checks, one slot write.
    #[inline(always)]
    pub fn stage(&mut self, wr: &SendWr, sgl: &[verbs::Sge]) -> Result<(), WqError> {
        let max = self.limits.max_sge;
        if sgl.len() > usize::from(max) {
            return Err(self.too_many_sge(wr, sgl.len()));
        }
        if sgl.len() > 1 {
            self.ring.reserve()?; // before touching the slot's side table
            write_ext(self.sges.as_mut(), self.ring.next_index(), sgl);
        }
        self.ring.push(Wqe::encode_as(wr, false, sgl, 0))?;
        Ok(())
    }

    #[cold]
    #[inline(never)]
    fn too_many_sge(&self, wr: &SendWr, n: usize) -> WqError {
        let num_sge = u8::try_from(n).unwrap_or(u8::MAX);
        self.refuse(wr, WqeError::TooManySge { num_sge, max: self.limits.max_sge })
    }

    /// Publishes every staged WQE (one Release store; nothing if none is staged).
    #[inline]
    pub fn publish(&mut self) {
        self.ring.publish();
    }

    /// WQEs staged and not yet published.
    #[inline]
    pub fn staged(&self) -> u32 {
        self.ring.pending()
    }

    /// Posts `wr` with `data` copied into the slot's inline area (the buffer is free again on return).
    pub fn post_inline(&mut self, wr: &SendWr, data: &[u8]) -> Result<(), WqError> {
        let max = self.limits.max_inline;
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        if wr.opcode.is_rd_atomic() {
            return Err(self.refuse(wr, WqeError::InlineNotAllowed(super::abi::wr_opcode_code(wr.opcode))));
        }
        if len > max {
            return Err(self.refuse(wr, WqeError::InlineTooLong { len, max }));
        }
        self.ring.reserve()?; // before touching the slot's inline area
        let index = self.ring.next_index();
        if let Some(t) = self.inline.as_mut() {
            let _ = t.write(index, data);
        }
        self.ring.push_publish(Wqe::encode_as(wr, true, &[], len))?;
        Ok(())
    }
}

/// The client's writer of a QP's receive queue.
pub struct RecvQueueWriter {
    ring: Producer<RecvWqe>,
    sges: Option<SlotTable<Sge>>,
    max_sge: u8,
}

impl RecvQueueWriter {
    /// A writer over the receive ring and its SGE table.
    pub fn new(ring: Producer<RecvWqe>, sges: Option<SlotTable<Sge>>, max_sge: u8) -> Result<Self, WqError> {
        check_tables(max_sge, sges.as_ref(), 0, None)?;
        Ok(RecvQueueWriter { ring, sges, max_sge })
    }

    /// Posts a receive request and publishes it.
    pub fn post(&mut self, wr_id: u64, sgl: &[verbs::Sge]) -> Result<(), WqError> {
        if sgl.len() > usize::from(self.max_sge) {
            let num_sge = u8::try_from(sgl.len()).unwrap_or(u8::MAX);
            let error = WqeError::TooManySge { num_sge, max: self.max_sge };
            return Err(WqError::Wqe { index: self.ring.next_index(), wr_id, error });
        }
        self.ring.reserve()?; // before touching the slot's side table
        write_ext(self.sges.as_mut(), self.ring.next_index(), sgl);
        self.ring.push_publish(RecvWqe::encode(wr_id, sgl))?;
        Ok(())
    }
}

/// The client's reader of a CQ ring.
pub struct CqReader {
    ring: Consumer<Cqe>,
    /// A CQE that failed to decode after others were returned: reported by the next poll.
    deferred: Option<CqeError>,
}

impl CqReader {
    /// A reader over the completion ring.
    pub fn new(ring: Consumer<Cqe>) -> CqReader {
        CqReader { ring, deferred: None }
    }

    /// The ring index of the next completion to read (free-running).
    pub fn head_index(&self) -> u32 {
        self.ring.head_index()
    }

    /// A view of the daemon's index in the ring, for other threads (`None` for a heap ring without an owner).
    pub fn tail_view(&self) -> Option<super::ring::TailView> {
        self.ring.tail_view()
    }

    /// Completions waiting in the ring, looking at the daemon's tail now (nothing is consumed): the re-check after
    /// arming a CQ. An error if the ring is corrupt.
    pub fn pending(&mut self) -> Result<u32, WqError> {
        Ok(self.ring.sync()?)
    }

    /// Up to `out.len()` completions (`ibv_poll_cq`); slots go back to the daemon before returning. A CQE that
    /// cannot be decoded is an error, reported once, after the good completions polled before it.
    #[inline]
    pub fn poll(&mut self, out: &mut [verbs::Cqe]) -> Result<usize, WqError> {
        self.poll_skipping(out, |_, _| false)
    }

    /// [`poll`](Self::poll), but the completions for which `skip(ring index, completion)` says true are consumed
    /// and not returned (those of a destroyed QP).
    pub fn poll_skipping(
        &mut self,
        out: &mut [verbs::Cqe],
        mut skip: impl FnMut(u32, &verbs::Cqe) -> bool,
    ) -> Result<usize, WqError> {
        if let Some(e) = self.deferred.take() {
            return Err(WqError::Cqe(e));
        }
        let mut n = 0;
        while n < out.len() {
            let Some((i, c)) = self.ring.pop_indexed()? else { break };
            match c.decode() {
                Ok(d) if skip(i, &d) => continue,
                Ok(d) => out[n] = d,
                Err(e) => {
                    self.deferred = Some(e);
                    break;
                }
            }
            n += 1;
        }
        self.ring.release();
        if n == 0 {
            if let Some(e) = self.deferred.take() {
                return Err(WqError::Cqe(e));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::super::abi::{send_flags, wr_opcode, MAX_WQE_SGE};
    use super::super::ring::{heap_ring, heap_table};
    use super::*;
    use crate::sim::SimRng;
    use crate::verbs::{WcOpcode, WcStatus, WrOpcode};

    const LIMITS: WqeLimits = WqeLimits { max_sge: 4, max_inline: 128 };
    const CAP: u32 = 16;

    fn send_pair() -> (SendQueueWriter, SendQueueReader) {
        let (p, c) = heap_ring::<Wqe>(CAP);
        let (sw, sr) = heap_table::<Sge>(CAP, 3);
        let (iw, ir) = heap_table::<u8>(CAP, 128);
        (
            SendQueueWriter::new(p, Some(sw), Some(iw), LIMITS).unwrap(),
            SendQueueReader::new(c, Some(sr), Some(ir), LIMITS).unwrap(),
        )
    }

    fn sgl(n: u32, seed: u32) -> Vec<verbs::Sge> {
        (0..n)
            .map(|i| verbs::Sge { addr: u64::from(seed) << 20 | u64::from(i) << 12, len: 100 + i, lkey: seed + i })
            .collect()
    }

    #[test]
    fn constructors_check_side_tables() {
        let (_, c) = heap_ring::<Wqe>(CAP);
        let (_, small) = heap_table::<Sge>(CAP, 2);
        let e = SendQueueReader::new(c, Some(small), None, LIMITS).err();
        assert!(matches!(e, Some(WqError::Geometry(_))));
        let (_, c) = heap_ring::<Wqe>(CAP);
        let (_, t) = heap_table::<Sge>(CAP, 3);
        assert!(matches!(SendQueueReader::new(c, Some(t), None, LIMITS), Err(WqError::Geometry(_))), "no inline area");
    }

    #[test]
    fn send_queue_round_trip_with_side_sges_and_inline() {
        let (mut w, mut r) = send_pair();
        let mut inline = [0u8; 128];
        for round in 0..5u32 {
            // 10 WQEs per round through a 16-slot ring: wraps.
            for i in 0..10u32 {
                let seed = round * 10 + i;
                let wr = SendWr::new(u64::from(seed), WrOpcode::RdmaWrite).remote(0x9000, 7);
                if i % 3 == 0 {
                    let data: Vec<u8> = (0..(seed % 129) as u8).collect();
                    w.post_inline(&wr, &data).unwrap();
                } else {
                    w.post(&wr, &sgl(i % 5, seed)).unwrap();
                }
            }
            for i in 0..10u32 {
                let seed = round * 10 + i;
                let req = r.poll(&mut inline).unwrap().expect("posted");
                assert_eq!(req.wr.wr_id, u64::from(seed));
                if i % 3 == 0 {
                    assert!(req.wr.inline);
                    let n = (seed % 129) as usize;
                    assert_eq!(req.inline_len as usize, n);
                    assert!(inline[..n].iter().enumerate().all(|(k, b)| *b == k as u8));
                } else {
                    assert_eq!(req.sges.as_slice(), &sgl(i % 5, seed)[..]);
                }
            }
            assert_eq!(r.poll(&mut inline), Ok(None));
            r.release();
        }
        let wr = SendWr::new(1, WrOpcode::Send);
        assert!(matches!(w.post(&wr, &sgl(5, 1)), Err(WqError::Wqe { error: WqeError::TooManySge { .. }, .. })));
        assert!(matches!(w.post_inline(&wr, &[0; 129]), Err(WqError::Wqe { .. })));
    }

    #[test]
    fn staged_wqes_are_invisible_until_published() {
        let (mut w, mut r) = send_pair();
        let mut inline = [0u8; 128];
        for i in 0..5u64 {
            w.stage(&SendWr::new(i, WrOpcode::RdmaWrite).remote(0x9000, 7), &sgl(2, i as u32)).unwrap();
        }
        assert_eq!(w.staged(), 5);
        assert!(!r.has_work(), "staged WQEs are not published");
        assert_eq!(r.poll(&mut inline), Ok(None));
        w.publish();
        assert_eq!(w.staged(), 0);
        for i in 0..5u64 {
            let req = r.poll(&mut inline).unwrap().expect("published");
            assert_eq!((req.wr.wr_id, req.sges.as_slice()), (i, &sgl(2, i as u32)[..]));
        }
        // A post publishes what was staged before it, in order.
        w.stage(&SendWr::new(10, WrOpcode::Send), &sgl(1, 1)).unwrap();
        w.post(&SendWr::new(11, WrOpcode::Send), &sgl(1, 1)).unwrap();
        assert_eq!(r.poll(&mut inline).unwrap().map(|q| q.wr.wr_id), Some(10));
        assert_eq!(r.poll(&mut inline).unwrap().map(|q| q.wr.wr_id), Some(11));
        assert_eq!(r.poll(&mut inline), Ok(None));
        r.release();
        // Staged WQEs take room: a ring full of them refuses the next one until published and consumed.
        for i in 0..u64::from(CAP) {
            w.stage(&SendWr::new(i, WrOpcode::Send), &sgl(1, 1)).unwrap();
        }
        assert_eq!(w.stage(&SendWr::new(99, WrOpcode::Send), &sgl(1, 1)), Err(WqError::Ring(RingError::Full)));
        w.publish();
        assert_eq!(r.sync(), Ok(CAP));
    }

    /// A successful SEND completion of QP `qpn`.
    fn success(wr_id: u64, qpn: u32) -> verbs::Cqe {
        verbs::Cqe {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            qpn,
            byte_len: 0,
            imm: None,
            invalidated_rkey: None,
            solicited: false,
        }
    }

    #[test]
    fn full_queue_and_cq_round_trip() {
        let (mut w, mut r) = send_pair();
        let wr = SendWr::new(1, WrOpcode::Send);
        for _ in 0..CAP {
            w.post(&wr, &sgl(1, 1)).unwrap();
        }
        assert_eq!(w.post(&wr, &sgl(1, 1)), Err(WqError::Ring(RingError::Full)));
        r.poll(&mut []).unwrap().unwrap();
        r.release();
        w.post(&wr, &sgl(1, 1)).unwrap();

        let (mut p, c) = heap_ring::<Cqe>(8);
        let mut cq = CqReader::new(c);
        let done = success(3, 5);
        p.push_publish(Cqe::from(&done)).unwrap();
        p.push_publish(Cqe { status: 200, ..Cqe::default() }).unwrap();
        let mut out = [done; 4];
        assert_eq!(cq.poll(&mut out[..1]), Ok(1));
        assert_eq!(out[0], done);
        assert_eq!(cq.poll(&mut out), Err(WqError::Cqe(CqeError::Status(200))));
        // Good completions before a bad one are returned first; the error comes with the next poll, once.
        let second = verbs::Cqe { wr_id: 4, ..done };
        p.push_publish(Cqe::from(&second)).unwrap();
        p.push_publish(Cqe { opcode: 99, ..Cqe::default() }).unwrap();
        p.push_publish(Cqe::from(&done)).unwrap();
        assert_eq!(cq.poll(&mut out), Ok(1));
        assert_eq!(out[0], second);
        assert_eq!(cq.poll(&mut out), Err(WqError::Cqe(CqeError::Opcode(99))));
        assert_eq!(cq.poll(&mut out), Ok(1));
        assert_eq!(out[0], done);
    }

    /// A daemon that writes completions as fast as a poll skips them (those of a destroyed QP, which the client
    /// library consumes without returning) cannot keep the poll from returning: the ring hands it no more than the
    /// slots the poll has not released yet, so after a ring's worth the poll ends, here with the ring corrupt
    /// (the daemon wrote slots it was not given). The daemon's tail moves forward by one for each completion
    /// skipped, over completions of the same QP it wrote before.
    #[test]
    fn a_poll_skipping_a_daemons_endless_completions_returns() {
        let (mut p, c) = heap_ring::<Cqe>(8);
        let mut cq = CqReader::new(c);
        let stale = success(1, 9);
        for _ in 0..8 {
            p.push(Cqe::from(&stale)).unwrap();
        }
        p.publish();
        let mut tail = 8u32;
        let mut skipped = 0u32;
        let mut out = [stale; 4];
        let r = cq.poll_skipping(&mut out, |_, c| {
            skipped += 1;
            assert!(skipped <= 10 * 8, "the poll is still skipping after {skipped} completions of a ring of 8");
            tail += 1;
            p.publish_raw_tail(tail);
            c.qpn == 9
        });
        assert!(matches!(r, Err(WqError::Ring(RingError::Corrupt { .. }))), "{r:?}");
        assert!(skipped <= 8, "{skipped} skipped: more than the ring holds");
    }

    #[test]
    fn a_post_to_a_full_queue_leaves_the_pending_slot_alone() {
        let (mut w, mut r) = send_pair();
        let wr = SendWr::new(1, WrOpcode::Send);
        for _ in 0..CAP {
            w.post(&wr, &sgl(3, 1)).unwrap();
        }
        // Same slot index modulo CAP as the first, still unread: its side-table SGEs must not change.
        assert_eq!(w.post(&wr, &sgl(3, 2)), Err(WqError::Ring(RingError::Full)));
        assert_eq!(w.post_inline(&wr, &[7; 100]), Err(WqError::Ring(RingError::Full)));
        let first = r.poll(&mut []).unwrap().unwrap();
        assert_eq!(first.sges.as_slice(), &sgl(3, 1)[..]);

        let (p, c) = heap_ring::<RecvWqe>(CAP);
        let (tw, tr) = heap_table::<Sge>(CAP, 3);
        let mut w = RecvQueueWriter::new(p, Some(tw), 4).unwrap();
        let mut r = RecvQueueReader::new(c, Some(tr), 4).unwrap();
        for _ in 0..CAP {
            w.post(5, &sgl(4, 1)).unwrap();
        }
        assert_eq!(w.post(6, &sgl(4, 2)), Err(WqError::Ring(RingError::Full)));
        assert_eq!(r.poll().unwrap().unwrap().1.as_slice(), &sgl(4, 1)[..]);
    }

    #[test]
    fn recv_queue_round_trip() {
        let (p, c) = heap_ring::<RecvWqe>(CAP);
        let (tw, tr) = heap_table::<Sge>(CAP, 3);
        let mut w = RecvQueueWriter::new(p, Some(tw), 4).unwrap();
        let mut r = RecvQueueReader::new(c, Some(tr), 4).unwrap();
        for i in 0..40u32 {
            w.post(u64::from(i), &sgl(i % 5, i)).unwrap();
            let (id, s) = r.poll().unwrap().unwrap();
            assert_eq!((id, s.as_slice()), (u64::from(i), &sgl(i % 5, i)[..]));
            r.sync().unwrap();
        }
    }

    /// A WQE that is mostly valid but with one field at a time made hostile (or, sometimes, all random).
    fn hostile_wqe(rng: &mut SimRng) -> Wqe {
        let mut w = Wqe::encode(&SendWr::new(rng.next_u64(), WrOpcode::Send), &sgl(1, 1), 0);
        match rng.below(10) {
            0 => w.opcode = rng.next_u64() as u8,
            1 => w.flags = rng.next_u64() as u8,
            2 => w.num_sge = rng.next_u64() as u8,
            3 => {
                w.flags |= send_flags::INLINE;
                w.num_sge = 0;
                w.inline_len = rng.next_u64() as u32 >> rng.below(32);
            }
            4 => w.sge0.len = u32::MAX,
            5 => w.reserved = 1 + rng.below(255) as u8,
            6 => {
                w.opcode = wr_opcode::ATOMIC_CMP_AND_SWP;
                w.sge0.len = rng.below(16) as u32;
            }
            7 => {
                // All random bytes.
                let b: [u64; 8] = core::array::from_fn(|_| rng.next_u64());
                w = Wqe {
                    wr_id: b[0],
                    opcode: b[1] as u8,
                    flags: (b[1] >> 8) as u8,
                    num_sge: (b[1] >> 16) as u8,
                    reserved: (b[1] >> 24) as u8,
                    imm_inv: (b[1] >> 32) as u32,
                    remote_addr: b[2],
                    rkey: b[3] as u32,
                    inline_len: (b[3] >> 32) as u32,
                    compare_add: b[4],
                    swap: b[5],
                    sge0: Sge { addr: b[6], len: b[7] as u32, lkey: (b[7] >> 32) as u32 },
                };
            }
            _ => w.num_sge = rng.below(6) as u8, // often valid, with random side-table SGEs
        }
        w
    }

    /// The hostile-producer model test: the "client" writes random WQEs, random side-table contents and random
    /// tails; the daemon's reader must return valid requests or typed errors, never panic, never hand out a request
    /// outside the QP's limits, and stay stopped once it saw corrupt indices. Even runs keep the indices honest
    /// (only contents are hostile: never reported corrupt), odd runs attack the indices too. Seeded and bounded; the
    /// seed is printed on failure and `ROCE_SHM_SEED` reproduces the series.
    #[test]
    fn hostile_producer_gets_typed_errors_only() {
        let base = std::env::var("ROCE_SHM_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5eed_0007_u64);
        let mut total = (0, 0, 0);
        for run in 0..200u64 {
            let seed = base.wrapping_add(run);
            let attack_indices = run % 2 == 1;
            match std::panic::catch_unwind(|| hostile_run(seed, attack_indices)) {
                Ok((ok, bad, corrupt)) => {
                    assert!(attack_indices || corrupt == 0, "honest indices flagged corrupt, seed {seed}");
                    total = (total.0 + ok, total.1 + bad, total.2 + corrupt);
                }
                Err(_) => panic!("hostile run {run} (seed {seed}) failed; reproduce with ROCE_SHM_SEED={base}"),
            }
        }
        eprintln!("hostile producer: (accepted, refused WQEs, runs ending corrupt) = {total:?}");
        // The model reaches every outcome: accepted requests, refused WQEs, corrupt indices.
        assert!(total.0 > 500 && total.1 > 500 && total.2 > 20 && total.2 <= 100, "{total:?}");
    }

    /// What every request the reader accepts satisfies, whatever the client wrote (and when).
    fn assert_valid(req: &SendRequest) {
        let sges = req.sges.as_slice();
        assert!(sges.len() <= usize::from(LIMITS.max_sge) && sges.len() <= MAX_WQE_SGE, "{req:?}");
        assert!(req.sges.total_len() <= crate::qp::MAX_MSG_LEN, "{req:?}");
        assert!(req.inline_len <= LIMITS.max_inline, "{req:?}");
        assert!(!req.wr.inline || sges.is_empty(), "{req:?}");
        assert!(req.wr.inline || req.inline_len == 0, "{req:?}");
        if req.wr.opcode.is_atomic() {
            assert!(sges.len() == 1 && sges[0].len == 8, "{req:?}");
        }
    }

    /// Session 16 review (TOCTOU): a client thread rewrites every slot and side-table entry of its send queue with
    /// hostile values, without pause, and keeps the tail a whole ring ahead of the head handed back, while the
    /// reader decodes: each WQE word and each SGE is read once into a copy that is then checked and used, so every
    /// request accepted, however torn, satisfies the limits ([`assert_valid`]), nothing but single WQEs is refused,
    /// and the ring is never taken for corrupt.
    #[test]
    fn a_client_rewriting_its_queue_while_it_is_read_gets_only_valid_requests_accepted() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (mut p, c) = heap_ring::<Wqe>(CAP);
        let (mut sw, sr) = heap_table::<Sge>(CAP, 3);
        let (mut iw, ir) = heap_table::<u8>(CAP, 128);
        let mut r = SendQueueReader::new(c, Some(sr), Some(ir), LIMITS).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let writer = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut rng = SimRng::new(16);
                let mut rounds = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    for i in 0..CAP {
                        // Half of them valid with 4 SGEs, whose 3 in the side table change under the reader.
                        let w = if rng.below(2) == 0 {
                            hostile_wqe(&mut rng)
                        } else {
                            Wqe::encode(&SendWr::new(u64::from(i), WrOpcode::Send), &sgl(4, i), 0)
                        };
                        p.store_raw(i, w);
                        let ext: [Sge; 3] = core::array::from_fn(|_| Sge {
                            addr: rng.next_u64(),
                            len: rng.next_u64() as u32 >> rng.below(32),
                            lkey: rng.next_u64() as u32,
                        });
                        sw.write(i, &ext).unwrap();
                        let _ = iw.set(i, rng.below(128) as usize, rng.next_u64() as u8);
                    }
                    // Every slot handed back is filled again: the tail stays a ring ahead of the released head.
                    p.sync().expect("the reader keeps its index right");
                    while p.push(hostile_wqe(&mut rng)).is_ok() {}
                    p.publish();
                    rounds += 1;
                }
                rounds
            })
        };
        let (mut ok, mut refused) = (0u32, 0u32);
        let mut inline = [0u8; 128];
        let t0 = std::time::Instant::now();
        // Miri runs the same interleavings far slower: fewer requests there. The time limit only stops a reader
        // that no longer makes progress: 100 000 requests took ~3 s idle, but a loaded machine (load 7, fuzzers
        // beside it) accepted from 9 000 to 92 000 in 20 s; 20 000 in at most 180 s leaves room for that.
        let (want_ok, want_refused) = if cfg!(miri) { (200, 40) } else { (20_000, 4_000) };
        while (ok < want_ok || refused < want_refused) && t0.elapsed() < std::time::Duration::from_secs(180) {
            match r.poll(&mut inline) {
                Ok(Some(req)) => {
                    assert_valid(&req);
                    ok += 1;
                }
                Ok(None) => {}
                Err(WqError::Wqe { .. }) => refused += 1,
                Err(e) => panic!("the reader saw {e:?} from a client that kept its indices right"),
            }
            if (ok + refused).is_multiple_of(7) {
                r.release();
            }
        }
        stop.store(true, Ordering::Relaxed);
        let rounds = writer.join().unwrap();
        assert!(
            ok >= want_ok && refused >= want_refused && rounds > 10,
            "accepted {ok}, refused {refused}, rounds {rounds}"
        );
    }

    /// One run: returns (valid requests, WQE errors, 1 if the ring was found corrupt).
    fn hostile_run(seed: u64, attack_indices: bool) -> (u32, u32, u32) {
        let mut rng = SimRng::new(seed);
        let (mut p, c) = heap_ring::<Wqe>(CAP);
        let (mut sw, sr) = heap_table::<Sge>(CAP, 3);
        let (mut iw, ir) = heap_table::<u8>(CAP, 128);
        let mut r = SendQueueReader::new(c, Some(sr), Some(ir), LIMITS).unwrap();
        let mut inline = [0u8; 128];
        let (mut ok, mut bad_wqe, mut corrupt) = (0, 0, 0);
        let mut tail = 0u32;
        let mut dead = false;
        for _step in 0..300 {
            match rng.below(16) {
                // Garbage into a random slot's side tables and a hostile WQE into the next slot.
                0..=8 => {
                    let i = rng.next_u64() as u32;
                    let ext: [Sge; 3] = core::array::from_fn(|_| Sge {
                        addr: rng.next_u64(),
                        len: rng.next_u64() as u32 >> rng.below(32),
                        lkey: rng.next_u64() as u32,
                    });
                    sw.write(i, &ext).unwrap();
                    let bytes: [u8; 128] = core::array::from_fn(|_| rng.next_u64() as u8);
                    iw.write(i, &bytes).unwrap();
                    if attack_indices {
                        // Write the slot whatever the ring state and publish a tail that may run ahead.
                        let _ = p.push(hostile_wqe(&mut rng));
                        tail = tail.wrapping_add(1 + rng.below(2) as u32);
                        p.publish_raw_tail(tail);
                    } else {
                        // Honest indices, hostile contents.
                        match p.push_publish(hostile_wqe(&mut rng)) {
                            Ok(()) | Err(RingError::Full) => {}
                            Err(e) => panic!("honest producer saw {e}"),
                        }
                    }
                }
                // A random tail, occasionally far off.
                9 if attack_indices => {
                    tail = match rng.below(3) {
                        0 => rng.next_u64() as u32,
                        1 => tail.wrapping_sub(rng.below(4) as u32),
                        _ => tail.wrapping_add(rng.below(2 * u64::from(CAP)) as u32),
                    };
                    p.publish_raw_tail(tail);
                }
                // The daemon drains a bounded batch.
                _ => {
                    for _ in 0..rng.below(2 * u64::from(CAP)) {
                        match r.poll(&mut inline) {
                            Ok(None) => break,
                            Ok(Some(req)) => {
                                assert!(!dead, "a reader that saw corrupt indices must stay stopped");
                                assert_valid(&req);
                                ok += 1;
                            }
                            Err(WqError::Wqe { error, .. }) => {
                                assert!(!dead);
                                assert!(!error.to_string().is_empty() && error.code() != 0);
                                bad_wqe += 1;
                            }
                            Err(WqError::Ring(RingError::Corrupt { .. })) => {
                                dead = true;
                                corrupt += 1;
                                break;
                            }
                            Err(e) => panic!("unexpected error {e:?}"),
                        }
                    }
                    let _ = r.sync();
                }
            }
        }
        assert_eq!(dead, corrupt > 0);
        (ok, bad_wqe, u32::from(dead))
    }
}
