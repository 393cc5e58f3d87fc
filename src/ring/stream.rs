//! Reader-side bookkeeping shared by both output schemes: which stream bytes are stored where,
//! and which of them the writer has overwritten before the reader got to them.
//!
//! The writer's output is one logical byte stream (SDM §33.2.7.2: "the processor treats the
//! various output regions referenced by the ToPA table(s) as a unified buffer"). Every byte
//! offered to the writer gets a *stream offset* (dropped bytes too, so losses have a position).
//! A [`Segment`] maps a run of stream offsets to contiguous physical memory. When the writer
//! stores over physical bytes that an undrained segment still describes, those stream bytes are
//! lost: the segment is trimmed and the loss counted, so the reader can never return bytes that
//! were overwritten and always knows exactly how many it missed.

use std::collections::VecDeque;

use super::memory::Memory;
use super::{Chunk, DrainReport, OutputState};

/// A run of undrained stream bytes stored contiguously in physical memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    pub(crate) stream: u64,
    pub(crate) phys: u64,
    pub(crate) len: u64,
}

#[derive(Debug, Default)]
pub(crate) struct StreamLog {
    segs: VecDeque<Segment>,
    /// Stream offset the reader has consumed up to.
    tail: u64,
    /// Sum of `segs[..].len`.
    present: u64,
    overwritten_total: u64,
    overwritten_reported: u64,
    dropped_total: u64,
    dropped_reported: u64,
    /// Physical range of the region the writer is filling.
    region: (u64, u64),
    /// Whether an undrained segment may still overlap the rest of `region`; only then do stores
    /// pay for the overlap scan (the hot path is a compare and an add).
    clobber_check: bool,
    /// The next store starts a new segment even if it is physically adjacent to the last one:
    /// adjacent regions may be different memory blocks, and a segment must stay in one.
    fresh_region: bool,
}

fn overlaps(s: &Segment, start: u64, end: u64) -> bool {
    s.phys < end && start < s.phys + s.len
}

impl StreamLog {
    /// The writer starts filling the physical range `start..end` (a new region, or the single
    /// range after a wrap). Every segment recorded so far is older than what comes next.
    pub(crate) fn enter_region(&mut self, start: u64, end: u64) {
        self.region = (start, end);
        self.fresh_region = true;
        self.clobber_check = self.segs.iter().any(|s| overlaps(s, start, end));
    }

    /// `len` stream bytes starting at stream offset `stream` were stored at `phys`.
    pub(crate) fn record(&mut self, stream: u64, phys: u64, len: u64) {
        if len == 0 {
            return;
        }
        if self.clobber_check {
            self.clobber(phys, phys + len);
        }
        self.present += len;
        let fresh = std::mem::take(&mut self.fresh_region);
        if let (Some(last), false) = (self.segs.back_mut(), fresh) {
            if last.stream + last.len == stream && last.phys + last.len == phys {
                last.len += len;
                return;
            }
        }
        self.segs.push_back(Segment { stream, phys, len });
    }

    /// `len` stream bytes were offered but not stored (output stopped, errored or disabled).
    pub(crate) fn drop_bytes(&mut self, len: u64) {
        self.dropped_total += len;
    }

    /// Removes from the undrained segments every byte stored at `start..end`.
    fn clobber(&mut self, start: u64, end: u64) {
        let mut kept = VecDeque::with_capacity(self.segs.len() + 1);
        for s in self.segs.drain(..) {
            if !overlaps(&s, start, end) {
                kept.push_back(s);
                continue;
            }
            let cut_start = start.max(s.phys);
            let cut_end = end.min(s.phys + s.len);
            let lost = cut_end - cut_start;
            self.overwritten_total += lost;
            self.present -= lost;
            if cut_start > s.phys {
                kept.push_back(Segment {
                    stream: s.stream,
                    phys: s.phys,
                    len: cut_start - s.phys,
                });
            }
            if cut_end < s.phys + s.len {
                kept.push_back(Segment {
                    stream: s.stream + (cut_end - s.phys),
                    phys: cut_end,
                    len: s.phys + s.len - cut_end,
                });
            }
        }
        self.segs = kept;
        let (_, region_end) = self.region;
        self.clobber_check = self.segs.iter().any(|s| overlaps(s, end, region_end));
    }

    /// Stream bytes (stored or lost) not yet reported to the reader, given the writer's stream
    /// offset `head`.
    pub(crate) fn pending(&self, head: u64) -> u64 {
        head - self.tail
    }

    /// Undrained bytes still present in memory.
    pub(crate) fn present(&self) -> u64 {
        self.present
    }

    /// Hands every present undrained byte to `f` in stream order and reports the losses since
    /// the previous drain. `head` is the writer's stream offset.
    pub(crate) fn drain(
        &mut self,
        mem: &Memory,
        head: u64,
        state: OutputState,
        f: &mut dyn FnMut(Chunk<'_>),
    ) -> DrainReport {
        let start = self.tail;
        let mut present = 0;
        for s in self.segs.drain(..) {
            // Segments are only recorded after a successful store into a located block, so the
            // read cannot fail; if it somehow did, the bytes count as overwritten, never as data.
            match mem.read(s.phys, s.len) {
                Some(bytes) => {
                    present += s.len;
                    f(Chunk {
                        stream_offset: s.stream,
                        bytes,
                    });
                }
                None => {
                    debug_assert!(false, "segment {s:?} not inside one memory block");
                    self.overwritten_total += s.len;
                }
            }
        }
        self.present = 0;
        self.clobber_check = false;
        self.tail = head;
        let overwritten = self.overwritten_total - self.overwritten_reported;
        let dropped = self.dropped_total - self.dropped_reported;
        self.overwritten_reported = self.overwritten_total;
        self.dropped_reported = self.dropped_total;
        debug_assert_eq!(head - start, present + overwritten + dropped);
        DrainReport {
            start,
            end: head,
            present,
            overwritten,
            dropped,
            state,
        }
    }

    /// Total bytes overwritten before the reader drained them, since the ring was created.
    pub(crate) fn overwritten_total(&self) -> u64 {
        self.overwritten_total
    }

    /// Total bytes dropped (never stored), since the ring was created.
    pub(crate) fn dropped_total(&self) -> u64 {
        self.dropped_total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lapping_trims_oldest_bytes_exactly() {
        let mut mem = Memory::new();
        let base = mem.alloc(16, 16).unwrap();
        mem.write(base, &[7; 16]).unwrap();
        let mut log = StreamLog::default();
        log.enter_region(base, base + 16);
        log.record(0, base, 16);
        // Second lap over the same 16 bytes: first 5 bytes overwritten.
        log.enter_region(base, base + 16);
        log.record(16, base, 5);
        assert_eq!(log.present(), 16);
        let mut seen = Vec::new();
        let r = log.drain(&mem, 21, OutputState::Tracing, &mut |c| {
            seen.push((c.stream_offset, c.bytes.len()))
        });
        assert_eq!(seen, vec![(5, 11), (16, 5)]);
        assert_eq!(r.overwritten, 5);
        assert_eq!(r.present, 16);
        assert_eq!((r.start, r.end), (0, 21));
    }

    #[test]
    fn overlap_in_the_middle_splits_a_segment() {
        let mut mem = Memory::new();
        let base = mem.alloc(64, 64).unwrap();
        let mut log = StreamLog::default();
        log.enter_region(base, base + 64);
        log.record(0, base, 64);
        log.enter_region(base + 16, base + 32);
        log.record(64, base + 16, 16);
        let mut seen = Vec::new();
        let r = log.drain(&mem, 80, OutputState::Tracing, &mut |c| {
            seen.push((c.stream_offset, c.bytes.len()))
        });
        assert_eq!(seen, vec![(0, 16), (32, 32), (64, 16)]);
        assert_eq!(r.overwritten, 16);
    }
}
