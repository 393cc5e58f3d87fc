//! Process images: the traced program's code at its run-time addresses, plus symbols and lines.
