//! The barrier the threads of one step meet at between kernels (ggml's `ggml_barrier`):
//! a counter and a generation number, spinning with `pause` and yielding the core after a
//! while (the machine is shared); no system call when the threads arrive close together.
//!
//! A thread that fails (a panic caught by the step) poisons the barrier, so the others leave
//! their wait instead of waiting forever; the step then reports the failure.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Spins between `yield_now` calls while waiting.
const SPINS_BEFORE_YIELD: u32 = 1 << 14;

/// A reusable barrier for a fixed number of threads.
#[derive(Debug)]
pub(crate) struct Barrier {
    n: usize,
    count: AtomicUsize,
    generation: AtomicUsize,
    poisoned: AtomicBool,
}

impl Barrier {
    /// A barrier for `n` threads (at least 1).
    pub fn new(n: usize) -> Barrier {
        Barrier {
            n: n.max(1),
            count: AtomicUsize::new(0),
            generation: AtomicUsize::new(0),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Resets the barrier before a step (no thread may be waiting).
    pub fn reset(&self) {
        self.count.store(0, Ordering::Relaxed);
        self.poisoned.store(false, Ordering::Relaxed);
    }

    /// Makes every waiting and future [`Barrier::wait`] return `false`.
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Whether a thread poisoned the barrier.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Waits until all `n` threads have called `wait`; returns `false` if the barrier is
    /// poisoned (the caller should stop).
    pub fn wait(&self) -> bool {
        if self.n == 1 {
            return !self.is_poisoned();
        }
        let gen = self.generation.load(Ordering::Acquire);
        if self.count.fetch_add(1, Ordering::AcqRel) + 1 == self.n {
            self.count.store(0, Ordering::Relaxed);
            self.generation.store(gen.wrapping_add(1), Ordering::Release);
            return !self.is_poisoned();
        }
        let mut spins = 0u32;
        while self.generation.load(Ordering::Acquire) == gen {
            if self.poisoned.load(Ordering::Relaxed) {
                return false;
            }
            std::hint::spin_loop();
            spins += 1;
            if spins == SPINS_BEFORE_YIELD {
                spins = 0;
                std::thread::yield_now();
            }
        }
        !self.is_poisoned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn phases_do_not_overlap() {
        let b = Barrier::new(3);
        let counter = AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    for phase in 0..200u64 {
                        counter.fetch_add(1, Ordering::Relaxed);
                        assert!(b.wait());
                        // Everyone incremented in this phase before anyone passed.
                        assert!(counter.load(Ordering::Relaxed) >= 3 * (phase + 1));
                        assert!(b.wait());
                    }
                });
            }
        });
        assert_eq!(counter.load(Ordering::Relaxed), 600);
    }

    #[test]
    fn poison_releases_waiters() {
        let b = Barrier::new(2);
        std::thread::scope(|s| {
            let h = s.spawn(|| b.wait());
            std::thread::sleep(std::time::Duration::from_millis(10));
            b.poison();
            assert!(!h.join().unwrap());
        });
    }
}
