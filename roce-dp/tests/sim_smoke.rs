use roce_dp::sim::{run_workload, LinkConfig, Sim, SimOp, Workload};
use roce_dp::EngineConfig;

fn run(op: SimOp, size: u32, msgs: u32, loss: f64) -> roce_dp::sim::SimReport {
    let link = LinkConfig { loss_ppm: roce_dp::sim::ppm(loss), ..LinkConfig::default() };
    let mut sim = Sim::new(EngineConfig::default(), [link, link], 1);
    let w = Workload { op, size, msgs, ..Workload::default() };
    let r = run_workload(&mut sim, &w);
    println!("{op:?} {size} loss={loss}: {} {:?}", r.result_line(), r.failure);
    r
}

#[test]
fn smoke() {
    for op in [SimOp::Write, SimOp::Send, SimOp::Read, SimOp::Atomic] {
        for size in [0u32, 1, 1024, 5000] {
            for loss in [0.0, 0.05] {
                let r = run(op, size, 50, loss);
                assert!(r.ok, "{op:?} {size} {loss}: {:?}", r.failure);
            }
        }
    }
}
