#!/usr/bin/env bash
# The README's main-job command. Until the RoCE engine lands it runs the memif pair of test tier 3 as a throughput
# run: a server on lcore 1 and a client on lcore 0 (copy mode, no hugepages) send numbered frames both ways at
# once for a few seconds per frame size, verify every byte, and this prints frames/s in each direction.
#
#   scripts/run.sh                         64, 1024 and 4096 B frames, 3 s each
#   scripts/run.sh --seconds 10 --sizes 1024
#
# Runs scripts/setup.sh and the release build first (both do nothing when all is in place). Needs root.
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

seconds=3
sizes=(64 1024 4096)
while [[ $# -gt 0 ]]; do
    case "$1" in
        --seconds) seconds="${2:?}"; shift 2 ;;
        --sizes) IFS=', ' read -r -a sizes <<<"${2:?}"; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) echo "run.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ $(id -u) -ne 0 ]]; then
    echo "run.sh: run as root (DPDK needs /var/run/dpdk)" >&2
    exit 2
fi
LOG_DIR="$ROOT/target/run-logs/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$LOG_DIR"

bash scripts/setup.sh || exit 2
# shellcheck disable=SC1091
[[ -f "$HOME/.cargo/env" ]] && source "$HOME/.cargo/env"
if ! cargo build --locked --release -p roce-dp-tools --bins >"$LOG_DIR/build.log" 2>&1; then
    echo "run.sh: build failed:"
    grep -E '^error' -A 5 "$LOG_DIR/build.log" | head -n 30
    exit 2
fi

# rate LOG: "frames/s" of the rx direction in rdp-porttest's RESULT line.
rate() { grep -m1 '^RESULT' "$1" | grep -Eo 'rx [0-9]+ frames, [0-9]+ frames/s' | grep -Eo '[0-9]+ frames/s' | cut -d' ' -f1; }
fmt() { awk -v f="$1" -v s="$2" 'BEGIN { printf "%6.2f Mframes/s %7.2f Gbit/s", f / 1e6, f * s * 8 / 1e9 }'; }

echo "roce-dp run: memif pair, copy mode, server on lcore 1, client on lcore 0, ${seconds} s per size, every byte verified"
printf '%10s   %-33s   %s\n' "frame" "client -> server" "server -> client"
status=0
for size in "${sizes[@]}"; do
    sock="/run/rdp-${RUN_ID}-run.sock" ps="${RUN_ID}s${size}" pc="${RUN_ID}c${size}"
    slog="$LOG_DIR/server-$size.log" clog="$LOG_DIR/client-$size.log" src=0 crc=0
    track_prefix "$ps"
    track_prefix "$pc"
    common=(--socket "$sock" --sizes "$size" --seconds "$seconds" --window 512 --timeout $((seconds + 30)))
    "$PORTTEST" memif --role server --lcore 1 --file-prefix "$ps" "${common[@]}" >"$slog" 2>&1 &
    spid=$!
    track_pid "$spid"
    "$PORTTEST" memif --role client --lcore 0 --file-prefix "$pc" "${common[@]}" >"$clog" 2>&1 || crc=$?
    wait_pid "$spid" 30 || src=$?
    if [[ $src -ne 0 || $crc -ne 0 ]]; then
        printf '%8s B   FAILED (server exit %s, client exit %s)\n' "$size" "$src" "$crc"
        cat "$slog" "$clog" | grep -E '^(CHECK FAIL|rdp-porttest:)' | sed 's/^/    /'
        status=1
    else
        printf '%8s B   %-33s   %s\n' "$size" "$(fmt "$(rate "$slog")" "$size")" "$(fmt "$(rate "$clog")" "$size")"
    fi
    cleanup_all
done
echo "logs: $LOG_DIR"
exit $status
