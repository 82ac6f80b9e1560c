//! Configuration: parse `slogate.yaml`, check it, and say every problem with
//! the field it is in (`pools[0].replicas[1]: ...`), not only the first.
//!
//! Parsing goes section by section (and pool by pool, class by class) through
//! `serde_path_to_error`, so one bad field does not hide the others; semantic
//! checks then run over whatever parsed.

mod access;
pub(crate) mod pem;
mod types;

use std::collections::HashMap;
use std::path::Path;

pub use types::*;

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
        if self.pools.is_empty() && seen.pool_index.len() == seen.pools_given {
            bad("pools".into(), "at least one pool is required".into());
        }
        let mut names = std::collections::HashSet::new();
        let mut models: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for (pool, &i) in self.pools.iter().zip(&seen.pool_index) {
            let f = |s: &str| format!("pools[{i}].{s}");
            if pool.name.is_empty() {
                bad(f("name"), "must not be empty".into());
            } else if !names.insert(pool.name.as_str()) {
                bad(f("name"), format!("pool name `{}` is used twice", pool.name));
            }
            if pool.models.is_empty() {
                bad(f("models"), "list at least one model, or [auto]".into());
            }
            for (j, m) in pool.models.iter().enumerate() {
                if m.is_empty() {
                    bad(format!("pools[{i}].models[{j}]"), "must not be empty".into());
                } else if m != "auto" {
                    if let Some(other) = models.insert(m.as_str(), i) {
                        bad(format!("pools[{i}].models[{j}]"), format!("model `{m}` is already served by pools[{other}]"));
                    }
                }
            }
            if pool.replicas.is_empty() {
                bad(f("replicas"), "at least one replica is required".into());
            }
            let mut names = HashMap::new();
            for (j, r) in pool.replicas.iter().enumerate() {
                if let Err(e) = parse_replica_url(&r.url) {
                    bad(format!("pools[{i}].replicas[{j}]"), e);
                }
                if let Some(name) = &r.name {
                    if let Err(e) = check_replica_name(name) {
                        bad(format!("pools[{i}].replicas[{j}].name"), e);
                    } else if let Some(other) = names.insert(name.as_str(), j) {
                        bad(format!("pools[{i}].replicas[{j}].name"), format!("`{name}` is already the name of replicas[{other}]"));
                    }
                }
            }
            let https = pool.replicas.iter().any(|r| r.url.trim_start().starts_with("https://"));
            if let Some(tls) = &pool.tls {
                if !https {
                    bad(f("tls"), "is set, but no replica URL starts with https://".into());
                }
                if let Some(ca) = &tls.ca {
                    if let Err(e) = pem::certs(ca) {
                        bad(f("tls.ca"), e);
                    }
                }
                match (&tls.cert, &tls.key) {
                    (Some(cert), Some(key)) => {
                        if let Err(e) = pem::certs(cert) {
                            bad(f("tls.cert"), e);
                        }
                        if let Err(e) = pem::key(key) {
                            bad(f("tls.key"), e);
                        }
                    }
                    (Some(_), None) => bad(f("tls.key"), "is required with tls.cert (the client certificate's private key)".into()),
                    (None, Some(_)) => bad(f("tls.cert"), "is required with tls.key (the client certificate)".into()),
                    (None, None) => {}
                }
                if let Some(name) = &tls.server_name {
                    if rustls_pki_types::ServerName::try_from(name.as_str()).is_err() {
                        bad(f("tls.server_name"), format!("`{name}` is not a DNS name or an IP address"));
                    }
                }
            }
            if let Some(problem) = pool.api_key_env.as_deref().and_then(env_problem) {
                bad(f("api_key_env"), problem);
            }
            if pool.max_event_bytes.0 < 1024 {
                bad(f("max_event_bytes"), "must be at least 1KiB (a chunk of vLLM's stream with usage is a few hundred bytes)".into());
            }
            match pool.max_inflight_per_replica {
                InflightLimit::Fixed(0) => bad(f("max_inflight_per_replica"), "must be at least 1, or auto".into()),
                InflightLimit::Auto if pool.scrape_metrics.get().is_zero() => bad(
                    f("scrape_metrics"),
                    "must be greater than 0 with max_inflight_per_replica: auto (the learned limit reads the replicas' queues)".into(),
                ),
                _ => {}
            }
            let l = &pool.learned_limit;
            if l.min == 0 || l.min > l.max || !(l.min..=l.max).contains(&l.initial) {
                bad(f("learned_limit"), "needs 1 <= min <= initial <= max".into());
            }
            if !pool.health.path.starts_with('/') {
                bad(f("health.path"), "must start with /".into());
            }
            for (name, d) in [("health.interval", pool.health.interval), ("health.timeout", pool.health.timeout)] {
                if d.get().is_zero() {
                    bad(f(name), "must be greater than 0".into());
                }
            }
            for (name, n) in [("health.unhealthy_after", pool.health.unhealthy_after), ("health.healthy_after", pool.health.healthy_after)]
            {
                if n == 0 {
                    bad(f(name), "must be at least 1".into());
                }
            }
            let t = &pool.timeouts;
            for (name, d) in [
                ("timeouts.connect", t.connect),
                ("timeouts.first_token", t.first_token),
                ("timeouts.idle", t.idle),
                ("timeouts.total", t.total),
            ] {
                if d.get().is_zero() {
                    bad(f(name), "must be greater than 0".into());
                }
            }
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
        access::validate(self, &seen.pool_index, &class_known, p);
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
mod tests {
    use super::*;

    #[test]
    fn empty_file_is_the_reference_default() {
        let c = Config::parse("").expect("defaults are valid");
        assert_eq!(c.pools[0].max_inflight_per_replica, InflightLimit::Auto);
        assert_eq!(c.classes["voice"].ttft, Dur::millis(150));
        assert_eq!(c.server.max_request_body, Size(4 * 1024 * 1024));
        assert_eq!(c.slo.window, Dur::secs(28 * 86_400));
        assert_eq!(c.default_class, "chat");
    }

    #[test]
    fn the_limit_store_is_checked() {
        let ok = Config::parse("limits:\n  redis: redis://127.0.0.1:6379/2\n  timeout: 20ms\n").expect("valid");
        assert_eq!(ok.limits.redis.as_deref(), Some("redis://127.0.0.1:6379/2"));
        assert_eq!(ok.limits.timeout, Dur::millis(20));
        assert_eq!(Config::parse("").expect("valid").limits, LimitsConfig::default(), "no store by default");
        let text =
            "limits:\n  redis: rediss://cache:6380\n  timeout: 0s\n  key_prefix: ''\n  password_env: SLOGATE_UNIT_TEST_NOBODY_SETS_THIS\n";
        let err = Config::parse(text).expect_err("four problems").0;
        let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["limits.redis", "limits.password_env", "limits.timeout", "limits.key_prefix"]);
        assert!(err[0].message.contains("TLS"), "{}", err[0].message);
        let err = Config::parse("limits: { redis: 'http://cache:6379' }\n").expect_err("not redis").0;
        assert!(err[0].message.contains("redis://"), "{}", err[0].message);
    }

    #[test]
    fn fleet_peers_and_times_are_checked() {
        let ok = Config::parse("fleet:\n  peers: [http://10.0.0.7:9091, 'http://[::1]:9091/']\n  peers_dns: slogate.ai.svc:9091\n")
            .expect("valid");
        assert!(ok.fleet.enabled());
        assert!(!Config::parse("").expect("valid").fleet.enabled(), "no fleet by default");
        let text = "fleet:\n  peers: [https://a:1, 'http://a', http://a:1/x]\n  peers_dns: nameonly\n  period: 100ms\n  peer_timeout: 150ms\n  takeover_after: 100ms\n";
        let err = Config::parse(text).expect_err("invalid").0;
        let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(
            fields,
            ["fleet.peers[0]", "fleet.peers[1]", "fleet.peers[2]", "fleet.peers_dns", "fleet.peer_timeout", "fleet.takeover_after"],
            "{err:?}"
        );
    }

    #[test]
    fn partial_section_keeps_the_other_defaults() {
        let c = Config::parse("pools:\n  - name: p\n    models: [m]\n    replicas: [http://127.0.0.1:1]\n    timeouts: { idle: 5s }\n")
            .expect("valid");
        assert_eq!(c.pools[0].timeouts.idle, Dur::secs(5));
        assert_eq!(c.pools[0].timeouts.first_token, Dur::secs(60));
        assert_eq!(c.pools[0].health.unhealthy_after, 2);
    }

    #[test]
    fn every_problem_is_reported_with_its_field() {
        let text = "server:\n  listen: nope\npools:\n  - name: a\n    models: [m]\n    replicas: [http://127.0.0.1:1]\n  - name: a\n    models: [m]\n    replicas: [http://127.0.0.1:2, 'not a url']\n    max_inflight_per_replica: 0\n  - name: c\n    models: [x]\n    replicas: [http://127.0.0.1:3]\n    balance: random\nclasses:\n  chat: { tier: interactive, ttft: 3 bananas, itl: 50ms }\nbogus: 1\n";
        let err = Config::parse(text).expect_err("invalid").0;
        let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
        for want in [
            "server.listen",
            "pools[2].balance",
            "pools[1].name",
            "pools[1].models[0]",
            "pools[1].replicas[1]",
            "pools[1].max_inflight_per_replica",
            "classes.chat.ttft",
            "bogus",
        ] {
            assert!(fields.contains(&want), "missing {want} in {fields:?}");
        }
    }

    #[test]
    fn server_limits_out_of_range_are_named() {
        let pool = "pools:\n  - name: p\n    models: [m]\n    replicas: [http://127.0.0.1:1]\n";
        for (server, field) in [
            ("listen_backlog: 0", "server.listen_backlog"),
            ("listen_backlog: 70000", "server.listen_backlog"),
            ("max_connections: 0", "server.max_connections"),
            ("http2_max_streams: 0", "server.http2_max_streams"),
        ] {
            let err = Config::parse(&format!("server: {{ {server} }}\n{pool}")).expect_err(server).0;
            assert_eq!(err.iter().map(|p| p.field.as_str()).collect::<Vec<_>>(), [field], "{server}");
        }
        let c = Config::parse(&format!("server: {{ listen_backlog: 128 }}\n{pool}")).expect("valid");
        assert_eq!((c.server.listen_backlog, Config::parse(pool).expect("valid").server.listen_backlog), (128, 4096));
    }

    #[test]
    fn unknown_fields_are_errors() {
        let err = Config::parse("breaker:\n  trip_ratoi: 3\n").expect_err("typo").0;
        assert_eq!(err.len(), 1);
        assert!(err[0].field.starts_with("breaker"), "{:?}", err[0]);
        assert!(err[0].message.contains("trip_ratoi"), "{:?}", err[0]);
    }

    #[test]
    fn replica_urls_are_checked() {
        let err =
            Config::parse("pools:\n  - name: a\n    models: [m]\n    replicas: [http://127.0.0.1:1, 'ftp://x']\n").expect_err("bad").0;
        assert_eq!(err[0].field, "pools[0].replicas[1]");
    }

    #[test]
    fn key_weights_and_limits_are_checked_and_keys_file_problems_are_named_there() {
        let h = "a".repeat(64);
        let err = Config::parse(&format!(
            "auth:\n  keys:\n    - {{ name: a, key_sha256: {h}, classes: [chat], weight: 0 }}\n    - {{ name: b, key_sha256: {h}, classes: [chat], limits: {{ tokens_per_minute: 0 }} }}\n"
        ))
        .expect_err("bad")
        .0;
        let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, vec!["auth.keys[0].weight", "auth.keys[1].limits.tokens_per_minute"], "{err:?}");
        let err = Config::parse(&format!("auth:\n  keys:\n    - {{ name: b, key_sha256: {h}, classes: [chat], limits: {{ rpm: 3 }} }}\n"))
            .expect_err("bad")
            .0;
        assert_eq!(err[0].field, "auth.keys[0].limits.rpm", "{err:?}");
        let dir = tempfile::tempdir().expect("dir");
        std::fs::write(
            dir.path().join("keys.yaml"),
            format!("- {{ name: f, key_sha256: {h}, classes: [nope] }}\n- {{ name: g, classes: [chat] }}\n"),
        )
        .expect("write");
        let cfg = dir.path().join("slogate.yaml");
        std::fs::write(&cfg, format!("auth:\n  keys_file: keys.yaml\n  keys:\n    - {{ name: a, key_sha256: {h}, classes: [chat] }}\n"))
            .expect("write");
        let err = Config::load(&cfg).expect_err("bad keys file").0;
        let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
        assert!(fields.contains(&"auth.keys_file[0].classes[0]"), "{err:?}");
        assert!(fields.contains(&"auth.keys_file[1]"), "{err:?}");
        std::fs::write(
            dir.path().join("keys.yaml"),
            format!("- {{ name: a, key_sha256: {h}, classes: [chat], limits: {{ max_concurrent: 2 }} }}\n"),
        )
        .expect("write");
        let err = Config::load(&cfg).expect_err("a name twice").0;
        assert_eq!(err[0].field, "auth.keys_file[0].name", "{err:?}");
        std::fs::write(dir.path().join("keys.yaml"), format!("- {{ name: f, key_sha256: {h}, classes: [chat], weight: 2.5 }}\n"))
            .expect("write");
        let ok = Config::load(&cfg).expect("valid");
        assert_eq!(ok.auth.keys.len(), 2);
        assert_eq!((ok.auth.keys[1].name.as_str(), ok.auth.keys[1].weight), ("f", 2.5));
        std::fs::remove_file(dir.path().join("keys.yaml")).expect("rm");
        let err = Config::load(&cfg).expect_err("missing file").0;
        assert_eq!(err[0].field, "auth.keys_file", "{err:?}");
    }

    #[test]
    fn a_tier_given_in_part_keeps_its_own_defaults() {
        let c = Config::parse("tiers:\n  batch: { queue_timeout: 5m }\n  interactive: { queue_max_bytes: 64MiB }\n").expect("valid");
        assert_eq!(c.tiers.batch.queue_capacity, 10_000, "batch's default, not interactive's");
        assert_eq!(c.tiers.batch.queue_max_bytes, Size(1 << 30));
        assert_eq!(c.tiers.batch.queue_timeout, Dur::secs(300));
        assert_eq!(c.tiers.interactive.queue_max_bytes, Size(64 << 20));
        assert_eq!(c.tiers.interactive.reserved_share, 0.25);
        let err = Config::parse("tiers:\n  interactive: { queue_max_bytes: 1MiB, queue_cap: 3 }\n").expect_err("unknown").0;
        assert!(err[0].field.starts_with("tiers"), "{err:?}");
        let err = Config::parse("tiers:\n  interactive: { queue_max_bytes: 1MiB }\n").expect_err("below the body limit").0;
        assert_eq!(err[0].field, "tiers.interactive.queue_max_bytes");
    }

    #[test]
    fn a_queued_keepalive_is_off_by_default_and_at_least_a_second() {
        assert_eq!(Config::default().server.queued_keepalive.map(Dur::get), None);
        let c = Config::parse("server:\n  queued_keepalive: 15s\n").expect("valid");
        assert_eq!(c.server.queued_keepalive.map(Dur::get), Some(std::time::Duration::from_secs(15)));
        let err = Config::parse("server:\n  queued_keepalive: 500ms\n").expect_err("too short").0;
        assert_eq!(err[0].field, "server.queued_keepalive");
        assert!(err[0].message.contains("at least 1s"), "{err:?}");
    }

    #[test]
    fn the_admin_token_variable_must_be_set() {
        let err = Config::parse("server:\n  admin_token_env: SLOGATE_UNIT_TEST_NOBODY_SETS_THIS\n").expect_err("unset").0;
        assert_eq!(err[0].field, "server.admin_token_env");
        assert!(err[0].message.contains("is not set"), "{err:?}");
    }

    #[test]
    fn replicas_are_urls_or_url_and_name() {
        let c = Config::parse(
            "pools:\n  - name: a\n    models: [m]\n    replicas: [http://10.0.0.1:8000, { url: http://10.0.0.2:8000, name: gpu-b }]\n",
        )
        .expect("valid");
        assert_eq!(c.pools[0].replicas[0], ReplicaConfig { url: "http://10.0.0.1:8000".into(), name: None });
        assert_eq!(c.pools[0].replicas[1], ReplicaConfig { url: "http://10.0.0.2:8000".into(), name: Some("gpu-b".into()) });
        // Written back as read.
        let again = Config::parse(&serde_norway::to_string(&c).expect("yaml")).expect("round trip");
        assert_eq!(again.pools[0].replicas, c.pools[0].replicas);

        let text = "pools:\n  - name: a\n    models: [m]\n    replicas:\n      - { url: http://10.0.0.1:8000, name: x }\n      - { url: http://10.0.0.2:8000, name: x }\n      - { url: http://10.0.0.3:8000, name: 'has space' }\n";
        let err = Config::parse(text).expect_err("bad").0;
        let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
        assert_eq!(fields, ["pools[0].replicas[1].name", "pools[0].replicas[2].name"], "{err:?}");
        assert!(err[0].message.contains("already the name of replicas[0]"), "{err:?}");
        for bad in ["{ name: x }", "{ url: http://10.0.0.1:8000, nmae: x }", "[1, 2]"] {
            let err = Config::parse(&format!("pools:\n  - name: a\n    models: [m]\n    replicas: [{bad}]\n")).expect_err(bad).0;
            assert!(err[0].field.starts_with("pools"), "{bad}: {err:?}");
        }
    }

    #[test]
    fn extra_paths_models_endpoints_quotas_and_the_access_log_are_checked() {
        let h = key_sha256("k");
        let text = format!(
            "pools:\n  - name: p\n    replicas: [http://127.0.0.1:1]\n    extra_paths:\n      - {{ path: /v1/load_lora_adapter, keys: [ops] }}\n      - {{ path: v1/x, keys: [] }}\n      - {{ path: /v1/chat/completions, keys: [nobody] }}\n      - {{ path: /v1/load_lora_adapter, keys: [ops] }}\nauth:\n  keys:\n    - {{ name: ops, key_sha256: {h}, classes: [chat], models: [], endpoints: [], limits: {{ tokens_per_day: 0 }} }}\ntelemetry:\n  access_log: {{ to: '', buffer: 0 }}\n"
        );
        let err = Config::parse(&text).expect_err("problems").0;
        let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
        for f in [
            "pools[0].extra_paths[1].path",
            "pools[0].extra_paths[1].keys",
            "pools[0].extra_paths[2].path",
            "pools[0].extra_paths[2].keys[0]",
            "pools[0].extra_paths[3].path",
            "auth.keys[0].models",
            "auth.keys[0].endpoints",
            "auth.keys[0].limits.tokens_per_day",
            "telemetry.access_log.to",
            "telemetry.access_log.buffer",
        ] {
            assert!(fields.contains(&f), "{f} not named: {err:?}");
        }
        let err = Config::parse("auth:\n  keys:\n    - { name: a, key_sha256: x, classes: [chat], endpoints: [chats] }\n")
            .expect_err("unknown kind")
            .0;
        assert!(err.iter().any(|p| p.field.starts_with("auth.keys[0].endpoints") && p.message.contains("chats")), "{err:?}");
        // Without keys, the one caller is `anonymous`.
        let ok = Config::parse(
            "pools:\n  - name: p\n    replicas: [http://127.0.0.1:1]\n    extra_paths: [{ path: /sleep, keys: [anonymous] }]\n",
        );
        assert!(ok.is_ok(), "{ok:?}");
    }

    #[test]
    fn auth_keys_need_exactly_one_source_and_known_classes() {
        let err =
            Config::parse("auth:\n  keys:\n    - { name: a, classes: [chat] }\n    - { name: b, key_sha256: abc, classes: [nope] }\n")
                .expect_err("bad")
                .0;
        let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
        assert!(fields.contains(&"auth.keys[0]"), "{fields:?}");
        assert!(fields.contains(&"auth.keys[1].key_sha256"), "{fields:?}");
        assert!(fields.contains(&"auth.keys[1].classes[0]"), "{fields:?}");
    }
}
