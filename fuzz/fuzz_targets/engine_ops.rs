//! The engine fuzzer of roce-dp/tests/engine_fuzz.rs with libFuzzer's input as its choices (8 bytes a choice):
//! two engines, two RC QP pairs, a hostile wire, WR posting, time, modify/destroy/re-register; the invariants of
//! that test (no panic, completions at most once and in order, errors only in ERR, bounded settling, guard regions
//! untouched and never sent). The machinery is the test's file, included by path.

#![no_main]

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../../roce-dp/tests/fuzz_core/engine.rs"]
mod engine;

fuzz_target!(|data: &[u8]| {
    if let Err(e) = engine::run(engine::Src::bytes(data), 4000) {
        panic!("{e}");
    }
});
