//! The readiness gate's node side: the record of why a replica trusts its store
//! (`DATA_DIR/readiness`, [`Record`]) and the logs of the gate's progress. The gate
//! itself is `pangea_core::readiness` (docs there), which the simulator's replicas
//! run too.

pub use pangea_core::readiness::{Gate, LISTEN_ALONE, Phase, STALL_MAX};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often progress is logged while catching up (while waiting for peers: ten
/// times less often).
const LOG_EVERY: Duration = Duration::from_secs(1);

/// Why a replica trusts its store, as recorded in `DATA_DIR/readiness`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    /// Created with a new cluster: empty is the truth.
    NewCluster,
    /// Caught up with its peers at least once.
    CaughtUp,
}

impl Record {
    fn path(data_dir: &Path) -> PathBuf {
        data_dir.join("readiness")
    }

    /// What `data_dir` records (`None`: nothing, or a file this version does not
    /// know, which trusts nothing).
    pub fn read(data_dir: &Path) -> Option<Record> {
        match std::fs::read_to_string(Self::path(data_dir)).ok()?.trim() {
            "new-cluster" => Some(Record::NewCluster),
            "caught-up" => Some(Record::CaughtUp),
            _ => None,
        }
    }

    /// Records `self` durably (temporary file, fsync, rename, fsync of the
    /// directory).
    pub fn write(self, data_dir: &Path) -> std::io::Result<()> {
        use std::io::Write as _;
        let text = match self {
            Record::NewCluster => "new-cluster\n",
            Record::CaughtUp => "caught-up\n",
        };
        let path = Self::path(data_dir);
        let tmp = path.with_extension("tmp");
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(data_dir)?.sync_all()
    }
}

/// Logs what the gate does: each change of phase, and progress while it stays
/// closed.
#[derive(Debug)]
pub struct PhaseLog {
    started: Instant,
    logged_at: Instant,
}

impl PhaseLog {
    pub fn new(now: Instant) -> Self {
        PhaseLog {
            started: now,
            logged_at: now,
        }
    }

    /// After an update of `gate` that returned `changed`.
    pub fn note(&mut self, now: Instant, gate: &Gate, changed: Option<&Phase>) {
        let phase = gate.phase();
        let every = match phase {
            Phase::WaitingForPeers { .. } => LOG_EVERY * 10,
            _ => LOG_EVERY,
        };
        if changed.is_none() && now - self.logged_at < every {
            return;
        }
        self.logged_at = now;
        match phase {
            Phase::WaitingForPeers { .. } => tracing::warn!(%phase, "not serving reads"),
            Phase::Relearning { .. } if changed.is_some() => {
                tracing::info!(%phase, "not serving reads or writes")
            }
            Phase::CatchingUp { .. } => tracing::info!(%phase, "not serving reads yet"),
            Phase::Ready if changed.is_some() => {
                if let Some((streams_behind, entries_behind)) = gate.opened_stalled() {
                    tracing::warn!(
                        streams_behind,
                        entries_behind,
                        "catching up made no progress for {STALL_MAX:?}: serving reads anyway"
                    );
                }
                tracing::info!(
                    after_ms = (now - self.started).as_millis() as u64,
                    "caught up: serving reads"
                );
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_unknown_ones_trust_nothing() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        assert_eq!(Record::read(dir.path()), None);
        Record::NewCluster.write(dir.path())?;
        assert_eq!(Record::read(dir.path()), Some(Record::NewCluster));
        Record::CaughtUp.write(dir.path())?;
        assert_eq!(Record::read(dir.path()), Some(Record::CaughtUp));
        std::fs::write(dir.path().join("readiness"), "maybe\n")?;
        assert_eq!(Record::read(dir.path()), None);
        Ok(())
    }
}
