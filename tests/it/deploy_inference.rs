//! The Gateway API Inference Extension manifests (deploy/kubernetes/inference):
//! Kubernetes' own schemas accept the core kinds (kubernetes-validate), the
//! InferencePool, Gateway and HTTPRoute hold to the fields their v1 APIs
//! define (those CRDs' schemas are not in kubernetes-validate: checked here
//! field by field), and the pieces agree with each other and with the
//! slogate config they carry.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_norway::Value;
use slogate::config::Config;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes/inference")
}

fn documents() -> Vec<Value> {
    let mut out = Vec::new();
    for f in ["configmap.yaml", "deployment.yaml", "services.yaml", "inferencepool.yaml"] {
        let text = std::fs::read_to_string(dir().join(f)).expect("read");
        for doc in serde_norway::Deserializer::from_str(&text) {
            let v = Value::deserialize(doc).unwrap_or_else(|e| panic!("{f}: not YAML: {e}"));
            if !v.is_null() {
                out.push(v);
            }
        }
    }
    out
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter().find(|v| v["kind"].as_str() == Some(kind)).unwrap_or_else(|| panic!("no {kind}"))
}

fn port(v: &Value) -> u64 {
    let p = v.as_u64().unwrap_or_else(|| panic!("not a port: {v:?}"));
    assert!((1..=65535).contains(&p), "port {p}");
    p
}

#[test]
fn kubernetes_schemas_accept_the_core_kinds() {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/kubernetes-validate");
    assert!(bin.exists(), "kubernetes-validate not found: run scripts/test, which installs it into .venv");
    let files = ["configmap.yaml", "deployment.yaml", "services.yaml"].map(|f| dir().join(f));
    let out = std::process::Command::new(&bin).arg("--strict").args(&files).output().expect("run kubernetes-validate");
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "kubernetes-validate refused the manifests:\n{said}");
}

/// The v1 fields the InferencePool, Gateway and HTTPRoute may carry, and
/// their types: nothing unknown, nothing required missing.
#[test]
fn the_inference_pool_gateway_and_route_hold_to_their_v1_apis() {
    let docs = documents();
    let only = |v: &Value, allowed: &[&str], what: &str| {
        for k in v.as_mapping().unwrap_or_else(|| panic!("{what}: not a mapping")).keys() {
            let k = k.as_str().unwrap_or("");
            assert!(allowed.contains(&k), "{what}: `{k}` is not a field of the v1 API");
        }
    };
    let pool = find(&docs, "InferencePool");
    assert_eq!(pool["apiVersion"].as_str(), Some("inference.networking.k8s.io/v1"));
    let spec = &pool["spec"];
    only(spec, &["selector", "targetPorts", "endpointPickerRef"], "InferencePool.spec");
    only(&spec["selector"], &["matchLabels"], "spec.selector");
    assert!(spec["selector"]["matchLabels"].as_mapping().is_some_and(|m| !m.is_empty()));
    let targets = spec["targetPorts"].as_sequence().expect("targetPorts");
    assert_eq!(targets.len(), 1, "v1 takes exactly one target port");
    port(&targets[0]["number"]);
    let epp = &spec["endpointPickerRef"];
    only(epp, &["group", "kind", "name", "port", "failureMode"], "spec.endpointPickerRef");
    assert!(epp["name"].as_str().is_some_and(|n| !n.is_empty()));
    assert!(matches!(epp["kind"].as_str(), None | Some("Service")));
    assert!(matches!(epp["failureMode"].as_str(), None | Some("FailOpen") | Some("FailClose")));
    only(&epp["port"], &["number"], "endpointPickerRef.port");
    port(&epp["port"]["number"]);

    let gw = find(&docs, "Gateway");
    assert_eq!(gw["apiVersion"].as_str(), Some("gateway.networking.k8s.io/v1"));
    only(&gw["spec"], &["gatewayClassName", "listeners", "addresses", "infrastructure"], "Gateway.spec");
    for l in gw["spec"]["listeners"].as_sequence().expect("listeners") {
        only(l, &["name", "hostname", "port", "protocol", "tls", "allowedRoutes"], "Gateway listener");
        port(&l["port"]);
        assert!(matches!(l["protocol"].as_str(), Some("HTTP" | "HTTPS")));
    }
    let route = find(&docs, "HTTPRoute");
    assert_eq!(route["apiVersion"].as_str(), Some("gateway.networking.k8s.io/v1"));
    only(&route["spec"], &["parentRefs", "hostnames", "rules"], "HTTPRoute.spec");
    for r in route["spec"]["rules"].as_sequence().expect("rules") {
        only(r, &["name", "matches", "filters", "backendRefs", "timeouts", "retry", "sessionPersistence"], "HTTPRoute rule");
        for b in r["backendRefs"].as_sequence().expect("backendRefs") {
            only(b, &["group", "kind", "name", "namespace", "port", "weight", "filters"], "backendRef");
        }
    }
}

/// The route sends to the pool, the pool names the picker's Service and
/// port, that port is the picker's container port and `epp.listen` in the
/// config it carries (a valid config, the picker alone), the pool's
/// selector and target port are the headless Service's, whose name the
/// config resolves, and the probes ask gRPC health for what slogate serves.
#[test]
fn the_pieces_agree_with_each_other_and_with_the_config() {
    let docs = documents();
    let pool = find(&docs, "InferencePool");
    let route = find(&docs, "HTTPRoute");
    let backend = &route["spec"]["rules"][0]["backendRefs"][0];
    assert_eq!((backend["kind"].as_str(), backend["name"].as_str()), (Some("InferencePool"), pool["metadata"]["name"].as_str()));
    assert_eq!(route["spec"]["parentRefs"][0]["name"], find(&docs, "Gateway")["metadata"]["name"]);
    let epp = &pool["spec"]["endpointPickerRef"];
    let services: Vec<&Value> = docs.iter().filter(|v| v["kind"].as_str() == Some("Service")).collect();
    let picker = services.iter().find(|s| s["metadata"]["name"] == epp["name"]).expect("the picker's Service");
    let svc_port =
        picker["spec"]["ports"].as_sequence().expect("ports").iter().find(|p| p["port"] == epp["port"]["number"]).expect("the port");
    let deployment = find(&docs, "Deployment");
    let container = &deployment["spec"]["template"]["spec"]["containers"][0];
    let grpc = container["ports"].as_sequence().expect("ports").iter().find(|p| p["name"] == svc_port["targetPort"]).expect("named port");
    let config_text = find(&docs, "ConfigMap")["data"]["slogate.yaml"].as_str().expect("slogate.yaml");
    let config = Config::parse(config_text).unwrap_or_else(|e| panic!("the ConfigMap's slogate.yaml is not a valid config:\n{e}"));
    let listen = config.epp.as_ref().expect("epp").listen;
    assert_eq!(u64::from(listen.port()), port(&grpc["containerPort"]), "epp.listen is the container's gRPC port");
    assert!(!config.epp.as_ref().expect("epp").proxy, "the picker alone");
    for probe in ["readinessProbe", "livenessProbe"] {
        assert_eq!(container[probe]["grpc"]["port"], grpc["containerPort"], "{probe}");
    }
    assert_eq!(container["readinessProbe"]["grpc"]["service"].as_str(), Some("readiness"));
    assert_eq!(container["livenessProbe"]["grpc"]["service"].as_str(), Some("liveness"));
    let headless = services.iter().find(|s| s["spec"]["clusterIP"].as_str() == Some("None")).expect("a headless Service");
    assert_eq!(headless["spec"]["selector"], pool["spec"]["selector"]["matchLabels"], "the pool's pods are the Service's");
    assert_eq!(headless["spec"]["ports"][0]["port"], pool["spec"]["targetPorts"][0]["number"]);
    let dns = config.pools[0].replicas_dns.as_ref().expect("replicas_dns");
    let (host, p) = slogate::config::parse_host_port(&dns.name).expect("host:port");
    assert!(host.starts_with(&format!("{}.", headless["metadata"]["name"].as_str().expect("name"))), "{host}");
    assert_eq!(Some(u64::from(p)), pool["spec"]["targetPorts"][0]["number"].as_u64());
}
