//! The timeline over a live hardware-style capture, with a simulated CPU: the perf backend's
//! AUX pipeline and INT3 breakpoints, stops that wait for the drain, stop registers keyed
//! through the index, the past served PC-only.

use std::time::Duration;

use super::Timeline;
use crate::capture::perf::{AuxSink, DrainSource, PerfCapture, PerfPtError, PtSource};
use crate::ring::aux::AuxStats;
use crate::target::{PtraceTarget, StopEvent};

/// A "CPU" for straight-line code, standing in for Intel PT behind [`PerfCapture`]: each
/// drain on the tracer thread (at a stop) reads the tracee's PC and encodes what a CPU
/// tracing it would have written since the previous stop — PSB+, TIP.PGE at the previous PC,
/// FUP + TIP.PGD at the current one. On the drainer thread (not the tracer) the registers
/// cannot be read and nothing is produced, like an AUX area the CPU has not flushed yet.
struct StraightLineCpu {
    pid: nix::unistd::Pid,
    last: u64,
}

impl DrainSource for StraightLineCpu {
    fn drain_once(&mut self, sink: &mut dyn AuxSink) -> Result<u64, PerfPtError> {
        use crate::packet::Packet;
        use crate::packet::{Encoder, IpKind};
        let Ok(regs) = nix::sys::ptrace::getregs(self.pid) else {
            return Ok(0);
        };
        if regs.rip == self.last {
            return Ok(0);
        }
        let mut enc = Encoder::new();
        let mut out = Vec::new();
        enc.psb(&mut out);
        let mode = Packet::ModeExec {
            csl: true,
            csd: false,
            iflag: false,
        };
        enc.packet(&mode, &mut out).unwrap();
        enc.packet(&Packet::PsbEnd, &mut out).unwrap();
        enc.ip_packet(IpKind::TipPge, Some(self.last), &mut out)
            .unwrap();
        enc.ip_packet(IpKind::Fup, Some(regs.rip), &mut out)
            .unwrap();
        enc.ip_packet(IpKind::TipPgd, None, &mut out).unwrap();
        sink.trace(1, &out);
        self.last = regs.rip;
        Ok(out.len() as u64)
    }
    fn wait_ready(&self, period: Duration) {
        std::thread::sleep(period);
    }
}

impl PtSource for StraightLineCpu {
    fn set_tracing(&mut self, _on: bool) -> Result<(), PerfPtError> {
        Ok(())
    }
    fn aux_stats(&self) -> AuxStats {
        AuxStats::default()
    }
}

/// A timeline over the simulated hardware capture of a program of 30 NOPs and an `exit`,
/// stopped at its first instruction: the timeline, its directory, the start registers.
fn straight_line_timeline(
    name: &str,
) -> (Timeline, std::path::PathBuf, crate::target::X86Registers) {
    use crate::target::{SpawnOptions, Target};
    let dir = std::env::temp_dir().join(format!("ptrewind-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("straight.S");
    let exe = dir.join("straight");
    std::fs::write(
        &src,
        ".globl _start\n_start:\n.rept 30\nnop\n.endr\nmov $60, %eax\nxor %edi, %edi\nsyscall\n",
    )
    .unwrap();
    let ok = std::process::Command::new("cc")
        .args(["-nostdlib", "-static", "-no-pie", "-o"])
        .arg(&exe)
        .arg(&src)
        .status()
        .unwrap()
        .success();
    assert!(ok, "cc failed");
    let mut ptrace =
        PtraceTarget::spawn(&exe.clone().into_os_string(), &[], &SpawnOptions::default()).unwrap();
    let start_regs = ptrace.read_registers().unwrap();
    let cpu = StraightLineCpu {
        pid: nix::unistd::Pid::from_raw(Target::pid(&ptrace)),
        last: start_regs.pc(),
    };
    let capture = PerfCapture::with_source(ptrace, cpu);
    (
        Timeline::live(Box::new(capture), true).unwrap(),
        dir,
        start_regs,
    )
}

/// The hardware capture drives a live process at full speed with INT3 breakpoints; the
/// stops wait for the drain, the history indexes it, the stops' registers are keyed at
/// their positions through the index, and the past is served PC-only.
#[test]
fn hardware_capture_serves_a_live_process_pc_only() {
    use crate::target::{RegMask, Resume, ReverseResume};
    let (mut t, dir, start_regs) = straight_line_timeline("hwcap");
    let start = start_regs.pc();
    let run = |t: &mut Timeline, how: Resume| {
        t.resume(how).unwrap();
        t.wait(true).unwrap().unwrap()
    };
    t.add_breakpoint(start + 10).unwrap();
    t.add_breakpoint(start + 20).unwrap();
    assert_eq!(
        run(&mut t, Resume::Continue { signal: None }),
        StopEvent::Breakpoint { pc: start + 10 }
    );
    assert_eq!(
        run(
            &mut t,
            Resume::Step {
                signal: None,
                others: false,
            }
        ),
        StopEvent::Step
    );
    let at_11 = t.read_registers().unwrap();
    assert_eq!(at_11.pc(), start + 11);
    assert_eq!(
        run(&mut t, Resume::Continue { signal: None }),
        StopEvent::Breakpoint { pc: start + 20 }
    );
    assert_eq!(t.ensure_indexed(Duration::from_secs(10)), Ok(20));

    // One instruction back: only RIP is known there.
    t.reverse(ReverseResume::Step).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Step));
    let past = t.read_registers().unwrap();
    assert_eq!(past.pc(), start + 19);
    assert_eq!(past.unavailable, RegMask::ALL_BUT_PC);
    // Code is read from the image; the stack is refused.
    let mut byte = [0u8; 1];
    assert_eq!(t.read_memory(start + 19, &mut byte).unwrap(), 1);
    assert_eq!(byte, [0x90]);
    let mut word = [0u8; 8];
    assert!(matches!(
        t.read_memory(start_regs.sp(), &mut word),
        Err(crate::target::TargetError::Memory { .. })
    ));
    // The stops' registers: the step at 11, and the start at 0, in full.
    for (n, want) in [(11, &at_11), (0, &start_regs)] {
        t.goto(n).unwrap();
        let r = t.read_registers().unwrap();
        assert_eq!(r.unavailable, RegMask::NONE, "position {n}");
        assert_eq!(r.gprs, want.gprs, "position {n}");
    }
    // Back to the breakpoint instance at 10 from 19, then forward to the present.
    t.goto(19).unwrap();
    t.reverse(ReverseResume::Continue).unwrap();
    assert_eq!(
        t.wait(true).unwrap(),
        Some(StopEvent::Breakpoint { pc: start + 10 })
    );
    assert_eq!(t.read_registers().unwrap().unavailable, RegMask::NONE);
    assert_eq!(
        run(&mut t, Resume::Continue { signal: None }),
        StopEvent::HistoryEnd { at_begin: false }
    );
    let live = t.read_registers().unwrap();
    assert_eq!((live.pc(), live.unavailable), (start + 20, RegMask::NONE));
    let mut stats = String::new();
    t.stats(&mut |k: &str, v: String| stats.push_str(&format!("{k:<24} {v}\n")));
    assert!(stats.contains("pt (hardware"), "{stats}");
    assert!(stats.contains("stop trace problems      0"), "{stats}");
    t.kill().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A range step (GDB's `vCont;r`) is one stop where the PC leaves the range or reaches a
/// breakpoint, at the present (the backend's steps, the trace synced once) and in the past
/// (the history's steps); a range step cut short by the debugger's interrupt stops with
/// `SIGINT`.
#[test]
fn a_range_step_stops_once_where_the_pc_leaves_the_range() {
    use crate::target::regs::gpr;
    use crate::target::{RegMask, Resume, ReverseResume, StepRange};
    let (mut t, dir, start_regs) = straight_line_timeline("rangestep");
    let start = start_regs.pc();
    let step = Resume::Step {
        signal: None,
        others: true,
    };
    let range = |from: u64, to: u64| StepRange {
        start: start + from,
        end: start + to,
    };
    let range_steps = |t: &mut Timeline| {
        let mut stats = String::new();
        t.stats(&mut |k: &str, v: String| stats.push_str(&format!("{k:<24} {v}\n")));
        stats
            .lines()
            .find(|l| l.starts_with("range steps"))
            .map(str::to_string)
            .unwrap_or_default()
    };
    // At the present: from 0 to the end of [0, 12).
    t.resume_range(step, range(0, 12)).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Step));
    assert_eq!(t.read_registers().unwrap().pc(), start + 12);
    assert!(
        range_steps(&mut t).contains(" 1 (12 instructions"),
        "{}",
        range_steps(&mut t)
    );
    // The trace was synced at that one stop only, and covers every step.
    assert_eq!(t.ensure_indexed(Duration::from_secs(10)), Ok(12));
    // The past is PC-only, yet each step's complete register file is served at its position
    // (GDB's frame checks in a reverse-next read the stack pointer there).
    assert!(
        range_steps(&mut t).ends_with("kept at 11 of their steps, 0 not placed)"),
        "{}",
        range_steps(&mut t)
    );
    t.goto(5).unwrap();
    let past = t.read_registers().unwrap();
    assert_eq!((past.pc(), past.unavailable), (start + 5, RegMask::NONE));
    assert_eq!(past.gprs[gpr::RSP], start_regs.gprs[gpr::RSP]);
    t.goto(12).unwrap();
    // A breakpoint inside the range ends it there (reported as the step onto it).
    t.add_breakpoint(start + 16).unwrap();
    t.resume_range(step, range(12, 20)).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Step));
    assert_eq!(t.read_registers().unwrap().pc(), start + 16);
    // A range the PC is not in: one step.
    t.resume_range(step, range(0, 10)).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Step));
    assert_eq!(t.read_registers().unwrap().pc(), start + 17);
    assert_eq!(t.ensure_indexed(Duration::from_secs(10)), Ok(17));

    // In the past: back to the start, then through the history to the breakpoint.
    t.remove_breakpoint(start + 16).unwrap();
    t.goto(0).unwrap();
    t.resume_range(step, range(0, 9)).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Step));
    assert_eq!(t.position(), 9);
    assert_eq!(t.read_registers().unwrap().pc(), start + 9);
    // From the past onto the present and on, live, to the range's end.
    t.resume_range(step, range(9, 22)).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Step));
    assert_eq!(t.read_registers().unwrap().pc(), start + 22);
    assert!(!t.is_replaying());
    // The debugger's interrupt: the range step ends at the next step, as `SIGINT`.
    t.resume_range(step, range(22, 30)).unwrap();
    t.interrupt().unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Signal(libc::SIGINT)));
    assert_eq!(t.read_registers().unwrap().pc(), start + 23);
    // A reverse step after it is an ordinary one.
    t.reverse(ReverseResume::Step).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Step));
    assert_eq!(t.read_registers().unwrap().pc(), start + 22);
    assert!(
        range_steps(&mut t).starts_with("range steps              6 ("),
        "{}",
        range_steps(&mut t)
    );
    t.kill().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}
