//! What operators need while faults happen (issue 31 point 6): one replica of a
//! local cluster stopped, started and restarted while the others run, its log
//! appended to (never truncated), and `--deadline-ms` honoured by operator commands.

mod common;

use anyhow::{Context, Result, ensure};
use common::{Cluster, pangea};
use std::time::Duration;

fn cli(args: &[&str]) -> Result<(bool, String)> {
    let out = pangea(args, Duration::from_secs(60))?;
    Ok((
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    ))
}

#[test]
fn one_replica_stops_starts_and_restarts_and_its_log_grows() -> Result<()> {
    let mut c = Cluster::up(false)?;
    let dir = c.dir.path().to_str().context("path")?.to_owned();
    let log = c.replica("use1-b")?.log.clone().context("log")?;
    let before = std::fs::read_to_string(&log)?;
    ensure!(before.contains("replica serving"), "{before}");

    let (ok, out) = cli(&["cluster", "stop", "--data-dir", &dir, "use1-b"])?;
    ensure!(ok && out.contains("stopped replica use1-b"), "{out}");
    c.reload()?;
    ensure!(
        c.replica("use1-b")?.pid.is_none(),
        "still recorded as running"
    );
    ensure!(
        c.admin_get("use1-a", "/health")?.0 == 200,
        "the others keep running"
    );
    let (ok, out) = cli(&["cluster", "stop", "--data-dir", &dir, "nope"])?;
    ensure!(!ok && out.contains("\"nope\" is not in"), "{out}");

    let (ok, out) = cli(&["cluster", "start", "--data-dir", &dir, "use1-b"])?;
    ensure!(ok && out.contains("started replica use1-b"), "{out}");
    c.reload()?;
    ensure!(c.admin_get("use1-b", "/health")?.0 == 200);
    let (ok, out) = cli(&["cluster", "restart", "--data-dir", &dir, "use1-b"])?;
    ensure!(ok && out.contains("started replica use1-b"), "{out}");
    c.reload()?;

    // The log kept the first run's lines and gained two more starts.
    let after = std::fs::read_to_string(&log)?;
    ensure!(after.starts_with(&before), "the log was truncated");
    ensure!(
        after.matches("replica serving").count() == 3,
        "{} starts in the log",
        after.matches("replica serving").count()
    );

    // --deadline-ms reaches operator calls: 1 ms is too short to audit 3,000 rows.
    let rt = common::runtime()?;
    rt.block_on(async {
        let fe = c.client(common::US, "frontend").await?;
        let mut tasks = tokio::task::JoinSet::new();
        for lane in 0..16 {
            let fe = fe.clone();
            tasks.spawn(async move {
                for i in (lane..3_000).step_by(16) {
                    let m = common::profile_set(format!("us/{i:05}"), &b"v"[..])?;
                    fe.mutate(m, &common::setup_writes()).await?;
                }
                anyhow::Ok(())
            });
        }
        while let Some(r) = tasks.join_next().await {
            r??;
        }
        anyhow::Ok(())
    })?;
    let cluster = c.cluster_path();
    let cluster = cluster.to_str().context("path")?;
    let (ok, out) = cli(&[
        "placement",
        "audit",
        "--cluster",
        cluster,
        "--region",
        common::US,
        "--deadline-ms",
        "1",
    ])?;
    ensure!(!ok && out.to_lowercase().contains("deadline"), "{out}");
    let (ok, out) = cli(&[
        "placement",
        "audit",
        "--cluster",
        cluster,
        "--region",
        common::US,
    ])?;
    ensure!(ok, "{out}");
    c.down(common::CLEANUP_GRACE_MS)?;
    let _ = &mut c;
    Ok(())
}
