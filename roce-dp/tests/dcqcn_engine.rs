//! DCQCN through the engine's sans-IO interface, with explicit time: ECN on transmit, the notification point (CNP
//! generation, format, one per interval), the reaction point (a CNP cuts the rate, frames are paced, CNPs
//! ignored without congestion control), counters.

use roce_dp::engine::MAX_HEADER_BYTES;
use roce_dp::sim::incast::{connect, mark_ce};
use roce_dp::wire::{self, Ecn, IpAddrs, MacAddr, Opcode};
use roce_dp::{
    AccessFlags, CcAlgorithm, CcConfig, DcqcnConfig, Engine, EngineConfig, Instant, LocalIp, PeerAddr, QpAttr, QpCaps,
    RxMeta, SendWr, Sge, WrOpcode,
};

const IP: [[u8; 4]; 2] = [[10, 0, 0, 1], [10, 0, 0, 2]];
const MAC: [MacAddr; 2] = [MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2])];
const VA: u64 = 0x1000_0000;
const LEN: u32 = 1 << 20;

/// Node 0 (requester, `cc0`) and node 1 (responder, `cc1`), one connected QP each; node 0 has a 1 MiB WRITE
/// posted. Returns the engines and QP numbers.
fn pair(cc0: CcConfig, cc1: CcConfig) -> ([Engine; 2], [u32; 2]) {
    pair_op(cc0, cc1, WrOpcode::RdmaWrite)
}

fn pair_op(cc0: CcConfig, cc1: CcConfig, op: WrOpcode) -> ([Engine; 2], [u32; 2]) {
    let mk = |n: usize, cc: CcConfig| {
        Engine::new(EngineConfig {
            local_mac: MAC[n],
            local_ip: LocalIp { v4: Some(IP[n]), v6: None },
            qpn_base: 0x40 + 0x10 * n as u32,
            max_unacked_psns: 1024,
            cc,
            ..EngineConfig::default()
        })
    };
    let mut e = [mk(0, cc0), mk(1, cc1)];
    let mut qpn = [0; 2];
    let mut keys = Vec::new();
    for (n, eng) in e.iter_mut().enumerate() {
        let pd = eng.alloc_pd();
        let cq = eng.create_cq(64).unwrap();
        keys.push(eng.reg_mr(pd, VA, LEN as usize, AccessFlags::ALL).unwrap());
        qpn[n] = eng.create_qp(pd, cq, cq, QpCaps::default()).unwrap();
    }
    for n in 0..2 {
        let peer = PeerAddr { ip: IpAddrs::V4 { src: [0; 4], dst: IP[1 - n] }, mac: MAC[1 - n] };
        connect(&mut e[n], qpn[n], qpn[1 - n], peer, 4096).unwrap();
    }
    let wr = SendWr::new(1, op).remote(VA, keys[1].rkey);
    e[0].post_send(qpn[0], &wr, &[Sge { addr: VA, len: LEN, lkey: keys[0].lkey }]).unwrap();
    (e, qpn)
}

fn tx(e: &mut Engine, now: Instant) -> Option<Vec<u8>> {
    let mut buf = vec![0u8; 4096 + MAX_HEADER_BYTES];
    e.poll_transmit(now, &mut buf).map(|n| buf[..n].to_vec())
}

fn dcqcn(np_us: u32) -> CcConfig {
    CcConfig {
        algorithm: CcAlgorithm::Dcqcn,
        line_rate_mbps: 25_000,
        dcqcn: DcqcnConfig { np_min_time_between_cnps: np_us, ..DcqcnConfig::default() },
        ..CcConfig::default()
    }
}

/// Sends one CE-marked data frame per microsecond from node 0 to node 1 for `us` µs; returns node 1's CNPs with
/// their times (node 1's ACKs are dropped: node 0 keeps sending within its window).
fn ce_stream(e: &mut [Engine; 2], us: u64) -> Vec<(Instant, Vec<u8>)> {
    let mut cnps = Vec::new();
    for t in 0..us {
        let now = Instant::from_micros(t);
        let mut f = tx(&mut e[0], now).expect("node 0 has data to send");
        assert!(mark_ce(&mut f), "data frames are ECN-capable");
        e[1].handle_rx(now, &f, RxMeta::default());
        while let Some(out) = tx(&mut e[1], now) {
            if wire::parse_frame(&out).unwrap().repr.bth.opcode == Opcode::CNP {
                cnps.push((now, out));
            }
        }
    }
    cnps
}

#[test]
fn data_frames_are_ect0_by_default_with_the_qp_dscp_and_not_ect_on_request() {
    let (mut e, q) = pair(CcConfig::default(), CcConfig::default());
    let f = tx(&mut e[0], Instant::ZERO).unwrap();
    let p = wire::parse_frame(&f).unwrap();
    assert_eq!((p.repr.ip.ecn, p.repr.ip.dscp), (Ecn::Ect0, 0));
    e[0].modify_qp(q[0], &QpAttr { ecn: Some(Ecn::NotEct), dscp: Some(26), ..QpAttr::default() }).unwrap();
    let p = wire::parse_frame(&tx(&mut e[0], Instant::ZERO).unwrap()).unwrap().repr;
    assert_eq!((p.ip.ecn, p.ip.dscp), (Ecn::NotEct, 26));
    e[0].modify_qp(q[0], &QpAttr { ecn: Some(Ecn::Ect1), ..QpAttr::default() }).unwrap();
    let p = wire::parse_frame(&tx(&mut e[0], Instant::ZERO).unwrap()).unwrap().repr;
    assert_eq!(p.ip.ecn, Ecn::Ect1);
}

#[test]
fn ce_marked_frames_get_one_cnp_per_interval_in_the_cnp_format() {
    let (mut e, q) = pair(CcConfig::default(), CcConfig::default());
    let cnps = ce_stream(&mut e, 100);
    // One CE frame per µs, ConnectX default interval 4 µs: CNPs at 0, 4, 8, ... 96 µs.
    let times: Vec<u64> = cnps.iter().map(|(t, _)| t.as_nanos() / 1000).collect();
    assert_eq!(times, (0..25).map(|k| 4 * k).collect::<Vec<u64>>());
    for w in cnps.windows(2) {
        assert!(w[1].0.saturating_since(w[0].0).as_micros() >= 4, "two CNPs inside the interval");
    }
    for (_, f) in &cnps {
        let p = wire::parse_frame(f).unwrap();
        let r = p.repr;
        assert!(p.icrc_ok && p.payload.is_empty());
        assert_eq!(r.bth.opcode.0, 0x81);
        assert!(r.bth.becn && !r.bth.fecn && !r.bth.ack_req && !r.bth.solicited);
        assert_eq!((r.bth.dest_qp, r.bth.pkey, r.bth.psn.value()), (q[0], 0xffff, 0));
        assert_eq!((r.ip.dscp, r.ip.ecn), (48, Ecn::NotEct));
        assert_eq!(r.ip.addrs, IpAddrs::V4 { src: IP[1], dst: IP[0] });
        assert_eq!((r.eth.src, r.eth.dst, r.udp_dst), (MAC[1], MAC[0], 4791));
        // Ethernet 14 + IPv4 20 + UDP 8 + BTH 12 + 16 reserved zero bytes + ICRC 4.
        assert_eq!(f.len(), 74);
        assert_eq!(&f[54..70], &[0u8; 16]);
    }
    let c = e[1].qp_counters(q[1]).unwrap();
    assert_eq!((c.ecn_ce_rcvd, c.cnp_sent, c.cnp_suppressed), (100, 25, 75));
}

#[test]
fn the_cnp_interval_and_dscp_are_configurable_and_the_np_can_be_off() {
    let cc = CcConfig {
        dcqcn: DcqcnConfig { np_min_time_between_cnps: 50, np_cnp_dscp: 26, ..DcqcnConfig::default() },
        ..CcConfig::default()
    };
    let (mut e, _) = pair(CcConfig::default(), cc);
    let cnps = ce_stream(&mut e, 120);
    let times: Vec<u64> = cnps.iter().map(|(t, _)| t.as_nanos() / 1000).collect();
    assert_eq!(times, vec![0, 50, 100]);
    assert_eq!(wire::parse_frame(&cnps[0].1).unwrap().repr.ip.dscp, 26);

    let (mut e, q) = pair(CcConfig::default(), CcConfig { np_enabled: false, ..CcConfig::default() });
    assert!(ce_stream(&mut e, 20).is_empty());
    let c = e[1].qp_counters(q[1]).unwrap();
    assert_eq!((c.ecn_ce_rcvd, c.cnp_sent, c.cnp_suppressed), (20, 0, 20));
}

#[test]
fn a_cnp_cuts_the_senders_rate_and_its_frames_are_paced() {
    let (mut e, q) = pair(dcqcn(4), CcConfig::default());
    let cnp = ce_stream(&mut e, 1).pop().expect("a CNP").1;
    let st = e[0].qp_cc_state(q[0]).unwrap();
    assert!(!st.limited && st.rate_kbps == 25_000_000);
    let t0 = Instant::from_micros(10);
    e[0].handle_rx(t0, &cnp, RxMeta::default());
    let st = e[0].qp_cc_state(q[0]).unwrap();
    // First CNP: alpha = 1023/1024, Rc = 25 Gb/s * (1 - alpha/2).
    assert!(st.limited);
    assert_eq!(st.rate_kbps, 25_000_000 - 25_000_000 * 1023 / 2048);
    let c = e[0].qp_counters(q[0]).unwrap();
    assert_eq!((c.cnp_rcvd, c.cnp_ignored, c.rate_decreases), (1, 0, 1));
    assert_eq!(e[0].stats().rx_cnp, 1);
    // The rate-increase timer is armed.
    assert!(e[0].poll_timeout().is_some());

    // Pacing: one frame now, the next only after frame_bits / rate.
    let f = tx(&mut e[0], t0).expect("first frame leaves at once");
    assert!(tx(&mut e[0], t0).is_none(), "the pacer holds the second frame");
    let gap_ns = (f.len() as u64 * 8 * 1_000_000).div_ceil(st.rate_kbps);
    let due = t0 + roce_dp::Duration::from_nanos(gap_ns - 1);
    let deadline = e[0].poll_timeout().unwrap();
    assert!(deadline <= due + roce_dp::Duration::from_nanos(1) && deadline >= due, "pace deadline {deadline}");
    assert!(tx(&mut e[0], Instant(deadline.as_nanos() - 1)).is_none());
    e[0].handle_timeout(deadline);
    assert!(tx(&mut e[0], deadline).is_some(), "the frame leaves at the pace deadline");
}

#[test]
fn cnps_are_ignored_without_congestion_control_or_for_an_unknown_qp() {
    let (mut e, q) = pair(CcConfig::default(), CcConfig::default());
    let cnp = ce_stream(&mut e, 1).pop().expect("a CNP").1;
    e[0].handle_rx(Instant::from_micros(5), &cnp, RxMeta::default());
    let c = e[0].qp_counters(q[0]).unwrap();
    assert_eq!((c.cnp_rcvd, c.cnp_ignored, c.rate_decreases), (0, 1, 0));
    assert!(!e[0].qp_cc_state(q[0]).unwrap().limited);
    // A CNP to a QP number that does not exist.
    let mut r = wire::parse_frame(&cnp).unwrap().repr;
    r.bth = wire::BthRepr::cnp(q[0] + 7);
    let mut buf = vec![0u8; 128];
    let n = wire::emit_frame(&mut buf, &r, 0, |_| {}).unwrap();
    e[0].handle_rx(Instant::from_micros(6), &buf[..n], RxMeta::default());
    assert_eq!((e[0].stats().rx_cnp, e[0].stats().rx_cnp_ignored), (2, 2));
}

#[test]
fn a_cnp_for_marked_read_responses_paces_the_responder() {
    let (mut e, q) = pair_op(CcConfig::default(), dcqcn(4), WrOpcode::RdmaRead);
    let t0 = Instant::ZERO;
    let req = tx(&mut e[0], t0).expect("READ request");
    e[1].handle_rx(t0, &req, RxMeta::default());
    // The first READ response is marked CE on its way; node 0's NP answers with a CNP to node 1's QP.
    let mut resp = tx(&mut e[1], t0).expect("first READ response");
    assert_eq!(wire::parse_frame(&resp).unwrap().repr.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_FIRST);
    assert!(mark_ce(&mut resp));
    e[0].handle_rx(t0, &resp, RxMeta::default());
    let cnp = tx(&mut e[0], t0).expect("a CNP");
    let r = wire::parse_frame(&cnp).unwrap().repr;
    assert_eq!((r.bth.opcode, r.bth.dest_qp), (Opcode::CNP, q[1]));
    let t1 = Instant::from_micros(1);
    e[1].handle_rx(t1, &cnp, RxMeta::default());
    let st = e[1].qp_cc_state(q[1]).unwrap();
    assert!(st.limited && st.rate_kbps < 13_000_000);
    // READ responses now leave one per frame time at the reduced rate.
    let f = tx(&mut e[1], t1).expect("a response leaves at once");
    assert!(tx(&mut e[1], t1).is_none(), "the next READ response is paced");
    let deadline = e[1].poll_timeout().unwrap();
    let gap = (f.len() as u64 * 8 * 1_000_000).div_ceil(st.rate_kbps);
    assert!(deadline.saturating_since(t1).as_nanos().abs_diff(gap) <= 1, "{deadline} vs {gap} ns");
    e[1].handle_timeout(deadline);
    let p = wire::parse_frame(&tx(&mut e[1], deadline).expect("due")).unwrap().repr;
    assert_eq!(p.bth.opcode, Opcode::RC_RDMA_READ_RESPONSE_MIDDLE);
}

/// Every frame `e` sends at `now`.
fn drain(e: &mut Engine, now: Instant) -> Vec<Vec<u8>> {
    std::iter::from_fn(|| tx(e, now)).collect()
}

#[test]
fn a_qp_in_err_ignores_cnps_sends_none_and_keeps_no_cc_timer() {
    let (mut e, q) = pair(dcqcn(4), dcqcn(4));
    let cnp = ce_stream(&mut e, 1).pop().expect("a CNP").1;
    e[0].handle_rx(Instant::from_micros(10), &cnp, RxMeta::default());
    assert!(e[0].qp_cc_state(q[0]).unwrap().limited);
    // The error state stops every timer (the CC timer and the pacer's with the others): an idle engine.
    e[0].modify_qp(q[0], &QpAttr { state: Some(roce_dp::QpState::Err), ..QpAttr::default() }).unwrap();
    assert_eq!(e[0].poll_timeout(), None, "a QP in ERR keeps a congestion-control timer");
    // A CNP for the QP in ERR is counted as ignored and arms nothing.
    let before = e[0].qp_counters(q[0]).unwrap().cnp_rcvd;
    e[0].handle_rx(Instant::from_micros(20), &cnp, RxMeta::default());
    assert_eq!(e[0].qp_counters(q[0]).unwrap().cnp_rcvd, before, "a QP in ERR acted on a CNP");
    assert_eq!((e[0].stats().rx_cnp, e[0].stats().rx_cnp_ignored), (2, 1));
    assert_eq!(e[0].poll_timeout(), None);

    // The notification point of a QP in ERR sends no CNP for a CE-marked frame (the QP sends nothing).
    let (mut e, q) = pair(CcConfig::default(), CcConfig::default());
    let mut f = tx(&mut e[0], Instant::ZERO).expect("a WRITE frame");
    assert!(mark_ce(&mut f));
    e[1].modify_qp(q[1], &QpAttr { state: Some(roce_dp::QpState::Err), ..QpAttr::default() }).unwrap();
    e[1].handle_rx(Instant::from_micros(1), &f, RxMeta::default());
    let out = drain(&mut e[1], Instant::from_micros(1));
    assert!(out.is_empty(), "a QP in ERR sent {} frame(s), the first {:?}", out.len(), wire::parse_frame(&out[0]));
    let c = e[1].qp_counters(q[1]).unwrap();
    assert_eq!((c.ecn_ce_rcvd, c.cnp_sent, c.cnp_suppressed), (1, 0, 1));
    // Nor a CNP it queued before it entered ERR.
    let (mut e, q) = pair(CcConfig::default(), CcConfig::default());
    let mut f = tx(&mut e[0], Instant::ZERO).expect("a WRITE frame");
    assert!(mark_ce(&mut f));
    e[1].handle_rx(Instant::from_micros(1), &f, RxMeta::default());
    e[1].modify_qp(q[1], &QpAttr { state: Some(roce_dp::QpState::Err), ..QpAttr::default() }).unwrap();
    assert!(drain(&mut e[1], Instant::from_micros(1)).is_empty(), "a QP in ERR sent the CNP it had queued");
}

/// Node 0 under DCQCN `d` with the target clamped on every cut (rp_clamp_tgt_rate), cut by two CNPs at 10 and 20 µs:
/// the second clamps the target to the rate the first one set, below the line rate. Returns the engines, the QP
/// numbers and the CNP.
fn cut_twice(d: DcqcnConfig) -> ([Engine; 2], [u32; 2], Vec<u8>) {
    let cc = CcConfig { dcqcn: DcqcnConfig { rp_clamp_tgt_rate: true, ..d }, ..dcqcn(4) };
    cc.validate().unwrap();
    let (mut e, q) = pair(cc, CcConfig::default());
    let cnp = ce_stream(&mut e, 1).pop().expect("a CNP").1;
    e[0].handle_rx(Instant::from_micros(10), &cnp, RxMeta::default());
    e[0].handle_rx(Instant::from_micros(20), &cnp, RxMeta::default());
    let st = e[0].qp_cc_state(q[0]).unwrap();
    assert!(st.limited && st.target_kbps < 25_000_000, "{st:?}");
    (e, q, cnp)
}

#[test]
fn timers_at_the_end_of_time_do_not_spin() {
    // No additive increase and an idle QP (so no byte-counter event reaches the hyper stage): the target stays
    // below the line rate and the rate-increase timer stays armed while the QP is limited.
    let (e, _, _) = cut_twice(DcqcnConfig { rp_ai_rate: 0, ..DcqcnConfig::default() });
    // Time jumps to the last representable instant: every timer due runs once; none may re-arm itself at a
    // deadline that is already due (now + period saturates at Instant::MAX), or handle_timeout never returns.
    // (The rate controller's own check: cc::dcqcn::tests::no_timer_is_left_due_after_it_ran_at_the_end_of_time.)
    let [e0, _] = e;
    assert_eq!(timers_at_the_end_of_time(e0), None, "a timer due at the end of time");
}

/// Runs `e`'s timers at Instant::MAX in a thread; returns its next deadline after them, or fails the test if
/// handle_timeout has not returned within 20 s. Nothing can be due after the last instant: a timer still armed then
/// would be due at once, and run again.
fn timers_at_the_end_of_time(mut e: Engine) -> Option<Instant> {
    let (done, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        e.handle_timeout(Instant::MAX);
        let _ = done.send(e.poll_timeout());
    });
    rx.recv_timeout(std::time::Duration::from_secs(20)).expect("handle_timeout(Instant::MAX) spins")
}

#[test]
fn the_retransmission_timer_at_the_end_of_time_does_not_spin() {
    // Retrying for ever at retry_cnt 7 (Linux rxe's rule, rdp-sim --rxe-retry): each local ACK timeout re-armed the
    // timer at now + timeout, which at Instant::MAX is Instant::MAX again.
    let (mut e, _) = sim_pair(EngineConfig { retry_cnt_7_infinite: true, ..EngineConfig::default() }, false);
    assert!(tx(&mut e[0], Instant::ZERO).is_some());
    let [e0, _] = e;
    assert_eq!(timers_at_the_end_of_time(e0), None, "a timer due at the end of time");
}

/// `f` (untagged IPv4) with `extra` bytes inserted before the ICRC, the IP and UDP lengths, the IP checksum and the
/// ICRC made to match.
fn with_extra_bytes(f: &[u8], extra: usize) -> Vec<u8> {
    let mut g = f[..f.len() - 4].to_vec();
    g.extend(std::iter::repeat_n(0u8, extra + 4));
    let ip_len = (g.len() - 14) as u16;
    g[16..18].copy_from_slice(&ip_len.to_be_bytes());
    g[38..40].copy_from_slice(&(ip_len - 20).to_be_bytes());
    wire::Ipv4Packet::new_unchecked(&mut g[14..34]).fill_checksum();
    wire::icrc::fill(&mut g[14..]).unwrap();
    g
}

#[test]
fn hostile_cnps_are_counted_and_never_take_the_rate_out_of_its_bounds() {
    let (mut e, q) = pair(dcqcn(4), CcConfig::default());
    let cnp = ce_stream(&mut e, 1).pop().expect("a CNP").1;
    assert_eq!(with_extra_bytes(&cnp, 0), cnp, "the helper reseals a frame it did not change to itself");
    // Each frame a microsecond after the previous one.
    let t = std::cell::Cell::new(Instant::from_micros(10));
    let rx = |e: &mut Engine, f: &[u8]| {
        t.set(t.get() + roce_dp::Duration::from_micros(1));
        e.handle_rx(t.get(), f, RxMeta::default());
    };
    // Malformed CNPs never reach the CNP counters: a bad ICRC, every truncation, 4 bytes too many in the packet.
    let mut bad = cnp.clone();
    *bad.last_mut().unwrap() ^= 1;
    rx(&mut e[0], &bad);
    for n in 0..cnp.len() {
        rx(&mut e[0], &cnp[..n]);
    }
    rx(&mut e[0], &with_extra_bytes(&cnp, 4));
    let s = e[0].stats();
    assert_eq!((s.rx_cnp, s.rx_cnp_ignored, s.rx_drop_icrc, s.rx_drop_length_mismatch), (0, 0, 1, 1), "{s:?}");
    assert!(!e[0].qp_cc_state(q[0]).unwrap().limited);
    // Well formed but not the peer's (another source address), or for a QP in INIT: counted, ignored.
    let mut r = wire::parse_frame(&cnp).unwrap().repr;
    r.ip.addrs = IpAddrs::V4 { src: [10, 0, 0, 99], dst: IP[0] };
    let mut buf = vec![0u8; 128];
    let n = wire::emit_frame(&mut buf, &r, 0, |_| {}).unwrap();
    rx(&mut e[0], &buf[..n]);
    let pd = e[0].alloc_pd();
    let cq = e[0].create_cq(4).unwrap();
    let idle = e[0].create_qp(pd, cq, cq, QpCaps::default()).unwrap();
    e[0].modify_qp(idle, &QpAttr { state: Some(roce_dp::QpState::Init), ..QpAttr::default() }).unwrap();
    let mut r = wire::parse_frame(&cnp).unwrap().repr;
    r.bth = wire::BthRepr::cnp(idle);
    let n = wire::emit_frame(&mut buf, &r, 0, |_| {}).unwrap();
    rx(&mut e[0], &buf[..n]);
    let s = e[0].stats();
    assert_eq!((s.rx_cnp, s.rx_cnp_ignored), (2, 2), "{s:?}");
    assert!(!e[0].qp_cc_state(q[0]).unwrap().limited && e[0].qp_cc_state(idle).unwrap().rate_kbps == 25_000_000);
    // Ethernet padding after the IP packet is not part of the CNP: it is taken.
    let mut padded = cnp.clone();
    padded.extend([0u8; 6]);
    rx(&mut e[0], &padded);
    assert_eq!(e[0].qp_counters(q[0]).unwrap().cnp_rcvd, 1);
    // A flood: 20000 CNPs, a microsecond apart, then the same at once; the rate stays at or above rp_min_rate
    // (1 Mb/s) and every CNP is counted as received and acted on.
    for k in 0..40_000u64 {
        if k < 20_000 {
            rx(&mut e[0], &cnp);
        } else {
            e[0].handle_rx(t.get(), &cnp, RxMeta::default());
        }
        if k % 1000 == 0 {
            e[0].handle_timeout(t.get());
        }
        let st = e[0].qp_cc_state(q[0]).unwrap();
        assert!(st.rate_kbps >= 1_000 && st.rate_kbps <= st.target_kbps && st.target_kbps <= 25_000_000, "{st:?}");
    }
    let s = e[0].stats();
    assert_eq!((s.rx_cnp, s.rx_cnp_ignored), (40_003, 2));
    assert_eq!(e[0].qp_counters(q[0]).unwrap().cnp_rcvd, 40_001);
    assert_eq!(e[0].qp_cc_state(q[0]).unwrap().rate_kbps, 1_000, "a flood of CNPs ends at the minimum rate");
}

/// The simulator's two nodes under `cfg`, one QP each connected over IPv6 or IPv4, a 100-byte WRITE posted on node 0.
fn sim_pair(cfg: EngineConfig, ipv6: bool) -> ([Engine; 2], [u32; 2]) {
    use roce_dp::sim::{LinkConfig, Sim};
    let mut e = Sim::new(cfg, [LinkConfig::default(); 2], 1).nodes;
    let mut qpn = [0; 2];
    let mut keys = Vec::new();
    for n in 0..2 {
        let pd = e[n].alloc_pd();
        let cq = e[n].create_cq(16).unwrap();
        keys.push(e[n].reg_mr(pd, VA, 4096, AccessFlags::ALL).unwrap());
        qpn[n] = e[n].create_qp(pd, cq, cq, QpCaps::default()).unwrap();
    }
    for n in 0..2 {
        let peer = if ipv6 { Sim::peer6_of(1 - n) } else { Sim::peer_of(1 - n) };
        connect(&mut e[n], qpn[n], qpn[1 - n], peer, 1024).unwrap();
    }
    let wr = SendWr::new(1, WrOpcode::RdmaWrite).remote(VA, keys[1].rkey);
    e[0].post_send(qpn[0], &wr, &[Sge { addr: VA, len: 100, lkey: keys[0].lkey }]).unwrap();
    (e, qpn)
}

#[test]
fn an_ipv6_cnp_has_the_cnp_format_too() {
    let (mut e, qpn) = sim_pair(EngineConfig::default(), true);
    let mut f = tx(&mut e[0], Instant::ZERO).unwrap();
    assert_eq!(wire::parse_frame(&f).unwrap().repr.ip.ecn, Ecn::Ect0);
    // CE: the two low bits of the traffic class (byte 15's 0x30); the ICRC masks the traffic class.
    f[15] |= 0x30;
    let p = wire::parse_frame(&f).unwrap();
    assert!(p.icrc_ok && p.repr.ip.ecn == Ecn::Ce);
    e[1].handle_rx(Instant::from_micros(1), &f, RxMeta::default());
    let cnp = tx(&mut e[1], Instant::from_micros(1)).expect("a CNP first");
    let p = wire::parse_frame(&cnp).unwrap();
    let r = p.repr;
    assert!(p.icrc_ok && p.payload.is_empty());
    assert_eq!((r.bth.opcode, r.bth.becn, r.bth.fecn, r.bth.ack_req), (Opcode::CNP, true, false, false));
    assert_eq!((r.bth.dest_qp, r.bth.pkey, r.bth.psn.value()), (qpn[0], 0xffff, 0));
    assert_eq!((r.ip.dscp, r.ip.ecn), (48, Ecn::NotEct));
    assert_eq!(r.ip.addrs, IpAddrs::V6 { src: roce_dp::sim::NODE_IP6[1], dst: roce_dp::sim::NODE_IP6[0] });
    // Ethernet 14 + IPv6 40 + UDP 8 + BTH 12 + 16 reserved zero bytes + ICRC 4.
    assert_eq!(cnp.len(), 94);
    assert_eq!(&cnp[74..90], &[0u8; 16]);
}

#[test]
fn a_destroyed_or_idle_limited_qp_leaves_no_timer_behind() {
    // Destroyed: its timers go with it, and a QP created in its place (the same QP number, once the engine's
    // cyclic allocation comes round to it again) starts unlimited with no timer.
    let (mut e, q) = pair(dcqcn(4), dcqcn(4));
    let cnp = ce_stream(&mut e, 1).pop().expect("a CNP").1;
    e[0].handle_rx(Instant::from_micros(10), &cnp, RxMeta::default());
    assert!(e[0].poll_timeout().is_some());
    e[0].destroy_qp(q[0]).unwrap();
    assert_eq!(e[0].poll_timeout(), None);
    let pd = e[0].alloc_pd();
    let cq = e[0].create_cq(4).unwrap();
    let mut created = 0;
    loop {
        let n = e[0].create_qp(pd, cq, cq, QpCaps::default()).unwrap();
        if n == q[0] {
            break;
        }
        e[0].destroy_qp(n).unwrap();
        created += 1;
        assert!(created <= 4096, "QP number {:#x} never handed out again", q[0]);
    }
    assert!(!e[0].qp_cc_state(q[0]).unwrap().limited);
    assert_eq!(e[0].poll_timeout(), None);
    // Idle (nothing polled out): the rate-increase timer raises the rate back to the line rate, 300 µs at a time,
    // and then stops. Every deadline lies after the previous one (no timer re-armed in the past, no spin).
    let (mut e, q) = pair(dcqcn(4), CcConfig::default());
    let cnp = ce_stream(&mut e, 1).pop().expect("a CNP").1;
    e[0].handle_rx(Instant::from_micros(10), &cnp, RxMeta::default());
    let mut last = Instant::from_micros(10);
    let mut expiries = 0;
    while e[0].qp_cc_state(q[0]).unwrap().limited {
        let t = e[0].poll_timeout().expect("a limited QP keeps its rate-increase timer");
        assert!(t > last, "deadline {t} not after {last}");
        e[0].handle_timeout(t);
        last = t;
        expiries += 1;
        assert!(expiries < 100, "the rate never recovers");
    }
    assert_eq!(e[0].qp_cc_state(q[0]).unwrap().rate_kbps, 25_000_000);
    // Fast recovery halves the distance to the line rate every 300 µs: ~25 steps from 12.5 Gb/s to 25 Gb/s (the
    // data frame's retransmission timer, 4.2 ms, is among the expiries).
    assert!(last <= Instant::from_micros(10 + 30 * 300), "recovered at {last} after {expiries} expiries");
}

#[test]
fn a_rate_that_cannot_rise_again_stops_its_timer() {
    // No additive or hyper increase (rp_ai_rate 0, no byte counter), the target clamped on every cut, a 1 µs
    // rate-increase timer: after two cuts, fast recovery brings Rc to Rt below the line rate, where no timer event
    // can change it before the next CNP. The timer must stop there, not fire every microsecond for ever.
    let (mut e, q, cnp) =
        cut_twice(DcqcnConfig { rp_ai_rate: 0, rp_byte_reset: 0, rp_time_reset: 1, ..DcqcnConfig::default() });
    // Run every timer due in the first 2 ms; the one data frame's retransmission timer (4.2 ms) is the only one
    // left after them.
    let mut expiries = 0;
    while let Some(t) = e[0].poll_timeout().filter(|&t| t < Instant::from_micros(2_000)) {
        e[0].handle_timeout(t);
        expiries += 1;
        assert!(expiries < 10_000, "the rate-increase timer runs for ever (at {t})");
    }
    assert!(e[0].poll_timeout().is_some_and(|t| t > Instant::from_micros(4_000)), "{:?}", e[0].poll_timeout());
    let st = e[0].qp_cc_state(q[0]).unwrap();
    assert!(st.limited && st.rate_kbps == st.target_kbps && st.target_kbps < 25_000_000, "{st:?}");
    // The next CNP cuts and starts the timer again.
    e[0].handle_rx(Instant::from_micros(2_000), &cnp, RxMeta::default());
    assert!(e[0].qp_cc_state(q[0]).unwrap().rate_kbps < st.rate_kbps);
    assert!(e[0].poll_timeout().is_some_and(|t| t < Instant::from_micros(2_010)));
}
