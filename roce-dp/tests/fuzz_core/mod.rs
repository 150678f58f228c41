//! Fuzzer machinery shared by the seeded tests and the cargo-fuzz targets in fuzz/ (which include these files by
//! path).

pub mod engine;
