//! `pangea store inspect` and `pangea store get` on a real data directory.

use bytes::Bytes;
use pangea_core::storage::{LogEntry, RowWrite, Storage, Watermark, WriteBatch};
use pangea_core::{Limits, Mutation, RowMutation, RowState, ScopeId, Timestamp, Version};
use pangea_store::{Store, StoreOptions};
use std::process::Command;

fn pangea(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pangea"))
        .args(args)
        .output()
        .expect("run pangea");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

fn fill(dir: &std::path::Path) {
    let mut store = Store::open(dir, StoreOptions::default()).unwrap();
    let mut batch = WriteBatch::default();
    for seq in 1..=3u64 {
        let ts = Timestamp::new(1_000 + seq, 0);
        let m = Mutation::SetCell {
            family: "profile".into(),
            column: Bytes::from_static(b"segments"),
            value: Bytes::from(format!("value-{seq}")),
        };
        let mutation = RowMutation::new(
            "ad_profiles",
            format!("user{seq}"),
            vec![m],
            &Limits::default(),
        )
        .unwrap();
        let mut row = RowState::default();
        row.apply(
            &Version::new(ts, "eu-west-1a".into()),
            mutation.mutations(),
            None,
        );
        batch.rows.push(RowWrite {
            table: "ad_profiles".into(),
            key: mutation.row_key().clone(),
            row: Some(row),
        });
        batch.log.push(LogEntry {
            scope: ScopeId::global(),
            origin: "eu-west-1a".into(),
            sequence: seq,
            timestamp: ts,
            mutation,
        });
    }
    batch.watermarks.push((
        ScopeId::global(),
        "eu-west-1a".into(),
        Watermark {
            sequence: 3,
            timestamp: Timestamp::new(1003, 0),
        },
    ));
    store.write(batch).unwrap();
    store.sync().unwrap();
}

#[test]
fn inspect_reports_tables_watermarks_and_log_ranges() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path());
    let d = dir.path().to_str().unwrap();
    let (ok, out, err) = pangea(&["store", "inspect", "--data-dir", d, "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["tables"][0]["table"], "ad_profiles");
    assert_eq!(v["tables"][0]["rows"], 3);
    assert_eq!(v["streams"][0]["scope"], "global");
    assert_eq!(v["streams"][0]["origin"], "eu-west-1a");
    assert_eq!(v["streams"][0]["watermark_sequence"], 3);
    assert_eq!(v["streams"][0]["log_first"], 1);
    assert_eq!(v["streams"][0]["log_last"], 3);

    let (ok, out, _) = pangea(&["store", "inspect", "--data-dir", d]);
    assert!(ok);
    assert!(
        out.contains("ad_profiles") && out.contains("1..=3"),
        "{out}"
    );
}

#[test]
fn get_prints_a_row_and_names_a_missing_one() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path());
    let d = dir.path().to_str().unwrap();
    let (ok, out, err) = pangea(&[
        "store",
        "get",
        "--data-dir",
        d,
        "--table",
        "ad_profiles",
        "user2",
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("profile:segments") && out.contains("value-2") && out.contains("eu-west-1a"),
        "{out}"
    );

    let (ok, _, err) = pangea(&[
        "store",
        "get",
        "--data-dir",
        d,
        "--table",
        "ad_profiles",
        "nobody",
    ]);
    assert!(!ok);
    assert!(err.contains("no row \"nobody\""), "{err}");
}

#[test]
fn missing_directory_is_named() {
    let (ok, _, err) = pangea(&["store", "inspect", "--data-dir", "/nonexistent/pangea"]);
    assert!(!ok);
    assert!(err.contains("/nonexistent/pangea does not exist"), "{err}");
}
