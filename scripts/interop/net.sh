# The interop lab's network, created INSIDE the harness's own network namespace (sourced; run every function under
# `ip netns exec NS`). Nothing here touches the machine's own namespace.
#
#   br-rxe  (data, RoCEv2 only, no host IP): tap-a0 (guest a eth0 10.50.0.1), tap-b0 (guest b eth0 10.50.0.2)
#   br-mgmt (management, host 10.51.0.254):  tap-a1 (a eth1 10.51.0.1), tap-b1 (b eth1 10.51.0.2),
#                                            tap-h1 (h eth1 10.51.0.3)
#   tap-h0  not bridged: guest h's RoCE wire (10.50.1.1), owned by our DPDK program with net_af_packet
#           (conf/rxe-peer.toml, our IP 10.50.1.2). perftest's TCP exchange runs over br-mgmt.

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

# iop_loss PCT | off: drop PCT % of the RoCEv2 (udp/4791) frames on the wires: br-rxe (guest to guest) and tap-h0
# (frames leaving the host towards guest h; frames from the guest reach af_packet before any ingress hook can drop
# them). Counters in table netdev/bridge "iop".
iop_loss() {
    nft delete table bridge iop 2>/dev/null
    nft delete table netdev iop 2>/dev/null
    [[ "$1" == off ]] && return 0
    nft -f - <<NFT
table bridge iop {
    chain impair { type filter hook forward priority 0; policy accept;
        ether type ip udp dport 4791 numgen random mod 100 < $1 counter drop
    }
}
table netdev iop {
    chain impair { type filter hook egress device "tap-h0" priority 0; policy accept;
        ether type ip udp dport 4791 numgen random mod 100 < $1 counter drop
        ether type ip udp dport 4791 counter
    }
}
NFT
}

# iop_loss_dropped: frames dropped by iop_loss so far (both tables).
iop_loss_dropped() {
    nft list ruleset 2>/dev/null | awk '/drop/ { for (i = 1; i < NF; i++) if ($i == "packets") n += $(i + 1) } END { print n + 0 }'
}
