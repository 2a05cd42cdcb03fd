//! Creating a charge exactly once.
//!
//! 1. Insert the charge as `pending` with a lease and commit, before any side
//!    effect. The unique (merchant, key) index makes this the one decision
//!    point: whoever inserts owns the charge; everyone else finds the row.
//! 2. Call the processor with the charge's stable downstream key, holding no
//!    database connection.
//! 3. Record the outcome and its outbox event in one statement.
//!
//! A request that finds a pending charge whose lease ran out (its owner died
//! or got no answer) takes the lease over and repeats step 2 with the same
//! downstream key; the processor answers as it did the first time.

use std::time::{Duration, Instant};

use actix_web::web;

use crate::domain::{Charge, ChargeStatus, Fingerprint, IdempotencyKey, MerchantId, NewCharge};
use crate::error::ApiError;
use crate::processor::{PaymentRequest, ProcessorReply};
use crate::state::AppState;
use crate::{crash, db};

/// What a client is told to wait before retrying a key that is in flight.
/// Requests normally finish in milliseconds, so a second is a fair hint even
/// though the lease itself may run longer.
pub const IN_USE_RETRY_AFTER_SECS: u64 = 1;

/// Longest pause between two looks at a charge in flight elsewhere.
const MAX_IN_FLIGHT_POLL: Duration = Duration::from_millis(20);

/// A charge to answer with. `replayed` is true when the key already existed,
/// so the answer belongs to an earlier request.
#[derive(Debug)]
pub struct ChargeReply {
    pub charge: Charge,
    pub replayed: bool,
}

pub async fn create(
    state: web::Data<AppState>,
    merchant: MerchantId,
    key: &IdempotencyKey,
    fingerprint: Fingerprint,
    request: &NewCharge,
) -> Result<ChargeReply, ApiError> {
    let (charge, created) = {
        let client = state.pool.get().await?;
        db::charges::insert_or_find(
            &client,
            crate::domain::ChargeId::new(),
            merchant,
            key,
            &fingerprint,
            request,
            state.lease,
        )
        .await?
        .ok_or_else(|| {
            ApiError::ServiceUnavailable("idempotency key kept changing hands".to_owned())
        })?
    };
    // Same key, different request: a client bug. Never execute it.
    if charge.fingerprint != fingerprint {
        return Err(ApiError::IdempotencyKeyReused);
    }
    if created {
        return process(state, charge, false).await;
    }
    if charge.status != ChargeStatus::Pending {
        return Ok(ChargeReply {
            charge,
            replayed: true,
        });
    }
    resume(state, charge).await
}

/// A pending charge found by a retry or a concurrent duplicate. If its lease
/// ran out, take it over and finish it. If it is in flight elsewhere, wait up
/// to `in_flight_wait` for that request to finish and answer with its result;
/// only then give up with 409.
async fn resume(state: web::Data<AppState>, charge: Charge) -> Result<ChargeReply, ApiError> {
    let deadline = Instant::now() + state.in_flight_wait;
    let mut pause = Duration::from_millis(1);
    loop {
        let (current, taken) = {
            let client = state.pool.get().await?;
            db::charges::take_over_or_read(&client, charge.id, state.lease)
                .await?
                .ok_or(ApiError::NotFound)?
        };
        if taken {
            return process(state, current, true).await;
        }
        if current.status != ChargeStatus::Pending {
            return Ok(ChargeReply {
                charge: current,
                replayed: true,
            });
        }
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(ApiError::IdempotencyKeyInUse {
                retry_after_secs: IN_USE_RETRY_AFTER_SECS,
            });
        }
        tokio::time::sleep(pause.min(remaining)).await;
        pause = (pause * 2).min(MAX_IN_FLIGHT_POLL);
    }
}

/// Steps 2 and 3 for a charge whose lease we hold. Runs as its own task so a
/// client that hangs up mid-request cannot cancel it between the processor's
/// answer and the outcome's commit.
async fn process(
    state: web::Data<AppState>,
    charge: Charge,
    replayed: bool,
) -> Result<ChargeReply, ApiError> {
    let task = tokio::spawn(async move {
        let charge = call_processor_and_record(&state, charge).await?;
        Ok(ChargeReply { charge, replayed })
    });
    task.await
        .map_err(|e| ApiError::Internal(format!("charge task failed: {e}")))?
}

/// Finishes abandoned charges (pending, lease run out) through the same path
/// a request takes; returns how many it claimed. Used by the recovery worker.
pub async fn recover_abandoned(state: &AppState, batch: i64) -> Result<usize, ApiError> {
    let claimed = {
        let client = state.pool.get().await?;
        db::charges::claim_abandoned(&client, state.lease, batch).await?
    };
    let count = claimed.len();
    let results = futures_util::future::join_all(
        claimed
            .into_iter()
            .map(|charge| call_processor_and_record(state, charge)),
    )
    .await;
    for result in results {
        match result {
            Ok(charge) if charge.status == ChargeStatus::Pending => {
                tracing::info!(charge = %charge.id, "still pending after recovery attempt")
            }
            Ok(charge) => {
                tracing::info!(charge = %charge.id, status = charge.status.as_str(), "recovered")
            }
            Err(error) => tracing::warn!(%error, "recovery attempt failed"),
        }
    }
    Ok(count)
}

/// Steps 2 and 3, for a charge whose lease the caller holds.
async fn call_processor_and_record(state: &AppState, charge: Charge) -> Result<Charge, ApiError> {
    crash::point("after_pending_commit");
    let processor_key = charge.id.processor_idempotency_key();
    let reply = state
        .processor
        .charge(&PaymentRequest {
            idempotency_key: &processor_key,
            amount: charge.amount,
            currency: &charge.currency,
            customer: charge.customer.as_deref(),
            description: charge.description.as_deref(),
        })
        .await;
    crash::point("after_processor_reply");
    let client = state.pool.get().await?;
    let recorded = match reply {
        ProcessorReply::Final(outcome) => {
            db::charges::record_outcome(&client, &charge, &outcome).await?
        }
        ProcessorReply::Unknown { reason } => {
            tracing::warn!(charge = %charge.id, %reason, "processor outcome unknown; charge stays pending");
            match charge.locked_until {
                Some(lease) => db::charges::release_lease(&client, charge.id, lease).await?,
                None => None,
            }
        }
    };
    match recorded {
        Some(charge) => {
            crash::point("after_outcome_commit");
            Ok(charge)
        }
        // Another request recorded the outcome (or took the lease) first.
        None => db::charges::find(&client, charge.merchant_id, charge.id)
            .await?
            .ok_or(ApiError::NotFound),
    }
}
