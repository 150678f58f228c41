//! Structure-aware fuzzing of the engine: two engines, two RC QP pairs between them, and a wire the fuzzer owns
//! (machinery in fuzz_core/engine.rs, shared with the cargo-fuzz target fuzz/fuzz_targets/engine_ops.rs). Every
//! step it does one of: deliver the next frame honestly; deliver it mutated (opcode, PSN near the window edges and
//! across the wrap, AckReq, destination QP, RETH va/len/rkey near region bounds and wrapping 64 bits, AETH syndrome
//! and MSN, atomic ACK values, AtomicETH address, payload cut, grown past the MTU, emptied or at its largest, ECN
//! CE, a wrong pad count with a valid ICRC, or one flipped byte); drop, duplicate or reorder frames; inject a frame
//! made up from nothing (any opcode, CNPs, UC and UD ones too) to a QP; post send WRs (every opcode, SGEs at and
//! across region bounds, other PDs' and stale keys, inline, unsignaled, fenced) and receive WRs; move time (to the
//! next deadline, a little, or far); modify a QP (every target state, MTU, PSNs, timeouts, retry counts, rights);
//! take a pair through RESET and up again, or destroy and re-create it (frames of the old connection still on the
//! wire); deregister and re-register a data region; try to destroy a CQ in use; poll the CQs. Each run picks its
//! hostility (how often a value is bad rather than valid: 1 % to 60 %), its path MTU, DCQCN or line rate, IPv4
//! or IPv6 per pair, and sometimes CQs of a few entries.
//!
//! A quarter of the runs are clean: the wire only drops, duplicates and reorders, the WRs are valid (SEND and WRITE
//! from a static source area, READ of the peer's, FetchAdd on a counter of the peer's), and their data is checked:
//! every receive holds the bytes of its SEND (and its length), every completed WRITE's bytes are at the peer (and
//! still are at the end: no late duplicate re-executed an older one), every READ's bytes are the peer's, every
//! FetchAdd returned the counter's value after exactly the FetchAdds before it, and the counter ends at their sum.
//! A third of the clean runs also re-register a node's data region (same bytes, new keys) under traffic: a WR in
//! flight with the old keys must fail, never complete with bytes other than its own (it did: hostile_regressions.rs
//! `region_deregistered_under_a_write_in_flight_is_an_error_not_zeros`).
//!
//! Invariants, checked as it runs and in a final phase where the wire is honest and time runs on:
//! - nothing panics (debug build, and the long runs in release with overflow checks: integer overflow included);
//! - every send WR that `post_send` took completes at most once, in posting order; a signaled one exactly once
//!   unless its QP was reset or destroyed (or its CQ overflowed); receive WRs complete in order, at most once, and
//!   all are flushed once the QP is in ERR;
//! - an error completion (or a flush) is seen only while the QP is in ERR, and no success follows an error on the
//!   same queue (until a reset);
//! - with retry_cnt and rnr_retry below 7 and a finite ACK timeout, every QP in RTS ends with its send queue empty
//!   within a bounded virtual time; after `handle_timeout(now)` the next deadline is never at or before `now`;
//! - guard regions (no rights) and a region of another PD (every right) never change, a read-only region (remote
//!   read only) never changes, and no frame the engine sends carries guard or foreign bytes; every frame it sends
//!   parses with a good ICRC and the right addresses; a CQ in use cannot be destroyed;
//! - per QP, without CQ overflow, the completion counters equal the completions polled.
//!
//! Seeded: `ROCE_HOSTILE_SEED`, `ROCE_HOSTILE_ITERS` (runs, default 150), `ROCE_FUZZ_STEPS` (steps per run,
//! default 2000), `ROCE_HOSTILE_SOAK=1` (100x the runs), `ROCE_FUZZ_CLEAN=1` (every run clean),
//! `ROCE_FUZZ_VERBOSE=1` (a line of counters per run), `ROCE_FUZZ_TRACE=1` (every frame delivered, every
//! completion). A failure prints its seed and the last actions.

mod fuzz_core;
mod seeded;

use seeded::Seeds;

#[test]
fn engine_fuzz_seeded() {
    let seeds = Seeds::from_env(0x5eed_f022, 150);
    let steps = std::env::var("ROCE_FUZZ_STEPS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
    let verbose = std::env::var_os("ROCE_FUZZ_VERBOSE").is_some();
    let failures = seeds.run("engine_fuzz", 10, |s| {
        if verbose {
            eprintln!("seed {s}");
        }
        fuzz_core::engine::run(fuzz_core::engine::Src::seeded(s), steps)
    });
    seeded::assert_none(&failures);
}
