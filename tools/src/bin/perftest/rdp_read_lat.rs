//! rdp_read_lat: perftest's ib_read_lat on a roce-dp engine (see `roce_dp_tools::perftest::run`).

fn main() {
    roce_dp_tools::perftest::run::main(roce_dp_tools::perftest::exchange::TestKind::ReadLat)
}
