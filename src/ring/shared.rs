//! Sharing a ring between the recorder thread (writer) and the drainer thread (reader).
//!
//! The models themselves are single-threaded; [`SharedRing`] puts one behind a mutex and a
//! condition variable. The writer's [`SharedRing::write`] wakes the drainer when a ToPA PMI was
//! raised (the software stand-in for the interrupt that tells perf to copy data out), when
//! output stopped or failed, or when the undrained amount reaches a watermark.

use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::{Drain, OutputState, TraceSink, TraceSource, WriteOutcome};

/// Why [`SharedRing::wait_for_data`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wake {
    /// A PMI was raised since the last wake, or the undrained amount reached the watermark.
    Data,
    /// Output has stopped (ToPA STOP) or failed (operational error); drain what is left.
    /// Returned on every call while that lasts, so a drainer never blocks on a dead writer.
    /// (TraceEn = 0 alone is not an end: software may be reprogramming the output.)
    Ended,
    /// [`SharedRing::close`] was called.
    Closed,
    /// The timeout expired first. There may still be data below the watermark.
    TimedOut,
}

struct State<R> {
    ring: R,
    pmi_seq: u64,
    pmi_seen: u64,
    watermark: u64,
    closed: bool,
}

struct Inner<R> {
    state: Mutex<State<R>>,
    cond: Condvar,
}

/// A ring shared by a writer and a reader thread. Cloning gives another handle to the same ring.
pub struct SharedRing<R> {
    inner: Arc<Inner<R>>,
}

impl<R> Clone for SharedRing<R> {
    fn clone(&self) -> Self {
        SharedRing {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<R> std::fmt::Debug for SharedRing<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedRing").finish_non_exhaustive()
    }
}

impl<R: TraceSink + TraceSource> SharedRing<R> {
    /// Shares `ring`; the watermark defaults to half its capacity.
    pub fn new(ring: R) -> Self {
        let watermark = (ring.capacity() / 2).max(1);
        Self::with_watermark(ring, watermark)
    }

    /// Shares `ring`, waking the reader once `watermark` stream bytes are undrained.
    pub fn with_watermark(ring: R, watermark: u64) -> Self {
        SharedRing {
            inner: Arc::new(Inner {
                state: Mutex::new(State {
                    ring,
                    pmi_seq: 0,
                    pmi_seen: 0,
                    watermark: watermark.max(1),
                    closed: false,
                }),
                cond: Condvar::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<R>> {
        // A panic while holding the lock leaves the model in a consistent state between
        // operations (every operation completes or panics before mutating), so keep going.
        self.inner
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Writes through the ring and wakes the reader if this raised a PMI, ended output or
    /// crossed the watermark.
    pub fn write(&self, bytes: &[u8]) -> WriteOutcome {
        let mut st = self.lock();
        let out = st.ring.write(bytes);
        st.pmi_seq += u64::from(out.pmis);
        let wake =
            out.pmis > 0 || out.state != OutputState::Tracing || st.ring.pending() >= st.watermark;
        drop(st);
        if wake {
            self.inner.cond.notify_all();
        }
        out
    }

    /// Drains everything present (see [`TraceSource::drain`]).
    pub fn drain(&self) -> Drain {
        self.lock().ring.drain()
    }

    /// Blocks until there is something to drain, output ended, the ring was closed, or
    /// `timeout` passed.
    pub fn wait_for_data(&self, timeout: Duration) -> Wake {
        let deadline = Instant::now() + timeout;
        let mut st = self.lock();
        loop {
            if st.closed {
                return Wake::Closed;
            }
            if st.pmi_seq != st.pmi_seen || st.ring.pending() >= st.watermark {
                st.pmi_seen = st.pmi_seq;
                return Wake::Data;
            }
            if matches!(st.ring.state(), OutputState::Stopped | OutputState::Error) {
                return Wake::Ended;
            }
            let now = Instant::now();
            if now >= deadline {
                return Wake::TimedOut;
            }
            st = self
                .inner
                .cond
                .wait_timeout(st, deadline - now)
                .unwrap_or_else(PoisonError::into_inner)
                .0;
        }
    }

    /// Marks the ring closed and wakes every waiter (the recorder is done).
    pub fn close(&self) {
        self.lock().closed = true;
        self.inner.cond.notify_all();
    }

    /// Runs `f` with exclusive access to the ring (to read MSRs, reprogram it, …). Call
    /// [`SharedRing::notify`] afterwards if `f` changed something a waiter cares about.
    pub fn with<T>(&self, f: impl FnOnce(&mut R) -> T) -> T {
        f(&mut self.lock().ring)
    }

    /// Wakes waiters so they re-check their condition.
    pub fn notify(&self) {
        self.inner.cond.notify_all();
    }
}
