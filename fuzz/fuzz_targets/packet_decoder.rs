//! Fuzz the packet decoder: arbitrary bytes must never panic or loop, Invalid is followed by a
//! resync at the next PSB, and every decoded packet must survive encode → decode unchanged.
//!
//! Run (stable toolchain): `RUSTC_BOOTSTRAP=1 cargo fuzz run packet_decoder -- -max_total_time=300`
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptrewind::packet::{
    LastIp, Packet, PacketDecoder, PacketError, decode_packet, encode_packet_in_block,
    find_psb_backward, find_psb_forward,
};

fuzz_target!(|data: &[u8]| {
    let mut d = PacketDecoder::new(data);
    let mut last_ip = LastIp::new();
    let mut items = Vec::new();
    let mut out = Vec::with_capacity(16);
    let mut steps = 0usize;
    loop {
        let before = d.position();
        let block = d.block_context();
        let Some(r) = d.next_packet() else { break };
        steps += 1;
        assert!(steps <= data.len() + 1, "decoder does not terminate");
        assert!(d.position() > before || d.position() == data.len(), "no progress");
        match r {
            Ok((off, p)) => {
                let len = d.position() - off as usize;
                assert_eq!(decode_packet(data, off as usize, block), Ok((p, len)));
                // Round trip through the encoder.
                out.clear();
                let n = encode_packet_in_block(&p, block, &mut out)
                    .unwrap_or_else(|e| panic!("decoded {p:?} but cannot encode it: {e}"));
                assert_eq!(decode_packet(&out, 0, block), Ok((p, n)));
                if matches!(p, Packet::Cyc { .. }) {
                    assert!(n <= len);
                } else {
                    assert_eq!(n, len, "{p:?}");
                }
                match p {
                    Packet::Psb | Packet::Ovf => last_ip.reset(),
                    _ => {
                        if let Some((_, payload)) = p.ip_payload() {
                            let _ = last_ip.apply(payload);
                        }
                    }
                }
                items.push(Ok((off, p)));
            }
            Err(e @ PacketError::Invalid { offset, .. }) => {
                items.push(Err(e));
                assert_eq!(offset as usize, before);
                let resync = d.sync_forward();
                assert_eq!(resync.map(|o| o as usize), find_psb_forward(data, before + 1));
                if resync.is_none() {
                    break;
                }
            }
            Err(e @ PacketError::Truncated { offset, needed }) => {
                items.push(Err(e));
                assert_eq!(offset as usize, before);
                assert!(needed >= 1);
                assert_eq!(d.next_packet(), None);
                break;
            }
        }
    }
    // The sync functions never panic and agree with each other.
    if let Some(p) = find_psb_backward(data, data.len()) {
        assert_eq!(find_psb_forward(data, p), Some(p));
    }
    let _ = find_psb_backward(data, data.len() / 2);
    // Batch decoding (without resync) agrees with next_packet up to the first error.
    let mut d = PacketDecoder::new(data);
    let mut batch = Vec::new();
    let res = d.decode_into(&mut batch, usize::MAX);
    let ok_prefix: Vec<_> = items.iter().take_while(|r| r.is_ok()).cloned().map(Result::unwrap).collect();
    assert_eq!(batch, ok_prefix);
    if let Err(e) = res {
        assert_eq!(items.get(batch.len()), Some(&Err(e)));
    }
});
