//! The system-call boundary of the hardware backend: `perf_event_open(2)`, the two `mmap`s of a
//! perf event, and its ioctls. This is the only place in the perf backend with `unsafe`.
//!
//! ABI rules implemented (`include/uapi/linux/perf_event.h`, `kernel/events/core.c`,
//! `kernel/events/ring_buffer.c`):
//! * `perf_event_attr.size` must name a published layout; we use `PERF_ATTR_SIZE_VER5` (112
//!   bytes), the first that contains `aux_watermark`, so older kernels accept the attr.
//! * The first mmap, at offset 0, is `1 + 2^n` pages: the `perf_event_mmap_page` control page and
//!   the data ring (`perf_mmap` rejects a data page count that is not a power of two). It is
//!   mapped `PROT_READ|PROT_WRITE` so that user space owns `data_tail` (a read-only mapping would
//!   put the data ring itself into overwrite mode).
//! * The AUX area: user space writes `aux_offset` (page aligned, ≥ `data_offset + data_size`)
//!   and `aux_size` (a power-of-two number of pages) into the control page, then maps
//!   `aux_size` bytes at file offset `aux_offset`. `PROT_WRITE` selects normal mode (user space
//!   owns `aux_tail`); without it the area is in overwrite mode (`rb_alloc_aux`:
//!   `overwrite = !(flags & RING_BUFFER_WRITABLE)`).
//! * Per-task events (`pid = tid`, `cpu = -1`) cannot be `inherit`ed and mmapped at the same time
//!   (`perf_mmap`: "Don't allow mmap() of inherited per-task counters"), so every thread gets its
//!   own event; new threads must be added explicitly.

use std::ffi::CStr;
use std::io;
use std::marker::PhantomData;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::Ordering;

use perf_event_open_sys::bindings::{self, perf_event_attr};

use crate::ring::aux::{PerfMmapPage, RingRegion, SampleIdLayout};

/// How the AUX area is consumed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AuxMode {
    /// Normal mode: AUX mapped read-write, the drainer advances `aux_tail`; PT stops (and the
    /// kernel emits `PERF_AUX_FLAG_TRUNCATED`) when the drainer lags.
    #[default]
    Full,
    /// Overwrite mode: AUX mapped read-only, a flight recorder keeping the newest
    /// `aux_size` bytes; read by disabling the event and copying back from `aux_head`.
    Snapshot,
}

/// How a freshly opened event starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StartMode {
    /// `disabled = 1, enable_on_exec = 1`: for a child stopped before `execve` (the trace starts
    /// with the new program).
    EnableOnExec,
    /// `disabled = 1`, and the backend issues `PERF_EVENT_IOC_ENABLE` once the rings are mapped
    /// (an already running process).
    #[default]
    AfterMmap,
    /// `disabled = 1` and left disabled until [`PerfEvent::enable`].
    Manual,
}

/// Everything that goes into `perf_event_attr` for one `intel_pt` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventSpec {
    /// `attr.type` (from sysfs `intel_pt/type`).
    pub pmu_type: u32,
    /// `attr.config` (encoded from the format terms).
    pub config: u64,
    /// `attr.exclude_kernel`: trace user space only.
    pub exclude_kernel: bool,
    /// Start behaviour.
    pub start: StartMode,
    /// `attr.aux_watermark` in bytes (0 = kernel default: half the AUX area).
    pub aux_watermark: u32,
}

/// The `sample_type` used for the `sample_id` trailer of side-band records
/// (`PERF_SAMPLE_TID | PERF_SAMPLE_TIME`, with `sample_id_all = 1`).
pub const SIDEBAND_SAMPLE_TYPE: u64 = SampleIdLayout::TID | SampleIdLayout::TIME;

/// Builds the `perf_event_attr`: `size = PERF_ATTR_SIZE_VER5`, `type`, `config`,
/// `exclude_kernel`, `exclude_hv = 1`, `disabled = 1`, `enable_on_exec` per start mode,
/// `inherit = 0`, `sample_id_all = 1` with `sample_type = TID|TIME`, `aux_watermark`.
pub fn build_attr(spec: &EventSpec) -> perf_event_attr {
    let mut attr = perf_event_attr {
        type_: spec.pmu_type,
        size: bindings::PERF_ATTR_SIZE_VER5,
        config: spec.config,
        sample_type: SIDEBAND_SAMPLE_TYPE,
        aux_watermark: spec.aux_watermark,
        ..Default::default()
    };
    attr.set_disabled(1);
    attr.set_enable_on_exec((spec.start == StartMode::EnableOnExec) as u64);
    // Per-task AUX events cannot be inherited and mmapped (see the module docs).
    attr.set_inherit(0);
    attr.set_exclude_kernel(spec.exclude_kernel as u64);
    attr.set_exclude_hv(1);
    attr.set_sample_id_all(1);
    attr
}

/// `perf_event_open` failed; `errno` is the raw OS error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenError {
    /// The thread (`pid` argument).
    pub tid: i32,
    /// The OS error number.
    pub errno: i32,
}

/// An open perf event file descriptor.
#[derive(Debug)]
pub struct PerfEvent {
    fd: OwnedFd,
    tid: i32,
}

fn ioctl_result(rc: libc::c_int) -> io::Result<()> {
    if rc == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

impl PerfEvent {
    /// `perf_event_open(attr, pid = tid, cpu = -1, group_fd = -1, PERF_FLAG_FD_CLOEXEC)`:
    /// one event following thread `tid` on every CPU. `tid = 0` means the calling thread.
    pub fn open(attr: &perf_event_attr, tid: i32) -> Result<Self, OpenError> {
        // The kernel may write the expected size back into `attr.size` on E2BIG, so it gets a
        // private copy.
        let mut attr = *attr;
        // SAFETY: `attr` is a fully initialised perf_event_attr owned by this frame for the
        // duration of the call; the other arguments are plain integers. The syscall only reads
        // (and on E2BIG writes `size` of) the struct.
        let fd = unsafe {
            perf_event_open_sys::perf_event_open(
                &mut attr,
                tid,
                -1,
                -1,
                bindings::PERF_FLAG_FD_CLOEXEC as libc::c_ulong,
            )
        };
        if fd < 0 {
            return Err(OpenError {
                tid,
                errno: io::Error::last_os_error().raw_os_error().unwrap_or(0),
            });
        }
        // SAFETY: `fd` is a freshly returned, valid descriptor that nothing else owns.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Self { fd, tid })
    }

    /// The traced thread.
    pub fn tid(&self) -> i32 {
        self.tid
    }

    /// `PERF_EVENT_IOC_ENABLE`.
    pub fn enable(&self) -> io::Result<()> {
        // SAFETY: valid perf fd owned by self; the argument is an integer (0 = this event only).
        ioctl_result(unsafe { perf_event_open_sys::ioctls::ENABLE(self.fd.as_raw_fd(), 0) })
    }

    /// `PERF_EVENT_IOC_DISABLE`.
    pub fn disable(&self) -> io::Result<()> {
        // SAFETY: valid perf fd owned by self; the argument is an integer (0 = this event only).
        ioctl_result(unsafe { perf_event_open_sys::ioctls::DISABLE(self.fd.as_raw_fd(), 0) })
    }

    /// `PERF_EVENT_IOC_SET_FILTER` with an address-filter string (see
    /// [`super::filter::ioctl_string`]).
    pub fn set_filter(&self, filter: &CStr) -> io::Result<()> {
        // SAFETY: valid perf fd; `filter` is a NUL-terminated string that outlives the call and
        // the kernel only reads it (strndup_user) despite the `*mut` in the binding's signature.
        ioctl_result(unsafe {
            perf_event_open_sys::ioctls::SET_FILTER(
                self.fd.as_raw_fd(),
                filter.as_ptr() as *mut libc::c_char,
            )
        })
    }

    /// The raw descriptor (for `poll`).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// `poll(2)` for `POLLIN` on perf event descriptors (the kernel signals readability when a
/// wake-up is due: every `wakeup_events`/`wakeup_watermark` on the data ring, every
/// `aux_watermark` bytes of AUX, and on `PERF_AUX_FLAG_TRUNCATED`). Returns how many are ready.
pub fn poll_readable(fds: &[RawFd], timeout: std::time::Duration) -> io::Result<usize> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
    // SAFETY: `pfds` is a live, correctly sized array of pollfd for the duration of the call.
    let rc = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc as usize)
    }
}

/// The system page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 { v as usize } else { 4096 }
}

/// The two mappings of one event: control page + data ring, and the AUX area.
#[derive(Debug)]
pub struct PerfMmap {
    base: NonNull<u8>,
    base_len: usize,
    aux: NonNull<u8>,
    aux_len: usize,
    page: usize,
    mode: AuxMode,
}

// SAFETY: the mappings are owned exclusively by this value (unmapped only in Drop); the control
// page is accessed through atomics only, and the rings only through `RingRegion::stable_slice`,
// whose contract limits reads to ranges the kernel is not writing. Moving the owner to another
// thread (the background drainer) changes none of that.
unsafe impl Send for PerfMmap {}

fn mmap_shared(fd: RawFd, len: usize, prot: libc::c_int, offset: u64) -> io::Result<NonNull<u8>> {
    let off = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "mmap offset too large"))?;
    // SAFETY: a fresh shared mapping chosen by the kernel (addr = NULL), so no existing Rust
    // memory is affected; fd is a valid perf event descriptor.
    let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, off) };
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    NonNull::new(p.cast()).ok_or_else(|| io::Error::other("mmap returned NULL"))
}

/// Which mapping failed.
#[derive(Debug)]
pub struct MmapError {
    /// `"data ring"` or `"AUX area"`.
    pub what: &'static str,
    /// Bytes requested.
    pub len: usize,
    /// The OS error.
    pub source: io::Error,
}

impl PerfMmap {
    /// Maps `1 + 2^data_pages_log2` pages at offset 0, then sets `aux_offset`/`aux_size` in the
    /// control page and maps `2^aux_pages_log2` pages of AUX area (`PROT_READ|PROT_WRITE` in
    /// [`AuxMode::Full`], `PROT_READ` in [`AuxMode::Snapshot`]).
    pub fn map(
        event: &PerfEvent,
        data_pages_log2: u8,
        aux_pages_log2: u8,
        mode: AuxMode,
    ) -> Result<Self, MmapError> {
        let page = page_size();
        let too_big = |what, len| MmapError {
            what,
            len,
            source: io::Error::new(io::ErrorKind::InvalidInput, "ring size overflows"),
        };
        let aux_len = 1usize
            .checked_shl(aux_pages_log2.into())
            .and_then(|n| n.checked_mul(page))
            .ok_or_else(|| too_big("AUX area", usize::MAX))?;
        let (base, base_len) = Self::map_base(event, data_pages_log2, page)?;
        // SAFETY: the first mapped page is the kernel's perf_event_mmap_page; PerfMmapPage mirrors
        // it field for field with atomics for every kernel-written field, the page is page aligned
        // (≥ align_of) and ≥ size_of::<PerfMmapPage>() = 1088 bytes, and it stays mapped while
        // this reference is used.
        let ctl = unsafe { base.cast::<PerfMmapPage>().as_ref() };
        let aux_offset = ctl
            .data_offset
            .load(Ordering::Relaxed)
            .saturating_add(ctl.data_size.load(Ordering::Relaxed))
            .max(base_len as u64);
        ctl.aux_offset.store(aux_offset, Ordering::SeqCst);
        ctl.aux_size.store(aux_len as u64, Ordering::SeqCst);
        let prot = match mode {
            AuxMode::Full => libc::PROT_READ | libc::PROT_WRITE,
            AuxMode::Snapshot => libc::PROT_READ,
        };
        let aux = match mmap_shared(event.raw_fd(), aux_len, prot, aux_offset) {
            Ok(p) => p,
            Err(source) => {
                // SAFETY: `base` was mapped above with `base_len` and is not referenced after
                // this point.
                unsafe { libc::munmap(base.as_ptr().cast(), base_len) };
                return Err(MmapError {
                    what: "AUX area",
                    len: aux_len,
                    source,
                });
            }
        };
        Ok(Self {
            base,
            base_len,
            aux,
            aux_len,
            page,
            mode,
        })
    }

    /// Maps only the control page and the data ring (side-band records, no AUX area; `aux()`
    /// is then empty). Useful for events of PMUs without AUX support.
    pub fn map_data_only(event: &PerfEvent, data_pages_log2: u8) -> Result<Self, MmapError> {
        let page = page_size();
        let (base, base_len) = Self::map_base(event, data_pages_log2, page)?;
        Ok(Self {
            base,
            base_len,
            aux: NonNull::dangling(),
            aux_len: 0,
            page,
            mode: AuxMode::Full,
        })
    }

    fn map_base(
        event: &PerfEvent,
        data_pages_log2: u8,
        page: usize,
    ) -> Result<(NonNull<u8>, usize), MmapError> {
        let base_len = 1usize
            .checked_shl(data_pages_log2.into())
            .and_then(|n| n.checked_add(1))
            .and_then(|n| n.checked_mul(page))
            .ok_or_else(|| MmapError {
                what: "data ring",
                len: usize::MAX,
                source: io::Error::new(io::ErrorKind::InvalidInput, "ring size overflows"),
            })?;
        let base = mmap_shared(
            event.raw_fd(),
            base_len,
            libc::PROT_READ | libc::PROT_WRITE,
            0,
        )
        .map_err(|source| MmapError {
            what: "data ring",
            len: base_len,
            source,
        })?;
        Ok((base, base_len))
    }

    /// The control page.
    pub fn page(&self) -> &PerfMmapPage {
        // SAFETY: see `map`: the mapping outlives `&self` and the type mirrors the kernel layout
        // with atomics for concurrently written fields.
        unsafe { self.base.cast::<PerfMmapPage>().as_ref() }
    }

    /// The data ring (the `2^n` pages after the control page).
    pub fn data(&self) -> MappedRegion<'_> {
        MappedRegion {
            // SAFETY: `page` < `base_len`, so the result stays inside the mapping.
            ptr: unsafe { NonNull::new_unchecked(self.base.as_ptr().add(self.page)) },
            len: self.base_len - self.page,
            _owner: PhantomData,
        }
    }

    /// The AUX area.
    pub fn aux(&self) -> MappedRegion<'_> {
        MappedRegion {
            ptr: self.aux,
            len: self.aux_len,
            _owner: PhantomData,
        }
    }

    /// The AUX mode this mapping was made for.
    pub fn mode(&self) -> AuxMode {
        self.mode
    }
}

impl Drop for PerfMmap {
    fn drop(&mut self) {
        // SAFETY: both regions were mapped by `map` with these lengths (the AUX one only if
        // non-empty) and no borrow of them can outlive `self` (MappedRegion and page() borrow self).
        unsafe {
            if self.aux_len != 0 {
                libc::munmap(self.aux.as_ptr().cast(), self.aux_len);
            }
            libc::munmap(self.base.as_ptr().cast(), self.base_len);
        }
    }
}

/// A borrowed mapped ring, implementing [`RingRegion`].
#[derive(Debug, Clone, Copy)]
pub struct MappedRegion<'a> {
    ptr: NonNull<u8>,
    len: usize,
    _owner: PhantomData<&'a PerfMmap>,
}

impl RingRegion for MappedRegion<'_> {
    fn ring_len(&self) -> usize {
        self.len
    }

    fn stable_slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: the range is inside the live mapping (checked above), and by the RingRegion
        // contract the caller only asks for bytes the kernel is not writing now ([tail, head) of a
        // ring whose tail we own, or an overwrite-mode AUX area whose event is disabled), so no
        // write aliases the slice while it is borrowed.
        Some(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr().add(offset), len) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attr_matches_abi() {
        let attr = build_attr(&EventSpec {
            pmu_type: 8,
            config: 0x2401,
            exclude_kernel: true,
            start: StartMode::EnableOnExec,
            aux_watermark: 4096,
        });
        assert_eq!(attr.size, 112);
        assert_eq!(attr.type_, 8);
        assert_eq!(attr.config, 0x2401);
        assert_eq!(attr.disabled(), 1);
        assert_eq!(attr.enable_on_exec(), 1);
        assert_eq!(attr.inherit(), 0);
        assert_eq!(attr.exclude_kernel(), 1);
        assert_eq!(attr.exclude_user(), 0);
        assert_eq!(attr.exclude_hv(), 1);
        assert_eq!(attr.sample_id_all(), 1);
        assert_eq!(attr.sample_type, 2 | 4);
        assert_eq!(attr.aux_watermark, 4096);
        let attr = build_attr(&EventSpec {
            pmu_type: 8,
            config: 1,
            exclude_kernel: false,
            start: StartMode::AfterMmap,
            aux_watermark: 0,
        });
        assert_eq!(attr.enable_on_exec(), 0);
        assert_eq!(attr.exclude_kernel(), 0);
        assert_eq!(attr.disabled(), 1);
    }
}
