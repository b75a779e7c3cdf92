//! Fuzz target: any bytes given to the GGUF reader must give a file or an error, never a
//! panic, a hang or an allocation far beyond the input's size. A file that reads must also
//! survive walking every tensor's data and printing every metadata value.

#![no_main]

use ir::gguf::GgufFile;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = GgufFile::from_bytes(data.to_vec()) {
        for t in f.tensors() {
            let bytes = f.tensor_data(t);
            assert_eq!(bytes.len() as u64, t.n_bytes);
        }
        for (k, v) in f.metadata().iter() {
            let _ = (k.len(), format!("{v:?}").len());
        }
    }
});
