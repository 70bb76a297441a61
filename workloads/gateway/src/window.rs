//! The sale window: new orders are taken from `opensAt` (inclusive) until
//! `closesAt` (exclusive). Either bound may be absent; with neither the sale
//! is always open. The decision is a pure function of the time, so it is
//! tested without a clock; the handler passes the system clock.

use std::time::Duration;

use axum::http::{HeaderValue, StatusCode, header};
use flashsale_runtime::ApiError;
use jiff::Timestamp;

/// The longest `Retry-After` sent before the opening: a client told to come
/// back in a day would rather be told again in an hour (the opening time may
/// also move when the operator re-renders the configuration).
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(3600);

/// Where a moment falls in the sale window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowState {
    /// Orders are taken.
    Open,
    /// Before the opening.
    NotYet {
        /// When the sale opens.
        opens_at: Timestamp,
        /// Whole seconds until the opening, rounded up, within
        /// 1 s..=[`MAX_RETRY_AFTER`].
        retry_after: Duration,
    },
    /// At or after the closing.
    Ended {
        /// When the sale closed.
        closed_at: Timestamp,
    },
}

/// Where `now` falls in the window `[opens, closes)`.
pub fn window_state(
    now: Timestamp,
    opens: Option<Timestamp>,
    closes: Option<Timestamp>,
) -> WindowState {
    if let Some(closed_at) = closes
        && now >= closed_at
    {
        return WindowState::Ended { closed_at };
    }
    match opens {
        Some(opens_at) if now < opens_at => WindowState::NotYet {
            opens_at,
            retry_after: retry_after(opens_at.duration_since(now)),
        },
        _ => WindowState::Open,
    }
}

/// `until` in whole seconds, rounded up so a client does not come back
/// early, and kept within 1 s..=[`MAX_RETRY_AFTER`].
fn retry_after(until: jiff::SignedDuration) -> Duration {
    let whole = until
        .as_secs()
        .saturating_add(i64::from(until.subsec_nanos() > 0));
    let max = MAX_RETRY_AFTER.as_secs();
    Duration::from_secs(u64::try_from(whole).unwrap_or(1).clamp(1, max))
}

impl WindowState {
    /// Ok when orders are taken, else the refusal: 409 `sale_not_open`
    /// with `Retry-After`, or 410 `sale_ended`.
    pub fn check(self) -> Result<(), ApiError> {
        match self {
            WindowState::Open => Ok(()),
            WindowState::NotYet {
                opens_at,
                retry_after,
            } => Err(ApiError::new(
                StatusCode::CONFLICT,
                "sale_not_open",
                format!(
                    "the sale opens at {opens_at}; no orders are taken before then (retry after the Retry-After delay)"
                ),
            )
            .with_header(
                header::RETRY_AFTER,
                HeaderValue::from(retry_after.as_secs()),
            )),
            WindowState::Ended { closed_at } => Err(ApiError::new(
                StatusCode::GONE,
                "sale_ended",
                format!(
                    "the sale closed at {closed_at}; no new orders are taken (reserved orders may still be paid until their reservation expires)"
                ),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use jiff::SignedDuration;

    use super::*;

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
    }

    const OPENS: &str = "2026-11-11T00:00:00Z";
    const CLOSES: &str = "2026-11-12T00:00:00Z";

    fn state(now: Timestamp) -> WindowState {
        window_state(now, Some(at(OPENS)), Some(at(CLOSES)))
    }

    #[test]
    fn no_bounds_is_always_open() {
        for now in [Timestamp::MIN, at(OPENS), Timestamp::MAX] {
            assert_eq!(window_state(now, None, None), WindowState::Open);
        }
    }

    #[test]
    fn the_opening_is_inclusive_and_the_closing_exclusive() {
        let opens = at(OPENS);
        let closes = at(CLOSES);
        let tick = SignedDuration::from_nanos(1);
        assert!(matches!(
            state(opens - tick),
            WindowState::NotYet { retry_after, opens_at }
                if retry_after == Duration::from_secs(1) && opens_at == opens
        ));
        assert_eq!(state(opens), WindowState::Open);
        assert_eq!(state(closes - tick), WindowState::Open);
        assert_eq!(state(closes), WindowState::Ended { closed_at: closes });
        assert_eq!(
            state(closes + SignedDuration::from_hours(48)),
            WindowState::Ended { closed_at: closes }
        );
    }

    #[test]
    fn retry_after_rounds_up_and_is_capped() {
        let opens = at(OPENS);
        let wait = |before: SignedDuration| match state(opens - before) {
            WindowState::NotYet { retry_after, .. } => retry_after.as_secs(),
            other => panic!("{other:?}"),
        };
        assert_eq!(wait(SignedDuration::from_millis(1)), 1);
        assert_eq!(wait(SignedDuration::from_secs(10)), 10);
        assert_eq!(wait(SignedDuration::from_millis(10_200)), 11);
        assert_eq!(wait(SignedDuration::from_secs(3599)), 3599);
        assert_eq!(wait(SignedDuration::from_secs(3600)), 3600);
        assert_eq!(wait(SignedDuration::from_hours(48)), 3600);
    }

    #[test]
    fn one_bound_alone() {
        let opens = at(OPENS);
        let hour = SignedDuration::from_hours(1);
        assert!(matches!(
            window_state(opens - hour, Some(opens), None),
            WindowState::NotYet { .. }
        ));
        assert_eq!(
            window_state(opens + hour * 1000, Some(opens), None),
            WindowState::Open
        );
        assert_eq!(
            window_state(opens - hour, None, Some(opens)),
            WindowState::Open
        );
        assert_eq!(
            window_state(opens, None, Some(opens)),
            WindowState::Ended { closed_at: opens }
        );
    }

    #[test]
    fn refusals_carry_their_status_code_and_headers() {
        let opens = at(OPENS);
        assert!(state(opens).check().is_ok());
        let early = state(opens - SignedDuration::from_secs(90)).check();
        let Err(early) = early else {
            panic!("open before the opening")
        };
        assert_eq!(
            (early.status(), early.code()),
            (StatusCode::CONFLICT, "sale_not_open")
        );
        assert!(early.to_string().contains(OPENS), "{early}");
        let response = axum::response::IntoResponse::into_response(early);
        assert_eq!(response.headers()[header::RETRY_AFTER], "90");

        let Err(late) = state(at(CLOSES)).check() else {
            panic!("open at the closing")
        };
        assert_eq!(
            (late.status(), late.code()),
            (StatusCode::GONE, "sale_ended")
        );
        assert!(late.to_string().contains(CLOSES), "{late}");
    }
}
