//! The audit log: one JSON line per security-relevant action, in
//! `DATA_DIR/audit.log`: every operator action (placement moves, audits, reloads)
//! whatever its outcome, every refused attempt at an operator action or a system
//! table, every pre-versioned merge, every purge of rows a migration moved away.
//! Each line is also a `pangea.audit` tracing event (logs and OTLP traces).
//!
//! A line: `{"ts_ms":…,"replica":"use1-a","principal":{"kind":"operator","name":"ops"},
//! "action":"placement_move","target":"ad_profiles prefix#3f2a…/4 -> eu-resident",
//! "outcome":"ok","detail":"job …"}`. Targets name tables and policies; key prefixes
//! appear only hashed (`pangea_core::redact`), so the log carries no user data.
//! Lines are written (and flushed to the OS) before the request is answered, so
//! they survive a crash of the process; the file is opened in append mode and never
//! truncated by Pangea (rotate it with logrotate's `copytruncate`).

use pangea_core::auth::Principal;
use serde::Serialize;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The audit log of one replica.
#[derive(Debug)]
pub struct AuditLog {
    path: PathBuf,
    file: Mutex<Option<std::fs::File>>,
    replica: String,
}

/// The outcome of an audited action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    Ok,
    /// Refused by authorization or validation.
    Denied,
    /// Authorized, then failed.
    Failed,
}

#[derive(Serialize)]
struct Who<'a> {
    kind: &'a str,
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    app_profile: Option<&'a str>,
}

#[derive(Serialize)]
struct Line<'a> {
    ts_ms: u64,
    replica: &'a str,
    principal: Who<'a>,
    action: &'a str,
    target: &'a str,
    outcome: Outcome,
    detail: &'a str,
}

impl AuditLog {
    /// Opens (creating) `dir/audit.log` for appending.
    pub fn open(dir: &Path, replica: &str) -> std::io::Result<AuditLog> {
        let path = dir.join("audit.log");
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        Ok(AuditLog {
            path,
            file: Mutex::new(Some(file)),
            replica: replica.to_owned(),
        })
    }

    /// A log that writes only tracing events (tests, tools).
    pub fn events_only(replica: &str) -> AuditLog {
        AuditLog {
            path: PathBuf::new(),
            file: Mutex::new(None),
            replica: replica.to_owned(),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Records one action. A failure to write the file is logged, not returned: the
    /// action itself already happened or was refused.
    pub fn record(
        &self,
        who: &Principal,
        action: &str,
        target: &str,
        outcome: Outcome,
        detail: &str,
    ) {
        let line = Line {
            ts_ms: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
            replica: &self.replica,
            principal: Who {
                kind: who.kind(),
                name: who.name(),
                app_profile: who.app_profile(),
            },
            action,
            target,
            outcome,
            detail,
        };
        tracing::info!(
            target: "pangea.audit",
            principal = %who,
            action,
            target_ = target,
            outcome = ?outcome,
            detail,
            "audit"
        );
        let Ok(mut text) = serde_json::to_vec(&line) else {
            return;
        };
        text.push(b'\n');
        let mut file = self.file.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = file.as_mut()
            && let Err(e) = f.write_all(&text).and_then(|()| f.flush())
        {
            tracing::error!(path = %self.path.display(), error = %e, "cannot write the audit log");
        }
    }
}

/// The replica itself as the actor of what it does on its own (purges after a
/// migration's flip).
pub fn replica_itself(id: &pangea_core::ReplicaId) -> Principal {
    Principal::Replica { id: id.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_json_and_appended() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let log = AuditLog::open(dir.path(), "r1")?;
        let op = Principal::Operator { name: "ops".into() };
        log.record(
            &op,
            "placement_move",
            "t prefix#ab/2 -> p",
            Outcome::Ok,
            "job 1",
        );
        let client = Principal::Client {
            name: "fe".into(),
            app_profile: "frontend".into(),
        };
        log.record(
            &client,
            "placement_move",
            "t",
            Outcome::Denied,
            "an operator certificate is needed",
        );
        drop(log);
        // Reopening appends.
        let log = AuditLog::open(dir.path(), "r1")?;
        log.record(&op, "reload", "", Outcome::Failed, "bad file");
        let text = std::fs::read_to_string(dir.path().join("audit.log"))?;
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(serde_json::from_str)
            .collect::<Result<_, _>>()?;
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[0]["principal"]["kind"], "operator");
        assert_eq!(lines[0]["action"], "placement_move");
        assert_eq!(lines[0]["outcome"], "ok");
        assert_eq!(lines[1]["principal"]["app_profile"], "frontend");
        assert_eq!(lines[1]["outcome"], "denied");
        assert_eq!(lines[2]["outcome"], "failed");
        assert!(lines[2]["ts_ms"].as_u64().is_some_and(|t| t > 0));
        Ok(())
    }
}
