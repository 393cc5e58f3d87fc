//! The stub's register layout, learned from its target description (`target.xml` and the
//! files it `xi:include`s) instead of assumed, and register values read with it.

use super::RemoteError;
use super::wire::lossy;

/// One register of the target description.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegInfo {
    /// `name` attribute (`rax`, `rip`, `eflags`, `fs_base`, `xmm0`…).
    pub name: String,
    /// Size in bits.
    pub bitsize: u32,
    /// The protocol's register number (`p`/`P`, expedited stop-reply registers).
    pub regnum: u32,
    /// `type` attribute (`int64`, `code_ptr`, `i387_ext`, `vec128`…), empty if absent.
    pub ty: String,
    /// The feature it belongs to (`org.gnu.gdb.i386.core`…).
    pub feature: String,
}

impl RegInfo {
    /// Size in bytes (rounded up).
    pub fn size(&self) -> usize {
        self.bitsize.div_ceil(8) as usize
    }
}

/// Every register the stub describes, by register number.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RegLayout {
    /// The `<architecture>` element (`i386:x86-64`), if any.
    pub architecture: Option<String>,
    /// Registers sorted by `regnum`.
    pub regs: Vec<RegInfo>,
}

/// Limits on what a description may make the client fetch.
const MAX_INCLUDES: usize = 32;
const MAX_REGS: usize = 4096;

impl RegLayout {
    /// Builds the layout from `target.xml`, fetching each `xi:include` with `fetch(annex)`
    /// in document order (GDB's numbering rule: a register without `regnum` is numbered one
    /// more than the register before it, the first one 0).
    pub fn from_target_xml(
        root: &str,
        fetch: &mut dyn FnMut(&str) -> Result<String, RemoteError>,
    ) -> Result<Self, RemoteError> {
        let mut layout = RegLayout::default();
        let mut next = 0u32;
        let mut includes = 0usize;
        layout.walk(root, fetch, &mut next, &mut includes, "")?;
        layout.regs.sort_by_key(|r| r.regnum);
        if let Some(w) = layout.regs.windows(2).find(|w| w[0].regnum == w[1].regnum) {
            return Err(RemoteError::Description(format!(
                "registers {} and {} share number {}",
                w[0].name, w[1].name, w[0].regnum
            )));
        }
        Ok(layout)
    }

    fn walk(
        &mut self,
        doc: &str,
        fetch: &mut dyn FnMut(&str) -> Result<String, RemoteError>,
        next: &mut u32,
        includes: &mut usize,
        feature: &str,
    ) -> Result<(), RemoteError> {
        let doc = strip_comments(doc);
        let mut feature = feature.to_string();
        let mut rest = doc.as_str();
        while let Some(lt) = rest.find('<') {
            rest = &rest[lt + 1..];
            let end = rest.find('>').ok_or_else(|| {
                RemoteError::Description(format!("unterminated tag in {}", lossy(rest.as_bytes())))
            })?;
            let tag = &rest[..end];
            let after = &rest[end + 1..];
            let name = tag
                .split(|c: char| c.is_whitespace() || c == '/')
                .next()
                .unwrap_or("");
            match name {
                "architecture" => {
                    let text_end = after.find('<').unwrap_or(after.len());
                    self.architecture = Some(after[..text_end].trim().to_string());
                }
                "feature" => feature = attr(tag, "name").unwrap_or_default(),
                "reg" => {
                    if self.regs.len() >= MAX_REGS {
                        return Err(RemoteError::Description(format!(
                            "more than {MAX_REGS} registers"
                        )));
                    }
                    let reg_name = attr(tag, "name").ok_or_else(|| {
                        RemoteError::Description(format!("<reg> without a name: <{tag}>"))
                    })?;
                    let num = |key: &str| -> Result<Option<u32>, RemoteError> {
                        attr(tag, key)
                            .map(|v| {
                                v.parse::<u32>().map_err(|_| {
                                    RemoteError::Description(format!("bad {key} in <{tag}>"))
                                })
                            })
                            .transpose()
                    };
                    let bitsize = num("bitsize")?.ok_or_else(|| {
                        RemoteError::Description(format!("<reg> without bitsize: <{tag}>"))
                    })?;
                    if bitsize == 0 || bitsize > 8192 {
                        return Err(RemoteError::Description(format!(
                            "register {reg_name}: bitsize {bitsize}"
                        )));
                    }
                    let regnum = num("regnum")?.unwrap_or(*next);
                    *next = regnum + 1;
                    self.regs.push(RegInfo {
                        name: reg_name,
                        bitsize,
                        regnum,
                        ty: attr(tag, "type").unwrap_or_default(),
                        feature: feature.clone(),
                    });
                }
                "xi:include" => {
                    let href = attr(tag, "href").ok_or_else(|| {
                        RemoteError::Description(format!("xi:include without href: <{tag}>"))
                    })?;
                    *includes += 1;
                    if *includes > MAX_INCLUDES {
                        return Err(RemoteError::Description(format!(
                            "more than {MAX_INCLUDES} included files"
                        )));
                    }
                    let sub = fetch(&href)?;
                    self.walk(&sub, fetch, next, includes, &feature)?;
                }
                _ => {}
            }
            rest = after;
        }
        Ok(())
    }

    /// The register named `name`.
    pub fn by_name(&self, name: &str) -> Option<&RegInfo> {
        self.regs.iter().find(|r| r.name == name)
    }

    /// The register numbered `regnum`.
    pub fn by_num(&self, regnum: u32) -> Option<&RegInfo> {
        self.regs
            .binary_search_by_key(&regnum, |r| r.regnum)
            .ok()
            .map(|i| &self.regs[i])
    }

    /// How a `g` reply of `len` bytes splits: the registers from number 0 upwards, contiguous,
    /// that fit exactly (a stub sends the first N registers; QEMU sends its core set). `None`
    /// when no prefix of the layout adds up to `len`.
    pub fn g_prefix(&self, len: usize) -> Option<usize> {
        let mut off = 0usize;
        if len == 0 {
            return Some(0);
        }
        for (i, r) in self.regs.iter().enumerate() {
            if r.regnum as usize != i {
                return None;
            }
            off += r.size();
            if off == len {
                return Some(i + 1);
            }
            if off > len {
                return None;
            }
        }
        None
    }
}

/// Removes `<!-- … -->` comments (an unterminated one runs to the end).
fn strip_comments(doc: &str) -> String {
    let mut out = String::with_capacity(doc.len());
    let mut rest = doc;
    while let Some(start) = rest.find("<!--") {
        out.push_str(&rest[..start]);
        match rest[start..].find("-->") {
            Some(end) => rest = &rest[start + end + 3..],
            None => return out,
        }
    }
    out.push_str(rest);
    out
}

/// The value of attribute `key` in a tag's text (either quote), with the five predefined
/// entities decoded.
fn attr(tag: &str, key: &str) -> Option<String> {
    let mut rest = tag;
    loop {
        let at = rest.find(key)?;
        let before_ok = at == 0 || rest[..at].ends_with(|c: char| c.is_whitespace());
        let after = rest[at + key.len()..].trim_start();
        if before_ok && let Some(v) = after.strip_prefix('=') {
            let v = v.trim_start();
            let quote = v.chars().next()?;
            if quote != '"' && quote != '\'' {
                return None;
            }
            let body = &v[1..];
            let end = body.find(quote)?;
            return Some(
                body[..end]
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
                    .replace("&quot;", "\"")
                    .replace("&apos;", "'")
                    .replace("&amp;", "&"),
            );
        }
        rest = &rest[at + key.len()..];
    }
}

/// Register values of one thread, by register number (`None`: not read or unavailable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registers {
    values: Vec<(u32, Option<Vec<u8>>)>,
}

impl Registers {
    /// From `(regnum, value)` pairs.
    pub fn new(mut values: Vec<(u32, Option<Vec<u8>>)>) -> Self {
        values.sort_by_key(|v| v.0);
        Registers { values }
    }

    /// The raw (target byte order) value of register `regnum`.
    pub fn raw(&self, regnum: u32) -> Option<&[u8]> {
        self.values
            .binary_search_by_key(&regnum, |v| v.0)
            .ok()
            .and_then(|i| self.values[i].1.as_deref())
    }

    /// Register `name` of `layout` as a little-endian integer (at most 8 bytes).
    pub fn u64(&self, layout: &RegLayout, name: &str) -> Option<u64> {
        let info = layout.by_name(name)?;
        let raw = self.raw(info.regnum)?;
        if raw.len() > 8 {
            return None;
        }
        let mut b = [0u8; 8];
        b[..raw.len()].copy_from_slice(raw);
        Some(u64::from_le_bytes(b))
    }

    /// Every `(regnum, value)` pair.
    pub fn iter(&self) -> impl Iterator<Item = (u32, Option<&[u8]>)> {
        self.values.iter().map(|(n, v)| (*n, v.as_deref()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROOT: &str = r#"<?xml version="1.0"?><!DOCTYPE target SYSTEM "gdb-target.dtd"><target><architecture>i386:x86-64</architecture><xi:include href="core.xml"/><xi:include href="sse.xml"/></target>"#;
    const CORE: &str = r#"<feature name="org.gnu.gdb.i386.core"><!-- <reg name="bogus" bitsize="8"/> -->
        <reg name="rax" bitsize="64" type="int64" regnum="0"/>
        <reg name='rbx' bitsize='64'/>
        <reg name="eflags" bitsize="32" type="i386_eflags"/>
        <reg name="st0" bitsize="80" type="i387_ext"/></feature>"#;
    const SSE: &str = r#"<feature name="org.gnu.gdb.i386.sse"><reg name="fs_base" bitsize="64" regnum="10"/></feature>"#;

    fn fetch(annex: &str) -> Result<String, RemoteError> {
        match annex {
            "core.xml" => Ok(CORE.into()),
            "sse.xml" => Ok(SSE.into()),
            _ => Err(RemoteError::Description(annex.into())),
        }
    }

    #[test]
    fn layout_follows_includes_numbering_and_comments() {
        let l = RegLayout::from_target_xml(ROOT, &mut fetch).unwrap();
        assert_eq!(l.architecture.as_deref(), Some("i386:x86-64"));
        let names: Vec<_> = l.regs.iter().map(|r| (r.name.as_str(), r.regnum)).collect();
        assert_eq!(
            names,
            [
                ("rax", 0),
                ("rbx", 1),
                ("eflags", 2),
                ("st0", 3),
                ("fs_base", 10)
            ]
        );
        assert_eq!(l.by_name("st0").unwrap().size(), 10);
        assert_eq!(
            l.by_name("fs_base").unwrap().feature,
            "org.gnu.gdb.i386.sse"
        );
        // 8 + 8 + 4 = 20 bytes: the first three; 30 bytes: four; 25: no prefix fits.
        assert_eq!(l.g_prefix(20), Some(3));
        assert_eq!(l.g_prefix(30), Some(4));
        assert_eq!(l.g_prefix(25), None);
    }

    #[test]
    fn bad_descriptions_are_errors() {
        let mut loops = |_: &str| Ok(ROOT.to_string());
        assert!(
            RegLayout::from_target_xml(ROOT, &mut loops).is_err(),
            "include loop bounded"
        );
        for bad in [
            r#"<reg bitsize="8"/>"#,
            r#"<reg name="a"/>"#,
            r#"<reg name="a" bitsize="x"/>"#,
            r#"<reg name="a" bitsize="0"/>"#,
            r#"<reg name="a" bitsize="8" regnum="1"/><reg name="b" bitsize="8" regnum="1"/>"#,
            r#"<reg name="a" bitsize="8""#,
            r#"<xi:include/>"#,
        ] {
            assert!(
                RegLayout::from_target_xml(bad, &mut fetch).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn register_values() {
        let l = RegLayout::from_target_xml(ROOT, &mut fetch).unwrap();
        let r = Registers::new(vec![(1, Some(vec![0x34, 0x12])), (0, None)]);
        assert_eq!(r.u64(&l, "rbx"), Some(0x1234));
        assert_eq!(r.u64(&l, "rax"), None);
        assert_eq!(r.u64(&l, "nope"), None);
    }
}
