//! Payload copies.
//!
//! glibc 2.36 (Debian 12) copies blocks of 2 KiB and more with `rep movsb`. On the AMD EPYC (Zen 3 class) virtual
//! machines this project was tested on, that path is fast (45-80 GB/s for 4 KiB) except when the destination lies
//! a few bytes after the source modulo 4 KiB: with `(dst - src) mod 4096` in 1..64 it drops to 0.6-9 GB/s (false
//! 4 KiB aliasing between its loads and stores). The engine's own vector loop (fixed 64-byte chunks, SSE2) does not
//! collapse there, but is slower than glibc elsewhere — and collapses itself at other distances (around 150-200
//! bytes: 14 GB/s). So mid-sized blocks take the loop only in glibc's bad window, and only on CPUs other than
//! Intel's (on an Intel machine glibc has no bad window and the loop is 2x slower), and `memcpy` otherwise; blocks of
//! 8..=64 bytes are two fixed-size moves each (inline: the call cost more than the copy), other small blocks (no
//! `rep movsb`) and very large ones (non-temporal stores) always go to `memcpy`. Measured with
//! `cargo run --release -p roce-dp-bench --bin engine`, whose reference line prints both at such a distance.

use core::sync::atomic::{compiler_fence, Ordering};

/// Below this, the system memcpy is fast (no `rep movsb`).
const CHUNKED_FROM: usize = 2048;
/// From here on, glibc switches to non-temporal stores, which are right for blocks larger than the cache.
const CHUNKED_UNTIL: usize = 512 * 1024;
/// `(dst - src) mod 4096` below this (and above 0) is glibc's slow `rep movsb` window.
const ALIAS_WINDOW: usize = 128;

/// True if glibc's `rep movsb` would be slow for a mid-sized copy from `src` to `dst`.
#[inline]
fn rep_movsb_aliases(dst: *const u8, src: *const u8) -> bool {
    let d = (dst as usize).wrapping_sub(src as usize) & 4095;
    d != 0 && d < ALIAS_WINDOW
}

/// Whether a copy of `n` bytes from `src` to `dst` should take the 64-byte-chunk loop instead of `memcpy`: a
/// mid-sized block in glibc's slow `rep movsb` window, on a CPU where that window is slow. The one decision for
/// [`copy_bytes`] and for the copies through shared-memory windows (`ctrl::shm::ShmBytes`), which cannot form
/// slices of the client's memory.
#[inline]
pub fn wants_chunked(dst: *const u8, src: *const u8, n: usize) -> bool {
    (CHUNKED_FROM..CHUNKED_UNTIL).contains(&n) && rep_movsb_aliases(dst, src) && alias_window_is_slow()
}

/// False on Intel CPUs: there glibc's `memcpy` has no slow window (a Sapphire Rapids class VM, 2-256 KiB at
/// 16, 64, 127 and 198 bytes from the source mod 4 KiB: 125-207 GB/s up to 16 KiB, 46-49 at 64-256 KiB, where the
/// chunk loop ran 49-92 and 27-46), so the detour only cost time. True elsewhere (the AMD machines it was measured
/// on). Read once (CPUID exits to the hypervisor in a VM).
#[inline]
fn alias_window_is_slow() -> bool {
    static SLOW: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SLOW.get_or_init(|| !cpu_is_intel())
}

/// The CPUID vendor string is "GenuineIntel".
#[cfg(target_arch = "x86_64")]
fn cpu_is_intel() -> bool {
    let r = core::arch::x86_64::__cpuid(0);
    (r.ebx, r.edx, r.ecx) == (0x756e_6547, 0x4965_6e69, 0x6c65_746e)
}

#[cfg(not(target_arch = "x86_64"))]
fn cpu_is_intel() -> bool {
    false
}

/// Copies `src` into `dst` (equal lengths; panics otherwise, like `copy_from_slice`). The small-block path is
/// inline in the caller (a 64-byte payload is four vector moves: a call cost more than the copy); longer copies
/// are a call.
#[inline(always)]
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    if !copy_small(dst, src) {
        copy_large(dst, src);
    }
}

/// [`copy_bytes`] beyond [`copy_small`]'s sizes.
#[inline(never)]
fn copy_large(dst: &mut [u8], src: &[u8]) {
    if !wants_chunked(dst.as_ptr(), src.as_ptr(), src.len()) {
        dst.copy_from_slice(src);
        return;
    }
    vector_copy(dst, src);
}

/// Copies a block of 8..=64 bytes (equal lengths) as its first and last 8, 16 or 32 bytes: two fixed-size moves
/// each (overlapping in the middle), without the `memcpy` call, which costs more than the copy at these sizes (a
/// 64-byte payload, a short READ response). False, copying nothing, for any other length or unequal lengths.
#[inline(always)]
fn copy_small(dst: &mut [u8], src: &[u8]) -> bool {
    let n = src.len();
    if dst.len() != n || !(8..=64).contains(&n) {
        return false;
    }
    if n >= 32 {
        copy_ends::<32>(dst, src);
    } else if n >= 16 {
        copy_ends::<16>(dst, src);
    } else {
        copy_ends::<8>(dst, src);
    }
    true
}

/// Copies the first and the last `N` bytes of `src` (`N..=2N` bytes long, as `dst`) to the same places of `dst`.
#[inline(always)]
fn copy_ends<const N: usize>(dst: &mut [u8], src: &[u8]) {
    if let (Some(d), Some(s)) = (dst.first_chunk_mut::<N>(), src.first_chunk::<N>()) {
        *d = *s;
    }
    if let (Some(d), Some(s)) = (dst.last_chunk_mut::<N>(), src.last_chunk::<N>()) {
        *d = *s;
    }
}

/// The 64-byte-chunk loop (out of line: the rare path).
#[inline(never)]
fn vector_copy(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    assert_eq!(dst.len(), n, "copy_bytes: length mismatch");
    let mut d = dst.chunks_exact_mut(64);
    let mut s = src.chunks_exact(64);
    for (a, b) in (&mut d).zip(&mut s) {
        let a: &mut [u8; 64] = a.try_into().expect("64-byte chunk");
        let b: &[u8; 64] = b.try_into().expect("64-byte chunk");
        *a = *b;
        // An empty compiler barrier (no instruction): without it LLVM's loop-idiom pass turns this loop back into
        // a `memcpy` call, which is the slow path this function exists to avoid.
        compiler_fence(Ordering::SeqCst);
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

#[cfg(test)]
mod tests {
    use super::{copy_bytes, cpu_is_intel, rep_movsb_aliases, vector_copy, wants_chunked};

    #[test]
    fn copies_every_length() {
        for n in [0usize, 1, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 2047, 2048, 2049, 4096, 4097, 70_001, 600_000]
        {
            let src: Vec<u8> = (0..n).map(|i| (i * 31 + 7) as u8).collect();
            // Every distance class: glibc's window (1..128 bytes after the source mod 4 KiB), outside it, equal.
            for shift in [0usize, 16, 100, 128, 198, 4000] {
                let mut dst = vec![0u8; n + 8192];
                let at = ((src.as_ptr() as usize + shift).wrapping_sub(dst.as_ptr() as usize)) & 4095;
                copy_bytes(&mut dst[at..at + n], &src);
                assert_eq!(&dst[at..at + n], &src[..], "length {n} shift {shift}");
                assert!(dst[..at].iter().chain(&dst[at + n..]).all(|&b| b == 0), "length {n} shift {shift}");
            }
            let mut dst = vec![0u8; n];
            vector_copy(&mut dst, &src);
            assert_eq!(dst, src, "vector loop, length {n}");
        }
    }

    /// Unequal lengths panic as `copy_from_slice` does, also at the sizes of the fixed-size path.
    #[test]
    #[should_panic(expected = "length")]
    fn unequal_small_lengths_panic() {
        copy_bytes(&mut [0u8; 32], &[1u8; 31]);
    }

    /// The chunk loop is taken only for a mid-sized block in the window, and never on an Intel CPU.
    #[test]
    fn chunked_only_in_the_window_and_not_on_intel() {
        let b = [0u8; 8192];
        let p = b.as_ptr();
        assert_eq!(wants_chunked(p.wrapping_add(16), p, 4096), !cpu_is_intel());
        assert!(!wants_chunked(p.wrapping_add(198), p, 4096));
        assert!(!wants_chunked(p.wrapping_add(16), p, 1024));
    }

    #[test]
    fn alias_window() {
        let b = [0u8; 8192];
        let p = b.as_ptr();
        assert!(!rep_movsb_aliases(p, p));
        assert!(rep_movsb_aliases(p.wrapping_add(16), p));
        assert!(rep_movsb_aliases(p.wrapping_add(4096 + 127), p));
        assert!(!rep_movsb_aliases(p.wrapping_add(128), p));
        assert!(!rep_movsb_aliases(p, p.wrapping_add(16)));
    }
}
