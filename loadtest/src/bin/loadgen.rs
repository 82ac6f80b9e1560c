//! `loadgen`: run a scenario against a loopback target, or compare two runs.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use loadtest::loadgen::run::{run_with, Options};
use loadtest::loadgen::scenario::TtftDefinition;
use loadtest::loadgen::{report, vllm, RunResult, Scenario};

#[derive(Parser)]
#[command(name = "loadgen", about = "Open-loop load generator that measures TTFT and ITL like a client")]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a scenario file; write the JSON result and print (or write) the Markdown report.
    Run {
        scenario: PathBuf,
        /// Override the scenario's target URL (loopback only).
        #[arg(long)]
        target: Option<String>,
        /// Where to write the JSON result.
        #[arg(long)]
        out: Option<PathBuf>,
        /// Where to write the Markdown report (printed otherwise).
        #[arg(long)]
        report: Option<PathBuf>,
        /// Write SVG and PNG charts into this directory.
        #[arg(long)]
        plots: Option<PathBuf>,
        /// A name for this run in reports.
        #[arg(long, default_value = "run")]
        label: String,
        #[arg(long)]
        no_progress: bool,
        /// Which event is the first token (overrides the scenario's `ttft`):
        /// first_content (slogate's) or first_choices (vllm bench's).
        #[arg(long, value_enum)]
        ttft: Option<TtftDefinition>,
        /// Also write the run in `vllm bench serve`'s form: PREFIX.json (the
        /// summary, with its keys) and PREFIX.jsonl (one line per request).
        #[arg(long, value_name = "PREFIX")]
        vllm_bench: Option<PathBuf>,
        /// With --vllm-bench: the summary also holds the per-request arrays
        /// (input_lens, output_lens, ttfts, itls, generated_texts, errors),
        /// as `vllm bench serve --save-detailed` writes them.
        #[arg(long, requires = "vllm_bench")]
        save_detailed: bool,
    },
    /// Compare two results side by side: loadgen JSON results, or summaries
    /// in `vllm bench serve`'s form (its --save-result file, or loadgen's
    /// --vllm-bench one).
    Compare { a: PathBuf, b: PathBuf },
    /// Chart a CSV file (x column, then one column per series) as SVG and PNG.
    Chart {
        csv: PathBuf,
        #[arg(long)]
        dir: PathBuf,
        #[arg(long)]
        stem: String,
        #[arg(long)]
        title: String,
        #[arg(long, default_value = "")]
        y_label: String,
        /// A horizontal reference line, `LABEL=Y` (repeatable).
        #[arg(long = "line")]
        lines: Vec<String>,
    },
    /// Render the SVG and PNG charts of a JSON result.
    Plot {
        result: PathBuf,
        #[arg(long)]
        dir: PathBuf,
    },
}

fn read(p: &PathBuf) -> Result<RunResult, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
}

/// A result to compare: loadgen's own, or a vllm bench summary.
fn read_either(p: &PathBuf) -> Result<report::Compared, String> {
    let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
    if vllm::is_summary(&v) {
        let label =
            v.get("label").and_then(|l| l.as_str()).filter(|l| !l.is_empty()).map_or_else(|| p.display().to_string(), str::to_string);
        return Ok(report::Compared::vllm(label, &v));
    }
    let r: RunResult =
        serde_json::from_value(v).map_err(|e| format!("{}: neither a loadgen result nor a vllm bench summary: {e}", p.display()))?;
    Ok(report::Compared::run(&r))
}

fn write(p: &PathBuf, bytes: &[u8]) -> Result<(), String> {
    std::fs::write(p, bytes).map_err(|e| format!("{}: {e}", p.display()))
}

#[tokio::main]
async fn main() -> ExitCode {
    let result = match Args::parse().cmd {
        Cmd::Run { scenario, target, out, report: rpath, plots, label, no_progress, ttft, vllm_bench, save_detailed } => {
            async {
                let mut s = Scenario::load(&scenario)?;
                if let Some(t) = target {
                    s.target = t;
                }
                if let Some(t) = ttft {
                    s.ttft = t;
                }
                let r = run_with(&s, &label, Options { progress: !no_progress, details: vllm_bench.is_some() }).await?;
                if let Some(prefix) = &vllm_bench {
                    let mut summary = vllm::summary(&r);
                    if save_detailed {
                        vllm::add_detailed(&mut summary, &r);
                    }
                    let summary = serde_json::to_vec_pretty(&summary).map_err(|e| e.to_string())?;
                    write(&prefix.with_extension("json"), &summary)?;
                    write(&prefix.with_extension("jsonl"), vllm::requests_jsonl(&r).as_bytes())?;
                }
                if let Some(out) = out {
                    std::fs::write(&out, serde_json::to_vec(&r).map_err(|e| e.to_string())?)
                        .map_err(|e| format!("{}: {e}", out.display()))?;
                }
                if let Some(dir) = plots {
                    let files = loadtest::loadgen::plots::render(&r, &dir, &label)?;
                    eprintln!("loadgen: wrote {} charts to {}", files.len(), dir.display());
                }
                let md = report::markdown(&r);
                match rpath {
                    Some(p) => std::fs::write(&p, md).map_err(|e| format!("{}: {e}", p.display()))?,
                    None => print!("{md}"),
                }
                Ok::<(), String>(())
            }
            .await
        }
        Cmd::Compare { a, b } => read_either(&a).and_then(|a| read_either(&b).map(|b| print!("{}", report::compare_summaries(&a, &b)))),
        Cmd::Chart { csv, dir, stem, title, y_label, lines } => lines
            .iter()
            .map(|l| {
                let (name, y) = l.rsplit_once('=').ok_or_else(|| format!("--line {l}: write LABEL=Y"))?;
                Ok((name.to_string(), y.parse::<f64>().map_err(|e| format!("--line {l}: {e}"))?))
            })
            .collect::<Result<Vec<_>, String>>()
            .and_then(|lines| loadtest::loadgen::plots::render_csv(&csv, &dir, &stem, &title, &y_label, lines))
            .map(|files| eprintln!("loadgen: wrote {} charts to {}", files.len(), dir.display())),
        Cmd::Plot { result, dir } => read(&result).and_then(|r| {
            let files = loadtest::loadgen::plots::render(&r, &dir, &r.label)?;
            eprintln!("loadgen: wrote {} charts to {}", files.len(), dir.display());
            Ok(())
        }),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: {e}");
            ExitCode::from(2)
        }
    }
}
