//! Fuzzes the GDB remote-protocol side of the server with arbitrary bytes from "GDB":
//!
//! * the pure parsers: `Framer` (`$…#xx`, acks, 0x03, oversized packets), `check_packet`,
//!   `normalize_qsupported`, `rsp::{unescape, hex_decode, parse_hex_u64, parse_thread_id,
//!   parse_qxfer_read, qxfer_chunk}`, `btrace::resolve_thread`;
//! * the btrace (`Qbtrace*`, `qXfer:btrace*`) and `jLLDBTrace*` servers on every framed packet,
//!   over a fixed in-memory trace;
//! * a whole `Router` serving the bytes over a loopback TCP connection to a fake in-memory
//!   target (no ptrace): gdbstub's state machine, the router's interceptors, `qSupported`
//!   rewriting, `qRcmd` monitor commands, no-ack mode, the resume checks (threads, signals),
//!   and with `OnDisconnect::Keep` a second connection after the first one ends.
//!
//! Checked: no panic, no hang, and the session never ends with a protocol error (a malformed
//! packet must get an error reply, not end the debugging session).
//!
//! Run: `cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run rsp $PWD/corpus/rsp -- -max_len=4096 -max_total_time=180 -timeout=10`
//! (seeds: see docs/fuzzing.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ptrewind::target::regs::zeroed_gprs;
use ptrewind::server::btrace::{BtraceServer, FixedTraceProvider, resolve_thread};
use ptrewind::server::lldb_trace::LldbTraceServer;
use ptrewind::server::router::{Frame, Framer, check_packet, normalize_qsupported};
use ptrewind::server::{OnDisconnect, Router, ServeOutcome, ServerError, GdbStubAdapter, rsp};
use ptrewind::target::{Resume, StopEvent, Target, TargetError, TargetResult, X86Registers};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::OnceLock;

const PID: i32 = 4242;

/// A stopped process with 64 KiB of memory at 0x400000 that single-steps by one byte.
struct FakeTarget {
    regs: X86Registers,
    mem: Vec<u8>,
    running: bool,
    exited: bool,
}

impl FakeTarget {
    fn new() -> Self {
        let mut r = zeroed_gprs();
        r.rip = 0x400000;
        r.rsp = 0x40f000;
        FakeTarget {
            regs: X86Registers::from_parts(&r, vec![0; 576]),
            mem: (0..0x10000u32).map(|i| i as u8).collect(),
            running: false,
            exited: false,
        }
    }
}

impl Target for FakeTarget {
    fn pid(&self) -> i32 {
        PID
    }
    fn exec_path(&self) -> Option<PathBuf> {
        Some(PathBuf::from("/fuzz/fake"))
    }
    fn read_registers(&mut self) -> TargetResult<X86Registers> {
        Ok(self.regs.clone())
    }
    fn write_registers(&mut self, regs: &X86Registers) -> TargetResult<()> {
        self.regs = regs.clone();
        Ok(())
    }
    fn read_memory(&self, addr: u64, buf: &mut [u8]) -> TargetResult<usize> {
        let start = addr
            .checked_sub(0x400000)
            .ok_or(TargetError::Memory { addr })? as usize;
        let avail = self.mem.get(start..).ok_or(TargetError::Memory { addr })?;
        let n = buf.len().min(avail.len());
        buf[..n].copy_from_slice(&avail[..n]);
        Ok(n)
    }
    fn write_memory(&mut self, addr: u64, data: &[u8]) -> TargetResult<()> {
        let start = addr
            .checked_sub(0x400000)
            .ok_or(TargetError::Memory { addr })? as usize;
        let end = start
            .checked_add(data.len())
            .ok_or(TargetError::Memory { addr })?;
        self.mem
            .get_mut(start..end)
            .ok_or(TargetError::Memory { addr })?
            .copy_from_slice(data);
        Ok(())
    }
    fn resume(&mut self, _how: Resume) -> TargetResult<()> {
        if self.exited {
            return Err(TargetError::Exited { pid: PID });
        }
        self.running = true;
        Ok(())
    }
    fn wait(&mut self, _block: bool) -> TargetResult<Option<StopEvent>> {
        if !self.running {
            return Ok(None);
        }
        self.running = false;
        let r = &mut self.regs.gprs[ptrewind::target::regs::gpr::RIP];
        *r = r.wrapping_add(1);
        Ok(Some(StopEvent::Step))
    }
    fn interrupt(&mut self) -> TargetResult<()> {
        Ok(())
    }
    fn kill(&mut self) -> TargetResult<()> {
        self.exited = true;
        Ok(())
    }
    fn detach(&mut self) -> TargetResult<()> {
        self.exited = true;
        Ok(())
    }
    fn has_exited(&self) -> bool {
        self.exited
    }
}

fn listener() -> &'static TcpListener {
    static L: OnceLock<TcpListener> = OnceLock::new();
    L.get_or_init(|| TcpListener::bind("127.0.0.1:0").expect("bind loopback"))
}

/// The pure parsers, on every framed packet.
fn parsers(data: &[u8]) {
    let trace = [
        0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02, 0x82, 0x02,
        0x82, 0x02, 0x23, 0x00,
    ];
    let mut provider = FixedTraceProvider::new(ptrewind::server::btrace::PtCpu::SOFTWARE);
    provider.set_trace(PID as u32, trace.to_vec());
    let mut btrace = BtraceServer::new();
    let mut lldb = LldbTraceServer::new();
    let mut framer = Framer::new(1024);
    for &b in data {
        let Some(frame) = framer.push(b) else {
            continue;
        };
        let Frame::Packet(body) = frame else { continue };
        let _ = normalize_qsupported(&body);
        let _ = check_packet(&body, false);
        let _ = check_packet(&body, true);
        let plain = rsp::unescape(&body);
        let _ = rsp::hex_decode(&plain);
        let _ = rsp::parse_hex_u64(&plain);
        let _ = rsp::parse_thread_id(&plain);
        if let Ok(q) = rsp::parse_qxfer_read(&plain) {
            let _ = rsp::qxfer_chunk(&plain, q.offset, q.length);
        }
        let text = String::from_utf8_lossy(&plain);
        let thread = resolve_thread(Some(&text), PID as u32, |t| t == PID as u32);
        let _ = btrace.handle(&plain, thread, &mut provider);
        let _ = btrace.handle(&plain, Ok(PID as u32), &mut provider);
        let _ = lldb.handle(&plain, &[PID as u32], &mut provider);
    }
}

/// With an odd first byte the rest is a list of packet bodies separated by `\n`, each framed
/// with a correct checksum (and acked), so that mutations reach the packet parsers instead of
/// dying at the checksum; otherwise the input is the raw byte stream.
fn wire_bytes(data: &[u8]) -> Vec<u8> {
    match data.split_first() {
        Some((&mode, rest)) if mode & 1 == 1 => {
            let mut out = Vec::new();
            for body in rest.split(|&b| b == b'\n') {
                out.extend_from_slice(&rsp::encode_packet(body));
                out.push(b'+');
            }
            out
        }
        _ => data.to_vec(),
    }
}

/// Serves `input` as one connection's bytes from "GDB" (our side closed after it) and drains
/// the replies.
fn serve_bytes(
    router: &mut Router,
    session: &mut GdbStubAdapter,
    input: Vec<u8>,
) -> Result<ServeOutcome, ServerError> {
    let mut client = TcpStream::connect(listener().local_addr().unwrap()).unwrap();
    let (server, _) = listener().accept().unwrap();
    let writer = {
        let mut c = client.try_clone().unwrap();
        std::thread::spawn(move || {
            let _ = c.write_all(&input);
            let _ = c.shutdown(std::net::Shutdown::Write);
        })
    };
    let drain = std::thread::spawn(move || {
        let mut sink = Vec::new();
        let _ = client.read_to_end(&mut sink);
    });
    let outcome = router.serve(server, session);
    let _ = writer.join();
    let _ = drain.join();
    outcome
}

fuzz_target!(|data: &[u8]| {
    let data = &wire_bytes(data)[..];
    parsers(data);

    // The whole router over loopback. Inputs of even length use `OnDisconnect::Keep`: when the
    // connection ends with the program kept, a second connection (a debugger reconnecting)
    // must be served from a clean state, wherever the first one stopped (mid-packet included).
    let mut session = GdbStubAdapter::new(Box::new(FakeTarget::new()));
    let mut router = Router::default();
    let keep = data.len() % 2 == 0;
    if keep {
        router.set_on_disconnect(OnDisconnect::Keep);
    }
    let outcome = serve_bytes(&mut router, &mut session, data.to_vec());
    if let Err(ServerError::Protocol(msg)) = &outcome {
        panic!("the session ended with a protocol error: {msg}");
    }
    if keep && matches!(outcome, Ok(ServeOutcome::Kept)) {
        let again = b"+$qSupported:multiprocess+#c6+$?#3f+$g#67+$k#6b".to_vec();
        let outcome = serve_bytes(&mut router, &mut session, again);
        if let Err(ServerError::Protocol(msg)) = &outcome {
            panic!("the reconnected session ended with a protocol error: {msg}");
        }
    }
});
