#!/usr/bin/env bash
# Benchmark (not a test): WRITE bandwidth through roce-dpd against the engine embedded in the tool, over the same
# memif pair, in ONE invocation, the two modes alternated (issue 7's target: ratio >= 0.9):
#   tool    rdp_write_bw server --port-conf conf/memif-server.toml (its engine busy-polls lcore 1) and client
#           --port-conf conf/memif-client.toml (lcore 0);
#   daemon  two roce-dpd on the memif pair (conf/daemon-memif-server.toml, worker on lcore 1;
#           conf/daemon-memif-client.toml, worker on lcore 0) and rdp_write_bw --daemon on each side.
# Both modes: the same perftest flags (-q 2 -m 4096, 4 KiB and 64 KiB), copy-mode memif, no hugepages. Two cores,
# never two busy-pollers on one: with the daemons, their two workers own the cores, so the tools must not spin. The
# server tool only waits for the client's report (it sleeps), and the client tool runs with --poll-sleep (a pass over
# its CQ rings that found nothing and could post nothing is followed by a sleep; -t 128 WRs in flight cover many
# times the sleep) pinned to lcore 0 (--tool-cpu N), the sending daemon's core: the application sits on the core
# of the engine it feeds in both modes (the embedded client tool is its engine, on lcore 0). Its work and wake-ups
# are taken from that worker, so the figure counts the application's share of a core against the daemon (a
# deployment with a core for the application would not pay it). Its CPU time is printed. (Until session 7 the
# default was lcore 1, the receiving daemon's core: there the tool took ~3x the CPU, 0.9-1.06 s against 0.27-0.36 s
# per 4 KiB run, and the daemon path ran ~15% slower; figures in the README.) Post -> completion: the loopback bench
# (roce-dp-bench --bin daemon --only embedded|daemon: 64 B WRITE, one in flight, no DPDK; client and worker on the
# two cores), alternated the same way. Prints a markdown table of medians, each round's own ratio (the daemon run
# over the embedded run of the same round) and their median, and ends with:
#   bench-daemon: write_4k_vs_tool=R write_64k_vs_tool=R post_to_cqe_ns=N
#
#   scripts/bench-daemon.sh              3 rounds
#   scripts/bench-daemon.sh --rounds 5   (--events, the default since session 23: the client tool runs with -e,
#                                         sleeping on its completion channel when a pass moved nothing;
#                                         --poll-sleep US: instead, it sleeps US microseconds after such a pass (the
#                                         default until session 23, 20); --tool-cpu N: its core, default 0;
#                                         --bin DIR: run the binaries in DIR instead of building them, for A/B runs
#                                         of two builds: rdp_write_bw, roce-dpd and daemon; --tx-depth N:
#                                         perftest's -t for BOTH modes, default 128 as perftest's; the WRs a QP
#                                         keeps in flight, of which only N - 100 are left when a signaled completion
#                                         (every 100th WR, -Q 100) wakes the client tool; --event-moderation
#                                         N:US: with --events, the daemon-mode client tool's CQ events wait for N
#                                         completions or US microseconds, ibv_modify_cq's moderation)
# Why -e is the default: it is how an application that does not spin waits (perftest's -e), and the tool's naps
# took 4-15x its CPU from the sending worker's core; session 23 on the same machine and build: 4 KiB ratio 0.835
# with -e against 0.450 with --poll-sleep 20 (bench/RESULTS.md).
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

rounds=3
nap=20
tool_cpu=0
events=1
bin_dir=
tx_depth=128
moderation=
while [[ $# -gt 0 ]]; do
    case "$1" in
        --rounds) rounds="${2:?}"; shift 2 ;;
        --poll-sleep) nap="${2:?}"; events=0; shift 2 ;;
        --tool-cpu) tool_cpu="${2:?}"; shift 2 ;;
        --events) events=1; shift ;;
        --bin) bin_dir="${2:?}"; shift 2 ;;
        --tx-depth) tx_depth="${2:?}"; shift 2 ;;
        --event-moderation) moderation="${2:?}"; shift 2 ;;
        -h|--help) sed -n '2,37p' "$0"; exit 0 ;;
        *) echo "bench-daemon.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -n $moderation ]] && ! ((events)); then
    echo "bench-daemon.sh: --event-moderation N:US is for the -e mode (--events), not --poll-sleep" >&2
    exit 2
fi
if [[ $(id -u) -ne 0 ]]; then
    echo "bench-daemon.sh: run as root (DPDK needs /var/run/dpdk)" >&2
    exit 2
fi
LOG_DIR="$ROOT/target/bench-logs/daemon-$(date -u +%Y%m%d-%H%M%S)"
mkdir -p "$LOG_DIR"
bash scripts/setup.sh >/dev/null || exit 2
# shellcheck disable=SC1091
[[ -f "$HOME/.cargo/env" ]] && source "$HOME/.cargo/env"
BIN="$ROOT/target/release"
if [[ -n $bin_dir ]]; then
    BIN=$(cd "$bin_dir" && pwd) || exit 2
    for b in rdp_write_bw roce-dpd daemon; do
        [[ -x $BIN/$b ]] || { echo "bench-daemon.sh: --bin $bin_dir has no executable $b" >&2; exit 2; }
    done
else
    cargo build --locked --release -p roce-dp-tools --bins -p roce-dp-bench --bin daemon >"$LOG_DIR/build.log" 2>&1 ||
        { echo "bench-daemon.sh: build failed (see $LOG_DIR/build.log)"; exit 2; }
fi
WAIT_FLAGS=(--poll-sleep "$nap") WAIT_DESC="--poll-sleep $nap" WAIT_ARG="--poll-sleep $nap"
((events)) && WAIT_FLAGS=(-e) WAIT_DESC="-e (sleeping on completion events)" WAIT_ARG="--events"
if [[ -n $moderation ]]; then
    WAIT_FLAGS+=(--event-moderation "$moderation") WAIT_DESC+=" --event-moderation $moderation"
    WAIT_ARG+=" --event-moderation $moderation"
fi
load0=$(cut -d' ' -f1-3 /proc/loadavg)

SIZES=(4096 65536)
declare -A ITERS=([4096]=1000000 [65536]=60000)
FLAGS=(-q 2 -m 4096 -t "$tx_depth")
n=0
# bw_of LOG SIZE: perftest's BW average (MiB/s) from the client's result row.
bw_of() { awk -v s="$2" '$1 == s && NF >= 5 { print $4 }' "$1" | tail -n 1; }

# tool_run SIZE: both tools with the engine embedded; OUT = the client's BW average.
tool_run() {
    local size="$1" sp sc port=$((18000 + ($$ % 1000) * 4 + n % 4)) rs
    n=$((n + 1))
    local sock="/run/rdp-${RUN_ID}-bd$n.sock" slog="$LOG_DIR/tool-$size-$n-server.log" clog="$LOG_DIR/tool-$size-$n-client.log"
    track_prefix "${RUN_ID}bd${n}s"
    track_prefix "${RUN_ID}bd${n}c"
    "$BIN/rdp_write_bw" --port-conf conf/memif-server.toml --socket "$sock" --file-prefix "${RUN_ID}bd${n}s" \
        -p "$port" -s "$size" -n "${ITERS[$size]}" "${FLAGS[@]}" >"$slog" 2>&1 &
    sp=$!
    track_pid "$sp"
    sleep 0.5
    timeout 120 "$BIN/rdp_write_bw" --port-conf conf/memif-client.toml --socket "$sock" \
        --file-prefix "${RUN_ID}bd${n}c" -p "$port" -s "$size" -n "${ITERS[$size]}" "${FLAGS[@]}" 127.0.0.1 \
        >"$clog" 2>&1 || echo "bench-daemon.sh: tool run $n failed (logs $clog)" >&2
    rs=0
    wait_pid "$sp" 30 >/dev/null 2>&1 || rs=$?
    [[ $rs -eq 0 ]] || echo "bench-daemon.sh: tool server $n exit $rs (logs $slog)" >&2
    OUT=$(bw_of "$clog" "$size")
    cleanup_all
}

# daemons_start: the two roce-dpd on a memif pair of this run; DSOCK / CSOCK their sockets.
daemons_start() {
    n=$((n + 1))
    DN=$n
    local memif="/run/roce-dpd-${RUN_ID}-m$n.sock" side i
    DSOCK="/run/roce-dpd-${RUN_ID}-s$n.sock" CSOCK="/run/roce-dpd-${RUN_ID}-c$n.sock"
    for side in server client; do
        sed "s#^socket = \"/run/roce-dpd-memif.sock\"#socket = \"$memif\"#" "conf/daemon-memif-$side.toml" \
            >"$LOG_DIR/daemon-$side-$n.toml"
    done
    track_prefix "${RUN_ID}dd${n}s"
    track_prefix "${RUN_ID}dd${n}c"
    track_path "$DSOCK"
    track_path "$CSOCK"
    "$BIN/roce-dpd" --config "$LOG_DIR/daemon-server-$n.toml" --socket "$DSOCK" --file-prefix "${RUN_ID}dd${n}s" \
        >"$LOG_DIR/daemon-server-$n.log" 2>&1 &
    DS_PID=$!
    track_pid "$DS_PID"
    for i in $(seq 100); do grep -q '^roce-dpd: serving' "$LOG_DIR/daemon-server-$n.log" && break; sleep 0.1; done
    "$BIN/roce-dpd" --config "$LOG_DIR/daemon-client-$n.toml" --socket "$CSOCK" --file-prefix "${RUN_ID}dd${n}c" \
        >"$LOG_DIR/daemon-client-$n.log" 2>&1 &
    DC_PID=$!
    track_pid "$DC_PID"
    for i in $(seq 100); do grep -q '^roce-dpd: serving' "$LOG_DIR/daemon-client-$n.log" && break; sleep 0.1; done
    grep -q '^roce-dpd: serving' "$LOG_DIR/daemon-client-$n.log" || {
        echo "bench-daemon.sh: the daemons did not start (logs $LOG_DIR/daemon-*-$n.log)" >&2
        return 1
    }
}

# daemons_stop: the client side first; the server side once its memif link went down (DPDK-NOTES: memif teardown).
daemons_stop() {
    local r1=0 r2=0
    kill -TERM "$DC_PID"
    wait_pid "$DC_PID" 15 >/dev/null 2>&1 || r1=$?
    sleep 1.5
    kill -TERM "$DS_PID"
    wait_pid "$DS_PID" 15 >/dev/null 2>&1 || r2=$?
    [[ $r1 -eq 0 && $r2 -eq 0 ]] || echo "bench-daemon.sh: roce-dpd exits $r1 (client side) $r2 (server side)" >&2
    # The sending daemon's completion events (both sizes' runs), from its last line.
    EVENTS+="$(grep -o 'events_signalled=[0-9]*' "$LOG_DIR/daemon-client-$DN.log" | head -n 1 | cut -d= -f2) "
    cleanup_all
}

# daemon_run SIZE: both tools through the daemons; OUT = the client's BW average, its CPU seconds, the run's seconds.
daemon_run() {
    local size="$1" sp rs port=$((18000 + ($$ % 1000) * 4 + n % 4)) cpu
    n=$((n + 1))
    local slog="$LOG_DIR/daemon-$size-$n-server.log" clog="$LOG_DIR/daemon-$size-$n-client.log"
    taskset -c 1 "$BIN/rdp_write_bw" --daemon "$DSOCK" -p "$port" -s "$size" -n "${ITERS[$size]}" "${FLAGS[@]}" \
        >"$slog" 2>&1 &
    sp=$!
    track_pid "$sp"
    sleep 0.3
    # times: the subshell's children's user and system time (the client tool's).
    cpu=$( (timeout 120 taskset -c "$tool_cpu" "$BIN/rdp_write_bw" --daemon "$CSOCK" "${WAIT_FLAGS[@]}" -p "$port" \
        -s "$size" -n "${ITERS[$size]}" "${FLAGS[@]}" 127.0.0.1 >"$clog" 2>&1 ||
        echo "bench-daemon.sh: daemon run $n failed (logs $clog)" >&2
        times) | tail -n 1 | awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); printf "%.2f", u[1] * 60 + u[2] + s[1] * 60 + s[2] }')
    rs=0
    wait_pid "$sp" 30 >/dev/null 2>&1 || rs=$?
    [[ $rs -eq 0 ]] || echo "bench-daemon.sh: daemon-mode server $n exit $rs (logs $slog)" >&2
    OUT="$(bw_of "$clog" "$size") $cpu $(awk -v s="$size" '$1 == s { print $2 / $4 * s / 1048576 }' "$clog" | tail -n 1)"
}

median() { sort -g | awk '{a[NR]=$1} END {if (NR == 0) print "nan"; else if (NR % 2) print a[(NR+1)/2]; else print (a[NR/2]+a[NR/2+1])/2}'; }
declare -A R
EVENTS=
for r in $(seq "$rounds"); do
    # Alternate which mode goes first, so a drift in the machine's load hits both alike.
    for mode in $( ((r % 2)) && echo tool daemon || echo daemon tool); do
        if [[ $mode == tool ]]; then
            for s in "${SIZES[@]}"; do
                tool_run "$s"
                R[tool$s]+="${OUT:-fail} "
            done
        elif daemons_start; then
            for s in "${SIZES[@]}"; do
                daemon_run "$s"
                read -r bw cpu secs <<<"$OUT"
                R[daemon$s]+="${bw:-fail} "
                R[cpu$s]+="${cpu:-?}/${secs:-?} "
            done
            daemons_stop
        else
            daemons_stop
        fi
    done
    # Post -> completion through the rings (loopback engine, no DPDK), embedded and through the daemon's path.
    for p in embedded daemon; do
        R[lat$p]+="$("$BIN/daemon" --only "$p" | awk '{ print $1 }') "
    done
    echo "round $r/$rounds done" >&2
done
med() { tr ' ' '\n' <<<"${R[$1]}" | grep -E '^[0-9.]+$' | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "nan" || b == "nan" || b == 0) print "nan"; else printf "%.3f", a / b }'; }
load1=$(cut -d' ' -f1-3 /proc/loadavg)
echo
echo "rdp_write_bw ${FLAGS[*]} over a copy-mode memif pair, engine in the tool vs through two roce-dpd (client tool"
echo "$WAIT_DESC on lcore $tool_cpu with a daemon's worker); medians of $rounds alternated rounds; $(nproc) CPUs,"
echo "loadavg $load0 at the start, $load1 at the end"
echo
echo "| case | engine embedded in rdp_write_bw | through roce-dpd (rdp_write_bw --daemon) | ratio |"
echo "|---|---|---|---|"
for s in "${SIZES[@]}"; do
    echo "| WRITE $((s / 1024)) KiB x ${ITERS[$s]}, BW average | $(med "tool$s") MiB/s | $(med "daemon$s") MiB/s | $(ratio "$(med "daemon$s")" "$(med "tool$s")") |"
done
latE=$(med latembedded) latD=$(med latdaemon)
echo "| post -> completion, 64 B WRITE, one in flight (loopback engine) | $latE ns | $latD ns | $(ratio "$latE" "$latD") |"
echo
echo "tool runs: ${R[tool4096]}| ${R[tool65536]}; daemon runs: ${R[daemon4096]}| ${R[daemon65536]}"
# paired SIZE: each round's daemon run over the same round's tool run (the two modes ran seconds apart, so a host
# phase longer than a round hits both: the spread of these ratios shows what the medians' ratio hides).
paired() {
    awk -v d="${R[daemon$1]}" -v t="${R[tool$1]}" 'BEGIN {
        n = split(d, a, " "); split(t, b, " "); m = 0
        for (i = 1; i <= n; i++) if (a[i] ~ /^[0-9.]+$/ && b[i] ~ /^[0-9.]+$/ && b[i] > 0) { r[++m] = a[i] / b[i]; out = out sprintf("%.3f ", r[m]) }
        for (i = 1; i <= m; i++) for (j = i + 1; j <= m; j++) if (r[j] < r[i]) { x = r[i]; r[i] = r[j]; r[j] = x }
        med = m == 0 ? "nan" : (m % 2 ? sprintf("%.3f", r[(m + 1) / 2]) : sprintf("%.3f", (r[m / 2] + r[m / 2 + 1]) / 2))
        printf "%s(median %s)", out, med }'
}
echo "per-round ratios (daemon / tool, same round): 4 KiB $(paired 4096); 64 KiB $(paired 65536)"
echo "client tool CPU s / run s with the daemons: ${R[cpu4096]}| ${R[cpu65536]}; logs: $LOG_DIR"
echo "completion events the sending roce-dpd signalled per round (4 KiB + 64 KiB runs): ${EVENTS:-?}"
echo "reproduce: flock /tmp/roce-dp-busy.lock scripts/bench-daemon.sh --rounds $rounds $WAIT_ARG --tool-cpu $tool_cpu --tx-depth $tx_depth${bin_dir:+ --bin $bin_dir}"
echo "bench-daemon: write_4k_vs_tool=$(ratio "$(med daemon4096)" "$(med tool4096)") write_64k_vs_tool=$(ratio "$(med daemon65536)" "$(med tool65536)") post_to_cqe_ns=$latD"
