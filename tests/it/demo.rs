//! `slogate demo` as a user runs it: the real binary, its printed address,
//! and the real OpenAI SDK streaming through the gateway.

use std::path::PathBuf;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn demo_serves_the_openai_sdk_through_the_gateway_and_stops_on_sigterm() {
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_slogate"))
        .args(["demo", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn slogate demo");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), lines.next_line())
        .await
        .expect("demo starts")
        .expect("read")
        .expect("a line");
    let url = first.split_whitespace().find(|w| w.starts_with("http://")).expect("gateway URL in the first line").to_string();
    let mut rest = Vec::new();
    while let Ok(Ok(Some(l))) = tokio::time::timeout(std::time::Duration::from_secs(5), lines.next_line()).await {
        let done = l.starts_with("Ctrl-C");
        rest.push(l);
        if done {
            break;
        }
    }
    assert!(rest.iter().any(|l| l.contains("curl -N")), "demo tells the user what to run next: {rest:?}");
    let admin =
        rest.iter().find_map(|l| l.strip_prefix("admin: ")).and_then(|l| l.split_whitespace().next()).expect("admin URL").to_string();

    let py = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(py.is_file(), "{} missing: run scripts/setup-test-deps", py.display());
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("loadtest/tests/openai_check.py");
    let out = tokio::process::Command::new(py).arg(script).arg(&url).arg("sim-llama-8b").output().await.expect("python");
    assert!(
        out.status.success(),
        "OpenAI SDK through the gateway:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );

    // The gateway measured those requests.
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<http_body_util::Full<bytes::Bytes>>();
    let resp = client.get(admin.parse().expect("uri")).await.expect("metrics");
    let text = String::from_utf8_lossy(&http_body_util::BodyExt::collect(resp.into_body()).await.expect("body").to_bytes()).into_owned();
    let ttfts = crate::common::metric(&text, "slogate_time_to_first_token_seconds_count", &[("model", "sim-llama-8b"), ("class", "chat")]);
    assert_eq!(ttfts, Some(3.0), "{text}");

    let pid = child.id().expect("pid") as i32;
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status().expect("kill");
    assert!(status.success());
    let exit = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait()).await.expect("exits after SIGTERM").expect("wait");
    assert!(exit.success(), "exit code 0 after SIGTERM: {exit:?}");
}
