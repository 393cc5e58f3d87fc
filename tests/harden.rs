//! Local attackers and bad input, through the `ptrewind` binary: temporary files and recording
//! directories never written or read through a planted link; every input command fails with a
//! clear error and a non-zero exit on empty, truncated, non-trace and unbounded (`/dev/zero`)
//! input.

use std::os::unix::fs::{PermissionsExt as _, symlink};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

mod support;

use support::cbuild::build_example;
use support::gdb::{Server, gdb_session, ptrewind, run_until};

const TIMEOUT: Duration = Duration::from_secs(90);

/// `examples/c/recursion.c`, built once per test run.
fn recursion() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("harden-examples");
        std::fs::create_dir_all(&dir).unwrap();
        build_example(&dir, "recursion", &[])
    })
}

// ---- Step 1: temporary files and recording directories ----

/// `ptrewind gdb` puts its helper script in a fresh private directory under $TMPDIR (mode
/// 0700, a name nobody could predict), hands that path to GDB, and removes it afterwards. A
/// fake `gdb` records what it was given.
#[test]
fn gdb_helper_script_lives_in_a_private_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let fake = tmp.path().join("fake-gdb");
    let log = tmp.path().join("log");
    // Prints the sourced file's directory mode, the file's type and size, then exits without
    // connecting (ptrewind's watcher then ends the session).
    std::fs::write(
        &fake,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do case \"$a\" in source\\ *) f=${{a#source }};\n\
             echo \"FILE $f\"; stat -c 'DIR %a %U' \"$(dirname \"$f\")\";\n\
             stat -c 'TYPE %F %s' \"$f\";; esac; done > {}\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
    let scratch = tmp.path().join("tmpdir");
    std::fs::create_dir(&scratch).unwrap();
    let out = run_until(
        ptrewind()
            .env("TMPDIR", &scratch)
            .args(["gdb", "--backend", "soft", "--gdb"])
            .arg(&fake)
            .arg("--")
            .arg(recursion()),
        TIMEOUT,
    );
    assert!(out.status.is_some(), "{}", out.stderr);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let file = text
        .lines()
        .find_map(|l| l.strip_prefix("FILE "))
        .unwrap_or_else(|| panic!("no script given to gdb: {text}\n{}", out.stderr));
    let file = Path::new(file);
    assert!(file.starts_with(&scratch), "{text}");
    assert!(
        file.parent().unwrap() != scratch.as_path(),
        "the script is directly in $TMPDIR: {text}"
    );
    assert!(text.contains("DIR 700 "), "{text}");
    assert!(text.contains("TYPE regular file"), "{text}");
    // Cleaned up.
    assert_eq!(std::fs::read_dir(&scratch).unwrap().count(), 0, "{text}");
}

/// `monitor save DIR` into a directory where links were planted as `trace.pt` (to a file of
/// the user's) and `manifest.json` (dangling): the targets are untouched, the links replaced
/// by regular files, and the recording replays. A link planted afterwards as a code file, or
/// as the manifest, makes `replay` refuse the directory, naming the file.
#[test]
fn monitor_save_and_replay_never_follow_planted_links() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("rec");
    std::fs::create_dir(&dir).unwrap();
    let victim = tmp.path().join("victim");
    std::fs::write(&victim, b"the user's file").unwrap();
    symlink(&victim, dir.join("trace.pt")).unwrap();
    let dangling = tmp.path().join("created-through-link");
    symlink(&dangling, dir.join("manifest.json")).unwrap();
    symlink(&victim, dir.join("README")).unwrap();

    let program = recursion();
    let server = Server::spawn(
        ptrewind()
            .args([
                "record",
                "--backend",
                "soft",
                "--listen",
                "127.0.0.1:0",
                "--",
            ])
            .arg(program),
    );
    let cmds = [
        "break factorial".to_string(),
        "continue".into(),
        format!("monitor save {}", dir.display()),
    ];
    let r = gdb_session(server, program, &cmds, TIMEOUT);
    r.expect("saved ");
    assert_eq!(std::fs::read(&victim).unwrap(), b"the user's file");
    assert!(!dangling.exists(), "{}", r.dump());
    for name in ["trace.pt", "manifest.json", "README", "maps.json"] {
        let meta = std::fs::symlink_metadata(dir.join(name)).unwrap();
        assert!(meta.file_type().is_file(), "{name}");
    }

    // The saved directory loads (then the server waits for a debugger: kill it).
    let check_replay = |expect_err: Option<&str>| {
        let mut cmd = ptrewind();
        cmd.args(["replay", "--listen", "127.0.0.1:0"]).arg(&dir);
        let Some(needle) = expect_err else {
            // Fails unless it listens.
            let mut server = Server::spawn(&mut cmd);
            let _ = server.child.kill();
            let _ = server.child.wait();
            return;
        };
        let out = run_until(&mut cmd, TIMEOUT);
        assert!(
            out.status.is_some_and(|s| !s.success()),
            "accepted: {}",
            out.stderr
        );
        assert!(out.stderr.contains(needle), "{needle}: {}", out.stderr);
        assert!(out.stderr.contains("symbolic link"), "{}", out.stderr);
    };
    check_replay(None);
    // A code file swapped for a link to an identical copy outside: still refused.
    let code = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .find(|n| n.starts_with("code-"))
        .expect("a code file");
    let outside = tmp.path().join("outside.bin");
    std::fs::rename(dir.join(&code), &outside).unwrap();
    symlink(&outside, dir.join(&code)).unwrap();
    check_replay(Some(&code));
    std::fs::remove_file(dir.join(&code)).unwrap();
    std::fs::rename(&outside, dir.join(&code)).unwrap();
    check_replay(None);
    let manifest = tmp.path().join("manifest.json");
    std::fs::rename(dir.join("manifest.json"), &manifest).unwrap();
    symlink(&manifest, dir.join("manifest.json")).unwrap();
    check_replay(Some("manifest.json"));
}
