//! How the CPU kernels and the host block operations use rayon's threads:
//! the hot pool a forward pass runs on, and the split of a product or a
//! per-row pass into one task per thread (a leaf module).

/// Runs `f` on one of rayon's threads (in place when already on one) while
/// the pool's other threads wait for work spinning instead of sleeping.
///
/// Why: a decode step on the CPU kernels splits each product over the pool.
/// From outside the pool every split injects its halves and sleeps until
/// they finish; inside, it is a local `join`, but a worker that has gone to
/// sleep between two products takes tens of µs to wake, as long as a small
/// product itself (`cargo bench -p privmix-models --bench forward`, group
/// `quantized_q4_1_1536x576`, compares the pool with one thread).
///
/// Nested calls on the thread running `f` run in place: a forward pass's
/// head inside the whole pass keeps the same spinners.
///
/// The spinners are scoped jobs that run pending work through
/// [`rayon::yield_now`] until `f` returns; one that lands on `f`'s own
/// thread (while `f` waits in a `join`) returns at once, so `f` never
/// waits on a spinner.
pub fn on_hot_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    use std::cell::Cell;
    use std::sync::atomic::{AtomicBool, Ordering};
    thread_local! {
        /// Whether this thread runs inside `on_hot_pool` already.
        static HOT: Cell<bool> = const { Cell::new(false) };
    }
    if HOT.get() {
        return f();
    }
    let done = AtomicBool::new(false);
    rayon::scope(|scope| {
        let home = rayon::current_thread_index();
        for _ in 1..rayon::current_num_threads() {
            let done = &done;
            scope.spawn(move |_| {
                if rayon::current_thread_index() == home {
                    return;
                }
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_now() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        /// Clears the flag when `f` returns or unwinds.
        struct Cool;
        impl Drop for Cool {
            fn drop(&mut self) {
                HOT.set(false);
            }
        }
        HOT.set(true);
        let cool = Cool;
        let out = f();
        drop(cool);
        done.store(true, Ordering::Release);
        out
    })
}

/// Runs `f(index, task)` for every task, in parallel on rayon's pool: the
/// split of one product or pass into one task per thread.
///
/// With two tasks the second is spawned and the calling thread, after its
/// own, spins (running the second itself if no thread took it) instead of
/// waiting in rayon's `join`. Why: a waiting rayon worker calls
/// `sched_yield` between its looks for work and sleeps after a few dozen,
/// and a decode step ends a few hundred such splits, each of which would
/// pay a trip through the scheduler. Other counts go through rayon's
/// parallel iterator.
pub fn for_each_task<T: Send>(tasks: Vec<T>, f: impl Fn(usize, T) + Sync) {
    use rayon::prelude::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    match <[T; 2]>::try_from(tasks) {
        Ok([first, second]) => {
            let done = AtomicBool::new(false);
            let (f, done) = (&f, &done);
            rayon::in_place_scope(|scope| {
                scope.spawn(move |_| {
                    f(1, second);
                    done.store(true, Ordering::Release);
                });
                f(0, first);
                while !done.load(Ordering::Acquire) {
                    if rayon::yield_local() != Some(rayon::Yield::Executed) {
                        std::hint::spin_loop();
                    }
                }
            });
        }
        Err(tasks) if tasks.len() > 2 => {
            tasks.into_par_iter().enumerate().for_each(|(i, t)| f(i, t));
        }
        Err(tasks) => tasks.into_iter().enumerate().for_each(|(i, t)| f(i, t)),
    }
}

/// Rows per task when a per-row pass over `rows` rows is split into one
/// run of consecutive rows per rayon thread (for [`for_each_task`]), or all
/// rows in one task unless `parallel`.
///
/// Why runs and not a task per row: the per-row passes of a decode step (the
/// ensemble's LoRA update, host attention) have a few rows of small work each,
/// mostly waiting on memory, and rayon's splitting into a task per row costs
/// more than it gains.
pub fn rows_per_task(rows: usize, parallel: bool) -> usize {
    let tasks = if parallel {
        rayon::current_num_threads().clamp(1, rows.max(1))
    } else {
        1
    };
    rows.div_ceil(tasks).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rayon::prelude::*;

    /// `on_hot_pool` returns `f`'s value and finishes when called from
    /// outside the pool, from inside it, nested in itself and from many
    /// parallel tasks at once (forward passes of several models side by
    /// side), with parallel work inside, on pools of 1 to 4 threads.
    #[test]
    fn hot_pool_runs_nested_and_parallel_calls_to_completion() {
        let work = |seed: u64| -> u64 {
            (0..64u64)
                .into_par_iter()
                .map(|i| (0..200u64).map(|j| (i * 31 + j + seed) % 7).sum::<u64>())
                .sum()
        };
        let want: Vec<u64> = (0..8).map(work).collect();
        for threads in 1..=4 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                assert_eq!(on_hot_pool(|| work(0)), want[0]);
                let got: Vec<u64> = (0..8u64)
                    .into_par_iter()
                    .map(|s| on_hot_pool(|| on_hot_pool(|| work(s))))
                    .collect();
                assert_eq!(got, want);
            });
        }
        // From outside any pool (the global one).
        assert_eq!(on_hot_pool(|| work(3)), want[3]);
    }

    /// `for_each_task` runs every task once with its index, for 0 to 5
    /// tasks, outside and inside pools of 1 to 3 threads (with and without
    /// spinners), nested in itself and from parallel callers.
    #[test]
    fn for_each_task_runs_each_task_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let run = |n: usize| {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            let tasks: Vec<usize> = (0..n).map(|i| 10 * i).collect();
            for_each_task(tasks, |i, t| {
                assert_eq!(t, 10 * i);
                // Nested: each task splits again.
                for_each_task(vec![(); 2], |_, ()| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            });
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 2));
        };
        (0..=5).for_each(run);
        for threads in 1..=3 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(|| {
                (0..=5).for_each(run);
                on_hot_pool(|| (0..=5).for_each(run));
                (0..16usize).into_par_iter().for_each(|n| run(n % 6));
            });
        }
    }
}
