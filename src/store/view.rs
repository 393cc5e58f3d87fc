//! Read access to a trace that grows at its end ([`TraceView`]), and the plain callback a
//! growing store calls after every append ([`AppendListener`]) — what the history's background
//! indexer needs from a store, without the store knowing the indexer.

use std::sync::{Arc, RwLock};

/// Called after every append that added bytes (e.g. to wake the history worker).
pub type AppendListener = Arc<dyn Fn() + Send + Sync>;

/// Read access to a trace that grows at its end.
pub trait TraceView: Send + Sync {
    /// Calls `f` with the bytes recorded so far. Bytes once shown never change unless
    /// [`rewritten_since`](Self::rewritten_since) says so; later calls may show more of them. The worker decodes inside `f`, at most one window
    /// (the history worker's window, bytes past the last sync point, more only when no PSB
    /// lies within it) at a time.
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R;

    /// Number of bytes recorded so far.
    fn len(&self) -> u64;

    /// Whether nothing was recorded yet.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Rewrites of bytes already shown (a store whose end is provisional, see
    /// [`TraceStore::rewrite_from`](crate::store::live::TraceStore::rewrite_from)): the number
    /// of rewrites so far, and the lowest offset rewritten by those after the first `seen`
    /// (`None`: none since). A reader that indexed the bytes forgets what it read at or after
    /// that offset. The default: bytes once shown never change.
    fn rewritten_since(&self, seen: u64) -> (u64, Option<u64>) {
        let _ = seen;
        (0, None)
    }
}

impl TraceView for RwLock<Vec<u8>> {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        // A writer that panicked mid-append leaves whole bytes behind: still readable.
        let g = self.read().unwrap_or_else(|e| e.into_inner());
        f(&g)
    }

    fn len(&self) -> u64 {
        self.read().unwrap_or_else(|e| e.into_inner()).len() as u64
    }
}

impl TraceView for Vec<u8> {
    fn with_bytes<R>(&self, f: impl FnOnce(&[u8]) -> R) -> R {
        f(self)
    }

    fn len(&self) -> u64 {
        self.len() as u64
    }
}
