//! Checks of who may do what: the API keys (their classes, weights, limits,
//! models and endpoints), the paths opened beyond the inference endpoints
//! (`pools[].extra_paths`), and the access log.

use super::{Config, Endpoint, Problem};

/// Every problem of the keys, the extra paths and the access log.
/// `pool_index`: each parsed pool's position in the file.
pub(super) fn validate(cfg: &Config, pool_index: &[usize], class_known: &dyn Fn(&str) -> bool, p: &mut Vec<Problem>) {
    keys(cfg, class_known, p);
    extra_paths(cfg, pool_index, p);
    access_log(cfg, p);
}

fn keys(cfg: &Config, class_known: &dyn Fn(&str) -> bool, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    let mut key_names = std::collections::HashSet::new();
    for (i, k) in cfg.auth.keys.iter().enumerate() {
        let at = cfg.auth.key_field(i);
        let f = |s: &str| format!("{at}.{s}");
        if k.name.is_empty() {
            bad(f("name"), "must not be empty".into());
        } else if !key_names.insert(k.name.as_str()) {
            bad(f("name"), format!("key name `{}` is used twice", k.name));
        }
        if !(k.weight.is_finite() && k.weight > 0.0) {
            bad(f("weight"), format!("must be a number above 0, not {}", k.weight));
        }
        if let Some(l) = &k.limits {
            for (name, v) in [
                ("requests_per_minute", l.requests_per_minute),
                ("tokens_per_minute", l.tokens_per_minute),
                ("max_concurrent", l.max_concurrent),
                ("requests_per_day", l.requests_per_day),
                ("tokens_per_day", l.tokens_per_day),
                ("requests_per_month", l.requests_per_month),
                ("tokens_per_month", l.tokens_per_month),
            ] {
                if v == Some(0) {
                    bad(f(&format!("limits.{name}")), "must be at least 1 (leave it out for no limit)".into());
                }
            }
        }
        match (&k.key_env, &k.key_sha256) {
            (Some(_), Some(_)) | (None, None) => bad(at.clone(), "give exactly one of key_env and key_sha256".into()),
            (Some(env), None) => {
                if std::env::var(env).map(|v| v.trim().is_empty()).unwrap_or(true) {
                    bad(f("key_env"), format!("environment variable {env} is not set"));
                }
            }
            (None, Some(h)) => {
                if h.len() != 64 || !h.chars().all(|c| c.is_ascii_hexdigit()) {
                    bad(f("key_sha256"), "must be 64 hex digits (the SHA-256 of the key)".into());
                }
            }
        }
        if k.classes.is_empty() {
            bad(f("classes"), "list at least one class".into());
        }
        for (j, c) in k.classes.iter().enumerate() {
            if !class_known(c) {
                bad(f(&format!("classes[{j}]")), format!("`{c}` is not one of the classes"));
            }
        }
        if let Some(models) = &k.models {
            if models.is_empty() {
                bad(f("models"), "list at least one model or pattern (leave it out for every model)".into());
            }
            for (j, m) in models.iter().enumerate() {
                if m.is_empty() {
                    bad(f(&format!("models[{j}]")), "must not be empty".into());
                }
            }
        }
        if k.endpoints.as_ref().is_some_and(|e| e.is_empty()) {
            bad(f("endpoints"), "list at least one endpoint kind (leave it out for every kind)".into());
        }
    }
}

/// The names a path may be opened for: the keys, or `anonymous` without keys.
fn extra_paths(cfg: &Config, pool_index: &[usize], p: &mut Vec<Problem>) {
    let known = |name: &str| {
        if cfg.auth.keys.is_empty() {
            name == "anonymous"
        } else {
            cfg.auth.keys.iter().any(|k| k.name == name)
        }
    };
    for (pool, &i) in cfg.pools.iter().zip(pool_index) {
        let mut seen = std::collections::HashSet::new();
        for (j, e) in pool.extra_paths.iter().enumerate() {
            let f = |s: &str| format!("pools[{i}].extra_paths[{j}].{s}");
            if !e.path.starts_with('/') || e.path.contains(['?', '#', ' ']) || e.path.contains("/../") || e.path.ends_with("/..") {
                p.push(Problem {
                    field: f("path"),
                    message: format!("`{}` must be a plain absolute path, e.g. /v1/load_lora_adapter", e.path),
                });
            } else if Endpoint::of_path(&e.path).is_some() || e.path == "/v1/models" {
                p.push(Problem { field: f("path"), message: format!("`{}` is an inference endpoint, open to every key already", e.path) });
            } else if !seen.insert(e.path.as_str()) {
                p.push(Problem { field: f("path"), message: format!("`{}` is opened twice on this pool", e.path) });
            }
            if e.keys.is_empty() {
                p.push(Problem { field: f("keys"), message: "name at least one key that may call it".into() });
            }
            for (k, name) in e.keys.iter().enumerate() {
                if !known(name) {
                    let what = if cfg.auth.keys.is_empty() {
                        "without auth.keys the only caller is `anonymous`"
                    } else {
                        "not a key of auth.keys"
                    };
                    p.push(Problem { field: f(&format!("keys[{k}]")), message: format!("`{name}`: {what}") });
                }
            }
        }
    }
}

fn access_log(cfg: &Config, p: &mut Vec<Problem>) {
    let Some(a) = &cfg.telemetry.access_log else { return };
    if a.to.trim().is_empty() {
        p.push(Problem { field: "telemetry.access_log.to".into(), message: "must be stderr, stdout or a file path".into() });
    }
    if a.buffer == 0 {
        p.push(Problem { field: "telemetry.access_log.buffer".into(), message: "must be at least 1".into() });
    }
}

impl super::Config {
    /// What `slogate check` warns of, though the file is valid: a key read
    /// from the environment with spaces or a line break around it (slogate
    /// trims it, as it trims a caller's bearer token, so the key is the
    /// trimmed value: a client sending it as written would not match).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        for (i, k) in self.auth.keys.iter().enumerate() {
            let Some(env) = &k.key_env else { continue };
            if std::env::var(env).is_ok_and(|v| v.trim() != v) {
                out.push(format!(
                    "auth.keys[{i}].key_env: the value of {env} has spaces or a line break around it; the key is the value trimmed"
                ));
            }
        }
        out
    }
}
