//! Weights for an engine's loader that give the model file's pages back while they are copied.
//!
//! The CPU engine copies every matrix into a repacked buffer (and small F32 weights into
//! vectors) when it is built; only the embedding table is read in place, a few rows per token.
//! Left alone, the GGUF mapping's pages stay resident next to those copies: for SmolLM2 Q4_1
//! that is 92 MiB counted twice in the process's RSS (measured: peak 225,904 KiB for a 64-token
//! generation without release, 137,412 KiB with it). [`ReleasingGguf::while_loading`] builds the
//! engine while a helper thread advises the kernel every few milliseconds that the mapped pages
//! are not needed ([`GgufFile::release_all_pages`]), then once more at the end, so the file's
//! resident pages never exceed what the loader reads in one period. Nothing becomes invalid: a
//! later read of a released page (a `get_rows` row, or the loader reading a weight again)
//! faults it back in from the page cache. llama.cpp's loader frees what it copied in the same
//! spirit (`llama_mmap::unmap_fragment`).

use ir::gguf::GgufFile;
use ir::interp::{WeightRef, WeightSource};

/// A [`WeightSource`] over a GGUF file whose mapped pages are released while an engine is
/// built from it (module doc).
pub struct ReleasingGguf<'a> {
    gguf: &'a GgufFile,
}

impl<'a> ReleasingGguf<'a> {
    /// Serves the tensors of `gguf`.
    pub fn new(gguf: &'a GgufFile) -> ReleasingGguf<'a> {
        ReleasingGguf { gguf }
    }

    /// The file.
    pub fn gguf(&self) -> &'a GgufFile {
        self.gguf
    }

    /// Releases every mapped page of the file ([`GgufFile::release_all_pages`]); returns the
    /// bytes advised. A failing `madvise` costs only memory, so it is not an error here.
    pub fn release_all(&self) -> u64 {
        self.gguf.release_all_pages().unwrap_or(0)
    }

    /// Runs `load` (an engine build over `self`) while a helper thread releases every mapped
    /// page of the file each `period` (a few milliseconds), then releases them all once more.
    ///
    /// Why a period rather than releasing each tensor once it is copied: a loader may read a
    /// tensor again later from a slice it kept (the embedding table is served first for
    /// `get_rows` and read again when a tied output matrix is repacked, 30 MB for SmolLM2).
    /// Releasing pages the loader is reading is safe (module doc); it only costs a fault.
    pub fn while_loading<T>(&self, period: std::time::Duration, load: impl FnOnce() -> T) -> T {
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let out = std::thread::scope(|s| {
            s.spawn(move || {
                while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(period)
                {
                    self.release_all();
                }
            });
            let out = load();
            drop(stop);
            out
        });
        self.release_all();
        out
    }
}

impl WeightSource for ReleasingGguf<'_> {
    fn weight(&self, name: &str) -> Option<WeightRef<'_>> {
        self.gguf.weight(name)
    }
}
