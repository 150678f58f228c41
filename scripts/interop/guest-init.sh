#!/bin/sh
# /init of the interop guest (busybox + rdma_rxe + perftest), built by scripts/interop/guest.sh.
# Kernel command line:
#   rxe_ip=A/LEN    eth0 (the RoCE wire; rxe0 is bound to it)
#   mgmt_ip=A/LEN   eth1 (management: control shell and perftest's TCP exchange)
#   rxe_mtu=N       eth0's MTU (rxe's active_mtu follows: 1500 -> 1024, 9000 -> 4096); default 1500
# Prints "rxe-init: rxe0 on eth0 created" and "rxe-init: ready" on the serial console.
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /sbin /usr/bin /usr/sbin
/bin/busybox --install -s /bin
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mkdir -p /dev/pts && mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp

rxe_ip=""
mgmt_ip=""
rxe_mtu=1500
for a in $(cat /proc/cmdline); do
    case "$a" in
        rxe_ip=*) rxe_ip=${a#rxe_ip=} ;;
        mgmt_ip=*) mgmt_ip=${a#mgmt_ip=} ;;
        rxe_mtu=*) rxe_mtu=${a#rxe_mtu=} ;;
    esac
done
for m in virtio_pci virtio_net crc32_generic ib_core ib_uverbs rdma_rxe; do
    modprobe "$m" || echo "rxe-init: modprobe $m FAILED"
done
i=0
while { [ ! -e /sys/class/net/eth0 ] || [ ! -e /sys/class/net/eth1 ]; } && [ $i -lt 50 ]; do
    sleep 0.1
    i=$((i + 1))
done
ip link set lo up
ip link set eth0 mtu "$rxe_mtu"
[ -n "$rxe_ip" ] && ip addr add "$rxe_ip" dev eth0
ip link set eth0 up
[ -n "$mgmt_ip" ] && ip addr add "$mgmt_ip" dev eth1
ip link set eth1 up
rdma link add rxe0 type rxe netdev eth0 && echo "rxe-init: rxe0 on eth0 created"
# Control shell for the host: printf 'cmd\nexit\n' | nc MGMT_IP 5000
(while true; do nc -ll -p 5000 -e /bin/sh; sleep 1; done) </dev/null >/dev/null 2>&1 &
echo "rxe-init: ready $(cut -d' ' -f1 /proc/uptime) s after kernel start"
exec setsid cttyhack /bin/sh
