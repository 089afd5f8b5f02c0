//! Placement migration jobs in the simulator: the `migrate` fault starts one on
//! the replica the node would pick, and each replica's turn steps its jobs before
//! the flush, as `pangea-node`'s driver does (`pangea_core::migration::Job`, the
//! same state machine). A crash drops a replica's jobs with its process; its
//! restart resumes them from the `_jobs` rows its store kept.

use super::*;
use metrics::MigrationSummary;
use pangea_core::migration::{self, Job, Progress, Request};

impl Simulation {
    /// The `migrate` fault `i`: plans the move on its runner and starts it.
    pub(super) fn start_migration(
        &mut self,
        i: usize,
        table: &str,
        prefix: &str,
        to: &str,
        home: &str,
    ) {
        let label = self.sc.faults[i].label.clone();
        let d = self.views[self.client_view].clone();
        let to_scope = ScopeId::from(to);
        // The rows' policy now, as the runner will see it: any live replica's
        // location metadata (all agree once applied).
        let from = self
            .nodes
            .iter()
            .find_map(|n| n.replica.as_ref())
            .map_or_else(
                || d.scope_of(table, prefix.as_bytes()).clone(),
                |rep| rep.scope_of(table, prefix.as_bytes()),
            );
        let Some(runner) = migration::runner_for(&d, &from, &to_scope) else {
            self.checks.other_violations += 1;
            self.checks.violation(format!(
                "fault {label}: no replica is in both {from} and {to}"
            ));
            return;
        };
        let Some(r) = self.names.get(runner.as_str()) else {
            return;
        };
        let node = &mut self.nodes[r];
        if node.foreign {
            return; // its shard runs it
        }
        let nw = node.now(self.now);
        let Some(rep) = node.replica.as_ref() else {
            // As `pangea placement move` against a replica that is down.
            self.checks.other_violations += 1;
            self.checks
                .violation(format!("fault {label}: runner {runner} is down"));
            return;
        };
        let request = Request {
            table: table.to_owned(),
            prefix: Bytes::copy_from_slice(prefix.as_bytes()),
            to: to.to_owned(),
            home: home.to_owned(),
        };
        match Job::plan(rep, &d, request, nw) {
            Ok(job) => {
                self.migrations.push(MigrationSummary {
                    label,
                    job: job.id().to_owned(),
                    runner: runner.to_string(),
                    phase: job.record().phase.clone(),
                    rows_total: 0,
                    rows_copied: 0,
                    start_s: self.now.as_secs_f64(),
                    end_s: None,
                    error: String::new(),
                });
                node.jobs.push(job);
                self.settle(r);
            }
            Err(refused) => {
                self.checks.other_violations += 1;
                self.checks
                    .violation(format!("fault {label}: move refused: {refused}"));
            }
        }
    }

    /// Steps replica `r`'s jobs (before its turn's flush, in `settle`), and asks
    /// for another turn right after this one's commit while one wants it.
    /// One turn of replica `r`'s jobs; whether they want another right after
    /// this turn's commit (`settle` queues it). A job that made progress wrote:
    /// the turn goes to the disk.
    pub(super) fn step_jobs(&mut self, r: usize) -> bool {
        let node = &mut self.nodes[r];
        let nw = node.now(self.now);
        let Some(rep) = node.replica.as_mut() else {
            return false;
        };
        for record in rep.take_assigned_jobs() {
            if !node.jobs.iter().any(|j| j.id() == record.id) {
                node.jobs.push(Job::resumed(record));
            }
        }
        let mut again = false;
        let mut finished = 0;
        let mut k = 0;
        while k < node.jobs.len() {
            let progress = match node.jobs[k].step(rep, nw) {
                Ok(p) => p,
                Err(e) => {
                    // In-memory stores do not fail.
                    self.checks.other_violations += 1;
                    self.checks
                        .violation(format!("{}: migration job failed: {e}", node.id));
                    node.jobs.swap_remove(k);
                    continue;
                }
            };
            let record = node.jobs[k].record();
            if let Some(m) = self
                .migrations
                .iter_mut()
                .find(|m| m.job == record.id && m.end_s.is_none())
            {
                m.phase = record.phase.clone();
                m.rows_total = record.rows_total;
                m.rows_copied = record.rows_copied;
                m.error = record.error.clone();
                if progress == Progress::Finished {
                    m.end_s = Some(self.now.as_secs_f64());
                }
            }
            if progress != Progress::Waiting {
                node.turn.get_or_insert(self.now);
            }
            match progress {
                Progress::Again => again = true,
                Progress::Waiting => {}
                Progress::Finished => {
                    finished += 1;
                    node.jobs.swap_remove(k);
                    continue;
                }
            }
            k += 1;
        }
        for _ in 0..finished {
            self.trace([61, r as u64, 0, 0]);
        }
        again
    }

    /// A replica's jobs asked for another turn.
    pub(super) fn on_jobs(&mut self, r: usize) {
        let node = &mut self.nodes[r];
        node.jobs_at = None;
        if node.paused > 0 {
            return; // its turn comes when it resumes (`resume` settles it)
        }
        self.settle(r);
    }

    /// After a restart: the jobs replica `r` was running, from its store.
    pub(super) fn resume_jobs(&mut self, r: usize) {
        let node = &mut self.nodes[r];
        let Some(rep) = node.replica.as_ref() else {
            return;
        };
        match migration::resumable(rep) {
            Ok(jobs) => node.jobs = jobs,
            Err(e) => {
                self.checks.other_violations += 1;
                self.checks
                    .violation(format!("{}: cannot read its migration jobs: {e}", node.id));
            }
        }
    }
}
