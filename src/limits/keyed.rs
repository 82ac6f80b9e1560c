//! The key's own limits as a stage of the request path: its reservation
//! taken (from the limit store when it answers, else this instance's
//! part), or the 429 that says which limit refused, for how long, and how
//! the request could fit (docs/access.md, rules 7 to 12).

use std::sync::Arc;

use tokio::time::Instant;

use super::{quota, tenants, Permit, RateState, Tenant};
use crate::error::GatewayError;

/// The key's own limits, before anything else of admission: a permit for
/// the request and the key's quotas after it, or the 429 (with the quotas,
/// for its headers). `reserve`: the tokens the request may use.
///
/// With a limit store that answers, the key's whole limits are checked there
/// (every instance counts against them); otherwise this instance's part.
pub(crate) async fn limit(tenant: &Arc<Tenant>, reserve: u64) -> Result<(Permit, RateState), Box<(GatewayError, RateState)>> {
    let now = Instant::now();
    let verdict = match tenant.admit_shared(now, reserve).await {
        Some(v) => v,
        None => tenant.admit(now, reserve),
    };
    let shared = tenant.store().is_some_and(|s| s.is_up());
    verdict.map_err(|l| {
        let limits = if shared { tenant.configured_limits() } else { tenant.limits() };
        let message = match l.limit {
            tenants::Limit::Requests => format!(
                "Rate limit reached for key `{}` on requests per minute: limit {}; retry in {} s",
                tenant.name,
                limits.requests_per_minute.unwrap_or(0),
                l.retry_after
            ),
            tenants::Limit::Tokens if l.too_large => format!(
                "Request too large for key `{}` on tokens per minute: limit {}, requested {} (prompt estimate plus max_tokens); lower max_tokens or the prompt",
                tenant.name,
                limits.tokens_per_minute.unwrap_or(0),
                l.reserve
            ),
            tenants::Limit::Tokens => format!(
                "Rate limit reached for key `{}` on tokens per minute: limit {}, requested {}; retry in {} s",
                tenant.name,
                limits.tokens_per_minute.unwrap_or(0),
                l.reserve,
                l.retry_after
            ),
            tenants::Limit::Concurrent => format!(
                "Key `{}` has {} requests running, its max_concurrent; retry when one ends",
                tenant.name,
                limits.max_concurrent.unwrap_or(0)
            ),
            tenants::Limit::Quota => return Box::new((quota_error(&tenant.name, &l), l.state)),
        };
        Box::new((GatewayError::KeyLimited { message, limit: l.limit.as_str(), code: "rate_limit_exceeded", retry_after: l.retry_after }, l.state))
    })
}

/// The 429 of a key with `max` requests running (or being read) already.
pub(crate) fn concurrent_error(max: u64) -> GatewayError {
    GatewayError::KeyLimited {
        message: format!("This key has {max} requests running, its max_concurrent; retry when one ends"),
        limit: tenants::Limit::Concurrent.as_str(),
        code: "rate_limit_exceeded",
        retry_after: 1,
    }
}

/// The 429 of a key over its day's or month's quota (`quota_exceeded`),
/// with Retry-After to the window's end.
fn quota_error(key: &str, l: &tenants::Limited) -> GatewayError {
    let Some(q) = l.quota else {
        return GatewayError::KeyLimited {
            message: format!("Key `{key}` is over a quota"),
            limit: "tokens",
            code: "quota_exceeded",
            retry_after: l.retry_after,
        };
    };
    let what = format!("{} per {}", q.kind.as_str(), q.period.as_str());
    let message = if q.too_large {
        format!(
            "Request too large for key `{key}`'s quota of {what}: limit {}, requested {} (prompt estimate plus max_tokens)",
            q.limit, l.reserve
        )
    } else {
        let back = match q.period {
            quota::Period::Day => "at 00:00 UTC",
            quota::Period::Month => "on the first of the month, 00:00 UTC",
        };
        format!("Quota exceeded for key `{key}`: {what}, limit {}, used {}; it comes back {back}, in {} s", q.limit, q.used, q.retry_after)
    };
    GatewayError::KeyLimited { message, limit: q.kind.as_str(), code: "quota_exceeded", retry_after: q.retry_after }
}
