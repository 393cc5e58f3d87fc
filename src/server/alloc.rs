//! LLDB's memory allocation packets, `_M<size>,<permissions>` and `_m<address>`, served by
//! running `mmap`/`munmap` directly in the stopped process ([`Target::inject_syscall`]): no
//! program code runs and nothing enters the recording. Without them LLDB allocates by calling
//! `mmap` in the program, which the recorder would record as the program's own calls.

use std::collections::HashMap;

use super::router::{Intercept, Router};
use crate::target::Target;

/// `mmap` and `munmap` on x86-64.
const NR_MMAP: u64 = 9;
const NR_MUNMAP: u64 = 11;

/// `PROT_*` bits from LLDB's permission letters (`r`, `w`, `x`).
fn prot(perms: &[u8]) -> Option<u64> {
    perms.iter().try_fold(0, |p, c| match c {
        b'r' => Some(p | libc::PROT_READ as u64),
        b'w' => Some(p | libc::PROT_WRITE as u64),
        b'x' => Some(p | libc::PROT_EXEC as u64),
        _ => None,
    })
}

/// The reply to `_M` (`body` without the `_M`): the address in hex, or `E01` (malformed) /
/// `E02` (the allocation failed or is not possible here).
fn allocate(t: &mut dyn Target, body: &[u8], sizes: &mut HashMap<u64, u64>) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    let Some((size, perms)) = text.split_once(',') else {
        return b"E01".to_vec();
    };
    let (Ok(size), Some(prot)) = (u64::from_str_radix(size, 16), prot(perms.as_bytes())) else {
        return b"E01".to_vec();
    };
    if size == 0 {
        return b"E01".to_vec();
    }
    let flags = (libc::MAP_PRIVATE | libc::MAP_ANONYMOUS) as u64;
    match t.inject_syscall(NR_MMAP, [0, size, prot, flags, u64::MAX, 0]) {
        // A result in the last page of the address space is `-errno`.
        Ok(addr) if addr < (-4095i64) as u64 => {
            sizes.insert(addr, size);
            format!("{addr:x}").into_bytes()
        }
        _ => b"E02".to_vec(),
    }
}

/// The reply to `_m` (`body` without the `_m`): `OK`, or an error for an address `_M` did not
/// return.
fn deallocate(t: &mut dyn Target, body: &[u8], sizes: &mut HashMap<u64, u64>) -> Vec<u8> {
    let Ok(addr) = u64::from_str_radix(&String::from_utf8_lossy(body), 16) else {
        return b"E01".to_vec();
    };
    let Some(&size) = sizes.get(&addr) else {
        return b"E02".to_vec();
    };
    match t.inject_syscall(NR_MUNMAP, [addr, size, 0, 0, 0, 0]) {
        Ok(0) => {
            sizes.remove(&addr);
            b"OK".to_vec()
        }
        _ => b"E02".to_vec(),
    }
}

/// Answers `_M`/`_m` on `router` for the session's target (an unsupported target gets `E02`,
/// and LLDB falls back to its own way).
pub fn install(router: &mut Router) {
    let mut sizes: HashMap<u64, u64> = HashMap::new();
    router.intercept(b"_", move |session, _state, packet| {
        let t = session.target_mut();
        if let Some(body) = packet.strip_prefix(b"_M") {
            Intercept::Reply(allocate(t, body, &mut sizes))
        } else if let Some(body) = packet.strip_prefix(b"_m") {
            Intercept::Reply(deallocate(t, body, &mut sizes))
        } else {
            Intercept::Pass
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permissions_map_to_prot_bits() {
        assert_eq!(prot(b"rw"), Some(3));
        assert_eq!(prot(b"rwx"), Some(7));
        assert_eq!(prot(b""), Some(0));
        assert_eq!(prot(b"rq"), None);
    }
}
