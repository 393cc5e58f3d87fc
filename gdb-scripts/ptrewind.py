# ptrewind GDB helpers: `pt history`, `pt calls`, `pt goto N`, `pt where`, `pt stats`.
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


PtPrefix()
PtHistory()
PtCalls()
PtWhere()
PtStats()
PtView()
PtGoto()
