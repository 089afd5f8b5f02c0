//! Storage health: a full disk handled before it breaks the store, and a broken
//! store reopened once space returns.
//!
//! fjall poisons its database on the first failed journal write or fsync (from
//! then on every write fails with `Poisoned`; its docs advise letting the
//! application crash and recover), because after a failed fsync nobody can say what
//! reached the disk. So a replica first keeps fjall away from a full disk: every
//! second it reads the free space of its data directory, and below
//! `disk_reserve_mib` it is **disk full**: client writes are refused at once
//! (`UNAVAILABLE`, naming the replica and the space; clients write at another
//! replica), replicated entries are not applied (gap repair fetches them later), and
//! reads are served as before. Above the reserve plus half of it again, writes
//! resume.
//!
//! If a write fails anyway (the disk filled faster than a second, by another
//! process), the store is **failed**: the driver drops the replication core and
//! the store, and once the free space is back above the reserve it reopens the
//! store — fjall recovers from its journal exactly as after `kill -9`, which every
//! acknowledged write survives (I2) — and rebuilds the core from it (`driver`). Only
//! unacknowledged, unsent writes can be lost that way, as in a crash (I11).

use std::path::Path;
use std::sync::RwLock;

/// Free space below which a failed write counts as a full disk.
pub const FULL_BELOW_BYTES: u64 = 16 << 20;

/// What the store can do now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StorageState {
    Ok,
    /// Free space below the reserve: writes refused, reads served.
    DiskFull {
        free_bytes: u64,
        reserve_bytes: u64,
    },
    /// A write failed; the store is closed until it can be reopened.
    /// `free_bytes`: the free space when it failed (a full disk, if little).
    Failed {
        error: String,
        free_bytes: Option<u64>,
    },
}

impl std::fmt::Display for StorageState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StorageState::Ok => f.write_str("ok"),
            StorageState::DiskFull {
                free_bytes,
                reserve_bytes,
            } => write!(
                f,
                "disk full: {} MiB free, below the reserve of {} MiB",
                free_bytes >> 20,
                reserve_bytes >> 20
            ),
            StorageState::Failed {
                error,
                free_bytes: Some(free),
            } if *free < FULL_BELOW_BYTES => write!(
                f,
                "disk full ({} MiB free): a write failed ({error}); the store is reopened \
                 once there is room",
                free >> 20
            ),
            StorageState::Failed { error, .. } => write!(
                f,
                "storage failed ({error}); reopening once the disk has room"
            ),
        }
    }
}

/// The storage state of one replica and the reserve it keeps.
#[derive(Debug)]
pub struct Disk {
    reserve_bytes: u64,
    state: RwLock<StorageState>,
    /// Fault injection (`fault`): every reading of the free space is 0.
    forced_full: std::sync::atomic::AtomicBool,
}

impl Disk {
    pub fn new(reserve_bytes: u64) -> Disk {
        Disk {
            reserve_bytes,
            state: RwLock::new(StorageState::Ok),
            forced_full: std::sync::atomic::AtomicBool::new(false),
        }
    }

    pub fn reserve_bytes(&self) -> u64 {
        self.reserve_bytes
    }

    pub fn state(&self) -> StorageState {
        self.state.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Why writes are refused now, if they are.
    pub fn refusal(&self) -> Option<StorageState> {
        Some(self.state()).filter(|s| *s != StorageState::Ok)
    }

    /// Whether replicated entries should wait (not Ok).
    pub fn holding(&self) -> bool {
        self.refusal().is_some()
    }

    /// A new reading of the free space: Ok ↔ DiskFull (with hysteresis); a failed
    /// store stays failed until [`Disk::reopened`]. Returns the new state when it
    /// changed.
    pub fn observe(&self, free_bytes: u64) -> Option<StorageState> {
        let free_bytes = if self.forced_full() { 0 } else { free_bytes };
        let mut s = self.state.write().unwrap_or_else(|p| p.into_inner());
        let next = match &*s {
            StorageState::Failed { .. } => return None,
            StorageState::Ok if free_bytes < self.reserve_bytes => StorageState::DiskFull {
                free_bytes,
                reserve_bytes: self.reserve_bytes,
            },
            StorageState::DiskFull { .. } if free_bytes >= self.resume_bytes() => StorageState::Ok,
            StorageState::DiskFull { .. } => StorageState::DiskFull {
                free_bytes,
                reserve_bytes: self.reserve_bytes,
            },
            StorageState::Ok => return None,
        };
        let changed = std::mem::discriminant(&next) != std::mem::discriminant(&*s);
        *s = next.clone();
        changed.then_some(next)
    }

    /// Fault injection: the disk reads as full (`true`) or as it is.
    pub fn force_full(&self, full: bool) {
        self.forced_full
            .store(full, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn forced_full(&self) -> bool {
        self.forced_full.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Free space at which a full disk counts as having room again.
    pub fn resume_bytes(&self) -> u64 {
        self.reserve_bytes + self.reserve_bytes / 2
    }

    /// A write failed: the store is closed until reopened. `free_bytes`: the free
    /// space now, if it could be read.
    pub fn failed(&self, error: String, free_bytes: Option<u64>) {
        *self.state.write().unwrap_or_else(|p| p.into_inner()) =
            StorageState::Failed { error, free_bytes };
    }

    /// The store was reopened.
    pub fn reopened(&self) {
        *self.state.write().unwrap_or_else(|p| p.into_inner()) = StorageState::Ok;
    }
}

/// Bytes free for unprivileged writers on the file system holding `path`.
pub fn free_bytes(path: &Path) -> std::io::Result<u64> {
    let s = nix::sys::statvfs::statvfs(path).map_err(std::io::Error::from)?;
    Ok(s.blocks_available().saturating_mul(s.fragment_size()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn full_below_the_reserve_room_again_above_it_and_a_half() {
        let d = Disk::new(100 * MIB);
        assert_eq!(d.observe(500 * MIB), None);
        assert!(matches!(
            d.observe(99 * MIB),
            Some(StorageState::DiskFull { .. })
        ));
        assert!(d.holding());
        // Just above the reserve is not room enough yet.
        assert_eq!(d.observe(120 * MIB), None);
        assert!(
            d.refusal()
                .is_some_and(|s| s.to_string().contains("120 MiB free"))
        );
        assert_eq!(d.observe(150 * MIB), Some(StorageState::Ok));
        assert!(!d.holding());
    }

    #[test]
    fn a_failed_store_stays_failed_until_reopened() {
        let d = Disk::new(10 * MIB);
        d.failed("Poisoned".into(), Some(1_000 * MIB));
        assert_eq!(d.observe(1_000 * MIB), None);
        assert!(d.state().to_string().contains("storage failed (Poisoned)"));
        d.failed("No space left".into(), Some(MIB));
        assert!(
            d.state()
                .to_string()
                .starts_with("disk full (1 MiB free): a write failed")
        );
        d.reopened();
        assert_eq!(d.state(), StorageState::Ok);
    }

    #[test]
    fn free_space_of_a_real_directory() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        assert!(free_bytes(dir.path())? > 0);
        assert!(free_bytes(&dir.path().join("missing")).is_err());
        Ok(())
    }
}
