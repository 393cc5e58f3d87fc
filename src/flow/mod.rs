//! Instruction-flow reconstruction: packets + process image → executed instructions and events.
