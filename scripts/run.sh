#!/usr/bin/env bash
# The README's main-job command: rdp_write_bw (perftest's ib_write_bw flags and output) between two roce-dp soft-NIC
# processes over memif (server lcore 1, client lcore 0, copy mode, no hugepages). perftest's out-of-band exchange
# runs over TCP on 127.0.0.1; --data_validation makes the server check the written payload; prints perftest's table.
#
#   scripts/run.sh                                  -s 4096 -n 20000 -q 2 -m 4096 --data_validation
#   scripts/run.sh -s 65536 -n 5000 -q 4 -m 1024    (the arguments replace the defaults)
#
# Any rdp_write_bw option is passed to both sides (see target/release/rdp_write_bw --help); -p PORT (the TCP
# exchange's, default one from run.sh's PID) and --timeout S (default 120) replace run.sh's, and the port's options
# (--port-conf, --socket, --file-prefix, --lcore, --daemon) are refused: they are run.sh's, and so is a HOST (the
# client connects to 127.0.0.1). Runs scripts/setup.sh and the release build first (both do nothing when all is in
# place). Needs root. Exit status 0 only if both sides exit 0 (every WR completed OK; with --data_validation, the
# payload verified).
set -uo pipefail

# shellcheck source=scripts/lib.sh
source "$(dirname "$0")/lib.sh"
cd "$ROOT"

args=(-s 4096 -n 20000 -q 2 -m 4096 --data_validation)
# -h/--help anywhere before "--" (as rdp_write_bw's clap takes it) is run.sh's own help.
for a in "$@"; do
    case "$a" in
        -h | --help) sed -n '2,14p' "$0"; exit 0 ;;
        --) break ;;
    esac
done
[[ $# -gt 0 ]] && args=("$@")
# The options run.sh gives each side itself: -p and --timeout the user's replace run.sh's; the port's are run.sh's
# (each side's memif profile, socket and EAL prefix), and rdp_write_bw said "cannot be used multiple times" of a flag
# the user gave once.
# A word that is no option's value is a HOST: the client side's, which run.sh gives itself (127.0.0.1); passed on,
# the server ran as a client of it and the client was given two. rdp_write_bw's options without a value (the rest
# take one, or are refused by the tool itself):
flags=" -a --all -b --bidirectional -F --CPU-freq -N --noPeak --report_gbits --run_infinitely --out_json
 --data_validation -e --events --use_event -h --help -V --version "
port="" timeout=120 given=("${args[@]}") args=() value=0
host() {
    echo "run.sh: $1 looks like a HOST, which is run.sh's own (the client connects to 127.0.0.1; both sides run here, over memif); against another machine run rdp_write_bw by hand (README: perftest-compatible tools)" >&2
    exit 2
}
needs_value() {
    echo "run.sh: $1 needs a value (see target/release/rdp_write_bw --help)" >&2
    exit 2
}
for ((i = 0; i < ${#given[@]}; i++)); do
    a="${given[i]}"
    # After "--" every word is a HOST (clap's end of options).
    if [[ $a == -- ]]; then
        ((i + 1 < ${#given[@]})) && host "${given[i + 1]}"
        continue
    fi
    if [[ $a != -?* ]]; then
        ((value == 0)) && host "$a"
        value=0 args+=("$a")
        continue
    fi
    # The next word is this option's value unless the option takes none or carries it (-s4096, --size=4096, -ab).
    # In a cluster of short options (-bs 4096, as clap reads it) flags come first; the first option that takes a
    # value takes the rest of the word, or the next word when it ends the cluster.
    value=1
    if [[ $flags == *" $a "* || $a == --*=* ]]; then
        value=0
    elif [[ $a =~ ^-[^-]. ]]; then
        value=0
        for ((k = 1; k < ${#a}; k++)); do
            # -p with its value in the word (-p3000, -p=3000 as clap reads it) or ending a cluster of flags (-bp 3000,
            # -bp3000, -bp=3000): the port is run.sh's to give, the flags before it pass on.
            if [[ ${a:k:1} == p ]]; then
                ((k > 1)) && args+=("${a:0:k}")
                port="${a:k+1}" port="${port#=}"
                if [[ -z $port ]]; then
                    ((i + 1 == ${#given[@]})) && needs_value "$a"
                    port="${given[i + 1]}" i=$((i + 1))
                fi
                value=0
                continue 2
            fi
            if [[ $flags != *" -${a:k:1} "* ]]; then
                ((k + 1 == ${#a})) && value=1
                break
            fi
        done
    fi
    if [[ $a == -p || $a == --port || $a == --timeout ]] && ((i + 1 == ${#given[@]})); then
        needs_value "$a"
    fi
    case "$a" in
        -p | --port) port="${given[i + 1]:-}" i=$((i + 1)) value=0 ;;
        --timeout) timeout="${given[i + 1]:-}" i=$((i + 1)) value=0 ;;
        --port=*) port="${a#--port=}" ;;
        --timeout=*) timeout="${a#--timeout=}" ;;
        --port-conf | --port-conf=* | --daemon | --daemon=* | --socket | --socket=* | --file-prefix | --file-prefix=* \
            | --lcore | --lcore=*)
            echo "run.sh: ${a%%=*} is run.sh's own (each side: conf/memif-{server,client}.toml, its socket and EAL prefix); for another port run rdp_write_bw by hand (README: perftest-compatible tools)" >&2
            exit 2
            ;;
        *) args+=("$a") ;;
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
BW="$ROOT/target/release/rdp_write_bw"
sock="/run/rdp-${RUN_ID}-run.sock" ps="${RUN_ID}rs" pc="${RUN_ID}rc" port=${port:-$((20000 + ($$ % 20000)))}
slog="$LOG_DIR/server.log" clog="$LOG_DIR/client.log" src=0 crc=0
track_prefix "$ps"
track_prefix "$pc"
track_path "$sock"
echo "roce-dp run: rdp_write_bw over memif between two soft-NIC processes (server lcore 1, client lcore 0)"
"$BW" --port-conf conf/memif-server.toml --socket "$sock" --file-prefix "$ps" -p "$port" --timeout "$timeout" \
    "${args[@]}" >"$slog" 2>&1 &
spid=$!
track_pid "$spid"
"$BW" --port-conf conf/memif-client.toml --socket "$sock" --file-prefix "$pc" -p "$port" --timeout "$timeout" \
    "${args[@]}" 127.0.0.1 >"$clog" 2>&1 || crc=$?
wait_pid "$spid" 30 || src=$?
sed -n '/^ #bytes/,$p' "$clog"
grep -h '^rdp_write_bw:' "$clog" "$slog" | sed 's/^/  /'
if [[ $src -ne 0 || $crc -ne 0 ]]; then
    echo "run.sh: FAILED (server exit $src, client exit $crc); logs: ${LOG_DIR#"$ROOT"/}"
    exit 1
fi
echo "server:$(grep -h '^ Data validation' "$slog" || echo ' (no --data_validation)'); logs: ${LOG_DIR#"$ROOT"/}"
