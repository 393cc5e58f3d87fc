//! `ptrewind view`: the flame graph and the call timeline, checked structurally.
//!
//! Ground truth is never our own output: for the HASE hardware traces, the corpus's branch
//! list with instruction boundaries from `objdump -d` and function addresses from `nm` gives
//! every executed instruction, from which this file derives the calls (its own small walk:
//! `call` opens a frame at the target, `ret` closes up to the frame expecting the return
//! address, a `jmp` to a function's first instruction is a tail call); for the recorded program,
//! its source fixes the call counts and depth, and `objdump` the length of its straight-line leaf.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

mod support;

use support::cbuild::compile_source;
use support::gdb::{Server, gdb_session, ptrewind};

/// One slice of a timeline: name, start and end (ns), instruction counts, track.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slice {
    name: String,
    begin: u64,
    end: u64,
    insns: u64,
    own: u64,
    tid: u64,
    depth: usize,
}

/// The `X` events of a trace-event JSON document, per track sorted by start (longest first on a
/// tie), with their nesting depth; fails unless every slice lies inside the one enclosing it.
fn slices(json: &serde_json::Value) -> Vec<Slice> {
    let ns = |v: &serde_json::Value| (v.as_f64().expect("number") * 1000.0).round() as u64;
    let mut all: Vec<Slice> = json["traceEvents"]
        .as_array()
        .expect("traceEvents")
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| {
            let begin = ns(&e["ts"]);
            Slice {
                name: e["name"].as_str().expect("name").to_string(),
                begin,
                end: begin + ns(&e["dur"]),
                insns: e["args"]["insns"].as_u64().expect("insns"),
                own: e["args"]["self"].as_u64().expect("self"),
                tid: e["tid"].as_u64().expect("tid"),
                depth: 0,
            }
        })
        .collect();
    all.sort_by_key(|s| (s.tid, s.begin, std::cmp::Reverse(s.end)));
    let mut open: Vec<(u64, u64)> = Vec::new(); // (tid, end)
    for s in &mut all {
        while open
            .last()
            .is_some_and(|&(tid, end)| tid != s.tid || end <= s.begin)
        {
            open.pop();
        }
        if let Some(&(_, end)) = open.last() {
            assert!(s.end <= end, "{s:?} overlaps its parent ending at {end}");
        }
        s.depth = open.len();
        open.push((s.tid, s.end));
    }
    // Starts are distinct within a track: the nesting is unambiguous.
    for w in all.windows(2) {
        assert!(
            w[0].tid != w[1].tid || w[0].begin < w[1].begin,
            "two slices start together: {w:?}"
        );
    }
    all
}

/// Runs `ptrewind view ARGS`; returns its output.
fn view(args: &[&std::ffi::OsStr]) -> Output {
    ptrewind()
        .arg("view")
        .args(args)
        .output()
        .expect("run ptrewind")
}

fn out_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("view")
        .join(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The `<title>` texts of an SVG, after checking it is well-formed XML.
fn svg_titles(svg: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(svg).expect("svg");
    let mut reader = quick_xml::Reader::from_str(&text);
    let mut titles = Vec::new();
    let mut in_title = false;
    let mut depth = 0i64;
    loop {
        match reader.read_event() {
            Ok(quick_xml::events::Event::Start(e)) => {
                depth += 1;
                in_title = e.name().as_ref() == b"title";
            }
            Ok(quick_xml::events::Event::End(_)) => {
                depth -= 1;
                in_title = false;
            }
            Ok(quick_xml::events::Event::Text(t)) if in_title => {
                titles.push(String::from_utf8_lossy(t.as_ref()).to_string());
            }
            Ok(quick_xml::events::Event::Eof) => break,
            Ok(_) => {}
            Err(e) => panic!("{}: not well-formed: {e}", svg.display()),
        }
    }
    assert_eq!(depth, 0, "{}: unbalanced elements", svg.display());
    titles
}

/// Inclusive instruction count per flame graph frame, from the titles
/// `NAME (COUNT instructions, P%)` (COUNT with thousands separators).
fn svg_frames(titles: &[String]) -> Vec<(String, u64)> {
    titles
        .iter()
        .filter_map(|t| {
            let (name, rest) = t.rsplit_once(" (")?;
            let count = rest.split_whitespace().next()?.replace(',', "");
            Some((name.to_string(), count.parse().ok()?))
        })
        .collect()
}

// ---- ground truth: the calls a HASE branch list implies ----

/// Function start addresses and their names (`nm`, text symbols; aliases share an address).
fn functions(exe: &Path) -> BTreeMap<u64, Vec<String>> {
    let out = std::process::Command::new("nm")
        .arg(exe)
        .output()
        .expect("nm");
    let mut map: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for l in String::from_utf8_lossy(&out.stdout).lines() {
        let f: Vec<&str> = l.split_whitespace().collect();
        if let [addr, kind, name] = f[..]
            && ["T", "t", "W", "w"].contains(&kind)
            && let Ok(addr) = u64::from_str_radix(addr, 16)
        {
            map.entry(addr).or_default().push(name.to_string());
        }
    }
    map
}

/// `(address, operation)` of every instruction `objdump -d` lists, the operation being the
/// mnemonic after any prefixes (`addr32 call` is a call, `repz ret` a return).
fn operations(exe: &Path) -> Vec<(u64, String)> {
    let out = std::process::Command::new("objdump")
        .arg("-d")
        .arg(exe)
        .output()
        .expect("objdump");
    const PREFIXES: &[&str] = &[
        "addr32", "data16", "bnd", "notrack", "repz", "repnz", "rep", "lock",
    ];
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let addr = f.next()?.trim().strip_suffix(':')?;
            let _bytes = f.next()?;
            let op = f
                .next()?
                .split_whitespace()
                .find(|w| !PREFIXES.contains(w))?
                .to_string();
            Some((u64::from_str_radix(addr, 16).ok()?, op))
        })
        .collect()
}

/// (name, first instruction, instructions, depth) of every call the executed instructions
/// `run` imply, in order of their first instruction.
fn truth_calls(
    run: &[u64],
    insns: &[(u64, String)],
    funcs: &BTreeMap<u64, Vec<String>>,
) -> Vec<(Vec<String>, u64, u64, usize)> {
    let mnemonic: HashMap<u64, &str> = insns.iter().map(|(a, m)| (*a, m.as_str())).collect();
    let next_insn: HashMap<u64, u64> = insns.windows(2).map(|w| (w[0].0, w[1].0)).collect();
    let func = |a: u64| {
        funcs
            .range(..=a)
            .next_back()
            .map(|(_, n)| n.clone())
            .unwrap()
    };
    // (name, return address, first instruction)
    let mut stack: Vec<(Vec<String>, u64, u64)> = vec![(func(run[0]), 0, 0)];
    let mut out = Vec::new();
    let close = |stack: &mut Vec<(Vec<String>, u64, u64)>, out: &mut Vec<_>, at: u64| {
        let (name, _, begin) = stack.pop().unwrap();
        out.push((name, begin, at - begin, stack.len()));
    };
    for (i, &a) in run.iter().enumerate() {
        let Some(&next) = run.get(i + 1) else { break };
        let at = i as u64 + 1;
        let m = mnemonic[&a];
        if m.starts_with("call") {
            let ret = next_insn[&a];
            if next != ret {
                stack.push((func(next), ret, at));
            }
        } else if m.starts_with("ret") {
            match stack.iter().skip(1).rposition(|f| f.1 == next) {
                Some(k) => {
                    while stack.len() > k + 1 {
                        close(&mut stack, &mut out, at);
                    }
                }
                None => panic!("return at {a:#x} to {next:#x} matches no frame"),
            }
        } else if m.starts_with("jmp")
            && funcs.contains_key(&next)
            && func(next) != stack.last().unwrap().0
        {
            let ret = stack.last().unwrap().1;
            close(&mut stack, &mut out, at);
            stack.push((func(next), ret, at));
        }
    }
    while !stack.is_empty() {
        close(&mut stack, &mut out, run.len() as u64);
    }
    out.sort_by_key(|c| (c.1, std::cmp::Reverse(c.2)));
    out
}

fn hase() -> Option<PathBuf> {
    Some(support::require_corpus("view")?.join("hase-pt-recordings"))
}

/// The HASE `control_flow` recording (a static musl program: start-up, `main`, `raise`):
/// every call of the ground truth is a slice with the same function, first instruction,
/// instruction count and depth, and nothing else is; the flame graph has a frame per call
/// stack with the summed counts.
#[test]
fn hase_trace_matches_the_ground_truth_calls() {
    let Some(dir) = hase() else { return };
    let exe = dir.join("control_flow-20180404/control_flow");
    let pt = dir.join("extracted-aux/control_flow-20180404T163033.aux.bin");
    let insns = support::hase::objdump_insns(&exe);
    let ops = operations(&exe);
    let run = support::hase::ground_truth(
        &std::fs::read_to_string(
            dir.join("control_flow-20180404/control_flow-20180404T163033.trace"),
        )
        .unwrap(),
        &insns,
    );
    // The helper takes a disable's source as executed when it is a branch; this trace has an
    // asynchronous disable (FUP + TIP.PGD, an interrupt) at `call *(%rbx)`, which ran only
    // after tracing resumed there: the instruction appears twice in a row. Nothing in this
    // program branches to itself, so a repeat is always that.
    let mut run = run;
    run.dedup();
    let truth = truth_calls(&run, &ops, &functions(&exe));
    assert!(truth.len() > 10, "{truth:?}");
    let main = |c: &(Vec<String>, u64, u64, usize)| c.0.contains(&"main".to_string());
    assert!(truth.iter().any(|c| main(c) && c.3 == 3), "{truth:?}");

    let out = out_dir("hase");
    let (json, svg, folded) = (out.join("t.json"), out.join("f.svg"), out.join("f.txt"));
    let o = view(&[
        "--pt".as_ref(),
        pt.as_os_str(),
        "--elf".as_ref(),
        exe.as_os_str(),
        "--json".as_ref(),
        json.as_os_str(),
        "--svg".as_ref(),
        svg.as_os_str(),
        "--folded".as_ref(),
        folded.as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("{} instructions", run.len())),
        "ground truth: {} instructions\n{stderr}",
        run.len()
    );

    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    // This raw trace's time does not move while instructions run: instruction clock, where a
    // slice starts at its first instruction's number in microseconds.
    assert_eq!(doc["otherData"]["time"], "instructions");
    let got: Vec<(String, u64, u64, usize)> = slices(&doc)
        .into_iter()
        .map(|s| (s.name, s.begin / 1000, s.insns, s.depth))
        .collect();
    assert_eq!(got.len(), truth.len(), "{got:?}\n{truth:?}");
    for (g, t) in got.iter().zip(&truth) {
        // The view names a function by one of the symbols at its address.
        assert!(
            t.0.contains(&g.0) && (g.1, g.2, g.3) == (t.1, t.2, t.3),
            "{g:?} is not {t:?}\n{got:?}\n{truth:?}"
        );
    }

    // Flame graph: one frame per distinct stack, its inclusive count the sum over its calls.
    let mut stacks: BTreeMap<Vec<String>, u64> = BTreeMap::new();
    let mut path: Vec<String> = Vec::new();
    for ((name, ..), (_, _, n, depth)) in got.iter().zip(&truth) {
        path.truncate(*depth);
        path.push(name.clone());
        *stacks.entry(path.clone()).or_default() += n;
    }
    let frames = svg_frames(&svg_titles(&svg));
    for (stack, n) in &stacks {
        let name = stack.last().unwrap();
        assert!(
            frames.iter().any(|(f, c)| f == name && c == n),
            "no frame {name} with {n} instructions (stack {stack:?}) in {frames:?}"
        );
    }
    let total: u64 = std::fs::read_to_string(&folded)
        .unwrap()
        .lines()
        .map(|l| l.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
        .sum();
    assert_eq!(total, run.len() as u64);
}

/// The same program recorded by perf (2018-05, code found through the perf.data's MMAP
/// records): a TSC clock from perf's time conversion, the same call structure as the raw trace
/// of the same program, and slices that nest on the track of the traced thread.
#[test]
fn perf_data_timeline_uses_the_trace_clock() {
    let Some(dir) = hase() else { return };
    let rec = dir.join("control_flow-20180515");
    let bins = rec.join("binaries/home/joerg/git/hase/tests/bin/control_flow");
    let out = out_dir("perf");
    let o = view(&[
        "--perf".as_ref(),
        rec.join("perf.data.1").as_os_str(),
        "--search-dir".as_ref(),
        bins.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    // The vdso is not in the recording: reported as decode does, and not needed here.
    assert!(stderr.contains("no code for [vdso]"), "{stderr}");
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("timeline.json")).unwrap()).unwrap();
    assert_eq!(doc["otherData"]["time"], "tsc");
    assert!(
        doc["otherData"]["clock"]
            .as_str()
            .unwrap()
            .contains("time_mult"),
        "{}",
        doc["otherData"]
    );
    let s = slices(&doc);
    let shape: Vec<(&str, usize)> = s.iter().map(|x| (x.name.as_str(), x.depth)).collect();
    assert_eq!(shape[0], ("_start", 0));
    assert!(shape.contains(&("main", 3)), "{shape:?}");
    assert!(shape.contains(&("raise", 4)), "{shape:?}");
    // Real time: the whole run took microseconds, not instruction counts.
    let span = s[0].end - s[0].begin;
    assert!(span > 1_000 && span < 10_000_000, "{span} ns");
    // The thread's track: the per-CPU stream (cpu1) split into its thread, named after it.
    let tid = s[0].tid;
    assert_eq!(tid, 11181);
    assert!(
        doc["traceEvents"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "thread_name"
                && e["tid"] == tid
                && e["args"]["name"] == "tid11181"),
        "{doc}"
    );
    svg_titles(&out.join("flame.svg"));
}

/// Bad input: the errors `decode` gives, a non-zero exit, and no output file left behind.
#[test]
fn bad_input_fails_clearly_without_output() {
    let out = out_dir("bad");
    let svg = out.join("f.svg");
    let missing = out.join("missing.pt");
    let o = view(&[
        "--pt".as_ref(),
        missing.as_os_str(),
        "--svg".as_ref(),
        svg.as_os_str(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("missing.pt"), "{err}");
    // A trace without any code to decode it against.
    let pt = out.join("trace.pt");
    std::fs::write(&pt, [0x02u8, 0x82].repeat(8)).unwrap();
    let o = view(&[
        "--pt".as_ref(),
        pt.as_os_str(),
        "--svg".as_ref(),
        svg.as_os_str(),
    ]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no code for the trace"), "{err}");
    // Nothing to write.
    let o = view(&["--pt".as_ref(), pt.as_os_str()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("nothing to write"));
    // A saved recording that is not one.
    let o = view(&[out.as_os_str(), "--svg".as_ref(), svg.as_os_str()]);
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("manifest.json"));
    assert!(!svg.exists());
    assert_eq!(std::fs::read_dir(&out).unwrap().count(), 1, "only trace.pt");
}

// ---- a recorded program with known call structure ----

const DEPTH: u32 = 4;
const TOP_CALLS: u32 = 3;

fn program_source() -> String {
    format!(
        r#"
static volatile int sink;
__attribute__((noinline)) int leaf(int x) {{ return x * 2 + 1; }}
__attribute__((noinline)) int rec(int d) {{
    if (d == 0)
        return leaf(d);
    return rec(d - 1) + leaf(d);
}}
__attribute__((noinline)) void done(void) {{ sink++; }}
int main(void) {{
    int s = 0;
    for (int i = 0; i < {TOP_CALLS}; i++)
        s += rec({DEPTH});
    sink = s;
    done();
    return 0;
}}
"#
    )
}

/// Records the program with `ptrewind record --backend ptrace` (the software encoder: recording
/// starts at `main`, symbols from the process's mappings) up to `done`, saves it (`monitor
/// save`), and returns the program and the saved directory.
fn record_program(name: &str, extra: &[String]) -> (PathBuf, PathBuf, support::gdb::GdbRun) {
    let dir = out_dir(name);
    let exe = compile_source("cc", &dir, "calls", &program_source(), &["-O1", "-g"], &[]);
    let saved = dir.join("saved");
    let mut cmds = vec![
        "break done".to_string(),
        "continue".to_string(),
        format!("monitor save {}", saved.display()),
    ];
    cmds.extend(extra.iter().cloned());
    let server = Server::spawn(
        ptrewind()
            .args([
                "record",
                "--backend",
                "ptrace",
                "--listen",
                "127.0.0.1:0",
                "--",
            ])
            .arg(&exe),
    );
    let r = gdb_session(server, &exe, &cmds, Duration::from_secs(120));
    assert!(saved.join("manifest.json").is_file(), "{}", r.dump());
    (exe, dir, r)
}

/// Instructions of `leaf` (straight-line code: every one runs once per call), from objdump.
fn leaf_length(exe: &Path) -> u64 {
    let funcs = functions(exe);
    let start = *funcs
        .iter()
        .find(|(_, n)| n.iter().any(|x| x == "leaf"))
        .unwrap()
        .0;
    let end = *funcs.range(start + 1..).next().unwrap().0;
    let insns = support::hase::objdump_insns(exe);
    let body: Vec<&(u64, String)> = insns
        .iter()
        .filter(|(a, _)| *a >= start && *a < end)
        .collect();
    assert!(
        body.iter()
            .all(|(_, m)| !m.starts_with('j') && !m.starts_with("call")),
        "leaf is not straight-line: {body:?}"
    );
    // Up to and including its `ret` (padding after it never runs).
    let ret = body.iter().position(|(_, m)| m.starts_with("ret")).unwrap();
    ret as u64 + 1
}

/// Checks the call structure of the recorded program in a timeline and a flame graph.
fn check_program(exe: &Path, json: &Path, svg: &Path) {
    let doc: serde_json::Value = serde_json::from_slice(&std::fs::read(json).unwrap()).unwrap();
    let s = slices(&doc);
    // Recording starts at main, which has not returned at `done`: the outermost slice.
    assert_eq!(s[0].name, "main", "{s:?}");
    assert_eq!(s[0].depth, 0);
    let recs: Vec<&Slice> = s.iter().filter(|x| x.name == "rec").collect();
    let leaves: Vec<&Slice> = s.iter().filter(|x| x.name == "leaf").collect();
    assert_eq!(recs.len() as u32, TOP_CALLS * (DEPTH + 1), "{s:?}");
    assert_eq!(leaves.len() as u32, TOP_CALLS * (DEPTH + 1), "{s:?}");
    assert_eq!(
        recs.iter().filter(|r| r.depth == 1).count() as u32,
        TOP_CALLS
    );
    assert_eq!(recs.iter().map(|r| r.depth).max(), Some(DEPTH as usize + 1));
    let n = leaf_length(exe);
    for l in &leaves {
        assert_eq!((l.insns, l.own), (n, n), "{l:?}");
    }
    // Every rec(d) contains rec(d-1) .. rec(0) and a leaf per level: its count is its own
    // instructions plus its callees'.
    for (i, r) in s.iter().enumerate().filter(|(_, x)| x.name == "rec") {
        let kids: Vec<&Slice> = s[i + 1..]
            .iter()
            .take_while(|k| k.depth > r.depth)
            .filter(|k| k.depth == r.depth + 1)
            .collect();
        assert_eq!(
            r.insns,
            r.own + kids.iter().map(|k| k.insns).sum::<u64>(),
            "{r:?} {kids:?}"
        );
        assert!(kids.iter().all(|k| k.name == "rec" || k.name == "leaf"));
        assert_eq!(kids.iter().filter(|k| k.name == "leaf").count(), 1);
    }
    let frames = svg_frames(&svg_titles(svg));
    for f in ["main", "rec", "leaf"] {
        assert!(frames.iter().any(|(n, _)| n == f), "{f} not in {frames:?}");
    }
    // The deepest leaf's frame: one per top-level call.
    let deepest = frames
        .iter()
        .filter(|(n, _)| n == "leaf")
        .map(|(_, c)| *c)
        .min();
    assert_eq!(deepest, Some(n * TOP_CALLS as u64));
}

/// A program recorded with `ptrewind record` and saved: `ptrewind view DIR` shows its
/// recursion — the calls, their nesting and their instruction counts.
#[test]
fn recorded_program_shows_its_recursion() {
    let live = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("view/recorded-live");
    let _ = std::fs::remove_dir_all(&live);
    let (exe, dir, r) = record_program("recorded", &[format!("monitor view {}", live.display())]);
    let out = dir.join("out");
    let o = view(&[
        dir.join("saved").as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    check_program(&exe, &out.join("timeline.json"), &out.join("flame.svg"));
    // --min-insns: short calls are left out of the timeline, their callers keep their counts.
    let n = leaf_length(&exe);
    let small = dir.join("small.json");
    let o = view(&[
        dir.join("saved").as_os_str(),
        "--json".as_ref(),
        small.as_os_str(),
        "--min-insns".as_ref(),
        (n + 1).to_string().as_ref(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let (all, few) = (slices(&read(&out.join("timeline.json"))), read(&small));
    let kept: Vec<Slice> = all.iter().filter(|s| s.insns > n).cloned().collect();
    let few_slices: Vec<(String, u64, u64)> = slices(&few)
        .into_iter()
        .map(|s| (s.name, s.begin, s.insns))
        .collect();
    assert_eq!(
        few_slices,
        kept.iter()
            .map(|s| (s.name.clone(), s.begin, s.insns))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        few["otherData"]["slices_omitted"].as_u64(),
        Some((all.len() - kept.len()) as u64)
    );
    // `monitor view DIR` in the live session: the same calls, from the history so far.
    r.expect("timeline.json (timeline: open it in ui.perfetto.dev)");
    assert!(!r.gdb.contains("note:"), "{}", r.dump());
    check_program(&exe, &live.join("timeline.json"), &live.join("flame.svg"));
    assert_eq!(
        slices(&read(&live.join("timeline.json"))),
        slices(&read(&out.join("timeline.json")))
    );
    // And in `ptrewind replay` of the saved recording.
    let replayed = dir.join("replayed");
    let _ = std::fs::remove_dir_all(&replayed);
    let server = Server::replay(&dir.join("saved"));
    let cmds = [format!("monitor view {}", replayed.display())];
    let r = gdb_session(server, &exe, &cmds, Duration::from_secs(60));
    r.expect("timeline.json (timeline: open it in ui.perfetto.dev)");
    assert_eq!(
        slices(&read(&replayed.join("timeline.json"))),
        slices(&read(&out.join("timeline.json")))
    );
}

/// A headless Chromium opens the flame graph, runs its search (`?s=`) and takes a
/// screenshot (skipped when `chromium` is not installed; see docs/view.md).
#[test]
fn chromium_renders_and_searches_the_flame_graph() {
    if !support::cbuild::have("chromium") {
        eprintln!("chromium not installed: skipped");
        return;
    }
    let Some(dir) = hase() else { return };
    let out = out_dir("chromium");
    let svg = out.join("flame.svg");
    let o = view(&[
        "--pt".as_ref(),
        dir.join("extracted-aux/control_flow-20180404T163033.aux.bin")
            .as_os_str(),
        "--elf".as_ref(),
        dir.join("control_flow-20180404/control_flow").as_os_str(),
        "--svg".as_ref(),
        svg.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let url = format!("file://{}?s=init", svg.display());
    let chromium = |extra: &[&str]| {
        let mut cmd = std::process::Command::new("chromium");
        cmd.args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
        ])
        .arg(format!("--user-data-dir={}", out.join("profile").display()))
        .args(extra)
        .arg(&url);
        support::gdb::run_until(&mut cmd, Duration::from_secs(60))
    };
    // The DOM after the page's script ran: the search highlighted the matches.
    let dom = chromium(&["--dump-dom"]);
    assert!(dom.stdout.contains("__init_libc"), "{}", dom.stderr);
    assert!(
        dom.stdout.contains("Matched: "),
        "search did not run: {}",
        dom.stdout
    );
    let png = out.join("flame.png");
    let shot = chromium(&[
        "--window-size=1600,300",
        &format!("--screenshot={}", png.display()),
    ]);
    let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{e}: {}", shot.stderr));
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 5_000,
        "{}",
        bytes.len()
    );
}

/// A QEMU-backend recording of a two-thread program: `ptrewind view --qemu DIR` has one track
/// per thread, each with exactly its thread's calls (known counts and depths), and functions
/// named from the recorded mappings.
#[test]
fn qemu_recording_has_a_track_per_thread() {
    use ptrewind::capture::qemu::recording::find_plugin;
    use ptrewind::capture::qemu::{QemuConfig, QemuRecording};
    if !support::cbuild::have("qemu-x86_64") {
        eprintln!("qemu-x86_64 not installed: skipped");
        return;
    }
    let plugin = find_plugin(Path::new(env!("CARGO_BIN_EXE_ptrewind")))
        .expect("the QEMU plugin is built with the workspace");
    let dir = out_dir("qemu");
    let src = r#"
#include <pthread.h>
__attribute__((noinline)) int leaf(int x) { return x * 2 + 1; }
__attribute__((noinline)) int rec(int d) { return d == 0 ? leaf(d) : rec(d - 1) + leaf(d); }
static void *worker(void *a) {
    (void)a;
    int s = 0;
    for (int i = 0; i < 50; i++)
        s += rec(6);
    return (void *)(long)s;
}
int main(void) {
    pthread_t t;
    pthread_create(&t, 0, worker, 0);
    int s = 0;
    for (int i = 0; i < 20; i++)
        s += rec(3);
    pthread_join(t, 0);
    return s & 1;
}
"#;
    let exe = compile_source("cc", &dir, "threads", src, &["-O1", "-g"], &["-lpthread"]);
    let mut cfg = QemuConfig::new(plugin);
    cfg.dir = Some(dir.join("rec"));
    let mut rec = QemuRecording::spawn_with(&cfg, &exe, &[], |c| {
        c.stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
    })
    .expect("spawn qemu");
    rec.wait().expect("qemu ran the plugin");
    let out = dir.join("out");
    let o = view(&[
        "--qemu".as_ref(),
        dir.join("rec").as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let doc: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("timeline.json")).unwrap()).unwrap();
    let s = slices(&doc);
    let mut tids: Vec<u64> = s.iter().map(|x| x.tid).collect();
    tids.dedup();
    assert_eq!(tids.len(), 2, "one track per thread: {tids:?}");
    // main: 20 calls of rec(3) (4 frames each); the worker: 50 of rec(6) (7 each).
    let mut per_track: Vec<(usize, usize)> = tids
        .iter()
        .map(|&t| {
            let recs: Vec<&Slice> = s.iter().filter(|x| x.tid == t && x.name == "rec").collect();
            let outer = recs.iter().map(|r| r.depth).min().unwrap_or(0);
            let deepest = recs.iter().map(|r| r.depth).max().unwrap_or(0);
            (recs.len(), deepest + 1 - outer)
        })
        .collect();
    per_track.sort();
    assert_eq!(per_track, [(20 * 4, 4), (50 * 7, 7)]);
    let leaves = s.iter().filter(|x| x.name == "leaf").count();
    assert_eq!(leaves, 20 * 4 + 50 * 7);
    let frames = svg_frames(&svg_titles(&out.join("flame.svg")));
    assert!(frames.iter().any(|(n, _)| n == "worker"), "{frames:?}");
}
