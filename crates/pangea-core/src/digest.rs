//! Content digests: one 128-bit xxh3 value for everything a reader can see in a set of
//! rows, so replicas can be compared without shipping rows (checker C5).

use crate::row::RowState;
use bytes::Bytes;
use pangea_topology::schema::Schema;
use xxhash_rust::xxh3::Xxh3;

/// Accumulates rows, which must be fed in (table, key) order.
#[derive(Clone, Default)]
pub struct ContentDigest {
    hasher: Xxh3,
    rows: u64,
}

impl std::fmt::Debug for ContentDigest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContentDigest")
            .field("rows", &self.rows)
            .finish_non_exhaustive()
    }
}

impl ContentDigest {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one row; rows with nothing visible at `now_ms` do not count, so a replica
    /// that purged a deleted row and one that still holds its tombstone agree.
    pub fn add(&mut self, schema: &Schema, table: &str, key: &Bytes, row: &RowState, now_ms: u64) {
        self.add_visible(table, row.visible_digest(key, schema.table(table), now_ms));
    }

    /// [`ContentDigest::add`] with the row's [`RowState::visible_digest`] already
    /// worked out (`None`: nothing visible), for a caller that met the same row before.
    pub fn add_visible(&mut self, table: &str, visible: Option<u128>) {
        if let Some(d) = visible {
            self.hasher.update(&(table.len() as u64).to_le_bytes());
            self.hasher.update(table.as_bytes());
            self.hasher.update(&d.to_le_bytes());
            self.rows += 1;
        }
    }

    /// Rows with visible content so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    pub fn finish(&self) -> u128 {
        self.hasher.digest128()
    }
}
