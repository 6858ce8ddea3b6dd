//! Named crash points (ADR 0004), driven by the `FAILPOINTS` environment
//! variable when built with the `failpoints` feature.
//!
//! `FAILPOINTS="after_commit=return(exit)"` ends the process there with
//! [`CRASH_EXIT_CODE`]; `FAILPOINTS="after_commit=panic"` panics there.
//! A point never changes which code runs: where two points fall inside one
//! database call (PostgreSQL's one-call batch, ADR 0010), both are passed
//! just before that call, the last moment before its commit.

/// Every crash point, in the order an attempt passes them, the fault
/// point `commit_ack_lost` ([`ack_lost`]), then the relay's.
pub const CRASH_POINTS: [&str; 11] = [
    "after_claim",
    "after_model_call",
    // An HTTP response journaled, before the guest reads it.
    "after_http_call",
    "after_execute",
    "after_persist",
    "after_outbox_insert",
    // A map's elements and their jobs written, its transaction not yet
    // committed (`store::map`).
    "after_map_expand",
    "after_commit",
    "commit_ack_lost",
    // The relay's: before a delivery is sent, and after its sink
    // acknowledged it but before it is marked delivered.
    "relay_before_send",
    "relay_after_send",
];

/// The exit code of a process ended by a `return(exit)` crash point.
pub const CRASH_EXIT_CODE: i32 = 86;

/// Passes the named crash point.
#[inline]
pub fn point(name: &str) {
    #[cfg(feature = "failpoints")]
    fail::eval(name, |arg| {
        if arg.as_deref() == Some("exit") {
            tracing::warn!(point = name, "crash point hit: exiting the process");
            std::process::exit(CRASH_EXIT_CODE);
        }
    });
    #[cfg(not(feature = "failpoints"))]
    let _ = name;
}

/// Passes the named crash point once for each of `attempts` attempts that
/// reached it together in one batch, as each would alone: a point set to
/// act on its n-th pass acts inside the batch holding the n-th attempt.
#[inline]
pub fn point_per_attempt(name: &str, attempts: usize) {
    for _ in 0..attempts {
        point(name);
    }
}

/// The fault point `commit_ack_lost`, passed by a store right after a
/// write transaction committed: when set to `return`, the store reports
/// the error a connection closed before the commit's acknowledgement gives
/// (the commit stands). For testing that a retry recognises its own commit.
pub fn ack_lost() -> bool {
    #[cfg(feature = "failpoints")]
    let lost = fail::eval("commit_ack_lost", |_| ()).is_some();
    #[cfg(not(feature = "failpoints"))]
    let lost = false;
    lost
}

/// Applies `FAILPOINTS` (`name=action;name=action`) once at start-up.
///
/// # Errors
/// A malformed entry, or a name that is not a crash point, is reported so
/// the caller can refuse to start instead of silently ignoring it.
pub fn setup_from_env() -> Result<(), String> {
    let Ok(spec) = std::env::var("FAILPOINTS") else {
        return Ok(());
    };
    for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, action)) = entry.split_once('=') else {
            return Err(format!(
                "FAILPOINTS entry `{entry}` is not `name=action` (e.g. after_commit=return(exit))"
            ));
        };
        let name = name.trim();
        if !CRASH_POINTS.contains(&name) {
            return Err(format!(
                "FAILPOINTS names `{name}`, which is not a crash point (known: {})",
                CRASH_POINTS.join(", ")
            ));
        }
        #[cfg(feature = "failpoints")]
        fail::cfg(name, action.trim()).map_err(|e| format!("FAILPOINTS entry `{entry}`: {e}"))?;
        #[cfg(not(feature = "failpoints"))]
        {
            let _ = action;
            return Err("FAILPOINTS is set but this build has no crash points (build with the `failpoints` feature)".into());
        }
    }
    Ok(())
}
