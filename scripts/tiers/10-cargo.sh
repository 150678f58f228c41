# Tier 1: cargo test --workspace (no EAL needed), the protocol core without DPDK, and the one-line build hints when
# libdpdk is missing or too old, and the API documentation without a rustdoc warning.
TIERS+=(tier1_cargo)

# cargo_counts LOG: add the passed/failed counts of every "test result:" line in LOG (also in CARGO_PASSED and
# CARGO_FAILED); print the failing tests.
cargo_counts() {
    CARGO_PASSED=$(grep -E '^test result: ' "$1" | grep -Eo '[0-9]+ passed' | awk '{s += $1} END {print s + 0}')
    CARGO_FAILED=$(grep -E '^test result: ' "$1" | grep -Eo '[0-9]+ failed' | awk '{s += $1} END {print s + 0}')
    add_counts "$CARGO_PASSED" "$CARGO_FAILED"
    grep -E '^test .* FAILED$' "$1" | head -n 20 | sed 's/^/  /' || true
}

tier1_cargo() {
    tier_begin "tier 1 cargo test"
    local log="$LOG_DIR/tier1-cargo-test.log" rc=0 empty="$LOG_DIR/empty-pkgconfig"
    cargo test --locked --workspace >"$log" 2>&1 || rc=$?
    cargo_counts "$log"
    if [[ $rc -ne 0 && $CARGO_FAILED -eq 0 ]]; then
        fail "cargo test --workspace exited $rc without a test failure: $(grep -m1 '^error' "$log")"
    fi
    local ws=$CARGO_PASSED

    # The protocol core builds and passes without DPDK: pkg-config finds no libdpdk here.
    mkdir -p "$empty"
    log="$LOG_DIR/tier1-core-no-dpdk.log"
    rc=0
    PKG_CONFIG_LIBDIR="$empty" PKG_CONFIG_PATH="" cargo test --locked -p roce-dp --no-default-features >"$log" 2>&1 || rc=$?
    cargo_counts "$log"
    if [[ $rc -ne 0 && $CARGO_FAILED -eq 0 ]]; then
        fail "cargo test -p roce-dp --no-default-features exited $rc: $(grep -m1 '^error' "$log")"
    fi
    local core=$CARGO_PASSED

    # Without libdpdk, `cargo build` stops with one line naming scripts/setup.sh, not a wall of compiler errors.
    # (A separate target directory, so the normal build is not invalidated.)
    log="$LOG_DIR/tier1-build-without-dpdk.log"
    rc=0
    PKG_CONFIG_LIBDIR="$empty" PKG_CONFIG_PATH="" cargo build --locked --workspace \
        --target-dir "$ROOT/target/no-dpdk-check" >"$log" 2>&1 || rc=$?
    check "build without libdpdk fails (exit $rc)" test "$rc" -ne 0
    check "build without libdpdk: one line names scripts/setup.sh" test "$(grep -c 'scripts/setup.sh' "$log")" -eq 1
    check "build without libdpdk: no compiler errors" bash -c "! grep -q 'error\[E' '$log'"

    # An unsupported DPDK (a fake libdpdk.pc saying 21.11) is refused with one line too.
    local fake="$LOG_DIR/fake-pkgconfig"
    mkdir -p "$fake"
    printf 'Name: DPDK\nDescription: fake\nVersion: 21.11.0\nCflags:\nLibs:\n' >"$fake/libdpdk.pc"
    log="$LOG_DIR/tier1-build-old-dpdk.log"
    rc=0
    PKG_CONFIG_LIBDIR="$fake" PKG_CONFIG_PATH="" cargo build --locked -p dpdk-sys \
        --target-dir "$ROOT/target/no-dpdk-check" >"$log" 2>&1 || rc=$?
    check "build against DPDK 21.11 fails (exit $rc) with one line: not a supported release" \
        test "$rc" -ne 0 -a "$(grep -c 'not a supported release.*scripts/setup.sh' "$log")" -eq 1

    # The API documentation builds without a warning (broken or private intra-doc links).
    log="$LOG_DIR/tier1-doc.log"
    rc=0
    RUSTDOCFLAGS="-D warnings" cargo doc --locked --workspace --no-deps >"$log" 2>&1 || rc=$?
    check "cargo doc --workspace --no-deps: no warning (exit $rc$( ((rc)) && echo ": $(grep -m1 -E '^(warning|error)' "$log")"))" \
        test "$rc" -eq 0
    TIER_NOTE="(cargo test --workspace: $ws, roce-dp without DPDK: $core, build hints: 4, docs: 1)"
    tier_end
}
