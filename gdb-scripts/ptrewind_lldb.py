# ptrewind LLDB helpers: `pt history [N]`, `pt calls [N]`, `pt goto N|begin|end`, `pt where`,
# `pt stats` (and `pt <any monitor command>`, e.g. `pt help`, `pt maps`), and reverse
# execution for LLDB versions without it (lldb-19): `pt reverse-stepi`, `pt reverse-continue`,
# `pt reverse-step`, `pt reverse-next`, `pt reverse-finish`.
#
# The LLDB counterpart of ptrewind.py (GDB). Each command sends the matching ptrewind monitor
# command as a `qRcmd` packet through `process plugin packet monitor <cmd>` and prints the
# text the server returns, without LLDB's "packet:/response:" trailer.
#
# Load in LLDB (after or before `gdb-remote HOST:PORT`):
#     command script import /path/to/ptrewind/gdb-scripts/ptrewind_lldb.py
import lldb

_USAGE = (
    "usage: pt history [N] | calls [N] | goto N|begin|end | where | stats | help\n"
    "       pt reverse-stepi | reverse-continue | reverse-step | reverse-next | reverse-finish"
)

_REVERSE = (
    "reverse-stepi",
    "reverse-continue",
    "reverse-step",
    "reverse-next",
    "reverse-finish",
)


def _monitor(debugger, line):
    """Runs `monitor <line>` on the server; returns (ok, text)."""
    result = lldb.SBCommandReturnObject()
    debugger.GetCommandInterpreter().HandleCommand(
        "process plugin packet monitor " + line, result
    )
    if not result.Succeeded():
        return False, (result.GetError() or "monitor command failed\n")
    text = result.GetOutput() or ""
    # LLDB appends "  packet: qRcmd,<hex>\nresponse: <reply>\n" after the console output
    # (the `O` packets) the server sent while running the command.
    body, sep, trailer = text.rpartition("  packet: qRcmd,")
    if not sep:
        return True, text
    reply = ""
    for trailer_line in trailer.splitlines():
        if trailer_line.startswith("response: "):
            reply = trailer_line[len("response: "):].strip()
    if reply.startswith("E") and len(reply) == 3:
        return False, body + "ptrewind: monitor %s failed (%s)\n" % (line, reply)
    if reply == "" and "UNIMPLEMENTED" in trailer:
        return False, "ptrewind: the server does not support monitor commands\n"
    return True, body


def _packet(debugger, body):
    """Sends the raw packet `body`; returns the server's reply (or None if LLDB failed)."""
    result = lldb.SBCommandReturnObject()
    debugger.GetCommandInterpreter().HandleCommand(
        "process plugin packet send " + body, result
    )
    if not result.Succeeded():
        return None
    for line in (result.GetOutput() or "").splitlines():
        if line.startswith("response: "):
            return line[len("response: "):].strip()
    return ""


def _stop_regs(reply):
    """The registers a `T` stop reply expedites, {regnum: value}, and whether it says the
    history boundary was reached (`replaylog:`)."""
    regs = {}
    boundary = False
    for field in reply[3:].split(";"):
        key, _, value = field.partition(":")
        if key == "replaylog":
            boundary = True
        elif key and all(c in "0123456789abcdef" for c in key) and value:
            try:
                regs[int(key, 16)] = int.from_bytes(bytes.fromhex(value), "little")
            except ValueError:
                pass
    return regs, boundary


_RSP, _RIP = 7, 16


class _Reverse(object):
    """Reverse execution over raw `bs`/`bc` packets, the way CodeLLDB implements its
    reverse buttons: LLDB does not know the process moved, so after the moves the helper
    steps back one instruction more and forward one with LLDB's own `stepi`, which makes
    LLDB read the registers, memory and frames of the new position."""

    def __init__(self, debugger, result):
        self.debugger = debugger
        self.result = result
        self.process = debugger.GetSelectedTarget().GetProcess()
        self.thread = self.process.GetSelectedThread()
        self.at_boundary = False
        # The thread our last `Hc` selected, until LLDB steps by itself: a second reverse
        # packet in a row needs no `Hc` (one of the four round trips the helper itself makes
        # for a `pt reverse-stepi`; LLDB's own step and its stop make the others).
        self.hc_tid = None

    def raw(self, body):
        """Sends a reverse packet for the selected thread; returns (regs, boundary)."""
        tid = self.thread.GetThreadID()
        if self.hc_tid != tid:
            if _packet(self.debugger, "Hc%x" % tid) != "OK":
                raise RuntimeError("the server refused to select thread %d" % tid)
            self.hc_tid = tid
        reply = _packet(self.debugger, body)
        if not reply or reply[0] not in "ST":
            raise RuntimeError(
                "the server does not reverse-execute (%s -> %r)" % (body, reply)
            )
        regs, boundary = _stop_regs(reply)
        if reply[0] == "S" or _RIP not in regs:
            # A short stop reply: read the registers we need.
            for n in (_RSP, _RIP):
                value = _packet(self.debugger, "p%x" % n) or ""
                try:
                    regs[n] = int.from_bytes(bytes.fromhex(value), "little")
                except ValueError:
                    pass
        self.at_boundary = boundary
        return regs

    def refresh(self):
        """Makes LLDB show the server's position: one more `bs`, then LLDB's own `stepi`.
        At the start of the history there is no instruction before: LLDB keeps its old view
        and the helper says so."""
        if self.at_boundary:
            self.result.AppendMessage(
                "ptrewind: reached the start of the recorded history; LLDB still shows "
                "the frame of its last stop (see `pt where`)"
            )
            return False
        self.raw("bs")
        if self.at_boundary:
            # The position is the first instruction: `bs` did not move.
            self.result.AppendMessage(
                "ptrewind: reached the start of the recorded history; LLDB still shows "
                "the frame of its last stop (see `pt where`)"
            )
            return False
        self.forward1()
        return True

    def forward1(self):
        """LLDB's own one-instruction step forward."""
        interp = self.debugger.GetCommandInterpreter()
        r = lldb.SBCommandReturnObject()
        # LLDB's step may select a thread for continuing itself.
        self.hc_tid = None
        interp.HandleCommand("thread step-inst", r)
        if not r.Succeeded():
            raise RuntimeError(r.GetError() or "stepi failed")
        self.thread = self.process.GetSelectedThread()

    def back1(self):
        """One instruction back, LLDB refreshed; False at the start of the history."""
        self.raw("bs")
        if self.at_boundary:
            self.result.AppendMessage("ptrewind: at the start of the recorded history")
            return False
        return self.refresh()

    def stepi(self):
        self.raw("bs")
        if self.at_boundary:
            self.result.AppendMessage("ptrewind: at the start of the recorded history")
        elif self.refresh():
            self.show()

    def cont(self):
        self.raw("bc")
        if self.refresh():
            self.show()

    def finish_frame(self, cfa):
        """Back to the call instruction of the function whose frame has canonical frame
        address `cfa` (the PC must be inside it): a temporary breakpoint on the function's
        entry, `bc` until the stack pointer there is the one of this call (`cfa - 8`:
        recursive calls made and finished by this one are passed), then one `bs`.
        Returns False if something else stopped the search (a user breakpoint, the start
        of the history)."""
        f = self.thread.GetFrameAtIndex(0)
        target = self.debugger.GetSelectedTarget()
        sym = f.GetSymbol()
        if not sym.IsValid():
            raise RuntimeError("no symbol for the current function")
        entry = sym.GetStartAddress().GetLoadAddress(target)
        bp = target.BreakpointCreateByAddress(entry)
        try:
            while True:
                regs = self.raw("bc")
                if self.at_boundary:
                    return False
                if regs.get(_RIP) != entry:
                    return False
                if regs.get(_RSP) == cfa - 8:
                    break
        finally:
            target.BreakpointDelete(bp.GetID())
        self.raw("bs")
        return not self.at_boundary

    def finish(self):
        f = self.thread.GetFrameAtIndex(0)
        self.finish_frame(f.GetCFA())
        if self.refresh():
            self.show()

    def line(self, into):
        """reverse-next (`into` False) / reverse-step (`into` True), with GDB's rule: back to
        the nearest start of a line-table entry (a statement) in this frame, passing over
        the functions called on the way; reverse-step instead enters a function with line
        information that returned there and stops at the start of its last statement."""
        f = self.thread.GetFrameAtIndex(0)
        cfa = f.GetCFA()
        target = self.debugger.GetSelectedTarget()
        while self.back1():
            f = self.thread.GetFrameAtIndex(0)
            fcfa = f.GetCFA()
            if fcfa < cfa:
                # Stepped back over a return, into the callee.
                if into and f.GetLineEntry().IsValid():
                    # reverse-step goes on in the callee, to the start of its last statement.
                    cfa = fcfa
                else:
                    if not self.finish_frame(fcfa) or not self.refresh():
                        break
                    f = self.thread.GetFrameAtIndex(0)
                    fcfa = f.GetCFA()
            if fcfa > cfa:
                # Back out of the function's first instruction: stop at the call.
                break
            entry = f.GetLineEntry()
            if entry.IsValid() and entry.GetLine() != 0:
                start = entry.GetStartAddress().GetLoadAddress(target)
                if f.GetPC() == start:
                    break
        self.show()

    def show(self):
        interp = self.debugger.GetCommandInterpreter()
        r = lldb.SBCommandReturnObject()
        interp.HandleCommand("frame select 0", r)
        self.result.AppendMessage((r.GetOutput() or "").rstrip("\n"))


def _reverse(debugger, sub, result):
    r = _Reverse(debugger, result)
    # Front ends (lldb-dap, CodeLLDB) run LLDB asynchronously: a `thread step-inst` would
    # return before the stop. The moves are made synchronously and the mode restored.
    was_async = debugger.GetAsync()
    debugger.SetAsync(False)
    try:
        if sub == "reverse-stepi":
            r.stepi()
        elif sub == "reverse-continue":
            r.cont()
        elif sub == "reverse-finish":
            r.finish()
        else:
            r.line(into=(sub == "reverse-step"))
    except RuntimeError as e:
        result.SetError("pt %s: %s" % (sub, e))
    finally:
        debugger.SetAsync(was_async)


def pt(debugger, command, result, internal_dict):
    """pt history [N] | calls [N] | goto N|begin|end | where | stats | help:
    ptrewind recording commands (ptrewind monitor commands over qRcmd)."""
    args = command.split()
    if not args:
        result.SetError(_USAGE)
        return
    if debugger.GetSelectedTarget().GetProcess().GetState() != lldb.eStateStopped:
        result.SetError("pt: the process must be connected and stopped (gdb-remote first)")
        return
    sub = args[0]
    if sub in _REVERSE:
        _reverse(debugger, sub, result)
        return
    if sub == "goto" and len(args) != 2:
        result.SetError("usage: pt goto N|begin|end")
        return
    ok, text = _monitor(debugger, " ".join(args))
    if not ok:
        result.SetError(text.rstrip("\n"))
        return
    result.AppendMessage(text.rstrip("\n"))
    if sub == "goto" and "monitor goto:" not in text:
        # The server moved the replay position behind LLDB's back. LLDB keeps the registers
        # and frames of the last stop until the process stops again, so say so (GDB's
        # helper flushes its register cache; LLDB 19 has no command for that).
        result.AppendMessage(
            "ptrewind: LLDB still shows the frame of the last stop; step or continue "
            "(in either direction) to see the new position"
        )


def __lldb_init_module(debugger, internal_dict):
    debugger.HandleCommand("command script add -o -f %s.pt pt" % __name__)
