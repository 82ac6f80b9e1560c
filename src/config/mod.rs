//! Configuration: parse `slogate.yaml`, check it, and say every problem with
//! the field it is in (`pools[0].replicas[1]: ...`), not only the first.
//!
//! Parsing goes section by section (and pool by pool, class by class) through
//! `serde_path_to_error`, so one bad field does not hide the others; semantic
//! checks then run over whatever parsed.

mod access;
mod auth;
pub(crate) mod pem;
mod pool;
mod types;
mod units;

use std::path::Path;

pub use auth::*;
pub use pool::*;
pub use types::*;
pub use units::*;

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

const SECTIONS: &[&str] = &[
    "server",
    "pools",
    "classes",
    "default_class",
    "tiers",
    "slo",
    "breaker",
    "context_reduction",
    "auth",
    "telemetry",
    "fleet",
    "limits",
];

impl Config {
    /// Read and check a config file (and its `auth.keys_file`, beside it
    /// when the path is relative).
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigError(vec![Problem { field: String::new(), message: format!("cannot read {}: {e}", path.display()) }]))?;
        Config::parse_in(&text, path.parent())
    }

    /// Parse and check config text (an `auth.keys_file` is read relative to
    /// the working directory).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_in(text, None)
    }

    /// Parse and check config text whose relative paths start at `dir`.
    fn parse_in(text: &str, dir: Option<&Path>) -> Result<Config, ConfigError> {
        let mut problems = Vec::new();
        let value: serde_norway::Value = match serde_norway::from_str(text) {
            Ok(v) => v,
            Err(e) => {
                return Err(ConfigError(vec![Problem { field: String::new(), message: format!("not valid YAML: {e}") }]));
            }
        };
        let mut cfg = Config::default();
        // Original indices of the pools that parsed, and classes that did not,
        // so later checks name the right field and do not repeat a problem.
        let mut seen = Parsed { pool_index: (0..cfg.pools.len()).collect(), pools_given: cfg.pools.len(), failed_classes: Vec::new() };
        let map = match value {
            serde_norway::Value::Null => serde_norway::Mapping::new(),
            serde_norway::Value::Mapping(m) => m,
            _ => {
                return Err(ConfigError(vec![Problem {
                    field: String::new(),
                    message: "the top level must be a mapping of sections".into(),
                }]));
            }
        };
        for (k, v) in map {
            let Some(key) = k.as_str() else {
                problems.push(Problem { field: format!("{k:?}"), message: "section names must be strings".into() });
                continue;
            };
            match key {
                "server" => section(key, v, &mut cfg.server, &mut problems),
                "default_class" => section(key, v, &mut cfg.default_class, &mut problems),
                "tiers" => section(key, v, &mut cfg.tiers, &mut problems),
                "slo" => section(key, v, &mut cfg.slo, &mut problems),
                "breaker" => section(key, v, &mut cfg.breaker, &mut problems),
                "context_reduction" => section(key, v, &mut cfg.context_reduction, &mut problems),
                "auth" => section(key, v, &mut cfg.auth, &mut problems),
                "telemetry" => section(key, v, &mut cfg.telemetry, &mut problems),
                "fleet" => section(key, v, &mut cfg.fleet, &mut problems),
                "limits" => section(key, v, &mut cfg.limits, &mut problems),
                "pools" => match v {
                    serde_norway::Value::Sequence(items) => {
                        seen.pool_index.clear();
                        seen.pools_given = items.len();
                        cfg.pools = items
                            .into_iter()
                            .enumerate()
                            .filter_map(|(i, item)| {
                                let p = parse_part(&format!("pools[{i}]"), item, &mut problems)?;
                                seen.pool_index.push(i);
                                Some(p)
                            })
                            .collect();
                    }
                    _ => problems.push(Problem { field: "pools".into(), message: "must be a list of pools".into() }),
                },
                "classes" => match v {
                    serde_norway::Value::Mapping(items) => {
                        cfg.classes = items
                            .into_iter()
                            .filter_map(|(name, item)| {
                                let name = name.as_str().map(str::to_owned).unwrap_or_else(|| format!("{name:?}"));
                                let parsed = parse_part(&format!("classes.{name}"), item, &mut problems);
                                if parsed.is_none() {
                                    seen.failed_classes.push(name.clone());
                                }
                                parsed.map(|c| (name, c))
                            })
                            .collect();
                    }
                    _ => problems.push(Problem { field: "classes".into(), message: "must be a mapping of class name to class".into() }),
                },
                other => problems
                    .push(Problem { field: other.into(), message: format!("unknown section, expected one of: {}", SECTIONS.join(", ")) }),
            }
        }
        if let Some(file) = cfg.auth.keys_file.clone() {
            let path = match dir {
                Some(d) if file.is_relative() => d.join(&file),
                _ => file,
            };
            if let Some(keys) = read_keys_file(&path, &mut problems) {
                cfg.auth.from_file = keys.len();
                cfg.auth.keys.extend(keys);
            }
        }
        cfg.validate(&seen, &mut problems);
        if problems.is_empty() {
            Ok(cfg)
        } else {
            Err(ConfigError(problems))
        }
    }

    /// The class with the given name.
    pub fn class(&self, name: &str) -> Option<&ClassConfig> {
        self.classes.get(name)
    }

    fn validate(&self, seen: &Parsed, p: &mut Vec<Problem>) {
        let class_known = |c: &str| self.classes.contains_key(c) || seen.failed_classes.iter().any(|f| f == c);
        let mut bad = |field: String, message: String| p.push(Problem { field, message });
        if self.server.listen == self.server.admin_listen && self.server.listen.port() != 0 {
            bad("server.admin_listen".into(), "must differ from server.listen".into());
        }
        if let Some(tls) = &self.server.tls {
            if let Err(e) = pem::certs(&tls.cert) {
                bad("server.tls.cert".into(), e);
            }
            if let Err(e) = pem::key(&tls.key) {
                bad("server.tls.key".into(), e);
            }
        }
        for (name, d) in [
            ("server.send_timeout", self.server.send_timeout),
            ("server.header_read_timeout", self.server.header_read_timeout),
            ("server.body_read_timeout", self.server.body_read_timeout),
        ] {
            if d.get().is_zero() {
                bad(name.into(), "must be greater than 0".into());
            }
        }
        if self.server.queued_keepalive.is_some_and(|d| d.get() < std::time::Duration::from_secs(1)) {
            bad("server.queued_keepalive".into(), "must be at least 1s (a comment a second already keeps any proxy awake)".into());
        }
        if self.slo.history_step.get() < std::time::Duration::from_millis(100) {
            bad("slo.history_step".into(), "must be at least 100ms".into());
        }
        if let Some(problem) = self.server.admin_token_env.as_deref().and_then(env_problem) {
            bad("server.admin_token_env".into(), problem);
        }
        if self.server.http2_max_streams == 0 {
            bad("server.http2_max_streams".into(), "must be at least 1".into());
        }
        if !(1..=65535).contains(&self.server.listen_backlog) {
            bad("server.listen_backlog".into(), "must be between 1 and 65535".into());
        }
        if self.server.max_connections == 0 {
            bad("server.max_connections".into(), "must be at least 1".into());
        }
        if self.server.max_request_body.0 == 0 {
            bad("server.max_request_body".into(), "must be greater than 0".into());
        }
        let fl = &self.fleet;
        for (i, peer) in fl.peers.iter().enumerate() {
            if let Err(e) = parse_peer_url(peer) {
                bad(format!("fleet.peers[{i}]"), e);
            }
        }
        if let Some(name) = &fl.peers_dns {
            if let Err(e) = parse_host_port(name) {
                bad("fleet.peers_dns".into(), e);
            }
        }
        if fl.period.get().is_zero() {
            bad("fleet.period".into(), "must be greater than 0".into());
        } else if fl.peer_timeout.get() < fl.period.get() * 2 {
            bad("fleet.peer_timeout".into(), "must be at least twice fleet.period (one slow answer is not a lost peer)".into());
        }
        if fl.takeover_after.get() < fl.peer_timeout.get() {
            bad("fleet.takeover_after".into(), "must be at least fleet.peer_timeout".into());
        }
        let li = &self.limits;
        if let Some(url) = &li.redis {
            if let Err(e) = check_redis_url(url) {
                bad("limits.redis".into(), e);
            }
        }
        if let Some(problem) = li.password_env.as_deref().and_then(env_problem) {
            bad("limits.password_env".into(), problem);
        }
        if li.timeout.get().is_zero() {
            bad("limits.timeout".into(), "must be greater than 0".into());
        }
        if li.key_prefix.is_empty() || li.key_prefix.contains(char::is_whitespace) {
            bad("limits.key_prefix".into(), "must be a non-empty word without spaces".into());
        }
        if self.classes.is_empty() && seen.failed_classes.is_empty() {
            bad("classes".into(), "at least one class is required".into());
        }
        for (name, c) in &self.classes {
            if name.is_empty() || !name.chars().all(|ch| ch.is_ascii_alphanumeric() || ch == '-' || ch == '_') {
                bad(format!("classes.{name}"), "class names use letters, digits, - and _ only".into());
            }
            if c.ttft.get().is_zero() {
                bad(format!("classes.{name}.ttft"), "must be greater than 0".into());
            }
            if c.itl.get().is_zero() {
                bad(format!("classes.{name}.itl"), "must be greater than 0".into());
            }
        }
        if !class_known(&self.default_class) {
            bad("default_class".into(), format!("`{}` is not one of the classes", self.default_class));
        }
        for (tier, t) in [("interactive", &self.tiers.interactive), ("batch", &self.tiers.batch)] {
            if t.queue_capacity == 0 {
                bad(format!("tiers.{tier}.queue_capacity"), "must be at least 1".into());
            }
            if t.queue_timeout.get().is_zero() {
                bad(format!("tiers.{tier}.queue_timeout"), "must be greater than 0".into());
            }
            if tier == "batch" && t.shed_late {
                bad(
                    "tiers.batch.shed_late".into(),
                    "interactive only (batch requests that cannot be served before their queue timeout are refused early already)".into(),
                );
            }
            if !(0.0..1.0).contains(&t.reserved_share) {
                bad(format!("tiers.{tier}.reserved_share"), "must be at least 0 and below 1".into());
            }
            if t.queue_max_bytes.0 < self.server.max_request_body.0 {
                bad(
                    format!("tiers.{tier}.queue_max_bytes"),
                    format!(
                        "must be at least server.max_request_body ({} bytes): a body the server takes must be able to wait",
                        self.server.max_request_body.0
                    ),
                );
            }
        }
        if self.tiers.batch.reserved_share != 0.0 {
            bad("tiers.batch.reserved_share".into(), "only the interactive tier reserves slots".into());
        }
        for (name, v) in
            [("slo.latency_objective", self.slo.latency_objective), ("slo.availability_objective", self.slo.availability_objective)]
        {
            if !(v > 0.0 && v < 1.0) {
                bad(name.into(), "must be between 0 and 1, e.g. 0.99".into());
            }
        }
        if self.slo.window.get().is_zero() {
            bad("slo.window".into(), "must be greater than 0".into());
        }
        for (i, a) in self.slo.burn_alerts.iter().enumerate() {
            if a.short >= a.long {
                bad(format!("slo.burn_alerts[{i}].short"), format!("must be shorter than long ({})", a.long));
            }
            if a.long > self.slo.window {
                bad(format!("slo.burn_alerts[{i}].long"), "must not exceed slo.window".into());
            }
            if a.short.get().is_zero() {
                bad(format!("slo.burn_alerts[{i}].short"), "must be greater than 0".into());
            }
            if !(a.factor.is_finite() && a.factor > 0.0) {
                bad(format!("slo.burn_alerts[{i}].factor"), "must be greater than 0".into());
            }
        }
        let b = &self.breaker;
        if !(b.trip_ratio.is_finite() && b.trip_ratio >= 1.0) {
            bad("breaker.trip_ratio".into(), "must be at least 1.0".into());
        }
        for (name, d) in [("breaker.trip_after", b.trip_after), ("breaker.window", b.window), ("breaker.retry_after", b.retry_after)] {
            if d.get().is_zero() {
                bad(name.into(), "must be greater than 0".into());
            }
        }
        if b.min_samples == 0 {
            bad("breaker.min_samples".into(), "must be at least 1".into());
        }
        let r = &self.context_reduction;
        if !(r.trigger_ratio.is_finite() && r.trigger_ratio >= 1.0) {
            bad("context_reduction.trigger_ratio".into(), "must be at least 1.0".into());
        }
        for (name, v) in
            [("max_tokens_cap", r.max_tokens_cap), ("max_documents", r.max_documents), ("max_prompt_tokens", r.max_prompt_tokens)]
        {
            if v == 0 {
                bad(format!("context_reduction.{name}"), "must be at least 1".into());
            }
        }
        if self.auth.default_max_tokens == 0 {
            bad("auth.default_max_tokens".into(), "must be at least 1".into());
        }
        if let Some(ep) = &self.telemetry.otlp_endpoint {
            if parse_replica_url(ep).is_err() || !ep.starts_with("http://") {
                bad(
                    "telemetry.otlp_endpoint".into(),
                    "must be an http://host:port URL (OTLP over HTTP, e.g. http://127.0.0.1:4318; for TLS, run a collector beside slogate)"
                        .into(),
                );
            }
        }
        pool::validate(self, seen, p);
        access::validate(self, &seen.pool_index, &class_known, p);
        runbook(self, p);
    }
}

/// What is wrong with the replicas' key in environment variable `var`, if
/// anything: unset, empty, or not something an `Authorization` header can carry.
fn env_problem(var: &str) -> Option<String> {
    match std::env::var(var) {
        Err(_) => Some(format!("environment variable {var} is not set")),
        Ok(v) if v.is_empty() => Some(format!("environment variable {var} is empty")),
        Ok(v) if http::HeaderValue::from_str(&format!("Bearer {v}")).is_err() => {
            Some(format!("environment variable {var} holds characters a header cannot carry"))
        }
        Ok(_) => None,
    }
}

fn runbook(cfg: &Config, p: &mut Vec<Problem>) {
    if let Some(u) = &cfg.slo.runbook_url {
        if !(u.starts_with("https://") || u.starts_with("http://")) || u.contains(char::is_whitespace) {
            p.push(Problem {
                field: "slo.runbook_url".into(),
                message: format!("`{u}` must be an http(s) URL, e.g. https://wiki.example.com/slogate/runbook"),
            });
        }
    }
}

struct Parsed {
    pool_index: Vec<usize>,
    pools_given: usize,
    failed_classes: Vec<String>,
}

/// Check a replica base URL: `http://host:port` or `https://host:port`,
/// with an optional path prefix.
/// A replica's name: what clients see in a header, so short and plain.
/// A peer's admin listener: `http://host:port` (no path).
/// The `key_sha256` of an API key: what `auth.keys[].key_sha256` holds, and
/// what slogate compares a caller's key against.
pub fn key_sha256(key: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(key.trim().as_bytes()))
}

/// The keys of `auth.keys_file`: a YAML list of keys as in `auth.keys`.
/// Problems are named `auth.keys_file...`; `None` when the file is not usable at all.
fn read_keys_file(path: &Path, problems: &mut Vec<Problem>) -> Option<Vec<KeyConfig>> {
    let field = "auth.keys_file";
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) => {
            problems.push(Problem { field: field.into(), message: format!("cannot read {}: {e}", path.display()) });
            return None;
        }
    };
    let items = match serde_norway::from_str::<serde_norway::Value>(&text) {
        Ok(serde_norway::Value::Sequence(items)) => items,
        Ok(serde_norway::Value::Null) => Vec::new(),
        Ok(_) => {
            problems
                .push(Problem { field: field.into(), message: format!("{}: must be a list of keys, as under auth.keys", path.display()) });
            return None;
        }
        Err(e) => {
            problems.push(Problem { field: field.into(), message: format!("{}: not valid YAML: {e}", path.display()) });
            return None;
        }
    };
    Some(items.into_iter().enumerate().filter_map(|(i, item)| parse_part(&format!("{field}[{i}]"), item, problems)).collect())
}

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

fn check_replica_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > 64 {
        return Err("must be 1 to 64 characters".into());
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b)) {
        return Err(format!("`{name}` may hold only letters, digits and - _ . :"));
    }
    Ok(())
}

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

fn section<T: serde::de::DeserializeOwned>(name: &str, v: serde_norway::Value, slot: &mut T, problems: &mut Vec<Problem>) {
    if let Some(parsed) = parse_part(name, v, problems) {
        *slot = parsed;
    }
}

fn parse_part<T: serde::de::DeserializeOwned>(prefix: &str, v: serde_norway::Value, problems: &mut Vec<Problem>) -> Option<T> {
    match serde_path_to_error::deserialize::<_, T>(v) {
        Ok(t) => Some(t),
        Err(e) => {
            let path = e.path().to_string();
            let field = if path == "." || path.is_empty() {
                prefix.to_string()
            } else if path.starts_with('[') {
                format!("{prefix}{path}")
            } else {
                format!("{prefix}.{path}")
            };
            problems.push(Problem { field, message: e.into_inner().to_string() });
            None
        }
    }
}

#[cfg(test)]
mod tests;
