//! CRC-32 (IEEE 802.3, bit-reflected: zlib's and crc32fast's) for the ICRC, with a kernel of our own for CPUs with
//! AVX-512 and VPCLMULQDQ, and a fused copy-and-hash for a transmitted payload.
//!
//! [`update`] and [`update_copy`] give the same values as `crc32fast::Hasher::new_with_initial(crc)` fed the same
//! bytes (the tests compare them over every length, alignment and initial value). On a CPU without the features
//! they are crc32fast; with them, [`update`] takes a kernel per block count from [`SHORT_MIN`] to [`SHORT_MAX`]
//! bytes ([`update_short`]: short frames' ICRCs), the general kernel above, crc32fast below; [`update_copy`] copies
//! then hashes below [`KERNEL_MIN`].
//!
//! Why a kernel of our own (measured in `cargo run --release -p roce-dp-bench --bin icrc`, figures in
//! bench/RESULTS.md, session 19): on the AMD EPYC (Zen 4) machines of this project a 512-bit VPCLMULQDQ multiplies
//! two 128-bit lanes per cycle, so a CRC by folding is bound at 16 bytes per cycle, and crc32fast 1.5 is near that
//! bound only for long inputs (57 GB/s at 64 KiB, 44 GB/s at 4 KiB, 25 GB/s at 1 KiB): it collapses its 16 streams
//! one after the other (15 dependent multiplications) and takes its 512-bit kernel only from 2 KiB. Here every block
//! of a short input, and every stream of a long one at its end, is multiplied by its own distance to the end of the
//! input in parallel (one table of constants), and the products are XORed together: a 4 KiB ICRC ~17% faster, 1 KiB
//! ~35%. And a transmitted payload is hashed as it is copied into the frame ([`update_copy`]): the frame's loads
//! and stores ride alongside the multiplications that bound the pass, where a copy then a CRC pay for both (4 KiB:
//! ~90 ns against ~150).
//!
//! How it works: the input is read as 16-byte blocks (from the end: a partial first block is zero-padded in front,
//! which a CRC from a zero register does not see, with the initial register XORed at the input's first bytes). A
//! block `d` blocks from the end contributes `block(x) * x^(128 d) mod P`, computed in two carry-less
//! multiplications of its 64-bit halves by `x^(128 d + 32)` and `x^(128 d - 32)` (reflected, as the "fold"
//! constants of Intel's paper "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ"); the sum of all
//! blocks is reduced from 128 to 32 bits by Barrett reduction. Long inputs first fold 256 bytes at a time into four
//! 512-bit accumulators (2048 bits ahead), whose 16 lanes then take the table's constants like the remaining blocks.
//!
//! Loads and stores are safe (`bytemuck` reads and writes the vector types from byte slices, bounds-checked);
//! the `unsafe` blocks are the calls into the `#[target_feature]` kernels, each made only once the CPU was seen to
//! have every feature it is compiled for (and `update_copy_shared`'s reads of memory that is not a slice).

#![allow(unsafe_code)]

/// The shortest input of the general kernel ([`update_long`], [`update_copy`], [`update_copy_shared`]); [`update`]
/// takes it only above [`SHORT_MAX`] (below, the per-block-count kernels of [`update_short`] beat it in the engine:
/// bench/RESULTS.md, session 21). Below it [`update_copy`] copies then hashes.
pub const KERNEL_MIN: usize = 384;

// The dispatch in `update_short` covers every block count from SHORT_MIN / 16 to SHORT_MAX / 16, each within the
// constants table (a block at distance up to 31; `x86::MAX_D`).
const _: () = assert!(SHORT_MIN / 16 == 2 && SHORT_MAX / 16 == 31 && KERNEL_MIN <= SHORT_MAX + 1);
#[cfg(target_arch = "x86_64")]
const _: () = assert!(SHORT_MAX / 16 < x86::MAX_D);

/// The CRC of `data` continuing from `crc` (a finished CRC value, as `crc32fast::Hasher::new_with_initial`).
#[inline]
pub fn update(crc: u32, data: &[u8]) -> u32 {
    if let Some(v) = update_short(crc, data) {
        return v;
    }
    match update_long(crc, data) {
        Some(v) => v,
        None => fallback(crc, data),
    }
}

/// The general kernel's CRC of `data` (at least [`KERNEL_MIN`] bytes, on a CPU with its features); None otherwise,
/// for a caller with a cheaper way to run crc32fast than `new_with_initial` (which looks up the CPU's features on
/// every call: a clone of a hasher made once does not). [`update`] tries [`update_short`] first.
#[inline(always)]
pub fn update_long(crc: u32, data: &[u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if data.len() >= KERNEL_MIN && x86::available() {
        // SAFETY: `available` saw every target feature of `update_avx512` on this CPU (and caches only that).
        return Some(unsafe { x86::update_avx512::<_, false>(crc, data, &mut []) });
    }
    None
}

/// The shortest and longest inputs of [`update_short`].
pub const SHORT_MIN: usize = 32;
pub const SHORT_MAX: usize = 511;

/// [`update`] of a short input ([`SHORT_MIN`]..=[`SHORT_MAX`] bytes) on a CPU with this module's kernel features;
/// None otherwise (the caller runs crc32fast). One kernel per count of whole 16-byte blocks (2 to 31), with its
/// constants fixed at compile time: no loop, no table index; a partial block in front (the input's first `len % 16`
/// bytes, zero-padded in front) multiplied to the end like the others, and the initial register XORed into the
/// input's first four bytes (into that partial block, or the first whole block). The short
/// frames' ICRC passes are such inputs: in the engine pair (`engine --one write|send 64`, whose spans are whole
/// blocks: the masked LRH in front makes a 64-byte WRITE's 120 bytes 128, a 64-byte SEND's 112) they ran 7.5% and
/// 8.4% faster with it than with crc32fast's 128-bit kernel, whose folds are one dependent chain (bench/RESULTS.md,
/// session 21). This module's general kernel did not pay at these lengths in the same place (+1.2% for the
/// receive side's pass alone, against +3.7% for this one: its branches, loops and table lookups).
#[inline(always)]
pub fn update_short(crc: u32, data: &[u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if (SHORT_MIN..=SHORT_MAX).contains(&data.len()) && x86::available() {
        // SAFETY: `available` saw every target feature of `short` on this CPU; each arm's kernel is for the
        // input's count of whole blocks (2..=31, as checked).
        return Some(unsafe {
            match data.len() / 16 {
                2 => x86::short::<2>(crc, data),
                3 => x86::short::<3>(crc, data),
                4 => x86::short::<4>(crc, data),
                5 => x86::short::<5>(crc, data),
                6 => x86::short::<6>(crc, data),
                7 => x86::short::<7>(crc, data),
                8 => x86::short::<8>(crc, data),
                9 => x86::short::<9>(crc, data),
                10 => x86::short::<10>(crc, data),
                11 => x86::short::<11>(crc, data),
                12 => x86::short::<12>(crc, data),
                13 => x86::short::<13>(crc, data),
                14 => x86::short::<14>(crc, data),
                15 => x86::short::<15>(crc, data),
                16 => x86::short::<16>(crc, data),
                17 => x86::short::<17>(crc, data),
                18 => x86::short::<18>(crc, data),
                19 => x86::short::<19>(crc, data),
                20 => x86::short::<20>(crc, data),
                21 => x86::short::<21>(crc, data),
                22 => x86::short::<22>(crc, data),
                23 => x86::short::<23>(crc, data),
                24 => x86::short::<24>(crc, data),
                25 => x86::short::<25>(crc, data),
                26 => x86::short::<26>(crc, data),
                27 => x86::short::<27>(crc, data),
                28 => x86::short::<28>(crc, data),
                29 => x86::short::<29>(crc, data),
                30 => x86::short::<30>(crc, data),
                31 => x86::short::<31>(crc, data),
                _ => unreachable!("update_short: {} bytes passed the length check", data.len()),
            }
        });
    }
    let _ = (crc, data);
    None
}

/// Copies `src` into `dst` (equal lengths; panics otherwise, like `copy_from_slice`) and returns the CRC of the
/// bytes continuing from `crc`: one pass over them.
#[inline]
pub fn update_copy(crc: u32, src: &[u8], dst: &mut [u8]) -> u32 {
    assert_eq!(src.len(), dst.len(), "update_copy: length mismatch");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= KERNEL_MIN && x86::available() {
        // SAFETY: as in `update`.
        return unsafe { x86::update_avx512::<_, true>(crc, src, dst) };
    }
    crate::copy::copy_bytes(dst, src);
    update(crc, src)
}

/// [`update_copy`] from memory another process may write meanwhile (a client's shared memory, which must not be
/// made a slice): copies `dst.len()` bytes from `src` into `dst` and returns the CRC of the bytes as copied, when this
/// module's kernel takes them (at least [`KERNEL_MIN`] bytes, on a CPU with its features); None, copying nothing,
/// otherwise (the caller copies, then hashes its copy). Every source byte is read once: the CRC is that of `dst`
/// afterwards, whatever the other process wrote meanwhile.
///
/// # Safety
/// `src .. src + dst.len()` is readable for the whole call (mapped and kept mapped), and does not overlap `dst`.
#[inline]
pub unsafe fn update_copy_shared(crc: u32, src: *const u8, dst: &mut [u8]) -> Option<u32> {
    #[cfg(target_arch = "x86_64")]
    if dst.len() >= KERNEL_MIN && x86::available() {
        let src = x86::Shared { ptr: src, len: dst.len() };
        // SAFETY: `available` saw the kernel's features; the caller's contract makes `src` a readable range for
        // the call, which `Shared` reads within (each read checked against its length).
        return Some(unsafe { x86::update_avx512::<_, true>(crc, src, dst) });
    }
    let _ = (crc, src);
    None
}

/// Whether this CPU has the features of this module's kernels: [`update`] then takes [`update_short`]'s from
/// [`SHORT_MIN`] to [`SHORT_MAX`] bytes and the general one above (else crc32fast at every length).
#[inline]
pub fn kernel_available() -> bool {
    #[cfg(target_arch = "x86_64")]
    return x86::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// The CRC from `crc` of the `8 * W` bytes of `words` (each little-endian, in order), `W` 6 or 8 (three or four
/// 16-byte blocks). For bytes the caller holds as values: they reach the multiplications in registers, not through
/// memory. The transmit side hashes a frame's headers this way (`template::HeaderTemplate`'s `head_crc`), built
/// from its template and the packet's fields, instead of reading back the bytes it has just stored. Other `W` (at
/// most 8), or a CPU without this module's kernel: crc32fast over the bytes.
#[inline(always)]
pub fn update_words<const W: usize>(crc: u32, words: [u64; W]) -> u32 {
    const { assert!(W <= 8, "update_words: at most 8 words") };
    #[cfg(target_arch = "x86_64")]
    if x86::available() {
        let b = |k: usize| x86::block(words[2 * k], words[2 * k + 1]);
        match W {
            // SAFETY: `available` saw every target feature of `blocks` on this CPU (the fourth block is not read).
            6 => return unsafe { x86::blocks::<3>(crc, [b(0), b(1), b(2), b(2)]) },
            // SAFETY: as above.
            8 => return unsafe { x86::blocks::<4>(crc, [b(0), b(1), b(2), b(3)]) },
            _ => {}
        }
    }
    let mut bytes = [0u8; 64];
    for (b, w) in bytes.chunks_exact_mut(8).zip(words) {
        b.copy_from_slice(&w.to_le_bytes());
    }
    fallback(crc, &bytes[..8 * W])
}

/// crc32fast, from a finished CRC value.
#[inline]
fn fallback(crc: u32, data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new_with_initial(crc);
    h.update(data);
    h.finalize()
}

/// The generator polynomial without its x^32 term, normal (not reflected) bit order.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const POLY: u32 = 0x04C1_1DB7;

/// `a(x) * b(x) mod P(x)`, normal bit order.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const fn mul_mod(a: u32, b: u32) -> u32 {
    let (mut a, mut r, mut i) = (a, 0u32, 0);
    while i < 32 {
        if b & (1 << i) != 0 {
            r ^= a;
        }
        let carry = a & 0x8000_0000 != 0;
        a <<= 1;
        if carry {
            a ^= POLY;
        }
        i += 1;
    }
    r
}

/// `x^n mod P(x)`, normal bit order.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const fn x_pow_mod(n: u32) -> u32 {
    let (mut r, mut base, mut e) = (1u32, 2u32, n);
    while e > 0 {
        if e & 1 != 0 {
            r = mul_mod(r, base);
        }
        base = mul_mod(base, base);
        e >>= 1;
    }
    r
}

/// The reflected 33-bit constant `x^n mod P` as the carry-less multiplications of the reflected domain use it.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const fn fold_key(n: u32) -> u64 {
    (x_pow_mod(n).reverse_bits() as u64) << 1
}

/// The constants that move a 128-bit block `d` blocks forward (`x^(128 d)`): for its low and high 64-bit halves.
/// Zero for `d = 0` (the last block is added as it is).
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const fn fold_pair(d: usize) -> [u64; 2] {
    if d == 0 {
        return [0, 0];
    }
    let bits = 128 * d as u32;
    [fold_key(bits + 32), fold_key(bits - 32)]
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::fold_pair;
    use core::arch::x86_64::*;
    use std::sync::atomic::{AtomicU8, Ordering};

    /// Distances (in 16-byte blocks) the table covers: the 16 accumulator lanes plus up to 16 remaining blocks, and
    /// `short`'s blocks (up to 31 blocks from the end).
    pub(super) const MAX_D: usize = 32;

    /// `BY_DESCENDING_D[j] = fold_pair(MAX_D - 1 - j)`: four consecutive entries are the constants of a 512-bit
    /// vector whose four blocks lie `d, d - 1, d - 2, d - 3` blocks from the end.
    static BY_DESCENDING_D: [[u64; 2]; MAX_D] = {
        let mut t = [[0u64; 2]; MAX_D];
        let mut j = 0;
        while j < MAX_D {
            t[j] = fold_pair(MAX_D - 1 - j);
            j += 1;
        }
        t
    };

    /// The 16-byte block of two little-endian words.
    #[inline(always)]
    pub(super) fn block(lo: u64, hi: u64) -> __m128i {
        bytemuck::cast([lo, hi])
    }

    /// The CRC from `crc` of the first `N` (2..=4) of `b` as consecutive blocks: each block times its distance to
    /// the end (the last added as it is), the initial register XORed into the first block's first four bytes, one
    /// reduction.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    pub(super) fn blocks<const N: usize>(crc: u32, b: [__m128i; 4]) -> u32 {
        const { assert!(N >= 2 && N <= 4) };
        let mut x = _mm_xor_si128(b[0], _mm_cvtsi32_si128(!crc as i32));
        x = mul128(x, keys128(N - 1));
        for (i, &v) in b.iter().enumerate().take(N - 1).skip(1) {
            x = _mm_xor_si128(x, mul128(v, keys128(N - 1 - i)));
        }
        reduce(_mm_xor_si128(x, b[N - 1]))
    }

    /// 2048 bits ahead: the four accumulators' step.
    const STEP: [u64; 2] = fold_pair(16);
    /// `x^64`: the second step of the 128 -> 32-bit reduction (crc32fast's K5).
    const K64: u64 = super::fold_key(64);
    /// Barrett reduction: P(x) reflected with its x^32 term, and floor(x^64 / P(x)) reflected.
    const P_X: u64 = 0x1_DB71_0641;
    const MU: u64 = 0x1_F701_1641;

    /// 0 not yet looked, 1 the kernel's features are there, 2 they are not.
    static KIND: AtomicU8 = AtomicU8::new(0);

    /// Whether this CPU has every feature `update_avx512` is compiled for (looked up once).
    #[inline(always)]
    pub(super) fn available() -> bool {
        match KIND.load(Ordering::Relaxed) {
            1 => true,
            2 => false,
            _ => detect(),
        }
    }

    #[cold]
    fn detect() -> bool {
        let ok = is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512vl")
            && is_x86_feature_detected!("vpclmulqdq")
            && is_x86_feature_detected!("pclmulqdq")
            && is_x86_feature_detected!("sse4.1")
            && is_x86_feature_detected!("avx2");
        KIND.store(if ok { 1 } else { 2 }, Ordering::Relaxed);
        ok
    }

    /// Where the kernel reads its input: a slice, or a range of shared memory ([`Shared`]). Every read is within
    /// `len()` (checked: a bad index panics instead of reading out of bounds).
    pub(super) trait Source: Copy {
        fn len(self) -> usize;
        /// The 16 bytes at `at`.
        fn block(self, at: usize) -> __m128i;
        /// The 64 bytes at `at`.
        fn vector(self, at: usize) -> __m512i;
        /// The 256 bytes at `at`, as four vectors (one check for the four).
        fn chunk(self, at: usize) -> [__m512i; 4];
        /// Copies the `dst.len()` bytes at `at` into `dst`.
        fn copy_to(self, at: usize, dst: &mut [u8]);
    }

    impl Source for &[u8] {
        #[inline(always)]
        fn len(self) -> usize {
            <[u8]>::len(self)
        }
        #[inline(always)]
        fn block(self, at: usize) -> __m128i {
            bytemuck::pod_read_unaligned(&self[at..at + 16])
        }
        #[inline(always)]
        fn vector(self, at: usize) -> __m512i {
            bytemuck::pod_read_unaligned(&self[at..at + 64])
        }
        #[inline(always)]
        fn chunk(self, at: usize) -> [__m512i; 4] {
            let c: &[u8; 256] = self[at..at + 256].try_into().expect("256 bytes");
            bytemuck::pod_read_unaligned(c)
        }
        #[inline(always)]
        fn copy_to(self, at: usize, dst: &mut [u8]) {
            dst.copy_from_slice(&self[at..at + dst.len()]);
        }
    }

    /// A range of memory another process may write while it is read (see [`super::update_copy_shared`]).
    #[derive(Clone, Copy)]
    pub(super) struct Shared {
        /// Readable for `len` bytes during the kernel's call (its caller's contract).
        pub(super) ptr: *const u8,
        pub(super) len: usize,
    }

    impl Shared {
        /// `N` bytes at `at`, as `T` (a vector of `N` bytes).
        #[inline(always)]
        fn read<T: bytemuck::Pod, const N: usize>(self, at: usize) -> T {
            assert!(at <= self.len && N <= self.len - at, "crc kernel: read past the shared range");
            // SAFETY: at .. at + N is inside the range (checked), which `update_copy_shared`'s caller keeps
            // readable for the call; an unaligned read of plain bytes (any value is a valid T: Pod).
            unsafe { self.ptr.add(at).cast::<T>().read_unaligned() }
        }
    }

    impl Source for Shared {
        #[inline(always)]
        fn len(self) -> usize {
            self.len
        }
        #[inline(always)]
        fn block(self, at: usize) -> __m128i {
            self.read::<__m128i, 16>(at)
        }
        #[inline(always)]
        fn vector(self, at: usize) -> __m512i {
            self.read::<__m512i, 64>(at)
        }
        #[inline(always)]
        fn chunk(self, at: usize) -> [__m512i; 4] {
            self.read::<[__m512i; 4], 256>(at)
        }
        #[inline(always)]
        fn copy_to(self, at: usize, dst: &mut [u8]) {
            assert!(at <= self.len && dst.len() <= self.len - at, "crc kernel: copy past the shared range");
            // SAFETY: as in `read`; `dst` is the kernel's own buffer, which the caller's contract keeps apart.
            unsafe { core::ptr::copy_nonoverlapping(self.ptr.add(at), dst.as_mut_ptr(), dst.len()) };
        }
    }

    #[inline(always)]
    fn load128(s: &[u8], at: usize) -> __m128i {
        bytemuck::pod_read_unaligned(&s[at..at + 16])
    }

    #[inline(always)]
    fn store128(d: &mut [u8], at: usize, v: __m128i) {
        d[at..at + 16].copy_from_slice(bytemuck::bytes_of(&v));
    }

    #[inline(always)]
    fn store512(d: &mut [u8], at: usize, v: __m512i) {
        d[at..at + 64].copy_from_slice(bytemuck::bytes_of(&v));
    }

    /// The constants of a 512-bit vector whose first block lies `d` (3..MAX_D) blocks from the end.
    #[inline(always)]
    fn keys512(d: usize) -> __m512i {
        let j = MAX_D - 1 - d;
        bytemuck::pod_read_unaligned(bytemuck::cast_slice(&BY_DESCENDING_D[j..j + 4]))
    }

    /// The constants of a block `d` (0..MAX_D) blocks from the end.
    #[inline(always)]
    fn keys128(d: usize) -> __m128i {
        bytemuck::cast(BY_DESCENDING_D[MAX_D - 1 - d])
    }

    /// Each 128-bit lane of `v` times its lane of `k` (low half by low key, high by high, XORed).
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.1,avx2")]
    fn mul512(v: __m512i, k: __m512i) -> __m512i {
        _mm512_xor_si512(_mm512_clmulepi64_epi128(v, k, 0x00), _mm512_clmulepi64_epi128(v, k, 0x11))
    }

    /// [`mul512`] XOR `data`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.1,avx2")]
    fn fold512(v: __m512i, k: __m512i, data: __m512i) -> __m512i {
        _mm512_ternarylogic_epi64(
            _mm512_clmulepi64_epi128(v, k, 0x00),
            _mm512_clmulepi64_epi128(v, k, 0x11),
            data,
            0x96,
        )
    }

    #[inline]
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    fn mul128(v: __m128i, k: __m128i) -> __m128i {
        _mm_xor_si128(_mm_clmulepi64_si128(v, k, 0x00), _mm_clmulepi64_si128(v, k, 0x11))
    }

    /// The four lanes of `z` XORed.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.1,avx2")]
    fn lanes_xor(z: __m512i) -> __m128i {
        let y = _mm256_xor_si256(_mm512_castsi512_si256(z), _mm512_extracti64x4_epi64(z, 1));
        _mm_xor_si128(_mm256_castsi256_si128(y), _mm256_extracti128_si256(y, 1))
    }

    /// The finished CRC of the input whose blocks, each moved to the end, XOR to `x`.
    #[inline]
    #[target_feature(enable = "pclmulqdq,sse4.1")]
    fn reduce(x: __m128i) -> u32 {
        let low32 = _mm_set_epi32(0, 0, 0, !0);
        // 128 -> 96 bits: the low half times x^96 ... (crc32fast's K4), XOR the high half.
        let x = _mm_xor_si128(_mm_clmulepi64_si128(x, keys128(1), 0x10), _mm_srli_si128(x, 8));
        // 96 -> 64 bits.
        let x = _mm_xor_si128(
            _mm_clmulepi64_si128(_mm_and_si128(x, low32), _mm_set_epi64x(0, K64 as i64), 0x00),
            _mm_srli_si128(x, 4),
        );
        // Barrett, reflected: the quotient's low 32 bits times P, then the remainder is the upper half.
        let pu = _mm_set_epi64x(MU as i64, P_X as i64);
        let t1 = _mm_clmulepi64_si128(_mm_and_si128(x, low32), pu, 0x10);
        let t2 = _mm_clmulepi64_si128(_mm_and_si128(t1, low32), pu, 0x00);
        !(_mm_extract_epi32(_mm_xor_si128(x, t2), 1) as u32)
    }

    /// The blocks of `t` from `at` to its end (16..=256 bytes, whole blocks), each moved to the end, as a 512-bit and
    /// a 128-bit part to XOR; copied into `d` (that many bytes) when `COPY`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.1,avx2")]
    fn blocks_to_end<S: Source, const COPY: bool>(t: S, at: usize, d: &mut [u8]) -> (__m512i, __m128i) {
        let len = t.len() - at;
        let n = len / 16;
        let lead = n % 4;
        let mut x = _mm_setzero_si128();
        for i in 0..lead {
            let v = t.block(at + 16 * i);
            if COPY {
                store128(d, 16 * i, v);
            }
            x = _mm_xor_si128(x, mul128(v, keys128(n - 1 - i)));
        }
        let mut z = _mm512_setzero_si512();
        let mut o = 16 * lead;
        while o < len {
            let v = t.vector(at + o);
            if COPY {
                store512(d, o, v);
            }
            z = _mm512_xor_si512(z, mul512(v, keys512(n - 1 - o / 16)));
            o += 64;
        }
        // The last block, zero blocks from the end: its constants are zero, so it is added as it is (read again
        // from the copy when there is one, so that a source that changed meanwhile is hashed as it was copied).
        let last = if COPY { load128(d, len - 16) } else { t.block(t.len() - 16) };
        (z, _mm_xor_si128(x, last))
    }

    /// An input's first `r` (1..16) bytes, read as the 16 bytes `first` (little-endian), with the initial register
    /// `init` (the complemented CRC value) XORed over them, at the top of a block zero-padded in front; and what the
    /// shift drops of the register (`r < 4`), which belongs to the first whole block.
    #[inline(always)]
    fn partial_head(first: u128, init: u128, r: usize) -> (u128, u128) {
        let head = (first ^ init) << (8 * (16 - r));
        let spill = if r < 4 { init >> (8 * r) } else { 0 };
        (head, spill)
    }

    /// The CRC from `crc` of `data`: `r` (0..16) bytes, then `N` (2..=31) whole blocks ([`super::update_short`]).
    /// The leading `N % 4` whole blocks one by one, the rest as 512-bit vectors, each block times its own distance
    /// to the end (the last block, at distance zero, added as it is); the first `r` bytes as a block zero-padded in
    /// front, `N` blocks from the end. The initial register is XORed into the input's first four bytes: into that
    /// partial block, the part of it past `r` bytes into the first whole block. One reduction. `N` is a constant:
    /// the loops unroll and the constants are fixed loads.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.1,avx2")]
    pub(super) fn short<const N: usize>(crc: u32, data: &[u8]) -> u32 {
        assert!((2..=31).contains(&N) && data.len() / 16 == N, "crc short kernel: {} bytes for {N} blocks", data.len());
        let r = data.len() % 16;
        let init = u128::from(!crc);
        // What the first whole block takes besides its bytes, and the partial block's product.
        let (into_first, mut x) = if r == 0 {
            (init, _mm_setzero_si128())
        } else {
            let (head, spill) = partial_head(bytemuck::pod_read_unaligned(&data[..16]), init, r);
            (spill, mul128(bytemuck::cast(head), keys128(N)))
        };
        let body = &data[r..];
        let into_first: __m128i = bytemuck::cast(into_first);
        let lead = N % 4;
        for i in 0..lead {
            let v = load128(body, 16 * i);
            let v = if i == 0 { _mm_xor_si128(v, into_first) } else { v };
            x = _mm_xor_si128(x, mul128(v, keys128(N - 1 - i)));
        }
        let mut z = _mm512_setzero_si512();
        let mut o = 16 * lead;
        while o < 16 * N {
            let v: __m512i = bytemuck::pod_read_unaligned(&body[o..o + 64]);
            let v = if o == 0 { _mm512_xor_si512(v, _mm512_zextsi128_si512(into_first)) } else { v };
            z = _mm512_xor_si512(z, mul512(v, keys512(N - 1 - o / 16)));
            o += 64;
        }
        reduce(_mm_xor_si128(_mm_xor_si128(lanes_xor(z), x), load128(body, 16 * N - 16)))
    }

    /// The kernel: the CRC of `src` (at least [`super::KERNEL_MIN`] bytes) from `crc`; `src` copied into `dst`
    /// (same length) when `COPY`, else `dst` is not used. With `COPY` every source byte is read once.
    #[target_feature(enable = "avx512f,avx512vl,vpclmulqdq,pclmulqdq,sse4.1,avx2")]
    pub(super) fn update_avx512<S: Source, const COPY: bool>(crc: u32, src: S, dst: &mut [u8]) -> u32 {
        let n = src.len();
        assert!(n >= 64, "crc kernel: input below 64 bytes");
        if COPY {
            assert_eq!(dst.len(), n, "crc kernel: length mismatch");
        }
        let init = u128::from(!crc);
        // The input as whole blocks from its end: a first partial block of `r` bytes, zero-padded in front. `x` is
        // what the body's first block takes besides its bytes: the initial register (XORed into the input's first
        // four bytes) and, with a partial block, that block moved one block forward.
        let r = n % 16;
        let x: __m128i = if r == 0 {
            bytemuck::cast(init)
        } else {
            // The first r bytes (read once: from the copy when there is one; the bytes after them in those 16 are
            // shifted out below).
            let first: u128 = if COPY {
                src.copy_to(0, &mut dst[..r]);
                u128::from_le_bytes(dst[..16].try_into().expect("16 bytes"))
            } else {
                bytemuck::cast(src.block(0))
            };
            let (head, spill) = partial_head(first, init, r);
            _mm_xor_si128(mul128(bytemuck::cast(head), keys128(1)), bytemuck::cast(spill))
        };
        let dbody: &mut [u8] = if COPY { &mut dst[r..] } else { &mut [] };
        let len = n - r;
        if len <= 256 {
            let (z, b) = blocks_to_end::<S, COPY>(src, r, dbody);
            return reduce(_mm_xor_si128(_mm_xor_si128(lanes_xor(z), b), mul128(x, keys128(len / 16 - 1))));
        }
        let [b0, b1, b2, b3] = src.chunk(r);
        if COPY {
            store512(dbody, 0, b0);
            store512(dbody, 64, b1);
            store512(dbody, 128, b2);
            store512(dbody, 192, b3);
        }
        let (mut v0, mut v1, mut v2, mut v3) = (_mm512_xor_si512(b0, _mm512_zextsi128_si512(x)), b1, b2, b3);
        let step: __m512i = bytemuck::cast([STEP; 4]);
        // Whole 256-byte chunks after the first, leaving 16..=256 bytes for the end (so that the last block is one
        // of the input's).
        let end = 256 + (len - 256 - 1) / 256 * 256;
        let mut at = 256;
        while at < end {
            let [a, b, c, d] = src.chunk(r + at);
            if COPY {
                let out: &mut [u8; 256] = (&mut dbody[at..at + 256]).try_into().expect("256 bytes");
                *out = bytemuck::cast([a, b, c, d]);
            }
            v0 = fold512(v0, step, a);
            v1 = fold512(v1, step, b);
            v2 = fold512(v2, step, c);
            v3 = fold512(v3, step, d);
            at += 256;
        }
        let left = (len - at) / 16;
        let (z, b) = blocks_to_end::<S, COPY>(src, r + at, if COPY { &mut dbody[at..] } else { &mut [] });
        let acc = _mm512_ternarylogic_epi64(
            mul512(v0, keys512(left + 15)),
            mul512(v1, keys512(left + 11)),
            mul512(v2, keys512(left + 7)),
            0x96,
        );
        let acc = _mm512_ternarylogic_epi64(acc, mul512(v3, keys512(left + 3)), z, 0x96);
        reduce(_mm_xor_si128(lanes_xor(acc), b))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(crc: u32, data: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new_with_initial(crc);
        h.update(data);
        h.finalize()
    }

    #[test]
    fn update_words_equals_crc32fast_over_the_words_bytes() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..2000 {
            let crc = next() as u32;
            let w: [u64; 8] = std::array::from_fn(|_| next());
            let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
            let six: [u64; 6] = w[..6].try_into().unwrap();
            assert_eq!(update_words(crc, six), reference(crc, &bytes[..48]), "6 words from {crc:#x}");
            assert_eq!(update_words(crc, w), reference(crc, &bytes), "8 words from {crc:#x}");
        }
        // Every single bit of each word, from the two registers the transmit side uses.
        for crc in [0u32, !0] {
            for bit in 0..512 {
                let mut w = [0u64; 8];
                w[bit / 64] = 1 << (bit % 64);
                let bytes: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
                assert_eq!(update_words(crc, w), reference(crc, &bytes), "bit {bit} from {crc:#x}");
                if bit < 384 {
                    let six: [u64; 6] = w[..6].try_into().unwrap();
                    assert_eq!(update_words(crc, six), reference(crc, &bytes[..48]), "bit {bit} from {crc:#x}");
                }
            }
        }
    }

    #[test]
    fn fold_keys_are_the_published_constants() {
        // Intel's paper / crc32fast's K1..K5 and its 2048-bit pair.
        assert_eq!(fold_pair(4), [0x1_5444_2bd4, 0x1_c6e4_1596]);
        assert_eq!(fold_pair(1), [0x1_7519_97d0, 0x0_ccaa_009e]);
        assert_eq!(fold_pair(16), [0x1_1542_778a, 0x1_322d_1430]);
        assert_eq!(fold_key(64), 0x1_63cd_6124);
        assert_eq!(fold_pair(0), [0, 0]);
    }

    #[test]
    fn equals_crc32fast_at_every_length_alignment_and_register() {
        let src: Vec<u8> = (0..6000u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8).collect();
        for n in (0..1100).chain([2047, 2048, 2049, 4095, 4096, 4097, 4160, 4176, 5000]) {
            for off in [0usize, 1, 7, 13] {
                for crc in [0u32, !0, 0x2144_df1c, 0x1234_5678] {
                    let s = &src[off..off + n];
                    assert_eq!(update(crc, s), reference(crc, s), "update: {n} bytes at {off}, register {crc:#x}");
                }
            }
        }
    }

    #[test]
    fn update_copy_copies_exactly_and_hashes() {
        let src: Vec<u8> = (0..5010u32).map(|i| (i.wrapping_mul(40_503) >> 3) as u8).collect();
        for n in (0..700).chain([1024, 1031, 4096, 4100, 4999]) {
            for (off, dst_off) in [(0usize, 0usize), (3, 58), (1, 70)] {
                let mut dst = vec![0xa5u8; n + 200];
                let s = &src[off..off + n];
                let got = update_copy(0x2144_df1c, s, &mut dst[dst_off..dst_off + n]);
                assert_eq!(got, reference(0x2144_df1c, s), "{n} bytes");
                assert_eq!(&dst[dst_off..dst_off + n], s, "{n} bytes copied");
                assert!(dst[..dst_off].iter().chain(&dst[dst_off + n..]).all(|&b| b == 0xa5), "{n} bytes: outside");
            }
        }
    }

    /// Every destination alignment within a cache line, with source offsets and lengths around the kernel's chunk and tail boundaries: the
    /// bytes copied exactly, nothing written outside, the CRC crc32fast's; the shared-memory copy the same.
    #[test]
    fn update_copy_at_every_destination_alignment() {
        let src: Vec<u8> = (0..5300u32).map(|i| (i.wrapping_mul(2_246_822_519) >> 9) as u8).collect();
        let mut arena = vec![0u8; 5300 + 256];
        let base = (64 - arena.as_ptr() as usize % 64) % 64;
        for n in [384usize, 400, 511, 512, 527, 639, 640, 1000, 1024, 2047, 4096, 4100, 5000] {
            for align in 0..64 {
                for off in [0usize, 1, 32, 63] {
                    let s = &src[off..off + n];
                    arena.fill(0xa5);
                    let at = base + 64 + align;
                    let got = update_copy(0x1234_5678, s, &mut arena[at..at + n]);
                    assert_eq!(got, reference(0x1234_5678, s), "{n} bytes to alignment {align} from {off}");
                    assert!(arena[at..at + n] == *s, "{n} bytes to alignment {align} from {off}: copy");
                    assert!(
                        arena[..at].iter().chain(&arena[at + n..]).all(|&b| b == 0xa5),
                        "{n} bytes to alignment {align} from {off}: outside"
                    );
                    arena.fill(0xa5);
                    // SAFETY: `s` is a live slice of `n` readable bytes that the arena does not overlap.
                    if let Some(v) = unsafe { update_copy_shared(0x1234_5678, s.as_ptr(), &mut arena[at..at + n]) } {
                        assert_eq!(v, got, "shared: {n} bytes to alignment {align} from {off}");
                        assert!(arena[at..at + n] == *s, "shared: {n} bytes to alignment {align}: copy");
                        assert!(arena[..at].iter().chain(&arena[at + n..]).all(|&b| b == 0xa5), "shared: outside");
                    }
                }
            }
        }
    }

    #[test]
    fn update_copy_shared_equals_update_copy() {
        let src: Vec<u8> = (0..5100u32).map(|i| (i.wrapping_mul(97) ^ (i >> 5)) as u8).collect();
        for n in (0..700).chain([1024, 1031, 4096, 4100, 5000]) {
            for off in [0usize, 5, 64] {
                let s = &src[off..off + n];
                let mut a = vec![0x5au8; n];
                let mut b = vec![0x5au8; n];
                let want = update_copy(0x2144_df1c, s, &mut a);
                // SAFETY: `s` is a live slice of `n` readable bytes that `b` does not overlap.
                match unsafe { update_copy_shared(0x2144_df1c, s.as_ptr(), &mut b) } {
                    Some(v) => {
                        assert!(n >= KERNEL_MIN && kernel_available(), "{n} bytes: the kernel took it");
                        assert_eq!((v, &b), (want, &a), "{n} bytes at {off}");
                    }
                    None => {
                        assert!(n < KERNEL_MIN || !kernel_available(), "{n} bytes: refused");
                        assert!(b.iter().all(|&x| x == 0x5a), "{n} bytes: nothing copied when refused");
                    }
                }
            }
        }
    }

    /// Every length the short kernel takes, and the lengths beside them, at several alignments and registers;
    /// lengths it does not take are refused (the caller then runs crc32fast).
    #[test]
    fn update_short_equals_crc32fast() {
        if !kernel_available() {
            eprintln!("this CPU lacks the CRC kernels' features: update_short is checked to refuse every input");
        }
        let src: Vec<u8> = (0..700u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        for n in 0..=SHORT_MAX + 20 {
            for off in [0usize, 1, 9, 63] {
                for crc in [0u32, !0, 0x2144_df1c, 0x9e37_79b9] {
                    let s = &src[off..off + n];
                    let taken = (SHORT_MIN..=SHORT_MAX).contains(&n) && kernel_available();
                    match update_short(crc, s) {
                        Some(v) => {
                            assert!(taken, "{n} bytes taken");
                            assert_eq!(v, reference(crc, s), "{n} bytes at {off}, register {crc:#x}");
                        }
                        None => assert!(!taken, "{n} bytes refused"),
                    }
                }
            }
        }
    }

    /// Each block's bit at each position reaches the CRC (a constant at the wrong distance, or a block left out,
    /// changes the value of some single-bit input).
    #[test]
    fn update_short_sees_every_bit() {
        // Without the kernel's features every call is refused (checked too).
        let has = kernel_available();
        for n in (SHORT_MIN..=SHORT_MAX).step_by(7).chain([SHORT_MAX]) {
            let mut d = vec![0u8; n];
            for bit in 0..d.len() * 8 {
                d[bit / 8] = 1 << (bit % 8);
                let want = has.then(|| reference(0, &d));
                assert_eq!(update_short(0, &d), want, "{n} bytes, bit {bit}");
                d[bit / 8] = 0;
            }
        }
    }

    #[test]
    fn continues_across_calls() {
        // A pass split anywhere equals one pass (the ICRC hashes headers, then payload, then pad).
        let src: Vec<u8> = (0..3000u32).map(|i| (i ^ (i >> 7)) as u8).collect();
        let whole = reference(0, &src);
        for cut in [0usize, 1, 60, 64, 127, 128, 129, 1000, 2999, 3000] {
            let (a, b) = src.split_at(cut);
            assert_eq!(update(update(0, a), b), whole, "cut at {cut}");
            let mut d = vec![0u8; b.len()];
            assert_eq!(update_copy(update(0, a), b, &mut d), whole, "copy, cut at {cut}");
        }
    }

    /// A xorshift64 generator (test inputs).
    fn xorshift(mut x: u64) -> impl FnMut() -> u64 {
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// The CRC bit by bit from the polynomial (independent of crc32fast, whose vector kernels share this module's
    /// method).
    fn bitwise(crc: u32, data: &[u8]) -> u32 {
        let mut r = !crc;
        for &b in data {
            r ^= u32::from(b);
            for _ in 0..8 {
                r = if r & 1 != 0 { (r >> 1) ^ 0xedb8_8320 } else { r >> 1 };
            }
        }
        !r
    }

    /// Every length to 5000 (every residue of 16, every count of remaining blocks after the 256-byte loop, up to
    /// 18 turns of it) and a few longer ones, each from a random register at a random alignment, by `update` and
    /// by `update_copy` into a random destination alignment (the bytes around it untouched); some against the
    /// bitwise CRC too.
    #[test]
    fn every_length_to_5000_from_random_registers_and_alignments() {
        let mut rnd = xorshift(0x9e37_79b9_7f4a_7c15);
        let src: Vec<u8> = (0..9000).map(|_| rnd() as u8).collect();
        let mut dst = vec![0u8; 9000];
        for n in (0..=5000).chain([6143, 6144, 6145, 8191, 8192, 8193]) {
            for k in 0..3 {
                let crc = match k {
                    0 => rnd() as u32,
                    1 => !0,
                    _ => 0,
                };
                let off = (rnd() % 64) as usize;
                let s = &src[off..off + n];
                let want = reference(crc, s);
                assert_eq!(update(crc, s), want, "update: {n} bytes at {off}, register {crc:#x}");
                if n % 97 == 0 || n < 300 {
                    assert_eq!(bitwise(crc, s), want, "bitwise: {n} bytes");
                }
                let at = (rnd() % 64) as usize;
                let fill = rnd() as u8;
                dst.fill(fill);
                assert_eq!(
                    update_copy(crc, s, &mut dst[at..at + n]),
                    want,
                    "update_copy: {n} bytes, register {crc:#x}"
                );
                assert_eq!(&dst[at..at + n], s, "update_copy: {n} bytes copied");
                assert!(dst[..at].iter().chain(&dst[at + n..]).all(|&b| b == fill), "update_copy: {n} bytes: outside");
            }
        }
    }

    /// A pass cut at random points into up to five pieces, each by `update` or `update_copy`, equals one pass.
    #[test]
    fn random_splits_equal_one_pass() {
        let mut rnd = xorshift(0x2545_f491_4f6c_dd1d);
        let src: Vec<u8> = (0..6000).map(|_| rnd() as u8).collect();
        for _ in 0..3000 {
            let n = (rnd() % 6000) as usize;
            let s = &src[..n];
            let init = rnd() as u32;
            let want = reference(init, s);
            let mut cuts: Vec<usize> = (0..rnd() % 5).map(|_| (rnd() % (n as u64 + 1)) as usize).collect();
            cuts.push(0);
            cuts.push(n);
            cuts.sort_unstable();
            let mut out = vec![0u8; n];
            let mut crc = init;
            for w in cuts.windows(2) {
                let (a, b) = (w[0], w[1]);
                crc = if rnd() & 1 == 0 { update(crc, &s[a..b]) } else { update_copy(crc, &s[a..b], &mut out[a..b]) };
                out[a..b].copy_from_slice(&s[a..b]);
            }
            assert_eq!(crc, want, "{n} bytes cut at {cuts:?}");
            assert_eq!(out, s);
        }
    }

    #[test]
    #[should_panic(expected = "length mismatch")]
    fn update_copy_refuses_unequal_lengths() {
        update_copy(0, &[0u8; 200], &mut [0u8; 199]);
    }
}
