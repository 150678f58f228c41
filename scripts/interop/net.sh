# The interop lab's network, created INSIDE the harness's own network namespace (sourced; run every function under
# `ip netns exec NS`). Nothing here touches the machine's own namespace.
#
#   br-rxe  (data, RoCEv2 only, no host IP): tap-a0 (guest a eth0 10.50.0.1), tap-b0 (guest b eth0 10.50.0.2)
#   br-mgmt (management, host 10.51.0.254):  tap-a1 (a eth1 10.51.0.1), tap-b1 (b eth1 10.51.0.2),
#                                            tap-h1 (h eth1 10.51.0.3)
#   tap-h0  not bridged: guest h's RoCE wire (10.50.1.1), owned by our DPDK program with net_af_packet
#           (conf/rxe-peer.toml, our IP 10.50.1.2). perftest's TCP exchange runs over br-mgmt.
#           For the loss rows: br-h {tap-h0, vh0}, our program on vh1 (iop_wire_bridged).

iop_no_ipv6() { echo 1 >"/proc/sys/net/ipv6/conf/$1/disable_ipv6"; }

iop_bridge() {
    ip link add "$1" type bridge stp_state 0 forward_delay 0 && iop_no_ipv6 "$1" && ip link set "$1" up
}

# iop_tap NAME [BRIDGE]
iop_tap() {
    ip tuntap add dev "$1" mode tap && iop_no_ipv6 "$1" || return 1
    if [[ -n "${2:-}" ]]; then ip link set "$1" master "$2" || return 1; fi
    ip link set "$1" up
}

iop_net_up() {
    local t
    ip link set lo up && iop_no_ipv6 all && iop_no_ipv6 default || return 1
    iop_bridge br-rxe && iop_bridge br-mgmt && ip addr add 10.51.0.254/24 dev br-mgmt || return 1
    for t in tap-a0 tap-b0; do iop_tap "$t" br-rxe || return 1; done
    for t in tap-a1 tap-b1 tap-h1; do iop_tap "$t" br-mgmt || return 1; done
    iop_tap tap-h0
}

# iop_loss PCT | off: drop PCT % of the RoCEv2 (udp/4791) frames the bridges forward (both directions; counters in
# table bridge "iop"). tap-h0 is not bridged until iop_wire_bridged: af_packet sees a tap's frames before any
# ingress hook, and DPDK's af_packet transmits with PACKET_QDISC_BYPASS (no egress hook), so a drop on tap-h0
# itself would miss most frames.
iop_loss() {
    nft delete table bridge iop 2>/dev/null
    [[ "$1" == off ]] && return 0
    nft -f - <<NFT
table bridge iop {
    chain impair { type filter hook forward priority 0; policy accept;
        ether type ip udp dport 4791 numgen random mod 100 < $1 counter drop
    }
}
NFT
}

# iop_wire_bridged on MTU | off: put guest h's tap-h0 on bridge br-h with a veth pair vh0 (bridged) - vh1 (ours,
# for net_af_packet), so the loss rules act on its wire; "off" restores the direct tap-h0 layout.
iop_wire_bridged() {
    if [[ $1 == off ]]; then
        ip link del vh0 2>/dev/null
        ip link del br-h 2>/dev/null
        return 0
    fi
    iop_bridge br-h && ip link add vh0 mtu "$2" type veth peer name vh1 mtu "$2" &&
        ip link set tap-h0 master br-h && ip link set vh0 master br-h && ip link set vh0 up && ip link set vh1 up
}

# iop_loss_dropped: frames dropped by iop_loss so far (both tables).
iop_loss_dropped() {
    nft list ruleset 2>/dev/null | awk '/drop/ { for (i = 1; i < NF; i++) if ($i == "packets") n += $(i + 1) } END { print n + 0 }'
}
