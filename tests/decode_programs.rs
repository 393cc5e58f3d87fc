//! `ptrewind decode` on whole runs of small real programs (`ls -l`, `sed`, `sort`: dynamically
//! linked, through ld.so and libc, 0.5–3 M instructions), recorded under QEMU with the plugin
//! and handed to the CLI the way `examples/bench_cli.rs` does (the main thread's PT stream and
//! the recorded code as `--raw` files): every run decodes without an error, to the instruction
//! count Intel's libipt gives on the same files. Skipped when `qemu-x86_64` is not installed.

mod support;

use std::process::Command;

use support::programs::{PROGRAMS, record_program};

#[test]
fn program_runs_decode_like_libipt() {
    if !support::qemu::qemu_available() {
        return;
    }
    let plugin = support::qemu::plugin();
    let tmp = tempfile::tempdir().expect("tempdir");
    for name in PROGRAMS {
        let dir = tmp.path().join(name.replace('/', "_"));
        let t = record_program(name, &plugin, &dir).unwrap_or_else(|e| panic!("{e}"));
        assert!(
            t.qemu_insns > 100_000,
            "{name}: only {} instructions",
            t.qemu_insns
        );
        let files = support::corpus::write_raw_inputs(&t.pt, &t.images, &dir).expect("inputs");
        let out = Command::new(env!("CARGO_BIN_EXE_ptrewind"))
            .arg("decode")
            .args(files.decode_args())
            .args(["--format", "ips-bin"])
            .output()
            .expect("run ptrewind decode");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.is_empty(),
            "{name}: decode exited with {} and said: {stderr}",
            out.status
        );
        assert_eq!(out.stdout.len() % 8, 0);
        let ours = (out.stdout.len() / 8) as u64;
        let (masked, _) = support::libipt::mask_psb_fup_before_pge(&t.pt);
        let ipt = support::libipt::ipt_insn_count(&masked, None, &t.images);
        assert!(
            ipt.errors.is_empty(),
            "{name}: libipt reports errors: {:?}",
            ipt.errors
        );
        assert_eq!(
            ours, ipt.insns,
            "{name} (`{}`): ptrewind / libipt",
            t.command
        );
        eprintln!(
            "{name} (`{}`): {ours} instructions, QEMU counted {}",
            t.command, t.qemu_insns
        );
    }
}
