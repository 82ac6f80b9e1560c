//! `--keys-from URL`: the keys and teams of a running LiteLLM proxy,
//! through its own API (`/key/list?return_full_object=true`, page by
//! page, and `/team/list`), with its master key.

use http_body_util::{BodyExt, Empty};
use serde_json::Value;

/// Keys asked per page.
const PAGE: u32 = 100;
/// Pages read at most (a proxy that keeps answering does not hold the import).
const MAX_PAGES: u32 = 10_000;

/// Every key row, and the teams.
pub(super) async fn keys_and_teams(base: &str, master: &str) -> Result<(Vec<Value>, Vec<Value>), String> {
    let base = base.trim_end_matches('/');
    let mut keys = Vec::new();
    let mut page = 1;
    loop {
        let url = format!("{base}/key/list?return_full_object=true&include_team_keys=true&page={page}&size={PAGE}");
        let answer = get(&url, master).await?;
        keys.extend(super::keys::rows_of(&answer).map_err(|e| format!("{url}: {e}"))?);
        let pages = answer.get("total_pages").and_then(Value::as_u64).unwrap_or(1);
        if u64::from(page) >= pages || page >= MAX_PAGES {
            break;
        }
        page += 1;
    }
    let teams = super::keys::teams_of(&get(&format!("{base}/team/list"), master).await?)?;
    Ok((keys, teams))
}

/// GET `url` (plain HTTP) with the master key; its JSON answer.
async fn get(url: &str, master: &str) -> Result<Value, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    if uri.scheme_str() != Some("http") {
        return Err(format!("{url}: --keys-from takes an http:// URL (reach an https proxy through a local port-forward)"));
    }
    let host = uri.host().ok_or_else(|| format!("{url}: no host"))?;
    let port = uri.port_u16().unwrap_or(80);
    let tcp = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| format!("{url}: cannot connect: {e}"))?;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await.map_err(|e| format!("{url}: {e}"))?;
    tokio::spawn(conn);
    let authority = uri.authority().map(|a| a.to_string()).unwrap_or_default();
    let req = http::Request::get(uri.path_and_query().map_or("/", |p| p.as_str()))
        .header(http::header::HOST, authority)
        .header(http::header::AUTHORIZATION, format!("Bearer {master}"))
        .body(Empty::<bytes::Bytes>::new())
        .map_err(|e| format!("{url}: {e}"))?;
    let resp = send.send_request(req).await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.map_err(|e| format!("{url}: {e}"))?.to_bytes();
    if !status.is_success() {
        return Err(format!("{url}: {status}: {}", String::from_utf8_lossy(&body[..body.len().min(300)])));
    }
    serde_json::from_slice(&body).map_err(|e| format!("{url}: not JSON: {e}"))
}
