//! What the ledger commands share, below all of them: the δ of a new budget when
//! none is given, and how a recorded time is printed.

/// δ of a new ledger when `--delta` is not given.
pub const DEFAULT_DELTA: f64 = 1e-5;

/// A time in ms since the Unix epoch as RFC 3339 UTC (`2026-01-02T03:04:05.678Z`).
pub fn utc(ms: u64) -> String {
    let nanos = i128::from(ms) * 1_000_000;
    time::OffsetDateTime::from_unix_timestamp_nanos(nanos)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("{ms} ms after the Unix epoch"))
}
