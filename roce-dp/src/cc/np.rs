//! The DCQCN notification point (NP) of one QP: a CE-marked frame for the QP asks for a CNP to the peer QP, at
//! most one per `np_min_time_between_cnps` (ConnectX: a CE frame inside the interval sends nothing; ROCE-NOTES
//! §3.1/§3.2).

use crate::time::{Duration, Instant};

/// Per-QP CNP state.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NotificationPoint {
    /// When the last CNP was queued.
    last: Option<Instant>,
    /// A CNP waits to be sent.
    pending: bool,
}

impl NotificationPoint {
    /// A CE-marked frame arrived at `now`. Returns true if a CNP is queued, false if the interval since the last
    /// one has not passed (or one is still waiting to leave).
    pub fn on_ce(&mut self, now: Instant, min_interval: Duration) -> bool {
        if self.pending {
            return false;
        }
        if let Some(t) = self.last {
            // The time since the last CNP, not `now < t + interval`: that sum saturates at the end of representable
            // time, where a second CNP would then leave inside the interval. A clock that stepped back reads 0.
            if now.saturating_since(t) < min_interval {
                return false;
            }
        }
        self.last = Some(now);
        self.pending = true;
        true
    }

    /// True if a CNP waits to be sent.
    #[inline]
    pub fn pending(&self) -> bool {
        self.pending
    }

    /// The CNP was sent.
    #[inline]
    pub fn sent(&mut self) {
        self.pending = false;
    }

    /// Forgets everything (QP reset).
    pub fn reset(&mut self) {
        *self = NotificationPoint::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_cnp_per_interval() {
        let iv = Duration::from_micros(4);
        let mut np = NotificationPoint::default();
        assert!(np.on_ce(Instant::from_micros(10), iv));
        assert!(!np.on_ce(Instant::from_micros(10), iv), "still pending");
        np.sent();
        assert!(!np.on_ce(Instant(13_999), iv));
        assert!(np.on_ce(Instant(14_000), iv));
        np.sent();
        assert!(np.on_ce(Instant(18_000), iv));
    }

    #[test]
    fn never_two_inside_the_interval_at_the_end_of_time_or_when_time_steps_back() {
        let iv = Duration::from_micros(4);
        // The last CNP 1 µs before the end of representable time: `last + interval` saturates, and nothing more
        // is sent (never a CNP before the interval has passed).
        let mut np = NotificationPoint::default();
        assert!(np.on_ce(Instant(u64::MAX - 1_000), iv));
        np.sent();
        assert!(!np.on_ce(Instant::MAX, iv));
        // A caller whose clock steps back: nothing until the interval has passed since the last CNP.
        let mut np = NotificationPoint::default();
        assert!(np.on_ce(Instant(10_000), iv));
        np.sent();
        assert!(!np.on_ce(Instant(5_000), iv));
        assert!(!np.on_ce(Instant(13_999), iv));
        assert!(np.on_ce(Instant(14_000), iv));
        // A zero interval: one CNP per CE frame, never two for one frame (the first still waits to leave).
        let mut np = NotificationPoint::default();
        assert!(np.on_ce(Instant(1), Duration::ZERO));
        assert!(!np.on_ce(Instant(1), Duration::ZERO));
        np.sent();
        assert!(np.on_ce(Instant(1), Duration::ZERO));
    }
}
