//! Build script for dpdk-sys: find the system DPDK with pkg-config, check its version, compile the C shim and
//! generate allowlist-only bindings with bindgen.
//!
//! Both cc and bindgen get the RAW `pkg-config --cflags libdpdk` output: it carries `-include rte_config.h` and
//! `-march=...`, which the pkg-config crate's parsed include paths would drop. Every failure the user can fix
//! (no libdpdk, wrong version, no libclang) stops the build with one `cargo::error` line naming scripts/setup.sh.

use std::env;
use std::path::PathBuf;
use std::process::Command;

#[path = "build/version.rs"]
mod version;

/// The hint every fixable failure ends with.
const HINT: &str = "run scripts/setup.sh as root (installs libdpdk-dev libclang1-14 libclang-common-14-dev pkg-config)";

/// Driver libraries the bindings call directly. pkg-config lists only the core libraries, not the PMDs.
const DRIVER_LIBS: &[&str] = &["rte_net_ring", "rte_bus_vdev"];

/// Exported (non-inline) functions the project calls. The shim's `rte_*_` functions are added by pattern.
const FUNCTIONS: &[&str] = &[
    "rte_version",
    "rte_eal_init",
    "rte_eal_cleanup",
    "rte_eal_get_runtime_dir",
    "rte_strerror",
    "rte_openlog_stream",
    "rte_lcore_count",
    "rte_get_main_lcore",
    "rte_socket_id",
    "rte_pktmbuf_pool_create",
    "rte_mempool_free",
    "rte_mempool_avail_count",
    "rte_mempool_in_use_count",
    "rte_ring_create",
    "rte_ring_free",
    "rte_thread_register",
    "rte_thread_unregister",
    "rte_vdev_init",
    "rte_vdev_uninit",
    "rte_eth_from_rings",
    "rte_eth_dev_count_avail",
    "rte_eth_dev_is_valid_port",
    "rte_eth_dev_get_port_by_name",
    "rte_eth_dev_get_name_by_port",
    "rte_eth_dev_socket_id",
    "rte_eth_dev_info_get",
    "rte_eth_dev_configure",
    "rte_eth_dev_adjust_nb_rx_tx_desc",
    "rte_eth_rx_queue_setup",
    "rte_eth_tx_queue_setup",
    "rte_eth_dev_start",
    "rte_eth_dev_stop",
    "rte_eth_dev_close",
    "rte_eth_link_get_nowait",
    "rte_eal_alarm_set",
    "rte_eal_alarm_cancel",
    "rte_eth_stats_get",
    "rte_eth_stats_reset",
    "rte_eth_dev_set_mtu",
    "rte_eth_dev_get_mtu",
    "rte_eth_macaddr_get",
    "rte_eth_promiscuous_enable",
    "rte_flow_validate",
    "rte_flow_create",
    "rte_flow_destroy",
    "rte_flow_flush",
    "rte_eth_dev_rss_hash_conf_get",
    "rte_eth_dev_rss_reta_query",
];

/// Types the project names (their dependencies come in automatically).
const TYPES: &[&str] = &[
    "rte_mbuf",
    "rte_mempool",
    "rte_ring",
    "rte_eth_conf",
    "rte_eth_dev_info",
    "rte_eth_link",
    "rte_eth_stats",
    "rte_ether_addr",
    "rte_flow_attr",
    "rte_flow_item",
    "rte_flow_action",
    "rte_flow_item_udp",
    "rte_flow_action_rss",
    "rte_flow_action_queue",
    "rte_flow_item_ipv4",
    "rte_flow_item_ipv6",
    "rte_flow_error",
    "rte_eth_rss_conf",
    "rte_eth_rss_reta_entry64",
];

/// Constants, by pattern. Some lack the RTE_ prefix (SOCKET_ID_ANY, LCORE_ID_ANY, RING_F_*).
const VARS: &[&str] = &[
    "RTE_ETH_RX_OFFLOAD_.*",
    "RTE_ETH_RSS_.*",
    "RTE_ETH_TX_OFFLOAD_.*",
    "RTE_ETH_LINK_.*",
    "RTE_ETH_SPEED_NUM_.*",
    "RTE_ETHER_.*",
    "RTE_MBUF_DEFAULT_.*",
    "RTE_PKTMBUF_HEADROOM",
    "RTE_MAX_ETHPORTS",
    "RTE_MAX_LCORE",
    "RTE_MEMPOOL_CACHE_MAX_SIZE",
    "RTE_ETH_NAME_MAX_LEN",
    "RTE_MAX_ERRNO",
    "SOCKET_ID_ANY",
    "LCORE_ID_ANY",
    "RING_F_.*",
];

/// Stop the build with one error line (cargo prints it as `error: ...`).
fn fail(msg: &str) -> ! {
    println!("cargo::error={msg}; {HINT}");
    std::process::exit(0)
}

/// Run `pkg-config <args> libdpdk`; None when pkg-config is missing or does not know libdpdk.
fn pkg_config(args: &[&str]) -> Option<String> {
    let out = Command::new("pkg-config").args(args).arg("libdpdk").output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn main() {
    println!("cargo::rerun-if-changed=csrc/shim.h");
    println!("cargo::rerun-if-changed=csrc/shim.c");
    println!("cargo::rerun-if-changed=csrc/wrapper.h");
    println!("cargo::rerun-if-changed=build/version.rs");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_PATH");
    println!("cargo::rerun-if-env-changed=PKG_CONFIG_LIBDIR");

    let Some(version) = pkg_config(&["--modversion"]) else {
        fail("libdpdk not found by pkg-config (DPDK development files are missing)")
    };
    if let Err(why) = version::check_version(&version) {
        fail(&why)
    }
    let cflags_raw = pkg_config(&["--cflags"]).unwrap_or_else(|| fail("`pkg-config --cflags libdpdk` failed"));
    let libs_raw = pkg_config(&["--libs"]).unwrap_or_else(|| fail("`pkg-config --libs libdpdk` failed"));
    let cflags: Vec<String> = split_flags(&cflags_raw);
    println!("cargo::rustc-env=DPDK_SYS_DPDK_VERSION={version}");

    // Link: the core libraries from pkg-config, then the driver libraries it does not list.
    for flag in split_flags(&libs_raw) {
        if let Some(dir) = flag.strip_prefix("-L") {
            println!("cargo::rustc-link-search=native={dir}");
        } else if let Some(lib) = flag.strip_prefix("-l") {
            println!("cargo::rustc-link-lib={lib}");
        } else if flag.starts_with("-Wl,") {
            println!("cargo::rustc-link-arg={flag}");
        }
    }
    for lib in DRIVER_LIBS {
        println!("cargo::rustc-link-lib={lib}");
    }

    // The shim: same flags DPDK's own applications get.
    let mut build = cc::Build::new();
    build.file("csrc/shim.c").include("csrc").warnings(true).extra_warnings(true);
    for flag in &cflags {
        build.flag(flag);
    }
    if let Err(e) = build.try_compile("roce_dp_dpdk_shim") {
        fail(&format!("compiling csrc/shim.c failed ({})", first_line(&e.to_string())))
    }

    // libclang is loaded at run time; bindgen panics if it is missing. Turn that into the one-line hint.
    std::panic::set_hook(Box::new(|_| {}));
    let generated = std::panic::catch_unwind(|| bindings(&cflags).generate());
    let _ = std::panic::take_hook();
    let bindings = match generated {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => fail(&format!("bindgen failed: {}", first_line(&e.to_string()))),
        Err(_) => fail("bindgen could not load libclang"),
    };
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("bindings.rs");
    if let Err(e) = bindings.write_to_file(&out) {
        fail(&format!("writing {} failed: {e}", out.display()))
    }
}

/// The bindgen configuration: allowlist-only, with function-like macro constants (RTE_BIT64) evaluated by clang.
fn bindings(cflags: &[String]) -> bindgen::Builder {
    let mut b = bindgen::Builder::default()
        .header("csrc/wrapper.h")
        .clang_arg("-Icsrc")
        .clang_args(cflags)
        .clang_macro_fallback()
        .allowlist_function(r"rte_[a-z0-9_]+_") // the shim
        .allowlist_function(r"rdp_[a-z0-9_]+") // the shim's burst guard
        .opaque_type("rte_gtp_psc_generic_hdr") // packed struct with a flexible array: Debug derive breaks
        .derive_default(true)
        .layout_tests(true)
        .generate_comments(false)
        .parse_callbacks(Box::new(bindgen::CargoCallbacks::new()));
    for f in FUNCTIONS {
        b = b.allowlist_function(f);
    }
    for t in TYPES {
        b = b.allowlist_type(t);
    }
    for v in VARS {
        b = b.allowlist_var(v);
    }
    b
}

/// Split a flag string on whitespace (pkg-config output for DPDK has no quoted arguments).
fn split_flags(s: &str) -> Vec<String> {
    s.split_whitespace().map(str::to_owned).collect()
}

fn first_line(s: &str) -> &str {
    s.lines().find(|l| !l.trim().is_empty()).unwrap_or(s).trim()
}
