# Tier 4: net_af_packet on a veth pair whose ends sit in two network namespaces that this tier creates (the pair is
# created inside them: nothing touches the host's own namespace). MTU 9000 and framesz 8192 for 4 KiB frames.
# Bad input: an interface that does not exist.
TIERS+=(tier4_af_packet)

tier4_af_packet() {
    tier_begin "tier 4 af_packet"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    local na="${RUN_ID}na" nb="${RUN_ID}nb" va="${RUN_ID}va" vb="${RUN_ID}vb" n ok=1
    track_netns "$na"
    track_netns "$nb"
    ip netns add "$na" && ip netns add "$nb" &&
        ip link add "$va" netns "$na" mtu 9000 type veth peer name "$vb" netns "$nb" mtu 9000 || ok=0
    for n in "$na" "$nb"; do
        # No IPv6 on the test link: keeps the kernel's own frames (router solicitations, MLD) off it. Written via
        # /proc rather than sysctl(8), which a minimal Debian lacks (procps).
        ip netns exec "$n" sh -c 'echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6' || ok=0
        ip -n "$n" link set lo up || ok=0
    done
    ip -n "$na" link set "$va" up && ip -n "$nb" link set "$vb" up || ok=0
    check "two namespaces with a veth pair (MTU 9000) between them" test "$ok" -eq 1
    if [[ $ok -ne 1 ]]; then tier_end; return; fi

    local pa="${RUN_ID}t4a" pb="${RUN_ID}t4b" alog="$LOG_DIR/tier4-af-packet-a.log" blog="$LOG_DIR/tier4-af-packet-b.log"
    local arc=0 brc=0 apid
    track_prefix "$pa"
    track_prefix "$pb"
    ip netns exec "$na" "$PORTTEST" af-packet --iface "$va" --lcore 0 --file-prefix "$pa" >"$alog" 2>&1 &
    apid=$!
    track_pid "$apid"
    timeout 120 ip netns exec "$nb" "$PORTTEST" af-packet --iface "$vb" --lcore 1 --file-prefix "$pb" >"$blog" 2>&1 || brc=$?
    wait_pid "$apid" 30 || arc=$?
    check "af_packet side a: exit status 0 (got $arc)" test "$arc" -eq 0
    check "af_packet side b: exit status 0 (got $brc)" test "$brc" -eq 0
    tool_checks "$alog"
    tool_checks "$blog"
    local left
    left=$(prefix_leftovers "$pa"; prefix_leftovers "$pb")
    check "af_packet pair: nothing left behind${left:+ ($left)}" test -z "$left"

    expect_setup_error "af_packet on an interface that does not exist" "${RUN_ID}t4x" "rte_vdev_init failed: No such device" -- \
        ip netns exec "$na" "$PORTTEST" af-packet --iface "${RUN_ID}nx" --lcore 0 --file-prefix "${RUN_ID}t4x"

    cleanup_all
    check "namespaces removed" bash -c "! ip netns list | grep -q '^$RUN_ID'"
    TIER_NOTE="($(grep -m1 '^RESULT' "$blog" | grep -Eo 'rx [0-9]+ frames' | head -1) each way, $(grep -m1 '^RESULT' "$blog" | grep -Eo 'retransmitted [0-9]+' | cut -d' ' -f2) retransmitted)"
    tier_end
}
