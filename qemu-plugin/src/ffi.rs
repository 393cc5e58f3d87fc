//! The part of QEMU 7.2's TCG plugin C API (`include/qemu/qemu-plugin.h`, plugin API version 1)
//! this plugin uses, declared from the documented types and signatures. QEMU resolves these
//! symbols against its own executable when it loads the plugin.

#![allow(non_camel_case_types)]

use std::ffi::{c_char, c_int, c_uint, c_void};

/// The plugin API version this plugin is built for (QEMU 7.2 speaks version 1).
pub const QEMU_PLUGIN_VERSION: c_int = 1;

/// `qemu_plugin_id_t`.
pub type qemu_plugin_id_t = u64;

/// `qemu_info_t`: what QEMU tells the plugin at install time.
#[repr(C)]
pub struct qemu_info_t {
    /// The guest architecture, e.g. `"x86_64"`.
    pub target_name: *const c_char,
    /// Oldest plugin API version QEMU supports.
    pub version_min: c_int,
    /// Current plugin API version of QEMU.
    pub version_cur: c_int,
    /// Full-system emulation (false for user mode).
    pub system_emulation: bool,
    /// `system.smp_vcpus`, `system.max_vcpus` (system emulation only).
    pub system: [c_int; 2],
}

/// Opaque `struct qemu_plugin_tb`.
#[repr(C)]
pub struct qemu_plugin_tb {
    _private: [u8; 0],
}

/// Opaque `struct qemu_plugin_insn`.
#[repr(C)]
pub struct qemu_plugin_insn {
    _private: [u8; 0],
}

/// `enum qemu_plugin_cb_flags`: the callback does not touch guest registers.
pub const QEMU_PLUGIN_CB_NO_REGS: c_int = 0;
/// `enum qemu_plugin_cb_flags`: the callback reads guest registers (TCG writes them back to the
/// CPU state before it: the gdbstub reads them there while the thread waits in the callback).
pub const QEMU_PLUGIN_CB_R_REGS: c_int = 1;
/// `enum qemu_plugin_op`: add an immediate to a `u64` in memory.
pub const QEMU_PLUGIN_INLINE_ADD_U64: c_int = 0;

/// `enum qemu_plugin_mem_rw`: loads.
pub const QEMU_PLUGIN_MEM_R: c_int = 1;
/// `enum qemu_plugin_mem_rw`: stores.
pub const QEMU_PLUGIN_MEM_W: c_int = 2;
/// `enum qemu_plugin_mem_rw`: loads and stores.
pub const QEMU_PLUGIN_MEM_RW: c_int = 3;

/// `qemu_plugin_meminfo_t`: an opaque description of one memory access (size, store, ...).
pub type qemu_plugin_meminfo_t = u32;

/// `qemu_plugin_vcpu_mem_cb_t`: called after a guest memory access (`vaddr`: its guest address).
pub type VcpuMemCb = extern "C" fn(
    vcpu_index: c_uint,
    info: qemu_plugin_meminfo_t,
    vaddr: u64,
    userdata: *mut c_void,
);
/// `qemu_plugin_udata_cb_t`.
pub type UdataCb = extern "C" fn(id: qemu_plugin_id_t, userdata: *mut c_void);
/// `qemu_plugin_vcpu_simple_cb_t`.
pub type VcpuSimpleCb = extern "C" fn(id: qemu_plugin_id_t, vcpu_index: c_uint);
/// `qemu_plugin_vcpu_udata_cb_t`.
pub type VcpuUdataCb = extern "C" fn(vcpu_index: c_uint, userdata: *mut c_void);
/// `qemu_plugin_vcpu_tb_trans_cb_t`.
pub type TbTransCb = extern "C" fn(id: qemu_plugin_id_t, tb: *mut qemu_plugin_tb);
/// `qemu_plugin_vcpu_syscall_cb_t`.
pub type SyscallCb = extern "C" fn(
    id: qemu_plugin_id_t,
    vcpu_index: c_uint,
    num: i64,
    a1: u64,
    a2: u64,
    a3: u64,
    a4: u64,
    a5: u64,
    a6: u64,
    a7: u64,
    a8: u64,
);
/// `qemu_plugin_vcpu_syscall_ret_cb_t`.
pub type SyscallRetCb = extern "C" fn(id: qemu_plugin_id_t, vcpu_index: c_uint, num: i64, ret: i64);

unsafe extern "C" {
    pub fn qemu_plugin_register_vcpu_init_cb(id: qemu_plugin_id_t, cb: VcpuSimpleCb);
    pub fn qemu_plugin_register_vcpu_exit_cb(id: qemu_plugin_id_t, cb: VcpuSimpleCb);
    pub fn qemu_plugin_register_vcpu_tb_trans_cb(id: qemu_plugin_id_t, cb: TbTransCb);
    pub fn qemu_plugin_register_vcpu_tb_exec_cb(
        tb: *mut qemu_plugin_tb,
        cb: VcpuUdataCb,
        flags: c_int,
        userdata: *mut c_void,
    );
    pub fn qemu_plugin_register_vcpu_insn_exec_cb(
        insn: *mut qemu_plugin_insn,
        cb: VcpuUdataCb,
        flags: c_int,
        userdata: *mut c_void,
    );
    pub fn qemu_plugin_register_vcpu_insn_exec_inline(
        insn: *mut qemu_plugin_insn,
        op: c_int,
        ptr: *mut c_void,
        imm: u64,
    );
    pub fn qemu_plugin_register_vcpu_mem_cb(
        insn: *mut qemu_plugin_insn,
        cb: VcpuMemCb,
        flags: c_int,
        rw: c_int,
        userdata: *mut c_void,
    );
    pub fn qemu_plugin_mem_size_shift(info: qemu_plugin_meminfo_t) -> c_uint;
    pub fn qemu_plugin_mem_is_store(info: qemu_plugin_meminfo_t) -> bool;
    pub fn qemu_plugin_register_vcpu_syscall_cb(id: qemu_plugin_id_t, cb: SyscallCb);
    pub fn qemu_plugin_register_vcpu_syscall_ret_cb(id: qemu_plugin_id_t, cb: SyscallRetCb);
    pub fn qemu_plugin_register_atexit_cb(id: qemu_plugin_id_t, cb: UdataCb, userdata: *mut c_void);
    pub fn qemu_plugin_tb_n_insns(tb: *const qemu_plugin_tb) -> usize;
    pub fn qemu_plugin_tb_get_insn(tb: *const qemu_plugin_tb, idx: usize) -> *mut qemu_plugin_insn;
    pub fn qemu_plugin_insn_data(insn: *const qemu_plugin_insn) -> *const c_void;
    pub fn qemu_plugin_insn_size(insn: *const qemu_plugin_insn) -> usize;
    pub fn qemu_plugin_insn_vaddr(insn: *const qemu_plugin_insn) -> u64;
    pub fn qemu_plugin_insn_haddr(insn: *const qemu_plugin_insn) -> *mut c_void;
}
