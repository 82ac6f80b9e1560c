//! A key's own limits: its requests and tokens per minute, its requests at
//! once, its day and month quotas, kept by this instance or, in a fleet, in
//! the limit store ([`store`]), and the series each tenant has
//! ([`tenant_series`]). The request path calls one stage here, in two
//! steps of one tenant: [`Tenant::start_reading`] before the body is read
//! (the key's concurrency), then [`limit`] once its tokens are known (the
//! rates and quotas). Below admission, which reads a tenant's [`Share`] of
//! the slots; above `upstream`. The rules: docs/design/fair-share.md
//! (rules 9 to 12) and docs/access.md.

mod keyed;
pub(crate) mod keylimits;
pub(crate) mod quota;
pub(crate) mod store;
pub(crate) mod tenant_series;
pub(crate) mod tenants;

pub(crate) use keyed::{concurrent_error, limit};
pub(crate) use tenants::{Permit, RateState, Share, Tenant, Tenants};
