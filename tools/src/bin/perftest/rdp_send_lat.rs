//! rdp_send_lat: perftest's ib_send_lat on a roce-dp engine (see `roce_dp_tools::perftest::run`).

fn main() {
    roce_dp_tools::perftest::run::main(roce_dp_tools::perftest::exchange::TestKind::SendLat)
}
