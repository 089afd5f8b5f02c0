//! Decoded rows kept in memory for point reads.
//!
//! A replica serving ad profiles reads the same hot rows over and over; without a
//! cache each read searches fjall's memtable and segments and decodes the stored
//! protobuf, which profiled at about a quarter of a replica's CPU on 1 KiB gets
//! (docs/benchmarks.md). The cache holds decoded [`RowState`]s by row key.
//!
//! It is never staler than the store once a commit has returned: [`Store`]'s commit
//! replaces the cached rows it wrote with their new states (rows not cached stay
//! out) right after fjall applied the batch, before it returns (so before the
//! driver publishes the new watermarks that let a read ask for them). Hot rows that
//! are written therefore stay hits: a read of one does not go to fjall, whose reads
//! can wait tens of milliseconds behind a flush or compaction installing its files
//! (its version lock is held across their syncs). A read that missed fills the
//! cache only if no commit touched its stripe since the miss ([`RowCache::lookup`]
//! hands out the stripe's epoch): a read that fetched the row from fjall just
//! before a commit cannot put the old row back after it.
//!
//! Beside each row the cache keeps, once a get asked for it, the row's answer to a
//! point read of its newest versions already encoded ([`CachedRow::latest_encoded`]):
//! building and encoding that answer per read was an eighth of a replica's CPU on
//! 1 KiB gets (docs/benchmarks.md); a hot row now pays for it once per change.
//!
//! Memory is bounded: the budget is split over [`STRIPES`] stripes, a stripe that
//! would exceed its share is emptied (crude, but O(1) and fair to hot rows, which
//! come back at once), and rows over a quarter of a stripe's share are not cached.
//! A row counts twice its stored size: its decoded state and its encoded answer.
//!
//! [`Store`]: crate::Store

use bytes::Bytes;
use pangea_core::RowState;
use pangea_topology::schema::TableSchema;
use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::{Arc, Mutex, PoisonError};

/// A row as the store read it, and its encoded newest-version answer once asked.
#[derive(Debug)]
pub struct CachedRow {
    row: RowState,
    latest: Mutex<Option<Latest>>,
}

/// A remembered [`RowState::encode_latest`].
#[derive(Debug)]
struct Latest {
    encoded: Option<Bytes>,
    /// Wall ms from which (made at) and before which (a cell's TTL) it holds: a
    /// clock set back (an NTP step, a drill's skew healed) may show a cell that had
    /// expired when it was made.
    from_ms: u64,
    until_ms: u64,
    /// The schema generation it was made under (TTLs come from the schema).
    schema: u64,
}

impl CachedRow {
    pub(crate) fn new(row: RowState) -> CachedRow {
        CachedRow {
            row,
            latest: Mutex::new(None),
        }
    }

    /// [`RowState::encode_latest`] at `now_ms`, made once and then shared until a
    /// cell expires, the clock reads earlier than when it was made, or
    /// `schema_generation` (which the caller bumps whenever table schemas may have
    /// changed) moves. The row itself never changes: a write replaces the whole
    /// entry.
    pub fn latest_encoded(
        &self,
        key: &Bytes,
        table: Option<&TableSchema>,
        now_ms: u64,
        schema_generation: u64,
    ) -> Option<Bytes> {
        let mut latest = self.latest.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(l) = &*latest
            && l.schema == schema_generation
            && (l.from_ms..l.until_ms).contains(&now_ms)
        {
            return l.encoded.clone();
        }
        let (encoded, until_ms) = self.row.encode_latest(key, table, now_ms);
        *latest = Some(Latest {
            encoded: encoded.clone(),
            from_ms: now_ms,
            until_ms,
            schema: schema_generation,
        });
        encoded
    }

    /// The row, copied only if the cache still shares it.
    pub fn into_row(this: Arc<CachedRow>) -> RowState {
        Arc::try_unwrap(this).map_or_else(|shared| shared.row.clone(), |own| own.row)
    }
}

impl std::ops::Deref for CachedRow {
    type Target = RowState;
    fn deref(&self) -> &RowState {
        &self.row
    }
}

/// Independent locks; a power of two.
pub(crate) const STRIPES: usize = 64;

#[derive(Default)]
struct Stripe {
    /// Shared with the reads being served from them: a hit costs a reference
    /// count, not a copy of the row's maps.
    rows: HashMap<Vec<u8>, (Arc<CachedRow>, usize)>,
    bytes: usize,
    /// Bumped by every invalidation in this stripe.
    epoch: u64,
}

pub(crate) struct RowCache {
    stripes: Vec<Mutex<Stripe>>,
    stripe_bytes: usize,
    hasher: RandomState,
}

/// A miss: fill with this ticket once the row is read.
pub(crate) struct Miss {
    stripe: usize,
    epoch: u64,
}

impl RowCache {
    /// A cache of about `bytes` of encoded rows; `None` for 0 (no cache).
    pub(crate) fn new(bytes: u64) -> Option<RowCache> {
        (bytes > 0).then(|| RowCache {
            stripes: (0..STRIPES).map(|_| Mutex::default()).collect(),
            stripe_bytes: usize::try_from(bytes).unwrap_or(usize::MAX) / STRIPES,
            hasher: RandomState::new(),
        })
    }

    fn stripe_of(&self, key: &[u8]) -> usize {
        self.hasher.hash_one(key) as usize & (STRIPES - 1)
    }

    fn lock(&self, stripe: usize) -> std::sync::MutexGuard<'_, Stripe> {
        self.stripes[stripe]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached row of `key` (shared, not copied), or the ticket to fill it with.
    pub(crate) fn lookup(&self, key: &[u8]) -> Result<Arc<CachedRow>, Miss> {
        let stripe = self.stripe_of(key);
        let s = self.lock(stripe);
        match s.rows.get(key) {
            Some((row, _)) => Ok(row.clone()),
            None => Err(Miss {
                stripe,
                epoch: s.epoch,
            }),
        }
    }

    /// Whether `key` is cached now (a commit then decodes its new state for
    /// [`RowCache::replace`]; one cached meanwhile is dropped there instead).
    pub(crate) fn contains(&self, key: &[u8]) -> bool {
        self.lock(self.stripe_of(key)).rows.contains_key(key)
    }

    /// Caches `row` (`stored_bytes` long on disk) unless its stripe was invalidated
    /// since `miss` was handed out.
    pub(crate) fn fill(&self, key: &[u8], miss: Miss, row: &Arc<CachedRow>, stored_bytes: usize) {
        let encoded_bytes = stored_bytes.saturating_mul(2);
        if encoded_bytes > self.stripe_bytes / 4 {
            return;
        }
        let mut s = self.lock(miss.stripe);
        if s.epoch != miss.epoch {
            return;
        }
        if s.bytes + encoded_bytes > self.stripe_bytes {
            s.rows.clear();
            s.bytes = 0;
        }
        if let Some((_, old)) = s.rows.insert(key.to_vec(), (row.clone(), encoded_bytes)) {
            s.bytes -= old;
        }
        s.bytes += encoded_bytes;
    }

    /// Called after every commit that wrote `key`: a cached row takes `row` (its
    /// new state and stored size; `None` for a deleted row, or one the commit
    /// may not have written); a row not cached stays out, so writes alone (a bulk
    /// load) do not push the rows being read out of the cache. Reads that missed
    /// before this cannot fill the stripe afterwards.
    pub(crate) fn replace(&self, key: &[u8], row: Option<(Arc<CachedRow>, usize)>) {
        let mut s = self.lock(self.stripe_of(key));
        s.epoch += 1;
        let Some((_, old)) = s.rows.remove(key) else {
            return;
        };
        s.bytes -= old;
        if let Some((row, stored_bytes)) = row {
            let encoded_bytes = stored_bytes.saturating_mul(2);
            if encoded_bytes <= self.stripe_bytes / 4
                && s.bytes + encoded_bytes <= self.stripe_bytes
            {
                s.rows.insert(key.to_vec(), (row, encoded_bytes));
                s.bytes += encoded_bytes;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pangea_core::{Mutation, Timestamp, Version};
    use pangea_topology::schema::{GcPolicy, Schema};

    /// The remembered answer is used only between the time it was made and the
    /// first expiry of a cell it shows: before (a clock set back) and after, the
    /// answer is made again and shows what a read then sees.
    #[test]
    fn an_encoded_answer_holds_only_from_when_it_was_made_until_a_cell_expires() {
        let gc = |ttl_ms| GcPolicy {
            max_versions: None,
            ttl_ms,
            ..GcPolicy::default()
        };
        let schema = Schema::single_table("t", &[("short", gc(Some(100))), ("long", gc(None))]);
        let table = schema.table("t");
        let set = |family: &str| Mutation::SetCell {
            family: family.into(),
            column: Bytes::from_static(b"c"),
            value: Bytes::from_static(b"v"),
        };
        let mut row = RowState::default();
        // Written at 1,000 ms: "short" shows until 1,100, "long" always.
        row.apply(
            &Version::new(Timestamp::new(1_000, 0), "a".into()),
            &[set("short"), set("long")],
            table,
        );
        let key = Bytes::from_static(b"k");
        let cached = CachedRow::new(row.clone());
        let fresh = |now_ms| row.encode_latest(&key, table, now_ms).0;
        for now_ms in [1_050, 1_099, 1_100, 1_200, 1_050, 1_150] {
            assert_eq!(
                cached.latest_encoded(&key, table, now_ms, 0),
                fresh(now_ms),
                "at {now_ms} ms"
            );
        }
        // A new schema generation: made again, same bytes.
        assert_eq!(cached.latest_encoded(&key, table, 1_050, 1), fresh(1_050));
        assert_ne!(
            fresh(1_050),
            fresh(1_100),
            "the short cell must expire at 1,100"
        );
    }
}
