//! Memory of location metadata at scale: what a client holds for `_location`
//! entries (`Location`, as `Client::refresh_location` builds it from the rows it
//! reads), measured as the growth of the process's resident memory (the
//! workspace forbids the unsafe code a counting allocator needs). The default run
//! checks 100,000 entries; the figure in docs/benchmarks.md is the ignored run:
//! `cargo test --release -p pangea-core --test location_memory -- --ignored --nocapture
//! --test-threads=1` (one test at a time: the other's memory would count).

use bytes::Bytes;
use pangea_core::location::{Location, LocationEntry, location_key};
use pangea_proto::Message;
use pangea_proto::v1 as pb;
use std::time::Instant;

/// This process's resident memory, from /proc (Linux).
fn rss_bytes() -> usize {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("/proc/self/statm");
    let pages: usize = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("resident pages");
    pages * 4096
}

/// `n` `_location` rows as a replica returns them: one per user prefix, half of
/// them moved to `eu-resident` with a home region, by a migration job.
fn rows(n: usize) -> Vec<(Bytes, Vec<u8>)> {
    (0..n)
        .map(|i| {
            let key = location_key("ad_profiles", format!("u/{i:08}/").as_bytes());
            let eu = i % 2 == 0;
            let e = pb::LocationEntry {
                policy: if eu { "eu-resident" } else { "global" }.into(),
                home_region: if eu {
                    "eu-west-1".into()
                } else {
                    String::new()
                },
                version: 3,
                migrating_to: String::new(),
                job_id: format!("job-{:04}", i % 1000),
            };
            (key, e.encode_to_vec())
        })
        .collect()
}

/// Builds the client's `Location` from `rows`; (bytes held, seconds taken).
fn measure(rows: &[(Bytes, Vec<u8>)]) -> (Location, usize, f64) {
    let before = rss_bytes();
    // A measurement, not the core's logic: the clock is the test's own.
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    let mut loc = Location::new();
    for (key, value) in rows {
        let e = LocationEntry::from_row(key, value).expect("valid entry");
        loc.set(e.table.clone(), e.prefix.clone(), Some(e));
    }
    let took = started.elapsed().as_secs_f64();
    (loc, rss_bytes().saturating_sub(before), took)
}

#[test]
fn location_entries_cost_a_few_hundred_bytes_each() {
    let n = 100_000;
    let rows = rows(n);
    let (loc, bytes, _) = measure(&rows);
    assert_eq!(loc.len(), n);
    // A key and an entry: two strings, two names, a prefix, a B-tree slot; the
    // allocator's rounding and the resident pages' granularity on top.
    let each = bytes / n;
    assert!(each < 1_024, "{each} bytes an entry");
}

#[test]
#[ignore = "a million entries: run with --release"]
fn a_million_location_entries() {
    let n = 1_000_000;
    let rows = rows(n);
    let wire: usize = rows.iter().map(|(k, v)| k.len() + v.len()).sum();
    let (loc, bytes, took) = measure(&rows);
    assert_eq!(loc.len(), n);
    println!(
        "{n} location entries: {:.1} MiB held ({} bytes an entry), built from {:.1} MiB of \
         rows in {:.2} s ({:.0} ns an entry)",
        bytes as f64 / (1 << 20) as f64,
        bytes / n,
        wire as f64 / (1 << 20) as f64,
        took,
        took * 1e9 / n as f64
    );
}

/// What a client's refresh costs against a replica holding `source`: requests,
/// response bytes and time (the replica's `changes_page`, the encoding, and the
/// client's decoding and applying, in one process), from `cursor` until nothing
/// more follows. Returns the new cursor.
fn refresh(
    source: &Location,
    copy: &mut Location,
    mut cursor: Bytes,
) -> (Bytes, usize, usize, usize, f64) {
    use pangea_core::location::changes_page;
    #[allow(clippy::disallowed_methods)]
    let started = Instant::now();
    let (mut requests, mut bytes, mut entries) = (0, 0, 0);
    let mut building: Option<Location> = None;
    loop {
        let page = changes_page(source, &cursor, 1_000);
        let wire = page.encode_to_vec();
        requests += 1;
        bytes += wire.len();
        let page = pb::LocationChangesResponse::decode(wire.as_slice()).expect("decodes");
        if page.reset {
            building = Some(Location::new());
        }
        let target = building.as_mut().unwrap_or(copy);
        for u in page.updates {
            entries += 1;
            let nul = u.key.iter().position(|&b| b == 0).expect("a location key");
            let table = std::str::from_utf8(&u.key[..nul]).expect("utf-8");
            let entry = u
                .entry
                .map(|e| LocationEntry::from_proto(&u.key, e).expect("valid entry"));
            target.set(table.into(), u.key.slice(nul + 1..), entry);
        }
        cursor = page.cursor;
        if !page.more {
            break;
        }
    }
    if let Some(b) = building {
        *copy = b;
    }
    (
        cursor,
        requests,
        bytes,
        entries,
        started.elapsed().as_secs_f64(),
    )
}

#[test]
#[ignore = "a million entries: run with --release"]
fn refreshing_a_million_location_entries() {
    let n = 1_000_000;
    let mut source = Location::with_epoch(1);
    for (key, value) in rows(n) {
        let e = LocationEntry::from_row(&key, &value).expect("valid entry");
        source.set(e.table.clone(), e.prefix.clone(), Some(e));
    }
    let mut copy = Location::new();
    let report = |what: &str, (requests, bytes, entries, took): (usize, usize, usize, f64)| {
        println!(
            "{what}: {requests} requests, {entries} entries, {bytes} B ({:.2} MiB), {:.3} s",
            bytes as f64 / (1 << 20) as f64,
            took
        );
    };
    let (cursor, r, b, e, t) = refresh(&source, &mut copy, Bytes::new());
    report("first refresh (everything)", (r, b, e, t));
    assert_eq!(copy, source);
    let (cursor, r, b, e, t) = refresh(&source, &mut copy, cursor);
    report("refresh, nothing changed", (r, b, e, t));
    assert_eq!((r, e), (1, 0));
    // A thousand entries move (a migration job's worth of prefixes).
    for i in 0..1_000 {
        let p = format!("u/{:08}/", i * 997);
        let mut e = copy
            .get("ad_profiles", p.as_bytes())
            .expect("entry")
            .clone();
        e.version += 1;
        e.policy = "global".into();
        e.home = None;
        source.set(e.table.clone(), e.prefix.clone(), Some(e));
    }
    let (_, r, b, e, t) = refresh(&source, &mut copy, cursor);
    report("refresh, 1,000 entries changed", (r, b, e, t));
    assert_eq!(e, 1_000);
    assert_eq!(copy, source);
}
