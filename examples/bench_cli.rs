//! End-to-end CLI benchmark: `ptrewind decode --format ips` (and `ips-bin`) against a
//! ptxed-style libipt driver (`examples/c/ptxed_ips.c`, built here with `cc -O2 … -lipt`) that
//! writes every instruction address as hex text, or as a binary little-endian u64, on every
//! corpus trace that has code images. Same files, same run, interleaved repetitions.
//!
//! ```text
//! cargo build --release --bin ptrewind --example bench_cli
//! cargo build --release -p ptrewind-qemu-plugin     # for the recorded program runs
//! target/release/examples/bench_cli [--reps N] [--trace NAME]... [--ptrewind PATH]
//!                                   [--before PATH] [--no-ips-bin] [--dir DIR]
//!                                   [--programs | --no-programs]
//! ```
//!
//! Each process's cost is its CPU time (user + system, from `wait4`'s rusage), the fair measure
//! on a shared machine; wall time is printed alongside. The minimum over `--reps` (default 3)
//! interleaved runs is kept. Output goes to /dev/null, so the writes are counted but no disk.
//! First the floor of any process is timed the same way: an empty C program, linked dynamically
//! and statically, and `ptrewind --version`. Rows marked † are traces where 10× the driver's
//! hex run is below the empty static program's time, so that no process can reach it here.
//! Before timing, both sides run once into a pipe and their instruction counts are printed
//! (ptrewind: the lines that are not events), so a mismatch is visible.
//! `--ptrewind PATH`: the binary to time (default: `ptrewind` next to this example's directory,
//! i.e. `target/release/ptrewind`). `--before PATH`: another ptrewind binary, timed with
//! `--format ips` too (e.g. a build of the previous commit), for a before/after in one run.
//! Both are timed from copies made at the start of the run (see `fresh_copy`).
//! `--no-ips-bin`: skip `--format ips-bin` (binaries older than that format). `--dir DIR`: write
//! the inputs and the driver under DIR (kept, for profiling one command) instead of a temporary
//! directory; `--reps 0` then only writes them and prints each trace's commands.
//!
//! After the corpus traces come whole runs of small real programs (`qemu/ls`, `qemu/sed`,
//! `qemu/sort`: `tests/support/programs.rs`, 0.5–3 M instructions through ld.so and libc),
//! recorded at start under QEMU with ptrewind's plugin (found beside the ptrewind binary; build
//! it with `cargo build --release -p ptrewind-qemu-plugin`) into the temporary directory: the
//! main thread's PT stream and the recorded code mappings as raw files. Skipped, with a
//! message, when `qemu-x86_64` is not installed. `--programs`: only these (no corpus);
//! `--no-programs`: only the corpus; `--trace qemu/ls` selects one like a corpus trace.

#[path = "../tests/support/mod.rs"]
mod support;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use ptrewind::capture::qemu::recording::{PLUGIN_FILE_NAME, find_plugin};
use support::corpus::CliInputs;

/// One timed command.
struct Variant {
    label: &'static str,
    program: PathBuf,
    args: Vec<OsString>,
}

/// Runs `v` with stdout to /dev/null; returns (CPU seconds, wall seconds).
// The child is reaped by `wait4` (for its rusage), not by `Child::wait`.
#[allow(clippy::zombie_processes)]
fn time_run(v: &Variant) -> (f64, f64) {
    let devnull = std::fs::File::create("/dev/null").expect("/dev/null");
    let started = Instant::now();
    let child = Command::new(&v.program)
        .args(&v.args)
        .stdout(devnull)
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let pid = child.id() as libc::pid_t;
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value of this plain C struct.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet waited for (`child` is never waited on through std);
    // `status` and `usage` are valid out-pointers.
    let r = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let wall = started.elapsed().as_secs_f64();
    assert_eq!(r, pid, "wait4 failed");
    let exited = libc::WIFEXITED(status) && libc::WEXITSTATUS(status) <= 2;
    assert!(exited, "{} failed: status {status:#x}", v.label);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    (tv(usage.ru_utime) + tv(usage.ru_stime), wall)
}

/// Runs `v` into a pipe and returns its stdout and stderr.
fn capture(v: &Variant) -> (Vec<u8>, String) {
    let out = Command::new(&v.program)
        .args(&v.args)
        .output()
        .expect("run");
    (
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn default_ptrewind() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    // target/release/examples/bench_cli -> target/release/ptrewind
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("ptrewind"))
        .expect("target dir")
}

fn build_driver(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c/ptxed_ips.c");
    let exe = dir.join("ptxed_ips");
    let _ = std::fs::remove_file(&exe);
    let st = Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lipt")
        .status()
        .expect("cc");
    assert!(
        st.success(),
        "building {} failed (libipt-dev?)",
        src.display()
    );
    exe
}

/// The least CPU time of `reps` runs of `v`, in seconds.
fn min_cpu(v: &Variant, reps: usize) -> f64 {
    (0..reps).map(|_| time_run(v).0).fold(f64::MAX, f64::min)
}

/// The start-up floor of any process on this machine: an empty C program (`int main(void) {
/// return 0; }`), linked dynamically and, when the C library's archive is installed, statically;
/// returns (dynamic, static) as CPU seconds, minimum over `reps` runs.
fn empty_process_floors(dir: &Path, reps: usize) -> (f64, Option<f64>) {
    let src = dir.join("empty.c");
    // Files left by an earlier run with `--dir` are replaced, never written through.
    let _ = std::fs::remove_file(&src);
    std::fs::write(&src, "int main(void) { return 0; }\n").expect("write empty.c");
    let build = |name: &str, extra: &[&str]| {
        let exe = dir.join(name);
        let _ = std::fs::remove_file(&exe);
        let ok = Command::new("cc")
            .args(["-O2"])
            .args(extra)
            .arg("-o")
            .arg(&exe)
            .arg(&src)
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        ok.then_some(exe)
    };
    let time = |exe: PathBuf| {
        let v = Variant {
            label: "empty",
            program: exe,
            args: Vec::new(),
        };
        min_cpu(&v, reps)
    };
    let dynamic = time(build("empty-dynamic", &[]).expect("cc could not build an empty program"));
    (dynamic, build("empty-static", &["-static"]).map(time))
}

/// `bin` copied to `dir/bin/name`, the copy that is timed. A binary's start-up depends on how
/// its file sits in the page cache: the same bytes copied half an hour apart started 0.1 ms and
/// 15 page faults apart on the shortest traces (docs/benchmarks.md, session 23). Copies made
/// in the same second put `--ptrewind` and `--before` on the same footing.
fn fresh_copy(bin: &Path, dir: &Path, name: &str) -> PathBuf {
    let bins = dir.join("bin");
    std::fs::create_dir_all(&bins).expect("bin dir");
    let copy = bins.join(name);
    // A copy left by an earlier run with `--dir` is replaced, never written through.
    let _ = std::fs::remove_file(&copy);
    std::fs::copy(bin, &copy).unwrap_or_else(|e| panic!("copying {}: {e}", bin.display()));
    copy
}

/// What every row shares: the binaries, the driver and the options.
struct Bench {
    ours: PathBuf,
    before: Option<PathBuf>,
    driver: PathBuf,
    ips_bin: bool,
    reps: usize,
    /// An empty static C program's CPU time (see `empty_process_floors`).
    floor: Option<f64>,
}

impl Bench {
    /// Times one trace (`pt` written as `files.pt`, images as `files.raws`, under `dir`) and
    /// prints its row; `qemu_insns`: the recorder's own count, printed beside the decoders'.
    fn run(&self, name: &str, pt: &[u8], files: &CliInputs, dir: &Path, qemu_insns: Option<u64>) {
        // libipt rejects the "PSB+ FUP immediately followed by TIP.PGE to the same IP" form
        // (see tests/support/libipt.rs); it gets the masked trace, as in bench_flow.
        let (masked, _) = support::libipt::mask_psb_fup_before_pge(pt);
        let masked_path = dir.join("trace.masked.pt");
        std::fs::write(&masked_path, &masked).expect("write");
        let mut drv_args: Vec<OsString> = vec![
            "hex".into(),
            masked_path.into(),
            files.bits.to_string().into(),
            files.cpu.clone().unwrap_or_else(|| "-".into()).into(),
        ];
        for (p, base) in &files.raws {
            let mut s = p.clone().into_os_string();
            s.push(format!(":{base:#x}"));
            drv_args.push(s);
        }
        let mut drv_bin_args = drv_args.clone();
        drv_bin_args[0] = "bin".into();
        let decode = |bin: &Path, format: &str| {
            let mut a: Vec<OsString> = vec!["decode".into()];
            a.extend(files.decode_args());
            a.push("--format".into());
            a.push(format.into());
            (bin.to_path_buf(), a)
        };
        let mut variants = Vec::new();
        let (p, a) = decode(&self.ours, "ips");
        variants.push(Variant {
            label: "ips",
            program: p,
            args: a,
        });
        if self.ips_bin {
            let (p, a) = decode(&self.ours, "ips-bin");
            variants.push(Variant {
                label: "ips-bin",
                program: p,
                args: a,
            });
        }
        variants.push(Variant {
            label: "hex",
            program: self.driver.clone(),
            args: drv_args,
        });
        variants.push(Variant {
            label: "bin",
            program: self.driver.clone(),
            args: drv_bin_args,
        });
        if let Some(b) = &self.before {
            let (p, a) = decode(b, "ips");
            variants.push(Variant {
                label: "before",
                program: p,
                args: a,
            });
        }
        if self.reps == 0 {
            for v in &variants {
                let a: Vec<String> = v
                    .args
                    .iter()
                    .map(|a| a.to_string_lossy().into_owned())
                    .collect();
                println!(
                    "{name} {}: {} {}",
                    v.label,
                    v.program.display(),
                    a.join(" ")
                );
            }
            return;
        }
        // Counts, untimed.
        let (text, _) = capture(&variants[0]);
        let ours_insns = text
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty() && l[0] != b'[')
            .count();
        let hex = variants.iter().find(|v| v.label == "hex").expect("hex");
        let (_, err) = capture(hex);
        let ipt_insns: u64 = err
            .split_whitespace()
            .skip_while(|w| *w != "insns")
            .nth(1)
            .and_then(|w| w.parse().ok())
            .unwrap_or(0);
        let qemu = match qemu_insns {
            Some(n) => format!(" (QEMU {n})"),
            None => String::new(),
        };
        let mut best: Vec<(f64, f64)> = vec![(f64::MAX, f64::MAX); variants.len()];
        for _ in 0..self.reps {
            for (k, v) in variants.iter().enumerate() {
                let (cpu, wall) = time_run(v);
                best[k].0 = best[k].0.min(cpu);
                best[k].1 = best[k].1.min(wall);
            }
        }
        let get = |label: &str| {
            variants
                .iter()
                .position(|v| v.label == label)
                .map(|k| best[k])
        };
        let cell = |x: Option<(f64, f64)>| match x {
            Some((c, w)) => format!("{:.1} ms ({:.1})", c * 1e3, w * 1e3),
            None => "—".to_string(),
        };
        let ratio = |num: Option<(f64, f64)>, den: Option<(f64, f64)>| match (num, den) {
            (Some(n), Some(d)) => format!("**{:.1}×**", n.0 / d.0.max(1e-6)),
            _ => "—".to_string(),
        };
        let (ips, ipsb, hexr, bin, bef) = (
            get("ips"),
            get("ips-bin"),
            get("hex"),
            get("bin"),
            get("before"),
        );
        // Marked when 10× the driver is below the start-up of an empty process.
        let below = match (self.floor, hexr) {
            (Some(f), Some((h, _))) if h < 10.0 * f => " †",
            _ => "",
        };
        println!(
            "| {name}{below} | {ours_insns} / {ipt_insns}{qemu} | {} | {} | {} | {} | {}{} | {} | {} |",
            cell(ips),
            cell(ipsb),
            cell(hexr),
            cell(bin),
            if self.before.is_some() {
                format!("{} | {} | ", cell(bef), ratio(bef, ips))
            } else {
                String::new()
            },
            ratio(hexr, ips),
            ratio(bin, ips),
            ratio(bin, ipsb),
        );
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut reps = 3usize;
    let mut only: Vec<String> = Vec::new();
    let mut ours = default_ptrewind();
    let mut before: Option<PathBuf> = None;
    let mut ips_bin = true;
    let mut keep: Option<PathBuf> = None;
    let (mut corpus, mut programs) = (true, true);
    let mut i = 0;
    while i < args.len() {
        let val = |i: usize| args.get(i + 1).cloned().unwrap_or_default();
        match args[i].as_str() {
            "--reps" => {
                reps = val(i).parse().unwrap_or(3);
                i += 1;
            }
            "--trace" => {
                only.push(val(i));
                i += 1;
            }
            "--ptrewind" => {
                ours = PathBuf::from(val(i));
                i += 1;
            }
            "--before" => {
                before = Some(PathBuf::from(val(i)));
                i += 1;
            }
            "--no-ips-bin" => ips_bin = false,
            "--programs" => corpus = false,
            "--no-programs" => programs = false,
            "--dir" => {
                keep = Some(PathBuf::from(val(i)));
                i += 1;
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
        i += 1;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let work = keep.clone().unwrap_or_else(|| tmp.path().to_path_buf());
    std::fs::create_dir_all(&work).unwrap_or_else(|e| panic!("creating {}: {e}", work.display()));
    let driver = build_driver(&work);
    // The plugin is looked for beside the binary given, not beside its copy.
    let plugin = find_plugin(&ours).or_else(|| find_plugin(&default_ptrewind()));
    let given = ours.clone();
    let ours = fresh_copy(&ours, &work, "ptrewind");
    let before = before.map(|b| fresh_copy(&b, &work, "ptrewind-before"));
    println!(
        "ptrewind {}; driver {}; {} reps; CPU ms = user+sys of the process, min over reps",
        given.display(),
        driver.display(),
        reps
    );
    // The floors (not with `--reps 0`, which only writes the inputs and prints commands).
    let mut stat = None;
    if reps > 0 {
        let floor_reps = reps.max(20);
        let dynamic;
        (dynamic, stat) = empty_process_floors(&work, floor_reps);
        let version = Variant {
            label: "version",
            program: ours.clone(),
            args: vec!["--version".into()],
        };
        let version = min_cpu(&version, floor_reps);
        println!(
            "process floors, CPU ms (min over {floor_reps}): empty C program {:.2} (dynamic), {} \
             (static); `ptrewind --version` {:.2}",
            dynamic * 1e3,
            stat.map_or("—".to_string(), |s| format!("{:.2}", s * 1e3)),
            version * 1e3
        );
        if let Some(s) = stat {
            println!(
                "†: the driver's hex run takes less than 10× the empty static program ({:.2} ms): \
                 no process can decode that trace at 10× the driver on this machine",
                10.0 * s * 1e3
            );
        }
    }
    println!(
        "| trace | insns (ptrewind / libipt) | ptrewind ips | ptrewind ips-bin | libipt hex | libipt bin | {}hex ÷ ips | bin ÷ ips | bin ÷ ips-bin |",
        if before.is_some() {
            "before ips | before ÷ ips | "
        } else {
            ""
        }
    );
    println!(
        "|---|---|---:|---:|---:|---:|{}---:|---:|---:|",
        if before.is_some() { "---:|---:|" } else { "" }
    );
    let bench = Bench {
        ours,
        before,
        driver,
        ips_bin,
        reps,
        floor: stat,
    };
    let mut cases = 0usize;
    if corpus {
        match support::corpus::corpus_dir() {
            None => eprintln!("corpus not found (set PTREWIND_CORPUS): corpus traces skipped"),
            Some(root) => {
                for name in support::corpus::trace_names(&root) {
                    if !only.is_empty() && !only.contains(&name) {
                        continue;
                    }
                    let t = match support::corpus::load_trace(&root, &name) {
                        Ok(t) if t.has_images() => t,
                        Ok(_) => continue,
                        Err(e) => {
                            eprintln!("{e}");
                            continue;
                        }
                    };
                    let dir = work.join(name.replace('/', "_"));
                    std::fs::create_dir_all(&dir).expect("mkdir");
                    let files = support::corpus::write_cli_inputs(&t, &dir).expect("write inputs");
                    bench.run(&name, &t.pt, &files, &dir, None);
                    cases += 1;
                }
            }
        }
    }
    if programs {
        let wanted: Vec<&str> = support::programs::PROGRAMS
            .iter()
            .copied()
            .filter(|p| only.is_empty() || only.iter().any(|o| o == p))
            .collect();
        if wanted.is_empty() {
        } else if !support::cbuild::have("qemu-x86_64") {
            println!(
                "qemu-x86_64 not installed (package qemu-user): the recorded program runs \
                 ({}) are skipped",
                wanted.join(", ")
            );
        } else if let Some(plugin) = plugin {
            for name in wanted {
                let dir = work.join(name.replace('/', "_"));
                let t = match support::programs::record_program(name, &plugin, &dir) {
                    Ok(t) => t,
                    Err(e) => {
                        println!("{name}: not recorded: {e}");
                        continue;
                    }
                };
                let files = support::corpus::write_raw_inputs(&t.pt, &t.images, &dir)
                    .expect("write inputs");
                println!(
                    "{name}: `{}` recorded: {} threads, main thread {} instructions (QEMU's count), \
                     {} bytes of PT, {} image ranges",
                    t.command,
                    t.threads,
                    t.qemu_insns,
                    t.pt.len(),
                    files.raws.len()
                );
                bench.run(name, &t.pt, &files, &dir, Some(t.qemu_insns));
                cases += 1;
            }
        } else {
            println!(
                "the QEMU plugin ({PLUGIN_FILE_NAME}) was not found beside {}: build it with \
                 `cargo build --release -p ptrewind-qemu-plugin`; program runs skipped",
                given.display()
            );
        }
    }
    if cases == 0 {
        eprintln!("nothing was measured");
        std::process::exit(2);
    }
}
