//! PSB synchronisation: finding the next or previous PSB in a byte stream.
//!
//! A PSB is the 16-byte pattern `02 82` × 8. The payload of the packet before a PSB may itself end
//! in `02 82` (a TSC, a CYC, a long TNT, …), which makes the run of `02 82` pairs longer than 16
//! bytes. As libipt does, the PSB is taken to be the **last** 16 bytes of such a run: the bytes
//! before belong to the preceding packet.

use memchr::memmem;

/// The bytes of a PSB packet.
pub const PSB_BYTES: [u8; 16] = [
    0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82,
];

/// End (exclusive) of the run of `02 82` pairs that starts at `start` (which must hold a pair).
#[inline]
fn run_end(buf: &[u8], start: usize) -> usize {
    let mut end = start;
    while buf.get(end) == Some(&0x02) && buf.get(end + 1) == Some(&0x82) {
        end += 2;
    }
    end
}

/// Start of the run of `02 82` pairs (stepping back by whole pairs) that contains the pair at `at`.
#[inline]
fn run_start(buf: &[u8], at: usize) -> usize {
    let mut start = at;
    while start >= 2 && buf[start - 2] == 0x02 && buf[start - 1] == 0x82 {
        start -= 2;
    }
    start
}

/// The offset of the next PSB that starts at or after `from`, or `None`. Never panics, whatever
/// `from` is.
///
/// When the run of `02 82` pairs that holds the first match is longer than 16 bytes, the PSB is
/// the last 16 bytes of the run (libipt's rule; see the module documentation).
pub fn find_psb_forward(buf: &[u8], from: usize) -> Option<usize> {
    let hay = buf.get(from..)?;
    // A trace usually starts with its PSB: then the first match is found without setting up
    // `memmem`'s searcher, whose first use detects the CPU's features (CPUID instructions, each
    // a VM exit under a hypervisor: 40 µs of a short `decode`'s 2 ms).
    let first = if hay.starts_with(&PSB_BYTES) {
        from
    } else {
        from + memmem::find(hay, &PSB_BYTES)?
    };
    Some(run_end(buf, first) - PSB_BYTES.len())
}

/// The start of the last PSB that begins strictly before `before`, or `None`. Never panics,
/// whatever `before` is. Consistent with [`find_psb_forward`]: every offset it returns is one that
/// a forward scan would also report.
pub fn find_psb_backward(buf: &[u8], before: usize) -> Option<usize> {
    let mut limit = before.min(buf.len());
    let finder = memmem::FinderRev::new(&PSB_BYTES);
    loop {
        // A PSB starting at s < limit occupies s..s + 16, so look at buf[..limit + 15].
        let hay_end = limit.saturating_add(PSB_BYTES.len() - 1).min(buf.len());
        let hit = finder.rfind(&buf[..hay_end])?;
        if hit >= limit {
            // Cannot happen (the haystack ends at limit + 15), but never loop on it.
            return None;
        }
        let psb = run_end(buf, hit) - PSB_BYTES.len();
        if psb < limit {
            return Some(psb);
        }
        // The run's PSB lies at or after `limit`: the bytes before it are another packet's
        // payload, not a PSB. Continue before the whole run.
        limit = run_start(buf, hit);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn forward_and_backward_basic() {
        let mut buf = vec![0u8; 5];
        buf.extend_from_slice(&PSB_BYTES);
        buf.extend_from_slice(&[0x02, 0x23, 0, 0]);
        buf.extend_from_slice(&PSB_BYTES);
        assert_eq!(find_psb_forward(&buf, 0), Some(5));
        assert_eq!(find_psb_forward(&buf, 5), Some(5));
        assert_eq!(find_psb_forward(&buf, 6), Some(25));
        assert_eq!(find_psb_forward(&buf, 26), None);
        assert_eq!(find_psb_forward(&buf, usize::MAX), None);
        assert_eq!(find_psb_backward(&buf, usize::MAX), Some(25));
        assert_eq!(find_psb_backward(&buf, 25), Some(5));
        assert_eq!(find_psb_backward(&buf, 6), Some(5));
        assert_eq!(find_psb_backward(&buf, 5), None);
        assert_eq!(find_psb_backward(&[], 0), None);
    }

    #[test]
    fn longer_run_takes_last_16_bytes() {
        // A TSC whose payload ends in 02 82 02 82, then a PSB: the run is 20 bytes long.
        let mut buf = vec![0x19, 1, 2, 3, 0x02, 0x82, 0x02, 0x82];
        buf.extend_from_slice(&PSB_BYTES);
        buf.extend_from_slice(&[0x02, 0x23]);
        assert_eq!(find_psb_forward(&buf, 0), Some(8));
        assert_eq!(find_psb_backward(&buf, buf.len()), Some(8));
        assert_eq!(find_psb_backward(&buf, 8), None);
        assert_eq!(find_psb_backward(&buf, 9), Some(8));
    }
}
