//! `bench timeline`: sample a running gateway's admission state over time,
//! and switch simulator faults at given offsets, for the benchmarks that
//! chart what the gateway saw (admission, learned limits).
//!
//! Every 250 ms it reads the admin `/metrics` and writes one CSV row: `t`
//! (seconds since start), `ttft_p99_ms`, `breaker_state` (0 closed, 1
//! half-open, 2 open), `reduction_active`, `queue_interactive`,
//! `queue_batch`, `replica_limits` (the sum of `slogate_replica_limit`
//! over the replicas), `replica_slots` (the sum of `slogate_replica_slots`:
//! this instance's part in a fleet; nan alone), `batch_cut`, `inflight`,
//! `seats_interactive`, `seats_batch`, `seats_reserved`. A fault is POSTed
//! to the simulator's `/admin/faults` at its offset and logged to stderr
//! as `fault T URL JSON`. Loopback only; stops by itself.

use std::io::Write as _;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;

/// A fault to switch: at `at` seconds, POST `body` to `url`/admin/faults.
#[derive(Clone, Debug)]
pub struct Fault {
    pub at: f64,
    pub url: String,
    pub body: String,
}

impl std::str::FromStr for Fault {
    type Err = String;
    /// `SECONDS=SIM_URL=JSON`.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut parts = s.splitn(3, '=');
        let (Some(at), Some(url), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(format!("fault {s:?}: SECONDS=SIM_URL=JSON"));
        };
        let at = at.parse().map_err(|_| format!("fault {s:?}: {at:?} is not seconds"))?;
        Ok(Fault { at, url: loopback(url)?, body: body.to_string() })
    }
}

/// `url` without its trailing slash, if its host is this machine.
pub fn loopback(url: &str) -> Result<String, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("{url}: {e}"))?;
    let host = uri.host().unwrap_or("").trim_matches(['[', ']']);
    if host == "localhost" || host.starts_with("127.") || host == "::1" {
        Ok(url.trim_end_matches('/').to_string())
    } else {
        Err(format!("{url}: loopback only"))
    }
}

/// The value of series `name{labels}` (the labels exactly as written); NaN without it.
fn metric(text: &str, name: &str, labels: &str) -> f64 {
    let head = format!("{name}{{{labels}}} ");
    text.lines().find_map(|l| l.strip_prefix(&head)).and_then(|v| v.trim().parse().ok()).unwrap_or(f64::NAN)
}

/// The sum of `name`'s series whose labels contain `having`.
fn metric_sum(text: &str, name: &str, having: &str) -> f64 {
    text.lines()
        .filter_map(|l| l.strip_prefix(name)?.strip_prefix('{'))
        .filter_map(|rest| rest.split_once("} "))
        .filter(|(labels, _)| labels.contains(having))
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .fold(0.0, |a, b| a + b) // from +0: an empty sum prints 0, not -0
}

/// The CSV header of a timeline.
pub const HEADER: &str = "t,ttft_p99_ms,breaker_state,reduction_active,queue_interactive,queue_batch,replica_limits,replica_slots,batch_cut,inflight,seats_interactive,seats_batch,seats_reserved";

/// One row from a scrape at `t` seconds, for `class`.
pub fn row(text: &str, t: f64, class: &str) -> String {
    let c = format!("class=\"{class}\"");
    let slots = if text.contains("slogate_replica_slots{") { metric_sum(text, "slogate_replica_slots", "") } else { f64::NAN };
    let values = [
        t,
        metric(text, "slogate_ttft_p99_seconds", &c) * 1000.0,
        metric(text, "slogate_breaker_state", &c),
        metric(text, "slogate_context_reduction_active", &c),
        metric(text, "slogate_queue_depth", "tier=\"interactive\""),
        metric(text, "slogate_queue_depth", "tier=\"batch\""),
        metric_sum(text, "slogate_replica_limit", ""),
        slots,
        metric_sum(text, "slogate_replica_batch_cut", ""),
        metric_sum(text, "slogate_inflight_requests", ""),
        metric_sum(text, "slogate_pool_seats", "tier=\"interactive\""),
        metric_sum(text, "slogate_pool_seats", "tier=\"batch\""),
        metric_sum(text, "slogate_pool_reserved_seats", ""),
    ];
    values.iter().map(|v| super::report::out::n(*v, 3)).collect::<Vec<_>>().join(",")
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

async fn send(client: &HttpClient, req: http::Request<Full<Bytes>>) -> Result<String, String> {
    let call = async {
        let resp = client.request(req).await.map_err(|e| e.to_string())?;
        let body = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        Ok::<_, String>(String::from_utf8_lossy(&body).into_owned())
    };
    tokio::time::timeout(Duration::from_secs(5), call).await.map_err(|_| "timed out".to_string())?
}

/// Samples `admin` for `duration` seconds into `out`, switching `faults`.
pub fn run(admin: &str, class: &str, duration: f64, out: &Path, mut faults: Vec<Fault>) -> Result<(), String> {
    let admin = loopback(admin)?;
    faults.sort_by(|a, b| a.at.total_cmp(&b.at));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let mut file = std::fs::File::create(out).map_err(|e| format!("{}: {e}", out.display()))?;
    writeln!(file, "{HEADER}").map_err(|e| e.to_string())?;
    rt.block_on(async {
        let client: HttpClient = Client::builder(TokioExecutor::new()).build_http();
        let start = tokio::time::Instant::now();
        let step = Duration::from_millis(250);
        let mut faults = faults.into_iter().peekable();
        for n in 1u32.. {
            let now = start.elapsed().as_secs_f64();
            if now > duration {
                break;
            }
            while let Some(f) = faults.next_if(|f| f.at <= now) {
                let req = http::Request::post(format!("{}/admin/faults", f.url))
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from(f.body.clone())))
                    .map_err(|e| e.to_string())?;
                send(&client, req).await.map_err(|e| format!("fault {}: {e}", f.url))?;
                eprintln!("fault {now:.3} {} {}", f.url, f.body);
            }
            let req = http::Request::get(format!("{admin}/metrics")).body(Full::new(Bytes::new())).map_err(|e| e.to_string())?;
            match send(&client, req).await {
                Ok(text) => writeln!(file, "{}", row(&text, now, class)).map_err(|e| e.to_string())?,
                Err(e) => eprintln!("timeline: {e}"),
            }
            tokio::time::sleep_until(start + step * n).await;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row reads each series by its exact labels or sums them, and a
    /// gateway alone (no `slogate_replica_slots`) has no slots: nan.
    #[test]
    fn a_scrape_becomes_a_row() {
        let text = "slogate_ttft_p99_seconds{class=\"chat\"} 0.25\nslogate_ttft_p99_seconds{class=\"batch\"} 9\n\
slogate_breaker_state{class=\"chat\"} 2\nslogate_queue_depth{tier=\"interactive\"} 3\n\
slogate_replica_limit{pool=\"p\",replica=\"a\"} 64\nslogate_replica_limit{pool=\"p\",replica=\"b\"} 32\n\
slogate_pool_seats{pool=\"p\",tier=\"interactive\"} 5\nslogate_pool_seats{pool=\"p\",tier=\"batch\"} 7\n";
        let r = row(text, 1.5, "chat");
        assert_eq!(r, "1.500,250.000,2.000,nan,3.000,nan,96.000,nan,0.000,0.000,5.000,7.000,0.000");
        let with_slots = format!("{text}slogate_replica_slots{{pool=\"p\",replica=\"a\"}} 20\n");
        assert!(row(&with_slots, 0.0, "chat").contains(",96.000,20.000,"));
    }

    #[test]
    fn only_loopback_is_sampled() {
        assert_eq!(loopback("http://127.0.0.1:9000/").as_deref(), Ok("http://127.0.0.1:9000"));
        assert!(loopback("http://example.com:9000").is_err());
        let f: Fault = "25=http://127.0.0.1:8001={\"slowdown\": 8}".parse().expect("a fault");
        assert_eq!((f.at, f.url.as_str(), f.body.as_str()), (25.0, "http://127.0.0.1:8001", "{\"slowdown\": 8}"));
    }
}
