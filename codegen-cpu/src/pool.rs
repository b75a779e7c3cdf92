//! A persistent thread pool for running kernels over `T` threads (`-t T`): threads are
//! created once; one [`ThreadPool::run`] hands every thread the same job with its index and
//! waits for all of them. Nothing is allocated or spawned per call.
//!
//! Hand-off is an epoch counter: the caller publishes the job and bumps the epoch, workers
//! spin on it (a decode step issues hundreds of kernels a few microseconds apart, so parking
//! between them would cost more than the kernels; after a few µs of `pause` they
//! `sched_yield` between checks, in case the OS put two pool threads on one core), and park
//! on a condition variable after [`ThreadPool::spin_limit`] rounds without work. Completion
//! is a countdown the caller waits on the same way. The caller runs the job as thread 0.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;

/// The job type: called as `job(thread_index, n_threads)` on every thread.
pub type Job<'a> = dyn Fn(usize, usize) + Sync + 'a;

/// Default number of wait rounds before a waiting thread parks: 64 `pause` rounds (~44 ns
/// each on this project's Zen 3 machine) then `sched_yield` rounds (~0.5 µs or a time
/// slice of another thread): about 100 µs or more, longer than the gaps between the kernels
/// of one decode step.
pub const DEFAULT_SPIN: u32 = 512;

struct Shared {
    n_threads: usize,
    spin: u32,
    /// The current job, a `*const &Job` valid while `remaining > 0` for its epoch.
    job: AtomicPtr<()>,
    epoch: AtomicU64,
    remaining: AtomicUsize,
    shutdown: AtomicBool,
    panicked: AtomicBool,
    // Parking of idle workers.
    work_lock: Mutex<()>,
    work_cv: Condvar,
    sleepers: AtomicUsize,
    // Parking of the caller waiting for completion.
    done_lock: Mutex<()>,
    done_cv: Condvar,
    caller_sleeping: AtomicBool,
}

/// A fixed set of threads that run jobs together. See the module doc.
pub struct ThreadPool {
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    run_lock: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.shared.n_threads)
            .finish()
    }
}

impl ThreadPool {
    /// A pool of `n_threads` threads in all (the caller of [`ThreadPool::run`] is one of
    /// them, so `n_threads - 1` are spawned); 0 is treated as 1.
    ///
    /// Errors: the OS refused to spawn a thread.
    pub fn new(n_threads: usize) -> std::io::Result<ThreadPool> {
        ThreadPool::with_spin(n_threads, DEFAULT_SPIN)
    }

    /// As [`ThreadPool::new`], with `spin` rounds of spinning before a waiting thread parks.
    ///
    /// Errors: the OS refused to spawn a thread.
    pub fn with_spin(n_threads: usize, spin: u32) -> std::io::Result<ThreadPool> {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            n_threads,
            spin,
            job: AtomicPtr::new(std::ptr::null_mut()),
            epoch: AtomicU64::new(0),
            remaining: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            work_lock: Mutex::new(()),
            work_cv: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            done_lock: Mutex::new(()),
            done_cv: Condvar::new(),
            caller_sleeping: AtomicBool::new(false),
        });
        let mut pool = ThreadPool {
            shared: shared.clone(),
            workers: Vec::with_capacity(n_threads - 1),
            run_lock: Mutex::new(()),
        };
        for idx in 1..n_threads {
            let s = shared.clone();
            let h = std::thread::Builder::new()
                .name(format!("modelc-worker-{idx}"))
                .spawn(move || worker(s, idx))
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("starting worker thread {idx} of {n_threads}: {e}"),
                    )
                })?;
            pool.workers.push(h);
        }
        Ok(pool)
    }

    /// Number of threads (including the caller).
    pub fn n_threads(&self) -> usize {
        self.shared.n_threads
    }

    /// Spin rounds before a waiting thread parks.
    pub fn spin_limit(&self) -> u32 {
        self.shared.spin
    }

    /// Runs `job(i, n)` for every thread index `i` in `0..n` (`n = n_threads()`), `i = 0` on
    /// the calling thread, and returns when all have finished. Calls from several threads
    /// are serialized; calling `run` from inside a job deadlocks.
    ///
    /// Panics if the job panicked on a worker thread (after all threads have finished).
    pub fn run(&self, job: &Job<'_>) {
        let s = &*self.shared;
        if s.n_threads == 1 {
            job(0, 1);
            return;
        }
        let _guard = self.run_lock.lock().unwrap_or_else(|p| p.into_inner());
        let job_ref: &Job<'_> = job;
        let ptr = &job_ref as *const &Job<'_> as *mut ();
        s.job.store(ptr, Ordering::Relaxed);
        s.remaining.store(s.n_threads - 1, Ordering::Relaxed);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        if s.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = s.work_lock.lock().unwrap_or_else(|p| p.into_inner());
            s.work_cv.notify_all();
        }
        let mine = catch_unwind(AssertUnwindSafe(|| job(0, s.n_threads)));
        // Wait for the workers: `job` must stay alive until every worker is done with it.
        let mut spins = 0u32;
        while s.remaining.load(Ordering::Acquire) != 0 {
            if spins < s.spin {
                spin_round(spins);
                spins += 1;
                continue;
            }
            let mut l = s.done_lock.lock().unwrap_or_else(|p| p.into_inner());
            s.caller_sleeping.store(true, Ordering::SeqCst);
            while s.remaining.load(Ordering::SeqCst) != 0 {
                l = s.done_cv.wait(l).unwrap_or_else(|p| p.into_inner());
            }
            s.caller_sleeping.store(false, Ordering::SeqCst);
        }
        s.job.store(std::ptr::null_mut(), Ordering::Relaxed);
        if let Err(p) = mine {
            std::panic::resume_unwind(p);
        }
        if s.panicked.swap(false, Ordering::Relaxed) {
            panic!("a thread pool job panicked on a worker thread");
        }
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        let s = &*self.shared;
        s.shutdown.store(true, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::SeqCst);
        {
            let _l = s.work_lock.lock().unwrap_or_else(|p| p.into_inner());
            s.work_cv.notify_all();
        }
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Pure `pause` rounds before a waiting thread starts yielding its core between checks.
const PAUSE_ROUNDS: u32 = 64;

/// One round of waiting: `pause` for the first [`PAUSE_ROUNDS`], then `sched_yield`, so that
/// when the OS has put two pool threads on one core (the machine is busy) the one that has
/// work gets to run instead of waiting out the other's spin.
fn spin_round(round: u32) {
    if round < PAUSE_ROUNDS {
        std::hint::spin_loop();
    } else {
        std::thread::yield_now();
    }
}

fn worker(s: Arc<Shared>, idx: usize) {
    let mut seen = 0u64;
    loop {
        // Wait for a new epoch: spin, then park.
        let mut spins = 0u32;
        let mut epoch = s.epoch.load(Ordering::Acquire);
        while epoch == seen {
            if spins < s.spin {
                spin_round(spins);
                spins += 1;
            } else {
                let mut l = s.work_lock.lock().unwrap_or_else(|p| p.into_inner());
                s.sleepers.fetch_add(1, Ordering::SeqCst);
                while s.epoch.load(Ordering::SeqCst) == seen {
                    l = s.work_cv.wait(l).unwrap_or_else(|p| p.into_inner());
                }
                s.sleepers.fetch_sub(1, Ordering::SeqCst);
                drop(l);
            }
            epoch = s.epoch.load(Ordering::Acquire);
        }
        seen = epoch;
        if s.shutdown.load(Ordering::Acquire) {
            return;
        }
        let ptr = s.job.load(Ordering::Relaxed) as *const &Job<'static>;
        // SAFETY: `run` stored a pointer to a live `&Job` before bumping the epoch (the
        // Acquire load of the epoch orders this read after it) and keeps it alive until
        // `remaining` reaches 0, which happens only after this call returns.
        let job: &Job<'_> = unsafe { *ptr };
        if catch_unwind(AssertUnwindSafe(|| job(idx, s.n_threads))).is_err() {
            s.panicked.store(true, Ordering::Relaxed);
        }
        if s.remaining.fetch_sub(1, Ordering::SeqCst) == 1
            && s.caller_sleeping.load(Ordering::SeqCst)
        {
            let _l = s.done_lock.lock().unwrap_or_else(|p| p.into_inner());
            s.done_cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn every_thread_runs_once_per_call() {
        for n in [1, 2, 3] {
            let pool = ThreadPool::new(n).unwrap();
            let hits: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
            for _ in 0..300 {
                pool.run(&|i, nt| {
                    assert_eq!(nt, n);
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            for h in &hits {
                assert_eq!(h.load(Ordering::Relaxed), 300);
            }
        }
    }

    #[test]
    fn parked_workers_wake_up() {
        // No spinning: every wait parks, which exercises the condition variables.
        let pool = ThreadPool::with_spin(2, 0).unwrap();
        let sum = AtomicUsize::new(0);
        for k in 0..200 {
            if k % 50 == 0 {
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            pool.run(&|i, _| {
                sum.fetch_add(i + 1, Ordering::Relaxed);
            });
        }
        assert_eq!(sum.load(Ordering::Relaxed), 200 * 3);
    }

    #[test]
    fn worker_panic_is_reported() {
        let pool = ThreadPool::with_spin(2, 16).unwrap();
        let r = catch_unwind(AssertUnwindSafe(|| {
            pool.run(&|i, _| {
                if i == 1 {
                    panic!("boom");
                }
            })
        }));
        assert!(r.is_err());
        // The pool still works afterwards.
        let c = AtomicUsize::new(0);
        pool.run(&|_, _| {
            c.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(c.load(Ordering::Relaxed), 2);
    }
}
