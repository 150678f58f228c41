# Tier 2: one process, no hugepages: two net_ring ports cross-connected (rte_eth_from_rings); 64 B, 1 KiB and 4 KiB
# frames both ways, every byte checked; again with two queue pairs per port. The data-path worker fed hand-made
# frames (rdp-porttest worker: runts, frames in data the mbuf does not own alone, multi-segment frames, hostile
# destination QPs, full rings, an empty mempool, a stop with frames in flight; counters and the mempool checked after
# each). Plus bad input: a wrong EAL argument and a vdev that does not exist.
TIERS+=(tier2_ring)

tier2_ring() {
    tier_begin "tier 2 net_ring"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    local p="${RUN_ID}t2" log="$LOG_DIR/tier2-ring.log" rc=0
    track_prefix "$p"
    timeout 120 "$PORTTEST" ring --file-prefix "$p" --mem 256 >"$log" 2>&1 || rc=$?
    check "ring pair: exit status 0 (got $rc)" test "$rc" -eq 0
    tool_checks "$log"
    local left
    left=$(prefix_leftovers "$p")
    check "ring pair: nothing left behind${left:+ ($left)}" test -z "$left"

    # Two queue pairs per port, one flow each (Port::configure with N queues, bursts on queue 1).
    local pq="${RUN_ID}t2q" qlog="$LOG_DIR/tier2-ring-2-queues.log"
    rc=0
    track_prefix "$pq"
    timeout 120 "$PORTTEST" ring --queues 2 --file-prefix "$pq" --mem 256 >"$qlog" 2>&1 || rc=$?
    check "ring pair, 2 queues: exit status 0 (got $rc)" test "$rc" -eq 0
    tool_checks "$qlog"

    # The worker on a net_ring port whose rings the harness owns (session 11's audit of the data path).
    local pw="${RUN_ID}t2w" wlog="$LOG_DIR/tier2-worker.log"
    rc=0
    track_prefix "$pw"
    timeout 120 "$PORTTEST" worker --file-prefix "$pw" >"$wlog" 2>&1 || rc=$?
    check "worker harness: exit status 0 (got $rc)" test "$rc" -eq 0
    tool_checks "$wlog"
    left=$(prefix_leftovers "$pw")
    check "worker harness: nothing left behind${left:+ ($left)}" test -z "$left"

    expect_setup_error "wrong EAL argument" "${p}e" "rte_eal_init failed: Invalid argument" -- \
        "$PORTTEST" ring --file-prefix "${p}e" --eal=--no-such-eal-option
    expect_setup_error "vdev that does not exist" "${p}v" "rte_eal_init failed: .*net_nosuchdriver0" -- \
        "$PORTTEST" ring --file-prefix "${p}v" --eal=--vdev=net_nosuchdriver0
    TIER_NOTE="($(grep -m1 '^RESULT ring a' "$log" | grep -Eo 'rx [0-9]+ frames' | head -1) each way, 64/1024/4096 B; 1 and 2 queues)"
    tier_end
}
