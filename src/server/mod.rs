//! The GDB remote-protocol server (gdbstub) with reverse execution, btrace and LLDB trace packets.
