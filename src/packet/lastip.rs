//! Last-IP reconstruction for TIP, TIP.PGE, TIP.PGD and FUP payloads (SDM Table "FUP/TIP IP
//! Reconstruction"; reference §2).

use super::{IpCompression, IpPayload};

/// Why an IP payload could not be reconstructed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LastIpError {
    /// A compressed payload (IPBytes 001, 010 or 100) arrived while Last IP is unknown, i.e. the
    /// decoder synchronised without a PSB. Only 011 and 110 payloads can be trusted then.
    #[error("IP compressed with {compression:?} but Last IP is unknown (no PSB seen)")]
    NoLastIp {
        /// The compression of the payload that could not be applied.
        compression: IpCompression,
    },
}

/// The decoder's copy of the processor's Last IP register, shared by FUP, TIP, TIP.PGE and
/// TIP.PGD.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LastIp {
    ip: u64,
    known: bool,
}

impl LastIp {
    /// An unknown Last IP: the state of a decoder that has not seen a PSB (or OVF) yet. Only
    /// Sext48 and Full payloads can be reconstructed until one arrives.
    pub fn new() -> Self {
        LastIp {
            ip: 0,
            known: false,
        }
    }

    /// Resets Last IP to zero, as the processor does at every PSB (and libipt at OVF). After this
    /// compressed payloads are reconstructed against 0.
    pub fn reset(&mut self) {
        self.ip = 0;
        self.known = true;
    }

    /// Forgets Last IP (e.g. after an overflow when the decoder does not want to assume a reset).
    pub fn forget(&mut self) {
        self.ip = 0;
        self.known = false;
    }

    /// Whether Last IP is known, so that payloads compressed against it can be trusted.
    pub fn have_ip(&self) -> bool {
        self.known
    }

    /// The current Last IP, if known.
    pub fn ip(&self) -> Option<u64> {
        self.known.then_some(self.ip)
    }

    /// The IP that payload `p` would reconstruct to, without changing the state. `Ok(None)` for a
    /// suppressed IP.
    #[inline]
    pub fn reconstruct(&self, p: IpPayload) -> Result<Option<u64>, LastIpError> {
        let raw = p.raw;
        Ok(Some(match p.compression {
            IpCompression::Suppressed => return Ok(None),
            IpCompression::Sext48 => (((raw << 16) as i64) >> 16) as u64,
            IpCompression::Full => raw,
            c if !self.known => return Err(LastIpError::NoLastIp { compression: c }),
            IpCompression::Update16 => (self.ip & !0xffff) | (raw & 0xffff),
            IpCompression::Update32 => (self.ip & !0xffff_ffff) | (raw & 0xffff_ffff),
            IpCompression::Update48 => (self.ip & !0xffff_ffff_ffff) | (raw & 0xffff_ffff_ffff),
        }))
    }

    /// Applies an IP payload: returns the reconstructed IP and makes it the new Last IP, or returns
    /// `None` for a suppressed IP (IPBytes 000), which leaves Last IP unchanged. Only 011 (Sext48)
    /// sign-extends; 001, 010 and 100 keep the upper bits of Last IP; 110 takes all 64 bits.
    /// Payload bits above the compression's width are ignored. On error the state is unchanged.
    #[inline]
    pub fn apply(&mut self, p: IpPayload) -> Result<Option<u64>, LastIpError> {
        let ip = self.reconstruct(p)?;
        if let Some(ip) = ip {
            self.ip = ip;
            self.known = true;
        }
        Ok(ip)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pl(compression: IpCompression, raw: u64) -> IpPayload {
        IpPayload::new(compression, raw)
    }

    #[test]
    fn unknown_last_ip_accepts_only_uncompressed() {
        let mut l = LastIp::new();
        assert!(!l.have_ip());
        assert_eq!(
            l.apply(pl(IpCompression::Update16, 0x1234)),
            Err(LastIpError::NoLastIp {
                compression: IpCompression::Update16
            })
        );
        assert_eq!(l.apply(pl(IpCompression::Suppressed, 0)), Ok(None));
        assert!(!l.have_ip());
        assert_eq!(
            l.apply(pl(IpCompression::Sext48, 0x8000_0000_0000)),
            Ok(Some(0xffff_8000_0000_0000))
        );
        assert!(l.have_ip());
    }
}
