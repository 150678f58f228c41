# Tier 5: the RoCE engine on the DPDK data path in one process: two soft NICs (rdp-nic ring) on two net_ring ports
# cross-connected by rte_rings, one worker thread each on its own core, peers resolved with ARP. SEND, WRITE, READ
# and atomics at path MTU 1024 and 4096 with every byte verified; 1% and 5% loss injected in the data path; RoCE over
# IPv6 with neighbour discovery; two workers per NIC behind the software dispatcher; the mempool holds as many mbufs
# after each run as before (rdp-nic's own CHECK lines); confined to one CPU, the run stops at once with one line;
# SIGTERM mid-run: exit 130, one line, nothing left behind.
# Bad input: bad profiles and arguments give one line and exit 2 without touching DPDK.
TIERS+=(tier5_engine_ring)

NIC="${NIC:-$ROOT/target/release/rdp-nic}"

# expect_nic_error DESC PATTERN -- CMD...: CMD exits 2 with exactly one stderr line "rdp-nic: ...PATTERN...".
expect_nic_error() {
    local desc="$1" pattern="$2" err rc=0
    shift 3
    err="$LOG_DIR/nic-error-$((TIER_PASS + TIER_FAIL)).err"
    timeout 60 "$@" >/dev/null 2>"$err" || rc=$?
    check "$desc: exit status 2 (got $rc)" test "$rc" -eq 2
    if [[ $(wc -l <"$err") -eq 1 ]] && grep -Eq "^rdp-nic: .*$pattern" "$err"; then
        pass "$desc: one line"
        [[ -n "${VERBOSE:-}" ]] && sed 's/^/       /' "$err"
    else
        fail "$desc: want one line matching '$pattern', got: $(head -c 600 "$err")"
    fi
}

# nic_run NAME LOG CMD...: run one rdp-nic process, require exit 0, count its CHECK lines.
nic_run() {
    local name="$1" log="$2" rc=0
    shift 2
    timeout 120 "$@" >"$log" 2>&1 || rc=$?
    check "$name: exit status 0 (got $rc)" test "$rc" -eq 0
    tool_checks "$log"
}

# ring_on_one_cpu: rdp-nic ring pins its node threads to cores 0 and 1; confined to CPU 0 by a cpuset cgroup (v1 or
# v2, created here and removed after), the thread for core 1 cannot pin itself. The run must end at once with one
# line naming that, exit 2 (session 11: the other threads waited at the start barrier for ever, past --timeout).
ring_on_one_cpu() {
    local cg="" tasks p="${RUN_ID}t5c" err="$LOG_DIR/tier5-one-cpu.err" rc=0 t0
    if [[ -f /sys/fs/cgroup/cpuset/cpuset.cpus ]]; then
        cg="/sys/fs/cgroup/cpuset/rdp-${RUN_ID}"
        mkdir -p "$cg" && echo 0 >"$cg/cpuset.cpus" && cat /sys/fs/cgroup/cpuset/cpuset.mems >"$cg/cpuset.mems"
        tasks="$cg/tasks"
    elif grep -qw cpuset /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
        echo +cpuset >/sys/fs/cgroup/cgroup.subtree_control
        cg="/sys/fs/cgroup/rdp-${RUN_ID}"
        mkdir -p "$cg" && echo 0 >"$cg/cpuset.cpus"
        tasks="$cg/cgroup.procs"
    fi
    if [[ -z "$cg" || ! -w "$tasks" ]]; then
        fail "ring on one CPU: no cpuset cgroup to confine rdp-nic to CPU 0 (cgroup v1 cpuset or v2 with cpuset)"
        return
    fi
    track_prefix "$p"
    t0=$SECONDS
    timeout 60 bash -c 'echo $$ >"$1"; shift; exec "$@"' _ "$tasks" "$NIC" ring --op write --iters 10 --timeout 30 \
        --file-prefix "$p" >/dev/null 2>"$err" || rc=$?
    rmdir "$cg" 2>/dev/null
    check "ring on one CPU: exit status 2 within the --timeout (got $rc after $((SECONDS - t0)) s)" \
        test "$rc" -eq 2 -a $((SECONDS - t0)) -lt 30
    check "ring on one CPU: one line naming the core that could not be had ($(head -c 300 "$err"))" \
        grep -Eq '^rdp-nic: node 1 worker 0: pin to core 1 and register with EAL: pin thread to core failed' "$err"
    check "ring on one CPU: one line" test "$(wc -l <"$err")" -eq 1
}

# ring_interrupted: SIGTERM in the middle of a run (SIGINT too; a background job of a script ignores SIGINT, so the
# tier sends SIGTERM): rdp-nic stops polling, cleans up and says so, exit 130, its EAL runtime directory gone
# (session 11: it died at once, leaving /var/run/dpdk/PREFIX behind).
ring_interrupted() {
    local p="${RUN_ID}t5i" out="$LOG_DIR/tier5-interrupted.log" err="$LOG_DIR/tier5-interrupted.err" pid rc=0 left
    track_prefix "$p"
    "$NIC" ring --op write --size 64 --iters 100000000 --file-prefix "$p" >"$out" 2>"$err" &
    pid=$!
    track_pid "$pid"
    sleep 3
    kill -TERM "$pid" 2>/dev/null
    wait_pid "$pid" 30 || rc=$?
    check "ring interrupted by SIGTERM: exit status 130 (got $rc)" test "$rc" -eq 130
    check "ring interrupted by SIGTERM: one line says so ($(head -c 200 "$err"))" grep -qx 'rdp-nic: interrupted' "$err"
    left=$(prefix_leftovers "$p")
    check "ring interrupted by SIGTERM: its EAL runtime directory is gone${left:+ ($left)}" test -z "$left"
}

# ring_hold_interrupted: `--hold` ends on SIGTERM too, with stdin still open (session 11: the blocking read of stdin
# restarted after the signal, so only a second signal, which kills at once, or stdin's end ended the hold).
ring_hold_interrupted() {
    local p="${RUN_ID}t5h" out="$LOG_DIR/tier5-hold.log" err="$LOG_DIR/tier5-hold.err" fifo="$LOG_DIR/tier5-hold.fifo"
    local pid rc=0 i t0 hold_fd
    track_prefix "$p"
    mkfifo "$fifo"
    "$NIC" ring --op write --size 64 --iters 1000 --hold --file-prefix "$p" <"$fifo" >"$out" 2>"$err" &
    pid=$!
    track_pid "$pid"
    # The writing end stays open (no end of file) until the check is over.
    exec {hold_fd}>"$fifo"
    for i in $(seq 300); do grep -q '^HOLD' "$out" && break; sleep 0.1; done
    check "ring --hold: the run reached its hold" grep -q '^HOLD' "$out"
    t0=$SECONDS
    kill -TERM "$pid" 2>/dev/null
    wait_pid "$pid" 10 || rc=$?
    exec {hold_fd}>&-
    check "ring --hold: SIGTERM ends the hold with stdin still open (exit $rc after $((SECONDS - t0)) s; 130 wanted)" \
        test "$rc" -eq 130
    check "ring --hold: one line says so ($(head -c 200 "$err"))" grep -qx 'rdp-nic: interrupted' "$err"
}

tier5_engine_ring() {
    tier_begin "tier 5 engine over net_ring"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    local op mtu p log n=0 left
    for op in send write read atomic; do
        for mtu in 1024 4096; do
            n=$((n + 1))
            p="${RUN_ID}t5$n" log="$LOG_DIR/tier5-$op-$mtu.log"
            track_prefix "$p"
            nic_run "ring $op mtu $mtu" "$log" "$NIC" ring --op "$op" --mtu "$mtu" --size 10000 --iters 200 --qps 2 \
                --depth 16 --file-prefix "$p" --stats
            left=$(prefix_leftovers "$p")
            check "ring $op mtu $mtu: nothing left behind${left:+ ($left)}" test -z "$left"
        done
    done
    for loss in 1 5; do
        for op in write read; do
            n=$((n + 1))
            p="${RUN_ID}t5$n" log="$LOG_DIR/tier5-loss$loss-$op.log"
            track_prefix "$p"
            nic_run "ring $op with ${loss}% loss" "$log" "$NIC" ring --op "$op" --mtu 1024 --size 6000 --iters 150 \
                --qps 2 --depth 16 --inject-loss "$loss" --seed "$n" --file-prefix "$p" --stats
            check "ring $op with ${loss}% loss: frames were dropped" \
                grep -Eq 'loss_injected=[1-9]' "$log"
        done
    done
    # RoCE over IPv6, the peer resolved with neighbour discovery (NS to the solicited-node address, NA back).
    for op in write read; do
        n=$((n + 1))
        p="${RUN_ID}t5$n" log="$LOG_DIR/tier5-ipv6-$op.log"
        track_prefix "$p"
        nic_run "ring $op over IPv6" "$log" "$NIC" ring --ipv6 --op "$op" --mtu 1024 --size 10000 --iters 200 \
            --qps 2 --depth 16 --inject-loss 1 --file-prefix "$p" --stats
        check "ring $op over IPv6: an NS answered by an NA" grep -Eq '^STATS neigh a0: .*nd_adverts: 1, nd_solicits: 1' "$log"
    done

    # Two workers per soft NIC: one rx queue, worker 0 dispatches RoCE frames on the BTH destination QP to the
    # owner over an SPSC ring; each worker sends on its own tx queue (idle workers sleep: 4 threads, 2 cores).
    for op in write atomic; do
        n=$((n + 1))
        p="${RUN_ID}t5$n" log="$LOG_DIR/tier5-workers-$op.log"
        track_prefix "$p"
        nic_run "ring $op, 2 workers per NIC" "$log" "$NIC" ring --op "$op" --workers 2 --mtu 4096 --size 10000 \
            --iters 200 --qps 4 --depth 16 --inject-loss 1 --file-prefix "$p" --stats
        check "ring $op, 2 workers per NIC: frames dispatched to worker 1" grep -Eq '^STATS worker a0: .* dispatched=[1-9]' "$log"
        check "ring $op, 2 workers per NIC: worker 1 sent frames" grep -Eq '^STATS worker a1: .* tx_frames=[1-9]' "$log"
        check "ring $op, 2 workers per NIC: rte_flow refused by net_ring, software dispatcher used" \
            grep -Eq '^STEERING auto: software \(rte_flow unavailable: .* refused a RoCE rule: rte_flow_validate failed: .*\)' "$log"
        check "ring $op, 2 workers per NIC: software steering, one rx queue" \
            grep -Eq '^STEERING mode=software workers=2 rx_queues=1 ' "$log"
    done

    ring_on_one_cpu
    ring_interrupted
    ring_hold_interrupted

    local bad="$LOG_DIR/bad-profile.toml"
    printf '[port]\ndriver = "af_packet"\n[net]\nipv4 = "10.0.0.1"\nmtu = 4096\n' >"$bad"
    expect_nic_error "profile without an interface" "bad-profile.toml: port.iface: missing" -- \
        "$NIC" client --profile "$bad"
    printf '[port]\ndriver = "memif"\nrole = "client"\nsocket = "/run/x.sock"\nsokcet = 1\n[net]\nipv4 = "10.0.0.1"\nmtu = 4096\n' >"$bad"
    expect_nic_error "profile with an unknown key" "bad-profile.toml: line 5: unknown field .sokcet." -- \
        "$NIC" client --profile "$bad"
    printf '[port]\ndriver = "memif"\nrole = "client"\nsocket = "/run/x.sock"\n[net]\nipv4 = "10.0.0.1"\nmtu = 9000\n' >"$bad"
    expect_nic_error "profile with a bad MTU" "net.mtu: 9000 is not a RoCE path MTU" -- "$NIC" client --profile "$bad"
    expect_nic_error "profile that does not exist" "cannot read" -- "$NIC" server --profile "$LOG_DIR/nope.toml"
    printf '[port]\ndriver = "memif"\nrole = "client"\nsocket = "/run/x.sock"\n[net]\nipv4 = "10.0.0.1"\nmtu = 1024\n' >"$bad"
    expect_nic_error "--mtu above the profile's" "larger than the profile's path MTU 1024" -- \
        "$NIC" client --profile "$bad" --mtu 4096
    expect_nic_error "unknown operation" "invalid value 'bogus'" -- "$NIC" ring --op bogus
    TIER_NOTE="($(grep -h '^RESULT' "$LOG_DIR"/tier5-write-4096.log | grep -Eo 'avg_mib_s=[0-9.]+'), 4 ops x 2 MTUs, loss 1%/5%)"
    tier_end
}
