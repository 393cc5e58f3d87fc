//! LLDB's packets that gdbstub does not answer (or answers in a form LLDB misreads): host and
//! process info (`qHostInfo`/`qProcessInfo`: hex pid, `ostype`, which LLDB needs to pick its
//! Linux dynamic loader), memory regions (`qMemoryRegionInfo`, from the target's maps file, so
//! a replay or a QEMU guest answers with its own), and `qShlibInfoAddr` (where LLDB's POSIX
//! dynamic loader finds `r_debug`). The reply to `k` (`X09`, as lldb-server) is set in the
//! router's dispatch.

use std::path::PathBuf;

use super::super::GdbStubAdapter;
use super::super::rsp::hex_encode;
use super::{Intercept, Router};
use crate::image::procfs::MapEntry;

/// The largest maps file read for `qMemoryRegionInfo`.
const MAX_MAPS: u64 = 16 << 20;

/// LLDB's `qMemoryRegionInfo` reply for `addr`: the mapping that contains it (with
/// permissions and the hex-encoded file name), or the unmapped gap around it.
pub fn memory_region_info(maps: &[MapEntry], addr: u64) -> String {
    if let Some(m) = maps.iter().find(|m| m.start <= addr && addr < m.end) {
        let perms: String = m.perms().chars().take(3).filter(|&c| c != '-').collect();
        let mut out = format!(
            "start:{:x};size:{:x};permissions:{perms};",
            m.start,
            m.end - m.start
        );
        if let Some(name) = m
            .path
            .as_deref()
            .filter(|n| !n.is_empty() && !n.starts_with('['))
        {
            out.push_str(&format!("name:{};", hex_encode(name.as_bytes())));
        }
        return out;
    }
    let start = maps
        .iter()
        .map(|m| m.end)
        .filter(|&e| e <= addr)
        .max()
        .unwrap_or(0);
    let end = maps
        .iter()
        .map(|m| m.start)
        .filter(|&s| s > addr)
        .min()
        .unwrap_or(u64::MAX);
    format!("start:{start:x};size:{:x};", end - start)
}

/// The `qHostInfo` / `qProcessInfo` reply (LLDB's format: hex pid, hex-encoded triple).
fn lldb_info(pid: Option<i32>) -> String {
    let triple = hex_encode(b"x86_64-pc-linux-gnu");
    let mut out = String::new();
    if let Some(pid) = pid {
        out.push_str(&format!("pid:{pid:x};"));
    }
    out.push_str(&format!(
        "triple:{triple};ostype:linux;vendor:pc;endian:little;ptrsize:8;"
    ));
    out
}

/// The target's memory mappings, from its maps file as it serves it (a live process's
/// `/proc/PID/maps`, a replay's saved one, a QEMU guest's own).
fn target_maps(session: &mut GdbStubAdapter) -> Option<Vec<MapEntry>> {
    let pid = session.target().pid();
    let file = session
        .target_mut()
        .open_file(&PathBuf::from(format!("/proc/{pid}/maps")))
        .ok()?;
    let mut text = Vec::new();
    let mut off = 0u64;
    let mut buf = vec![0u8; 64 << 10];
    while off < MAX_MAPS {
        let n = file.read_at(&mut buf, off).ok()?;
        if n == 0 {
            break;
        }
        text.extend_from_slice(&buf[..n]);
        off += n as u64;
    }
    let text = String::from_utf8_lossy(&text);
    Some(crate::image::procfs::parse_maps_lenient(&text).collect())
}

/// Registers the LLDB packets on `router`.
pub(super) fn register(router: &mut Router) {
    router.intercept(b"qHostInfo", |_, _, body| {
        if body != b"qHostInfo" {
            return Intercept::Pass;
        }
        Intercept::Reply(lldb_info(None).into_bytes())
    });
    router.intercept(b"qMemoryRegionInfo:", |session, _, body| {
        let hex = &body[b"qMemoryRegionInfo:".len()..];
        let addr = std::str::from_utf8(hex)
            .ok()
            .and_then(|h| u64::from_str_radix(h, 16).ok());
        match (addr, target_maps(session)) {
            (Some(addr), Some(maps)) => {
                Intercept::Reply(memory_region_info(&maps, addr).into_bytes())
            }
            _ => Intercept::Reply(b"E01".to_vec()),
        }
    });
    router.intercept(b"qShlibInfoAddr", |session, _, body| {
        if body != b"qShlibInfoAddr" {
            return Intercept::Pass;
        }
        match super::super::svr4::shlib_info_addr(session.target()) {
            Some(addr) => Intercept::Reply(format!("{addr:x}").into_bytes()),
            None => Intercept::Reply(b"E01".to_vec()),
        }
    });
    router.intercept(b"qProcessInfo", |session, _, body| {
        if body != b"qProcessInfo" {
            return Intercept::Pass;
        }
        Intercept::Reply(lldb_info(Some(session.target().pid())).into_bytes())
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_region_replies() {
        let line = |l: &str| MapEntry::parse_line(l).unwrap();
        let maps = vec![
            line("1000-3000 r-xp 00000000 08:01 12 /bin/x"),
            line("5000-6000 rw-p 00000000 00:00 0 [heap]"),
        ];
        assert_eq!(
            memory_region_info(&maps, 0x1800),
            "start:1000;size:2000;permissions:rx;name:2f62696e2f78;"
        );
        assert_eq!(
            memory_region_info(&maps, 0x5000),
            "start:5000;size:1000;permissions:rw;"
        );
        assert_eq!(memory_region_info(&maps, 0x4000), "start:3000;size:2000;");
        assert_eq!(memory_region_info(&maps, 0x10), "start:0;size:1000;");
    }
}
