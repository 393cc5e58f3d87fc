//! Control of a live traced process through ptrace: start, attach, registers, memory, breakpoints.
