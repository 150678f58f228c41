//! Shared helpers for the roce-dp benchmarks (medians, tables, the command line).

use std::io::Write as _;

/// Median of a set of samples (sorts them in place). Returns 0.0 for an empty set.
pub fn median(samples: &mut [f64]) -> f64 {
    if samples.is_empty() {
        return 0.0;
    }
    samples.sort_by(|a, b| a.total_cmp(b));
    let n = samples.len();
    if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    }
}

/// A benchmark's command line, checked before anything runs: `-h` / `--help` prints `usage` and exits 0; an
/// argument that is not one of `flags` (each with the number of values it takes) gets one line naming it and exit
/// status 2. Returns the arguments (without the program name) for the benchmark's own lookups.
pub fn check_args(name: &str, usage: &str, flags: &[(&str, usize)]) -> Vec<String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args_problem(&args, flags) {
        Ok(true) => {
            // (Ignoring a closed stdout: `--help | head` is no error.)
            let _ = writeln!(std::io::stdout(), "{usage}");
            std::process::exit(0);
        }
        Ok(false) => args,
        Err(msg) => {
            eprintln!("{name}: {msg} (see --help)");
            std::process::exit(2);
        }
    }
}

/// `Ok(true)` for a help request, `Ok(false)` when every argument is a known flag with its values, else what is wrong.
fn args_problem(args: &[String], flags: &[(&str, usize)]) -> Result<bool, String> {
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if a == "-h" || a == "--help" {
            return Ok(true);
        }
        let Some(&(_, n)) = flags.iter().find(|(f, _)| *f == a) else {
            return Err(format!("unknown argument {a}"));
        };
        if args.len() - i - 1 < n {
            return Err(format!("{a} takes {n} value(s)"));
        }
        i += 1 + n;
    }
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::args_problem;

    fn v(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn args_are_checked_before_a_run() {
        let flags = [("--one", 3), ("--quick", 0)];
        assert_eq!(args_problem(&v(&[]), &flags), Ok(false));
        assert_eq!(args_problem(&v(&["--one", "write", "64", "10", "--quick"]), &flags), Ok(false));
        assert_eq!(args_problem(&v(&["--quick", "--help"]), &flags), Ok(true));
        assert_eq!(args_problem(&v(&["-h"]), &flags), Ok(true));
        assert_eq!(args_problem(&v(&["--runs", "5"]), &flags), Err("unknown argument --runs".into()));
        assert_eq!(args_problem(&v(&["--one", "write", "64"]), &flags), Err("--one takes 3 value(s)".into()));
    }
}
