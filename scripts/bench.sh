#!/usr/bin/env bash
# Benchmark (not a test): raw DPDK memif frame moving vs roce-dp RDMA WRITE over the same memif pair, in ONE
# invocation, alternating the two: 4 KiB and 64 B messages (MTU 4096; the raw frames have the RoCE frames' size),
# plus a one-frame ping-pong RTT for both (raw: a frame echoed back; roce-dp: an 8-byte WRITE and its ACK, one in
# flight; both timed per round trip after 1000 left out; the last line has the median, as perftest's t_typical,
# the table the mean beside it). roce-dp runs use --no-verify (payloads are neither generated nor checked: raw mode
# does not touch them either; the data path still copies each payload into its mbuf and computes the ICRC on both
# sides). Server on lcore 1, client on lcore 0, no hugepages. Prints a markdown table of medians, each round's RTT
# gap (roce-dp's RTT run minus raw's, run back to back: the host's phases move both) and its median, and ends with:
#   bench: write_4k_vs_raw=R write_64_pps_vs_raw=R rtt_raw_us=X rtt_rdp_us=Y
#
#   scripts/bench.sh             3 rounds
#   scripts/bench.sh --rounds 5
#   scripts/bench.sh --nic PATH  run the rdp-nic binary at PATH instead of building this tree's (before/after
#                                comparisons in one window: e.g. a copy of main's target/release/rdp-nic)
#   scripts/bench.sh --zero-copy both modes' clients in memif zero-copy mode (conf/memif-client-zc.toml): their
#                                transmit hands the server descriptors instead of copying into the ring
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

rounds=3
nic=""
client_profile=conf/memif-client.toml
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) rounds="${2:?}"; shift 2 ;;
        --nic) nic="${2:?}"; shift 2 ;;
        --zero-copy) client_profile=conf/memif-client-zc.toml; shift ;;
        -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
        *) echo "bench.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ $(id -u) -ne 0 ]]; then
    echo "bench.sh: run as root (DPDK needs /var/run/dpdk)" >&2
    exit 2
fi
LOG_DIR="$ROOT/target/bench-logs/$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$LOG_DIR"
bash scripts/setup.sh >/dev/null || exit 2
# shellcheck disable=SC1091
[[ -f "$HOME/.cargo/env" ]] && source "$HOME/.cargo/env"
if [[ -n "$nic" ]]; then
    [[ -x "$nic" ]] || { echo "bench.sh: --nic $nic is not an executable file" >&2; exit 2; }
    NIC="$(realpath "$nic")"
else
    cargo build --locked --release -p roce-dp-tools --bins >"$LOG_DIR/build.log" 2>&1 || { echo "bench.sh: build failed"; exit 2; }
    NIC="$ROOT/target/release/rdp-nic"
fi

# Frame sizes of RoCE WRITE-with-immediate frames: Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + RETH 16 + ImmDt 4 +
# payload + ICRC 4.
HDR=78
# pair NAME N ARGS...: one server/client run (N numbers its socket, port and logs); prints the client's RESULT
# line (empty on failure). QPs use perftest's local ACK timeout (exponent 14: 67 ms, rdp-nic's default 12 is 16.8
# ms): on this shared VM a descheduled peer can stall longer than 16.8 ms seven times in a row at load ~9, and the
# spurious retransmissions (or a retry-exceeded end) would be measured as roce-dp's; with no loss no timer fires.
pair() {
    local name="$1" n="$2"
    shift 2
    local sock="/run/rdp-${RUN_ID}-b$n.sock" ps="${RUN_ID}b${n}s" pc="${RUN_ID}b${n}c" port=$((20000 + ($$ % 20000) + n))
    local slog="$LOG_DIR/$name-$n-server.log" clog="$LOG_DIR/$name-$n-client.log" spid
    track_prefix "$ps"
    track_prefix "$pc"
    "$NIC" server --profile conf/memif-server.toml --socket "$sock" --oob-port "$port" --file-prefix "$ps" \
        --timeout 120 --qp-timeout 14 "$@" >"$slog" 2>&1 &
    spid=$!
    track_pid "$spid"
    timeout 150 "$NIC" client --profile "$client_profile" --socket "$sock" --oob-port "$port" --file-prefix "$pc" \
        --timeout 120 --qp-timeout 14 "$@" >"$clog" 2>&1 || echo "bench.sh: $name run $n failed (logs $clog)" >&2
    wait_pid "$spid" 30 >/dev/null 2>&1
    # A run that did not complete (status=FAIL, e.g. `transport retry counter exceeded` when a descheduled peer
    # outlasted seven local ACK timeouts) measured the failure, not the data path: it is left out of the medians.
    if grep -q '^RESULT.*status=FAIL' "$clog"; then
        echo "bench.sh: $name run $n did not complete, left out (logs $clog)" >&2
    else
        grep -m1 '^RESULT' "$clog"
    fi
    cleanup_all
}
field() { grep -Eo "$1=[0-9.]+" | cut -d= -f2; }
median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }

declare -A R
for r in $(seq "$rounds"); do
    R[raw4k]+="$(pair raw4k "${r}1" --raw bw --size $((4096 + HDR)) --seconds 2 | field fps) "
    R[rdp4k]+="$(pair rdp4k "${r}2" --no-verify --op write --size 4096 --mtu 4096 --iters 150000 --qps 2 --depth 64 | field mpps) "
    R[raw64]+="$(pair raw64 "${r}3" --raw bw --size $((64 + HDR)) --seconds 2 | field fps) "
    R[rdp64]+="$(pair rdp64 "${r}4" --no-verify --op write --size 64 --mtu 4096 --iters 1000000 --qps 2 --depth 64 | field mpps) "
    raw=$(pair rawrtt "${r}5" --raw rtt --size $((8 + HDR)) --iters 20000)
    R[rawrtt]+="$(echo "$raw" | field median_us) "
    R[rawrttavg]+="$(echo "$raw" | field avg_us) "
    R[rawrttp10]+="$(echo "$raw" | field p10_us) "
    rdp=$(pair rdprtt "${r}6" --no-verify --op write --size 8 --mtu 4096 --iters 21000 --qps 1 --depth 1)
    R[rdprtt]+="$(echo "$rdp" | field rtt_median_us) "
    R[rdprttavg]+="$(echo "$rdp" | field rtt_avg_us) "
    R[rdprttp10]+="$(echo "$rdp" | field rtt_p10_us) "
    # The two RTT runs of a round follow each other within ~2 s, usually in the same phase of the host (which
    # moves both RTTs by 2-3x on this VM): their difference is the round's gap.
    a=$(echo "$raw" | field median_us) b=$(echo "$rdp" | field rtt_median_us)
    [[ -n "$a" && -n "$b" ]] && R[rttgap]+="$(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", b - a }') "
    echo "round $r/$rounds done" >&2
done
med() { tr ' ' '\n' <<<"${R[$1]}" | grep -E '^[0-9.]+$' | median; }
raw4k=$(med raw4k) rdp4k=$(med rdp4k) raw64=$(med raw64) rdp64=$(med rdp64) rawrtt=$(med rawrtt) rdprtt=$(med rdprtt)
rawrttavg=$(med rawrttavg) rdprttavg=$(med rdprttavg) rawrttp10=$(med rawrttp10) rdprttp10=$(med rdprttp10)
rttgap=$(tr ' ' '\n' <<<"${R[rttgap]:-}" | grep -E '^-?[0-9.]+$' | median)
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "nan"; else printf "%.3f", a * 1e6 / b }'; }
mib() { awk -v f="$1" -v s="$2" 'BEGIN { if (f == "nan") print "nan"; else printf "%.0f", f * s / 1048576 }'; }
echo
echo "memif $([[ $client_profile == *zc* ]] && echo "zero-copy (client)" || echo copy) mode, server lcore 1 / client lcore 0, MTU 4096, medians of $rounds alternating runs ($NIC)"
echo
echo "| case | raw memif | roce-dp WRITE | ratio |"
echo "|---|---|---|---|"
echo "| 4 KiB messages | $(awk -v f="$raw4k" 'BEGIN{printf "%.3f", f/1e6}') Mfps ($(mib "$raw4k" 4096) MiB/s of 4 KiB) | $rdp4k Mmsg/s ($(mib "$(awk -v m="$rdp4k" 'BEGIN{print m*1e6}')" 4096) MiB/s) | $(ratio "$rdp4k" "$raw4k") |"
echo "| 64 B messages | $(awk -v f="$raw64" 'BEGIN{printf "%.3f", f/1e6}') Mfps | $rdp64 Mmsg/s | $(ratio "$rdp64" "$raw64") |"
echo "| RTT, one in flight: median (mean) | $rawrtt us ($rawrttavg us) | $rdprtt us ($rdprttavg us) | |"
echo "| RTT, 10th percentile of each run | $rawrttp10 us | $rdprttp10 us | |"
echo
echo "RTT gap per round (roce-dp's median minus raw's, the two runs back to back): ${R[rttgap]:-none}; median $rttgap us (target <= 0.5)"
echo "raw runs: ${R[raw4k]}| ${R[raw64]}| ${R[rawrtt]}; roce-dp runs: ${R[rdp4k]}| ${R[rdp64]}| ${R[rdprtt]}; logs: $LOG_DIR"
echo "bench: write_4k_vs_raw=$(ratio "$rdp4k" "$raw4k") write_64_pps_vs_raw=$(ratio "$rdp64" "$raw64") rtt_raw_us=$rawrtt rtt_rdp_us=$rdprtt"
