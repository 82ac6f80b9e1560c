//! The checks of each section that parsed, one function a section (the
//! pools' and the keys' are in their own files). Each says every problem
//! it finds, with its field.

use super::{check_redis_url, env_problem, parse_host_port, parse_peer_url, parse_replica_url, pem, Config, Parsed, Problem};

/// `server`: listeners, TLS files, timeouts and sizes; `slo.history_step`.
pub(super) fn server(cfg: &Config, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    if cfg.server.listen == cfg.server.admin_listen && cfg.server.listen.port() != 0 {
        bad("server.admin_listen".into(), "must differ from server.listen".into());
    }
    if let Some(tls) = &cfg.server.tls {
        if let Err(e) = pem::certs(&tls.cert) {
            bad("server.tls.cert".into(), e);
        }
        if let Err(e) = pem::key(&tls.key) {
            bad("server.tls.key".into(), e);
        }
    }
    for (name, d) in [
        ("server.send_timeout", cfg.server.send_timeout),
        ("server.header_read_timeout", cfg.server.header_read_timeout),
        ("server.body_read_timeout", cfg.server.body_read_timeout),
    ] {
        if d.get().is_zero() {
            bad(name.into(), "must be greater than 0".into());
        }
    }
    if cfg.server.queued_keepalive.is_some_and(|d| d.get() < std::time::Duration::from_secs(1)) {
        bad("server.queued_keepalive".into(), "must be at least 1s (a comment a second already keeps any proxy awake)".into());
    }
    if cfg.slo.history_step.get() < std::time::Duration::from_millis(100) {
        bad("slo.history_step".into(), "must be at least 100ms".into());
    }
    if let Some(problem) = cfg.server.admin_token_env.as_deref().and_then(env_problem) {
        bad("server.admin_token_env".into(), problem);
    }
    if cfg.server.http2_max_streams == 0 {
        bad("server.http2_max_streams".into(), "must be at least 1".into());
    }
    if !(1..=65535).contains(&cfg.server.listen_backlog) {
        bad("server.listen_backlog".into(), "must be between 1 and 65535".into());
    }
    if cfg.server.max_connections == 0 {
        bad("server.max_connections".into(), "must be at least 1".into());
    }
    if cfg.server.max_request_body.0 == 0 {
        bad("server.max_request_body".into(), "must be greater than 0".into());
    }
    let largest = cfg.server.max_request_body.0.max(cfg.server.max_upload_body.0);
    if cfg.server.max_buffered_body_bytes.0 < largest {
        bad(
            "server.max_buffered_body_bytes".into(),
            format!("must be at least server.max_request_body and server.max_upload_body ({largest} bytes): one body must fit"),
        );
    }
    if cfg.server.max_upload_body.0 == 0 {
        bad("server.max_upload_body".into(), "must be greater than 0".into());
    }
}

/// `fleet`: peers and the exchange's timing.
pub(super) fn fleet(cfg: &Config, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    let fl = &cfg.fleet;
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
}

/// `limits`: the limit store.
pub(super) fn limits(cfg: &Config, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    let li = &cfg.limits;
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
}

/// `classes` and `default_class` (`seen`: the classes that failed to parse count as known).
pub(super) fn classes(cfg: &Config, seen: &Parsed, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    if cfg.classes.is_empty() && seen.failed_classes.is_empty() {
        bad("classes".into(), "at least one class is required".into());
    }
    for (name, c) in &cfg.classes {
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
    let class_known = |c: &str| cfg.classes.contains_key(c) || seen.failed_classes.iter().any(|f| f == c);
    if !class_known(&cfg.default_class) {
        bad("default_class".into(), format!("`{}` is not one of the classes", cfg.default_class));
    }
    for (endpoint, class) in cfg.endpoint_classes.iter().flatten() {
        if !class_known(class) {
            bad(format!("endpoint_classes.{}", endpoint.as_str()), format!("`{class}` is not one of the classes"));
        }
    }
}

/// `tiers`.
pub(super) fn tiers(cfg: &Config, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    for (tier, t) in [("interactive", &cfg.tiers.interactive), ("batch", &cfg.tiers.batch)] {
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
        let largest = cfg.server.max_request_body.0.max(cfg.server.max_upload_body.0);
        if t.queue_max_bytes.0 < largest {
            bad(
                format!("tiers.{tier}.queue_max_bytes"),
                format!(
                    "must be at least server.max_request_body and server.max_upload_body ({largest} bytes): a body the server takes must be able to wait"
                ),
            );
        }
    }
    if cfg.tiers.batch.reserved_share != 0.0 {
        bad("tiers.batch.reserved_share".into(), "only the interactive tier reserves slots".into());
    }
}

/// `slo`: objectives, window, burn alerts.
pub(super) fn slo(cfg: &Config, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    for (name, v) in [("slo.latency_objective", cfg.slo.latency_objective), ("slo.availability_objective", cfg.slo.availability_objective)]
    {
        if !(v > 0.0 && v < 1.0) {
            bad(name.into(), "must be between 0 and 1, e.g. 0.99".into());
        }
    }
    if cfg.slo.window.get().is_zero() {
        bad("slo.window".into(), "must be greater than 0".into());
    }
    for (i, a) in cfg.slo.burn_alerts.iter().enumerate() {
        if a.short >= a.long {
            bad(format!("slo.burn_alerts[{i}].short"), format!("must be shorter than long ({})", a.long));
        }
        if a.long > cfg.slo.window {
            bad(format!("slo.burn_alerts[{i}].long"), "must not exceed slo.window".into());
        }
        if a.short.get().is_zero() {
            bad(format!("slo.burn_alerts[{i}].short"), "must be greater than 0".into());
        }
        if !(a.factor.is_finite() && a.factor > 0.0) {
            bad(format!("slo.burn_alerts[{i}].factor"), "must be greater than 0".into());
        }
    }
}

/// `breaker`.
pub(super) fn breaker(cfg: &Config, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    let b = &cfg.breaker;
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
}

/// `context_reduction` and `auth.default_max_tokens`.
pub(super) fn reduction(cfg: &Config, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    let r = &cfg.context_reduction;
    if !(r.trigger_ratio.is_finite() && r.trigger_ratio >= 1.0) {
        bad("context_reduction.trigger_ratio".into(), "must be at least 1.0".into());
    }
    for (name, v) in [("max_tokens_cap", r.max_tokens_cap), ("max_documents", r.max_documents), ("max_prompt_tokens", r.max_prompt_tokens)]
    {
        if v == 0 {
            bad(format!("context_reduction.{name}"), "must be at least 1".into());
        }
    }
    if cfg.auth.default_max_tokens == 0 {
        bad("auth.default_max_tokens".into(), "must be at least 1".into());
    }
}

/// `telemetry`.
pub(super) fn telemetry(cfg: &Config, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    if let Some(ep) = &cfg.telemetry.otlp_endpoint {
        if parse_replica_url(ep).is_err() || !ep.starts_with("http://") {
            bad(
                "telemetry.otlp_endpoint".into(),
                "must be an http://host:port URL (OTLP over HTTP, e.g. http://127.0.0.1:4318; for TLS, run a collector beside slogate)"
                    .into(),
            );
        }
    }
}
