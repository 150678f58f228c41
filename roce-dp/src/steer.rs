//! Hardware steering bookkeeping (no DPDK): which exact-match rules a port should hold so that each RC QP's
//! incoming frames reach the rx queue of the worker that owns the QP.
//!
//! A frame for our QP `l` from the peer's QP `r` carries UDP source port `rxe_udp_sport(r, l)` when the peer is
//! rxe or roce-dp (the same value both ways: it hashes the product of the QPNs), so once a QP is connected (RTR:
//! peer address and QPN known) one rule `IP src = peer, UDP src = sport, UDP dst = 4791 -> QUEUE owner` steers all
//! of its frames. Two QPs can hash to the same source port with the same peer: the [`SteerTable`] then keeps a rule
//! only while every QP behind the key lives on one worker, removes it as soon as QPs on two workers share it
//! (those frames then land on the port's default queue and the worker that gets them forwards them to the owner,
//! counted as steering misses), and puts it back when the conflict is gone. A table full of rules (the PMD's limit
//! or the profile's `max_rules`) and a rule the PMD refuses are handled the same way: no rule, forwarding instead;
//! keys that found the table full wait, in order, for the next free slot (a rule removed, a conflict, a refusal).
//! Whatever happens here, no frame reaches the wrong engine: steering only decides where a frame is received; the
//! worker checks the owner of every RoCE frame by its BTH destination QP and forwards it if it is not its own.

use std::collections::{HashMap, VecDeque};

/// What a per-QP rule matches: the peer's address and the UDP source port of the pair's frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FlowKey {
    /// IPv6 (else IPv4 in the first 4 bytes of `src_ip`).
    pub ipv6: bool,
    /// The peer's address.
    pub src_ip: [u8; 16],
    /// The UDP source port of the peer's frames.
    pub udp_src: u16,
}

impl FlowKey {
    /// The key for frames from `peer` (IPv4) with UDP source port `udp_src`.
    pub fn v4(peer: [u8; 4], udp_src: u16) -> Self {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&peer);
        Self { ipv6: false, src_ip: a, udp_src }
    }

    /// The key for frames from `peer` (IPv6) with UDP source port `udp_src`.
    pub fn v6(peer: [u8; 16], udp_src: u16) -> Self {
        Self { ipv6: true, src_ip: peer, udp_src }
    }
}

/// A change the caller makes on the port (install or destroy one rte_flow rule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleOp {
    /// Create the rule `key -> QUEUE queue`; report a refusal with [`SteerTable::refused`].
    Install {
        /// What to match.
        key: FlowKey,
        /// The owner's rx queue.
        queue: u16,
    },
    /// Destroy the rule for `key`.
    Remove {
        /// The rule's key.
        key: FlowKey,
    },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RuleState {
    /// A rule is installed (the caller applied [`RuleOp::Install`] and did not report a refusal).
    Installed,
    /// No rule: QPs on different workers share the key.
    Conflict,
    /// No rule: the table was full.
    Full,
    /// No rule: the PMD refused it (not retried).
    Refused,
}

#[derive(Debug)]
struct Entry {
    /// (QPN, owner's queue) of every QP behind the key.
    qps: Vec<(u32, u16)>,
    state: RuleState,
}

impl Entry {
    /// The one queue every QP behind the key lives on, if they agree.
    fn single_queue(&self) -> Option<u16> {
        let q = self.qps.first()?.1;
        self.qps.iter().all(|&(_, x)| x == q).then_some(q)
    }
}

/// Counters of a [`SteerTable`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SteerStats {
    /// Rules installed now.
    pub rules: u32,
    /// Keys without a rule because QPs on different workers share them.
    pub conflicts: u32,
    /// Keys without a rule because the table was full.
    pub full: u32,
    /// Keys without a rule because the PMD refused it.
    pub refused: u32,
}

/// The exact-match rules a port should hold, by key; see the module docs.
#[derive(Debug)]
pub struct SteerTable {
    max_rules: usize,
    entries: HashMap<FlowKey, Entry>,
    installed: usize,
    /// Keys that found the table full, oldest first (an entry may have changed since: checked when taken).
    waiting: VecDeque<FlowKey>,
}

impl SteerTable {
    /// A table allowing at most `max_rules` rules at once.
    pub fn new(max_rules: usize) -> Self {
        Self { max_rules, entries: HashMap::new(), installed: 0, waiting: VecDeque::new() }
    }

    /// Gives free slots to waiting keys (oldest first) whose QPs still agree on one queue: their installs.
    fn fill_free_slots(&mut self, ops: &mut Vec<RuleOp>) {
        while self.installed < self.max_rules {
            let Some(key) = self.waiting.pop_front() else { return };
            let Some(e) = self.entries.get_mut(&key) else { continue };
            if e.state != RuleState::Full {
                continue;
            }
            if let Some(queue) = e.single_queue() {
                e.state = RuleState::Installed;
                self.installed += 1;
                ops.push(RuleOp::Install { key, queue });
            }
        }
    }

    /// QP `qpn`, owned by the worker on rx queue `queue`, receives the frames `key` matches. Returns what to do
    /// on the port, in order: nothing, an install, or the removal of a rule that now covers QPs on two workers
    /// (and then the install of a key that waited for the slot it frees).
    pub fn add(&mut self, key: FlowKey, qpn: u32, queue: u16) -> Vec<RuleOp> {
        let room = self.installed < self.max_rules;
        let Some(e) = self.entries.get_mut(&key) else {
            let state = if room { RuleState::Installed } else { RuleState::Full };
            self.entries.insert(key, Entry { qps: vec![(qpn, queue)], state });
            if !room {
                self.waiting.push_back(key);
                return Vec::new();
            }
            self.installed += 1;
            return vec![RuleOp::Install { key, queue }];
        };
        e.qps.retain(|&(q, _)| q != qpn);
        e.qps.push((qpn, queue));
        if e.single_queue().is_some() || e.state == RuleState::Refused {
            return Vec::new();
        }
        let was = std::mem::replace(&mut e.state, RuleState::Conflict);
        let mut ops = Vec::new();
        if was == RuleState::Installed {
            self.installed -= 1;
            ops.push(RuleOp::Remove { key });
            self.fill_free_slots(&mut ops);
        }
        ops
    }

    /// QP `qpn` is gone (destroyed, or reset before it connects elsewhere). Returns, in order, the removal of its
    /// rule when no QP needs it any more (and the install of a key that waited for the slot it frees), or the
    /// install of a rule whose conflict just ended.
    pub fn remove(&mut self, key: FlowKey, qpn: u32) -> Vec<RuleOp> {
        let mut ops = Vec::new();
        let Some(e) = self.entries.get_mut(&key) else { return ops };
        e.qps.retain(|&(q, _)| q != qpn);
        if e.qps.is_empty() {
            let was = e.state;
            self.entries.remove(&key);
            if was == RuleState::Installed {
                self.installed -= 1;
                ops.push(RuleOp::Remove { key });
                self.fill_free_slots(&mut ops);
            }
            return ops;
        }
        if matches!(e.state, RuleState::Conflict | RuleState::Full) {
            if let Some(queue) = e.single_queue() {
                if self.installed < self.max_rules {
                    e.state = RuleState::Installed;
                    self.installed += 1;
                    ops.push(RuleOp::Install { key, queue });
                } else if e.state != RuleState::Full {
                    e.state = RuleState::Full;
                    self.waiting.push_back(key);
                }
            }
        }
        ops
    }

    /// The PMD refused the install of `key`'s rule: its frames are forwarded in software from now on (no retry).
    /// Returns the install of a key that waited for the slot this frees (which the PMD may refuse in turn).
    pub fn refused(&mut self, key: FlowKey) -> Vec<RuleOp> {
        let mut ops = Vec::new();
        if let Some(e) = self.entries.get_mut(&key) {
            if e.state == RuleState::Installed {
                e.state = RuleState::Refused;
                self.installed -= 1;
                self.fill_free_slots(&mut ops);
            }
        }
        ops
    }

    /// The queue a rule steers `key` to, if one is installed.
    pub fn rule(&self, key: &FlowKey) -> Option<u16> {
        let e = self.entries.get(key)?;
        (e.state == RuleState::Installed).then(|| e.single_queue()).flatten()
    }

    /// Counters.
    pub fn stats(&self) -> SteerStats {
        let mut s = SteerStats { rules: self.installed as u32, ..SteerStats::default() };
        for e in self.entries.values() {
            match e.state {
                RuleState::Installed => {}
                RuleState::Conflict => s.conflicts += 1,
                RuleState::Full => s.full += 1,
                RuleState::Refused => s.refused += 1,
            }
        }
        s
    }
}

/// How a port gets RoCE frames to the worker owning their QP (a port profile's `[worker] steering`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SteeringMode {
    /// One rx queue; worker 0 receives every frame and forwards each to its owner over SPSC rings.
    Software,
    /// One rx queue per worker and an exact rte_flow rule per connected QP (peer address + UDP source port ->
    /// the owner's queue); frames without a rule (other peers' entropy, conflicts, a full table) are forwarded by
    /// whichever worker receives them, counted as steering misses. Refused by the PMD: an error.
    RteFlow,
    /// One rx queue per worker, spread by the port itself (RSS, or the kernel's flow hash on net_tap); every
    /// frame a worker does not own is forwarded to its owner and counted as a steering miss.
    Rss,
    /// `rte_flow` where the PMD accepts a rule (checked with `rte_flow_validate` and a first create), else
    /// `software`; the choice is printed at start.
    Auto,
}

impl SteeringMode {
    /// Parse a profile or command-line value; the error is one line naming what is accepted.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "software" => Ok(Self::Software),
            "rte_flow" => Ok(Self::RteFlow),
            "rss" => Ok(Self::Rss),
            "auto" => Ok(Self::Auto),
            _ => Err(format!("steering = {s:?}: expected \"software\", \"rte_flow\", \"rss\" or \"auto\"")),
        }
    }

    /// The profile spelling.
    pub fn name(self) -> &'static str {
        match self {
            Self::Software => "software",
            Self::RteFlow => "rte_flow",
            Self::Rss => "rss",
            Self::Auto => "auto",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::rxe_udp_sport;

    const PEER: [u8; 4] = [10, 0, 0, 2];

    #[test]
    fn one_rule_per_connected_qp_and_removed_with_it() {
        let mut t = SteerTable::new(16);
        let (a, b) =
            (FlowKey::v4(PEER, rxe_udp_sport(0x100, 0x100)), FlowKey::v4(PEER, rxe_udp_sport(0x10100, 0x10100)));
        assert_ne!(a, b);
        assert_eq!(t.add(a, 0x100, 0), vec![RuleOp::Install { key: a, queue: 0 }]);
        assert_eq!(t.add(b, 0x10100, 1), vec![RuleOp::Install { key: b, queue: 1 }]);
        assert_eq!((t.rule(&a), t.rule(&b)), (Some(0), Some(1)));
        assert_eq!(t.stats(), SteerStats { rules: 2, ..SteerStats::default() });
        assert_eq!(t.remove(b, 0x10100), vec![RuleOp::Remove { key: b }]);
        assert_eq!(t.remove(b, 0x10100), vec![], "removing twice is a no-op");
        assert_eq!(t.rule(&b), None);
        assert_eq!(t.stats().rules, 1);
    }

    #[test]
    fn shared_key_on_one_worker_keeps_the_rule_on_two_workers_drops_it() {
        let mut t = SteerTable::new(16);
        let k = FlowKey::v4(PEER, 0xc123);
        assert!(matches!(t.add(k, 0x100, 1)[..], [RuleOp::Install { queue: 1, .. }]));
        assert_eq!(t.add(k, 0x101, 1), vec![], "same worker: the rule already covers it");
        assert_eq!(t.add(k, 0x10100, 0), vec![RuleOp::Remove { key: k }], "two workers share the key: no rule");
        assert_eq!(t.rule(&k), None);
        assert_eq!(t.stats(), SteerStats { rules: 0, conflicts: 1, ..SteerStats::default() });
        assert_eq!(t.remove(k, 0x101), vec![], "still a conflict (0x100 on queue 1, 0x10100 on queue 0)");
        assert_eq!(t.remove(k, 0x10100), vec![RuleOp::Install { key: k, queue: 1 }], "conflict over: back");
        assert_eq!(t.rule(&k), Some(1));
        assert_eq!(t.remove(k, 0x100), vec![RuleOp::Remove { key: k }]);
        assert_eq!(t.stats(), SteerStats::default());
    }

    #[test]
    fn full_table_and_refused_rules_fall_back_to_forwarding() {
        let mut t = SteerTable::new(2);
        let keys: Vec<FlowKey> = (0..4).map(|i| FlowKey::v4(PEER, 0xc000 + i)).collect();
        assert!(!t.add(keys[0], 1, 0).is_empty());
        assert!(!t.add(keys[1], 2, 1).is_empty());
        assert_eq!(t.add(keys[2], 3, 1), vec![], "table full: forwarded in software");
        assert_eq!(t.stats(), SteerStats { rules: 2, full: 1, ..SteerStats::default() });
        // A refused key frees its slot: the key that waited for one gets it.
        assert_eq!(t.refused(keys[1]), vec![RuleOp::Install { key: keys[2], queue: 1 }]);
        assert_eq!(t.rule(&keys[1]), None);
        assert_eq!(t.stats(), SteerStats { rules: 2, refused: 1, ..SteerStats::default() });
        assert_eq!(t.add(keys[3], 4, 0), vec![], "full again");
        assert_eq!(t.remove(keys[1], 2), vec![], "refused: nothing to destroy, no slot freed");
        assert_eq!(t.stats(), SteerStats { rules: 2, full: 1, ..SteerStats::default() });
        assert_eq!(t.remove(keys[3], 4), vec![]);
        assert_eq!(t.stats(), SteerStats { rules: 2, ..SteerStats::default() });
    }

    #[test]
    fn a_key_that_found_the_table_full_gets_the_next_free_slot() {
        // Session 11: a key that found the table full got a rule only if one of its own QPs went away; a slot
        // freed by another key (its QP destroyed, a conflict, a refusal) stayed empty, its frames forwarded for
        // good although the module promised the rule back once the full table ended.
        let keys: Vec<FlowKey> = (0..4).map(|i| FlowKey::v4(PEER, 0xd000 + i)).collect();
        let mut t = SteerTable::new(1);
        assert_eq!(t.add(keys[0], 0x100, 0), vec![RuleOp::Install { key: keys[0], queue: 0 }]);
        assert_eq!(t.add(keys[1], 0x10100, 1), vec![]);
        assert_eq!(t.add(keys[2], 0x101, 0), vec![]);
        assert_eq!(t.stats(), SteerStats { rules: 1, full: 2, ..SteerStats::default() });
        // keys[0]'s QP goes: its slot goes to the oldest waiting key.
        assert_eq!(
            t.remove(keys[0], 0x100),
            vec![RuleOp::Remove { key: keys[0] }, RuleOp::Install { key: keys[1], queue: 1 }]
        );
        assert_eq!((t.rule(&keys[1]), t.rule(&keys[2])), (Some(1), None));
        // keys[1] turns into a conflict (a QP of worker 0 shares it): its rule goes, keys[2] gets the slot.
        assert_eq!(
            t.add(keys[1], 0x102, 0),
            vec![RuleOp::Remove { key: keys[1] }, RuleOp::Install { key: keys[2], queue: 0 }]
        );
        assert_eq!(t.stats(), SteerStats { rules: 1, conflicts: 1, ..SteerStats::default() });
        // The conflict ends while the table is full: keys[1] waits, and gets the slot keys[2]'s refusal frees.
        assert_eq!(t.remove(keys[1], 0x102), vec![]);
        assert_eq!(t.stats(), SteerStats { rules: 1, full: 1, ..SteerStats::default() });
        assert_eq!(t.refused(keys[2]), vec![RuleOp::Install { key: keys[1], queue: 1 }]);
        assert_eq!(t.stats(), SteerStats { rules: 1, refused: 1, ..SteerStats::default() });
        // A waiting key whose QPs are all gone is skipped.
        assert_eq!(t.add(keys[3], 0x103, 0), vec![]);
        assert_eq!(t.remove(keys[3], 0x103), vec![]);
        assert_eq!(t.remove(keys[1], 0x10100), vec![RuleOp::Remove { key: keys[1] }]);
        assert_eq!(t.stats(), SteerStats { refused: 1, ..SteerStats::default() });
    }

    #[test]
    fn v6_keys_differ_from_v4() {
        let mut a6 = [0u8; 16];
        a6[..4].copy_from_slice(&PEER);
        assert_ne!(FlowKey::v4(PEER, 1), FlowKey::v6(a6, 1));
    }

    #[test]
    fn steering_mode_parse() {
        for m in [SteeringMode::Software, SteeringMode::RteFlow, SteeringMode::Rss, SteeringMode::Auto] {
            assert_eq!(SteeringMode::parse(m.name()), Ok(m));
        }
        let e = SteeringMode::parse("hw").unwrap_err();
        assert!(e.contains("\"hw\"") && e.contains("rte_flow"), "{e}");
    }
}
