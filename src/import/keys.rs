//! LiteLLM's virtual keys (its `/key/list?return_full_object=true` rows)
//! as slogate's keys: the hash kept, the alias as the name, the models and
//! limits carried and flattened with the team's and user's to the tightest,
//! blocked and expired keys left out.

use std::collections::{HashMap, HashSet};

use serde_json::{json, Map, Value};

use super::Report;

/// What a key's conversion reads besides its row.
pub(super) struct Context<'a> {
    /// Dollars per input and output token, by model name.
    pub(super) prices: &'a HashMap<String, (f64, f64)>,
    /// The model names the pools serve.
    pub(super) models: &'a [String],
    pub(super) budgets_as_tokens: bool,
}

/// The key rows of `/key/list`'s answer: one page (`{"keys": [...]}`),
/// several pages (a list of them), or a list of rows.
pub(super) fn rows_of(v: &Value) -> Result<Vec<Value>, String> {
    let page = |p: &Value| p.get("keys").and_then(Value::as_array).cloned();
    if let Some(rows) = page(v) {
        return Ok(rows);
    }
    match v.as_array() {
        Some(items) if items.iter().all(|i| i.get("keys").is_some()) => Ok(items.iter().filter_map(page).flatten().collect()),
        Some(items) => Ok(items.clone()),
        None => Err("not /key/list's answer (an object with `keys`, or a list)".into()),
    }
}

/// The team rows of `/team/list`'s answer (a list, or `{"teams": [...]}`).
pub(super) fn teams_of(v: &Value) -> Result<Vec<Value>, String> {
    v.as_array()
        .or_else(|| v.get("teams").and_then(Value::as_array))
        .cloned()
        .ok_or_else(|| "not /team/list's answer (a list of teams)".into())
}

/// The fields of a key row that have no slogate equivalent, reported when set.
const NO_EQUIVALENT: [(&str, &str); 12] = [
    ("aliases", "no model aliases on a key"),
    ("model_max_budget", "no per-model budgets on a key"),
    ("model_rpm_limit", "no per-model limits on a key"),
    ("model_tpm_limit", "no per-model limits on a key"),
    ("rpm_limit_per_model", "no per-model limits on a key"),
    ("tpm_limit_per_model", "no per-model limits on a key"),
    ("guardrails", "no guardrails"),
    ("allowed_routes", "a key's endpoints are kinds (auth.keys[].endpoints), not routes: set them by hand"),
    ("allowed_cache_controls", "no response cache"),
    ("permissions", "no slogate equivalent"),
    ("config", "no slogate equivalent"),
    ("soft_budget", "no soft budgets (alerts): slogate's quota metrics can drive one"),
];

/// Convert every row; the keys, and how many were left out.
pub(super) fn convert(rows: &[Value], teams: &[Value], ctx: &Context, report: &mut Report) -> (Vec<Value>, usize) {
    let teams: HashMap<&str, &Value> = teams.iter().filter_map(|t| Some((t.get("team_id")?.as_str()?, t))).collect();
    let (mut out, mut left_out, mut names) = (Vec::new(), 0, HashSet::new());
    let mut teams_noted = HashSet::new();
    for (i, row) in rows.iter().enumerate() {
        let alias = row.get("key_alias").and_then(Value::as_str).filter(|a| !a.is_empty());
        let token = row.get("token").and_then(Value::as_str).unwrap_or("");
        let at = format!("keys[{}]", alias.map_or_else(|| i.to_string(), str::to_string));
        if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            report.skip(at, "left out: its `token` is not a SHA-256 hex (was the list asked with return_full_object=true?)");
            left_out += 1;
            continue;
        }
        let team = row.get("team_id").and_then(Value::as_str).and_then(|t| teams.get(t).copied());
        if let Some(why) = refused(row, team) {
            report.skip(at, format!("left out: {why}"));
            left_out += 1;
            continue;
        }
        let mut name = alias.map_or_else(|| format!("key-{}", &token[..8]), str::to_string);
        while !names.insert(name.clone()) {
            name = format!("{name}-{}", &token[..8]);
        }
        let mut key = json!({"name": name, "key_sha256": token.to_ascii_lowercase(), "classes": super::all_classes()});
        let models = models(row, team);
        if let Some(m) = &models {
            key["models"] = json!(m);
        }
        let limits = limits(row, team, models.as_deref(), ctx, &at, report);
        if !limits.is_empty() {
            key["limits"] = Value::Object(limits);
        }
        if let Some(t) = team.and_then(|t| t.get("team_alias").or(t.get("team_id"))).and_then(Value::as_str) {
            if teams_noted.insert(t.to_string()) {
                report.note(
                    format!("teams[{t}]"),
                    "its limits apply to each of its keys (the tightest of the key's and the team's), not to the team's keys together",
                );
            }
        }
        if row.get("team_id").and_then(Value::as_str).is_some() && team.is_none() {
            report.note(format!("{at}.team_id"), "the team is not in the team list: its limits are not applied");
        }
        unmapped(row, &at, report);
        out.push(key);
    }
    (out, left_out)
}

/// Why a key must not work: blocked (itself or its team), or expired.
fn refused(row: &Value, team: Option<&Value>) -> Option<String> {
    let on = |v: Option<&Value>, k: &str| v.and_then(|v| v.get(k)).and_then(Value::as_bool) == Some(true);
    if on(Some(row), "blocked") {
        return Some("blocked".into());
    }
    if on(Some(row), "team_blocked") || on(team, "blocked") {
        return Some("its team is blocked".into());
    }
    let expires = row.get("expires").and_then(Value::as_str)?;
    match humantime::parse_rfc3339_weak(expires.trim_end_matches('Z').split('+').next().unwrap_or(expires)) {
        Ok(at) if at <= std::time::SystemTime::now() => Some(format!("expired at {expires}")),
        Ok(_) => None,
        Err(_) => Some(format!("its expiry `{expires}` cannot be read, so it cannot be honoured")),
    }
}

/// The models a key may use: its own, within its team's (`None`: all).
fn models(row: &Value, team: Option<&Value>) -> Option<Vec<String>> {
    let list = |v: Option<&Value>, k: &str| -> Option<Vec<String>> {
        let m: Vec<String> = v?.get(k)?.as_array()?.iter().filter_map(|m| m.as_str().map(str::to_string)).collect();
        (!m.is_empty() && !m.iter().any(|m| m == "all-proxy-models" || m == "*")).then_some(m)
    };
    let team_models = list(team, "models").or_else(|| list(Some(row), "team_models"));
    match (list(Some(row), "models"), team_models) {
        (Some(k), Some(t)) => Some(k.into_iter().filter(|m| t.contains(m)).collect()),
        (k, t) => k.or(t),
    }
}

/// The tightest of the key's, its team's and its user's limits, and its
/// budgets as token quotas when asked.
fn limits(
    row: &Value,
    team: Option<&Value>,
    models: Option<&[String]>,
    ctx: &Context,
    at: &str,
    report: &mut Report,
) -> Map<String, Value> {
    let n = |v: Option<&Value>, k: &str| v.and_then(|v| v.get(k)).and_then(Value::as_u64);
    // The key's budget row (`budget_id`'s), whose limits apply as LiteLLM applies them.
    let budget = row.get("litellm_budget_table").filter(|b| b.is_object());
    let tightest = |vals: [Option<u64>; 4]| vals.into_iter().flatten().min();
    let mut l = Map::new();
    let mut put = |name: &str, v: Option<u64>| {
        if let Some(v) = v {
            l.insert(name.into(), json!(v));
        }
    };
    let user = |k: &str| n(Some(row), k);
    put("requests_per_minute", tightest([n(Some(row), "rpm_limit"), n(team, "rpm_limit"), user("user_rpm_limit"), n(budget, "rpm_limit")]));
    put("tokens_per_minute", tightest([n(Some(row), "tpm_limit"), n(team, "tpm_limit"), user("user_tpm_limit"), n(budget, "tpm_limit")]));
    let parallel = "max_parallel_requests";
    put("max_concurrent", tightest([n(Some(row), parallel), n(team, parallel), n(budget, parallel), None]));
    put("tokens_per_day", tightest([n(Some(row), "tpd_limit"), n(team, "tpd_limit"), n(budget, "tpd_limit"), None]));
    for (whose, v) in [("", Some(row)), ("team.", team), ("litellm_budget_table.", budget)] {
        let Some(dollars) = v.and_then(|v| v.get("max_budget")).and_then(Value::as_f64) else { continue };
        let duration = v.and_then(|v| v.get("budget_duration")).and_then(Value::as_str);
        budget_quota(&mut l, dollars, duration, models, ctx, &format!("{at}.{whose}max_budget"), report);
    }
    l
}

/// A dollar budget as a token quota (`--budgets-as-tokens`): what the
/// budget buys at the dearest price among the key's models, per day or month.
fn budget_quota(
    l: &mut Map<String, Value>,
    budget: f64,
    duration: Option<&str>,
    models: Option<&[String]>,
    ctx: &Context,
    field: &str,
    report: &mut Report,
) {
    if !ctx.budgets_as_tokens {
        report.skip(
            field,
            format!("${budget}: slogate counts tokens, not dollars (--budgets-as-tokens converts budgets through model_info's prices)"),
        );
        return;
    }
    let period = match duration.map(str::trim) {
        Some("1d" | "24h") => "tokens_per_day",
        Some("30d" | "31d" | "1mo") => "tokens_per_month",
        other => {
            report.skip(field, format!("${budget} per {}: slogate's quotas are per day or per month", other.unwrap_or("lifetime")));
            return;
        }
    };
    let usable = |m: &&String| models.is_none_or(|ms| ms.contains(m));
    let dearest = ctx.models.iter().filter(usable).filter_map(|m| ctx.prices.get(m)).map(|(i, o)| i.max(*o)).fold(0.0, f64::max);
    if dearest <= 0.0 {
        report.skip(field, format!("${budget}: no model_info prices for the key's models to convert it with"));
        return;
    }
    let tokens = (budget / dearest).floor() as u64;
    let tighter = l.get(period).and_then(Value::as_u64).map_or(tokens, |t| t.min(tokens));
    l.insert(period.into(), json!(tighter));
    report.note(
        field,
        format!("${budget} as {tokens} {} (approximate: at the dearest token price of its models, ${dearest})", period.replace('_', " ")),
    );
}

/// Report what the row sets that has no equivalent.
fn unmapped(row: &Value, at: &str, report: &mut Report) {
    let set = |v: &Value| match v {
        Value::Null | Value::Bool(false) => false,
        Value::Array(a) => !a.is_empty(),
        Value::Object(o) => !o.is_empty(),
        Value::String(s) => !s.is_empty(),
        _ => true,
    };
    for (k, why) in NO_EQUIVALENT {
        if row.get(k).is_some_and(set) {
            report.skip(format!("{at}.{k}"), why);
        }
    }
    if row.get("spend").and_then(Value::as_f64).is_some_and(|s| s > 0.0) {
        report.note(format!("{at}.spend"), "spend so far is not carried: quotas start from zero");
    }
    if let Some(e) = row.get("expires").and_then(Value::as_str) {
        report.note(format!("{at}.expires"), format!("expires at {e}: slogate's keys do not expire; remove it from keys.yaml then"));
    }
}
