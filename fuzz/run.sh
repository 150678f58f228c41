#!/usr/bin/env bash
# Builds the libFuzzer targets of this directory with the flags `cargo fuzz build` uses (sanitizer coverage,
# AddressSanitizer, debug assertions and overflow checks), so the cargo-fuzz binary is not needed, only the nightly
# toolchain and a C++ compiler (libfuzzer-sys builds libFuzzer), then runs one target.
#
#   fuzz/run.sh TARGET [SECONDS] [libFuzzer options...]     e.g. fuzz/run.sh engine_ops 600 -max_len=65536
#
# Corpus in fuzz/corpus/TARGET, crashes in fuzz/artifacts/TARGET (both ignored by git). Replay a crash:
#   fuzz/target/x86_64-unknown-linux-gnu/release/TARGET fuzz/artifacts/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")"
target=${1:?usage: fuzz/run.sh TARGET [SECONDS] [libFuzzer options...]}
secs=${2:-60}
shift $(($# < 2 ? $# : 2))
triple=x86_64-unknown-linux-gnu
RUSTFLAGS="-Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 \
-Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table \
-Cllvm-args=-sanitizer-coverage-trace-compares --cfg fuzzing -Zsanitizer=address -Cdebug-assertions \
-Coverflow-checks" cargo +nightly build --release --target "$triple" --bin "$target"
mkdir -p "corpus/$target" "artifacts/$target"
exec "target/$triple/release/$target" "corpus/$target" -max_total_time="$secs" \
    -artifact_prefix="artifacts/$target/" -print_final_stats=1 "$@"
