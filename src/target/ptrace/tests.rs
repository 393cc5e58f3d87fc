//! Tests of the ptrace target on real processes.

use super::*;

fn spawn(prog: &str, args: &[&str]) -> PtraceTarget {
    let args: Vec<OsString> = args.iter().map(OsString::from).collect();
    PtraceTarget::spawn(&OsString::from(prog), &args, &SpawnOptions::default()).unwrap()
}

#[test]
fn spawn_step_read_and_exit() {
    let mut t = spawn("/bin/sh", &["-c", "exit 7"]);
    let regs = t.read_registers().unwrap();
    let pc = regs.pc();
    // Code at the PC is readable, and reading via /proc/PID/mem matches process_vm_readv.
    let mut code = [0u8; 16];
    assert_eq!(t.read_memory(pc, &mut code).unwrap(), 16);
    let mut check = [0u8; 16];
    let local = [std::io::IoSliceMut::new(&mut check)];
    let remote = [nix::sys::uio::RemoteIoVec {
        base: pc as usize,
        len: 16,
    }];
    let mut local = local;
    nix::sys::uio::process_vm_readv(t.pid, &mut local, &remote).unwrap();
    assert_eq!(code, check);
    // Unmapped memory is an error, not garbage.
    assert!(matches!(
        t.read_memory(8, &mut code),
        Err(TargetError::Memory { addr: 8 })
    ));
    assert!(regs.xsave.len() >= 512);
    if super::super::regs::avx_enabled() {
        assert!(
            regs.has_avx(),
            "xcr0={:#x} len={}",
            regs.xcr0(),
            regs.xsave.len()
        );
    }
    // One step moves the PC.
    assert_eq!(t.single_step(None).unwrap(), StopEvent::Step);
    assert_ne!(t.read_registers().unwrap().pc(), pc);
    t.cont(None).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Exited(7)));
    assert!(t.has_exited());
    assert!(t.read_registers().is_err());
}

#[test]
fn partial_read_at_the_end_of_a_mapping() {
    let t = spawn("/bin/true", &[]);
    let maps = crate::target::read_maps(t.pid()).unwrap();
    // A mapping whose end is not the start of another one: the next page is unmapped.
    let end = maps
        .iter()
        .map(|m| m.end)
        .find(|&end| !maps.iter().any(|m| m.start <= end && end < m.end))
        .expect("a mapping followed by a hole");
    let mut buf = [0u8; 16];
    assert_eq!(t.read_memory(end - 8, &mut buf).unwrap(), 8);
    assert!(
        matches!(t.read_memory(end, &mut buf), Err(TargetError::Memory { addr }) if addr == end)
    );
}

#[test]
fn breakpoint_hit_and_step_over() {
    let mut t = spawn("/bin/true", &[]);
    let pc = t.read_registers().unwrap().pc();
    // Find the address reached after a few steps, put a breakpoint there, restart a
    // fresh process and run to it.
    let mut addrs = vec![pc];
    for _ in 0..5 {
        assert_eq!(t.single_step(None).unwrap(), StopEvent::Step);
        addrs.push(t.read_registers().unwrap().pc());
    }
    drop(t);
    let mut t = spawn("/bin/true", &[]);
    let target_pc = addrs[5];
    t.add_breakpoint(target_pc).unwrap();
    let mut orig = [0u8; 1];
    t.read_memory(target_pc, &mut orig).unwrap();
    t.cont(None).unwrap();
    assert_eq!(
        t.wait(true).unwrap(),
        Some(StopEvent::Breakpoint { pc: target_pc })
    );
    assert_eq!(t.read_registers().unwrap().pc(), target_pc);
    // While stopped, memory shows the original byte, not int3.
    let mut now = [0u8; 1];
    t.read_memory(target_pc, &mut now).unwrap();
    assert_eq!(now, orig);
    // Continuing steps over the breakpoint and runs to the end.
    t.cont(None).unwrap();
    assert_eq!(t.wait(true).unwrap(), Some(StopEvent::Exited(0)));
}
