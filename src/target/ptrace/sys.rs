//! The raw system calls of the ptrace target: register sets, `waitpid` decoded by hand, resumes
//! that carry real-time signals, `/proc` files, attaching one thread.

use super::*;

pub(super) fn sys(op: &'static str, pid: Pid) -> impl FnOnce(nix::Error) -> TargetError {
    move |source| TargetError::Sys {
        op,
        pid: pid.as_raw(),
        source,
    }
}

/// Direction of a [`regset`] transfer.
#[derive(Clone, Copy)]
pub(super) enum RegsetOp {
    /// `PTRACE_GETREGSET`: the kernel fills the buffer.
    Get,
    /// `PTRACE_SETREGSET`: the kernel reads the buffer.
    Set,
}

/// `PTRACE_GETREGSET` / `PTRACE_SETREGSET` of register set `note` with `buf`; returns the
/// number of bytes the kernel transferred.
pub(super) fn regset(pid: Pid, op: RegsetOp, note: usize, buf: &mut [u8]) -> TargetResult<usize> {
    let (request, name) = match op {
        RegsetOp::Get => (libc::PTRACE_GETREGSET, "PTRACE_GETREGSET"),
        RegsetOp::Set => (libc::PTRACE_SETREGSET, "PTRACE_SETREGSET"),
    };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: the kernel writes (GETREGSET) or reads (SETREGSET) at most `iov_len` bytes of
    // `buf`, which outlives the call, and updates `iov_len` to the size transferred.
    let r = unsafe {
        libc::ptrace(
            request,
            pid.as_raw(),
            note as *mut libc::c_void,
            &mut iov as *mut libc::iovec,
        )
    };
    if r < 0 {
        return Err(sys(name, pid)(nix::Error::last()));
    }
    Ok(iov.iov_len)
}

/// Decoded `waitpid` status (our own decoding: nix cannot represent real-time signals).
#[derive(Debug, Clone, Copy)]
pub(super) enum Wait {
    StillRunning,
    Exited(i32),
    Killed(i32),
    Stopped(i32),
    Event(i32),
}

pub(super) fn waitpid_raw(pid: Pid, block: bool) -> TargetResult<Wait> {
    let mut status: libc::c_int = 0;
    let flags = libc::__WALL | if block { 0 } else { libc::WNOHANG };
    loop {
        // SAFETY: waitpid only writes the status integer we own.
        let r = unsafe { libc::waitpid(pid.as_raw(), &mut status, flags) };
        if r < 0 {
            let err = nix::Error::last();
            if err == nix::Error::EINTR {
                continue;
            }
            return Err(sys("waitpid", pid)(err));
        }
        if r == 0 {
            return Ok(Wait::StillRunning);
        }
        break;
    }
    Ok(if libc::WIFEXITED(status) {
        Wait::Exited(libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        Wait::Killed(libc::WTERMSIG(status))
    } else if libc::WIFSTOPPED(status) {
        let event = status >> 16;
        if event != 0 {
            Wait::Event(event)
        } else {
            Wait::Stopped(libc::WSTOPSIG(status))
        }
    } else {
        Wait::StillRunning
    })
}

/// `ptrace(request, pid, 0, signal)` for the requests that take a signal number in `data`
/// (CONT, SINGLESTEP, DETACH). Raw because nix's `Signal` cannot carry real-time signals.
pub(super) fn ptrace_with_signal(
    request: libc::c_uint,
    op: &'static str,
    pid: Pid,
    signal: Option<i32>,
) -> TargetResult<()> {
    let data = signal.unwrap_or(0) as usize;
    // SAFETY: these requests take no pointers: `addr` is ignored and `data` is a signal number.
    let r = unsafe {
        libc::ptrace(
            request,
            pid.as_raw(),
            std::ptr::null_mut::<libc::c_void>(),
            data as *mut libc::c_void,
        )
    };
    if r < 0 {
        return Err(sys(op, pid)(nix::Error::last()));
    }
    Ok(())
}

pub(super) fn open_mem(pid: Pid) -> TargetResult<File> {
    let path = PathBuf::from(format!("/proc/{}/mem", pid.as_raw()));
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .map_err(|source| TargetError::Io { path, source })
}

pub(super) fn exe_of(pid: Pid) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/{}/exe", pid.as_raw())).ok()
}

pub(super) fn trace_options() -> nix::sys::ptrace::Options {
    use nix::sys::ptrace::Options;
    Options::PTRACE_O_TRACECLONE
        | Options::PTRACE_O_TRACEFORK
        | Options::PTRACE_O_TRACEVFORK
        | Options::PTRACE_O_TRACEVFORKDONE
        | Options::PTRACE_O_TRACEEXEC
        | Options::PTRACE_O_TRACEEXIT
}

/// `PTRACE_ATTACH` to one thread and waits for its `SIGSTOP` (signals that arrive first are
/// delivered, as they would have been).
pub(super) fn attach_one(tid: Pid) -> TargetResult<()> {
    nix::sys::ptrace::attach(tid).map_err(sys("PTRACE_ATTACH", tid))?;
    loop {
        match waitpid_raw(tid, true)? {
            Wait::Stopped(libc::SIGSTOP) => return Ok(()),
            Wait::Stopped(sig) => {
                ptrace_with_signal(libc::PTRACE_CONT, "PTRACE_CONT", tid, Some(sig))?
            }
            Wait::Exited(_) | Wait::Killed(_) => {
                return Err(TargetError::Exited { pid: tid.as_raw() });
            }
            _ => {}
        }
    }
}

/// The thread-group id of `tid` (`Tgid:` in `/proc/TID/status`).
pub(super) fn tgid_of(tid: i32) -> Option<i32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Tgid:"))
        .and_then(|v| v.trim().parse().ok())
}
