# Tier 9 (file 85): the appliance. roce-dpd on a loopback net_ring port (conf/daemon-ring.toml, one busy worker on
# lcore 1, no hugepages) serves client processes through the roce_dp::client library: two pairs of rdp-client
# processes at once (each client its own session, PD, buffer, CQ and QP; both QPs of a pair in the one daemon) run
# SEND, WRITE, READ, FETCH_ADD and CMP_SWP with every byte verified, while the active client of a third pair is
# killed with SIGKILL mid-transfer (its session reclaimed within 1 s; at the end the daemon's object counters are
# back to zero). The eight perftest tools with --daemon (server and client both in this daemon): tables parsed by
# column, data validated where it applies, JSON as printed; -a, -b, -D 2, --run_infinitely ended by SIGINT, -m, -t,
# --report_gbits; a client and a server killed mid-run; --daemon with --port-conf and with no daemon: one line each.
# One-line errors: daemon absent, socket permission denied (a client as user nobody on the default 0600 socket), ABI
# mismatch (both sides say so), socket in use, invalid config, [daemon] missing. SIGTERM: a client mid-transfer gets
# a clear error instead of hanging, the daemon exits 0, removes its socket and EAL runtime directory. SIGKILL to a
# second daemon mid-run of rdp_write_bw: both tools say the daemon is gone in one line and exit 2.
# Then tier85_workers (below): a daemon with two workers and inline data through the rings.
TIERS+=(tier85_daemon)

# dpd_start SOCK PREFIX LOG [CONFIG]: starts roce-dpd (conf/daemon-ring.toml by default); DPD_PID. Waits for the
# socket (10 s).
dpd_start() {
    local sock="$1" prefix="$2" log="$3" conf="${4:-${DPD_CONF:-$ROOT/conf/daemon-ring.toml}}" i
    track_prefix "$prefix"
    track_path "$sock"
    "$ROOT/target/release/roce-dpd" --config "$conf" --socket "$sock" --file-prefix "$prefix" >"$log" 2>&1 &
    DPD_PID=$!
    track_pid "$DPD_PID"
    for i in $(seq 100); do
        [[ -S $sock ]] && grep -q '^roce-dpd: serving' "$log" && return 0
        kill -0 "$DPD_PID" 2>/dev/null || return 1
        sleep 0.1
    done
    return 1
}

# one_line FILE PATTERN: FILE has exactly one line and it matches PATTERN (extended regex).
one_line() {
    [[ $(wc -l <"$1") -eq 1 ]] && grep -Eq "$2" "$1"
}

# dpd_log_fds_cloexec PID: every fd of PID on an unlinked /tmp file (tmpfile(): DPDK's captured log) has O_CLOEXEC
# (fdinfo flags, octal 02000000), and there is at least one.
dpd_log_fds_cloexec() {
    local n=0 fd l fl
    for fd in /proc/"$1"/fd/*; do
        l=$(readlink "$fd") || continue
        [[ $l == /tmp/*' (deleted)' ]] || continue
        fl=$(awk '/^flags:/ {print $2}' "/proc/$1/fdinfo/${fd##*/}") || return 1
        ((8#$fl & 8#2000000)) || return 1
        n=$((n + 1))
    done
    ((n >= 1))
}

# dpd_capture_size PID: the size in bytes of PID's captured DPDK log (the first fd on an unlinked /tmp file).
dpd_capture_size() {
    local fd l
    for fd in /proc/"$1"/fd/*; do
        l=$(readlink "$fd") || continue
        [[ $l == /tmp/*' (deleted)' ]] || continue
        stat -L -c %s "$fd"
        return
    done
    return 1
}

tier85_daemon() {
    tier_begin "tier 9 roce-dpd + client processes (net_ring loopback)"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    local client="$ROOT/target/release/rdp-client" sock="/run/roce-dpd-${RUN_ID}.sock" prefix="${RUN_ID}dpd"
    local dlog="$LOG_DIR/tier9-daemon.log" rc err
    if ! dpd_start "$sock" "$prefix" "$dlog"; then
        fail "roce-dpd starts: $(tail -n 2 "$dlog")"
        tier_end
        return
    fi
    pass "roce-dpd serves $sock"
    check "socket is owner-only (0600)" test "$(stat -c %a "$sock")" = 600
    check "roce-dpd's captured DPDK log (an unlinked /tmp file) is close-on-exec in every fd" dpd_log_fds_cloexec "$DPD_PID"
    # A second daemon pinned to the first's lcore (it backs off when idle, so the busy first keeps the core): it says
    # which process polls that core already; the first one's claim ends with it, so a later start is quiet.
    local second="$LOG_DIR/tier9-same-lcore.log" sconf="$LOG_DIR/tier9-same-lcore.toml" first=$DPD_PID
    sed 's/^idle = "busy"/idle = "sleep"/' "$ROOT/conf/daemon-ring.toml" >"$sconf"
    if dpd_start "/run/roce-dpd-${RUN_ID}s.sock" "${prefix}s" "$second" "$sconf"; then
        kill -TERM "$DPD_PID"
        wait_pid "$DPD_PID" 10
    fi
    DPD_PID=$first
    check "a second roce-dpd on the first's lcore 1 warns in one line naming the first's pid ($first)" \
        grep -q "^roce-dpd: warning: lcore 1 is also polled by pid $first (roce-dpd): " "$second"

    # Two pairs of clients at once, all four sessions in the one daemon, while a third pair's active client is
    # killed with SIGKILL mid-transfer: its session is reclaimed within a second and the others carry on.
    local oa="/run/rdp-oob-${RUN_ID}a.sock" ob="/run/rdp-oob-${RUN_ID}b.sock" ok_="/run/rdp-oob-${RUN_ID}k.sock"
    local pa pb pk qk aa=0 ab=0 ra=0 rb=0 rk=0
    track_path "$oa"
    track_path "$ob"
    track_path "$ok_"
    timeout 60 "$client" passive --daemon "$sock" --oob "$ok_" >"$LOG_DIR/tier9-k-passive.log" 2>&1 &
    pk=$!
    # Not under timeout(1): the SIGKILL must reach the client itself (cleanup_all stops it if the tier fails).
    "$client" active --daemon "$sock" --oob "$ok_" --op write --size 65536 --iters 100000000 --timeout 60 \
        >"$LOG_DIR/tier9-k-active.log" 2>&1 &
    qk=$!
    track_pid "$pk"
    track_pid "$qk"
    timeout 60 "$client" passive --daemon "$sock" --oob "$oa" >"$LOG_DIR/tier9-a-passive.log" 2>&1 &
    pa=$!
    timeout 60 "$client" passive --daemon "$sock" --oob "$ob" >"$LOG_DIR/tier9-b-passive.log" 2>&1 &
    pb=$!
    track_pid "$pa"
    track_pid "$pb"
    timeout 60 "$client" active --daemon "$sock" --oob "$oa" --op all --size 4096 --iters 200 \
        >"$LOG_DIR/tier9-a-active.log" 2>&1 &
    local qa=$!
    sleep 1
    check "kill -9: the victim was running" kill -0 "$qk"
    local ended_before t_kill
    ended_before=$(grep -c 'ended after' "$dlog")
    t_kill=$(date +%s%N)
    kill -KILL "$qk" 2>/dev/null
    wait "$qk" 2>/dev/null
    # Its passive peer loses the out-of-band socket and its own session ends too: two sessions reclaimed.
    local i reclaimed_ms=""
    for i in $(seq 100); do
        if [[ $(grep -c 'ended after' "$dlog") -ge $((ended_before + 1)) ]]; then
            reclaimed_ms=$((($(date +%s%N) - t_kill) / 1000000))
            break
        fi
        sleep 0.02
    done
    check "kill -9: the killed client's session is reclaimed within 1 s (${reclaimed_ms:-no} ms)" \
        test -n "$reclaimed_ms" -a "${reclaimed_ms:-9999}" -le 1000
    wait_pid "$pk" 10 || rk=$?
    check "kill -9: its passive peer stops with one line (exit $rk)" test "$rk" -eq 2 -a \
        "$(grep -c '^rdp-client: out-of-band' "$LOG_DIR/tier9-k-passive.log")" -eq 1
    timeout 60 "$client" active --daemon "$sock" --oob "$ob" --op all --size 10000 --iters 100 \
        >"$LOG_DIR/tier9-b-active.log" 2>&1 || ab=$?
    wait "$qa" || aa=$?
    wait_pid "$pa" 20 || ra=$?
    wait_pid "$pb" 20 || rb=$?
    check "pair a (4096 B x 200): both clients exit 0 (active $aa, passive $ra)" test "$aa" -eq 0 -a "$ra" -eq 0
    check "pair b (10000 B x 100, 3 packets each): both clients exit 0 (active $ab, passive $rb)" \
        test "$ab" -eq 0 -a "$rb" -eq 0
    rc=0
    timeout 10 "$client" open --daemon "$sock" --stats >"$LOG_DIR/tier9-stats.out" 2>&1 || rc=$?
    check "stats: every client's QPs, CQs, MRs and PDs are gone" test "$rc" -eq 0 -a -n \
        "$(grep -q '^STAT daemon 0x0 qps 0$' "$LOG_DIR/tier9-stats.out" &&
            grep -q '^STAT daemon 0x0 mrs 0$' "$LOG_DIR/tier9-stats.out" &&
            grep -q '^STAT daemon 0x0 cqs 0$' "$LOG_DIR/tier9-stats.out" &&
            grep -q '^STAT daemon 0x0 pds 0$' "$LOG_DIR/tier9-stats.out" && echo y)"
    check "stats: the port and worker counted the traffic" grep -Eq '^STAT worker 0x0 tx_frames [1-9]' \
        "$LOG_DIR/tier9-stats.out"
    local f
    for f in a-active a-passive b-active b-passive; do
        tool_checks "$LOG_DIR/tier9-$f.log"
        grep -h '^rdp-client: ' "$LOG_DIR/tier9-$f.log" | sed 's/^/    /'
    done
    for f in send write read fadd cswap; do
        check "pair a: $f verified" grep -q "^CHECK ok   $f: 200 x .* bytes verified" "$LOG_DIR/tier9-a-active.log"
    done
    check "pair a: passive received and verified 1638400 bytes (SEND + WRITE)" \
        grep -q '^CHECK ok   passive: 1638400 bytes' "$LOG_DIR/tier9-a-passive.log"

    # The eight perftest tools through the daemon (--daemon): server and client are two processes with their QPs in
    # this one roce-dpd (pf_* helpers of tier 8, 80-perftest-memif.sh, with PF_DAEMON set).
    tier9_perftest "$sock"
    tier9_events "$sock"

    err="$LOG_DIR/tier9-pf-both.err" rc=0
    timeout 10 "$ROOT/target/release/rdp_write_bw" --daemon "$sock" --port-conf "$ROOT/conf/memif-server.toml" \
        >/dev/null 2>"$err" || rc=$?
    check "rdp_write_bw --daemon with --port-conf: exit 2 (got $rc), one line" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^rdp_write_bw: --daemon SOCKET and --port-conf FILE exclude each other' && echo y)"
    err="$LOG_DIR/tier9-pf-absent.err" rc=0
    timeout 10 "$ROOT/target/release/rdp_write_bw" --daemon "/run/roce-dpd-${RUN_ID}-absent.sock" 127.0.0.1 \
        >/dev/null 2>"$err" || rc=$?
    check "rdp_write_bw --daemon, daemon absent: exit 2 (got $rc), one line" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^rdp_write_bw: no roce-dpd listening on /run/roce-dpd-.*-absent.sock: start it with' && echo y)"

    # One-line errors.
    err="$LOG_DIR/tier9-absent.err" rc=0
    timeout 10 "$client" open --daemon "/run/roce-dpd-${RUN_ID}-absent.sock" >/dev/null 2>"$err" || rc=$?
    check "daemon absent: exit 2 (got $rc), one line naming the fix" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^rdp-client: no roce-dpd listening on /run/roce-dpd-.*-absent.sock: start it with' && echo y)"
    err="$LOG_DIR/tier9-perm.err" rc=0
    timeout 10 setpriv --reuid=65534 --regid=65534 --clear-groups "$client" open --daemon "$sock" >/dev/null 2>"$err" ||
        rc=$?
    check "permission denied (user nobody, socket 0600): exit 2 (got $rc), one line" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" "^rdp-client: permission denied on $sock: " && echo y)"
    # roce-dpd not as root: /run is root's (bind said "Permission denied (os error 13)" and nothing to do).
    err="$LOG_DIR/tier9-dpd-nobody.err" rc=0
    track_prefix "${RUN_ID}nb"
    timeout 30 setpriv --reuid=65534 --regid=65534 --clear-groups "$ROOT/target/release/roce-dpd" \
        --config "$ROOT/conf/daemon-ring.toml" --socket "/run/roce-dpd-${RUN_ID}-nobody.sock" --file-prefix "${RUN_ID}nb" \
        >/dev/null 2>"$err" || rc=$?
    check "roce-dpd as user nobody, socket in /run: exit 2 (got $rc), one line saying what to change" test "$rc" -eq 2 \
        -a -n "$(one_line "$err" "^roce-dpd: cannot create the socket /run/roce-dpd-.*-nobody.sock: permission denied on its directory: run roce-dpd as root" && echo y)"
    # EAL of a user other than root keeps its runtime directory under /tmp/dpdk: nothing left there.
    rm -rf "/tmp/dpdk/${RUN_ID}nb"
    rmdir /tmp/dpdk 2>/dev/null || true
    err="$LOG_DIR/tier9-abi.err" rc=0
    timeout 10 "$client" open --daemon "$sock" --abi-version 99 >/dev/null 2>"$err" || rc=$?
    check "ABI mismatch: exit 2 (got $rc), one line naming both versions" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^rdp-client: shared-memory ABI mismatch: roce-dpd speaks v3, .* library v99' && echo y)"
    check "ABI mismatch: the daemon logs one line too" \
        test "$(grep -c 'refused: shared-memory ABI mismatch.*v99' "$dlog")" -eq 1
    rc=0
    timeout 10 "$client" open --daemon "$sock" >"$LOG_DIR/tier9-open.out" 2>&1 || rc=$?
    check "open: exit 0 (got $rc), ABI and GID shown" grep -q 'ABI v3 mtu 4096 .* gid ::ffff:10.0.0.1' \
        "$LOG_DIR/tier9-open.out"
    err="$LOG_DIR/tier9-inuse.err" rc=0
    track_prefix "${prefix}2"
    timeout 20 "$ROOT/target/release/roce-dpd" --config "$ROOT/conf/daemon-ring.toml" --socket "$sock" \
        --file-prefix "${prefix}2" >/dev/null 2>"$err" || rc=$?
    check "second daemon on the socket: exit 2 (got $rc), one line" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" "^roce-dpd: socket $sock is in use by a running daemon" && echo y)"
    rc=0
    timeout 10 "$client" open --daemon "$sock" >/dev/null 2>&1 || rc=$?
    check "second daemon: the first still serves (open exit $rc)" test "$rc" -eq 0
    local bad="$LOG_DIR/tier9-bad.toml"
    sed 's/^socket_mode = 0o600/socket_mode = 0o400/' "$ROOT/conf/daemon-ring.toml" >"$bad"
    err="$LOG_DIR/tier9-badconf.err" rc=0
    timeout 10 "$ROOT/target/release/roce-dpd" --config "$bad" >/dev/null 2>"$err" || rc=$?
    check "invalid config: exit 2 (got $rc), one line naming the key" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^roce-dpd: .*tier9-bad.toml: daemon.socket_mode: ' && echo y)"
    err="$LOG_DIR/tier9-nodaemon.err" rc=0
    timeout 10 "$ROOT/target/release/roce-dpd" --config "$ROOT/conf/net-ring.toml" >/dev/null 2>"$err" || rc=$?
    check "config without [daemon]: exit 2 (got $rc), one line" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^roce-dpd: .*net-ring.toml: \[daemon\] section missing' && echo y)"

    # SIGTERM while a pair is mid-transfer: the clients fail with one line within seconds, the daemon exits 0 and
    # leaves nothing behind.
    local oc="/run/rdp-oob-${RUN_ID}c.sock" pc qc rp=0 rq=0 rd=0 t0
    track_path "$oc"
    timeout 60 "$client" passive --daemon "$sock" --oob "$oc" >"$LOG_DIR/tier9-c-passive.log" 2>&1 &
    pc=$!
    timeout 60 "$client" active --daemon "$sock" --oob "$oc" --op write --size 4096 --iters 100000000 \
        >"$LOG_DIR/tier9-c-active.log" 2>&1 &
    qc=$!
    track_pid "$pc"
    track_pid "$qc"
    sleep 2
    check "SIGTERM: the pair was running" kill -0 "$qc"
    t0=$SECONDS
    kill -TERM "$DPD_PID"
    wait_pid "$DPD_PID" 15 || rd=$?
    wait_pid "$qc" 10 || rq=$?
    wait_pid "$pc" 10 || rp=$?
    check "SIGTERM: roce-dpd exits 0 (got $rd) within 5 s ($((SECONDS - t0)) s)" test "$rd" -eq 0 -a $((SECONDS - t0)) -le 5
    check "SIGTERM: the active client stops with exit 2 (got $rq) and one line saying the daemon is gone" \
        test "$rq" -eq 2 -a "$(grep -c '^rdp-client: roce-dpd on .* is gone (it is shutting down: roce-dpd stopped by SIGTERM)' \
        "$LOG_DIR/tier9-c-active.log")" -eq 1
    [[ -n "${VERBOSE:-}" ]] && grep -h '^rdp-client: ' "$LOG_DIR/tier9-c-active.log" | sed 's/^/       /' | head -n 1
    check "SIGTERM: every session reclaimed, nothing left" grep -q '^roce-dpd: stopped; .* 0 QPs 0 CQs 0 MRs 0 PDs left' "$dlog"
    check "SIGTERM: socket removed" test ! -e "$sock"
    check "SIGTERM: EAL runtime directory removed" test ! -e "/var/run/dpdk/$prefix"

    # roce-dpd killed with SIGKILL mid-run: both tools say the daemon is gone in one line and exit 2, no hang.
    tier9_daemon_killed "/run/roce-dpd-${RUN_ID}k.sock" "${prefix}k"
    tier85_link "$prefix"

    TIER85_WORKERS_NOTE=""
    tier85_workers
    tier85_hugetlb
    TIER_NOTE="(4 clients at once, every byte verified; session of a SIGKILLed client reclaimed in ${reclaimed_ms:-?} ms; the 8 perftest tools: write_bw 65536 B ${T9_AVG:-?} MiB/s; ${T9_EV_NOTE:-events: failed}; ${TIER85_WORKERS_NOTE:-2 workers: failed}; hugetlbfs backing)"
    tier_end
}

# ---- Two workers and inline data (conf/daemon-ring-2w.toml: worker 0 on lcore 1 receives and dispatches, worker 1
# on lcore 0; both sleep when idle, so two workers and the clients share the 2 cores without two busy-pollers on one).
# QPs go to the worker with the fewest QPs (lowest index on a tie), so the order in which clients create their QPs
# decides where each lands; the checks read where they landed from roce-stat --json.

# dpd2_stat SOCK SCOPE ID NAME: one counter of the daemon (rdp-client open --stats), empty if absent.
dpd2_stat() {
    timeout 10 "$ROOT/target/release/rdp-client" open --daemon "$1" --stats 2>/dev/null |
        awk -v k="STAT $2 $(printf '0x%x' "$3") $4" 'index($0, k " ") == 1 { print $NF }'
}

# dpd2_wait_qps SOCK N: wait (10 s) until the daemon has N QPs.
dpd2_wait_qps() {
    local i
    for i in $(seq 100); do
        [[ $(dpd2_stat "$1" daemon 0 qps) == "$2" ]] && return 0
        sleep 0.1
    done
    return 1
}

# dpd2_qps SOCK: "QPN CLIENT WORKER" per QP, from roce-stat --json.
dpd2_qps() {
    timeout 10 "$ROOT/target/release/roce-stat" --socket "$1" --json |
        grep -o '"scope":"qp","id":[0-9]*,"counters":{"client":[0-9]*,"worker":[0-9]*' |
        sed -E 's/.*"id":([0-9]+),"counters":\{"client":([0-9]+),"worker":([0-9]+)/\1 \2 \3/'
}

tier85_workers() {
    local client="$ROOT/target/release/rdp-client" sock="/run/roce-dpd-${RUN_ID}-2w.sock" prefix="${RUN_ID}dpd2w"
    local dlog="$LOG_DIR/tier9-2w-daemon.log" L="$LOG_DIR/tier9-2w" rc i qps
    if ! DPD_CONF="$ROOT/conf/daemon-ring-2w.toml" dpd_start "$sock" "$prefix" "$dlog"; then
        fail "2 workers: roce-dpd starts: $(tail -n 2 "$dlog")"
        return
    fi
    check "2 workers: roce-dpd serves on lcores 1,0 with idle back-off" \
        grep -q '^roce-dpd: serving .* 2 workers on lcores 1,0 (idle sleep)$' "$dlog"
    local ok="/run/rdp-oob-${RUN_ID}2k.sock" oa="/run/rdp-oob-${RUN_ID}2a.sock" ob="/run/rdp-oob-${RUN_ID}2b.sock"
    local oc="/run/rdp-oob-${RUN_ID}2c.sock" od="/run/rdp-oob-${RUN_ID}2d.sock"
    local pk qk pa qa pb qb pc qc pd qd ra=0 aa=0 rb=0 ab=0 rd=0 rqc=0 rqd=0
    for i in "$ok" "$oa" "$ob" "$oc" "$od"; do track_path "$i"; done

    # Pair K, one QP after the other: the passive's on worker 0, the active's on worker 1.
    timeout 60 "$client" passive --daemon "$sock" --oob "$ok" >"$L-k-passive.log" 2>&1 &
    pk=$!
    track_pid "$pk"
    dpd2_wait_qps "$sock" 1
    "$client" active --daemon "$sock" --oob "$ok" --op write --size 65536 --iters 100000000 --timeout 60 \
        >"$L-k-active.log" 2>&1 &
    qk=$!
    track_pid "$qk"
    dpd2_wait_qps "$sock" 2
    dpd2_qps "$sock" >"$L-qps-k.txt"
    check "2 workers: the two clients' QPs are on different workers, each its own session (roce-stat --json)" test \
        "$(awk '{ w[$3]++; c[$2]++ } END { print length(w), length(c), NR }' "$L-qps-k.txt")" = "2 2 2"
    # Pair A meanwhile: SEND, WRITE, READ and both atomics between a QP on each worker (loads 1/1: worker 0 first).
    timeout 60 "$client" passive --daemon "$sock" --oob "$oa" >"$L-a-passive.log" 2>&1 &
    pa=$!
    track_pid "$pa"
    dpd2_wait_qps "$sock" 3
    timeout 60 "$client" active --daemon "$sock" --oob "$oa" --op all --size 4096 --iters 200 >"$L-a-active.log" 2>&1 &
    qa=$!
    track_pid "$qa"
    dpd2_wait_qps "$sock" 4
    dpd2_qps "$sock" >"$L-qps-ka.txt"
    check "2 workers: 4 QPs, 2 on each worker" test \
        "$(awk '{ w[$3]++ } END { print w[0] + 0, w[1] + 0 }' "$L-qps-ka.txt")" = "2 2"
    # kill -9 of the active client of pair K (the second QP made: worker 1): its QP is gone within a second.
    local t_kill reclaimed_ms="" victim
    victim=$(awk '$3 == 1 { print $1 }' "$L-qps-k.txt")
    check "2 workers, kill -9: the victim (QP $victim on worker 1) was running" kill -0 "$qk"
    t_kill=$(date +%s%N)
    kill -KILL "$qk" 2>/dev/null
    wait "$qk" 2>/dev/null
    local now
    for i in $(seq 100); do
        now=$(dpd2_qps "$sock")
        # (pair A's QPs are still there: an empty answer is a failed query, not a reclaim)
        if [[ -n $now && -n $victim ]] && ! grep -q "^$victim " <<<"$now"; then
            reclaimed_ms=$((($(date +%s%N) - t_kill) / 1000000))
            break
        fi
        sleep 0.01
    done
    check "2 workers, kill -9: worker 1 reclaimed the killed client's QP within 1 s (${reclaimed_ms:-no} ms)" \
        test -n "$reclaimed_ms" -a "${reclaimed_ms:-9999}" -le 1000
    wait "$qa" || aa=$?
    wait_pid "$pa" 20 || ra=$?
    wait_pid "$pk" 10
    check "2 workers: pair A (4096 B x 200, a QP on each worker) exits 0 (active $aa, passive $ra)" \
        test "$aa" -eq 0 -a "$ra" -eq 0
    for i in send write read fadd cswap; do
        check "2 workers: pair A $i verified" grep -q "^CHECK ok   $i: 200 x .* bytes verified" "$L-a-active.log"
    done
    check "2 workers: pair A's passive verified 1638400 bytes" grep -q '^CHECK ok   passive: 1638400 bytes' \
        "$L-a-passive.log"

    # Inline: SEND and WRITE payloads copied into the send ring at post time from an unregistered buffer that is
    # overwritten right after each post; the passive side checks every byte.
    timeout 60 "$client" passive --daemon "$sock" --oob "$ob" >"$L-b-passive.log" 2>&1 &
    pb=$!
    track_pid "$pb"
    timeout 60 "$client" active --daemon "$sock" --oob "$ob" --op all --size 1000 --iters 100 --inline 1024 \
        >"$L-b-active.log" 2>&1 || ab=$?
    wait_pid "$pb" 20 || rb=$?
    check "inline: pair B (1000 B inline, max_inline 1024) exits 0 (active $ab, passive $rb)" \
        test "$ab" -eq 0 -a "$rb" -eq 0
    for i in send write; do
        check "inline: $i verified (inline)" grep -q "^CHECK ok   $i: 100 x 1000 B, 100000 bytes verified, .* (inline)$" \
            "$L-b-active.log"
    done
    check "inline: the passive received and verified 200000 bytes" grep -q '^CHECK ok   passive: 200000 bytes' \
        "$L-b-passive.log"
    rc=0
    timeout 10 "$client" active --daemon "$sock" --oob "$ob" --size 2000 --inline 1024 >/dev/null 2>"$L-inl.err" || rc=$?
    check "inline: --size over --inline: exit 2 (got $rc), one line" test "$rc" -eq 2 -a -n \
        "$(one_line "$L-inl.err" '^rdp-client: --inline 1024: --size 2000 does not fit' && echo y)"
    timeout 10 "$client" open --daemon "$sock" --stats >"$L-stats.out" 2>&1
    check "2 workers: every client's QPs, CQs, MRs and PDs are gone from both workers" test -n \
        "$(grep -q '^STAT daemon 0x0 qps 0$' "$L-stats.out" && grep -q '^STAT daemon 0x0 cqs 0$' "$L-stats.out" &&
            grep -q '^STAT daemon 0x0 mrs 0$' "$L-stats.out" && grep -q '^STAT daemon 0x0 pds 0$' "$L-stats.out" &&
            grep -q '^STAT worker 0x1 qps 0$' "$L-stats.out" && grep -q '^STAT daemon 0x0 workers 2$' "$L-stats.out" &&
            echo y)"
    check "2 workers: worker 0 dispatched frames to worker 1, which sent on its own tx queue and posted WQEs" test -n \
        "$(grep -Eq '^STAT worker 0x0 dispatched [1-9]' "$L-stats.out" &&
            grep -Eq '^STAT worker 0x1 tx_frames [1-9]' "$L-stats.out" &&
            grep -Eq '^STAT worker 0x1 wqes_posted [1-9]' "$L-stats.out" && echo y)"

    # SIGTERM with an active client mid-transfer on each worker (QPs made in the order passive C, passive D,
    # active C, active D: workers 0, 1, 0, 1): both are flushed and told, the daemon exits 0 and leaves nothing.
    timeout 60 "$client" passive --daemon "$sock" --oob "$oc" >"$L-c-passive.log" 2>&1 &
    pc=$!
    dpd2_wait_qps "$sock" 1
    timeout 60 "$client" passive --daemon "$sock" --oob "$od" >"$L-d-passive.log" 2>&1 &
    pd=$!
    dpd2_wait_qps "$sock" 2
    timeout 60 "$client" active --daemon "$sock" --oob "$oc" --op write --size 4096 --iters 100000000 \
        >"$L-c-active.log" 2>&1 &
    qc=$!
    dpd2_wait_qps "$sock" 3
    timeout 60 "$client" active --daemon "$sock" --oob "$od" --op write --size 4096 --iters 100000000 \
        >"$L-d-active.log" 2>&1 &
    qd=$!
    for i in "$pc" "$pd" "$qc" "$qd"; do track_pid "$i"; done
    dpd2_wait_qps "$sock" 4
    sleep 1
    dpd2_qps "$sock" >"$L-qps-cd.txt"
    check "2 workers, SIGTERM: both active clients running, 2 QPs on each worker" test \
        "$(kill -0 "$qc" && kill -0 "$qd" && awk '{ w[$3]++ } END { print w[0] + 0, w[1] + 0 }' "$L-qps-cd.txt")" = "2 2"
    local t0=$SECONDS
    kill -TERM "$DPD_PID"
    wait_pid "$DPD_PID" 15 || rd=$?
    wait_pid "$qc" 10 || rqc=$?
    wait_pid "$qd" 10 || rqd=$?
    wait_pid "$pc" 10
    wait_pid "$pd" 10
    check "2 workers, SIGTERM: roce-dpd exits 0 (got $rd) within 5 s ($((SECONDS - t0)) s)" \
        test "$rd" -eq 0 -a $((SECONDS - t0)) -le 5
    for i in c d; do
        [[ $i == c ]] && rc=$rqc || rc=$rqd
        check "2 workers, SIGTERM: active $i stops with exit 2 (got $rc), one line saying the daemon is gone" \
            test "$rc" -eq 2 -a "$(grep -c '^rdp-client: roce-dpd on .* is gone (it is shutting down: roce-dpd stopped by SIGTERM)' \
            "$L-$i-active.log")" -eq 1
    done
    check "2 workers, SIGTERM: every session reclaimed on both workers, nothing left" \
        grep -q '^roce-dpd: stopped; .* 0 QPs 0 CQs 0 MRs 0 PDs left; worker 0: .*; worker 1: ' "$dlog"
    check "2 workers, SIGTERM: socket and EAL runtime directory removed" \
        test ! -e "$sock" -a ! -e "/var/run/dpdk/$prefix"
    TIER85_WORKERS_NOTE="2 workers: kill -9 reclaimed in ${reclaimed_ms:-?} ms"
}

# tier9_perftest SOCK: the eight perftest tools through the roce-dpd on SOCK: result tables parsed by column, data
# validated where it applies, JSON as printed; -a, -b, -D 2, --run_infinitely ended by SIGINT, -m/-t/--report_gbits;
# a client and a server killed mid-run (the other side: one line, non-zero, within its timeout). Sets T9_AVG.
tier9_perftest() {
    local PF_DAEMON="$1" PF_LOG=tier9 PF_SEXTRA=() PF_CEXTRA=() tool checker want lt
    for tool in rdp_write_bw rdp_read_bw rdp_send_bw; do
        PF_CEXTRA=(--out_json_file "$LOG_DIR/tier9-$tool.json")
        pf_pair "$tool" "$tool" -s 65536 -n 2000 -q 2 --data_validation
        PF_CEXTRA=()
        check "$tool --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
        [[ $PF_CRC -ne 0 || $PF_SRC -ne 0 ]] && grep -h '^rdp_' "$PF_CLOG" "$PF_SLOG" | sed 's/^/    /'
        check "$tool --daemon: client table parses (65536 B x 2000, BW > 0)" pf_table "$PF_CLOG" 65536 2000
        check "$tool --daemon: server table parses" pf_table "$PF_SLOG" 65536 2000
        # WRITE: the server's two regions; READ: what the client read into its two; SEND: every receive.
        checker="$PF_SLOG" want=131072
        [[ $tool == rdp_read_bw ]] && checker="$PF_CLOG"
        [[ $tool == rdp_send_bw ]] && want=262144000
        check "$tool --daemon: $want bytes validated" grep -q "^ Data validation: $want bytes verified$" "$checker"
        check "$tool --daemon: JSON as printed" pf_json_last "$PF_CLOG" "$LOG_DIR/tier9-$tool.json" 1
        [[ $tool == rdp_write_bw ]] && T9_AVG=$(awk '/^ #bytes/ {getline; print $4}' "$PF_CLOG")
    done
    for lt in "rdp_atomic_bw -A FETCH_AND_ADD" "rdp_atomic_bw -A CMP_AND_SWAP"; do
        # shellcheck disable=SC2086
        pf_pair "${lt// /}" $lt -n 2000 -q 2
        check "$lt --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
        check "$lt --daemon: both tables parse" test -n "$(pf_table "$PF_CLOG" 8 2000 && pf_table "$PF_SLOG" 8 2000 && echo y)"
    done
    for lt in "rdp_read_lat -s 64" "rdp_read_lat -s 4096" "rdp_atomic_lat -A FETCH_AND_ADD" \
        "rdp_atomic_lat -A CMP_AND_SWAP" "rdp_send_lat -s 64" "rdp_send_lat -s 4096" "rdp_write_lat -s 64" \
        "rdp_write_lat -s 4096"; do
        # shellcheck disable=SC2086
        pf_pair "${lt// /}" $lt -n 1000 --data_validation
        check "$lt --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
        [[ $PF_CRC -ne 0 || $PF_SRC -ne 0 ]] && grep -h '^rdp_' "$PF_CLOG" "$PF_SLOG" | sed 's/^/    /'
        check "$lt --daemon: client latency row (1000 iterations, t_avg > 0)" \
            awk '/^ #bytes #iterations/ {getline; ok = ($2 == 1000 && $6 > 0)} END {exit !ok}' "$PF_CLOG"
        # send_lat / write_lat: both sides time their messages, both print the table.
        [[ $lt == *send_lat* || $lt == *write_lat* ]] && check "$lt --daemon: server latency row" \
            awk '/^ #bytes #iterations/ {getline; ok = ($2 == 1000 && $6 > 0)} END {exit !ok}' "$PF_SLOG"
    done
    check "rdp_read_lat -s 4096 --daemon: the client validated the READ" \
        grep -q '^ Data validation: 4096 bytes verified$' "$LOG_DIR/tier9-rdp_read_lat-s4096-client.log"
    check "rdp_atomic_lat --daemon: every FETCH_AND_ADD result validated" \
        grep -q '^ Data validation: 8000 bytes verified$' "$LOG_DIR/tier9-rdp_atomic_lat-AFETCH_AND_ADD-client.log"

    # -a: send BW steps through 2 .. 2^23 B on both sides in lockstep, every receive validated; 23 JSON rows.
    PF_CEXTRA=(--out_json_file "$LOG_DIR/tier9-send_bw-all.json")
    pf_pair send_bw-all rdp_send_bw -a -n 5 --data_validation
    PF_CEXTRA=()
    check "rdp_send_bw -a --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_send_bw -a --daemon: a row per size 2 .. 8388608 on both sides" pf_all_rows "$PF_CLOG" "$PF_SLOG"
    check "rdp_send_bw -a --daemon: every receive validated (5 x 2 .. 2^23 B)" \
        grep -q '^ Data validation: 83886070 bytes verified$' "$PF_SLOG"
    check "rdp_send_bw -a --daemon: 23 JSON rows, the last as printed" \
        pf_json_last "$PF_CLOG" "$LOG_DIR/tier9-send_bw-all.json" 23
    pf_pair read_bw-all rdp_read_bw -a -n 5 --data_validation
    check "rdp_read_bw -a --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_read_bw -a --daemon: the client prints a row per size and validated each" \
        test -n "$(pf_all_rows "$PF_CLOG" && grep -q '^ Data validation: 16777214 bytes verified$' "$PF_CLOG" && echo y)"

    # -b: both sides post; each prints the sum of both reports.
    pf_pair write_bw-bidir rdp_write_bw -b -s 4096 -n 2000 -q 2 -Q 7
    check "rdp_write_bw -b --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_write_bw -b --daemon: the server's row is the client's" test -n "$(pf_table "$PF_CLOG" 4096 2000 &&
        [[ $(awk '/^ #bytes/ {getline; print $3, $4}' "$PF_CLOG") == $(awk '/^ #bytes/ {getline; print $3, $4}' "$PF_SLOG") ]] &&
        echo y)"
    pf_pair send_bw-bidir rdp_send_bw -b -s 4096 -n 2000
    check "rdp_send_bw -b --daemon: both exit 0 (server $PF_SRC, client $PF_CRC), both tables parse" test -n \
        "$([[ $PF_SRC -eq 0 && $PF_CRC -eq 0 ]] && pf_table "$PF_CLOG" 4096 2000 && pf_table "$PF_SLOG" 4096 2000 && echo y)"

    # -D 2: what completed between the margins, no peak; the send BW receiver ends when the sender moves on.
    PF_CEXTRA=(--out_json_file "$LOG_DIR/tier9-write_bw-duration.json")
    pf_pair write_bw-duration rdp_write_bw -D 2 -s 4096
    PF_CEXTRA=()
    check "rdp_write_bw -D 2 --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_write_bw -D 2 --daemon: a row with iterations and no peak, JSON as printed" test -n "$(
        awk '/^ #bytes/ {getline; ok = ($1 == 4096 && $2 > 0 && $3 == 0 && $4 > 0)} END {exit !ok}' "$PF_CLOG" &&
            pf_json_last "$PF_CLOG" "$LOG_DIR/tier9-write_bw-duration.json" 1 && echo y)"
    pf_pair send_bw-duration rdp_send_bw -D 2 -s 4096
    check "rdp_send_bw -D 2 --daemon: both exit 0 (server $PF_SRC, client $PF_CRC), both print a row" test -n \
        "$([[ $PF_SRC -eq 0 && $PF_CRC -eq 0 ]] &&
            awk '/^ #bytes/ {getline; ok = ($2 > 0 && $4 > 0)} END {exit !ok}' "$PF_CLOG" &&
            awk '/^ #bytes/ {getline; ok = ($2 > 0 && $4 > 0)} END {exit !ok}' "$PF_SLOG" && echo y)"

    # -m 1024, -t 16, --report_gbits.
    pf_pair read_bw-gbits rdp_read_bw -s 65536 -n 500 -m 1024 -t 16 --report_gbits
    check "rdp_read_bw -m 1024 -t 16 --report_gbits --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" \
        test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "rdp_read_bw --daemon: banner MTU 1024 and TX depth 16, Gb/s header, table parses" test -n "$(
        grep -q '^ Mtu             : 1024\[B\]$' "$PF_CLOG" && grep -q '^ TX depth        : 16$' "$PF_CLOG" &&
            grep -q 'BW average\[Gb/sec\]' "$PF_CLOG" && pf_table "$PF_CLOG" 65536 500 && echo y)"

    # --run_infinitely: a row per period until SIGINT, then the teardown and exit 0 on both sides.
    pf_infinite
    check "--run_infinitely --daemon: both exit 0 after SIGINT (server $PF_SRC, client $PF_CRC)" \
        test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    check "--run_infinitely --daemon: at least 2 rows, one per second" \
        test "$(grep -cE '^ 4096 +[1-9][0-9]* ' "$PF_CLOG")" -ge 2

    # A client, then a server, killed mid-run: the other side exits non-zero within its timeout, one line.
    pf_vanish client
    pf_vanish server
}

# t9_cpu_pair NAME TOOL ARGS...: a server of TOOL in the background and its client in the foreground, both through
# PF_DAEMON; sets PF_SLOG, PF_CLOG, PF_SRC, PF_CRC, and, from GNU time (/usr/bin/time, package time), the client's
# T9_CPU (user + system seconds), T9_WALL (elapsed seconds) and T9_VCSW (voluntary context switches: a client that
# sleeps on completion events blocks in the kernel once per event it waits for; one that spins hardly ever does).
t9_cpu_pair() {
    local name="$1" tool="$2" port tf
    shift 2
    PF_N=$((PF_N + 1))
    port=$((20000 + ($$ % 10000) + PF_N))
    PF_SRC=0 PF_CRC=0 T9_CPU="" T9_WALL="" T9_VCSW=""
    PF_SLOG="$LOG_DIR/tier9-$name-server.log" PF_CLOG="$LOG_DIR/tier9-$name-client.log"
    tf="$LOG_DIR/tier9-$name-client.time"
    "$ROOT/target/release/$tool" --daemon "$PF_DAEMON" -p "$port" --timeout 20 "$@" >"$PF_SLOG" 2>&1 &
    PF_SPID=$!
    track_pid "$PF_SPID"
    /usr/bin/time -o "$tf" -f 'time %e %U %S %w' timeout 60 "$ROOT/target/release/$tool" --daemon "$PF_DAEMON" \
        -p "$port" --timeout 20 "$@" 127.0.0.1 >"$PF_CLOG" 2>&1 || PF_CRC=$?
    read -r T9_WALL T9_CPU T9_VCSW < <(awk '$1 == "time" { printf "%.2f %.2f %d\n", $2, $3 + $4, $5 }' "$tf")
    wait_pid "$PF_SPID" 30 || PF_SRC=$?
}

# tier9_events SOCK: perftest's -e (--events) through the roce-dpd on SOCK: write_bw -D 3, send_bw with
# --data_validation and send_lat with -e on both sides give their results, the clients sleep on completion events
# instead of spinning (write_bw: CPU time under half the wall time; send_lat: at least one voluntary context switch
# per two iterations; behaviour checks, not performance figures; the daemon's worker busy-polls lcore 1
# meanwhile), the daemon counted the events; bad input:
# -e with --port-conf, -e with --poll-sleep, write_lat -e (perftest: no events with WRITE latency), one line each.
tier9_events() {
    local PF_DAEMON="$1" PF_LOG=tier9 PF_SEXTRA=() PF_CEXTRA=() ev0 ev1 rc err
    ev0=$(dpd2_stat "$1" daemon 0 events_signalled)
    t9_cpu_pair write_bw-events rdp_write_bw -e -D 3 -s 65536 -q 2
    check "rdp_write_bw -e -D 3 --daemon: both exit 0 (server $PF_SRC, client $PF_CRC), a row with BW > 0" test -n \
        "$([[ $PF_SRC -eq 0 && $PF_CRC -eq 0 ]] &&
            awk '/^ #bytes/ {getline; ok = ($1 == 65536 && $2 > 0 && $4 > 0)} END {exit !ok}' "$PF_CLOG" && echo y)"
    check "rdp_write_bw -e --daemon: the client slept (CPU ${T9_CPU:-?} s of ${T9_WALL:-?} s wall, under half)" \
        awk -v c="${T9_CPU:-9}" -v w="${T9_WALL:-0}" 'BEGIN { exit !(w > 0 && c < w / 2) }'
    T9_EV_NOTE="write_bw -e client CPU ${T9_CPU:-?}/${T9_WALL:-?} s"
    t9_cpu_pair send_lat-events rdp_send_lat -e -s 64 -n 10000
    check "rdp_send_lat -e --daemon: both exit 0 (server $PF_SRC, client $PF_CRC)" test "$PF_SRC" -eq 0 -a "$PF_CRC" -eq 0
    [[ $PF_CRC -ne 0 || $PF_SRC -ne 0 ]] && grep -h '^rdp_' "$PF_CLOG" "$PF_SLOG" | sed 's/^/    /'
    check "rdp_send_lat -e --daemon: latency rows on both sides (10000 iterations, t_avg > 0)" test -n "$(
        awk '/^ #bytes #iterations/ {getline; ok = ($2 == 10000 && $6 > 0)} END {exit !ok}' "$PF_CLOG" &&
            awk '/^ #bytes #iterations/ {getline; ok = ($2 == 10000 && $6 > 0)} END {exit !ok}' "$PF_SLOG" && echo y)"
    # Not CPU under half the wall time: each of the 10000 round trips costs a wake-up, so a sleeping latency client
    # spends ~40% of its time on the CPU and sat on that bound (failed at 0.21/0.41 s in a CI run).
    check "rdp_send_lat -e --daemon: the client slept on events (${T9_VCSW:-?} voluntary context switches for 10000 \
iterations, at least 5000; CPU ${T9_CPU:-?} s of ${T9_WALL:-?} s)" test "${T9_VCSW:-0}" -ge 5000
    T9_EV_NOTE+=", send_lat -e ${T9_CPU:-?}/${T9_WALL:-?} s, ${T9_VCSW:-?} voluntary switches"
    # -q 2: the two QPs share the tools' CQ with -e, its send and receive completions sorted to their QPs.
    pf_pair send_bw-events rdp_send_bw -e -s 4096 -n 2000 -q 2 --data_validation
    check "rdp_send_bw -e --daemon: both exit 0 (server $PF_SRC, client $PF_CRC), every receive validated" test -n \
        "$([[ $PF_SRC -eq 0 && $PF_CRC -eq 0 ]] && pf_table "$PF_CLOG" 4096 2000 &&
            grep -q '^ Data validation: 16384000 bytes verified$' "$PF_SLOG" && echo y)"
    ev1=$(dpd2_stat "$1" daemon 0 events_signalled)
    check "roce-stat: the daemon signalled completion channels (events_signalled ${ev0:-0} -> ${ev1:-0})" \
        test "${ev1:-0}" -gt "${ev0:-0}"
    err="$LOG_DIR/tier9-events-embedded.err" rc=0
    timeout 10 "$ROOT/target/release/rdp_write_bw" -e --port-conf "$ROOT/conf/memif-server.toml" \
        >/dev/null 2>"$err" || rc=$?
    check "rdp_write_bw -e --port-conf: exit 2 (got $rc), one line" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^rdp_write_bw: -e/--events needs --daemon SOCKET' && echo y)"
    err="$LOG_DIR/tier9-events-nap.err" rc=0
    timeout 10 "$ROOT/target/release/rdp_send_bw" --daemon "$1" -e --poll-sleep 20 >/dev/null 2>"$err" || rc=$?
    check "rdp_send_bw -e --poll-sleep 20: exit 2 (got $rc), one line" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^rdp_send_bw: -e/--events and --poll-sleep US exclude each other' && echo y)"
    err="$LOG_DIR/tier9-events-wlat.err" rc=0
    timeout 10 "$ROOT/target/release/rdp_write_lat" --daemon "$1" --events >/dev/null 2>"$err" || rc=$?
    check "rdp_write_lat --events: exit 2 (got $rc), one line as perftest's" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^rdp_write_lat: Events feature not available on WRITE latency test' && echo y)"
}

# tier9_daemon_killed SOCK PREFIX: a second roce-dpd on SOCK, a long write_bw through it, then SIGKILL to the
# daemon: server and client each exit 2 within seconds with one line saying the daemon is gone.
tier9_daemon_killed() {
    local sock="$1" prefix="$2" dlog="$LOG_DIR/tier9-daemon-k.log" PF_DAEMON="$1" PF_LOG=tier9 PF_SEXTRA=() PF_CEXTRA=()
    local rs=0 rc=0 t0 f
    if ! dpd_start "$sock" "$prefix" "$dlog"; then
        fail "daemon killed: a second roce-dpd starts: $(tail -n 2 "$dlog")"
        return
    fi
    pf_spawn daemon-killed rdp_write_bw 20 -s 4096 -n 50000000
    sleep 2
    check "daemon killed: the run was going" kill -0 "$PF_CPID"
    kill -KILL "$DPD_PID"
    wait "$DPD_PID" 2>/dev/null
    t0=$SECONDS
    wait_pid "$PF_CPID" 15 || rc=$?
    wait_pid "$PF_SPID" 15 || rs=$?
    check "daemon killed: client and server exit 2 (client $rc, server $rs) within 5 s ($((SECONDS - t0)) s)" \
        test "$rc" -eq 2 -a "$rs" -eq 2 -a $((SECONDS - t0)) -le 5
    for f in "$PF_CLOG" "$PF_SLOG"; do
        check "daemon killed: $(basename "$f" .log) says so in one line" \
            test "$(grep -c '^rdp_write_bw: ' "$f")" -eq 1 -a -n \
            "$(grep -q "^rdp_write_bw: roce-dpd on $sock is gone" "$f" && echo y)"
    done
    [[ -n "${VERBOSE:-}" ]] && grep -h '^rdp_write_bw: ' "$PF_CLOG" | sed 's/^/       /'
}

# port_link SOCK: the port line of roce-stat's text output for the roce-dpd on SOCK.
port_link() {
    timeout 10 "$ROOT/target/release/roce-stat" --socket "$1" 2>&1 | grep '^port '
}

# tier85_link PREFIX: two roce-dpd on a memif pair (conf/daemon-memif-*.toml, workers on lcores 1 and 0): roce-stat
# shows the server's port link down while it has no peer, up on both once the client daemon connects, and down
# again when the client daemon stops (a zero would be left out of the text: the link is always shown).
tier85_link() {
    local ss="/run/roce-dpd-${RUN_ID}ls.sock" cs="/run/roce-dpd-${RUN_ID}lc.sock" spid cpid line i rc=0 size0
    local slog="$LOG_DIR/tier9-link-server.log" clog="$LOG_DIR/tier9-link-client.log"
    # The server's memif driver logs at info level (it says "Connected." when its peer comes), which shows on stderr
    # once the daemon runs: before session 16 it went to the captured log, unseen and growing.
    local sconf="$LOG_DIR/tier9-link-server.toml"
    sed '/^\[eal\]/a extra = ["--log-level=pmd.net.memif:info"]' "$ROOT/conf/daemon-memif-server.toml" >"$sconf"
    if ! dpd_start "$ss" "${1}ls" "$slog" "$sconf"; then
        fail "link: roce-dpd memif server starts: $(tail -n 2 "$slog")"
        return
    fi
    spid=$DPD_PID
    size0=$(dpd_capture_size "$spid")
    line=$(port_link "$ss")
    check "link: a memif server without its peer shows 'link down' ($line)" grep -q '^port 0: .*link down' <<<"$line"
    # A second memif server daemon on the memif socket the first holds: the vdev's probe fails inside EAL, which
    # roce-dpd reported as "rte_eth_dev_get_port_by_name failed: No such device" alone; now with DPDK's reason.
    local dup="$LOG_DIR/tier9-link-second-server.err"
    track_prefix "${1}l2"
    track_path "/run/roce-dpd-${RUN_ID}l2.sock"
    timeout 30 "$ROOT/target/release/roce-dpd" --config "$ROOT/conf/daemon-memif-server.toml" \
        --socket "/run/roce-dpd-${RUN_ID}l2.sock" --file-prefix "${1}l2" >"$dup" 2>&1 || rc=$?
    check "link: a second memif server daemon on the first's memif socket: exit 2 (got $rc)" test "$rc" -eq 2
    check "link: ... one line with DPDK's reason" \
        one_line "$dup" '^roce-dpd: port net_memif0: .*; DPDK: .*Address already in use'
    rc=0
    if ! dpd_start "$cs" "${1}lc" "$clog" "$ROOT/conf/daemon-memif-client.toml"; then
        fail "link: roce-dpd memif client starts: $(tail -n 2 "$clog")"
        kill -TERM "$spid"
        wait_pid "$spid" 10
        return
    fi
    cpid=$DPD_PID
    for i in $(seq 50); do
        port_link "$ss" | grep -q 'link up' && port_link "$cs" | grep -q 'link up' && break
        sleep 0.1
    done
    line="$(port_link "$ss") / $(port_link "$cs")"
    check "link: once connected, both show 'link up' ($line)" \
        test "$(grep -o 'link up' <<<"$line" | wc -l)" -eq 2
    check "link: the server shows DPDK's runtime message on stderr: 'roce-dpd: DPDK: memif_connect(): Connected.'" \
        grep -q '^roce-dpd: DPDK: memif_connect(): Connected' "$slog"
    check "link: ... and its captured DPDK log stopped growing once it served ($size0 bytes, now \
$(dpd_capture_size "$spid"))" test -n "$size0" -a "$(dpd_capture_size "$spid")" = "$size0"
    kill -TERM "$cpid"
    wait_pid "$cpid" 10 || rc=$?
    check "link: the client daemon stops with exit 0 (got $rc)" test "$rc" -eq 0
    for i in $(seq 50); do
        port_link "$ss" | grep -q 'link down' && break
        sleep 0.1
    done
    line=$(port_link "$ss")
    check "link: its peer gone, the server shows 'link down' again ($line)" grep -q '^port 0: .*link down' <<<"$line"
    rc=0
    kill -TERM "$spid"
    wait_pid "$spid" 10 || rc=$?
    check "link: the server daemon stops with exit 0 (got $rc)" test "$rc" -eq 0
}

# smaps_pages PID NAME: the KernelPageSize (kB) of each mapping of process PID whose path contains NAME, one a line.
smaps_pages() {
    awk -v name="$2" '/^[0-9a-f]+-[0-9a-f]+ / { m = index($0, name) > 0 } m && /^KernelPageSize:/ { print $2 }' \
        "/proc/$1/smaps" 2>/dev/null
}

# all_huge PID NAME [MIN]: at least MIN (1) mappings of PID named NAME, every one in 2 MiB pages.
all_huge() {
    local pages
    pages=$(smaps_pages "$1" "$2")
    [[ $(grep -c . <<<"$pages") -ge ${3:-1} ]] && ! grep -qv '^2048$' <<<"$pages"
}

# Hugetlbfs backing (`[daemon] backing = "hugetlbfs"`, conf/daemon-ring.toml otherwise): the block makes sure 8
# 2 MiB hugepages are free (reserving what is missing in /proc/sys/vm/nr_hugepages; cleanup_all gives them back
# even when a check fails), runs roce-dpd with that backing and proves that the clients' regions are huge pages:
# the smaps of an rdp-client and of an rdp_write_bw --daemon server show their buffer and their ring regions with
# KernelPageSize 2048 kB (the daemon's smaps shows the client's buffer so too), and the pool's available pages drop
# while the client holds them. Traffic verified (rdp-client SEND/WRITE/READ/atomics, rdp_write_bw
# --data_validation); a client asking for more than is free gets one line naming hugepages and how to reserve them;
# when the clients and the daemon are gone every page is back and the pool is as it was.
tier85_hugetlb() {
    local client="$ROOT/target/release/rdp-client" sock="/run/roce-dpd-${RUN_ID}h.sock" prefix="${RUN_ID}dph"
    local conf="$LOG_DIR/tier9-huge.toml" dlog="$LOG_DIR/tier9-huge-daemon.log" l="$LOG_DIR/tier9-huge"
    local need=8 nr0 nr avail avail0 avail1 rc=0 i
    nr0=$(cat /proc/sys/vm/nr_hugepages)
    avail=$(hugepages_available)
    if [[ $avail -lt $need ]]; then
        echo $((nr0 + need - avail)) >/proc/sys/vm/nr_hugepages
        nr=$(cat /proc/sys/vm/nr_hugepages)
        track_hugepages $((nr - nr0))
    fi
    avail0=$(hugepages_available)
    if [[ $avail0 -lt $need ]]; then
        fail "hugetlbfs: $need free 2 MiB hugepages (only $avail0 after asking for them: memory too fragmented?)"
        hugepages_give_back
        return
    fi
    pass "hugetlbfs: $need free 2 MiB hugepages ($((avail0 - avail)) reserved by the test, $nr0 before)"
    sed 's/^backing = "memfd"/backing = "hugetlbfs"/' "$ROOT/conf/daemon-ring.toml" >"$conf"
    if ! dpd_start "$sock" "$prefix" "$dlog" "$conf"; then
        fail "hugetlbfs: roce-dpd starts: $(tail -n 2 "$dlog")"
        hugepages_give_back
        return
    fi
    local dpd=$DPD_PID
    check "hugetlbfs: roce-dpd says so" grep -q '^roce-dpd: serving .*(hugetlbfs backing)' "$dlog"

    # rdp-client: the passive side registers its buffer and creates its CQ and QP, then waits for its peer.
    local oob="/run/rdp-oob-${RUN_ID}h.sock" pp ra=0 rp=0
    track_path "$oob"
    # Not under timeout(1): its smaps are read by PID (rdp-client's own --timeout ends it).
    "$client" passive --daemon "$sock" --oob "$oob" >"$l-passive.log" 2>&1 &
    pp=$!
    track_pid "$pp"
    for i in $(seq 100); do
        [[ -S $oob ]] && all_huge "$pp" "memfd:roce-dpd-qp-" && break
        sleep 0.05
    done
    avail1=$(hugepages_available)
    check "hugetlbfs: the client's buffer is in 2 MiB pages (smaps: $(smaps_pages "$pp" "memfd:roce-dp-mr-$pp-" | head -n 1) kB)" \
        all_huge "$pp" "memfd:roce-dp-mr-$pp-"
    check "hugetlbfs: the client's CQ and QP rings are in 2 MiB pages" \
        all_huge "$pp" "memfd:roce-dpd-" 2
    check "hugetlbfs: the daemon maps the client's buffer in 2 MiB pages" all_huge "$dpd" "memfd:roce-dp-mr-$pp-"
    check "hugetlbfs: the pool's available pages dropped by 3 or more (buffer, CQ, QP: $avail0 -> $avail1)" \
        test $((avail0 - avail1)) -ge 3
    timeout 60 "$client" active --daemon "$sock" --oob "$oob" --op all --size 65536 --iters 50 \
        >"$l-active.log" 2>&1 || ra=$?
    wait_pid "$pp" 20 || rp=$?
    check "hugetlbfs: rdp-client pair exits 0 (active $ra, passive $rp)" test "$ra" -eq 0 -a "$rp" -eq 0
    tool_checks "$l-active.log"
    tool_checks "$l-passive.log"

    # rdp_write_bw --daemon: its region is hugepage-backed while it runs, and the server checks every byte.
    local pport=$((10000 + ($$ % 10000) + 20)) ps pc rs=0 rc_=0 seen=""
    "$ROOT/target/release/rdp_write_bw" --daemon "$sock" -p "$pport" -s 65536 -n 20000 --data_validation --timeout 60 \
        >"$l-bw-server.log" 2>&1 &
    ps=$!
    track_pid "$ps"
    sleep 0.3
    timeout 60 "$ROOT/target/release/rdp_write_bw" --daemon "$sock" -p "$pport" -s 65536 -n 20000 --data_validation \
        127.0.0.1 >"$l-bw-client.log" 2>&1 &
    pc=$!
    track_pid "$pc"
    while kill -0 "$ps" 2>/dev/null; do
        if all_huge "$ps" "memfd:roce-dp-mr-$ps-" && all_huge "$ps" "memfd:roce-dpd-" 2; then
            seen=y
            break
        fi
        sleep 0.02
    done
    wait_pid "$pc" 60 || rc_=$?
    wait_pid "$ps" 10 || rs=$?
    check "hugetlbfs: rdp_write_bw --daemon server's buffer and rings in 2 MiB pages while it ran" test -n "$seen"
    check "hugetlbfs: rdp_write_bw --daemon exits 0 (server $rs, client $rc_)" test "$rs" -eq 0 -a "$rc_" -eq 0
    check "hugetlbfs: rdp_write_bw --daemon: the client prints perftest's result line" \
        grep -Eq '^ 65536 +20000 +[0-9]+\.[0-9]{2} +[0-9]*[1-9][0-9]*\.[0-9]{2}[[:space:]]+[0-9]+\.[0-9]{6}$' "$l-bw-client.log"
    check "hugetlbfs: rdp_write_bw --daemon: the server verified the data" \
        grep -q '^ Data validation: 65536 bytes verified$' "$l-bw-server.log"

    # A buffer bigger than the pool has free: one line naming hugepages and how to reserve them.
    local err="$l-toobig.err" big
    avail=$(hugepages_available)
    big=$(((avail + 1) * 2 * 1048576))
    timeout 10 "$client" passive --daemon "$sock" --oob "$oob" --buffer "$big" >/dev/null 2>"$err" || rc=$?
    check "hugetlbfs: a buffer of $((big >> 20)) MiB with $avail pages free: exit 2 (got $rc), one line naming the fix" \
        test "$rc" -eq 2 -a -n "$(one_line "$err" "^rdp-client: not enough free 2 MiB hugepages for a $((big >> 20)) MiB region \($((avail + 1)) needed, $avail free\): reserve more as root \(scripts/setup.sh --hugepages N, or echo N > /proc/sys/vm/nr_hugepages\)" && echo y)"
    [[ -n "${VERBOSE:-}" ]] && sed 's/^/       /' "$err"

    rc=0
    kill -TERM "$dpd"
    wait_pid "$dpd" 15 || rc=$?
    check "hugetlbfs: roce-dpd exits 0 on SIGTERM (got $rc), nothing left" test "$rc" -eq 0 -a -n \
        "$(grep -q '^roce-dpd: stopped; .* 0 QPs 0 CQs 0 MRs 0 PDs left' "$dlog" && echo y)"
    check "hugetlbfs: every hugepage back in the pool ($(hugepages_available) available, $avail0 before)" \
        test "$(hugepages_available)" -eq "$avail0"
    hugepages_give_back
    check "hugetlbfs: the pool given back (nr_hugepages $(cat /proc/sys/vm/nr_hugepages), $nr0 before)" \
        test "$(cat /proc/sys/vm/nr_hugepages)" -eq "$nr0"

    # The pool empty (as on this VM once the block gave its pages back): roce-dpd starts and warns in one line, and a
    # client's buffer is refused in one line. On a machine whose pool keeps free pages of its own this is said, not
    # checked (emptying the pool would take pages from whatever reserved them).
    avail=$(hugepages_available)
    if [[ $avail -ne 0 ]]; then
        pass "hugetlbfs: the warning of an empty pool not checked here ($avail 2 MiB pages free besides the test's)"
        return
    fi
    local elog="$LOG_DIR/tier9-huge-empty-daemon.log"
    if ! dpd_start "$sock" "${prefix}e" "$elog" "$conf"; then
        fail "hugetlbfs, empty pool: roce-dpd starts: $(tail -n 2 "$elog")"
        return
    fi
    dpd=$DPD_PID
    check "hugetlbfs, empty pool: roce-dpd warns in one line naming the key and the fix" \
        test "$(grep -c '^roce-dpd: warning:' "$elog")" -eq 1 -a -n "$(grep -E "^roce-dpd: warning: $conf: daemon.backing: \"hugetlbfs\", but no 2 MiB hugepage is free on this machine: every CQ, QP and client buffer is refused until some are \(as root: scripts/setup.sh --hugepages N, or echo N > /proc/sys/vm/nr_hugepages\), or set backing = \"memfd\"$" "$elog")"
    rc=0 err="$l-empty.err"
    timeout 10 "$client" passive --daemon "$sock" --oob "$oob" >/dev/null 2>"$err" || rc=$?
    check "hugetlbfs, empty pool: a client's buffer is refused: exit 2 (got $rc), one line" \
        test "$rc" -eq 2 -a -n "$(one_line "$err" '^rdp-client: not enough free 2 MiB hugepages for a [0-9]+ MiB region \([0-9]+ needed, 0 free\)' && echo y)"
    rc=0
    kill -TERM "$dpd"
    wait_pid "$dpd" 15 || rc=$?
    check "hugetlbfs, empty pool: roce-dpd exits 0 on SIGTERM (got $rc)" test "$rc" -eq 0
}
