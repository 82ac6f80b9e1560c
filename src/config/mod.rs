//! Configuration: parse `slogate.yaml`, check it, and say every problem with
//! the field it is in (`pools[0].replicas[1]: ...`), not only the first.
//!
//! Parsing goes section by section (and pool by pool, class by class) through
//! `serde_path_to_error`, so one bad field does not hide the others; semantic
//! checks then run over whatever parsed.

mod access;
mod auth;
mod checks;
pub(crate) mod pem;
mod pool;
mod pool_check;
mod types;
mod units;
mod validate;

use std::path::Path;

pub use auth::*;
pub use checks::{check_redis_url, parse_host_port, parse_peer_url, parse_replica_url, ConfigError, Problem};
use checks::{check_replica_name, env_problem, Parsed};
pub use pool::*;
pub use types::*;
pub use units::*;

const SECTIONS: &[&str] = &[
    "server",
    "pools",
    "classes",
    "default_class",
    "endpoint_classes",
    "tiers",
    "slo",
    "breaker",
    "context_reduction",
    "auth",
    "telemetry",
    "fleet",
    "limits",
    "epp",
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
                "endpoint_classes" => section(key, v, &mut cfg.endpoint_classes, &mut problems),
                "tiers" => section(key, v, &mut cfg.tiers, &mut problems),
                "slo" => section(key, v, &mut cfg.slo, &mut problems),
                "breaker" => section(key, v, &mut cfg.breaker, &mut problems),
                "context_reduction" => section(key, v, &mut cfg.context_reduction, &mut problems),
                "auth" => section(key, v, &mut cfg.auth, &mut problems),
                "telemetry" => section(key, v, &mut cfg.telemetry, &mut problems),
                "fleet" => section(key, v, &mut cfg.fleet, &mut problems),
                "limits" => section(key, v, &mut cfg.limits, &mut problems),
                "epp" => section(key, v, &mut cfg.epp, &mut problems),
                "pools" => parse_pools(v, &mut cfg, &mut seen, &mut problems),
                "classes" => parse_classes(v, &mut cfg, &mut seen, &mut problems),
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
        validate::server(self, p);
        validate::fleet(self, p);
        validate::limits(self, p);
        validate::classes(self, seen, p);
        validate::tiers(self, p);
        validate::slo(self, p);
        validate::breaker(self, p);
        validate::reduction(self, p);
        validate::telemetry(self, p);
        pool_check::validate(self, seen, p);
        access::validate(self, &seen.pool_index, &class_known, p);
        runbook(self, p);
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

/// The `pools` section: each pool that parses, with its index in the file.
fn parse_pools(v: serde_norway::Value, cfg: &mut Config, seen: &mut Parsed, problems: &mut Vec<Problem>) {
    let serde_norway::Value::Sequence(items) = v else {
        problems.push(Problem { field: "pools".into(), message: "must be a list of pools".into() });
        return;
    };
    seen.pool_index.clear();
    seen.pools_given = items.len();
    cfg.pools = items
        .into_iter()
        .enumerate()
        .filter_map(|(i, item)| {
            let p = parse_part(&format!("pools[{i}]"), item, problems)?;
            seen.pool_index.push(i);
            Some(p)
        })
        .collect();
}

/// The `classes` section: each class that parses; the names of those that
/// do not are noted, so a check naming one does not say it is unknown.
fn parse_classes(v: serde_norway::Value, cfg: &mut Config, seen: &mut Parsed, problems: &mut Vec<Problem>) {
    let serde_norway::Value::Mapping(items) = v else {
        problems.push(Problem { field: "classes".into(), message: "must be a mapping of class name to class".into() });
        return;
    };
    cfg.classes = items
        .into_iter()
        .filter_map(|(name, item)| {
            let name = name.as_str().map(str::to_owned).unwrap_or_else(|| format!("{name:?}"));
            let parsed = parse_part(&format!("classes.{name}"), item, problems);
            if parsed.is_none() {
                seen.failed_classes.push(name.clone());
            }
            parsed.map(|c| (name, c))
        })
        .collect();
}

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
