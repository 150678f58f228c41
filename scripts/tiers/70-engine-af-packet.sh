# Tier 7: two soft-NIC processes over net_af_packet on a veth pair (MTU 9000) between two network namespaces this
# tier creates (framesz = blocksz = 8192 for 4 KiB RoCE frames, conf/af-packet.toml). Peers are resolved with ARP
# (no static neighbours); the out-of-band exchange uses a Unix socket (the namespaces have separate loopbacks).
# SEND, WRITE, READ and atomics at path MTU 1024 and 4096 with every byte verified, 1% and 5% loss, leak checks.
TIERS+=(tier7_engine_af_packet)

afp_pair() {
    local name="$1" n="$2"
    shift 2
    local sock="/run/rdp-${RUN_ID}-a$n.sock" ps="${RUN_ID}a${n}s" pc="${RUN_ID}a${n}c"
    local slog="$LOG_DIR/tier7-$name-server.log" clog="$LOG_DIR/tier7-$name-client.log" src=0 crc=0 spid left
    track_prefix "$ps"
    track_prefix "$pc"
    track_path "$sock"
    ip netns exec "$AFP_NA" "$NIC" server --profile "$ROOT/conf/af-packet.toml" --iface "$AFP_VA" \
        --ipv4 10.0.0.1 --lcore 1 --oob-unix "$sock" --file-prefix "$ps" --timeout 60 --stats "$@" >"$slog" 2>&1 &
    spid=$!
    track_pid "$spid"
    timeout 90 ip netns exec "$AFP_NB" "$NIC" client --profile "$ROOT/conf/af-packet.toml" --iface "$AFP_VB" \
        --ipv4 10.0.0.2 --lcore 0 --oob-unix "$sock" --file-prefix "$pc" --timeout 60 --stats "$@" >"$clog" 2>&1 || crc=$?
    wait_pid "$spid" 30 || src=$?
    check "$name: client exit status 0 (got $crc)" test "$crc" -eq 0
    check "$name: server exit status 0 (got $src)" test "$src" -eq 0
    tool_checks "$clog"
    tool_checks "$slog"
    [[ $crc -ne 0 || $src -ne 0 ]] && grep -h '^rdp-nic:' "$clog" "$slog" | sed 's/^/    /'
    left=$(prefix_leftovers "$ps"; prefix_leftovers "$pc")
    check "$name: nothing left behind${left:+ ($left)}" test -z "$left"
}

tier7_engine_af_packet() {
    tier_begin "tier 7 engine over af_packet"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    AFP_NA="${RUN_ID}ea" AFP_NB="${RUN_ID}eb" AFP_VA="${RUN_ID}xa" AFP_VB="${RUN_ID}xb"
    local ok=1 n op mtu loss
    track_netns "$AFP_NA"
    track_netns "$AFP_NB"
    ip netns add "$AFP_NA" && ip netns add "$AFP_NB" &&
        ip link add "$AFP_VA" netns "$AFP_NA" mtu 9000 type veth peer name "$AFP_VB" netns "$AFP_NB" mtu 9000 || ok=0
    for n in "$AFP_NA" "$AFP_NB"; do
        ip netns exec "$n" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6' || ok=0
        ip -n "$n" link set lo up || ok=0
    done
    ip -n "$AFP_NA" link set "$AFP_VA" up && ip -n "$AFP_NB" link set "$AFP_VB" up || ok=0
    check "two namespaces with a veth pair (MTU 9000) between them" test "$ok" -eq 1
    if [[ $ok -ne 1 ]]; then tier_end; return; fi
    n=0
    for op in send write read atomic; do
        for mtu in 1024 4096; do
            n=$((n + 1))
            afp_pair "$op-$mtu" "$n" --op "$op" --mtu "$mtu" --size 10000 --iters 100 --qps 2 --depth 16
        done
    done
    check "ARP resolved the peer (no static neighbours)" grep -q 'peer 10.0.0.1 at .* (ARP)' \
        "$LOG_DIR/tier7-write-4096-client.log"
    for loss in 1 5; do
        n=$((n + 1))
        afp_pair "write-loss$loss" "$n" --op write --mtu 4096 --size 9000 --iters 100 --qps 2 --depth 16 \
            --inject-loss "$loss" --seed "$n" --qp-timeout 13
    done
    cleanup_all
    check "namespaces removed" bash -c "! ip netns list | grep -q '^$RUN_ID'"
    TIER_NOTE="($(grep -h '^RESULT op' "$LOG_DIR"/tier7-write-4096-client.log | grep -Eo 'avg_mib_s=[0-9.]+'))"
    tier_end
}
