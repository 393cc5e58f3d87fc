//! The background drainer: a thread that waits for data (or a period) and moves it into a
//! [`AuxSink`], until stopped. Generic over [`DrainSource`] so its loop is testable without
//! Intel PT.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use super::{AuxSink, PerfPtBackend, PerfPtError};

/// Something the drainer thread can drive.
pub trait DrainSource: Send + 'static {
    /// Moves everything available into `sink`; returns the trace bytes moved.
    fn drain_once(&mut self, sink: &mut dyn AuxSink) -> Result<u64, PerfPtError>;
    /// Blocks until data may be available or `period` has elapsed.
    fn wait_ready(&self, period: Duration);
}

impl DrainSource for PerfPtBackend {
    fn drain_once(&mut self, sink: &mut dyn AuxSink) -> Result<u64, PerfPtError> {
        self.drain_into(sink)
    }
    fn wait_ready(&self, period: Duration) {
        self.wait_readable(period)
    }
}

/// What the drainer hands back when stopped.
#[derive(Debug)]
pub struct DrainerResult<S, B = PerfPtBackend> {
    /// The source (for the backend: still open, so the caller can `close` it).
    pub backend: B,
    /// The sink.
    pub sink: S,
    /// Trace bytes moved by the thread.
    pub bytes: u64,
    /// Every error met while draining (draining went on after each; none is dropped).
    pub errors: Vec<PerfPtError>,
}

/// Handle of the background drainer thread.
#[derive(Debug)]
pub struct Drainer<S, B = PerfPtBackend> {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<DrainerResult<S, B>>,
}

impl<S, B> Drainer<S, B> {
    /// Asks the thread to stop; it finishes its current wait (at most one period), drains a last
    /// time and hands everything back. `None` if the thread panicked.
    pub fn stop(self) -> Option<DrainerResult<S, B>> {
        self.stop.store(true, Ordering::Release);
        self.handle.join().ok()
    }
}

/// Starts a thread that alternates `wait_ready(period)` and `drain_once(sink)`.
pub fn spawn_drainer<B, S>(backend: B, sink: S, period: Duration) -> Drainer<S, B>
where
    B: DrainSource,
    S: AuxSink + Send + 'static,
{
    let stop = Arc::new(AtomicBool::new(false));
    let stop_flag = Arc::clone(&stop);
    let handle = std::thread::spawn(move || {
        let mut backend = backend;
        let mut sink = sink;
        let mut errors = Vec::new();
        let mut bytes = 0;
        loop {
            // Read the flag before the drain so the last drain happens after stop was requested.
            let stopping = stop_flag.load(Ordering::Acquire);
            match backend.drain_once(&mut sink) {
                Ok(n) => bytes += n,
                Err(e) => errors.push(e),
            }
            if stopping {
                break;
            }
            backend.wait_ready(period);
        }
        DrainerResult {
            backend,
            sink,
            bytes,
            errors,
        }
    });
    Drainer { stop, handle }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::capture::perf::PerfPtError;

    /// Produces one numbered chunk per drain; fails on drain 3.
    struct Fake {
        n: u8,
        produced: Arc<std::sync::atomic::AtomicU64>,
    }

    impl DrainSource for Fake {
        fn drain_once(&mut self, sink: &mut dyn AuxSink) -> Result<u64, PerfPtError> {
            self.n += 1;
            if self.n == 3 {
                return Err(PerfPtError::NoThreads);
            }
            sink.trace(1, &[self.n]);
            self.produced.fetch_add(1, Ordering::SeqCst);
            Ok(1)
        }
        fn wait_ready(&self, period: Duration) {
            std::thread::sleep(period);
        }
    }

    #[test]
    fn drains_until_stopped_and_keeps_errors() {
        let produced = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let d = spawn_drainer(
            Fake {
                n: 0,
                produced: Arc::clone(&produced),
            },
            Vec::<u8>::new(),
            Duration::from_millis(1),
        );
        // Wait (without timing assertions) until a few drains happened, including the failing one.
        while produced.load(Ordering::SeqCst) < 5 {
            std::thread::yield_now();
        }
        let r = d.stop().expect("drainer thread panicked");
        let n = r.backend.n;
        assert!(n >= 6);
        // Every successful drain's chunk is in the sink, in order; the failure is reported.
        let want: Vec<u8> = (1..=n).filter(|&i| i != 3).collect();
        assert_eq!(r.sink, want);
        assert_eq!(r.bytes, want.len() as u64);
        assert_eq!(r.errors.len(), 1);
        assert!(matches!(r.errors[0], PerfPtError::NoThreads));
    }
}
