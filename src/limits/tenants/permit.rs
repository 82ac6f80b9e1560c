//! A request's hold on its key's limits, from before its body is read
//! ([`Reading`]) to its end ([`Permit`]), given back exactly once.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio::time::Instant;

use super::Tenant;
use crate::limits::store::Store;

/// A request of a key with `max_concurrent` whose body is being read: one
/// of its key's requests already, so a key cannot have more bodies in
/// memory than requests running (docs/access.md, rule 18).
pub(crate) struct Reading(pub(super) Option<Arc<Tenant>>);

impl Drop for Reading {
    fn drop(&mut self) {
        if let Some(t) = &self.0 {
            t.reading.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

/// A request's hold on its key's limits: one of its concurrent requests,
/// and the tokens reserved for it until it is settled. It travels with the
/// response body and is given back exactly once, when the request ends.
#[derive(Debug)]
pub(crate) struct Permit {
    pub(super) tenant: Arc<Tenant>,
    pub(super) second: u64,
    pub(super) reserved: u64,
    pub(super) concurrent: bool,
    /// The replica's usage (prompt plus completion), once known.
    pub(super) used: Option<u64>,
    /// The request never reached a replica: it takes nothing from the key.
    pub(super) refunded: bool,
    /// Taken from the limit store (settled there), not this instance's windows.
    pub(super) shared: Option<Arc<Store>>,
    /// The wall second it was taken in (its quotas' windows), when the key has quotas.
    pub(super) quota_at: Option<u64>,
}

impl Permit {
    /// The replica said the request used `tokens` in all.
    pub(crate) fn settle(&mut self, tokens: u64) {
        self.used = Some(tokens);
    }

    /// The gateway refused the request after the key's limits let it
    /// through (its queue, its breaker): it counts for nothing.
    pub(crate) fn refund(&mut self) {
        self.used = Some(0);
        self.refunded = true;
    }

    /// The request is over: refunded if the gateway refused it after the
    /// key's limits let it through, else settled to `used`, what it took
    /// (`None`: unknown, and the reservation stands; docs/access.md, rule 9).
    pub(crate) fn finished(&mut self, admitted: bool, used: Option<u64>) {
        match (admitted, used) {
            (false, _) => self.refund(),
            (true, Some(n)) => self.settle(n),
            (true, None) => {}
        }
    }

    /// The tokens reserved for it, when its key limits tokens: the most it
    /// may take, a stream ended once it has (docs/access.md, rule 10).
    pub(crate) fn token_bound(&self) -> Option<u64> {
        self.tenant.configured_limits().limits_tokens().then_some(self.reserved)
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if self.concurrent {
            self.tenant.concurrent.fetch_sub(1, Ordering::Relaxed);
        }
        if let Some(store) = &self.shared {
            let delta = self.used.map_or(0, |used| used as i64 - self.reserved as i64);
            store.settle(&self.tenant.name, self.second, delta, self.refunded, self.concurrent, self.quota_at);
            return;
        }
        if let Some(used) = self.used {
            let at = Instant::now();
            let now = self.tenant.second(at);
            let delta = used as f64 - self.reserved as f64;
            if let Ok(mut u) = self.tenant.inner.lock() {
                u.tokens.adjust(self.second, now, delta);
                if self.refunded {
                    u.requests.adjust(self.second, now, -1.0);
                }
                if let Some(taken) = self.quota_at {
                    let unix = self.tenant.unix(at);
                    u.calendar.settle(taken, unix, delta, self.refunded);
                    let limits = self.tenant.limits().quotas;
                    if let Some(s) = self.tenant.series() {
                        s.quotas(&u.calendar.standing(unix, limits));
                    }
                }
            }
        }
    }
}
