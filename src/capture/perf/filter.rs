//! Address filters for `ioctl(PERF_EVENT_IOC_SET_FILTER)`.
//!
//! Syntax (comment above `perf_event_parse_addr_filter()` in `kernel/events/core.c`):
//! `ACTION RANGE_SPEC`, ACTION ∈ `filter` | `start` | `stop`, RANGE_SPEC =
//! `<start>[/<size>]` (kernel addresses) or `<start>[/<size>]@</path/to/object>` (file-backed; the
//! start is an offset in the object file). Several filters are separated by `,`, space or newline
//! (the kernel tokenises with `strsep(" ,\n")`); numbers are parsed by `kstrtoul(.., 0)`, i.e.
//! `0x` hex, leading-`0` octal or decimal.
//!
//! What the `intel_pt` driver accepts is narrower (`pt_event_addr_filters_validate()` in
//! `arch/x86/events/intel/pt.c`): no `start` action and no zero-size ranges (both `EOPNOTSUPP`),
//! and at most `caps/num_address_ranges` filters. For a user-space-only event
//! (`exclude_kernel = 1`) a filter on kernel addresses (no `@object`) is `EINVAL`. Those rules
//! are checked by [`validate_for_intel_pt`] so the user gets a sentence instead of an errno.

use std::ffi::CString;
use std::fmt;

use thiserror::Error;

/// `filter`, `start` or `stop`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FilterAction {
    /// Trace only inside the range.
    Filter,
    /// Start tracing at the address (not supported by `intel_pt`).
    Start,
    /// Stop tracing when the range is reached (TraceStop).
    Stop,
}

/// One address filter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AddrFilter {
    /// The action.
    pub action: FilterAction,
    /// Start address (file offset when `object` is set).
    pub start: u64,
    /// Size in bytes; 0 means a single address.
    pub size: u64,
    /// Object file for file-backed filters.
    pub object: Option<String>,
}

impl fmt::Display for AddrFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let action = match self.action {
            FilterAction::Filter => "filter",
            FilterAction::Start => "start",
            FilterAction::Stop => "stop",
        };
        write!(f, "{action} {:#x}", self.start)?;
        if self.size != 0 {
            write!(f, "/{:#x}", self.size)?;
        }
        if let Some(o) = &self.object {
            write!(f, "@{o}")?;
        }
        Ok(())
    }
}

/// A filter string that does not parse or that `intel_pt` would refuse.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FilterError {
    /// No filter in the string.
    #[error("empty address filter")]
    Empty,
    /// An action other than `filter`/`start`/`stop`.
    #[error("address filter {index}: unknown action {action:?} (expected filter, start or stop)")]
    BadAction {
        /// 0-based filter index.
        index: usize,
        /// The word found.
        action: String,
    },
    /// The action has no range.
    #[error("address filter {index}: `{action}` has no address range")]
    MissingRange {
        /// 0-based filter index.
        index: usize,
        /// The action.
        action: String,
    },
    /// A number did not parse.
    #[error("address filter {index}: bad number {text:?} (use 0x hex, 0 octal or decimal)")]
    BadNumber {
        /// 0-based filter index.
        index: usize,
        /// The text.
        text: String,
    },
    /// Empty or relative object path.
    #[error("address filter {index}: object path {path:?} must be absolute")]
    BadPath {
        /// 0-based filter index.
        index: usize,
        /// The path.
        path: String,
    },
    /// `start + size` overflows.
    #[error("address filter {index}: range {start:#x}/{size:#x} wraps past 2^64")]
    RangeOverflow {
        /// 0-based filter index.
        index: usize,
        /// Start.
        start: u64,
        /// Size.
        size: u64,
    },
    /// `start` actions are refused by `intel_pt`.
    #[error(
        "address filter {index} ({filter}): intel_pt does not support `start` filters (the driver returns EOPNOTSUPP); use `filter` or `stop` with a size"
    )]
    StartUnsupported {
        /// 0-based filter index.
        index: usize,
        /// The filter.
        filter: String,
    },
    /// Single-address filters are refused by `intel_pt`.
    #[error(
        "address filter {index} ({filter}): intel_pt needs a non-zero size (`<start>/<size>`); single-address filters return EOPNOTSUPP"
    )]
    ZeroSize {
        /// 0-based filter index.
        index: usize,
        /// The filter.
        filter: String,
    },
    /// Kernel-address filter on a user-space-only event.
    #[error(
        "address filter {index} ({filter}): no `@/path/to/object`, so it names kernel addresses, but the event traces user space only (exclude_kernel=1; the kernel returns EINVAL)"
    )]
    KernelAddressOnUserEvent {
        /// 0-based filter index.
        index: usize,
        /// The filter.
        filter: String,
    },
    /// More filters than address ranges.
    #[error(
        "{requested} address filters requested but this CPU has {available} address range(s) (caps/num_address_ranges, caps/ip_filtering)"
    )]
    TooMany {
        /// Filters requested.
        requested: usize,
        /// `caps/num_address_ranges` (0 without `ip_filtering`).
        available: u64,
    },
}

fn parse_num(text: &str, index: usize) -> Result<u64, FilterError> {
    let bad = || FilterError::BadNumber {
        index,
        text: text.to_owned(),
    };
    let r = if let Some(h) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        u64::from_str_radix(h, 16)
    } else if text.len() > 1 && text.starts_with('0') {
        u64::from_str_radix(&text[1..], 8)
    } else {
        text.parse()
    };
    r.map_err(|_| bad())
}

/// Parses a filter string in `PERF_EVENT_IOC_SET_FILTER` syntax (several filters separated by
/// `,`, spaces or newlines).
pub fn parse_filters(text: &str) -> Result<Vec<AddrFilter>, FilterError> {
    let mut tokens = text.split([' ', ',', '\n', '\t']).filter(|t| !t.is_empty());
    let mut out = Vec::new();
    while let Some(action_word) = tokens.next() {
        let index = out.len();
        let action = match action_word {
            "filter" => FilterAction::Filter,
            "start" => FilterAction::Start,
            "stop" => FilterAction::Stop,
            other => {
                return Err(FilterError::BadAction {
                    index,
                    action: other.to_owned(),
                });
            }
        };
        let spec = tokens.next().ok_or_else(|| FilterError::MissingRange {
            index,
            action: action_word.to_owned(),
        })?;
        let (range, object) = match spec.split_once('@') {
            Some((r, o)) => {
                if !o.starts_with('/') {
                    return Err(FilterError::BadPath {
                        index,
                        path: o.to_owned(),
                    });
                }
                (r, Some(o.to_owned()))
            }
            None => (spec, None),
        };
        let (start, size) = match range.split_once('/') {
            Some((s, z)) => (parse_num(s, index)?, parse_num(z, index)?),
            None => (parse_num(range, index)?, 0),
        };
        if start.checked_add(size).is_none() {
            return Err(FilterError::RangeOverflow { index, start, size });
        }
        out.push(AddrFilter {
            action,
            start,
            size,
            object,
        });
    }
    if out.is_empty() {
        return Err(FilterError::Empty);
    }
    Ok(out)
}

/// Checks filters against what the `intel_pt` driver accepts for an event with the given
/// `exclude_kernel` setting and `num_address_ranges` (see the module docs).
pub fn validate_for_intel_pt(
    filters: &[AddrFilter],
    num_address_ranges: u64,
    exclude_kernel: bool,
) -> Result<(), FilterError> {
    if filters.is_empty() {
        return Err(FilterError::Empty);
    }
    for (index, f) in filters.iter().enumerate() {
        if f.action == FilterAction::Start {
            return Err(FilterError::StartUnsupported {
                index,
                filter: f.to_string(),
            });
        }
        if f.size == 0 {
            return Err(FilterError::ZeroSize {
                index,
                filter: f.to_string(),
            });
        }
        if exclude_kernel && f.object.is_none() {
            return Err(FilterError::KernelAddressOnUserEvent {
                index,
                filter: f.to_string(),
            });
        }
    }
    if filters.len() as u64 > num_address_ranges {
        return Err(FilterError::TooMany {
            requested: filters.len(),
            available: num_address_ranges,
        });
    }
    Ok(())
}

/// The string handed to `PERF_EVENT_IOC_SET_FILTER` (filters joined by `,`). Object paths
/// containing a separator or NUL cannot be expressed in the kernel syntax.
pub fn ioctl_string(filters: &[AddrFilter]) -> Result<CString, FilterError> {
    for (index, f) in filters.iter().enumerate() {
        if let Some(o) = &f.object
            && o.contains([' ', ',', '\n', '\t', '\0'])
        {
            return Err(FilterError::BadPath {
                index,
                path: o.clone(),
            });
        }
    }
    let s = filters
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",");
    CString::new(s).map_err(|_| FilterError::Empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kernel_syntax() {
        let f = parse_filters("filter 0x1000/0x200@/bin/ls, stop 4096/16@/lib/x.so\nstart 010")
            .unwrap();
        assert_eq!(f.len(), 3);
        assert_eq!(
            f[0],
            AddrFilter {
                action: FilterAction::Filter,
                start: 0x1000,
                size: 0x200,
                object: Some("/bin/ls".into())
            }
        );
        assert_eq!(
            (f[1].action, f[1].start, f[1].size),
            (FilterAction::Stop, 4096, 16)
        );
        assert_eq!(
            (f[2].action, f[2].start, f[2].size, f[2].object.as_deref()),
            (FilterAction::Start, 8, 0, None)
        );
        assert_eq!(
            ioctl_string(&f[..2]).unwrap().to_str().unwrap(),
            "filter 0x1000/0x200@/bin/ls,stop 0x1000/0x10@/lib/x.so"
        );
    }

    #[test]
    fn rejects_bad_syntax() {
        assert_eq!(parse_filters("  "), Err(FilterError::Empty));
        assert!(matches!(
            parse_filters("trace 0x1/2"),
            Err(FilterError::BadAction { .. })
        ));
        assert!(matches!(
            parse_filters("filter"),
            Err(FilterError::MissingRange { .. })
        ));
        assert!(matches!(
            parse_filters("filter 0xzz/2"),
            Err(FilterError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_filters("filter 1/2@rel"),
            Err(FilterError::BadPath { .. })
        ));
        assert!(matches!(
            parse_filters("filter 0xffffffffffffffff/2@/a"),
            Err(FilterError::RangeOverflow { .. })
        ));
    }
}
