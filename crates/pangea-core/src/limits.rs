//! Size limits on user data, each named and configurable.

/// What a [`Limits`] bound applies to; named in [`crate::Error::TooLarge`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limited {
    RowKey,
    Column,
    Value,
    MutationsPerRow,
    RowMutation,
    Row,
    Token,
    BatchRows,
}

impl std::fmt::Display for Limited {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Limited::RowKey => "row key",
            Limited::Column => "column qualifier",
            Limited::Value => "value",
            Limited::MutationsPerRow => "mutations in one row mutation",
            Limited::RowMutation => "row mutation",
            Limited::Row => "row after the write",
            Limited::Token => "consistency token",
            Limited::BatchRows => "rows in one batch write",
        })
    }
}

impl Limited {
    /// The unit of its size in messages: bytes, or nothing for a count.
    pub fn unit(self) -> &'static str {
        match self {
            Limited::MutationsPerRow | Limited::BatchRows => "",
            _ => " bytes",
        }
    }
}

/// Bounds on what a client may write. Defaults follow Bigtable's order of magnitude
/// and the ad-profile use case (p99 profile < 1 MiB).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Longest row key in bytes (default 4 KiB). Keys are stored and compared whole.
    pub row_key_bytes_max: usize,
    /// Longest column qualifier in bytes (default 16 KiB).
    pub column_bytes_max: usize,
    /// Largest cell value in bytes (default 8 MiB).
    pub value_bytes_max: usize,
    /// Most mutations in one atomic row mutation (default 10,000).
    pub mutations_per_row_max: usize,
    /// Largest encoded row mutation in bytes (default 16 MiB); bounds frames and log
    /// entries.
    pub row_mutation_bytes_max: usize,
    /// Most bytes of columns and values one row may hold, every version counted
    /// (default 16 MiB). A write that would take its row past it is refused at the
    /// origin, so that any row can be read in one response and shipped in one
    /// frame (a snapshot splits rows larger than its chunks).
    pub row_bytes_max: usize,
    /// Most rows in one batch write (`MutateRows`, default 1,000): bounds the work
    /// one request queues at the replica's writer.
    pub batch_rows_max: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            row_key_bytes_max: 4 << 10,
            column_bytes_max: 16 << 10,
            value_bytes_max: 8 << 20,
            mutations_per_row_max: 10_000,
            row_mutation_bytes_max: 16 << 20,
            row_bytes_max: 16 << 20,
            batch_rows_max: 1_000,
        }
    }
}

impl Limits {
    /// No bounds: for re-reading what this replica itself accepted earlier, perhaps
    /// under larger limits than today's. Never for input from a peer or a client.
    pub const STORED: Limits = Limits {
        row_key_bytes_max: usize::MAX,
        column_bytes_max: usize::MAX,
        value_bytes_max: usize::MAX,
        mutations_per_row_max: usize::MAX,
        row_mutation_bytes_max: usize::MAX,
        row_bytes_max: usize::MAX,
        batch_rows_max: usize::MAX,
    };

    /// Fails with [`crate::Error::TooLarge`] when `size > limit`.
    pub fn check(what: Limited, size: usize, limit: usize) -> Result<(), crate::Error> {
        if size > limit {
            Err(crate::Error::TooLarge { what, size, limit })
        } else {
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_name_what_its_size_and_the_limit_in_its_unit() {
        let e = Limits::check(Limited::Value, 9, 8).unwrap_err();
        assert_eq!(e.to_string(), "value is 9 bytes, limit 8");
        let e = Limits::check(Limited::MutationsPerRow, 10_001, 10_000).unwrap_err();
        assert_eq!(
            e.to_string(),
            "mutations in one row mutation is 10001, limit 10000"
        );
        assert!(Limits::check(Limited::RowKey, 8, 8).is_ok());
    }
}
