//! CPU priorities of a replica's threads: serving first, then the driver (writes
//! and replication), then the store's flushes and compactions.
//!
//! On a machine with few cores the serving threads share the CPU with the driver
//! and fjall's workers; at equal priority the kernel hands each a slice of
//! milliseconds in turn, and every read that arrives while the serving thread
//! waits for its turn waits too. On the mixed load at half of capacity (2 cores,
//! docs/benchmarks.md "A mixed load") reads p99 went from 3.9–23.6 ms in four
//! rounds to 3.0–4.4 ms with the driver at nice 5 and fjall's workers at 10,
//! writes' p99 unchanged; RocksDB lowers its compaction threads the same way.
//! Nice values only ever rise here (a lower one needs privileges); a priority
//! that cannot be set is logged and the replica runs on.

/// Raises the calling thread's nice value to `nice` (0 leaves it).
pub(crate) fn lower_this_thread(nice: i32, what: &str) {
    if nice <= 0 {
        return;
    }
    #[cfg(target_os = "linux")]
    set(rustix::thread::gettid(), nice, what);
    #[cfg(not(target_os = "linux"))]
    tracing::debug!(what, nice, "thread priorities are set on Linux only");
}

/// Raises the nice value of the store's worker threads (fjall's flushes and
/// compactions, named `fjall:worker`) to `nice`; returns how many it found.
/// Called after every open of the store: a reopened store has new workers.
pub(crate) fn lower_store_workers(nice: i32) -> usize {
    if nice <= 0 {
        return 0;
    }
    #[cfg(target_os = "linux")]
    {
        let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
            tracing::warn!("cannot list this process's threads; store workers keep their priority");
            return 0;
        };
        let mut found = 0;
        for task in tasks.flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            let tid = task
                .file_name()
                .to_str()
                .and_then(|t| t.parse::<i32>().ok());
            if let (Some(tid), "fjall:worker") = (tid, comm.trim_end()) {
                // A thread id from /proc/self/task names a live thread of ours,
                // or one that just ended (setpriority then fails: logged).
                if let Some(pid) = rustix::process::Pid::from_raw(tid) {
                    set(pid, nice, "store worker");
                    found += 1;
                }
            }
        }
        found
    }
    #[cfg(not(target_os = "linux"))]
    {
        tracing::debug!(nice, "thread priorities are set on Linux only");
        0
    }
}

#[cfg(target_os = "linux")]
fn set(tid: rustix::process::Pid, nice: i32, what: &str) {
    // Never lower a nice value someone raised further (`nice -n 15 pangea start`).
    let current = rustix::process::getpriority_process(Some(tid)).unwrap_or(0);
    if current >= nice {
        return;
    }
    if let Err(e) = rustix::process::setpriority_process(Some(tid), nice) {
        tracing::warn!(what, nice, error = %e, "cannot lower a thread's CPU priority");
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    fn nice_of(tid: rustix::process::Pid) -> i32 {
        rustix::process::getpriority_process(Some(tid)).unwrap_or(i32::MIN)
    }

    /// A thread lowers itself, and only itself; it never comes back up.
    #[test]
    fn a_thread_lowers_its_own_priority_and_no_other() {
        let main = rustix::thread::gettid();
        let before = nice_of(main);
        let lowered = std::thread::spawn(|| {
            lower_this_thread(7, "test");
            let t = rustix::thread::gettid();
            let once = nice_of(t);
            lower_this_thread(3, "test");
            (once, nice_of(t))
        })
        .join()
        .expect("thread");
        assert_eq!(lowered, (7.max(before), 7.max(before)));
        assert_eq!(nice_of(main), before, "the calling thread only");
    }

    /// Threads named as fjall names its workers are found and lowered.
    #[test]
    fn store_workers_are_found_by_name_and_lowered() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let worker = std::thread::Builder::new()
            .name("fjall:worker".into())
            .spawn(move || {
                let _ = tx.send(rustix::thread::gettid());
                let _ = done_rx.recv();
            })
            .expect("spawn");
        let tid = rx.recv().expect("tid");
        assert!(lower_store_workers(9) >= 1);
        assert!(nice_of(tid) >= 9, "nice {}", nice_of(tid));
        let _ = done_tx.send(());
        worker.join().expect("join");
    }
}
