#!/usr/bin/env bash
# Install what building and testing roce-dp needs on Debian 12 (bookworm), idempotently.
#
#   scripts/setup.sh                 packages (+ Rust if missing); prints what it changed, or that all is in place
#   scripts/setup.sh --hugepages N   also reserve N 2 MiB hugepages and mount hugetlbfs on /dev/hugepages
#   scripts/setup.sh --check         change nothing; exit 1 if something is missing
#
# Packages (measured minimal set, see ../shared/docs/DPDK-NOTES.md): libdpdk-dev (DPDK 22.11 LTS, all PMDs),
# libclang1-14 + libclang-common-14-dev (bindgen: libclang and its stddef.h), pkg-config, build-essential (cc for
# the C shim), iproute2 (network namespaces and veth pairs for the af_packet tier), ca-certificates (cargo fetches
# crates over https), time (GNU time: tier 9 reads a client's context switches), tshark (tier 1 checks how
# Wireshark decodes the CNPs the engine builds; Debian 12 ships 4.0.17, bookworm-backports has no Wireshark, and no
# Debian Wireshark up to 4.6.9 names opcode 0x81), curl (rustup, only when Rust is missing). Rust >= 1.89
# (rust-version in Cargo.toml) comes from rustup: Debian 12 ships 1.63.
# For the QEMU guest of tier 12 (scripts/interop/guest.sh; Debian's kernel and qemu-system-x86 .debs are fetched
# with apt-get download and unpacked, never installed): busybox-static, cpio and kmod (the initramfs) and the
# shared libraries qemu-system-x86_64 7.2 links (its package's Depends that a minimal system lacks).
set -euo pipefail

PACKAGES=(libdpdk-dev libclang1-14 libclang-common-14-dev pkg-config build-essential iproute2 ca-certificates time tshark
    busybox-static cpio kmod
    libaio1 libcapstone4 libfdt1 libfuse3-3 libglib2.0-0 libgnutls30 libjpeg62-turbo libnuma1 libpixman-1-0 libpmem1
    libpng16-16 librdmacm1 libsasl2-2 libseccomp2 libslirp0 liburing2 libvdeplug2 libzstd1)
RUST_MIN=1.89
hugepages=""
check_only=0

while [[ $# -gt 0 ]]; do
    case "$1" in
        --hugepages) hugepages="${2:?--hugepages needs a number}"; shift 2 ;;
        --hugepages=*) hugepages="${1#*=}"; shift ;;
        --check) check_only=1; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "setup.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
if [[ -n "$hugepages" && ! "$hugepages" =~ ^[0-9]+$ ]]; then
    echo "setup.sh: --hugepages wants a number of 2 MiB pages, got '$hugepages'" >&2
    exit 2
fi

changed=()
need_root() {
    if [[ $(id -u) -ne 0 ]]; then
        echo "setup.sh: $1 needs root; run: sudo scripts/setup.sh $*" >&2
        exit 1
    fi
}

# --- Debian packages -------------------------------------------------------------------------------------------
missing=()
for p in "${PACKAGES[@]}"; do
    if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
        missing+=("$p")
    fi
done
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ $check_only -eq 1 ]]; then
        echo "setup.sh: missing packages: ${missing[*]}"
        exit 1
    fi
    need_root "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt_log=$(mktemp)
    if ! { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >"$apt_log" 2>&1; then
        tail -n 20 "$apt_log" >&2
        rm -f "$apt_log"
        echo "setup.sh: apt-get install ${missing[*]} failed" >&2
        exit 1
    fi
    rm -f "$apt_log"
    changed+=("installed ${missing[*]}")
fi

# --- Rust -------------------------------------------------------------------------------------------------------
# shellcheck disable=SC1091
[[ -f "$HOME/.cargo/env" ]] && source "$HOME/.cargo/env"
rust_ok() {
    local v
    v=$(cargo --version 2>/dev/null | awk '{print $2}') || return 1
    [[ -n "$v" ]] && [[ "$(printf '%s\n%s\n' "$RUST_MIN" "$v" | sort -V | head -1)" == "$RUST_MIN" ]]
}
if ! rust_ok; then
    if [[ $check_only -eq 1 ]]; then
        echo "setup.sh: Rust >= $RUST_MIN (cargo) is missing"
        exit 1
    fi
    if command -v rustup >/dev/null; then
        rustup toolchain install stable --profile minimal --component rustfmt,clippy >/dev/null
        rustup default stable >/dev/null
    else
        for p in curl; do
            if [[ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" != "install ok installed" ]]; then
                need_root "installing $p"
                DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 ||
                    { echo "setup.sh: apt-get install $p failed" >&2; exit 1; }
                changed+=("installed $p")
            fi
        done
        if ! curl -sSf --proto '=https' --tlsv1.2 https://sh.rustup.rs -o /tmp/rustup-init.sh ||
            ! sh /tmp/rustup-init.sh -y -q --profile minimal --component rustfmt,clippy >/dev/null; then
            echo "setup.sh: could not install Rust >= $RUST_MIN with rustup; install it (https://rustup.rs) and rerun" >&2
            exit 1
        fi
        rm -f /tmp/rustup-init.sh
        # shellcheck disable=SC1091
        source "$HOME/.cargo/env"
    fi
    rust_ok || { echo "setup.sh: Rust >= $RUST_MIN still missing after rustup" >&2; exit 1; }
    changed+=("installed Rust $(cargo --version | awk '{print $2}') with rustup (cargo in ~/.cargo/bin)")
fi

# --- Hugepages (optional: the tests and scripts/run.sh use --no-huge) -------------------------------------------
if [[ -n "$hugepages" ]]; then
    current=$(cat /proc/sys/vm/nr_hugepages)
    if [[ "$current" -lt "$hugepages" ]]; then
        [[ $check_only -eq 1 ]] && { echo "setup.sh: $current hugepages reserved, $hugepages wanted"; exit 1; }
        need_root "reserving hugepages"
        echo "$hugepages" >/proc/sys/vm/nr_hugepages
        got=$(cat /proc/sys/vm/nr_hugepages)
        changed+=("reserved hugepages: $current -> $got (of 2 MiB)")
        [[ "$got" -lt "$hugepages" ]] && echo "setup.sh: warning: only $got of $hugepages hugepages could be reserved" >&2
    fi
    if ! mountpoint -q /dev/hugepages; then
        [[ $check_only -eq 1 ]] && { echo "setup.sh: /dev/hugepages is not mounted"; exit 1; }
        need_root "mounting hugetlbfs"
        mkdir -p /dev/hugepages
        mount -t hugetlbfs nodev /dev/hugepages
        changed+=("mounted hugetlbfs on /dev/hugepages")
    fi
fi

# --- Report -----------------------------------------------------------------------------------------------------
if ! pkg-config --exists libdpdk; then
    echo "setup.sh: pkg-config still cannot find libdpdk after installing libdpdk-dev" >&2
    exit 1
fi
huge_note=""
[[ -n "$hugepages" ]] && huge_note=", $(cat /proc/sys/vm/nr_hugepages) hugepages on /dev/hugepages"
if [[ ${#changed[@]} -eq 0 ]]; then
    echo "setup: nothing to do (DPDK $(pkg-config --modversion libdpdk), $(cargo --version | awk '{print "cargo", $2}'), all packages in place$huge_note)"
else
    for c in "${changed[@]}"; do echo "setup: $c"; done
    echo "setup: done (DPDK $(pkg-config --modversion libdpdk), $(cargo --version | awk '{print "cargo", $2}'))"
fi
