//! A fixed, allocation-free engine workload for instruction counting: two engines, one RC QP each, `MSGS` WRITEs
//! of `SIZE` bytes (path MTU 4096) moved through preallocated frame buffers at one virtual instant. Run under
//! callgrind to compare two builds of the engine without host timing:
//!
//! ```text
//! cargo build --release -p roce-dp --no-default-features --example engine_ir
//! valgrind --tool=callgrind target/release/examples/engine_ir 64 20000     # SIZE MSGS
//! ```
//! (Used to check that congestion control switched off costs nothing measurable: see the DCQCN commit notes.)

use roce_dp::engine::MAX_HEADER_BYTES;
use roce_dp::wire::{IpAddrs, MacAddr};
use roce_dp::{
    AccessFlags, CqId, Cqe, Engine, EngineConfig, Instant, LocalIp, PeerAddr, QpAttr, QpCaps, QpState, RxMeta, SendWr,
    Sge, WcStatus, WrOpcode,
};

const VA: u64 = 0x1000_0000;

fn main() {
    let arg = |i: usize, d: u64| std::env::args().nth(i).map_or(d, |s| s.parse().expect("a number"));
    let (size, msgs) = (arg(1, 64) as u32, arg(2, 20_000));
    let ip = [[10, 0, 0, 1], [10, 0, 0, 2]];
    let mac = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])];
    let mut e: Vec<Engine> = (0..2)
        .map(|n| {
            Engine::new(EngineConfig {
                local_mac: mac[n],
                local_ip: LocalIp { v4: Some(ip[n]), v6: None },
                max_unacked_psns: 1024,
                ..EngineConfig::default()
            })
        })
        .collect();
    let (mut qpn, mut cq, mut keys) = ([0u32; 2], [CqId(0); 2], Vec::new());
    for n in 0..2 {
        let pd = e[n].alloc_pd();
        cq[n] = e[n].create_cq(1024).unwrap();
        keys.push(e[n].reg_mr(pd, VA, 1 << 20, AccessFlags::ALL).unwrap());
        let caps = QpCaps { max_send_wr: 256, max_recv_wr: 256, ..QpCaps::default() };
        qpn[n] = e[n].create_qp(pd, cq[n], cq[n], caps).unwrap();
    }
    for n in 0..2 {
        let st = |s| QpAttr { state: Some(s), ..QpAttr::default() };
        e[n].modify_qp(qpn[n], &QpAttr { access: Some(AccessFlags::ALL), ..st(QpState::Init) }).unwrap();
        let peer = PeerAddr { ip: IpAddrs::V4 { src: [0; 4], dst: ip[1 - n] }, mac: mac[1 - n] };
        let rtr = QpAttr {
            path_mtu: Some(4096),
            dest_qpn: Some(qpn[1 - n]),
            rq_psn: Some(0),
            max_dest_rd_atomic: Some(16),
            peer: Some(peer),
            ..st(QpState::Rtr)
        };
        e[n].modify_qp(qpn[n], &rtr).unwrap();
        let rts = QpAttr { sq_psn: Some(0), timeout: Some(14), max_rd_atomic: Some(16), ..st(QpState::Rts) };
        e[n].modify_qp(qpn[n], &rts).unwrap();
    }
    let mut bufs = vec![vec![0u8; 4096 + MAX_HEADER_BYTES]; 256];
    let mut lens = [0usize; 256];
    let blank = Cqe::EMPTY;
    let mut cqes = [blank; 64];
    let (mut posted, mut done, now) = (0u64, 0u64, Instant::ZERO);
    while done < msgs {
        while posted < msgs && posted - done < 128 {
            let wr = SendWr::new(posted, WrOpcode::RdmaWrite).remote(VA + (posted % 64) * 4096, keys[1].rkey);
            e[0].post_send(qpn[0], &wr, &[Sge { addr: VA, len: size, lkey: keys[0].lkey }]).unwrap();
            posted += 1;
        }
        for from in 0..2 {
            let mut n = 0;
            while let Some(l) = e[from].poll_transmit(now, &mut bufs[n.min(255)]) {
                lens[n] = l;
                n += 1;
                if n == 256 {
                    break;
                }
            }
            for (b, l) in bufs.iter().zip(&lens).take(n) {
                e[1 - from].handle_rx(now, &b[..*l], RxMeta::default());
            }
        }
        loop {
            let n = e[0].poll_cq(cq[0], &mut cqes);
            if n == 0 {
                break;
            }
            assert!(cqes[..n].iter().all(|c| c.status == WcStatus::Success));
            done += n as u64;
        }
    }
    println!("{msgs} WRITEs of {size} B completed");
}
