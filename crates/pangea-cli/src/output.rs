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
                u8::from_str_radix(&hex[i..i + 2], 16)
                    .map_err(|e| anyhow::anyhow!("row key {s:?}: {e}"))
            })
            .collect(),
        Some(_) => anyhow::bail!("row key {s:?}: odd number of hex digits"),
        None => Ok(s.as_bytes().to_vec()),
    }
}
