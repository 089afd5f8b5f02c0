//! Location metadata is checked wherever it comes from, and rows leave a replica
//! only after a migration's flip (issue 30 points 3 and 4; docs/placement.md):
//! replays of the attacks that purged a cluster's rows, at the level of the core.

use bytes::Bytes;
use pangea_core::frame::Frame;
use pangea_core::location::{
    JOBS_COLUMN, JOBS_FAMILY, JOBS_TABLE, LOCATION_COLUMN, LOCATION_FAMILY, LOCATION_TABLE,
    LocationEntry, location_key,
};
use pangea_core::replica::{Config, Event, Now, Replica};
use pangea_core::storage::{LogEntry, Storage};
use pangea_core::{Error, Limits, MemStorage, Mutation, RowMutation, ScopeId, Timestamp};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use pangea_topology::ReplicaId;

mod common;
use common::{T0, at, deployment, replica};

fn set(
    table: &str,
    key: &[u8],
    family: &str,
    column: &'static [u8],
    value: Vec<u8>,
) -> RowMutation {
    let m = Mutation::SetCell {
        family: family.into(),
        column: Bytes::from_static(column),
        value: Bytes::from(value),
    };
    RowMutation::new(table, Bytes::copy_from_slice(key), vec![m], &Limits::STORED).unwrap()
}

fn profile(key: &str) -> RowMutation {
    set(
        "ad_profiles",
        key.as_bytes(),
        "profile",
        b"p",
        b"v".to_vec(),
    )
}

fn entry(prefix: &str, policy: &str, job_id: &str) -> LocationEntry {
    LocationEntry {
        table: "ad_profiles".into(),
        prefix: Bytes::copy_from_slice(prefix.as_bytes()),
        policy: policy.into(),
        home: None,
        version: 1,
        migrating_to: None,
        job_id: job_id.into(),
    }
}

fn location_write(e: &LocationEntry) -> RowMutation {
    set(
        LOCATION_TABLE,
        &location_key(&e.table, &e.prefix),
        LOCATION_FAMILY,
        LOCATION_COLUMN,
        e.to_proto().encode_to_vec(),
    )
}

/// Delivers `mutations` to `to` as the next entries of `origin`'s global stream,
/// as a peer would send them: nothing of the propose path checks them.
fn deliver(
    to: &mut Replica<MemStorage>,
    origin: &str,
    first_seq: u64,
    mutations: Vec<RowMutation>,
    now: Now,
) {
    let entries = mutations
        .into_iter()
        .enumerate()
        .map(|(i, mutation)| LogEntry {
            scope: ScopeId::global(),
            origin: origin.into(),
            sequence: first_seq + i as u64,
            timestamp: Timestamp::new(now.wall_ms, i as u16),
            mutation,
        })
        .collect();
    to.handle_frame(now, &ReplicaId::from(origin), Frame::Mutations(entries))
        .unwrap();
    to.flush(now).unwrap();
}

/// The `_jobs` row of migration job `id` moving us/ rows from global to `to`, at
/// `phase`.
fn job_write(id: &str, phase: &str, to: &str) -> RowMutation {
    let job = pb::MigrationJob {
        id: id.into(),
        table: "ad_profiles".into(),
        prefix: Bytes::from_static(b"us/"),
        from_policy: "global".into(),
        to_policy: to.into(),
        runner: "euw1-a".into(),
        phase: phase.into(),
        ..Default::default()
    };
    set(
        JOBS_TABLE,
        id.as_bytes(),
        JOBS_FAMILY,
        JOBS_COLUMN,
        job.encode_to_vec(),
    )
}

fn purge(r: &mut Replica<MemStorage>) -> u64 {
    r.purge_moved_rows().unwrap().iter().map(|p| p.rows).sum()
}

fn rows(r: &Replica<MemStorage>, prefix: &[u8]) -> usize {
    r.storage()
        .scan_rows("ad_profiles", prefix, None, usize::MAX)
        .unwrap()
        .len()
}

fn events(r: &mut Replica<MemStorage>) -> Vec<Event> {
    std::iter::from_fn(|| r.poll_event()).collect()
}

#[test]
fn a_forged_entry_with_an_unknown_policy_is_not_in_force_and_purges_nothing() {
    let d = deployment();
    let mut r = replica(&d, "use1-a");
    deliver(
        &mut r,
        "euw1-a",
        1,
        (0..50).map(|i| profile(&format!("us/{i}"))).collect(),
        at(1),
    );
    assert_eq!(rows(&r, b""), 50);
    // The attack: an entry for prefix "" naming a policy that does not exist.
    deliver(
        &mut r,
        "euw1-a",
        51,
        vec![location_write(&entry("", "nope", "forged"))],
        at(2),
    );
    assert_eq!(purge(&mut r), 0);
    assert_eq!(rows(&r, b""), 50, "no row may be purged");
    assert!(
        events(&mut r)
            .iter()
            .any(|e| matches!(e, Event::LocationRefused(i) if i.reason.contains("nope"))),
        "the refusal is reported"
    );
    assert!(r.location().is_empty(), "the entry is not in force");
    assert_eq!(r.scope_of("ad_profiles", b"us/1"), ScopeId::global());
    // Nor after a restart, which rebuilds the location from the store.
    let storage = r.into_storage();
    let r = Replica::new("use1-a".into(), d, Config::default(), storage, 7, at(3)).unwrap();
    assert!(r.location().is_empty());
}

#[test]
fn entries_breaking_the_deployment_are_refused_each_for_its_reason() {
    let d = deployment();
    let cases: Vec<(LocationEntry, &str)> = vec![
        (
            LocationEntry {
                table: "no_such_table".into(),
                ..entry("", "global", "j")
            },
            "no such table",
        ),
        (
            LocationEntry {
                table: "_jobs".into(),
                ..entry("", "global", "j")
            },
            "system tables",
        ),
        (entry("eu/", "nope", "j"), "unknown placement policy"),
        (
            LocationEntry {
                home: Some("us-east-1".into()),
                ..entry("eu/", "eu-resident", "j")
            },
            "home region",
        ),
        (
            LocationEntry {
                migrating_to: Some("nowhere".into()),
                ..entry("eu/", "eu-resident", "j")
            },
            "to migrate to",
        ),
        (entry("eu/", "eu-resident", ""), "job id"),
    ];
    for (e, reason) in cases {
        let err = e.check(&d).expect_err(reason);
        assert!(err.reason.contains(reason), "{err} lacks {reason:?}");
        // A local write of it is refused before it enters any stream.
        let mut r = replica(&d, "euw1-a");
        if e.table.starts_with('_') {
            continue; // refused by name before any check (system tables)
        }
        let refused = r.propose(at(1), location_write(&e));
        assert!(
            matches!(refused, Err(Error::Malformed { .. })),
            "{refused:?}"
        );
    }
    assert!(entry("eu/", "eu-resident", "j").check(&d).is_ok());
}

#[test]
fn deletes_and_merges_of_location_rows_are_refused_at_the_origin() {
    let d = deployment();
    let mut r = replica(&d, "euw1-a");
    let key = location_key("ad_profiles", b"eu/");
    let delete = RowMutation::new(
        LOCATION_TABLE,
        key.clone(),
        vec![Mutation::DeleteFromRow],
        &Limits::STORED,
    )
    .unwrap();
    assert!(r.propose(at(1), delete).is_err());
    // A merge of a valid entry's row state: still not the one way entries are made.
    let mut state = pangea_core::RowState::default();
    let valid = location_write(&entry("eu/", "eu-resident", "job-1"));
    state.apply(
        &pangea_core::Version::new(Timestamp::new(T0, 0), "euw1-a".into()),
        valid.mutations(),
        None,
    );
    let merge = RowMutation::new(
        LOCATION_TABLE,
        key,
        vec![Mutation::MergeRow(Box::new(state))],
        &Limits::STORED,
    )
    .unwrap();
    assert!(r.propose(at(1), merge).is_err());
    // The one way: a set of the entry cell, valid under the deployment.
    assert!(r.propose(at(1), valid).is_ok());
}

#[test]
fn a_valid_entry_without_a_flip_moves_routing_but_purges_nothing() {
    let d = deployment();
    let mut r = replica(&d, "use1-a");
    deliver(
        &mut r,
        "euw1-a",
        1,
        (0..20).map(|i| profile(&format!("us/{i}"))).collect(),
        at(1),
    );
    // A well-formed entry putting us/ rows in eu-resident, which excludes
    // use1-a, but no migration job backfilled and flipped them.
    deliver(
        &mut r,
        "euw1-a",
        21,
        vec![location_write(&entry("us/", "eu-resident", "job-1"))],
        at(2),
    );
    assert_eq!(purge(&mut r), 0);
    assert_eq!(
        rows(&r, b"us/"),
        20,
        "rows stay until a flip proves them held elsewhere"
    );
    assert!(
        events(&mut r)
            .iter()
            .any(|e| matches!(e, Event::PurgeWithheld { .. }))
    );
    // A `_jobs` row that is not at its flip, or flips to another policy, does not
    // count.
    deliver(
        &mut r,
        "euw1-a",
        22,
        vec![
            job_write("job-2", "backfill", "eu-resident"),
            location_write(&LocationEntry {
                version: 2,
                ..entry("us/", "eu-resident", "job-2")
            }),
            job_write("job-3", "flip", "global"),
            location_write(&LocationEntry {
                version: 3,
                ..entry("us/", "eu-resident", "job-3")
            }),
        ],
        at(3),
    );
    assert_eq!(purge(&mut r), 0);
    assert_eq!(rows(&r, b"us/"), 20);
}

#[test]
fn the_flip_of_a_finished_backfill_purges_the_rows_it_moved() {
    let d = deployment();
    let mut r = replica(&d, "use1-a");
    deliver(
        &mut r,
        "euw1-a",
        1,
        (0..20).map(|i| profile(&format!("us/{i}"))).collect(),
        at(1),
    );
    deliver(&mut r, "euw1-a", 21, vec![profile("apac/1")], at(1));
    deliver(
        &mut r,
        "euw1-a",
        22,
        vec![
            job_write("job-3", "flip", "eu-resident"),
            location_write(&entry("us/", "eu-resident", "job-3")),
        ],
        at(2),
    );
    let purged = r.purge_moved_rows().unwrap();
    assert_eq!(purged.len(), 1);
    assert_eq!((purged[0].rows, purged[0].job_id.as_str()), (20, "job-3"));
    assert_eq!(rows(&r, b"us/"), 0);
    assert_eq!(rows(&r, b"apac/"), 1, "rows outside the prefix stay");
}

#[test]
fn the_audit_judges_stores_by_the_placement_file_not_by_location_entries() {
    let d = deployment();
    let us = ReplicaId::from("use1-a");
    let eu = ReplicaId::from("euw1-a");
    let mut loc = pangea_core::location::Location::new();
    // As the placement file says: eu/ rows only in the EU.
    assert!(!loc.audit_allows(&d, &d, &us, "ad_profiles", b"eu/1"));
    assert!(loc.audit_allows(&d, &d, &eu, "ad_profiles", b"eu/1"));
    assert!(loc.audit_allows(&d, &d, &us, "ad_profiles", b"us/1"));
    // An entry (well-formed, so in force) moving eu/ rows to global: an American
    // replica holding them is still a violation, as the file keeps them in the EU.
    let e = entry("eu/", "global", "job-9");
    loc.set(e.table.clone(), e.prefix.clone(), Some(e));
    assert_eq!(loc.scope_of(&d, "ad_profiles", b"eu/1"), ScopeId::global());
    assert!(!loc.audit_allows(&d, &d, &us, "ad_profiles", b"eu/1"));
    assert!(loc.audit_allows(&d, &d, &eu, "ad_profiles", b"eu/1"));
    // Narrowing is fine: us/ rows moved into the EU are allowed there, and no
    // longer in the US.
    let e = entry("us/", "eu-resident", "job-10");
    loc.set(e.table.clone(), e.prefix.clone(), Some(e));
    assert!(loc.audit_allows(&d, &d, &eu, "ad_profiles", b"us/1"));
    assert!(!loc.audit_allows(&d, &d, &us, "ad_profiles", b"us/1"));
}

#[test]
fn moves_may_narrow_residency_never_widen_it() {
    use pangea_core::location::escapes_residency;
    let d = deployment();
    let global = ScopeId::global();
    let eu = ScopeId::from("eu-resident");
    assert_eq!(
        escapes_residency(&d, "ad_profiles", b"eu/", &global),
        Some(eu.clone())
    );
    assert_eq!(
        escapes_residency(&d, "ad_profiles", b"eu/x", &global),
        Some(eu.clone())
    );
    assert_eq!(escapes_residency(&d, "ad_profiles", b"eu/", &eu), None);
    assert_eq!(escapes_residency(&d, "ad_profiles", b"us/", &eu), None);
    assert_eq!(escapes_residency(&d, "ad_profiles", b"us/", &global), None);
    // A prefix covering eu/ rows (here: every row) may not go global either.
    assert_eq!(
        escapes_residency(&d, "ad_profiles", b"", &global),
        Some(eu.clone())
    );
    assert_eq!(
        escapes_residency(&d, "ad_profiles", b"e", &global),
        Some(eu)
    );
}
