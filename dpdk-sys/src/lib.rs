//! Raw DPDK bindings (placeholder until the foundation work lands).
