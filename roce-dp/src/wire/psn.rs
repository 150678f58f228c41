//! 24-bit packet sequence numbers with modular arithmetic.
//!
//! PSNs wrap at 2^24. Comparison follows rxe's `psn_compare`: the signed 24-bit difference, so each PSN sees 2^23
//! values ahead of it and 2^23 behind (the half-space window).

use core::fmt;

/// Mask of the 24 PSN bits.
pub const PSN_MASK: u32 = 0x00ff_ffff;
/// Half the PSN space: the largest forward distance that still counts as "ahead".
pub const PSN_HALF: u32 = 1 << 23;

/// A 24-bit packet sequence number. Always kept masked to 24 bits.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Psn(u32);

impl Psn {
    /// Builds a PSN from the low 24 bits of `v`.
    #[inline]
    pub const fn new(v: u32) -> Psn {
        Psn(v & PSN_MASK)
    }

    /// The raw 24-bit value.
    #[inline]
    pub const fn value(self) -> u32 {
        self.0
    }

    /// `self + n`, wrapping at 2^24.
    #[inline]
    #[must_use]
    pub const fn add(self, n: u32) -> Psn {
        Psn(self.0.wrapping_add(n) & PSN_MASK)
    }

    /// `self - n`, wrapping at 2^24.
    #[inline]
    #[must_use]
    pub const fn sub(self, n: u32) -> Psn {
        Psn(self.0.wrapping_sub(n) & PSN_MASK)
    }

    /// The signed distance `self - other` in the half-space window: positive when `self` is ahead of `other`.
    /// Ranges over -2^23 ..= 2^23 - 1.
    #[inline]
    pub const fn diff(self, other: Psn) -> i32 {
        ((self.0.wrapping_sub(other.0) << 8) as i32) >> 8
    }

    /// The forward distance from `from` to `self`, modulo 2^24 (0 ..= 2^24 - 1).
    #[inline]
    pub const fn distance_from(self, from: Psn) -> u32 {
        self.0.wrapping_sub(from.0) & PSN_MASK
    }

    /// True when `self` comes strictly before `other` in the window.
    #[inline]
    pub const fn before(self, other: Psn) -> bool {
        self.diff(other) < 0
    }

    /// True when `self` comes strictly after `other` in the window.
    #[inline]
    pub const fn after(self, other: Psn) -> bool {
        self.diff(other) > 0
    }

    /// True when `self` lies in the half-open range `[start, start + len)` modulo 2^24.
    #[inline]
    pub const fn in_range(self, start: Psn, len: u32) -> bool {
        self.distance_from(start) < len
    }
}

impl fmt::Debug for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Psn({:#08x})", self.0)
    }
}

impl fmt::Display for Psn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#08x}", self.0)
    }
}

impl From<Psn> for u32 {
    fn from(p: Psn) -> u32 {
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_to_24_bits() {
        assert_eq!(Psn::new(0x1234_5678).value(), 0x34_5678);
        assert_eq!(Psn::new(PSN_MASK).add(1).value(), 0);
        assert_eq!(Psn::new(0).sub(1).value(), PSN_MASK);
    }

    #[test]
    fn diff_across_the_wrap() {
        let top = Psn::new(PSN_MASK);
        let zero = Psn::new(0);
        assert_eq!(zero.diff(top), 1);
        assert_eq!(top.diff(zero), -1);
        assert!(zero.after(top));
        assert!(top.before(zero));
        assert_eq!(Psn::new(5).diff(Psn::new(PSN_MASK - 4)), 10);
        assert_eq!(zero.distance_from(top), 1);
        assert!(Psn::new(1).in_range(Psn::new(PSN_MASK - 1), 4));
        assert!(!Psn::new(2).in_range(Psn::new(PSN_MASK - 1), 4));
    }

    #[test]
    fn half_space_window_edges() {
        let a = Psn::new(100);
        // 2^23 - 1 ahead is still "ahead"; 2^23 ahead flips to "behind" (the most negative difference).
        assert_eq!(a.add(PSN_HALF - 1).diff(a), (PSN_HALF - 1) as i32);
        assert_eq!(a.add(PSN_HALF).diff(a), -(PSN_HALF as i32));
        assert_eq!(a.sub(PSN_HALF - 1).diff(a), -((PSN_HALF - 1) as i32));
        for start in [0u32, 1, PSN_HALF - 1, PSN_HALF, PSN_MASK - 1, PSN_MASK] {
            let s = Psn::new(start);
            for step in [0u32, 1, 7, 1000, PSN_HALF - 1] {
                assert_eq!(s.add(step).diff(s), step as i32, "start {start} step {step}");
                assert_eq!(s.sub(step).diff(s), -(step as i32), "start {start} step {step}");
                assert_eq!(s.add(step).sub(step), s);
            }
        }
    }
}
