//! The `slogate` command line: serve | check | demo.

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

#[derive(Subcommand)]
enum Command {
    /// Run the gateway.
    Serve {
        /// Config file.
        #[arg(long, default_value = "config/slogate.yaml")]
        config: PathBuf,
    },
    /// Validate a config: exit 0, or exit 2 with one line per problem naming the field.
    Check {
        /// Config file.
        #[arg(long)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Check { config } => match Config::load(&config) {
            Ok(_) => {
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
        Command::Serve { config } => {
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
            let json = match cli.log_format {
                Some(LogFmt::Json) => true,
                Some(LogFmt::Text) => false,
                None => cfg.telemetry.log_format == LogFormat::Json,
            };
            slogate::telemetry::init_logging(json);
            let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            rt.block_on(serve(cfg))
        }
    }
}

async fn serve(cfg: Config) -> ExitCode {
    let gw = match Gateway::start(cfg).await {
        Ok(g) => g,
        Err(e) => {
            tracing::error!("{e}");
            return ExitCode::FAILURE;
        }
    };
    let scheme = if gw.tls { "https" } else { "http" };
    tracing::info!(data = %format!("{scheme}://{}", gw.data_addr), admin = %format!("http://{}", gw.admin_addr), "slogate listening");
    wait_for_signal().await;
    tracing::info!("shutting down: no new connections; draining in-flight streams");
    gw.shutdown().await;
    tracing::info!("stopped");
    ExitCode::SUCCESS
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
