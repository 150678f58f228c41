//! perftest-compatible pieces of the `rdp_*_bw` / `rdp_*_lat` tools: the out-of-band exchange with a perftest 4.5
//! peer ([`exchange`]), perftest's flags and defaults ([`params`]), and its printed and JSON output ([`report`]).
//! None of it needs the data path: a tool wires these around an engine, in this order (a one-way, single-size
//! run; `-a` repeats `start_run`/traffic/`end_run` per size):
//!
//! ```no_run
//! use roce_dp_tools::perftest::exchange::{self, Dest, Exchange, Mtu, Role, SysData, TestKind, DEFAULT_TIMEOUT};
//! use roce_dp_tools::perftest::params::Params;
//! use roce_dp_tools::perftest::report::{self, Banner};
//!
//! # fn main() -> Result<(), exchange::ExchangeError> {
//! let test = TestKind::WriteBw;
//! let p = Params::parse_or_exit(test);
//! let (stream, role) = match &p.host {
//!     Some(host) => (exchange::connect(host, p.port, DEFAULT_TIMEOUT, DEFAULT_TIMEOUT)?, Role::Client),
//!     None => {
//!         for l in report::waiting_lines() {
//!             println!("{l}");
//!         }
//!         let listener = exchange::listen(p.port)?;
//!         (exchange::accept(&listener, None, DEFAULT_TIMEOUT)?, Role::Server)
//!     }
//! };
//! let mut ex = Exchange::new(stream, role, DEFAULT_TIMEOUT);
//! let port_mtu = Mtu::Mtu4096; // the engine's port MTU
//! let n = ex.setup(SysData::default(), p.mtu.unwrap_or(port_mtu), p.mtu.is_some())?;
//! let mine: Vec<Dest> = vec![Dest::default(); p.num_qps as usize]; // the engine's QPs: QPN, PSN, rkey, buffer, GID
//! let remote = ex.exchange_dests(test, &mine)?;
//! exchange::check_gid_compatibility(&mine[0], &remote[0])?;
//! let banner = Banner::new(&p, "rdp0", n.mtu, p.gid_index.unwrap_or(0), 16);
//! for l in banner.lines().into_iter().chain(report::addresses(test, &mine, &remote)) {
//!     println!("{l}");
//! }
//! // ... move the QPs to RTR/RTS with `remote` and `n.mtu` ...
//! ex.connected(test, &mine[0])?;
//! // ... send tests: post the receives here ...
//! ex.start_run(test, &mine[0], p.duplex)?;
//! // ... the client runs the traffic and measures, checking `ex.peer_gone()` now and then; the server waits in
//! // `finish` (`ex.set_timeout(None)` or the run's length) ...
//! let mine_report = report::bw_report(4096, 1000, p.num_qps, p.duplex, std::time::Duration::from_millis(5), 0.0);
//! ex.end_run(test, &mine[0], &mine_report, p.duplex, p.all)?;
//! let peer_report = ex.finish(test, &mine[0], &mine_report, p.duplex)?;
//! println!("{}", report::bw_header(p.report_gbits));
//! println!("{}", report::bw_line(&peer_report.filter(|_| role == Role::Server).unwrap_or(mine_report), p.report_gbits));
//! println!("{}", report::RESULT_LINE);
//! # Ok(())
//! # }
//! ```

#[cfg(feature = "dpdk")]
mod daemon;
#[cfg(feature = "dpdk")]
mod embedded;
pub mod exchange;
pub mod params;
pub mod report;
#[cfg(feature = "dpdk")]
pub mod run;
#[cfg(feature = "dpdk")]
mod traffic;
