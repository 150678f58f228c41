//! perftest-compatible pieces of the `rdp_*_bw` / `rdp_*_lat` tools: the out-of-band exchange with a perftest 4.5
//! peer ([`exchange`]), perftest's flags and defaults ([`params`]), and its printed and JSON output ([`report`]).
//! None of it needs the data path: the tools wire these around an engine.

pub mod exchange;
pub mod params;
pub mod report;
