//! Ground truth of the HASE recordings (`shared/corpus/hase-pt-recordings`): the instruction
//! addresses a `.trace` branch list implies. Self-contained (std only), so the crate's own unit
//! tests can `#[path]`-include it as well.

use std::path::Path;

/// `(address, mnemonic)` of every instruction `objdump -d` lists.
pub fn objdump_insns(exe: &Path) -> Vec<(u64, String)> {
    let out = std::process::Command::new("objdump")
        .arg("-d")
        .arg(exe)
        .output()
        .expect("objdump");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| {
            let mut f = l.split('\t');
            let addr = f.next()?.trim().strip_suffix(':')?;
            let _bytes = f.next()?;
            let mnemonic = f.next()?.split_whitespace().next()?.to_string();
            Some((u64::from_str_radix(addr, 16).ok()?, mnemonic))
        })
        .collect()
}

/// The executed instruction addresses the ground-truth branch list (`from<TAB>to`, 0 for trace
/// enable/disable) implies, with instruction boundaries and mnemonics from [`objdump_insns`]:
/// each segment runs from a branch target (or enable IP) to the next branch source. A disable's
/// source is included when it is a branch (the `syscall` that entered the kernel) and excluded
/// otherwise (tracing stopped asynchronously before it ran).
pub fn ground_truth(trace: &str, insns: &[(u64, String)]) -> Vec<u64> {
    let is_branch = |a: u64| {
        insns.iter().any(|(x, m)| {
            *x == a
                && (m.starts_with('j')
                    || ["call", "ret", "syscall", "sysenter", "int"]
                        .iter()
                        .any(|b| m.starts_with(b)))
        })
    };
    let mut out = Vec::new();
    let mut at: Option<u64> = None;
    for line in trace.lines() {
        let mut f = line.split_whitespace();
        let (Some(from), Some(to)) = (f.next(), f.next()) else {
            continue;
        };
        let from = u64::from_str_radix(from, 16).unwrap();
        let to = u64::from_str_radix(to, 16).unwrap();
        if let Some(start) = at
            && from != 0
        {
            let inclusive = to != 0 || is_branch(from);
            out.extend(
                insns
                    .iter()
                    .map(|(a, _)| *a)
                    .filter(|&a| a >= start && (a < from || (inclusive && a == from))),
            );
        }
        at = (to != 0).then_some(to);
    }
    out
}
