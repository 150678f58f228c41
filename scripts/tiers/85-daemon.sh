# Tier 9 (file 85): the appliance. roce-dpd on a loopback net_ring port (conf/daemon-ring.toml, one busy worker on
# lcore 1, no hugepages) serves client processes through the roce_dp::client library: two pairs of rdp-client
# processes at once (each client its own session, PD, buffer, CQ and QP; both QPs of a pair in the one daemon) run
# SEND, WRITE, READ, FETCH_ADD and CMP_SWP with every byte verified, while the active client of a third pair is
# killed with SIGKILL mid-transfer (its session reclaimed within 1 s; at the end the daemon's object counters are
# back to zero). rdp_write_bw and rdp_read_bw with --daemon (server and client both in this daemon,
# --data_validation, perftest's result line parsed); --daemon with --port-conf and with no daemon: one line each. One-line errors: daemon absent, socket permission denied (a client as user nobody on the default
# 0600 socket), ABI mismatch (both sides say so), socket in use, invalid config, [daemon] missing. SIGTERM: a
# client mid-transfer gets a clear error instead of hanging, the daemon exits 0, removes its socket and EAL runtime
# directory.
TIERS+=(tier85_daemon)

# dpd_start SOCK PREFIX LOG [CONFIG]: starts roce-dpd (conf/daemon-ring.toml by default); DPD_PID. Waits for the
# socket (10 s).
dpd_start() {
    local sock="$1" prefix="$2" log="$3" conf="${4:-$ROOT/conf/daemon-ring.toml}" i
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

    # The perftest tools through the daemon (--daemon): server and client are two processes with their QPs in this
    # one roce-dpd; the result line is perftest's, every byte of the sink checked (WRITE: the server's region;
    # READ: what the client read).
    local tool pf pfs pfc rs rc_ pport
    for tool in rdp_write_bw rdp_read_bw; do
        # TCP ports below Linux's ephemeral range (32768-60999), as tiers 6 and 8: an outgoing connection cannot hold them.
        pf="$LOG_DIR/tier9-$tool" pport=$((10000 + ($$ % 10000) + ${#tool}))
        rs=0 rc_=0
        timeout 60 "$ROOT/target/release/$tool" --daemon "$sock" -p "$pport" -s 65536 -n 2000 --data_validation \
            >"$pf-server.log" 2>&1 &
        pfs=$!
        track_pid "$pfs"
        sleep 0.3
        timeout 60 "$ROOT/target/release/$tool" --daemon "$sock" -p "$pport" -s 65536 -n 2000 --data_validation \
            127.0.0.1 >"$pf-client.log" 2>&1 &
        pfc=$!
        track_pid "$pfc"
        wait_pid "$pfc" 60 || rc_=$?
        wait_pid "$pfs" 10 || rs=$?
        check "$tool --daemon: server and client exit 0 (server $rs, client $rc_)" test "$rs" -eq 0 -a "$rc_" -eq 0
        for f in server client; do
            check "$tool --daemon: the $f prints perftest's result line (65536 B x 2000)" \
                grep -Eq '^ 65536 +2000 +[0-9]+\.[0-9]{2} +[0-9]*[1-9][0-9]*\.[0-9]{2}[[:space:]]+[0-9]+\.[0-9]{6}$' "$pf-$f.log"
        done
        [[ $tool == rdp_write_bw ]] && f=server || f=client
        check "$tool --daemon: the $f verified the data" grep -q '^ Data validation: 65536 bytes verified$' "$pf-$f.log"
        [[ -n "${VERBOSE:-}" ]] && grep -E '^ 65536 ' "$pf-client.log" | sed "s/^/       $tool:/"
    done
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
    err="$LOG_DIR/tier9-abi.err" rc=0
    timeout 10 "$client" open --daemon "$sock" --abi-version 99 >/dev/null 2>"$err" || rc=$?
    check "ABI mismatch: exit 2 (got $rc), one line naming both versions" test "$rc" -eq 2 -a -n \
        "$(one_line "$err" '^rdp-client: shared-memory ABI mismatch: roce-dpd speaks v1, .* library v99' && echo y)"
    check "ABI mismatch: the daemon logs one line too" \
        test "$(grep -c 'refused: shared-memory ABI mismatch.*v99' "$dlog")" -eq 1
    rc=0
    timeout 10 "$client" open --daemon "$sock" >"$LOG_DIR/tier9-open.out" 2>&1 || rc=$?
    check "open: exit 0 (got $rc), ABI and GID shown" grep -q 'ABI v1 mtu 4096 .* gid ::ffff:10.0.0.1' \
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
    tier85_hugetlb
    TIER_NOTE="(4 clients at once, every byte verified; session of a SIGKILLed client reclaimed in ${reclaimed_ms:-?} ms)"
    tier_end
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
}
