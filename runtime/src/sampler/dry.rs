//! llama.cpp's DRY sampler (being written).
