//! Starting a placement migration job on this replica. The job itself — dual
//! write, backfill, flip, each checkpointed in `_jobs` — is
//! `pangea_core::migration::Job`, which the driver steps with the core each turn
//! (and resumes after a restart); docs/placement.md describes the phases.

use crate::Shared;
use crate::driver::Input;
use bytes::Bytes;
use pangea_core::migration::Request;
use tokio::sync::oneshot;

/// Starts a job moving `table`/`prefix` to policy `to` (with home region `home`,
/// or empty), run here. Returns its id once the job is recorded durably, or why
/// the move was refused.
pub async fn start(
    shared: &Shared,
    table: String,
    prefix: Bytes,
    to: String,
    home: String,
) -> Result<String, String> {
    let (reply, started) = oneshot::channel();
    let request = Request {
        table,
        prefix,
        to,
        home,
    };
    let stopping = || "the replica is shutting down".to_owned();
    shared
        .driver
        .send(Input::StartMigration { request, reply })
        .await
        .map_err(|_| stopping())?;
    started.await.map_err(|_| stopping())?
}
