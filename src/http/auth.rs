//! `Authorization: Bearer <secret key>` → the merchant. A missing, malformed,
//! unknown or revoked key is 401; a database that cannot be asked is 503, so
//! nothing is ever served unauthenticated.

use std::future::Future;
use std::pin::Pin;

use actix_web::http::header::AUTHORIZATION;
use actix_web::{dev::Payload, web, FromRequest, HttpRequest};

use crate::db::Database;
use crate::domain::{ApiKey, MerchantId};
use crate::error::ApiError;
use crate::service::api_keys::ApiKeyCache;

pub struct AuthenticatedMerchant(pub MerchantId);

impl FromRequest for AuthenticatedMerchant {
    type Error = ApiError;
    type Future = Pin<Box<dyn Future<Output = Result<Self, ApiError>>>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let secret = bearer_token(request).map(ApiKey::from_secret);
        let cache = request.app_data::<web::Data<ApiKeyCache>>().cloned();
        let db = request.app_data::<web::Data<Database>>().cloned();
        Box::pin(async move {
            let key = secret.ok_or(ApiError::Unauthenticated)?;
            let (Some(cache), Some(db)) = (cache, db) else {
                return Err(ApiError::Internal(
                    "the app carries no API-key cache".into(),
                ));
            };
            let merchant = cache
                .authenticate(&db, &key)
                .await?
                .ok_or(ApiError::Unauthenticated)?;
            crate::telemetry::record("merchant", &merchant);
            Ok(AuthenticatedMerchant(merchant))
        })
    }
}

/// The token of the one `Authorization: Bearer` header; two headers are as
/// good as none (which one would count is ambiguous).
fn bearer_token(request: &HttpRequest) -> Option<&str> {
    let mut values = request.headers().get_all(AUTHORIZATION);
    let value = values.next()?.to_str().ok()?;
    if values.next().is_some() {
        return None;
    }
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty() && token.len() <= 200)
        .then_some(token)
}
