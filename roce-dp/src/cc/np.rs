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
            if now < t + min_interval {
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
}
