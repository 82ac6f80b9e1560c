//! How a pool's replicas are reached: their URLs, TLS and key, checked
//! before anything of a pool is built, and the names clients are shown.

use http::HeaderValue;

use super::{tls, PoolError};
use crate::config::PoolConfig;

/// How a pool's replicas are reached, checked before anything is built:
/// their URLs, TLS (files read, names checked) and API key (read from its
/// environment variable).
pub(crate) struct Access {
    pub(super) bases: Vec<http::Uri>,
    pub(super) tls: Vec<Option<tls::ReplicaTls>>,
    pub(super) api_key: Option<http::HeaderValue>,
    /// Exact prefix routing's tokenizer and event endpoints (`prefix.kv_events`).
    pub(super) exact: Option<super::kv_events::Setup>,
}

impl Access {
    pub(crate) fn new(config: &PoolConfig) -> Result<Access, PoolError> {
        let bases = config
            .replicas
            .iter()
            .enumerate()
            .map(|(replica, u)| crate::config::parse_replica_url(&u.url).map_err(|message| PoolError::ReplicaUrl { replica, message }))
            .collect::<Result<Vec<_>, _>>()?;
        let client_tls = tls::client_config(config)?;
        let server_name = config.tls.as_ref().and_then(|t| t.server_name.as_deref());
        let tls = bases.iter().map(|b| tls::for_replica(b, client_tls.as_ref(), server_name)).collect::<Result<Vec<_>, _>>()?;
        let api_key = match &config.api_key_env {
            None => None,
            Some(var) => {
                let key = std::env::var(var).ok().filter(|k| !k.is_empty());
                let mut value = key
                    .and_then(|k| http::HeaderValue::from_str(&format!("Bearer {k}")).ok())
                    .ok_or_else(|| PoolError::ApiKey { var: var.clone() })?;
                value.set_sensitive(true);
                Some(value)
            }
        };
        let exact = match &config.prefix.kv_events {
            None => None,
            Some(k) => Some(super::kv_events::Setup::load(k, &config.replicas, &bases).map_err(PoolError::KvEvents)?),
        };
        Ok(Access { bases, tls, api_key, exact })
    }
}

/// What clients see of replica `i` of pool `pool`: its name, else
/// `<pool>-<i + 1>`.
pub(super) fn public_name(pool: &str, i: usize, name: Option<&str>) -> HeaderValue {
    let shown = match name {
        Some(n) => n.to_string(),
        None => format!("{pool}-{}", i + 1),
    };
    HeaderValue::from_str(&shown).unwrap_or_else(|_| HeaderValue::from(i + 1))
}
