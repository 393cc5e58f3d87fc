//! Starting a program under `qemu-x86_64 -g SOCKET` and connecting to its gdbstub.
//!
//! The stub listens on a UNIX socket in a fresh directory only we can enter (mode 0700, from
//! `tempfile`), never on TCP: QEMU 7.2 binds a numeric `-g PORT` to every interface. The
//! program is checked first (an x86-64 ELF file) so that the common mistakes get a clear error
//! instead of QEMU's, and a missing `qemu-x86_64` names the package to install.

use std::ffi::{OsStr, OsString};
use std::io::Read;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use thiserror::Error;

use super::{Remote, RemoteError, RemoteOptions};

/// Why the program could not be started under QEMU.
#[derive(Debug, Error)]
pub enum LaunchError {
    /// `qemu-x86_64` is not installed (or not in `PATH`).
    #[error(
        "{name} not found (looked in PATH: {searched}); install the qemu-user package \
         (Debian/Ubuntu: apt-get install qemu-user)"
    )]
    QemuNotFound {
        /// The executable looked for.
        name: String,
        /// The `PATH` searched.
        searched: String,
    },
    /// The program cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    ProgramUnreadable {
        /// The program.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The program is not an ELF file.
    #[error("{} is not an ELF executable ({detail}); qemu-x86_64 runs x86-64 Linux ELF programs", path.display())]
    NotElf {
        /// The program.
        path: PathBuf,
        /// What it looks like instead.
        detail: String,
    },
    /// An ELF file for another machine (or 32-bit).
    #[error("{} is an ELF file for {machine}, not x86-64; this backend runs x86-64 programs only", path.display())]
    WrongArch {
        /// The program.
        path: PathBuf,
        /// The machine it is for.
        machine: String,
    },
    /// The private socket directory could not be made.
    #[error("cannot create a private directory for the gdbstub socket: {0}")]
    TempDir(#[source] std::io::Error),
    /// The socket path does not fit `sockaddr_un` (set `TMPDIR` to a shorter directory).
    #[error("gdbstub socket path {} is too long for a UNIX socket (set TMPDIR to a shorter directory)", path.display())]
    SocketPathTooLong {
        /// The path.
        path: PathBuf,
    },
    /// `qemu-x86_64` could not be executed.
    #[error("cannot run {}: {source}", qemu.display())]
    Spawn {
        /// The QEMU binary.
        qemu: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// QEMU exited before the debugger could connect.
    #[error("{} exited ({status}) before its gdbstub accepted a connection{}", qemu.display(), stderr_note(stderr))]
    ExitedEarly {
        /// The QEMU binary.
        qemu: PathBuf,
        /// How it ended.
        status: ExitStatus,
        /// What it wrote to stderr, when stderr was captured.
        stderr: Option<String>,
    },
    /// The socket never accepted a connection.
    #[error("the gdbstub socket {} accepted no connection within {after:?}", path.display())]
    ConnectTimeout {
        /// The socket.
        path: PathBuf,
        /// How long we tried.
        after: Duration,
    },
    /// Connected, but the protocol handshake failed.
    #[error("gdbstub handshake: {0}")]
    Remote(#[from] RemoteError),
    /// Sending a signal to QEMU failed.
    #[error("cannot signal qemu (pid {pid}): {source}")]
    Signal {
        /// QEMU's pid.
        pid: u32,
        /// The error.
        #[source]
        source: nix::Error,
    },
}

fn stderr_note(stderr: &Option<String>) -> String {
    match stderr {
        Some(s) if !s.trim().is_empty() => format!(": {}", s.trim()),
        Some(_) => String::new(),
        None => " (its message, if any, is on stderr)".into(),
    }
}

/// The QEMU binary's default name.
pub const QEMU_X86_64: &str = "qemu-x86_64";

/// How to start a program under QEMU with its gdbstub.
#[derive(Debug)]
pub struct QemuLaunch {
    /// The QEMU binary: a path, or a name searched in `PATH` (default `qemu-x86_64`).
    pub qemu: OsString,
    /// Arguments to QEMU before `-g` (e.g. `-plugin PATH,ARGS`).
    pub qemu_args: Vec<OsString>,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Run QEMU with address-space randomisation off (`personality(ADDR_NO_RANDOMIZE)`), so
    /// that runs are reproducible.
    pub disable_aslr: bool,
    /// Standard input of the program (inherited if `None`).
    pub stdin: Option<Stdio>,
    /// Standard output of the program (inherited if `None`).
    pub stdout: Option<Stdio>,
    /// Standard error of the program and QEMU's messages (inherited if `None`; with
    /// [`capture_stderr`](Self::capture_stderr) it is a pipe read back for the error of a QEMU
    /// that exits before the connection).
    pub stderr: Option<Stdio>,
    /// Pipe stderr (for tests; a program that writes much to stderr would block on a full
    /// pipe unless the caller reads [`QemuProcess::take_stderr`]).
    pub capture_stderr: bool,
    /// How long QEMU may take to accept the connection.
    pub connect_timeout: Duration,
    /// Protocol settings.
    pub remote: RemoteOptions,
}

impl QemuLaunch {
    /// `program args…` under `qemu-x86_64`, with the defaults.
    pub fn new(
        program: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<OsString>>,
    ) -> Self {
        QemuLaunch {
            qemu: QEMU_X86_64.into(),
            qemu_args: Vec::new(),
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            disable_aslr: true,
            stdin: None,
            stdout: None,
            stderr: None,
            capture_stderr: false,
            connect_timeout: Duration::from_secs(20),
            remote: RemoteOptions::default(),
        }
    }

    /// Checks the program, starts QEMU stopped at the program's first instruction, and
    /// connects.
    pub fn launch(self) -> Result<(QemuProcess, Remote<UnixStream>), LaunchError> {
        check_program(&self.program)?;
        let qemu = find_qemu(&self.qemu)?;
        // Private (0700): whoever connects to the socket first controls the program.
        let dir = tempfile::Builder::new()
            .prefix("ptrewind-qemu-")
            .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .tempdir()
            .map_err(LaunchError::TempDir)?;
        let sock = dir.path().join("gdb");
        // sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
        if sock.as_os_str().len() >= 108 {
            return Err(LaunchError::SocketPathTooLong { path: sock });
        }
        let mut cmd = Command::new(&qemu);
        cmd.args(&self.qemu_args)
            .arg("-g")
            .arg(&sock)
            .arg(&self.program)
            .args(&self.args);
        if let Some(s) = self.stdin {
            cmd.stdin(s);
        }
        if let Some(s) = self.stdout {
            cmd.stdout(s);
        }
        if self.capture_stderr {
            cmd.stderr(Stdio::piped());
        } else if let Some(s) = self.stderr {
            cmd.stderr(s);
        }
        let disable_aslr = self.disable_aslr;
        // SAFETY: the closure runs in the forked child before exec and only makes the
        // async-signal-safe system calls prctl(2) and personality(2); it allocates nothing.
        unsafe {
            cmd.pre_exec(move || {
                // QEMU dies with us (as ptrace's EXITKILL does for native targets): a guest
                // left running without its debugger would be invisible to the user.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if disable_aslr {
                    use nix::sys::personality::{self, Persona};
                    let current = personality::get().map_err(std::io::Error::from)?;
                    personality::set(current | Persona::ADDR_NO_RANDOMIZE)
                        .map_err(std::io::Error::from)?;
                }
                Ok(())
            });
        }
        let child = cmd.spawn().map_err(|source| LaunchError::Spawn {
            qemu: qemu.clone(),
            source,
        })?;
        let mut proc = QemuProcess {
            child,
            status: None,
            _dir: dir,
            qemu,
        };
        let stream = proc.connect(&sock, self.connect_timeout)?;
        let remote = Remote::connect(stream, self.remote)?;
        Ok((proc, remote))
    }
}

/// Checks that `path` is a readable x86-64 ELF file.
pub fn check_program(path: &Path) -> Result<(), LaunchError> {
    let unreadable = |source| LaunchError::ProgramUnreadable {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::File::open(path).map_err(unreadable)?;
    if f.metadata().map_err(unreadable)?.is_dir() {
        return Err(LaunchError::NotElf {
            path: path.to_path_buf(),
            detail: "a directory".into(),
        });
    }
    let mut head = [0u8; 20];
    let mut n = 0;
    while n < head.len() {
        match f.read(&mut head[n..]).map_err(unreadable)? {
            0 => break,
            k => n += k,
        }
    }
    let head = &head[..n];
    if !head.starts_with(b"\x7fELF") {
        let detail = if head.starts_with(b"#!") {
            "a script starting with #!; run its interpreter instead".to_string()
        } else if n == 0 {
            "an empty file".to_string()
        } else {
            format!("starts with bytes {:02x?}", &head[..n.min(4)])
        };
        return Err(LaunchError::NotElf {
            path: path.to_path_buf(),
            detail,
        });
    }
    if n < 20 {
        return Err(LaunchError::NotElf {
            path: path.to_path_buf(),
            detail: "a truncated ELF header".into(),
        });
    }
    let class = head[4];
    let data = head[5];
    let machine = if data == 2 {
        u16::from_be_bytes([head[18], head[19]])
    } else {
        u16::from_le_bytes([head[18], head[19]])
    };
    const EM_X86_64: u16 = 62;
    if class == 2 && data == 1 && machine == EM_X86_64 {
        return Ok(());
    }
    let name = match machine {
        3 => "i386 (32-bit x86)".to_string(),
        8 => "MIPS".to_string(),
        20 => "PowerPC".to_string(),
        21 => "PowerPC64".to_string(),
        22 => "s390".to_string(),
        40 => "ARM (32-bit)".to_string(),
        62 if class != 2 => "x86-64 with 32-bit ELF class (x32)".to_string(),
        183 => "AArch64".to_string(),
        243 => "RISC-V".to_string(),
        258 => "LoongArch".to_string(),
        m => format!("machine {m}"),
    };
    Err(LaunchError::WrongArch {
        path: path.to_path_buf(),
        machine: name,
    })
}

/// Resolves the QEMU binary: a name containing `/` as is, otherwise the first executable
/// file of that name in `PATH`.
pub fn find_qemu(name: &OsStr) -> Result<PathBuf, LaunchError> {
    let path = Path::new(name);
    let executable = |p: &Path| {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    let searched = std::env::var_os("PATH").unwrap_or_default();
    if name.as_encoded_bytes().contains(&b'/') {
        if executable(path) {
            return Ok(path.to_path_buf());
        }
    } else {
        for dir in std::env::split_paths(&searched) {
            let cand = dir.join(name);
            if executable(&cand) {
                return Ok(cand);
            }
        }
    }
    Err(LaunchError::QemuNotFound {
        name: name.to_string_lossy().into_owned(),
        searched: searched.to_string_lossy().into_owned(),
    })
}

/// Connects to the gdbstub socket `sock` of the QEMU `child` (started with `-g sock`), retrying
/// until `timeout` while QEMU starts; an exited QEMU is [`LaunchError::ExitedEarly`] (without
/// its stderr).
pub fn connect_socket(
    child: &mut Child,
    qemu: &Path,
    sock: &Path,
    timeout: Duration,
) -> Result<UnixStream, LaunchError> {
    let start = Instant::now();
    let mut pause = Duration::from_millis(2);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(LaunchError::ExitedEarly {
                qemu: qemu.to_path_buf(),
                status,
                stderr: None,
            });
        }
        match UnixStream::connect(sock) {
            Ok(s) => return Ok(s),
            Err(_) if start.elapsed() < timeout => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(50));
            }
            Err(_) => {
                return Err(LaunchError::ConnectTimeout {
                    path: sock.to_path_buf(),
                    after: timeout,
                });
            }
        }
    }
}

/// A running `qemu-x86_64` with its gdbstub. Dropping it kills QEMU (and so the program) if it
/// is still running, and removes the socket directory.
#[derive(Debug)]
pub struct QemuProcess {
    child: Child,
    status: Option<ExitStatus>,
    /// The socket's private directory, removed on drop.
    _dir: tempfile::TempDir,
    qemu: PathBuf,
}

impl QemuProcess {
    /// QEMU's process id (the guest runs inside it; guest thread ids are QEMU's thread ids).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn connect(&mut self, sock: &Path, timeout: Duration) -> Result<UnixStream, LaunchError> {
        match connect_socket(&mut self.child, &self.qemu, sock, timeout) {
            Err(LaunchError::ExitedEarly { qemu, status, .. }) => {
                self.status = Some(status);
                let stderr = self.take_stderr_text();
                Err(LaunchError::ExitedEarly {
                    qemu,
                    status,
                    stderr,
                })
            }
            other => other,
        }
    }

    fn take_stderr_text(&mut self) -> Option<String> {
        let mut pipe = self.child.stderr.take()?;
        let mut buf = Vec::new();
        // QEMU has exited: the pipe ends. Bounded anyway.
        let _ = (&mut pipe).take(64 * 1024).read_to_end(&mut buf);
        Some(String::from_utf8_lossy(&buf).into_owned())
    }

    /// The stderr pipe, when [`QemuLaunch::capture_stderr`] was set.
    pub fn take_stderr(&mut self) -> Option<std::process::ChildStderr> {
        self.child.stderr.take()
    }

    /// Interrupts the program: `SIGINT` to QEMU, which delivers it to the guest, whose stub
    /// then reports a `SIGINT` stop in the thread that took it. (QEMU 7.2's user-mode stub does
    /// not read its socket while the guest runs, so the protocol's `0x03` byte is not seen.)
    /// Resuming without a signal discards it. A guest that blocks `SIGINT` is not interrupted.
    pub fn interrupt(&self) -> Result<(), LaunchError> {
        let pid = self.pid();
        let raw = i32::try_from(pid).map_err(|_| LaunchError::Signal {
            pid,
            source: nix::Error::ESRCH,
        })?;
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(raw),
            nix::sys::signal::Signal::SIGINT,
        )
        .map_err(|source| LaunchError::Signal { pid, source })
    }

    /// QEMU's exit status, if it has exited (reaps it).
    pub fn try_wait(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().ok().flatten();
        }
        self.status
    }

    /// Waits up to `timeout` for QEMU to exit.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(s) = self.try_wait() {
                return Some(s);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Kills QEMU (`SIGKILL`) and reaps it.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        if self.try_wait().is_none() {
            let _ = self.child.kill();
            self.status = self.child.wait().ok();
        }
        self.status
    }
}

impl Drop for QemuProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn program_checks_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("s");
        std::fs::write(&script, "#!/bin/sh\necho\n").unwrap();
        let err = check_program(&script).unwrap_err().to_string();
        assert!(err.contains("script"), "{err}");
        let empty = dir.path().join("e");
        std::fs::write(&empty, "").unwrap();
        assert!(
            check_program(&empty)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        let mut arm = b"\x7fELF\x01\x01\x01\0\0\0\0\0\0\0\0\0\x02\0\x28\0".to_vec();
        arm.resize(64, 0);
        let arm_path = dir.path().join("arm");
        std::fs::write(&arm_path, &arm).unwrap();
        let err = check_program(&arm_path).unwrap_err().to_string();
        assert!(err.contains("ARM") && err.contains("not x86-64"), "{err}");
        let mut x86 = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x02\0\x3e\0".to_vec();
        x86.resize(64, 0);
        let x86_path = dir.path().join("x86");
        std::fs::write(&x86_path, &x86).unwrap();
        check_program(&x86_path).unwrap();
        let err = check_program(&dir.path().join("missing")).unwrap_err();
        assert!(
            matches!(err, LaunchError::ProgramUnreadable { .. }),
            "{err}"
        );
        assert!(matches!(
            check_program(dir.path()).unwrap_err(),
            LaunchError::NotElf { .. }
        ));
    }

    #[test]
    fn missing_qemu_names_the_package() {
        let err = find_qemu(OsStr::new("qemu-x86_64-does-not-exist")).unwrap_err();
        assert!(err.to_string().contains("qemu-user"), "{err}");
        let err = find_qemu(OsStr::new("/nonexistent/qemu-x86_64")).unwrap_err();
        assert!(matches!(err, LaunchError::QemuNotFound { .. }), "{err}");
    }
}
