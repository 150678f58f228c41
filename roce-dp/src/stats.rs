//! Counters named after causes, as rxe's hw_counters are. Plain u64 fields (one owner per engine: no atomics on
//! the packet path); `iter()` lists name/value pairs for tools.

/// Declares a counter struct with `iter()` over `(name, value)`.
macro_rules! counters {
    ($(#[$m:meta])* pub struct $name:ident { $( $(#[$fm:meta])* $field:ident, )* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct $name {
            $( $(#[$fm])* pub $field: u64, )*
        }
        impl $name {
            /// `(name, value)` for every counter, in declaration order.
            pub fn iter(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
                [$( (stringify!($field), self.$field), )*].into_iter()
            }
            /// Adds every counter of `o` into `self`.
            pub fn add(&mut self, o: &$name) {
                $( self.$field += o.$field; )*
            }
        }
    };
}

counters! {
    /// Engine-level counters: frames before they reach a QP, and transmit totals.
    pub struct EngineStats {
        /// Frames handed to `handle_rx`.
        rx_frames,
        /// Dropped: frame ends before a header or an announced length.
        rx_drop_truncated,
        /// Dropped: not IPv4/IPv6 (ARP and others are for the port layer).
        rx_drop_not_ip,
        /// Dropped: malformed IP header.
        rx_drop_bad_ip_header,
        /// Dropped: not UDP.
        rx_drop_not_udp,
        /// Dropped: UDP port is not 4791.
        rx_drop_not_roce,
        /// Dropped: IP/UDP length fields disagree.
        rx_drop_length_mismatch,
        /// Dropped: BTH version not 0.
        rx_drop_bad_bth_version,
        /// Dropped: opcode not in the table.
        rx_drop_unknown_opcode,
        /// Dropped: bad pad count.
        rx_drop_bad_pad,
        /// Dropped: ICRC mismatch.
        rx_drop_icrc,
        /// Dropped: destination IP is not this engine's.
        rx_drop_not_for_us,
        /// Dropped: 802.1Q-tagged for a VLAN (VID != 0): another network; the port has none and QPs send untagged.
        rx_drop_vlan,
        /// Dropped: no QP with the BTH destination QP number.
        rx_drop_unknown_qp,
        /// Dropped: source address is not the QP's peer.
        rx_drop_wrong_peer,
        /// Dropped: the QP is in RESET or INIT.
        rx_drop_bad_state,
        /// Dropped: opcode of another transport (UC/UD) or otherwise not for an RC QP.
        rx_drop_wrong_transport,
        /// CNPs received.
        rx_cnp,
        /// CNPs ignored: no congestion control, unknown QP, a QP in RESET, INIT or ERR, or not from the QP's peer.
        rx_cnp_ignored,
        /// Frames written by `poll_transmit`.
        tx_frames,
        /// Bytes written by `poll_transmit`.
        tx_bytes,
        /// `poll_transmit` called with a buffer too small for the QP's path MTU.
        tx_buffer_too_small,
        /// Frames that could not be emitted (should stay 0).
        tx_emit_errors,
        /// Timer expiries processed.
        timer_expiries,
    }
}

counters! {
    /// Per-QP counters.
    pub struct QpCounters {
        /// Packets transmitted.
        tx_packets,
        /// Frame bytes transmitted.
        tx_bytes,
        /// Request packets accepted by the responder.
        rx_packets,
        /// Payload bytes accepted by the responder.
        rx_bytes,
        /// Request packets sent again by go-back-N.
        retransmitted_packets,
        /// Local ACK timeouts that triggered a retry.
        retry_timeouts,
        /// Go-back-N rewinds (timeout, sequence NAK, RNR, or implied by a response).
        rewinds,
        /// Duplicate requests seen by the responder.
        duplicate_requests,
        /// Requests ahead of the expected PSN.
        out_of_sequence,
        /// NAK PSN sequence error sent.
        nak_psn_seq_sent,
        /// NAK invalid request sent.
        nak_inv_req_sent,
        /// NAK remote access error sent.
        nak_rem_access_sent,
        /// NAK remote operational error sent.
        nak_rem_op_sent,
        /// RNR NAKs sent.
        rnr_nak_sent,
        /// NAK PSN sequence error received.
        nak_psn_seq_rcvd,
        /// Fatal NAKs received (invalid request, remote access, remote operational).
        nak_fatal_rcvd,
        /// RNR NAKs received.
        rnr_nak_rcvd,
        /// Plain ACKs sent.
        acks_sent,
        /// Plain ACKs received.
        acks_rcvd,
        /// Responses dropped as stale or duplicate.
        duplicate_responses,
        /// Responses dropped as unexpected (wrong opcode, PSN never sent, bad length).
        bad_responses,
        /// Requests dropped silently (duplicates without a resource, flood of duplicates).
        dropped_requests,
        /// Send completions generated.
        send_completions,
        /// Receive completions generated.
        recv_completions,
        /// Completions lost to a full CQ.
        cq_overflows,
        /// Request packets whose payload could not be read at transmit time (their region was deregistered under
        /// the in-flight WR): not sent; the WR completed with LOC_PROT_ERR.
        tx_local_access_errors,
        /// Frames received with ECN = CE (congestion experienced).
        ecn_ce_rcvd,
        /// CNPs sent (notification point).
        cnp_sent,
        /// CE-marked frames that sent no CNP (inside np_min_time_between_cnps, NP disabled, or the QP in ERR).
        cnp_suppressed,
        /// CNPs received and acted on (reaction point).
        cnp_rcvd,
        /// CNPs received and ignored (congestion control off).
        cnp_ignored,
        /// Rate decreases by the reaction point.
        rate_decreases,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iter_and_add() {
        let mut a = QpCounters { rewinds: 2, ..Default::default() };
        a.add(&QpCounters { rewinds: 3, acks_sent: 1, ..Default::default() });
        let v: Vec<_> = a.iter().filter(|(_, v)| *v != 0).collect();
        assert_eq!(v, vec![("rewinds", 5), ("acks_sent", 1)]);
    }
}
