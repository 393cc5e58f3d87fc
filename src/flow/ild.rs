//! A cheap instruction length and class decoder for the common x86 encodings (libipt's
//! `pt_ild` is the model), in front of iced-x86 in the block cache's cold path.
//!
//! The flow decoder needs three things of an instruction it has not seen before: its length,
//! its control-flow class ([`InsnClass`]) and, for a direct branch, its target. iced-x86 decodes
//! every operand as well, about 10 ns per instruction, which is most of the cost of a short
//! trace. This decoder reads only the prefixes, the opcode, ModRM/SIB and the displacement and
//! immediate sizes, for a whitelist of encodings in 32- and 64-bit mode: the general-purpose
//! integer instructions, `jcc`/`jmp`/`call`/`ret`/`loop`/`jrcxz`, the indirect `call`/`jmp`,
//! `int`/`int3`/`int1`, `syscall`, the hint NOPs (`endbr64`), and the SSE/SSE2/MMX
//! instructions of the two-byte map with the prefixes that make them valid.
//!
//! Also taken, outside the fast paths: LOCK on a memory destination, the memory-offset `mov`s,
//! x87, `sysenter`, `vmcall`, what glibc and ld.so run of the system and SSE2-4 instructions
//! (`cpuid`, `rdtsc`, `xgetbv`, the fences, `xsavec`/`xrstor`, `pmovmskb`, `movq`, shifts by an
//! immediate, `movbe`, `pshufb`, `palignr`, `pcmpistri`), and the VEX (AVX/AVX2/BMI, opmask)
//! and EVEX (AVX-512) instructions of glibc's string and memory functions, each held to
//! iced-x86's rules for `pp`, `L`, `W`, `vvvv`, the register-extension bits and ModRM. A trace
//! of such code then never builds iced-x86's tables (≈ 0.4 ms of a short `decode`).
//!
//! Everything else returns `None` and goes to iced-x86: XOP, the rest of VEX, EVEX and the
//! 0F38/0F3A maps, EVEX with zeroing, broadcast or rounding, the undocumented x87 aliases,
//! far transfers and the other system instructions, 16-bit code and 16-bit addressing,
//! operand-size prefixes on branches (they truncate the IP), instructions that are invalid in
//! the mode, and anything running past the end of the bytes given. The rule is that `Some`
//! must agree with iced-x86 on length, class and branch target (the unit tests check that on
//! random bytes and exhaustively over the two-byte map, LOCK, x87 and every VEX and EVEX opcode
//! taken; `tests/ild.rs` on every instruction of the corpus images).
//!
//! Two paths: 64-bit code without a legacy prefix (a REX at most), 16 bytes from the end of
//! the section, an opcode in one table (`decode_plain64`; 90 % of the new instructions of the
//! corpus trace arcus/hello), which the block cache runs in a loop of its own, and the general
//! path for the rest. A new instruction's cost is mostly the chain from its first byte to the
//! next instruction's start: the fast path keeps that to the byte loads and two table loads.

use super::class::InsnClass;

/// What the cheap decoder found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ild {
    /// Length in bytes.
    pub len: u8,
    /// Control-flow class.
    pub class: InsnClass,
    /// Displacement of a direct branch (`jcc`, `jmp`, `call`, `loop`, `jrcxz`), relative to the
    /// next instruction; 0 otherwise.
    pub disp: i32,
}

impl Ild {
    /// The target of a direct branch at `ip`, as iced-x86's `near_branch_target` gives it.
    #[inline]
    pub fn target(&self, ip: u64, bits: u32) -> u64 {
        let t = ip
            .wrapping_add(self.len as u64)
            .wrapping_add(self.disp as i64 as u64);
        if bits == 64 { t } else { t as u32 as u64 }
    }
}

/// Bytes of ModRM, SIB and displacement starting at `b[i]` (32/64-bit addressing).
#[inline(always)]
fn modrm_len(b: &[u8], i: usize) -> Option<usize> {
    let e = MODRM[*b.get(i)? as usize];
    let mut n = (e & 0x7F) as usize;
    if e & 0x80 != 0 {
        let sib = *b.get(i + 1)?;
        // disp32 with no base: mod 0 (the table entry is then exactly ModRM + SIB) and base 5.
        if n == 2 && sib & 7 == 5 {
            n += 4;
        }
    }
    Some(n)
}

/// Sets the entries `lo..=hi` of an opcode table to `v` (a `for` loop is not allowed in a
/// `const fn`).
const fn set_range<T: Copy>(t: &mut [T; 256], lo: usize, hi: usize, v: T) {
    let mut op = lo;
    while op <= hi {
        t[op] = v;
        op += 1;
    }
}

/// Flags of an opcode table entry, shared by [`ONE_BYTE`] (bits 0-3) and the [`Fast`] tables
/// (all): valid, ModRM follows, the immediate in bits 0-1 (none, imm8, imm16/32 by operand
/// size, and for the fast path imm32 or imm64 by REX.W), the displacement of a direct branch
/// is that immediate, `lea` (a register operand, mod 3, is invalid), `C6`/`C7` (only `/0` is
/// taken).
const F_VALID: u8 = 8;
const F_MODRM: u8 = 4;
const F_IMM8: u8 = 1;
const F_IMM32: u8 = 2;
const F_IMMV: u8 = 3;
const F_IMM_MASK: u8 = 3;
const F_REL: u8 = 16;
const F_LEA: u8 = 32;
const F_REG0: u8 = 64;

/// One-byte opcode table for the common instructions without control flow whose length depends
/// only on ModRM and the operand size: [`F_VALID`], [`F_MODRM`] and the immediate
/// ([`F_IMM8`], or [`F_IMM32`] for imm16/32). A table instead of the `match` below, so
/// that the bulk of the instructions costs no indirect jump (a mispredicted one per instruction
/// was most of the cost).
const fn one_byte_table() -> [u8; 256] {
    const V: u8 = F_VALID;
    const M: u8 = F_MODRM;
    let mut t = [0u8; 256];
    let mut k = 0;
    while k < 8 {
        let base = k * 8;
        t[base] = V | M;
        t[base + 1] = V | M;
        t[base + 2] = V | M;
        t[base + 3] = V | M;
        t[base + 4] = V | F_IMM8;
        t[base + 5] = V | F_IMM32;
        k += 1;
    }
    set_range(&mut t, 0x84, 0x8B, V | M);
    set_range(&mut t, 0x50, 0x5F, V);
    set_range(&mut t, 0x90, 0x99, V);
    set_range(&mut t, 0xB0, 0xB7, V | F_IMM8);
    set_range(&mut t, 0xD0, 0xD3, V | M);
    set_range(&mut t, 0xF8, 0xFD, V);
    t[0x9C] = V;
    t[0x9D] = V;
    t[0xC9] = V;
    t[0xF5] = V;
    t[0xA4] = V;
    t[0xA5] = V;
    t[0xA6] = V;
    t[0xA7] = V;
    set_range(&mut t, 0xAA, 0xAF, V);
    t[0xA8] = V | F_IMM8;
    t[0xA9] = V | F_IMM32;
    t[0x6A] = V | F_IMM8;
    t[0x68] = V | F_IMM32;
    t[0x69] = V | M | F_IMM32;
    t[0x6B] = V | M | F_IMM8;
    t[0x80] = V | M | F_IMM8;
    t[0x81] = V | M | F_IMM32;
    t[0x83] = V | M | F_IMM8;
    t[0xC0] = V | M | F_IMM8;
    t[0xC1] = V | M | F_IMM8;
    t
}

static ONE_BYTE: [u8; 256] = one_byte_table();

/// Per ModRM byte (32/64-bit addressing): bytes of ModRM and displacement, plus 1 and bit 7 set
/// when a SIB byte follows (whose base 5 under mod 0 adds a disp32).
const fn modrm_table() -> [u8; 256] {
    let mut t = [0u8; 256];
    let mut m = 0;
    while m < 256 {
        let (md, rm) = (m >> 6, m & 7);
        let mut n = 1u8;
        if md != 3 {
            if rm == 4 {
                n += 1 | 0x80;
            } else if md == 0 && rm == 5 {
                n += 4;
            }
            if md == 1 {
                n += 1;
            } else if md == 2 {
                n += 4;
            }
        }
        t[m] = n;
        m += 1;
    }
    t
}

static MODRM: [u8; 256] = modrm_table();

/// Prefix columns of the two-byte SSE/MMX table: which mandatory prefix makes the opcode valid.
const NP: u8 = 1;
const P66: u8 = 2;
const PF3: u8 = 4;
const PF2: u8 = 8;
const ALL: u8 = NP | P66 | PF3 | PF2;
/// Flag: an imm8 follows the ModRM operand.
const IMM8: u8 = 16;

/// The two-byte (0F xx) SSE/MMX opcodes taken: valid mandatory prefixes and immediate. Opcodes
/// not listed (0 here) go to iced-x86.
const fn sse_table() -> [u8; 256] {
    let mut t = [0u8; 256];
    t[0x10] = ALL;
    t[0x11] = ALL;
    t[0x14] = NP | P66;
    t[0x15] = NP | P66;
    t[0x28] = NP | P66;
    t[0x29] = NP | P66;
    t[0x2A] = ALL;
    t[0x2C] = ALL;
    t[0x2D] = ALL;
    t[0x2E] = NP | P66;
    t[0x2F] = NP | P66;
    t[0x51] = ALL;
    t[0x52] = NP | PF3;
    t[0x53] = NP | PF3;
    t[0x54] = NP | P66;
    t[0x55] = NP | P66;
    t[0x56] = NP | P66;
    t[0x57] = NP | P66;
    t[0x58] = ALL;
    t[0x59] = ALL;
    t[0x5A] = ALL;
    t[0x5B] = NP | P66 | PF3;
    t[0x5C] = ALL;
    t[0x5D] = ALL;
    t[0x5E] = ALL;
    t[0x5F] = ALL;
    set_range(&mut t, 0x60, 0x6B, NP | P66);
    t[0x6C] = P66;
    t[0x6D] = P66;
    t[0x6E] = NP | P66;
    t[0x6F] = NP | P66 | PF3;
    t[0x70] = ALL | IMM8;
    t[0x74] = NP | P66;
    t[0x75] = NP | P66;
    t[0x76] = NP | P66;
    t[0x7C] = P66 | PF2;
    t[0x7D] = P66 | PF2;
    t[0x7E] = NP | P66 | PF3;
    t[0x7F] = NP | P66 | PF3;
    t[0xC2] = ALL | IMM8;
    t[0xC6] = NP | P66 | IMM8;
    t[0xD0] = P66 | PF2;
    set_range(&mut t, 0xD1, 0xFE, NP | P66);
    t[0xD6] = 0;
    t[0xD7] = 0;
    t[0xE6] = P66 | PF3 | PF2;
    t[0xE7] = 0;
    t[0xF0] = 0;
    t[0xF7] = 0;
    t
}

static SSE: [u8; 256] = sse_table();

/// An opcode of the prefix-free 64-bit path: its flags and class, read in one load.
#[derive(Clone, Copy)]
struct Fast {
    flags: u8,
    class: InsnClass,
}

const NOT_FAST: Fast = Fast {
    flags: 0,
    class: InsnClass::Other,
};

const fn fast(flags: u8, class: InsnClass) -> Fast {
    Fast {
        flags: F_VALID | flags,
        class,
    }
}

/// One-byte opcodes of the prefix-free 64-bit path: those of [`ONE_BYTE`] plus `mov r, imm`,
/// `lea`, `movsxd`, `mov r/m, imm` and the direct branches and `ret`.
const fn fast_table() -> [Fast; 256] {
    let mut t = [NOT_FAST; 256];
    let mut op = 0;
    while op < 256 {
        let e = ONE_BYTE[op];
        if e & F_VALID != 0 {
            t[op] = fast(e & (F_MODRM | F_IMM_MASK), InsnClass::Other);
        }
        op += 1;
    }
    set_range(&mut t, 0xB8, 0xBF, fast(F_IMMV, InsnClass::Other));
    set_range(
        &mut t,
        0x70,
        0x7F,
        fast(F_IMM8 | F_REL, InsnClass::CondBranch),
    );
    set_range(
        &mut t,
        0xE0,
        0xE3,
        fast(F_IMM8 | F_REL, InsnClass::CondBranch),
    );
    t[0xEB] = fast(F_IMM8 | F_REL, InsnClass::DirectJump);
    t[0xE9] = fast(F_IMM32 | F_REL, InsnClass::DirectJump);
    t[0xE8] = fast(F_IMM32 | F_REL, InsnClass::DirectCall);
    t[0xC3] = fast(0, InsnClass::Return);
    t[0x8D] = fast(F_MODRM | F_LEA, InsnClass::Other);
    t[0x63] = fast(F_MODRM, InsnClass::Other);
    t[0xC6] = fast(F_MODRM | F_IMM8 | F_REG0, InsnClass::Other);
    t[0xC7] = fast(F_MODRM | F_IMM32 | F_REG0, InsnClass::Other);
    t
}

/// Two-byte (`0F xx`) opcodes of the prefix-free 64-bit path: as the general path takes them
/// without a prefix.
const fn fast_0f_table() -> [Fast; 256] {
    let mut t = [NOT_FAST; 256];
    let mut op = 0;
    while op < 256 {
        let e = SSE[op];
        if e & NP != 0 {
            let imm = if e & IMM8 != 0 { F_IMM8 } else { 0 };
            t[op] = fast(F_MODRM | imm, InsnClass::Other);
        }
        op += 1;
    }
    let modrm_ops: [u8; 19] = [
        0x1E, 0x1F, 0xA3, 0xA5, 0xAB, 0xAD, 0xAF, 0xB0, 0xB1, 0xB3, 0xB6, 0xB7, 0xBB, 0xBC, 0xBD,
        0xBE, 0xBF, 0xC0, 0xC1,
    ];
    let mut k = 0;
    while k < modrm_ops.len() {
        t[modrm_ops[k] as usize] = fast(F_MODRM, InsnClass::Other);
        k += 1;
    }
    t[0xA4] = fast(F_MODRM | F_IMM8, InsnClass::Other);
    t[0xAC] = fast(F_MODRM | F_IMM8, InsnClass::Other);
    // cmovcc, jcc rel32, setcc, bswap.
    set_range(&mut t, 0x40, 0x4F, fast(F_MODRM, InsnClass::Other));
    set_range(
        &mut t,
        0x80,
        0x8F,
        fast(F_IMM32 | F_REL, InsnClass::CondBranch),
    );
    set_range(&mut t, 0x90, 0x9F, fast(F_MODRM, InsnClass::Other));
    set_range(&mut t, 0xC8, 0xCF, fast(0, InsnClass::Other));
    t[0x05] = fast(0, InsnClass::SysCall);
    t
}

static FAST: [Fast; 256] = fast_table();
static FAST_0F: [Fast; 256] = fast_0f_table();

/// The common case of 64-bit code: no legacy prefix (a REX at most), an opcode of [`FAST`] or
/// [`FAST_0F`], and 16 bytes to read. One table lookup replaces the prefix loop and the
/// `match` of [`decode_general`], no byte read needs a bounds test of its own, and the
/// immediate and displacement come from shifts rather than branches; `None` sends the
/// instruction to the general path.
#[inline(always)]
pub(super) fn decode_plain64(w: &[u8; 16]) -> Option<Ild> {
    let rex = w[0] & 0xF0 == 0x40;
    let mut i = rex as usize;
    let rex_w = rex & (w[0] & 8 != 0);
    let esc = w[i] == 0x0F;
    let e = if esc {
        i += 1;
        FAST_0F[w[i] as usize]
    } else {
        FAST[w[i] as usize]
    };
    let t = e.flags;
    if t & F_VALID == 0 {
        return None;
    }
    i += 1;
    let mut len = i;
    if t & F_MODRM != 0 {
        let m = w[i];
        if (t & F_LEA != 0 && m >> 6 == 3) || (t & F_REG0 != 0 && (m >> 3) & 7 != 0) {
            return None;
        }
        len += modrm_len(w, i)?;
    }
    let k = u32::from(t & F_IMM_MASK);
    // Immediate bytes by kind, as nibbles: none, imm8, imm32, imm32 (imm64 with REX.W).
    let imm = ((0x4410u32 >> (k * 4)) & 0xF) as usize + if k == 3 && rex_w { 4 } else { 0 };
    // A branch's displacement is its immediate: rel8 sign-extended by the shifts, rel32 as
    // is. Read from the window as one value (`len <= 9` here), not byte by byte.
    let raw = (u128::from_le_bytes(*w) >> (len * 8)) as u32 as i32;
    let sh = if k == 1 { 24 } else { 0 };
    let disp = if t & F_REL != 0 { (raw << sh) >> sh } else { 0 };
    Some(Ild {
        len: (len + imm) as u8,
        class: e.class,
        disp,
    })
}

/// Decodes the instruction at the start of `b` in `bits` (32 or 64) mode, or `None` to leave
/// it to iced-x86 (see the module docs).
#[inline]
pub fn decode(b: &[u8], bits: u32) -> Option<Ild> {
    if bits == 64 {
        if let Some(d) = b.first_chunk::<16>().and_then(decode_plain64) {
            return Some(d);
        }
        return decode_general_64(b);
    }
    decode_general(b, bits)
}

/// The general path of 64-bit code, out of line: the prefix-free path takes most instructions,
/// and inlining both made the block cache's loop slower (more instructions per pass).
#[inline(never)]
fn decode_general_64(b: &[u8]) -> Option<Ild> {
    decode_general(b, 64)
}

/// [`decode`] for every encoding it takes: legacy prefixes, 32-bit mode, the end of the bytes.
/// Inlined like `decode` itself: called out of line, 32-bit traces paid for the call.
#[inline(always)]
fn decode_general(b: &[u8], bits: u32) -> Option<Ild> {
    let is64 = match bits {
        64 => true,
        32 => false,
        _ => return None,
    };
    let mut i = 0usize;
    let (mut p66, mut p67, mut f2, mut f3) = (false, false, false, false);
    let mut lock = false;
    let mut op = loop {
        let p = *b.get(i)?;
        match p {
            0x26 | 0x2E | 0x36 | 0x3E | 0x64 | 0x65 => {}
            0x66 => p66 = true,
            0xF0 => lock = true,
            0x67 => p67 = true,
            0xF2 => f2 = true,
            0xF3 => f3 = true,
            _ => break p,
        }
        i += 1;
        if i >= 15 {
            return None;
        }
    };
    // 16-bit addressing (67 in 32-bit mode) has its own ModRM layout.
    if p67 && !is64 {
        return None;
    }
    let mut rex_w = false;
    if is64 && op & 0xF0 == 0x40 {
        rex_w = op & 8 != 0;
        i += 1;
        op = *b.get(i)?;
        // A prefix after REX cancels it (and another REX replaces it): rare, left to iced-x86.
        if matches!(
            op,
            0x26 | 0x2E | 0x36 | 0x3E | 0x64 | 0x65 | 0x66 | 0x67 | 0xF0 | 0xF2 | 0xF3
        ) || op & 0xF0 == 0x40
        {
            return None;
        }
    }
    if is64 && i == 0 && (op == 0xC4 || op == 0xC5) {
        return decode_vex(b);
    }
    if is64 && i == 0 && op == 0x62 {
        return decode_evex(b);
    }
    // LOCK is valid only on a memory destination of the read-modify-write instructions
    // (iced-x86 calls anything else invalid); XACQUIRE/XRELEASE with it are left to iced-x86.
    if lock && (f2 || f3 || !lock_allowed(op, b, i)?) {
        return None;
    }
    i += 1; // the opcode
    let z = if p66 && !rex_w { 2 } else { 4 };
    let t = ONE_BYTE[op as usize];
    if t & F_VALID != 0 {
        let mut len = i;
        if t & F_MODRM != 0 {
            len += modrm_len(b, i)?;
        }
        len += [0, 1, z, 0][(t & F_IMM_MASK) as usize];
        if len > 15 || len > b.len() {
            return None;
        }
        return Some(Ild {
            len: len as u8,
            class: InsnClass::Other,
            disp: 0,
        });
    }
    let mut disp = 0i32;
    let rel8 = |at: usize| b.get(at).map(|&d| d as i8 as i32);
    let rel32 = |at: usize| {
        b.get(at..at + 4)
            .map(|s| i32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    let reg = |at: usize| b.get(at).map(|m| (m >> 3) & 7);
    let (rest, class) = match op {
        // ALU r/m, reg forms.
        0x00..=0x03
        | 0x08..=0x0B
        | 0x10..=0x13
        | 0x18..=0x1B
        | 0x20..=0x23
        | 0x28..=0x2B
        | 0x30..=0x33
        | 0x38..=0x3B
        | 0x84..=0x8B => (modrm_len(b, i)?, InsnClass::Other),
        0x04 | 0x0C | 0x14 | 0x1C | 0x24 | 0x2C | 0x34 | 0x3C | 0xA8 | 0xB0..=0xB7 | 0x6A => {
            (1, InsnClass::Other)
        }
        0x05 | 0x0D | 0x15 | 0x1D | 0x25 | 0x2D | 0x35 | 0x3D | 0xA9 | 0x68 => {
            (z, InsnClass::Other)
        }
        0x40..=0x4F if !is64 => (0, InsnClass::Other),
        0x50..=0x5F | 0x90..=0x99 | 0x9C | 0x9D | 0xC9 | 0xF5 | 0xF8..=0xFD => {
            (0, InsnClass::Other)
        }
        0xA4..=0xA7 | 0xAA..=0xAF => (0, InsnClass::Other),
        // `mov` to or from a memory offset: the offset has the address size.
        0xA0..=0xA3 => (if !is64 || p67 { 4 } else { 8 }, InsnClass::Other),
        0x63 if is64 => (modrm_len(b, i)?, InsnClass::Other),
        0x69 => (modrm_len(b, i)? + z, InsnClass::Other),
        0x6B | 0x80 | 0x83 | 0xC0 | 0xC1 => (modrm_len(b, i)? + 1, InsnClass::Other),
        0x81 => (modrm_len(b, i)? + z, InsnClass::Other),
        0x8D => {
            if *b.get(i)? >> 6 == 3 {
                return None;
            }
            (modrm_len(b, i)?, InsnClass::Other)
        }
        0x8F if reg(i)? == 0 => (modrm_len(b, i)?, InsnClass::Other),
        0xB8..=0xBF => (if rex_w { 8 } else { z }, InsnClass::Other),
        0xC6 if reg(i)? == 0 => (modrm_len(b, i)? + 1, InsnClass::Other),
        0xC7 if reg(i)? == 0 => (modrm_len(b, i)? + z, InsnClass::Other),
        0xD0..=0xD3 => (modrm_len(b, i)?, InsnClass::Other),
        0xF6 => {
            let imm = if reg(i)? < 2 { 1 } else { 0 };
            (modrm_len(b, i)? + imm, InsnClass::Other)
        }
        0xF7 => {
            let imm = if reg(i)? < 2 { z } else { 0 };
            (modrm_len(b, i)? + imm, InsnClass::Other)
        }
        0xFE if reg(i)? < 2 => (modrm_len(b, i)?, InsnClass::Other),
        0xFF => match reg(i)? {
            0 | 1 | 6 => (modrm_len(b, i)?, InsnClass::Other),
            2 if !p66 => (modrm_len(b, i)?, InsnClass::IndirectCall),
            4 if !p66 => (modrm_len(b, i)?, InsnClass::IndirectJump),
            _ => return None,
        },
        // Branches: an operand-size prefix truncates the IP to 16 bits; left to iced-x86.
        _ if p66 && matches!(op, 0x70..=0x7F | 0xC2 | 0xC3 | 0xE0..=0xE3 | 0xE8 | 0xE9 | 0xEB) => {
            return None;
        }
        0x70..=0x7F | 0xE0..=0xE3 => {
            disp = rel8(i)?;
            (1, InsnClass::CondBranch)
        }
        0xEB => {
            disp = rel8(i)?;
            (1, InsnClass::DirectJump)
        }
        0xE9 => {
            disp = rel32(i)?;
            (4, InsnClass::DirectJump)
        }
        0xE8 => {
            disp = rel32(i)?;
            (4, InsnClass::DirectCall)
        }
        0xC3 => (0, InsnClass::Return),
        0xC2 => (2, InsnClass::Return),
        0xCC | 0xF1 => (0, InsnClass::SoftInt),
        0xD8..=0xDF if !p66 && !f2 && !f3 && x87_valid(op, *b.get(i)?) => {
            (modrm_len(b, i)?, InsnClass::Other)
        }
        0xCD => (1, InsnClass::SoftInt),
        0x0F => {
            let op2 = *b.get(i)?;
            i += 1;
            match op2 {
                0x05 if is64 => (0, InsnClass::SysCall),
                0x34 if !p66 && !f2 && !f3 => (0, InsnClass::SysCall),
                // VMCALL: a VM exit, like WRMSR an instruction the decoder treats apart.
                0x01 if !p66 && !f2 && !f3 && b.get(i) == Some(&0xC1) => (1, InsnClass::Special),
                0x1E | 0x1F => (modrm_len(b, i)?, InsnClass::Other),
                0x40..=0x4F
                | 0x90..=0x9F
                | 0xA3
                | 0xA5
                | 0xAB
                | 0xAD
                | 0xAF
                | 0xB0
                | 0xB1
                | 0xB3
                | 0xB6
                | 0xB7
                | 0xBB
                | 0xBE
                | 0xBF
                | 0xC0
                | 0xC1
                    if !f2 && !f3 =>
                {
                    (modrm_len(b, i)?, InsnClass::Other)
                }
                0xBC | 0xBD if !f2 => (modrm_len(b, i)?, InsnClass::Other),
                0xA4 | 0xAC if !f2 && !f3 => (modrm_len(b, i)? + 1, InsnClass::Other),
                0xBA if !f2 && !f3 && reg(i)? >= 4 => (modrm_len(b, i)? + 1, InsnClass::Other),
                0xC8..=0xCF if !f2 && !f3 => (0, InsnClass::Other),
                0x80..=0x8F if !p66 => {
                    disp = rel32(i)?;
                    (4, InsnClass::CondBranch)
                }
                _ => {
                    let t = SSE[op2 as usize];
                    // One mandatory prefix at most (66 with F2/F3, or F2 with F3, is left to
                    // iced-x86, which picks by position).
                    let col = match (p66, f3, f2) {
                        (false, false, false) => NP,
                        (true, false, false) => P66,
                        (false, true, false) => PF3,
                        (false, false, true) => PF2,
                        _ => return None,
                    };
                    if let Some(rest) = more_0f(op2, col, b, i) {
                        (rest?, InsnClass::Other)
                    } else {
                        if t & col == 0 {
                            return None;
                        }
                        let imm = if t & IMM8 != 0 { 1 } else { 0 };
                        (modrm_len(b, i)? + imm, InsnClass::Other)
                    }
                }
            }
        }
        _ => return None,
    };
    let len = i + rest;
    if len > 15 || len > b.len() {
        return None;
    }
    Some(Ild {
        len: len as u8,
        class,
        disp,
    })
}

/// Whether the x87 instruction `op` (`D8`..`DF`) with ModRM byte `m` is valid: every memory
/// form but `D9 /1`, `DB /4`, `DB /6` and `DD /5`, and the register forms of the x87 opcode
/// map except the undocumented aliases (`FSTP1`, `FXCH4`, `FCOMP5`, `FFREEP`, …) and the
/// 8087/287 leftovers, which go to iced-x86.
#[cold]
#[inline(never)]
fn x87_valid(op: u8, m: u8) -> bool {
    let reg = (m >> 3) & 7;
    if m >> 6 != 3 {
        return !matches!((op, reg), (0xD9, 1) | (0xDB, 4) | (0xDB, 6) | (0xDD, 5));
    }
    match op {
        0xD8 | 0xDC => true,
        0xD9 => matches!(m, 0xC0..=0xCF | 0xE0 | 0xE1 | 0xE4 | 0xE5 | 0xE8..=0xEE | 0xF0..=0xFF),
        0xDA => matches!(m, 0xC0..=0xDF | 0xE9),
        0xDB => matches!(m, 0xC0..=0xDF | 0xE2 | 0xE3 | 0xE8..=0xF7),
        0xDD => matches!(m, 0xC0..=0xC7 | 0xD0..=0xEF),
        0xDE => matches!(m, 0xC0..=0xCF | 0xD9 | 0xE0..=0xFF),
        _ => matches!(m, 0xE0 | 0xE8..=0xF7),
    }
}

/// Whether LOCK may precede the opcode `op` at `b[i]`: a memory operand and a
/// read-modify-write instruction. The rare encodings here and below are kept out of line, so
/// that the general path inlined into the block cache stays small.
#[cold]
#[inline(never)]
fn lock_allowed(op: u8, b: &[u8], i: usize) -> Option<bool> {
    let (opx, m) = if op == 0x0F {
        (0x100 | u16::from(*b.get(i + 1)?), *b.get(i + 2)?)
    } else {
        (u16::from(op), *b.get(i + 1)?)
    };
    Some(m >> 6 != 3 && lockable(opx, (m >> 3) & 7))
}

/// Whether LOCK may precede the opcode `opx` (`0x100 | op` for the two-byte map) with ModRM
/// reg field `reg` (the memory operand is checked by the caller).
fn lockable(opx: u16, reg: u8) -> bool {
    match opx {
        0x00 | 0x01 | 0x08 | 0x09 | 0x10 | 0x11 | 0x18 | 0x19 | 0x20 | 0x21 | 0x28 | 0x29
        | 0x30 | 0x31 | 0x86 | 0x87 => true,
        0x80 | 0x81 | 0x83 => reg != 7,
        0xF6 | 0xF7 => reg == 2 || reg == 3,
        0xFE | 0xFF => reg < 2,
        0x1AB | 0x1B0 | 0x1B1 | 0x1B3 | 0x1BB | 0x1C0 | 0x1C1 => true,
        0x1BA => reg >= 5,
        0x1C7 => reg == 1,
        _ => false,
    }
}

/// Two-byte-map instructions outside the [`SSE`] table's pattern, by mandatory prefix `col`:
/// `Some(Some(n))` is the length after the opcode, `Some(None)` an encoding the cheap decoder
/// leaves to iced-x86, `None` an opcode for the table. These are what glibc and ld.so run
/// besides the table's: `cpuid`, `rdtsc`, `xgetbv`, the fences, `xsavec`/`xrstor` (lazy
/// binding), `pmovmskb`, `movq`, the shifts by an immediate, `movlpd`/`movhpd`, `movbe`,
/// `pshufb`, `palignr`, `pcmpistri`, non-temporal stores and prefetches.
#[cold]
#[inline(never)]
fn more_0f(op2: u8, col: u8, b: &[u8], i: usize) -> Option<Option<usize>> {
    let np = col == NP;
    if matches!(op2, 0x31 | 0xA2) {
        return Some(np.then_some(0));
    }
    // Every other encoding has a byte after the opcode (ModRM, or the third opcode byte); the
    // table's need one too.
    let Some(&m) = b.get(i) else {
        return Some(None);
    };
    let (mem, reg) = (m >> 6 != 3, (m >> 3) & 7);
    let modrm = || modrm_len(b, i);
    Some(match op2 {
        0x01 if np && m == 0xD0 => Some(1),
        // Fences (register forms of /5../7), FXSAVE..CLFLUSH (memory forms).
        0xAE if np && (mem || reg >= 5) => modrm(),
        // CMPXCHG8B/16B, XRSTORS, XSAVEC, XSAVES.
        0xC7 if np && mem && matches!(reg, 1 | 3 | 4 | 5) => modrm(),
        0x12 if col != P66 || mem => modrm(),
        0x13 | 0x17 if (np || col == P66) && mem => modrm(),
        0x16 if col != PF2 && (col != P66 || mem) => modrm(),
        0xD7 if (np || col == P66) && !mem => Some(1),
        0x71 | 0x72 if (np || col == P66) && !mem && matches!(reg, 2 | 4 | 6) => Some(2),
        0x73 if !mem
            && ((matches!(reg, 2 | 6) && (np || col == P66))
                || (col == P66 && matches!(reg, 3 | 7))) =>
        {
            Some(2)
        }
        // MOVQ xmm/m64, xmm.
        0xD6 if col == P66 => modrm(),
        0x2B | 0xE7 if (np || col == P66) && mem => modrm(),
        0x18 if np && mem && reg < 4 => modrm(),
        // The three-byte maps: `m` is the third opcode byte, ModRM follows.
        0x38 => {
            let m3 = *b.get(i + 1)?;
            match m {
                0x00 if np || col == P66 => modrm_len(b, i + 1).map(|n| n + 1),
                0xF0 | 0xF1 if np && m3 >> 6 != 3 => modrm_len(b, i + 1).map(|n| n + 1),
                _ => None,
            }
        }
        0x3A => match m {
            0x0F if np || col == P66 => modrm_len(b, i + 1).map(|n| n + 2),
            0x63 if col == P66 => modrm_len(b, i + 1).map(|n| n + 2),
            _ => None,
        },
        0x01
        | 0xAE
        | 0xC7
        | 0x12
        | 0x13
        | 0x16
        | 0x17
        | 0xD7
        | 0x71..=0x73
        | 0xD6
        | 0x2B
        | 0xE7
        | 0x18 => None,
        _ => return None,
    })
}

/// What a VEX- or EVEX-encoded opcode allows: the `pp` values (bit 0 none, 1 `66`, 2 `F3`,
/// 3 `F2`), `L` (bit 0 128-bit, 1 256-bit, 2 512-bit), `W` (bit 0 W0, 1 W1), the (`pp`, `W`)
/// pairs (bit `2 × pp + W`) where they depend on each other, whether `vvvv` must be 1111 (no
/// second source), whether ModRM must name a register or memory, whether its `reg` or its
/// register `rm` names an opmask register (k0-k7: the register-extension bits must be clear),
/// the `reg` values of a group opcode, a ModRM byte and an imm8.
#[derive(Clone, Copy)]
struct VexRule {
    pp: u8,
    l: u8,
    w: u8,
    pw: u8,
    no_vvvv: bool,
    reg_only: bool,
    mem_only: bool,
    k_reg: bool,
    k_rm: bool,
    regs: u8,
    modrm: bool,
    imm8: bool,
}

/// Three-operand integer AVX/AVX2 instruction with `66`, either length, any `W`.
const V3: VexRule = VexRule {
    pp: 2,
    l: 3,
    w: 3,
    pw: 0xFF,
    no_vvvv: false,
    reg_only: false,
    mem_only: false,
    k_reg: false,
    k_rm: false,
    regs: 0xFF,
    modrm: true,
    imm8: false,
};

/// Two-operand move or test: as [`V3`] with `vvvv` 1111.
const V2: VexRule = VexRule {
    no_vvvv: true,
    ..V3
};

/// The VEX instructions taken (maps 1 = `0F`, 2 = `0F38`, 3 = `0F3A`): those of glibc's
/// AVX2 string and memory functions and the BMI ones compilers emit. Anything else goes to
/// iced-x86. `tests` checks every entry against iced-x86 over all the `VEX` bytes.
fn vex_rule(map: u8, op: u8) -> Option<VexRule> {
    const KMOV_GPR: VexRule = VexRule {
        pp: 1 | 2 | 8,
        l: 1,
        pw: 1 << 0 | 1 << 2 | 1 << 6 | 1 << 7,
        reg_only: true,
        ..V2
    };
    let r = match (map, op) {
        // VZEROUPPER (L0) / VZEROALL (L1).
        (1, 0x77) => VexRule {
            pp: 1,
            modrm: false,
            ..V2
        },
        (1, 0x6F | 0x7F) => VexRule { pp: 2 | 4, ..V2 },
        (1, 0x10 | 0x11 | 0x28 | 0x29) => VexRule { pp: 1 | 2, ..V2 },
        (1, 0x54..=0x57) => VexRule { pp: 1 | 2, ..V3 },
        (1, 0xC6) => VexRule {
            pp: 1 | 2,
            imm8: true,
            ..V3
        },
        (1, 0x60..=0x6D | 0x74..=0x76 | 0xD1..=0xD5 | 0xD8..=0xDF | 0xE0..=0xE5 | 0xE8..=0xEF)
        | (1, 0xF1..=0xF6 | 0xF8..=0xFE) => V3,
        (1, 0xD7) => VexRule {
            reg_only: true,
            ..V2
        },
        (1, 0x6E | 0xD6) => VexRule { l: 1, ..V2 },
        (1, 0x7E) => VexRule {
            pp: 2 | 4,
            l: 1,
            ..V2
        },
        (1, 0x70) => VexRule {
            pp: 2 | 4 | 8,
            imm8: true,
            ..V2
        },
        (1, 0x71 | 0x72) => VexRule {
            reg_only: true,
            regs: 1 << 2 | 1 << 4 | 1 << 6,
            imm8: true,
            ..V3
        },
        (1, 0x73) => VexRule {
            reg_only: true,
            regs: 1 << 2 | 1 << 3 | 1 << 6 | 1 << 7,
            imm8: true,
            ..V3
        },
        (2, 0x00 | 0x38..=0x3F) => V3,
        (2, 0x17) => V2,
        (2, 0x78 | 0x79 | 0x58 | 0x59) => VexRule { w: 1, ..V2 },
        // SHLX / SARX / SHRX, BEXTR.
        (2, 0xF7) => VexRule { pp: 15, l: 1, ..V3 },
        // BZHI, PEXT, PDEP; ANDN; MULX.
        (2, 0xF5) => VexRule {
            pp: 1 | 4 | 8,
            l: 1,
            ..V3
        },
        (2, 0xF2) => VexRule { pp: 1, l: 1, ..V3 },
        (2, 0xF6) => VexRule { pp: 8, l: 1, ..V3 },
        // BLSR / BLSMSK / BLSI.
        (2, 0xF3) => VexRule {
            pp: 1,
            l: 1,
            regs: 1 << 1 | 1 << 2 | 1 << 3,
            ..V3
        },
        // The opmask instructions (AVX-512): KMOV (k, k/m; m, k; k, r; r, k), KORTEST, KTEST.
        (1, 0x90) => VexRule {
            pp: 1 | 2,
            l: 1,
            k_reg: true,
            k_rm: true,
            ..V2
        },
        (1, 0x91) => VexRule {
            pp: 1 | 2,
            l: 1,
            mem_only: true,
            k_reg: true,
            ..V2
        },
        // KMOVW/B/D/Q between an opmask and a general register (W1 only for KMOVQ).
        (1, 0x92) => VexRule {
            k_reg: true,
            ..KMOV_GPR
        },
        (1, 0x93) => VexRule {
            k_rm: true,
            ..KMOV_GPR
        },
        (1, 0x98 | 0x99) => VexRule {
            pp: 1 | 2,
            l: 1,
            reg_only: true,
            k_reg: true,
            k_rm: true,
            ..V2
        },
        (3, 0x0F) => VexRule { imm8: true, ..V3 },
        (3, 0x62 | 0x63) => VexRule {
            l: 1,
            imm8: true,
            ..V2
        },
        (3, 0x38 | 0x46) => VexRule {
            l: 2,
            w: 1,
            imm8: true,
            ..V3
        },
        (3, 0x39) => VexRule {
            l: 2,
            w: 1,
            imm8: true,
            ..V2
        },
        // RORX.
        (3, 0xF0) => VexRule {
            pp: 8,
            l: 1,
            imm8: true,
            ..V2
        },
        _ => return None,
    };
    Some(r)
}

/// A VEX instruction (64-bit mode, `C4`/`C5` first, no prefix before it), or `None`.
#[cold]
#[inline(never)]
fn decode_vex(b: &[u8]) -> Option<Ild> {
    let b1 = *b.get(1)?;
    // The register-extension bits are stored inverted: R̄ (ModRM.reg), B̄ (ModRM.rm).
    let (map, wvvvvlpp, at, b_bar) = if b[0] == 0xC5 {
        (1, b1 & 0x7F, 2, 1)
    } else {
        (b1 & 0x1F, *b.get(2)?, 3, (b1 >> 5) & 1)
    };
    let rule = vex_rule(map, *b.get(at)?)?;
    if rule.k_reg && b1 >> 7 == 0 {
        return None;
    }
    let (w, vvvv, l, pp) = (
        wvvvvlpp >> 7,
        (wvvvvlpp >> 3) & 0xF,
        (wvvvvlpp >> 2) & 1,
        wvvvvlpp & 3,
    );
    if !rule.allows(pp, w, l) || (rule.no_vvvv && vvvv != 0xF) {
        return None;
    }
    rule.operands(b, at + 1, b_bar == 0)
}

impl VexRule {
    /// Whether the prefix's `pp`, `W` and vector length are allowed.
    fn allows(&self, pp: u8, w: u8, l: u8) -> bool {
        self.pp & 1 << pp != 0
            && self.w & 1 << w != 0
            && self.pw & 1 << (2 * pp + w) != 0
            && self.l & 1 << l != 0
    }

    /// The instruction whose opcode ends at `b[at - 1]`: ModRM, SIB, displacement and
    /// immediate as the rule says.
    /// `rm_high`: the prefix extends a register `rm` past 7.
    fn operands(&self, b: &[u8], at: usize, rm_high: bool) -> Option<Ild> {
        let mut len = at;
        if self.modrm {
            let m = *b.get(len)?;
            let reg_form = m >> 6 == 3;
            if (self.reg_only && !reg_form)
                || (self.mem_only && reg_form)
                || (self.k_rm && reg_form && rm_high)
                || self.regs & 1 << ((m >> 3) & 7) == 0
            {
                return None;
            }
            len += modrm_len(b, len)?;
        }
        len += usize::from(self.imm8);
        if len > 15 || len > b.len() {
            return None;
        }
        Some(Ild {
            len: len as u8,
            class: InsnClass::Other,
            disp: 0,
        })
    }
}

/// The EVEX (AVX-512) instructions taken: those of glibc's `*_evex` string and memory
/// functions, which it picks on CPUs with AVX-512 (most servers with Intel PT). Held to
/// iced-x86's rules like [`vex_rule`]; on top, only without zeroing (`z`), broadcast or
/// rounding (`b`), and with `V'` set where `vvvv` is unused.
fn evex_rule(map: u8, op: u8) -> Option<VexRule> {
    const E3: VexRule = VexRule { l: 7, ..V3 };
    const E2: VexRule = VexRule {
        no_vvvv: true,
        ..E3
    };
    let r = match (map, op) {
        // VMOVDQA32/64, VMOVDQU32/64, VMOVDQU8/16: loads and stores.
        (1, 0x6F | 0x7F) => VexRule {
            pp: 2 | 4 | 8,
            ..E2
        },
        // VPXOR/VPAND/VPANDN/VPOR D/Q, VPMINUB, VPMAXUB, VPSUBB, VPADDB.
        (1, 0xEF | 0xDB | 0xDF | 0xEB | 0xDA | 0xDE | 0xF8 | 0xFC) => E3,
        // VPCMPEQB/W/D, VPCMPGTB into an opmask.
        (1, 0x74 | 0x75 | 0x64) => VexRule { k_reg: true, ..E3 },
        (1, 0x76) => VexRule {
            w: 1,
            k_reg: true,
            ..E3
        },
        // VPBROADCASTB/W/D/Q from a general register; VPBROADCASTB from xmm/m8.
        (2, 0x7A | 0x7B) => VexRule {
            w: 1,
            reg_only: true,
            ..E2
        },
        (2, 0x7C) => VexRule {
            reg_only: true,
            ..E2
        },
        (2, 0x78) => VexRule { w: 1, ..E2 },
        // VPTESTMB/W, VPTESTNMB/W; VPMINSB/SD, VPMINUW/UD.
        (2, 0x26) => VexRule {
            pp: 2 | 4,
            k_reg: true,
            ..E3
        },
        (2, 0x38..=0x3B) => E3,
        // VPCMPUB/UW, VPCMPB/W; VPTERNLOGD/Q.
        (3, 0x3E | 0x3F) => VexRule {
            imm8: true,
            k_reg: true,
            ..E3
        },
        (3, 0x25) => VexRule { imm8: true, ..E3 },
        _ => return None,
    };
    Some(r)
}

/// An EVEX instruction (64-bit mode, `62` first, no prefix before it), or `None`.
#[cold]
#[inline(never)]
fn decode_evex(b: &[u8]) -> Option<Ild> {
    let (p0, p1, p2) = (*b.get(1)?, *b.get(2)?, *b.get(3)?);
    // P0 bits 2-3 and P1 bit 2 are fixed (0, 0, 1) in every EVEX instruction iced-x86 and
    // this decoder know.
    if p0 & 0x0C != 0 || p1 & 0x04 == 0 {
        return None;
    }
    let rule = evex_rule(p0 & 3, *b.get(4)?)?;
    // An opmask register in ModRM.reg: R̄ and R̄' (inverted) must both be set.
    if rule.k_reg && p0 & 0x90 != 0x90 {
        return None;
    }
    let (w, vvvv, pp) = (p1 >> 7, (p1 >> 3) & 0xF, p1 & 3);
    let (z, ll, bcst, v_hi) = (p2 >> 7, (p2 >> 5) & 3, (p2 >> 4) & 1, (p2 >> 3) & 1);
    if !rule.allows(pp, w, ll)
        || z != 0
        || bcst != 0
        || (rule.no_vvvv && (vvvv != 0xF || v_hi == 0))
    {
        return None;
    }
    rule.operands(b, 5, p0 & 0x20 == 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use iced_x86::{Decoder, DecoderOptions};

    /// `Some` agrees with iced-x86 (length, class, branch target); `None` is always allowed.
    /// Returns whether the cheap decoder answered.
    pub(crate) fn check(bytes: &[u8], bits: u32, ip: u64) -> bool {
        let Some(got) = decode(bytes, bits) else {
            return false;
        };
        let mut d = Decoder::with_ip(bits, bytes, ip, DecoderOptions::NONE);
        let ins = d.decode();
        assert!(
            !ins.is_invalid(),
            "{bits}-bit {:02x?}: iced-x86 says invalid, ild says {got:?}",
            &bytes[..bytes.len().min(15)]
        );
        let class = InsnClass::of(&ins);
        assert_eq!(
            (got.len as usize, got.class),
            (ins.len(), class),
            "{bits}-bit {:02x?} ({ins}, {:?})",
            &bytes[..ins.len()],
            ins.code()
        );
        if matches!(
            class,
            InsnClass::CondBranch | InsnClass::DirectJump | InsnClass::DirectCall
        ) {
            assert_eq!(
                got.target(ip, bits),
                ins.near_branch_target(),
                "{bits}-bit {:02x?}",
                &bytes[..ins.len()]
            );
        }
        true
    }

    #[test]
    fn common_encodings() {
        let cases: &[(&[u8], u8, InsnClass)] = &[
            (&[0x48, 0x89, 0xe5], 3, InsnClass::Other), // mov rbp, rsp
            (&[0xf3, 0x0f, 0x1e, 0xfa], 4, InsnClass::Other), // endbr64
            (&[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00], 6, InsnClass::Other), // nop word
            (&[0xe8, 0, 0, 0, 0], 5, InsnClass::DirectCall),
            (&[0xff, 0x15, 0, 0, 0, 0], 6, InsnClass::IndirectCall), // call [rip]
            (&[0xff, 0xe0], 2, InsnClass::IndirectJump),             // jmp rax
            (&[0xc3], 1, InsnClass::Return),
            (&[0xf3, 0xc3], 2, InsnClass::Return), // rep ret
            (&[0x0f, 0x84, 1, 0, 0, 0], 6, InsnClass::CondBranch),
            (&[0x48, 0xb8, 1, 2, 3, 4, 5, 6, 7, 8], 10, InsnClass::Other), // mov rax, imm64
            (&[0x0f, 0x05], 2, InsnClass::SysCall),
            (&[0x66, 0x0f, 0xef, 0xc0], 4, InsnClass::Other), // pxor
            (&[0xf0, 0x48, 0x0f, 0xb1, 0x0a], 5, InsnClass::Other), // lock cmpxchg [rdx], rcx
            (&[0x0f, 0xa2], 2, InsnClass::Other),             // cpuid
            (&[0x66, 0x0f, 0xd7, 0xc1], 4, InsnClass::Other), // pmovmskb eax, xmm1
            (&[0xc5, 0xf8, 0x77], 3, InsnClass::Other),       // vzeroupper
        ];
        for &(bytes, len, class) in cases {
            let got = decode(bytes, 64).unwrap_or_else(|| panic!("{bytes:02x?} deferred"));
            assert_eq!((got.len, got.class), (len, class), "{bytes:02x?}");
            assert!(check(bytes, 64, 0x40_1000));
        }
        // Deferred: EVEX with a 512-bit FP opcode, LOCK on a register, an undocumented x87
        // alias (FSTP1), a branch with an operand-size prefix, a truncated one.
        for bytes in [
            &[0x62, 0xf1, 0x7c, 0x48, 0x58, 0xc0][..],
            &[0xf0, 0x48, 0x0f, 0xb1, 0xca],
            &[0xd9, 0xd8],
            &[0x66, 0xe9, 0, 0],
            &[0xe8, 0, 0],
        ] {
            assert_eq!(decode(bytes, 64), None, "{bytes:02x?}");
        }
    }

    /// Random byte strings (with the first bytes drawn from prefixes and the opcodes the
    /// decoder takes, so that its paths are all visited): `Some` always agrees with iced-x86.
    #[test]
    fn random_bytes_agree_with_iced() {
        let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
        let mut next = move || rng.next_u64();
        let lead = [
            0x66u8, 0x67, 0xf2, 0xf3, 0x2e, 0x3e, 0x64, 0x48, 0x41, 0x4c, 0x0f, 0x0f, 0x0f,
        ];
        let mut answered = 0;
        for round in 0..400_000u32 {
            let mut bytes = [0u8; 16];
            for c in bytes.chunks_mut(8) {
                c.copy_from_slice(&next().to_le_bytes()[..c.len()]);
            }
            let k = (next() % 4) as usize;
            for slot in bytes.iter_mut().take(k) {
                *slot = lead[(next() % lead.len() as u64) as usize];
            }
            let bits = if round % 3 == 0 { 32 } else { 64 };
            let cut = 1 + (next() % 16) as usize;
            if check(&bytes[..cut], bits, next() >> 16) {
                answered += 1;
            }
            // All 16 bytes: the prefix-free 64-bit path takes these.
            if check(&bytes, bits, next() >> 16) {
                answered += 1;
            }
        }
        assert!(answered > 200_000, "only {answered} answered");
    }

    /// Every ModRM byte, followed by a SIB with base 5 (a disp32 under mod 0) or 0, and
    /// filler bytes (displacement, immediate).
    fn with_modrm(head: &[u8], mut f: impl FnMut(&[u8])) {
        for m in 0..=255u8 {
            for sib in [0x25u8, 0x00] {
                let mut v = head.to_vec();
                v.extend_from_slice(&[m, sib, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88]);
                v.extend_from_slice(&[0x99; 8]);
                f(&v);
            }
        }
    }

    /// The two-byte map, exhaustively: every opcode and ModRM under each mandatory prefix,
    /// LOCK, REX.W and the three-byte maps' first opcodes.
    #[test]
    fn every_two_byte_opcode_agrees_with_iced() {
        let mut answered = 0u32;
        for pre in [
            &[][..],
            &[0x66],
            &[0xF2],
            &[0xF3],
            &[0xF0],
            &[0x66, 0xF0],
            &[0x48],
            &[0x66, 0x48],
        ] {
            for op2 in 0..=255u8 {
                let mut head = pre.to_vec();
                head.extend_from_slice(&[0x0F, op2]);
                with_modrm(&head, |v| {
                    for bits in [64, 32] {
                        if bits == 32 && pre.contains(&0x48) {
                            continue;
                        }
                        answered += u32::from(check(v, bits, 0x40_1000));
                    }
                });
            }
            for (map, op3) in [
                (0x38u8, 0x00u8),
                (0x38, 0xF0),
                (0x38, 0xF1),
                (0x3A, 0x0F),
                (0x3A, 0x63),
            ] {
                let mut head = pre.to_vec();
                head.extend_from_slice(&[0x0F, map, op3]);
                with_modrm(&head, |v| answered += u32::from(check(v, 64, 0x40_1000)));
            }
        }
        assert!(answered > 300_000, "only {answered} answered");
    }

    /// LOCK before every one-byte opcode and ModRM; the memory-offset `mov`s.
    #[test]
    fn locked_one_byte_opcodes_and_moffs_agree_with_iced() {
        let mut answered = 0u32;
        for pre in [&[0xF0u8][..], &[0xF0, 0x48], &[0x66, 0xF0], &[0xF2, 0xF0]] {
            for op in 0..=255u8 {
                let mut head = pre.to_vec();
                head.push(op);
                with_modrm(&head, |v| answered += u32::from(check(v, 64, 0x40_1000)));
            }
        }
        assert!(answered > 10_000, "only {answered} answered");
        for pre in [&[][..], &[0x67], &[0x48], &[0x66]] {
            for op in 0xA0..=0xA3u8 {
                let mut v = pre.to_vec();
                v.push(op);
                v.extend_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8, 9]);
                assert!(check(&v, 64, 0x40_1000), "{v:02x?}");
                if !pre.contains(&0x48) && !pre.contains(&0x67) {
                    assert!(check(&v, 32, 0x40_1000), "{v:02x?}");
                }
            }
        }
    }

    /// Runs `answered` (how many encodings the cheap decoder took) for every (map, opcode) that
    /// `rule` has a rule for, and demands that each was taken somewhere.
    fn each_opcode_taken(
        rule: fn(u8, u8) -> Option<VexRule>,
        mut answered: impl FnMut(u8, u8) -> u32,
    ) {
        for map in 1..=3u8 {
            for op in 0..=255u8 {
                if rule(map, op).is_some() {
                    assert!(
                        answered(map, op) > 0,
                        "map {map} opcode {op:#04x} never answered"
                    );
                }
            }
        }
    }

    /// Every VEX opcode the cheap decoder takes, over every second (C5) or third (C4) VEX
    /// byte, three of the C4 register-extension bits and every ModRM: wherever it answers,
    /// iced-x86 agrees; and it answers for each opcode somewhere.
    #[test]
    fn every_vex_rule_agrees_with_iced() {
        each_opcode_taken(vex_rule, |map, op| {
            let mut answered = 0u32;
            for p in 0..=255u8 {
                if map == 1 {
                    with_modrm(&[0xC5, p, op], |v| answered += u32::from(check(v, 64, 0)));
                }
                for rxb in [0xE0u8, 0x00, 0xA0] {
                    with_modrm(&[0xC4, rxb | map, p, op], |v| {
                        answered += u32::from(check(v, 64, 0))
                    });
                }
            }
            answered
        });
        // Invalid maps, a prefix before VEX, 32-bit mode (LES/LDS there): not taken.
        for b in [
            &[0xC4u8, 0xE0, 0x7D, 0x6F, 0xC0][..],
            &[0xC4, 0xE4, 0x7D, 0x6F, 0xC0],
            &[0x66, 0xC5, 0xFD, 0x6F, 0xC0],
        ] {
            assert_eq!(decode(b, 64), None, "{b:02x?}");
        }
        assert_eq!(decode(&[0xC5, 0xFD, 0x6F, 0xC0], 32), None);
        // glibc's AVX2 strlen: vpcmpeqb ymm1, ymm0, [rdi]; vpmovmskb eax, ymm1; vzeroupper.
        for (b, len) in [
            (&[0xC5u8, 0xFD, 0x74, 0x0F][..], 4),
            (&[0xC5, 0xFD, 0xD7, 0xC1], 4),
            (&[0xC5, 0xF8, 0x77], 3),
            (&[0xC4, 0xE2, 0x7D, 0x78, 0xC0], 5),
        ] {
            assert_eq!(decode(b, 64).map(|d| d.len), Some(len), "{b:02x?}");
        }
    }

    /// Every EVEX opcode the cheap decoder takes, over every P1 and P2 byte, four of the P0
    /// register-extension bit patterns and register, memory and SIB forms of ModRM.
    #[test]
    fn every_evex_rule_agrees_with_iced() {
        each_opcode_taken(evex_rule, |map, op| {
            let mut answered = 0u32;
            for p0 in [0xF0u8, 0x00, 0x60, 0x90] {
                for p1 in 0..=255u8 {
                    for p2 in 0..=255u8 {
                        for m in [0xC1u8, 0xD8, 0x06, 0x44, 0x85, 0x0C] {
                            let v = [
                                0x62,
                                p0 | map,
                                p1,
                                p2,
                                op,
                                m,
                                0x24,
                                1,
                                2,
                                3,
                                4,
                                5,
                                6,
                                7,
                                8,
                                9,
                            ];
                            answered += u32::from(check(&v, 64, 0));
                        }
                    }
                }
            }
            answered
        });
        // glibc's strlen-evex: vpcmpb k0, ymm16, [rdi], 0; vmovdqu64 ymm16, [rsi].
        for (b, len) in [
            (&[0x62u8, 0xF3, 0x7D, 0x20, 0x3F, 0x07, 0x00][..], 7),
            (&[0x62, 0xE1, 0xFE, 0x28, 0x6F, 0x06], 6),
        ] {
            assert_eq!(decode(b, 64).map(|d| d.len), Some(len), "{b:02x?}");
        }
    }

    /// Every x87 opcode and ModRM, with and without prefixes, in both modes.
    #[test]
    fn every_x87_encoding_agrees_with_iced() {
        let mut answered = 0u32;
        for pre in [&[][..], &[0x66], &[0x9B], &[0x48], &[0x67]] {
            for op in 0xD8..=0xDFu8 {
                let mut head = pre.to_vec();
                head.push(op);
                with_modrm(&head, |v| {
                    for bits in [64, 32] {
                        if bits == 32 && pre.contains(&0x48) {
                            continue;
                        }
                        answered += u32::from(check(v, bits, 0x40_1000));
                    }
                });
            }
        }
        assert!(answered > 10_000, "only {answered} answered");
        for (b, class) in [
            (&[0x0Fu8, 0x34][..], InsnClass::SysCall),
            (&[0x0F, 0x01, 0xC1], InsnClass::Special),
        ] {
            assert_eq!(decode(b, 32).map(|d| d.class), Some(class), "{b:02x?}");
            assert!(check(b, 32, 0x1000) && check(b, 64, 0x1000));
        }
    }
}
