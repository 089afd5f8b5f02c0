//! Store benchmarks with HDR histograms (p50/p99/p999), run with
//! `cargo bench -p pangea-store --bench store`. Results go to docs/benchmarks.md.
//!
//! 1. puts, one writer, fsync per write (the default durability);
//! 2. puts, 16 writers sharing fsyncs (group commit);
//! 3. point gets of 1 KiB rows, one reader, random keys;
//! 4. reopen time of a store holding `PANGEA_BENCH_ROWS` (default 1,000,000) 1 KiB rows;
//! 5. the replication log as a replica keeps it: appends, with a purge of what
//!    every peer has and a bounds lookup every 10 entries, early and after
//!    `PANGEA_BENCH_LOG_ENTRIES` (default 200,000) entries (each purge must cost
//!    the same however long the replica has run).
//!
//! `PANGEA_BENCH_DIR` chooses where the data goes (default: a temporary directory).

use bytes::Bytes;
use hdrhistogram::Histogram;
use pangea_core::storage::{LogEntry, RowWrite, Storage, Watermark, WriteBatch};
use pangea_core::{Limits, Mutation, RowMutation, RowState, ScopeId, Timestamp, Version};
use pangea_store::{Durability, Store, StoreOptions};
use std::time::{Duration, Instant};

const VALUE_BYTES: usize = 1024;

fn write(origin: &str, seq: u64, key: &str) -> WriteBatch {
    let ts = Timestamp::new(1_700_000_000_000 + seq, 0);
    let value = Bytes::from(vec![(seq % 251) as u8; VALUE_BYTES]);
    let m = Mutation::SetCell {
        family: "p".into(),
        column: Bytes::from_static(b"profile"),
        value,
    };
    let mutation = RowMutation::new("t", key.to_owned(), vec![m], &Limits::default()).unwrap();
    let mut row = RowState::default();
    row.apply(&Version::new(ts, origin.into()), mutation.mutations(), None);
    WriteBatch {
        rows: vec![RowWrite {
            table: "t".into(),
            key: mutation.row_key().clone(),
            row: Some(row),
        }],
        log: vec![LogEntry {
            scope: ScopeId::global(),
            origin: origin.into(),
            sequence: seq,
            timestamp: ts,
            mutation,
        }],
        watermarks: vec![(
            ScopeId::global(),
            origin.into(),
            Watermark {
                sequence: seq,
                timestamp: ts,
            },
        )],
        ..Default::default()
    }
}

fn report(name: &str, h: &Histogram<u64>, elapsed: Duration) {
    println!(
        "{name:<44} {:>10.0} ops/s   p50 {:>8.1} µs   p99 {:>8.1} µs   p999 {:>8.1} µs   (n={})",
        h.len() as f64 / elapsed.as_secs_f64(),
        h.value_at_quantile(0.50) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
        h.value_at_quantile(0.999) as f64 / 1e3,
        h.len(),
    );
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).unwrap()
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list; nothing to list.
    }
    let base = std::env::var("PANGEA_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let rows: u64 = std::env::var("PANGEA_BENCH_ROWS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1_000_000);
    let dir = tempfile::tempdir_in(&base).unwrap();

    // 1. One writer, fsync per write.
    {
        let store = Store::open(dir.path().join("puts"), StoreOptions::default()).unwrap();
        let mut h = hist();
        let start = Instant::now();
        for seq in 1..=2_000u64 {
            let t = Instant::now();
            store
                .commit_durable(write("o", seq, &format!("k{seq:09}")))
                .unwrap();
            h.record(t.elapsed().as_nanos() as u64).unwrap();
        }
        report("put 1 KiB, 1 writer, fsync each", &h, start.elapsed());
    }

    // 2. Sixteen writers, group commit.
    {
        let store = Store::open(dir.path().join("group"), StoreOptions::default()).unwrap();
        let start = Instant::now();
        let threads: Vec<_> = (0..16)
            .map(|w| {
                let store = store.clone();
                std::thread::spawn(move || {
                    let mut h = hist();
                    let origin = format!("o{w}");
                    for seq in 1..=1_000u64 {
                        let t = Instant::now();
                        store
                            .commit_durable(write(&origin, seq, &format!("k{w}-{seq:09}")))
                            .unwrap();
                        h.record(t.elapsed().as_nanos() as u64).unwrap();
                    }
                    h
                })
            })
            .collect();
        let mut h = hist();
        for t in threads {
            h.add(t.join().unwrap()).unwrap();
        }
        report("put 1 KiB, 16 writers, group commit", &h, start.elapsed());
    }

    // 3 and 4. Load `rows` rows, reopen, then point gets.
    let path = dir.path().join("big");
    {
        let opts = StoreOptions {
            durability: Durability::OsBuffer,
            ..Default::default()
        };
        let mut store = Store::open(&path, opts).unwrap();
        let start = Instant::now();
        let mut batch = WriteBatch::default();
        for seq in 1..=rows {
            let w = write("o", seq, &format!("k{seq:09}"));
            batch.rows.extend(w.rows);
            batch.log.extend(w.log);
            if seq % 1_000 == 0 || seq == rows {
                batch.watermarks = w.watermarks;
                store.write(std::mem::take(&mut batch)).unwrap();
            }
        }
        store.sync().unwrap();
        let elapsed = start.elapsed();
        println!(
            "{:<44} {:>10.0} rows/s   ({rows} rows of {VALUE_BYTES} B in {:.1} s, {} MiB on disk)",
            "bulk load (1,000 rows per batch)",
            rows as f64 / elapsed.as_secs_f64(),
            elapsed.as_secs_f64(),
            store.disk_bytes().unwrap() >> 20
        );
    }
    let start = Instant::now();
    let store = Store::open(&path, StoreOptions::default()).unwrap();
    let reopen = start.elapsed();
    println!(
        "{:<44} {:>10.2} s     ({rows} rows of {VALUE_BYTES} B)",
        "reopen",
        reopen.as_secs_f64()
    );

    let log_entries = std::env::var("PANGEA_BENCH_LOG_ENTRIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200_000);
    log_purges(dir.path(), log_entries);

    let mut h = hist();
    let mut rng = pangea_core::rng::Rng::new(0x2545_f491_4f6c_dd1d);
    let start = Instant::now();
    for _ in 0..100_000 {
        let x = rng.next_u64();
        let key = format!("k{:09}", x % rows + 1);
        let t = Instant::now();
        let row = store.get_row("t", key.as_bytes()).unwrap();
        h.record(t.elapsed().as_nanos() as u64).unwrap();
        assert!(row.is_some());
    }
    report("get 1 KiB, 1 reader, random keys", &h, start.elapsed());
}

/// Benchmark 5: appends to one origin's log, each tenth with a purge of all but
/// the last 100 entries and a bounds lookup (the core's compaction). Reports the
/// purges of the first 10,000 entries and of the last 10,000 of `entries`.
fn log_purges(dir: &std::path::Path, entries: u64) {
    let opts = StoreOptions {
        durability: Durability::OsBuffer,
        ..Default::default()
    };
    let mut store = Store::open(dir.join("purges"), opts).unwrap();
    let (g, o) = (ScopeId::global(), pangea_core::ReplicaId::from("o"));
    let (mut early, mut late) = (hist(), hist());
    let (mut early_time, mut late_time) = (Duration::ZERO, Duration::ZERO);
    for seq in 1..=entries {
        let mut batch = write("o", seq, &format!("k{:06}", seq % 1_000));
        if seq % 10 == 0 {
            batch
                .truncate_log
                .push((g.clone(), o.clone(), seq.saturating_sub(100)));
            let t = Instant::now();
            store.write(batch).unwrap();
            let bounds = store.log_bounds(&g, &o).unwrap();
            let took = t.elapsed();
            assert_eq!(bounds, Some((seq.saturating_sub(100).max(1), seq)));
            let (h, time) = if seq <= 10_000 {
                (&mut early, &mut early_time)
            } else if seq > entries.saturating_sub(10_000) {
                (&mut late, &mut late_time)
            } else {
                continue;
            };
            h.record(took.as_nanos() as u64).unwrap();
            *time += took;
        } else {
            store.write(batch).unwrap();
        }
    }
    report(
        "append + purge + bounds, first 10k entries",
        &early,
        early_time,
    );
    report(
        &format!("append + purge + bounds, last 10k of {}k", entries / 1_000),
        &late,
        late_time,
    );
}
