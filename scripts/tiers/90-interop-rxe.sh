# Tier 10: interop with Linux Soft-RoCE (rdma_rxe + perftest 4.5 in a QEMU guest, TCG), through
# scripts/interop-rxe.sh --matrix: the CI subset of the matrix, one check per row. It installs and downloads what it
# needs itself (host packages, Debian's kernel and qemu-system-x86 .debs; cached in target/interop-cache, so a
# repeated run skips them). A missing QEMU or a guest that does not boot fails the tier with the harness's line.
# CI subset (every test, both directions, a loss row, an MTU 4096 row, the cheapest -a, -b and -D rows): the eight
# tests at 4 KiB (atomics: 8 B) and path MTU 1024, write_bw at 4 KiB and path MTU 4096, write_bw at 64 KiB with 5%
# loss, our write_bw client with -a (every size, 2 B .. 8 MiB), perftest's send_bw client against our server with -b
# and with -D 3, our write_bw client with -D 3. The full matrix (sizes 64 B / 4 KiB / 64 KiB x MTU 1024 / 4096,
# write_bw and read_bw with loss, the -a/-b/-D rows both ways): scripts/interop-rxe.sh --matrix (README).
TIERS+=(tier9_interop_rxe)

IOP_CI_ROWS='^(send_bw|write_bw|read_bw|send_lat|write_lat|read_lat) .* 4096 mtu1024$|^atomic_(bw|lat) .* mtu1024$|^write_bw .* 4096 mtu4096$|^write_bw .* loss5%$'
IOP_CI_ROWS+='|^write_bw rdp->perftest -a mtu1024$|^send_bw perftest->rdp 4096 -(b|D3) mtu1024$|^write_bw rdp->perftest 4096 -D3 mtu1024$'

tier9_interop_rxe() {
    tier_begin "tier 10 interop with Linux rxe"
    if [[ $BUILD_OK -ne 1 ]]; then fail "build failed"; tier_end; return; fi
    local out="$LOG_DIR/tier9-interop.log" rc=0 line name res rows=0
    ROWS="$IOP_CI_ROWS" bash "$ROOT/scripts/interop-rxe.sh" --matrix >"$out" 2>&1 || rc=$?
    # The matrix as printed: "  NAME<pad> pass|FAILED DETAIL" lines between "interop matrix:" and the summary.
    while IFS= read -r line; do
        name=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "pass" || $i == "FAILED") { NF = i - 1; print; exit } }' <<<"$line")
        res=$(awk '{ for (i = 1; i <= NF; i++) if ($i == "pass" || $i == "FAILED") { print $i; exit } }' <<<"$line")
        [[ -n "$name" ]] || continue
        rows=$((rows + 1))
        if [[ $res == pass ]]; then pass "interop: $line"; else fail "interop: $line"; fi
    done < <(sed -n '/^interop matrix:/,/^interop: passed=/p' "$out" | sed '1d;$d' | sed 's/^  //')
    # Rows the harness could not reach (prepare, lab network, QEMU) show up only in its last lines.
    if [[ $rows -eq 0 ]]; then
        fail "interop: no matrix rows (exit $rc): $(grep -m1 -E 'FAILED|failed' "$out" || tail -n 2 "$out" | head -n 1)"
    fi
    check "interop-rxe.sh exit 0 (got $rc)" test "$rc" -eq 0
    TIER_NOTE="(CI subset: $rows rows of the matrix; the full matrix: scripts/interop-rxe.sh --matrix; $(grep -m1 '^interop: kernel' "$out" | sed 's/^interop: //; s/ (.*//'))"
    tier_end
}
