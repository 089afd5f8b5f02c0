//! Bounded polling of the serving runtime (`serve_poll_us`).
//!
//! A serving thread that has answered everything sleeps in `epoll_wait` until the
//! next datagram, and the kernel takes tens of µs to wake it (more in a VM). Under
//! load the next request comes sooner than that, so the wait for the wake-up is
//! time the replica neither works nor lets its client work: a 1 KiB get benchmark
//! left a fifth of a 2-core machine idle (docs/benchmarks.md, "What bounds it").
//!
//! While requests keep coming, a task here keeps the runtime from sleeping: it
//! yields in a loop, and a single-threaded tokio runtime polls its sockets
//! between turns (a yielded task is woken only after the driver has been
//! polled) instead of parking. Only there: on the multi-threaded runtime a
//! worker that yields polls the sockets only if no parked worker holds the
//! driver, so polling would burn a core and wake nothing sooner; the poller
//! turns itself off there (`threads = 0`). Once no request has come for the
//! window, it sleeps until the next one, so an idle replica costs nothing and a
//! replica sharing its machine with others (a local cluster) polls only while it
//! is being loaded.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

/// The most `serve_poll_us` may be: 10 ms (a window that long is a core given
/// to polling, not a wait skipped).
pub const WINDOW_MAX_US: u64 = 10_000;

/// When the serving runtime polls instead of sleeping.
#[derive(Debug)]
pub struct Poller {
    /// 0: never (the task is not started).
    window: Duration,
    epoch: Instant,
    /// The last request, in µs since `epoch`.
    last_us: AtomicU64,
    /// The task sleeps until `wake`.
    asleep: AtomicBool,
    wake: Notify,
}

impl Poller {
    pub fn new(window: Duration) -> Poller {
        Poller {
            window,
            epoch: Instant::now(),
            last_us: AtomicU64::new(0),
            asleep: AtomicBool::new(true),
            wake: Notify::new(),
        }
    }

    /// The poller for the runtime it is built on: polling only on a
    /// single-threaded runtime; elsewhere a zero window (off, with a warning),
    /// so no request pays for it.
    pub fn for_current_runtime(window: Duration) -> Poller {
        let single_threaded = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        if !window.is_zero() && !single_threaded {
            tracing::warn!(
                serve_poll_us = window.as_micros() as u64,
                "serve_poll_us is ignored on the multi-threaded runtime (threads = 1 for it)"
            );
            return Poller::new(Duration::ZERO);
        }
        Poller::new(window)
    }

    pub fn enabled(&self) -> bool {
        !self.window.is_zero()
    }

    fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// A request came in: poll for the window from now.
    pub fn request(&self) {
        if !self.enabled() {
            return;
        }
        // SeqCst with the poller's re-check after it says it sleeps: either it
        // sees this request, or this sees it asleep and wakes it.
        self.last_us.fetch_max(self.now_us(), Ordering::SeqCst);
        if self.asleep.swap(false, Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }

    /// Whether a request came within the window.
    fn busy(&self) -> bool {
        self.now_us()
            .saturating_sub(self.last_us.load(Ordering::SeqCst))
            < self.window.as_micros() as u64
    }

    /// The polling task: runs on the serving runtime until the runtime stops.
    /// Asleep until the first request.
    pub async fn run(self: Arc<Self>) {
        loop {
            // `notify_one` keeps a permit when no one waits yet: a request
            // between saying it sleeps and this wait is not lost.
            self.wake.notified().await;
            loop {
                while self.busy() {
                    tokio::task::yield_now().await;
                }
                self.asleep.store(true, Ordering::SeqCst);
                // A request between the check and the store found it awake and
                // did not notify: look once more before sleeping.
                if !self.busy() {
                    break;
                }
                self.asleep.store(false, Ordering::SeqCst);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a multi-threaded runtime the poller is off whatever the window.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_multi_threaded_runtime_never_polls() {
        assert!(!Poller::for_current_runtime(Duration::from_micros(500)).enabled());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_single_threaded_runtime_polls_if_asked() {
        assert!(Poller::for_current_runtime(Duration::from_micros(500)).enabled());
        assert!(!Poller::for_current_runtime(Duration::ZERO).enabled());
    }

    /// Off by default (window 0): requests note nothing and wake no one.
    #[test]
    fn a_zero_window_never_polls() {
        let p = Poller::new(Duration::ZERO);
        assert!(!p.enabled());
        p.request();
        assert!(!p.busy());
    }

    /// A request makes the poller busy for the window, then it sleeps until the
    /// next request wakes it.
    #[tokio::test(flavor = "current_thread")]
    async fn polls_for_the_window_after_a_request_then_sleeps() {
        let p = Arc::new(Poller::new(Duration::from_millis(20)));
        let task = tokio::spawn(p.clone().run());
        p.request();
        assert!(p.busy());
        // The task polls (yields) while busy, then goes to sleep.
        let deadline = Instant::now() + Duration::from_secs(5);
        while !p.asleep.load(Ordering::SeqCst) {
            assert!(Instant::now() < deadline, "never went to sleep");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(!p.busy());
        // A request wakes it.
        p.request();
        assert!(!p.asleep.load(Ordering::SeqCst) && p.busy());
        task.abort();
    }
}
