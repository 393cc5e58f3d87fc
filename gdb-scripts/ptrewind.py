# ptrewind GDB helpers: `pt history`, `pt calls`, `pt goto N`, `pt where`, `pt stats`,
# `pt reverse-finish`, `pt reverse-next`.
#
# Each command runs the matching `monitor` command of the ptrewind server and prints its text,
# coloured when the terminal supports it. Load with `source ptrewind.py` (`ptrewind gdb` does).
import os
import re
import sys

import gdb


def _colour_enabled():
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("TERM", "dumb") == "dumb":
        return False
    try:
        return sys.stdout.isatty()
    except Exception:
        return False


_ADDR = re.compile(r"(0x[0-9a-f]+)")
_FUNC = re.compile(r"(?<=\s)([A-Za-z_][\w.@:<>~]*)(\+\d+)?(?= at |\s*$|\s)")
_ERROR = re.compile(r"^(.*ERROR.*)$", re.M)


def _paint(text):
    if not _colour_enabled():
        return text
    text = _ADDR.sub("\x1b[34m\\1\x1b[0m", text)
    text = _ERROR.sub("\x1b[1;31m\\1\x1b[0m", text)
    text = re.sub(r" at ([^\s:]+:\d+)", " at \x1b[32m\\1\x1b[0m", text)
    return text


def _monitor(line):
    return gdb.execute("monitor " + line, to_string=True)


class PtPrefix(gdb.Command):
    """ptrewind recording commands (pt history, pt calls, pt goto, pt where, pt stats)."""

    def __init__(self):
        super().__init__("pt", gdb.COMMAND_USER, prefix=True)


class _PtMonitor(gdb.Command):
    def __init__(self, name, monitor):
        super().__init__("pt " + name, gdb.COMMAND_USER)
        self._monitor = monitor

    def invoke(self, arg, from_tty):
        sys.stdout.write(_paint(_monitor((self._monitor + " " + arg).strip())))


class PtHistory(_PtMonitor):
    """pt history [N]: the last N branches before the replay position, with symbols and lines."""

    def __init__(self):
        super().__init__("history", "history")


class PtCalls(_PtMonitor):
    """pt calls [N]: the function-call history before the replay position, indented by depth."""

    def __init__(self):
        super().__init__("calls", "calls")


class PtWhere(_PtMonitor):
    """pt where: the instruction number of the replay position and of the present."""

    def __init__(self):
        super().__init__("where", "where")


class PtStats(_PtMonitor):
    """pt stats: trace, history and state-log statistics."""

    def __init__(self):
        super().__init__("stats", "stats")


class PtView(_PtMonitor):
    """pt view DIR: write DIR/flame.svg (flame graph) and DIR/timeline.json (Perfetto) of the
    history so far (see docs/view.md)."""

    def __init__(self):
        super().__init__("view", "view")


class PtGoto(gdb.Command):
    """pt goto N|begin|end: move the replay position to instruction N and show the frame."""

    def __init__(self):
        super().__init__("pt goto", gdb.COMMAND_USER)

    def invoke(self, arg, from_tty):
        if not arg.strip():
            raise gdb.GdbError("usage: pt goto N|begin|end")
        text = _monitor("goto " + arg.strip())
        sys.stdout.write(_paint(text))
        if "monitor goto:" in text:
            return
        # The server moved the position behind GDB's back: drop GDB's cached registers/frames.
        gdb.execute("maintenance flush register-cache", to_string=True)
        gdb.execute("frame")


class PtReverse(gdb.Command):
    """pt reverse-finish | pt reverse-next: reverse-finish / reverse-next in the selected thread,
    done by the server from the decoded calls and returns. For a past without a stack pointer
    (PC-only: QEMU and hardware recordings), where GDB cannot unwind and cannot do them itself;
    GDB's own reverse-finish and reverse-next use these there."""

    def __init__(self, what):
        super().__init__("pt " + what, gdb.COMMAND_USER)
        self._what = what

    def invoke(self, arg, from_tty):
        text = _monitor(self._what)
        sys.stdout.write(_paint(text))
        if ("monitor " + self._what + ":") in text:
            raise gdb.GdbError("ptrewind: " + self._what + " not possible here")
        gdb.execute("maintenance flush register-cache", to_string=True)
        gdb.execute("frame")


def _sp_unavailable():
    try:
        return str(gdb.parse_and_eval("$sp")) == "<unavailable>"
    except gdb.error:
        return False


class _ReverseOverride(gdb.Command):
    """Replaces GDB's reverse-finish / reverse-next / reverse-step so that a past without a stack
    pointer (PC-only: QEMU and hardware recordings) is handled: GDB cannot unwind there
    (reverse-finish would say "not meaningful in the outermost frame", reverse-next would run back
    to the previous breakpoint), so the server does reverse-finish and reverse-next from the
    recorded calls and returns, and reverse-step is refused with the reason. Everywhere else GDB's
    own command runs, exactly as GDB runs it: the forward command with `exec-direction reverse`.

    A replacement rather than a `hook-` command: a hook can keep GDB's version from running only
    by raising an error, which reports success as a failure and aborts the user's scripts and
    breakpoint command lists. GDB's aliases (`rn`, `rs`) follow the replacement."""

    def __init__(self, name, forward, doc):
        self.__doc__ = doc
        super().__init__(name, gdb.COMMAND_RUNNING)
        self._name = name
        self._forward = forward

    def invoke(self, arg, from_tty):
        if gdb.parameter("exec-direction") == "reverse":
            # GDB's own wording (infcmd.c, exec_reverse_once).
            raise gdb.GdbError(
                "Already in reverse mode.  Use '%s' or 'set exec-dir forward'." % self._forward
            )
        if _sp_unavailable():
            self._pc_only(arg)
            return
        gdb.execute("set exec-direction reverse", to_string=True)
        try:
            gdb.execute((self._forward + " " + arg).strip(), from_tty)
        finally:
            gdb.execute("set exec-direction forward", to_string=True)

    def _pc_only(self, arg):
        if self._forward == "step":
            raise gdb.GdbError(
                "ptrewind: reverse-step needs the stack pointer, which this past does not have "
                "(PC-only); use reverse-next, reverse-finish, reverse-stepi or a breakpoint and "
                "reverse-continue"
            )
        count = 1
        if self._forward == "next" and arg.strip():
            count = int(gdb.parse_and_eval(arg))
        for _ in range(count):
            gdb.execute("pt " + self._name)
        sys.stdout.write(
            "ptrewind: %s done from the recorded calls and returns (no stack pointer in this "
            "past)\n" % self._name
        )


PtPrefix()
PtHistory()
PtCalls()
PtWhere()
PtStats()
PtView()
PtGoto()
PtReverse("reverse-finish")
PtReverse("reverse-next")
_ReverseOverride(
    "reverse-finish",
    "finish",
    "Execute backward until just before selected stack frame is called.\n"
    "In a past without a stack pointer (PC-only), ptrewind does it from the recorded calls.",
)
_ReverseOverride(
    "reverse-next",
    "next",
    "Step program backward, proceeding through subroutine calls.\n"
    "Usage: reverse-next [N]\n"
    "In a past without a stack pointer (PC-only), ptrewind does it from the recorded calls.",
)
_ReverseOverride(
    "reverse-step",
    "step",
    "Step program backward until it reaches the beginning of another source line.\n"
    "Usage: reverse-step [N]\n"
    "Refused in a past without a stack pointer (PC-only), where GDB cannot unwind.",
)

# Keep breakpoints inserted while the program is stopped. By default GDB removes every
# breakpoint at each stop and inserts them again before each resume: a `z0` and a `Z0` round
# trip per breakpoint per step (the dynamic linker's at least), more than a reverse step costs
# the server (tests/round_trips.rs, docs/benchmarks.md). Safe with ptrewind: its breakpoints
# never show in memory as GDB reads it (a live process has its int3 bytes only while it runs,
# a recording has none), and GDB still lifts the one under the PC to step over it.
gdb.execute("set breakpoint always-inserted on", to_string=True)
