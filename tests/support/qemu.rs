//! QEMU backend helpers shared by the tests: whether `qemu-x86_64` is installed, the plugin,
//! a test-mode recording (the plugin's per-instruction log as ground truth) and that log with
//! QEMU's re-executions of REP string instructions folded.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use ptrewind::capture::qemu::recording::find_plugin;
use ptrewind::capture::qemu::{QemuConfig, QemuRecording, Recorded};
use ptrewind::capture::soft::classify::decode_insn;
use ptrewind::image::Image;

/// Whether `qemu-x86_64` is installed (says why a test is skipped when not).
pub fn qemu_available() -> bool {
    if super::cbuild::have("qemu-x86_64") {
        return true;
    }
    eprintln!("qemu-x86_64 not installed (package qemu-user): skipping");
    false
}

/// The plugin built with the workspace.
pub fn plugin() -> PathBuf {
    let Some(exe) = option_env!("CARGO_BIN_EXE_ptrewind") else {
        panic!("the ptrewind binary is only known to integration tests");
    };
    find_plugin(Path::new(exe)).expect("the QEMU plugin is built with the workspace")
}

/// Runs `exe` under QEMU with the plugin in test mode, recording into `dir`; returns the
/// recording and the exit status.
pub fn record_into(
    dir: &Path,
    exe: &Path,
    args: &[&str],
    precise: bool,
) -> (Recorded, std::process::ExitStatus) {
    let mut cfg = QemuConfig::new(plugin());
    cfg.log_insns = true;
    cfg.precise = precise;
    cfg.dir = Some(dir.to_path_buf());
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    let mut rec = QemuRecording::spawn_with(&cfg, exe, &args, |c| {
        c.stdout(Stdio::null()).stderr(Stdio::null());
    })
    .expect("spawn qemu");
    let status = rec.wait().expect("qemu ran the plugin");
    let recorded = rec.read().expect("read recording");
    (recorded, status)
}

/// [`record_into`] a temporary directory, removed once read.
pub fn record(exe: &Path, args: &[&str], precise: bool) -> (Recorded, std::process::ExitStatus) {
    let dir = tempfile::tempdir().expect("tempdir");
    record_into(&dir.path().join("rec"), exe, args, precise)
}

/// The plugin's log with QEMU's re-executions of a REP string instruction (one per iteration)
/// folded into one execution, as the architecture counts them.
pub fn fold_rep(log: &[u64], image: &Image) -> Vec<u64> {
    let mut out: Vec<u64> = Vec::with_capacity(log.len());
    for &ip in log {
        if out.last() == Some(&ip) {
            let mut b = [0u8; 15];
            let n = image.read(ip, &mut b);
            if decode_insn(ip, &b[..n]).is_some_and(|i| i.rep_string) {
                continue;
            }
        }
        out.push(ip);
    }
    out
}

/// `source` compiled with `cc flags` as `name` in a fresh temporary directory, for a live QEMU
/// session with GDB; `None` (the test is skipped, with a message) when `qemu-x86_64` or `gdb`
/// is not installed.
pub fn live_program(
    name: &str,
    source: &str,
    flags: &[&str],
) -> Option<(tempfile::TempDir, PathBuf)> {
    if !super::cbuild::have("qemu-x86_64") || !super::cbuild::have("gdb") {
        eprintln!("skipped: qemu-x86_64 (package qemu-user) or gdb not installed");
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let exe = super::cbuild::compile_source("cc", dir.path(), name, source, flags, &[]);
    Some((dir, exe))
}

/// A live QEMU recording server (`record --backend qemu`) of `exe args`, listening on a free
/// loopback port, its recording directory beside `exe`; `extra`: more `record` options.
pub fn live_server(exe: &Path, args: &[&str], extra: &[&str]) -> super::gdb::Server {
    super::gdb::Server::spawn(&mut live_server_command(exe, args, extra))
}

/// The `ptrewind` command [`live_server`] runs (to add environment variables first).
pub fn live_server_command(exe: &Path, args: &[&str], extra: &[&str]) -> std::process::Command {
    let mut cli: Vec<OsString> = ["record", "--backend", "qemu", "--listen", "127.0.0.1:0"]
        .iter()
        .map(Into::into)
        .collect();
    cli.push("--qemu-plugin".into());
    cli.push(plugin().into());
    cli.extend(extra.iter().map(Into::into));
    cli.push("--trace-dir".into());
    cli.push(exe.with_file_name("recording").into());
    cli.push("--".into());
    cli.push(exe.into());
    cli.extend(args.iter().map(Into::into));
    let mut cmd = super::gdb::ptrewind();
    cmd.args(cli);
    cmd
}
