//! rdp_send_bw: perftest's ib_send_bw on a roce-dp engine (see `roce_dp_tools::perftest::run`).

fn main() {
    roce_dp_tools::perftest::run::main(roce_dp_tools::perftest::exchange::TestKind::SendBw)
}
