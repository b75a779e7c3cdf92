//! `compiler`: lowering of a GGUF model to the modelc IR (`arch`, one module per architecture
//! family) and the named optimisation passes that turn a graph into a plan (`passes`).
