//! LiteLLM's `model_list` as pools: the deployments of one `model_name`
//! are one pool, each `hosted_vllm/` or `openai/` deployment a replica.

use std::collections::HashMap;

use serde_json::{json, Map, Value};

use super::settings::{resolved, Secret, Source};
use super::Report;

/// The pools, the model names clients use, and each model's prices
/// (dollars per input and output token, from `model_info`).
pub(super) struct Pools {
    pub(super) pools: Vec<Value>,
    pub(super) names: Vec<String>,
    pub(super) prices: HashMap<String, (f64, f64)>,
}

/// The providers whose deployments are OpenAI-compatible servers slogate
/// can stand in front of.
const PROVIDERS: [&str; 2] = ["hosted_vllm/", "openai/"];

/// What `litellm_params` may hold that is mapped (the rest is reported).
const MAPPED: [&str; 8] =
    ["model", "api_base", "api_key", "max_parallel_requests", "timeout", "stream_timeout", "max_retries", "num_retries"];

/// One pool being built.
struct Group {
    name: String,
    served: Option<String>,
    replicas: Vec<String>,
    api_key: Option<Value>,
    limit: Option<u64>,
    timeouts: Map<String, Value>,
}

pub(super) fn pools(source: &Source, report: &mut Report) -> Result<Pools, String> {
    let mut groups: Vec<Group> = Vec::new();
    let mut prices = HashMap::new();
    let total = source.router_settings.get("timeout").or_else(|| source.litellm_settings.get("request_timeout")).and_then(seconds);
    let retries = ["router_settings.num_retries", "litellm_settings.num_retries"];
    for (field, v) in retries.iter().zip([source.router_settings.get("num_retries"), source.litellm_settings.get("num_retries")]) {
        if v.is_some() {
            report.note(*field, RETRIES);
        }
    }
    for (i, entry) in source.model_list.iter().enumerate() {
        let at = format!("model_list[{i}]");
        let Some(name) = entry.get("model_name").and_then(Value::as_str) else {
            report.skip(at, "no model_name");
            continue;
        };
        let params = entry.get("litellm_params").and_then(Value::as_object).cloned().unwrap_or_default();
        let Some(deployment) = deployment(&params, &at, report) else { continue };
        if let Some(info) = entry.get("model_info").and_then(Value::as_object) {
            let price = |k: &str| info.get(k).and_then(Value::as_f64).unwrap_or(0.0);
            let (input, output) = (price("input_cost_per_token"), price("output_cost_per_token"));
            if input > 0.0 || output > 0.0 {
                prices.insert(name.to_string(), (input, output));
            }
        }
        let g = match groups.iter_mut().position(|g| g.name == name) {
            Some(p) => &mut groups[p],
            None => {
                groups.push(Group {
                    name: name.into(),
                    served: None,
                    replicas: Vec::new(),
                    api_key: None,
                    limit: None,
                    timeouts: Map::new(),
                });
                groups.last_mut().ok_or("unreachable")?
            }
        };
        merge(g, deployment, &params, total, &at, report);
    }
    let names = groups.iter().map(|g| g.name.clone()).collect();
    Ok(Pools { pools: groups.into_iter().map(pool_of).collect(), names, prices })
}

const RETRIES: &str = "slogate sends a request that failed before its first byte to another replica, and continues a stream that broke on another (pools[].resume); there is no retry count to set";

/// A deployment slogate can serve: the model its replica serves, and the replica.
struct Deployment {
    served: String,
    url: String,
}

fn deployment(params: &Map<String, Value>, at: &str, report: &mut Report) -> Option<Deployment> {
    let model = params.get("model").and_then(Value::as_str).unwrap_or("");
    let Some(served) = PROVIDERS.iter().find_map(|p| model.strip_prefix(p)) else {
        report.skip(
            format!("{at}.litellm_params.model"),
            format!("`{model}`: slogate stands in front of OpenAI-compatible replicas (hosted_vllm/, openai/) only"),
        );
        return None;
    };
    let base = params.get("api_base").and_then(resolved).and_then(|v| v.as_str().map(str::to_string));
    let Some(base) = base.filter(|b| b.starts_with("http://") || b.starts_with("https://")) else {
        report.skip(format!("{at}.litellm_params.api_base"), "missing, unset or not an http(s) URL: the replica is not known");
        return None;
    };
    let url = base.trim_end_matches('/').trim_end_matches("/v1").trim_end_matches('/').to_string();
    for k in params.keys().filter(|k| !MAPPED.contains(&k.as_str())) {
        let why = match k.as_str() {
            "rpm" | "tpm" => "no per-replica rate limit: slogate learns how many requests a replica serves at once, and keys carry rates",
            _ => "no slogate equivalent (requests go on as their callers send them)",
        };
        report.skip(format!("{at}.litellm_params.{k}"), why);
    }
    Some(Deployment { served: served.to_string(), url })
}

fn merge(g: &mut Group, d: Deployment, params: &Map<String, Value>, total: Option<f64>, at: &str, report: &mut Report) {
    match &g.served {
        None => g.served = Some(d.served),
        Some(s) if *s != d.served => report.skip(
            format!("{at}.litellm_params.model"),
            format!("serves `{}` where the group's first serves `{s}`: a pool's replicas serve one model name", d.served),
        ),
        Some(_) => {}
    }
    if !g.replicas.contains(&d.url) {
        g.replicas.push(d.url);
    }
    if let Some(k) = params.get("api_key") {
        let pool_env = format!("SLOGATE_{}_API_KEY", env_name(&g.name));
        let env = match Secret::of(k) {
            Some(Secret::Env(name)) => Some(name),
            Some(Secret::Literal(v)) if !matches!(v.as_str(), "none" | "EMPTY" | "fake-key" | "dummy") => {
                report.note(format!("{at}.litellm_params.api_key"), format!("a literal: set {pool_env} to it (not written out)"));
                Some(pool_env)
            }
            _ => None,
        };
        match (&g.api_key, env) {
            (None, Some(e)) => g.api_key = Some(json!(e)),
            (Some(had), Some(e)) if had != &json!(e) => {
                report.skip(format!("{at}.litellm_params.api_key"), "differs from the group's first replica's: a pool has one replica key")
            }
            _ => {}
        }
    }
    if let Some(n) = params.get("max_parallel_requests").and_then(Value::as_u64) {
        g.limit = Some(g.limit.map_or(n, |l| l.min(n)));
    }
    if let Some(t) = params.get("timeout").and_then(seconds).or(total) {
        g.timeouts.insert("total".into(), json!(format!("{}ms", (t * 1000.0).round() as u64)));
    }
    if let Some(t) = params.get("stream_timeout").and_then(seconds) {
        g.timeouts.insert("first_token".into(), json!(format!("{}ms", (t * 1000.0).round() as u64)));
    }
    if params.contains_key("max_retries") || params.contains_key("num_retries") {
        report.note(format!("{at}.litellm_params.max_retries"), RETRIES);
    }
}

fn pool_of(g: Group) -> Value {
    let mut p = json!({"name": g.name, "models": [g.name], "replicas": g.replicas});
    if let Some(s) = g.served.filter(|s| *s != g.name) {
        p["served_model"] = json!(s);
    }
    if let Some(k) = g.api_key {
        p["api_key_env"] = k;
    }
    if let Some(n) = g.limit {
        p["max_inflight_per_replica"] = json!(n);
    }
    if !g.timeouts.is_empty() {
        p["timeouts"] = Value::Object(g.timeouts);
    }
    p
}

/// Seconds from LiteLLM's number (or numeric string).
fn seconds(v: &Value) -> Option<f64> {
    v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok())).filter(|s: &f64| *s > 0.0)
}

/// `name` as part of an environment variable's name.
fn env_name(name: &str) -> String {
    name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
}
