//! What a sink is sent for an event, the same for every kind of sink.

use serde::Serialize;
use serde_json::value::RawValue;

use crate::clock::rfc3339;
use crate::store::OutboxRow;

/// What every sink is sent for an event: its identity, type, time, run and
/// stage (`null` for a run's own event) around the host-written payload.
pub fn envelope(e: &OutboxRow) -> Vec<u8> {
    // The payload is JSON the host wrote, spliced in as it is stored; text
    // that is not JSON goes as a string.
    let data = match serde_json::from_str::<&RawValue>(&e.payload) {
        Ok(json) => Data::Json(json),
        Err(_) => Data::Text(&e.payload),
    };
    let envelope = Envelope {
        data,
        id: &e.dedup_key,
        run: &e.run_id,
        stage: (!e.stage.is_empty()).then_some(&e.stage),
        timestamp: rfc3339(e.created_at),
        kind: &e.event,
    };
    serde_json::to_vec(&envelope).expect("an envelope of strings and JSON serializes")
}

/// The envelope's fields in the order of their names, as sinks have always
/// been sent them.
#[derive(Serialize)]
struct Envelope<'a> {
    data: Data<'a>,
    id: &'a str,
    run: &'a str,
    stage: Option<&'a str>,
    timestamp: String,
    #[serde(rename = "type")]
    kind: &'a str,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Data<'a> {
    Json(&'a RawValue),
    Text(&'a str),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(payload: &str, stage: &str) -> OutboxRow {
        OutboxRow {
            id: 7,
            dedup_key: "r1/draft/draft.ready".into(),
            run_id: "r1".into(),
            stage: stage.into(),
            event: "draft.ready".into(),
            payload: payload.into(),
            created_at: 0,
        }
    }

    /// The envelope names its fields in order and keeps the payload's JSON
    /// as the host wrote it. Seen failing with the payload taken as text:
    /// `data` was the quoted string.
    #[test]
    fn the_envelope_carries_the_payload_as_json_and_text_as_a_string() {
        let body = envelope(&event(r#"{"b":[1,2],"a":"x"}"#, "draft"));
        assert_eq!(
            String::from_utf8(body).expect("utf-8"),
            r#"{"data":{"b":[1,2],"a":"x"},"id":"r1/draft/draft.ready","run":"r1","stage":"draft","timestamp":"1970-01-01T00:00:00.000Z","type":"draft.ready"}"#
        );
        let body = envelope(&event("not json", ""));
        let value: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(value["data"], "not json");
        assert_eq!(value["stage"], serde_json::Value::Null);
    }
}
