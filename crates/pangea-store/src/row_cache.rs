//! Decoded rows kept in memory for point reads.
//!
//! A replica serving ad profiles reads the same hot rows over and over; without a
//! cache each read searches fjall's memtable and segments and decodes the stored
//! protobuf, which profiled at about a quarter of a replica's CPU on 1 KiB gets
//! (docs/benchmarks.md). The cache holds decoded [`RowState`]s by row key.
//!
//! It is never staler than the store once a commit has returned: [`Store`]'s commit
//! invalidates the rows it wrote right after fjall applied the batch, before it
//! returns (so before the driver publishes the new watermarks that let a read ask
//! for them). A read that missed fills the cache only if no invalidation touched its
//! stripe since the miss ([`RowCache::lookup`] hands out the stripe's epoch): a read
//! that fetched the row from fjall just before a commit cannot put the old row back
//! after that commit's invalidation.
//!
//! Memory is bounded: the budget is split over [`STRIPES`] stripes, a stripe that
//! would exceed its share is emptied (crude, but O(1) and fair to hot rows, which
//! come back at once), and rows over a quarter of a stripe's share are not cached.
//!
//! [`Store`]: crate::Store

use pangea_core::RowState;
use std::collections::HashMap;
use std::hash::{BuildHasher as _, RandomState};
use std::sync::{Arc, Mutex, PoisonError};

/// Independent locks; a power of two.
pub(crate) const STRIPES: usize = 64;

#[derive(Default)]
struct Stripe {
    /// Shared with the reads being served from them: a hit costs a reference
    /// count, not a copy of the row's maps.
    rows: HashMap<Vec<u8>, (Arc<RowState>, usize)>,
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
    pub(crate) fn lookup(&self, key: &[u8]) -> Result<Arc<RowState>, Miss> {
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

    /// Caches `row` (`encoded_bytes` long on disk) unless its stripe was invalidated
    /// since `miss` was handed out.
    pub(crate) fn fill(&self, key: &[u8], miss: Miss, row: &Arc<RowState>, encoded_bytes: usize) {
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

    /// Forgets `key`: called after every commit that wrote it.
    pub(crate) fn invalidate(&self, key: &[u8]) {
        let mut s = self.lock(self.stripe_of(key));
        s.epoch += 1;
        if let Some((_, bytes)) = s.rows.remove(key) {
            s.bytes -= bytes;
        }
    }
}
