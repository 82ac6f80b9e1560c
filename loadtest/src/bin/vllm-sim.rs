//! `vllm-sim`: run simulated vLLM replicas on loopback.
//!
//! Prints one JSON line per replica (`{"url": ...}`) on stdout once it
//! listens, so scripts can read the ports. Stops on SIGINT/SIGTERM, or when
//! the exit fault is set on any replica.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use loadtest::sim::{FaultConfig, Profile, SimConfig, SimServer};

#[derive(Parser)]
#[command(name = "vllm-sim", about = "A vLLM-faithful simulated replica (vLLM's scheduling's queueing model)")]
struct Args {
    /// Address to bind; port 0 picks a free port. Replica i binds port + i.
    #[arg(long, default_value = "127.0.0.1:8000")]
    listen: SocketAddr,
    /// How many replicas to start.
    #[arg(long, default_value_t = 1)]
    replicas: u16,
    #[arg(long, value_enum, default_value_t = Profile::Llama8bH100)]
    profile: Profile,
    /// A JSON or YAML file with SimConfig fields (over the profile).
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    max_num_seqs: Option<usize>,
    #[arg(long)]
    max_num_batched_tokens: Option<u32>,
    #[arg(long)]
    kv_blocks: Option<u32>,
    #[arg(long)]
    step_base_ms: Option<f64>,
    #[arg(long)]
    decode_per_seq_ms: Option<f64>,
    #[arg(long)]
    prefill_per_token_ms: Option<f64>,
    /// Bound the waiting queue (503 past it).
    #[arg(long)]
    max_waiting: Option<usize>,
    /// `priority` orders the waiting queue by the request's priority field.
    #[arg(long, value_parser = ["fcfs", "priority"])]
    scheduling_policy: Option<String>,
    /// Natural output length as a share of max_tokens, e.g. `0.3,1.0`.
    #[arg(long, value_delimiter = ',', num_args = 2)]
    natural_stop: Option<Vec<f64>>,
    #[arg(long)]
    error_rate: Option<f64>,
    #[arg(long)]
    stream_error_rate: Option<f64>,
    #[arg(long)]
    cut_rate: Option<f64>,
    #[arg(long)]
    slowdown: Option<f64>,
    /// Stamp every streamed chunk with `sim_rx_ns` / `sim_t_ns` (benchmarks:
    /// lets loadgen separate the path's latency from the engine's).
    #[arg(long)]
    stamp_events: bool,
    /// Benchmarks: replica i of N ends its steps i/N of a step after the
    /// others (each on a grid of --step-base-ms), as a fleet's replicas step
    /// at different instants.
    #[arg(long)]
    stagger: bool,
    /// The model's tokenizer.json (its chat template beside it): prompts are
    /// counted, and their blocks named, by the token ids vLLM would compute.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Publish KV events as vLLM's --kv-events-config does (ZMQ PUB,
    /// msgpack batches) on this port of the listen address; 0 picks a free
    /// one. Replica i publishes on port + i. Needs --tokenizer.
    #[arg(long, requires = "tokenizer")]
    kv_events_port: Option<u16>,
    /// The replay socket's port (vLLM's replay_endpoint); replica i: port + i.
    #[arg(long, requires = "kv_events_port")]
    kv_events_replay_port: Option<u16>,
    /// Serve HTTPS with this PEM certificate chain (needs --tls-key).
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
}

/// A TLS acceptor from PEM files.
fn tls_acceptor(cert: &std::path::Path, key: &std::path::Path) -> Result<tokio_rustls::TlsAcceptor, String> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|it| it.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("--tls-cert {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("--tls-key {}: {e}", key.display()))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| format!("--tls-cert: {e}"))?;
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(cfg)))
}

fn load(args: &Args) -> Result<SimConfig, String> {
    let mut cfg = args.profile.config();
    if let Some(path) = &args.config {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let overlay: serde_json::Value = serde_norway::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut base = serde_json::to_value(&cfg).map_err(|e| e.to_string())?;
        if let (Some(b), Some(o)) = (base.as_object_mut(), overlay.as_object()) {
            for (k, v) in o {
                b.insert(k.clone(), v.clone());
            }
        }
        cfg = serde_json::from_value(base).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    macro_rules! set {
        ($($f:ident),*) => { $(if let Some(v) = args.$f.clone() { cfg.$f = v; })* };
    }
    set!(model, max_num_seqs, max_num_batched_tokens, kv_blocks, step_base_ms, decode_per_seq_ms, prefill_per_token_ms);
    if args.max_waiting.is_some() {
        cfg.max_waiting = args.max_waiting;
    }
    if let Some(p) = &args.scheduling_policy {
        cfg.priority_scheduling = p == "priority";
    }
    if args.stamp_events {
        cfg.stamp_events = true;
    }
    if let Some(v) = &args.natural_stop {
        cfg.natural_stop = Some((v[0], v[1]));
    }
    let f: &mut FaultConfig = &mut cfg.faults;
    if let Some(v) = args.error_rate {
        f.error_rate = v;
    }
    if let Some(v) = args.stream_error_rate {
        f.stream_error_rate = v;
    }
    if let Some(v) = args.cut_rate {
        f.cut_rate = v;
    }
    if let Some(v) = args.slowdown {
        f.slowdown = v;
    }
    Ok(cfg)
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let cfg = match load(&args) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vllm-sim: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(c), Some(k)) => match tls_acceptor(c, k) {
            Ok(a) => Some(a),
            Err(e) => {
                eprintln!("vllm-sim: {e}");
                return std::process::ExitCode::from(2);
            }
        },
        _ => None,
    };
    let mut servers = Vec::new();
    for i in 0..args.replicas {
        let mut addr = args.listen;
        if addr.port() != 0 {
            addr.set_port(addr.port() + i);
        }
        let mut cfg = cfg.clone();
        if args.stagger {
            cfg.step_phase = Some(f64::from(i) / f64::from(args.replicas));
        }
        let offset = |p: u16| if p == 0 { 0 } else { p + i };
        cfg.kv_events_port = args.kv_events_port.map(offset);
        cfg.kv_events_replay_port = args.kv_events_replay_port.map(offset);
        if args.tokenizer.is_some() {
            cfg.tokenizer = args.tokenizer.clone();
        }
        match SimServer::start_with_tls(cfg.clone(), addr, tls.clone()).await {
            Ok(s) => {
                let kv = s.kv_events.as_ref();
                let line = serde_json::json!({
                    "url": s.url(),
                    "model": cfg.model,
                    "kv_events": kv.map(|k| k.events.clone()),
                    "kv_events_replay": kv.and_then(|k| k.replay.clone()),
                });
                println!("{line}");
                servers.push(s);
            }
            Err(e) => {
                eprintln!("vllm-sim: cannot listen on {addr}: {e}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    let (tx, mut any_exit) = tokio::sync::mpsc::channel::<()>(1);
    for s in &servers {
        let (tx, mut rx) = (tx.clone(), s.exit_signal());
        tokio::spawn(async move {
            if rx.wait_for(|e| *e).await.is_ok() {
                let _ = tx.send(()).await;
            }
        });
    }
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = any_exit.recv() => {
            eprintln!("vllm-sim: exit fault set; exiting");
            return std::process::ExitCode::from(3);
        }
    }
    std::process::ExitCode::SUCCESS
}
