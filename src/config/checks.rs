//! What every section's checks share: a problem and the error of many,
//! what parsing found, and the checks of an address (a replica, a peer,
//! the limit store, a host and port) or an environment variable.

/// One problem in a config file: the dotted field path and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    pub field: String,
    pub message: String,
}

impl std::fmt::Display for Problem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.field.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.field, self.message)
        }
    }
}

/// Every problem found in a config, one per line when displayed.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", self.0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError(pub Vec<Problem>);

/// What parsing found of the sections the checks read: the pools given
/// and where each went, the classes that failed.
pub(super) struct Parsed {
    pub(super) pool_index: Vec<usize>,
    pub(super) pools_given: usize,
    pub(super) failed_classes: Vec<String>,
}

/// What is wrong with the replicas' key in environment variable `var`, if
/// anything: unset, empty, or not something an `Authorization` header can carry.
pub(super) fn env_problem(var: &str) -> Option<String> {
    match std::env::var(var) {
        Err(_) => Some(format!("environment variable {var} is not set")),
        Ok(v) if v.is_empty() => Some(format!("environment variable {var} is empty")),
        Ok(v) if http::HeaderValue::from_str(&format!("Bearer {v}")).is_err() => {
            Some(format!("environment variable {var} holds characters a header cannot carry"))
        }
        Ok(_) => None,
    }
}

/// A peer's admin listener: `http://host:port` (no path).
pub fn parse_peer_url(url: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = url.trim().trim_end_matches('/').parse().map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("`{url}`: must start with http:// (the admin listener speaks plain HTTP)"));
    }
    match uri.authority() {
        Some(a) if a.port_u16().is_some() => {}
        _ => return Err(format!("`{url}`: needs a host and the admin listener's port, e.g. http://10.0.0.7:9091")),
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/" && !p.as_str().is_empty()) {
        return Err(format!("`{url}`: give the listener only, without a path"));
    }
    Ok(uri)
}

/// The limit store's address: `redis://host:port[/db]` (or `valkey://`,
/// `redis+unix:///path`); TLS is not built in.
pub fn check_redis_url(url: &str) -> Result<(), String> {
    let scheme = url.split_once("://").map(|(s, _)| s).unwrap_or("");
    if matches!(scheme, "rediss" | "valkeys") {
        return Err(format!("`{url}`: TLS to the limit store is not supported; reach it over a private network or a local TLS tunnel"));
    }
    if !matches!(scheme, "redis" | "valkey" | "redis+unix" | "unix") {
        return Err(format!("`{url}`: must start with redis:// (or valkey://, redis+unix://), e.g. redis://10.0.0.9:6379/0"));
    }
    redis::Client::open(url).map(drop).map_err(|e| format!("`{url}`: {e}"))
}

/// `host:port` (a DNS name or an IP address, and a port).
pub fn parse_host_port(s: &str) -> Result<(String, u16), String> {
    let (host, port) =
        s.rsplit_once(':').ok_or_else(|| format!("`{s}`: must be host:port, e.g. slogate-peers.ai.svc.cluster.local:9091"))?;
    let port: u16 = port.parse().map_err(|_| format!("`{s}`: `{port}` is not a port"))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || port == 0 {
        return Err(format!("`{s}`: must be host:port with a port above 0"));
    }
    Ok((host.to_string(), port))
}

/// A replica's name: what clients see in a header, so short and plain.
pub(super) fn check_replica_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)) {
        return Err(format!("`{name}` may hold only letters, digits and - _ . :"));
    }
    Ok(())
}

/// Check a replica base URL: `http://host:port` or `https://host:port`,
/// with an optional path prefix.
pub fn parse_replica_url(s: &str) -> Result<http::Uri, String> {
    let uri: http::Uri = s.parse().map_err(|e| format!("`{s}` is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("`{s}` must start with http:// or https://")),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("`{s}` has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("`{s}` must not have a query"));
    }
    Ok(uri)
}
