//! How the threads of one step share the work of each op phase. Each thread owns an equal
//! run of the phase's chunks (thread `i` of `T`: chunks `i·n/T .. (i+1)·n/T`) and takes them
//! in order from a counter on its own cache line; a thread whose run is spent takes the
//! next chunks of the other threads' runs (work stealing), so a thread the OS preempts
//! between chunks delays nobody, and one preempted inside a chunk delays only the end of
//! that phase (with a barrier per op, as ggml has, every preemption stalls all threads).
//! Each thread counts its finished chunks on its own line too; a thread that finds no
//! chunk left waits until the counts add up to the phase's chunk count, then moves on to
//! the next phase.
//!
//! Owned runs, not one shared counter: with a shared counter every chunk cost two
//! read-modify-writes of a line the other thread had just written, ~0.3 ms of a SmolLM2
//! decode step (about 180 phases of 16 chunks).
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

/// One thread's counters of one phase, on their own cache lines: `next` the chunks of its
/// run handed out (by it, or to a thief), `done` the chunks it finished (its own or stolen).
#[derive(Debug, Default)]
#[repr(align(128))]
struct Progress {
    next: AtomicUsize,
    done: AtomicUsize,
}

/// The counters of every phase of one step, for every thread (see the module doc).
#[derive(Debug)]
pub(crate) struct StepSync {
    n_threads: usize,
    /// Phase `i`, thread `t`: `slots[i · n_threads + t]`.
    slots: Vec<Progress>,
    poisoned: AtomicBool,
}

/// Chunks `lo..hi` of `n`: the run thread `t` of `n_threads` owns.
fn run_of(t: usize, n: usize, n_threads: usize) -> (usize, usize) {
    (t * n / n_threads, (t + 1) * n / n_threads)
}

impl StepSync {
    /// Counters for `n` phases shared by `n_threads` threads (0 is taken as 1).
    pub fn new(n: usize, n_threads: usize) -> StepSync {
        let n_threads = n_threads.max(1);
        StepSync {
            n_threads,
            slots: (0..n * n_threads).map(|_| Progress::default()).collect(),
            poisoned: AtomicBool::new(false),
        }
    }

    /// Zeroes every counter before a step (no thread may be running it).
    pub fn reset(&self) {
        for p in &self.slots {
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

    fn slot(&self, i: usize, t: usize) -> &Progress {
        &self.slots[i * self.n_threads + t]
    }

    /// The next chunk of phase `i` (of `n`) for thread `ti`: from its own run, then from the
    /// others' (`None`: nothing left). `victim` is the thread's cursor for the phase, 0 at
    /// its start (its own run; `k` the `k`-th thread after it).
    #[inline]
    pub fn grab(&self, i: usize, ti: usize, n: usize, victim: &mut usize) -> Option<usize> {
        while *victim < self.n_threads {
            let owner = (ti + *victim) % self.n_threads;
            let (lo, hi) = run_of(owner, n, self.n_threads);
            if lo < hi {
                let k = self.slot(i, owner).next.fetch_add(1, Ordering::Relaxed);
                if lo + k < hi {
                    return Some(lo + k);
                }
            }
            *victim += 1;
        }
        None
    }

    /// Records one chunk of phase `i` finished by thread `ti` (its writes become visible
    /// to waiters).
    #[inline]
    pub fn finish(&self, i: usize, ti: usize) {
        // Only thread `ti` writes its `done`: a plain store, no read-modify-write.
        let done = &self.slot(i, ti).done;
        done.store(done.load(Ordering::Relaxed) + 1, Ordering::Release);
    }

    /// Chunks of phase `i` finished so far, by all threads.
    fn finished(&self, i: usize) -> usize {
        (0..self.n_threads)
            .map(|t| self.slot(i, t).done.load(Ordering::Acquire))
            .sum()
    }

    /// Waits until `n` chunks of phase `i` are finished; `false` if the step was poisoned.
    pub fn wait(&self, i: usize, n: usize) -> bool {
        let mut spins = 0u32;
        while self.finished(i) < n {
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
        let s = StepSync::new(50, 3);
        let runs: Vec<AtomicU64> = (0..50 * 7).map(|_| AtomicU64::new(0)).collect();
        std::thread::scope(|sc| {
            for ti in 0..3 {
                let (s, runs) = (&s, &runs);
                sc.spawn(move || {
                    for ph in 0..50 {
                        let mut victim = 0;
                        while let Some(c) = s.grab(ph, ti, 7, &mut victim) {
                            runs[ph * 7 + c].fetch_add(1, Ordering::Relaxed);
                            s.finish(ph, ti);
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

    /// A thread whose partners never come (preempted) takes their runs: every chunk, once,
    /// its own run first, then each other thread's in order; the phase completes.
    #[test]
    fn a_lone_thread_steals_every_run() {
        let s = StepSync::new(2, 3);
        let mut victim = 0;
        let got: Vec<usize> = std::iter::from_fn(|| s.grab(1, 1, 7, &mut victim)).collect();
        // Thread 1 owns chunks 2..4; then thread 2's 4..7, then thread 0's 0..2.
        assert_eq!(got, [2, 3, 4, 5, 6, 0, 1]);
        for _ in &got {
            s.finish(1, 1);
        }
        assert!(s.wait(1, 7));
        // Phase 0 is untouched: its chunks are all still there.
        let mut victim = 0;
        assert_eq!(s.grab(0, 0, 3, &mut victim), Some(0));
    }

    #[test]
    fn poison_releases_waiters() {
        let s = StepSync::new(1, 2);
        std::thread::scope(|sc| {
            let h = sc.spawn(|| s.wait(0, 1));
            std::thread::sleep(std::time::Duration::from_millis(10));
            s.poison();
            assert!(!h.join().unwrap());
        });
    }
}
