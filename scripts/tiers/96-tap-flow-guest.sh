# Tier 12: the exact-rule rte_flow steering path on a kernel that has what net_tap's rte_flow needs (sch_multiq,
# cls_flower, act_skbedit, act_gact): tier 11's `rdp-nic tap` runs inside a QEMU guest (TCG, 2 vCPUs, no NIC)
# booted from Debian 12's own kernel with a busybox initramfs holding the release rdp-nic, the shared libraries it
# loads, the net_tap and mempool_ring plugins, iproute2's ip and tc, and those modules (scripts/interop/guest.sh:
# iop_flow_initramfs; the guest's /init is scripts/interop/flow-guest-init.sh). The kernel and QEMU .debs come from
# the interop harness's cache (target/interop-cache, shared with tier 10; downloaded on a fresh machine).
# In the guest: `--steering rte_flow` write, then SEND, WRITE and READ with `--steering auto`, each 4 QPs x 16 x
# 64 KiB over two net_tap ports with 2 rx queues bridged by br0; the guest hands each run's output and the
# `tc -s filter show` of both taps, taken while rdp-nic holds its rules after the run (--hold), back on its second
# serial port. Checks: every byte verified (the tool's CHECK lines), net_tap CREATED the exact rules (rules=4 on
# both ports, none refused or in conflict; the kernel lists 4 flower filters UDP dst 4791 with skbedit
# queue_mapping on each tap, 2 of them to queue 1, and the rules to each queue matched at least the RoCE frames that
# queue's worker received), auto chose rte_flow, and tier 11's counter checks with 0 steering misses: worker 1 of
# each NIC received on its own rx queue, nothing dropped between workers or for an unknown QP. Then a run with a
# rule conflict and a full table (below). TCG runs ~100x slower than the host, so the guest's runs take
# `--qp-timeout 18` (1.07 s): with the default 16.8 ms, 16 x 64 KiB in flight per QP kept timing out.
TIERS+=(tier12_tap_flow_guest)

# shellcheck source=scripts/interop/guest.sh
source "$ROOT/scripts/interop/guest.sh"

# NAME ARGS: 4 QPs (2 per worker) x 16 x 64 KiB, as tier 11. Then 67 QPs x 4 x 4 KiB with at most 60 rules per
# port: QPN 0x121 (worker 0's 34th QP) and QPN 0x1010b (worker 1's 12th), each paired with the same QPN on the
# other NIC, share UDP source port 0xc644 (rxe's hash of the QPN product), so that key's rule is installed for the
# first and destroyed again when the second joins (a conflict: rte_flow_destroy on a live port); 5 keys find the table
# full; their frames land on whichever queue the kernel picks and reach their owner through forwarding.
FLOW_GUEST_RUNS=(
    "rte_flow_write --steering rte_flow --op write --qps 4 --size 65536 --iters 16"
    "auto_send --steering auto --op send --qps 4 --size 65536 --iters 16"
    "auto_write --steering auto --op write --qps 4 --size 65536 --iters 16"
    "auto_read --steering auto --op read --qps 4 --size 65536 --iters 16"
    "conflict_write --steering rte_flow --op write --qps 67 --max-rules 60 --size 4096 --iters 4"
)
FLOW_GUEST_COMMON="--depth 16 --qp-timeout 18"

# flow_guest_split OUT DIR: the guest's ttyS1 stream -> DIR/NAME.log, DIR/NAME.rc, DIR/NAME.tc-IFACE.
flow_guest_split() {
    awk -v d="$2" '
        /^@@begin / { f = d "/" $2 ".log"; printf "" >f; next }
        /^@@tc / { f = d "/" $2 ".tc-" $3; printf "" >f; next }
        /^@@end / { split($3, a, "="); print a[2] >(d "/" $2 ".rc"); split($4, s, "="); print s[2] >(d "/" $2 ".seconds"); f = ""; next }
        /^@@/ { next }
        f != "" { print >f }
    ' "$1"
}

# flow_tc_rules FILE: "RULES Q1_RULES HITS0 HITS1" from a `tc -s filter show` listing: the flower filters matching
# UDP dst 4791, how many of them set queue_mapping 1, and the frames the rules to queue 0 and to queue 1 matched.
flow_tc_rules() {
    awk '
        /^filter .* handle / { roce = 0; q = -1 }
        /^ *dst_port 4791$/ { roce = 1; rules++ }
        roce && /skbedit.*queue_mapping [0-9]+/ {
            for (i = 1; i <= NF; i++) if ($i == "queue_mapping") q = $(i + 1)
            if (q == 1) q1++
        }
        roce && /Sent [0-9]+ bytes [0-9]+ pkt/ { for (i = 1; i <= NF; i++) if ($i == "pkt") hits[q] += $(i - 1) }
        END { printf "%d %d %d %d\n", rules, q1, hits[0], hits[1] }
    ' "$1"
}

# flow_guest_conflict NAME DIR LOG: the 67-QP run: 60 rules, the conflicting key's rule gone from the kernel too,
# the table full for 5 keys, and their frames forwarded to their owners.
flow_guest_conflict() {
    local name="$1" dir="$2" log="$3" st tap rules
    for st in a b; do
        check "$name: port $st: 60 rules, 1 key in conflict (its rule destroyed), 5 keys over the limit" \
            grep -Eq "^STEERING node $st rules=60 conflicts=1 full=5 refused=0$" "$log"
    done
    for tap in 0 1; do
        read -r rules _ < <(flow_tc_rules "$dir/$name.tc-rdptap$tap" 2>/dev/null || echo "0 0 0 0")
        check "$name: rdptap$tap in the kernel: 60 flower rules UDP dst 4791 (got $rules)" test "$rules" -eq 60
    done
    tap_counters "$name" "$log" "rules+forwarding"
    CONFLICT_NOTE="conflict run: $TAP_MISSES misses forwarded"
}

tier12_tap_flow_guest() {
    tier_begin "tier 12 rte_flow steering in a Debian 6.1 guest"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    CONFLICT_NOTE=""
    local dir="$LOG_DIR/tier12" t=$SECONDS pid rc=0 run name log r st tap tc_b="" rules q1 h0 h1 r0 r1 note="" secs=""
    mkdir -p "$dir"
    if ! { iop_kernel && iop_qemu; } >"$dir/prepare.log" 2>&1; then
        fail "Debian kernel and QEMU: $(tail -n 2 "$dir/prepare.log" | tr '\n' ' ')"
        tier_end
        return
    fi
    for run in "${FLOW_GUEST_RUNS[@]}"; do echo "$run $FLOW_GUEST_COMMON"; done >"$dir/flow-runs"
    track_path "$dir/initrd.gz"
    track_path "$dir/initrd.gz.root"
    if ! iop_flow_initramfs "$dir/initrd.gz" "$ROOT/target/release/rdp-nic" "$dir/flow-runs" >"$dir/initramfs.log" 2>&1; then
        fail "guest initramfs: $(tail -n 2 "$dir/initramfs.log" | tr '\n' ' ')"
        tier_end
        return
    fi
    local prep=$((SECONDS - t))
    t=$SECONDS
    iop_flow_vm "$dir/initrd.gz" "$dir/console.log" "$dir/runs.out"
    pid=$IOP_FLOW_PID
    track_pid "$pid"
    wait_pid "$pid" 170 || rc=$?
    check "guest ran every run and powered off (QEMU exit $rc, $((SECONDS - t)) s)" \
        grep -q '^@@done' "$dir/runs.out"
    if ! grep -q '^@@guest kernel 6\.1\.' "$dir/runs.out"; then
        fail "guest did not start its runs: $(tail -c 600 "$dir/console.log" "$dir/console.log.qemu" 2>/dev/null | tr '\n' ' ')"
        cleanup_all
        tier_end
        return
    fi
    pass "guest up: $(grep -m1 '^@@guest' "$dir/runs.out" | cut -c9-)"
    check "guest setup: modules loaded and bridge up ($(grep -m1 '^@@setup' "$dir/runs.out"))" \
        bash -c "! grep -q '^@@setup' '$dir/runs.out'"
    flow_guest_split "$dir/runs.out" "$dir"

    for run in "${FLOW_GUEST_RUNS[@]}"; do
        name=${run%% *}
        log="$dir/$name.log"
        r=$(cat "$dir/$name.rc" 2>/dev/null || echo none)
        secs+=" $name $(cat "$dir/$name.seconds" 2>/dev/null) s,"
        check "$name: exit status 0 (got $r)" test "$r" = 0
        [[ -f "$log" ]] || { fail "$name: no output from the guest"; continue; }
        tool_checks "$log"
        check "$name: steering rte_flow with 2 rx queues" grep -Eq '^STEERING mode=rte_flow workers=2 rx_queues=2 ' "$log"
        if [[ $name == conflict_* ]]; then
            flow_guest_conflict "$name" "$dir" "$log"
            continue
        fi
        for st in a b; do
            check "$name: port $st: 4 exact rules created, none refused or in conflict" \
                grep -Eq "^STEERING node $st rules=4 conflicts=0 full=0 refused=0$" "$log"
        done
        # What the kernel held at the end of the run (rdp-nic --hold): net_tap's flower filters on each tap's multiq
        # qdisc and the frames each one matched. Every RoCE frame a worker took from its own queue was put there
        # by a rule to that queue (a frame left on a queue when the run ended counts as a hit only).
        for tap in 0 1; do
            st=$([[ $tap == 0 ]] && echo a || echo b)
            read -r rules q1 h0 h1 < <(flow_tc_rules "$dir/$name.tc-rdptap$tap" 2>/dev/null || echo "0 0 0 0")
            r0=$(stat_of "$log" "${st}0" rx_roce)
            r1=$(stat_of "$log" "${st}1" rx_roce)
            check "$name: rdptap$tap (port $st) in the kernel: 4 flower rules UDP dst 4791, 2 of them to queue 1 (got $rules, $q1)" \
                test "$rules" -eq 4 -a "$q1" -eq 2
            check "$name: rdptap$tap rules matched $h0 frames to queue 0, $h1 to queue 1; workers ${st}0 and ${st}1 received $r0 and $r1 RoCE frames" \
                test "$h0" -ge "$r0" -a "$h1" -ge "$r1" -a "$r1" -gt 0
            [[ $tap == 1 ]] && tc_b="$h1/$r1"
        done
        tap_counters "$name" "$log" rte_flow
        if [[ $name == rte_flow_write ]]; then
            note="rte_flow write: $(grep -Eo 'avg_mib_s=[0-9.]+' "$log"), $TAP_MISSES misses, port b queue 1: rules matched / worker b1 received $tc_b RoCE frames"
        fi
    done
    cleanup_all
    TIER_NOTE="($note; $CONFLICT_NOTE; guest kernel $(cat "$IOP_CACHE/KV"); prepare $prep s, runs:${secs%,})"
    tier_end
}
