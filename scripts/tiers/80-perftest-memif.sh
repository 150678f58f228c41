# Tier 8: the eight perftest-compatible tools (rdp_{write,read,send,atomic}_{bw,lat}) between two roce-dp soft NICs over
# memif (server lcore 1, client lcore 0, distinct --file-prefix, no hugepages): sizes 64 and 4096 with
# --data_validation, exit codes, perftest's BW and latency tables parsed by column position, --out_json_file; -a (send
# BW and send latency, both sides in lockstep), -b, -Q, -D, --run_infinitely ended by SIGINT; bad input: an unknown
# flag, connection refused, a forced MTU the peer does not have, a client and a server killed mid-run, a peer speaking
# another perftest version. And the README's main job, scripts/run.sh, with -p and --timeout of its caller's.
TIERS+=(tier8_perftest_memif)

PF_N=0

# pf_spawn NAME TOOL TIMEOUT ARGS...: starts a server and a client of TOOL with ARGS (plus PF_SEXTRA / PF_CEXTRA) and
# --timeout TIMEOUT in the background; sets PF_SPID, PF_CPID, PF_SLOG, PF_CLOG. Socket, TCP port and prefixes unique
# per run. Both sides run on the memif profiles, or with PF_DAEMON set (tier 9) through the roce-dpd on that socket;
# logs are $LOG_DIR/$PF_LOG-NAME-{server,client}.log.
PF_SEXTRA=()
PF_CEXTRA=()
PF_DAEMON=""
PF_LOG=tier8
pf_spawn() {
    local name="$1" tool="$2" limit="$3"
    shift 3
    PF_N=$((PF_N + 1))
    local n=$PF_N
    local sock="/run/rdp-${RUN_ID}-p$n.sock" ps="${RUN_ID}p${n}s" pc="${RUN_ID}p${n}c" port=$((20000 + ($$ % 10000) + n))
    local back_s back_c
    PF_SLOG="$LOG_DIR/$PF_LOG-$name-server.log" PF_CLOG="$LOG_DIR/$PF_LOG-$name-client.log"
    if [[ -n $PF_DAEMON ]]; then
        back_s=(--daemon "$PF_DAEMON") back_c=(--daemon "$PF_DAEMON")
    else
        track_prefix "$ps"
        track_prefix "$pc"
        track_path "$sock"
        back_s=(--port-conf "$ROOT/conf/memif-server.toml" --socket "$sock" --file-prefix "$ps")
        back_c=(--port-conf "$ROOT/conf/memif-client.toml" --socket "$sock" --file-prefix "$pc")
    fi
    "$ROOT/target/release/$tool" "${back_s[@]}" -p "$port" --timeout "$limit" "$@" "${PF_SEXTRA[@]}" >"$PF_SLOG" 2>&1 &
    PF_SPID=$!
    track_pid "$PF_SPID"
    "$ROOT/target/release/$tool" "${back_c[@]}" -p "$port" --timeout "$limit" "$@" "${PF_CEXTRA[@]}" 127.0.0.1 \
        >"$PF_CLOG" 2>&1 &
    PF_CPID=$!
    track_pid "$PF_CPID"
}

# pf_pair NAME TOOL ARGS...: one server/client run of TOOL with ARGS on both sides (plus PF_SEXTRA / PF_CEXTRA) to
# the end; sets PF_SLOG, PF_CLOG, PF_SRC, PF_CRC (124: killed by the watchdog).
pf_pair() {
    local name="$1" tool="$2"
    shift 2
    PF_SRC=0 PF_CRC=0
    pf_spawn "$name" "$tool" 20 "$@"
    wait_pid "$PF_CPID" 40 || PF_CRC=$?
    wait_pid "$PF_SPID" 30 || PF_SRC=$?
}

# pf_table LOG SIZE ITERS: perftest's BW table as its scripts read it: the line after the '#bytes' header, columns
# 1 (#bytes), 2 (#iterations), 4 (BW average) and 5 (MsgRate), the average positive.
pf_table() {
    awk -v s="$2" -v n="$3" '/^ #bytes/ {getline; ok = ($1 == s && $2 == n && $4 > 0 && $5 > 0)} END {exit !ok}' "$1"
}

# pf_all_rows LOG...: every log has perftest's -a table: a row per size 2 .. 2^23, in order.
pf_all_rows() {
    local f
    for f in "$@"; do
        awk '/^ #bytes/ {on = 1; next} on && /^ [0-9]/ {s[n++] = $1} END {
            if (n != 23) exit 1; for (i = 0; i < n; i++) if (s[i] != 2 ^ (i + 1)) exit 1 }' "$f" || return 1
    done
}

# pf_json_last LOG JSON ROWS: the JSON has ROWS result objects and its last one has the figures of the table's last row.
pf_json_last() {
    local row json
    row=$(awk '/^ #bytes/ {on = 1; next} on && /^ [0-9]/ {last = $1 " " $2 " " $3 " " $4 " " $5} END {print last}' "$1")
    json=$(grep -o '"MsgSize": [0-9]*, "n_iterations": [0-9]*, "BW_peak": [0-9.]*, "BW_average": [0-9.]*, "MsgRate": [0-9.]*' "$2" |
        tail -1 | awk -F'[:,] *' '{print $2, $4, $6, $8, $10}')
    [[ $(grep -c '"MsgSize"' "$2") -eq $3 && -n $row && $row == "$json" ]]
}

# pf_infinite: write_bw --run_infinitely -D 1 for about 4 s, then SIGINT to the client; sets PF_SRC, PF_CRC,
# PF_CLOG, PF_SLOG.
pf_infinite() {
    PF_SRC=0 PF_CRC=0
    pf_spawn infinite rdp_write_bw 10 -s 4096 --run_infinitely -D 1
    sleep 4
    kill -INT "$PF_CPID" 2>/dev/null
    wait_pid "$PF_CPID" 15 || PF_CRC=$?
    wait_pid "$PF_SPID" 15 || PF_SRC=$?
}

# pf_vanish WHO: a 30 s write_bw run; after 3 s WHO (client or server) is killed with SIGKILL. The other side must
# exit non-zero within its timeout (not by the watchdog) and say why in one line. (A run of 5 000 000 messages was
# meant to be long, but through roce-dpd on a quiet machine it ended in 2.5 s, before the kill.)
pf_vanish() {
    local who="$1" victim survivor rc=0 t0 log
    pf_spawn "vanish-$who" rdp_write_bw 10 -s 4096 -D 30
    if [[ $who == client ]]; then victim=$PF_CPID survivor=$PF_SPID log=$PF_SLOG; else victim=$PF_SPID survivor=$PF_CPID log=$PF_CLOG; fi
    sleep 3
    check "$who vanishes: it was running" kill -0 "$victim"
    kill -KILL "$victim" 2>/dev/null
    wait "$victim" 2>/dev/null
    t0=$SECONDS
    wait_pid "$survivor" 20 || rc=$?
    check "$who vanishes: the other side exits non-zero, not by the watchdog (got $rc, $((SECONDS - t0)) s)" \
        test "$rc" -ne 0 -a "$rc" -ne 124
    check "$who vanishes: the other side says why in one line" test "$(grep -c '^rdp_write_bw: ' "$log")" -eq 1
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

    # -a: both sides of send BW step through 2 .. 2^23 B in lockstep, a row each (the server's from its receives);
    # the JSON carries the same 23 rows.
    PF_CEXTRA=(--out_json_file "$LOG_DIR/tier8-send_bw-all.json")
    pf_pair send_bw-all rdp_send_bw -a -n 5 --data_validation
    check "rdp_send_bw -a: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_send_bw -a: client and server print a row per size, 2 .. 8388608" pf_all_rows "$PF_CLOG" "$PF_SLOG"
    check "rdp_send_bw -a: 23 JSON rows, the last as printed" pf_json_last "$PF_CLOG" "$LOG_DIR/tier8-send_bw-all.json" 23

    PF_CEXTRA=()

    # send_lat -a: a barrier record before every size, once its receives are posted (as ib_send_lat -a); each side
    # prints a row per size.
    pf_pair send_lat-all rdp_send_lat -a -n 5
    check "rdp_send_lat -a: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_send_lat -a: client and server print a row per size, 2 .. 8388608" pf_all_rows "$PF_CLOG" "$PF_SLOG"

    # -b: both sides write; each prints the sum of both directions' reports (the same figures on both sides).
    pf_pair write_bw-bidir rdp_write_bw -b -s 4096 -n 2000 -q 2 -Q 7
    check "rdp_write_bw -b: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_write_bw -b: both tables parse" pf_table "$PF_CLOG" 4096 2000
    check "rdp_write_bw -b: the server's row is the client's" \
        test "$(awk '/^ #bytes/ {getline; print $3, $4}' "$PF_CLOG")" = "$(awk '/^ #bytes/ {getline; print $3, $4}' "$PF_SLOG")"

    # -D: a timed run; perftest reports what completed between the margins, with no peak.
    PF_CEXTRA=(--out_json_file "$LOG_DIR/tier8-write_bw-duration.json")
    pf_pair write_bw-duration rdp_write_bw -D 2 -s 4096
    PF_CEXTRA=()
    check "rdp_write_bw -D 2: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_write_bw -D 2: a row with iterations and no peak" \
        awk '/^ #bytes/ {getline; ok = ($1 == 4096 && $2 > 0 && $3 == 0 && $4 > 0)} END {exit !ok}' "$PF_CLOG"
    check "rdp_write_bw -D 2: JSON as printed" pf_json_last "$PF_CLOG" "$LOG_DIR/tier8-write_bw-duration.json" 1

    # --run_infinitely: a row per period until SIGINT, then the teardown and exit 0 on both sides.
    pf_infinite
    check "--run_infinitely: client exits 0 after SIGINT (got $PF_CRC)" test "$PF_CRC" -eq 0
    check "--run_infinitely: server exits 0 (got $PF_SRC)" test "$PF_SRC" -eq 0
    check "--run_infinitely: at least 2 rows, one per second" \
        test "$(grep -cE '^ 4096 +[1-9][0-9]* ' "$PF_CLOG")" -ge 2

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

    # Profiles swapped or doubled: a memif client with no memif server to connect to (DPDK: "Operation not
    # permitted"), and a second memif server on a socket the first holds (the vdev's probe failed inside EAL, and
    # the tool said only "rte_eth_dev_get_port_by_name failed: No such device"): one line each saying why, exit 2.
    local dsock="/run/rdp-${RUN_ID}-pdup.sock" dspid
    track_path "$dsock"
    track_prefix "${RUN_ID}pd1" && track_prefix "${RUN_ID}pd2" && track_prefix "${RUN_ID}pd3"
    rc=0 err="$LOG_DIR/tier8-no-memif-server.err"
    timeout 30 "$ROOT/target/release/rdp_write_bw" --port-conf "$ROOT/conf/memif-client.toml" --socket "$dsock" \
        --file-prefix "${RUN_ID}pd1" --timeout 5 >/dev/null 2>"$err" || rc=$?
    check "memif client profile, no memif server: exit 2 (got $rc)" test "$rc" -eq 2
    check "memif client profile, no memif server: one line saying so" test "$(wc -l <"$err")" -eq 1 \
        -a -n "$(grep "^rdp_write_bw: start net_memif0: .*: no memif server on $dsock" "$err")"
    "$ROOT/target/release/rdp_write_bw" --port-conf "$ROOT/conf/memif-server.toml" --socket "$dsock" \
        --file-prefix "${RUN_ID}pd2" -p $((30000 + ($$ % 20000) + 97)) --timeout 10 >/dev/null 2>&1 &
    dspid=$!
    track_pid "$dspid"
    sleep 1
    rc=0 err="$LOG_DIR/tier8-memif-socket-in-use.err"
    timeout 30 "$ROOT/target/release/rdp_write_bw" --port-conf "$ROOT/conf/memif-server.toml" --socket "$dsock" \
        --file-prefix "${RUN_ID}pd3" -p $((30000 + ($$ % 20000) + 96)) --timeout 5 >/dev/null 2>"$err" || rc=$?
    kill -TERM "$dspid" 2>/dev/null
    wait_pid "$dspid" 20 || true
    check "second memif server on one socket: exit 2 (got $rc)" test "$rc" -eq 2
    check "second memif server on one socket: one line with DPDK's reason" test "$(wc -l <"$err")" -eq 1 \
        -a -n "$(grep '^rdp_write_bw: port net_memif0: .*; DPDK: .*Address already in use' "$err")"

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


    # The README's main job, scripts/run.sh, with perftest's flags and its own -p / --timeout replacing run.sh's
    # (rdp_write_bw said "cannot be used multiple times" of a -p the user gave once); the port's options are run.sh's
    # and refused in one line before anything runs.
    local run_out="$LOG_DIR/tier8-run-sh.out"
    # run.sh runs the release build first: done here, outside the checks' timeouts, so that a tree edited since
    # test.sh's build (a rebuild takes minutes on 2 cores) cannot make them fail spuriously; run.sh's then has
    # nothing to do.
    rc=0 t0=$SECONDS
    cargo build --locked --release -p roce-dp-tools --bins >"$LOG_DIR/tier8-run-sh-build.log" 2>&1 || rc=$?
    check "the release build scripts/run.sh runs first: ok ($((SECONDS - t0)) s)" test "$rc" -eq 0
    rc=0
    timeout 120 "$ROOT/scripts/run.sh" -s 4096 -n 2000 -q 2 --data_validation -p $((30000 + ($$ % 20000) + 98)) \
        --timeout 30 >"$run_out" 2>&1 || rc=$?
    check "scripts/run.sh -s 4096 -n 2000 -q 2 --data_validation -p PORT --timeout 30: exit 0 (got $rc)" test "$rc" -eq 0
    check "scripts/run.sh: perftest's table" pf_table "$run_out" 4096 2000
    check "scripts/run.sh: the server's validation and the logs, as the README shows" \
        grep -Eq '^server: Data validation: 8192 bytes verified; logs: target/run-logs/[0-9]{8}-[0-9]{6}$' "$run_out"
    rc=0 err="$LOG_DIR/tier8-run-sh-port-conf.err" t0=$SECONDS
    timeout 60 "$ROOT/scripts/run.sh" --port-conf conf/af-packet.toml >/dev/null 2>"$err" || rc=$?
    check "scripts/run.sh --port-conf FILE: exit 2 (got $rc) within 5 s ($((SECONDS - t0)) s)" \
        test "$rc" -eq 2 -a $((SECONDS - t0)) -le 5
    check "scripts/run.sh --port-conf FILE: one line naming it" \
        test "$(wc -l <"$err")" -eq 1 -a -n "$(grep "^run.sh: --port-conf is run.sh's own" "$err")"
    # A HOST (a word that is no option's value) went to both sides: the server ran as a client of it.
    rc=0 err="$LOG_DIR/tier8-run-sh-host.err" t0=$SECONDS
    timeout 60 "$ROOT/scripts/run.sh" -s 4096 10.0.0.2 >/dev/null 2>"$err" || rc=$?
    check "scripts/run.sh -s 4096 HOST: exit 2 (got $rc) within 5 s ($((SECONDS - t0)) s)" \
        test "$rc" -eq 2 -a $((SECONDS - t0)) -le 5
    check "scripts/run.sh -s 4096 HOST: one line naming it" \
        test "$(wc -l <"$err")" -eq 1 -a -n "$(grep "^run.sh: 10.0.0.2 looks like a HOST, which is run.sh's own" "$err")"
    # -p=PORT and --timeout=S, as rdp_write_bw takes them (run.sh passed "-p =PORT" on, which both sides refused).
    rc=0 run_out="$LOG_DIR/tier8-run-sh-equals.out"
    timeout 120 "$ROOT/scripts/run.sh" -s 64 -n 500 -p=$((30000 + ($$ % 20000) + 97)) --timeout=30 >"$run_out" 2>&1 ||
        rc=$?
    check "scripts/run.sh -s 64 -n 500 -p=PORT --timeout=30: exit 0 (got $rc)" test "$rc" -eq 0
    check "scripts/run.sh -p=PORT: perftest's table" pf_table "$run_out" 64 500
    # -p at the end of a cluster of flags (-Fp PORT): run.sh passed it on beside its own -p ("cannot be used
    # multiple times" on both sides).
    rc=0 run_out="$LOG_DIR/tier8-run-sh-cluster.out"
    timeout 120 "$ROOT/scripts/run.sh" -s 64 -n 500 -Fp $((30000 + ($$ % 20000) + 98)) --timeout=30 >"$run_out" 2>&1 ||
        rc=$?
    check "scripts/run.sh -s 64 -n 500 -Fp PORT --timeout=30: exit 0 (got $rc)" test "$rc" -eq 0
    check "scripts/run.sh -Fp PORT: perftest's table" pf_table "$run_out" 64 500

    # A client, then a server, killed mid-run: the other side exits non-zero within its timeout.
    pf_vanish client
    pf_vanish server

    # A peer speaking another perftest version (a fake client sends "5.60"): the server refuses in one line.
    PF_N=$((PF_N + 1))
    local sock="/run/rdp-${RUN_ID}-pw.sock" port=$((20000 + ($$ % 10000) + PF_N)) spid src=0
    track_prefix "${RUN_ID}pws"
    track_path "$sock"
    "$ROOT/target/release/rdp_write_bw" --port-conf "$ROOT/conf/memif-server.toml" --socket "$sock" \
        --file-prefix "${RUN_ID}pws" -p "$port" --timeout 10 >"$LOG_DIR/tier8-version-server.log" 2>&1 &
    spid=$!
    track_pid "$spid"
    t0=$SECONDS
    check "another perftest version: the fake client saw our version and the close" \
        timeout 20 bash -c 'for i in $(seq 1 100); do { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null && break; sleep 0.1; done
            printf "5.60\0\0\0\0\0\0\0\0\0\0\0\0" >&3 && test "$(head -c 4 <&3)" = 6.06 && cat <&3 >/dev/null' _ "$port"
    wait_pid "$spid" 20 || src=$?
    check "another perftest version: server exits 1 within its timeout (got $src, $((SECONDS - t0)) s)" \
        test "$src" -eq 1 -a $((SECONDS - t0)) -le 15
    check "another perftest version: one line naming both versions" \
        grep -q '^rdp_write_bw: peer speaks perftest exchange version "5.60", we speak "6.06"' \
        "$LOG_DIR/tier8-version-server.log"
    TIER_NOTE="(write_bw 4096 B: ${avg:-?} MiB/s)"
    tier_end
}
