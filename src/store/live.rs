//! A live trace store: the bytes a drainer moves out of an output ring while a recording runs,
//! kept in stream order with exact loss accounting.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::ring::Drain;

/// A gap in the stored stream: bytes the ring lost (overwritten or dropped) before they could be
/// drained.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gap {
    /// Offset in the stored bytes where the gap sits (the next stored byte follows the gap).
    pub data_offset: usize,
    /// Stream offset of the first lost byte.
    pub stream_offset: u64,
    /// Number of lost bytes.
    pub lost: u64,
}

#[derive(Debug, Default)]
struct Inner {
    bytes: Vec<u8>,
    /// Stream offset after the last byte accounted for (stored or lost).
    stream_end: u64,
    lost: u64,
    gaps: Vec<Gap>,
    drains: u64,
}

impl Inner {
    /// Accounts the bytes from the current stream end up to `stream_offset` as lost (one
    /// [`Gap`]), if the stream skips any.
    fn skip_to(&mut self, stream_offset: u64) {
        if stream_offset > self.stream_end {
            let lost = stream_offset - self.stream_end;
            self.gaps.push(Gap {
                data_offset: self.bytes.len(),
                stream_offset: self.stream_end,
                lost,
            });
            self.lost += lost;
            self.stream_end = stream_offset;
        }
    }
}

/// Trace bytes in stream order behind a shared handle: clone it to give the drainer thread and
/// a reader access to the same store.
#[derive(Debug, Clone, Default)]
pub struct TraceStore {
    inner: Arc<Mutex<Inner>>,
}

impl TraceStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // Appends complete or panic before mutating; the data stays consistent.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends one drain: its present bytes, and a [`Gap`] wherever the stream skips bytes
    /// (between runs, or between the previous drain and this one).
    pub fn append(&self, drain: &Drain) {
        let mut st = self.lock();
        st.drains += 1;
        for run in &drain.runs {
            st.skip_to(run.stream_offset);
            let bytes = &drain.data[run.data_offset..run.data_offset + run.len];
            st.bytes.extend_from_slice(bytes);
            st.stream_end = run.stream_offset + run.len as u64;
        }
        // Bytes lost at the end of the drained range (no run after them).
        st.skip_to(drain.report.end);
    }

    /// Number of stored bytes.
    pub fn len(&self) -> usize {
        self.lock().bytes.len()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes the ring lost before they were drained (0 for a complete trace).
    pub fn lost(&self) -> u64 {
        self.lock().lost
    }

    /// Where bytes were lost.
    pub fn gaps(&self) -> Vec<Gap> {
        self.lock().gaps.clone()
    }

    /// How many drains were appended.
    pub fn drains(&self) -> u64 {
        self.lock().drains
    }

    /// A copy of the stored bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.lock().bytes.clone()
    }

    /// Runs `f` over the stored bytes without copying them (the store is locked meanwhile).
    pub fn with_bytes<T>(&self, f: impl FnOnce(&[u8]) -> T) -> T {
        f(&self.lock().bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{Capabilities, IntOn, Topa, TraceSink, TraceSource};

    #[test]
    fn complete_stream_has_no_gaps() {
        let mut ring = Topa::circular(Capabilities::default(), &[4096, 4096], IntOn::Every)
            .expect("valid layout");
        let store = TraceStore::new();
        let data: Vec<u8> = (0..6000u32).map(|i| i as u8).collect();
        ring.write(&data[..3000]);
        store.append(&ring.drain());
        ring.write(&data[3000..]);
        store.append(&ring.drain());
        assert_eq!(store.to_vec(), data);
        assert_eq!(store.lost(), 0);
        assert!(store.gaps().is_empty());
    }

    #[test]
    fn overwritten_bytes_are_counted_as_a_gap() {
        let mut ring =
            Topa::circular(Capabilities::default(), &[4096], IntOn::None).expect("valid layout");
        let store = TraceStore::new();
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
        ring.write(&data);
        store.append(&ring.drain());
        let stored = store.len() as u64;
        assert_eq!(stored + store.lost(), data.len() as u64);
        assert!(store.lost() > 0);
        let gaps = store.gaps();
        assert_eq!(gaps.iter().map(|g| g.lost).sum::<u64>(), store.lost());
        // What is stored is the tail of the stream.
        assert_eq!(store.to_vec(), data[data.len() - stored as usize..]);
    }
}
