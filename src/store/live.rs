//! A live trace store: the bytes a drainer moves out of an output ring while a recording runs,
//! kept in stream order with exact loss accounting.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use super::{AppendListener, TraceView};
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

#[derive(Default)]
struct Inner {
    bytes: Vec<u8>,
    /// Stream offset after the last byte accounted for (stored or lost).
    stream_end: u64,
    lost: u64,
    gaps: Vec<Gap>,
    drains: u64,
    /// Told after every append that added bytes (the history worker).
    listener: Option<AppendListener>,
    /// The offset each [`TraceStore::rewrite_from`] rewrote from, in order.
    rewrites: Vec<u64>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Inner")
            .field("len", &self.bytes.len())
            .field("stream_end", &self.stream_end)
            .field("lost", &self.lost)
            .field("gaps", &self.gaps)
            .field("drains", &self.drains)
            .field("listener", &self.listener.is_some())
            .field("rewrites", &self.rewrites.len())
            .finish()
    }
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
        let before = st.bytes.len();
        self.append_locked(&mut st, drain);
        let listener = (st.bytes.len() > before)
            .then(|| st.listener.clone())
            .flatten();
        // Outside the lock: the listener's reader may be waiting for it.
        drop(st);
        if let Some(l) = listener {
            l();
        }
    }

    /// Tells `listener` after every append that adds bytes (replacing any earlier listener).
    /// Appends are whole under the store's lock, so a reader never sees part of a drain.
    pub fn set_listener(&self, listener: Option<AppendListener>) {
        self.lock().listener = listener;
    }

    fn append_locked(&self, st: &mut Inner, drain: &Drain) {
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

    /// Replaces everything stored by `bytes` (a backend whose stream at a stop is not an
    /// extension of the stream at the previous stop: the QEMU backend completes each thread's
    /// stream from the plugin's pending state at every stop). Loss accounting restarts; the
    /// listener is notified. A history indexed from the old bytes must be rebuilt
    /// ([`LiveBackend::trace_rewritten`](crate::capture::LiveBackend::trace_rewritten)).
    pub fn replace(&self, bytes: Vec<u8>) {
        let mut st = self.lock();
        let drains = st.drains + 1;
        let listener = st.listener.take();
        let mut rewrites = std::mem::take(&mut st.rewrites);
        rewrites.push(0);
        *st = Inner {
            stream_end: bytes.len() as u64,
            bytes,
            drains,
            listener: listener.clone(),
            rewrites,
            ..Inner::default()
        };
        drop(st);
        if let Some(l) = listener {
            l();
        }
    }

    /// Replaces the stored bytes from `offset` on by `bytes` (a backend whose stream ends in a
    /// provisional completion at each stop: the QEMU backend keeps the plugin's written stream,
    /// which only grows, and closes it at the stop PC with packets the next stop replaces).
    /// Bytes before `offset` stay as they are, so a reader of the store (the history worker,
    /// told through [`TraceView::rewritten_since`]) re-reads only from there. Loss accounting
    /// before `offset` is kept; `offset` past the end appends.
    pub fn rewrite_from(&self, offset: usize, bytes: &[u8]) {
        let mut st = self.lock();
        let offset = offset.min(st.bytes.len());
        if offset < st.bytes.len() {
            st.bytes.truncate(offset);
            st.gaps.retain(|g| g.data_offset <= offset);
            st.lost = st.gaps.iter().map(|g| g.lost).sum();
            st.rewrites.push(offset as u64);
        }
        st.bytes.extend_from_slice(bytes);
        st.stream_end = st.bytes.len() as u64 + st.lost;
        st.drains += 1;
        let listener = st.listener.clone();
        drop(st);
        if let Some(l) = listener {
            l();
        }
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

/// The history worker reads the store in place: each read holds the lock, and an append is
/// applied whole under it, so a read sees a prefix of the stream ending at a drain boundary.
impl TraceView for TraceStore {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        TraceStore::with_bytes(self, f)
    }

    fn len(&self) -> u64 {
        TraceStore::len(self) as u64
    }

    fn rewritten_since(&self, seen: u64) -> (u64, Option<u64>) {
        let st = self.lock();
        let seen = usize::try_from(seen).unwrap_or(usize::MAX);
        let lowest = st
            .rewrites
            .get(seen..)
            .and_then(|r| r.iter().copied().min());
        (st.rewrites.len() as u64, lowest)
    }
}

/// Appends `bytes`, which directly follow what `store` holds, as one drain (the hardware
/// backend's AUX copies, a trace file for offline replay).
pub fn append_bytes(store: &TraceStore, bytes: &[u8]) {
    if bytes.is_empty() {
        return;
    }
    // The stream end is everything stored plus everything accounted as lost.
    let start = store.len() as u64 + store.lost();
    let len = bytes.len();
    store.append(&Drain {
        data: bytes.to_vec(),
        runs: vec![crate::ring::Run {
            stream_offset: start,
            data_offset: 0,
            len,
        }],
        report: crate::ring::DrainReport {
            start,
            end: start + len as u64,
            present: len as u64,
            overwritten: 0,
            dropped: 0,
            state: crate::ring::OutputState::Tracing,
        },
    });
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

    /// A reader through [`TraceView`] never sees part of a drain, while a drainer appends.
    #[test]
    fn views_see_whole_drains_while_appending() {
        const DRAIN: usize = 1000;
        const DRAINS: usize = 200;
        let store = TraceStore::new();
        let writer = {
            let store = store.clone();
            std::thread::spawn(move || {
                let mut ring = Topa::circular(Capabilities::default(), &[4096], IntOn::None)
                    .expect("valid layout");
                for d in 0..DRAINS {
                    ring.write(&[d as u8; DRAIN]);
                    store.append(&ring.drain());
                }
            })
        };
        let mut reads = 0;
        loop {
            let len = TraceView::len(&store);
            let whole = TraceView::with_bytes(&store, |b| {
                b.len() % DRAIN == 0
                    && b.chunks(DRAIN)
                        .enumerate()
                        .all(|(d, c)| c.iter().all(|&x| x == d as u8))
            });
            assert!(whole && len % DRAIN as u64 == 0, "torn read at {len} bytes");
            reads += 1;
            if len == (DRAIN * DRAINS) as u64 {
                break;
            }
        }
        writer.join().expect("writer");
        assert!(reads > 0);
        assert_eq!(store.lost(), 0);
    }

    /// The listener is told after each append that adds bytes, so a history worker indexes
    /// without anyone calling `notify`, and a wait covers exactly the bytes present when it
    /// began.
    #[test]
    fn appends_wake_the_history_worker() {
        use crate::flow::FlowConfig;
        use crate::history::HistoryWorker;
        use crate::image::Image;
        use crate::packet::PSB_BYTES;
        use std::time::{Duration, Instant};

        let store = TraceStore::new();
        let w = HistoryWorker::spawn(
            Arc::new(store.clone()),
            Arc::new(Image::new()),
            FlowConfig::default(),
        )
        .expect("spawn");
        store.set_listener(Some(w.notifier().into_listener()));
        // Let the worker finish its first look (at nothing), so only the listener can wake it.
        assert_eq!(w.wait_indexed(Duration::from_secs(20)), Ok(0));
        let mut ring =
            Topa::circular(Capabilities::default(), &[4096], IntOn::None).expect("valid layout");
        // PSB+ (PSB, PSBEND) with tracing off: sync points without instructions.
        let psb_plus: Vec<u8> = PSB_BYTES.iter().copied().chain([0x02, 0x23]).collect();
        for _ in 0..3 {
            ring.write(&psb_plus);
            store.append(&ring.drain());
        }
        let len = store.len() as u64;
        let deadline = Instant::now() + Duration::from_secs(20);
        // No notify, no request: the appends alone must get the segments before the last PSB
        // indexed.
        while w.stats().indexed_bytes == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let st = w.stats();
        assert!(st.indexed_bytes > 0, "{st:?}");
        assert!(st.updates > 0, "{st:?}");
        assert_eq!(w.wait_indexed(Duration::from_secs(20)), Ok(0));
        let st = w.stats();
        assert_eq!((st.trace_bytes, st.decode_lag), (len, 0), "{st:?}");
        assert!(st.complete, "{st:?}");
        // Without a listener, appends are still counted in the view.
        store.set_listener(None);
        ring.write(&psb_plus);
        store.append(&ring.drain());
        assert_eq!(w.stats().trace_bytes, len + psb_plus.len() as u64);
    }

    #[test]
    fn appended_bytes_follow_the_stream() {
        let store = TraceStore::new();
        append_bytes(&store, &[1, 2, 3]);
        append_bytes(&store, &[]);
        append_bytes(&store, &[4]);
        assert_eq!(store.to_vec(), vec![1, 2, 3, 4]);
        assert_eq!(store.lost(), 0);
        assert!(store.gaps().is_empty());
    }
}
