//! The saved-recording format (`monitor save DIR`), read back by [`offline`](super::offline):
//! `trace.pt`, the code as raw sections, `manifest.json` (sections, registers at the start,
//! the stops and the end, counters), `maps.json` and a `README` with the commands that decode
//! and replay it.

use super::{MONITOR_INDEX_WAIT, Timeline};
use crate::target::X86Registers;
use crate::target::regs::gpr;

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

impl Timeline {
    /// Writes a self-contained recording into `dir` (`monitor save DIR`): `trace.pt`, the code
    /// as raw sections (`code-ADDR.bin`), `manifest.json` (sections, registers at the first
    /// recorded instruction and after the last one, counters), `maps.json` and a `README` with
    /// the exact `ptrewind decode` and `ptrewind replay` commands. Returns a summary.
    pub fn save(&mut self, dir: &std::path::Path) -> Result<String, String> {
        let insns = self.ensure_indexed(MONITOR_INDEX_WAIT)?;
        let io = |what: &str, e: std::io::Error| format!("{what}: {e}");
        std::fs::create_dir_all(dir).map_err(|e| io(&dir.display().to_string(), e))?;
        let trace = self.store.to_vec();
        std::fs::write(dir.join("trace.pt"), &trace).map_err(|e| io("trace.pt", e))?;
        let mut sections = Vec::new();
        let mut raw_args = Vec::new();
        for sec in self.image.sections() {
            let name = format!("code-{:x}.bin", sec.addr);
            std::fs::write(dir.join(&name), sec.data()).map_err(|e| io(&name, e))?;
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
            Some(live) => (live.pid(), live.exec_path(), live.maps()),
            None => {
                let info = self.offline.clone().unwrap_or_default();
                (info.pid, info.exe, String::new())
            }
        };
        let maps: Vec<serde_json::Value> = maps_text
            .lines()
            .map(|l| serde_json::Value::String(l.to_string()))
            .collect();
        std::fs::write(
            dir.join("maps.json"),
            serde_json::to_string_pretty(&maps).unwrap_or_default(),
        )
        .map_err(|e| io("maps.json", e))?;
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
            "registers_at_start": start.as_ref().map(regs_json),
            "registers_at_end": present.as_ref().map(regs_json),
            "registers_at_stops": stops,
        });
        std::fs::write(
            dir.join("manifest.json"),
            serde_json::to_string_pretty(&manifest).unwrap_or_default(),
        )
        .map_err(|e| io("manifest.json", e))?;
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
        std::fs::write(dir.join("README"), readme).map_err(|e| io("README", e))?;
        Ok(format!(
            "saved {} trace bytes, {} instructions, {} code sections to {}\ndecode with: {cmd}\n",
            trace.len(),
            insns,
            self.image.sections().len(),
            dir.display()
        ))
    }
}
