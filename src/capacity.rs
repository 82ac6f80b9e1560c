//! Capacity planning: how many replicas a target request rate
//! needs for a class to hold its TTFT P99.
//!
//! `replicas = ceil(rate / (utilisation_ceiling / service_time))`, with the
//! utilisation ceilings an M/M/c-style queue allows for P99 TTFT targets (300 ms: 63 %, 400 ms:
//! 70 %, 500 ms: 75 %; linear between, extended with the same slope and
//! clamped to 30-85 % outside). Assumptions, stated with every answer:
//! the workload is prefill-bound (the prefill-bound model), a replica's service
//! time is the measured median TTFT of the class (prefill plus the
//! replica's own queueing at the load it was measured at, so measure at
//! moderate load), arrivals are Poisson, and classes are sized
//! independently (add the replicas of the classes a pool serves).

use serde::Serialize;

/// What was measured for one class.
#[derive(Debug, Clone, Serialize)]
pub struct Measured {
    pub class: String,
    pub ttft_target_ms: f64,
    /// Median TTFT, the service-time estimate.
    pub service_time_ms: f64,
    /// Requests per second seen while measuring.
    pub observed_rps: f64,
    /// Requests behind the estimate.
    pub samples: u64,
}

/// The answer for one class.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Estimate {
    pub class: String,
    pub target_rps: f64,
    pub ttft_target_ms: f64,
    pub service_time_ms: f64,
    pub utilisation_ceiling: f64,
    pub per_replica_rps: f64,
    /// `None` when there is no service-time measurement yet.
    pub replicas_needed: Option<u64>,
    pub samples: u64,
}

pub const ASSUMPTIONS: &str = "replicas = ceil(rate / (ceiling / service_time)). Prefill-bound workload; service time = the class's \
median TTFT as measured (measure at moderate load: at saturation it includes queueing); utilisation ceiling from the TTFT P99 target \
(300 ms: 63 %, 400 ms: 70 %, 500 ms: 75 %, linear between, clamped to 30-85 %); Poisson arrivals; classes sized independently.";

/// The utilisation ceiling for a TTFT P99 target.
pub fn utilisation_ceiling(ttft_target_ms: f64) -> f64 {
    let pts = [(300.0, 0.63), (400.0, 0.70), (500.0, 0.75)];
    let c = if ttft_target_ms <= 300.0 {
        0.63 - (300.0 - ttft_target_ms) * 0.0007
    } else if ttft_target_ms <= 400.0 {
        pts[0].1 + (ttft_target_ms - 300.0) / 100.0 * (pts[1].1 - pts[0].1)
    } else if ttft_target_ms <= 500.0 {
        pts[1].1 + (ttft_target_ms - 400.0) / 100.0 * (pts[2].1 - pts[1].1)
    } else {
        0.75 + (ttft_target_ms - 500.0) * 0.0005
    };
    c.clamp(0.30, 0.85)
}

/// How many replicas `target_rps` of class `m` needs.
pub fn estimate(m: &Measured, target_rps: f64) -> Estimate {
    let ceiling = utilisation_ceiling(m.ttft_target_ms);
    let service_s = m.service_time_ms / 1000.0;
    let per_replica = if service_s > 0.0 { ceiling / service_s } else { 0.0 };
    let replicas_needed = (per_replica > 0.0).then(|| ((target_rps / per_replica).ceil() as u64).max(1));
    Estimate {
        class: m.class.clone(),
        target_rps,
        ttft_target_ms: m.ttft_target_ms,
        service_time_ms: m.service_time_ms,
        utilisation_ceiling: ceiling,
        per_replica_rps: per_replica,
        replicas_needed,
        samples: m.samples,
    }
}

/// Parse `chat=100,batch=20` (or repeated `CLASS=RPS` items) into target rates.
pub fn parse_rates<'a>(items: impl IntoIterator<Item = &'a str>) -> Result<Vec<(String, f64)>, String> {
    let mut out = Vec::new();
    for item in items.into_iter().flat_map(|s| s.split(',')).map(str::trim).filter(|s| !s.is_empty()) {
        let (class, rate) = item.split_once('=').ok_or_else(|| format!("`{item}`: write CLASS=REQUESTS_PER_SECOND, e.g. chat=100"))?;
        let rate: f64 = rate.trim().parse().map_err(|e| format!("`{item}`: {e}"))?;
        if !(rate.is_finite() && rate >= 0.0) {
            return Err(format!("`{item}`: the rate must be a number of requests per second >= 0"));
        }
        out.push((class.trim().to_string(), rate));
    }
    Ok(out)
}

/// Estimates for every measured class: at its target rate if one is given,
/// else at the rate observed.
pub fn plan(measured: &[Measured], rates: &[(String, f64)]) -> Vec<Estimate> {
    measured
        .iter()
        .map(|m| {
            let rate = rates.iter().find(|(c, _)| *c == m.class).map(|(_, r)| *r).unwrap_or(m.observed_rps);
            estimate(m, rate)
        })
        .collect()
}

/// Measured service times from a loadgen result (its JSON): per class, the
/// median TTFT of completed requests and the rate over the measured window.
pub fn from_loadgen(result: &serde_json::Value, targets_ms: &dyn Fn(&str) -> Option<f64>) -> Result<Vec<Measured>, String> {
    let records = result.get("records").and_then(|r| r.as_array()).ok_or("not a loadgen result: no `records`")?;
    let elapsed = result.get("elapsed_s").and_then(|v| v.as_f64()).unwrap_or(0.0);
    let mut by_class: indexmap::IndexMap<String, (Vec<f64>, u64)> = indexmap::IndexMap::new();
    for r in records {
        let class = r.get("class").and_then(|v| v.as_str()).unwrap_or("default").to_string();
        let e = by_class.entry(class).or_default();
        e.1 += 1;
        let done = matches!(r.get("outcome").and_then(|v| v.as_str()), Some("ok" | "length"));
        if let (true, Some(t)) = (done, r.get("ttft_ms").and_then(|v| v.as_f64())) {
            e.0.push(t);
        }
    }
    let mut out = Vec::new();
    for (class, (mut ttfts, n)) in by_class {
        ttfts.sort_by(f64::total_cmp);
        let median = if ttfts.is_empty() { 0.0 } else { ttfts[ttfts.len() / 2] };
        let target = targets_ms(&class).or_else(|| result.pointer(&format!("/scenario/classes/{class}/ttft_ms")).and_then(|v| v.as_f64()));
        out.push(Measured {
            ttft_target_ms: target.unwrap_or(300.0),
            class,
            service_time_ms: median,
            observed_rps: if elapsed > 0.0 { n as f64 / elapsed } else { 0.0 },
            samples: ttfts.len() as u64,
        });
    }
    Ok(out)
}

/// A plain-text table of estimates.
pub fn table(estimates: &[Estimate]) -> String {
    let mut s = String::from("class        target req/s  TTFT target ms  service ms  ceiling  req/s per replica  replicas needed\n");
    for e in estimates {
        s.push_str(&format!(
            "{:<12} {:>12.2}  {:>14.0}  {:>10.1}  {:>6.0} %  {:>17.2}  {:>15}\n",
            e.class,
            e.target_rps,
            e.ttft_target_ms,
            e.service_time_ms,
            e.utilisation_ceiling * 100.0,
            e.per_replica_rps,
            e.replicas_needed.map(|n| n.to_string()).unwrap_or_else(|| "no data".into())
        ));
    }
    s.push_str(&format!("\n{ASSUMPTIONS}\n"));
    s
}

/// What a running gateway has measured: per class, the rolling median TTFT
/// and the rate of counted requests over the last five minutes.
pub(crate) fn measure(app: &crate::state::App) -> Vec<Measured> {
    let snap = app.snapshot();
    let now = tokio::time::Instant::now();
    let span = std::time::Duration::from_secs(300);
    snap.classifier
        .classes()
        .iter()
        .map(|c| {
            let v = c.control.view();
            let counts = c.control.budget.counts(now, span);
            let uptime = c.control.budget.uptime(now).as_secs_f64().clamp(1.0, span.as_secs_f64());
            Measured {
                class: c.name.to_string(),
                ttft_target_ms: c.ttft.as_secs_f64() * 1000.0,
                service_time_ms: v.ttft.p50.as_secs_f64() * 1000.0,
                observed_rps: counts.avail_valid as f64 / uptime,
                samples: v.ttft.count,
            }
        })
        .collect()
}

/// Estimates from a running gateway's admin listener (`GET /capacity`),
/// fetched with the same client code that talks to replicas; `token`: the
/// admin token, when the gateway requires one.
pub async fn from_gateway(admin_url: &str, rates: &[(String, f64)], token: Option<&str>) -> Result<Vec<Estimate>, String> {
    let authorization = match token {
        None => None,
        Some(t) => Some(
            http::HeaderValue::from_str(&format!("Bearer {}", t.trim()))
                .map_err(|_| "the admin token holds characters a header cannot carry".to_string())?,
        ),
    };
    let base: http::Uri = admin_url.parse().map_err(|e| format!("{admin_url}: {e}"))?;
    let query: Vec<String> = rates.iter().map(|(c, r)| format!("rate={c}={r}")).collect();
    let path = format!("/capacity?{}", query.join("&"));
    let url = format!("{}{path}", admin_url.trim_end_matches('/'));
    let (status, body) = crate::upstream::conn::get_once(&base, &path, authorization.as_ref(), std::time::Duration::from_secs(10))
        .await
        .map_err(|e| format!("{admin_url}: {e}"))?;
    if !status.is_success() {
        return Err(format!("{url}: {status}: {}", String::from_utf8_lossy(&body)));
    }
    let v: serde_json::Value = serde_json::from_slice(&body).map_err(|e| format!("{url}: {e}"))?;
    serde_json::from_value(v["estimates"].clone()).map_err(|e| format!("{url}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_formula_worked_example() {
        // 1,000 RPS, 40 ms average service time, 400 ms target (70 %): 58 instances.
        let m = Measured { class: "rag".into(), ttft_target_ms: 400.0, service_time_ms: 40.0, observed_rps: 0.0, samples: 100 };
        let e = estimate(&m, 1000.0);
        assert!((e.per_replica_rps - 17.5).abs() < 1e-9);
        assert_eq!(e.replicas_needed, Some(58));
    }

    #[test]
    fn ceilings_follow_the_published_curve_and_stay_bounded() {
        assert!((utilisation_ceiling(300.0) - 0.63).abs() < 1e-9);
        assert!((utilisation_ceiling(400.0) - 0.70).abs() < 1e-9);
        assert!((utilisation_ceiling(500.0) - 0.75).abs() < 1e-9);
        assert!(utilisation_ceiling(100.0) < 0.63 && utilisation_ceiling(100.0) >= 0.30);
        assert!(utilisation_ceiling(3000.0) <= 0.85);
        assert!(utilisation_ceiling(350.0) > 0.63 && utilisation_ceiling(350.0) < 0.70);
    }

    #[test]
    fn rates_parse_or_say_why() {
        assert_eq!(parse_rates(["chat=100,batch=2.5"]).expect("ok"), vec![("chat".into(), 100.0), ("batch".into(), 2.5)]);
        assert!(parse_rates(["chat"]).unwrap_err().contains("CLASS=REQUESTS_PER_SECOND"));
        assert!(parse_rates(["chat=-1"]).is_err());
    }

    #[test]
    fn no_measurement_no_number() {
        let m = Measured { class: "voice".into(), ttft_target_ms: 150.0, service_time_ms: 0.0, observed_rps: 0.0, samples: 0 };
        assert_eq!(estimate(&m, 10.0).replicas_needed, None);
    }
}
