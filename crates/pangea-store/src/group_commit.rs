//! Group commit: many writers, one fsync.
//!
//! Each writer commits its batch to the journal (buffered), takes a ticket, and waits
//! until a sync covering its ticket has finished. Whoever finds no sync in progress
//! becomes the leader: it notes the newest ticket, fsyncs once, and releases every
//! writer up to that ticket. Under load, one fsync covers many writes.

use fjall::{Database, PersistMode};
use pangea_core::StorageError;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};

pub struct GroupCommit {
    db: Database,
    mode: PersistMode,
    /// Tickets handed to writers whose batch is in the journal.
    committed: AtomicU64,
    state: Mutex<SyncState>,
    synced: Condvar,
}

impl std::fmt::Debug for GroupCommit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit")
            .field("committed", &self.committed)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
struct SyncState {
    /// Every ticket up to this one is durable.
    synced: u64,
    /// A leader is fsyncing now.
    syncing: bool,
    /// Fsyncs performed, for statistics.
    syncs: u64,
}

impl GroupCommit {
    pub(crate) fn new(db: Database, mode: PersistMode) -> Self {
        GroupCommit {
            db,
            mode,
            committed: AtomicU64::new(0),
            state: Mutex::default(),
            synced: Condvar::new(),
        }
    }

    /// Call after committing a batch: returns once that batch is durable.
    pub fn sync_after_commit(&self) -> Result<(), StorageError> {
        let ticket = self.committed.fetch_add(1, Ordering::SeqCst) + 1;
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if state.synced >= ticket {
                return Ok(());
            }
            if !state.syncing {
                state.syncing = true;
                // Every ticket up to here was committed before this load.
                let target = self.committed.load(Ordering::SeqCst);
                drop(state);
                let result = self.db.persist(self.mode);
                state = self.state.lock().unwrap_or_else(|p| p.into_inner());
                state.syncing = false;
                if result.is_ok() {
                    state.synced = state.synced.max(target);
                    state.syncs += 1;
                }
                self.synced.notify_all();
                result.map_err(|e| StorageError::Io {
                    doing: "syncing the journal",
                    source: pangea_core::EngineError::new(e),
                })?;
            } else {
                state = self.synced.wait(state).unwrap_or_else(|p| p.into_inner());
            }
        }
    }

    /// Fsyncs performed so far.
    pub fn syncs(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).syncs
    }
}
