//! Per-call settings: consistency, deadline, hedging, filters.

use bytes::Bytes;
use pangea_core::read::Consistency;
use pangea_core::{BytesRange, ReadFilter};
use pangea_proto::v1 as pb;
use std::time::Duration;

/// The read latency budget of an ad request (p99 under 20 ms).
pub const READ_DEADLINE_DEFAULT: Duration = Duration::from_millis(20);
/// Writes wait for an fsync at the origin: a little more room by default.
pub const WRITE_DEADLINE_DEFAULT: Duration = Duration::from_millis(200);
/// Writes that wait for other regions ([`Ack`]) cross the WAN and back, with a
/// heartbeat each way: more room again.
pub const WRITE_DEADLINE_REPLICATED_DEFAULT: Duration = Duration::from_secs(2);

/// When a write is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Ack {
    /// Once durable at the replica that took it (default): the lowest latency;
    /// the write reaches every other region in the background.
    #[default]
    Origin,
    /// Once also durably applied by replicas in this many other regions (as in
    /// Cassandra's `EACH_QUORUM` spirit, by region): survives the loss of the
    /// origin's whole region when ≥ 1. More regions than the row's policy spans
    /// is refused before anything is written.
    Regions(u32),
    /// Once durably applied in every region of the row's placement policy.
    AllRegions,
}

/// When to send a second request ("The Tail at Scale"); shared with the simulator.
pub use pangea_core::frontend::HedgePolicy;

#[derive(Debug, Clone)]
pub struct ReadOptions {
    pub consistency: Consistency,
    pub deadline: Duration,
    /// `None` disables hedging for the call.
    pub hedge: Option<HedgePolicy>,
    /// Families and columns to return (server-side).
    pub filter: ReadFilter,
}

impl Default for ReadOptions {
    fn default() -> Self {
        ReadOptions {
            consistency: Consistency::Eventual,
            deadline: READ_DEADLINE_DEFAULT,
            hedge: Some(HedgePolicy::default()),
            filter: ReadFilter::default(),
        }
    }
}

impl ReadOptions {
    pub fn with_consistency(mut self, c: Consistency) -> Self {
        self.consistency = c;
        self
    }

    pub fn with_deadline(mut self, d: Duration) -> Self {
        self.deadline = d;
        self
    }
}

#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    /// Default [`WRITE_DEADLINE_DEFAULT`].
    pub deadline: Option<Duration>,
    /// `Some(true)`: send the write to the row's affinity replica in the caller's
    /// region — the one [`Consistency::RowAffinity`] reads of the row go to — so
    /// that affinity reads in the region read it back without a token. When that
    /// replica is down the write goes to the nearest (the response's `reason` says
    /// `nearest`, not `affinity`). `Some(false)`: the nearest replica. `None`
    /// (default): the app profile's `writes` setting (nearest unless the topology
    /// file says `writes = "row-affinity"`).
    pub row_affinity: Option<bool>,
    /// When the write is acknowledged (default: once durable at its origin). A
    /// write that waits for other regions and misses the deadline fails with
    /// `Error::NotReplicated` carrying its token (it happened). Default deadline
    /// then [`WRITE_DEADLINE_REPLICATED_DEFAULT`].
    pub ack: Ack,
    /// `true`: applying this mutation twice is harmless (it sets cells to values
    /// no other writer races), so when the replica asked cannot say whether it
    /// applied it — it stopped waiting, went silent, or the connection was lost
    /// after the request went out — the client sends it to the next replica
    /// rather than failing. Default `false`: the write goes elsewhere only when
    /// it certainly was not applied (could not be sent, or refused), and otherwise
    /// fails with `Error::Ambiguous`. A write sent twice is applied twice, under
    /// two origins: last writer wins between the two, so a concurrent writer's
    /// cells can be overwritten again (docs/protocol.md, §9 "Writes").
    pub resend_if_unknown: bool,
}

impl WriteOptions {
    /// The call's deadline: [`WriteOptions::deadline`], else the default for its
    /// [`Ack`] (longer when it waits for other regions).
    pub(crate) fn deadline_or_default(&self) -> Duration {
        self.deadline.unwrap_or(match self.ack {
            Ack::Origin => WRITE_DEADLINE_DEFAULT,
            _ => WRITE_DEADLINE_REPLICATED_DEFAULT,
        })
    }

    /// Writes to the row's affinity replica (see [`WriteOptions::row_affinity`]).
    pub fn with_row_affinity(mut self) -> Self {
        self.row_affinity = Some(true);
        self
    }

    /// Acknowledged only once applied as `ack` says (see [`WriteOptions::ack`]).
    pub fn with_ack(mut self, ack: Ack) -> Self {
        self.ack = ack;
        self
    }

    /// May be sent to another replica when whether it was applied is unknown
    /// (see [`WriteOptions::resend_if_unknown`]).
    pub fn resend_if_unknown(mut self) -> Self {
        self.resend_if_unknown = true;
        self
    }

    /// Writes to the nearest replica whatever the app profile's default.
    pub fn with_nearest(mut self) -> Self {
        self.row_affinity = Some(false);
        self
    }
}

#[derive(Debug, Clone, Default)]
pub struct ScanOptions {
    /// Most rows (0: the replica's default, 100; the replica caps it at 1,000).
    pub limit: u32,
    /// Most bytes of rows in a page, about (0: the replica's default, 4 MiB; the
    /// replica caps it at 16 MiB). A page ends at `limit` rows or these bytes,
    /// whichever comes first, and always holds at least one row.
    pub max_bytes: u32,
    /// Resume after this key (from the previous page); going down
    /// ([`ScanOptions::reverse`]), before it.
    pub resume_after: Bytes,
    /// Only keys in this range as well as under the prefix (default: every key).
    /// The rows answered are those of the prefix's placement policy.
    pub range: BytesRange,
    /// Highest key first.
    pub reverse: bool,
    /// A sample of the rows, for splitting batch work: a fraction in (0, 1]
    /// (0: every row). The same rows on every replica and run
    /// ([`pangea_core::filter::in_sample`]); a sampled page counts the rows it
    /// returns against `limit`.
    pub row_sample: f64,
    /// Rows with their keys only (rows the filter leaves empty are still left out).
    pub keys_only: bool,
}

impl ScanOptions {
    /// The request for one page of `table`'s rows under `prefix`.
    pub(crate) fn request(
        &self,
        table: &str,
        prefix: Bytes,
        filter: &ReadFilter,
        consistency: &Consistency,
    ) -> pb::ScanPrefixRequest {
        pb::ScanPrefixRequest {
            table: table.to_owned(),
            prefix,
            filter: Some(filter.to_proto()),
            consistency: Some(consistency_to_proto(consistency)),
            limit: self.limit,
            resume_after: self.resume_after.clone(),
            max_bytes: self.max_bytes,
            range: (self.range != BytesRange::ALL).then(|| self.range.to_proto()),
            reverse: self.reverse,
            row_sample: self.row_sample,
            keys_only: self.keys_only,
        }
    }
}

pub(crate) fn consistency_to_proto(c: &Consistency) -> pb::Consistency {
    use pb::consistency::Mode;
    let mode = match c {
        Consistency::Eventual => Mode::Eventual(pb::consistency::Eventual {}),
        Consistency::RowAffinity => Mode::RowAffinity(pb::consistency::RowAffinity {}),
        Consistency::Watermark(t) => Mode::WatermarkToken(t.encode()),
        Consistency::BoundedStaleness { max_ms } => Mode::BoundedStalenessMs(*max_ms),
        Consistency::AsOf { ms } => Mode::AsOfMs(*ms),
    };
    pb::Consistency { mode: Some(mode) }
}
