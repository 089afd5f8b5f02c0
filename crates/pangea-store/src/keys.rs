//! Key layout inside fjall. Names never contain NUL (`validate_name`), so NUL
//! separates them and every key of one table (or stream) sorts together.
//!
//! | keyspace | key                                   | value                        |
//! |----------|---------------------------------------|------------------------------|
//! | `rows`   | table `\0` row key                    | format byte, `RowState`      |
//! | `log`    | scope `\0` origin `\0` sequence (BE)  | format byte, `MutationFrame` |
//! | `meta`   | `w\0` scope `\0` origin               | sequence (BE), timestamp (BE)|
//! | `meta`   | `m\0` name                            | bytes                        |

pub(crate) const FORMAT_V1: u8 = 1;

pub(crate) fn row_key(table: &str, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(table.len() + 1 + key.len());
    k.extend_from_slice(table.as_bytes());
    k.push(0);
    k.extend_from_slice(key);
    k
}

/// Splits a `rows` key into (table, row key).
pub(crate) fn split_row_key(k: &[u8]) -> Option<(&str, &[u8])> {
    let nul = k.iter().position(|&b| b == 0)?;
    Some((std::str::from_utf8(&k[..nul]).ok()?, &k[nul + 1..]))
}

pub(crate) fn log_prefix(scope: &str, origin: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(scope.len() + origin.len() + 10);
    k.extend_from_slice(scope.as_bytes());
    k.push(0);
    k.extend_from_slice(origin.as_bytes());
    k.push(0);
    k
}

pub(crate) fn log_key(scope: &str, origin: &str, sequence: u64) -> Vec<u8> {
    let mut k = log_prefix(scope, origin);
    k.extend_from_slice(&sequence.to_be_bytes());
    k
}

/// Splits a `log` key into (scope, origin, sequence).
pub(crate) fn split_log_key(k: &[u8]) -> Option<(&str, &str, u64)> {
    let (names, seq) = k.split_at_checked(k.len().checked_sub(8)?)?;
    let names = names.strip_suffix(&[0])?;
    let nul = names.iter().position(|&b| b == 0)?;
    let scope = std::str::from_utf8(&names[..nul]).ok()?;
    let origin = std::str::from_utf8(&names[nul + 1..]).ok()?;
    Some((scope, origin, u64::from_be_bytes(seq.try_into().ok()?)))
}

pub(crate) const WATERMARK_PREFIX: &[u8] = b"w\0";
pub(crate) const META_PREFIX: &[u8] = b"m\0";

pub(crate) fn watermark_key(scope: &str, origin: &str) -> Vec<u8> {
    let mut k = WATERMARK_PREFIX.to_vec();
    k.extend_from_slice(scope.as_bytes());
    k.push(0);
    k.extend_from_slice(origin.as_bytes());
    k
}

pub(crate) fn meta_key(name: &str) -> Vec<u8> {
    let mut k = META_PREFIX.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

/// A key for error messages: UTF-8 as is, otherwise hex.
pub(crate) fn printable(k: &[u8]) -> String {
    match std::str::from_utf8(k) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_owned(),
        _ => k.iter().map(|b| format!("{b:02x}")).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_sort_by_sequence() {
        let k = log_key("global", "eu-west-1a", 258);
        assert_eq!(split_log_key(&k), Some(("global", "eu-west-1a", 258)));
        assert!(log_key("g", "o", 255) < log_key("g", "o", 256));
        assert_eq!(
            split_row_key(&row_key("t", b"a\0b")),
            Some(("t", &b"a\0b"[..]))
        );
        assert_eq!(split_log_key(b"short"), None);
    }
}
