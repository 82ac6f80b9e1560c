//! The `slogate` command line: serve | check | rules | demo.

#![warn(clippy::too_many_lines)]

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use slogate::config::{Config, LogFormat};
use slogate::Gateway;

#[derive(Parser)]
#[command(
    name = "slogate",
    version,
    about = "OpenAI-compatible streaming gateway for vLLM that measures and acts on TTFT, ITL and availability"
)]
struct Cli {
    /// Log format on stderr (overrides telemetry.log_format).
    #[arg(long, global = true, value_enum)]
    log_format: Option<LogFmt>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum LogFmt {
    Json,
    Text,
}

#[derive(Clone, Copy, ValueEnum)]
enum RulesFormat {
    Prometheus,
    PrometheusOperator,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Config file.
        #[arg(long, default_value = "config/slogate.yaml")]
        config: PathBuf,
    },
    /// The embedded default: the gateway (config/slogate.yaml) in front of
    /// simulated vLLM replicas, with a line telling what to run next.
    /// (Built with the `demo` feature, on by default.)
    #[cfg(feature = "demo")]
    Demo {
        /// Data-plane address.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// Admin address (/metrics, /readyz).
        #[arg(long, default_value = "127.0.0.1:9464")]
        admin_listen: std::net::SocketAddr,
        /// Number of simulated replicas.
        #[arg(long, default_value_t = 2)]
        replicas: u16,
        /// Drive a mixed chat/batch load for this long (e.g. 60s), print the report, and exit.
        #[arg(long, value_parser = humantime::parse_duration)]
        load: Option<std::time::Duration>,
    },
    /// Print Prometheus recording rules and multi-window burn-rate alerts for
    /// every SLO class of the config (a file `promtool check rules` accepts).
    Rules {
        /// Config file.
        #[arg(long, default_value = "config/slogate.yaml")]
        config: PathBuf,
        /// `prometheus` (a rule file) or `prometheus-operator` (a PrometheusRule resource).
        #[arg(long, value_enum, default_value = "prometheus")]
        format: RulesFormat,
    },
    /// How many replicas each class needs for a target rate to hold its TTFT
    /// P99 (the capacity formula), from a running gateway's measurements
    /// (`--from http://ADMIN`) or a loadgen result (`--from result.json`).
    Capacity {
        /// A gateway's admin URL (loopback or not) or a loadgen JSON result.
        #[arg(long)]
        from: String,
        /// Target rate per class, `CLASS=RPS` (repeatable or comma-separated); default: the rate measured.
        #[arg(long = "rate")]
        rates: Vec<String>,
        /// With a loadgen result: take the classes' TTFT targets from this config.
        #[arg(long)]
        config: Option<PathBuf>,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// The environment variable holding the gateway's admin token (its `server.admin_token_env`).
        #[arg(long)]
        admin_token_env: Option<String>,
    },
    /// Validate a config: exit 0, or exit 2 with one line per problem naming the field.
    Check {
        /// Config file.
        #[arg(long)]
        config: PathBuf,
    },
    /// API keys for `auth.keys`.
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Import another gateway's deployment as a slogate config.
    Import {
        #[command(subcommand)]
        from: ImportCommand,
    },
}

#[derive(Subcommand)]
enum ImportCommand {
    /// LiteLLM's proxy: its config.yaml and its virtual keys (hashes kept,
    /// so every client keeps its key) into DIR/slogate.yaml, DIR/keys.yaml
    /// and DIR/report.md (every field not carried, and why).
    Litellm(slogate::import::Options),
}

#[derive(Subcommand)]
enum KeysCommand {
    /// Read a key from standard input (one line; surrounding whitespace is
    /// not part of it) and print its `key_sha256`, so the config never holds the key itself.
    Hash,
}

#[cfg(feature = "heap-profile")]
#[global_allocator]
static ALLOC: dhat::Alloc = dhat::Alloc;

fn main() -> ExitCode {
    // Written when main returns (after a SIGTERM's graceful shutdown).
    #[cfg(feature = "heap-profile")]
    let _heap =
        std::env::var_os("SLOGATE_HEAP_PROFILE").map(|path| dhat::Profiler::builder().file_name(path).trim_backtraces(Some(60)).build());
    // Before any thread allocates: large request bodies reuse pages (server::memory).
    slogate::server::memory::keep_large_buffers(std::env::var_os("GLIBC_TUNABLES").as_deref());
    let cli = Cli::parse();
    match cli.command {
        Command::Keys { command: KeysCommand::Hash } => keys_hash(),
        Command::Import { from: ImportCommand::Litellm(opts) } => match runtime(false) {
            Ok(rt) => printed("slogate import litellm: ", rt.block_on(slogate::import::litellm(&opts)).map(|i| i.summary())),
            Err(code) => code,
        },
        Command::Check { config } => match Config::load(&config) {
            Ok(c) => {
                for w in c.warnings() {
                    eprintln!("warning: {w}");
                }
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                for p in &e.0 {
                    eprintln!("{p}");
                }
                ExitCode::from(2)
            }
        },
        Command::Capacity { from, rates, config, json, admin_token_env } => match runtime(false) {
            Ok(rt) => {
                printed("slogate capacity: ", rt.block_on(capacity(&from, &rates, config.as_deref(), json, admin_token_env.as_deref())))
            }
            Err(code) => code,
        },
        Command::Rules { config, format } => {
            let format = match format {
                RulesFormat::Prometheus => slogate::rules::Format::Prometheus,
                RulesFormat::PrometheusOperator => slogate::rules::Format::PrometheusOperator,
            };
            printed("", Config::load(&config).map_err(|e| e.to_string()).and_then(|c| slogate::rules::render(&c, format)))
        }
        #[cfg(feature = "demo")]
        Command::Demo { listen, admin_listen, replicas, load } => {
            slogate::telemetry::init_logging(matches!(cli.log_format, Some(LogFmt::Json)));
            match runtime(false) {
                Ok(rt) => rt.block_on(demo(listen, admin_listen, replicas, load)),
                Err(code) => code,
            }
        }
        Command::Serve { config } => serve_command(config, cli.log_format),
    }
}

/// Print a command's output, or its error after `prefix` (exit 2).
fn printed(prefix: &str, out: Result<String, String>) -> ExitCode {
    match out {
        Ok(out) => {
            print!("{out}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{prefix}{e}");
            ExitCode::from(2)
        }
    }
}

/// `slogate keys hash`: the SHA-256 of the key on standard input.
fn keys_hash() -> ExitCode {
    let mut key = String::new();
    if let Err(e) = std::io::stdin().read_line(&mut key) {
        eprintln!("slogate keys hash: cannot read standard input: {e}");
        return ExitCode::from(2);
    }
    let key = key.trim();
    if key.is_empty() {
        eprintln!("slogate keys hash: no key on standard input (e.g. `printf %s \"$KEY\" | slogate keys hash`)");
        return ExitCode::from(2);
    }
    println!("{}", slogate::config::key_sha256(key));
    ExitCode::SUCCESS
}

/// `slogate serve`: load the config, set up logging (and tracing), run.
fn serve_command(config: PathBuf, log_format: Option<LogFmt>) -> ExitCode {
    let cfg = match Config::load(&config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{}: invalid config", config.display());
            for p in &e.0 {
                eprintln!("{p}");
            }
            return ExitCode::from(2);
        }
    };
    let json = match log_format {
        Some(LogFmt::Json) => true,
        Some(LogFmt::Text) => false,
        None => cfg.telemetry.log_format == LogFormat::Json,
    };
    // With an OTLP endpoint, spans are exported too; the guard flushes them at exit.
    let _otel = match &cfg.telemetry.otlp_endpoint {
        Some(endpoint) => match slogate::telemetry::otel::init(endpoint, json) {
            Ok(g) => Some(g),
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        },
        None => {
            slogate::telemetry::init_logging(json);
            None
        }
    };
    match runtime(cfg.server.short_sched_slice) {
        Ok(rt) => rt.block_on(serve(cfg, config)),
        Err(code) => code,
    }
}

/// The runtime, with short scheduler slices when the config asks for them.
fn runtime(short_sched_slice: bool) -> Result<tokio::runtime::Runtime, ExitCode> {
    slogate::server::runtime(short_sched_slice).map_err(|e| {
        eprintln!("cannot start the runtime: {e}");
        ExitCode::FAILURE
    })
}

/// The example config, embedded so `slogate demo` needs no files.
#[cfg(feature = "demo")]
const EXAMPLE_CONFIG: &str = include_str!("../config/slogate.yaml");

#[cfg(feature = "demo")]
async fn demo(
    listen: std::net::SocketAddr,
    admin_listen: std::net::SocketAddr,
    replicas: u16,
    load: Option<std::time::Duration>,
) -> ExitCode {
    // Before anything listens: a SIGTERM that comes early must not end the process unhandled.
    let mut signals = match Signals::install() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cfg = match Config::parse(EXAMPLE_CONFIG) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("embedded config is invalid:\n{e}");
            return ExitCode::FAILURE;
        }
    };
    let (sims, sim_cfg) = match demo_replicas(replicas).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cannot start a simulated replica: {e}");
            return ExitCode::FAILURE;
        }
    };
    cfg.pools[0].replicas = sims
        .iter()
        .enumerate()
        .map(|(i, s)| slogate::config::ReplicaConfig { url: s.url(), name: Some(format!("sim-{}", i + 1)), ..Default::default() })
        .collect();
    cfg.server.listen = listen;
    cfg.server.admin_listen = admin_listen;
    let targets = cfg
        .classes
        .iter()
        .map(|(n, c)| {
            (
                n.clone(),
                loadtest::loadgen::scenario::Targets { ttft_ms: c.ttft.get().as_secs_f64() * 1e3, itl_ms: c.itl.get().as_secs_f64() * 1e3 },
            )
        })
        .collect();
    let gw = match Gateway::start(cfg).await {
        Ok(g) => g,
        Err(e) => {
            eprintln!("slogate demo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gw.serves(&sim_cfg.model) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let (data, admin, model) = (gw.data_addr, gw.admin_addr, &sim_cfg.model);
    demo_banner(&gw, &sims, model);
    if let Some(duration) = load {
        let code = demo_load(&format!("http://{data}"), admin, model, duration, targets).await;
        gw.shutdown().await;
        return code;
    }
    println!("Ctrl-C stops.");
    signals.terminated().await;
    gw.shutdown().await;
    drop(sims);
    ExitCode::SUCCESS
}

/// `demo --load`: drive `duration` of mixed load at the gateway on `base`
/// and print the report.
#[cfg(feature = "demo")]
async fn demo_load(
    base: &str,
    admin: std::net::SocketAddr,
    model: &str,
    duration: std::time::Duration,
    targets: std::collections::BTreeMap<String, loadtest::loadgen::scenario::Targets>,
) -> ExitCode {
    let scenario = demo_scenario(base, model, duration, targets);
    println!("driving {duration:?} of mixed load: chat (Poisson, 8 req/s) and batch (bursts of 8, every 2 s on average)");
    match loadtest::loadgen::run(&scenario, "slogate demo", true).await {
        Ok(r) => {
            print!("{}", loadtest::loadgen::report::markdown(&r));
            println!("\ngateway's own view: curl -s http://{admin}/metrics | grep slogate_");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("slogate demo: load failed: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `n` simulated replicas (at least one) of an 8B model on an H100, its
/// prefill chunks capped at 1,024 tokens as a team serving interactive
/// traffic would (a 2,048-token chunk makes a step long enough to break
/// chat's 50 ms ITL target).
#[cfg(feature = "demo")]
async fn demo_replicas(n: u16) -> std::io::Result<(Vec<loadtest::sim::SimServer>, loadtest::sim::SimConfig)> {
    let mut sim_cfg = loadtest::sim::Profile::Llama8bH100.config();
    sim_cfg.max_num_batched_tokens = 1024;
    let mut sims = Vec::new();
    for _ in 0..n.max(1) {
        sims.push(loadtest::sim::SimServer::start(sim_cfg.clone(), std::net::SocketAddr::from(([127, 0, 0, 1], 0))).await?);
    }
    Ok((sims, sim_cfg))
}

/// What the demo runs, and what to try.
#[cfg(feature = "demo")]
fn demo_banner(gw: &Gateway, sims: &[loadtest::sim::SimServer], model: &str) {
    let (data, admin) = (gw.data_addr, gw.admin_addr);
    let urls: Vec<String> = sims.iter().map(|s| s.url()).collect();
    println!("slogate demo: gateway http://{data} in front of {} simulated vLLM replicas of {model} ({})", sims.len(), urls.join(", "));
    println!("admin: http://{admin}/metrics (Prometheus), http://{admin}/readyz");
    println!("try a stream:");
    println!(
        "  curl -N http://{data}/v1/chat/completions -H 'content-type: application/json' -H 'x-slo-class: chat' -d '{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}],\"max_tokens\":32,\"stream\":true}}'"
    );
    println!(
        "  an agent's turns (the Responses API; follow-ups go to the replica that holds their state): curl -s http://{data}/v1/responses -H 'content-type: application/json' -d '{{\"model\":\"{model}\",\"input\":\"Hello\",\"max_output_tokens\":16}}', then again with \"previous_response_id\":\"<its id>\""
    );
    println!(
        "  a coding agent's turn (Anthropic's Messages API): curl -N http://{data}/v1/messages -H 'content-type: application/json' -d '{{\"model\":\"{model}\",\"max_tokens\":32,\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello\"}}]}}'"
    );
    println!("  OpenAI SDK: OpenAI(base_url=\"http://{data}/v1\", api_key=\"unused\")");
    println!("  curl -s http://{admin}/metrics | grep slogate_time_to_first_token");
}

/// The `demo --load` traffic: interactive chat plus bursty batch.
#[cfg(feature = "demo")]
fn demo_scenario(
    target: &str,
    model: &str,
    duration: std::time::Duration,
    classes: std::collections::BTreeMap<String, loadtest::loadgen::scenario::Targets>,
) -> loadtest::loadgen::Scenario {
    use loadtest::loadgen::scenario::{Arrival, Endpoint, LenDist, StreamSpec};
    let stream = |name: &str, arrival, prompt, output| StreamSpec {
        name: name.into(),
        class: Some(name.into()),
        api_key: None,
        model: model.into(),
        endpoint: Endpoint::Chat,
        stream: true,
        arrival,
        prompt_tokens: Some(prompt),
        output_tokens: Some(output),
        dataset: None,
        turns: 1,
        http2: false,
        target: None,
        upload_bytes: None,
    };
    loadtest::loadgen::Scenario {
        target: target.into(),
        duration,
        max_requests: 1_000_000,
        seed: 1,
        warmup: std::time::Duration::ZERO,
        request_timeout: std::time::Duration::from_secs(120),
        classes,
        ttft: Default::default(),
        streams: vec![
            stream(
                "chat",
                Arrival::Poisson { rate: 8.0 },
                LenDist::Lognormal { median: 256.0, sigma: 0.6, max: Some(4096) },
                LenDist::Uniform { min: 32, max: 160 },
            ),
            stream(
                "batch",
                Arrival::Batch { rate: 0.5, size: LenDist::Fixed { value: 8 } },
                LenDist::Fixed { value: 1024 },
                LenDist::Fixed { value: 256 },
            ),
        ],
    }
}

/// `slogate capacity`: estimates from a gateway's `/capacity` or a loadgen result.
async fn capacity(
    from: &str,
    rates: &[String],
    config: Option<&std::path::Path>,
    json: bool,
    token_env: Option<&str>,
) -> Result<String, String> {
    use slogate::capacity;
    let targets = capacity::parse_rates(rates.iter().map(String::as_str))?;
    let token = match token_env {
        None => None,
        Some(var) => Some(
            std::env::var(var)
                .ok()
                .filter(|t| !t.trim().is_empty())
                .ok_or_else(|| format!("--admin-token-env: {var} is not set or empty"))?,
        ),
    };
    let estimates: Vec<capacity::Estimate> = if from.starts_with("http://") {
        capacity::from_gateway(from, &targets, token.as_deref()).await?
    } else {
        let text = std::fs::read_to_string(from).map_err(|e| format!("{from}: {e}"))?;
        let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{from}: {e}"))?;
        let cfg = match config {
            Some(p) => Some(Config::load(p).map_err(|e| e.to_string())?),
            None => None,
        };
        let target = |class: &str| cfg.as_ref().and_then(|c| c.classes.get(class)).map(|c| c.ttft.get().as_secs_f64() * 1000.0);
        capacity::plan(&capacity::from_loadgen(&v, &target)?, &targets)
    };
    if json {
        serde_json::to_string_pretty(&serde_json::json!({"assumptions": capacity::ASSUMPTIONS, "estimates": estimates}))
            .map(|s| s + "\n")
            .map_err(|e| e.to_string())
    } else {
        Ok(capacity::table(&estimates))
    }
}

async fn serve(validated: Config, path: PathBuf) -> ExitCode {
    // The signal handlers are in place before the gateway starts: a SIGHUP or
    // SIGTERM that arrives as soon as it listens must not meet the default
    // action (which ends the process).
    let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
    let (mut signals, mut hup) = match (Signals::install(), hangup) {
        (Ok(s), Ok(h)) => (s, h),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("cannot install signal handlers: {e}");
            return ExitCode::FAILURE;
        }
    };
    match slogate::server::raise_file_limit() {
        // Two files an HTTP/1.1 stream, and some for replicas' health checks and the admin listener.
        Ok(files) if files < 2 * u64::from(validated.server.max_connections) + 256 => tracing::warn!(
            files,
            max_connections = validated.server.max_connections,
            "the open-file limit is below two per server.max_connections: about {} HTTP/1.1 streams fit (raise it with ulimit -n or LimitNOFILE=)",
            files.saturating_sub(256) / 2
        ),
        Ok(_) => {}
        Err(e) => tracing::warn!(error = %e, "cannot read or raise the open-file limit"),
    }
    let gw = match Gateway::start_file(&path).await {
        Ok(g) => g,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let scheme = if gw.tls { "https" } else { "http" };
    tracing::info!(data = %format!("{scheme}://{}", gw.data_addr), admin = %format!("http://{}", gw.admin_addr), "slogate listening");
    // SIGHUP reloads the config file, like POST /-/reload.
    let app = gw.reloader();
    let reloads = tokio::spawn(async move {
        while hup.recv().await.is_some() {
            tracing::info!("SIGHUP: reloading the config");
            // A signal is never dropped: past the reload rate, it waits its
            // turn (signals arriving meanwhile fold into it).
            while let Err(slogate::ReloadError::TooSoon { retry_after }) = app.reload().await {
                tokio::time::sleep(retry_after).await;
            }
        }
    });
    signals.terminated().await;
    reloads.abort();
    tracing::info!("shutting down: no new connections; draining in-flight streams");
    gw.shutdown().await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

/// SIGTERM and SIGINT, registered with the OS when installed (before then
/// their default action would end the process unhandled).
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals { term: signal(SignalKind::terminate())?, int: signal(SignalKind::interrupt())? })
    }

    /// Until SIGTERM or SIGINT.
    async fn terminated(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
