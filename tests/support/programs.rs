//! Whole runs of small real programs — `ls -l`, `sed`, `sort`, dynamically linked, from the
//! loader's first instruction through ld.so and libc to `exit_group` — recorded under QEMU with
//! ptrewind's plugin, as inputs for a command-line decoder (`ptrewind decode`, the ptxed-style
//! libipt driver of `examples/bench_cli.rs`). These are the "ls/sed/sort" traces of issue 17,
//! sized to 1.3–1.6 M instructions each: the size where start-up and per-run costs decide the
//! end-to-end figure. Their inputs are generated (nothing of the machine is read but the
//! programs, their libraries and, for `ls`, `/etc`), so the counts depend on little else.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use ptrewind::capture::qemu::{QemuConfig, QemuRecording};

use super::libipt::ImageSection;

/// The names of the recorded programs, as `bench_cli` lists them.
pub const PROGRAMS: &[&str] = &["qemu/ls", "qemu/sed", "qemu/sort"];

/// One recorded program run: the main thread's PT stream and the code it ran.
#[derive(Clone, Debug)]
pub struct ProgramTrace {
    /// e.g. `qemu/ls`.
    pub name: String,
    /// The command that was recorded (for messages and docs).
    pub command: String,
    /// The main thread's PT stream.
    pub pt: Vec<u8>,
    /// The recorded code mappings (the program, ld.so, libc, ...) at the addresses QEMU placed
    /// them, sorted, non-overlapping.
    pub images: Vec<ImageSection>,
    /// Instructions the plugin counted on the main thread.
    pub qemu_insns: u64,
    /// Number of threads recorded.
    pub threads: usize,
}

/// Deterministic pseudo-random words (xorshift), `n` lines of 1–6 words.
fn text_lines(n: usize, seed: u64) -> String {
    const WORDS: &[&str] = &[
        "alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india",
        "juliet", "kilo", "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra",
        "tango", "uniform", "victor", "whiskey", "xray", "yankee", "zulu", "0x1f", "42", "#",
        "the", "quick", "brown", "fox",
    ];
    let mut x = seed | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let mut s = String::new();
    for _ in 0..n {
        let words = 1 + next() % 6;
        for w in 0..words {
            if w > 0 {
                s.push(' ');
            }
            s.push_str(WORDS[(next() % WORDS.len() as u64) as usize]);
        }
        s.push('\n');
    }
    s
}

/// The program and arguments of `name`, with any input file written under `dir`.
pub fn command(name: &str, dir: &Path) -> Result<(PathBuf, Vec<OsString>), String> {
    let write = |file: &str, text: String| -> Result<PathBuf, String> {
        let p = dir.join(file);
        std::fs::File::create(&p)
            .and_then(|mut f| f.write_all(text.as_bytes()))
            .map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(p)
    };
    match name {
        // Every entry of /etc: stat, the user and group names through NSS, times, columns.
        "qemu/ls" => Ok(("/bin/ls".into(), vec!["-l".into(), "/etc".into()])),
        "qemu/sed" => {
            let input = write("sed.txt", text_lines(130, 0x5eed))?;
            Ok((
                "/bin/sed".into(),
                vec![
                    "-e".into(),
                    "s/[aeiou][a-z]*/<&>/g".into(),
                    "-e".into(),
                    "/^#/d".into(),
                    input.into(),
                ],
            ))
        }
        "qemu/sort" => {
            let input = write("sort.txt", text_lines(1200, 0x50f7))?;
            Ok((
                "/usr/bin/sort".into(),
                vec!["--parallel=1".into(), input.into()],
            ))
        }
        _ => Err(format!("unknown program {name:?}")),
    }
}

/// Records `name` (one of [`PROGRAMS`]) under QEMU with `plugin` into `dir` (created, must not
/// exist), in the C locale, its output discarded; reads back the main thread's stream and the
/// recorded code.
pub fn record_program(name: &str, plugin: &Path, dir: &Path) -> Result<ProgramTrace, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (exe, args) = command(name, dir)?;
    let mut cfg = QemuConfig::new(plugin);
    cfg.dir = Some(dir.join("rec"));
    let mut rec = QemuRecording::spawn_with(&cfg, &exe, &args, |c| {
        c.stdout(Stdio::null())
            .stderr(Stdio::null())
            .env("LC_ALL", "C")
            .env("TZ", "UTC");
    })
    .map_err(|e| format!("{name}: {e}"))?;
    let status = rec.wait().map_err(|e| format!("{name}: {e}"))?;
    if !status.success() {
        return Err(format!("{name}: {} exited with {status}", exe.display()));
    }
    let recorded = rec.read().map_err(|e| format!("{name}: {e}"))?;
    let main = recorded
        .threads
        .first()
        .ok_or_else(|| format!("{name}: no thread recorded"))?;
    let (image, missing) = recorded.image().map_err(|e| format!("{name}: {e}"))?;
    if !missing.is_empty() {
        return Err(format!(
            "{name}: recorded mappings without a file: {missing:?}"
        ));
    }
    let mut images = ImageSection::all_of(&image);
    images.sort_by_key(|s| s.addr);
    let command = std::iter::once(exe.display().to_string())
        .chain(args.iter().map(|a| {
            let a = a.to_string_lossy();
            // The generated input lives in a temporary directory: name it by file name.
            match Path::new(&*a).strip_prefix(dir) {
                Ok(rel) => rel.display().to_string(),
                Err(_) => a.into_owned(),
            }
        }))
        .collect::<Vec<_>>()
        .join(" ");
    Ok(ProgramTrace {
        name: name.to_string(),
        command,
        pt: main.trace.clone(),
        images,
        qemu_insns: main.meta.as_ref().map_or(0, |m| m.tracer.instructions),
        threads: recorded.threads.len(),
    })
}
