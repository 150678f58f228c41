# Tier 6: two soft-NIC processes over memif (rdp-nic server on lcore 1, client on lcore 0, distinct --file-prefix,
# no hugepages): QPN/PSN/rkey/VA exchanged over TCP on 127.0.0.1; SEND, WRITE, READ and atomics at path MTU 1024 and
# 4096 with every byte verified, 1% and 5% loss injected on both sides, mempool leak checks in both processes, and
# the stop order memif needs (the server stops polling before the client disconnects); a raw echo server whose peer
# never reads ends by its --timeout; an rdp-nic server whose client is killed ends at once; WRITE and READ with the
# client in memif zero-copy mode.
TIERS+=(tier6_engine_memif)

# memif_pair NAME N CLIENT-ARGS...: one server/client run; socket, TCP port and prefixes unique per run; the client's
# profile is conf/${CLIENT_PROFILE:-memif-client.toml}.
memif_pair() {
    local name="$1" n="$2"
    shift 2
    local sock="/run/rdp-${RUN_ID}-m$n.sock" ps="${RUN_ID}m${n}s" pc="${RUN_ID}m${n}c" port=$((20000 + ($$ % 10000) + n))
    local slog="$LOG_DIR/tier6-$name-server.log" clog="$LOG_DIR/tier6-$name-client.log" src=0 crc=0 spid left
    track_prefix "$ps"
    track_prefix "$pc"
    "$NIC" server --profile "$ROOT/conf/memif-server.toml" --socket "$sock" --oob-port "$port" --file-prefix "$ps" \
        --timeout 60 --stats "$@" >"$slog" 2>&1 &
    spid=$!
    track_pid "$spid"
    timeout 90 "$NIC" client --profile "$ROOT/conf/${CLIENT_PROFILE:-memif-client.toml}" --socket "$sock" \
        --oob-port "$port" --file-prefix "$pc" --timeout 60 --stats "$@" >"$clog" 2>&1 || crc=$?
    wait_pid "$spid" 30 || src=$?
    check "$name: client exit status 0 (got $crc)" test "$crc" -eq 0
    check "$name: server exit status 0 (got $src)" test "$src" -eq 0
    tool_checks "$clog"
    tool_checks "$slog"
    [[ $crc -ne 0 || $src -ne 0 ]] && grep -h '^rdp-nic:' "$clog" "$slog" | sed 's/^/    /'
    left=$(prefix_leftovers "$ps"; prefix_leftovers "$pc")
    check "$name: nothing left behind${left:+ ($left)}" test -z "$left"
}

# raw_echo_peer_stops_reading: rdp-nic's raw RTT server echoes every frame its memif peer sends; here the peer is
# an rdp-nic raw BW client, which floods 64-byte frames and never reads (its out-of-band partner is the RTT server
# itself: the server takes any RAW line). The echoes soon find the ring to the client full, and after the client's
# disconnect memif's tx takes nothing: the server must still end at its --timeout with a CHECK FAIL line naming
# it, exit 1, its mempool whole (session 11: it retried the tx burst for ever, ignoring --timeout).
raw_echo_peer_stops_reading() {
    local sock="/run/rdp-${RUN_ID}-mraw.sock" ps="${RUN_ID}mrs" pc="${RUN_ID}mrc" port=$((20000 + ($$ % 10000) + 99))
    local slog="$LOG_DIR/tier6-raw-stuck-server.log" clog="$LOG_DIR/tier6-raw-stuck-client.log" spid cpid rc=0 t0
    track_prefix "$ps"
    track_prefix "$pc"
    t0=$SECONDS
    "$NIC" server --profile "$ROOT/conf/memif-server.toml" --socket "$sock" --oob-port "$port" --file-prefix "$ps" \
        --raw rtt --timeout 6 >"$slog" 2>&1 &
    spid=$!
    track_pid "$spid"
    "$NIC" client --profile "$ROOT/conf/memif-client.toml" --socket "$sock" --oob-port "$port" --file-prefix "$pc" \
        --raw bw --size 64 --seconds 2 --timeout 30 >"$clog" 2>&1 &
    cpid=$!
    track_pid "$cpid"
    wait_pid "$spid" 30 || rc=$?
    check "raw echo, peer never reads: the server ends by its --timeout, exit 1 (got $rc after $((SECONDS - t0)) s)" \
        test "$rc" -eq 1
    check "raw echo, peer never reads: one CHECK line says the echoes were not taken" \
        grep -q '^CHECK FAIL raw server: echoes taken by the port before the timeout (6 s)' "$slog"
    check "raw echo, peer never reads: the server's mempool is whole" grep -q '^CHECK ok   raw server: mempool: ' "$slog"
    wait_pid "$cpid" 30 >/dev/null || true
}

# client_killed_mid_run: the rdp-nic client of a long WRITE run is killed with SIGKILL 2 s in; its server must see
# the out-of-band connection end and stop at once with a CHECK FAIL line naming it, exit 1, mempool whole (session
# 12: it ignored the closed connection and waited out its --timeout, here 60 s).
client_killed_mid_run() {
    local sock="/run/rdp-${RUN_ID}-mkill.sock" ps="${RUN_ID}mks" pc="${RUN_ID}mkc" port=$((20000 + ($$ % 10000) + 98))
    local slog="$LOG_DIR/tier6-killed-server.log" clog="$LOG_DIR/tier6-killed-client.log" spid cpid rc=0 t0
    track_prefix "$ps"
    track_prefix "$pc"
    "$NIC" server --profile "$ROOT/conf/memif-server.toml" --socket "$sock" --oob-port "$port" --file-prefix "$ps" \
        --timeout 60 --op write --mtu 4096 --size 65536 --iters 100000000 --qps 1 --depth 16 >"$slog" 2>&1 &
    spid=$!
    track_pid "$spid"
    "$NIC" client --profile "$ROOT/conf/memif-client.toml" --socket "$sock" --oob-port "$port" --file-prefix "$pc" \
        --timeout 60 --op write --mtu 4096 --size 65536 --iters 100000000 --qps 1 --depth 16 >"$clog" 2>&1 &
    cpid=$!
    track_pid "$cpid"
    sleep 2
    check "client killed mid-run: the client was still running after 2 s" kill -0 "$cpid"
    # Reaped here, quietly: bash would otherwise report the kill at the next wait.
    { kill -9 "$cpid" && wait "$cpid"; } 2>/dev/null
    t0=$SECONDS
    wait_pid "$spid" 30 || rc=$?
    check "client killed mid-run: the server ends with exit 1 (got $rc) within 10 s of the kill (took $((SECONDS - t0)) s)" \
        test "$rc" -eq 1 -a $((SECONDS - t0)) -le 10
    check "client killed mid-run: one CHECK line says the client went away" \
        grep -q '^CHECK FAIL server: the client went away before it said DONE (out-of-band: the peer closed the connection)' "$slog"
    check "client killed mid-run: the server's mempool is whole" grep -q '^CHECK ok   server: mempool: ' "$slog"
    wait_pid "$cpid" 5 >/dev/null 2>&1 || true
}

# memif_socket_in_use: a second rdp-nic server on the memif socket a first one holds: one line with DPDK's own
# reason, exit 2 (session 14: rdp-nic sent DPDK's log to /dev/null and said only "No such device").
memif_socket_in_use() {
    local sock="/run/rdp-${RUN_ID}-mdup.sock" p1="${RUN_ID}md1" p2="${RUN_ID}md2" port=$((20000 + ($$ % 10000) + 97))
    local err="$LOG_DIR/tier6-memif-socket-in-use.err" spid rc=0
    track_prefix "$p1"
    track_prefix "$p2"
    track_path "$sock"
    "$NIC" server --profile "$ROOT/conf/memif-server.toml" --socket "$sock" --oob-port "$port" --file-prefix "$p1" \
        --timeout 10 --op write --size 64 --iters 10 >/dev/null 2>&1 &
    spid=$!
    track_pid "$spid"
    sleep 1
    timeout 30 "$NIC" server --profile "$ROOT/conf/memif-server.toml" --socket "$sock" --oob-port $((port + 1)) \
        --file-prefix "$p2" --timeout 5 --op write --size 64 --iters 10 >/dev/null 2>"$err" || rc=$?
    kill -TERM "$spid" 2>/dev/null
    wait_pid "$spid" 20 >/dev/null 2>&1 || true
    check "second rdp-nic memif server on one socket: exit 2 (got $rc)" test "$rc" -eq 2
    check "second rdp-nic memif server on one socket: one line with DPDK's reason" test "$(wc -l <"$err")" -eq 1 \
        -a -n "$(grep '^rdp-nic: port net_memif0: .*; DPDK: .*Address already in use' "$err")"
}

tier6_engine_memif() {
    tier_begin "tier 6 engine over memif"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    local op mtu n=0 loss
    for op in send write read atomic; do
        for mtu in 1024 4096; do
            n=$((n + 1))
            memif_pair "$op-$mtu" "$n" --op "$op" --mtu "$mtu" --size 10000 --iters 300 --qps 2 --depth 16
        done
    done
    for loss in 1 5; do
        n=$((n + 1))
        memif_pair "write-loss$loss" "$n" --op write --mtu 4096 --size 9000 --iters 200 --qps 2 --depth 16 \
            --inject-loss "$loss" --seed "$n" --qp-timeout 13
        check "write with ${loss}% loss: frames were dropped" \
            grep -Eq 'loss_injected=[1-9]' "$LOG_DIR/tier6-write-loss$loss-server.log"
    done
    # The client in memif zero-copy mode (conf/memif-client-zc.toml: the tools add the --single-file-segments EAL
    # needs; session 12: without it the port was never created). Its mempool line must show the PMD's rings holding
    # mbufs after the stop, i.e. zero-copy really ran.
    for op in write read; do
        n=$((n + 1))
        CLIENT_PROFILE=memif-client-zc.toml memif_pair "zc-$op-4096" "$n" --op "$op" --mtu 4096 --size 10000 \
            --iters 300 --qps 2 --depth 16
        check "zc-$op-4096: the client ran memif zero-copy (its rings hold mbufs after the stop)" grep -Eq \
            'CHECK ok   client: mempool: .* [1-9][0-9]* after port stop \(memif zero-copy' "$LOG_DIR/tier6-zc-$op-4096-client.log"
    done
    raw_echo_peer_stops_reading
    client_killed_mid_run
    memif_socket_in_use
    TIER_NOTE="($(grep -h '^RESULT op' "$LOG_DIR"/tier6-write-4096-client.log | grep -Eo 'avg_mib_s=[0-9.]+'))"
    tier_end
}
