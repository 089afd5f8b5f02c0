//! Live changes: on SIGHUP (or `pangea topology apply`) a replica re-reads its
//! topology and placement files. An invalid file changes nothing and says why; a
//! valid one is diffed against the running deployment (the diff is logged), then
//! applied: the core recomputes scopes and trees, links to new peers start and
//! links to departed ones end.
//!
//! SIGHUP also reloads the certificate files (trust bundle, CRL, this replica's
//! certificate and key), and a poller checks them every `certs_reload_interval_ms`
//! (30 s by default): new handshakes use the new files, and accepted connections
//! whose peer certificate no longer verifies (revoked, or its CA dropped from the
//! bundle) are closed, each logged and counted in
//! `pangea_frames_rejected_total{reason="certificate_revoked"}` (or
//! `certificate_untrusted`). See `pangea_net::reload`.
//!
//! A changed placement rule does not move rows by itself: rows whose policy the new
//! file changes keep their current policy (pinned) until a migration job — started
//! by one designated replica of both policies — moves them with no downtime
//! (docs/placement.md); the job's flip writes the location entry that matches the
//! new rule.

use crate::Shared;
use crate::audit_log::Outcome;
use crate::driver::Input;
use pangea_topology::placement::PrefixRule;
use pangea_topology::{Deployment, ScopeId};
use std::sync::Arc;

/// Re-reads the files this node started with and applies them. Returns what changed,
/// one line per change.
pub async fn reload(shared: &Arc<Shared>) -> Result<Vec<String>, String> {
    let c = &shared.config;
    let new = Deployment::load(&c.topology, c.placement.as_deref())
        .map_err(|p| format!("reload refused, nothing changed: {p}"))?;
    let Some(me) = new.topology.replica(shared.id.as_str()) else {
        return Err(format!(
            "reload refused: replica {} is not in the new topology (stop it instead)",
            shared.id
        ));
    };
    if me.region != shared.region {
        return Err(format!(
            "reload refused: replica {} moved from {} to {} (a region change needs a new replica)",
            shared.id, shared.region, me.region
        ));
    }
    let old = shared.deployment();
    let layout = old.layout_changes(&new);
    if !layout.is_empty() {
        return Err(format!(
            "reload refused, nothing changed: {}",
            layout.join("; ")
        ));
    }
    let location = shared
        .published
        .with_location(pangea_core::location::Location::clone);
    keeps_every_row(shared, &old, &new, &location)
        .map_err(|why| format!("reload refused, nothing changed: {why}"))?;
    let diff = old.diff(&new);
    let mut lines = Vec::new();
    for r in &diff.replicas_added {
        lines.push(format!("+ replica {r}"));
    }
    for r in &diff.replicas_removed {
        lines.push(format!("- replica {r}"));
    }
    for t in &diff.tree_changes {
        lines.push(format!(
            "scope {}: {} tree edges added, {} removed",
            t.scope,
            t.edges_added.len(),
            t.edges_removed.len()
        ));
    }
    for p in &diff.policy_changes {
        lines.push(format!("policy {}: {}", p.policy, p.change));
    }
    // Rows whose policy the new file changes stay where they are, for now.
    let mut effective = new.clone();
    let mut moves: Vec<(String, String, ScopeId, Option<String>)> = Vec::new();
    for ch in &diff.placement_changes {
        let current = location.scope_of(&old, &ch.table, ch.prefix.as_bytes());
        lines.push(format!(
            "rows of {} under {:?}: policy {} -> {}, home {:?} -> {:?}",
            ch.table, ch.prefix, ch.old_policy, ch.new_policy, ch.old_home, ch.new_home
        ));
        if current != ch.new_policy {
            effective
                .placement
                .rules
                .retain(|r| !(*r.table == *ch.table && r.prefix == ch.prefix));
            effective.placement.rules.push(PrefixRule {
                table: ch.table.as_str().into(),
                prefix: ch.prefix.clone(),
                policy: current.clone(),
            });
            moves.push((
                ch.table.clone(),
                ch.prefix.clone(),
                ch.new_policy.clone(),
                ch.new_home.as_ref().map(|h| h.to_string()),
            ));
        }
    }
    effective
        .placement
        .rules
        .sort_by(|a, b| (&a.table, &a.prefix).cmp(&(&b.table, &b.prefix)));
    let effective = Arc::new(effective);
    if let Some(links) = &shared.links {
        links.learn(&new, &shared.id);
    }
    shared.deployed.set_files(Arc::new(new), &shared.config);
    shared.deployed.set_deployment(effective.clone());
    shared
        .driver
        .send(Input::View(effective.clone()))
        .await
        .map_err(|_| "the replica is shutting down".to_owned())?;
    // One replica of both policies starts each move: the smallest id, so that every
    // replica agrees without talking.
    for (table, prefix, to, home) in moves {
        let from = location.scope_of(&old, &table, prefix.as_bytes());
        let runner = pangea_core::migration::runner_for(&effective, &from, &to);
        match runner {
            Some(r) if r == shared.id => {
                match crate::migration::start(shared, table.clone(), prefix.clone().into(), to.to_string(), home.unwrap_or_default()).await {
                    Ok(job) => lines.push(format!("started migration job {job}")),
                    Err(e) => lines.push(format!("cannot start the migration of {table}/{prefix:?}: {e}")),
                }
            }
            Some(r) => lines.push(format!("replica {r} moves {table}/{prefix:?} to {to}")),
            None => lines.push(format!(
                "no replica is in both {from} and {to}: rows of {table} under {prefix:?} stay in {from}; move them through \"global\" in two steps"
            )),
        }
    }
    for l in &lines {
        tracing::info!("reload: {l}");
    }
    Ok(lines)
}

/// A new deployment must keep a home for every row: no policy that rows are in
/// (a table default, a rule, a rule pinned by an earlier reload, a location entry)
/// may disappear or move to regions none of which held it before, and no table
/// this replica holds rows of may disappear. Rows leave a policy by a migration,
/// never because a file stopped mentioning it.
fn keeps_every_row(
    shared: &Shared,
    old: &Deployment,
    new: &Deployment,
    location: &pangea_core::location::Location,
) -> Result<(), String> {
    let mut in_use: Vec<(ScopeId, String)> = Vec::new();
    for (table, policy) in &old.placement.table_defaults {
        in_use.push((policy.clone(), format!("the default of table {table}")));
    }
    for r in &old.placement.rules {
        in_use.push((
            r.policy.clone(),
            format!("rows of {} under {:?}", r.table, r.prefix),
        ));
    }
    for e in location.entries() {
        let rows = format!(
            "rows of {} under {} (location entry of job {})",
            e.table,
            pangea_core::redact::RedactedKey(&e.prefix),
            e.job_id
        );
        in_use.push((e.policy.clone(), rows.clone()));
        if let Some(to) = &e.migrating_to {
            in_use.push((to.clone(), rows));
        }
    }
    for (policy, what) in &in_use {
        let Some(before) = old.placement.policy(policy) else {
            continue;
        };
        match new.placement.policy(policy) {
            None => {
                return Err(format!(
                    "the new placement file drops policy {policy}, which holds {what}; move \
                     the rows to another policy first (pangea placement move)"
                ));
            }
            Some(after) if after.regions.is_disjoint(&before.regions) => {
                return Err(format!(
                    "policy {policy} would move from regions {:?} to {:?}, none of which \
                     holds its rows ({what}); add the new regions first, let them catch up, \
                     then remove the old ones",
                    before.regions, after.regions
                ));
            }
            Some(_) => {}
        }
    }
    for table in old.placement.schema.tables.keys() {
        if new.placement.schema.table(table).is_some() {
            continue;
        }
        let holds = shared
            .scan(table, &pangea_core::BytesRange::ALL, false, 1)
            .map_err(|e| {
                let e = pangea_core::Chain(&e);
                format!("cannot check table {table} for rows: {e}")
            })?;
        if !holds.is_empty() {
            return Err(format!(
                "the new placement file drops table {table}, which holds rows on replica {}",
                shared.id
            ));
        }
    }
    Ok(())
}

/// Re-reads the certificate files now (SIGHUP), whether or not they changed. A
/// failure changes nothing and is logged.
pub fn reload_certificates(shared: &Shared) {
    match shared.tls.reload() {
        Ok(report) => {
            pangea_net::reload::log_report(shared.tls.files(), &report);
            count_closed(&shared.metrics, &report);
        }
        Err(e) => tracing::error!(
            error = %e,
            "certificate reload refused, keeping the current certificates"
        ),
    }
}

/// Starts the poller of the certificate files (`certs_reload_interval_ms`; 0: none).
pub fn poll_certificates(shared: &Arc<Shared>) {
    let interval_ms = shared.config.certs_reload_interval_ms;
    if interval_ms == 0 {
        tracing::info!("certificate polling off: certificates reload on SIGHUP only");
        return;
    }
    if interval_ms > 60_000 {
        tracing::warn!(
            interval_ms,
            "certificate poll interval above 60 s: revoked certificates may keep their connections longer than the runbook promises"
        );
    }
    let metrics = shared.metrics.clone();
    let started = pangea_net::reload::spawn_poller(
        &shared.tls,
        std::time::Duration::from_millis(interval_ms),
        move |report| count_closed(&metrics, report),
    );
    if let Err(e) = started {
        tracing::error!(error = %e, "cannot poll the certificate files: reload on SIGHUP only");
    }
}

/// Counts the connections a reload closed, by why.
fn count_closed(metrics: &crate::metrics::NodeMetrics, report: &pangea_net::reload::ReloadReport) {
    for closed in &report.closed {
        metrics.inc_frames_rejected(if closed.revoked {
            "certificate_revoked"
        } else {
            "certificate_untrusted"
        });
    }
}

/// Reloads on every SIGHUP until the node stops: certificates first (independent
/// of, and never blocked by, an invalid topology file), then topology and placement.
pub fn on_sighup(shared: Arc<Shared>) {
    tokio::spawn(async move {
        let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        else {
            tracing::warn!("cannot listen for SIGHUP: live reload disabled");
            return;
        };
        while hup.recv().await.is_some() {
            reload_certificates(&shared);
            let principal = pangea_core::auth::Principal::Operator {
                name: "SIGHUP".into(),
            };
            match reload(&shared).await {
                Ok(lines) => {
                    if lines.is_empty() {
                        tracing::info!("reload: no changes");
                    }
                    shared
                        .audit
                        .record(&principal, "reload", "", Outcome::Ok, &lines.join("; "));
                }
                Err(e) => {
                    tracing::error!("{e}");
                    shared
                        .audit
                        .record(&principal, "reload", "", Outcome::Failed, &e);
                }
            }
        }
    });
}
