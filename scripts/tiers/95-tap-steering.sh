# Tier 11: hardware steering on a PMD with several rx queues: `rdp-nic tap`, two soft NICs in one process on two
# net_tap ports (2 rx + 2 tx queues each, one worker per queue pair) whose interfaces join a Linux bridge in a
# network namespace this tier creates. First `--steering rte_flow` alone: either the PMD installs the exact per-QP
# rules (peer IP + UDP source port -> the owner's rx queue; cls_flower + act_skbedit on the tap's multiq qdisc) and
# the run passes with 0 steering misses, or it refuses and rdp-nic stops with one line carrying the PMD's error
# text (this VM's kernel has neither sch_multiq nor cls_flower: `rte_flow_create failed: File exists (overlapping
# rules or Kernel too old for flower support)`); the tier says which. Then SEND, WRITE and READ with `--steering
# auto` (rte_flow, or rss where rte_flow was refused: the tap spreads frames over its queues by the kernel's flow
# hash), every byte verified, and from the per-worker counters: worker 1 of each NIC received frames on its own rx
# queue, nothing was dropped between workers, every frame a worker forwarded reached its owner, and with rte_flow
# no frame needed forwarding. Bad steering arguments: one line, exit 2. Where this VM refuses the rules, tier 12
# (96-tap-flow-guest.sh) runs the rte_flow path in a guest whose kernel has the modules.
TIERS+=(tier11_tap_steering)

NIC="${NIC:-$ROOT/target/release/rdp-nic}"

# stat_of LOG WORKER FIELD: a counter from a "STATS worker WORKER: ... FIELD=N ..." line (0 if missing).
stat_of() {
    grep -E "^STATS worker $2: " "$1" | grep -Eo "(^| )$3=[0-9]+" | head -1 | cut -d= -f2 | grep . || echo 0
}

# tap_run NAME LOG ARGS...: one rdp-nic tap run in the tier's namespace; its exit status.
tap_run() {
    local name="$1" log="$2" rc=0 p="${RUN_ID}tp$((TIER_PASS + TIER_FAIL))"
    shift 2
    track_prefix "$p"
    timeout 120 ip netns exec "$TAP_NS" "$NIC" tap --bridge br0 --workers 2 --qps 4 --depth 16 --file-prefix "$p" \
        --timeout 90 --stats "$@" >"$log" 2>&1 || rc=$?
    local left
    left=$(prefix_leftovers "$p")
    check "$name: nothing left behind${left:+ ($left)}" test -z "$left"
    return "$rc"
}

# tap_counters NAME LOG MODE: what the per-worker counters must show for steering MODE: rte_flow (an exact rule for
# every QP: no misses), or rss or anything else (frames may land on the wrong queue: misses forwarded).
tap_counters() {
    local name="$1" log="$2" mode="$3" node w own misses fwd_in=0 fwd_out=0 drops=0 unknown=0 allmiss=0
    for node in a b; do
        own=$(($(stat_of "$log" "${node}1" rx_frames) - $(stat_of "$log" "${node}1" rx_from_ring)))
        check "$name: worker ${node}1 received $own frames on its own rx queue (queue 1)" test "$own" -gt 0
        for w in 0 1; do
            fwd_in=$((fwd_in + $(stat_of "$log" "$node$w" rx_from_ring)))
            fwd_out=$((fwd_out + $(stat_of "$log" "$node$w" dispatched)))
            drops=$((drops + $(stat_of "$log" "$node$w" dispatch_drops)))
            unknown=$((unknown + $(stat_of "$log" "$node$w" rx_unknown_qp)))
            misses=$(stat_of "$log" "$node$w" steering_misses)
            allmiss=$((allmiss + misses))
        done
    done
    check "$name: no frame dropped between workers, none for an unknown QP (drops $drops, unknown $unknown)" \
        test "$drops" -eq 0 -a "$unknown" -eq 0
    check "$name: every forwarded frame reached its owner ($fwd_out forwarded, $fwd_in received)" \
        test "$fwd_out" -eq "$fwd_in"
    if [[ $mode == rte_flow ]]; then
        check "$name: exact rules: 0 steering misses (got $allmiss)" test "$allmiss" -eq 0
    else
        check "$name: $mode: steering misses counted and forwarded ($allmiss misses <= $fwd_out forwarded)" \
            test "$allmiss" -le "$fwd_out"
    fi
    TAP_MISSES="$allmiss"
}

tier11_tap_steering() {
    tier_begin "tier 11 steering over net_tap"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    TAP_NS="${RUN_ID}st"
    local ok=1 log rc mode why op note=""
    track_netns "$TAP_NS"
    ip netns add "$TAP_NS" &&
        ip netns exec "$TAP_NS" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6 &&
            echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6' &&
        ip -n "$TAP_NS" link set lo up &&
        ip -n "$TAP_NS" link add br0 type bridge forward_delay 0 stp_state 0 &&
        ip -n "$TAP_NS" link set br0 up || ok=0
    check "a namespace with a bridge for the two tap interfaces" test "$ok" -eq 1
    if [[ $ok -ne 1 ]]; then tier_end; return; fi

    # rte_flow on its own: really installed (then it must steer exactly), or refused with the PMD's words.
    log="$LOG_DIR/tier11-rte-flow.log"
    rc=0
    tap_run "rte_flow write" "$log" --steering rte_flow --op write --size 65536 --iters 16 || rc=$?
    if [[ $rc -eq 0 ]]; then
        mode=rte_flow
        tool_checks "$log"
        check "rte_flow write: one exact rule per QP on each port" grep -Eq '^STEERING node b rules=4 ' "$log"
        tap_counters "rte_flow write" "$log" rte_flow
        note="rte_flow: exact per-QP rules installed, $TAP_MISSES misses"
    else
        mode=rss
        why=$(grep -m1 '^rdp-nic: ' "$log")
        check "rte_flow refused: exit status 2 (got $rc)" test "$rc" -eq 2
        check "rte_flow refused: one line with the PMD's error ($why)" \
            grep -Eq '^rdp-nic: --steering rte_flow: net_tap0 \(a\) refused a RoCE rule: rte_flow_(validate|create) failed: ' "$log"
        note="rte_flow refused by net_tap here: ${why#*refused a RoCE rule: }; rss used"
    fi

    for op in send write read; do
        log="$LOG_DIR/tier11-auto-$op.log"
        rc=0
        tap_run "auto $op" "$log" --steering auto --op "$op" --size 65536 --iters 16 || rc=$?
        check "auto $op: exit status 0 (got $rc)" test "$rc" -eq 0
        tool_checks "$log"
        check "auto $op: steering $mode with 2 rx queues printed at start" \
            grep -Eq "^STEERING mode=$mode workers=2 rx_queues=2 " "$log"
        if [[ $mode == rss ]]; then
            check "auto $op: the fallback names the PMD's refusal" \
                grep -Eq '^STEERING auto: rss \(rte_flow unavailable: .*rte_flow_(validate|create) failed: ' "$log"
        fi
        tap_counters "auto $op" "$log" "$mode"
    done
    note+=", write: $(grep -h '^RESULT' "$LOG_DIR/tier11-auto-write.log" | grep -Eo 'avg_mib_s=[0-9.]+'), $TAP_MISSES misses (read)"

    expect_nic_error "tap --steering software" "net_tap needs as many rx queues as tx queues" -- \
        ip netns exec "$TAP_NS" "$NIC" tap --bridge br0 --workers 2 --qps 2 --steering software
    expect_nic_error "ring --steering rss" "net_ring ports have one rx queue and no rte_flow" -- \
        "$NIC" ring --workers 2 --qps 2 --steering rss
    expect_nic_error "unknown steering" "expected \"software\", \"rte_flow\", \"rss\" or \"auto\"" -- \
        "$NIC" tap --bridge br0 --steering hw
    expect_nic_error "server --hold" "--hold needs the ring or tap mode" -- \
        "$NIC" server --profile "$ROOT/conf/memif-server.toml" --hold
    expect_nic_error "tap above path MTU 1024" "tap mode carries frames up to 1500 bytes" -- \
        ip netns exec "$TAP_NS" "$NIC" tap --bridge br0 --mtu 4096
    cleanup_all
    check "namespace removed" bash -c "! ip netns list | grep -q '^$TAP_NS'"
    TIER_NOTE="($note)"
    tier_end
}
