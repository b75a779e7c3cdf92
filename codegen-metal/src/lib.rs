//! `codegen-metal`: will generate Metal Shading Language source for the kernels of a plan, for
//! the runtime's Metal device on Apple GPUs. Nothing is generated yet; the CPU target comes first
//! (see DESIGN.md, "Data flow").
