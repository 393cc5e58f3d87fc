//! Live indexing while recording: a background thread that keeps a [`History`] up to date with a
//! growing trace.
//!
//! The recorder appends trace bytes and calls [`HistoryWorker::notify`]; the worker decodes what
//! arrived in bounded windows (so it never holds the trace or the history for long) and indexes
//! every PSB+ whose segment can no longer change. When the target stops, the server calls
//! [`HistoryWorker::wait_indexed`] before answering a reverse request: the worker then also counts
//! the instructions after the last PSB (a *complete* update), and the wait returns as soon as the
//! index covers the trace as it was when the request came — never later, and never waiting for
//! bytes that arrived after it.
//!
//! The trace is reached through [`TraceView`], so the store can keep it however it likes (one
//! buffer under a lock, chunks, a memory map); the code image is shared read-only.

use super::{History, Scan, SyncPoint, scan, view_len};
use crate::flow::FlowConfig;
use crate::image::Image;
use crate::store::AppendListener;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use crate::store::TraceView;

/// Why [`HistoryWorker::wait_indexed`] returned without a complete index.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WaitError {
    /// The index did not catch up in time.
    #[error("history indexing still {lag} trace bytes behind after {waited:?}")]
    Timeout {
        /// Trace bytes not yet indexed when the wait gave up.
        lag: u64,
        /// How long it waited.
        waited: Duration,
    },
    /// The worker is gone (shut down, or its thread died).
    #[error("history worker stopped{}", if *.panicked { " (its thread panicked)" } else { "" })]
    Stopped {
        /// The worker thread panicked.
        panicked: bool,
    },
}

/// Counters for `monitor stats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerStats {
    /// Trace bytes recorded.
    pub trace_bytes: u64,
    /// Trace bytes the index covers.
    pub indexed_bytes: u64,
    /// Decode lag: trace bytes not yet indexed.
    pub decode_lag: u64,
    /// Instructions indexed.
    pub insns: u64,
    /// Sync points (PSB+) indexed.
    pub sync_points: u64,
    /// Decode errors met while indexing.
    pub errors: u64,
    /// Overflows (lost packets) met while indexing.
    pub overflows: u64,
    /// Bytes of the index.
    pub index_bytes: u64,
    /// Index updates applied by the worker.
    pub updates: u64,
    /// Whether the index counts every instruction of the trace as it is now.
    pub complete: bool,
}

/// Control state shared by the worker and its callers.
#[derive(Debug, Default)]
struct Ctl {
    /// Bumped by every [`HistoryWorker::notify`].
    seq: u64,
    /// The `seq` the worker last started working on.
    seen: u64,
    /// The largest trace length a caller wants indexed completely.
    want_complete: Option<u64>,
    /// The largest trace length indexed completely so far.
    complete_at: Option<u64>,
    updates: u64,
    shutdown: bool,
    /// The worker thread ended (shut down or panicked).
    dead: bool,
    /// The store's rewrites the history has forgotten the old bytes of
    /// ([`TraceView::rewritten_since`]).
    rewrites_seen: u64,
    panicked: bool,
}

impl Ctl {
    fn want(&mut self, len: u64) {
        self.want_complete = Some(self.want_complete.map_or(len, |w| w.max(len)));
    }

    /// The last complete update's length, if it was made from the trace's current bytes
    /// (`rewrites` = the trace's rewrite count now).
    fn complete_at(&self, rewrites: u64) -> Option<u64> {
        self.complete_at.filter(|_| rewrites == self.rewrites_seen)
    }

    /// A caller waits for a complete index of more bytes than the last complete update covered.
    fn needs_complete(&self, rewrites: u64) -> bool {
        self.want_complete
            .is_some_and(|w| self.complete_at(rewrites).is_none_or(|v| v < w))
    }
}

struct Shared<T> {
    trace: Arc<T>,
    /// Replaced when the code changes ([`HistoryWorker::set_image`]); steps take a copy.
    image: RwLock<Arc<Image>>,
    history: Mutex<History>,
    ctl: Mutex<Ctl>,
    /// The worker sleeps on it; notified on new bytes, requests and shutdown.
    wake: Condvar,
    /// Waiters sleep on it; notified after every update.
    progress: Condvar,
    window: usize,
}

fn lock<X>(m: &Mutex<X>) -> MutexGuard<'_, X> {
    // The data under these locks stays consistent at every unlock (updates are applied whole),
    // so a panic elsewhere does not make it unusable.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The counters of a [`HistoryWorker`] for another thread (see [`HistoryWorker::probe`]).
pub struct WorkerProbe<T: TraceView + 'static> {
    shared: Arc<Shared<T>>,
}

impl<T: TraceView + 'static> WorkerProbe<T> {
    /// The worker's counters now.
    pub fn stats(&self) -> WorkerStats {
        stats_of(&self.shared)
    }
}

/// The counters of `shared` (trace length, index progress, check state).
fn stats_of<T: TraceView>(shared: &Shared<T>) -> WorkerStats {
    let trace_bytes = shared.trace.len();
    let rewrites = shared.trace.rewritten_since(u64::MAX).0;
    let (updates, complete_at) = {
        let c = lock(&shared.ctl);
        (c.updates, c.complete_at(rewrites))
    };
    let h = lock(&shared.history);
    let hs = h.stats();
    WorkerStats {
        trace_bytes,
        indexed_bytes: hs.indexed_bytes,
        decode_lag: trace_bytes.saturating_sub(hs.indexed_bytes),
        insns: hs.insns,
        sync_points: hs.sync_points,
        errors: hs.errors,
        overflows: hs.overflows,
        index_bytes: hs.index_bytes,
        updates,
        complete: h.is_complete() && complete_at == Some(trace_bytes),
    }
}

/// The background indexer of one growing trace. Dropping it stops the thread.
pub struct HistoryWorker<T: TraceView + 'static> {
    shared: Arc<Shared<T>>,
    thread: Option<JoinHandle<()>>,
}

impl<T: TraceView + 'static> std::fmt::Debug for HistoryWorker<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryWorker")
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl<T: TraceView + 'static> HistoryWorker<T> {
    /// Trace bytes decoded per step: small enough that the trace and the history are never held
    /// for long (about 2–4 million instructions), large enough that steps are cheap.
    pub const DEFAULT_WINDOW: usize = 256 * 1024;

    /// Starts indexing `trace` (decoded against `image` with `cfg`) on a new thread.
    pub fn spawn(trace: Arc<T>, image: Arc<Image>, cfg: FlowConfig) -> std::io::Result<Self> {
        Self::spawn_with_window(trace, image, cfg, Self::DEFAULT_WINDOW)
    }

    /// Like [`spawn`](Self::spawn) with a decode window of `window` bytes (at least 4 KiB).
    pub fn spawn_with_window(
        trace: Arc<T>,
        image: Arc<Image>,
        cfg: FlowConfig,
        window: usize,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared {
            trace,
            image: RwLock::new(image),
            history: Mutex::new(History::new(cfg)),
            ctl: Mutex::new(Ctl::default()),
            wake: Condvar::new(),
            progress: Condvar::new(),
            window: window.max(4096),
        });
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("ptrewind-history".into())
            .spawn(move || {
                let guard = DeadGuard(&s);
                s.run();
                drop(guard);
            })?;
        // Index whatever is there already.
        let w = HistoryWorker {
            shared,
            thread: Some(thread),
        };
        w.notify();
        Ok(w)
    }

    /// New trace bytes arrived. Cheap; call it after every append.
    pub fn notify(&self) {
        let mut c = lock(&self.shared.ctl);
        c.seq += 1;
        self.shared.wake.notify_one();
    }

    /// A cheap handle that does what [`notify`](Self::notify) does, for the thread that appends
    /// the bytes (a drainer). It does not keep the worker alive.
    pub fn notifier(&self) -> Notifier {
        Notifier(Arc::downgrade(&self.shared) as std::sync::Weak<dyn Notify>)
    }

    /// Decodes bytes indexed from now on against `image` (the code changed: a new mapping).
    /// What is indexed already stays as it was decoded.
    pub fn set_image(&self, image: Arc<Image>) {
        *self.shared.image.write().unwrap_or_else(|e| e.into_inner()) = image;
    }

    /// The target stopped: index the trace completely as it is now, without waiting for it.
    pub fn request_complete(&self) {
        let len = self.shared.trace.len();
        let mut c = lock(&self.shared.ctl);
        c.want(len);
        c.seq += 1;
        self.shared.wake.notify_one();
    }

    /// Waits until every instruction of the trace as it is now is indexed (a complete update),
    /// or `timeout` passes. Returns the number of instructions then indexed. Bytes appended
    /// during the wait are not waited for.
    pub fn wait_indexed(&self, timeout: Duration) -> Result<u64, WaitError> {
        let start = Instant::now();
        let target = self.shared.trace.len();
        let rewrites = self.shared.trace.rewritten_since(u64::MAX).0;
        let mut c = lock(&self.shared.ctl);
        if c.complete_at(rewrites).is_none_or(|v| v < target) {
            c.want(target);
            c.seq += 1;
            self.shared.wake.notify_one();
        }
        loop {
            let rewrites = self.shared.trace.rewritten_since(u64::MAX).0;
            if c.complete_at(rewrites).is_some_and(|v| v >= target) {
                drop(c);
                return Ok(lock(&self.shared.history).len());
            }
            if c.dead {
                return Err(WaitError::Stopped {
                    panicked: c.panicked,
                });
            }
            let waited = start.elapsed();
            let Some(left) = timeout.checked_sub(waited).filter(|d| !d.is_zero()) else {
                drop(c);
                let indexed = lock(&self.shared.history).indexed_bytes();
                return Err(WaitError::Timeout {
                    lag: target.saturating_sub(indexed),
                    waited,
                });
            };
            c = self
                .shared
                .progress
                .wait_timeout(c, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Runs `f` on the history with the trace bytes and the image (a query: `insn`, `rfind` ...).
    /// The worker cannot apply an update meanwhile, so keep it short.
    pub fn with_history<R>(&self, f: impl FnOnce(&mut History, &[u8], &Image) -> R) -> R {
        let image = self.shared.image();
        let mut h = lock(&self.shared.history);
        self.shared
            .trace
            .with_bytes(|bytes| f(&mut h, bytes, &image))
    }

    /// The sync points indexed so far (a copy).
    pub fn sync_points(&self) -> Vec<SyncPoint> {
        lock(&self.shared.history).sync_points().to_vec()
    }

    /// Counters for `monitor stats`.
    pub fn stats(&self) -> WorkerStats {
        stats_of(&self.shared)
    }

    /// A handle another thread can read the counters through (progress displays).
    pub fn probe(&self) -> WorkerProbe<T> {
        WorkerProbe {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops the thread and returns the history.
    pub fn into_history(mut self) -> History {
        self.stop();
        std::mem::replace(
            &mut *lock(&self.shared.history),
            History::new(FlowConfig::default()),
        )
    }

    fn stop(&mut self) {
        {
            let mut c = lock(&self.shared.ctl);
            c.shutdown = true;
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.thread.take() {
            // A panic in the worker was recorded by its guard already.
            let _ = t.join();
        }
    }
}

impl<T: TraceView + 'static> Drop for HistoryWorker<T> {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Marks the worker dead when its thread ends, however it ends, so waiters do not wait forever.
struct DeadGuard<'a, T>(&'a Shared<T>);

impl<T> Drop for DeadGuard<'_, T> {
    fn drop(&mut self) {
        let mut c = lock(&self.0.ctl);
        c.dead = true;
        c.panicked = std::thread::panicking();
        self.0.progress.notify_all();
    }
}

/// What one step did.
struct Step {
    /// The step decoded up to the end of the trace as it was.
    caught_up: bool,
}

/// Wakes a worker from another thread (see [`HistoryWorker::notifier`]).
#[derive(Clone)]
pub struct Notifier(std::sync::Weak<dyn Notify>);

impl std::fmt::Debug for Notifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Notifier").finish_non_exhaustive()
    }
}

impl Notifier {
    /// New trace bytes arrived (a no-op once the worker is gone).
    pub fn notify(&self) {
        if let Some(s) = self.0.upgrade() {
            s.notify();
        }
    }

    /// The notifier as the plain callback a [`TraceStore`](crate::store::live::TraceStore)
    /// calls after every append.
    pub fn into_listener(self) -> AppendListener {
        Arc::new(move || self.notify())
    }
}

/// Type-erased [`Shared::notify`], so a [`Notifier`] does not carry the trace type.
trait Notify: Send + Sync {
    fn notify(&self);
}

impl<T: TraceView> Notify for Shared<T> {
    fn notify(&self) {
        let mut c = lock(&self.ctl);
        c.seq += 1;
        self.wake.notify_one();
    }
}

impl<T> Shared<T> {
    fn image(&self) -> Arc<Image> {
        Arc::clone(&self.image.read().unwrap_or_else(|e| e.into_inner()))
    }
}

impl<T: TraceView> Shared<T> {
    fn run(&self) {
        loop {
            let mut c = lock(&self.ctl);
            while !c.shutdown && c.seq == c.seen {
                c = self.wake.wait(c).unwrap_or_else(|e| e.into_inner());
            }
            if c.shutdown {
                return;
            }
            c.seen = c.seq;
            drop(c);
            // Work until caught up with the trace as it is now, checking for shutdown and new
            // completion requests between steps.
            loop {
                let rewrites = self.trace.rewritten_since(u64::MAX).0;
                let want_complete = {
                    let c = lock(&self.ctl);
                    if c.shutdown {
                        return;
                    }
                    c.needs_complete(rewrites)
                };
                if self.step(want_complete).caught_up {
                    break;
                }
            }
        }
    }

    /// Decodes one window from the resume point and applies it.
    fn step(&self, want_complete: bool) -> Step {
        // Bytes the store rewrote since the last step: forget what was indexed from them.
        let seen = lock(&self.ctl).rewrites_seen;
        let (rewrites, lowest) = self.trace.rewritten_since(seen);
        if rewrites != seen {
            if let Some(offset) = lowest {
                lock(&self.history).rewind(offset);
            }
            let len = self.trace.len();
            let mut c = lock(&self.ctl);
            c.rewrites_seen = rewrites;
            c.complete_at = None;
            // A request for more bytes than there are now was for bytes that are gone.
            c.want_complete = c.want_complete.map(|w| w.min(len));
        }
        let (from, view, was_complete, cfg) = {
            let h = lock(&self.history);
            (h.resume_point(), h.view, h.complete, h.cfg.clone())
        };
        let start = from.map_or(0, |(_, p)| usize::try_from(p.offset).unwrap_or(usize::MAX));
        let image = self.image();
        let image = &*image;
        let (scan, len, caught_up) = self.trace.with_bytes(|bytes| {
            let len = bytes.len();
            let mut window = self.window;
            loop {
                let end = start.saturating_add(window).min(len);
                let complete = want_complete && end == len;
                let sub = &bytes[..end];
                let v = view_len(sub, complete) as u64;
                if v > view || (v == view && complete && !was_complete) {
                    let s: Scan = scan(sub, image, &cfg, from, complete);
                    return (Some(s), len as u64, end == len);
                }
                if end == len {
                    return (None, len as u64, true);
                }
                // No PSB beyond the resume point in this window (tracing was off, or a long
                // PSB-less stretch): look further.
                window = window.saturating_mul(2);
            }
        });
        let mut applied = false;
        let mut complete_len = None;
        if let Some(s) = scan {
            let complete = s.complete;
            let mut h = lock(&self.history);
            // A rewrite after the check above: the scan may have read replaced bytes; the next
            // step rewinds and scans again.
            if self.trace.rewritten_since(u64::MAX).0 != rewrites {
                drop(h);
                return Step { caught_up: false };
            }
            applied = h.apply(s);
            drop(h);
            if applied && complete {
                complete_len = Some(len);
            }
        } else if was_complete && view == len {
            complete_len = Some(len);
        }
        let mut c = lock(&self.ctl);
        if applied {
            c.updates += 1;
        }
        if let Some(l) = complete_len {
            c.complete_at = Some(c.complete_at.map_or(l, |v| v.max(l)));
        }
        self.progress.notify_all();
        Step { caught_up }
    }
}
