//! The recording's monitor commands (`stats`, `record`, `where`, `goto`, `past`, `save`,
//! `history`, `calls`, `insns`) and the `monitor save` format read back by
//! [`offline`](super::offline).

use super::inspect::parse_count;
use super::{MONITOR_INDEX_WAIT, Recorder, RecordingTarget};
use crate::capture::soft::Regs;
use crate::capture::soft::state_log::{REG_NAMES, regs_to_array};
use crate::server::MonitorRegistry;
use crate::store::dirfile::RecordingDir;
use crate::target::Target;

/// The `format` of a saved recording's `manifest.json`.
pub const SAVE_FORMAT: &str = "ptrewind-recording-1";

fn regs_json(r: &Regs) -> serde_json::Value {
    serde_json::Value::Object(
        REG_NAMES
            .iter()
            .zip(regs_to_array(r))
            .map(|(n, v)| (n.to_string(), serde_json::Value::String(format!("{v:#x}"))))
            .collect(),
    )
}

impl Recorder {
    /// Writes a self-contained recording into `dir` (`monitor save DIR`): `trace.pt`, the code
    /// as raw sections (`code-ADDR.bin`), `manifest.json` (sections, registers at the first
    /// recorded instruction and after the last one, counters), `maps.json` and a `README` with
    /// the exact `ptrewind decode` and `ptrewind replay` commands. Returns a summary.
    pub fn save(&mut self, dir: &std::path::Path) -> Result<String, String> {
        let insns = self.ensure_indexed(MONITOR_INDEX_WAIT)?;
        // Never through a planted link, only plain names, new files (see `store::dirfile`).
        let out = RecordingDir::create(dir).map_err(|e| e.to_string())?;
        // The manifest is what makes a directory a recording: the old one goes first and the
        // new one is written last, so a save that fails half-way never leaves a directory
        // that claims to be complete.
        out.remove("manifest.json").map_err(|e| e.to_string())?;
        let mut written: Vec<String> = Vec::new();
        let result = self.save_files(&out, insns, &mut written);
        if let Err(e) = result {
            for name in &written {
                let _ = out.remove(name);
            }
            return Err(format!(
                "{e}; nothing saved (the {} file(s) written before were removed)",
                written.len()
            ));
        }
        result
    }

    /// The files of [`Recorder::save`], `manifest.json` last; `written` collects the names
    /// created so far.
    fn save_files(
        &mut self,
        out: &RecordingDir,
        insns: u64,
        written: &mut Vec<String>,
    ) -> Result<String, String> {
        let dir = out.path();
        let mut put = |name: &str, bytes: &[u8]| {
            written.push(name.to_string());
            out.write(name, bytes).map_err(|e| e.to_string())
        };
        let trace = self.store.to_vec();
        put("trace.pt", &trace)?;
        let mut sections = Vec::new();
        let mut raw_args = Vec::new();
        for sec in self.image.sections() {
            let name = format!("code-{:x}.bin", sec.addr);
            put(&name, sec.data())?;
            raw_args.push(format!(
                "--raw {}:{:#x}",
                dir.join(&name).display(),
                sec.addr
            ));
            sections.push(serde_json::json!({
                "file": name,
                "addr": format!("{:#x}", sec.addr),
                "len": sec.data().len(),
                "origin": &*sec.origin,
            }));
        }
        let (pid, exe, maps_text) = match self.live.as_mut() {
            Some(live) => {
                let pid = Target::pid(live.ptrace());
                let exe = live.ptrace().exec_path();
                let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
                (pid, exe, maps)
            }
            None => {
                let info = self.offline.clone().unwrap_or_default();
                (info.pid, info.exe, String::new())
            }
        };
        let maps: Vec<serde_json::Value> = maps_text
            .lines()
            .map(|l| serde_json::Value::String(l.to_string()))
            .collect();
        put(
            "maps.json",
            serde_json::to_string_pretty(&maps)
                .unwrap_or_default()
                .as_bytes(),
        )?;
        let present = match self.live.as_mut() {
            Some(live) if self.exited.is_none() => live.present_gprs().ok(),
            Some(_) => None,
            None => self.snapshots.get(insns).map(|r| r.to_libc()),
        };
        let logged_start = match (present, self.live.as_ref()) {
            (Some(p), Some(live)) => live.state_log().and_then(|l| l.registers_at(0, &p)),
            _ => None,
        };
        let start = logged_start.or_else(|| self.snapshots.get(0).map(|r| r.to_libc()));
        // Every register file captured at a position (start, stops): the general-purpose
        // registers, for `ptrewind replay`.
        let stops: Vec<serde_json::Value> = self
            .snapshots
            .positions()
            .filter(|&n| n <= insns)
            .filter_map(|n| {
                let r = self.snapshots.get(n)?;
                Some(serde_json::json!({
                    "position": n,
                    "registers": regs_json(&r.to_libc()),
                }))
            })
            .collect();
        let backend = self.live.as_ref().map_or("offline replay", |l| l.backend());
        let manifest = serde_json::json!({
            "format": SAVE_FORMAT,
            "backend": backend,
            "pid": pid,
            "exe": exe.map(|e| e.display().to_string()),
            "trace": "trace.pt",
            "trace_bytes": trace.len(),
            "lost_bytes": self.store.lost(),
            "instructions": insns,
            "recorded_instructions": self.live.as_ref().and_then(|l| l.recorded()),
            "sync_points": self.worker.stats().sync_points,
            "sections": sections,
            "registers_at_start": start.as_ref().map(regs_json),
            "registers_at_end": present.as_ref().map(regs_json),
            "registers_at_stops": stops,
        });
        let cmd = format!(
            "ptrewind decode --pt {} {}",
            dir.join("trace.pt").display(),
            raw_args.join(" ")
        );
        let readme = format!(
            "A ptrewind recording ({backend}).\n\n\
             trace.pt       Intel PT packets of {} instructions\n\
             code-*.bin     the executable mappings' bytes (see manifest.json for addresses)\n\
             manifest.json  sections, registers at the first recorded instruction, at the end and \
             at every stop\n\
             maps.json      /proc/PID/maps when saved\n\n\
             Decode with:\n\n    {cmd}\n\n\
             Debug it (reverse execution, PC-only) with:\n\n    ptrewind replay {}\n",
            insns,
            dir.display()
        );
        put("README", readme.as_bytes())?;
        put(
            "manifest.json",
            serde_json::to_string_pretty(&manifest)
                .unwrap_or_default()
                .as_bytes(),
        )?;
        Ok(format!(
            "saved {} trace bytes, {} instructions, {} code sections to {}\ndecode with: {cmd}\n",
            trace.len(),
            insns,
            self.image.sections().len(),
            dir.display()
        ))
    }

    /// The `monitor stats` text.
    pub fn stats_text(&mut self) -> String {
        // The check needs the complete index; the counters are shown either way.
        let indexed = self.ensure_indexed(MONITOR_INDEX_WAIT);
        let h = self.worker.stats();
        let mut out = String::new();
        let mut line = |k: &str, v: String| {
            out.push_str(&format!("{k:<24} {v}\n"));
        };
        match (self.live.as_ref(), self.offline.as_ref()) {
            (Some(live), _) => line("backend", live.backend().into()),
            (None, Some(o)) => line("backend", format!("offline replay of {}", o.source)),
            (None, None) => line("backend", "offline replay".into()),
        }
        line("past reads", self.past_reads_text().into());
        if self.live.is_some() {
            line(
                "recording",
                if self.record_wanted { "on" } else { "off" }.into(),
            );
        }
        line("trace bytes", self.store.len().to_string());
        line("lost bytes", self.store.lost().to_string());
        line("gaps", self.store.gaps().len().to_string());
        if let Some(live) = self.live.as_ref() {
            live.stats(&mut line);
        }
        line("history instructions", h.insns.to_string());
        line("sync points (PSB)", h.sync_points.to_string());
        line("decode lag (bytes)", h.decode_lag.to_string());
        line("indexed trace bytes", h.indexed_bytes.to_string());
        line(
            "index bytes",
            format!(
                "{} ({:.4} per trace byte)",
                h.index_bytes,
                h.index_bytes as f64 / h.trace_bytes.max(1) as f64
            ),
        );
        line("index updates", h.updates.to_string());
        line(
            "indexed at last stop",
            format!("{} instructions (in the background)", self.indexed_at_stop),
        );
        line(
            "index complete",
            if h.complete { "yes" } else { "no" }.into(),
        );
        line("decode errors", h.errors.to_string());
        line("overflows", h.overflows.to_string());
        line("untraced runs", self.untraced_runs.to_string());
        line("reverse floor", self.floor().to_string());
        let known = if self.snapshots.is_empty() {
            "0".to_string()
        } else {
            let mut at: Vec<String> = self
                .snapshots
                .positions()
                .take(8)
                .map(|n| n.to_string())
                .collect();
            if self.snapshots.len() > at.len() {
                at.push("…".into());
            }
            format!(
                "{} ({} distinct XSAVE images; at instructions {})",
                self.snapshots.len(),
                self.snapshots.distinct_xsave_images(),
                at.join(", ")
            )
        };
        line("known register files", known);
        line("stop trace problems", self.stop_errors.to_string());
        line(
            "cursor",
            match self.cursor {
                Some(n) => format!("{n} (replaying)"),
                None => format!("{} (present)", self.len()),
            },
        );
        let recorded = self.live.as_ref().and_then(|l| l.recorded());
        let logged = self
            .live
            .as_ref()
            .and_then(|l| l.state_log())
            .map(|l| l.len() as u64);
        let consistent = recorded.is_none_or(|r| h.insns == r && logged.is_none_or(|l| l == r));
        line(
            "history check",
            if let Err(e) = indexed {
                format!("pending: {e}")
            } else if recorded.is_none() && self.checks.length_mismatches == 0 {
                "not applicable: the backend does not count instructions (the trace is the \
                 only record)"
                    .into()
            } else if consistent && self.checks.length_mismatches == 0 {
                "ok: history length == recorded instructions".into()
            } else {
                format!(
                    "ERROR: history {} vs recorded {:?} vs state log {:?}; {} mismatching \
                     stop(s){}",
                    h.insns,
                    recorded,
                    logged,
                    self.checks.length_mismatches,
                    self.checks
                        .last_mismatch
                        .as_ref()
                        .map(|m| format!(" (last: {m})"))
                        .unwrap_or_default()
                )
            },
        );
        if self.checks.pc_mismatches > 0 {
            line(
                "replay PC check",
                format!(
                    "ERROR: {} position(s) where the state log's RIP differs from the trace",
                    self.checks.pc_mismatches
                ),
            );
        }
        if self.checks.snapshot_mismatches > 0 {
            line(
                "register file check",
                format!(
                    "ERROR: {} captured register file(s) whose RIP differs from the trace at \
                     their position (not served)",
                    self.checks.snapshot_mismatches
                ),
            );
        }
        out
    }
}

/// Registers the recording monitor commands (`stats`, `record`, `where`, `goto`, `past`,
/// `save`, `history`, `calls`, `insns`) on `registry`, over the shared state of a [`RecordingTarget`].
pub fn register_monitors(registry: &mut MonitorRegistry, target: &RecordingTarget) {
    let s = target.shared();
    registry.register(
        "stats",
        "trace, history and state-log statistics, with the history consistency check",
        move |_, _| Ok(s.borrow_mut().stats_text()),
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
        move |_, _| Ok(s.borrow_mut().where_text()),
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
            Ok(r.where_text())
        },
    );
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
        move |_, a| {
            if a.trim().is_empty() {
                return Err("usage: monitor save DIR".into());
            }
            s.borrow_mut().save(std::path::Path::new(a.trim()))
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
            Ok(r.history_text(n))
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
            Ok(r.calls_text(n))
        },
    );
    let s = target.shared();
    registry.register(
        "insns",
        "insns FROM TO|end: the address of each history instruction FROM..TO (at most 100000)",
        move |_, a| insns_text(&mut s.borrow_mut(), a),
    );
}

/// `monitor insns FROM TO`: one `N 0xADDR` line per history instruction in `FROM..TO`.
fn insns_text(r: &mut Recorder, args: &str) -> Result<String, String> {
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
