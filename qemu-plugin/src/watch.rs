//! Watchpoints of a live session (`pause=on`), seen through QEMU's memory callbacks.
//!
//! ptrewind writes the watched ranges into the shared `watch` file
//! (`ptrewind::capture::qemu::output::watch_gate`) at a stop; QEMU's gdbstub drops its
//! translations at every stop, so what runs next is translated again. Until the first
//! watchpoint is set, blocks are translated without memory callbacks: a program without
//! watchpoints runs exactly as before. From then on (see `EVER` for why not only while
//! some are set), every instruction of a new translation gets a memory callback; QEMU calls it
//! after the access with the guest address. An access that overlaps a watched range is published in the
//! vCPU's hit slot and the thread sends itself `SIGTRAP`: QEMU takes the signal when the
//! translated block ends (plugin API v1 has no way to leave a block early), and its gdbstub
//! reports it in that thread, where ptrewind turns it into a watchpoint stop. A thread being
//! single-stepped only publishes the hit: the step's own stop reports it.

use std::ffi::{c_uint, c_void};
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, Ordering};

use ptrewind::capture::qemu::output::{self, watch_gate as w};

use crate::ffi::*;

/// The watch file's words, null when not mapped (no live session).
static WATCH: AtomicPtr<AtomicU64> = AtomicPtr::new(ptr::null_mut());

/// A watchpoint was set once: every block is translated with memory callbacks from then on,
/// even with no watchpoint left. QEMU 7.2 keeps the memory callbacks of the last instrumented
/// instruction in `CPUState::plugin_mem_cbs` after some block exits; an instruction of an
/// uninstrumented block whose memory access is done by a helper (e.g. `xsavec` in the dynamic
/// linker's lazy binding) then calls through that stale pointer and QEMU aborts
/// (`qemu_plugin_vcpu_mem_cb: code should not be reached`, seen after deleting the last
/// watchpoint). Instrumented instructions set their own callbacks first.
static EVER: AtomicBool = AtomicBool::new(false);

/// Maps `DIR/watch` (a live session).
pub fn map(dir: &std::path::Path) -> Result<(), String> {
    let p = crate::map_shared_file(dir, output::WATCH_FILE, w::SIZE, 0)?;
    WATCH.store(p, Ordering::Release);
    Ok(())
}

/// Word `i` of the mapping at `base`.
fn word(base: *mut AtomicU64, i: usize) -> &'static AtomicU64 {
    // SAFETY: every index used is below `w::SIZE / 8`; the mapping is never unmapped.
    unsafe { &*base.add(i) }
}

/// The thread a single step runs (0: none; see `watch_gate::STEP`).
pub fn stepping() -> u64 {
    let base = WATCH.load(Ordering::Relaxed);
    if base.is_null() {
        return 0;
    }
    word(base, w::STEP).load(Ordering::Acquire)
}

/// Whether `vcpu`'s hit slot still holds a hit of thread `tid` (ptrewind clears it when it
/// reports the hit).
pub fn has_hit(vcpu: c_uint, tid: u32) -> bool {
    let base = WATCH.load(Ordering::Relaxed);
    let slot = vcpu as usize;
    !base.is_null()
        && slot < w::MAX_SLOTS
        && word(base, w::HITS + w::HIT_WORDS * slot).load(Ordering::Acquire) == u64::from(tid)
}

/// The union of the watched kinds ([`w::WRITE`] | [`w::READ`]); 0 without watchpoints.
fn watched_kinds(base: *mut AtomicU64) -> u64 {
    let n = (word(base, w::COUNT).load(Ordering::Acquire) as usize).min(w::MAX_WATCHES);
    (0..n).fold(0, |k, i| {
        k | word(base, w::WATCHES + 3 * i + 2).load(Ordering::Relaxed)
    })
}

/// At translation: adds a memory callback to each instruction of the block (`ips`: their
/// addresses) while watchpoints are set.
///
/// # Safety
///
/// `tb` is the block being translated (valid during the translation callback) and `ips` has
/// one address per instruction of it.
pub unsafe fn instrument(tb: *mut qemu_plugin_tb, ips: &[u64]) {
    let base = WATCH.load(Ordering::Relaxed);
    if base.is_null() {
        return;
    }
    if watched_kinds(base) == 0 && !EVER.load(Ordering::Relaxed) {
        return;
    }
    EVER.store(true, Ordering::Relaxed);
    // Loads and stores whatever the kinds: measured with QEMU 7.2.22, a callback registered for
    // loads only (`QEMU_PLUGIN_MEM_R`) was called for stores and never for loads, one for stores
    // only (`QEMU_PLUGIN_MEM_W`) for both; the callback filters by `qemu_plugin_mem_is_store`.
    let rw = QEMU_PLUGIN_MEM_RW;
    for (i, &ip) in ips.iter().enumerate() {
        // SAFETY: `i` is below the block's instruction count (the caller's contract).
        unsafe {
            let insn = qemu_plugin_tb_get_insn(tb, i);
            qemu_plugin_register_vcpu_mem_cb(
                insn,
                on_mem,
                QEMU_PLUGIN_CB_NO_REGS,
                rw,
                ip as *mut c_void,
            );
        }
    }
}

/// The lowest watched address `[vaddr, vaddr + size)` overlaps, for an access of kind `access`.
fn hit(base: *mut AtomicU64, vaddr: u64, size: u64, access: u64) -> Option<u64> {
    let n = (word(base, w::COUNT).load(Ordering::Acquire) as usize).min(w::MAX_WATCHES);
    (0..n)
        .filter_map(|i| {
            let at = w::WATCHES + 3 * i;
            let addr = word(base, at).load(Ordering::Relaxed);
            let len = word(base, at + 1).load(Ordering::Relaxed);
            let kind = word(base, at + 2).load(Ordering::Relaxed);
            (kind & access != 0
                && vaddr < addr.saturating_add(len)
                && addr < vaddr.saturating_add(size))
            .then(|| vaddr.max(addr))
        })
        .min()
}

/// After a guest memory access (`udata`: the instruction's address).
extern "C" fn on_mem(vcpu: c_uint, info: qemu_plugin_meminfo_t, vaddr: u64, udata: *mut c_void) {
    let base = WATCH.load(Ordering::Relaxed);
    // Nothing watched (any more): return before asking QEMU about the access.
    if base.is_null() || word(base, w::COUNT).load(Ordering::Relaxed) == 0 {
        return;
    }
    // SAFETY: `info` is the access QEMU describes in this callback.
    let (shift, store) = unsafe {
        (
            qemu_plugin_mem_size_shift(info),
            qemu_plugin_mem_is_store(info),
        )
    };
    let access = if store { w::WRITE } else { w::READ };
    let Some(addr) = hit(base, vaddr, 1u64 << shift.min(6), access) else {
        return;
    };
    // A forked child shares the mapping but is not the debugged process.
    if !crate::is_gated_process() {
        return;
    }
    let slot = vcpu as usize;
    if slot >= w::MAX_SLOTS {
        return;
    }
    let at = w::HITS + w::HIT_WORDS * slot;
    if word(base, at).load(Ordering::Acquire) != 0 {
        // The first hit since the last stop is the one reported (its signal is on its way).
        return;
    }
    let tid = crate::gettid();
    word(base, at + 1).store(addr, Ordering::Relaxed);
    word(base, at + 2).store(access, Ordering::Relaxed);
    word(base, at + 3).store(udata as u64, Ordering::Relaxed);
    word(base, at).store(u64::from(tid), Ordering::Release);
    crate::stop_for_watch(vcpu, tid);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A watch file's words with `list` set.
    fn words(list: &[(u64, u64, u64)]) -> Vec<AtomicU64> {
        let v: Vec<AtomicU64> = (0..w::HITS).map(|_| AtomicU64::new(0)).collect();
        for (i, &(a, l, k)) in list.iter().enumerate() {
            v[w::WATCHES + 3 * i].store(a, Ordering::Relaxed);
            v[w::WATCHES + 3 * i + 1].store(l, Ordering::Relaxed);
            v[w::WATCHES + 3 * i + 2].store(k, Ordering::Relaxed);
        }
        v[w::COUNT].store(list.len() as u64, Ordering::Relaxed);
        v
    }

    #[test]
    fn an_access_hits_a_watch_it_overlaps_of_its_kind() {
        let mut v = words(&[(0x1000, 4, w::WRITE), (0x2000, 8, w::READ | w::WRITE)]);
        let base = v.as_mut_ptr();
        // A 4-byte store at the watched int, one overlapping its last byte, one just after it.
        assert_eq!(hit(base, 0x1000, 4, w::WRITE), Some(0x1000));
        assert_eq!(hit(base, 0x0ffd, 4, w::WRITE), Some(0x1000));
        assert_eq!(hit(base, 0x1004, 4, w::WRITE), None);
        assert_eq!(hit(base, 0x0ffc, 4, w::WRITE), None);
        // A load of a write-only watch is not a hit; of an access watch it is.
        assert_eq!(hit(base, 0x1000, 4, w::READ), None);
        assert_eq!(hit(base, 0x2004, 8, w::READ), Some(0x2004));
        // An 8-byte store over both: the lowest watched address accessed.
        assert_eq!(hit(base, 0x0ffe, 0x1010, w::WRITE), Some(0x1000));
        assert_eq!(watched_kinds(base), w::READ | w::WRITE);
        // No watchpoints: nothing hits.
        v[w::COUNT].store(0, Ordering::Relaxed);
        assert_eq!(hit(v.as_mut_ptr(), 0x1000, 4, w::WRITE), None);
        assert_eq!(watched_kinds(v.as_mut_ptr()), 0);
    }
}
