//! Replicas found in DNS (`pools[].replicas_dns`): the addresses a name
//! has now, as the replica URLs of the pool.

use std::net::IpAddr;
use std::time::Duration;

use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::Resolver;

use crate::config::ReplicasDns;

/// How long one lookup may take.
const LOOKUP: Duration = Duration::from_secs(3);

/// The replica URLs `dns` names now (`scheme://ip:port`, sorted), or why
/// not. Asked afresh each time: nothing is cached past the records' life.
pub(crate) async fn replica_urls(dns: &ReplicasDns, scheme: &str) -> Result<Vec<String>, String> {
    let (host, port) = crate::config::parse_host_port(&dns.name)?;
    let mut opts = ResolverOpts::default();
    opts.cache_size = 0;
    opts.timeout = LOOKUP;
    let builder = match dns.nameserver {
        Some(server) => {
            let mut ns = NameServerConfig::udp_and_tcp(server.ip());
            for c in &mut ns.connections {
                c.port = server.port();
            }
            Resolver::builder_with_config(ResolverConfig::from_name_servers(vec![ns]), TokioRuntimeProvider::default())
        }
        None => Resolver::builder_tokio().map_err(|e| format!("the system's resolver: {e}"))?,
    };
    let resolver = builder.with_options(opts).build().map_err(|e| format!("the resolver: {e}"))?;
    let found = tokio::time::timeout(LOOKUP * 2, resolver.lookup_ip(host.as_str())).await;
    let ips: Vec<IpAddr> = match found {
        Ok(Ok(l)) => l.iter().collect(),
        Ok(Err(e)) => return Err(format!("{host}: {e}")),
        Err(_) => return Err(format!("{host}: no answer in time")),
    };
    let mut urls: Vec<String> = ips
        .into_iter()
        .map(|ip| match ip {
            IpAddr::V4(v4) => format!("{scheme}://{v4}:{port}"),
            IpAddr::V6(v6) => format!("{scheme}://[{v6}]:{port}"),
        })
        .collect();
    urls.sort();
    urls.dedup();
    Ok(urls)
}
