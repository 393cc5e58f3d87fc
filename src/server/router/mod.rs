//! The packet router: our own connection loop in front of gdbstub's state machine, in three
//! parts besides the loop here: `framing` (bytes ⇄ frames, both ways), `precheck` (what
//! gdbstub would reject fatally, answered with a typed [`Refusal`]) and `lldb` (LLDB's
//! packets); `threads_xfer` serves the thread list as one `qXfer` document, `siginfo_xfer` the
//! signal a thread stopped with.
//!
//! Every byte from GDB goes through a [`Framer`] first. Complete packets are then
//!
//! 1. offered to the registered interceptors ([`Router::intercept`]), by prefix; an
//!    interceptor may answer the packet itself (gdbstub never sees it) or pass it on;
//! 2. checked for the syntax gdbstub would reject *fatally* (a malformed `m`, `Z`, `H`, ...
//!    ends a gdbstub session), and answered with `E01` if malformed;
//! 3. fed to gdbstub. The reply to `qSupported` is rewritten on its way out to add the
//!    features registered with [`Router::add_qsupported_feature`].
//!
//! Bad checksums are answered with `-` (GDB retransmits), a `-` from GDB makes us resend our
//! last packet, oversized packets are discarded and answered with `E01`. The router tracks
//! what later extensions need but gdbstub keeps private: the general thread (`Hg`), no-ack
//! mode, and the features GDB announced in `qSupported`.

mod forks;
mod framing;
mod lldb;
mod precheck;
mod siginfo_xfer;
mod threads_xfer;

pub use framing::{Frame, Framer, RouterConn};
pub use lldb::memory_region_info;
pub use precheck::{Check, Refusal, check_packet, normalize_qsupported};

use super::ServerError;
use super::adapter::{GdbStubAdapter, stop_reason};
use super::arch::GdbRegId;
use super::rsp::frame;
pub use super::rsp::{encode_packet, unescape};
use crate::target::regs::gpr;
use crate::target::{Notice, StopEvent};
use gdbstub::stub::state_machine::GdbStubStateMachine;
use gdbstub::stub::{DisconnectReason, GdbStubBuilder, MultiThreadStopReason};
use precheck::{check_threads_and_signals, resume_all_selected};
use std::io::Read;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// Default maximum packet size (advertised as `PacketSize`): large enough for a full `g`
/// reply with AVX and for paging trace data.
pub const DEFAULT_PACKET_SIZE: usize = 0x4000;

/// What an interceptor decided about a packet.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Intercept {
    /// Let gdbstub handle the packet.
    Pass,
    /// Answer with this reply body (binary allowed: the router escapes `$ # } *`).
    Reply(Vec<u8>),
}

/// Protocol state the router tracks for interceptors.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RouterState {
    /// The thread id text of the last `Hg` packet (e.g. `p1234.1234`, `0`, `-1`); `None` after
    /// a stop reply, which makes the stopped thread the general one.
    pub general_thread: Option<String>,
    /// The thread id text of the last `Hc` packet.
    pub continue_thread: Option<String>,
    /// The thread GDB has selected as far as its packets say, for a reverse step that names
    /// none (`bs` after a wildcard `Hc`): the last `Hg` naming one thread; `None` after a stop
    /// GDB shows (the stop's thread is then its selected one), but kept across the stop of a
    /// step of a thread GDB named itself (`Hc` + `bs`: its step of another thread off a
    /// breakpoint before resuming the whole process, after which it sends no `Hg` again).
    pub selected_thread: Option<String>,
    /// The last resume was a reverse step of a thread GDB named (`Hc` naming one, then `bs`).
    named_step: bool,
    /// The features GDB sent in its `qSupported` packet.
    pub client_features: Vec<String>,
    /// The client asked for the thread list in every stop reply (`QListThreadsInStopReply`,
    /// LLDB): each `T` stop reply then carries `threads:` (and `thread-pcs:` for one thread),
    /// and LLDB asks no `qfThreadInfo`/`qsThreadInfo` after it.
    pub threads_in_stop_reply: bool,
    /// The client names the thread of its register packets in a `;thread:TID;` suffix instead
    /// of a `Hg` before them (`QThreadSuffixSupported`, LLDB).
    pub thread_suffix: bool,
}

/// An interceptor: gets the session, the router state and the packet body (with `}` escapes
/// undone).
pub type PacketHandler = Box<dyn FnMut(&mut GdbStubAdapter, &RouterState, &[u8]) -> Intercept>;

/// How a served session ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ServeOutcome {
    /// The program exited with this status.
    Exited(i32),
    /// The program was killed by this (Linux) signal.
    Killed(i32),
    /// GDB detached; the program runs on untraced.
    Detached,
    /// GDB killed the program (`kill`).
    KilledByDebugger,
    /// GDB closed the connection; a program we started was killed, an attached one detached
    /// ([`OnDisconnect::End`]).
    ConnectionClosed,
    /// GDB closed the connection and the program and its recording were kept, stopped, for
    /// the next debugger ([`OnDisconnect::Keep`]; call [`Router::serve`] again).
    Kept,
}

/// What happens to the program when the debugger's connection closes without `detach` or
/// `kill` (GDB crashed, `disconnect`, the network went away).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OnDisconnect {
    /// Kill a program we started, detach from an attached one; the session is over.
    #[default]
    End,
    /// Stop the program (if it runs) and keep it and its recording, so that a debugger can
    /// connect again (like gdbserver without `--once`).
    Keep,
}

/// Receives target notices (e.g. to print them on the CLI's stderr).
pub type NoticeSink = Box<dyn FnMut(&Notice)>;

type Sm<'a> = GdbStubStateMachine<'a, GdbStubAdapter, RouterConn>;

fn conn<'s>(sm: &'s mut Sm<'_>) -> &'s mut RouterConn {
    match sm {
        GdbStubStateMachine::Idle(s) => s.borrow_conn(),
        GdbStubStateMachine::Running(s) => s.borrow_conn(),
        GdbStubStateMachine::CtrlCInterrupt(s) => s.borrow_conn(),
        GdbStubStateMachine::Disconnected(s) => s.borrow_conn(),
    }
}

fn gs_err<E: std::fmt::Display>(e: E) -> ServerError {
    ServerError::Protocol(e.to_string())
}

/// The packet router and connection loop. Configure it, then call [`Router::serve`].
pub struct Router {
    handlers: Vec<(Vec<u8>, PacketHandler)>,
    features: Vec<String>,
    packet_size: usize,
    state: RouterState,
    framer: Framer,
    notice_sink: Option<NoticeSink>,
    on_disconnect: OnDisconnect,
    /// Whether the program runs (gdbstub's `Running` state, until its stop was taken): what a
    /// connection lost mid-write must stop.
    running: bool,
    /// How long to poll for the debugger's next packet before blocking (see
    /// [`Router::set_poll_window`]).
    poll_window: Duration,
}

impl std::fmt::Debug for Router {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Router")
            .field(
                "intercepts",
                &self
                    .handlers
                    .iter()
                    .map(|(p, _)| String::from_utf8_lossy(p))
                    .collect::<Vec<_>>(),
            )
            .field("features", &self.features)
            .field("packet_size", &self.packet_size)
            .field("state", &self.state)
            .field("on_disconnect", &self.on_disconnect)
            .finish()
    }
}

impl Default for Router {
    fn default() -> Self {
        Self::new(DEFAULT_PACKET_SIZE)
    }
}

impl Router {
    /// A router whose gdbstub uses a packet buffer of `packet_size` bytes.
    pub fn new(packet_size: usize) -> Self {
        let packet_size = packet_size.max(1024);
        let mut router = Router {
            handlers: Vec::new(),
            features: Vec::new(),
            packet_size,
            state: RouterState::default(),
            // Room for "$", "#xx" and the slack gdbstub needs in its own buffer.
            framer: Framer::new(packet_size - 8),
            notice_sink: None,
            on_disconnect: OnDisconnect::default(),
            running: false,
            poll_window: default_poll_window(),
        };
        lldb::register(&mut router);
        threads_xfer::register(&mut router);
        siginfo_xfer::register(&mut router);
        forks::register(&mut router);
        router
    }

    /// After each reply, keeps checking for the debugger's next packet for up to `window`
    /// (yielding the CPU in between) before blocking in `read`. A debugger sends its packets
    /// in bursts (three per reverse-stepi from GDB: the step, the registers, the thread list),
    /// each a short computation after the previous reply. A server that blocks at once lets
    /// its CPU go idle, and waking it again costs more than the server's own work: on an idle
    /// 2-vCPU VM, GDB's reverse-stepi took 0.25–0.27 ms with no window and 0.11–0.13 ms with
    /// 1 ms (docs/benchmarks.md). Zero blocks at once. The default is 1 ms with two CPUs or
    /// more and zero with one, where polling would only take the CPU from the debugger.
    pub fn set_poll_window(&mut self, window: Duration) {
        self.poll_window = window;
    }

    /// Answers packets starting with `prefix` (after un-escaping) with `handler` before
    /// gdbstub sees them. The first matching handler that does not [`Intercept::Pass`] wins.
    pub fn intercept(
        &mut self,
        prefix: &[u8],
        handler: impl FnMut(&mut GdbStubAdapter, &RouterState, &[u8]) -> Intercept + 'static,
    ) {
        self.handlers.push((prefix.to_vec(), Box::new(handler)));
    }

    /// Appends `feature` (e.g. `Qbtrace:pt+`) to gdbstub's `qSupported` reply.
    pub fn add_qsupported_feature(&mut self, feature: impl Into<String>) {
        self.features.push(feature.into());
    }

    /// Called with every [`Notice`] from the target (they are also sent to GDB's console).
    pub fn on_notice(&mut self, sink: impl FnMut(&Notice) + 'static) {
        self.notice_sink = Some(Box::new(sink));
    }

    /// What a closed connection does to the program (default [`OnDisconnect::End`]).
    pub fn set_on_disconnect(&mut self, on: OnDisconnect) {
        self.on_disconnect = on;
    }

    /// The protocol state seen so far.
    pub fn state(&self) -> &RouterState {
        &self.state
    }

    /// Serves one GDB connection until the program exits, GDB detaches/kills, or the
    /// connection closes or fails (then see [`OnDisconnect`]: the program is killed or
    /// detached, or kept stopped for the next connection, [`ServeOutcome::Kept`]).
    pub fn serve(
        &mut self,
        stream: TcpStream,
        session: &mut GdbStubAdapter,
    ) -> Result<ServeOutcome, ServerError> {
        self.running = false;
        match self.serve_connection(stream, session) {
            // A reset or a write to a closed socket is the debugger going away, like EOF.
            Err(ServerError::Io(e))
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::BrokenPipe
                        | std::io::ErrorKind::ConnectionReset
                        | std::io::ErrorKind::ConnectionAborted
                        | std::io::ErrorKind::UnexpectedEof
                ) =>
            {
                let running = self.running;
                self.connection_closed(session, running)
            }
            r => r,
        }
    }

    fn serve_connection(
        &mut self,
        stream: TcpStream,
        session: &mut GdbStubAdapter,
    ) -> Result<ServeOutcome, ServerError> {
        let _ = stream.set_nodelay(true);
        // Files a previous debugger left open are not this one's.
        session.host_files.clear();
        let writer = stream.try_clone().map_err(ServerError::Io)?;
        let stub = GdbStubBuilder::new(RouterConn::new(writer))
            .packet_buffer_size(self.packet_size)
            .build()
            .map_err(gs_err)?;
        let mut sm: Sm<'_> = stub.run_state_machine(session).map_err(gs_err)?;
        // A new connection starts with a clean slate (a previous one may have ended mid-packet).
        self.framer = Framer::new(self.packet_size - 8);
        self.state = RouterState::default();
        let mut reader = stream;
        let mut buf = vec![0u8; 8192];
        let mut idle_polls = 0u32;
        loop {
            sm = match sm {
                GdbStubStateMachine::Disconnected(mut d) => {
                    let reason = d.get_reason();
                    if matches!(
                        reason,
                        DisconnectReason::TargetExited(_) | DisconnectReason::TargetTerminated(_)
                    ) && session.kept_child.is_some()
                        && session.target().held_fork_child() == session.kept_child
                    {
                        // GDB keeps the fork's other process and stays connected for it.
                        self.serve_kept_child(&mut reader, d.borrow_conn(), session)?;
                    }
                    return self.finish(reason, session);
                }
                GdbStubStateMachine::CtrlCInterrupt(c) => {
                    session.target_mut().interrupt()?;
                    c.interrupt_handled(session, None::<MultiThreadStopReason<u64>>)
                        .map_err(gs_err)?
                }
                GdbStubStateMachine::Idle(i) => {
                    self.running = false;
                    await_next_packet(&reader, self.poll_window)?;
                    let n = read_some(&mut reader, &mut buf)?;
                    if n == 0 {
                        return self.connection_closed(session, false);
                    }
                    self.feed(GdbStubStateMachine::Idle(i), session, &buf[..n])?
                }
                GdbStubStateMachine::Running(mut r) => {
                    self.running = true;
                    let stop = session.target_mut().wait(false)?;
                    self.running = stop.is_none();
                    self.forward_notices(r.borrow_conn(), session)?;
                    if let Some(ev) = stop {
                        idle_polls = 0;
                        let tid = session.target().tid();
                        let multiprocess = self
                            .state
                            .client_features
                            .iter()
                            .any(|f| f == "multiprocess+");
                        if let Some(reply) = forks::own_stop_reply(session, ev, tid, multiprocess) {
                            r.borrow_conn().replace_reply = Some(reply);
                        }
                        // Expedite rbp, rsp and rip (as gdbserver does) so GDB can identify
                        // the frame without fetching every register after each step; never a
                        // register the past does not know (a PC-only replay): GDB would take
                        // its 0 for a value and read memory near address 0 at every step. The
                        // stop thread's (GDB may have read another one's before).
                        // A stop reply makes its thread the general thread, as gdbserver
                        // does: GDB assumes so (`record_currthread`) and sends no `Hg` before
                        // its next request for that thread (btrace reads a thread's trace
                        // right after the stop that reported it).
                        self.state.general_thread = None;
                        if !std::mem::take(&mut self.state.named_step) {
                            self.state.selected_thread = None;
                        }
                        let expedited = match ev {
                            StopEvent::Exited(_) | StopEvent::Killed(_) => None,
                            _ => session.target_mut().read_thread_registers(tid).ok(),
                        };
                        if self.state.threads_in_stop_reply && expedited.is_some() {
                            let pc = expedited
                                .as_ref()
                                .filter(|regs| !regs.unavailable.contains(16))
                                .map(|regs| regs.gprs[gpr::RIP]);
                            let threads = session.target().thread_ids();
                            r.borrow_conn().stop_reply_suffix =
                                Some(threads_in_stop_reply(&threads, pc));
                        }
                        match expedited {
                            Some(regs) => {
                                let values: Vec<(GdbRegId, [u8; 8])> =
                                    [(6, gpr::RBP), (7, gpr::RSP), (16, gpr::RIP)]
                                        .iter()
                                        .filter(|&&(num, _)| !regs.unavailable.contains(num))
                                        .map(|&(num, idx)| {
                                            (GdbRegId(num), regs.gprs[idx].to_le_bytes())
                                        })
                                        .collect();
                                let mut iter = values.iter().map(|(id, v)| (*id, &v[..]));
                                r.report_stop_with_regs(session, stop_reason(tid, ev), &mut iter)
                                    .map_err(gs_err)?
                            }
                            None => r
                                .report_stop(session, stop_reason(tid, ev))
                                .map_err(gs_err)?,
                        }
                    } else {
                        // A single step stops within microseconds: yield-spin briefly first,
                        // then back off to 10 ms polls so a long-running program costs no CPU.
                        const SPINS: u32 = 200;
                        let timeout = idle_polls.saturating_sub(SPINS).min(10) as i32;
                        if idle_polls < SPINS {
                            std::thread::yield_now();
                        }
                        idle_polls += 1;
                        if poll_readable(&reader, timeout)? {
                            // Everything GDB sent so far is handled before the program runs
                            // on: a large packet (discarded by the framer beyond the packet
                            // size) must not cost one run slice per read, and a Ctrl-C behind
                            // it must be seen at once.
                            let mut sm = GdbStubStateMachine::Running(r);
                            loop {
                                let n = read_some(&mut reader, &mut buf)?;
                                if n == 0 {
                                    let running = matches!(sm, GdbStubStateMachine::Running(_));
                                    return self.connection_closed(session, running);
                                }
                                sm = self.feed(sm, session, &buf[..n])?;
                                if !matches!(sm, GdbStubStateMachine::Running(_))
                                    || !poll_readable(&reader, 0)?
                                {
                                    break;
                                }
                            }
                            sm
                        } else {
                            GdbStubStateMachine::Running(r)
                        }
                    }
                }
            };
        }
    }

    /// Serves the fork child the debugger keeps (`detach-on-fork off`) after the recorded
    /// process ended, until the debugger closes the connection ([`forks::after_exit_reply`]).
    fn serve_kept_child(
        &mut self,
        reader: &mut TcpStream,
        conn: &mut RouterConn,
        session: &mut GdbStubAdapter,
    ) -> Result<(), ServerError> {
        let mut buf = vec![0u8; 8192];
        let mut selected = false;
        loop {
            let n = match read_some(reader, &mut buf) {
                Ok(n) => n,
                Err(ServerError::Io(_)) => return Ok(()),
                Err(e) => return Err(e),
            };
            if n == 0 {
                return Ok(());
            }
            for &b in &buf[..n] {
                let Some(frame) = self.framer.push(b) else {
                    continue;
                };
                match frame {
                    Frame::Packet(body) => {
                        let plain = unescape(&body);
                        let reply = forks::after_exit_reply(session, &mut selected, &plain);
                        conn.ack().map_err(ServerError::Io)?;
                        if plain.starts_with(b"vCont;") {
                            self.forward_notices(conn, session)?;
                        }
                        conn.send_packet(&reply).map_err(ServerError::Io)?;
                    }
                    Frame::Nack => conn.resend_last().map_err(ServerError::Io)?,
                    Frame::BadChecksum => conn.nack().map_err(ServerError::Io)?,
                    Frame::Oversized => {
                        conn.ack().map_err(ServerError::Io)?;
                        conn.send_packet(b"E01").map_err(ServerError::Io)?;
                    }
                    Frame::Ack | Frame::Interrupt => {}
                }
            }
        }
    }

    fn forward_notices(
        &mut self,
        conn: &mut RouterConn,
        session: &mut GdbStubAdapter,
    ) -> Result<(), ServerError> {
        let mut notices = std::mem::take(&mut session.notices);
        notices.extend(session.target_mut().take_notices());
        for notice in notices {
            if let Some(sink) = self.notice_sink.as_mut() {
                sink(&notice);
            }
            conn.send_console(&format!("ptrewind: {notice}\n"))
                .map_err(ServerError::Io)?;
        }
        Ok(())
    }

    fn finish(
        &mut self,
        reason: DisconnectReason,
        session: &mut GdbStubAdapter,
    ) -> Result<ServeOutcome, ServerError> {
        let t = session.target_mut();
        Ok(match reason {
            DisconnectReason::TargetExited(code) => ServeOutcome::Exited(i32::from(code)),
            DisconnectReason::TargetTerminated(sig) => {
                ServeOutcome::Killed(super::adapter::gdb_to_linux_signal(sig.0).unwrap_or(0))
            }
            DisconnectReason::Kill => {
                t.kill()?;
                ServeOutcome::KilledByDebugger
            }
            DisconnectReason::Disconnect => {
                if t.has_exited() {
                    ServeOutcome::Detached
                } else {
                    t.detach()?;
                    ServeOutcome::Detached
                }
            }
        })
    }

    /// The connection closed; `running` says whether the program was running (gdbstub's
    /// `Running` state).
    fn connection_closed(
        &mut self,
        session: &mut GdbStubAdapter,
        running: bool,
    ) -> Result<ServeOutcome, ServerError> {
        let attached = session.is_attached();
        let t = session.target_mut();
        if t.has_exited() {
            return Ok(ServeOutcome::ConnectionClosed);
        }
        if self.on_disconnect == OnDisconnect::Keep {
            // Stopped where it is, with its recording; a stop nobody saw is dropped (the
            // next debugger asks `?` and gets where the program is).
            if running {
                let t = session.target_mut();
                t.interrupt()?;
                t.wait(true)?;
            }
            return Ok(if session.target().has_exited() {
                ServeOutcome::ConnectionClosed
            } else {
                ServeOutcome::Kept
            });
        }
        if attached {
            // Leave a process we did not start running, as GDB does on disconnect.
            if t.detach().is_err() {
                t.interrupt()?;
                t.wait(true)?;
                if !t.has_exited() {
                    t.detach()?;
                }
            }
        } else {
            t.kill()?;
        }
        Ok(ServeOutcome::ConnectionClosed)
    }

    /// Feeds bytes received from GDB through the framer, interceptors and gdbstub.
    fn feed<'a>(
        &mut self,
        mut sm: Sm<'a>,
        session: &mut GdbStubAdapter,
        bytes: &[u8],
    ) -> Result<Sm<'a>, ServerError> {
        for &b in bytes {
            if matches!(sm, GdbStubStateMachine::Disconnected(_)) {
                break;
            }
            let Some(frame) = self.framer.push(b) else {
                continue;
            };
            sm = match frame {
                Frame::Ack => sm,
                Frame::Nack => {
                    conn(&mut sm).resend_last().map_err(ServerError::Io)?;
                    sm
                }
                Frame::Interrupt => feed_raw(sm, session, &[0x03])?,
                Frame::BadChecksum => {
                    conn(&mut sm).nack().map_err(ServerError::Io)?;
                    sm
                }
                Frame::Oversized => {
                    let c = conn(&mut sm);
                    c.ack().map_err(ServerError::Io)?;
                    c.send_packet(b"E01").map_err(ServerError::Io)?;
                    sm
                }
                Frame::Packet(body) => self.dispatch(sm, session, &body)?,
            };
        }
        Ok(sm)
    }

    fn dispatch<'a>(
        &mut self,
        mut sm: Sm<'a>,
        session: &mut GdbStubAdapter,
        body: &[u8],
    ) -> Result<Sm<'a>, ServerError> {
        let body = &*normalize_qsupported(body);
        let (body, suffix_thread) = match self.state.thread_suffix {
            true => split_thread_suffix(body),
            false => (body, None),
        };
        if let Some(tid) = suffix_thread {
            // A thread the target does not have: refused, as lldb-server does (the `Hg`
            // below would be refused out of sight, and the packet served for another thread).
            let known =
                named_thread(Some(tid)).is_some_and(|t| session.target().thread_ids().contains(&t));
            if !known {
                let c = conn(&mut sm);
                c.ack().map_err(ServerError::Io)?;
                c.send_packet(b"E15").map_err(ServerError::Io)?;
                return Ok(sm);
            }
            // gdbstub knows no suffix: the thread becomes its general thread through a `Hg`
            // of ours first (its reply swallowed), when it is not that already. Only while
            // the program is stopped: gdbstub answers nothing else at once.
            let idle = matches!(sm, GdbStubStateMachine::Idle(_));
            if idle && self.state.general_thread.as_deref() != Some(tid) {
                // Straight to gdbstub: no interceptor may answer it in the client's sight.
                self.note_general_thread(tid.to_string());
                conn(&mut sm).swallow_reply = true;
                sm = feed_raw(sm, session, &frame(format!("Hg{tid}").as_bytes()))?;
            }
        }
        let plain = unescape(body);
        let mut intercepted = None;
        for (prefix, handler) in &mut self.handlers {
            if !plain.starts_with(prefix) {
                continue;
            }
            if let Intercept::Reply(reply) = handler(session, &self.state, &plain) {
                intercepted = Some(reply);
                break;
            }
        }
        if let Some(reply) = intercepted {
            let c = conn(&mut sm);
            c.ack().map_err(ServerError::Io)?;
            if plain.starts_with(b"vCont;") {
                // A resume answered here (the held fork child's run): its notices go out
                // while GDB waits for the stop reply, the only time it reads console output.
                self.forward_notices(c, session)?;
            }
            c.send_packet(&reply).map_err(ServerError::Io)?;
            return Ok(sm);
        }
        if plain == b"bs" {
            session.wildcard_step_thread = self.wildcard_step_thread(session);
        }
        // From a `bs` to its stop reply GDB sends nothing (all-stop), so every packet sets it.
        self.state.named_step =
            plain == b"bs" && named_thread(self.state.continue_thread.as_deref()).is_some();
        // gdbstub ends the session on a step of "all threads" (`s`/`bs` after `Hc-1`).
        let resume_all = self
            .state
            .continue_thread
            .as_deref()
            .is_some_and(resume_all_selected);
        let checked =
            check_packet(body, resume_all).and_then(|()| check_threads_and_signals(session, body));
        if let Err(refusal) = checked {
            let c = conn(&mut sm);
            c.ack().map_err(ServerError::Io)?;
            c.send_packet(refusal.reply()).map_err(ServerError::Io)?;
            return Ok(sm);
        }
        if let Some(features) = plain.strip_prefix(b"qSupported") {
            self.state.client_features = features
                .strip_prefix(b":")
                .unwrap_or(b"")
                .split(|&b| b == b';')
                .filter(|f| !f.is_empty())
                .map(|f| String::from_utf8_lossy(f).into_owned())
                .collect();
            // gdbstub asks the adapter whether to advertise fork events while it answers.
            let mut features = self.features.clone();
            features.extend(forks::negotiate(session, &self.state.client_features));
            if !features.is_empty() {
                conn(&mut sm).rewrite_features = Some(features);
            }
        } else if let Some(thread) = plain.strip_prefix(b"Hg") {
            self.note_general_thread(String::from_utf8_lossy(thread).into_owned());
        } else if let Some(thread) = plain.strip_prefix(b"Hc") {
            self.state.continue_thread = Some(String::from_utf8_lossy(thread).into_owned());
        } else if plain == b"QStartNoAckMode" {
            conn(&mut sm).watch_no_ack = true;
        } else if let Some(mode) = match &plain[..] {
            // LLDB's protocol modes, answered here (gdbstub knows neither).
            b"QThreadSuffixSupported" => Some(&mut self.state.thread_suffix),
            b"QListThreadsInStopReply" => Some(&mut self.state.threads_in_stop_reply),
            _ => None,
        } {
            *mode = true;
            let c = conn(&mut sm);
            c.ack().map_err(ServerError::Io)?;
            c.send_packet(b"OK").map_err(ServerError::Io)?;
            return Ok(sm);
        } else if plain == b"k" {
            // gdbstub answers `k` with `OK`. GDB reads no reply to `k` (it uses `vKill`,
            // answered `OK`, when multiprocess is on), but LLDB waits for an exit-status
            // stop reply and reports "unexpected response to k packet: OK" otherwise;
            // lldb-server answers `X09` (terminated by SIGKILL), and so do we.
            conn(&mut sm).replace_reply = Some(b"X09".to_vec());
        }
        feed_raw(sm, session, &frame(body))
    }
}

impl Router {
    /// A `Hg` to `thread` (its id text): the general thread, and the selected one when it
    /// names one thread.
    fn note_general_thread(&mut self, thread: String) {
        if named_thread(Some(&thread)).is_some() {
            self.state.selected_thread = Some(thread.clone());
        }
        self.state.general_thread = Some(thread);
    }

    /// The thread a `bs` steps when GDB's `Hc` named none (`pPID.0`, `0`, or no `Hc`): the
    /// thread GDB selected (`RouterState::selected_thread`), as gdbserver steps its general
    /// thread; `None` (gdbstub's choice: the stop's thread, listed first) when GDB's packets
    /// say nothing since its last stop, or name no thread of the target.
    fn wildcard_step_thread(&self, session: &GdbStubAdapter) -> Option<i32> {
        if named_thread(self.state.continue_thread.as_deref()).is_some() {
            return None;
        }
        named_thread(self.state.selected_thread.as_deref())
            .filter(|tid| session.target().thread_ids().contains(tid))
    }
}

/// The thread a thread id text (`pPID.TID`, `TID`) names; `None` for "any", "all" or junk.
fn named_thread(text: Option<&str>) -> Option<i32> {
    match text.map(|t| super::rsp::parse_thread_id(t.as_bytes())) {
        Some(Ok(super::rsp::ThreadSel::Thread { tid, .. })) => i32::try_from(tid).ok(),
        _ => None,
    }
}

fn feed_raw<'a>(
    mut sm: Sm<'a>,
    session: &mut GdbStubAdapter,
    bytes: &[u8],
) -> Result<Sm<'a>, ServerError> {
    for &b in bytes {
        sm = match sm {
            GdbStubStateMachine::Idle(i) => i.incoming_data(session, b).map_err(gs_err)?,
            GdbStubStateMachine::Running(r) => r.incoming_data(session, b).map_err(gs_err)?,
            GdbStubStateMachine::CtrlCInterrupt(c) => {
                session.target_mut().interrupt()?;
                let sm = c
                    .interrupt_handled(session, None::<MultiThreadStopReason<u64>>)
                    .map_err(gs_err)?;
                feed_raw(sm, session, &[b])?
            }
            d @ GdbStubStateMachine::Disconnected(_) => return Ok(d),
        };
    }
    Ok(sm)
}

/// A register packet (`p`, `P`, `g`, `G`, `QSaveRegisterState`, `QRestoreRegisterState`)
/// without its `;thread:TID;` suffix, and the TID text; other packets unchanged.
fn split_thread_suffix(body: &[u8]) -> (&[u8], Option<&str>) {
    let register_packet = matches!(body.first(), Some(b'p' | b'P' | b'g' | b'G'))
        || body.starts_with(b"QSaveRegisterState")
        || body.starts_with(b"QRestoreRegisterState");
    if !register_packet {
        return (body, None);
    }
    let Some(at) = body.windows(8).rposition(|w| w == b";thread:") else {
        return (body, None);
    };
    let tid = &body[at + 8..];
    let tid = tid.strip_suffix(b";").unwrap_or(tid);
    match std::str::from_utf8(tid) {
        Ok(t) if !t.is_empty() => (&body[..at], Some(t)),
        _ => (body, None),
    }
}

/// The `threads:` (and `thread-pcs:`) fields lldb-server adds to its stop replies after
/// `QListThreadsInStopReply`: the thread ids in hex, and the stop PC when there is one thread
/// (the other threads' PCs are left to LLDB to read when it needs them).
fn threads_in_stop_reply(threads: &[i32], pc: Option<u64>) -> Vec<u8> {
    let ids: Vec<String> = threads.iter().map(|t| format!("{t:x}")).collect();
    let mut text = format!("threads:{};", ids.join(","));
    if let ([_], Some(pc)) = (threads, pc) {
        text.push_str(&format!("thread-pcs:{pc:x};"));
    }
    text.into_bytes()
}

#[cfg(test)]
#[test]
fn thread_suffix_only_on_register_packets() {
    for (body, packet, tid) in [
        (&b"p6;thread:684e;"[..], &b"p6"[..], "684e"),
        (b"g;thread:p1.2", b"g", "p1.2"),
        (b"P10=0011;thread:1f;", b"P10=0011", "1f"),
        (
            b"QSaveRegisterState;thread:1f;",
            b"QSaveRegisterState",
            "1f",
        ),
    ] {
        assert_eq!(split_thread_suffix(body), (packet, Some(tid)));
    }
    // Other packets, a suffix with no id, or none: unchanged.
    for body in [&b"m1000,4;thread:1f;"[..], b"p6;thread:;", b"p6", b"qC"] {
        assert_eq!(split_thread_suffix(body), (body, None));
    }
}

#[cfg(test)]
#[test]
fn thread_pcs_only_for_one_thread() {
    assert_eq!(
        threads_in_stop_reply(&[0x1f], Some(0x401000)),
        b"threads:1f;thread-pcs:401000;"
    );
    assert_eq!(threads_in_stop_reply(&[0x1f], None), b"threads:1f;");
    assert_eq!(
        threads_in_stop_reply(&[0x1f, 0x20], Some(0x401000)),
        b"threads:1f,20;"
    );
}

/// The default of [`Router::set_poll_window`].
fn default_poll_window() -> Duration {
    match std::thread::available_parallelism() {
        Ok(n) if n.get() >= 2 => Duration::from_millis(1),
        _ => Duration::ZERO,
    }
}

/// Returns once a packet can be read or `window` has passed, yielding the CPU in between (see
/// [`Router::set_poll_window`]).
fn await_next_packet(stream: &TcpStream, window: Duration) -> Result<(), ServerError> {
    if window.is_zero() {
        return Ok(());
    }
    let started = Instant::now();
    while !poll_readable(stream, 0)? && started.elapsed() < window {
        std::thread::yield_now();
    }
    Ok(())
}

fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> Result<usize, ServerError> {
    loop {
        match stream.read(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Ok(0),
            Err(e) => return Err(ServerError::Io(e)),
        }
    }
}

fn poll_readable(stream: &TcpStream, timeout_ms: i32) -> Result<bool, ServerError> {
    let mut pfd = libc::pollfd {
        fd: stream.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `pfd` is a valid pollfd for the duration of the call and nfds is 1.
    let r = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if r < 0 {
        let err = std::io::Error::last_os_error();
        if err.kind() == std::io::ErrorKind::Interrupted {
            return Ok(false);
        }
        return Err(ServerError::Io(err));
    }
    Ok(r > 0)
}
