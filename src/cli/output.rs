//! The output buffer of `ptrewind decode`: large writes and hand-rolled hex/decimal formatting.
//!
//! The flow decoder hands out several hundred million instructions per second; formatting each
//! address through `write!("{:#x}")` (the `fmt` machinery, a `BufWriter` call per line) costs
//! more than decoding it. [`Out`] keeps a 256 KiB buffer (fits L2) with slack at its end, so a
//! line is formatted with unconditional fixed-size stores and one "buffer full?" test, and the
//! buffer goes to the writer in one `write_all` when it fills.

use std::io::{self, Write};

/// Bytes buffered before a write to the underlying writer, at first: the default pipe
/// capacity. A 256 KiB buffer from the start cost 48 more page faults per process (about
/// 0.06 ms, 3 % of a 150 k-instruction trace's `decode`).
const FIRST_CHUNK: usize = 64 << 10;
/// Bytes buffered once [`GROW_AFTER`] chunks (16 MiB) were written: a long output (144 MB for
/// libxdc/qemu) then makes a quarter of the write calls (docs/benchmarks.md, session 18).
const CHUNK: usize = 256 << 10;
/// Chunks written before the buffer grows to [`CHUNK`]. After 4 MiB (64 chunks) the growth's
/// 48 page faults cost outputs of a few MiB (a 0.5 M-instruction trace) more than the write
/// calls it saved: 5 % of arcus/cve-2004-0597-poc's `decode` (docs/benchmarks.md, session 23).
const GROW_AFTER: u32 = 256;
/// Room after `CHUNK` for one bounded item (an address line needs 19 bytes, a 16-byte store at
/// offset 2; a blocks line 62).
const SLACK: usize = 128;

/// Room [`Out::ip_lines`] needs per line: at most "0x" + 16 digits + "\n", and the last
/// 8-byte store may reach 8 bytes past the digits' end.
const IP_LINE_MAX: usize = 27;
/// Runs longer than this are formatted every time (long runs are rare, and their text would
/// crowd the arena); at most 64 × 27 bytes, well within a chunk.
const RUN_TEXT_MAX_INSNS: usize = 64;
/// Slots of [`RunText`]'s table at most (direct mapped; a power of two).
const RUN_TEXT_SLOTS: usize = 1 << 14;
/// Slots of [`RunText`]'s table at first: it grows as runs are kept. A short trace has a few
/// thousand distinct runs, and each page of a table that is probed before it is written costs
/// two page faults (≈ 1.3 µs each on the development VM).
const RUN_TEXT_SLOTS_FIRST: usize = 1 << 10;
/// Bytes [`Out::ip_lines_cached`] copies at a time: one copy takes a run of up to six lines of
/// user-space addresses (15 bytes each), and runs average five to six instructions.
const RUN_COPY: usize = 96;
/// Bytes of text [`RunText`] keeps before it starts over.
const RUN_TEXT_BYTES: usize = 4 << 20;
const _: () = assert!(RUN_TEXT_BYTES < 1 << 24 && RUN_TEXT_MAX_INSNS * IP_LINE_MAX < 1 << 24);

/// The text of runs [`Out::ip_lines_cached`] printed before: a direct-mapped table from
/// (start, count, mode) to a piece of a text arena. Bounded: when the arena is full, the table
/// and the arena start over.
pub(crate) struct RunText {
    /// Per slot: the run's start, then its tag (count, and mode + 1 above it; 0 = empty) in
    /// bits 0..16, the text's offset in bits 16..40 and its length in bits 40..64. Plain
    /// integers, so the table is a zeroed allocation whose pages are touched only as used.
    slots: Box<[[u64; 2]]>,
    /// 64 − log2 of the number of slots (the hash's top bits index the table).
    shift: u32,
    /// Runs kept since the table last grew (new ones, and ones that took another's slot).
    kept: usize,
    /// The texts, back to back, with [`RUN_COPY`] bytes of slack after `RUN_TEXT_BYTES`.
    text: Box<[u8]>,
    used: usize,
}

impl RunText {
    /// An empty cache.
    pub(crate) fn new() -> Self {
        RunText {
            slots: vec![[0u64; 2]; RUN_TEXT_SLOTS_FIRST].into_boxed_slice(),
            shift: 64 - RUN_TEXT_SLOTS_FIRST.trailing_zeros(),
            kept: 0,
            text: vec![0u8; RUN_TEXT_BYTES + RUN_COPY].into_boxed_slice(),
            used: 0,
        }
    }

    #[inline(always)]
    fn slot_of(&self, start: u64, tag: u64) -> usize {
        let h = (start ^ tag << 48).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        (h >> self.shift) as usize
    }

    /// Keeps `meta` for `start` in slot `at`. The table grows after as many misses as half its
    /// slots, whether they filled empty slots or evicted runs: a working set that collides in
    /// a small table misses as much as one that does not fit.
    #[inline]
    fn keep(&mut self, at: usize, start: u64, meta: u64) {
        self.slots[at] = [start, meta];
        self.kept += 1;
        if self.kept * 2 > self.slots.len() && self.slots.len() < RUN_TEXT_SLOTS {
            self.grow();
        }
    }

    /// Four times the slots, keeping the runs (two that meet in one slot: the later stays).
    #[cold]
    fn grow(&mut self) {
        let old = std::mem::take(&mut self.slots);
        self.slots = vec![[0u64; 2]; old.len() * 4].into_boxed_slice();
        self.shift -= 2;
        self.kept = 0;
        for [start, meta] in old.into_iter().filter(|s| s[1] != 0) {
            let at = self.slot_of(start, meta & 0xFFFF);
            self.slots[at] = [start, meta];
        }
    }

    #[cold]
    fn clear(&mut self) {
        self.slots.fill([0; 2]);
        self.kept = 0;
        self.used = 0;
    }
}

/// A buffered writer with fast formatting of addresses and numbers.
pub(crate) struct Out<W: Write> {
    buf: Box<[u8]>,
    pos: usize,
    /// Bytes buffered before a write: `buf.len() - SLACK`.
    chunk: usize,
    /// Chunks written so far (up to [`GROW_AFTER`]).
    drains: u32,
    inner: W,
    /// [`Out::ip_lines`]' digits of the last address, kept from one run to the next (runs are
    /// short, and the next one often starts in the same 256 bytes of code).
    ips: IpDigits,
}

/// The digits of the last address `ip_lines` printed (see there).
#[derive(Clone, Copy)]
struct IpDigits {
    /// The address bits above the low byte the digits were made for (`u64::MAX`: none).
    key: u64,
    hi_digits: u64,
    hi_n: usize,
    lo_digits: u64,
    lo_n: usize,
}

/// 8 hex digits of `v`, most significant first in memory order (a little-endian u64 of ASCII).
#[inline(always)]
fn hex8(v: u32) -> u64 {
    // Spread the nibbles into bytes (byte i = nibble i), then reverse so the most significant
    // digit comes first, then map 0..=15 to ASCII without a table: '0' + n, plus 0x27 for a-f
    // (n + 6 carries into bit 4 exactly when n >= 10).
    let mut x = v as u64;
    x = (x | (x << 16)) & 0x0000_FFFF_0000_FFFF;
    x = (x | (x << 8)) & 0x00FF_00FF_00FF_00FF;
    x = (x | (x << 4)) & 0x0F0F_0F0F_0F0F_0F0F;
    let x = x.swap_bytes();
    let letters = ((x + 0x0606_0606_0606_0606) >> 4) & 0x0101_0101_0101_0101;
    x + 0x3030_3030_3030_3030 + letters * 0x27
}

/// The two hex digits of a byte as the bytes of a little-endian u16 (high digit first).
const fn hex2_table() -> [u16; 256] {
    let digits = b"0123456789abcdef";
    let mut t = [0u16; 256];
    let mut b = 0;
    while b < 256 {
        t[b] = digits[b >> 4] as u16 | (digits[b & 15] as u16) << 8;
        b += 1;
    }
    t
}

static HEX2: [u16; 256] = hex2_table();

/// The 16 hex digits of `v` (zero-padded), as the bytes of a little-endian u128.
#[inline(always)]
fn hex16(v: u64) -> u128 {
    ((hex8(v as u32) as u128) << 64) | hex8((v >> 32) as u32) as u128
}

/// Number of hex digits of `v` without leading zeros (1 for 0).
#[inline(always)]
fn hex_digits(v: u64) -> usize {
    (64 - (v | 1).leading_zeros() as usize).div_ceil(4)
}

impl<W: Write> Out<W> {
    /// A buffer over `inner`.
    pub(crate) fn new(inner: W) -> Self {
        Out {
            buf: vec![0u8; FIRST_CHUNK + SLACK].into_boxed_slice(),
            pos: 0,
            chunk: FIRST_CHUNK,
            drains: 0,
            inner,
            ips: IpDigits {
                key: u64::MAX,
                hi_digits: 0,
                hi_n: 0,
                lo_digits: 0,
                lo_n: 0,
            },
        }
    }

    /// Writes the buffered bytes to the writer.
    #[cold]
    fn drain(&mut self) -> io::Result<()> {
        let r = self.inner.write_all(&self.buf[..self.pos]);
        self.pos = 0;
        if self.drains < GROW_AFTER {
            self.drains += 1;
            if self.drains == GROW_AFTER {
                self.buf = vec![0u8; CHUNK + SLACK].into_boxed_slice();
                self.chunk = CHUNK;
            }
        }
        r
    }

    /// Makes room for one bounded item (at most `SLACK` bytes).
    #[inline(always)]
    fn room(&mut self) -> io::Result<()> {
        if self.pos >= self.chunk {
            self.drain()?;
        }
        Ok(())
    }

    /// `0x<hex>` without leading zeros, as `{:#x}` prints it. Needs `room()`.
    #[inline(always)]
    fn put_hex(&mut self, v: u64) {
        let n = hex_digits(v);
        let p = self.pos;
        self.buf[p..p + 2].copy_from_slice(b"0x");
        // Fixed 8-byte stores of the digits shifted to drop the leading zeros; the bytes past
        // the number land in the slack and are overwritten by what follows.
        if n <= 8 {
            let digits = hex8(v as u32) >> (8 * (8 - n));
            self.buf[p + 2..p + 10].copy_from_slice(&digits.to_le_bytes());
        } else {
            let hi = hex8((v >> 32) as u32) >> (8 * (16 - n));
            self.buf[p + 2..p + 10].copy_from_slice(&hi.to_le_bytes());
            let q = p + 2 + (n - 8);
            self.buf[q..q + 8].copy_from_slice(&hex8(v as u32).to_le_bytes());
        }
        self.pos = p + 2 + n;
    }

    /// `0x` and all 16 hex digits, as `{:#018x}` prints a u64. Needs `room()`.
    #[inline(always)]
    fn put_hex_padded(&mut self, v: u64) {
        let p = self.pos;
        self.buf[p..p + 2].copy_from_slice(b"0x");
        self.buf[p + 2..p + 18].copy_from_slice(&hex16(v).to_le_bytes());
        self.pos = p + 18;
    }

    /// Decimal, as `{}` prints a u64. Needs `room()`.
    #[inline(always)]
    fn put_dec(&mut self, mut v: u64) {
        let mut tmp = [0u8; 20];
        let mut i = tmp.len();
        loop {
            i -= 1;
            tmp[i] = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
        let n = tmp.len() - i;
        self.buf[self.pos..self.pos + n].copy_from_slice(&tmp[i..]);
        self.pos += n;
    }

    /// A short piece of text (at most `SLACK - 20` bytes). Needs `room()`.
    #[inline(always)]
    fn put_short(&mut self, s: &[u8]) {
        self.buf[self.pos..self.pos + s.len()].copy_from_slice(s);
        self.pos += s.len();
    }

    /// The `0x<ip>\n` lines of a run of instructions starting at `start` with these lengths.
    ///
    /// Consecutive addresses of a run differ by an instruction length, so the digits are
    /// updated rather than recomputed: while the address stays within one 256-byte line of
    /// code, only its last two digits change (one table load); the full conversion runs when
    /// the bits above the low byte change (about one line in 30). Above 4 GiB the upper half's
    /// digits are kept the same way. The lines are written in groups that fit the buffer, with
    /// the position in a local so that it stays in a register.
    #[inline]
    pub(crate) fn ip_lines(&mut self, start: u64, lens: &[u8]) -> io::Result<()> {
        let mut ip = start;
        // Addresses below 0x100 always take the full path, as their digit count depends on the
        // low byte (their key is u64::MAX).
        let IpDigits {
            mut key,
            mut hi_digits,
            mut hi_n,
            mut lo_digits,
            mut lo_n,
        } = self.ips;
        let mut rest = lens;
        while !rest.is_empty() {
            self.room()?;
            let fit = ((self.buf.len() - self.pos) / IP_LINE_MAX).min(rest.len());
            let (group, tail) = rest.split_at(fit);
            rest = tail;
            let buf = &mut self.buf[..];
            let mut p = self.pos;
            for &len in group {
                if ip >> 8 == key {
                    lo_digits = (lo_digits & 0x0000_FFFF_FFFF_FFFF)
                        | (HEX2[(ip & 0xFF) as usize] as u64) << 48;
                } else {
                    key = if ip < 0x100 { u64::MAX } else { ip >> 8 };
                    let hi = ip >> 32;
                    hi_n = if hi == 0 { 0 } else { hex_digits(hi) };
                    hi_digits = hex8(hi as u32) >> (8 * (8 - hi_n.max(1)));
                    lo_digits = hex8(ip as u32);
                    lo_n = if hi == 0 { hex_digits(ip) } else { 8 };
                }
                buf[p..p + 2].copy_from_slice(b"0x");
                buf[p + 2..p + 10].copy_from_slice(&hi_digits.to_le_bytes());
                let q = p + 2 + hi_n;
                buf[q..q + 8].copy_from_slice(&(lo_digits >> (8 * (8 - lo_n))).to_le_bytes());
                p = q + lo_n;
                buf[p] = b'\n';
                p += 1;
                ip = ip.wrapping_add(len as u64);
            }
            self.pos = p;
        }
        self.ips = IpDigits {
            key,
            hi_digits,
            hi_n,
            lo_digits,
            lo_n,
        };
        Ok(())
    }

    /// The `0x<ip>\n` lines of a run, as [`Out::ip_lines`] writes them, copied from `cache`
    /// when the same run (start, instruction count, mode) was printed before.
    ///
    /// The flow decoder hands out the same few thousand cached blocks over and over (avscript_32:
    /// 316 k runs of 3.5 instructions on average), so formatting each line again costs more than
    /// copying the run's text: one table probe and usually one fixed-size copy instead of a
    /// conversion, a mispredicted "same 256 bytes?" test and a data-dependent loop per run. The
    /// key needs no lengths: within one image a run's lengths follow from its start, its count
    /// and the mode (the caller must not use one cache across images that differ at the same
    /// address).
    #[inline]
    pub(crate) fn ip_lines_cached(
        &mut self,
        cache: &mut RunText,
        start: u64,
        lens: &[u8],
        mode: u8,
    ) -> io::Result<()> {
        let n = lens.len();
        if n == 0 || n > RUN_TEXT_MAX_INSNS {
            return self.ip_lines(start, lens);
        }
        let tag = n as u64 | (mode as u64 + 1) << 8;
        let at = cache.slot_of(start, tag);
        let [key, meta] = cache.slots[at];
        if key == start && meta & 0xFFFF == tag {
            let (off, len) = ((meta >> 16) as usize & 0xFF_FFFF, (meta >> 40) as usize);
            if self.pos + len + RUN_COPY > self.buf.len() {
                self.drain()?;
            }
            // Whole `RUN_COPY`-byte copies: the bytes past the text land in the buffer's slack
            // (the test above) and are overwritten by what follows; the arena has as much slack
            // after its last text. Most runs take one copy of a fixed size, so no loop whose
            // trip count changes from one run to the next (a mispredicted exit per run).
            let p = self.pos;
            let mut i = 0;
            loop {
                self.buf[p + i..p + i + RUN_COPY]
                    .copy_from_slice(&cache.text[off + i..off + i + RUN_COPY]);
                i += RUN_COPY;
                if i >= len {
                    break;
                }
            }
            self.pos = p + len;
            return Ok(());
        }
        // Miss: format the run in one piece (room for its longest text first), then keep it.
        if self.pos >= self.chunk || self.pos + n * IP_LINE_MAX > self.buf.len() {
            self.drain()?;
        }
        let from = self.pos;
        self.ip_lines(start, lens)?;
        let text = &self.buf[from..self.pos];
        if cache.used + text.len() > RUN_TEXT_BYTES {
            cache.clear();
        }
        let off = cache.used;
        cache.text[off..off + text.len()].copy_from_slice(text);
        cache.used += text.len();
        cache.keep(
            at,
            start,
            tag | (off as u64) << 16 | (text.len() as u64) << 40,
        );
        Ok(())
    }

    /// The addresses of a run of instructions as little-endian u64s (the `ips-bin` format),
    /// in groups that fit the buffer as in [`Out::ip_lines`].
    #[inline]
    pub(crate) fn ip_bins(&mut self, start: u64, lens: &[u8]) -> io::Result<()> {
        let mut ip = start;
        let mut rest = lens;
        while !rest.is_empty() {
            self.room()?;
            let fit = ((self.buf.len() - self.pos) / 8).min(rest.len());
            let (group, tail) = rest.split_at(fit);
            rest = tail;
            let out = &mut self.buf[self.pos..self.pos + 8 * fit];
            for (slot, &len) in out.chunks_exact_mut(8).zip(group) {
                slot.copy_from_slice(&ip.to_le_bytes());
                ip = ip.wrapping_add(len as u64);
            }
            self.pos += 8 * fit;
        }
        Ok(())
    }

    /// One `0xSTART..0xEND COUNT CLASS\n` line (the `blocks` format).
    pub(crate) fn block_line(
        &mut self,
        start: u64,
        end: u64,
        count: u32,
        class: &str,
    ) -> io::Result<()> {
        self.room()?;
        self.put_hex(start);
        self.put_short(b"..");
        self.put_hex(end);
        self.put_short(b" ");
        self.put_dec(count as u64);
        self.put_short(b" ");
        self.bytes(class.as_bytes())?;
        self.bytes(b"\n")
    }

    /// One `{"class":…,"ip":"0x…","len":…,"time":…}\n` line (the `json` format, keys in the
    /// order `serde_json` prints an object).
    pub(crate) fn json_insn(&mut self, ip: u64, len: u8, class: &str, time: u64) -> io::Result<()> {
        self.room()?;
        self.put_short(b"{\"class\":\"");
        self.bytes(class.as_bytes())?;
        self.room()?;
        self.put_short(b"\",\"ip\":\"");
        self.put_hex(ip);
        self.put_short(b"\",\"len\":");
        self.put_dec(len as u64);
        self.put_short(b",\"time\":");
        self.put_dec(time);
        self.put_short(b"}\n");
        Ok(())
    }

    /// `{:#018x}` of `ip` followed by `rest` (the `insn` format: the rest of the line is cached
    /// per instruction by the caller).
    pub(crate) fn padded_ip_and(&mut self, ip: u64, rest: &[u8]) -> io::Result<()> {
        self.room()?;
        self.put_hex_padded(ip);
        self.bytes(rest)
    }

    /// Any bytes.
    #[inline]
    pub(crate) fn bytes(&mut self, b: &[u8]) -> io::Result<()> {
        if self.pos + b.len() > self.chunk + SLACK - 32 {
            self.drain()?;
            if b.len() > self.chunk {
                return self.inner.write_all(b);
            }
        }
        self.buf[self.pos..self.pos + b.len()].copy_from_slice(b);
        self.pos += b.len();
        Ok(())
    }
}

impl<W: Write> Write for Out<W> {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.bytes(b)?;
        Ok(b.len())
    }

    fn write_all(&mut self, b: &[u8]) -> io::Result<()> {
        self.bytes(b)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.drain()?;
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_bytes(f: impl FnOnce(&mut Out<&mut Vec<u8>>)) -> Vec<u8> {
        let mut v = Vec::new();
        let mut o = Out::new(&mut v);
        f(&mut o);
        o.flush().unwrap();
        drop(o);
        v
    }

    fn run(f: impl FnOnce(&mut Out<&mut Vec<u8>>)) -> String {
        String::from_utf8(run_bytes(f)).unwrap()
    }

    #[test]
    fn hex_matches_fmt() {
        let mut vals = vec![
            0u64,
            1,
            9,
            10,
            15,
            16,
            0xff,
            0x100,
            u64::MAX,
            0x7fff_f7dd_9c20,
        ];
        let mut rng = crate::test_rng::XorShift::new(0x9e37_79b9_7f4a_7c15);
        for _ in 0..10_000 {
            let x = rng.next_u64();
            vals.push(x >> (x % 64));
        }
        let got = run_bytes(|o| {
            for &v in &vals {
                o.ip_bins(v, &[1]).unwrap();
                o.ip_lines(v, &[1]).unwrap();
                o.padded_ip_and(v, b" ").unwrap();
                o.room().unwrap();
                o.put_dec(v);
                o.bytes(b"\n").unwrap();
            }
        });
        let want: Vec<u8> = vals
            .iter()
            .flat_map(|v| {
                let mut line = v.to_le_bytes().to_vec();
                line.extend_from_slice(format!("{v:#x}\n{v:#018x} {v}\n").as_bytes());
                line
            })
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn ip_lines_match_fmt() {
        let lens: Vec<u8> = (0..5000u32).map(|k| (k % 15 + 1) as u8).collect();
        for start in [
            0u64,
            0x40_0000,
            0xffff_ff00,
            0x7fff_ffff_f000,
            u64::MAX - 300,
        ] {
            let got = run(|o| o.ip_lines(start, &lens).unwrap());
            let mut want = String::new();
            let mut ip = start;
            for &l in &lens {
                want.push_str(&format!("{ip:#x}\n"));
                ip = ip.wrapping_add(l as u64);
            }
            assert_eq!(got, want, "{start:#x}");
        }
        // Short runs one after the other, within and across 256-byte lines and 4 GiB.
        let starts: Vec<u64> = (0..3000u64)
            .map(|k| {
                [0x40_1000, 0x1_0000_0000, 0x7f00_0000_00f0, 0xfe][k as usize % 4] + k * 7 % 700
            })
            .collect();
        let got = run(|o| {
            for &st in &starts {
                o.ip_lines(st, &[3, 5]).unwrap();
            }
        });
        let want: String = starts
            .iter()
            .map(|&st| format!("{:#x}\n{:#x}\n", st, st + 3))
            .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn cached_runs_match_formatted_ones() {
        // Runs that repeat, runs with the same start but other counts or modes, runs over the
        // 4 GiB line, runs of several copies and runs too long to cache, enough of them to
        // cross chunks and to fill the arena (so that it starts over) and colliding in the
        // table.
        let mut runs: Vec<(u64, Vec<u8>, u8)> = Vec::new();
        let mut rng = crate::test_rng::XorShift::new(0x2545_f491_4f6c_dd1d);
        for k in 0..400_000u64 {
            let x = rng.next_u64();
            let start = match k % 5 {
                0 => 0x40_1000 + (x % 64) * 16,
                1 => 0x7fff_f7dd_0000 + (x % 50_000) * 13,
                2 => 0xffff_fff0 + x % 32,
                3 => x % 0x200,
                _ => 0x5655_d000 + (x % 4096) * 5,
            };
            let n = if k % 997 == 0 {
                80
            } else if k % 89 == 0 {
                // Cached, and longer than one copy (`RUN_COPY`).
                7 + (x >> 30) as usize % 58
            } else {
                (x >> 20) as usize % 6 + 1
            };
            // Lengths follow from (start, count, mode), as they do in a decoded image.
            let mode = (x >> 40) as u8 % 2;
            let lens: Vec<u8> = (0..n as u64)
                .map(|i| ((start + i * 3 + mode as u64) % 15 + 1) as u8)
                .collect();
            runs.push((start, lens, mode));
        }
        let mut cache = RunText::new();
        let got = run_bytes(|o| {
            for (start, lens, mode) in &runs {
                o.ip_lines_cached(&mut cache, *start, lens, *mode).unwrap();
            }
        });
        let want = run_bytes(|o| {
            for (start, lens, _) in &runs {
                o.ip_lines(*start, lens).unwrap();
            }
        });
        assert!(got.len() > 2 * RUN_TEXT_BYTES);
        // The table grew from its first size to its last, keeping what it held.
        assert_eq!(cache.slots.len(), RUN_TEXT_SLOTS);
        assert!(got == want);
    }

    #[test]
    fn lines_across_many_chunks() {
        // Past the growth to `CHUNK` (at least 70 bytes a pair of lines), and then several
        // chunks more.
        let n = ((GROW_AFTER as usize + 2) * FIRST_CHUNK / 70 + 3 * CHUNK / 10 + 17) as u64;
        let got = run(|o| {
            for k in 0..n {
                o.block_line(k, k * 3, k as u32, "cond").unwrap();
                o.json_insn(k << 20, 7, "other", k).unwrap();
            }
            o.bytes(&vec![b'x'; CHUNK + 5]).unwrap();
            assert_eq!(o.chunk, CHUNK);
        });
        let mut want = String::new();
        for k in 0..n {
            want.push_str(&format!("{:#x}..{:#x} {} cond\n", k, k * 3, k));
            want.push_str(&format!(
                "{}\n",
                serde_json::json!({"ip": format!("{:#x}", k << 20), "len": 7u8, "class": "other", "time": k})
            ));
        }
        want.push_str(&"x".repeat(CHUNK + 5));
        assert_eq!(got, want);
    }
}
