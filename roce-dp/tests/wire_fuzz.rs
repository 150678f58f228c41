//! A bounded, seeded fuzz of the frame parser that runs in `cargo test` (cargo-fuzz needs nightly). Inputs are
//! the rxe capture frames mutated (bit flips, byte overwrites, header-field rewrites, truncation, extension) plus
//! random byte strings. Properties: no panic; every rejection is a parse-time reason; anything accepted re-emits
//! to a frame that parses back to the same headers and payload.
//!
//! `ROCE_FUZZ_SEED=<n>` and `ROCE_FUZZ_CASES=<n>` reproduce or extend a run.

mod common;

use roce_dp::wire::{emit_frame, frame_len, parse_frame, parse_frame_checked, Error};

/// SplitMix64: tiny, seedable, good enough to drive mutations.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn byte(&mut self) -> u8 {
        self.next() as u8
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// Offsets worth aiming at in an untagged IPv4 frame: Ethernet type, IP version/IHL/TOS/lengths/flags/TTL/
/// protocol/checksum, UDP ports/length, BTH opcode/flags/byte 4, the first extension header bytes.
const HOT: &[usize] = &[12, 13, 14, 15, 16, 17, 20, 21, 22, 23, 24, 25, 36, 37, 38, 39, 42, 43, 46, 50, 54, 58];

fn mutate(rng: &mut Rng, seed: &[u8], out: &mut Vec<u8>) {
    out.clear();
    match rng.below(8) {
        0 => {
            // Random bytes of a random length.
            let n = rng.below(160);
            out.extend((0..n).map(|_| rng.byte()));
            return;
        }
        1 => {
            // A seed prefix (every truncation point eventually).
            out.extend_from_slice(&seed[..rng.below(seed.len() + 1)]);
            return;
        }
        _ => out.extend_from_slice(seed),
    }
    for _ in 0..=rng.below(4) {
        if out.is_empty() {
            break;
        }
        match rng.below(5) {
            0 => {
                let at = rng.below(out.len());
                out[at] ^= 1 << rng.below(8);
            }
            1 => {
                let at = HOT[rng.below(HOT.len())];
                if at < out.len() {
                    out[at] = rng.byte();
                }
            }
            2 => {
                let at = HOT[rng.below(HOT.len())];
                if at < out.len() {
                    out[at] ^= 1 << rng.below(8);
                }
            }
            3 => {
                let n = rng.below(out.len() + 1);
                out.truncate(n);
            }
            _ => {
                let n = rng.below(64);
                out.extend((0..n).map(|_| rng.byte()));
            }
        }
    }
    // Often repair the IPv4 header checksum so mutations reach the layers behind it.
    if rng.below(2) == 0 && out.len() >= 34 && out[12..14] == [0x08, 0x00] {
        let ihl = usize::from(out[14] & 0x0f) * 4;
        if ihl >= 20 && out.len() >= 14 + ihl {
            let mut ip = roce_dp::wire::Ipv4Packet::new_unchecked(&mut out[14..14 + ihl]);
            ip.fill_checksum();
        }
    }
}

#[test]
fn parser_survives_mutated_and_random_frames() {
    let seed = env_u64("ROCE_FUZZ_SEED", 0x5eed_2026);
    let cases = env_u64("ROCE_FUZZ_CASES", 300_000);
    let seeds: Vec<Vec<u8>> = common::all_roce_frames().into_iter().map(|(_, f)| f).collect();
    assert!(!seeds.is_empty());
    let mut rng = Rng(seed);
    let mut input = Vec::with_capacity(2048);
    let mut out = vec![0u8; 4096];
    let (mut accepted, mut rejected) = (0u64, [0u64; 12]);
    for case in 0..cases {
        let s = &seeds[rng.below(seeds.len())];
        mutate(&mut rng, s, &mut input);
        let ctx = || format!("seed {seed} case {case} input {input:02x?}");
        let result = std::panic::catch_unwind(|| parse_frame(&input));
        let Ok(result) = result else { panic!("parse_frame panicked: {}", ctx()) };
        match result {
            Ok(f) => {
                accepted += 1;
                assert_eq!(parse_frame_checked(&input).is_ok(), f.icrc_ok, "{}", ctx());
                // The payload is a window of the input.
                let (base, p) = (input.as_ptr() as usize, f.payload.as_ptr() as usize);
                assert!(p >= base && p + f.payload.len() <= base + input.len(), "{}", ctx());
                // Re-emit and parse back: same headers (pad recomputed), same payload, good ICRC.
                let n = emit_frame(&mut out, &f.repr, f.payload.len(), |b| b.copy_from_slice(f.payload))
                    .unwrap_or_else(|e| panic!("re-emit failed ({e}): {}", ctx()));
                assert_eq!(n, frame_len(&f.repr, f.payload.len()));
                let g = parse_frame_checked(&out[..n]).unwrap_or_else(|e| panic!("re-parse failed ({e}): {}", ctx()));
                let mut expect = f.repr;
                expect.bth.pad = ((4 - f.payload.len() % 4) % 4) as u8;
                assert_eq!(g.repr, expect, "{}", ctx());
                assert_eq!(g.payload, f.payload, "{}", ctx());
            }
            Err(e) => {
                let i = match e {
                    Error::Truncated => 0,
                    Error::NotIp => 1,
                    Error::BadIpHeader => 2,
                    Error::NotUdp => 3,
                    Error::NotRoce => 4,
                    Error::LengthMismatch => 5,
                    Error::BadBthVersion => 6,
                    Error::UnknownOpcode(_) => 7,
                    Error::BadPadCount => 8,
                    Error::BadIcrc | Error::BufferTooSmall | Error::Unencodable => {
                        panic!("parse_frame returned {e:?}, which is not a parse-time reason: {}", ctx())
                    }
                };
                rejected[i] += 1;
            }
        }
    }
    eprintln!("fuzz: seed {seed}, {cases} cases, accepted {accepted}, rejected by reason {rejected:?}");
    // The mutations must reach every reason, or the fuzz is not exercising the parser.
    assert!(accepted > cases / 20, "too few accepted: {accepted}");
    for (i, n) in rejected.iter().take(9).enumerate() {
        assert!(*n > 0, "rejection reason #{i} never produced");
    }
}

/// Writes every RoCE frame of the captures as a seed corpus file for the cargo-fuzz target (fuzz/): run with
/// `ROCE_FUZZ_CORPUS=fuzz/corpus/parse_frame cargo test -p roce-dp --no-default-features --test wire_fuzz -- --ignored`.
#[test]
#[ignore = "a tool, not a check: exports the cargo-fuzz seed corpus"]
fn export_seed_corpus() {
    let dir = std::env::var("ROCE_FUZZ_CORPUS").expect("set ROCE_FUZZ_CORPUS to the corpus directory");
    std::fs::create_dir_all(&dir).unwrap();
    for (i, (name, f)) in common::all_roce_frames().iter().enumerate() {
        let path = std::path::Path::new(&dir).join(format!("{}-{i:04}.bin", name.trim_end_matches(".pcap")));
        std::fs::write(path, f).unwrap();
    }
}
