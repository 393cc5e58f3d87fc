//! `ptrewind dump`: list the packets of a trace, one per line, in the spirit of libipt's ptdump.
//!
//! stdout carries only the listing (or, with `--stats`, only the statistics) so that it can be
//! counted and diffed; everything else (stream headers, errors, resyncs, data loss) goes to
//! stderr.

use std::fmt::Write as _;
use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::process::ExitCode;

use ptrewind::packet::{IpCompression, IpPayload, LastIp, Packet, PacketDecoder, PacketError};
use ptrewind::store::perf_data::DataLoss;
use ptrewind::store::{SourceFormat, TraceFile, TraceStream, TraceStreams};

use super::CmdResult;

/// Arguments of `ptrewind dump`.
#[derive(clap::Args, Debug)]
#[command(after_help = DUMP_SHORT_HELP, after_long_help = DUMP_HELP)]
pub struct DumpArgs {
    /// A raw PT file (AUX dump, extracted stream) or a perf.data file (normal or pipe mode;
    /// detected by its PERFILE2 magic); `-` reads standard input (e.g. `perf record -o - ...`).
    file: PathBuf,
    /// Append the IP reconstructed from Last IP to TIP, TIP.PGE, TIP.PGD and FUP lines
    /// (`ip=0x...`, `ip=suppressed`, or `ip=unknown` before the first PSB).
    #[arg(long)]
    lastip: bool,
    /// Start decoding at the first PSB instead of at offset 0 (the bytes before it are counted as
    /// skipped).
    #[arg(long)]
    sync: bool,
    /// Print per-stream statistics (packets and bytes per packet type, invalid packets, resyncs,
    /// skipped bytes, truncated tail, data loss) on stdout INSTEAD of the listing.
    #[arg(long)]
    stats: bool,
    /// perf.data only: dump just the stream with this label (e.g. `cpu0`, `tid1234`).
    #[arg(long, value_name = "LABEL")]
    stream: Option<String>,
}

const DUMP_SHORT_HELP: &str = "\
stdout: one line per packet, `<offset %016x>  <name>  <payload>` (or only the statistics with
--stats); everything else goes to stderr.
Exit status: 0 clean, 1 invalid packets or data loss, 2 hard error. See --help for details.";

const DUMP_HELP: &str = "\
OUTPUT
  stdout holds one line per packet and nothing else:
      <offset, 16 hex digits>  <name>  <payload>
  e.g.
      0000000000000000  psb
      0000000000000010  tnt.8      !!.          (! = taken, . = not taken, oldest first)
      0000000000000011  tip        3: 00007fffd1e2c000   (IPBytes: payload; ? = bits from Last IP)
      0000000000000018  mode.exec  cs.l
  Offsets are positions in the PT stream: the file offset for raw files, the offset in the
  concatenated AUXTRACE payloads of the stream for perf.data (the same offsets a dump of the
  extracted stream shows). With --stats, stdout holds the statistics instead.

  stderr holds everything else: for perf.data a header line per stream naming it (label, CPU,
  thread, size, chunks), invalid packets and resyncs (stream and file offsets), a truncated last
  packet, data loss recorded by perf (AUX gaps, TRUNCATED/PARTIAL flags) and perf.data errors.

ERRORS
  An invalid packet is reported on stderr with its offset and counted; decoding resumes at the
  next PSB (a resync). A packet cut off by the end of the stream is reported as truncated, not
  invalid (a full buffer or a stopped trace ends that way). At a perf data-loss point decoding
  also resumes at the next PSB.

EXIT STATUS
  0  every stream decoded without an invalid packet and without data loss (a truncated last
     packet alone is not an error)
  1  invalid packets, data loss, or a damaged perf.data (records after the damage are ignored)
  2  hard error: the file cannot be read, is empty, a device or too large a pipe (the limit is
     1 GiB; regular files are mapped and have none), is not a usable perf.data, holds no Intel
     PT data, or --stream names no stream";

/// Per-stream counters.
#[derive(Debug, Default, Clone)]
struct Stats {
    /// (name, packets, bytes) per packet type, in first-seen order.
    per_type: Vec<(&'static str, u64, u64)>,
    packets: u64,
    packet_bytes: u64,
    invalid: u64,
    resyncs: u64,
    skipped_bytes: u64,
    truncated_bytes: u64,
    data_loss: u64,
}

impl Stats {
    fn count(&mut self, name: &'static str, len: u64) {
        self.packets += 1;
        self.packet_bytes += len;
        match self.per_type.iter_mut().find(|(n, _, _)| *n == name) {
            Some(entry) => {
                entry.1 += 1;
                entry.2 += len;
            }
            None => self.per_type.push((name, 1, len)),
        }
    }

    fn add(&mut self, other: &Stats) {
        for &(name, n, b) in &other.per_type {
            match self.per_type.iter_mut().find(|(m, _, _)| *m == name) {
                Some(entry) => {
                    entry.1 += n;
                    entry.2 += b;
                }
                None => self.per_type.push((name, n, b)),
            }
        }
        self.packets += other.packets;
        self.packet_bytes += other.packet_bytes;
        self.invalid += other.invalid;
        self.resyncs += other.resyncs;
        self.skipped_bytes += other.skipped_bytes;
        self.truncated_bytes += other.truncated_bytes;
        self.data_loss += other.data_loss;
    }

    fn write(&self, out: &mut impl Write, title: &str, stream_bytes: u64) -> io::Result<()> {
        writeln!(out, "stream {title}: {stream_bytes} bytes")?;
        writeln!(out, "  {:<12}{:>12}{:>12}", "packet", "count", "bytes")?;
        let mut types = self.per_type.clone();
        types.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        for (name, n, b) in types {
            writeln!(out, "  {name:<12}{n:>12}{b:>12}")?;
        }
        writeln!(
            out,
            "  {:<12}{:>12}{:>12}",
            "total", self.packets, self.packet_bytes
        )?;
        writeln!(out, "  {:<12}{:>12}", "invalid", self.invalid)?;
        writeln!(out, "  {:<12}{:>12}", "resyncs", self.resyncs)?;
        writeln!(out, "  {:<12}{:>24}", "skipped", self.skipped_bytes)?;
        writeln!(out, "  {:<12}{:>24}", "truncated", self.truncated_bytes)?;
        writeln!(out, "  {:<12}{:>12}", "data-loss", self.data_loss)
    }
}

/// Formats an IP payload like ptdump: `<ipbytes>: <payload>`, with `?` for the bits that come
/// from Last IP.
fn ip_payload(out: &mut String, p: &IpPayload) {
    let ipb = p.compression.ipbytes();
    let _ = match p.compression {
        IpCompression::Suppressed => write!(out, "{ipb}: ????????????????"),
        IpCompression::Update16 => write!(out, "{ipb}: ????????????{:04x}", p.raw & 0xffff),
        IpCompression::Update32 => write!(out, "{ipb}: ????????{:08x}", p.raw & 0xffff_ffff),
        IpCompression::Update48 => write!(out, "{ipb}: ????{:012x}", p.raw & 0xffff_ffff_ffff),
        IpCompression::Sext48 => write!(out, "{ipb}: {:016x}", (((p.raw << 16) as i64) >> 16)),
        IpCompression::Full => write!(out, "{ipb}: {:016x}", { p.raw }),
    };
}

/// Appends `flags` that are set, comma-separated.
fn flags(out: &mut String, flags: &[(bool, &str)]) {
    let mut first = true;
    for &(set, name) in flags {
        if set {
            if !first {
                out.push_str(", ");
            }
            out.push_str(name);
            first = false;
        }
    }
}

/// The payload column of a packet.
fn payload(out: &mut String, p: &Packet) {
    let _ = match p {
        Packet::ShortTnt(t) | Packet::LongTnt(t) => {
            for i in (0..t.count).rev() {
                out.push(if t.bits >> i & 1 == 1 { '!' } else { '.' });
            }
            Ok(())
        }
        Packet::Tip(ip) | Packet::TipPge(ip) | Packet::TipPgd(ip) | Packet::Fup(ip) => {
            ip_payload(out, ip);
            Ok(())
        }
        Packet::ModeExec { csl, csd, iflag } => {
            flags(out, &[(*csl, "cs.l"), (*csd, "cs.d"), (*iflag, "if")]);
            Ok(())
        }
        Packet::ModeTsx { intx, abort } => {
            flags(out, &[(*intx, "intx"), (*abort, "abrt")]);
            Ok(())
        }
        Packet::Pip { cr3, nr } => {
            let r = write!(out, "{cr3:x}");
            if *nr {
                out.push_str(", nr");
            }
            r
        }
        Packet::Cbr { ratio } => write!(out, "{ratio:x}"),
        Packet::Tsc { tsc } => write!(out, "{tsc:x}"),
        Packet::Mtc { ctc } => write!(out, "{ctc:x}"),
        Packet::Tma { ctc, fc } => write!(out, "{ctc:x}, {fc:x}"),
        Packet::Cyc { value } => write!(out, "{value:x}"),
        Packet::Vmcs { base } => write!(out, "{base:x}"),
        Packet::Mnt { payload } => write!(out, "{payload:x}"),
        Packet::Ptw { payload, size, ip } => {
            let r = write!(out, "{}: {payload:x}", if *size == 8 { 1 } else { 0 });
            if *ip {
                out.push_str(", ip");
            }
            r
        }
        Packet::Exstop { ip } | Packet::Bep { ip } => {
            flags(out, &[(*ip, "ip")]);
            Ok(())
        }
        Packet::Mwait { hints, ext } => write!(out, "{hints:08x}, {ext:08x}"),
        Packet::Pwre {
            hw,
            state,
            substate,
        } => {
            let r = write!(out, "c{state}.{substate}");
            if *hw {
                out.push_str(", hw");
            }
            r
        }
        Packet::Pwrx {
            last,
            deepest,
            wake,
        } => write!(out, "c{last}, c{deepest}, wake {wake:x}"),
        Packet::Bbp { sz, kind } => write!(out, "sz {}, type {kind:x}", if *sz { 4 } else { 8 }),
        Packet::Bip { id, value } => write!(out, "{id:x}: {value:x}"),
        Packet::Cfe { ip, kind, vector } => {
            let r = write!(out, "{kind:x}, {vector:x}");
            if *ip {
                out.push_str(", ip");
            }
            r
        }
        Packet::Evd { kind, payload } => write!(out, "{kind:x}: {payload:x}"),
        Packet::Pad | Packet::TraceStop | Packet::Ovf | Packet::Psb | Packet::PsbEnd => Ok(()),
    };
}

/// Options that shape one stream's dump.
struct Options {
    lastip: bool,
    sync: bool,
    listing: bool,
}

/// Describes a stream offset for stderr: the stream offset, plus the file offset when it differs.
fn place(stream: &TraceStream<'_>, offset: u64) -> String {
    match stream.file_offset(offset) {
        Some(file) if file != offset => format!("offset {offset:#x} (file offset {file:#x})"),
        _ => format!("offset {offset:#x}"),
    }
}

/// Dumps one stream; returns its statistics.
fn dump_stream(
    out: &mut impl Write,
    stream: &TraceStream<'_>,
    opts: &Options,
) -> io::Result<Stats> {
    let data: &[u8] = &stream.data;
    let mut stats = Stats::default();
    let mut last_ip = LastIp::new();
    let mut line = String::with_capacity(96);
    let prefix = if stream.label == "raw" {
        String::new()
    } else {
        format!("{}: ", stream.label)
    };

    // Losses without a stream position can only be reported.
    for loss in stream.losses.iter().filter(|l| l.stream_offset.is_none()) {
        stats.data_loss += 1;
        eprintln!(
            "ptrewind: {prefix}data loss ({}) flagged by the perf record at file offset {:#x}; \
             its position in the stream is unknown",
            super::input::loss_name(&loss.kind),
            loss.record_offset
        );
    }
    // The stream is decoded in segments separated by the loss points: the bytes after a loss do
    // not continue the packets before it, so a packet may not span one, and each segment after a
    // loss starts at its first PSB.
    let mut cuts: Vec<(u64, &DataLoss)> = stream
        .losses
        .iter()
        .filter_map(|l| l.stream_offset.map(|at| (at.min(data.len() as u64), l)))
        .collect();
    cuts.sort_by_key(|c| c.0);
    let mut start = 0u64;
    for segment in 0..=cuts.len() {
        let end = cuts.get(segment).map_or(data.len() as u64, |c| c.0);
        if end >= start {
            let sync = if segment == 0 { opts.sync } else { true };
            decode_segment(
                out,
                stream,
                &data[..end as usize],
                start,
                sync,
                opts,
                &prefix,
                &mut last_ip,
                &mut line,
                &mut stats,
            )?;
        }
        if let Some(&(at, loss)) = cuts.get(segment) {
            stats.data_loss += 1;
            eprintln!(
                "ptrewind: {prefix}data loss ({}) at {} (perf record at file offset {:#x}); \
                 decoding resumes at the next PSB",
                super::input::loss_name(&loss.kind),
                place(stream, at),
                loss.record_offset
            );
            start = start.max(at);
        }
    }
    Ok(stats)
}

/// Decodes `data[start..]` (`data` ends at the segment's end; offsets are stream offsets).
#[allow(clippy::too_many_arguments)] // One call site; a struct would only rename the locals.
fn decode_segment(
    out: &mut impl Write,
    stream: &TraceStream<'_>,
    data: &[u8],
    start: u64,
    sync: bool,
    opts: &Options,
    prefix: &str,
    last_ip: &mut LastIp,
    line: &mut String,
    stats: &mut Stats,
) -> io::Result<()> {
    let mut dec = PacketDecoder::new(data);
    dec.set_position(start as usize);
    if sync {
        match dec.sync_forward() {
            Some(psb) => stats.skipped_bytes += psb - start,
            None => {
                let rest = data.len() as u64 - start;
                if rest > 0 {
                    eprintln!(
                        "ptrewind: {prefix}no PSB in the {rest} byte(s) from offset {start:#x}"
                    );
                }
                stats.skipped_bytes += rest;
            }
        }
    }
    while let Some(item) = dec.next_packet() {
        match item {
            Ok((offset, packet)) => {
                let len = dec.offset() - offset;
                stats.count(packet.name(), len);
                if matches!(packet, Packet::Psb | Packet::Ovf) {
                    // Last IP is 0 after a PSB; after an overflow libipt assumes the same
                    // (reference §2 item 8).
                    last_ip.reset();
                }
                let ip = packet.ip_payload().map(|(_, ip)| last_ip.apply(ip));
                if !opts.listing {
                    continue;
                }
                line.clear();
                let _ = write!(line, "{offset:016x}  {:<11}", packet.name());
                payload(line, &packet);
                if opts.lastip {
                    match ip {
                        Some(Ok(Some(ip))) => {
                            let _ = write!(line, "  ip=0x{ip:016x}");
                        }
                        Some(Ok(None)) => line.push_str("  ip=suppressed"),
                        Some(Err(_)) => line.push_str("  ip=unknown"),
                        None => {}
                    }
                }
                out.write_all(line.trim_end().as_bytes())?;
                out.write_all(b"\n")?;
            }
            Err(PacketError::Truncated { offset, needed }) => {
                let rest = data.len() as u64 - offset;
                stats.truncated_bytes += rest;
                eprintln!(
                    "ptrewind: {prefix}truncated packet at {}: {needed} more byte(s) needed, \
                     {rest} byte(s) left undecoded",
                    place(stream, offset)
                );
                break;
            }
            Err(PacketError::Invalid { offset, reason }) => {
                stats.invalid += 1;
                eprintln!(
                    "ptrewind: {prefix}invalid packet at {}: {reason}",
                    place(stream, offset)
                );
                resync(&mut dec, stats, prefix, stream, offset);
            }
        }
    }
    Ok(())
}

/// Moves the decoder from `from` to the next PSB after it (strictly after, so a bad PSB cannot
/// loop) and reports the resync.
fn resync(
    dec: &mut PacketDecoder<'_>,
    stats: &mut Stats,
    prefix: &str,
    stream: &TraceStream<'_>,
    from: u64,
) {
    let len = dec.buffer().len() as u64;
    dec.set_position(from as usize + 1);
    match dec.sync_forward() {
        Some(psb) => {
            stats.resyncs += 1;
            stats.skipped_bytes += psb - from;
            eprintln!(
                "ptrewind: {prefix}resynced at PSB {} ({} byte(s) skipped)",
                place(stream, psb),
                psb - from
            );
        }
        None => {
            stats.skipped_bytes += len.saturating_sub(from);
            eprintln!(
                "ptrewind: {prefix}no PSB after offset {from:#x}: {} byte(s) skipped to the end",
                len.saturating_sub(from)
            );
        }
    }
}

/// Runs `ptrewind dump`.
pub fn run(args: DumpArgs) -> CmdResult {
    let file = if args.file.as_os_str() == "-" {
        TraceFile::stdin()?
    } else {
        TraceFile::open(&args.file)?
    };
    let source = TraceStreams::from_bytes(file.bytes())
        .map_err(|e| format!("{}: {e}", args.file.display()))?;
    let mut damaged = super::input::report_perf_damage(&args.file, &source);
    // Nothing to list in an intact file is a hard error (2); in a damaged one it is the damage
    // (1). A trace without a PSB is still listed from offset 0 (that is what a damaged trace
    // looks like), but never passes as clean.
    if let Err(e) = super::input::require_trace(&args.file, &source) {
        if source.streams.is_empty() && !damaged {
            return Err(e.into());
        }
        eprintln!("ptrewind: {e}");
        damaged = true;
    }

    let streams: Vec<&TraceStream<'_>> = match &args.stream {
        None => source.streams.iter().collect(),
        Some(label) => match source.stream(label) {
            Some(s) => vec![s],
            None => {
                let labels: Vec<&str> = source.streams.iter().map(|s| s.label.as_str()).collect();
                return Err(format!(
                    "{}: no stream labelled {label:?} (streams: {})",
                    args.file.display(),
                    if labels.is_empty() {
                        "none".to_string()
                    } else {
                        labels.join(", ")
                    }
                )
                .into());
            }
        },
    };

    let opts = Options {
        lastip: args.lastip,
        sync: args.sync,
        listing: !args.stats,
    };
    let stdout = io::stdout();
    let mut out = BufWriter::with_capacity(1 << 16, stdout.lock());
    let mut total = Stats::default();
    let mut total_bytes = 0u64;
    for stream in &streams {
        if matches!(source.format, SourceFormat::PerfData { .. }) {
            let who = match (stream.cpu, stream.tid) {
                (Some(cpu), Some(tid)) => format!("cpu {cpu}, tid {tid}"),
                (Some(cpu), None) => format!("cpu {cpu}"),
                (None, Some(tid)) => format!("tid {tid}"),
                (None, None) => "no cpu/tid".to_string(),
            };
            eprintln!(
                "ptrewind: stream {} ({who}): {} bytes in {} AUXTRACE chunk(s)",
                stream.label,
                stream.data.len(),
                stream.chunks.len()
            );
        }
        let stats = match dump_stream(&mut out, stream, &opts) {
            Ok(stats) => stats,
            // A closed pipe (`| head`) is not an error worth a message.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(ExitCode::SUCCESS),
            Err(e) => return Err(e.into()),
        };
        if args.stats {
            stats.write(&mut out, &stream.label, stream.data.len() as u64)?;
        }
        total.add(&stats);
        total_bytes += stream.data.len() as u64;
    }
    if args.stats && streams.len() > 1 {
        total.write(&mut out, "total", total_bytes)?;
    }
    match out.flush() {
        Err(e) if e.kind() != io::ErrorKind::BrokenPipe => return Err(e.into()),
        _ => {}
    }
    let failed = damaged || total.invalid > 0 || total.data_loss > 0;
    Ok(if failed {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}
