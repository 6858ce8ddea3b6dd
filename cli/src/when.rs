//! Times as people read them in tables: in the local time zone (`TZ`, else
//! the system's), to the second, with its offset. `--json` carries RFC 3339
//! in UTC instead (`ratchet_runtime::clock::as_rfc3339`).

use jiff::Timestamp;
use jiff::tz::TimeZone;

/// `ms` since the epoch as local time, e.g. `2026-12-04 19:02:03 +01:00`.
pub fn local(ms: i64) -> String {
    match Timestamp::from_millisecond(ms) {
        Ok(at) => at
            .to_zoned_datetime(TimeZone::system())
            .strftime("%Y-%m-%d %H:%M:%S %:z")
            .to_string(),
        Err(_) => format!("{ms} ms since the epoch"),
    }
}

/// A span of `ms` milliseconds, to the millisecond: `1.502 s`.
pub fn took(ms: i64) -> String {
    // Workers' clocks may disagree by a little: never a negative span.
    let ms = ms.max(0);
    format!("{}.{:03} s", ms / 1000, ms % 1000)
}
