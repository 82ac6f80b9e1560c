//! The importer's mapping, field by field.

use std::collections::HashMap;

use serde_json::{json, Value};

use super::keys::{convert, Context};
use super::settings::{self, Source};
use super::{model_list, Report};

fn source(model_list: Value, router: Value) -> Source {
    let obj = |v: Value| v.as_object().cloned().unwrap_or_default();
    Source {
        model_list: model_list.as_array().cloned().unwrap_or_default(),
        router_settings: obj(router),
        general_settings: Default::default(),
        litellm_settings: Default::default(),
        master_key: None,
    }
}

fn fields(rows: &[super::Skipped]) -> Vec<&str> {
    rows.iter().map(|s| s.field.as_str()).collect()
}

#[test]
fn a_group_is_one_pool_with_its_replicas_served_name_key_limit_and_timeouts() {
    let list = json!([
        {"model_name": "llama", "litellm_params": {"model": "hosted_vllm/meta/llama-8b", "api_base": "http://a:8000/v1", "api_key": "os.environ/VLLM_KEY", "max_parallel_requests": 16, "timeout": 300, "stream_timeout": 20}},
        {"model_name": "llama", "litellm_params": {"model": "hosted_vllm/meta/llama-8b", "api_base": "http://b:8000/v1/", "api_key": "os.environ/VLLM_KEY", "max_parallel_requests": 8}},
        {"model_name": "qwen", "litellm_params": {"model": "openai/qwen", "api_base": "http://c:8000", "api_key": "sk-literal"}},
        {"model_name": "qwen", "litellm_params": {"model": "openai/qwen", "api_base": "http://d:8000", "api_key": "os.environ/OTHER"}},
    ]);
    let mut report = Report::default();
    let pools = model_list::pools(&source(list, json!({})), &mut report).expect("pools");
    assert_eq!(pools.names, ["llama", "qwen"]);
    let llama = &pools.pools[0];
    assert_eq!(llama["replicas"], json!(["http://a:8000", "http://b:8000"]));
    assert_eq!(llama["served_model"], "meta/llama-8b");
    assert_eq!(llama["api_key_env"], "VLLM_KEY", "a reference stays a reference");
    assert_eq!(llama["max_inflight_per_replica"], 8, "the tightest");
    assert_eq!(llama["timeouts"], json!({"total": "300000ms", "first_token": "20000ms"}));
    let qwen = &pools.pools[1];
    assert!(qwen.get("served_model").is_none(), "served under the name clients use");
    assert_eq!(qwen["api_key_env"], "SLOGATE_QWEN_API_KEY", "a literal is never written out");
    assert!(!serde_json::to_string(&pools.pools).expect("JSON").contains("sk-literal"));
    assert_eq!(fields(&report.notes), ["model_list[2].litellm_params.api_key"]);
    assert_eq!(fields(&report.skipped), ["model_list[3].litellm_params.api_key"], "two keys in one pool");
}

#[test]
fn redis_becomes_the_limit_store_and_a_literal_password_a_variable() {
    let mut report = Report::default();
    let rs =
        json!({"redis_host": "redis.internal", "redis_port": 6380, "redis_password": "hunter2", "routing_strategy": "usage-based-routing"});
    let config = settings::config(&source(json!([]), rs), Vec::new(), ("0.0.0.0:4000", None), &mut report);
    assert_eq!(config["limits"], json!({"redis": "redis://redis.internal:6380", "password_env": "SLOGATE_REDIS_PASSWORD"}));
    assert!(!config.to_string().contains("hunter2"));
    assert_eq!(fields(&report.notes), ["router_settings.redis_password"]);
    assert_eq!(fields(&report.skipped), ["router_settings.routing_strategy"]);
}

fn row(alias: &str, extra: Value) -> Value {
    let mut r = json!({"token": format!("{:0>64}", alias.len()), "key_alias": alias, "models": [], "blocked": null, "expires": null});
    for (k, v) in extra.as_object().cloned().unwrap_or_default() {
        r[k] = v;
    }
    r
}

fn keys_of(rows: &[Value], teams: &[Value], as_tokens: bool) -> (Vec<Value>, usize, Report) {
    let prices: HashMap<String, (f64, f64)> = [("small".to_string(), (0.000001, 0.000002)), ("big".to_string(), (0.00001, 0.00003))].into();
    let models = ["small".to_string(), "big".to_string()];
    let ctx = Context { prices: &prices, models: &models, budgets_as_tokens: as_tokens };
    let mut report = Report::default();
    let (keys, left_out) = convert(rows, teams, &ctx, &mut report);
    (keys, left_out, report)
}

#[test]
fn limits_are_the_tightest_of_the_key_its_team_its_user_and_its_budget_row() {
    let team = json!({"team_id": "t1", "team_alias": "team-one", "rpm_limit": 5, "tpm_limit": 900, "max_parallel_requests": null, "models": ["small", "big"]});
    let k = row(
        "a",
        json!({"team_id": "t1", "rpm_limit": 50, "tpm_limit": 500, "user_rpm_limit": 40, "models": ["small"],
               "litellm_budget_table": {"max_parallel_requests": 3, "rpm_limit": null}}),
    );
    let (keys, left_out, report) = keys_of(&[k], &[team], false);
    assert_eq!(left_out, 0);
    assert_eq!(keys[0]["limits"], json!({"requests_per_minute": 5, "tokens_per_minute": 500, "max_concurrent": 3}));
    assert_eq!(keys[0]["models"], json!(["small"]));
    assert_eq!(fields(&report.notes), ["teams[team-one]"]);
}

#[test]
fn a_teams_models_bound_its_keys_and_all_proxy_models_is_every_model() {
    let team = json!({"team_id": "t1", "models": ["small"]});
    let rows = [
        row("a", json!({"team_id": "t1", "models": ["small", "big"]})),
        row("bb", json!({"team_id": "t1"})),
        row("ccc", json!({"models": ["all-proxy-models"]})),
    ];
    let (keys, _, _) = keys_of(&rows, &[team], false);
    assert_eq!(keys[0]["models"], json!(["small"]));
    assert_eq!(keys[1]["models"], json!(["small"]));
    assert!(keys[2].get("models").is_none(), "every model");
}

#[test]
fn budgets_become_token_quotas_only_when_asked_at_the_dearest_price() {
    let monthly = row("a", json!({"max_budget": 30.0, "budget_duration": "30d", "models": ["small", "big"]}));
    let daily = row("bb", json!({"max_budget": 1.0, "budget_duration": "1d", "models": ["small"]}));
    let lifetime = row("ccc", json!({"max_budget": 5.0}));
    let rows = [monthly, daily, lifetime];
    let (keys, _, report) = keys_of(&rows, &[], true);
    // $30 at big's output price ($0.00003 a token), $1 at small's ($0.000002).
    assert_eq!(keys[0]["limits"], json!({"tokens_per_month": 1_000_000}));
    assert_eq!(keys[1]["limits"], json!({"tokens_per_day": 500_000}));
    assert!(keys[2].get("limits").is_none());
    assert_eq!(fields(&report.notes), ["keys[a].max_budget", "keys[bb].max_budget"], "approximate, and said so");
    assert_eq!(fields(&report.skipped), ["keys[ccc].max_budget"], "a lifetime budget has no equivalent");
    let (keys, _, report) = keys_of(&rows, &[], false);
    assert!(keys.iter().all(|k| k.get("limits").is_none()));
    assert_eq!(fields(&report.skipped), ["keys[a].max_budget", "keys[bb].max_budget", "keys[ccc].max_budget"]);
}

#[test]
fn blocked_expired_and_hashless_keys_are_left_out_and_names_stay_unique() {
    let rows = [
        row("dup", json!({})),
        row("dup", json!({"token": format!("{:0>64}", "ab")})),
        row("gone", json!({"expires": "2021-03-01T00:00:00Z"})),
        row("later", json!({"expires": "2999-01-01T00:00:00Z"})),
        row("blocked", json!({"blocked": true})),
        row("x", json!({"token": "sk-...abcd"})),
        json!({"token": format!("{:1>64}", ""), "key_alias": null}),
    ];
    let (keys, left_out, report) = keys_of(&rows, &[], false);
    let names: Vec<&str> = keys.iter().filter_map(|k| k["name"].as_str()).collect();
    assert_eq!(names, ["dup", "dup-00000000", "later", "key-11111111"]);
    assert_eq!(left_out, 3);
    assert_eq!(fields(&report.skipped), ["keys[gone]", "keys[blocked]", "keys[x]"]);
    assert!(fields(&report.notes).contains(&"keys[later].expires"), "a key that expires later is carried, with its date");
}
