//! The seeded runs of the hostile suites (hostile_frames.rs, hostile_peer.rs, hostile_config.rs, hostile_proto.rs): the seed and the
//! number of iterations from the environment, every iteration behind `catch_unwind` so that a panic is reported with
//! the seed that caused it.
//!
//! - `ROCE_HOSTILE_SEED=S`: the first seed (iteration k runs seed S + k x [`STRIDE`]).
//! - `ROCE_HOSTILE_ITERS=N`: iterations (per capture and side in hostile_frames.rs); `ROCE_HOSTILE_SEED=<a failing
//!   seed> ROCE_HOSTILE_ITERS=1` replays exactly one failure.
//! - `ROCE_HOSTILE_SOAK=1`: 100 times the iterations (a soak run).

#![allow(dead_code, unreachable_pub)]

/// The distance between the seeds of two iterations. Not SplitMix64's own increment (0x9e3779b97f4a7c15, which
/// this stride was until session 21): `SimRng` adds that to its state at every draw, so a seed one increment
/// further gave the same stream one draw later, and the iterations of a suite, whose draws per frame vary, fell
/// into step with each other after a few frames and replayed the same mutations (hostile_frames.rs: about half as
/// many different runs, and with some first seeds not one CNP in 720 runs). What matters is the stride divided by
/// that increment (mod 2^64): the draws between two iterations' streams. For this constant it is 0x75b8311ba71fd2b7,
/// and no two of the first 200 000 iterations are closer than 2^46 draws (an odd multiple of the increment, such as
/// three times it, would put them 3 draws apart).
pub const STRIDE: u64 = 0xd1b5_4a32_d192_ed03;

/// Where a suite starts and how far it goes.
#[derive(Clone, Copy, Debug)]
pub struct Seeds {
    pub base: u64,
    pub iters: u64,
}

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|s| s.parse().ok())
}

impl Seeds {
    /// The suite's defaults, overridden by the environment.
    pub fn from_env(default_seed: u64, default_iters: u64) -> Seeds {
        let soak = std::env::var_os("ROCE_HOSTILE_SOAK").is_some_and(|v| v == "1");
        let iters = env_u64("ROCE_HOSTILE_ITERS").unwrap_or(default_iters) * if soak { 100 } else { 1 };
        Seeds { base: env_u64("ROCE_HOSTILE_SEED").unwrap_or(default_seed), iters }
    }

    /// True when one given seed is replayed.
    pub fn replaying(&self) -> bool {
        env_u64("ROCE_HOSTILE_ITERS") == Some(1)
    }

    /// Runs `f(seed)` for every seed; returns one line per failing seed (at most `max`), panics included.
    pub fn run(&self, label: &str, max: usize, mut f: impl FnMut(u64) -> Result<(), String>) -> Vec<String> {
        let mut failures = Vec::new();
        for k in 0..self.iters {
            let seed = self.base.wrapping_add(k.wrapping_mul(STRIDE));
            let e = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(seed))) {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e,
                Err(p) => {
                    let msg =
                        p.downcast_ref::<String>().cloned().or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()));
                    format!("PANIC {}", msg.unwrap_or_default())
                }
            };
            failures.push(format!("{label} seed {seed}: {e}"));
            if failures.len() >= max {
                break;
            }
        }
        failures
    }
}

/// Fails the test with every failure line and how to replay one.
pub fn assert_none(failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{} failing runs (replay one with ROCE_HOSTILE_SEED=<seed> ROCE_HOSTILE_ITERS=1):\n{}",
        failures.len(),
        failures.join("\n")
    );
}
