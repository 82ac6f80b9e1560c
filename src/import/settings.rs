//! LiteLLM's config file as read (`include:` files merged, `os.environ/`
//! references kept as references), and the slogate config written from
//! it: the server, the limit store, the admin token, and the pools.

use std::path::Path;

use serde_json::{json, Map, Value};

use super::Report;

/// LiteLLM's config, its includes merged.
pub(super) struct Source {
    pub(super) model_list: Vec<Value>,
    pub(super) router_settings: Map<String, Value>,
    pub(super) general_settings: Map<String, Value>,
    pub(super) litellm_settings: Map<String, Value>,
    pub(super) master_key: Option<Secret>,
}

/// A secret as the config gives it: an environment variable's name, or the
/// value itself (never written out: hashed, or asked for in an environment
/// variable the report names).
pub(super) enum Secret {
    Env(String),
    Literal(String),
}

impl Secret {
    pub(super) fn of(v: &Value) -> Option<Secret> {
        let s = v.as_str()?.trim();
        match env_ref(s) {
            Some(name) => Some(Secret::Env(name.to_string())),
            None if s.is_empty() => None,
            None => Some(Secret::Literal(s.to_string())),
        }
    }
}

/// `NAME` of LiteLLM's `os.environ/NAME`.
pub(super) fn env_ref(s: &str) -> Option<&str> {
    s.trim().strip_prefix("os.environ/").filter(|n| !n.is_empty())
}

/// A value that may be `os.environ/NAME`: the variable's value (`None` when unset).
pub(super) fn resolved(v: &Value) -> Option<Value> {
    match v.as_str().and_then(env_ref) {
        Some(name) => std::env::var(name).ok().map(Value::from),
        None => Some(v.clone()),
    }
}

/// Read `path` and its `include:` files (relative to it), as LiteLLM merges them.
pub(super) fn read(path: &Path, report: &mut Report) -> Result<Source, String> {
    let mut top = load(path)?;
    let includes = top.remove("include");
    let base = path.parent().unwrap_or(Path::new("."));
    let mut model_list = take_list(&mut top, "model_list");
    for inc in includes.as_ref().and_then(Value::as_array).into_iter().flatten() {
        let Some(rel) = inc.as_str() else { continue };
        let mut part = load(&base.join(rel))?;
        model_list.extend(take_list(&mut part, "model_list"));
        for (k, v) in part {
            top.entry(k).or_insert(v);
        }
    }
    let mut section = |name: &str| match top.remove(name) {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let (router_settings, mut general_settings, litellm_settings) =
        (section("router_settings"), section("general_settings"), section("litellm_settings"));
    if let Some(env) = top.remove("environment_variables") {
        let names: Vec<&String> = env.as_object().map(|m| m.keys().collect()).unwrap_or_default();
        let names: Vec<&str> = names.iter().map(|s| s.as_str()).collect();
        report.skip(
            "environment_variables",
            format!("slogate does not set environment variables: set {} in its environment", names.join(", ")),
        );
    }
    for k in top.keys() {
        report.skip(k.clone(), "no slogate equivalent");
    }
    let master_key = general_settings.remove("master_key").as_ref().and_then(Secret::of);
    Ok(Source { model_list, router_settings, general_settings, litellm_settings, master_key })
}

fn load(path: &Path) -> Result<Map<String, Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    match serde_norway::from_str::<Value>(&text) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(Value::Null) => Ok(Map::new()),
        Ok(_) => Err(format!("{}: not a LiteLLM config (a mapping)", path.display())),
        Err(e) => Err(format!("{}: not valid YAML: {e}", path.display())),
    }
}

fn take_list(m: &mut Map<String, Value>, key: &str) -> Vec<Value> {
    match m.remove(key) {
        Some(Value::Array(a)) => a,
        _ => Vec::new(),
    }
}

/// The master key as an inference key of slogate's (LiteLLM's master key
/// may call every model): its hash, or the variable holding it.
pub(super) fn master_key_entry(master: &Secret) -> Value {
    let mut k = json!({"name": "litellm-master-key", "classes": super::all_classes()});
    match master {
        Secret::Env(name) => k["key_env"] = json!(name),
        Secret::Literal(key) => k["key_sha256"] = json!(crate::config::key_sha256(key)),
    }
    k
}

/// The config: the server (its addresses, the admin token), the limit
/// store, `pools`, and the keys file beside it.
pub(super) fn config(source: &Source, pools: Vec<Value>, (listen, admin): (&str, Option<&str>), report: &mut Report) -> Value {
    let mut server = json!({"listen": listen});
    if let Some(a) = admin {
        server["admin_listen"] = json!(a);
    }
    match &source.master_key {
        Some(Secret::Env(name)) => server["admin_token_env"] = json!(name),
        Some(Secret::Literal(_)) => {
            server["admin_token_env"] = json!("LITELLM_MASTER_KEY");
            report.note(
                "general_settings.master_key",
                "written in the config as a literal: set LITELLM_MASTER_KEY to it for the admin listener (its hash is the key `litellm-master-key`)",
            );
        }
        None => {}
    }
    let mut config = json!({"server": server, "pools": pools, "auth": {"keys_file": "keys.yaml"}});
    if let Some(limits) = limit_store(&source.router_settings, report) {
        config["limits"] = limits;
    }
    router_settings(&source.router_settings, report);
    general_settings(&source.general_settings, report);
    litellm_settings(&source.litellm_settings, report);
    config
}

/// `redis_host`/`redis_port`/`redis_password` (or `redis_url`) as the limit store.
fn limit_store(rs: &Map<String, Value>, report: &mut Report) -> Option<Value> {
    let url = match (rs.get("redis_url").and_then(resolved), rs.get("redis_host").and_then(resolved)) {
        (Some(Value::String(u)), _) => u,
        (_, Some(Value::String(host))) => {
            let port =
                rs.get("redis_port").and_then(resolved).map_or("6379".to_string(), |p| p.as_str().map_or(p.to_string(), str::to_string));
            format!("redis://{host}:{port}")
        }
        _ => return None,
    };
    let mut limits = json!({"redis": url});
    match rs.get("redis_password").and_then(Secret::of) {
        Some(Secret::Env(name)) => limits["password_env"] = json!(name),
        Some(Secret::Literal(_)) => {
            limits["password_env"] = json!("SLOGATE_REDIS_PASSWORD");
            report.note("router_settings.redis_password", "a literal: set SLOGATE_REDIS_PASSWORD to it (not written out)");
        }
        None => {}
    }
    Some(limits)
}

fn router_settings(rs: &Map<String, Value>, report: &mut Report) {
    for (k, v) in rs {
        let why = match k.as_str() {
            "redis_host" | "redis_port" | "redis_password" | "redis_url" => continue,
            "timeout" | "num_retries" => continue, // mapped per pool (model_list)
            "routing_strategy" => format!("slogate picks replicas by their load and prefix cache, not `{}`", v.as_str().unwrap_or("?")),
            "fallbacks" | "context_window_fallbacks" | "content_policy_fallbacks" => {
                "no fallbacks to other model groups: slogate answers 429 with Retry-After when a pool is full, and reduces context past a model's window".into()
            }
            "model_group_alias" => "no model aliases: name the pool's models in its `models`".into(),
            _ => "no slogate equivalent".into(),
        };
        report.skip(format!("router_settings.{k}"), why);
    }
}

fn general_settings(gs: &Map<String, Value>, report: &mut Report) {
    for k in gs.keys() {
        let why = match k.as_str() {
            "database_url" => "keys are imported into keys.yaml (slogate keeps no database)",
            "max_parallel_requests" | "global_max_parallel_requests" => "slogate learns each replica's limit and queues above it",
            _ => "no slogate equivalent",
        };
        report.skip(format!("general_settings.{k}"), why);
    }
}

fn litellm_settings(ls: &Map<String, Value>, report: &mut Report) {
    for k in ls.keys() {
        let why = match k.as_str() {
            "request_timeout" | "num_retries" => continue, // mapped per pool (model_list)
            "cache" | "cache_params" => "no response cache (replicas' prefix caches are used by routing)",
            "success_callback" | "failure_callback" | "callbacks" => "no callbacks: slogate's metrics, access log and OpenTelemetry traces",
            "drop_params" => "requests go on as sent (vLLM takes OpenAI's parameters)",
            "guardrails" => "no guardrails",
            _ => "no slogate equivalent",
        };
        report.skip(format!("litellm_settings.{k}"), why);
    }
}
