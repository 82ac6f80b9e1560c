//! Replicas found in DNS (`pools[].replicas_dns`): a DNS server of the
//! test's own names the replicas; the pool follows its answers, probing
//! the new before they serve and draining the gone, within two periods of
//! the change, and no request fails.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use http_body_util::BodyExt;
use loadtest::sim::{SimConfig, SimServer};

use crate::common::*;

/// A DNS server on loopback answering every A query with the IPv4
/// addresses of `ips`, every AAAA query with the IPv6 ones (TTL 0), and
/// any other query with no records.
struct Dns {
    addr: SocketAddr,
    ips: Arc<Mutex<Vec<IpAddr>>>,
    /// The A queries answered so far (one per lookup of the gateway's).
    lookups: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Dns {
    async fn start(ips: &[IpAddr]) -> Dns {
        let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.expect("bind");
        let addr = socket.local_addr().expect("addr");
        let shared = Arc::new(Mutex::new(ips.to_vec()));
        let (answers, lookups) = (shared.clone(), Arc::new(AtomicUsize::new(0)));
        let counted = lookups.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                let reply = answer(&buf[..n], &answers.lock().expect("lock"));
                if let Some((reply, a)) = reply {
                    if a {
                        counted.fetch_add(1, Ordering::SeqCst);
                    }
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Dns { addr, ips: shared, lookups, task }
    }

    /// The lookups answered so far.
    fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }

    fn set(&self, ips: &[IpAddr]) {
        *self.ips.lock().expect("lock") = ips.to_vec();
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reply to query `q`: its question, and a record per address of the
/// family it asks for (A or AAAA), and whether it asked for A.
fn answer(q: &[u8], ips: &[IpAddr]) -> Option<(Vec<u8>, bool)> {
    let mut i = 12;
    while *q.get(i)? != 0 {
        i += usize::from(q[i]) + 1;
    }
    let qtype = u16::from_be_bytes([*q.get(i + 1)?, *q.get(i + 2)?]);
    let end = i + 5;
    let records: Vec<Vec<u8>> = ips
        .iter()
        .filter_map(|ip| match (qtype, ip) {
            (1, IpAddr::V4(v4)) => Some(v4.octets().to_vec()),
            (28, IpAddr::V6(v6)) => Some(v6.octets().to_vec()),
            _ => None,
        })
        .collect();
    let mut r = Vec::new();
    r.extend_from_slice(&q[..2]);
    r.extend_from_slice(&[0x81, 0x80, 0, 1]);
    r.extend_from_slice(&(records.len() as u16).to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 0]);
    r.extend_from_slice(q.get(12..end)?);
    for rdata in records {
        r.extend_from_slice(&[0xc0, 0x0c]);
        r.extend_from_slice(&qtype.to_be_bytes());
        r.extend_from_slice(&[0, 1, 0, 0, 0, 0]);
        r.extend_from_slice(&(rdata.len() as u16).to_be_bytes());
        r.extend_from_slice(&rdata);
    }
    Some((r, qtype == 1))
}

/// How many requests simulator `s` finished (its `vllm:request_success_total`).
async fn served(s: &SimServer) -> f64 {
    let addr: SocketAddr = s.url().trim_start_matches("http://").trim_end_matches('/').parse().expect("addr");
    let text = get(addr, "/metrics").await.1;
    text.lines().filter(|l| l.starts_with("vllm:request_success_total")).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

async fn sim(at: SocketAddr) -> SimServer {
    let cfg = SimConfig { step_base_ms: 1.0, decode_per_seq_ms: 0.0, prefill_per_token_ms: 0.0, ..SimConfig::default() };
    SimServer::start(cfg, at).await.expect("simulator")
}

fn port_of(s: &SimServer) -> u16 {
    s.url().rsplit(':').next().and_then(|p| p.trim_end_matches('/').parse().ok()).expect("port")
}

/// A gateway whose pool is the name `replicas.test:PORT` as `dns` answers
/// it, looked up every 500 ms.
async fn following(dns: &Dns, port: u16) -> Gw {
    let model = SimConfig::default().model;
    let gw = gateway_config(&[])
        .models(&[&model])
        .pool(&format!("replicas_dns: {{ name: 'replicas.test:{port}', every: 500ms, nameserver: '{}' }}", dns.addr))
        .start()
        .await;
    gw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_follows_the_replicas_its_dns_name_has() {
    // Two replicas on one port, at two loopback addresses, as pods of a headless Service.
    let (a_ip, b_ip) = (Ipv4Addr::new(127, 0, 0, 2), Ipv4Addr::new(127, 0, 0, 3));
    let a = sim(SocketAddr::from((a_ip, 0))).await;
    let port = port_of(&a);
    let b = sim(SocketAddr::from((b_ip, port))).await;
    let dns = Dns::start(&[a_ip.into()]).await;
    let model = SimConfig::default().model;
    let gw = following(&dns, port).await;
    let admin = gw.admin_addr;
    let healthy = move |ip: Ipv4Addr| async move {
        metric(&get(admin, "/metrics").await.1, "slogate_upstream_healthy", &[("replica", &format!("http://{ip}:{port}"))])
    };
    wait_until("the first replica found and probed", || async { healthy(a_ip).await == Some(1.0) }).await;

    // Requests one after another throughout, none may fail.
    let (stop, failed, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let body = chat_body(false, false).replace("m1", &model);
    let load = {
        let (stop, failed, sent, addr) = (stop.clone(), failed.clone(), sent.clone(), gw.data());
        tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let resp = client().request(post_req(addr, "/v1/chat/completions", &body, &[])).await.expect("response");
                if resp.status() != 200 {
                    failed.fetch_add(1, Ordering::SeqCst);
                }
                resp.into_body().collect().await.expect("body");
                sent.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    // Within two periods of a change: by the second lookup after it (the
    // first may have been answered before it), counted at the DNS server.
    let within_two = |what: &str, asked: usize| {
        let by = dns.lookups() - asked;
        assert!(by <= 2, "{what} by the {by}th lookup after the change");
    };
    // Scaled up: the new address is taken in and probed, then takes requests.
    dns.set(&[a_ip.into(), b_ip.into()]);
    let asked = dns.lookups();
    wait_until("the new replica taken in", || async { healthy(b_ip).await.is_some() }).await;
    within_two("taken in", asked);
    wait_until("the new replica probed", || async { healthy(b_ip).await == Some(1.0) }).await;
    wait_until("the new replica serves", || async { served(&b).await > 0.0 }).await;
    // Scaled down: the gone address is drained and forgotten.
    dns.set(&[b_ip.into()]);
    let asked = dns.lookups();
    wait_until("the gone replica dropped", || async { healthy(a_ip).await.is_none() }).await;
    within_two("drained", asked);
    // The one request in flight there when it went finishes there (drained); none after it goes there.
    let at = sent.load(Ordering::SeqCst);
    wait_until("the request in flight finished", || async { sent.load(Ordering::SeqCst) >= at + 2 }).await;
    let a_served = served(&a).await;
    wait_until("more requests served", || async { sent.load(Ordering::SeqCst) >= at + 12 }).await;
    stop.store(true, Ordering::SeqCst);
    load.await.expect("load");
    assert_eq!(served(&a).await, a_served, "nothing more went to the gone replica");
    assert_eq!(failed.load(Ordering::SeqCst), 0, "no request failed ({} sent)", sent.load(Ordering::SeqCst));
    assert_quiescent(&gw).await;
}

/// A name with IPv6 addresses only (an IPv6 cluster's headless Service):
/// the pool takes them in as `[addr]:port` replicas, which serve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_with_only_aaaa_records_gives_ipv6_replicas() {
    let replica = sim(SocketAddr::from((Ipv6Addr::LOCALHOST, 0))).await;
    let port = port_of(&replica);
    let dns = Dns::start(&[Ipv6Addr::LOCALHOST.into()]).await;
    let model = SimConfig::default().model;
    let gw = following(&dns, port).await;
    let admin = gw.admin_addr;
    let url = format!("http://[::1]:{port}");
    wait_until("the IPv6 replica found and probed", || {
        let url = url.clone();
        async move { metric(&get(admin, "/metrics").await.1, "slogate_upstream_healthy", &[("replica", &url)]) == Some(1.0) }
    })
    .await;
    let body = chat_body(false, false).replace("m1", &model);
    let resp = client().request(post_req(&gw, "/v1/chat/completions", &body, &[])).await.expect("response");
    assert_eq!(resp.status(), 200);
    resp.into_body().collect().await.expect("body");
    assert_eq!(served(&replica).await, 1.0);
    assert_quiescent(&gw).await;
}
