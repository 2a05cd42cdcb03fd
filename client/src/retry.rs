//! The retry policy: which failures are retried, how long to wait between
//! attempts, and when to give up. The rules themselves are documented on
//! [`RetryPolicy`], where users see them.
//!
//! Invariant: every attempt of one operation sends the same idempotency key
//! and the same body bytes. That is what makes retrying a `POST` safe: the
//! service answers a retry of finished work with the stored answer, and
//! finishes pending work instead of starting it again. This module never
//! sees a key; the caller builds every attempt from the same one.
//!
//! The loop is [`backon`]'s: its `when` hook applies the table of
//! [`RetryPolicy`], and its `adjust` hook replaces the exponential step with
//! `Retry-After` or a full-jitter draw and ends the retries at the deadline.
//! backon's own jitter is not used: it adds up to one more step on top of
//! the delay instead of drawing below it.

use std::future::Future;
use std::time::{Duration, Instant};

use backon::{ExponentialBuilder, Retryable};
use reqwest::StatusCode;

use crate::Error;

/// How hard the client tries before it gives up. Applies to every call;
/// the deadline and attempt count are per call (per logical operation).
///
/// | what happened | retried? |
/// |---|---|
/// | no answer (connection refused or broken, timeout) | yes |
/// | `5xx` (incl. `503 service_unavailable`) | yes |
/// | `429` | yes |
/// | `409 idempotency_key_in_use` | yes |
/// | `202` with `status: pending` | yes, with the same key, to finish it |
/// | `400`, `401`, `402`, `404`, `413`, `415`, `422`, any other `4xx` | never |
///
/// Between attempts the client waits what `Retry-After` (seconds) asks for,
/// else a random time in `[0, min(max_backoff, initial_backoff × 2ⁿ⁻¹)]`
/// before retry n ("full jitter": clients that failed together do not come
/// back together). It stops after `max_attempts` requests, or as soon as
/// the next wait would end past the total `deadline` (a wait that cannot be
/// followed by an attempt in time is not worth sleeping). A call that stops
/// on a retryable error returns [`Error::GaveUp`]; one that stops on a
/// pending charge or refund returns [`Error::Pending`] /
/// [`Error::RefundPending`].
///
/// ```
/// use std::time::Duration;
/// use chargeonce_client::RetryPolicy;
///
/// let patient = RetryPolicy {
///     max_attempts: 20,
///     deadline: Duration::from_secs(300),
///     ..RetryPolicy::default()
/// };
/// assert_eq!(patient.initial_backoff, Duration::from_millis(100));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Most requests per call, the first one included. `1` never retries;
    /// `0` counts as `1`.
    pub max_attempts: u32,
    /// The cap of the first wait; each later cap doubles, up to
    /// `max_backoff`.
    pub initial_backoff: Duration,
    /// The largest wait drawn from the backoff (not a cap on `Retry-After`,
    /// which only the deadline bounds).
    pub max_backoff: Duration,
    /// The longest a call may take, all attempts and waits included. Each
    /// attempt's timeout is cut to what remains of it.
    pub deadline: Duration,
}

impl Default for RetryPolicy {
    /// 8 attempts, waits from 100 ms doubling up to 5 s, within 60 s in
    /// total.
    fn default() -> Self {
        Self {
            max_attempts: 8,
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            deadline: Duration::from_secs(60),
        }
    }
}

impl RetryPolicy {
    /// One attempt, no retries: for callers that run their own retry loop
    /// (with the same key).
    pub fn no_retries() -> Self {
        Self {
            max_attempts: 1,
            ..Self::default()
        }
    }
}

/// Whether a failed attempt is tried again (the table of the module docs).
pub(crate) fn is_retried(error: &Error) -> bool {
    match error {
        Error::Transport { source, .. } => !(source.is_builder() || source.is_redirect()),
        Error::Pending { .. } | Error::RefundPending { .. } => true,
        Error::Api { status, code, .. } => {
            status.is_server_error()
                || *status == StatusCode::TOO_MANY_REQUESTS
                || (*status == StatusCode::CONFLICT
                    && code.as_deref() == Some("idempotency_key_in_use"))
        }
        _ => false,
    }
}

fn is_pending(error: &Error) -> bool {
    matches!(error, Error::Pending { .. } | Error::RefundPending { .. })
}

/// A `Retry-After` value in delay-seconds. The HTTP-date form (which the
/// service never sends) and anything unparsable give `None`, so the
/// backoff applies instead. Absurdly large numbers saturate, which ends the
/// retries at the deadline check rather than overflowing.
pub(crate) fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)))
}

/// Full jitter: a point in `[0, cap]`, where `unit` is uniform in `[0, 1)`.
fn full_jitter(cap: Duration, unit: f64) -> Duration {
    cap.mul_f64(unit.clamp(0.0, 1.0))
}

/// The wait before the next attempt, or `None` to stop. `step` is the
/// exponential step backon proposes (`None` once the attempts are used up),
/// `elapsed` the time since the call began.
fn next_wait(
    policy: &RetryPolicy,
    error: &Error,
    step: Option<Duration>,
    elapsed: Duration,
    unit: f64,
) -> Option<Duration> {
    let step = step?;
    let wait = match error {
        Error::Api {
            retry_after: Some(asked),
            ..
        } => *asked,
        _ => full_jitter(step, unit),
    };
    let remaining = policy.deadline.saturating_sub(elapsed);
    (wait < remaining).then_some(wait)
}

/// The exponential steps (caps of the jitter draws) of `policy`: initial,
/// doubling, at most `max_backoff`, one per retry.
fn steps(policy: &RetryPolicy) -> ExponentialBuilder {
    ExponentialBuilder::default()
        .with_min_delay(policy.initial_backoff)
        .with_max_delay(policy.max_backoff.max(policy.initial_backoff))
        .with_factor(2.0)
        .with_max_times(policy.max_attempts.max(1) as usize - 1)
}

/// Runs `attempt` until it succeeds, fails for good, or the policy runs out.
/// `attempt` gets the timeout for that one request: `request_timeout`, cut
/// to what is left of the deadline.
///
/// A retryable error that ends the call comes back as [`Error::GaveUp`],
/// except a pending resource, which comes back as itself
/// ([`Error::Pending`]): the service accepted the work, so "gave up" would
/// mislead.
pub(crate) async fn run<T, F, Fut>(
    policy: &RetryPolicy,
    request_timeout: Duration,
    mut attempt: F,
) -> Result<T, Error>
where
    F: FnMut(Duration) -> Fut,
    Fut: Future<Output = Result<T, Error>>,
{
    let started = Instant::now();
    let mut attempts = 0u32;
    let result = (|| {
        attempts += 1;
        let remaining = policy.deadline.saturating_sub(started.elapsed());
        attempt(request_timeout.min(remaining))
    })
    .retry(steps(policy))
    .when(is_retried)
    .adjust(|error, step| next_wait(policy, error, step, started.elapsed(), fastrand::f64()))
    .await;
    match result {
        Err(last) if is_retried(&last) && !is_pending(&last) => Err(Error::GaveUp {
            last: Box::new(last),
            attempts,
            elapsed: started.elapsed(),
        }),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use backon::BackoffBuilder;
    use reqwest::header::HeaderMap;

    fn answer(status: u16, code: &str) -> Error {
        let body = serde_json::json!({"code": code, "detail": "d"}).to_string();
        Error::from_answer(
            StatusCode::from_u16(status).expect("status"),
            &HeaderMap::new(),
            body.as_bytes(),
            None,
        )
    }

    #[test]
    fn retried_statuses_and_codes() {
        for (status, code) in [
            (500, "internal_error"),
            (502, ""),
            (503, "service_unavailable"),
            (504, ""),
            (429, "rate_limited"),
            (409, "idempotency_key_in_use"),
        ] {
            assert!(is_retried(&answer(status, code)), "{status} {code}");
        }
    }

    #[test]
    fn final_answers_are_never_retried() {
        for (status, code) in [
            (400, "invalid_request"),
            (400, "idempotency_key_invalid"),
            (400, "charge_not_refundable"),
            (401, "unauthenticated"),
            (402, "card_declined"),
            (404, "not_found"),
            (405, "method_not_allowed"),
            (409, "some_other_conflict"),
            (413, "payload_too_large"),
            (415, "unsupported_media_type"),
            (422, "idempotency_key_reused"),
            (422, "idempotency_key_expired"),
        ] {
            assert!(!is_retried(&answer(status, code)), "{status} {code}");
        }
    }

    #[test]
    fn retry_after_parses_delay_seconds_only() {
        assert_eq!(parse_retry_after("1"), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 120 "), Some(Duration::from_secs(120)));
        assert_eq!(parse_retry_after("0"), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("99999999999999999999999"),
            Some(Duration::from_secs(u64::MAX))
        );
        for unusable in ["", "-1", "1.5", "soon", "Wed, 21 Oct 2015 07:28:00 GMT"] {
            assert_eq!(parse_retry_after(unusable), None, "{unusable:?}");
        }
    }

    #[test]
    fn steps_double_from_the_initial_backoff_up_to_the_cap() {
        let policy = RetryPolicy::default();
        // backon multiplies in f32: compare whole milliseconds.
        let proposed: Vec<_> = steps(&policy).build().map(|d| d.as_millis()).collect();
        assert_eq!(
            proposed,
            [100, 200, 400, 800, 1600, 3200, 5000],
            "one step per retry: max_attempts - 1 of them"
        );
        let single = RetryPolicy {
            max_attempts: 0,
            ..RetryPolicy::default()
        };
        assert_eq!(steps(&single).build().count(), 0);
    }

    #[test]
    fn full_jitter_stays_within_zero_and_the_step() {
        let step = Duration::from_millis(800);
        assert_eq!(full_jitter(step, 0.0), Duration::ZERO);
        assert_eq!(full_jitter(step, 0.5), Duration::from_millis(400));
        assert!(full_jitter(step, 0.999_999) <= step);
        for _ in 0..1000 {
            assert!(full_jitter(step, fastrand::f64()) <= step);
        }
    }

    #[test]
    fn retry_after_overrides_the_backoff_but_not_the_deadline() {
        let policy = RetryPolicy::default();
        let mut busy = answer(503, "service_unavailable");
        if let Error::Api { retry_after, .. } = &mut busy {
            *retry_after = Some(Duration::from_secs(7));
        }
        let step = Some(Duration::from_millis(100));
        // Longer than the step and than max_backoff: the server's word wins.
        assert_eq!(
            next_wait(&policy, &busy, step, Duration::ZERO, 0.5),
            Some(Duration::from_secs(7))
        );
        // But a wait that would end past the deadline ends the call now.
        assert_eq!(
            next_wait(&policy, &busy, step, Duration::from_secs(53), 0.5),
            None
        );
    }

    #[test]
    fn waits_without_retry_after_are_jittered_steps_within_the_deadline() {
        let policy = RetryPolicy::default();
        let broken = answer(502, "");
        let step = Some(Duration::from_secs(2));
        assert_eq!(
            next_wait(&policy, &broken, step, Duration::ZERO, 0.25),
            Some(Duration::from_millis(500))
        );
        assert_eq!(
            next_wait(&policy, &broken, step, Duration::from_millis(59_600), 0.25),
            None
        );
        // Out of attempts: backon proposes no step, and nothing overrides it.
        assert_eq!(
            next_wait(&policy, &broken, None, Duration::ZERO, 0.25),
            None
        );
    }
}
