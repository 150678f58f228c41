//! Payload copies.
//!
//! glibc 2.36 (Debian 12) copies blocks of 2 KiB and more with `rep movsb`. On the AMD EPYC virtual machines this
//! project is tested on, that path runs at 1-2 GB/s, against 30-80 GB/s for a vector loop (measured with
//! `cargo run --release -p roce-dp-bench --bin engine`, which prints both). Every payload byte of a 4 KiB frame is
//! copied twice (gather at the requester, placement at the responder), so the engine copies mid-sized blocks with
//! fixed 64-byte chunks, which the compiler turns into vector loads and stores, and leaves small blocks and very
//! large ones (non-temporal stores) to the system `memcpy`.

use core::sync::atomic::{compiler_fence, Ordering};

/// Below this, the system memcpy is fast (no `rep movsb`).
const CHUNKED_FROM: usize = 2048;
/// From here on, glibc switches to non-temporal stores, which are right for blocks larger than the cache.
const CHUNKED_UNTIL: usize = 512 * 1024;

/// Copies `src` into `dst` (equal lengths; panics otherwise, like `copy_from_slice`).
#[inline]
pub fn copy_bytes(dst: &mut [u8], src: &[u8]) {
    let n = src.len();
    if !(CHUNKED_FROM..CHUNKED_UNTIL).contains(&n) {
        dst.copy_from_slice(src);
        return;
    }
    assert_eq!(dst.len(), n, "copy_bytes: length mismatch");
    let mut d = dst.chunks_exact_mut(64);
    let mut s = src.chunks_exact(64);
    for (a, b) in (&mut d).zip(&mut s) {
        let a: &mut [u8; 64] = a.try_into().expect("64-byte chunk");
        let b: &[u8; 64] = b.try_into().expect("64-byte chunk");
        *a = *b;
        // An empty compiler barrier (no instruction): without it LLVM's loop-idiom pass turns this loop back into
        // a `memcpy` call wherever it is inlined (it did in the requester's gather), which is the slow path above.
        compiler_fence(Ordering::SeqCst);
    }
    d.into_remainder().copy_from_slice(s.remainder());
}

#[cfg(test)]
mod tests {
    use super::copy_bytes;

    #[test]
    fn copies_every_length() {
        for n in [0usize, 1, 63, 64, 65, 2047, 2048, 2049, 4096, 4097, 70_001, 600_000] {
            let src: Vec<u8> = (0..n).map(|i| (i * 31 + 7) as u8).collect();
            let mut dst = vec![0u8; n];
            copy_bytes(&mut dst, &src);
            assert_eq!(dst, src, "length {n}");
        }
    }
}
