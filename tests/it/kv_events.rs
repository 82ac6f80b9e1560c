//! Exact prefix routing: simulated vLLM replicas that count and name their
//! prompt blocks by a real tokenizer and publish their KV events as vLLM
//! does (ZMQ PUB, msgpack batches, a replay socket), and a gateway that
//! follows the events with the same tokenizer and chat template.

use http_body_util::BodyExt;
use loadtest::sim::{SimConfig, SimServer};
use serde_json::Value;

use crate::common::*;

const MODEL: &str = "sim-llama-8b";

/// The small BPE tokenizer and Llama-3-style template of crates/prompt's tests.
fn tokenizer() -> String {
    format!("{}/crates/prompt/tests/fixtures/tokenizer/tokenizer.json", env!("CARGO_MANIFEST_DIR"))
}

async fn publishing(n: usize) -> Vec<SimServer> {
    let mut out = Vec::new();
    for _ in 0..n {
        let cfg = SimConfig {
            step_base_ms: 1.0,
            prefill_per_token_ms: 0.001,
            tokenizer: Some(tokenizer().into()),
            kv_events_port: Some(0),
            kv_events_replay_port: Some(0),
            ..SimConfig::default()
        };
        out.push(SimServer::start(cfg, "127.0.0.1:0".parse().expect("addr")).await.expect("simulator"));
    }
    out
}

/// A chat request: `group`'s long system prompt, then a question of its own.
fn chat(group: usize, question: usize) -> String {
    let system = format!("You are a helpful assistant for team {group}. Answer briefly and cite the documents. ").repeat(12);
    serde_json::json!({
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": format!("Question {question}: why?")}],
        "max_tokens": 2,
    })
    .to_string()
}

/// POST a chat request to `addr`: the replica that served it (through the
/// gateway) and the usage the engine reported.
async fn send(addr: impl To, body: &str, i: usize) -> (String, Value) {
    let (proto, client) = &clients()[i % 2];
    let resp = client.request(post_req(addr, "/v1/chat/completions", body, &[])).await.expect("POST");
    assert_eq!(resp.status(), 200, "{proto}");
    let replica = resp.headers().get("x-slogate-replica").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let bytes = resp.into_body().collect().await.expect("body").to_bytes();
    let v: Value = serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{proto}: {e}: {}", String::from_utf8_lossy(&bytes)));
    (replica, v["usage"].clone())
}

async fn replica_status(gw: &Gw) -> Vec<Value> {
    let slo: Value = serde_json::from_str(&get(gw.admin_addr, "/slo.json").await.1).expect("slo JSON");
    slo["pools"][0]["replicas"].as_array().expect("replicas").clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_goes_where_the_replicas_own_events_say_its_prefix_is_cached() {
    let sims = publishing(2).await;
    // Each replica's cache learns its groups' system prompts straight from
    // a client: the gateway sends nothing, so its estimate knows nothing.
    // Four groups, two on each: the estimate (each prompt's home, a hash)
    // would place all four as warmed one time in sixteen.
    for g in 0..4 {
        send(sims[g % 2].addr, &chat(g, 0), 0).await; // HTTP/1.1: the simulator speaks no h2c
    }
    let replicas: Vec<String> = sims
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let kv = s.kv_events.as_ref().expect("publishes");
            let replay = kv.replay.as_deref().expect("replays");
            format!("{{ url: '{}', name: r{i}, kv_events: '{}', kv_events_replay: '{replay}' }}", s.url(), kv.events)
        })
        .collect();
    let yaml = gateway_config(&replicas).pool(&format!("prefix: {{ kv_events: {{ tokenizer: '{}' }} }}", tokenizer())).yaml();
    let gw = start_gateway(&yaml.replace("models: [m1]", &format!("models: [{MODEL}]"))).await;

    // The gateway came after those batches: the next batch each replica
    // publishes once the gateway follows it (a new prompt makes one) brings
    // them back from its replay socket.
    for k in 0.. {
        for (g, s) in sims.iter().enumerate() {
            send(s.addr, &chat(100 + 2 * k + g, 0), 0).await;
        }
        let st = replica_status(&gw).await;
        if st.iter().all(|r| r["kv_events"]["alive"] == true && r["kv_events"]["replayed"].as_u64() >= Some(1)) {
            break;
        }
        assert!(k < 500, "the replicas' events never came: {st:?}");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }

    // Group g's next questions go to the replica that holds its system prompt.
    for q in 1..4 {
        for g in 0..4 {
            let (replica, usage) = send(&gw, &chat(g, q), g + q).await;
            assert_eq!(replica, format!("r{}", g % 2), "group {g}, question {q}");
            let prompt = usage["prompt_tokens"].as_u64().expect("prompt tokens");
            let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().expect("cached tokens");
            assert!(cached * 10 >= prompt * 7, "group {g}: {cached} of {prompt} tokens cached");
        }
    }
    for r in replica_status(&gw).await {
        let kv = &r["kv_events"];
        assert_eq!((kv["lost"].as_u64(), kv["malformed"].as_u64()), (Some(0), Some(0)), "{r}");
        assert!(kv["blocks"].as_u64() > Some(0), "{r}");
    }
    // The same on /metrics, read at the scrape.
    let metrics = get(gw.admin_addr, "/metrics").await.1;
    let sample = |name: &str, replica: &str| -> Option<f64> {
        let head = format!("{name}{{pool=\"p\",replica=\"{replica}\"}} ");
        metrics.lines().find_map(|l| l.strip_prefix(head.as_str())).and_then(|v| v.parse().ok())
    };
    for r in ["r0", "r1"] {
        assert_eq!(sample("slogate_replica_kv_events_alive", r), Some(1.0), "{r} in\n{metrics}");
        assert!(sample("slogate_replica_kv_events_blocks", r) > Some(0.0), "{r}");
        assert!(sample("slogate_replica_kv_events_batches_total", r) >= Some(1.0), "{r}");
        assert_eq!(sample("slogate_replica_kv_events_lost_batches_total", r), Some(0.0), "{r}");
        assert!(sample("slogate_replica_kv_events_replayed_batches_total", r) >= Some(1.0), "{r}");
    }
}

#[tokio::test]
async fn exact_mode_needs_a_tokenizer_it_can_read_and_prefix_aware_routing() {
    let yaml =
        gateway_config(&["http://127.0.0.1:9".into()]).pool("prefix: { kv_events: { tokenizer: /nonexistent/tokenizer.json } }").yaml();
    let cfg = slogate::config::Config::parse(&yaml).expect("the config itself is valid");
    let err = slogate::Gateway::start(cfg).await.err().expect("no gateway without its tokenizer").to_string();
    assert!(err.contains("prefix.kv_events") && err.contains("/nonexistent/tokenizer.json"), "{err}");
    let yaml = gateway_config(&["http://127.0.0.1:9".into()])
        .pool("balance: least_loaded")
        .pool(&format!("prefix: {{ kv_events: {{ tokenizer: '{}' }} }}", tokenizer()))
        .yaml();
    let err = slogate::config::Config::parse(&yaml).expect_err("exact mode routes by prefix").to_string();
    assert!(err.contains("prefix_aware"), "{err}");
    let yaml = gateway_config(&["{ url: 'http://127.0.0.1:9', kv_events: 'tcp://127.0.0.1:5557' }".into()]).yaml();
    let err = slogate::config::Config::parse(&yaml).expect_err("a replica's events need the pool's tokenizer").to_string();
    assert!(err.contains("replicas[0].kv_events"), "{err}");
}

/// vLLM's publisher is pyzmq (libzmq) and msgspec: a publisher built on
/// them, started before the gateway, is followed from its first batch (the
/// ones it missed replayed), every block indexed, nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publisher_on_vllms_own_libraries_is_followed_from_its_first_batch() {
    let py = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(py.is_file(), "{} missing: run scripts/setup-test-deps", py.display());
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/it/kv_publisher.py");
    let mut child = tokio::process::Command::new(py)
        .args([script, "60"])
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("python runs");
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(stdout));
    let first = lines.next_line().await.expect("reads").expect("the publisher's endpoints");
    let at: Value = serde_json::from_str(&first).expect("JSON");
    let mock = Mock::start(standard(2, std::time::Duration::ZERO)).await;
    let replica = format!(
        "{{ url: '{}', kv_events: '{}', kv_events_replay: '{}' }}",
        mock.url(),
        at["events"].as_str().expect("events"),
        at["replay"].as_str().expect("replay")
    );
    let gw = gateway_config(&[replica]).pool(&format!("prefix: {{ kv_events: {{ tokenizer: '{}' }} }}", tokenizer())).start().await;
    let admin = gw.admin_addr;
    wait_until("ten blocks followed, the first ones replayed", || async move {
        let slo: Value = serde_json::from_str(&get(admin, "/slo.json").await.1).unwrap_or_default();
        let kv = &slo["pools"][0]["replicas"][0]["kv_events"];
        kv["alive"] == true && kv["blocks"].as_u64() >= Some(10) && kv["replayed"].as_u64() >= Some(1)
    })
    .await;
    let kv = replica_status(&gw).await[0]["kv_events"].clone();
    assert_eq!((kv["lost"].as_u64(), kv["malformed"].as_u64()), (Some(0), Some(0)), "{kv}");
    // Every block chains to the one before: none was missed (one batch may
    // arrive between the two counts being read).
    let (blocks, batches) = (kv["blocks"].as_u64().unwrap_or(0), kv["batches"].as_u64().unwrap_or(0));
    assert!(blocks + 1 >= batches, "{blocks} blocks from {batches} batches: {kv}");
    let _ = child.kill().await;
}
