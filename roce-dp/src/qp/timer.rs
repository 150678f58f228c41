//! Per-QP timers: a small table indexed by kind (as quinn's TimerTable). The engine mirrors armed deadlines into
//! one min-heap so its `poll_timeout` is O(1) and timer expiry O(log n), never a scan of every QP.

use crate::time::Instant;

/// The timers of one QP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TimerKind {
    /// Local ACK timeout (requester retransmission).
    Retransmit = 0,
    /// RNR back-off before resending.
    Rnr = 1,
    /// Coalesced ACK must leave by now.
    AckCoalesce = 2,
    /// Congestion control: the rate controller's next event (DCQCN rate-increase timer, deferred decrease).
    Cc = 3,
    /// Pacing: the rate controller lets the next data frame leave at this time.
    Pace = 4,
}

/// Number of timer kinds.
pub(crate) const NUM_TIMERS: usize = 5;

/// Timer deadlines of one QP plus what the engine's heap holds for each.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct TimerTable {
    /// Armed deadline per kind.
    pub(crate) deadline: [Option<Instant>; NUM_TIMERS],
    /// The deadline of this kind's live entry in the engine heap (at most one live entry per kind).
    pub(crate) queued: [Option<Instant>; NUM_TIMERS],
    /// Bit k is set while `deadline[k]` is armed, so the engine's per-frame timer sync visits only armed kinds
    /// (usually just the retransmit timer) however many kinds exist. Write deadlines through `set`/`stop`.
    pub(crate) armed: u8,
    /// Bit k is set when `deadline[k]` was set since the engine last mirrored this table into its heap: only those
    /// kinds can need a heap entry (an armed kind not set since has its entry, at or before its deadline), so the
    /// per-frame sync of a QP whose timers did not move is a test of this byte.
    pub(crate) pending: u8,
}

impl TimerTable {
    #[inline]
    pub(crate) fn set(&mut self, k: TimerKind, at: Instant) {
        self.deadline[k as usize] = Some(at);
        self.armed |= 1 << k as u8;
        self.pending |= 1 << k as u8;
    }
    #[inline]
    pub(crate) fn stop(&mut self, k: TimerKind) {
        self.deadline[k as usize] = None;
        self.armed &= !(1 << k as u8);
    }
    #[inline]
    pub(crate) fn get(&self, k: TimerKind) -> Option<Instant> {
        self.deadline[k as usize]
    }
    pub(crate) fn kind(i: usize) -> TimerKind {
        match i {
            0 => TimerKind::Retransmit,
            1 => TimerKind::Rnr,
            2 => TimerKind::AckCoalesce,
            3 => TimerKind::Cc,
            _ => TimerKind::Pace,
        }
    }
}

// `armed` is a u8 bit set.
const _: () = assert!(NUM_TIMERS <= 8);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn armed_bits_follow_set_and_stop() {
        let mut t = TimerTable::default();
        t.set(TimerKind::Pace, Instant(5));
        t.set(TimerKind::Retransmit, Instant(9));
        assert_eq!((t.armed, t.pending), (0b1_0001, 0b1_0001));
        t.stop(TimerKind::Pace);
        t.stop(TimerKind::Rnr);
        assert_eq!((t.armed, t.get(TimerKind::Retransmit), t.get(TimerKind::Pace)), (1, Some(Instant(9)), None));
        for i in 0..NUM_TIMERS {
            assert_eq!(TimerTable::kind(i) as usize, i);
        }
    }
}
