#!/usr/bin/env bash
# The README's main-job command: a RoCE WRITE bandwidth run between two roce-dp soft-NIC processes over memif
# (rdp-nic server on lcore 1, client on lcore 0, copy mode, no hugepages). QPN/PSN/rkey/VA are exchanged over TCP
# on 127.0.0.1; every message is verified byte for byte at the responder; prints a perftest-like result line.
#
#   scripts/run.sh                                  4 KiB WRITEs, MTU 4096, 20000 per QP, 2 QPs
#   scripts/run.sh --size 65536 --iters 5000 --qps 4 --mtu 1024
#
# Any other rdp-nic option is passed to both sides (see target/release/rdp-nic --help). Runs scripts/setup.sh and
# the release build first (both do nothing when all is in place). Needs root. Exit status 0 only if every WR
# completed OK, every byte verified and no mbuf leaked.
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

args=(--op write --size 4096 --iters 20000 --qps 2 --depth 64 --mtu 4096)
while [[ $# -gt 0 ]]; do
    case "$1" in
        -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
        --*) args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
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
NIC="$ROOT/target/release/rdp-nic"
sock="/run/rdp-${RUN_ID}-run.sock" ps="${RUN_ID}rs" pc="${RUN_ID}rc" port=$((20000 + ($$ % 20000)))
slog="$LOG_DIR/server.log" clog="$LOG_DIR/client.log" src=0 crc=0
track_prefix "$ps"
track_prefix "$pc"
echo "roce-dp run: RDMA WRITE over memif between two soft-NIC processes (server lcore 1, client lcore 0), every byte verified"
"$NIC" server --profile conf/memif-server.toml --socket "$sock" --oob-port "$port" --file-prefix "$ps" --stats \
    --timeout 300 "${args[@]}" >"$slog" 2>&1 &
spid=$!
track_pid "$spid"
"$NIC" client --profile conf/memif-client.toml --socket "$sock" --oob-port "$port" --file-prefix "$pc" --stats \
    --timeout 300 "${args[@]}" >"$clog" 2>&1 || crc=$?
wait_pid "$spid" 30 || src=$?
grep -E '^ #bytes|^ [0-9]' "$clog"
grep -h '^CHECK FAIL\|^rdp-nic:' "$clog" "$slog" | sed 's/^/  /'
if [[ $src -ne 0 || $crc -ne 0 ]]; then
    echo "run.sh: FAILED (server exit $src, client exit $crc); logs: $LOG_DIR"
    exit 1
fi
echo "verified: $(grep -Eo 'verified_bytes=[0-9]+' "$slog" | cut -d= -f2) bytes at the responder; $(grep -c '^CHECK ok' "$clog" "$slog" | awk -F: '{s+=$2} END {print s}') checks ok; logs: $LOG_DIR"
