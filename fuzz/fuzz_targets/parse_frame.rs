//! parse_frame on arbitrary bytes must not panic, and whatever it accepts must re-emit and parse back to the
//! same headers and payload. Under `cfg(fuzzing)` the IPv4 header checksum is not checked, so inputs reach UDP
//! and the transport headers. Seed corpus: see ../README.md.

#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_dp::wire::{emit_frame, parse_frame};

fuzz_target!(|data: &[u8]| {
    let Ok(f) = parse_frame(data) else { return };
    let mut out = vec![0u8; data.len() + 64];
    let n = emit_frame(&mut out, &f.repr, f.payload.len(), |b| b.copy_from_slice(f.payload)).expect("re-emit");
    let g = parse_frame(&out[..n]).expect("re-parse");
    assert!(g.icrc_ok);
    assert_eq!(g.payload, f.payload);
    let mut expect = f.repr;
    expect.bth.pad = (f.payload.len().wrapping_neg() & 3) as u8;
    assert_eq!(g.repr, expect);
});
