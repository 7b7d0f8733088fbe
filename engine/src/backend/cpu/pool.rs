//! A persistent thread pool with spinning workers, built for many short parallel calls.
//!
//! A decode step issues a few hundred parallel kernels of 20–60 µs each, so the cost of one
//! dispatch must be a few microseconds at most. Workers therefore spin on an atomic job word
//! between calls and only park (on a condition variable) after `SPIN_TIME` without work, so an
//! idle engine does not keep its cores busy.
//!
//! Except when the pool shares its cores ([`ThreadPool::sharing_cores`]): pipeline ranks on one
//! host that together run more threads than it has cores (each rank takes all the cores, for
//! the moments it computes alone). There a worker spins only `SHARED_SPIN_TIME`, enough to
//! bridge the gap between one kernel and the next within a rank's turn, then parks so as not to
//! hold a core another rank's thread needs; a worker that wakes late leaves its share to the
//! caller, as always.
//!
//! # Protocol
//!
//! One atomic word, `state`, holds the job's epoch, an `OPEN` flag and the number of workers
//! currently inside the job. The caller publishes the job (the closure and the task count), then
//! stores a new epoch with `OPEN` set. A worker joins a job by incrementing the inside-count with a
//! compare-and-swap that only succeeds while `OPEN` is set; it then claims task indices until
//! none are left, and leaves by decrementing the count. The caller claims tasks too; when none
//! are left it clears `OPEN` and waits for the inside-count to reach zero. A worker that wakes
//! late (after `OPEN` was cleared) never touches the job, so the caller never waits for a
//! sleeping or descheduled worker: it just runs the remaining tasks itself.
//!
//! Tasks are claimed from one counter per thread, each on its own cache line: thread `k` first
//! runs the `k`-th contiguous share of the tasks, then takes what is left of the others' shares.
//! While the threads keep to their own shares, claiming a task costs no cache-line transfer
//! (with one shared counter, every claim moved the line between cores: a tenth of a short
//! matmul's time).

use std::any::Any;
use std::cell::{Cell, UnsafeCell};
use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long an idle worker spins before parking.
const SPIN_TIME: Duration = Duration::from_micros(100);
/// The same, for a pool sharing its cores with other ranks' pools.
const SHARED_SPIN_TIME: Duration = Duration::from_micros(20);
/// How long the dispatcher spins waiting for workers to finish before yielding its core.
const WAIT_SPIN_TIME: Duration = Duration::from_micros(50);
/// Bit flag in `state`: the current job accepts new workers.
const OPEN: u64 = 1 << 32;
/// The epoch counter lives above the flag.
const EPOCH_UNIT: u64 = 1 << 33;
/// Mask of the inside-count.
const INSIDE_MASK: u64 = OPEN - 1;

/// The task closure with its lifetime erased; only dereferenced while the job is live.
type TaskFn = dyn Fn(usize) + Sync;

thread_local! {
    /// Set while this thread runs tasks of some pool, so nested `run` calls execute inline
    /// instead of deadlocking on the dispatch lock.
    static IN_POOL: Cell<bool> = const { Cell::new(false) };
}

/// A task counter alone on its cache line (and the adjacent one, which some CPUs fetch in pairs).
#[repr(align(128))]
struct Counter(AtomicUsize);

/// The job word alone on its cache line: idle workers poll it.
#[repr(align(128))]
struct StateWord(AtomicU64);

impl std::ops::Deref for StateWord {
    type Target = AtomicU64;
    fn deref(&self) -> &AtomicU64 {
        &self.0
    }
}

struct Shared {
    /// Epoch (bits 33..), `OPEN` (bit 32), number of workers inside the job (bits 0..32).
    state: StateWord,
    /// The current job's closure. Written by the dispatcher only while no worker is inside
    /// and `OPEN` is clear; read by workers only while they are inside.
    job: UnsafeCell<Option<*const TaskFn>>,
    /// Number of tasks of the current job (same access rule as `job`, but atomic for simplicity).
    n_tasks: AtomicUsize,
    /// Per thread (the caller is 0), the next task index of its share to claim.
    next: Box<[Counter]>,
    /// Set when a task panicked; stops further claiming.
    panicked: AtomicBool,
    /// The first panic payload of the current job.
    panic_payload: Mutex<Option<Box<dyn Any + Send>>>,
    /// How long an idle worker spins before it parks: [`SPIN_TIME`], or `SHARED_SPIN_TIME`.
    spin: Duration,
    /// Parking: workers that found no work for `spin` wait here.
    sleep_lock: Mutex<()>,
    sleep_cv: Condvar,
    sleepers: AtomicUsize,
    shutdown: AtomicBool,
}

// SAFETY: the only non-thread-safe field is `job`, whose accesses follow the protocol above:
// the dispatcher writes it while no worker can read it (`OPEN` clear and inside-count zero, with
// the dispatch lock held), and workers read it only after joining an `OPEN` job, which
// synchronizes-with the dispatcher's release store that followed the write. The closure it
// points to is `Sync`, so calling it from several threads at once is allowed.
unsafe impl Sync for Shared {}
// SAFETY: the raw pointer in `job` is only a borrowed `Sync` closure (see above); everything
// else is `Send`.
unsafe impl Send for Shared {}

impl Shared {
    /// Claims and runs tasks of the current job until none are left (or a task panicked):
    /// those of thread `me`'s share first, then the rest of the others'.
    fn run_tasks(&self, f: &(dyn Fn(usize) + Sync), me: usize) {
        let n = self.n_tasks.load(Ordering::Relaxed);
        let t = self.next.len();
        for k in (me..t).chain(0..me) {
            let end = share_start(k + 1, n, t);
            loop {
                if self.panicked.load(Ordering::Relaxed) {
                    return;
                }
                let i = self.next[k].0.fetch_add(1, Ordering::Relaxed);
                if i >= end {
                    break;
                }
                if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| f(i))) {
                    self.panicked.store(true, Ordering::Relaxed);
                    let mut slot = lock(&self.panic_payload);
                    if slot.is_none() {
                        *slot = Some(payload);
                    }
                    return;
                }
            }
        }
    }
}

/// First task of thread `k`'s share of `n` tasks over `t` threads.
fn share_start(k: usize, n: usize, t: usize) -> usize {
    k * n / t
}

/// Locks a mutex, ignoring poisoning (the pool's own invariants do not depend on it).
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// A persistent pool of `n_threads - 1` workers plus the calling thread.
///
/// [`ThreadPool::run`] may be called from any thread, but calls are serialized by an internal
/// lock: one dispatch runs at a time. A `run` issued from inside a task (nested parallelism)
/// runs its tasks inline on the calling thread.
pub struct ThreadPool {
    n_threads: usize,
    shared: Arc<Shared>,
    workers: Vec<JoinHandle<()>>,
    dispatch: Mutex<()>,
}

impl std::fmt::Debug for ThreadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ThreadPool")
            .field("n_threads", &self.n_threads)
            .finish()
    }
}

impl ThreadPool {
    /// Starts a pool of `n_threads` threads in total, counting the caller of [`ThreadPool::run`];
    /// `n_threads <= 1` starts no worker and runs everything inline.
    pub fn new(n_threads: usize) -> ThreadPool {
        Self::start(n_threads, SPIN_TIME)
    }

    /// As [`ThreadPool::new`], for a pool whose cores other busy threads share: idle workers
    /// park after `SHARED_SPIN_TIME`.
    pub fn sharing_cores(n_threads: usize) -> ThreadPool {
        Self::start(n_threads, SHARED_SPIN_TIME)
    }

    fn start(n_threads: usize, spin: Duration) -> ThreadPool {
        let n_threads = n_threads.max(1);
        let shared = Arc::new(Shared {
            state: StateWord(AtomicU64::new(0)),
            job: UnsafeCell::new(None),
            n_tasks: AtomicUsize::new(0),
            next: (0..n_threads)
                .map(|_| Counter(AtomicUsize::new(0)))
                .collect(),
            panicked: AtomicBool::new(false),
            panic_payload: Mutex::new(None),
            spin,
            sleep_lock: Mutex::new(()),
            sleep_cv: Condvar::new(),
            sleepers: AtomicUsize::new(0),
            shutdown: AtomicBool::new(false),
        });
        let workers = (1..n_threads)
            .map(|k| {
                let shared = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("sluice-cpu-{k}"))
                    .spawn(move || worker_loop(&shared, k))
                    .unwrap_or_else(|e| panic!("cannot spawn CPU worker thread: {e}"))
            })
            .collect();
        ThreadPool {
            n_threads,
            shared,
            workers,
            dispatch: Mutex::new(()),
        }
    }

    /// Total number of threads that run tasks, the caller included.
    pub fn n_threads(&self) -> usize {
        self.n_threads
    }

    /// Runs `f(0)`, …, `f(n_tasks - 1)`, each exactly once, spread over the workers and the
    /// calling thread; returns when all have finished. Tasks are claimed dynamically, so uneven
    /// tasks balance out. A panic in `f` is re-raised here once every task has stopped.
    pub fn run(&self, n_tasks: usize, f: &(dyn Fn(usize) + Sync)) {
        if n_tasks == 0 {
            return;
        }
        if self.n_threads == 1 || n_tasks == 1 || IN_POOL.with(Cell::get) {
            (0..n_tasks).for_each(f);
            return;
        }
        let _guard = lock(&self.dispatch);
        let sh = &*self.shared;
        let prev = sh.state.load(Ordering::Relaxed);
        debug_assert_eq!(prev & (OPEN | INSIDE_MASK), 0);

        // SAFETY: erasing the closure's lifetime is sound because the pointer is only
        // dereferenced by workers inside this job, and this function does not return before
        // the job is closed and every worker has left it (the wait loop below).
        let f_static: *const TaskFn =
            unsafe { std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static TaskFn>(f) };
        // SAFETY: `OPEN` is clear and no worker is inside (checked at the end of the previous
        // dispatch, which we serialize with the `dispatch` lock), so no one reads `job` now.
        unsafe { *sh.job.get() = Some(f_static) };
        sh.n_tasks.store(n_tasks, Ordering::Relaxed);
        for (k, c) in sh.next.iter().enumerate() {
            c.0.store(share_start(k, n_tasks, self.n_threads), Ordering::Relaxed);
        }
        sh.panicked.store(false, Ordering::Relaxed);
        let epoch = (prev & !(OPEN | INSIDE_MASK)).wrapping_add(EPOCH_UNIT);
        // SeqCst pairs with the sleepers' SeqCst increment-then-check (no lost wake-up).
        sh.state.store(epoch | OPEN, Ordering::SeqCst);
        if sh.sleepers.load(Ordering::SeqCst) > 0 {
            let _l = lock(&sh.sleep_lock);
            sh.sleep_cv.notify_all();
        }

        IN_POOL.with(|c| c.set(true));
        sh.run_tasks(f, 0);
        IN_POOL.with(|c| c.set(false));

        // Close the job: late workers can no longer join. Wait for those inside to leave.
        // Spin briefly (they are normally mid-task), then yield: a preempted worker may need
        // this very core to finish.
        let mut s = sh.state.fetch_and(!OPEN, Ordering::AcqRel) & !OPEN;
        let mut spins = 0u32;
        let mut since: Option<Instant> = None;
        while s & INSIDE_MASK != 0 {
            spins += 1;
            let spin = !spins.is_multiple_of(64)
                || since.get_or_insert_with(Instant::now).elapsed() < WAIT_SPIN_TIME;
            if spin {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
            s = sh.state.load(Ordering::Acquire);
        }
        // SAFETY: the job is closed and empty (see above); drop the dangling pointer.
        unsafe { *sh.job.get() = None };

        if sh.panicked.load(Ordering::Relaxed) {
            let payload = lock(&sh.panic_payload).take();
            drop(_guard);
            match payload {
                Some(p) => panic::resume_unwind(p),
                None => panic!("a thread pool task panicked"),
            }
        }
    }
}

fn worker_loop(sh: &Shared, me: usize) {
    IN_POOL.with(|c| c.set(true));
    let mut seen_epoch = 0u64;
    loop {
        // Spin until a new open job appears, then park.
        let mut idle_since: Option<Instant> = None;
        let mut spins = 0u32;
        loop {
            let s = sh.state.load(Ordering::Acquire);
            let epoch = s & !(OPEN | INSIDE_MASK);
            if epoch != seen_epoch {
                if s & OPEN == 0 {
                    seen_epoch = epoch; // Missed it: the caller did all the work.
                    continue;
                }
                // Try to join.
                if sh
                    .state
                    .compare_exchange_weak(s, s + 1, Ordering::Acquire, Ordering::Relaxed)
                    .is_ok()
                {
                    seen_epoch = epoch;
                    break;
                }
                continue;
            }
            if sh.shutdown.load(Ordering::Relaxed) {
                return;
            }
            spins += 1;
            if !spins.is_multiple_of(256) {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let since = *idle_since.get_or_insert(now);
            if now.duration_since(since) < sh.spin {
                continue;
            }
            // Park until the next dispatch or shutdown.
            let mut g = lock(&sh.sleep_lock);
            sh.sleepers.fetch_add(1, Ordering::SeqCst);
            while sh.state.load(Ordering::SeqCst) & !(OPEN | INSIDE_MASK) == seen_epoch
                && !sh.shutdown.load(Ordering::SeqCst)
            {
                g = sh.sleep_cv.wait(g).unwrap_or_else(|e| e.into_inner());
            }
            sh.sleepers.fetch_sub(1, Ordering::SeqCst);
            drop(g);
            idle_since = None;
        }

        // SAFETY: we joined an open job (acquire CAS on `state`), so `job` holds the closure
        // published before the job opened, and the dispatcher keeps it alive until we leave.
        let f = unsafe { *sh.job.get() };
        if let Some(f) = f {
            // SAFETY: see above; the pointer came from a live `&TaskFn`.
            sh.run_tasks(unsafe { &*f }, me);
        }
        sh.state.fetch_sub(1, Ordering::Release);
    }
}

impl Drop for ThreadPool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::SeqCst);
        {
            let _l = lock(&self.shared.sleep_lock);
            self.shared.sleep_cv.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    fn assert_send_sync<T: Send + Sync>() {}

    #[test]
    fn pool_is_send_sync() {
        assert_send_sync::<ThreadPool>();
    }

    fn check_each_once(pool: &ThreadPool, n: usize) {
        let counts: Vec<AtomicU32> = (0..n).map(|_| AtomicU32::new(0)).collect();
        pool.run(n, &|i| {
            counts[i].fetch_add(1, Ordering::Relaxed);
        });
        for (i, c) in counts.iter().enumerate() {
            assert_eq!(c.load(Ordering::Relaxed), 1, "task {i} of {n}");
        }
    }

    /// A spinning pool and one sharing its cores (workers parking at once).
    fn both_kinds(threads: usize) -> [ThreadPool; 2] {
        [ThreadPool::new(threads), ThreadPool::sharing_cores(threads)]
    }

    #[test]
    fn runs_every_task_once() {
        for threads in [1, 2, 3] {
            for pool in both_kinds(threads) {
                assert_eq!(pool.n_threads(), threads);
                for n in [0, 1, 2, 3, 7, 64, 1000] {
                    check_each_once(&pool, n);
                }
            }
        }
    }

    #[test]
    fn many_dispatches_without_deadlock() {
        for pool in both_kinds(2) {
            many_dispatches(&pool);
        }
    }

    fn many_dispatches(pool: &ThreadPool) {
        let total = AtomicUsize::new(0);
        for round in 0..10_000 {
            let n = 1 + round % 9;
            pool.run(n, &|i| {
                total.fetch_add(i + 1, Ordering::Relaxed);
            });
        }
        let expected: usize = (0..10_000)
            .map(|r| {
                let n = 1 + r % 9;
                n * (n + 1) / 2
            })
            .sum();
        assert_eq!(total.load(Ordering::Relaxed), expected);
    }

    #[test]
    fn works_after_workers_park() {
        let pool = ThreadPool::new(2);
        for _ in 0..5 {
            check_each_once(&pool, 16);
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    #[test]
    fn both_threads_participate() {
        for pool in both_kinds(2) {
            let ids = Mutex::new(std::collections::HashSet::new());
            // Tasks that take long enough for the worker to join (a parked one too).
            for _ in 0..50 {
                pool.run(8, &|_| {
                    lock(&ids).insert(std::thread::current().id());
                    std::thread::sleep(Duration::from_micros(200));
                });
            }
            assert_eq!(lock(&ids).len(), 2);
        }
    }

    #[test]
    fn nested_run_executes_inline() {
        let pool = ThreadPool::new(2);
        let total = AtomicUsize::new(0);
        pool.run(4, &|_| {
            pool.run(3, &|j| {
                total.fetch_add(j, Ordering::Relaxed);
            });
        });
        assert_eq!(total.load(Ordering::Relaxed), 4 * 3);
    }

    #[test]
    fn panic_propagates_and_pool_survives() {
        let pool = ThreadPool::new(2);
        let r = panic::catch_unwind(AssertUnwindSafe(|| {
            pool.run(64, &|i| {
                if i == 37 {
                    panic!("boom at {i}");
                }
            });
        }));
        let msg = r.expect_err("the panic must propagate");
        let text = msg.downcast_ref::<String>().cloned().unwrap_or_default();
        assert_eq!(text, "boom at 37");
        check_each_once(&pool, 100);
    }
}
