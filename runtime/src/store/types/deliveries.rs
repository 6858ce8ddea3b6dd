//! The relay's rows: each committed event's deliveries to the sinks that
//! take it, one per sink, each with its own state.

use serde::Serialize;

use super::OutboxRow;

/// Where a delivery stands. `pending` covers waiting, being sent and
/// waiting to be retried; the other two are final until an operator
/// redelivers a dead letter.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    Serialize,
    serde::Deserialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum DeliveryState {
    Pending,
    Delivered,
    Dead,
}

impl DeliveryState {
    pub const ALL: [DeliveryState; 3] = [Self::Pending, Self::Delivered, Self::Dead];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "pending",
            Self::Delivered => "delivered",
            Self::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|state| state.as_str() == s)
    }
}

impl std::fmt::Display for DeliveryState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Routing's next page: up to `page` of the committed events no relay has
/// routed yet, oldest first, each given a delivery to every sink of
/// `sinks` that takes it (none, when none does) and marked routed, in one
/// transaction.
#[derive(Debug, Clone, Default)]
pub struct Routing {
    pub page: usize,
    pub sinks: Vec<SinkRoute>,
    pub now: i64,
}

impl Routing {
    /// The deliveries routing gives `events`, in their order.
    pub fn deliveries_of(&self, events: &[UnroutedEvent]) -> Vec<NewDelivery> {
        events
            .iter()
            .flat_map(|e| {
                self.sinks
                    .iter()
                    .filter(|s| s.takes(&e.event))
                    .map(|s| NewDelivery {
                        outbox_id: e.id,
                        sink: s.sink.clone(),
                        run_id: e.run_id.clone(),
                    })
            })
            .collect()
    }
}

/// A sink routing gives deliveries to, and the events it takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkRoute {
    pub sink: String,
    pub events: Vec<EventPattern>,
}

impl SinkRoute {
    /// Whether this sink takes `event`.
    pub fn takes(&self, event: &str) -> bool {
        self.events.iter().any(|p| p.matches(event))
    }
}

/// An event name pattern: `*` matches any run of characters, dots
/// included (`draft.*`, `run.*`, `*`); every other character is itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventPattern(String);

impl EventPattern {
    /// `text` as a pattern, if it is one: event name characters (ASCII
    /// letters and digits, `.`, `-`, `_`) and `*`.
    pub fn parse(text: &str) -> Option<Self> {
        let ok = !text.is_empty()
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '*'));
        ok.then(|| Self(text.to_string()))
    }

    pub fn matches(&self, event: &str) -> bool {
        let mut parts = self.0.split('*');
        let first = parts.next().unwrap_or_default();
        let Some(mut rest) = event.strip_prefix(first) else {
            return false;
        };
        let tail: Vec<&str> = parts.collect();
        let Some((last, middle)) = tail.split_last() else {
            return rest.is_empty();
        };
        for part in middle {
            match rest.find(part) {
                Some(at) => rest = &rest[at + part.len()..],
                None => return false,
            }
        }
        rest.ends_with(last)
    }

    /// The pattern for SQL's `LIKE`, whose escape is a backslash, that
    /// matches the names this one does: `*` is `%`, and `_`, which is any
    /// one character there, is escaped, as are `%` and the backslash.
    pub fn to_like(&self) -> String {
        let mut like = String::with_capacity(self.0.len() + 4);
        for c in self.0.chars() {
            match c {
                '*' => like.push('%'),
                '%' | '_' | '\\' => {
                    like.push('\\');
                    like.push(c);
                }
                c => like.push(c),
            }
        }
        like
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// What routing reads of an event not yet routed: its payload is read
/// only when a delivery of it is claimed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnroutedEvent {
    pub id: i64,
    pub run_id: String,
    pub event: String,
}

impl From<(i64, String, String)> for UnroutedEvent {
    /// From its columns `id, run_id, event`.
    fn from((id, run_id, event): (i64, String, String)) -> Self {
        Self { id, run_id, event }
    }
}

/// One event routed to one sink.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct NewDelivery {
    pub outbox_id: i64,
    pub sink: String,
    pub run_id: String,
}

/// Claims deliveries for `relay`, a run and sink at a time: up to `runs`
/// runs whose earliest pending delivery to one of `sinks` is due and not
/// leased (a later event of a run waits for an earlier one to the same
/// sink), and with it up to `per_run - 1` of the run's next pending
/// deliveries to that sink, in commit order, up to the first one leased or
/// waiting for a retry.
#[derive(Debug, Clone)]
pub struct DeliveryClaim {
    pub relay: String,
    pub sinks: Vec<String>,
    pub now: i64,
    pub lease_ms: i64,
    pub runs: usize,
    pub per_run: usize,
}

/// A delivery claimed for sending, with its event.
#[derive(Debug, Clone)]
pub struct ClaimedDelivery {
    pub id: i64,
    pub sink: String,
    /// Attempts so far, this one included.
    pub attempts: i64,
    /// When the current series of attempts began (created, or redelivered).
    pub retrying_since: i64,
    /// The lease it is sent under.
    pub lease: DeliveryLease,
    pub event: OutboxRow,
}

/// A claim's lease on a run's deliveries to a sink. Only the first of
/// them, the run's earliest pending one, records it (its owner, its end and
/// an attempt more): a claim never takes a run whose earliest pending
/// delivery is leased, so that one row holds the rest too.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeliveryLease {
    /// The delivery whose row records the lease.
    pub holder: i64,
    /// Its attempts, the claim's included: the lease's fence.
    pub attempts: i64,
}

/// How one attempt to deliver ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeliveryResult {
    Delivered {
        status: Option<i64>,
    },
    /// Try again at `at`.
    Retry {
        at: i64,
        status: Option<i64>,
        error: String,
    },
    /// A dead letter: refused by the sink, or retries exhausted.
    Dead {
        status: Option<i64>,
        error: String,
    },
    /// Not sent: an earlier event of its run claimed with it is being
    /// retried, or its lease would lapse during the send. Its lease is
    /// released and its attempt given back.
    Unsent,
}

/// The outcome of a claimed delivery's attempt, recorded only while
/// `relay` still holds `lease`.
#[derive(Debug, Clone)]
pub struct DeliveryFinish {
    pub id: i64,
    pub relay: String,
    pub lease: DeliveryLease,
    /// The claimed delivery's attempts, this one included.
    pub attempts: i64,
    pub result: DeliveryResult,
    pub now: i64,
}

/// Which deliveries to list: of one run or all, in one state or any.
#[derive(Debug, Clone, Default)]
pub struct DeliveryFilter {
    pub run_id: Option<String>,
    pub state: Option<DeliveryState>,
}

/// One delivery as `ratchet outbox` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct DeliveryRow {
    pub id: i64,
    pub outbox_id: i64,
    pub dedup_key: String,
    pub event: String,
    pub run_id: String,
    /// The stage whose completion committed the event.
    pub stage: String,
    pub sink: String,
    pub state: DeliveryState,
    pub attempts: i64,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub next_at: i64,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    #[serde(serialize_with = "crate::clock::as_rfc3339::serialize")]
    #[schema(value_type = String, format = DateTime)]
    pub created_at: i64,
    #[serde(serialize_with = "crate::clock::as_rfc3339::option")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub delivered_at: Option<i64>,
}

/// A delivery whose event is not in the outbox. Routing only ever makes
/// deliveries of events it has just read, and events are never deleted:
/// only a hand on the database makes one, and the audit reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OrphanDelivery {
    pub id: i64,
    pub outbox_id: i64,
    pub sink: String,
    pub run_id: String,
}

impl From<(i64, i64, String, String)> for OrphanDelivery {
    /// From its columns `id, outbox_id, sink, run_id`.
    fn from((id, outbox_id, sink, run_id): (i64, i64, String, String)) -> Self {
        Self {
            id,
            outbox_id,
            sink,
            run_id,
        }
    }
}

/// A delivery on which PostgreSQL's dead letters' table (`dead_deliveries`,
/// migration 0028) and the delivery's own state disagree: a dead delivery
/// the table does not list, which `ratchet outbox --state dead` and
/// `redeliver --dead` would miss, or a row of the table whose delivery is
/// not dead, or gone. Only a hand on the database makes one, and the audit
/// reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MisfiledDeadLetter {
    pub id: i64,
    pub sink: String,
    /// The delivery's run; `None` when the table lists a delivery that is
    /// gone.
    pub run_id: Option<String>,
    /// The delivery's state; `None` when it is gone.
    pub state: Option<DeliveryState>,
    /// Whether the dead letters' table lists it.
    pub listed: bool,
}

/// Dead letters to deliver again, under the same dedup key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeliver {
    One(i64),
    AllDead,
}

impl Redeliver {
    /// The one delivery named, if any (`None`: every dead letter).
    pub fn only(self) -> Option<i64> {
        match self {
            Self::One(id) => Some(id),
            Self::AllDead => None,
        }
    }
}
