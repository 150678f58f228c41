# Tier 8: the eight perftest-compatible tools (rdp_{write,read,send,atomic}_{bw,lat}) between two roce-dp soft NICs over
# memif (server lcore 1, client lcore 0, distinct --file-prefix, no hugepages): sizes 64 and 4096 with
# --data_validation, exit codes, perftest's BW and latency tables parsed by column position, --out_json_file; bad input: an
# unknown flag, connection refused, a forced MTU the peer does not have, a client killed mid-run.
TIERS+=(tier8_perftest_memif)

PF_N=0

# pf_pair NAME TOOL ARGS...: one server/client run of TOOL with ARGS on both sides (plus PF_SEXTRA / PF_CEXTRA);
# sets PF_SLOG, PF_CLOG, PF_SRC, PF_CRC. Socket, TCP port and prefixes unique per run.
PF_SEXTRA=()
PF_CEXTRA=()
pf_pair() {
    local name="$1" tool="$2"
    shift 2
    PF_N=$((PF_N + 1))
    local n=$PF_N
    local sock="/run/rdp-${RUN_ID}-p$n.sock" ps="${RUN_ID}p${n}s" pc="${RUN_ID}p${n}c" port=$((20000 + ($$ % 10000) + n))
    PF_SLOG="$LOG_DIR/tier8-$name-server.log" PF_CLOG="$LOG_DIR/tier8-$name-client.log" PF_SRC=0 PF_CRC=0
    track_prefix "$ps"
    track_prefix "$pc"
    track_path "$sock"
    "$ROOT/target/release/$tool" --port-conf "$ROOT/conf/memif-server.toml" --socket "$sock" --file-prefix "$ps" \
        -p "$port" --timeout 20 "$@" "${PF_SEXTRA[@]}" >"$PF_SLOG" 2>&1 &
    local spid=$!
    track_pid "$spid"
    timeout 40 "$ROOT/target/release/$tool" --port-conf "$ROOT/conf/memif-client.toml" --socket "$sock" \
        --file-prefix "$pc" -p "$port" --timeout 20 "$@" "${PF_CEXTRA[@]}" 127.0.0.1 >"$PF_CLOG" 2>&1 || PF_CRC=$?
    wait_pid "$spid" 30 || PF_SRC=$?
}

# pf_table LOG SIZE ITERS: perftest's BW table as its scripts read it: the line after the '#bytes' header, columns
# 1 (#bytes), 2 (#iterations), 4 (BW average) and 5 (MsgRate), the average positive.
pf_table() {
    awk -v s="$2" -v n="$3" '/^ #bytes/ {getline; ok = ($1 == s && $2 == n && $4 > 0 && $5 > 0)} END {exit !ok}' "$1"
}

tier8_perftest_memif() {
    tier_begin "tier 8 perftest tools over memif"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    local tool size checker avg=""
    for tool in rdp_write_bw rdp_read_bw rdp_send_bw; do
        for size in 64 4096; do
            pf_pair "$tool-$size" "$tool" -s "$size" -n 3000 -q 2 --data_validation --out_json_file \
                "$LOG_DIR/tier8-$tool-$size.json"
            check "$tool -s $size: client exit 0 (got $PF_CRC)" test "$PF_CRC" -eq 0
            check "$tool -s $size: server exit 0 (got $PF_SRC)" test "$PF_SRC" -eq 0
            [[ $PF_CRC -ne 0 || $PF_SRC -ne 0 ]] && grep -h '^rdp_' "$PF_CLOG" "$PF_SLOG" | sed 's/^/    /'
            check "$tool -s $size: client table parses" pf_table "$PF_CLOG" "$size" 3000
            check "$tool -s $size: server table parses" pf_table "$PF_SLOG" "$size" 3000
            checker="$PF_SLOG"
            [[ $tool == rdp_read_bw ]] && checker="$PF_CLOG"
            check "$tool -s $size: payloads validated" grep -Eq '^ Data validation: [1-9][0-9]* bytes verified' "$checker"
            check "$tool -s $size: JSON has the figures" grep -q "\"MsgSize\": $size, \"n_iterations\": 3000" \
                "$LOG_DIR/tier8-$tool-$size.json"
            [[ $tool == rdp_write_bw && $size == 4096 ]] && avg=$(awk '/^ #bytes/ {getline; print $4}' "$PF_CLOG")
        done
    done

    # atomic_bw and the latency tests: client tables by column (latency: #bytes, #iterations, t_avg > 0).
    pf_pair atomic_bw rdp_atomic_bw -n 2000
    check "rdp_atomic_bw: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_atomic_bw: client table parses" pf_table "$PF_CLOG" 8 2000
    local lt
    for lt in "rdp_read_lat -s 64" "rdp_atomic_lat -A FETCH_AND_ADD" "rdp_atomic_lat -A CMP_AND_SWAP" \
        "rdp_send_lat -s 64" "rdp_send_lat -s 4096" "rdp_write_lat -s 64" "rdp_write_lat -s 4096"; do
        # shellcheck disable=SC2086
        pf_pair "${lt// /}" $lt -n 2000 --data_validation
        check "$lt: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
        check "$lt: client latency table parses" awk '/^ #bytes #iterations/ {getline; ok = ($2 == 2000 && $6 > 0)} END {exit !ok}' "$PF_CLOG"
    done
    check "rdp_atomic_lat: every FETCH_AND_ADD result validated" \
        grep -q '^ Data validation: 16000 bytes verified' "$LOG_DIR/tier8-rdp_atomic_lat-AFETCH_AND_ADD-client.log"

    # Bad input: one clear line and a non-zero exit, never a hang.
    local rc=0 err="$LOG_DIR/tier8-unknown.err" t0
    timeout 10 "$ROOT/target/release/rdp_write_bw" --bogus >/dev/null 2>"$err" || rc=$?
    check "unknown flag: exit 2 (got $rc)" test "$rc" -eq 2
    check "unknown flag: one line naming it" test "$(wc -l <"$err")" -eq 1 -a -n "$(grep "^rdp_write_bw: .*--bogus" "$err")"

    rc=0 err="$LOG_DIR/tier8-refused.err" t0=$SECONDS
    timeout 30 "$ROOT/target/release/rdp_write_bw" --port-conf "$ROOT/conf/memif-client.toml" \
        --file-prefix "${RUN_ID}prf" -p $((30000 + ($$ % 20000) + 99)) 127.0.0.1 >/dev/null 2>"$err" || rc=$?
    track_prefix "${RUN_ID}prf"
    check "connection refused: exit 1 (got $rc) within 10 s ($((SECONDS - t0)) s)" test "$rc" -eq 1 -a $((SECONDS - t0)) -le 10
    check "connection refused: one line" test "$(wc -l <"$err")" -eq 1 -a -n "$(grep -i 'refused' "$err")"

    # The server forces 4096, the client 1024: the server refuses; the client then loses the exchange.
    PF_SEXTRA=(-m 4096) PF_CEXTRA=(-m 1024)
    pf_pair mtu-mismatch rdp_write_bw -s 4096 -n 1000
    PF_SEXTRA=() PF_CEXTRA=()
    check "MTU mismatch: both sides exit 1 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 1 -a "$PF_CRC" -eq 1
    check "MTU mismatch: the server says so in one line" test "$(grep -ci 'mtu' "$PF_SLOG")" -ge 1 \
        -a "$(grep -c '^rdp_write_bw: ' "$PF_SLOG")" -eq 1

    # A run longer than the server's --timeout is no stall: the server waits as long as RoCE frames come. One
    # message in flight makes the run RTT-bound; it is repeated 4x longer until it outlasts the timeout.
    local secs="" n
    PF_SEXTRA=(--timeout 3)
    for n in 100000 400000 1600000 6400000; do
        pf_pair "long-run-$n" rdp_write_bw -s 64 -t 1 -n "$n"
        secs=$(awk '/^ #bytes/ {getline; if ($5 > 0) printf "%.1f", $2 / ($5 * 1e6)}' "$PF_CLOG")
        [[ $PF_SRC -eq 0 && $PF_CRC -eq 0 ]] && awk -v s="${secs:-0}" 'BEGIN {exit !(s > 3)}' && break
        [[ $PF_SRC -ne 0 || $PF_CRC -ne 0 ]] && break
    done
    PF_SEXTRA=()
    check "run of ${secs:-?} s, server --timeout 3: both exit 0 (server $PF_SRC, client $PF_CRC)" \
        test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "run of ${secs:-?} s: longer than the server's --timeout" awk -v s="${secs:-0}" 'BEGIN {exit !(s > 3)}'

    # A client killed mid-run: the server exits non-zero within its timeout.
    PF_N=$((PF_N + 1))
    local sock="/run/rdp-${RUN_ID}-pk.sock" port=$((20000 + ($$ % 10000) + PF_N)) spid cpid src=0
    track_prefix "${RUN_ID}pks"
    track_prefix "${RUN_ID}pkc"
    track_path "$sock"
    "$ROOT/target/release/rdp_write_bw" --port-conf "$ROOT/conf/memif-server.toml" --socket "$sock" \
        --file-prefix "${RUN_ID}pks" -p "$port" --timeout 15 -s 4096 -n 5000000 >"$LOG_DIR/tier8-kill-server.log" 2>&1 &
    spid=$!
    track_pid "$spid"
    "$ROOT/target/release/rdp_write_bw" --port-conf "$ROOT/conf/memif-client.toml" --socket "$sock" \
        --file-prefix "${RUN_ID}pkc" -p "$port" --timeout 15 -s 4096 -n 5000000 127.0.0.1 \
        >"$LOG_DIR/tier8-kill-client.log" 2>&1 &
    cpid=$!
    track_pid "$cpid"
    sleep 3
    check "peer vanishes: the client was running" kill -0 "$cpid"
    kill -KILL "$cpid" 2>/dev/null
    wait "$cpid" 2>/dev/null
    t0=$SECONDS
    wait_pid "$spid" 20 || src=$?
    check "peer vanishes: server exits non-zero, not by the watchdog (got $src, $((SECONDS - t0)) s)" \
        test "$src" -ne 0 -a "$src" -ne 124
    check "peer vanishes: server says why in one line" grep -q '^rdp_write_bw: ' "$LOG_DIR/tier8-kill-server.log"
    TIER_NOTE="(write_bw 4096 B: ${avg:-?} MiB/s)"
    tier_end
}
