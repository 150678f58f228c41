# Tier 3: two processes over memif (copy mode): server on lcore 1, client on lcore 0, each with its own
# --file-prefix and no hugepages; frames both ways verified; in-band STOP handshake before either port stops.
# Bad input: a socket that is already in use, and a port that fails to start (a client with no server); such a client
# stopped by SIGTERM while it waits.
TIERS+=(tier3_memif)

tier3_memif() {
    tier_begin "tier 3 memif"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    # DPDK's memif uses an abstract unix socket by default: the name lives in the kernel, never on disk.
    local sock="/run/rdp-${RUN_ID}-memif.sock" ps="${RUN_ID}t3s" pc="${RUN_ID}t3c"
    local slog="$LOG_DIR/tier3-memif-server.log" clog="$LOG_DIR/tier3-memif-client.log" src=0 crc=0 spid
    track_prefix "$ps"
    track_prefix "$pc"
    "$PORTTEST" memif --role server --socket "$sock" --lcore 1 --file-prefix "$ps" >"$slog" 2>&1 &
    spid=$!
    track_pid "$spid"
    timeout 120 "$PORTTEST" memif --role client --socket "$sock" --lcore 0 --file-prefix "$pc" >"$clog" 2>&1 || crc=$?
    wait_pid "$spid" 30 || src=$?
    check "memif client: exit status 0 (got $crc)" test "$crc" -eq 0
    check "memif server: exit status 0 (got $src)" test "$src" -eq 0
    tool_checks "$slog"
    tool_checks "$clog"
    local left
    left=$(prefix_leftovers "$ps"; prefix_leftovers "$pc")
    check "memif pair: nothing left behind${left:+ ($left)}" test -z "$left"
    check "memif pair: socket closed" bash -c "! grep -q '$sock' /proc/net/unix"

    # A second server on a socket that is in use: one line, exit 2, nothing left.
    local hp="${RUN_ID}t3h" hpid i
    track_prefix "$hp"
    "$PORTTEST" memif --role server --socket "$sock" --lcore 1 --file-prefix "$hp" --link-timeout 30 \
        >"$LOG_DIR/tier3-holder.log" 2>&1 &
    hpid=$!
    track_pid "$hpid"
    for i in $(seq 50); do socket_listening "$sock" && break; sleep 0.1; done
    expect_setup_error "memif socket in use" "${RUN_ID}t3u" "rte_vdev_init failed.*Address already in use" -- \
        "$PORTTEST" memif --role server --socket "$sock" --lcore 0 --file-prefix "${RUN_ID}t3u"
    kill -TERM "$hpid" 2>/dev/null
    wait "$hpid" 2>/dev/null

    # A client whose port cannot start (no server listening).
    expect_setup_error "memif port that fails to start" "${RUN_ID}t3n" "rte_eth_dev_start failed" -- \
        "$PORTTEST" memif --role client --socket "/run/rdp-${RUN_ID}-nobody.sock" --lcore 0 \
        --file-prefix "${RUN_ID}t3n" --link-timeout 1
    # The same client waiting for its server is stopped by SIGTERM at once (session 11: it kept retrying the port
    # start until --link-timeout, then said the start failed, exit 2): "interrupted", exit 130, nothing left.
    local ip="${RUN_ID}t3i" ipid rc=0 t0
    track_prefix "$ip"
    "$PORTTEST" memif --role client --socket "/run/rdp-${RUN_ID}-nobody.sock" --lcore 0 --file-prefix "$ip" \
        --link-timeout 60 >"$LOG_DIR/tier3-interrupted.log" 2>"$LOG_DIR/tier3-interrupted.err" &
    ipid=$!
    track_pid "$ipid"
    sleep 2
    t0=$SECONDS
    kill -TERM "$ipid" 2>/dev/null
    wait_pid "$ipid" 30 || rc=$?
    check "memif client waiting for its server, SIGTERM: exit 130 within 5 s (got $rc after $((SECONDS - t0)) s)" \
        test "$rc" -eq 130 -a $((SECONDS - t0)) -le 5
    check "memif client waiting for its server, SIGTERM: one line says so" \
        grep -qx 'rdp-porttest: interrupted' "$LOG_DIR/tier3-interrupted.err"
    left=$(prefix_leftovers "$ip")
    check "memif client waiting for its server, SIGTERM: nothing left behind${left:+ ($left)}" test -z "$left"
    TIER_NOTE="($(grep -m1 '^RESULT' "$clog" | grep -Eo 'rx [0-9]+ frames' | head -1) each way)"
    tier_end
}
