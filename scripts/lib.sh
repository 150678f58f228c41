# Shared helpers for scripts/test.sh, scripts/run.sh and the tier files in scripts/tiers/ (sourced, not run).
#
# * Check accounting: tier_begin NAME / pass DESC / fail DESC / tool_checks LOG / tier_end -> one summary line per
#   tier; totals in PASSED / FAILED.
# * Cleanup registry: track_pid, track_netns, track_prefix, track_path, track_hugepages. cleanup_all stops every
#   recorded process by its PID (TERM, then KILL), deletes the namespaces, removes the DPDK runtime directories and
#   hugepage files of the recorded --file-prefix values, and the recorded paths, and gives back the 2 MiB hugepages
#   a test reserved. An EXIT/INT/TERM trap runs it, so it also runs when
#   a test fails or the run is interrupted.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PORTTEST="${PORTTEST:-$ROOT/target/release/rdp-porttest}"
# A short id for names in this run (netns, veth, --file-prefix): unique per run, at most 8 characters.
RUN_ID="r$(printf '%05d' $(($$ % 100000)))"

PASSED=0
FAILED=0
TIER_NAME=""
TIER_PASS=0
TIER_FAIL=0
TIER_NOTE=""

# shellcheck disable=SC1091
[[ -f "$HOME/.cargo/env" ]] && source "$HOME/.cargo/env"

# --- Check accounting -------------------------------------------------------------------------------------------

tier_begin() {
    TIER_NAME="$1"
    TIER_PASS=0
    TIER_FAIL=0
    TIER_NOTE=""
    TIER_T0=$SECONDS
}

pass() {
    TIER_PASS=$((TIER_PASS + 1))
    PASSED=$((PASSED + 1))
    [[ -n "${VERBOSE:-}" ]] && echo "  ok   $1"
    return 0
}

fail() {
    TIER_FAIL=$((TIER_FAIL + 1))
    FAILED=$((FAILED + 1))
    echo "  FAIL $1"
}

# check DESC CMD...: pass if CMD succeeds.
check() {
    local desc="$1"
    shift
    if "$@"; then pass "$desc"; else fail "$desc"; fi
}

# Add N passes or failures at once (e.g. cargo's per-binary test counts).
add_counts() {
    TIER_PASS=$((TIER_PASS + $1))
    PASSED=$((PASSED + $1))
    TIER_FAIL=$((TIER_FAIL + $2))
    FAILED=$((FAILED + $2))
}

# tool_checks LOG: count rdp-porttest's "CHECK ok|FAIL" lines; print the failing ones. Fails if there are none.
tool_checks() {
    local ok bad
    ok=$(grep -c '^CHECK ok' "$1" || true)
    bad=$(grep -c '^CHECK FAIL' "$1" || true)
    add_counts "$ok" "$bad"
    grep '^CHECK FAIL' "$1" | sed 's/^/  /' || true
    if [[ $((ok + bad)) -eq 0 ]]; then
        fail "no CHECK lines in $(basename "$1"): $(tail -n 1 "$1" 2>/dev/null)"
    fi
}

tier_end() {
    local n=$((TIER_PASS + TIER_FAIL)) t=$((SECONDS - TIER_T0))
    if [[ $TIER_FAIL -eq 0 && $n -gt 0 ]]; then
        echo "$TIER_NAME: ok ($n checks, ${t} s)${TIER_NOTE:+ $TIER_NOTE}"
    else
        echo "$TIER_NAME: FAILED ($TIER_FAIL of $n checks failed, ${t} s; logs in $LOG_DIR)"
    fi
}

# --- Cleanup registry -------------------------------------------------------------------------------------------

CLEAN_PIDS=()
CLEAN_NETNS=()
CLEAN_PREFIXES=()
CLEAN_PATHS=()
CLEAN_HUGEPAGES=0

track_pid() { CLEAN_PIDS+=("$1"); }
track_netns() { CLEAN_NETNS+=("$1"); }
track_prefix() { CLEAN_PREFIXES+=("$1"); }
track_path() { CLEAN_PATHS+=("$1"); }
# track_hugepages N: N 2 MiB hugepages this run added to /proc/sys/vm/nr_hugepages; cleanup_all takes them off again.
track_hugepages() { CLEAN_HUGEPAGES=$((CLEAN_HUGEPAGES + $1)); }

# hugepages_give_back: takes the tracked hugepages off the pool (pages still in use become surplus pages the kernel
# frees when they are unmapped).
hugepages_give_back() {
    local nr
    [[ $CLEAN_HUGEPAGES -gt 0 ]] || return 0
    nr=$(cat /proc/sys/vm/nr_hugepages)
    echo $((nr > CLEAN_HUGEPAGES ? nr - CLEAN_HUGEPAGES : 0)) >/proc/sys/vm/nr_hugepages
    CLEAN_HUGEPAGES=0
}

# hugepages_available: 2 MiB hugepages free and not reserved by a mapping.
hugepages_available() {
    local d=/sys/kernel/mm/hugepages/hugepages-2048kB
    echo $(($(cat "$d/free_hugepages") - $(cat "$d/resv_hugepages")))
}

# Files DPDK may leave for a --file-prefix: its runtime directory and its hugepage files.
prefix_leftovers() {
    local p="$1"
    compgen -G "/var/run/dpdk/$p" || true
    compgen -G "/dev/hugepages/${p}*" || true
}

cleanup_all() {
    local pid i ns p
    for pid in "${CLEAN_PIDS[@]}"; do
        kill -0 "$pid" 2>/dev/null && kill -TERM "$pid" 2>/dev/null
    done
    for pid in "${CLEAN_PIDS[@]}"; do
        for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    for ns in "${CLEAN_NETNS[@]}"; do
        ip netns pids "$ns" 2>/dev/null | while read -r pid; do kill -KILL "$pid" 2>/dev/null; done
        ip netns delete "$ns" 2>/dev/null
    done
    for p in "${CLEAN_PREFIXES[@]}"; do
        rm -rf "/var/run/dpdk/$p"
        rm -f /dev/hugepages/"${p}"map_* 2>/dev/null
    done
    for p in "${CLEAN_PATHS[@]}"; do
        rm -rf "$p"
    done
    hugepages_give_back
    CLEAN_PIDS=()
    CLEAN_NETNS=()
    CLEAN_PREFIXES=()
    CLEAN_PATHS=()
    return 0
}

trap 'cleanup_all' EXIT
trap 'cleanup_all; exit 130' INT
trap 'cleanup_all; exit 143' TERM

# --- Helpers for DPDK tiers -------------------------------------------------------------------------------------

# wait_pid PID SECONDS: wait for a background process; its exit status, or 124 (and it is killed) on timeout.
wait_pid() {
    local pid="$1" limit=$(($2 * 10)) i=0
    while kill -0 "$pid" 2>/dev/null; do
        if [[ $i -ge $limit ]]; then
            kill -KILL "$pid" 2>/dev/null
            wait "$pid" 2>/dev/null
            return 124
        fi
        sleep 0.1
        i=$((i + 1))
    done
    wait "$pid"
}

# expect_setup_error DESC PREFIX PATTERN -- CMD...: CMD must exit 2 with exactly one stderr line that starts with
# "rdp-porttest: " and matches PATTERN, and leave nothing behind for PREFIX. Three checks.
expect_setup_error() {
    local desc="$1" prefix="$2" pattern="$3"
    shift 4
    local err="$LOG_DIR/$prefix.err" rc=0
    track_prefix "$prefix"
    timeout 60 "$@" >"$LOG_DIR/$prefix.out" 2>"$err" || rc=$?
    check "$desc: exit status 2 (got $rc)" test "$rc" -eq 2
    if [[ $(wc -l <"$err") -eq 1 ]] && grep -Eq "^rdp-porttest: .*$pattern" "$err"; then
        pass "$desc: one line naming the step"
        [[ -n "${VERBOSE:-}" ]] && sed 's/^/       /' "$err"
    else
        fail "$desc: want one line matching '$pattern', got: $(head -c 600 "$err")"
    fi
    local left
    left=$(prefix_leftovers "$prefix")
    check "$desc: nothing left behind${left:+ (found: $left)}" test -z "$left"
}

# socket_listening NAME: a unix socket (abstract, as DPDK's memif uses by default, or a file) is listening.
socket_listening() {
    grep -Eq "[ @]$1\$" /proc/net/unix
}
