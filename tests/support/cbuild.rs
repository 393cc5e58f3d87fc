//! Building the C programs the integration tests run, and reading their symbols: one place
//! for the compiler invocation and its failure report, and for `nm` lookups.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// True if `tool --version` runs and succeeds (for tests that skip without a debugger).
pub fn have(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Runs the C compiler `compiler` with `args`; panics with its stderr if it fails.
pub fn cc_with<I, S>(compiler: &str, args: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<_> = args.into_iter().map(|a| a.as_ref().to_owned()).collect();
    let out = Command::new(compiler)
        .args(&args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        out.status.success(),
        "{compiler} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `cc` with `args`; panics with its stderr if it fails.
pub fn cc<I, S>(args: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    cc_with("cc", args);
}

/// Writes `src` to `dir/NAME.c` and compiles it with `compiler` into `dir/NAME`:
/// `compiler FLAGS -o dir/NAME dir/NAME.c AFTER` (libraries go in `after`).
pub fn compile_source(
    compiler: &str,
    dir: &Path,
    name: &str,
    src: &str,
    flags: &[&str],
    after: &[&str],
) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).expect("write C source");
    let exe = dir.join(name);
    let mut args: Vec<&OsStr> = flags.iter().map(OsStr::new).collect();
    args.extend([OsStr::new("-o"), exe.as_os_str(), c.as_os_str()]);
    args.extend(after.iter().map(OsStr::new));
    cc_with(compiler, args);
    exe
}

/// The address of symbol `name` in `exe`'s symbol table, read with `nm` (the link-time
/// address: the run-time one for a non-PIE executable).
pub fn nm_symbol(exe: &Path, name: &str) -> u64 {
    let out = Command::new("nm").arg(exe).output().expect("nm");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| {
            let mut f = l.split_whitespace();
            let addr = f.next()?;
            let _kind = f.next()?;
            (f.next()? == name).then(|| u64::from_str_radix(addr, 16).ok())?
        })
        .unwrap_or_else(|| panic!("no symbol {name} in {}", exe.display()))
}

/// The path of `examples/c/NAME` in the crate.
pub fn example_source(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("examples/c")
        .join(name)
}

/// 1-based line number of the first line of `examples/c/FILE` containing `marker`.
pub fn line_of(file: &str, marker: &str) -> usize {
    let text = std::fs::read_to_string(example_source(file)).unwrap();
    text.lines()
        .position(|l| l.contains(marker))
        .unwrap_or_else(|| panic!("marker {marker:?} not in {file}"))
        + 1
}

/// Compiles `examples/c/NAME.c` into `dir/NAME` with `cc -g -O0 FLAGS`.
pub fn build_example(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    let exe = dir.join(name);
    let src = example_source(&format!("{name}.c"));
    let mut args: Vec<&OsStr> = ["-g", "-O0"].iter().chain(flags).map(OsStr::new).collect();
    args.extend([OsStr::new("-o"), exe.as_os_str(), src.as_os_str()]);
    cc(args);
    exe
}
