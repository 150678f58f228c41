//! Session 10: resolving a peer that does not answer must not flood the segment. The daemon's control thread asks
//! the worker every 20 ms for up to 3 s while a peer's MAC is unknown, and the worker solicits on each ask
//! (`Worker::solicit` -> `Neighbours::solicit_at`): without a rate limit that was ~150 broadcasts per `ModifyQp`.
//! Expected behaviour from what Linux does (a few ARP probes, 1 s apart), with a fast start so that a peer that
//! answers the first or second solicitation is still resolved in milliseconds. `roce_dp::neigh` is sans-IO: time
//! is an argument, so the 3 s are simulated.

use roce_dp::neigh::{NeighIp, Neighbours, SOLICIT_FORGET};
use roce_dp::time::Instant;
use roce_dp::wire::MacAddr;

const OUR_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 1]);
const PEER_MAC: MacAddr = MacAddr([2, 0, 0, 0, 0, 2]);
const V6_US: [u8; 16] = [0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];

/// Asks for `ip` every 20 ms from `from` for 3 s, as the daemon's resolution loop does: the instants (ms after
/// `from`) at which a solicitation was written.
fn ask_for_3s(n: &mut Neighbours, ip: NeighIp, from: u64) -> Vec<u64> {
    let mut sent = Vec::new();
    let mut out = [0u8; 128];
    for k in 0..=150 {
        let t = k * 20;
        if n.solicit_at(ip, Instant((from + t) * 1_000_000), &mut out).is_some() {
            sent.push(t);
        }
    }
    sent
}

#[test]
fn an_unanswered_resolution_sends_a_few_solicitations_with_backoff() {
    let mut n = Neighbours::new(OUR_MAC, Some([10, 0, 0, 1]), Some(V6_US));
    let peer = NeighIp::V4([10, 0, 0, 2]);
    let sent = ask_for_3s(&mut n, peer, 0);
    // At once, then gaps of 20, 40, 80, ... ms up to 1 s (the asks come on a 20 ms grid).
    assert_eq!(sent, [0, 20, 60, 140, 300, 620, 1260, 2260], "151 asks, 8 broadcasts");
    assert_eq!(n.stats.arp_requests, 8);
    assert_eq!(n.stats.solicits_limited, 151 - 8);
    // Another target has its own backoff (IPv6 too), in the same window.
    let other = NeighIp::V6([0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 7]);
    assert_eq!(ask_for_3s(&mut n, other, 0).len(), 8);
    assert_eq!(n.stats.nd_solicits, 8);
    // A second ModifyQp right after the first timed out: the backoff goes on (1 s gaps), no new burst.
    let again = ask_for_3s(&mut n, peer, 3020);
    assert!(again.len() <= 3, "{again:?}");
    // After a quiet while the next resolution starts fast again.
    let later = 6040 + SOLICIT_FORGET.as_nanos() / 1_000_000;
    assert_eq!(&ask_for_3s(&mut n, peer, later)[..3], [0, 20, 60]);
}

#[test]
fn an_answer_ends_the_backoff_and_the_entry_is_used() {
    let mut us = Neighbours::new(OUR_MAC, Some([10, 0, 0, 1]), None);
    let mut peer = Neighbours::new(PEER_MAC, Some([10, 0, 0, 2]), None);
    let ip = NeighIp::V4([10, 0, 0, 2]);
    let (mut req, mut rep, mut scratch) = ([0u8; 128], [0u8; 128], [0u8; 128]);
    let n = us.solicit_at(ip, Instant(0), &mut req).expect("the first at once");
    assert!(us.solicit_at(ip, Instant(1_000_000), &mut scratch).is_none(), "1 ms later: limited");
    let m = peer.handle(&req[..n], &mut rep).expect("the peer answers");
    assert_eq!(us.handle(&rep[..m], &mut scratch), None);
    assert_eq!(us.lookup(ip), Some(PEER_MAC));
    // The answer ended the target's backoff: asking again (should the entry be needed anew) solicits at once.
    assert!(us.solicit_at(ip, Instant(2_000_000), &mut scratch).is_some(), "no stale backoff after an answer");
}
