//! `codegen-cuda`: will generate CUDA C source for the kernels of a plan, to be compiled by NVRTC
//! at load time and launched by the runtime's CUDA device. Nothing is generated yet; the CPU
//! target comes first (see DESIGN.md, "Data flow").
