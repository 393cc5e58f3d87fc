//! The inspection monitor commands' texts: `monitor where`, `history`, `calls`, `insns`.

use std::collections::BTreeSet;

use super::Recorder;
use crate::image::{ElfSpec, Symbolizer};
use crate::target::Target;

/// Symbols of every file-backed object mapped at offset 0 in `maps` (`/proc/PID/maps` lines).
pub(crate) fn symbolizer_from_maps(maps: &str) -> Symbolizer {
    let mut sym = Symbolizer::new();
    let text = maps;
    let mut seen = BTreeSet::new();
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 6 || !f[5].starts_with('/') || f[2] != "00000000" {
            continue;
        }
        let Some(start) = f[0]
            .split('-')
            .next()
            .and_then(|a| u64::from_str_radix(a, 16).ok())
        else {
            continue;
        };
        if seen.insert(f[5].to_string()) {
            // An object that cannot be read just has no symbols.
            let _ = sym.add_file(&ElfSpec::new(f[5], Some(start)));
        }
    }
    sym
}

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

pub(super) fn parse_count(args: &str, default: u64) -> Result<u64, String> {
    let a = args.trim();
    if a.is_empty() {
        return Ok(default);
    }
    a.parse::<u64>()
        .map_err(|_| format!("expected a number, got '{a}'"))
}

/// How far back `monitor history`/`calls` decode at most.
const SCAN_WINDOW: u64 = 200_000;

impl Recorder {
    fn symbolizer(&mut self) -> &Symbolizer {
        if self.symbols.is_none() {
            let maps = match self.live.as_mut() {
                Some(live) => {
                    let pid = Target::pid(live.ptrace());
                    std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default()
                }
                None => String::new(),
            };
            self.symbols = Some(symbolizer_from_maps(&maps));
        }
        self.symbols.get_or_insert_with(Symbolizer::new)
    }

    /// The PC at the cursor, if known.
    fn cursor_pc(&mut self) -> Option<u64> {
        let pos = self.position();
        if pos < self.len() {
            return self.insn_ip(pos);
        }
        if let Some(pc) = self.snapshots.pc(pos)
            && self.live.is_none()
        {
            return Some(pc);
        }
        if self.exited.is_some() {
            return None;
        }
        self.live
            .as_mut()
            .and_then(|l| l.present_gprs().ok())
            .map(|r| r.rip)
    }

    /// The `monitor where` text.
    pub fn where_text(&mut self) -> String {
        let len = self.len();
        let pos = self.position();
        let pc = self.cursor_pc();
        let place = pc.map_or_else(String::new, |pc| {
            format!(", pc {pc:#x} in {}", describe(self.symbolizer(), pc))
        });
        if self.live.is_none() {
            let at = if pos >= len { " (the end)" } else { "" };
            format!("replaying: instruction {pos} of {len}{at}{place}\n")
        } else if pos < len {
            format!("replaying: instruction {pos} of {len}{place}\n")
        } else {
            format!("at the present: instruction {pos} of {len} (live){place}\n")
        }
    }

    /// Branches (from, to) among the instructions before the cursor, oldest first, at most `max`.
    fn branches(&mut self, max: u64) -> Vec<(u64, u64, u64)> {
        let end = self.position();
        let start = end.saturating_sub(SCAN_WINDOW);
        let mut out: std::collections::VecDeque<(u64, u64, u64)> = Default::default();
        let mut prev: Option<(u64, u64, u8)> = None;
        // Include the cursor's instruction, so the last branch into it counts.
        let upto = (end + 1).min(self.len());
        self.for_each_insn(start, upto, |n, ip, len| {
            if let Some((pn, pip, plen)) = prev
                && pip.wrapping_add(u64::from(plen)) != ip
            {
                out.push_back((pn, pip, ip));
                if out.len() as u64 > max {
                    out.pop_front();
                }
            }
            prev = Some((n, ip, len));
        });
        out.into_iter().collect()
    }

    /// The `monitor history [N]` text.
    pub fn history_text(&mut self, max: u64) -> String {
        let branches = self.branches(max);
        if branches.is_empty() {
            return "no branches recorded before the cursor\n".into();
        }
        let mut out = String::new();
        for (n, from, to) in branches {
            let sym = self.symbolizer();
            out.push_str(&format!(
                "{n:>10}  {from:#014x} {}\n            -> {to:#014x} {}\n",
                describe(sym, from),
                describe(sym, to)
            ));
        }
        out
    }

    /// The `monitor calls [N]` text: function segments before the cursor, indented by call
    /// depth (a transfer to a function's first byte is a call, any other change of function a
    /// return), like GDB's `record function-call-history`.
    pub fn calls_text(&mut self, max: u64) -> String {
        let end = (self.position() + 1).min(self.len());
        let start = end.saturating_sub(SCAN_WINDOW);
        let mut ips: Vec<(u64, u64)> = Vec::new();
        self.for_each_insn(start, end, |n, ip, _| ips.push((n, ip)));
        let sym = self.symbolizer().clone();
        // (first insn, last insn, depth, function name)
        let mut segs: Vec<(u64, u64, i64, String)> = Vec::new();
        let mut depth: i64 = 0;
        for (n, ip) in ips {
            let (name, off) = sym
                .symbol(ip)
                .map_or(("??".to_string(), u64::MAX), |(s, o)| (s.to_string(), o));
            match segs.last_mut() {
                Some(last) if last.3 == name && off != 0 => last.1 = n,
                Some(_) => {
                    depth += if off == 0 { 1 } else { -1 };
                    segs.push((n, n, depth, name));
                }
                None => segs.push((n, n, 0, name)),
            }
        }
        let min = segs.iter().map(|s| s.2).min().unwrap_or(0);
        let skip = segs.len().saturating_sub(max as usize);
        let mut out = String::new();
        for (i, (a, b, d, name)) in segs.iter().enumerate().skip(skip) {
            out.push_str(&format!(
                "{i:>6}\t{}{name}\tinst {a},{b}\n",
                "  ".repeat((d - min) as usize)
            ));
        }
        if out.is_empty() {
            out.push_str("no instructions recorded before the cursor\n");
        }
        out
    }
}
