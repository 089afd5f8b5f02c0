//! Shared output helpers: how values and keys are shown to humans.

/// Bytes as text when they are printable UTF-8, else as hex.
pub(crate) fn show_bytes(b: &[u8]) -> String {
    match std::str::from_utf8(b) {
        Ok(s) if !s.chars().any(char::is_control) => s.to_owned(),
        _ => format!(
            "0x{}",
            b.iter().map(|b| format!("{b:02x}")).collect::<String>()
        ),
    }
}

/// A value for a table cell: shown whole when short, else its start and its size.
pub(crate) fn show_value(b: &[u8]) -> String {
    const SHOWN_BYTES_MAX: usize = 48;
    if b.len() <= SHOWN_BYTES_MAX {
        show_bytes(b)
    } else {
        format!("{}… ({} bytes)", show_bytes(&b[..SHOWN_BYTES_MAX]), b.len())
    }
}

/// Parses a human row key: `0x` followed by hex, or the text itself.
pub(crate) fn parse_key(s: &str) -> anyhow::Result<Vec<u8>> {
    match s.strip_prefix("0x") {
        Some(hex) if hex.len() % 2 == 0 => (0..hex.len())
            .step_by(2)
            .map(|i| {
                // `get`: a non-ASCII character is an error, not a panic.
                let pair = hex
                    .get(i..i + 2)
                    .ok_or_else(|| anyhow::anyhow!("row key {s:?}: not hex"))?;
                u8::from_str_radix(pair, 16).map_err(|e| anyhow::anyhow!("row key {s:?}: {e}"))
            })
            .collect(),
        Some(_) => anyhow::bail!("row key {s:?}: odd number of hex digits"),
        None => Ok(s.as_bytes().to_vec()),
    }
}

/// Lower-case hex of bytes (tokens, digests).
pub(crate) fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

/// A report as pretty JSON (`--json`) or as its text.
pub(crate) fn print(
    json: bool,
    report: &(impl serde::Serialize + std::fmt::Display),
) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(report)?);
    } else {
        println!("{report}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_keys_round_trip_and_bad_ones_are_errors_not_panics() {
        assert_eq!(parse_key("0x00ff").unwrap(), vec![0, 255]);
        assert_eq!(parse_key(&format!("0x{}", hex(b"ab"))).unwrap(), b"ab");
        assert_eq!(parse_key("plain").unwrap(), b"plain");
        for bad in ["0x1", "0xzz", "0x1\u{e9}1"] {
            assert!(parse_key(bad).is_err(), "{bad:?}");
        }
    }
}
