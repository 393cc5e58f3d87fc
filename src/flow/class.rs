//! What kind of control flow an instruction is: the class both instruction decoders give
//! (the cheap length-and-class decoder [`super::ild`] and iced-x86, through [`InsnClass::of`]) and
//! the block cache stores. Its own file so that `ild` and `cache` both import it and neither
//! imports the other's.

use iced_x86::{Code, FlowControl, Instruction, Mnemonic};
/// What kind of control flow an instruction is (reference §3.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum InsnClass {
    /// No control flow (or nothing the trace reports).
    Other,
    /// Jcc, J*CXZ, LOOP*: one TNT bit.
    CondBranch,
    /// Direct near JMP: no trace.
    DirectJump,
    /// Direct near CALL: no trace; pushes the return address.
    DirectCall,
    /// Indirect near JMP: TIP.
    IndirectJump,
    /// Indirect near CALL: TIP; pushes the return address.
    IndirectCall,
    /// Near RET: a taken TNT bit (compressed) or a TIP.
    Return,
    /// Far CALL (direct or indirect): TIP.
    FarCall,
    /// Far JMP (direct or indirect), VMLAUNCH/VMRESUME: TIP.
    FarJump,
    /// Far RET, IRET, SYSRET, SYSEXIT: TIP.
    FarReturn,
    /// SYSCALL, SYSENTER: TIP (or TIP.PGD into an untraced kernel).
    SysCall,
    /// INT n, INT3, INTO, INT1: TIP (or TIP.PGD into an untraced kernel), as for [`Self::SysCall`].
    SoftInt,
    /// PTWRITE: binds PTW packets without an IP.
    Ptwrite,
    /// MOV to CR3, WRMSR and similar: no packet of its own, but may switch tracing off.
    Special,
}

impl InsnClass {
    /// Classifies one decoded instruction (any mode).
    #[inline]
    pub fn of(i: &Instruction) -> InsnClass {
        Self::of_code(i.code())
    }

    /// The class of every instruction with this iced-x86 `Code` (the class depends on nothing
    /// else). One load from a table built on first use: the cold block decoder classifies
    /// every new instruction, and the two large iced-x86 tables (`Code` → mnemonic, `Code` →
    /// flow control) it would otherwise read per instruction cost more than the decode itself.
    #[inline]
    pub fn of_code(code: Code) -> InsnClass {
        code_classes()
            .get(code as usize)
            .copied()
            .unwrap_or_else(|| Self::classify(code))
    }

    /// What [`Self::of_code`] tabulates.
    fn classify(code: Code) -> InsnClass {
        // iced-x86 files SYSCALL, SYSENTER and VMLAUNCH under `FlowControl::Call` and far returns
        // under `Return`, so the far transfers are picked out by mnemonic first.
        let i = code;
        match i.mnemonic() {
            Mnemonic::Syscall | Mnemonic::Sysenter => return InsnClass::SysCall,
            Mnemonic::Int | Mnemonic::Int3 | Mnemonic::Into | Mnemonic::Int1 => {
                return InsnClass::SoftInt;
            }
            Mnemonic::Sysret
            | Mnemonic::Sysexit
            | Mnemonic::Iret
            | Mnemonic::Iretd
            | Mnemonic::Iretq
            | Mnemonic::Retf
            | Mnemonic::Uiret => return InsnClass::FarReturn,
            Mnemonic::Vmlaunch | Mnemonic::Vmresume => return InsnClass::FarJump,
            Mnemonic::Ptwrite => return InsnClass::Ptwrite,
            Mnemonic::Wrmsr | Mnemonic::Vmcall | Mnemonic::Vmmcall => return InsnClass::Special,
            _ => {}
        }
        match i.flow_control() {
            FlowControl::Next | FlowControl::XbeginXabortXend | FlowControl::Exception => {
                if i == Code::Mov_cr_r64 || i == Code::Mov_cr_r32 {
                    InsnClass::Special
                } else {
                    InsnClass::Other
                }
            }
            FlowControl::ConditionalBranch => InsnClass::CondBranch,
            FlowControl::UnconditionalBranch => {
                if i.is_jmp_far() {
                    InsnClass::FarJump
                } else {
                    InsnClass::DirectJump
                }
            }
            FlowControl::IndirectBranch => {
                if i.is_jmp_far_indirect() {
                    InsnClass::FarJump
                } else {
                    InsnClass::IndirectJump
                }
            }
            FlowControl::Call => {
                if i.is_call_far() {
                    InsnClass::FarCall
                } else {
                    InsnClass::DirectCall
                }
            }
            FlowControl::IndirectCall => {
                if i.is_call_far_indirect() {
                    InsnClass::FarCall
                } else {
                    InsnClass::IndirectCall
                }
            }
            FlowControl::Return => {
                if i.mnemonic() == Mnemonic::Ret {
                    InsnClass::Return
                } else {
                    InsnClass::FarReturn
                }
            }
            FlowControl::Interrupt => InsnClass::SoftInt,
        }
    }

    /// True for instructions whose successor the trace must give as a TIP (or TIP.PGD).
    #[inline]
    pub fn needs_tip(self) -> bool {
        matches!(
            self,
            InsnClass::IndirectJump
                | InsnClass::IndirectCall
                | InsnClass::FarCall
                | InsnClass::FarJump
                | InsnClass::FarReturn
                | InsnClass::SysCall
                | InsnClass::SoftInt
        )
    }

    /// True for far transfers and other instructions that may change the context (CPL, CR3) and
    /// so disable tracing with a suppressed TIP.PGD IP.
    #[inline]
    pub fn can_disable_suppressed(self) -> bool {
        matches!(
            self,
            InsnClass::FarCall
                | InsnClass::FarJump
                | InsnClass::FarReturn
                | InsnClass::SysCall
                | InsnClass::SoftInt
                | InsnClass::Special
        )
    }

    /// True for the near branches whose target is in the instruction (`jcc`, `loop`, `jrcxz`,
    /// direct `jmp` and `call`).
    #[inline]
    pub fn has_direct_target(self) -> bool {
        matches!(
            self,
            InsnClass::CondBranch | InsnClass::DirectJump | InsnClass::DirectCall
        )
    }

    /// True for any branch (near or far, direct or indirect, conditional or not).
    #[inline]
    pub fn is_branch(self) -> bool {
        !matches!(
            self,
            InsnClass::Other | InsnClass::Ptwrite | InsnClass::Special
        )
    }

    /// A short lowercase name (`cond`, `call`, `ret` ...), used by the CLI.
    pub fn name(self) -> &'static str {
        match self {
            InsnClass::Other => "other",
            InsnClass::CondBranch => "cond",
            InsnClass::DirectJump => "jump",
            InsnClass::DirectCall => "call",
            InsnClass::IndirectJump => "ind-jump",
            InsnClass::IndirectCall => "ind-call",
            InsnClass::Return => "ret",
            InsnClass::FarCall => "far-call",
            InsnClass::FarJump => "far-jump",
            InsnClass::FarReturn => "far-ret",
            InsnClass::SysCall => "syscall",
            InsnClass::SoftInt => "int",
            InsnClass::Ptwrite => "ptwrite",
            InsnClass::Special => "special",
        }
    }
}

/// [`InsnClass::classify`] of every `Code`, indexed by the code's value.
pub(super) fn code_classes() -> &'static [InsnClass] {
    static CLASSES: std::sync::OnceLock<Vec<InsnClass>> = std::sync::OnceLock::new();
    CLASSES.get_or_init(|| Code::values().map(InsnClass::classify).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_table_classifies_like_iced_x86() {
        // Spot checks against the SDM categories; the table is `classify` of every code.
        let cases = [
            (Code::Jne_rel8_64, InsnClass::CondBranch),
            (Code::Loop_rel8_64_RCX, InsnClass::CondBranch),
            (Code::Jmp_rel32_64, InsnClass::DirectJump),
            (Code::Call_rel32_64, InsnClass::DirectCall),
            (Code::Jmp_rm64, InsnClass::IndirectJump),
            (Code::Call_rm64, InsnClass::IndirectCall),
            (Code::Retnq, InsnClass::Return),
            (Code::Retfq, InsnClass::FarReturn),
            (Code::Iretq, InsnClass::FarReturn),
            (Code::Syscall, InsnClass::SysCall),
            (Code::Int3, InsnClass::SoftInt),
            (Code::Ptwrite_rm64, InsnClass::Ptwrite),
            (Code::Mov_cr_r64, InsnClass::Special),
            (Code::Wrmsr, InsnClass::Special),
            (Code::Add_rm64_r64, InsnClass::Other),
            (Code::Nopd, InsnClass::Other),
        ];
        for (code, class) in cases {
            assert_eq!(InsnClass::of_code(code), class, "{code:?}");
        }
        assert_eq!(code_classes().len(), Code::values().len());
        for code in Code::values() {
            assert_eq!(InsnClass::of_code(code), InsnClass::classify(code));
        }
    }
}
