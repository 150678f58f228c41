#!/usr/bin/env bash
# The README's test command (and what .ci/run calls): set up, build, then run every test tier in order.
#
#   scripts/test.sh            all tiers
#   scripts/test.sh 1 3        only tiers 1 and 3 (setup and build always run)
#   VERBOSE=1 scripts/test.sh  also list every passing check
#
# Prints one summary line per tier and, last, exactly "N passed, N failed" (individual checks: cargo's tests from
# its "test result:" lines plus each DPDK tier's checks). Exits 1 if any check failed. Needs root (package
# install, /var/run/dpdk, network namespaces); tiers 2-4 use EAL without hugepages (--no-huge). Tiers never run in
# parallel and never put two busy-polling processes on one core. Logs go to target/test-logs/<time>/.
#
# Tiers live in scripts/tiers/NN-name.sh: each appends a function name to TIERS and defines it with
# tier_begin/check/tier_end from scripts/lib.sh. A later issue adds a tier by adding a file.
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

selected=("$@")
# Tier numbers only, checked before setup and build (a typo or --help used to run setup and the build, then no tier).
ntiers=$(find "$ROOT/scripts/tiers" -maxdepth 1 -name '[0-9]*.sh' | wc -l)
for a in "${selected[@]}"; do
    case $a in
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
    esac
    if ! [[ $a =~ ^[1-9][0-9]*$ ]] || ((a < 1 || a > ntiers)); then
        echo "test.sh: $a is not a tier number (1-$ntiers; see --help and the README's tier table)" >&2
        exit 2
    fi
done
LOG_DIR="$ROOT/target/test-logs/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$LOG_DIR"
T0=$SECONDS

finish() {
    echo "total time: $((SECONDS - T0)) s; logs: $LOG_DIR"
    echo "$PASSED passed, $FAILED failed"
    [[ $FAILED -eq 0 ]]
    exit $?
}

if [[ $(id -u) -ne 0 ]]; then
    echo "test.sh: run as root (installs packages, uses /var/run/dpdk and network namespaces)" >&2
    FAILED=1
    finish
fi

# --- setup --------------------------------------------------------------------------------------------------------
if bash "$ROOT/scripts/setup.sh" >"$LOG_DIR/setup.log" 2>&1; then
    sed 's/^/  /' "$LOG_DIR/setup.log" | tail -n 5
    # shellcheck disable=SC1091
    [[ -f "$HOME/.cargo/env" ]] && source "$HOME/.cargo/env"
else
    echo "setup: FAILED: $(tail -n 1 "$LOG_DIR/setup.log")"
    FAILED=1
    finish
fi

# --- build (once: release tools for tiers 2+; tier 1 builds its own test binaries) --------------------------------
t=$SECONDS
if cargo build --locked --release -p roce-dp-tools --bins >"$LOG_DIR/build.log" 2>&1; then
    echo "build: ok ($((SECONDS - t)) s, cargo build --release -p roce-dp-tools)"
    BUILD_OK=1
else
    echo "build: FAILED ($((SECONDS - t)) s):"
    grep -E '^(error|warning: unused)' -A 5 "$LOG_DIR/build.log" | head -n 30 | sed 's/^/  /'
    BUILD_OK=0
fi

# --- tiers --------------------------------------------------------------------------------------------------------
TIERS=()
for f in "$ROOT"/scripts/tiers/[0-9]*.sh; do
    # shellcheck disable=SC1090
    source "$f"
done
n=0
for tier in "${TIERS[@]}"; do
    n=$((n + 1))
    if [[ ${#selected[@]} -gt 0 && ! " ${selected[*]} " =~ \ $n\  ]]; then
        continue
    fi
    "$tier"
    cleanup_all
done
finish
