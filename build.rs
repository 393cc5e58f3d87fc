//! Links the `ptrewind` binary's unwinder statically.
//!
//! Rust's standard library takes its unwinder from libgcc_s on `*-linux-gnu`. Loading that
//! shared library costs every process about 0.1 ms, most of it in its constructor, which probes
//! the CPU with CPUID (a VM exit each under virtualisation). That is a tenth of a `decode` of a
//! short trace (docs/benchmarks.md, session 23). GCC's static archive of the same unwinder,
//! `libgcc_eh.a`, is what `gcc -static-libgcc` links; offered to the linker as `libgcc_s.a` in a
//! directory searched before the system's, it satisfies std's `-lgcc_s` statically. Only the
//! binaries get it (`rustc-link-arg-bins`: tests, examples and the QEMU plugin, a shared
//! object, keep the shared library). Without the archive, or with
//! `PTREWIND_SHARED_LIBGCC=1`, the binaries link as before.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=PTREWIND_SHARED_LIBGCC");
    println!("cargo:rerun-if-env-changed=RUSTC_LINKER");
    let target = std::env::var("TARGET").unwrap_or_default();
    if !target.ends_with("-linux-gnu") || std::env::var_os("PTREWIND_SHARED_LIBGCC").is_some() {
        return;
    }
    // Cross-compiling with no linker configured: `cc` is the host's, and so would its archive be.
    if std::env::var("HOST").ok().as_deref() != Some(&target)
        && std::env::var_os("RUSTC_LINKER").is_none()
    {
        return;
    }
    let Some(out) = std::env::var_os("OUT_DIR").map(PathBuf::from) else {
        return;
    };
    match static_unwinder(&out) {
        Ok(dir) => println!("cargo:rustc-link-arg-bins=-L{}", dir.display()),
        Err(why) => println!("cargo:warning=ptrewind links libgcc_s dynamically: {why}"),
    }
}

/// A directory holding GCC's `libgcc_eh.a` under the name `libgcc_s.a`.
fn static_unwinder(out: &Path) -> Result<PathBuf, String> {
    // The C compiler rustc links with (no shell: the name is one argument).
    let cc = std::env::var("RUSTC_LINKER").unwrap_or_else(|_| "cc".to_string());
    let found = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .map_err(|e| format!("{cc} -print-file-name: {e}"))?;
    let archive = PathBuf::from(String::from_utf8_lossy(&found.stdout).trim());
    // Without the archive the driver prints the bare name back.
    if !found.status.success() || !archive.is_absolute() || !archive.is_file() {
        return Err(format!("{cc} has no libgcc_eh.a"));
    }
    let dir = out.join("static-unwinder");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let copy = dir.join("libgcc_s.a");
    // OUT_DIR is Cargo's, made for this build script: a plain copy, replaced whole.
    let _ = std::fs::remove_file(&copy);
    std::fs::copy(&archive, &copy).map_err(|e| format!("{}: {e}", archive.display()))?;
    println!("cargo:rerun-if-changed={}", archive.display());
    Ok(dir)
}
