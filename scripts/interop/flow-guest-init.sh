#!/bin/sh
# /init of the steering guest (busybox + rdp-nic + net_tap + the tc modules net_tap's rte_flow needs), built by
# iop_flow_initramfs in scripts/interop/guest.sh for tier 12 (scripts/tiers/96-tap-flow-guest.sh).
#
# It loads the modules, creates bridge br0, then runs rdp-nic once per line of /flow-runs ("NAME ARGS...": rdp-nic
# tap --bridge br0 --workers 2 --timeout 90 --stats --hold ARGS). When a run is done and holds
# its rules and ports (--hold), it takes `tc -s filter show` of both tap interfaces (the rules net_tap put on their
# multiq qdisc, with the frames each matched; iproute2's tc: busybox sh runs its own applets before PATH), then
# lets rdp-nic finish.
# Everything goes to the second serial port (ttyS1, a file on the host) between marker lines:
#   @@begin NAME            the run's stdout and stderr
#   @@tc NAME IFACE         IFACE's filters at the end of the run
#   @@end NAME rc=N         N: rdp-nic's exit status
#   @@setup ...             a setup step that failed (the host fails the tier with it)
#   @@done                  all runs finished
# Then it powers the guest off (QEMU runs with -no-reboot and exits).
/bin/busybox mkdir -p /proc /sys /dev /tmp /run /var/run /sbin /usr/bin /usr/sbin
/bin/busybox --install -s /bin
export PATH=/usr/bin:/usr/sbin:/bin:/sbin
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /run
mount -t tmpfs tmpfs /var/run
out=/dev/ttyS1
stty -F "$out" raw -echo 2>/dev/null
say() { echo "$*" >"$out"; }

for m in tun bridge sch_multiq sch_ingress cls_flower act_skbedit act_gact act_mirred; do
    modprobe "$m" || say "@@setup modprobe $m failed"
done
echo 1 >/proc/sys/net/ipv6/conf/all/disable_ipv6
echo 1 >/proc/sys/net/ipv6/conf/default/disable_ipv6
ip link set lo up
{ ip link add br0 type bridge forward_delay 0 stp_state 0 && ip link set br0 up; } >/tmp/br.log 2>&1 ||
    say "@@setup bridge br0: $(cat /tmp/br.log)"
say "@@guest kernel $(uname -r), $(nproc) CPUs, $(grep -c . /proc/modules) modules, up $(cut -d' ' -f1 /proc/uptime) s"

n=0
while read -r name args; do
    [ -n "$name" ] || continue
    n=$((n + 1))
    rm -f /tmp/tc-rdptap0 /tmp/tc-rdptap1 /tmp/hold
    mkfifo /tmp/hold
    t0=$(cut -d' ' -f1 /proc/uptime)
    # --hold: after the run rdp-nic prints HOLD and keeps its rules and ports until its stdin (the fifo) closes.
    # shellcheck disable=SC2086
    rdp-nic tap --bridge br0 --workers 2 --file-prefix "fg$n" --timeout 90 --stats --hold $args \
        </tmp/hold >/tmp/run.log 2>&1 &
    pid=$!
    exec 3>/tmp/hold
    while kill -0 "$pid" 2>/dev/null && ! grep -q '^HOLD' /tmp/run.log; do
        sleep 0.2
    done
    if grep -q '^HOLD' /tmp/run.log; then
        for i in rdptap0 rdptap1; do
            /usr/sbin/tc -s filter show dev "$i" parent 1: >"/tmp/tc-$i" 2>&1
        done
    fi
    exec 3>&-
    wait "$pid"
    rc=$?
    say "@@begin $name"
    cat /tmp/run.log >"$out"
    for i in rdptap0 rdptap1; do
        if [ -f "/tmp/tc-$i" ]; then
            say "@@tc $name $i"
            cat "/tmp/tc-$i" >"$out"
        fi
    done
    say "@@end $name rc=$rc seconds=$(awk -v a="$t0" -v b="$(cut -d' ' -f1 /proc/uptime)" 'BEGIN { printf "%.1f", b - a }')"
done </flow-runs
say "@@done"
sync
poweroff -f
