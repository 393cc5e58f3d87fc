//! Integration tests for `ptrewind::image`: ELF/raw/procfs/perf-sideband loaders and symbols.
//!
//! Ground truth comes from independent tools: C programs built at test time with `cc`, segment
//! tables from binutils `readelf`, symbol addresses from `nm`, source lines from `addr2line`, and
//! the live layout of a child process from `/proc/PID/maps`. Images from perf.data sideband are
//! checked against the HASE recordings' ground-truth branch lists and against `--elf` decodes.

mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ptrewind::image::elf::ElfKind;
use ptrewind::image::{
    ElfSpec, Image, LoadError, LoadedElf, MmapOptions, MmapRecord, ProcessImage, ProcessSnapshot,
    RawSpec, Segments, SpecError, Symbolizer,
};

const PROGRAM: &str = r#"
#include <unistd.h>

int named_fn(int x)
{
    int y = x * 3;
    if (y > 10)
        y -= 7;
    for (int i = 0; i < x; i++)
        y += i;
    return y + 1;
}

int main(int argc, char **argv)
{
    int r = named_fn(argc);
    if (argc > 1) {
        /* Block until the test closes our stdin, so it controls our lifetime. */
        char c;
        (void)read(0, &c, 1);
    }
    return r == 12345;
}
"#;

const LIBRARY: &str = r#"
int lib_fn(int x)
{
    int acc = 0;
    for (int i = 0; i < x; i++)
        acc += i * x;
    return acc;
}

int lib_other(int x)
{
    return lib_fn(x) + 1;
}
"#;

/// Builds `src` with `cc` and `flags` into `dir/name`.
fn build(dir: &Path, name: &str, src: &str, flags: &[&str]) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).unwrap();
    let out = dir.join(name);
    let status = Command::new("cc")
        .args(flags)
        .arg("-g")
        .arg("-O0")
        .arg("-o")
        .arg(&out)
        .arg(&c)
        .status()
        .expect("cc must be installed to run these tests");
    assert!(status.success(), "cc {flags:?} {name} failed");
    out
}

/// One `PT_LOAD` line of `readelf -lW`.
#[derive(Debug, Clone)]
struct LoadSeg {
    offset: u64,
    vaddr: u64,
    filesz: u64,
    exec: bool,
}

fn hex(s: &str) -> u64 {
    u64::from_str_radix(s.trim_start_matches("0x"), 16).unwrap_or_else(|_| panic!("hex {s:?}"))
}

fn tool(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} must be installed: {e}"));
    assert!(out.status.success(), "{cmd} {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn readelf_loads(path: &Path) -> Vec<LoadSeg> {
    let text = tool("readelf", &["-lW", path.to_str().unwrap()]);
    text.lines()
        .map(str::split_whitespace)
        .map(Iterator::collect::<Vec<_>>)
        .filter(|t| t.first() == Some(&"LOAD"))
        .map(|t| LoadSeg {
            offset: hex(t[1]),
            vaddr: hex(t[2]),
            filesz: hex(t[4]),
            // Flags are spread over tokens 6..len-1 ("R E", "RW").
            exec: t[6..t.len() - 1].iter().any(|f| f.contains('E')),
        })
        .collect()
}

fn readelf_entry(path: &Path) -> u64 {
    let text = tool("readelf", &["-hW", path.to_str().unwrap()]);
    let line = text
        .lines()
        .find(|l| l.contains("Entry point address"))
        .unwrap();
    hex(line.rsplit(' ').next().unwrap())
}

/// `nm -S --defined-only`: (address, size) of `name`.
fn nm(path: &Path, name: &str) -> Option<(u64, Option<u64>)> {
    let text = tool("nm", &["-S", "--defined-only", path.to_str().unwrap()]);
    text.lines().find_map(|l| {
        let t: Vec<_> = l.split_whitespace().collect();
        match t.as_slice() {
            [a, s, _, n] if *n == name => Some((hex(a), Some(hex(s)))),
            [a, _, n] if *n == name => Some((hex(a), None)),
            _ => None,
        }
    })
}

/// `addr2line -e path vaddr`: (file, line), or None for `??`.
fn addr2line(path: &Path, vaddr: u64) -> Option<(String, u32)> {
    let text = tool(
        "addr2line",
        &["-e", path.to_str().unwrap(), &format!("{vaddr:#x}")],
    );
    let first = text.lines().next()?;
    let first = first.split(" (discriminator").next()?;
    let (file, line) = first.rsplit_once(':')?;
    let line: u32 = line.trim().parse().ok()?;
    (file != "??" && line != 0).then(|| (file.to_string(), line))
}

fn file_bytes(path: &Path, seg: &LoadSeg) -> Vec<u8> {
    let data = std::fs::read(path).unwrap();
    data[seg.offset as usize..(seg.offset + seg.filesz) as usize].to_vec()
}

fn read_image(image: &Image, addr: u64, len: u64) -> Vec<u8> {
    let mut buf = vec![0u8; len as usize];
    let n = image.read(addr, &mut buf);
    buf.truncate(n);
    buf
}

/// Checks that every PT_LOAD the filter selects is in `image` at `vaddr + bias` with the file's
/// bytes, and that the first byte of every other segment is not mapped.
fn check_segments(path: &Path, image: &Image, bias: u64, which: Segments) {
    let loads = readelf_loads(path);
    assert!(!loads.is_empty(), "{}: no PT_LOAD", path.display());
    for seg in &loads {
        let addr = seg.vaddr.wrapping_add(bias);
        let wanted = seg.exec || which == Segments::AllLoadable;
        if wanted {
            assert_eq!(
                read_image(image, addr, seg.filesz),
                file_bytes(path, seg),
                "{}: segment at {:#x}",
                path.display(),
                seg.vaddr
            );
        } else if !loads
            .iter()
            .any(|e| e.exec && seg.vaddr >= e.vaddr && seg.vaddr < e.vaddr + e.filesz)
        {
            assert!(
                image.slice_at(addr).is_none(),
                "{}: non-exec segment at {:#x} was mapped",
                path.display(),
                seg.vaddr
            );
        }
    }
}

fn check_symbols_and_lines(path: &Path, symbolizer: &Symbolizer, bias: u64, names: &[&str]) {
    for name in names {
        let (vaddr, size) = nm(path, name).unwrap_or_else(|| panic!("nm: no {name}"));
        let addr = vaddr.wrapping_add(bias);
        assert_eq!(symbolizer.symbol(addr), Some((*name, 0)), "{name}");
        assert_eq!(symbolizer.symbol(addr + 3), Some((*name, 3)), "{name}+3");
        assert_eq!(symbolizer.lookup(name), Some(addr), "lookup {name}");
        let size = size.expect("C functions have sizes");
        assert_eq!(symbolizer.symbol(addr + size - 1), Some((*name, size - 1)));
        // Lines against binutils addr2line at several addresses inside the function.
        let mut compared = 0;
        for off in (0..size).step_by(5) {
            let Some((file, line)) = addr2line(path, vaddr + off) else {
                continue;
            };
            let ours = symbolizer
                .line(addr + off)
                .unwrap_or_else(|| panic!("{name}+{off:#x}: no line (addr2line: {file}:{line})"));
            assert_eq!(ours.1, line, "{name}+{off:#x}: {ours:?} vs {file}:{line}");
            assert_eq!(
                Path::new(&ours.0).file_name(),
                Path::new(&file).file_name(),
                "{name}+{off:#x}"
            );
            compared += 1;
        }
        assert!(compared >= 3, "{name}: only {compared} lines compared");
    }
}

#[test]
fn compiled_executables_and_library() {
    let dir = tempfile::tempdir().unwrap();
    let nonpie = build(dir.path(), "nonpie", PROGRAM, &["-no-pie", "-fno-pie"]);
    let pie = build(dir.path(), "pie", PROGRAM, &["-pie", "-fPIE"]);
    let lib = build(dir.path(), "libx.so", LIBRARY, &["-shared", "-fPIC"]);

    // Non-PIE at its link address; PIE and library without and with a base.
    let cases: [(&Path, Option<u64>, &[&str]); 5] = [
        (&nonpie, None, &["main", "named_fn"]),
        (&pie, None, &["main", "named_fn"]),
        (&pie, Some(0x5555_5555_4000), &["main", "named_fn"]),
        (&lib, Some(0x7f12_3456_0000), &["lib_fn", "lib_other"]),
        (&nonpie, Some(0x1000_0000), &["main", "named_fn"]),
    ];
    for (path, base, names) in cases {
        let lowest = readelf_loads(path).iter().map(|s| s.vaddr).min().unwrap();
        let bias = base.map_or(0, |b| b.wrapping_sub(lowest & !0xfff));
        let spec = ElfSpec::new(path, base);
        for which in [Segments::Executable, Segments::AllLoadable] {
            let mut image = Image::new();
            let elf = image.load_elf_with(&spec, which).unwrap();
            assert_eq!(elf.bias, bias, "{spec}");
            assert_eq!(elf.bits, 64);
            assert_eq!(elf.entry, readelf_entry(path).wrapping_add(bias));
            check_segments(path, &image, bias, which);
            // All sections of one file share one buffer.
            assert!(
                image
                    .sections()
                    .windows(2)
                    .all(|w| ptrewind::image::SectionBytes::ptr_eq(&w[0].bytes, &w[1].bytes))
            );
        }
        let mut symbolizer = Symbolizer::new();
        let elf = symbolizer.add_file(&spec).unwrap();
        assert_eq!(
            elf.kind,
            if path == nonpie.as_path() {
                ElfKind::Executable
            } else {
                ElfKind::Dynamic
            }
        );
        check_symbols_and_lines(path, &symbolizer, bias, names);
        // Outside every object: nothing.
        assert_eq!(symbolizer.symbol(0xffff_ffff_ffff_0000), None);
        assert_eq!(symbolizer.line(0xffff_ffff_ffff_0000), None);
    }

    // Two objects in one symbolizer: each address resolves in its own object.
    let mut symbolizer = Symbolizer::new();
    let exe = symbolizer
        .add_file(&ElfSpec::new(&pie, Some(0x5555_5555_4000)))
        .unwrap();
    let so = symbolizer
        .add_file(&ElfSpec::new(&lib, Some(0x7f00_0000_0000)))
        .unwrap();
    let main = exe.to_addr(nm(&pie, "main").unwrap().0);
    let lib_fn = so.to_addr(nm(&lib, "lib_fn").unwrap().0);
    assert_eq!(symbolizer.symbol(main + 1), Some(("main", 1)));
    assert_eq!(symbolizer.symbol(lib_fn + 2), Some(("lib_fn", 2)));
    let clone = symbolizer.clone();
    let handle = std::thread::spawn(move || clone.line(lib_fn).map(|l| l.1));
    assert_eq!(
        handle.join().unwrap(),
        addr2line(&lib, so.to_vaddr(lib_fn)).map(|l| l.1)
    );
}

#[test]
fn cpp_names_are_demangled() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("lib.cc");
    std::fs::write(
        &src,
        "namespace ns { int twice(int x) { return 2 * x; } struct S { long m(long y) const { return y; } }; }\n\
         long use(const ns::S &s) { return s.m(3) + ns::twice(4); }\n",
    )
    .unwrap();
    let lib = dir.path().join("libcc.so");
    let status = Command::new("c++")
        .args(["-g", "-O0", "-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .expect("c++ must be installed to run this test");
    assert!(status.success());
    let base = 0x7f55_0000_0000;
    let mut symbolizer = Symbolizer::new();
    let elf = symbolizer
        .add_file(&ElfSpec::new(&lib, Some(base)))
        .unwrap();
    // `nm -C` (binutils' demangler) is the oracle for names and addresses.
    let text = tool("nm", &["-C", "--defined-only", lib.to_str().unwrap()]);
    let mut checked = 0;
    for want in [
        "ns::twice(int)",
        "ns::S::m(long) const",
        "use(ns::S const&)",
    ] {
        let line = text
            .lines()
            .find(|l| l.ends_with(want))
            .unwrap_or_else(|| panic!("nm -C: no {want}"));
        let vaddr = hex(line.split(' ').next().unwrap());
        assert_eq!(symbolizer.symbol(elf.to_addr(vaddr) + 2), Some((want, 2)));
        checked += 1;
    }
    assert_eq!(checked, 3);
}

#[test]
fn elf_errors_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let junk = dir.path().join("junk");
    std::fs::write(&junk, b"this is not an ELF file").unwrap();
    let err = Image::new()
        .load_elf(&ElfSpec::new(&junk, None))
        .unwrap_err();
    assert!(matches!(err, LoadError::Elf { .. }), "{err}");
    assert!(err.to_string().contains("junk"), "{err}");
    let missing = dir.path().join("missing");
    let err = Image::new()
        .load_elf(&ElfSpec::new(&missing, None))
        .unwrap_err();
    assert!(matches!(err, LoadError::Io { .. }), "{err}");
    assert!(err.to_string().contains("missing"), "{err}");
    // A truncated ELF (headers claim more than the file holds) is an error, not a panic.
    let nonpie = build(dir.path(), "t", PROGRAM, &["-no-pie", "-fno-pie"]);
    let data = std::fs::read(&nonpie).unwrap();
    for cut in [64, 200, data.len() / 2] {
        let r = LoadedElf::from_bytes(&nonpie, data[..cut].to_vec().into(), None);
        if let Ok(elf) = r {
            // Whatever parses must stay inside the bytes it was given.
            for s in elf.sections(Segments::AllLoadable) {
                assert!(s.offset + s.len <= cut);
            }
        }
    }
}

#[test]
fn raw_spec_table_and_loading() {
    type Case = (
        &'static str,
        Result<(&'static str, u64, Option<u64>, u64), &'static str>,
    );
    let cases: &[Case] = &[
        ("f:0x400000", Ok(("f", 0, None, 0x400000))),
        ("f:4096", Ok(("f", 0, None, 4096))),
        ("f:0x1000:0x401000", Ok(("f", 0x1000, None, 0x401000))),
        (
            "f:0x1000-0x88000:0x401000",
            Ok(("f", 0x1000, Some(0x88000), 0x401000)),
        ),
        ("f:16-32:0", Ok(("f", 16, Some(32), 0))),
        ("f:0X10:0x20", Ok(("f", 16, None, 32))),
        ("f:017:0", Ok(("f", 15, None, 0))), // strtoull base 0: octal
        ("dir:x/f:0x10", Ok(("dir:x/f", 0, None, 0x10))),
        ("dir:x/f:1-2:0x10", Ok(("dir:x/f", 1, Some(2), 0x10))),
        ("a:b-c:0x10", Ok(("a:b-c", 0, None, 0x10))),
        ("f", Err("base")),
        ("f:", Err("base")),
        ("f:0x", Err("base")),
        ("f:0x1000:", Err("base")),
        ("f:08", Err("base")), // not octal, not decimal: like strtoull
        ("f:0x10-0x10:0", Err("range")),
        ("f:0x20-0x10:0", Err("range")),
        ("f:5-:0", Err("range")),
        (":0x1000", Err("path")),
        ("", Err("base")),
    ];
    for (arg, want) in cases {
        let got = arg.parse::<RawSpec>();
        match (want, got) {
            (Ok((path, from, to, base)), Ok(spec)) => {
                assert_eq!(spec.path, Path::new(path), "{arg}");
                assert_eq!(
                    (spec.from, spec.to, spec.base),
                    (*from, *to, *base),
                    "{arg}"
                );
                // Display round-trips.
                assert_eq!(spec.to_string().parse::<RawSpec>().unwrap(), spec, "{arg}");
            }
            (Err("base"), Err(SpecError::MissingBase { .. })) => {}
            (Err("range"), Err(SpecError::EmptyRange { .. })) => {}
            (Err("path"), Err(SpecError::MissingPath { .. })) => {}
            (want, got) => panic!("{arg:?}: want {want:?}, got {got:?}"),
        }
    }

    // Loading: bytes [FROM, TO) of the file at BASE; out-of-file ranges are errors.
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("blob");
    let data: Vec<u8> = (0..=255u8).cycle().take(1000).collect();
    std::fs::write(&f, &data).unwrap();
    let p = f.to_str().unwrap();
    let mut image = Image::new();
    image
        .load_raw(&format!("{p}:100-200:0x5000").parse().unwrap())
        .unwrap();
    assert_eq!(read_image(&image, 0x5000, 1000), &data[100..200]);
    assert!(image.slice_at(0x4fff).is_none());
    let s = format!("{p}:0x9000")
        .parse::<RawSpec>()
        .unwrap()
        .load()
        .unwrap();
    assert_eq!((s.addr, s.data()), (0x9000, &data[..]));
    let s = format!("{p}:999:0")
        .parse::<RawSpec>()
        .unwrap()
        .load()
        .unwrap();
    assert_eq!(s.data(), &data[999..]);
    for bad in [format!("{p}:1000:0"), format!("{p}:10-1001:0")] {
        let err = bad.parse::<RawSpec>().unwrap().load().unwrap_err();
        assert!(matches!(err, LoadError::FileRange { .. }), "{bad}: {err}");
    }
    let err = "/nonexistent/x:0"
        .parse::<RawSpec>()
        .unwrap()
        .load()
        .unwrap_err();
    assert!(matches!(err, LoadError::Io { .. }));
}

/// Kills the child on drop so a failing assertion does not leak it.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn live_process_image_matches_the_elf() {
    let dir = tempfile::tempdir().unwrap();
    let pie = build(dir.path(), "live", PROGRAM, &["-pie", "-fPIE"]);
    let mut child = Child(
        Command::new(&pie)
            .arg("wait")
            .stdin(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let pid = child.0.id() as i32;
    // `spawn` returns after exec, so the kernel has mapped the executable; wait for ld.so to map
    // libc too (the program then blocks in read), but do not depend on it for the assertions.
    let canon = std::fs::canonicalize(&pie).unwrap();
    let exe = canon.to_str().unwrap();
    let mut live = None;
    for _ in 0..200 {
        // Between exec's point of no return and the ELF loader's mmaps the new address space
        // holds only the stack and [vsyscall]; reading then fails, so retry.
        let Ok(p) = ProcessImage::read(pid) else {
            std::thread::sleep(std::time::Duration::from_millis(10));
            continue;
        };
        let libc = p
            .snapshot
            .mappings
            .iter()
            .any(|m| m.exec && m.name().contains("libc"));
        if libc {
            live = Some(p);
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let live = live.expect("libc never appeared in the child's maps");

    // Bias from /proc/PID/maps: the first mapping of the file is its lowest page.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let start = maps
        .lines()
        .filter(|l| l.ends_with(exe))
        .map(|l| hex(l.split('-').next().unwrap()))
        .min()
        .unwrap();
    let loads = readelf_loads(&pie);
    let lowest = loads.iter().map(|s| s.vaddr).min().unwrap() & !0xfff;
    let bias = start - lowest;
    assert_eq!(live.snapshot.base_of(&canon), Some(start));

    for name in ["main", "named_fn"] {
        let (vaddr, size) = nm(&pie, name).unwrap();
        let seg = loads
            .iter()
            .find(|s| vaddr >= s.vaddr && vaddr < s.vaddr + s.filesz)
            .unwrap();
        let data = std::fs::read(&pie).unwrap();
        let off = (vaddr - seg.vaddr + seg.offset) as usize;
        let size = size.unwrap() as usize;
        assert_eq!(
            read_image(&live.image, vaddr + bias, size as u64),
            &data[off..off + size],
            "{name}"
        );
        // The same bytes through the ELF loader at the observed base.
        let mut image = Image::new();
        image.load_elf(&ElfSpec::new(&pie, Some(start))).unwrap();
        assert_eq!(
            read_image(&image, vaddr + bias, size as u64),
            &data[off..off + size]
        );
    }

    // Every executable mapping is either in the image or reported as unreadable.
    for m in live.snapshot.executable() {
        let mapped = live.image.slice_at(m.start).is_some();
        let reported = live.unreadable.iter().any(|u| u.mapping == *m);
        assert!(mapped || reported, "{m:?} neither mapped nor reported");
        if m.is_file() {
            assert!(mapped, "file mapping {m:?} unreadable");
        }
    }
    if let Some(vdso) = live.snapshot.mappings.iter().find(|m| m.name() == "[vdso]") {
        // The vDSO is a little ELF image: its first page starts with the ELF magic.
        assert_eq!(read_image(&live.image, vdso.start, 4), b"\x7fELF");
    }

    // The snapshot, turned into sideband records, rebuilds the program's text from the files.
    let rebuilt = Image::from_mmaps(&live.snapshot.to_mmap_records(), &MmapOptions::default());
    let (main, size) = nm(&pie, "main").unwrap();
    assert_eq!(
        read_image(&rebuilt.image, main + bias, size.unwrap()),
        read_image(&live.image, main + bias, size.unwrap())
    );
    assert!(
        rebuilt.missing.iter().any(|m| m.filename == "[vdso]"),
        "the vDSO has no file and must be reported: {:?}",
        rebuilt.missing
    );

    // The snapshot survives a save/load round trip.
    let json = serde_json::to_string(&live.snapshot).unwrap();
    let back: ProcessSnapshot = serde_json::from_str(&json).unwrap();
    assert_eq!(back, live.snapshot);

    // Let the child finish, then reading it is an error that names the pid.
    child.0.stdin.take().unwrap().write_all(b"x").unwrap();
    let status = child.0.wait().unwrap();
    assert!(status.success());
    let err = ProcessImage::read(pid).unwrap_err();
    assert!(
        matches!(err, LoadError::Process { pid: p, .. } if p == pid),
        "{err}"
    );
    assert!(err.to_string().contains(&pid.to_string()));
}

#[test]
fn perf_mmap_records() {
    let dir = tempfile::tempdir().unwrap();
    let pie = build(dir.path(), "prog", PROGRAM, &["-pie", "-fPIE"]);
    let data = std::fs::read(&pie).unwrap();
    let loads = readelf_loads(&pie);
    let text = loads.iter().find(|s| s.exec).unwrap().clone();
    let base = 0x5600_0000_0000u64;
    // What the kernel reports for the text mapping: page-aligned address, length and offset.
    let rec = |filename: &str, pid: u32, exec: bool| MmapRecord {
        pid,
        tid: pid,
        addr: base + (text.vaddr & !0xfff),
        len: (text.filesz + (text.vaddr & 0xfff) + 0xfff) & !0xfff,
        pgoff: text.offset & !0xfff,
        filename: filename.to_string(),
        exec,
    };
    // The file is found under a symfs root at its recorded path.
    let root = dir.path().join("symfs");
    let recorded = "/opt/app/bin/prog";
    std::fs::create_dir_all(root.join("opt/app/bin")).unwrap();
    std::fs::copy(&pie, root.join("opt/app/bin/prog")).unwrap();
    let vdso_file = dir.path().join("vdso.so");
    std::fs::write(&vdso_file, vec![0x90u8; 0x2000]).unwrap();
    let records = vec![
        rec(recorded, 42, true),
        MmapRecord {
            addr: 0x7f00_0000_0000,
            ..rec("/nonexistent/libfoo.so", 42, true)
        },
        MmapRecord {
            addr: 0x7fff_0000_0000,
            len: 0x2000,
            pgoff: 0,
            ..rec("[vdso]", 42, true)
        },
        MmapRecord {
            addr: 0x7ffe_0000_0000,
            ..rec("//anon", 42, true)
        },
        rec("[kernel.kallsyms]_text", u32::MAX, true),
        rec(recorded, 43, true),
        MmapRecord {
            addr: 0x4000_0000,
            ..rec(recorded, 42, false)
        },
        MmapRecord {
            pgoff: 0x1000_0000,
            addr: 0x5000_0000,
            ..rec(recorded, 42, true)
        },
    ];
    let remap = |name: &str| (name == "[vdso]").then(|| vdso_file.clone());
    let opts = MmapOptions {
        pid: Some(42),
        symfs: vec![root.clone()],
        remap: Some(&remap),
        include_data: false,
        ..MmapOptions::default()
    };
    let out = Image::from_mmaps(&records, &opts);
    // The ELF is returned placed at the mapping's bias, for symbols (nm is the oracle).
    assert_eq!(out.elfs.len(), 1);
    assert_eq!(out.elfs[0].bias, base);
    let mut syms = Symbolizer::new();
    syms.add_elf(&out.elfs[0]).unwrap();
    let (named, _) = nm(&pie, "named_fn").unwrap();
    assert_eq!(syms.symbol(base + named + 1), Some(("named_fn", 1)));
    // The text bytes are the file's bytes at the recorded address.
    assert_eq!(
        read_image(&out.image, base + text.vaddr, text.filesz),
        file_bytes(&pie, &text)
    );
    assert_eq!(
        read_image(&out.image, 0x7fff_0000_0000, 0x2000),
        vec![0x90; 0x2000]
    );
    let missing: Vec<_> = out.missing.iter().map(|m| m.filename.as_str()).collect();
    assert_eq!(missing, ["/nonexistent/libfoo.so", "//anon", recorded]);
    assert_eq!(out.missing[0].addr, 0x7f00_0000_0000);
    assert!(out.missing[0].reason.contains("/nonexistent/libfoo.so"));
    assert!(out.missing[2].reason.contains("past the end"));
    assert_eq!(out.ignored_kernel, 1);
    assert_eq!(out.ignored_other_pid, 1);
    assert_eq!(out.ignored_data, 1);
    assert!(out.image.slice_at(0x4000_0000).is_none());

    // Without the symfs root the recorded path does not exist: reported, not skipped.
    let out = Image::from_mmaps(&records[..1], &MmapOptions::default());
    assert_eq!(out.missing.len(), 1);
    assert!(out.image.sections().is_empty());
    // With data records included the non-exec mapping is there too.
    let opts = MmapOptions {
        include_data: true,
        ..opts
    };
    let out = Image::from_mmaps(&records, &opts);
    assert_eq!(out.ignored_data, 0);
    let page = (text.offset & !0xfff) as usize;
    assert_eq!(
        read_image(&out.image, 0x4000_0000, 16),
        &data[page..page + 16]
    );
}

fn corpus() -> Option<PathBuf> {
    let dir = std::env::var_os("PTREWIND_CORPUS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/corpus"));
    dir.is_dir().then_some(dir)
}

#[test]
fn corpus_elfs_load_at_their_vaddrs() {
    let Some(corpus) = corpus() else {
        eprintln!("corpus not found (set PTREWIND_CORPUS): skipping");
        return;
    };
    let files = [
        ("hase-pt-recordings/loopy-20180404/loopy", 64),
        ("hase-pt-recordings/control_flow-20180404/control_flow", 64),
        (
            "hase-pt-recordings/loopy-20180514/binaries/home/joerg/git/hase/tests/bin/loopy/loopy",
            64,
        ),
        ("dynamorio-drpt2trace/v1_final_raw/hello", 64),
        ("dynamorio-drpt2trace/v2_tracedir_820k/hello", 64),
        ("dynamorio-drpt2trace/v3_raw_2848/hello", 32),
        ("dynamorio-drpt2trace/v4_tracedir_32304/hello", 64),
        ("dynamorio-drpt2trace/v5_tracedir_22112/tmp/hello", 64),
        ("dynamorio-drpt2trace/v6_tracedir_15040/hello", 64),
    ];
    let mut checked = 0;
    for (rel, bits) in files {
        let path = corpus.join(rel);
        if !path.exists() {
            eprintln!("{}: not in the corpus, skipped", path.display());
            continue;
        }
        let mut image = Image::new();
        let elf = image.load_elf(&ElfSpec::new(&path, None)).unwrap();
        assert_eq!(elf.bits, bits, "{rel}");
        assert_eq!(elf.bias, 0);
        assert_eq!(elf.kind, ElfKind::Executable, "{rel}");
        assert_eq!(elf.entry, readelf_entry(&path), "{rel}");
        check_segments(&path, &image, 0, Segments::Executable);
        // The entry point is `_start` in all of them (nm is the oracle for its address).
        let mut symbolizer = Symbolizer::new();
        symbolizer.add_elf(&elf).unwrap();
        let (start, _) = nm(&path, "_start").unwrap();
        assert_eq!(start, elf.entry, "{rel}");
        assert_eq!(
            symbolizer.symbol(elf.entry + 1),
            Some(("_start", 1)),
            "{rel}"
        );
        checked += 1;
    }
    // v6's mmap.txt describes the same text as a raw range: both loaders agree.
    let v6 = corpus.join("dynamorio-drpt2trace/v6_tracedir_15040/hello");
    if v6.exists() {
        let raw: RawSpec = format!("{}:0x1000-0x88000:0x401000", v6.display())
            .parse()
            .unwrap();
        let mut by_raw = Image::new();
        by_raw.load_raw(&raw).unwrap();
        let mut by_elf = Image::new();
        by_elf.load_elf(&ElfSpec::new(&v6, None)).unwrap();
        let text = readelf_loads(&v6).into_iter().find(|s| s.exec).unwrap();
        let n = text.filesz.min(0x87000);
        assert_eq!(
            read_image(&by_raw, text.vaddr, n),
            read_image(&by_elf, text.vaddr, n)
        );
    }
    assert!(checked > 0 || !corpus.join("hase-pt-recordings").exists());
}

// ---------------------------------------------------------------------------------------------
// Images from perf.data sideband (MMAP/MMAP2 records), end to end

use ptrewind::flow::{Cpu, Errata, EventKind, FlowConfig, FlowDecoder, FlowErrorKind, Item};
use ptrewind::image::perf_maps::{PerfSideband, elf_build_id};
use ptrewind::store::TraceStreams;
use ptrewind::store::perf_data::PerfData;

/// The HASE recordings: perf.data, the directory holding its binary (flat), the binary, and the
/// ground-truth branch list when the recording has one.
/// The AUX payload of each is also in `extracted-aux/`, the stream tests/flow.rs decodes with
/// the ELF image.
const HASE_PERF: [(&str, &str, &str, Option<&str>); 4] = [
    (
        "loopy-20180404/loopy-20180404T162955.perf",
        "loopy-20180404",
        "loopy",
        Some("loopy-20180404/loopy-20180404T162955.trace"),
    ),
    (
        "control_flow-20180404/control_flow-20180404T163033.perf",
        "control_flow-20180404",
        "control_flow",
        Some("control_flow-20180404/control_flow-20180404T163033.trace"),
    ),
    (
        "loopy-20180514/perf.data.1",
        "loopy-20180514/binaries/home/joerg/git/hase/tests/bin/loopy",
        "loopy",
        None,
    ),
    (
        "control_flow-20180515/perf.data.1",
        "control_flow-20180515/binaries/home/joerg/git/hase/tests/bin/control_flow",
        "control_flow",
        None,
    ),
];

fn decode_all(pt: &[u8], image: &Image, cfg: FlowConfig) -> Vec<Item> {
    let mut dec = FlowDecoder::new(pt, image, cfg);
    std::iter::from_fn(|| dec.next_item()).collect()
}

fn error_kinds(items: &[Item]) -> Vec<FlowErrorKind> {
    items
        .iter()
        .filter_map(|i| match i {
            Item::Event(e) => match &e.kind {
                EventKind::Error { kind, .. } => Some(kind.clone()),
                _ => None,
            },
            _ => None,
        })
        .collect()
}

/// `decode --perf X --search-dir DIR` without `--elf`: the image comes from the MMAP2 records
/// (which name the binaries by their original absolute paths on the recording machine), and the
/// instruction stream is exactly the one the ELF image gives — and the ground truth where the
/// recording has one.
#[test]
fn hase_perf_mmap_images_match_the_elf_and_the_ground_truth() {
    let Some(corpus) = support::require_corpus("hase_perf_mmap_images") else {
        return;
    };
    let hase = corpus.join("hase-pt-recordings");
    let mut with_truth = 0;
    for (perf_rel, dir_rel, bin, truth) in HASE_PERF {
        let bytes = std::fs::read(hase.join(perf_rel)).unwrap();
        let perf = PerfData::parse(&bytes).unwrap();
        let sb = PerfSideband::read(&perf);
        let source = TraceStreams::from_bytes(&bytes).unwrap();
        assert_eq!(source.streams.len(), 1, "{perf_rel}");
        let stream = &source.streams[0];
        // The same bytes the flow tests decode (extracted-aux/<stem>.aux.bin).
        let stem = Path::new(perf_rel).file_stem().unwrap().to_str().unwrap();
        let extracted = match stem {
            "perf.data" if perf_rel.starts_with("loopy") => "loopy-20180514T145114",
            "perf.data" => "control_flow-20180515T180451",
            other => other,
        };
        let aux = std::fs::read(hase.join(format!("extracted-aux/{extracted}.aux.bin"))).unwrap();
        assert_eq!(&stream.data[..], &aux[..], "{perf_rel}");
        let pid = sb.pid_for_stream(stream.cpu, stream.tid);
        assert!(pid.is_some(), "{perf_rel}: no traced process found");
        let recorded: Vec<&str> = sb
            .mmaps
            .iter()
            .filter(|m| m.exec && m.filename.ends_with(&format!("/{bin}")))
            .map(|m| m.filename.as_str())
            .collect();
        assert!(!recorded.is_empty(), "{perf_rel}: no MMAP record for {bin}");
        assert!(
            recorded.iter().all(|p| !Path::new(p).exists()),
            "{perf_rel}: the recorded path exists here, the search would prove nothing"
        );
        let dir = hase.join(dir_rel);
        let opts = MmapOptions {
            pid,
            search_dirs: vec![dir.clone()],
            build_ids: sb.build_id_map(),
            ..MmapOptions::default()
        };
        let m = Image::from_mmaps(&sb.mmaps, &opts);
        // Only pseudo mappings (stack, anonymous, vdso) have no file.
        for x in &m.missing {
            assert!(
                x.filename.starts_with('[') || x.filename.starts_with("//"),
                "{perf_rel}: {x:?}"
            );
        }
        assert_eq!(m.elfs.len(), 1, "{perf_rel}");
        assert_eq!(m.elfs[0].path, dir.join(bin));
        assert_eq!(m.elfs[0].bias, 0, "{perf_rel}: static non-PIE binary");
        // The CPU of the header selects the errata (SOURCE.txt / perf report give the models).
        let cpu = Cpu::from_perf_cpuid(perf.cpuid().unwrap()).unwrap();
        assert!(matches!(cpu.model, 94 | 61), "{perf_rel}: {cpu}");
        let cfg = FlowConfig {
            errata: Errata::for_cpu(&cpu),
            ..FlowConfig::default()
        };
        let by_mmap = decode_all(&stream.data, &m.image, cfg.clone());
        let mut elf_image = Image::new();
        elf_image
            .load_elf(&ElfSpec::new(dir.join(bin), None))
            .unwrap();
        let by_elf = decode_all(&stream.data, &elf_image, cfg.clone());
        assert!(error_kinds(&by_mmap).is_empty(), "{perf_rel}");
        assert!(by_mmap.len() > 50, "{perf_rel}");
        assert_eq!(by_mmap, by_elf, "{perf_rel}");
        // The 2018-05 tarballs keep the binary under binaries/<recorded absolute path>: the perf
        // --symfs layout, found without any name search.
        if let Some((tarball, _)) = dir_rel.split_once("/binaries/") {
            let root = hase.join(tarball).join("binaries");
            let by_symfs = Image::from_mmaps(
                &sb.mmaps,
                &MmapOptions {
                    pid,
                    symfs: vec![root.clone()],
                    build_ids: sb.build_id_map(),
                    ..MmapOptions::default()
                },
            );
            assert_eq!(by_symfs.elfs.len(), 1, "{perf_rel}");
            assert!(by_symfs.elfs[0].path.starts_with(&root));
            assert_eq!(
                decode_all(&stream.data, &by_symfs.image, cfg.clone()),
                by_mmap
            );
        }
        if let Some(truth) = truth {
            let truth = support::corpus::read_branch_list(&hase.join(truth)).unwrap();
            assert_eq!(
                support::corpus::hase_branches(&by_mmap),
                truth,
                "{perf_rel}"
            );
            with_truth += 1;
        }
        // Symbols come from the same ELF: `_start` is at the entry point (nm as the oracle).
        let mut syms = Symbolizer::new();
        syms.add_elf(&m.elfs[0]).unwrap();
        let (start, _) = nm(&dir.join(bin), "_start").unwrap();
        assert_eq!(syms.symbol(start), Some(("_start", 0)));

        // Without the search directory the binary is missing, reported, and the decode reports
        // the code it could not find instead of inventing any.
        let none = Image::from_mmaps(
            &sb.mmaps,
            &MmapOptions {
                pid,
                ..MmapOptions::default()
            },
        );
        assert!(
            none.missing
                .iter()
                .any(|x| recorded.contains(&x.filename.as_str()))
        );
        let items = decode_all(&stream.data, &none.image, cfg);
        assert!(
            error_kinds(&items).contains(&FlowErrorKind::NoCode),
            "{perf_rel}"
        );
        assert!(!items.iter().any(|i| matches!(i, Item::Insn(_))));
    }
    assert_eq!(with_truth, 2);
}

fn ptrewind(args: &[&std::ffi::OsStr]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_ptrewind"))
        .args(args)
        .output()
        .unwrap()
}

/// The CLI: `--perf` alone builds the image from the MMAP records; missing files are reported
/// once each with a hint; symbols and the header CPU are used.
#[test]
fn decode_perf_cli_uses_mmap_records() {
    let Some(corpus) = support::require_corpus("decode_perf_cli") else {
        return;
    };
    let hase = corpus.join("hase-pt-recordings");
    let perf = hase.join("loopy-20180404/loopy-20180404T162955.perf");
    let dir = hase.join("loopy-20180404");
    let os = |s: &str| std::ffi::OsString::from(s);
    let by_mmap = ptrewind(&[
        &os("decode"),
        &os("--perf"),
        perf.as_os_str(),
        &os("--search-dir"),
        dir.as_os_str(),
    ]);
    let by_elf = ptrewind(&[
        &os("decode"),
        &os("--perf"),
        perf.as_os_str(),
        &os("--no-mmaps"),
        &os("--elf"),
        dir.join("loopy").as_os_str(),
    ]);
    assert_eq!(by_mmap.status.code(), Some(0));
    assert_eq!(by_elf.status.code(), Some(0));
    assert_eq!(by_mmap.stdout, by_elf.stdout);
    assert!(String::from_utf8_lossy(&by_mmap.stdout).contains("0x4000e8"));
    // The pseudo mappings (no file) are reported once each, the binary is not.
    let err = String::from_utf8_lossy(&by_mmap.stderr);
    assert_eq!(err.matches("no code for [vdso]").count(), 1, "{err}");
    assert!(!err.contains("/loopy "), "{err}");
    // --raw/--elf are mapped over the MMAP image: the original bytes change nothing, other
    // bytes at the entry point change the decode.
    let tmp = tempfile::tempdir().unwrap();
    let text_bytes = std::fs::read(dir.join("loopy")).unwrap();
    let same = tmp.path().join("same.bin");
    std::fs::write(&same, &text_bytes[0xe8..0x100]).unwrap();
    let other = tmp.path().join("other.bin");
    std::fs::write(&other, [0xEBu8, 0xFE]).unwrap(); // jmp $
    let with_raw = |raw: &Path| {
        ptrewind(&[
            &os("decode"),
            &os("--perf"),
            perf.as_os_str(),
            &os("--search-dir"),
            dir.as_os_str(),
            &os("--raw"),
            &os(&format!("{}:0x4000e8", raw.display())),
        ])
    };
    assert_eq!(with_raw(&same).stdout, by_mmap.stdout);
    assert_ne!(with_raw(&other).stdout, by_mmap.stdout);
    // Symbols from the ELF found through the MMAP record.
    let calls = ptrewind(&[
        &os("decode"),
        &os("--perf"),
        perf.as_os_str(),
        &os("--search-dir"),
        dir.as_os_str(),
        &os("--format"),
        &os("calls"),
    ]);
    assert!(String::from_utf8_lossy(&calls.stdout).contains("\t_start"));
    // The CPU from the header (GenuineIntel,6,94,3: Skylake) and its errata, or --cpu's.
    let stats = ptrewind(&[
        &os("decode"),
        &os("--perf"),
        perf.as_os_str(),
        &os("--stats"),
    ]);
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(
        text.contains("cpu intel 6/0x5e/3 from perf.data header")
            && text.contains("errata bdm70,skd007,skd022,skd010,skl014,skl168"),
        "{text}"
    );
    let stats = ptrewind(&[
        &os("decode"),
        &os("--perf"),
        perf.as_os_str(),
        &os("--stats"),
        &os("--cpu"),
        &os("6/61"),
    ]);
    let text = String::from_utf8_lossy(&stats.stdout);
    assert!(text.contains("from --cpu errata bdm70,bdm64"), "{text}");

    // Without a way to find the binary: its recorded path is named with the hint, the decode
    // still runs and reports the missing code, exit status 2.
    let blind = ptrewind(&[&os("decode"), &os("--perf"), perf.as_os_str()]);
    assert_eq!(blind.status.code(), Some(2));
    let err = String::from_utf8_lossy(&blind.stderr);
    assert_eq!(
        err.matches("no code for /home/joerg/git/angr/hase/tests/bin/loopy/loopy")
            .count(),
        1,
        "{err}"
    );
    assert!(err.contains("0x400000-0x401000"), "{err}");
    assert!(err.contains("--search-dir"), "{err}");
    assert!(String::from_utf8_lossy(&blind.stdout).contains("[error: no code mapped"));
}

/// The quipper recordings have no binaries: every user-space file the MMAP records name is
/// reported, with the build id the perf.data holds (its `.buildids` listing is the oracle).
#[test]
fn decode_perf_cli_reports_quipper_missing_binaries() {
    let Some(corpus) = support::require_corpus("quipper_missing") else {
        return;
    };
    let q = corpus.join("quipper-perfdata-intel_pt");
    let listing = std::fs::read_to_string(q.join("perf.data.intel_pt-4.14.buildids")).unwrap();
    let ids: std::collections::HashMap<&str, &str> = listing
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(id, path)| (path.trim(), id))
        .collect();
    for file in ["perf.data.intel_pt-4.14", "perf.data.piped.intel_pt-4.14"] {
        let out = ptrewind(&[
            std::ffi::OsStr::new("decode"),
            std::ffi::OsStr::new("--perf"),
            q.join(file).as_os_str(),
        ]);
        assert_eq!(out.status.code(), Some(2), "{file}");
        let err = String::from_utf8_lossy(&out.stderr);
        for lib in [
            "/usr/bin/coreutils",
            "/lib64/libc-2.23.so",
            "/lib64/ld-2.23.so",
        ] {
            let lines: Vec<&str> = err
                .lines()
                .filter(|l| l.contains(&format!("no code for {lib} ")))
                .collect();
            assert_eq!(lines.len(), 1, "{file}: {lib}: {err}");
            if file == "perf.data.intel_pt-4.14" {
                assert!(lines[0].contains(ids[lib]), "{file}: {}", lines[0]);
            }
        }
        // The CPU comes from HEADER_CPUID (a feature section, or a HEADER_FEATURE record in
        // pipe mode); `perf report --header-only` prints "cpuid : GenuineIntel,6,78,3" for both.
        let stats = ptrewind(&[
            std::ffi::OsStr::new("decode"),
            std::ffi::OsStr::new("--perf"),
            q.join(file).as_os_str(),
            std::ffi::OsStr::new("--stats"),
        ]);
        let text = String::from_utf8_lossy(&stats.stdout);
        assert!(
            text.contains("cpu intel 6/0x4e/3 from perf.data header \"GenuineIntel,6,78,3\""),
            "{file}: {text}"
        );
        // Kernel mappings are not user-space images: never reported.
        assert!(!err.contains("kallsyms") && !err.contains(".ko"), "{err}");
        assert!(err.contains("hint:"));
    }
}

/// A file found by name whose build id differs from the recorded one is not used; the next
/// candidate with the right id is.
#[test]
fn build_id_mismatch_is_reported_not_used() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let good = build(&a, "prog", PROGRAM, &["-no-pie", "-Wl,--build-id=sha1"]);
    let other = build(
        &b,
        "prog",
        LIBRARY_MAIN,
        &["-no-pie", "-Wl,--build-id=sha1"],
    );
    // readelf is the oracle for the ids.
    let id_of = |p: &Path| {
        let notes = tool("readelf", &["-n", p.to_str().unwrap()]);
        notes
            .lines()
            .find_map(|l| l.trim().strip_prefix("Build ID: "))
            .unwrap()
            .trim()
            .to_string()
    };
    let (good_id, other_id) = (id_of(&good), id_of(&other));
    assert_ne!(good_id, other_id);
    let hex = |s: &str| {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect::<Vec<u8>>()
    };
    assert_eq!(
        elf_build_id(&std::fs::read(&good).unwrap()),
        Some(hex(&good_id))
    );
    let text = readelf_loads(&good).into_iter().find(|s| s.exec).unwrap();
    let recorded = "/build/machine/prog";
    let rec = MmapRecord {
        pid: 1,
        tid: 1,
        addr: text.vaddr & !0xfff,
        len: (text.filesz + (text.vaddr & 0xfff) + 0xfff) & !0xfff,
        pgoff: text.offset & !0xfff,
        filename: recorded.to_string(),
        exec: true,
    };
    let mut ids = std::collections::HashMap::new();
    ids.insert(recorded.to_string(), hex(&good_id));
    // b/prog (wrong id) is searched first, a/prog (right id) second.
    let opts = MmapOptions {
        search_dirs: vec![b.clone(), a.clone()],
        build_ids: ids.clone(),
        ..MmapOptions::default()
    };
    let out = Image::from_mmaps(std::slice::from_ref(&rec), &opts);
    assert!(out.missing.is_empty(), "{:?}", out.missing);
    assert_eq!(out.elfs[0].path, good);
    assert_eq!(
        read_image(&out.image, text.vaddr, text.filesz),
        file_bytes(&good, &text)
    );
    // Only the wrong one: reported with both ids, nothing mapped.
    let opts = MmapOptions {
        search_dirs: vec![b.clone()],
        build_ids: ids,
        ..MmapOptions::default()
    };
    let out = Image::from_mmaps(std::slice::from_ref(&rec), &opts);
    assert_eq!(out.missing.len(), 1);
    let reason = &out.missing[0].reason;
    assert!(
        reason.contains(&good_id) && reason.contains(&other_id) && reason.contains("differs"),
        "{reason}"
    );
    assert!(out.image.sections().is_empty());
    // Without a recorded id the first file found is used (nothing to check against).
    let opts = MmapOptions {
        search_dirs: vec![b.clone(), a],
        ..MmapOptions::default()
    };
    let out = Image::from_mmaps(std::slice::from_ref(&rec), &opts);
    assert_eq!(out.elfs[0].path, other);
}

const LIBRARY_MAIN: &str = r#"
int main(int argc, char **argv) { return argc * 7 + (int)(long)argv[0][0]; }
"#;

/// Sideband over time: an exec drops the process's earlier mappings; a later mapping replaces
/// the overlapped part of an earlier one; ITRACE_START names the traced process; MMAP2 build ids
/// are collected. A hand-made pipe-mode perf.data (layouts from the kernel's perf_event.h).
#[test]
fn perf_sideband_follows_exec_and_remaps() {
    fn record(kind: u32, misc: u16, body: &[u8]) -> Vec<u8> {
        let mut r = Vec::new();
        r.extend_from_slice(&kind.to_le_bytes());
        r.extend_from_slice(&misc.to_le_bytes());
        r.extend_from_slice(&((8 + body.len()) as u16).to_le_bytes());
        r.extend_from_slice(body);
        r
    }
    fn name(s: &str) -> Vec<u8> {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        while v.len() % 8 != 0 {
            v.push(0);
        }
        v
    }
    fn mmap(pid: u32, addr: u64, len: u64, file: &str) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [pid, pid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [addr, len, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend(name(file));
        record(1, 0, &b)
    }
    fn mmap2_build_id(pid: u32, addr: u64, len: u64, id: &[u8], file: &str) -> Vec<u8> {
        let mut b = Vec::new();
        for v in [pid, pid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [addr, len, 0] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        let mut area = [0u8; 24];
        area[0] = id.len() as u8;
        area[4..4 + id.len()].copy_from_slice(id);
        b.extend_from_slice(&area);
        b.extend_from_slice(&5u32.to_le_bytes()); // PROT_READ | PROT_EXEC
        b.extend_from_slice(&2u32.to_le_bytes()); // MAP_PRIVATE
        b.extend(name(file));
        record(10, 1 << 14, &b) // PERF_RECORD_MISC_MMAP_BUILD_ID
    }
    let mut file = b"PERFILE2".to_vec();
    file.extend_from_slice(&16u64.to_le_bytes());
    file.extend(mmap(7, 0x400000, 0x1000, "/old/shell"));
    file.extend(mmap(8, 0x400000, 0x1000, "/other/process"));
    let mut comm = Vec::new();
    comm.extend_from_slice(&7u32.to_le_bytes());
    comm.extend_from_slice(&7u32.to_le_bytes());
    comm.extend(name("prog"));
    file.extend(record(3, 1 << 13, &comm)); // PERF_RECORD_MISC_COMM_EXEC
    file.extend(mmap2_build_id(
        7,
        0x500000,
        0x2000,
        &[0xab; 20],
        "/new/prog",
    ));
    file.extend(mmap(7, 0x501000, 0x1000, "/new/libpatch"));
    let mut start = Vec::new();
    start.extend_from_slice(&7u32.to_le_bytes());
    start.extend_from_slice(&9u32.to_le_bytes());
    file.extend(record(12, 0, &start)); // PERF_RECORD_ITRACE_START (pid 7, tid 9)
    let perf = PerfData::parse(&file).unwrap();
    let sb = PerfSideband::read(&perf);
    assert_eq!(sb.malformed, 0);
    assert_eq!(sb.superseded_by_exec, 1);
    let names: Vec<&str> = sb.mmaps.iter().map(|m| m.filename.as_str()).collect();
    assert_eq!(names, ["/other/process", "/new/prog", "/new/libpatch"]);
    assert_eq!(sb.build_ids.get("/new/prog"), Some(&vec![0xab; 20]));
    assert_eq!(sb.pid_for_stream(None, Some(9)), Some(7));
    assert_eq!(sb.pid_for_stream(Some(0), None), Some(7));
    // Supply the files through `remap`: the later record replaces the second page.
    let dir = tempfile::tempdir().unwrap();
    let prog = dir.path().join("prog");
    let patch = dir.path().join("patch");
    std::fs::write(&prog, vec![0x11u8; 0x2000]).unwrap();
    std::fs::write(&patch, vec![0x22u8; 0x1000]).unwrap();
    let remap = |n: &str| match n {
        "/new/prog" => Some(prog.clone()),
        "/new/libpatch" => Some(patch.clone()),
        _ => None,
    };
    let out = Image::from_mmaps(
        &sb.mmaps,
        &MmapOptions {
            pid: Some(7),
            remap: Some(&remap),
            ..MmapOptions::default()
        },
    );
    assert!(out.missing.is_empty(), "{:?}", out.missing);
    assert_eq!(out.ignored_other_pid, 1);
    assert_eq!(
        read_image(&out.image, 0x500ffe, 4),
        [0x11, 0x11, 0x22, 0x22]
    );
    assert!(
        out.image.slice_at(0x400000).is_none(),
        "pre-exec mapping dropped"
    );
}
