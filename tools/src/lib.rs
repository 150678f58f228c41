//! Shared code for the roce-dp command-line tools.
