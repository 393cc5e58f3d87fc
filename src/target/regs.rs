//! The x86-64 register file of a stopped thread: general-purpose registers (`user_regs_struct`)
//! plus the raw XSAVE image (x87, SSE, AVX), in the layout GDB's `amd64-linux` description uses.
//!
//! The XSAVE image is kept as the kernel returned it (`PTRACE_GETREGSET NT_X86_XSTATE`) and the
//! accessors read fields in place, so writing registers back only patches the bytes GDB changed.

/// Offsets inside the legacy (FXSAVE) area of an XSAVE image (Intel SDM Vol. 1, table 10-2).
mod fx {
    pub const FCW: usize = 0;
    pub const FSW: usize = 2;
    pub const FTW: usize = 4;
    pub const FOP: usize = 6;
    pub const FIP: usize = 8;
    pub const FCS: usize = 12;
    pub const FDP: usize = 16;
    pub const FDS: usize = 20;
    pub const MXCSR: usize = 24;
    pub const ST0: usize = 32;
    pub const XMM0: usize = 160;
    /// `sw_reserved` bytes; for ptrace the first u64 is XCR0.
    pub const SW_RESERVED: usize = 464;
    /// Size of the legacy area.
    pub const LEGACY_SIZE: usize = 512;
    /// The XSAVE header follows the legacy area; its first u64 is XSTATE_BV.
    pub const XSTATE_BV: usize = 512;
}

/// XCR0 / XSTATE_BV bit of the AVX (YMM_Hi128) component.
const XFEATURE_AVX: u64 = 1 << 2;

/// Index of each general-purpose register in `libc::user_regs_struct` order.
#[allow(missing_docs)]
pub mod gpr {
    pub const R15: usize = 0;
    pub const R14: usize = 1;
    pub const R13: usize = 2;
    pub const R12: usize = 3;
    pub const RBP: usize = 4;
    pub const RBX: usize = 5;
    pub const R11: usize = 6;
    pub const R10: usize = 7;
    pub const R9: usize = 8;
    pub const R8: usize = 9;
    pub const RAX: usize = 10;
    pub const RCX: usize = 11;
    pub const RDX: usize = 12;
    pub const RSI: usize = 13;
    pub const RDI: usize = 14;
    pub const ORIG_RAX: usize = 15;
    pub const RIP: usize = 16;
    pub const CS: usize = 17;
    pub const EFLAGS: usize = 18;
    pub const RSP: usize = 19;
    pub const SS: usize = 20;
    pub const FS_BASE: usize = 21;
    pub const GS_BASE: usize = 22;
    pub const DS: usize = 23;
    pub const ES: usize = 24;
    pub const FS: usize = 25;
    pub const GS: usize = 26;
    /// Number of registers in `user_regs_struct`.
    pub const COUNT: usize = 27;
    /// The registers' names, by index (as `monitor save` writes them).
    pub const NAMES: [&str; COUNT] = [
        "r15", "r14", "r13", "r12", "rbp", "rbx", "r11", "r10", "r9", "r8", "rax", "rcx", "rdx",
        "rsi", "rdi", "orig_rax", "rip", "cs", "eflags", "rsp", "ss", "fs_base", "gs_base", "ds",
        "es", "fs", "gs",
    ];
}

/// The [`gpr`] index of GDB's x86-64 registers 0..=15 (`rax rbx rcx rdx rsi rdi rbp rsp
/// r8`..`r15`), which is not `user_regs_struct` order.
const GDB_GPR_ORDER: [usize; 16] = [
    gpr::RAX,
    gpr::RBX,
    gpr::RCX,
    gpr::RDX,
    gpr::RSI,
    gpr::RDI,
    gpr::RBP,
    gpr::RSP,
    gpr::R8,
    gpr::R9,
    gpr::R10,
    gpr::R11,
    gpr::R12,
    gpr::R13,
    gpr::R14,
    gpr::R15,
];

/// The general-purpose registers as the kernel exposes them to ptrace (`user_regs_struct`):
/// the GPR part of [`X86Registers`], on its own where every step needs only these (the
/// software recorder, its state log) and fetching the XSAVE area each time would cost.
pub type Gprs = libc::user_regs_struct;

/// An all-zero [`Gprs`].
pub fn zeroed_gprs() -> Gprs {
    gprs_from_array(&[0; gpr::COUNT])
}

/// Sets one register by [`gpr`] index (out-of-range indices are ignored).
pub fn set_gpr(r: &mut Gprs, index: usize, value: u64) {
    let slot = match index {
        gpr::R15 => &mut r.r15,
        gpr::R14 => &mut r.r14,
        gpr::R13 => &mut r.r13,
        gpr::R12 => &mut r.r12,
        gpr::RBP => &mut r.rbp,
        gpr::RBX => &mut r.rbx,
        gpr::R11 => &mut r.r11,
        gpr::R10 => &mut r.r10,
        gpr::R9 => &mut r.r9,
        gpr::R8 => &mut r.r8,
        gpr::RAX => &mut r.rax,
        gpr::RCX => &mut r.rcx,
        gpr::RDX => &mut r.rdx,
        gpr::RSI => &mut r.rsi,
        gpr::RDI => &mut r.rdi,
        gpr::ORIG_RAX => &mut r.orig_rax,
        gpr::RIP => &mut r.rip,
        gpr::CS => &mut r.cs,
        gpr::EFLAGS => &mut r.eflags,
        gpr::RSP => &mut r.rsp,
        gpr::SS => &mut r.ss,
        gpr::FS_BASE => &mut r.fs_base,
        gpr::GS_BASE => &mut r.gs_base,
        gpr::DS => &mut r.ds,
        gpr::ES => &mut r.es,
        gpr::FS => &mut r.fs,
        gpr::GS => &mut r.gs,
        _ => return,
    };
    *slot = value;
}

/// The [`Gprs`] of an array in [`gpr`] order.
pub fn gprs_from_array(g: &[u64; gpr::COUNT]) -> Gprs {
    Gprs {
        r15: g[gpr::R15],
        r14: g[gpr::R14],
        r13: g[gpr::R13],
        r12: g[gpr::R12],
        rbp: g[gpr::RBP],
        rbx: g[gpr::RBX],
        r11: g[gpr::R11],
        r10: g[gpr::R10],
        r9: g[gpr::R9],
        r8: g[gpr::R8],
        rax: g[gpr::RAX],
        rcx: g[gpr::RCX],
        rdx: g[gpr::RDX],
        rsi: g[gpr::RSI],
        rdi: g[gpr::RDI],
        orig_rax: g[gpr::ORIG_RAX],
        rip: g[gpr::RIP],
        cs: g[gpr::CS],
        eflags: g[gpr::EFLAGS],
        rsp: g[gpr::RSP],
        ss: g[gpr::SS],
        fs_base: g[gpr::FS_BASE],
        gs_base: g[gpr::GS_BASE],
        ds: g[gpr::DS],
        es: g[gpr::ES],
        fs: g[gpr::FS],
        gs: g[gpr::GS],
    }
}

/// The registers of one stopped thread: the general-purpose registers ([`Gprs`], as an array)
/// and the XSAVE image. GDB's view of it is `server::arch::GdbRegisters`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct X86Registers {
    /// General-purpose registers in `user_regs_struct` order (index with [`gpr`] constants).
    pub gprs: [u64; gpr::COUNT],
    /// The XSAVE image (at least the 512-byte legacy area; longer when XSAVE is available).
    pub xsave: Vec<u8>,
    /// Offset of the YMM_Hi128 component in `xsave`, if AVX is enabled in XCR0 and the offset
    /// (CPUID leaf 0xD, sub-leaf 2) lies inside the image.
    pub ymm_hi_offset: Option<usize>,
    /// Registers whose value is not known (GDB numbering, see [`GDB_REGS`]); empty for a live
    /// thread. A replaying target sets it for state its log does not cover, so that GDB shows
    /// `<unavailable>` instead of a wrong (present) value.
    pub unavailable: RegMask,
}

/// A set of registers in GDB numbering ([`GDB_REGS`]); the default is the empty set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegMask(pub u128);

impl RegMask {
    /// No register.
    pub const NONE: RegMask = RegMask(0);

    /// The x87, SSE and AVX state: `st0`-`st7`, the x87 control registers, `xmm0`-`xmm15`,
    /// `mxcsr` and `ymm0h`-`ymm15h` (GDB numbers 24..=56 and 60..=75).
    pub const VECTOR: RegMask = RegMask((((1u128 << 33) - 1) << 24) | (((1u128 << 16) - 1) << 60));

    /// Every register except the program counter (`rip`, GDB number 16).
    pub const ALL_BUT_PC: RegMask = RegMask(((1u128 << GDB_REGS.len()) - 1) & !(1u128 << 16));

    /// Whether GDB register `regnum` is in the set.
    pub fn contains(self, regnum: usize) -> bool {
        regnum < 128 && self.0 & (1u128 << regnum) != 0
    }

    /// Whether the set is empty.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl X86Registers {
    /// Builds a register file from `user_regs_struct` and an XSAVE/FXSAVE image.
    pub fn from_parts(regs: &Gprs, mut xsave: Vec<u8>) -> Self {
        if xsave.len() < fx::LEGACY_SIZE {
            xsave.resize(fx::LEGACY_SIZE, 0);
        }
        let ymm_hi_offset = ymm_hi_offset_for(&xsave);
        X86Registers {
            gprs: gprs_to_array(regs),
            xsave,
            ymm_hi_offset,
            unavailable: RegMask::NONE,
        }
    }

    /// The program counter.
    pub fn pc(&self) -> u64 {
        self.gprs[gpr::RIP]
    }

    /// Sets the program counter.
    pub fn set_pc(&mut self, pc: u64) {
        self.gprs[gpr::RIP] = pc;
    }

    /// The stack pointer.
    pub fn sp(&self) -> u64 {
        self.gprs[gpr::RSP]
    }

    /// True if the AVX upper halves (`ymmNh`) are part of this register file.
    pub fn has_avx(&self) -> bool {
        self.ymm_hi_offset.is_some()
    }

    /// XCR0 as recorded by the kernel in the image's `sw_reserved` bytes (0 if absent).
    pub fn xcr0(&self) -> u64 {
        xcr0_of(&self.xsave)
    }

    /// The general-purpose registers as `libc::user_regs_struct`.
    pub fn to_libc(&self) -> Gprs {
        gprs_from_array(&self.gprs)
    }

    fn le_u16(&self, off: usize) -> u16 {
        u16::from_le_bytes([self.xsave[off], self.xsave[off + 1]])
    }

    fn le_u32(&self, off: usize) -> u32 {
        let mut b = [0u8; 4];
        b.copy_from_slice(&self.xsave[off..off + 4]);
        u32::from_le_bytes(b)
    }

    fn put(&mut self, off: usize, bytes: &[u8]) {
        self.xsave[off..off + bytes.len()].copy_from_slice(bytes);
    }

    /// The x87 tag word in full (2 bits per physical register) form, as GDB's `ftag` shows it,
    /// reconstructed from the abridged FXSAVE tag byte and the register contents.
    pub fn full_tag_word(&self) -> u16 {
        let abridged = self.xsave[fx::FTW];
        let top = (self.le_u16(fx::FSW) >> 11) & 7;
        let mut tag = 0u16;
        for phys in 0..8u16 {
            let t = if abridged & (1 << phys) == 0 {
                3 // empty
            } else {
                let st = ((phys + 8 - top) & 7) as usize;
                let raw = &self.xsave[fx::ST0 + 16 * st..fx::ST0 + 16 * st + 10];
                let exponent = u16::from_le_bytes([raw[8], raw[9]]) & 0x7fff;
                let mut m = [0u8; 8];
                m.copy_from_slice(&raw[..8]);
                let mantissa = u64::from_le_bytes(m);
                if exponent == 0x7fff {
                    2 // special: NaN or infinity
                } else if exponent == 0 {
                    if mantissa == 0 { 1 } else { 2 } // zero, or denormal (special)
                } else if mantissa >> 63 == 0 {
                    2 // unnormal: integer bit clear
                } else {
                    0 // valid
                }
            };
            tag |= t << (2 * phys);
        }
        tag
    }

    /// Serialises the register file in the order of [`GDB_REGS`] (GDB's `g` packet layout),
    /// little-endian, calling `out` once per register with its bytes.
    pub fn gdb_layout(&self, mut out: impl FnMut(usize, &[u8])) {
        if self.xsave.len() < fx::LEGACY_SIZE {
            // A hand-built register file (e.g. a replayed one): x87/SSE state reads as zero.
            let mut padded = self.clone();
            padded.xsave.resize(fx::LEGACY_SIZE, 0);
            return padded.gdb_layout(out);
        }
        let g = &self.gprs;
        let mut n = 0;
        for idx in GDB_GPR_ORDER {
            out(n, &g[idx].to_le_bytes());
            n += 1;
        }
        out(n, &g[gpr::RIP].to_le_bytes());
        n += 1;
        out(n, &(g[gpr::EFLAGS] as u32).to_le_bytes());
        n += 1;
        for idx in [gpr::CS, gpr::SS, gpr::DS, gpr::ES, gpr::FS, gpr::GS] {
            out(n, &(g[idx] as u32).to_le_bytes());
            n += 1;
        }
        for st in 0..8 {
            out(n, &self.xsave[fx::ST0 + 16 * st..fx::ST0 + 16 * st + 10]);
            n += 1;
        }
        let fop = u32::from(self.le_u16(fx::FOP) & 0x7ff);
        let x87_ctl = [
            u32::from(self.le_u16(fx::FCW)),
            u32::from(self.le_u16(fx::FSW)),
            u32::from(self.full_tag_word()),
            u32::from(self.le_u16(fx::FCS)),
            self.le_u32(fx::FIP),
            u32::from(self.le_u16(fx::FDS)),
            self.le_u32(fx::FDP),
            fop,
        ];
        for v in x87_ctl {
            out(n, &v.to_le_bytes());
            n += 1;
        }
        for x in 0..16 {
            out(n, &self.xsave[fx::XMM0 + 16 * x..fx::XMM0 + 16 * x + 16]);
            n += 1;
        }
        out(n, &self.le_u32(fx::MXCSR).to_le_bytes());
        n += 1;
        out(n, &g[gpr::ORIG_RAX].to_le_bytes());
        n += 1;
        out(n, &g[gpr::FS_BASE].to_le_bytes());
        n += 1;
        out(n, &g[gpr::GS_BASE].to_le_bytes());
        n += 1;
        if let Some(off) = self.ymm_hi_offset {
            let avx_live = self.xstate_bv() & XFEATURE_AVX != 0 && off + 256 <= self.xsave.len();
            for y in 0..16 {
                if avx_live {
                    out(n, &self.xsave[off + 16 * y..off + 16 * y + 16]);
                } else {
                    out(n, &[0u8; 16]); // init state: upper halves are zero
                }
                n += 1;
            }
        }
    }

    fn xstate_bv(&self) -> u64 {
        if self.xsave.len() < fx::XSTATE_BV + 8 {
            return 0;
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.xsave[fx::XSTATE_BV..fx::XSTATE_BV + 8]);
        u64::from_le_bytes(b)
    }

    /// Total size in bytes of the GDB `g` layout of this register file.
    pub fn gdb_layout_len(&self) -> usize {
        let n = if self.has_avx() {
            GDB_REGS.len()
        } else {
            GDB_REGS_NO_AVX
        };
        GDB_REGS[..n].iter().map(|r| r.size).sum()
    }

    /// Sets register number `regnum` (GDB numbering, see [`GDB_REGS`]) from little-endian
    /// `bytes`. Returns `false` if the number is unknown or the size is wrong.
    pub fn set_gdb_reg(&mut self, regnum: usize, bytes: &[u8]) -> bool {
        let Some(desc) = GDB_REGS.get(regnum) else {
            return false;
        };
        if self.xsave.len() < fx::LEGACY_SIZE {
            self.xsave.resize(fx::LEGACY_SIZE, 0);
        }
        if bytes.len() != desc.size || (regnum >= GDB_REGS_NO_AVX && !self.has_avx()) {
            return false;
        }
        let mut b8 = [0u8; 8];
        b8[..bytes.len().min(8)].copy_from_slice(&bytes[..bytes.len().min(8)]);
        let v = u64::from_le_bytes(b8);
        match regnum {
            0..=15 => self.gprs[GDB_GPR_ORDER[regnum]] = v,
            16 => self.gprs[gpr::RIP] = v,
            17 => self.gprs[gpr::EFLAGS] = v & 0xffff_ffff,
            18..=23 => {
                let idx = [gpr::CS, gpr::SS, gpr::DS, gpr::ES, gpr::FS, gpr::GS][regnum - 18];
                self.gprs[idx] = v & 0xffff;
            }
            24..=31 => self.put(fx::ST0 + 16 * (regnum - 24), bytes),
            32 => self.put(fx::FCW, &bytes[..2]),
            33 => self.put(fx::FSW, &bytes[..2]),
            34 => {
                // Full tag word → abridged: a register is "valid" unless its tag is 3 (empty).
                let full = v as u16;
                let mut abridged = 0u8;
                for phys in 0..8 {
                    if (full >> (2 * phys)) & 3 != 3 {
                        abridged |= 1 << phys;
                    }
                }
                self.xsave[fx::FTW] = abridged;
            }
            35 => self.put(fx::FCS, &bytes[..2]),
            36 => self.put(fx::FIP, &bytes[..4]),
            37 => self.put(fx::FDS, &bytes[..2]),
            38 => self.put(fx::FDP, &bytes[..4]),
            39 => self.put(fx::FOP, &((v as u16) & 0x7ff).to_le_bytes()),
            40..=55 => self.put(fx::XMM0 + 16 * (regnum - 40), bytes),
            56 => self.put(fx::MXCSR, bytes),
            57 => self.gprs[gpr::ORIG_RAX] = v,
            58 => self.gprs[gpr::FS_BASE] = v,
            59 => self.gprs[gpr::GS_BASE] = v,
            _ => {
                let Some(off) = self.ymm_hi_offset.filter(|&o| o + 256 <= self.xsave.len()) else {
                    return false;
                };
                self.put(off + 16 * (regnum - 60), bytes);
                // Mark the AVX component as in use so the kernel loads what we wrote.
                let bv = self.xstate_bv() | XFEATURE_AVX;
                self.put(fx::XSTATE_BV, &bv.to_le_bytes());
            }
        }
        true
    }
}

/// One register of GDB's `amd64-linux` description, in `g`-packet order.
#[derive(Clone, Copy, Debug)]
pub struct GdbReg {
    /// GDB's name (`rax`, `st0`, `ymm0h`, ...).
    pub name: &'static str,
    /// Size in bytes.
    pub size: usize,
}

const fn r(name: &'static str, size: usize) -> GdbReg {
    GdbReg { name, size }
}

/// Number of registers when the AVX feature is absent (core + sse + linux + segments).
pub const GDB_REGS_NO_AVX: usize = 60;

/// GDB's `amd64-linux` register numbering: features core, sse, linux, segments, avx (the order
/// gdbserver uses and the order of our target description).
pub const GDB_REGS: [GdbReg; 76] = [
    r("rax", 8),
    r("rbx", 8),
    r("rcx", 8),
    r("rdx", 8),
    r("rsi", 8),
    r("rdi", 8),
    r("rbp", 8),
    r("rsp", 8),
    r("r8", 8),
    r("r9", 8),
    r("r10", 8),
    r("r11", 8),
    r("r12", 8),
    r("r13", 8),
    r("r14", 8),
    r("r15", 8),
    r("rip", 8),
    r("eflags", 4),
    r("cs", 4),
    r("ss", 4),
    r("ds", 4),
    r("es", 4),
    r("fs", 4),
    r("gs", 4),
    r("st0", 10),
    r("st1", 10),
    r("st2", 10),
    r("st3", 10),
    r("st4", 10),
    r("st5", 10),
    r("st6", 10),
    r("st7", 10),
    r("fctrl", 4),
    r("fstat", 4),
    r("ftag", 4),
    r("fiseg", 4),
    r("fioff", 4),
    r("foseg", 4),
    r("fooff", 4),
    r("fop", 4),
    r("xmm0", 16),
    r("xmm1", 16),
    r("xmm2", 16),
    r("xmm3", 16),
    r("xmm4", 16),
    r("xmm5", 16),
    r("xmm6", 16),
    r("xmm7", 16),
    r("xmm8", 16),
    r("xmm9", 16),
    r("xmm10", 16),
    r("xmm11", 16),
    r("xmm12", 16),
    r("xmm13", 16),
    r("xmm14", 16),
    r("xmm15", 16),
    r("mxcsr", 4),
    r("orig_rax", 8),
    r("fs_base", 8),
    r("gs_base", 8),
    r("ymm0h", 16),
    r("ymm1h", 16),
    r("ymm2h", 16),
    r("ymm3h", 16),
    r("ymm4h", 16),
    r("ymm5h", 16),
    r("ymm6h", 16),
    r("ymm7h", 16),
    r("ymm8h", 16),
    r("ymm9h", 16),
    r("ymm10h", 16),
    r("ymm11h", 16),
    r("ymm12h", 16),
    r("ymm13h", 16),
    r("ymm14h", 16),
    r("ymm15h", 16),
];

/// The general-purpose registers as an array in [`gpr`] order (what [`X86Registers::gprs`]
/// holds and a state log's register diffs index).
pub fn gprs_to_array(r: &Gprs) -> [u64; gpr::COUNT] {
    [
        r.r15, r.r14, r.r13, r.r12, r.rbp, r.rbx, r.r11, r.r10, r.r9, r.r8, r.rax, r.rcx, r.rdx,
        r.rsi, r.rdi, r.orig_rax, r.rip, r.cs, r.eflags, r.rsp, r.ss, r.fs_base, r.gs_base, r.ds,
        r.es, r.fs, r.gs,
    ]
}

/// XCR0 from a ptrace XSAVE image: for `NT_X86_XSTATE` the kernel stores the user XCR0 as
/// the first u64 of the `sw_reserved` bytes (`USER_XSTATE_XCR0_WORD`; GDB reads it at offset
/// 464 too). This is not the signal-frame `_fpx_sw_bytes` layout.
fn xcr0_of(xsave: &[u8]) -> u64 {
    xsave
        .get(fx::SW_RESERVED..fx::SW_RESERVED + 8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_le_bytes)
}

/// Where YMM_Hi128 lives in an XSAVE image from this CPU, if AVX is enabled in the image's XCR0.
fn ymm_hi_offset_for(xsave: &[u8]) -> Option<usize> {
    if xcr0_of(xsave) & XFEATURE_AVX == 0 {
        return None;
    }
    let off = cpuid_ymm_hi_offset()?;
    (off + 256 <= xsave.len()).then_some(off)
}

/// CPUID leaf 0xD sub-leaf 2: EBX is the offset of the AVX state component in the standard
/// (non-compacted) XSAVE format, which is the format ptrace returns.
fn cpuid_ymm_hi_offset() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unused_unsafe)]
        // SAFETY: CPUID is available on every x86-64 CPU; leaf 0xD is only queried after leaf 0
        // reports it exists.
        let (max_leaf, res) = unsafe {
            let max_leaf = core::arch::x86_64::__cpuid(0).eax;
            (
                max_leaf,
                if max_leaf >= 0xd {
                    Some(core::arch::x86_64::__cpuid_count(0xd, 2))
                } else {
                    None
                },
            )
        };
        let _ = max_leaf;
        let res = res?;
        (res.eax == 256 && res.ebx != 0).then_some(res.ebx as usize)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

/// True if the CPU supports AVX and the OS enabled XSAVE (CPUID leaf 1: OSXSAVE and AVX),
/// i.e. if ptrace will return YMM state. Used before any register has been read.
pub fn avx_enabled() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unused_unsafe)]
        // SAFETY: CPUID leaf 1 exists on every x86-64 CPU.
        let ecx = unsafe { core::arch::x86_64::__cpuid(1).ecx };
        ecx & (1 << 27) != 0 && ecx & (1 << 28) != 0 && cpuid_ymm_hi_offset().is_some()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Size of the XSAVE area the kernel may return (CPUID leaf 0xD sub-leaf 0, ECX: the size for
/// all features the CPU supports), or `None` without XSAVE.
pub(crate) fn xsave_area_size() -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        #[allow(unused_unsafe)]
        // SAFETY: see `cpuid_ymm_hi_offset`.
        let res = unsafe {
            if core::arch::x86_64::__cpuid(0).eax >= 0xd {
                Some(core::arch::x86_64::__cpuid_count(0xd, 0))
            } else {
                None
            }
        }?;
        (res.ecx as usize >= fx::LEGACY_SIZE + 64).then_some(res.ecx as usize)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> X86Registers {
        let mut xsave = vec![0u8; 1024];
        xsave[fx::SW_RESERVED..fx::SW_RESERVED + 8].copy_from_slice(&0x7u64.to_le_bytes());
        let mut regs = X86Registers {
            gprs: [0; gpr::COUNT],
            xsave,
            ymm_hi_offset: Some(576),
            unavailable: RegMask::NONE,
        };
        for (i, g) in regs.gprs.iter_mut().enumerate() {
            *g = 0x1000 + i as u64;
        }
        regs
    }

    #[test]
    fn layout_sizes_match_description() {
        let regs = sample();
        let mut total = 0;
        let mut count = 0;
        regs.gdb_layout(|n, bytes| {
            assert_eq!(
                bytes.len(),
                GDB_REGS[n].size,
                "register {}",
                GDB_REGS[n].name
            );
            assert_eq!(n, count);
            total += bytes.len();
            count += 1;
        });
        assert_eq!(count, 76);
        assert_eq!(total, regs.gdb_layout_len());
        let no_avx = X86Registers {
            ymm_hi_offset: None,
            unavailable: RegMask::NONE,
            ..regs
        };
        let mut c = 0;
        no_avx.gdb_layout(|_, _| c += 1);
        assert_eq!(c, GDB_REGS_NO_AVX);
    }

    #[test]
    fn gpr_order_and_write_back() {
        let mut regs = sample();
        let mut first = Vec::new();
        regs.gdb_layout(|n, b| {
            if n == 0 || n == 7 || n == 16 {
                first.push(u64::from_le_bytes(b.try_into().unwrap()));
            }
        });
        assert_eq!(
            first,
            vec![
                0x1000 + gpr::RAX as u64,
                0x1000 + gpr::RSP as u64,
                0x1000 + gpr::RIP as u64
            ]
        );
        assert!(regs.set_gdb_reg(16, &0xdead_beefu64.to_le_bytes()));
        assert_eq!(regs.pc(), 0xdead_beef);
        assert!(regs.set_gdb_reg(61, &[0xab; 16]));
        assert_eq!(&regs.xsave[576 + 16..576 + 32], &[0xab; 16]);
        assert!(!regs.set_gdb_reg(76, &[0; 16]));
        assert!(!regs.set_gdb_reg(0, &[0; 4]));
    }

    #[test]
    fn hand_built_register_files_do_not_panic() {
        let mut regs = X86Registers::default();
        regs.set_pc(0x401000);
        let mut n = 0;
        regs.gdb_layout(|_, _| n += 1);
        assert_eq!(n, GDB_REGS_NO_AVX);
        regs.ymm_hi_offset = Some(576); // claimed, but the image is too short
        let mut bytes = 0;
        regs.gdb_layout(|_, b| bytes += b.len());
        assert_eq!(bytes, regs.gdb_layout_len());
        assert!(regs.set_gdb_reg(40, &[1; 16]));
        assert!(!regs.set_gdb_reg(60, &[1; 16]));
    }

    #[test]
    fn tag_word_round_trip() {
        let mut regs = sample();
        // TOP = 7, one valid register in st0 (physical 7) holding 1.0.
        regs.xsave[fx::FSW..fx::FSW + 2].copy_from_slice(&(7u16 << 11).to_le_bytes());
        regs.xsave[fx::FTW] = 0x80;
        regs.xsave[fx::ST0 + 7] = 0x80;
        regs.xsave[fx::ST0 + 8..fx::ST0 + 10].copy_from_slice(&0x3fffu16.to_le_bytes());
        assert_eq!(regs.full_tag_word(), 0x3fff); // phys 7 valid (00), all others empty (11)
        assert!(regs.set_gdb_reg(34, &0xffffu32.to_le_bytes()));
        assert_eq!(regs.xsave[fx::FTW], 0);
    }
}
