//! The node's time source: monotonic time for timers, wall time for the hybrid
//! logical clock. Wall time carries an adjustable offset so fault injection (the
//! nemesis) can skew one replica's clock without touching the machine's.

use pangea_core::replica::Now;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

#[derive(Debug)]
pub struct Clock {
    start: Instant,
    /// Added to the system's wall clock, in ms.
    offset_ms: AtomicI64,
}

impl Default for Clock {
    fn default() -> Self {
        Clock {
            start: Instant::now(),
            offset_ms: AtomicI64::new(0),
        }
    }
}

impl Clock {
    pub fn now(&self) -> Now {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Now {
            mono_us: self.start.elapsed().as_micros() as u64,
            wall_ms: (wall + self.offset_ms.load(Ordering::Relaxed)).max(0) as u64,
        }
    }

    /// The instant a core timer (in monotonic microseconds) fires.
    pub fn instant_of(&self, mono_us: u64) -> Instant {
        self.start + std::time::Duration::from_micros(mono_us)
    }

    pub fn set_offset_ms(&self, ms: i64) {
        self.offset_ms.store(ms, Ordering::Relaxed);
    }

    pub fn offset_ms(&self) -> i64 {
        self.offset_ms.load(Ordering::Relaxed)
    }
}
