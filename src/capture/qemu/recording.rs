//! Launching QEMU with the plugin and reading a recording directory.
