//! Fuzzes the perf.data reader (normal and pipe mode: header, attributes, feature sections,
//! records, AUXTRACE stream assembly), the context-switch sideband and the split of per-CPU
//! streams into threads (`PerfData::context_switches`, `Schedule`, `store::percpu`), and the
//! sideband → image path (`PerfSideband::read`, `Image::from_mmaps`), and the exec cut
//! (`store::exec_cut`: the sideband's execs placed in every stream and every split thread).
//! Recorded file names are resolved without touching the file system's real files: to nothing
//! (a path that does not exist) or to a small fixed ELF file.
//!
//! Checked: no panic, every iteration ends (libFuzzer's `-timeout` catches hangs), the record
//! iterator makes progress.
//!
//! Run (seeded with the real recordings, read in place; the first directory receives new inputs):
//! ```text
//! cd fuzz && mkdir -p corpus/perf_data && RUSTC_BOOTSTRAP=1 cargo fuzz run perf_data \
//!     $PWD/corpus/perf_data /work/shared/corpus/quipper-perfdata-intel_pt \
//!     /work/shared/corpus/hase-pt-recordings -- -max_len=262144 -max_total_time=180 -timeout=10
//! ```
#![no_main]

#[path = "common.rs"]
mod common;

use libfuzzer_sys::fuzz_target;
use ptrewind::image::perf_maps::PerfSideband;
use ptrewind::image::{Image, MmapOptions};
use ptrewind::store::TraceStreams;
use ptrewind::store::exec_cut::{ExecAt, ExecPlace, cut_at_execs};
use ptrewind::store::percpu::split_per_cpu;
use ptrewind::store::perf_data::{PerfData, Schedule, TscConversion};
use std::path::PathBuf;
use std::sync::OnceLock;

fn elf_path() -> &'static PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let p = std::env::temp_dir().join(format!("ptrewind-fuzz-{}.elf", std::process::id()));
        // call rel32 +0; jz +2; jmp -9; syscall; ret
        let code = [0xE8, 0, 0, 0, 0, 0x74, 0x02, 0xEB, 0xF7, 0x0F, 0x05, 0xC3];
        std::fs::write(&p, common::tiny_elf(&code)).expect("write the fixed ELF");
        p
    })
}

/// Places the execs of the sideband's first process in `stream` (`cut_at_execs`, with each
/// address space's mappings from `PerfSideband::space_mmaps`); every period starts at a PSB of
/// the rewritten stream, and a cut stream ends at its cut.
fn exec_cut(sb: &PerfSideband, conv: Option<TscConversion>, stream: &[u8]) {
    let Some(pid) = sb.execs.first().map(|e| e.pid) else {
        return;
    };
    let execs = sb.execs_of(pid);
    let spaces: Vec<Vec<(u64, u64)>> = (0..=execs.len())
        .map(|k| {
            sb.space_mmaps(pid, k)
                .iter()
                .map(|m| (m.addr, m.addr.saturating_add(m.len)))
                .collect()
        })
        .collect();
    let mapped: Vec<Box<dyn Fn(u64) -> bool + '_>> = spaces
        .iter()
        .map(|r| Box::new(move |ip: u64| r.iter().any(|&(a, b)| a <= ip && ip < b)) as Box<_>)
        .collect();
    let at: Vec<ExecAt<'_>> = execs
        .iter()
        .enumerate()
        .map(|(k, e)| ExecAt {
            tsc: match (conv, e.time) {
                (Some(c), Some(t)) => c.perf_time_to_tsc(t),
                (_, t) => t.unwrap_or(0),
            },
            old_code: &*mapped[k],
            new_code: &*mapped[k + 1],
            old_has_code: !spaces[k].is_empty(),
        })
        .collect();
    let cut = cut_at_execs(stream, &at, &ptrewind::packet::time::TimingConfig::default());
    assert_eq!(cut.places.len(), at.len());
    if let Some((at, _)) = cut.truncated_at {
        assert_eq!(
            at,
            cut.data.len() as u64,
            "a cut stream does not end at its cut"
        );
    }
    for p in &cut.places {
        if let ExecPlace::At { psb_offset } = p {
            let at = *psb_offset as usize;
            assert_eq!(
                cut.data.get(at..at + 2),
                Some(&[0x02, 0x82][..]),
                "a period does not start at a PSB"
            );
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let _ = PerfData::is_perf_data(data);
    let Ok(perf) = PerfData::parse(data) else {
        return;
    };
    let _ = perf.is_pipe();
    for a in perf.attrs() {
        let _ = (a.attr.sample_id_all(), a.ids.len());
    }
    // The record iterator ends within one step per 8 bytes (a record header is 8 bytes).
    let mut n = 0usize;
    for r in perf.records() {
        n += 1;
        assert!(
            n <= data.len() / 8 + 2,
            "record iterator does not terminate"
        );
        let _ = r;
    }
    for feature in 0..40 {
        let _ = perf.has_feature(feature);
        let _ = perf.feature_section(feature);
        let _ = perf.string_feature(feature);
    }
    let _ = perf.build_ids();
    let _ = perf.cpuid();
    let streams = perf.aux_streams();
    for s in &streams.streams {
        let _ = s.label();
        let len = s.data.len() as u64;
        for off in [0, len / 2, len.saturating_sub(1), len, u64::MAX] {
            let _ = s.chunk_at(off);
            let _ = s.locate(off);
        }
        let covered: u64 = s.chunks.iter().map(|c| c.size).sum();
        assert_eq!(covered, len, "chunks do not cover the stream");
    }
    let _ = streams.loss_count();

    // Context switches and the per-CPU split: no panic; every piece of a thread's stream
    // lies inside its CPU stream, and every region is either attributed or counted.
    let switches = perf.context_switches();
    if let Some(conv) = switches.conversion {
        let schedule = Schedule::new(&switches, &conv);
        for cpu in schedule.cpus().collect::<Vec<_>>() {
            let _ = schedule.runs_during(cpu, 0, u64::MAX).count();
        }
        for t in [0, 1 << 40, u64::MAX] {
            let _ = conv.perf_time_to_tsc(conv.tsc_to_perf_time(t));
        }
    }
    let sb = PerfSideband::read(&perf);
    let source = TraceStreams::from_bytes(data).ok();
    // The exec cut (`store::exec_cut`) on every stream as it is, with the sideband's execs.
    if let Some(source) = &source {
        for s in &source.streams {
            exec_cut(&sb, switches.conversion, &s.data);
        }
    }
    if let Some(source) = &source
        && let Ok(split) = split_per_cpu(source, &switches)
    {
        let r = &split.report;
        assert_eq!(
            r.attributed + r.unattributed.len() as u64,
            r.regions,
            "regions lost by the split"
        );
        for t in &split.threads {
            for p in &t.pieces {
                assert!(p.from <= p.to && p.stream_offset <= t.stream.data.len() as u64);
            }
        }
        let _ = r.problems();
        // And on every thread of the split.
        for t in &split.threads {
            exec_cut(&sb, switches.conversion, &t.stream.data);
        }
    }

    for s in &streams.streams {
        let _ = sb.pid_for_stream(s.key.cpu, s.key.tid);
    }
    let elf = elf_path().clone();
    let remap = move |name: &str| {
        Some(if name.len().is_multiple_of(2) {
            elf.clone()
        } else {
            PathBuf::from("/nonexistent/ptrewind-fuzz")
        })
    };
    let opts = MmapOptions {
        remap: Some(&remap),
        include_data: true,
        build_ids: sb.build_id_map(),
        ..MmapOptions::default()
    };
    let out = Image::from_mmaps(&sb.mmaps, &opts);
    let _ = out.image.sections().len();
});
