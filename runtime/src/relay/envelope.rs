//! What a sink is sent for an event, the same for every kind of sink.

use crate::clock::rfc3339;
use crate::store::OutboxRow;

/// What every sink is sent for an event: its identity, type, time, run and
/// stage (`null` for a run's own event) around the host-written payload.
pub fn envelope(e: &OutboxRow) -> Vec<u8> {
    let data = serde_json::from_str::<serde_json::Value>(&e.payload)
        .unwrap_or_else(|_| serde_json::Value::String(e.payload.clone()));
    serde_json::json!({
        "id": e.dedup_key,
        "type": e.event,
        "timestamp": rfc3339(e.created_at),
        "run": e.run_id,
        "stage": (!e.stage.is_empty()).then_some(&e.stage),
        "data": data,
    })
    .to_string()
    .into_bytes()
}
