# Linux rxe guests for the interop harness (sourced by scripts/interop-rxe.sh, not run).
#
# Approach from ../shared/rxe-peer/: Debian bookworm's own kernel (apt-get download + dpkg -x, never installed),
# qemu-system-x86 unpacked from its .debs (apt-installing it would remove the backports qemu-utils here), and a
# busybox initramfs holding rdma_rxe, rdma-core's rxe provider and perftest. Guests run under TCG (KVM does not
# start here), one vCPU each; a control shell (busybox nc) on the management NIC runs commands in them.
#
# Everything downloaded or built lives in $IOP_CACHE (default target/interop-cache); a second run reuses it.
# Per-run state (consoles, pidfiles) lives in $IOP_RUN. Callers set both and track every guest's PID.

IOP_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
IOP_CACHE="${IOP_CACHE:-$ROOT/target/interop-cache}"
IOP_PACKAGES=(busybox-static rdma-core ibverbs-providers ibverbs-utils perftest iproute2 nftables kmod cpio
    libcapstone4 libfdt1 libpmem1 libslirp0 libvdeplug2)
IOP_CTL_PORT=5000

# iop_packages: install the host packages the guest image and QEMU need (idempotent).
iop_packages() {
    local p missing=()
    for p in "${IOP_PACKAGES[@]}"; do
        [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" == "install ok installed" ]] || missing+=("$p")
    done
    [[ ${#missing[@]} -eq 0 ]] && return 0
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; }
}

# iop_kernel: $IOP_CACHE/kroot/boot/vmlinuz-$KV + depmod'ed modules; $IOP_CACHE/KV names the version.
iop_kernel() {
    [[ -s "$IOP_CACHE/KV" && -f "$IOP_CACHE/kroot/boot/vmlinuz-$(cat "$IOP_CACHE/KV")" ]] && return 0
    local pkg kv
    # linux-image-amd64 is a metapackage; its Depends names the real image package.
    pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
    [[ -n "$pkg" ]] || { echo "interop: no linux-image package behind linux-image-amd64" >&2; return 1; }
    kv=${pkg#linux-image-}
    mkdir -p "$IOP_CACHE/debs" "$IOP_CACHE/kroot"
    (cd "$IOP_CACHE/debs" && { compgen -G "${pkg}_*.deb" >/dev/null || apt-get download -q "$pkg"; }) || return 1
    dpkg -x "$IOP_CACHE"/debs/"${pkg}"_*.deb "$IOP_CACHE/kroot" && depmod -b "$IOP_CACHE/kroot" "$kv" || return 1
    echo "$kv" >"$IOP_CACHE/KV"
}

# iop_qemu: qemu-system-x86_64 unpacked under $IOP_CACHE/qroot, firmware links in $IOP_CACHE/fw (for -L).
iop_qemu() {
    local q="$IOP_CACHE/qroot/usr/bin/qemu-system-x86_64" f
    [[ -x "$q" ]] && "$q" --version >/dev/null 2>&1 && return 0
    mkdir -p "$IOP_CACHE/debs" "$IOP_CACHE/qroot" "$IOP_CACHE/fw"
    (cd "$IOP_CACHE/debs" && apt-get download -q qemu-system-x86 qemu-system-common qemu-system-data seabios ipxe-qemu) ||
        return 1
    for f in "$IOP_CACHE"/debs/{qemu-system-x86,qemu-system-common,qemu-system-data,seabios,ipxe-qemu}_*.deb; do
        dpkg -x "$f" "$IOP_CACHE/qroot" || return 1
    done
    # qemu-system-data's symlinks are absolute and dangle when unpacked: point -L at resolved copies.
    for f in "$IOP_CACHE"/qroot/usr/share/qemu/* "$IOP_CACHE"/qroot/usr/share/seabios/* "$IOP_CACHE"/qroot/usr/lib/ipxe/qemu/*; do
        ln -sf "$(readlink -f "$f")" "$IOP_CACHE/fw/$(basename "$f")"
    done
    if ldd "$q" | grep 'not found' >&2; then return 1; fi
    "$q" --version >/dev/null
}

# iop_copy_with_libs ROOT FILE...: copy each file and every shared library it needs into ROOT.
iop_copy_with_libs() {
    local r="$1" f
    shift
    for f in "$@"; do mkdir -p "$r$(dirname "$f")" && cp "$f" "$r$f"; done
    iop_copy_libs "$r" "$@"
}

# iop_copy_libs ROOT FILE...: copy every shared library the files need (ldd) into ROOT, at the same paths.
iop_copy_libs() {
    local r="$1" f lib
    shift
    for f in "$@"; do ldd "$f" | awk '/=> \//{print $3} /^\t\/lib64/{print $1}'; done | sort -u |
        while read -r lib; do
            mkdir -p "$r$(dirname "$lib")"
            cp "$(readlink -f "$lib")" "$r$(dirname "$lib")/$(basename "$lib")"
        done
}

# iop_initramfs: $IOP_CACHE/rxe-initrd.cpio.gz (rebuilt when guest-init.sh or the kernel is newer).
iop_initramfs() {
    local img="$IOP_CACHE/rxe-initrd.cpio.gz" kv r ko rel b bins=()
    kv=$(cat "$IOP_CACHE/KV")
    [[ -s "$img" && "$img" -nt "$IOP_HERE/guest-init.sh" && "$img" -nt "$IOP_CACHE/KV" ]] && return 0
    r="$IOP_CACHE/initramfs"
    rm -rf "$r"
    mkdir -p "$r"/{bin,sbin,etc,proc,sys,dev,tmp,run,lib64,usr/bin,usr/sbin,etc/libibverbs.d}
    cp /bin/busybox "$r/bin/busybox" && ln -s busybox "$r/bin/sh" || return 1
    # Modules: the closure of what the guest's init loads.
    for b in virtio_pci virtio_net crc32_generic ib_core ib_uverbs rdma_rxe; do
        modprobe -d "$IOP_CACHE/kroot" -S "$kv" --show-depends "$b" | awk '/^insmod/{print $2}'
    done | sort -u | while read -r ko; do
        rel=${ko#"$IOP_CACHE"/kroot/}
        mkdir -p "$r/$(dirname "$rel")" && cp "$ko" "$r/$rel"
    done
    cp "$IOP_CACHE/kroot/lib/modules/$kv"/modules.{order,builtin,builtin.modinfo} "$r/lib/modules/$kv/" 2>/dev/null
    depmod -b "$r" "$kv" || return 1
    for b in ibv_devinfo rdma ip ib_send_bw ib_send_lat ib_write_bw ib_write_lat ib_read_bw ib_read_lat \
        ib_atomic_bw ib_atomic_lat; do
        bins+=("$(command -v "$b")") || { echo "interop: $b not installed" >&2; return 1; }
    done
    iop_copy_with_libs "$r" "${bins[@]}" /usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so || return 1
    cp /etc/libibverbs.d/rxe.driver "$r/etc/libibverbs.d/"   # only rxe: no probing of other providers
    cp /lib64/ld-linux-x86-64.so.2 "$r/lib64/" 2>/dev/null
    echo "root:x:0:0:root:/:/bin/sh" >"$r/etc/passwd"
    echo "root:x:0:" >"$r/etc/group"
    cp "$IOP_HERE/guest-init.sh" "$r/init" && chmod +x "$r/init"
    (cd "$r" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$img.tmp" && mv "$img.tmp" "$img"
}

# iop_prepare: packages, kernel, QEMU and the initramfs, all cached.
iop_prepare() {
    iop_packages || { echo "interop: package install failed" >&2; return 1; }
    iop_kernel || { echo "interop: kernel fetch failed" >&2; return 1; }
    iop_qemu || { echo "interop: qemu unpack failed" >&2; return 1; }
    iop_initramfs || { echo "interop: initramfs build failed" >&2; return 1; }
}

# iop_vm_start NAME DATA_TAP DATA_IP/LEN MGMT_TAP MGMT_IP/LEN MAC_SUFFIX [kernel args...]: start a daemonized
# guest (serial console in $IOP_RUN/NAME.console, pidfile $IOP_RUN/NAME.pid); prints the PID. Call it inside the
# namespace (the taps live there).
iop_vm_start() {
    local n="$1" dt="$2" dip="$3" mt="$4" mip="$5" s="$6" kv
    shift 6
    kv=$(cat "$IOP_CACHE/KV")
    rm -f "$IOP_RUN/$n.console" "$IOP_RUN/$n.pid"
    "$IOP_CACHE/qroot/usr/bin/qemu-system-x86_64" -L "$IOP_CACHE/fw" -name "rxe-$n" -accel tcg -cpu max \
        -m "${IOP_MEM:-768}" -smp 1 -display none -monitor none -serial "file:$IOP_RUN/$n.console" -no-reboot \
        -kernel "$IOP_CACHE/kroot/boot/vmlinuz-$kv" -initrd "$IOP_CACHE/rxe-initrd.cpio.gz" \
        -append "console=ttyS0 panic=-1 quiet rxe_ip=$dip mgmt_ip=$mip $*" \
        -netdev "tap,id=d0,ifname=$dt,script=no,downscript=no" -device "virtio-net-pci,netdev=d0,mac=52:54:00:50:00:$s" \
        -netdev "tap,id=m0,ifname=$mt,script=no,downscript=no" -device "virtio-net-pci,netdev=m0,mac=52:54:00:51:00:$s" \
        -daemonize -pidfile "$IOP_RUN/$n.pid" >&2 || return 1
    cat "$IOP_RUN/$n.pid"
}

# iop_vm_wait NAME SECONDS MGMT_IP: wait for the guest's "rxe-init: ready" line, rxe0 and its control shell;
# prints the boot time.
iop_vm_wait() {
    local n="$1" limit=$(($2 * 10)) i=0 t0=$SECONDS
    until grep -aq 'rxe-init: ready' "$IOP_RUN/$n.console" 2>/dev/null; do
        if [[ $i -ge $limit ]]; then
            echo "guest $n not ready after $2 s; console tail:" >&2
            tail -c 1500 "$IOP_RUN/$n.console" >&2
            return 1
        fi
        sleep 0.1
        i=$((i + 1))
    done
    grep -aq 'rxe0 on eth0 created' "$IOP_RUN/$n.console" || { echo "guest $n: rxe0 was not created" >&2; return 1; }
    # "ready" is printed as the control shell starts: wait until it answers (up to 10 s).
    i=0
    until [[ "$(iop_vmrun "$3" 'echo ctl-ok' 3 2>/dev/null)" == ctl-ok ]]; do
        [[ $i -ge 20 ]] && { echo "guest $n: control shell on $3 does not answer" >&2; return 1; }
        sleep 0.5
        i=$((i + 1))
    done
    echo "guest $n ready after $((SECONDS - t0)) s ($(grep -a -m1 'rxe-init: ready' "$IOP_RUN/$n.console" | tr -d '\r'))"
}

# iop_vm_stop NAME: stop a guest by its pidfile.
iop_vm_stop() {
    local f="$IOP_RUN/$1.pid" p
    [[ -f "$f" ]] || return 0
    p=$(cat "$f")
    kill -TERM "$p" 2>/dev/null
    rm -f "$f"
}

# iop_vmrun MGMT_IP 'command' [SECONDS]: run a shell command in a guest via its control shell; prints its output.
iop_vmrun() {
    local ip="$1" cmd="$2" t="${3:-120}"
    timeout "$t" bash -c 'exec 3<>"/dev/tcp/$1/$2" || exit 1; printf "( %s ) 2>&1\nexit\n" "$3" >&3; cat <&3' \
        _ "$ip" "$IOP_CTL_PORT" "$cmd"
}

# --- the steering guest (tier 12): rdp-nic on net_tap under Debian's kernel, whose tc modules net_tap's rte_flow needs

IOP_FLOW_MODULES=(tun bridge sch_multiq sch_ingress cls_flower act_skbedit act_gact act_mirred)
IOP_PMD_DIR=/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0

# iop_flow_initramfs IMG RDP_NIC RUNS_FILE: a busybox initramfs holding RDP_NIC and the shared libraries it loads, only
# the net_tap and mempool_ring plugins in DPDK's plugin directory (EAL loads every plugin found there), ip and tc
# from iproute2, the closure of IOP_FLOW_MODULES, /flow-runs (one "NAME ARGS..." line per rdp-nic run) and
# flow-guest-init.sh as /init. Built per run (the binary changes with every build); ~1 s.
iop_flow_initramfs() {
    local img="$1" nic="$2" runs="$3" kv r ko rel m p deps kos=()
    kv=$(cat "$IOP_CACHE/KV")
    r="$img.root"
    rm -rf "$r"
    mkdir -p "$r"/{bin,sbin,etc,proc,sys,dev,tmp,run,lib64,usr/bin,usr/sbin,"$IOP_PMD_DIR"}
    cp /bin/busybox "$r/bin/busybox" && ln -s busybox "$r/bin/sh" || return 1
    for m in "${IOP_FLOW_MODULES[@]}"; do
        deps=$(modprobe -d "$IOP_CACHE/kroot" -S "$kv" --show-depends "$m" | awk '/^insmod/{print $2}')
        [[ -n "$deps" ]] || { echo "interop: module $m not in kernel $kv" >&2; return 1; }
        kos+=($deps)
    done
    for ko in $(printf '%s\n' "${kos[@]}" | sort -u); do
        rel=${ko#"$IOP_CACHE"/kroot/}
        mkdir -p "$r/$(dirname "$rel")" && cp "$ko" "$r/$rel" || return 1
    done
    cp "$IOP_CACHE/kroot/lib/modules/$kv"/modules.{order,builtin,builtin.modinfo} "$r/lib/modules/$kv/" 2>/dev/null
    depmod -b "$r" "$kv" || return 1
    # The plugins under their .so names only: EAL would load a plugin twice under two names.
    for p in librte_net_tap librte_mempool_ring; do
        [[ -f "$IOP_PMD_DIR/$p.so" ]] || { echo "interop: $IOP_PMD_DIR/$p.so missing (libdpdk-dev)" >&2; return 1; }
        cp "$(readlink -f "$IOP_PMD_DIR/$p.so")" "$r$IOP_PMD_DIR/$p.so"
    done
    iop_copy_with_libs "$r" "$(command -v ip)" "$(command -v tc)" || return 1
    cp "$nic" "$r/usr/bin/rdp-nic" && iop_copy_libs "$r" "$nic" "$r$IOP_PMD_DIR"/*.so || return 1
    if ldd "$nic" "$r$IOP_PMD_DIR"/*.so | grep 'not found' >&2; then return 1; fi
    cp /lib64/ld-linux-x86-64.so.2 "$r/lib64/" 2>/dev/null
    echo "root:x:0:0:root:/:/bin/sh" >"$r/etc/passwd"
    echo "root:x:0:" >"$r/etc/group"
    cp "$runs" "$r/flow-runs" && cp "$IOP_HERE/flow-guest-init.sh" "$r/init" && chmod +x "$r/init" || return 1
    (cd "$r" && find . -print0 | cpio --null -o -H newc --quiet | gzip -1) >"$img.tmp" && mv "$img.tmp" "$img"
    rm -rf "$r"
}

# iop_flow_vm IMG CONSOLE OUT: boot the steering guest (2 vCPUs: rdp-nic pins its workers to cores 0 and 1; no
# NIC) in the background of the calling shell (so it can `wait` for it); its serial console goes to CONSOLE, the
# runs' output (ttyS1) to OUT. Sets IOP_FLOW_PID to QEMU's PID; the guest powers itself off when the runs are done.
iop_flow_vm() {
    local img="$1" con="$2" out="$3" kv
    kv=$(cat "$IOP_CACHE/KV")
    "$IOP_CACHE/qroot/usr/bin/qemu-system-x86_64" -L "$IOP_CACHE/fw" -name rdp-flow -accel tcg -cpu max \
        -m "${IOP_FLOW_MEM:-1536}" -smp 2 -display none -monitor none -nic none -no-reboot \
        -serial "file:$con" -serial "file:$out" \
        -kernel "$IOP_CACHE/kroot/boot/vmlinuz-$kv" -initrd "$img" \
        -append "console=ttyS0 panic=-1 quiet" </dev/null >/dev/null 2>"$con.qemu" &
    IOP_FLOW_PID=$!
}
