//! The config parser's and checks' tests.

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
    let ok =
        Config::parse("fleet:\n  peers: [http://10.0.0.7:9091, 'http://[::1]:9091/']\n  peers_dns: slogate.ai.svc:9091\n").expect("valid");
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
    let err = Config::parse("pools:\n  - name: a\n    models: [m]\n    replicas: [http://127.0.0.1:1, 'ftp://x']\n").expect_err("bad").0;
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
    assert_eq!(c.tiers.interactive.reserved_share, 0.5);
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
    assert_eq!(c.pools[0].replicas[0], ReplicaConfig { url: "http://10.0.0.1:8000".into(), ..ReplicaConfig::default() });
    assert_eq!(
        c.pools[0].replicas[1],
        ReplicaConfig { url: "http://10.0.0.2:8000".into(), name: Some("gpu-b".into()), ..ReplicaConfig::default() }
    );
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
    let ok =
        Config::parse("pools:\n  - name: p\n    replicas: [http://127.0.0.1:1]\n    extra_paths: [{ path: /sleep, keys: [anonymous] }]\n");
    assert!(ok.is_ok(), "{ok:?}");
}

#[test]
fn auth_keys_need_exactly_one_source_and_known_classes() {
    let err = Config::parse("auth:\n  keys:\n    - { name: a, classes: [chat] }\n    - { name: b, key_sha256: abc, classes: [nope] }\n")
        .expect_err("bad")
        .0;
    let fields: Vec<&str> = err.iter().map(|p| p.field.as_str()).collect();
    assert!(fields.contains(&"auth.keys[0]"), "{fields:?}");
    assert!(fields.contains(&"auth.keys[1].key_sha256"), "{fields:?}");
    assert!(fields.contains(&"auth.keys[1].classes[0]"), "{fields:?}");
}

#[test]
fn preemption_is_on_by_default_with_or_without_upstream_priority() {
    let preempts = |extra: &str| {
        let c =
            Config::parse(&format!("pools:\n  - name: p\n    models: [m]\n    replicas: [http://127.0.0.1:1]\n{extra}")).expect("valid");
        c.pools[0].preempts()
    };
    assert!(preempts(""), "auto, first come first served");
    assert!(preempts("    upstream_priority: true\n"), "auto: a priority engine frees no slot for chat either");
    assert!(!preempts("    upstream_priority: true\n    preempt: false\n"));
    assert!(preempts("    preempt: true\n"));
    let err = Config::parse("pools:\n  - name: p\n    models: [m]\n    replicas: [http://127.0.0.1:1]\n    preempt: sometimes\n")
        .expect_err("bad")
        .0;
    assert!(err[0].field.starts_with("pools"), "{err:?}");
}
