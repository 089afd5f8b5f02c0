//! The storage contract, checked on both implementations: fjall (`Store`) and the
//! in-memory one from pangea-core that the simulator uses.

use anyhow::Result;
use bytes::Bytes;
use pangea_core::storage::{LogEntry, RowWrite, Storage, Watermark, WriteBatch};
use pangea_core::{
    Limits, MemStorage, Mutation, RowMutation, RowState, ScopeId, Timestamp, Version,
};
use pangea_store::{Store, StoreOptions};

fn set(value: &str) -> RowMutation {
    let m = Mutation::SetCell {
        family: "p".into(),
        column: Bytes::from_static(b"c"),
        value: Bytes::from(value.to_owned()),
    };
    RowMutation::new("t", "k", vec![m], &Limits::default()).unwrap()
}

fn row(value: &str, ms: u64) -> RowState {
    let mut r = RowState::default();
    r.apply(
        &Version::new(Timestamp::new(ms, 0), "o".into()),
        set(value).mutations(),
        None,
    );
    r
}

fn entry(seq: u64) -> LogEntry {
    LogEntry {
        scope: ScopeId::global(),
        origin: "o".into(),
        sequence: seq,
        timestamp: Timestamp::new(seq, 0),
        mutation: set(&format!("v{seq}")),
    }
}

fn contract(s: &mut dyn Storage) -> Result<()> {
    // Rows in two tables, keys chosen to test prefix edges.
    let mut b = WriteBatch::default();
    for (t, k) in [
        ("t", "a"),
        ("t", "ab"),
        ("t", "abc"),
        ("t", "b"),
        ("u", "a"),
    ] {
        b.rows.push(RowWrite {
            table: t.into(),
            key: Bytes::from(k),
            row: Some(row(k, 1)),
        });
    }
    for seq in 1..=5 {
        b.log.push(entry(seq));
    }
    b.watermarks.push((
        ScopeId::global(),
        "o".into(),
        Watermark {
            sequence: 5,
            timestamp: Timestamp::new(5, 0),
        },
    ));
    b.meta.push(("hlc".into(), Some(Bytes::from_static(b"x"))));
    s.write(b)?;
    s.sync()?;

    assert_eq!(s.get_row("t", b"ab")?, Some(row("ab", 1)));
    assert_eq!(s.get_row("t", b"zz")?, None);
    assert_eq!(s.get_row("v", b"a")?, None);
    let keys = |rows: Vec<(Bytes, RowState)>| rows.into_iter().map(|(k, _)| k).collect::<Vec<_>>();
    assert_eq!(
        keys(s.scan_rows("t", b"a", None, 10)?),
        vec!["a", "ab", "abc"]
    );
    assert_eq!(
        keys(s.scan_rows("t", b"a", Some(b"a"), 10)?),
        vec!["ab", "abc"]
    );
    assert_eq!(keys(s.scan_rows("t", b"a", None, 2)?), vec!["a", "ab"]);
    assert_eq!(
        keys(s.scan_rows("t", b"", None, 10)?),
        vec!["a", "ab", "abc", "b"]
    );
    assert_eq!(keys(s.scan_rows("u", b"", None, 10)?), vec!["a"]);
    assert_eq!(
        s.tables()?
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>(),
        vec!["t", "u"]
    );

    assert_eq!(s.log_bounds(&ScopeId::global(), &"o".into())?, Some((1, 5)));
    assert_eq!(s.log_bounds(&ScopeId::global(), &"p".into())?, None);
    let log = s.read_log(&ScopeId::global(), &"o".into(), 3, 10, usize::MAX)?;
    assert_eq!(log, vec![entry(3), entry(4), entry(5)]);
    assert_eq!(
        s.read_log(&ScopeId::global(), &"o".into(), 2, 1, usize::MAX)?,
        vec![entry(2)]
    );
    // A byte budget stops the read after the entries that fit; the first entry
    // comes whatever its size.
    let two = entry(3).wire_bytes() + entry(4).wire_bytes();
    assert_eq!(
        s.read_log(&ScopeId::global(), &"o".into(), 3, 10, two)?,
        vec![entry(3), entry(4)]
    );
    assert_eq!(
        s.read_log(&ScopeId::global(), &"o".into(), 3, 10, 1)?,
        vec![entry(3)]
    );
    assert_eq!(
        s.watermarks()?,
        vec![(
            ScopeId::global(),
            "o".into(),
            Watermark {
                sequence: 5,
                timestamp: Timestamp::new(5, 0)
            }
        )]
    );
    assert_eq!(s.meta("hlc")?, Some(Bytes::from_static(b"x")));

    // Truncation, deletion and meta removal.
    let mut b = WriteBatch::default();
    b.truncate_log.push((ScopeId::global(), "o".into(), 4));
    b.rows.push(RowWrite {
        table: "t".into(),
        key: Bytes::from("ab"),
        row: None,
    });
    b.meta.push(("hlc".into(), None));
    s.write(b)?;
    assert_eq!(s.log_bounds(&ScopeId::global(), &"o".into())?, Some((4, 5)));
    assert_eq!(s.get_row("t", b"ab")?, None);
    assert_eq!(s.meta("hlc")?, None);

    // A purge past the end empties the stream; entries written afterwards below
    // where it ended (a log rebuilt after a snapshot) are found, read and purged.
    let purge = |below| WriteBatch {
        truncate_log: vec![(ScopeId::global(), "o".into(), below)],
        ..WriteBatch::default()
    };
    s.write(purge(100))?;
    assert_eq!(s.log_bounds(&ScopeId::global(), &"o".into())?, None);
    assert_eq!(
        s.read_log(&ScopeId::global(), &"o".into(), 0, 10, usize::MAX)?,
        vec![]
    );
    s.write(WriteBatch {
        log: vec![entry(2), entry(3)],
        ..WriteBatch::default()
    })?;
    assert_eq!(s.log_bounds(&ScopeId::global(), &"o".into())?, Some((2, 3)));
    assert_eq!(
        s.read_log(&ScopeId::global(), &"o".into(), 1, 10, usize::MAX)?,
        vec![entry(2), entry(3)]
    );
    s.write(purge(3))?;
    assert_eq!(s.log_bounds(&ScopeId::global(), &"o".into())?, Some((3, 3)));
    // A purge below where the log starts changes nothing.
    s.write(purge(1))?;
    assert_eq!(s.log_bounds(&ScopeId::global(), &"o".into())?, Some((3, 3)));
    Ok(())
}

#[test]
fn memory_storage_keeps_the_contract() -> Result<()> {
    contract(&mut MemStorage::new())
}

#[test]
fn fjall_store_keeps_the_contract() -> Result<()> {
    let dir = tempfile::tempdir()?;
    contract(&mut Store::open(dir.path(), StoreOptions::default())?)
}

#[test]
fn fjall_store_survives_reopen() -> Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let mut s = Store::open(dir.path(), StoreOptions::default())?;
        let mut b = WriteBatch::default();
        b.rows.push(RowWrite {
            table: "t".into(),
            key: Bytes::from("k"),
            row: Some(row("v", 7)),
        });
        b.log.push(entry(1));
        s.write(b)?;
        s.sync()?;
    }
    let s = Store::open(dir.path(), StoreOptions::default())?;
    assert_eq!(s.get_row("t", b"k")?, Some(row("v", 7)));
    assert_eq!(s.log_bounds(&ScopeId::global(), &"o".into())?, Some((1, 1)));
    Ok(())
}

/// A sync fsyncs only when this handle wrote since its last one: a driver turn that
/// wrote nothing costs no fsync, and one that wrote still gets its fsync.
#[test]
fn fjall_store_syncs_only_after_writes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let mut s = Store::open(dir.path(), StoreOptions::default())?;
    let put = |seq: u64| WriteBatch {
        log: vec![entry(seq)],
        ..WriteBatch::default()
    };
    let before = s.syncs();
    s.sync()?;
    assert_eq!(s.syncs(), before, "nothing written yet");
    s.write(put(1))?;
    s.sync()?;
    assert_eq!(s.syncs(), before + 1, "a write is synced");
    s.sync()?;
    s.write(WriteBatch::default())?;
    s.sync()?;
    assert_eq!(s.syncs(), before + 1, "no write, or an empty one: no fsync");
    s.write(put(2))?;
    s.write(put(3))?;
    s.sync()?;
    assert_eq!(s.syncs(), before + 2, "two writes, one fsync");
    Ok(())
}

#[test]
fn memory_storage_crash_loses_only_unsynced_writes() -> Result<()> {
    let mut s = MemStorage::new();
    let put = |k: &str| {
        let mut b = WriteBatch::default();
        b.rows.push(RowWrite {
            table: "t".into(),
            key: Bytes::from(k.to_owned()),
            row: Some(row(k, 1)),
        });
        b
    };
    s.write(put("synced"))?;
    s.sync()?;
    s.write(put("unsynced"))?;
    s.crash();
    assert!(s.get_row("t", b"synced")?.is_some());
    assert!(s.get_row("t", b"unsynced")?.is_none());
    Ok(())
}

#[test]
fn damaged_files_give_errors_not_panics() -> Result<()> {
    let dir = tempfile::tempdir()?;
    {
        let mut s = Store::open(dir.path(), StoreOptions::default())?;
        let mut b = WriteBatch::default();
        for i in 0..200 {
            b.rows.push(RowWrite {
                table: "t".into(),
                key: Bytes::from(format!("k{i}")),
                row: Some(row("v", 1)),
            });
        }
        s.write(b)?;
        s.sync()?;
    }
    // Overwrite the middle of every file with garbage.
    let mut damaged = 0;
    for entry in walk(dir.path())? {
        let len = std::fs::metadata(&entry)?.len();
        if len > 64 {
            let mut bytes = std::fs::read(&entry)?;
            let mid = bytes.len() / 2;
            for b in &mut bytes[mid - 16..mid + 16] {
                *b ^= 0x5a;
            }
            std::fs::write(&entry, bytes)?;
            damaged += 1;
        }
    }
    assert!(damaged > 0);
    // Opening may fail, or reading may fail; either way with an error, not a panic,
    // and an error that names the store.
    match Store::open(dir.path(), StoreOptions::default()) {
        Err(e) => assert!(
            e.to_string().contains(&dir.path().display().to_string()),
            "{e}"
        ),
        Ok(s) => {
            for i in 0..200 {
                let _ = s.get_row("t", format!("k{i}").as_bytes());
            }
        }
    }
    Ok(())
}

fn walk(dir: &std::path::Path) -> Result<Vec<std::path::PathBuf>> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir)? {
        let p = e?.path();
        if p.is_dir() {
            out.extend(walk(&p)?);
        } else {
            out.push(p);
        }
    }
    Ok(out)
}

/// The bytes of the columns and values in an encoded `pb::Row` (as
/// `RowState::value_bytes` counts them, for a row of one version per column).
fn encoded_value_bytes(encoded: &[u8]) -> Result<usize> {
    use pangea_proto::Message as _;
    let row = pangea_proto::v1::Row::decode(encoded)?;
    Ok(row
        .families
        .iter()
        .flat_map(|f| &f.cells)
        .map(|c| c.column.len() + c.value.len())
        .sum())
}

/// The row cache never serves a row older than a commit that has returned: a writer
/// overwrites one row 2,000 times, each value one byte longer, and publishes each
/// length once its commit returned; two readers check every read is at least that
/// long, half of them through the encoded answer the cache keeps beside the row.
/// (Without the stripe epoch, a read that fetched the old row just before a commit
/// could put it back in the cache after the commit's invalidation.) Every 100
/// writes the writer waits for a read, so reads interleave with the writes even
/// when the machine is too busy to run the readers on their own.
#[test]
fn the_row_cache_is_never_staler_than_a_returned_commit() -> Result<()> {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    const WRITES: usize = 2_000;
    let dir = tempfile::tempdir()?;
    let opts = StoreOptions {
        durability: pangea_store::Durability::OsBuffer,
        ..Default::default()
    };
    let mut store = Store::open(dir.path(), opts)?;
    let published = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let reads_total = Arc::new(AtomicUsize::new(0));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, published, done, reads_total) = (
                store.clone(),
                published.clone(),
                done.clone(),
                reads_total.clone(),
            );
            std::thread::spawn(move || -> Result<usize> {
                let mut reads = 0;
                while !done.load(Ordering::Acquire) {
                    let at_least = published.load(Ordering::Acquire);
                    // Alternately the row and its encoded answer (which the cache
                    // keeps beside it and must never outlive it).
                    let got = if reads % 2 == 0 {
                        store.get_row("t", b"k")?.map_or(0, |r| r.value_bytes())
                    } else {
                        let key = Bytes::from_static(b"k");
                        let encoded = store
                            .get_row_shared("t", &key)?
                            .and_then(|r| r.latest_encoded(&key, None, 0, 0));
                        encoded.map_or(Ok(0), |b| encoded_value_bytes(&b))?
                    };
                    anyhow::ensure!(
                        got >= at_least,
                        "read a {got}-byte value after the {at_least}-byte one was committed"
                    );
                    reads += 1;
                    reads_total.fetch_add(1, Ordering::Release);
                }
                Ok(reads)
            })
        })
        .collect();
    let mut last_bytes = 0;
    for i in 1..=WRITES {
        if i % 100 == 0 {
            let seen = reads_total.load(Ordering::Acquire);
            let waited = std::time::Instant::now();
            // (A reader that stopped on a stale read is joined below, with its error.)
            while reads_total.load(Ordering::Acquire) == seen
                && !readers.iter().any(|r| r.is_finished())
            {
                anyhow::ensure!(
                    waited.elapsed() < std::time::Duration::from_secs(10),
                    "no reader read for 10 s"
                );
                std::thread::yield_now();
            }
        }
        let r = row(&"x".repeat(i), i as u64);
        last_bytes = r.value_bytes();
        store.write(WriteBatch {
            rows: vec![RowWrite {
                table: "t".into(),
                key: Bytes::from_static(b"k"),
                row: Some(r),
            }],
            ..Default::default()
        })?;
        published.store(last_bytes, Ordering::Release);
    }
    done.store(true, Ordering::Release);
    let mut reads = 0;
    for r in readers {
        reads += r.join().map_err(|_| anyhow::anyhow!("reader panicked"))??;
    }
    assert!(reads >= WRITES / 100, "{reads} reads");
    let last = store.get_row("t", b"k")?.map(|r| r.value_bytes());
    assert_eq!(last, Some(last_bytes));
    Ok(())
}

/// A commit brings the rows it wrote up to date in the row cache: a cached row
/// that is written stays a hit, answered without fjall (`cached_row`), with its
/// new state; a row never read stays out (a bulk load does not fill the cache);
/// a deleted row leaves it.
#[test]
fn written_rows_that_are_cached_stay_hits_with_their_new_state() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let opts = StoreOptions {
        durability: pangea_store::Durability::OsBuffer,
        ..Default::default()
    };
    let mut store = Store::open(dir.path(), opts)?;
    let put = |store: &mut Store, key: &'static [u8], r: Option<RowState>| {
        store.write(WriteBatch {
            rows: vec![RowWrite {
                table: "t".into(),
                key: Bytes::from_static(key),
                row: r,
            }],
            ..Default::default()
        })
    };
    put(&mut store, b"hot", Some(row("one", 1)))?;
    put(&mut store, b"cold", Some(row("one", 1)))?;
    assert!(
        store.cached_row("t", b"hot").is_err(),
        "cached before any read"
    );
    store.get_row("t", b"hot")?;
    let hit = |store: &Store, key: &[u8]| store.cached_row("t", key).ok().map(|r| r.value_bytes());
    assert_eq!(hit(&store, b"hot"), Some(row("one", 1).value_bytes()));
    put(&mut store, b"hot", Some(row("three", 2)))?;
    put(&mut store, b"cold", Some(row("three", 2)))?;
    assert_eq!(
        hit(&store, b"hot"),
        Some(row("three", 2).value_bytes()),
        "the write's state, from the cache"
    );
    assert_eq!(hit(&store, b"cold"), None, "a row only written was cached");
    put(&mut store, b"hot", None)?;
    assert_eq!(hit(&store, b"hot"), None, "a deleted row stayed cached");
    assert!(store.get_row("t", b"hot")?.is_none());
    Ok(())
}

/// An engine failure keeps its cause: the error names the path, and its source
/// chain (not a string copy) carries the operating system's reason.
#[test]
fn open_errors_keep_their_source_chain() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"x")?;
    let err = match Store::open(file.join("store"), StoreOptions::default()) {
        Ok(_) => anyhow::bail!("a store opened under a regular file"),
        Err(e) => e,
    };
    let io = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .ok_or_else(|| anyhow::anyhow!("no io::Error source in {err:?}"))?;
    anyhow::ensure!(io.kind() == std::io::ErrorKind::NotADirectory, "{io:?}");
    let chain = pangea_core::Chain(&err).to_string();
    anyhow::ensure!(
        chain.contains("not-a-directory/store") && chain.contains(&io.to_string()),
        "{chain}"
    );
    Ok(())
}
