//! The benchmark scenario files (`loadtest/scenarios/`): each is read as the
//! runner reads it, its driver exists, and every gateway configuration and
//! load it gives, filled with its declared example values, is one slogate
//! and loadgen accept. A scenario cannot rot unseen between its runs.

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
