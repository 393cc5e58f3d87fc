//! The recording's monitor commands (`stats`, `record`, `where`, `goto`, `past`, `save`,
//! `history`, `calls`, `insns`): argument parsing and the texts, over a [`Timeline`].

use super::RecordingTarget;
use crate::image::Symbolizer;
use crate::server::MonitorRegistry;
use crate::timeline::{MONITOR_INDEX_WAIT, Timeline};

/// `function+off (file:line)` for an address.
fn describe(sym: &Symbolizer, addr: u64) -> String {
    let mut s = match sym.symbol(addr) {
        Some((name, 0)) => name.to_string(),
        Some((name, off)) => format!("{name}+{off}"),
        None => "??".to_string(),
    };
    if let Some((file, line)) = sym.line(addr) {
        let short = file.rsplit('/').next().unwrap_or(&file).to_string();
        s.push_str(&format!(" at {short}:{line}"));
    }
    s
}

fn parse_count(args: &str, default: u64) -> Result<u64, String> {
    let a = args.trim();
    if a.is_empty() {
        return Ok(default);
    }
    a.parse::<u64>()
        .map_err(|_| format!("expected a number, got '{a}'"))
}

/// The `monitor where` text.
pub fn where_text(t: &mut Timeline) -> String {
    let len = t.len();
    let pos = t.position();
    let pc = t.cursor_pc();
    let place = pc.map_or_else(String::new, |pc| {
        format!(", pc {pc:#x} in {}", describe(t.symbolizer(), pc))
    });
    if !t.is_live() {
        let at = if pos >= len { " (the end)" } else { "" };
        format!("replaying: instruction {pos} of {len}{at}{place}\n")
    } else if pos < len {
        format!("replaying: instruction {pos} of {len}{place}\n")
    } else {
        format!("at the present: instruction {pos} of {len} (live){place}\n")
    }
}

/// The `monitor history [N]` text.
fn history_text(t: &mut Timeline, max: u64) -> String {
    let branches = t.branches(max);
    if branches.is_empty() {
        return "no branches recorded before the cursor\n".into();
    }
    let mut out = String::new();
    for b in branches {
        let sym = t.symbolizer();
        out.push_str(&format!(
            "{:>10}  {:#014x} {}\n            -> {:#014x} {}\n",
            b.at,
            b.from,
            describe(sym, b.from),
            b.to,
            describe(sym, b.to)
        ));
    }
    out
}

/// The `monitor calls [N]` text: function segments before the cursor, indented by call depth.
fn calls_text(t: &mut Timeline, max: u64) -> String {
    let mut out = String::new();
    for s in t.call_segments(max) {
        out.push_str(&format!(
            "{:>6}\t{}{}\tinst {},{}\n",
            s.index,
            "  ".repeat(s.depth),
            s.function,
            s.first,
            s.last
        ));
    }
    if out.is_empty() {
        out.push_str("no instructions recorded before the cursor\n");
    }
    out
}

/// The `monitor stats` text.
pub fn stats_text(t: &mut Timeline) -> String {
    let mut out = String::new();
    t.stats(&mut |k: &str, v: String| {
        out.push_str(&format!("{k:<24} {v}\n"));
    });
    out
}

/// Registers the recording monitor commands (`stats`, `record`, `where`, `goto`, `past`,
/// `save`, `history`, `calls`, `insns`, `view`) on `registry`, over the shared state of a
/// [`RecordingTarget`].
pub fn register_monitors(registry: &mut MonitorRegistry, target: &RecordingTarget) {
    let s = target.shared();
    registry.register(
        "stats",
        "trace, history and state-log statistics, with the history consistency check",
        move |_, _| Ok(stats_text(&mut s.borrow_mut())),
    );
    let s = target.shared();
    registry.register(
        "record",
        "record on|off: turn recording on or off",
        move |_, a| {
            let on = match a.trim() {
                "on" => true,
                "off" => false,
                "" => {
                    return Ok(format!(
                        "recording is {}\n",
                        if s.borrow().recording_wanted() {
                            "on"
                        } else {
                            "off"
                        }
                    ));
                }
                other => return Err(format!("expected 'on' or 'off', got '{other}'")),
            };
            s.borrow_mut().set_recording(on)?;
            Ok(format!("recording {}\n", if on { "on" } else { "off" }))
        },
    );
    let s = target.shared();
    registry.register(
        "where",
        "instruction number of the cursor and of the present",
        move |_, _| Ok(where_text(&mut s.borrow_mut())),
    );
    let s = target.shared();
    registry.register(
        "goto",
        "goto N|begin|end: move the replay cursor (then 'maintenance flush register-cache')",
        move |_, a| {
            let mut r = s.borrow_mut();
            let len = r.ensure_indexed(MONITOR_INDEX_WAIT)?;
            let n = match a.trim() {
                "begin" | "start" => r.floor(),
                "end" | "present" => r.end(),
                other => other
                    .parse::<u64>()
                    .map_err(|_| format!("expected N, begin or end, got '{other}'"))?,
            };
            if n > len {
                return Err(format!("instruction {n} is beyond the history ({len})"));
            }
            r.goto(n)?;
            Ok(where_text(&mut r))
        },
    );
    for (name, help, finish) in [
        (
            "reverse-finish",
            "reverse-finish: back to the call into the function at the cursor, in the selected \
             thread, from the decoded calls and returns (a past without a stack pointer)",
            true,
        ),
        (
            "reverse-next",
            "reverse-next: back to the start of this source line or the one before it in the \
             same function, in the selected thread (calls stepped over), from the decoded \
             calls and returns",
            false,
        ),
    ] {
        let s = target.shared();
        registry.register(name, help, move |_, _| {
            let mut r = s.borrow_mut();
            r.ensure_indexed(MONITOR_INDEX_WAIT)?;
            let n = if finish {
                r.reverse_finish_target()?
            } else {
                r.reverse_next_target()?
            };
            r.goto(n)?;
            Ok(where_text(&mut r))
        });
    }
    let s = target.shared();
    registry.register(
        "past",
        "what reads of registers and memory in the past return here (state log or PC-only)",
        move |_, _| Ok(format!("{}\n", s.borrow().past_reads_text())),
    );
    let s = target.shared();
    registry.register(
        "save",
        "save DIR: write the recording (trace, code, registers, manifest) to DIR",
        move |t, a| {
            if a.trim().is_empty() {
                return Err("usage: monitor save DIR".into());
            }
            // The loader's list as the debugger sees it now (read through the target, before
            // the timeline is borrowed for saving); a replay serves it as saved.
            let list = crate::server::svr4::read_library_list(&*t);
            let xml = (!list.objects.is_empty() || list.main_lm != 0).then(|| list.to_xml());
            let dir = std::path::Path::new(a.trim());
            let mut r = s.borrow_mut();
            match r.save_threads(dir, xml.as_deref()) {
                Some(done) => done,
                None => r.save(dir, xml.as_deref()),
            }
        },
    );
    let s = target.shared();
    registry.register(
        "history",
        "history [N]: the last N branches before the cursor (default 10)",
        move |_, a| {
            let n = parse_count(a, 10)?;
            let mut r = s.borrow_mut();
            r.ensure_indexed(MONITOR_INDEX_WAIT)?;
            Ok(history_text(&mut r, n))
        },
    );
    let s = target.shared();
    registry.register(
        "calls",
        "calls [N]: the last N function segments before the cursor, indented by call depth",
        move |_, a| {
            let n = parse_count(a, 20)?;
            let mut r = s.borrow_mut();
            r.ensure_indexed(MONITOR_INDEX_WAIT)?;
            Ok(calls_text(&mut r, n))
        },
    );
    let s = target.shared();
    registry.register(
        "insns",
        "insns FROM TO|end: the address of each history instruction FROM..TO (at most 100000)",
        move |_, a| insns_text(&mut s.borrow_mut(), a),
    );
    let s = target.shared();
    registry.register(
        "threads",
        "every recorded thread: its position (instructions executed) and PC at the cursor",
        move |_, _| Ok(threads_text(&mut s.borrow_mut())),
    );
    let s = target.shared();
    registry.register(
        "thread",
        "thread [TID]: the selected thread (the one that steps and that monitor commands \
         show), or select TID",
        move |_, a| {
            let mut r = s.borrow_mut();
            let a = a.trim();
            if !a.is_empty() {
                let tid = a
                    .parse::<i32>()
                    .map_err(|_| format!("expected a thread id, got '{a}'"))?;
                if !r.select_thread(tid) {
                    return Err(format!("no thread {tid} in the recording"));
                }
            }
            Ok(format!("thread {} selected\n", r.tid()))
        },
    );
    super::view_monitor::register_view_monitor(registry, target);
}

/// The `monitor threads` text: one line per thread, the selected one marked.
fn threads_text(t: &mut Timeline) -> String {
    let selected = t.tid();
    let mut out = String::new();
    if let Some((pos, total)) = t.global_position() {
        out.push_str(&format!(
            "global position {pos} of {total} (all threads' instructions in time order)\n"
        ));
    }
    for why in t.skipped_threads() {
        out.push_str(&format!("  not served: {why}\n"));
    }
    let mut present = false;
    for p in t.thread_positions() {
        let mark = if p.tid == selected { '*' } else { ' ' };
        let state = match p.position {
            Some((n, len)) => {
                let note = if n == 0 {
                    " (not started)"
                } else if n + 1 >= len {
                    " (at its end)"
                } else {
                    ""
                };
                format!(": instruction {n} of {len}{note}")
            }
            None => {
                present = true;
                if p.exited {
                    ": exited"
                } else {
                    ": at the present"
                }
                .to_string()
            }
        };
        let place = match p.pc {
            Some(pc) => format!(", pc {pc:#x} in {}", describe(t.symbolizer(), pc)),
            // An ended thread without its last registers: nothing more to say.
            None if p.exited => String::new(),
            None => ", pc unknown".to_string(),
        };
        out.push_str(&format!("{mark} thread {}{state}{place}\n", p.tid));
    }
    if present {
        out.push_str(
            "(each thread's position in the recording is counted once the past is entered: \
             step back once)\n",
        );
    }
    out
}

/// `monitor insns FROM TO`: one `N 0xADDR` line per history instruction in `FROM..TO`.
fn insns_text(r: &mut Timeline, args: &str) -> Result<String, String> {
    const MAX: u64 = 100_000;
    let usage = || format!("usage: monitor insns FROM TO|end (got '{args}')");
    let len = r.len();
    let mut it = args.split_whitespace().map(|w| match w {
        "end" | "present" => Ok(len),
        n => n.parse::<u64>(),
    });
    let (Some(Ok(from)), Some(Ok(to)), None) = (it.next(), it.next(), it.next()) else {
        return Err(usage());
    };
    if to < from || to - from > MAX {
        return Err(format!(
            "FROM..TO must be ascending and at most {MAX} instructions"
        ));
    }
    let len = r.len();
    if to > len {
        return Err(format!("instruction {to} is beyond the history ({len})"));
    }
    let mut out = String::new();
    r.for_each_insn(from, to, |n, ip, _| {
        use std::fmt::Write as _;
        let _ = writeln!(out, "{n} {ip:#x}");
    });
    Ok(out)
}
