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
    let log = s.read_log(&ScopeId::global(), &"o".into(), 3, 10)?;
    assert_eq!(log, vec![entry(3), entry(4), entry(5)]);
    assert_eq!(
        s.read_log(&ScopeId::global(), &"o".into(), 2, 1)?,
        vec![entry(2)]
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
