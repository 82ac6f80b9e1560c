//! The simulator's API checked by the real OpenAI Python SDK (installed into
//! the workspace `.venv` by scripts/setup-test-deps).

use std::net::SocketAddr;
use std::path::PathBuf;

use loadtest::sim::{Profile, SimServer};

pub fn python() -> PathBuf {
    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/python");
    assert!(py.is_file(), "{} missing: run scripts/setup-test-deps (creates .venv with the openai package)", py.display());
    py
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simulator_speaks_the_openai_api_as_the_sdk_expects() {
    let sim = SimServer::start(Profile::Llama8bH100.config(), SocketAddr::from(([127, 0, 0, 1], 0))).await.expect("sim");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/openai_check.py");
    let out = tokio::process::Command::new(python()).arg(script).arg(sim.url()).arg("sim-llama-8b").output().await.expect("run python");
    assert!(
        out.status.success(),
        "OpenAI SDK check failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("openai sdk: ok"));
}
