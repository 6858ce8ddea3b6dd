//! What both backends' relay statements share: the columns an attempt's
//! result writes.

/// The columns an attempt's result writes to its delivery row.
pub(crate) struct Finished<'a> {
    pub state: super::DeliveryState,
    /// `None` keeps the row's.
    pub next_at: Option<i64>,
    pub status: Option<i64>,
    pub error: Option<&'a str>,
    pub delivered_at: Option<i64>,
    /// Not sent ([`super::DeliveryResult::Unsent`]): the row keeps its last
    /// status and error, and its attempt count is the one before the claim.
    pub unsent: bool,
    /// The row's attempts from now on.
    pub attempts: i64,
}

impl<'a> Finished<'a> {
    pub(crate) fn of(f: &'a super::DeliveryFinish) -> Self {
        use super::{DeliveryResult, DeliveryState};
        match &f.result {
            DeliveryResult::Delivered { status } => Self {
                state: DeliveryState::Delivered,
                next_at: None,
                status: *status,
                error: None,
                delivered_at: Some(f.now),
                unsent: false,
                attempts: f.attempts,
            },
            DeliveryResult::Retry { at, status, error } => Self {
                state: DeliveryState::Pending,
                next_at: Some(*at),
                status: *status,
                error: Some(error),
                delivered_at: None,
                unsent: false,
                attempts: f.attempts,
            },
            DeliveryResult::Dead { status, error } => Self {
                state: DeliveryState::Dead,
                next_at: None,
                status: *status,
                error: Some(error),
                delivered_at: None,
                unsent: false,
                attempts: f.attempts,
            },
            DeliveryResult::Unsent => Self {
                state: DeliveryState::Pending,
                next_at: None,
                status: None,
                error: None,
                delivered_at: None,
                unsent: true,
                attempts: f.attempts - 1,
            },
        }
    }
}
