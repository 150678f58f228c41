//! The test runner of the `harness = false` test binaries (they spawn themselves as child processes, so they have
//! their own `main`).

#![allow(dead_code, unreachable_pub)]

/// Runs `tests` in order, honouring a name filter as the default harness does (`cargo test --test NAME FILTER`),
/// and reports in its format (scripts/tiers count "test result:" lines and list "test ... FAILED" ones); exits 101 (as
/// the default harness does) if any failed.
pub fn run_tests(tests: &[(&str, fn())]) {
    let filter: Vec<String> = std::env::args().skip(1).filter(|a| !a.starts_with('-')).collect();
    let (mut passed, mut failed) = (0, 0);
    for &(name, f) in tests {
        if !filter.is_empty() && !filter.iter().any(|p| name.contains(p.as_str())) {
            continue;
        }
        println!("test {name} ...");
        if std::panic::catch_unwind(f).is_ok() {
            println!("test {name} ... ok");
            passed += 1;
        } else {
            println!("test {name} ... FAILED");
            failed += 1;
        }
    }
    let verdict = if failed == 0 { "ok" } else { "FAILED" };
    println!("test result: {verdict}. {passed} passed; {failed} failed");
    if failed > 0 {
        std::process::exit(101);
    }
}
