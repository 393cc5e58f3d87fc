//! The saved-recording format (`monitor save DIR`), read back by [`offline`](super::offline):
//! `trace.pt`, the code as raw sections, `manifest.json` (sections, registers at the start,
//! the stops and the end, counters), `maps.json` and a `README` with the commands that decode
//! and replay it.

use super::files::{MAX_PROGRAM_FILE, SavedFiles, program_files, saved_name};
use super::{MONITOR_INDEX_WAIT, Timeline};
use crate::store::dirfile::RecordingDir;
use crate::target::X86Registers;
use crate::target::files::open_host_file;
use crate::target::regs::gpr;

/// Writes one file of a recording being saved (its name, its bytes).
type PutFile<'a> = dyn FnMut(&str, &[u8]) -> Result<(), String> + 'a;

/// The `format` of a saved recording's `manifest.json`.
pub const SAVE_FORMAT: &str = "ptrewind-recording-1";

/// The general-purpose registers as a manifest object (`{"rip": "0x...", ...}`).
fn regs_json(r: &X86Registers) -> serde_json::Value {
    serde_json::Value::Object(
        gpr::NAMES
            .iter()
            .zip(r.gprs)
            .map(|(n, v)| (n.to_string(), serde_json::Value::String(format!("{v:#x}"))))
            .collect(),
    )
}

/// Whether every general-purpose register of `r` is known (PC-only register files are not
/// saved: the manifest has no way to say "unavailable").
fn complete(r: &X86Registers) -> bool {
    // GDB registers 0-15: rax … r15.
    (0..16).all(|n| !r.unavailable.contains(n))
}

impl Timeline {
    /// Writes a self-contained recording into `dir` (`monitor save DIR`): `trace.pt`, the code
    /// as raw sections (`code-ADDR.bin`), `manifest.json` (sections, registers at the first
    /// recorded instruction and after the last one, counters), `maps.json` and a `README` with
    /// the exact `ptrewind decode` and `ptrewind replay` commands; with it the auxiliary
    /// vector (`auxv.bin`), the stack at the end (`stack-ADDR.bin`) and `libraries_xml`, the
    /// loader's library list the server read (`libraries-svr4.xml`), so that a replay shows
    /// a PIE or dynamically linked program as the live session did. Returns a summary.
    pub fn save(
        &mut self,
        dir: &std::path::Path,
        libraries_xml: Option<&str>,
    ) -> Result<String, String> {
        let insns = self.ensure_indexed(MONITOR_INDEX_WAIT)?;
        // Never through a planted link, only plain names, new files (see `store::dirfile`).
        let out = RecordingDir::create(dir).map_err(|e| e.to_string())?;
        // The manifest is what makes a directory a recording: the old one goes first and the
        // new one is written last, so a save that fails half-way never leaves a directory
        // that claims to be complete.
        out.remove("manifest.json").map_err(|e| e.to_string())?;
        let mut written: Vec<String> = Vec::new();
        let result = self.save_files(&out, insns, libraries_xml, &mut written);
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

    /// The files of [`Timeline::save`], `manifest.json` last; `written` collects the names
    /// created so far.
    fn save_files(
        &mut self,
        out: &RecordingDir,
        insns: u64,
        libraries_xml: Option<&str>,
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
        // The present program's code; the programs before an exec follow in `exec_periods`.
        for sec in self.present.sections() {
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
        let exec_periods = self.save_exec_periods(&mut put)?;
        let (pid, exe, maps_text) = match self.live.as_mut() {
            Some(live) => (live.pid(), live.exec_path(), live.maps()),
            None => {
                let info = self.offline.clone().unwrap_or_default();
                (info.pid, info.exe, info.maps)
            }
        };
        // What a debugger needs to place the program and its libraries (auxv: the PIE load
        // address, the loader's rendezvous) and to unwind at the end (the stack).
        let auxv = match self.live.as_mut() {
            Some(live) => live.auxv().ok(),
            None => self.offline.as_ref().and_then(|o| o.auxv.clone()),
        };
        if let Some(a) = &auxv {
            put("auxv.bin", a)?;
        }
        let libraries_xml = libraries_xml
            .map(str::to_string)
            .or_else(|| self.offline.as_ref().and_then(|o| o.libraries_xml.clone()));
        if let Some(x) = &libraries_xml {
            put("libraries-svr4.xml", x.as_bytes())?;
        }
        let (files, unsaved) = self.save_program_files(
            &mut put,
            &maps_text,
            exe.as_deref(),
            libraries_xml.as_deref(),
        )?;
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
            Some(live) if self.exited.is_none() => live.read_registers().ok(),
            Some(_) => None,
            None => self.snapshots.get(insns),
        };
        let logged_start = match (&present, self.live.as_ref()) {
            (Some(p), Some(live)) => live.recorded_state().and_then(|l| l.registers_at(0, p)),
            _ => None,
        };
        let start = logged_start.or_else(|| self.snapshots.get(0));
        let mut stack_file = None;
        if let (Some(p), Some(live)) = (&present, self.live.as_mut()) {
            // From the red zone below the stack pointer to the top of its mapping.
            let sp = p.gprs[gpr::RSP].saturating_sub(128);
            let top = maps_text.lines().find_map(|l| {
                let range = l.split_whitespace().next()?;
                let (a, b) = range.split_once('-')?;
                let (a, b) = (
                    u64::from_str_radix(a, 16).ok()?,
                    u64::from_str_radix(b, 16).ok()?,
                );
                (sp >= a && sp < b).then_some(b)
            });
            if let Some(top) = top {
                let len = usize::try_from((top - sp).min(8 << 20)).unwrap_or(0);
                let mut bytes = vec![0; len];
                let mut got = 0;
                while got < len {
                    match live.read_memory(sp + got as u64, &mut bytes[got..]) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                }
                bytes.truncate(got);
                if !bytes.is_empty() {
                    let name = format!("stack-{sp:x}.bin");
                    put(&name, &bytes)?;
                    stack_file =
                        Some(serde_json::json!({"file": name, "addr": format!("{sp:#x}")}));
                }
            }
        }
        // Every register file captured at a position (start, stops): the general-purpose
        // registers, for `ptrewind replay`.
        let stops: Vec<serde_json::Value> = self
            .snapshots
            .positions()
            .filter(|&n| n <= insns)
            .filter_map(|n| {
                let r = self.snapshots.get(n)?;
                // Only complete register files: a PC alone (a thread's faulting instruction)
                // would come back as registers of value 0.
                if !complete(&r) {
                    return None;
                }
                Some(serde_json::json!({
                    "position": n,
                    "registers": regs_json(&r),
                }))
            })
            .collect();
        let backend = self.live.as_ref().map_or("offline replay", |l| l.name());
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
            "exec_periods": exec_periods,
            "tid": self.tid(),
            "registers_at_start": start.as_ref().filter(|r| complete(r)).map(regs_json),
            "registers_at_end": present.as_ref().filter(|r| complete(r)).map(regs_json),
            "registers_at_stops": stops,
            "auxv": auxv.as_ref().map(|_| "auxv.bin"),
            "libraries": libraries_xml.as_ref().map(|_| "libraries-svr4.xml"),
            "memory_at_end": stack_file.into_iter().collect::<Vec<_>>(),
            "files": files.to_json(),
        });
        let cmd = format!(
            "ptrewind decode --pt {} {}",
            dir.join("trace.pt").display(),
            raw_args.join(" ")
        );
        let exec_note = if self.exec_bounds.is_empty() {
            String::new()
        } else {
            format!(
                "The program called exec {} time(s): the code of each earlier program is in \
                 exec<K>-code-*.bin, and `exec_periods` in manifest.json says from which \
                 trace offset and instruction the next one ran. The command below decodes the \
                 whole trace against the last program; `ptrewind replay` uses every program's \
                 code.\n\n",
                self.exec_bounds.len()
            )
        };
        let readme = format!(
            "A ptrewind recording ({backend}).\n\n\
             trace.pt       Intel PT packets of {} instructions\n\
             code-*.bin     the executable mappings' bytes (see manifest.json for addresses)\n\
             manifest.json  sections, registers at the first recorded instruction, at the end and \
             at every stop\n\
             maps.json      /proc/PID/maps when saved\n\
             file-*         the executable and shared libraries (GDB reads them through the \
             replay server)\n\n\
             {exec_note}Decode with:\n\n    {cmd}\n\n\
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
        let unsaved = if unsaved.is_empty() {
            String::new()
        } else {
            format!("not saved (unreadable): {}\n", unsaved.join(", "))
        };
        Ok(format!(
            "saved {} trace bytes, {} instructions, {} code sections, {} program files to {}\n\
             {unsaved}decode with: {cmd}\n",
            trace.len(),
            insns,
            self.present.sections().len(),
            files.names().len(),
            dir.display()
        ))
    }

    /// Writes the code of every program before an exec (`exec<K>-code-ADDR.bin`) and returns
    /// the manifest's `exec_periods`: for each, where the next program starts (history position
    /// and trace offset), its executable, mappings and code sections.
    fn save_exec_periods(&self, put: &mut PutFile<'_>) -> Result<serde_json::Value, String> {
        let mut periods = Vec::new();
        for (k, b) in self.exec_bounds.iter().enumerate() {
            let mut sections = Vec::new();
            for sec in b.image.sections() {
                let name = format!("exec{k}-code-{:x}.bin", sec.addr);
                put(&name, sec.data())?;
                sections.push(serde_json::json!({
                    "file": name,
                    "addr": format!("{:#x}", sec.addr),
                    "len": sec.data().len(),
                    "origin": &*sec.origin,
                }));
            }
            periods.push(serde_json::json!({
                "cause": b.cause,
                "next_insn": b.next_insn,
                "next_offset": b.next_offset,
                "exe": b.exe.as_ref().map(|e| e.display().to_string()),
                "maps": b.maps.lines().collect::<Vec<_>>(),
                "sections": sections,
            }));
        }
        Ok(serde_json::Value::Array(periods))
    }

    /// Saves the executable and the libraries (see [`super::files`]) through `put`: from the
    /// host for a live process, copied from the recording for a replay. Returns the table for
    /// the manifest and the files that could not be read (said in the summary; a replay then
    /// serves the host's file if there is one).
    fn save_program_files(
        &mut self,
        put: &mut PutFile<'_>,
        maps_text: &str,
        exe: Option<&std::path::Path>,
        libraries_xml: Option<&str>,
    ) -> Result<(SavedFiles, Vec<String>), String> {
        let mut saved = SavedFiles::default();
        let mut unsaved = Vec::new();
        if self.live.is_none() {
            let old = self
                .offline
                .as_ref()
                .map(|o| o.files.clone())
                .unwrap_or_default();
            for name in old.names() {
                let bytes = old
                    .read_name(name)
                    .map_err(|e| format!("{name} of the replayed recording: {e}"))?;
                put(name, &bytes)?;
            }
            saved.paths = old.paths;
            return Ok((saved, unsaved));
        }
        let mut copies: Vec<(std::path::PathBuf, String)> = Vec::new();
        for (path, canonical) in program_files(maps_text, exe, libraries_xml) {
            if let Some((_, name)) = copies.iter().find(|(c, _)| *c == canonical) {
                saved.paths.push((path, name.clone()));
                continue;
            }
            let name = saved_name(copies.len(), &canonical);
            let bytes = open_host_file(&canonical).and_then(|f| {
                let len = f.stat()?.size.min(MAX_PROGRAM_FILE);
                let mut buf = vec![0; usize::try_from(len).unwrap_or(0)];
                let mut got = 0;
                while got < buf.len() {
                    match f.read_at(&mut buf[got..], got as u64)? {
                        0 => break,
                        n => got += n,
                    }
                }
                buf.truncate(got);
                Ok(buf)
            });
            match bytes {
                Ok(bytes) => {
                    put(&name, &bytes)?;
                    copies.push((canonical, name.clone()));
                    saved.paths.push((path, name));
                }
                Err(e) => unsaved.push(format!("{} ({e})", path.display())),
            }
        }
        Ok((saved, unsaved))
    }
}
