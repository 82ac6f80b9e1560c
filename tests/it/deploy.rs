//! The Kubernetes manifests (deploy/kubernetes): Kubernetes' own schemas
//! accept them (kubernetes-validate, installed by scripts/setup-test-deps),
//! they agree with each other and with the slogate config they carry, and
//! the PrometheusRule is the one `slogate rules` generates for that config.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_norway::Value;
use slogate::config::Config;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes")
}

/// Every document of every manifest file, with its file name.
fn documents() -> Vec<(String, Value)> {
    let mut out = Vec::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir()).expect("deploy/kubernetes").map(|e| e.expect("entry").path()).collect();
    files.sort();
    for f in files.iter().filter(|f| f.extension().is_some_and(|e| e == "yaml") && !f.ends_with("kustomization.yaml")) {
        let text = std::fs::read_to_string(f).expect("read");
        for doc in serde_norway::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap_or_else(|e| panic!("{}: not YAML: {e}", f.display()));
            if !v.is_null() {
                out.push((f.file_name().expect("name").to_string_lossy().into_owned(), v));
            }
        }
    }
    out
}

fn kind<'a>(docs: &'a [(String, Value)], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .map(|(_, v)| v)
        .find(|v| v["kind"].as_str() == Some(kind) && v["metadata"]["name"].as_str() == Some(name))
        .unwrap_or_else(|| panic!("no {kind} {name} in deploy/kubernetes"))
}

fn text(v: &Value) -> &str {
    v.as_str().unwrap_or_else(|| panic!("not a string: {v:?}"))
}

#[test]
fn kubernetes_schemas_accept_the_manifests() {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/kubernetes-validate");
    assert!(bin.exists(), "kubernetes-validate not found: run scripts/test, which installs it into .venv");
    // The Prometheus Operator's kinds are CRDs the tool has no schema for;
    // the PrometheusRule's rules are checked by promtool (tests/rules.rs).
    let files = ["configmap.yaml", "deployment.yaml", "services.yaml", "pdb.yaml"].map(|f| dir().join(f));
    let out = std::process::Command::new(&bin).arg("--strict").args(&files).output().expect("run kubernetes-validate");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubernetes-validate refused the manifests:\n{said}");
    assert_eq!(said.matches(" passed for resource ").count(), 5, "every resource was checked:\n{said}");
}

#[test]
fn the_manifests_agree_with_each_other_and_with_the_config() {
    let docs = documents();
    // The config reads the admin token's variable; the Secret sets it in the pod.
    std::env::set_var("SLOGATE_ADMIN_TOKEN", "test-token");
    let config_text = text(&kind(&docs, "ConfigMap", "slogate-config")["data"]["slogate.yaml"]).to_string();
    let config = Config::parse(&config_text).unwrap_or_else(|e| panic!("the ConfigMap's slogate.yaml is not a valid config:\n{e}"));
    let deploy = kind(&docs, "Deployment", "slogate");
    let pod = &deploy["spec"]["template"];
    let labels = &pod["metadata"]["labels"];
    assert_eq!(deploy["spec"]["replicas"].as_u64(), Some(3));
    assert_eq!(&deploy["spec"]["selector"]["matchLabels"], labels);
    let c = &pod["spec"]["containers"][0];
    let port = |name: &str| {
        c["ports"].as_sequence().expect("ports").iter().find(|p| p["name"].as_str() == Some(name)).expect("port")["containerPort"]
            .as_u64()
            .expect("number") as u16
    };
    assert_eq!(port("http"), config.server.listen.port());
    assert_eq!(port("admin"), config.server.admin_listen.port());
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        assert_eq!(text(&c[probe]["httpGet"]["path"]), path);
        assert_eq!(text(&c[probe]["httpGet"]["port"]), "admin", "{probe} on the admin listener");
    }
    // The grace period covers the preStop wait and slogate's own drain.
    let pre_stop = c["lifecycle"]["preStop"]["sleep"]["seconds"].as_u64().expect("preStop sleep");
    let grace = pod["spec"]["terminationGracePeriodSeconds"].as_u64().expect("grace");
    assert!(grace > pre_stop + config.server.shutdown_grace.get().as_secs(), "{grace} s <= {pre_stop} s + shutdown_grace");
    let token_env = config.server.admin_token_env.as_deref().expect("the fleet's exchange is authenticated");
    let env = c["env"].as_sequence().expect("env");
    let token = env.iter().find(|e| e["name"].as_str() == Some(token_env)).expect("the token's variable is set");
    let secret = &token["valueFrom"]["secretKeyRef"];
    assert_eq!(text(&c["volumeMounts"][0]["mountPath"]), "/etc/slogate");
    assert!(c["args"].as_sequence().expect("args").iter().any(|a| a.as_str() == Some("/etc/slogate/slogate.yaml")));

    // Peers: the headless Service named by fleet.peers_dns, on the admin port, not-ready pods listed.
    let (host, peers_port) = slogate::config::parse_host_port(config.fleet.peers_dns.as_deref().expect("peers_dns")).expect("host:port");
    let headless = kind(&docs, "Service", &host);
    assert_eq!(text(&headless["spec"]["clusterIP"]), "None");
    assert_eq!(headless["spec"]["publishNotReadyAddresses"].as_bool(), Some(true));
    assert_eq!(headless["spec"]["ports"][0]["port"].as_u64(), Some(peers_port as u64));
    assert_eq!(peers_port, config.server.admin_listen.port());
    let client = kind(&docs, "Service", "slogate");
    assert_eq!(text(&client["spec"]["type"]), "ClusterIP");
    assert_eq!(text(&client["spec"]["ports"][0]["targetPort"]), "http");
    for s in [headless, client, &kind(&docs, "PodDisruptionBudget", "slogate")["spec"]] {
        let sel = if s["spec"]["selector"].is_mapping() { &s["spec"]["selector"] } else { &s["selector"]["matchLabels"] };
        for (k, v) in sel.as_mapping().expect("selector") {
            assert_eq!(&labels[k], v, "a selector that matches the pods");
        }
    }
    assert!(kind(&docs, "PodDisruptionBudget", "slogate")["spec"]["minAvailable"].as_u64() == Some(2));
    // Prometheus scrapes the admin port of the headless Service, with the token.
    let sm = kind(&docs, "ServiceMonitor", "slogate");
    for (k, v) in sm["spec"]["selector"]["matchLabels"].as_mapping().expect("selector") {
        assert_eq!(&headless["metadata"]["labels"][k], v, "the ServiceMonitor selects the headless Service");
    }
    let ep = &sm["spec"]["endpoints"][0];
    assert_eq!(text(&ep["port"]), "admin");
    assert_eq!(&ep["authorization"]["credentials"]["name"], &secret["name"]);
    assert_eq!(&ep["authorization"]["credentials"]["key"], &secret["key"]);

    // The PrometheusRule is generated from the ConfigMap's config.
    let generated = slogate::rules::render(&config, slogate::rules::Format::PrometheusOperator).expect("rules");
    let committed = std::fs::read_to_string(dir().join("prometheusrule.yaml")).expect("prometheusrule.yaml");
    assert!(
        committed.ends_with(&generated),
        "deploy/kubernetes/prometheusrule.yaml is not what `slogate rules --format prometheus-operator` gives for the ConfigMap's config"
    );
}
