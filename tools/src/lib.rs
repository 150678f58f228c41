//! Shared code for the roce-dp command-line tools.

pub mod capture;
pub mod dump;
pub mod perftest;
