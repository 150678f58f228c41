//! The daemon's readers of a client's send and receive queues (`ctrl::wq`) over rings whose every byte the client
//! (the input) chose: WQE fields, SGE side-table entries, inline bytes, and the ring tails (honest, or any value).
//! Heap-backed rings (`ctrl::ring::heap_ring`) stand in for the shared memory; ASan (cargo fuzz's default) catches
//! any access outside them. The rule: no panic; a request the reader accepts is within the QP's limits (at most
//! `max_sge` SGEs, at most `max_inline` inline bytes); while the client writes no tail of its own, the reader
//! takes no more WQEs than were published.

#![no_main]

use libfuzzer_sys::fuzz_target;
use roce_dp::ctrl::abi::{RecvWqe, Sge, Wqe, WqeLimits};
use roce_dp::ctrl::ring::{heap_ring, heap_table};
use roce_dp::ctrl::wq::{RecvQueueReader, SendQueueReader};

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn bytes<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let n = self.0.len().min(N);
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
    fn u8(&mut self) -> u8 {
        self.bytes::<1>()[0]
    }
    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.bytes())
    }
    fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.bytes())
    }
    fn sge(&mut self) -> Sge {
        Sge { addr: self.u64(), len: self.u32(), lkey: self.u32() }
    }
}

const CAP: u32 = 16;

fuzz_target!(|data: &[u8]| {
    let mut inp = Input(data);
    let limits = WqeLimits { max_sge: 1 + inp.u8() % 4, max_inline: [0, 64, 256][usize::from(inp.u8() % 3)] };
    let per_slot_sge = u32::from(limits.max_sge - 1).max(1);
    let (mut sp, sc) = heap_ring::<Wqe>(CAP);
    let (mut sw, sr) = heap_table::<Sge>(CAP, per_slot_sge);
    let (mut iw, ir) = heap_table::<u8>(CAP, limits.max_inline.max(1));
    let (mut rp, rc) = heap_ring::<RecvWqe>(CAP);
    let (mut rw, rr) = heap_table::<Sge>(CAP, per_slot_sge);
    let Ok(mut send) = SendQueueReader::new(sc, Some(sr), Some(ir), limits) else { return };
    let Ok(mut recv) = RecvQueueReader::new(rc, Some(rr), limits.max_sge) else { return };
    let mut inline = vec![0u8; limits.max_inline as usize];
    let (mut published, mut taken) = (0u64, 0u64);
    // A tail the client wrote itself may publish any slots (their bytes are whatever the ring holds).
    let mut raw_tail = false;
    while !inp.0.is_empty() {
        match inp.u8() % 8 {
            0 | 1 => {
                let w = Wqe {
                    wr_id: inp.u64(),
                    opcode: inp.u8() % 12,
                    flags: inp.u8(),
                    num_sge: inp.u8() % 8,
                    reserved: 0,
                    imm_inv: inp.u32(),
                    remote_addr: inp.u64(),
                    rkey: inp.u32(),
                    inline_len: [0, 1, 64, 65, 256, 257, u32::MAX][usize::from(inp.u8() % 7)],
                    compare_add: inp.u64(),
                    swap: inp.u64(),
                    sge0: inp.sge(),
                };
                let i = sp.next_index();
                let ext: Vec<Sge> = (0..per_slot_sge).map(|_| inp.sge()).collect();
                let _ = sw.write(i, &ext);
                let bytes: Vec<u8> = (0..limits.max_inline.min(16)).map(|_| inp.u8()).collect();
                let _ = iw.write(i, &bytes);
                if sp.push(w).is_ok() {
                    published += 1;
                }
                sp.publish();
            }
            2 => {
                let w = RecvWqe { wr_id: inp.u64(), num_sge: inp.u8() % 8, reserved: [0; 7], sge0: inp.sge() };
                let i = rp.next_index();
                let ext: Vec<Sge> = (0..per_slot_sge).map(|_| inp.sge()).collect();
                let _ = rw.write(i, &ext);
                let _ = rp.push(w);
                rp.publish();
            }
            3 => {
                // The client writes any tail.
                let t = inp.u32();
                if inp.u8() & 1 == 0 {
                    raw_tail = true;
                    sp.publish_raw_tail(t);
                } else {
                    rp.publish_raw_tail(t);
                }
            }
            _ => {
                for _ in 0..(1 + inp.u8() % 32) {
                    match send.poll(&mut inline) {
                        Ok(Some(req)) => {
                            taken += 1;
                            assert!(
                                req.sges.as_slice().len() <= usize::from(limits.max_sge),
                                "{} SGEs accepted",
                                req.sges.as_slice().len()
                            );
                            assert!(req.inline_len <= limits.max_inline, "inline {} accepted", req.inline_len);
                        }
                        Ok(None) => break,
                        Err(e) => assert!(!e.to_string().is_empty()),
                    }
                }
                for _ in 0..(1 + inp.u8() % 32) {
                    match recv.poll() {
                        Ok(Some((_, sges))) => assert!(sges.as_slice().len() <= usize::from(limits.max_sge)),
                        Ok(None) => break,
                        Err(e) => assert!(!e.to_string().is_empty()),
                    }
                }
                send.release();
                recv.release();
                let _ = send.sync();
                let _ = recv.sync();
            }
        }
        assert!(raw_tail || taken <= published, "{taken} taken of {published} published");
    }
});
