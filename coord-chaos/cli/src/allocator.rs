//! The `chaos` binary's allocator settings: it runs on mimalloc and calls
//! [`keep_freed_memory`] first thing in `main`.

/// Tells mimalloc to keep the memory it frees for reuse, never returning it to the OS.
///
/// A simulation frees and allocates small objects (tasks, messages, views, history records)
/// at a high rate. By default mimalloc hands pages freed for 10 ms back to the OS, and the next
/// allocation there faults them in again, zeroed: at 1,000 simulated hosts, 12% of a run's
/// time was the kernel's page faults and zeroing, 3% with the memory kept, and the run's
/// rate once started a tenth to a fifth higher in alternated runs (BENCHMARKS.md). Its peak
/// memory is the same: the history grows to the end of a run anyway.
///
/// A no-op unless mimalloc is the global allocator. Call it before the simulations start.
#[allow(unsafe_code)]
pub(crate) fn keep_freed_memory() {
    // `mi_option_purge_delay`, mimalloc v2's 16th option (its `mimalloc.h`), which the sys
    // crate does not name; -1 is "never purge".
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets one of mimalloc's process-wide options, an integer it reads at each
    // purge; no memory is touched, and mimalloc allows options to be set at any time.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) }
}
