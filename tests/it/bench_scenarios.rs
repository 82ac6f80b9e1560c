//! The benchmark scenario files (`loadtest/scenarios/`): each is read as the
//! runner reads it, its driver exists, and every gateway configuration and
//! load it gives, filled with its declared example values, is one slogate
//! and loadgen accept. A scenario cannot rot unseen between its runs. And
//! the drivers' shared helpers (`loadtest/lib.sh`) hold what they promise.

use std::path::Path;

use loadtest::bench::{scenario_names, BenchFile};
use loadtest::loadgen::Scenario;
use slogate::config::Config;

#[test]
fn every_scenario_gives_configs_slogate_accepts_and_loads_loadgen_accepts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let names = scenario_names(&root.join("loadtest/scenarios")).expect("the scenarios folder");
    assert!(names.iter().any(|n| n == "admission/breaker"), "found: {names:?}");
    for n in &names {
        let f = BenchFile::load(&root.join(format!("loadtest/scenarios/{n}.yaml"))).unwrap_or_else(|e| panic!("{e}"));
        let (script, _) = f.driver_command(root);
        assert!(script.is_file(), "{n}: no driver {}", script.display());
        let vars = f.example_vars();
        for name in f.gateway.keys() {
            let yaml = f.gateway_config(name, &["http://127.0.0.1:1".into()], &vars).unwrap_or_else(|e| panic!("{n}: {e}"));
            if let Err(e) = Config::parse(&yaml) {
                panic!("{n}: gateway {name}: slogate refuses it: {e}\n{yaml}");
            }
        }
        for name in f.load.keys() {
            let yaml = f.load_scenario(name, "http://127.0.0.1:1", &vars).unwrap_or_else(|e| panic!("{n}: {e}"));
            let s: Scenario = serde_norway::from_str(&yaml).unwrap_or_else(|e| panic!("{n}: load {name}: {e}\n{yaml}"));
            s.check().unwrap_or_else(|e| panic!("{n}: load {name}: {e}"));
        }
        assert!(!f.checks.is_empty(), "{n}: a published result is judged by checks");
    }
}

#[test]
fn a_config_slogate_would_refuse_is_caught_here() {
    // The test above must be able to fail: a scenario whose configuration
    // misspells a field is refused the way slogate refuses it at start.
    let f: BenchFile = serde_norway::from_str(
        "title: t\ndriver: admission.sh breaker\ngateway:\n  main:\n    pools: [{ name: p, models: [auto], max_inflight_per_replica: \"${slots}\" }]\n    braeker: {}\n\
         vars: { slots: 4 }\nchecks: [{ name: c, measure: m, at_most: 1 }]\n",
    )
    .expect("parses");
    let yaml = f.gateway_config("main", &["http://127.0.0.1:1".into()], &f.example_vars()).expect("fills");
    let e = Config::parse(&yaml).expect_err("a misspelt field");
    assert!(e.to_string().contains("braeker"), "{e}");
}

/// Helpers that drivers source: held to the drivers' rules.
const SOURCED_BY_DRIVERS: &[&str] = &["pair.sh"];

#[test]
fn a_driver_writes_no_gateway_configuration_or_load_by_hand() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let names = scenario_names(&root.join("loadtest/scenarios")).expect("the scenarios folder");
    let mut drivers: Vec<String> = names
        .iter()
        .map(|n| {
            let f = BenchFile::load(&root.join(format!("loadtest/scenarios/{n}.yaml"))).unwrap_or_else(|e| panic!("{e}"));
            let (script, _) = f.driver_command(root);
            script.file_name().and_then(|s| s.to_str()).unwrap_or_default().to_string()
        })
        .collect();
    drivers.sort();
    drivers.dedup();
    drivers.extend(SOURCED_BY_DRIVERS.iter().map(|s| s.to_string()));
    for d in &drivers {
        let text = std::fs::read_to_string(root.join("loadtest/bench").join(d)).expect("driver");
        for hand_written in ["pools:", "listen: 127.0.0.1", "max_inflight_per_replica:"] {
            assert!(!text.contains(hand_written), "{d} writes a gateway configuration by hand ({hand_written:?}); use bench_config");
        }
        for hand_written in ["arrival:", "prompt_tokens:"] {
            assert!(!text.contains(hand_written), "{d} writes a load by hand ({hand_written:?}); use bench_load");
        }
    }
    let scripts = std::fs::read_dir(root.join("loadtest/bench")).expect("bench folder");
    for s in scripts.filter_map(|e| e.ok()).filter_map(|e| e.file_name().into_string().ok()).filter(|s| s.ends_with(".sh")) {
        assert!(
            drivers.contains(&s),
            "loadtest/bench/{s} is neither a scenario's driver nor a helper drivers source: every benchmark runs through loadtest/run"
        );
    }
}

/// lib.sh's `port_unused` (behind `free_port`, which names the ports of
/// gateways that must know their peers' before they start): a listener's
/// port, and a connected client's local port, are both in use. A client's
/// port refuses connections like a free one, and a fleet benchmark's
/// gateway once failed to bind one.
#[test]
fn free_port_never_names_a_port_a_socket_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let unused = |port: u16| {
        std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("source {}/loadtest/lib.sh && port_unused {port}", root.display()))
            .env("WORK", std::env::temp_dir())
            .status()
            .expect("bash")
            .success()
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let listening = listener.local_addr().expect("addr").port();
    let client = std::net::TcpStream::connect(("127.0.0.1", listening)).expect("connect");
    let (_accepted, _) = listener.accept().expect("accept");
    let client_port = client.local_addr().expect("addr").port();
    assert!(!unused(listening), "a listener's port {listening}");
    assert!(!unused(client_port), "a connected client's port {client_port}");
    let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("bind").port();
    assert!(unused(closed), "a port whose listener closed ({closed})");
}
