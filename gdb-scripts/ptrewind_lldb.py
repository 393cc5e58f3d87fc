# ptrewind LLDB helpers: `pt history [N]`, `pt calls [N]`, `pt goto N|begin|end`, `pt where`,
# `pt stats` (and `pt <any monitor command>`, e.g. `pt help`, `pt maps`).
#
# The LLDB counterpart of ptrewind.py (GDB). Each command sends the matching ptrewind monitor
# command as a `qRcmd` packet through `process plugin packet monitor <cmd>` and prints the
# text the server returns, without LLDB's "packet:/response:" trailer.
#
# Load in LLDB (after or before `gdb-remote HOST:PORT`):
#     command script import /path/to/ptrewind/gdb-scripts/ptrewind_lldb.py
import lldb

_USAGE = "usage: pt history [N] | calls [N] | goto N|begin|end | where | stats | help"


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
