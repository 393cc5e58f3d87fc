//! The client against a scripted stub (the real QEMU is driven by `tests/qemu_remote.rs`):
//! handshake, register splitting, memory chunking and fallbacks, queued stops, console output,
//! error replies.

use std::os::unix::net::UnixStream;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::wire::{Incoming, Wire};
use super::*;

const TARGET_XML: &str = r#"<?xml version="1.0"?><target><architecture>i386:x86-64</architecture><feature name="core"><reg name="rax" bitsize="64" regnum="0"/><reg name="rsp" bitsize="64"/><reg name="rip" bitsize="64"/><reg name="eflags" bitsize="32"/><reg name="fs_base" bitsize="64"/></feature></target>"#;

/// One scripted exchange: the request the stub expects (exactly) and the packets it sends back
/// (several for a stop reply racing a reply).
struct Step(&'static str, Vec<String>);

fn step(req: &'static str, replies: &[&str]) -> Step {
    Step(req, replies.iter().map(|s| s.to_string()).collect())
}

fn handshake(extra: &str) -> Vec<Step> {
    vec![
        Step(
            "qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+;xmlRegisters=i386",
            vec![format!(
                "PacketSize=40;qXfer:features:read+;multiprocess+{extra}"
            )],
        ),
        step("vCont?", &["vCont;c;C;s;S"]),
        // PacketSize 0x40: chunks of 0x30 bytes.
        Step(
            "qXfer:features:read:target.xml:0,30",
            vec![format!("m{}", &TARGET_XML[..0x30])],
        ),
        Step(
            "qXfer:features:read:target.xml:30,30",
            vec![format!("l{}", &TARGET_XML[0x30..])],
        ),
        step("?", &["T05thread:p01.10;"]),
    ]
}

/// Runs a stub that answers `script` in order and fails (panics in its thread) on anything
/// else.
fn stub(script: Vec<Step>) -> (Remote<UnixStream>, JoinHandle<()>) {
    let (a, b) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let mut w = Wire::new(b);
        let deadline = || Instant::now() + Duration::from_secs(5);
        for Step(req, replies) in script {
            let got = match w.recv(Some(deadline())).unwrap() {
                Some(Incoming::Packet(p)) => String::from_utf8(p).unwrap(),
                other => panic!("stub expected {req}, got {other:?}"),
            };
            assert_eq!(got, req, "request");
            for r in replies {
                w.send(r.as_bytes(), deadline()).unwrap();
            }
        }
    });
    let r = Remote::connect(a, RemoteOptions::default()).unwrap();
    (r, h)
}

fn with(extra: &str, rest: Vec<Step>) -> Vec<Step> {
    let mut s = handshake(extra);
    s.extend(rest);
    s
}

#[test]
fn handshake_learns_features_layout_and_initial_stop() {
    let (r, h) = stub(handshake(""));
    assert_eq!(r.features().packet_size, Some(0x40));
    assert!(r.features().multiprocess && !r.features().no_ack_mode);
    assert!(r.vcont_support().step && !r.vcont_support().range);
    assert_eq!(r.layout().by_name("rip").unwrap().regnum, 2);
    assert_eq!(
        r.initial_stop().thread(),
        Some(ThreadId {
            pid: Some(1),
            tid: 0x10
        })
    );
    h.join().unwrap();
}

#[test]
fn registers_split_by_the_description_and_p_for_the_rest() {
    let g = "0100000000000000".to_string() + "0200000000000000" + "0300000000000000" + "46020000";
    let script = with(
        "",
        vec![
            step("Hgp1.11", &["OK"]),
            Step("g", vec![g]),
            step("pf", &["E14"]),
            step("p4", &["efbeadde00000000"]),
            step("P2=0010400000000000", &["OK"]),
            step("g", &["0102"]),
        ],
    );
    let (mut r, h) = stub(script);
    let t = ThreadId {
        pid: Some(1),
        tid: 0x11,
    };
    let regs = r.read_registers(Some(t)).unwrap();
    let layout = r.layout().clone();
    assert_eq!(regs.u64(&layout, "rip"), Some(3));
    assert_eq!(regs.u64(&layout, "eflags"), Some(0x246));
    assert_eq!(regs.u64(&layout, "fs_base"), None, "not in the g reply");
    // Register 15 is not described: refused before anything is sent.
    assert!(matches!(
        r.read_register(None, "r15"),
        Err(RemoteError::Description(_))
    ));
    assert!(r.request(b"pf").is_ok_and(|e| e == b"E14"));
    assert_eq!(r.read_register_u64(None, "fs_base").unwrap(), 0xdeadbeef);
    r.write_register(None, "rip", &0x401000u64.to_le_bytes())
        .unwrap();
    assert!(r.write_register(None, "rip", &[0]).is_err(), "size checked");
    let err = r.read_registers(None).unwrap_err();
    assert!(matches!(err, RemoteError::Description(_)), "{err}");
    h.join().unwrap();
}

#[test]
fn memory_is_chunked_and_partial_reads_stop_early() {
    // PacketSize 0x40 → reads of (0x40 - 8) / 2 = 0x1c bytes.
    let script = with(
        "",
        vec![
            Step("m1000,1c", vec!["ab".repeat(0x1c)]),
            step("m101c,4", &["cdcdcdcd"]),
            step("m2000,10", &["E14"]),
            Step("m3000,1c", vec!["11".repeat(0x1c)]),
            step("m301c,1c", &["E14"]),
            step("X4000,0:", &[""]),
            step("X4000,3:ab}\x03", &[""]),
            step("M4000,3:616223", &["OK"]),
            step("M5000,1:00", &["E0e"]),
        ],
    );
    let (mut r, h) = stub(script);
    let m = r.read_memory(0x1000, 0x20).unwrap();
    assert_eq!(m.len(), 0x20);
    assert_eq!(&m[0x1c..], &[0xcd; 4]);
    assert!(matches!(
        r.read_memory(0x2000, 0x10),
        Err(RemoteError::ErrorReply { .. })
    ));
    assert_eq!(r.read_memory(0x3000, 0x40).unwrap().len(), 0x1c);
    // An X probe of zero length is what GDB sends; ours sends data directly.
    assert_eq!(r.request(b"X4000,0:").unwrap(), b"");
    r.write_memory(0x4000, b"ab#").unwrap();
    assert!(matches!(
        r.write_memory(0x5000, &[0]),
        Err(RemoteError::ErrorReply { .. })
    ));
    h.join().unwrap();
}

#[test]
fn threads_breakpoints_and_queued_stops() {
    let script = with(
        "",
        vec![
            step("qfThreadInfo", &["mp01.10,p01.11"]),
            step("qsThreadInfo", &["mp01.12"]),
            step("qsThreadInfo", &["l"]),
            step("Z0,401000,1", &["OK"]),
            step("Z2,601000,8", &[""]),
            step("z0,401000,1", &["E22"]),
            // Another thread's stop arrives before the reply to m.
            step("m601000,1", &["T02thread:p01.12;", "2a"]),
            step("vCont;s:p1.10", &["O68690a", "T05thread:p01.10;"]),
            step("vCont;c", &["W03"]),
        ],
    );
    let (mut r, h) = stub(script);
    let ts = r.threads().unwrap();
    assert_eq!(
        ts.iter().map(|t| t.tid).collect::<Vec<_>>(),
        [0x10, 0x11, 0x12]
    );
    assert!(
        r.insert_breakpoint(BreakKind::Software, 0x401000, 1)
            .unwrap()
    );
    assert!(!r.insert_breakpoint(BreakKind::Write, 0x601000, 8).unwrap());
    assert!(matches!(
        r.remove_breakpoint(BreakKind::Software, 0x401000, 1),
        Err(RemoteError::ErrorReply { .. })
    ));
    assert_eq!(r.read_memory(0x601000, 1).unwrap(), [0x2a]);
    assert_eq!(r.pending_stops(), 1);
    r.step(Some(ts[0])).unwrap();
    assert!(r.request(b"g").is_err(), "no requests while running");
    // The queued stop comes first.
    let s = r.wait(Some(Duration::from_secs(5))).unwrap().unwrap();
    assert!(matches!(s, StopReply::Signal { signal: 2, .. }));
    let s = r.wait(Some(Duration::from_secs(5))).unwrap().unwrap();
    assert_eq!(s.thread().map(|t| t.tid), Some(0x10));
    assert_eq!(r.take_output(), (b"hi\n".to_vec(), 0));
    r.cont().unwrap();
    assert_eq!(
        r.wait(Some(Duration::from_secs(5))).unwrap(),
        Some(StopReply::Exited {
            status: 3,
            pid: None
        })
    );
    h.join().unwrap();
    // The stub is gone: the connection's end is a disconnect error, not a hang or a panic.
    let err = r.request(b"g").unwrap_err();
    assert!(err.is_disconnect(), "{err}");
}

#[test]
fn wait_times_out_while_running_then_gets_the_stop() {
    let (a, b) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let mut w = Wire::new(b);
        let dl = || Instant::now() + Duration::from_secs(5);
        let mut script = handshake("").into_iter();
        loop {
            let Some(Incoming::Packet(p)) = w.recv(Some(dl())).unwrap() else {
                panic!()
            };
            if p == b"vCont;c" {
                break;
            }
            let Step(req, replies) = script.next().unwrap();
            assert_eq!(p, req.as_bytes());
            for r in replies {
                w.send(r.as_bytes(), dl()).unwrap();
            }
        }
        std::thread::sleep(Duration::from_millis(150));
        w.send(b"T0bthread:p01.10;", dl()).unwrap();
    });
    let mut r = Remote::connect(a, RemoteOptions::default()).unwrap();
    r.cont().unwrap();
    assert!(r.is_running());
    assert_eq!(r.wait(Some(Duration::from_millis(20))).unwrap(), None);
    let s = r.wait(None).unwrap().unwrap();
    assert!(matches!(s, StopReply::Signal { signal: 11, .. }));
    assert!(!r.is_running());
    h.join().unwrap();
}

#[test]
fn odd_replies_are_errors_not_panics() {
    let script = with(
        "",
        vec![
            step("g", &["zz"]),
            step("m0,1", &["0"]),
            step("m0,1", &["0102"]),
            step("qfThreadInfo", &["x"]),
            step("qC", &["nonsense"]),
            step("Z0,0,1", &["maybe"]),
        ],
    );
    let (mut r, h) = stub(script);
    assert!(r.read_registers(None).is_err());
    assert!(r.read_memory(0, 1).is_err());
    assert!(r.read_memory(0, 1).is_err(), "longer than asked");
    assert!(r.threads().is_err());
    assert!(r.current_thread().is_err());
    assert!(r.insert_breakpoint(BreakKind::Software, 0, 1).is_err());
    h.join().unwrap();
}

#[test]
fn handshake_refuses_a_stub_without_x86_64_registers() {
    let (a, b) = UnixStream::pair().unwrap();
    let h = std::thread::spawn(move || {
        let mut w = Wire::new(b);
        let dl = || Instant::now() + Duration::from_secs(5);
        for (req, rep) in [
            (
                &b"qSupported:multiprocess+;swbreak+;hwbreak+;vContSupported+;xmlRegisters=i386"[..],
                &b"qXfer:features:read+"[..],
            ),
            (b"vCont?", b""),
            (
                b"qXfer:features:read:target.xml:0,180",
                b"l<target><reg name=\"pc\" bitsize=\"32\"/></target>",
            ),
        ] {
            let Some(Incoming::Packet(p)) = w.recv(Some(dl())).unwrap() else {
                panic!()
            };
            assert_eq!(p, req);
            w.send(rep, dl()).unwrap();
        }
    });
    let err = Remote::connect(a, RemoteOptions::default()).unwrap_err();
    assert!(err.to_string().contains("not an x86-64"), "{err}");
    h.join().unwrap();
}

/// `Hg` is sent only when the stub's current thread is not already the one asked for: a stop
/// reply makes its thread current (as QEMU's `gdb_handlesig` does), and so does an `Hg`.
#[test]
fn hg_only_when_the_current_thread_changes() {
    let g = "0100000000000000".to_string() + "0200000000000000" + "0300000000000000" + "46020000";
    let script = with(
        "",
        vec![
            // Nothing known after the handshake: `Hg` first.
            step("Hgp1.10", &["OK"]),
            Step("g", vec![g.clone()]),
            step("vCont;s:p1.10", &["T05thread:p01.10;"]),
            Step("g", vec![g.clone()]),
            step("p2", &["0300000000000000"]),
            step("Hgp1.11", &["OK"]),
            Step("g", vec![g.clone()]),
            Step("g", vec![g.clone()]),
            // Another thread's stop while thread 0x11 is current: it becomes current.
            step("vCont;c", &["T05thread:p01.12;"]),
            Step("g", vec![g.clone()]),
            step("Hgp1.11", &["OK"]),
            Step("g", vec![g]),
        ],
    );
    let (mut r, h) = stub(script);
    let t = |tid| ThreadId { pid: Some(1), tid };
    r.read_registers(Some(t(0x10))).unwrap();
    r.step(Some(t(0x10))).unwrap();
    r.wait(Some(Duration::from_secs(5))).unwrap().unwrap();
    r.read_registers(Some(t(0x10))).unwrap();
    assert_eq!(r.read_register_u64(Some(t(0x10)), "rip").unwrap(), 3);
    r.read_registers(Some(t(0x11))).unwrap();
    r.read_registers(Some(t(0x11))).unwrap();
    r.cont().unwrap();
    r.wait(Some(Duration::from_secs(5))).unwrap().unwrap();
    r.read_registers(Some(t(0x12))).unwrap();
    r.read_registers(Some(t(0x11))).unwrap();
    h.join().unwrap();
}
