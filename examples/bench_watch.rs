//! Measures reverse-continue to a write watchpoint: ptrewind's native watchpoints (`Z2`, one
//! backward walk over the state log) against GDB's software watchpoints (`set
//! can-use-hw-watchpoints 0`: GDB steps backwards one instruction per `bs` round trip and
//! re-reads the watched value after each).
//!
//! ```text
//! cargo build --bin ptrewind --example bench_watch
//! target/debug/examples/bench_watch [ITERS] [SOFTWARE_ITERS]
//! ```
//!
//! `examples/c/watch.c` is compiled with `cc -g -O0` and recorded by `ptrewind record` (the
//! binary next to this example's directory, or `$PTREWIND`). In each GDB session (batch mode)
//! the program runs to `done()`, `watch total` is set, a first `reverse-continue` goes back to
//! `total -= 4` (a few instructions), and the second one is timed inside GDB (its Python
//! `time.time()` around the command): it goes back over `spin(n)` — about ten instructions per
//! iteration — and the `pipe`/`write`/`read` calls to the write `total *= 3`. `monitor where` before and after gives
//! the distance in instructions. Native runs use `ITERS` (default 100000) and `SOFTWARE_ITERS`
//! (default 10000) iterations; the software watchpoint runs only at `SOFTWARE_ITERS`, since it
//! costs a round trip per instruction. The ratio is taken at equal distance.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// One timed reverse-continue.
struct Timing {
    seconds: f64,
    distance: u64,
    old_new: String,
}

fn ptrewind_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("PTREWIND") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("current exe");
    // target/<profile>/examples/bench_watch -> target/<profile>/ptrewind
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .map(|d| d.join("ptrewind"))
        .expect("target dir");
    assert!(
        bin.exists(),
        "{} not found: cargo build --bin ptrewind (or set PTREWIND)",
        bin.display()
    );
    bin
}

fn build_program(dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/c/watch.c");
    let exe = dir.join("watch");
    let st = Command::new("cc")
        .args(["-g", "-O0", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "cc failed");
    exe
}

/// Starts `ptrewind record --listen 127.0.0.1:0 -- program iters`; returns it and its port.
fn start_server(ptrewind: &Path, program: &Path, iters: u64) -> (Child, u16) {
    use std::io::{BufRead, BufReader};
    let mut child = Command::new(ptrewind)
        .args([
            "record",
            "--backend",
            "ptrace",
            "--listen",
            "127.0.0.1:0",
            "--",
        ])
        .arg(program)
        .arg(iters.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn ptrewind");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("ptrewind exited before listening")
            .expect("read stderr");
        if let Some(rest) = line.split("listening on 127.0.0.1:").nth(1) {
            break rest
                .split(|c: char| !c.is_ascii_digit())
                .next()
                .and_then(|p| p.parse().ok())
                .expect("port");
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    (child, port)
}

fn position(where_line: &str) -> Option<u64> {
    let rest = where_line.split("instruction ").nth(1)?;
    rest.split_whitespace().next()?.parse().ok()
}

fn run(ptrewind: &Path, program: &Path, iters: u64, software: bool) -> Timing {
    let (mut server, port) = start_server(ptrewind, program, iters);
    let mut cmds: Vec<String> = vec![
        format!("target remote 127.0.0.1:{port}"),
        "break done".into(),
        "continue".into(),
    ];
    if software {
        cmds.push("set can-use-hw-watchpoints 0".into());
    }
    cmds.extend(
        [
            "watch total",
            "reverse-continue",
            "monitor where",
            "python import time; gdb._bench_t0 = time.time()",
            "reverse-continue",
            "python print('RC_SECONDS %.6f' % (time.time() - gdb._bench_t0))",
            "monitor where",
            "kill",
        ]
        .map(String::from),
    );
    let mut gdb = Command::new("gdb");
    gdb.args(["-nx", "-batch"]);
    for c in &cmds {
        gdb.arg("-ex").arg(c);
    }
    let out = gdb.arg(program).output().expect("run gdb");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let _ = server.wait_timeout_or_kill(Duration::from_secs(10));
    let seconds = text
        .lines()
        .find_map(|l| l.strip_prefix("RC_SECONDS ")?.trim().parse::<f64>().ok())
        .unwrap_or_else(|| panic!("no timing in GDB output:\n{text}"));
    let wheres: Vec<u64> = text
        .lines()
        .filter(|l| l.contains("instruction ") && l.contains(" of "))
        .filter_map(position)
        .collect();
    let distance = match wheres.as_slice() {
        [a, b, ..] => a.saturating_sub(*b),
        _ => panic!("no monitor where output:\n{text}"),
    };
    let old_new = text
        .lines()
        .filter(|l| l.starts_with("Old value") || l.starts_with("New value"))
        .skip(2)
        .collect::<Vec<_>>()
        .join(", ");
    Timing {
        seconds,
        distance,
        old_new,
    }
}

trait WaitKill {
    fn wait_timeout_or_kill(&mut self, t: Duration) -> std::io::Result<()>;
}

impl WaitKill for Child {
    fn wait_timeout_or_kill(&mut self, t: Duration) -> std::io::Result<()> {
        let end = std::time::Instant::now() + t;
        while std::time::Instant::now() < end {
            if self.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill()?;
        self.wait().map(|_| ())
    }
}

fn report(label: &str, t: &Timing) {
    println!(
        "{label:<34} {:>9} insns back  {:>9.3} s  {:>10.0} insns/s  [{}]",
        t.distance,
        t.seconds,
        t.distance as f64 / t.seconds.max(1e-9),
        t.old_new
    );
}

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let iters = args.first().copied().unwrap_or(100_000);
    let sw_iters = args.get(1).copied().unwrap_or(10_000);
    let ptrewind = ptrewind_binary();
    let dir = std::env::temp_dir().join(format!("ptrewind-bench-watch-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let program = build_program(&dir);

    let native_small = run(&ptrewind, &program, sw_iters, false);
    report("native Z2 (state log)", &native_small);
    let software = run(&ptrewind, &program, sw_iters, true);
    report("GDB software watchpoint (bs steps)", &software);
    if software.distance == native_small.distance {
        println!(
            "ratio at {} instructions: software / native = {:.0}x",
            software.distance,
            software.seconds / native_small.seconds.max(1e-9)
        );
    }
    if iters != sw_iters {
        let native_big = run(&ptrewind, &program, iters, false);
        report("native Z2 (state log)", &native_big);
        // GDB's software watchpoints cost a round trip per instruction: extrapolate linearly.
        let per_insn = software.seconds / software.distance.max(1) as f64;
        println!(
            "at {} instructions: software (extrapolated at {:.1} us/insn) ~{:.1} s vs native \
             {:.3} s: ~{:.0}x",
            native_big.distance,
            per_insn * 1e6,
            per_insn * native_big.distance as f64,
            native_big.seconds,
            per_insn * native_big.distance as f64 / native_big.seconds.max(1e-9)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
