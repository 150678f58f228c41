# The interop matrix against guest h (sourced by scripts/interop-rxe.sh inside its namespace; uses its row, boot,
# result_line, LOG_DIR, RDP_BIN_DIR, PORT_CONF, GUEST_H, HOST_MGMT).
#
# Row name: "<test> <who is the client>-><server> <size>[ <mode>] mtu<N>[ loss5%]", mode one of -b
# (bidirectional), -D3 (3 s timed, -f 1) or -a in place of the size (every size 2 B .. 8 MiB). Our side is
# target/release/rdp_<test> with --port-conf (a copy of conf/rxe-peer.toml with the phase's path MTU); perftest
# runs in guest h with -d rxe0 -x 1 and exchanges over the management bridge (guest 10.51.0.3, host 10.51.0.254,
# TCP 18515). A row passes when both sides exit 0 and print their table: every size's row (-a), with a BW average
# and message rate (or t_min and t_avg) above 0, except where perftest prints none (see table_rows_expected); our
# side runs without --data_validation: it checks our own payload pattern, which perftest does not write.
# IOP_PCAP=1 also captures each row next to its logs (dumpcap, one pcapng): the exchange (TCP 18515 on br-mgmt)
# and the RoCE wire's ARP and the first 160 bytes of each RoCEv2 frame (tap-h0).

MATRIX_TESTS=(send_bw write_bw read_bw atomic_bw send_lat write_lat read_lat atomic_lat)
MATRIX_SIZES=(64 4096 65536)
# The exchange variants at path MTU 1024, after the plain rows: "TEST MODE" (modes: row_args).
MATRIX_MODES=("write_bw -a" "send_bw -a" "send_lat -a" "write_bw -b" "send_bw -b" "read_bw -b" "write_bw -D3"
    "send_bw -D3")
# REPEAT=N runs every selected row N times in a row (for flaky rows; logs numbered).
ROW_SEQ=0
# Our tools give up after this many seconds without progress (--timeout); also how long a server may linger.
IOP_STALL=30

# row_args TEST SIZE [MODE]: perftest arguments of one row. Modes: -a (every size, perftest's least -n: 5
# iterations of each of 2 B .. 8 MiB, ~80 MiB each way), -b (both sides send), -D3 (3 s, 1 s margins).
# -a and -b also set the local ACK timeout to 537 ms (-u 17; perftest's default 14 is 67 ms): sending and
# receiving at once, or receiving MiB-sized SENDs, the single TCG vCPU of the guest answered our requests up to
# 0.9 s late (captured), so 67 ms timeouts went back N again and again (the guest ACKed thousands of duplicates)
# until the 7 retries ran out: RETRY_EXC_ERR, as the IBA says; Linux rxe retries retry_cnt 7 forever.
row_args() {
    local n=200
    [[ $1 == *_bw && $2 -lt 65536 ]] && n=1000
    case "${3:-}" in
        -a) echo "-a -n 5 -u 17"; return ;;
        -b) echo "-s $2 -n $n -b -u 17"; return ;;
        -D3) echo "-s $2 -D 3 -f 1"; return ;;
    esac
    if [[ $1 == atomic_* ]]; then echo "-n $n"; else echo "-s $2 -n $n"; fi
}

# table_rows FILE: the rows of the (first) result table perftest's way: the numeric lines after "#bytes".
table_rows() { awk '/#bytes/ { on = 1; next } on && /^ *[0-9]/ { print; next } on { exit }' "$1"; }

# table_rows_expected TEST DIR MODE SIDE: the sizes SIDE ("rdp" or "perftest") must print a row for, one per line,
# or nothing when that side prints no table: perftest 4.5's passive side of read_lat/atomic_lat prints none; the
# passive write/read/atomic BW server prints one row, the client's last (-a: 8 MiB).
table_rows_expected() {
    local test="$1" dir="$2" mode="$3" side="$4" size="$5" server=0 i
    [[ $dir == "rdp->perftest" && $side == perftest || $dir == "perftest->rdp" && $side == rdp ]] && server=1
    if [[ $server -eq 1 && ($test == read_lat || $test == atomic_lat) ]]; then return; fi
    if [[ $mode != -a ]]; then echo "$size"; return; fi
    if [[ $server -eq 1 && $test =~ ^(write|read|atomic)_bw$ ]]; then echo 8388608; return; fi
    for i in $(seq 1 23); do echo $((1 << i)); done
}

# table_check FILE TEST SIZES: why FILE's table is not the expected one (nothing when it is): one row per size in
# SIZES (newline-separated, in order), each with iterations, and a BW average or a message rate above 0 (both
# are printed rounded: 5 x 2 B rounds to 0.00 MiB/s, 8 MiB at 2 MiB/s to 0.000000 Mpps); latency rows with
# t_min and t_avg above 0.
table_check() {
    local file="$1" test="$2" want="$3" got
    got=$(table_rows "$file")
    [[ -n "$want" ]] || return 0
    if [[ -z "$got" ]]; then echo "printed no result line"; return; fi
    if [[ "$(awk '{print $1}' <<<"$got")" != "$want" ]]; then
        echo "table sizes $(awk '{print $1}' <<<"$got" | tr '\n' ' ')want $(tr '\n' ' ' <<<"$want")"
        return
    fi
    if [[ $test == *_bw ]]; then
        awk '!($2 > 0 && ($4 > 0 || $5 > 0)) { printf "row with no iterations, BW or message rate: %s", $0; exit }' <<<"$got"
    else
        awk '!($3 > 0 && $6 > 0) { printf "row with no t_min or t_avg: %s", $0; exit }' <<<"$got"
    fi
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

# row_name TEST SIZE DIR MTU [LOSS [MODE]]: a row's name (atomics: 8 B, perftest's fixed size; -a in place of the
# size).
row_name() {
    local size="$2" mode="${6:-}"
    [[ $1 == atomic_* ]] && size=8
    case "$mode" in
        -a) size=-a ;;
        ?*) size="$size $mode" ;;
    esac
    echo "$1 $3 $size mtu$4${5:+ loss$5%}"
}

# row_selected NAME: the row is in ROWS (all rows when ROWS is empty).
row_selected() { [[ -z "${ROWS:-}" || $1 =~ $ROWS ]]; }

# run_row TEST SIZE DIR MTU CONF [LOSS [MODE]]: one matrix row. DIR is "rdp->perftest" (our client) or
# "perftest->rdp"; MODE as in row_args.
run_row() {
    local test="$1" size="$2" dir="$3" mtu="$4" conf="$5" loss="${6:-}" mode="${7:-}" bin args dv name log t=$SECONDS
    local ours theirs orc=0 prc pid dropped0 limit cap=""
    bin="$RDP_BIN_DIR/rdp_$test"
    [[ $test == atomic_* ]] && size=8
    name=$(row_name "$test" "$size" "$dir" "$mtu" "$loss" "$mode")
    row_selected "$name" || return
    if [[ ! -x "$bin" ]]; then
        row "$name" FAILED "${bin#"$ROOT"/} not built"
        return
    fi
    args=$(row_args "$test" "$size" "$mode")
    # A row's time limit: perftest runs have no timeout of their own; a stuck row must not hold the matrix.
    limit=90
    [[ -n "$loss" || $mode == -a ]] && limit=240
    dv=""
    # Our --data_validation checks our own payload pattern, which only an rdp_* peer writes; perftest 4.5 has no
    # data validation, so against it the check does not apply (a row passes when both sides finish and report).
    [[ $test != atomic_* && -n "${RDP_BOTH:-}" ]] && dv="--data_validation"
    log="$LOG_DIR/row-${test}-${dir/->/-}-${name#* * }"
    log="${log// /-}"
    log="${log//%/}${REPEAT:+-$((++ROW_SEQ))}"
    ours="$log.rdp.log"
    track_prefix "$RUN_ID"
    theirs="$log.perftest.log"
    if [[ -n "$loss" ]] && ! iop_loss "$loss" >>"$LOG_DIR/nft.log" 2>&1; then
        row "$name" FAILED "nftables loss rules did not load: $(tail -n 1 "$LOG_DIR/nft.log")"
        return
    fi
    dropped0=$(iop_loss_dropped)
    if [[ -n "${IOP_PCAP:-}" ]]; then
        dumpcap -q -i br-mgmt -f 'tcp port 18515' -i tap-h0 -s 160 -f 'udp port 4791 or arp' \
            -w "$log.pcapng" >"$log.dumpcap.log" 2>&1 &
        cap=$!
        track_pid "$cap"
        sleep 1
    fi
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
    if [[ -n "$cap" ]]; then
        sleep 0.5
        kill -INT "$cap" 2>/dev/null
        wait "$cap" 2>/dev/null
    fi
    prc=$(grep -o '^rc=[0-9]*' "$theirs" | tail -n 1)
    prc=${prc#rc=}
    local why=() bad
    [[ $orc -eq 0 ]] || why+=("rdp_$test exit $orc: $(grep -v '^\s*$' "$ours" | tail -n 1)")
    if [[ $orc -eq 0 ]]; then
        bad=$(table_check "$ours" "$test" "$(table_rows_expected "$test" "$dir" "$mode" rdp "$size")")
        [[ -z "$bad" ]] || why+=("rdp_$test $bad")
    fi
    [[ "$prc" == 0 ]] || why+=("ib_$test exit ${prc:-?}: $(grep -m1 -iE 'fail|unable|error|couldn' "$theirs" || tail -n 2 "$theirs" | head -n 1)")
    if [[ "$prc" == 0 ]]; then
        bad=$(table_check "$theirs" "$test" "$(table_rows_expected "$test" "$dir" "$mode" perftest "$size")")
        [[ -z "$bad" ]] || why+=("ib_$test $bad")
    fi
    if [[ -n "$loss" ]]; then
        local d=$(($(iop_loss_dropped) - dropped0))
        iop_loss off
        [[ $d -gt 0 ]] || why+=("nftables dropped no frame")
    fi
    # For diagnosis: what the guest's rxe resolved our address to (modify-to-RTR needs our MAC). Full path: the
    # guest's busybox sh runs its own applets before PATH.
    [[ ${#why[@]} -eq 0 ]] || iop_vmrun "$GUEST_H" '/usr/sbin/ip neigh show dev eth0; /usr/sbin/ip -s link show eth0' 10 >"$log.guest-net.log" 2>&1
    if [[ ${#why[@]} -eq 0 ]]; then
        local shown
        # The row both printed (the first side's; -a: its last size and how many sizes).
        shown=$( (table_rows "$ours" | sed 's/^/o /'; table_rows "$theirs" | sed 's/^/p /') |
            awk '$1 != first && NR > 1 { exit } { first = $1; n++; $1 = ""; last = $0 } END { sub(/^ +/, "", last); gsub(/[ \t]+/, " ", last); print last (n > 1 ? " (" n " sizes)" : "") }')
        row "$name" pass "$shown${loss:+, $d dropped}, $((SECONDS - t)) s${ROW_RETRY:+, run twice: the perftest clock calibration failed the first time}"
    elif [[ -z "${ROW_RETRY:-}" ]] && grep -q '^Correlation coefficient r^2' "$theirs"; then
        # perftest's own clock calibration (get_cpu_mhz: r^2 of cycles against time below 0.9, then "Can't produce
        # a report" and exit 1) fails now and then in the TCG guest: perftest's measurement, not the interop. Such a
        # row runs once more (the first run's logs kept as *.first) and says so when it passes.
        mv "$theirs" "$theirs.first"
        mv "$ours" "$ours.first"
        ROW_RETRY=1 run_row "$@"
    else
        local IFS=';'
        row "$name" FAILED "${why[*]}"
    fi
}

# phase_rows MTU [with_extras]: the phase's rows as "TEST SIZE DIR LOSS MODE" ("-" for none), in run order, only
# those ROWS selects. with_extras: also the MATRIX_MODES rows (4 KiB) and the loss rows.
phase_rows() {
    local test size dir mode
    for test in "${MATRIX_TESTS[@]}"; do
        for size in "${MATRIX_SIZES[@]}"; do
            [[ $test == atomic_* && $size -ne ${MATRIX_SIZES[0]} ]] && continue
            for dir in "rdp->perftest" "perftest->rdp"; do
                row_selected "$(row_name "$test" "$size" "$dir" "$1")" && echo "$test $size $dir - -"
            done
        done
    done
    [[ -n "${2:-}" ]] || return 0
    for test in "${MATRIX_MODES[@]}"; do
        read -r test mode <<<"$test"
        for dir in "rdp->perftest" "perftest->rdp"; do
            row_selected "$(row_name "$test" 4096 "$dir" "$1" "" "$mode")" && echo "$test 4096 $dir - $mode"
        done
    done
    for test in write_bw read_bw; do
        for dir in "rdp->perftest" "perftest->rdp"; do
            row_selected "$(row_name "$test" 65536 "$dir" "$1" 5)" && echo "$test 65536 $dir 5 -"
        done
    done
}

# phase MTU NETDEV_MTU [with_extras]: boot guest h at NETDEV_MTU, run the phase's selected rows at path MTU MTU, stop
# the guest. A phase with no selected row boots nothing.
phase() {
    local mtu="$1" nmtu="$2" conf="$LOG_DIR/rxe-peer-mtu$1.toml" rows r test size dir loss mode active bridged=0
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
        read -r test size dir loss mode <<<"$r"
        [[ $loss == - ]] && loss=""
        [[ $mode == - ]] && mode=""
        if [[ -z "$loss" ]]; then
            run_row "$test" "$size" "$dir" "$mtu" "$conf" "" "$mode"
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
    phase 1024 1500 with_extras
    phase 4096 9000
}
