//! Ending on `SIGTERM`, `SIGHUP` (the terminal closed) and `SIGINT` the way every other end
//! goes: the program being debugged is killed (or, attached to, detached: never left stopped
//! with our breakpoints in it) and everything ptrewind created — the QEMU backend's recording
//! directory, sockets, scratch files — is removed by its owner's `Drop`. With the default
//! dispositions the kernel ended ptrewind on the spot and none of that ran: the debuggee died
//! of `PTRACE_O_EXITKILL`/`PR_SET_PDEATHSIG`, its temporary directories stayed.
//!
//! The handlers (from `signal-hook`) only write to a self-pipe; a thread of ours reads it,
//! records the signal and runs the wakers the serving code registered ([`on_ending`]): they
//! close the debugger's connection and wake the loop waiting for one, which then ends the
//! session and returns through the normal exit path. A second terminating signal while that
//! runs ends ptrewind at once (the signal's default action), in case the clean-up hangs.
//!
//! Exec resets handled signals to their default in the program and in QEMU and GDB, so
//! installing the handlers changes nothing for them (an ignored signal would be inherited).

use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// A waker run when a terminating signal arrives.
type Waker = Box<dyn Fn() + Send>;

/// The process-wide state: signal dispositions are per process.
struct Ending {
    /// The first terminating signal received (0: none).
    signal: AtomicI32,
    /// `SIGINT` is not a request to end (it is the program's or GDB's Ctrl-C).
    ignore_int: AtomicBool,
    /// Set once ending: a further `SIGTERM`/`SIGHUP` takes its default action.
    armed: Arc<AtomicBool>,
    /// As `armed`, for `SIGINT` (only when `SIGINT` was not ignored at the time).
    armed_int: Arc<AtomicBool>,
    /// Registered wakers, by id.
    wakers: Mutex<Vec<(u64, Waker)>>,
    next_id: AtomicU64,
}

static ENDING: OnceLock<Ending> = OnceLock::new();

/// The signals that end ptrewind cleanly.
const SIGNALS: [i32; 3] = [libc::SIGTERM, libc::SIGHUP, libc::SIGINT];

/// Installs the handlers and starts the thread that reads them (once per process; later calls
/// do nothing). Until then the signals keep their default action.
pub(crate) fn install() -> std::io::Result<()> {
    if ENDING.get().is_some() {
        return Ok(());
    }
    let ending = Ending {
        signal: AtomicI32::new(0),
        ignore_int: AtomicBool::new(false),
        armed: Arc::new(AtomicBool::new(false)),
        armed_int: Arc::new(AtomicBool::new(false)),
        wakers: Mutex::new(Vec::new()),
        next_id: AtomicU64::new(0),
    };
    // The conditional default goes first: at the first signal it is not armed yet and does
    // nothing; the iterator's handler then records the signal.
    for sig in SIGNALS {
        let flag = if sig == libc::SIGINT {
            &ending.armed_int
        } else {
            &ending.armed
        };
        signal_hook::flag::register_conditional_default(sig, Arc::clone(flag))?;
    }
    let mut signals = signal_hook::iterator::Signals::new(SIGNALS)?;
    if ENDING.set(ending).is_err() {
        return Ok(());
    }
    std::thread::Builder::new()
        .name("ptrewind-signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                let Some(e) = ENDING.get() else { continue };
                if sig == libc::SIGINT && e.ignore_int.load(Ordering::SeqCst) {
                    continue;
                }
                if e.signal
                    .compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst)
                    .is_err()
                {
                    // Already ending (a repeated signal is handled by the armed default).
                    continue;
                }
                e.armed.store(true, Ordering::SeqCst);
                if !e.ignore_int.load(Ordering::SeqCst) {
                    e.armed_int.store(true, Ordering::SeqCst);
                }
                let wakers = e.wakers.lock().unwrap_or_else(|p| p.into_inner());
                for (_, wake) in wakers.iter() {
                    wake();
                }
            }
        })?;
    Ok(())
}

/// The terminating signal received, if any.
pub(crate) fn received() -> Option<i32> {
    ENDING
        .get()
        .map(|e| e.signal.load(Ordering::SeqCst))
        .filter(|&s| s != 0)
}

/// Whether `SIGINT` is disregarded (`on`): while the program or GDB owns the terminal's Ctrl-C
/// (`ptrewind gdb`; a QEMU recording run to its end, whose Ctrl-C ends the program and keeps
/// the recording). Returns the previous setting. Without [`install`] the disposition itself is
/// set to ignore or to the default.
pub(crate) fn ignore_sigint(on: bool) -> bool {
    match ENDING.get() {
        Some(e) => e.ignore_int.swap(on, Ordering::SeqCst),
        None => {
            let handler = if on {
                nix::sys::signal::SigHandler::SigIgn
            } else {
                nix::sys::signal::SigHandler::SigDfl
            };
            // SAFETY: SIG_IGN and SIG_DFL install no handler code, so no async-signal-safety
            // question arises.
            let old =
                unsafe { nix::sys::signal::signal(nix::sys::signal::Signal::SIGINT, handler) };
            matches!(old, Ok(nix::sys::signal::SigHandler::SigIgn))
        }
    }
}

/// Runs `wake` when a terminating signal arrives (at once if one already has), on the signal
/// thread, until the returned guard is dropped. `wake` must not block.
pub(crate) fn on_ending(wake: impl Fn() + Send + 'static) -> WakerGuard {
    let Some(e) = ENDING.get() else {
        return WakerGuard { id: None };
    };
    let id = e.next_id.fetch_add(1, Ordering::Relaxed);
    let mut wakers = e.wakers.lock().unwrap_or_else(|p| p.into_inner());
    // Checked under the lock the signal thread holds while waking: no signal is missed.
    if received().is_some() {
        wake();
    }
    wakers.push((id, Box::new(wake)));
    WakerGuard { id: Some(id) }
}

/// Unregisters a waker of [`on_ending`] when dropped.
#[must_use = "the waker is unregistered when the guard is dropped"]
pub(crate) struct WakerGuard {
    id: Option<u64>,
}

impl Drop for WakerGuard {
    fn drop(&mut self) {
        if let (Some(id), Some(e)) = (self.id, ENDING.get()) {
            e.wakers
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .retain(|(i, _)| *i != id);
        }
    }
}

/// `SIGTERM` for 15.
pub(crate) fn name(sig: i32) -> String {
    nix::sys::signal::Signal::try_from(sig)
        .map(|s| s.as_str().to_string())
        .unwrap_or_else(|_| format!("signal {sig}"))
}

/// The exit code after ending on `sig`: 128 + its number, as a shell reports a process killed
/// by it.
pub(crate) fn exit_code(sig: i32) -> ExitCode {
    ExitCode::from(u8::try_from(128 + sig).unwrap_or(255))
}

/// Prints `line` on stderr without panicking when stderr is gone (a hung-up terminal).
pub(crate) fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_exit_codes() {
        assert_eq!(name(libc::SIGTERM), "SIGTERM");
        assert_eq!(name(libc::SIGHUP), "SIGHUP");
        assert_eq!(name(1000), "signal 1000");
        assert_eq!(exit_code(libc::SIGTERM), ExitCode::from(143));
    }
}
