//! Launching a program under `qemu-x86_64` with the plugin, and reading the recording directory
//! it fills (see [`super::output`] for the files).
//!
//! ```no_run
//! use ptrewind::capture::qemu::{QemuConfig, QemuRecording};
//!
//! let config = QemuConfig::new("target/debug/libptrewind_qemu_plugin.so");
//! let mut rec = QemuRecording::spawn(&config, "./a.out".as_ref(), &[])?;
//! let status = rec.wait()?;
//! let recording = rec.read()?;
//! for t in &recording.threads {
//!     println!("thread {}: {} bytes of PT", t.tid, t.trace.len());
//! }
//! let image = recording.image()?;
//! # let _ = (status, image);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use super::output::{
    self, CLOCK_FILE, LAUNCH_FILE, PLUGIN_FILE, PluginMeta, TailState, ThreadMeta,
};
use crate::image::Image;
use crate::image::perf_maps::{MissingImage, MmapImage, MmapOptions, MmapRecord};
use crate::image::procfs::parse_maps_lenient;

/// The plugin API version the plugin speaks (QEMU 4.2 to 8.x accept it).
pub const PLUGIN_API_VERSION: i32 = 1;
/// File name of the plugin as Cargo builds it.
pub const PLUGIN_FILE_NAME: &str = "libptrewind_qemu_plugin.so";

/// How to run QEMU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QemuConfig {
    /// The `qemu-x86_64` executable (looked up in `PATH` when not a path).
    pub qemu: PathBuf,
    /// The plugin shared object.
    pub plugin: PathBuf,
    /// Precise mode (see the plugin): interrupted blocks counted exactly.
    pub precise: bool,
    /// Test mode: log every executed instruction address per thread.
    pub log_insns: bool,
    /// Hold the process at its `exit_group` until released (see
    /// [`EXIT_FILE`](super::output::EXIT_FILE)); only for a live session that releases it.
    pub exit_stop: bool,
    /// Map the pause gate (see [`PAUSE_FILE`](super::output::PAUSE_FILE)): a live session holds
    /// the other threads while one is stopped in the gdbstub.
    pub pause: bool,
    /// Recording directory (created; an existing one is an error); `None`: a new private
    /// temporary directory, removed when the [`QemuRecording`] is dropped unless
    /// [`QemuRecording::keep_dir`] (a directory named here is never removed).
    pub dir: Option<PathBuf>,
    /// Extra QEMU options placed before the program (e.g. `-g PORT`).
    pub qemu_args: Vec<OsString>,
}

impl QemuConfig {
    /// Defaults: `qemu-x86_64` from `PATH`, precise mode, no instruction log.
    pub fn new(plugin: impl Into<PathBuf>) -> Self {
        QemuConfig {
            qemu: PathBuf::from("qemu-x86_64"),
            plugin: plugin.into(),
            precise: true,
            log_insns: false,
            exit_stop: false,
            pause: false,
            dir: None,
            qemu_args: Vec::new(),
        }
    }
}

/// What can go wrong launching or reading a QEMU recording.
#[derive(Debug, thiserror::Error)]
pub enum QemuError {
    /// `qemu-x86_64` is not installed.
    #[error(
        "cannot run {qemu}: {source} (install QEMU user-mode emulation: the Debian/Ubuntu package \
         `qemu-user`)"
    )]
    QemuMissing {
        /// What was run.
        qemu: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The plugin shared object was not found.
    #[error("QEMU plugin {0} not found (build it with `cargo build`, or pass --qemu-plugin PATH)")]
    PluginMissing(PathBuf),
    /// QEMU did not load the plugin.
    #[error(
        "{qemu_version} did not load the plugin {plugin} (exit status {status}): the plugin \
         speaks QEMU plugin API version {PLUGIN_API_VERSION}; QEMU 4.2 to 8.x (e.g. Debian \
         bookworm's 7.2) support it{detail}"
    )]
    PluginRefused {
        /// `qemu-x86_64 --version`'s first line.
        qemu_version: String,
        /// The plugin.
        plugin: PathBuf,
        /// QEMU's exit status.
        status: ExitStatus,
        /// More detail (the API range QEMU reported, if any).
        detail: String,
    },
    /// The program is not an ELF file.
    #[error("{path}: not an ELF executable ({why})")]
    NotElf {
        /// The program.
        path: PathBuf,
        /// What was found.
        why: String,
    },
    /// The program is an ELF file for another machine.
    #[error("{path}: {what}; the QEMU backend records x86-64 programs only")]
    NotX86_64 {
        /// The program.
        path: PathBuf,
        /// What it is.
        what: String,
    },
    /// File-system error.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        source: std::io::Error,
    },
    /// A recording file is malformed.
    #[error("{path}: {why}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> QemuError {
    let what = what.into();
    move |source| QemuError::Io { what, source }
}

/// Checks that `path` is an x86-64 ELF executable (a clear error otherwise).
pub fn check_program(path: &Path) -> Result<(), QemuError> {
    let mut f = std::fs::File::open(path).map_err(io_err(format!("{}", path.display())))?;
    let mut h = [0u8; 20];
    let n = f
        .read(&mut h)
        .map_err(io_err(format!("reading {}", path.display())))?;
    if n < 20 || &h[..4] != b"\x7fELF" {
        let why = if h[..n.min(2)] == *b"#!" {
            "a script: give its interpreter as the program".to_string()
        } else {
            format!("starts with {:02x?}", &h[..n.min(4)])
        };
        return Err(QemuError::NotElf {
            path: path.to_path_buf(),
            why,
        });
    }
    let machine = u16::from_le_bytes([h[18], h[19]]);
    if h[4] != 2 || machine != 62 {
        let what = match (h[4], machine) {
            (1, 3) => "a 32-bit x86 (i386) program".to_string(),
            (_, 183) => "an AArch64 program".to_string(),
            (_, 40) => "an ARM program".to_string(),
            (_, 243) => "a RISC-V program".to_string(),
            (c, m) => format!(
                "an ELF{} program for machine {m}",
                if c == 1 { 32 } else { 64 }
            ),
        };
        return Err(QemuError::NotX86_64 {
            path: path.to_path_buf(),
            what,
        });
    }
    Ok(())
}

/// The first line of `qemu --version`, or the error naming the package to install.
pub fn qemu_version(qemu: &Path) -> Result<String, QemuError> {
    let out = Command::new(qemu)
        .arg("--version")
        .output()
        .map_err(|source| QemuError::QemuMissing {
            qemu: qemu.to_path_buf(),
            source,
        })?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .unwrap_or("qemu-x86_64 (unknown version)")
        .trim()
        .to_string())
}

/// Looks for the plugin beside `exe` (an installed ptrewind) and in Cargo's target directories
/// (`target/{debug,release}` and their `deps/`), taking the newest.
pub fn find_plugin(exe: &Path) -> Option<PathBuf> {
    let dir = exe.parent()?;
    let mut candidates = vec![
        dir.join(PLUGIN_FILE_NAME),
        dir.join("deps").join(PLUGIN_FILE_NAME),
    ];
    if dir
        .file_name()
        .is_some_and(|n| n == "deps" || n == "examples")
        && let Some(up) = dir.parent()
    {
        candidates.push(up.join(PLUGIN_FILE_NAME));
        candidates.push(up.join("deps").join(PLUGIN_FILE_NAME));
    }
    // A test build refreshes `deps/` but not always the copy above it: take the newest.
    candidates
        .into_iter()
        .filter_map(|p| Some((std::fs::metadata(&p).ok()?.modified().ok()?, p)))
        .max_by_key(|(t, _)| *t)
        .map(|(_, p)| p)
}

/// What ptrewind launched, saved as `launch.json` in the recording directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaunchMeta {
    /// The program (canonical path).
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// `qemu --version`.
    pub qemu_version: String,
}

/// A program running under QEMU with the plugin. Dropping it kills QEMU if it still runs.
#[derive(Debug)]
pub struct QemuRecording {
    child: Child,
    dir: PathBuf,
    /// The temporary directory `dir` is, when we made it (removed on drop unless kept).
    temp: Option<tempfile::TempDir>,
    /// [`QemuRecording::keep_dir`] was asked.
    keep: bool,
    clock: Option<memmap2::Mmap>,
    plugin: PathBuf,
    qemu_version: String,
}

impl QemuRecording {
    /// Starts `program args` under QEMU (stdio inherited). QEMU is killed if the thread that
    /// started it ends first (`PR_SET_PDEATHSIG`): keep that thread until QEMU has ended.
    pub fn spawn(
        config: &QemuConfig,
        program: &Path,
        args: &[OsString],
    ) -> Result<QemuRecording, QemuError> {
        Self::spawn_with(config, program, args, |_| {})
    }

    /// Like [`QemuRecording::spawn`], letting `configure` adjust the command (stdio, env).
    pub fn spawn_with(
        config: &QemuConfig,
        program: &Path,
        args: &[OsString],
        configure: impl FnOnce(&mut Command),
    ) -> Result<QemuRecording, QemuError> {
        let qemu_version = qemu_version(&config.qemu)?;
        if !config.plugin.is_file() {
            return Err(QemuError::PluginMissing(config.plugin.clone()));
        }
        check_program(program)?;
        let program =
            std::fs::canonicalize(program).map_err(io_err(format!("{}", program.display())))?;
        let (dir, temp) = match &config.dir {
            Some(d) => {
                std::fs::create_dir(d).map_err(io_err(format!("creating {}", d.display())))?;
                (d.clone(), None)
            }
            None => {
                // Private (0700, unpredictable name, created exclusively): the trace shows
                // everything the program did. Removed by its `TempDir` on every exit path
                // that returns or unwinds; the CLI turns terminating signals into one.
                let temp = tempfile::Builder::new()
                    .prefix("ptrewind-qemu-")
                    .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o700))
                    .tempdir()
                    .map_err(io_err("creating a temporary recording directory"))?;
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        let launch = LaunchMeta {
            program: program.clone(),
            args: args
                .iter()
                .map(|a| a.to_string_lossy().into_owned())
                .collect(),
            qemu_version: qemu_version.clone(),
        };
        output::write_json(&dir.join(LAUNCH_FILE), &launch).map_err(io_err(format!(
            "writing {}",
            dir.join(LAUNCH_FILE).display()
        )))?;
        let plugin = std::fs::canonicalize(&config.plugin)
            .map_err(io_err(format!("{}", config.plugin.display())))?;
        let mut plugin_arg = OsString::from(plugin.as_os_str());
        plugin_arg.push(",out=");
        plugin_arg.push(dir.as_os_str());
        plugin_arg.push(if config.precise {
            ",precise=on"
        } else {
            ",precise=off"
        });
        if config.log_insns {
            plugin_arg.push(",log=on");
        }
        if config.exit_stop {
            plugin_arg.push(",exit_stop=on");
        }
        if config.pause {
            plugin_arg.push(",pause=on");
        }
        let mut cmd = Command::new(&config.qemu);
        // SAFETY: the closure runs in the forked child before exec and only makes the
        // async-signal-safe prctl(2) call; it allocates nothing.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut cmd, || {
                // QEMU dies with the thread that started it (as ptrace's EXITKILL does for
                // native targets) instead of running the program on unobserved, writing a
                // recording nobody reads, when ptrewind is killed.
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        cmd.arg("-plugin").arg(plugin_arg);
        cmd.args(&config.qemu_args);
        cmd.arg(&program).args(args);
        configure(&mut cmd);
        let child = cmd.spawn().map_err(|source| QemuError::QemuMissing {
            qemu: config.qemu.clone(),
            source,
        })?;
        Ok(QemuRecording {
            child,
            dir,
            temp,
            keep: false,
            clock: None,
            plugin,
            qemu_version,
        })
    }

    /// The QEMU process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The QEMU child process.
    pub fn child_mut(&mut self) -> &mut Child {
        &mut self.child
    }

    /// The recording directory (see [`QemuConfig::dir`] for when it is removed).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Keeps (`true`) or removes (`false`, the default) a temporary recording directory when
    /// this is dropped; a directory named in [`QemuConfig::dir`] is always kept.
    pub fn keep_dir(&mut self, keep: bool) {
        self.keep = keep;
        if let Some(t) = self.temp.as_mut() {
            t.disable_cleanup(keep);
        }
    }

    /// Whether the recording directory stays after this is dropped.
    pub fn keeps_dir(&self) -> bool {
        self.temp.is_none() || self.keep
    }

    /// The global instruction clock now (`None` before the plugin created it): at a stop, no
    /// thread's stream holds a later stamp.
    pub fn clock_now(&mut self) -> Option<u64> {
        self.map_clock();
        self.clock.as_ref().map(|m| {
            // SAFETY: the mapping is 8 bytes, page-aligned, and updated atomically by the plugin.
            let a = unsafe { &*(m.as_ptr() as *const AtomicU64) };
            a.load(Ordering::Acquire)
        })
    }

    fn map_clock(&mut self) {
        if self.clock.is_none()
            && let Ok(f) = std::fs::File::open(self.dir.join(CLOCK_FILE))
            && f.metadata().is_ok_and(|m| m.len() >= 8)
        {
            // SAFETY: a read-only mapping of the 8-byte clock file; the plugin only ever
            // writes it with atomic operations.
            self.clock = unsafe { memmap2::Mmap::map(&f) }.ok();
        }
    }

    /// Progress while running: (instructions on the global clock, trace bytes in files).
    pub fn progress(&mut self) -> (u64, u64) {
        let insns = self.clock_now().unwrap_or(0);
        let bytes = std::fs::read_dir(&self.dir)
            .map(|rd| {
                rd.flatten()
                    .filter(|e| e.path().extension().is_some_and(|x| x == "pt"))
                    .filter_map(|e| e.metadata().ok())
                    .map(|m| m.len())
                    .sum()
            })
            .unwrap_or(0);
        (insns, bytes)
    }

    /// Waits for QEMU to exit. A QEMU that ends without having loaded the plugin is
    /// [`QemuError::PluginRefused`].
    pub fn wait(&mut self) -> Result<ExitStatus, QemuError> {
        let status = self.child.wait().map_err(io_err("waiting for qemu"))?;
        if !self.dir.join(PLUGIN_FILE).exists() {
            return Err(QemuError::PluginRefused {
                qemu_version: self.qemu_version.clone(),
                plugin: self.plugin.clone(),
                status,
                detail: String::new(),
            });
        }
        Ok(status)
    }

    /// Reads the recording directory (after [`QemuRecording::wait`]).
    pub fn read(&self) -> Result<Recorded, QemuError> {
        Recorded::open(&self.dir)
    }
}

impl Drop for QemuRecording {
    /// Kills QEMU if it still runs (a caller that gave up on it, e.g. after a failed gdbstub
    /// connection): the program must not run on unobserved, and a temporary recording
    /// directory is removed right after (its `TempDir`).
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// One guest thread's recording.
#[derive(Debug, Clone)]
pub struct RecordedThread {
    /// Guest process id.
    pub pid: u32,
    /// Guest thread id.
    pub tid: u32,
    /// The Intel PT stream.
    pub trace: Vec<u8>,
    /// The plugin's summary, missing if the thread's stream never ended cleanly (QEMU killed).
    pub meta: Option<ThreadMeta>,
    /// Test mode: every instruction address QEMU started on the thread.
    pub insns: Option<Vec<u64>>,
    /// For a stream that did not end cleanly (no summary): how it was completed from the
    /// thread's tail file (see [`super::output::Tail`]).
    pub completed: Option<String>,
}

/// A recording directory read back.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The directory.
    pub dir: PathBuf,
    /// What the plugin reported at load.
    pub plugin: Option<PluginMeta>,
    /// What was launched (absent for directories made by other tools).
    pub launch: Option<LaunchMeta>,
    /// Threads, by process then thread id (the main thread first).
    pub threads: Vec<RecordedThread>,
    /// Mappings per process (`PID.maps`).
    pub maps: Vec<(u32, String)>,
    /// The one process this recording was narrowed to ([`Recorded::process`]): its threads
    /// only, and its mappings in [`Recorded::mmap_records`] (every process's `maps` stay,
    /// since a forked child's snapshot is read with its parent's).
    pub only: Option<u32>,
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> Result<Option<T>, QemuError> {
    match std::fs::read(path) {
        Ok(b) => serde_json::from_slice(&b)
            .map(Some)
            .map_err(|e| QemuError::Malformed {
                path: path.to_path_buf(),
                why: e.to_string(),
            }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(QemuError::Io {
            what: format!("reading {}", path.display()),
            source: e,
        }),
    }
}

impl Recorded {
    /// Reads the recording in `dir`.
    pub fn open(dir: &Path) -> Result<Recorded, QemuError> {
        Self::open_with(dir, true)
    }

    /// Reads the recording in `dir` without the threads' streams (their `trace` is empty and
    /// nothing is completed): the mappings, what was launched and which threads there are, at
    /// a cost that does not grow with the trace (the live backend's code image at each stop).
    pub fn open_layout(dir: &Path) -> Result<Recorded, QemuError> {
        Self::open_with(dir, false)
    }

    fn open_with(dir: &Path, traces: bool) -> Result<Recorded, QemuError> {
        let mut threads = Vec::new();
        let mut maps = Vec::new();
        let rd = std::fs::read_dir(dir).map_err(io_err(format!("reading {}", dir.display())))?;
        for e in rd {
            let e = e.map_err(io_err(format!("reading {}", dir.display())))?;
            let path = e.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if let Some(stem) = name.strip_suffix(".pt") {
                let Some((pid, tid)) = stem
                    .split_once('-')
                    .and_then(|(p, t)| Some((p.parse().ok()?, t.parse().ok()?)))
                else {
                    continue;
                };
                let trace = if traces {
                    std::fs::read(&path).map_err(io_err(format!("reading {name}")))?
                } else {
                    Vec::new()
                };
                let meta = read_json(&output::stream_path(dir, pid, tid, "json"))?;
                let insns = match std::fs::read(output::stream_path(dir, pid, tid, "insns")) {
                    Ok(b) if traces => Some(
                        b.chunks_exact(8)
                            .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                            .collect(),
                    ),
                    _ => None,
                };
                threads.push(RecordedThread {
                    pid,
                    tid,
                    trace,
                    meta,
                    insns,
                    completed: None,
                });
            } else if let Some(pid) = name.strip_suffix(".maps").and_then(|p| p.parse().ok()) {
                let text =
                    std::fs::read_to_string(&path).map_err(io_err(format!("reading {name}")))?;
                maps.push((pid, text));
            }
        }
        // Main thread (tid == pid) first, then by id.
        threads.sort_by_key(|t| (t.pid, t.tid != t.pid, t.tid));
        maps.sort_by_key(|m| m.0);
        let mut rec = Recorded {
            dir: dir.to_path_buf(),
            plugin: read_json(&dir.join(PLUGIN_FILE))?,
            launch: read_json(&dir.join(LAUNCH_FILE))?,
            threads,
            maps,
            only: None,
        };
        if traces {
            rec.complete_unclean();
        }
        Ok(rec)
    }

    /// Completes the streams of threads QEMU did not get to end (it died of a signal or was
    /// killed): the encoder output still in the thread's tail file is appended, then the pending
    /// TNT bits, and the block that was executing ends at the instruction its counter reached,
    /// with FUP(that instruction) + TIP.PGD: the instruction that faulted (or was about to run)
    /// is not counted as executed, nor anything after it in its block.
    fn complete_unclean(&mut self) {
        if self.threads.iter().all(|t| t.meta.is_some()) {
            return;
        }
        let counters = std::fs::read(self.dir.join(output::COUNTERS_FILE)).ok();
        // The clock when the process died: no thread's last run lasted longer.
        let now = std::fs::read(self.dir.join(CLOCK_FILE))
            .ok()
            .and_then(|b| Some(u64::from_ne_bytes(b.get(..8)?.try_into().ok()?)));
        let image = self.mmap_image().image;
        let dir = self.dir.clone();
        for t in self.threads.iter_mut().filter(|t| t.meta.is_none()) {
            let path = output::stream_path(&dir, t.pid, t.tid, "tail");
            let Some(tail) = std::fs::read(&path).ok().and_then(|d| TailState::read(&d)) else {
                t.completed = Some("no tail file: the stream ends at its last write".into());
                continue;
            };
            t.completed = Some(complete_stream(
                &mut t.trace,
                &tail,
                counters.as_deref(),
                now,
                &image,
            ));
        }
    }

    /// Instructions, trace bytes and lost bytes over every thread.
    pub fn totals(&self) -> (u64, u64, u64) {
        let mut t = (0, 0, 0);
        for th in &self.threads {
            t.1 += th.trace.len() as u64;
            if let Some(m) = &th.meta {
                t.0 += m.tracer.instructions;
                t.2 += m.lost;
            }
        }
        t
    }

    /// The code the recording ran, as mapping records: the program and its interpreter as
    /// QEMU's loader placed them (from the start snapshot), then every executable file
    /// mapping the guest made, in order; for a forked child, the guest's files in its fork
    /// snapshot (what it inherited), then its own mappings. Host mappings of the QEMU process
    /// are left out. A recording narrowed to one process ([`Recorded::process`]) gives that
    /// process's records only.
    pub fn mmap_records(&self) -> Vec<MmapRecord> {
        let program = self.launch.as_ref().map(|l| l.program.clone());
        let interp = program.as_deref().and_then(interpreter_of);
        let loader_files: Vec<String> = [program, interp]
            .into_iter()
            .flatten()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        // The files the guest mapped itself (in any process): with the loader's, what a
        // fork snapshot holds of the guest (the rest of it is QEMU's own).
        let guest_files: std::collections::BTreeSet<&str> = self
            .maps
            .iter()
            .flat_map(|(_, text)| text.lines())
            .filter_map(|l| l.strip_prefix("# mmap "))
            .filter_map(|rest| rest.splitn(4, ' ').nth(3))
            .chain(loader_files.iter().map(String::as_str))
            .collect();
        let mut out = Vec::new();
        for (pid, text) in self
            .maps
            .iter()
            .filter(|(p, _)| self.only.is_none_or(|o| o == *p))
        {
            // The start snapshot is QEMU's own maps, and QEMU runs through the same dynamic
            // loader as the guest: that copy is QEMU's. QEMU 7.2 never maps guest pages
            // executable (its `target_to_host_prot` turns PROT_EXEC into PROT_READ: it runs
            // translated code), so a copy with an executable line (its lines share `start -
            // offset`) is QEMU's, not the guest's.
            let qemus_own: Vec<(String, u64)> = parse_maps_lenient(text)
                .filter(|m| m.exec)
                .filter_map(|m| Some((m.path?, m.start.wrapping_sub(m.offset))))
                .collect();
            let mut in_start = false;
            let mut in_fork = false;
            let mut base = 0u64;
            for line in text.lines() {
                if let Some(rest) = line.strip_prefix("# snapshot ") {
                    in_start = rest.starts_with("start") || rest.starts_with("fork");
                    in_fork = rest.starts_with("fork");
                    base = rest
                        .split_whitespace()
                        .find_map(|w| w.strip_prefix("guest_base="))
                        .and_then(|b| b.parse::<i64>().ok())
                        .unwrap_or(0) as u64;
                } else if let Some(rest) = line.strip_prefix("# mmap ") {
                    let mut f = rest.splitn(4, ' ');
                    let (Some(a), Some(l), Some(o), Some(p)) =
                        (f.next(), f.next(), f.next(), f.next())
                    else {
                        continue;
                    };
                    let num = |s: &str| u64::from_str_radix(s.trim_start_matches("0x"), 16).ok();
                    let (Some(addr), Some(len), Some(pgoff)) = (num(a), num(l), num(o)) else {
                        continue;
                    };
                    out.push(MmapRecord {
                        pid: *pid,
                        tid: *pid,
                        addr,
                        len,
                        pgoff,
                        filename: p.to_string(),
                        exec: true,
                    });
                } else if in_start {
                    for m in parse_maps_lenient(line) {
                        let Some(path) = m.path.as_deref() else {
                            continue;
                        };
                        let of_guest = if in_fork {
                            guest_files.contains(path)
                        } else {
                            loader_files.iter().any(|f| f == path)
                        };
                        if !of_guest
                            || qemus_own
                                .iter()
                                .any(|(p, b)| p == path && *b == m.start.wrapping_sub(m.offset))
                        {
                            continue;
                        }
                        out.push(MmapRecord {
                            pid: *pid,
                            tid: *pid,
                            addr: m.start.wrapping_sub(base),
                            len: m.len(),
                            pgoff: m.offset,
                            filename: path.to_string(),
                            exec: true,
                        });
                    }
                }
            }
        }
        out
    }

    /// The code image of the recording (see [`Recorded::mmap_records`]) and the mappings whose
    /// files could not be read.
    pub fn image(&self) -> Result<(Image, Vec<MissingImage>), QemuError> {
        let built = self.mmap_image();
        Ok((built.image, built.missing))
    }

    /// The code image with the ELF files placed in it (for symbols).
    pub fn mmap_image(&self) -> MmapImage {
        self.mmap_image_with(&MmapOptions::default())
    }

    /// [`Recorded::mmap_image`] with `opts` (e.g. [`MmapOptions::map_files`]).
    pub fn mmap_image_with(&self, opts: &MmapOptions<'_>) -> MmapImage {
        Image::from_mmaps(&self.mmap_records(), opts)
    }

    /// The thread `tid`, or the main thread of the launched process
    /// ([`Recorded::launched_pid`]).
    pub fn thread(&self, tid: Option<u32>) -> Option<&RecordedThread> {
        match tid {
            Some(t) => self.threads.iter().find(|th| th.tid == t),
            None => {
                let pid = self.launched_pid();
                self.threads
                    .iter()
                    .find(|th| Some(th.pid) == pid)
                    .or(self.threads.first())
            }
        }
    }

    /// The process QEMU was launched with: the one whose mappings begin with the plugin's
    /// start snapshot (a forked child's begin with the fork snapshot), else the lowest process
    /// id recorded (pids may wrap, so that is only the fallback).
    pub fn launched_pid(&self) -> Option<u32> {
        self.maps
            .iter()
            .filter(|(p, _)| self.only.is_none_or(|o| o == *p))
            .find(|(_, text)| text.starts_with("# snapshot start"))
            .map(|(pid, _)| *pid)
            .or_else(|| self.pids().first().copied())
    }

    /// Every process recorded (with a stream or mappings), by id; of a recording narrowed to
    /// one process ([`Recorded::process`]), that one alone (its `maps` keep the others').
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self
            .threads
            .iter()
            .map(|t| t.pid)
            .chain(self.maps.iter().map(|m| m.0))
            .filter(|&p| self.only.is_none_or(|o| o == p))
            .collect();
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// The processes the launched one forked (directly or not: the plugin records every
    /// descendant QEMU runs), by id.
    pub fn forked_pids(&self) -> Vec<u32> {
        let main = self.launched_pid();
        self.pids()
            .into_iter()
            .filter(|&p| Some(p) != main)
            .collect()
    }

    /// The recording of process `pid` alone: its threads and its mappings, so that its code
    /// image is its own (a child that maps other code after the fork, or a parent after it,
    /// does not see the other's); `None` if nothing of it was recorded.
    pub fn process(&self, pid: u32) -> Option<Recorded> {
        if !self.pids().contains(&pid) {
            return None;
        }
        Some(Recorded {
            dir: self.dir.clone(),
            plugin: self.plugin.clone(),
            launch: self.launch.clone(),
            threads: self
                .threads
                .iter()
                .filter(|t| t.pid == pid)
                .cloned()
                .collect(),
            maps: self.maps.clone(),
            only: Some(pid),
        })
    }
}

/// Where QEMU's loader placed the program and its libraries, in the terms GDB learns them from
/// a live process: the auxiliary vector entries that place a PIE program and its loader
/// (`AT_PHDR`, `AT_PHENT`, `AT_PHNUM`, `AT_PAGESZ`, `AT_BASE`, `AT_ENTRY`), and the loaded
/// objects as the loader's `link_map` would list them. A replay has no process to read them
/// from; the recorded mappings say the same.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoaderView {
    /// The auxiliary vector (pairs of little-endian `u64`, ending with `AT_NULL`).
    pub auxv: Vec<u8>,
    /// Every mapped ELF but the program: (path, load bias, run-time address of its dynamic
    /// section, 0 if none).
    pub objects: Vec<(PathBuf, u64, u64)>,
}

/// One program header: what placing an ELF image and finding its parts needs.
#[derive(Debug, Clone, Copy)]
struct Segment {
    kind: object::elf::ProgramType,
    vaddr: u64,
    offset: u64,
    filesz: u64,
    exec: bool,
}

/// The ELF header fields of an image that the auxiliary vector describes, and its program headers.
struct Phdrs {
    phoff: u64,
    phent: u64,
    entry: u64,
    segments: Vec<Segment>,
}

impl Phdrs {
    fn parse(data: &[u8]) -> Option<Phdrs> {
        use object::read::elf::{FileHeader, ProgramHeader};
        let elf = object::elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
        let endian = elf.endian().ok()?;
        let headers = elf.program_headers(endian, data).ok()?;
        Some(Phdrs {
            phoff: elf.e_phoff(endian),
            phent: u64::from(elf.e_phentsize(endian)),
            entry: elf.e_entry(endian),
            segments: headers
                .iter()
                .map(|h| Segment {
                    kind: h.p_type(endian),
                    vaddr: h.p_vaddr(endian),
                    offset: h.p_offset(endian),
                    filesz: h.p_filesz(endian),
                    exec: h.p_flags(endian).0 & object::elf::PF_X.0 != 0,
                })
                .collect(),
        })
    }

    /// The link-time address of the program headers, which the loader reports biased as
    /// `AT_PHDR`: `PT_PHDR` if present, else the `PT_LOAD` holding the headers' file offset.
    fn phdr_vaddr(&self) -> u64 {
        self.segments
            .iter()
            .find(|h| h.kind == object::elf::PT_PHDR)
            .map(|h| h.vaddr)
            .or_else(|| {
                self.segments
                    .iter()
                    .filter(|h| h.kind == object::elf::PT_LOAD && h.offset <= self.phoff)
                    .map(|h| h.vaddr + (self.phoff - h.offset))
                    .next_back()
            })
            .unwrap_or(self.phoff)
    }

    /// The file mappings the loader makes for this image at load bias `bias`: one per
    /// `PT_LOAD`, page-aligned as `mmap` requires.
    fn mappings(&self, bias: u64, pid: u32, path: &Path) -> Vec<MmapRecord> {
        const PAGE: u64 = 4096;
        self.segments
            .iter()
            .filter(|h| h.kind == object::elf::PT_LOAD && h.filesz > 0)
            .map(|h| {
                let skew = h.vaddr % PAGE;
                MmapRecord {
                    pid,
                    tid: pid,
                    addr: bias.wrapping_add(h.vaddr - skew),
                    len: (h.filesz + skew).div_ceil(PAGE) * PAGE,
                    pgoff: h.offset - h.offset % PAGE,
                    filename: path.to_string_lossy().into_owned(),
                    exec: h.exec,
                }
            })
            .collect()
    }
}

/// Where QEMU's loader placed the program and its interpreter, from the auxiliary vector the
/// guest was started with (`AT_PHDR` places the program, `AT_BASE` the interpreter): the
/// inverse of [`Recorded::loader_view`]. It answers before the guest has run its first block,
/// when the plugin has not yet written the start snapshot [`Recorded::mmap_records`] reads.
pub fn loader_mappings(program: &Path, auxv: &[u8], pid: u32) -> Vec<MmapRecord> {
    let entry = |key: u64| {
        auxv.chunks_exact(16)
            .map(|p| {
                let word = |b: &[u8]| u64::from_le_bytes(b.try_into().unwrap_or_default());
                (word(&p[..8]), word(&p[8..]))
            })
            .take_while(|&(k, _)| k != 0)
            .find(|&(k, _)| k == key)
            .map(|(_, v)| v)
    };
    let mut out = Vec::new();
    let program = std::fs::canonicalize(program).unwrap_or_else(|_| program.to_path_buf());
    let Some(phdr) = entry(3) else {
        return out;
    };
    if let Some(headers) = std::fs::read(&program)
        .ok()
        .as_deref()
        .and_then(Phdrs::parse)
    {
        let bias = phdr.wrapping_sub(headers.phdr_vaddr());
        out.extend(headers.mappings(bias, pid, &program));
    }
    if let (Some(base), Some(interp)) = (entry(7).filter(|&b| b != 0), interpreter_of(&program))
        && let Some(headers) = std::fs::read(&interp)
            .ok()
            .as_deref()
            .and_then(Phdrs::parse)
    {
        // The interpreter is a shared object linked at 0: its bias is its base.
        let first = headers
            .segments
            .iter()
            .find(|h| h.kind == object::elf::PT_LOAD)
            .map_or(0, |h| h.vaddr - h.vaddr % 4096);
        out.extend(headers.mappings(base.wrapping_sub(first), pid, &interp));
    }
    out
}

impl Recorded {
    /// The loader's view of the recording's first process (see [`LoaderView`]) from the ELF
    /// files `elfs` placed at their recorded mappings ([`MmapImage::elfs`]); `None` if the
    /// program is not among them.
    pub fn loader_view(&self, elfs: &[crate::image::elf::LoadedElf]) -> Option<LoaderView> {
        let program = self.launch.as_ref()?.program.clone();
        let program = std::fs::canonicalize(&program).unwrap_or(program);
        let same = |p: &Path| std::fs::canonicalize(p).is_ok_and(|c| c == program);
        let exe = elfs.iter().find(|e| same(&e.path))?;
        let headers = Phdrs::parse(&exe.bytes)?;
        let phdr = headers.phdr_vaddr();
        let interp = interpreter_of(&program);
        let base = interp
            .as_deref()
            .and_then(|i| {
                elfs.iter()
                    .find(|e| std::fs::canonicalize(&e.path).is_ok_and(|c| c == i))
            })
            .map_or(0, |e| e.bias);
        let mut auxv = Vec::new();
        for (k, v) in [
            (3u64, exe.bias.wrapping_add(phdr)),
            (4, headers.phent),
            (5, headers.segments.len() as u64),
            (6, 4096),
            (7, base),
            (9, exe.bias.wrapping_add(headers.entry)),
            (0, 0),
        ] {
            auxv.extend_from_slice(&k.to_le_bytes());
            auxv.extend_from_slice(&v.to_le_bytes());
        }
        let objects = elfs
            .iter()
            .filter(|e| !same(&e.path))
            .map(|e| {
                let dynamic = Phdrs::parse(&e.bytes)
                    .and_then(|h| {
                        h.segments
                            .iter()
                            .find(|h| h.kind == object::elf::PT_DYNAMIC)
                            .copied()
                    })
                    .map_or(0, |h| e.bias.wrapping_add(h.vaddr));
                (e.path.clone(), e.bias, dynamic)
            })
            .collect();
        Some(LoaderView { auxv, objects })
    }
}

/// Appends to `trace` what the tail file says was not written when the thread stopped, the
/// thread's end stamped with the clock `now` when known; returns a description of what was done.
pub fn complete_stream(
    trace: &mut Vec<u8>,
    tail: &TailState,
    counters: Option<&[u8]>,
    now: Option<u64>,
    image: &Image,
) -> String {
    use crate::capture::soft::classify::decode_insn;
    use crate::packet::{Encoder, IpKind, Packet, Tnt, encode_packet};
    if tail.file_offset == trace.len() as u64 {
        trace.extend_from_slice(&tail.bytes);
    }
    let mut out = Vec::new();
    if tail.tnt.1 > 0 {
        let _ = encode_packet(
            &Packet::ShortTnt(Tnt::new(tail.tnt.0, tail.tnt.1)),
            &mut out,
        );
    }
    let mut note = String::from("stream completed from its tail file");
    if let Some((start, insns, counter, snapshot)) = tail.in_flight {
        let reached = usize::try_from(counter)
            .ok()
            .and_then(|i| counters?.get(i * 8..i * 8 + 8))
            .and_then(|b| b.try_into().ok())
            .map(|b: [u8; 8]| u64::from_ne_bytes(b).wrapping_sub(snapshot))
            .filter(|&d| d < u64::from(insns));
        // Without the counter the block is not counted at all.
        let d = reached.unwrap_or(0);
        let mut ip = start;
        for _ in 0..d {
            let mut b = [0u8; 15];
            let n = image.read(ip, &mut b);
            match decode_insn(ip, &b[..n]) {
                Some(i) => ip = i.nlip(),
                None => break,
            }
        }
        // A fresh encoder does not know Last IP: it writes full IPs, valid anywhere.
        let mut enc = Encoder::new();
        if trace.is_empty() && out.is_empty() && d > 0 {
            // The thread never wrote anything: start the stream.
            enc.psb(&mut out);
            let _ = encode_packet(&Packet::PsbEnd, &mut out);
        }
        if !tail.tracing && d > 0 {
            let _ = encode_packet(
                &Packet::ModeExec {
                    csl: true,
                    csd: false,
                    iflag: false,
                },
                &mut out,
            );
            let _ = enc.ip_packet(IpKind::TipPge, Some(start), &mut out);
        }
        if tail.tracing || d > 0 {
            output::stamp_end(now, &mut out);
            let _ = enc.ip_packet(IpKind::Fup, Some(ip), &mut out);
            let _ = enc.ip_packet(IpKind::TipPgd, None, &mut out);
        }
        note = match reached {
            Some(d) => format!(
                "stream completed from its tail file: stopped at instruction {d} of the block at \
                 {start:#x} ({ip:#x})"
            ),
            None => format!(
                "stream completed from its tail file: the block at {start:#x} that was running \
                 is not counted (where it stopped is unknown)"
            ),
        };
    }
    trace.extend_from_slice(&out);
    note
}

/// The `PT_INTERP` of an ELF file, canonicalized.
pub fn interpreter_of(program: &Path) -> Option<PathBuf> {
    let data = std::fs::read(program).ok()?;
    let elf = object::read::elf::ElfFile64::<object::Endianness>::parse(&*data).ok()?;
    use object::read::elf::ProgramHeader;
    let endian = elf.endian();
    for ph in elf.elf_program_headers() {
        if ph.p_type(endian) == object::elf::PT_INTERP {
            let bytes = ph.data(endian, &*data).ok()?;
            let s = std::str::from_utf8(bytes).ok()?.trim_end_matches('\0');
            return std::fs::canonicalize(s).ok();
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowConfig;
    use crate::history::ThreadClock;
    use crate::image::Section;

    /// A killed thread's stream, its block at 0x1000 (three `nop`s) two instructions in:
    /// completed with the clock at the death, its last run lasted until then.
    #[test]
    fn a_killed_threads_stream_ends_with_the_clock() {
        let mut img = Image::new();
        img.add(Section::new(0x1000, vec![0x90; 4], "nops"))
            .unwrap();
        let completed = |now| {
            let (mut trace, tail) = output::started_stream(Some(100), 3, 0);
            let counters = 2u64.to_ne_bytes();
            complete_stream(&mut trace, &tail, Some(&counters), now, &img);
            ThreadClock::from_trace(&trace, &img, &FlowConfig::default())
        };
        let lasted = |c: &ThreadClock| {
            let last = c.runs().len() - 1;
            c.end_time() == 500 || c.run_until(last) == Some(500)
        };
        let c = completed(Some(500));
        assert_eq!((c.len(), c.stop_ip()), (2, Some(0x1002)));
        assert!(lasted(&c), "{:?}", c.runs());
        assert!(!lasted(&completed(None)));
    }
}
