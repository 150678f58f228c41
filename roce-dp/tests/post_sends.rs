//! `Engine::post_sends_with`, the batch entry point the daemon's worker posts its clients' WQEs through (each WR
//! written straight into the send queue's slot): the same frames as `post_send`, and `post_send`'s checks on every
//! WR the source writes (state, SGE count, message length, inline limits), a refused WR left unposted and the batch
//! ended, a full queue ending it without an error, the source's error handed back.

mod harness;

use harness::*;
use roce_dp::{PostSendsStop, QpAttr, QpState, SendSlot, SendWr, Sge, VerbsError, WrOpcode};

const RVA: u64 = 0x7f00_0000_1000;
const RKEY: u32 = 0x1234;

/// What a test source writes into a slot: a WR and its SGEs, or a WR and inline bytes (`wr.inline`).
#[derive(Clone)]
enum Item {
    Sgl(SendWr, Vec<Sge>),
    Inline(SendWr, Vec<u8>),
    /// Claims `n` SGEs after writing only the first (for the count checks).
    Count(SendWr, Sge, u32),
    Fail(&'static str),
}

/// Posts `items` as one batch of at most `max`; returns what `post_sends_with` said and how many items the source
/// handed out.
fn batch(p: &mut Peer, max: u32, items: &[Item]) -> (u32, Option<PostSendsStop<&'static str>>, usize) {
    let mut it = items.iter();
    let mut taken = 0;
    let (n, stop) = p
        .eng
        .post_sends_with(p.qpn, max, |slot: SendSlot<'_>| {
            let Some(item) = it.next() else { return Ok(None) };
            taken += 1;
            match item {
                Item::Sgl(wr, sgl) => {
                    *slot.wr = *wr;
                    slot.sges[..sgl.len()].copy_from_slice(sgl);
                    Ok(Some(sgl.len() as u32))
                }
                Item::Inline(wr, data) => {
                    *slot.wr = SendWr { inline: true, ..*wr };
                    slot.inline[..data.len()].copy_from_slice(data);
                    Ok(Some(data.len() as u32))
                }
                Item::Count(wr, s, n) => {
                    *slot.wr = *wr;
                    slot.sges[0] = *s;
                    Ok(Some(*n))
                }
                Item::Fail(e) => Err(*e),
            }
        })
        .expect("the QP exists");
    (n, stop, taken)
}

fn write(p: &Peer, wr_id: u64, off: u64, len: u32) -> Item {
    Item::Sgl(SendWr::new(wr_id, WrOpcode::RdmaWrite).remote(RVA + off, RKEY), vec![p.sge(off, len)])
}

fn raw(v: &[Out]) -> Vec<Vec<u8>> {
    v.iter().map(|o| o.raw.clone()).collect()
}

#[test]
fn a_batch_sends_the_frames_post_send_sends() {
    let (mut a, mut b) = (Peer::new(), Peer::new());
    a.fill_data();
    b.fill_data();
    let items = vec![
        write(&a, 1, 0, 3000),
        Item::Sgl(SendWr::new(2, WrOpcode::Send), vec![a.sge(100, 10), a.sge(5000, 700)]),
        Item::Inline(
            SendWr { imm: 0xabcd, ..SendWr::new(3, WrOpcode::RdmaWriteWithImm).remote(RVA, RKEY) },
            b"inline!".to_vec(),
        ),
        write(&a, 4, 64, 0),
    ];
    assert_eq!(batch(&mut a, 16, &items), (4, None, 4), "the source's Ok(None) ends the batch");
    b.post(SendWr::new(1, WrOpcode::RdmaWrite).remote(RVA, RKEY), &[b.sge(0, 3000)]);
    b.post(SendWr::new(2, WrOpcode::Send), &[b.sge(100, 10), b.sge(5000, 700)]);
    let data = b"inline!";
    let wr = SendWr { imm: 0xabcd, ..SendWr::new(3, WrOpcode::RdmaWriteWithImm).remote(RVA, RKEY) };
    b.eng.post_send_inline(b.qpn, &wr, data).unwrap();
    b.post(SendWr::new(4, WrOpcode::RdmaWrite).remote(RVA + 64, RKEY), &[b.sge(64, 0)]);
    let (fa, fb) = (a.tx(), b.tx());
    assert_eq!(fa.len(), 6, "3 + 1 + 1 + 1 frames: {}", show(&fa));
    assert_eq!(raw(&fa), raw(&fb));
    assert_eq!(a.eng.query_qp(a.qpn).unwrap().sq_outstanding, 4);
}

#[test]
fn every_wr_gets_post_sends_checks_and_a_refused_one_is_not_posted() {
    let mut p = Peer::new();
    let max_sge = p.cfg.caps.max_send_sge;
    let max_inline = p.cfg.caps.max_inline as usize;
    let w = SendWr::new(9, WrOpcode::RdmaWrite).remote(RVA, RKEY);
    let cases: Vec<(Item, VerbsError)> = vec![
        (Item::Count(w, p.sge(0, 8), max_sge + 1), VerbsError::TooManySge(max_sge as usize + 1)),
        (Item::Count(w, p.sge(0, 8), 1000), VerbsError::TooManySge(1000)),
        (Item::Sgl(w, vec![p.sge(0, u32::MAX), p.sge(0, 2)]), VerbsError::BadLength(u64::from(u32::MAX) + 2)),
        (
            Item::Sgl(SendWr::new(9, WrOpcode::AtomicFetchAdd).remote(RVA, RKEY), vec![p.sge(0, 16)]),
            VerbsError::BadLength(16),
        ),
        (
            Item::Count(SendWr { inline: true, ..w }, p.sge(0, 0), max_inline as u32 + 1),
            VerbsError::BadInline(max_inline as u64 + 1),
        ),
        (Item::Inline(SendWr::new(9, WrOpcode::RdmaRead).remote(RVA, RKEY), vec![1, 2]), VerbsError::BadInline(2)),
    ];
    for (k, (item, error)) in cases.into_iter().enumerate() {
        let items = [write(&p, 100 + k as u64, 0, 64), item, write(&p, 200, 0, 64)];
        let (n, stop, taken) = batch(&mut p, 8, &items);
        assert_eq!((n, taken), (1, 2), "case {k}: the WR before is posted, the batch ends at the refused one");
        assert_eq!(stop, Some(PostSendsStop::Refused { wr_id: 9, error }), "case {k}");
        let v = p.tx();
        assert_eq!(v.len(), 1, "case {k}: only the good WR went out: {}", show(&v));
        p.rx(ack(v[0].psn(), 1));
        p.expect_cqes(&[(100 + k as u64, roce_dp::WcStatus::Success)]);
    }
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_outstanding, 0, "no refused WR stayed in the queue");
}

#[test]
fn a_qp_before_rts_refuses_the_first_wr_with_its_id() {
    let mut p = Peer::new();
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Reset), ..QpAttr::default() }).unwrap();
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Init), ..QpAttr::default() }).unwrap();
    let items = [write(&p, 7, 0, 64), write(&p, 8, 0, 64)];
    let (n, stop, taken) = batch(&mut p, 8, &items);
    assert_eq!((n, taken), (0, 1));
    assert_eq!(stop, Some(PostSendsStop::Refused { wr_id: 7, error: VerbsError::BadState(QpState::Init) }));
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_outstanding, 0);
}

#[test]
fn a_full_queue_or_the_count_ends_the_batch_and_the_source_keeps_the_rest() {
    let mut p = Peer::new();
    let depth = p.cfg.caps.max_send_wr;
    let items: Vec<Item> = (0..depth as u64 + 5).map(|i| write(&p, i, 0, 8)).collect();
    assert_eq!(batch(&mut p, 3, &items), (3, None, 3), "max");
    let (n, stop, taken) = batch(&mut p, u32::MAX, &items);
    assert_eq!((n, stop, taken), (depth - 3, None, (depth - 3) as usize), "full: no slot, the source not asked");
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_outstanding, depth);
    assert_eq!(batch(&mut p, 4, &items), (0, None, 0));
}

#[test]
fn the_sources_error_ends_the_batch_and_an_error_state_qp_flushes_what_was_posted() {
    let mut p = Peer::new();
    let items = [write(&p, 1, 0, 8), Item::Fail("corrupt"), write(&p, 2, 0, 8)];
    assert_eq!(batch(&mut p, 8, &items), (1, Some(PostSendsStop::Source("corrupt")), 2));
    assert_eq!(p.tx().len(), 1);
    p.eng.modify_qp(p.qpn, &QpAttr { state: Some(QpState::Err), ..QpAttr::default() }).unwrap();
    let _ = p.cqes();
    let items = [write(&p, 3, 0, 8), write(&p, 4, 0, 8)];
    assert_eq!(batch(&mut p, 8, &items), (2, None, 2));
    p.expect_cqes(&[(3, roce_dp::WcStatus::WrFlushErr), (4, roce_dp::WcStatus::WrFlushErr)]);
    assert!(p.tx().is_empty(), "nothing sent in the error state");
    assert!(p.eng.post_sends_with(0xdead, 8, |_| Ok::<_, ()>(None)).is_err(), "no such QP");
}

/// `post_send` and `post_sends_with` check a WR with one function in one order (state, SGE count, message length,
/// inline limits), so a WR that breaks two rules gets the same error from both: an inline atomic of 16 bytes is a
/// BadLength (the atomic's 8 bytes) from either, not a BadInline from the batch (as it was until session 17).
#[test]
fn both_entry_points_refuse_a_wr_with_the_same_error() {
    let mut p = Peer::new();
    let max_inline = p.cfg.caps.max_inline;
    let max_sge = p.cfg.caps.max_send_sge as usize;
    let inline = |op| SendWr { inline: true, ..SendWr::new(9, op).remote(RVA, RKEY) };
    let write_wr = SendWr::new(9, WrOpcode::RdmaWrite).remote(RVA, RKEY);
    // (the WR, its SGEs; post_sends_with gets the SGEs' bytes inline when the WR is inline)
    let cases: Vec<(SendWr, Vec<Sge>, VerbsError)> = vec![
        (inline(WrOpcode::AtomicFetchAdd), vec![p.sge(0, 16)], VerbsError::BadLength(16)),
        (inline(WrOpcode::AtomicCmpSwp), vec![p.sge(0, 4), p.sge(8, 8)], VerbsError::BadLength(12)),
        (inline(WrOpcode::AtomicCmpSwp), vec![p.sge(0, 8)], VerbsError::BadInline(8)),
        (inline(WrOpcode::RdmaRead), vec![p.sge(0, 2)], VerbsError::BadInline(2)),
        (
            SendWr { inline: true, ..write_wr },
            vec![p.sge(0, max_inline), p.sge(0, 1)],
            VerbsError::BadInline(u64::from(max_inline) + 1),
        ),
        (SendWr::new(9, WrOpcode::AtomicFetchAdd).remote(RVA, RKEY), vec![p.sge(0, 16)], VerbsError::BadLength(16)),
        (write_wr, vec![p.sge(0, 8); max_sge + 1], VerbsError::TooManySge(max_sge + 1)),
    ];
    for (k, (wr, sgl, error)) in cases.into_iter().enumerate() {
        let single = p.eng.post_send(p.qpn, &wr, &sgl);
        let bytes: u32 = sgl.iter().map(|s| s.len).sum();
        let item = if wr.inline && bytes > max_inline {
            Item::Count(wr, sgl[0], bytes) // claims more bytes than the slot's room
        } else if wr.inline {
            Item::Inline(wr, vec![0x5a; bytes as usize])
        } else if sgl.len() > max_sge {
            Item::Count(wr, sgl[0], sgl.len() as u32)
        } else {
            Item::Sgl(wr, sgl)
        };
        let (n, stop, _) = batch(&mut p, 8, &[item]);
        assert_eq!(single, Err(error), "case {k}: post_send");
        assert_eq!((n, stop), (0, Some(PostSendsStop::Refused { wr_id: 9, error })), "case {k}: post_sends_with");
    }
    assert_eq!(p.eng.query_qp(p.qpn).unwrap().sq_outstanding, 0, "nothing was posted");
}
