//! The checks of the pools' configuration: names, models, replicas, TLS,
//! limits, health, timeouts and KV events (see [`super::pool`]).

use std::collections::HashMap;

use super::pool::*;
use super::{check_replica_name, env_problem, parse_replica_url, pem, Config, Parsed, Problem};

/// Every problem of the pools: names, models, replicas, limits, health and timeouts.
pub(super) fn validate(cfg: &Config, seen: &Parsed, p: &mut Vec<Problem>) {
    if cfg.pools.is_empty() && seen.pool_index.len() == seen.pools_given {
        p.push(Problem { field: "pools".into(), message: "at least one pool is required".into() });
    }
    let mut names = std::collections::HashSet::new();
    let mut models: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (pool, &i) in cfg.pools.iter().zip(&seen.pool_index) {
        let mut bad = |field: String, message: String| p.push(Problem { field, message });
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
        replicas(pool, i, p);
        tls(pool, i, p);
        limits_and_timeouts(pool, i, p);
        kv_events(pool, i, p);
    }
}

/// A pool's replicas: at least one (or a name to find them in DNS), URLs,
/// names unique in the pool.
fn replicas(pool: &PoolConfig, i: usize, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    match &pool.replicas_dns {
        None if pool.replicas.is_empty() => {
            bad(format!("pools[{i}].replicas"), "at least one replica (or replicas_dns) is required".into())
        }
        Some(d) => {
            if let Err(e) = super::parse_host_port(&d.name) {
                bad(format!("pools[{i}].replicas_dns.name"), e);
            }
            if d.every.get().is_zero() {
                bad(format!("pools[{i}].replicas_dns.every"), "must be more than 0".into());
            }
        }
        None => {}
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
}

/// A pool's TLS to its replicas.
fn tls(pool: &PoolConfig, i: usize, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    let f = |s: &str| format!("pools[{i}].{s}");
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
}

/// A pool's API key, event size, slot limits, health checks and timeouts.
fn limits_and_timeouts(pool: &PoolConfig, i: usize, p: &mut Vec<Problem>) {
    let mut bad = |field: String, message: String| p.push(Problem { field, message });
    let f = |s: &str| format!("pools[{i}].{s}");
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
    let x = &pool.prefix;
    if !(16..=65_536).contains(&x.block.0) {
        bad(f("prefix.block"), "must be between 16B and 64KiB".into());
    }
    if !(1..=65_536).contains(&x.max_blocks) {
        bad(f("prefix.max_blocks"), "must be between 1 and 65536".into());
    }
    if x.index_blocks < x.max_blocks {
        bad(f("prefix.index_blocks"), format!("must be at least prefix.max_blocks ({}): one prompt must fit", x.max_blocks));
    }
    if !(x.load_weight.is_finite() && x.load_weight >= 0.0) {
        bad(f("prefix.load_weight"), "must be a number >= 0".into());
    }
    if !pool.health.path.starts_with('/') {
        bad(f("health.path"), "must start with /".into());
    }
    if !(0.0..=1.0).contains(&pool.health.panic_threshold) {
        bad(f("health.panic_threshold"), "must be between 0 and 1".into());
    }
    for (name, d) in [("health.interval", pool.health.interval), ("health.timeout", pool.health.timeout)] {
        if d.get().is_zero() {
            bad(f(name), "must be greater than 0".into());
        }
    }
    for (name, n) in [("health.unhealthy_after", pool.health.unhealthy_after), ("health.healthy_after", pool.health.healthy_after)] {
        if n == 0 {
            bad(f(name), "must be at least 1".into());
        }
    }
    let t = &pool.timeouts;
    for (name, d) in
        [("timeouts.connect", t.connect), ("timeouts.first_token", t.first_token), ("timeouts.idle", t.idle), ("timeouts.total", t.total)]
    {
        if d.get().is_zero() {
            bad(f(name), "must be greater than 0".into());
        }
    }
}

/// `prefix.kv_events`: needs `prefix_aware`, a port and a tokenizer file
/// (read when the pool is built; here only that it is named).
fn kv_events(pool: &PoolConfig, i: usize, p: &mut Vec<Problem>) {
    for (j, r) in pool.replicas.iter().enumerate() {
        for (field, at) in [("kv_events", &r.kv_events), ("kv_events_replay", &r.kv_events_replay)] {
            let Some(at) = at else { continue };
            let message = if pool.prefix.kv_events.is_none() {
                "needs the pool's prefix.kv_events (the model's tokenizer names the blocks)".to_string()
            } else if !at.starts_with("tcp://") || at.rsplit_once(':').and_then(|(_, port)| port.parse::<u16>().ok()).is_none() {
                format!("`{at}`: must be tcp://host:port")
            } else {
                continue;
            };
            p.push(Problem { field: format!("pools[{i}].replicas[{j}].{field}"), message });
        }
    }
    let Some(k) = &pool.prefix.kv_events else { return };
    let mut bad = |field: &str, message: String| p.push(Problem { field: format!("pools[{i}].prefix.kv_events.{field}"), message });
    if pool.balance != Balance::PrefixAware {
        bad("port", "needs balance: prefix_aware (the events say what each replica caches; only prefix_aware routes by it)".into());
    }
    if k.port == 0 || k.replay_port == Some(0) {
        bad("port", "ports must be between 1 and 65535".into());
    }
    if k.tokenizer.as_os_str().is_empty() {
        bad("tokenizer", "must name the model's tokenizer.json (a local path)".into());
    }
    if k.max_blocks_per_replica == 0 {
        bad("max_blocks_per_replica", "must be at least 1".into());
    }
}
