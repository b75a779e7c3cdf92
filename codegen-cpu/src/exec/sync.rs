//! How the threads of one step share the work of each op phase: a counter hands out chunk
//! indices (`next`), another counts finished chunks (`done`); a thread that finds no chunk
//! left waits until `done` reaches the phase's chunk count, then moves on to the next
//! phase. A thread the OS preempts between chunks delays nobody; one preempted inside a
//! chunk delays only the end of that phase (with a barrier per op, as ggml has, every
//! preemption stalls all threads).
//!
//! Waiting spins with `pause` and yields the core after a while (the machine is shared). A
//! thread that fails (a panic caught by the step) poisons the step, so the others leave
//! their wait instead of waiting forever; the step then reports the failure.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// `pause` rounds between `yield_now` calls while waiting: about 0.2 ms on this project's
/// machine (a `pause` takes about 55 ns there). Measured on SmolLM2 decode with 2 threads
/// and a barrier per op: yielding after 15 µs halved the token rate (a yield can cost a
/// whole time slice when other processes are runnable), never yielding collapsed it when
/// another process held a core.
const SPINS_BEFORE_YIELD: u32 = 4096;

/// The two counters of one phase, on their own cache lines.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Progress {
    next: AtomicUsize,
    done: AtomicUsize,
}

/// The counters of every phase of one step (see the module doc).
#[derive(Debug)]
pub(crate) struct StepSync {
    phases: Vec<Progress>,
    poisoned: AtomicBool,
}

impl StepSync {
    /// Counters for `n` phases.
    pub fn new(n: usize) -> StepSync {
        StepSync {
            phases: (0..n).map(|_| Progress::default()).collect(),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Zeroes every counter before a step (no thread may be running it).
    pub fn reset(&self) {
        for p in &self.phases {
            p.next.store(0, Ordering::Relaxed);
            p.done.store(0, Ordering::Relaxed);
        }
        self.poisoned.store(false, Ordering::Relaxed);
    }

    /// Makes every current and future wait return `false`.
    pub fn poison(&self) {
        self.poisoned.store(true, Ordering::Release);
    }

    /// Whether a thread poisoned the step.
    pub fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// The next chunk index of phase `i` (may be past its chunk count: nothing left).
    #[inline]
    pub fn grab(&self, i: usize) -> usize {
        self.phases[i].next.fetch_add(1, Ordering::Relaxed)
    }

    /// Records one finished chunk of phase `i` (its writes become visible to waiters).
    #[inline]
    pub fn finish(&self, i: usize) {
        self.phases[i].done.fetch_add(1, Ordering::Release);
    }

    /// Waits until `n` chunks of phase `i` are finished; `false` if the step was poisoned.
    pub fn wait(&self, i: usize, n: usize) -> bool {
        let done = &self.phases[i].done;
        let mut spins = 0u32;
        while done.load(Ordering::Acquire) < n {
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

    /// Three threads share 50 phases of 7 chunks: every chunk runs exactly once and no
    /// thread leaves a phase before all of its chunks are done.
    #[test]
    fn chunks_run_once_and_phases_do_not_overlap() {
        let s = StepSync::new(50);
        let runs: Vec<AtomicU64> = (0..50 * 7).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| {
                    for ph in 0..50 {
                        loop {
                            let c = s.grab(ph);
                            if c >= 7 {
                                break;
                            }
                            runs[ph * 7 + c].fetch_add(1, Ordering::Relaxed);
                            s.finish(ph);
                        }
                        assert!(s.wait(ph, 7));
                        for c in 0..7 {
                            assert_eq!(runs[ph * 7 + c].load(Ordering::Relaxed), 1);
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn poison_releases_waiters() {
        let s = StepSync::new(1);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| s.wait(0, 1));
            std::thread::sleep(std::time::Duration::from_millis(10));
            s.poison();
            assert!(!h.join().unwrap());
        });
    }
}
