# The interop matrix against guest h (sourced by scripts/interop-rxe.sh inside its namespace; uses its row, boot,
# result_line, LOG_DIR, RDP_BIN_DIR, PORT_CONF, GUEST_H, HOST_MGMT).
#
# Row name: "<test> <who is the client>-><server> <size> mtu<N>[ loss5%]". Our side is target/release/rdp_<test>
# with --port-conf (a copy of conf/rxe-peer.toml with the phase's path MTU); perftest runs in guest h with
# -d rxe0 -x 1 and exchanges over the management bridge (guest 10.51.0.3, host 10.51.0.254, TCP 18515).
# A row passes when both sides exit 0 and print their result line (the line after perftest's "#bytes" header);
# our side runs without --data_validation: it checks our own payload pattern, which perftest does not write.

MATRIX_TESTS=(send_bw write_bw read_bw atomic_bw send_lat write_lat read_lat atomic_lat)
MATRIX_SIZES=(64 4096 65536)
# REPEAT=N runs every selected row N times in a row (for flaky rows; logs numbered).
ROW_SEQ=0
# Our tools give up after this many seconds without progress (--timeout); also how long a server may linger.
IOP_STALL=30

# row_args TEST SIZE: perftest arguments of one row.
row_args() {
    local n=200
    [[ $1 == *_bw && $2 -lt 65536 ]] && n=1000
    if [[ $1 == atomic_* ]]; then echo "-n $n"; else echo "-s $2 -n $n"; fi
}

# guest_perftest_done TEST [SECONDS]: wait (default 30 s) until perftest has left guest h, else kill it.
guest_perftest_done() {
    local i
    for i in $(seq "${2:-30}"); do
        iop_vmrun "$GUEST_H" "pidof ib_$1 >/dev/null || echo gone" 5 | grep -q gone && return 0
        sleep 1
    done
    iop_vmrun "$GUEST_H" "killall ib_$1" 5 >/dev/null
    return 1
}

# our_listening: our server accepts perftest's TCP exchange (port 18515 = 0x4853 in LISTEN state; our tools listen
# on [::], a line of /proc/net/tcp6 with 32-digit addresses).
our_listening() { grep -Eq ':4853 0+:0000 0A' /proc/net/tcp /proc/net/tcp6 2>/dev/null; }

# row_name TEST SIZE DIR MTU [LOSS]: a row's name (atomics: 8 B, perftest's fixed size).
row_name() {
    local size="$2"
    [[ $1 == atomic_* ]] && size=8
    echo "$1 $3 $size mtu$4${5:+ loss$5%}"
}

# row_selected NAME: the row is in ROWS (all rows when ROWS is empty).
row_selected() { [[ -z "${ROWS:-}" || $1 =~ $ROWS ]]; }

# run_row TEST SIZE DIR MTU CONF [LOSS]: one matrix row. DIR is "rdp->perftest" (our client) or "perftest->rdp".
run_row() {
    local test="$1" size="$2" dir="$3" mtu="$4" conf="$5" loss="${6:-}" bin args dv name log t=$SECONDS
    local ours theirs orc=0 prc pid dropped0 limit
    bin="$RDP_BIN_DIR/rdp_$test"
    [[ $test == atomic_* ]] && size=8
    name=$(row_name "$test" "$size" "$dir" "$mtu" "$loss")
    row_selected "$name" || return
    if [[ ! -x "$bin" ]]; then
        row "$name" FAILED "${bin#"$ROOT"/} not built"
        return
    fi
    args=$(row_args "$test" "$size")
    # A row's time limit: perftest runs have no timeout of their own; a stuck row must not hold the matrix.
    limit=90
    [[ -n "$loss" ]] && limit=240
    dv=""
    # Our --data_validation checks our own payload pattern, which only an rdp_* peer writes; perftest 4.5 has no
    # data validation, so against it the check does not apply (a row passes when both sides finish and report).
    [[ $test != atomic_* && -n "${RDP_BOTH:-}" ]] && dv="--data_validation"
    log="$LOG_DIR/row-${test}-${dir/->/-}-$size-mtu$mtu${loss:+-loss$loss}${REPEAT:+-$((++ROW_SEQ))}"
    ours="$log.rdp.log"
    track_prefix "$RUN_ID"
    theirs="$log.perftest.log"
    if [[ -n "$loss" ]] && ! iop_loss "$loss" >>"$LOG_DIR/nft.log" 2>&1; then
        row "$name" FAILED "nftables loss rules did not load: $(tail -n 1 "$LOG_DIR/nft.log")"
        return
    fi
    dropped0=$(iop_loss_dropped)
    if [[ $dir == "rdp->perftest" ]]; then
        iop_vmrun "$GUEST_H" "(ib_$test -d rxe0 -x 1 $args >/tmp/srv.log 2>&1; echo rc=\$? >>/tmp/srv.log) </dev/null >/dev/null 2>&1 &" \
            10 >/dev/null
        sleep 1
        timeout "$limit" "$bin" --port-conf "$conf" --file-prefix "$RUN_ID" --timeout "$IOP_STALL" $args $dv "$GUEST_H" \
            >"$ours" 2>&1 || orc=$?
        # Our client failed: the server will not see a client, give it 3 s rather than 30.
        if [[ $orc -eq 0 ]]; then guest_perftest_done "$test"; else guest_perftest_done "$test" 3; fi
        iop_vmrun "$GUEST_H" 'cat /tmp/srv.log' 10 >"$theirs" 2>&1
    else
        "$bin" --port-conf "$conf" --file-prefix "$RUN_ID" --timeout "$IOP_STALL" $args $dv >"$ours" 2>&1 &
        pid=$!
        track_pid "$pid"
        for _ in $(seq 100); do our_listening && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
        iop_vmrun "$GUEST_H" "ib_$test -d rxe0 -x 1 $args $HOST_MGMT; echo rc=\$?" "$limit" >"$theirs" 2>&1
        wait_pid "$pid" "$IOP_STALL" || orc=$?
        # perftest has no timeout of its own: a client still running past the limit is stopped.
        grep -q '^rc=' "$theirs" || guest_perftest_done "$test" 3
    fi
    prc=$(grep -o '^rc=[0-9]*' "$theirs" | tail -n 1)
    prc=${prc#rc=}
    # perftest 4.5's passive side of read_lat and atomic_lat prints no result table (seen in the smoke runs): there
    # the server's report is its exit status alone.
    local why=() our_table=1 their_table=1
    if [[ $test == read_lat || $test == atomic_lat ]]; then
        if [[ $dir == "rdp->perftest" ]]; then their_table=0; else our_table=0; fi
    fi
    [[ $orc -eq 0 ]] || why+=("rdp_$test exit $orc: $(grep -v '^\s*$' "$ours" | tail -n 1)")
    [[ $orc -ne 0 || $our_table -eq 0 || -n "$(result_line "$ours")" ]] || why+=("rdp_$test printed no result line")
    [[ "$prc" == 0 ]] || why+=("ib_$test exit ${prc:-?}: $(grep -m1 -iE 'fail|unable|error|couldn' "$theirs" || tail -n 2 "$theirs" | head -n 1)")
    [[ "$prc" != 0 || $their_table -eq 0 || -n "$(result_line "$theirs")" ]] || why+=("ib_$test printed no result line")
    if [[ -n "$loss" ]]; then
        local d=$(($(iop_loss_dropped) - dropped0))
        iop_loss off
        [[ $d -gt 0 ]] || why+=("nftables dropped no frame")
    fi
    # For diagnosis: what the guest's rxe resolved our address to (modify-to-RTR needs our MAC). Full path: the
    # guest's busybox sh runs its own applets before PATH.
    [[ ${#why[@]} -eq 0 ]] || iop_vmrun "$GUEST_H" '/usr/sbin/ip neigh show dev eth0; /usr/sbin/ip -s link show eth0' 10 >"$log.guest-net.log" 2>&1
    if [[ ${#why[@]} -eq 0 ]]; then
        row "$name" pass "$( (result_line "$ours"; result_line "$theirs") | head -n 1 | awk '{$1=$1; print}')${loss:+, $d dropped}, $((SECONDS - t)) s"
    else
        local IFS=';'
        row "$name" FAILED "${why[*]}"
    fi
}

# phase_rows MTU [with_loss]: the phase's rows as "TEST SIZE DIR [LOSS]", in run order, only those ROWS selects.
phase_rows() {
    local test size dir
    for test in "${MATRIX_TESTS[@]}"; do
        for size in "${MATRIX_SIZES[@]}"; do
            [[ $test == atomic_* && $size -ne ${MATRIX_SIZES[0]} ]] && continue
            for dir in "rdp->perftest" "perftest->rdp"; do
                row_selected "$(row_name "$test" "$size" "$dir" "$1")" && echo "$test $size $dir"
            done
        done
    done
    [[ -n "${2:-}" ]] || return 0
    for test in write_bw read_bw; do
        for dir in "rdp->perftest" "perftest->rdp"; do
            row_selected "$(row_name "$test" 65536 "$dir" "$1" 5)" && echo "$test 65536 $dir 5"
        done
    done
}

# phase MTU NETDEV_MTU [with_loss]: boot guest h at NETDEV_MTU, run the phase's selected rows at path MTU MTU, stop
# the guest. A phase with no selected row boots nothing.
phase() {
    local mtu="$1" nmtu="$2" conf="$LOG_DIR/rxe-peer-mtu$1.toml" rows r test size dir loss active bridged=0
    mapfile -t rows < <(phase_rows "$mtu" "${3:-}" | awk -v n="${REPEAT:-1}" '{ for (i = 0; i < n; i++) print }')
    [[ ${#rows[@]} -gt 0 ]] || return 0
    sed "s/^mtu = .*/mtu = $mtu/" "$PORT_CONF" >"$conf"
    sed 's/^iface = .*/iface = "vh1"/' "$conf" >"$LOG_DIR/rxe-peer-mtu$mtu-loss.toml"
    ip link set tap-h0 mtu "$nmtu"
    echo "matrix: path MTU $mtu (guest h netdev MTU $nmtu), ${#rows[@]} rows"
    if ! boot h tap-h0 10.50.1.1/24 tap-h1 10.51.0.3/24 03 "rxe_mtu=$nmtu"; then
        row "guest h boot mtu$mtu" FAILED "see $LOG_DIR/run/h.console"
        return
    fi
    active=$(iop_vmrun "$GUEST_H" 'ibv_devinfo -d rxe0' 10 | awk '/active_mtu/ {print $2; exit}')
    if [[ "$active" == "$mtu" ]]; then
        row "guest h rxe0 active_mtu mtu$mtu" pass "active_mtu $active"
    else
        row "guest h rxe0 active_mtu mtu$mtu" FAILED "active_mtu ${active:-?}, want $mtu"
    fi
    for r in "${rows[@]}"; do
        read -r test size dir loss <<<"$r"
        if [[ -z "$loss" ]]; then
            run_row "$test" "$size" "$dir" "$mtu" "$conf"
            continue
        fi
        # Loss rows: the wire goes through br-h (tap-h0 + veth vh0), our port is vh1, nftables drops on the bridge.
        if [[ $bridged -eq 0 ]]; then
            if ! iop_wire_bridged on "$nmtu" >>"$LOG_DIR/net.log" 2>&1; then
                row "loss wire br-h mtu$mtu" FAILED "bridge/veth setup: $(tail -n 1 "$LOG_DIR/net.log")"
                break
            fi
            bridged=1
            # Our address now answers from vh1's MAC: the guest's neighbour entry still names tap-h0's (rxe would
            # ACK to it, unseen, until the entry aged: the first loss row then failed with RetryExcErr).
            iop_vmrun "$GUEST_H" '/usr/sbin/ip neigh flush dev eth0' 10 >>"$LOG_DIR/net.log" 2>&1
        fi
        run_row "$test" "$size" "$dir" "$mtu" "$LOG_DIR/rxe-peer-mtu$mtu-loss.toml" "$loss"
    done
    iop_wire_bridged off
    iop_vm_stop h
    sleep 1
}

matrix() {
    phase 1024 1500 with_loss
    phase 4096 9000
}
