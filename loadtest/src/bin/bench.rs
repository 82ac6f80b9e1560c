//! `bench`: run a benchmark scenario and publish its result, or hand a
//! driver the scenario's gateway configuration and loads, filled for a run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use clap::{Parser, Subcommand};
use loadtest::bench::{self, judge, BenchFile};

#[derive(Parser)]
#[command(
    name = "bench",
    about = "Run a benchmark scenario: its driver once per run, then its checks, stamped into loadtest/results/NAME/"
)]
struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run scenario NAME (loadtest/scenarios/NAME.yaml) and publish its result.
    Run {
        name: String,
        /// The repository root (the current directory by default).
        #[arg(long, default_value = ".")]
        root: PathBuf,
        /// Runs, instead of the file's number.
        #[arg(long)]
        runs: Option<u32>,
        /// The stamp: commit and machine.
        #[arg(long)]
        machine: String,
        /// Write the result here instead of loadtest/results/NAME/ (a trial).
        #[arg(long)]
        out: Option<PathBuf>,
        /// Give a var of the file another value for this result (stated in it).
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
    /// Print gateway configuration NAME of a scenario file, filled for a run.
    Config {
        file: PathBuf,
        name: String,
        /// The replicas of each pool that names none (comma-separated URLs).
        #[arg(long, value_delimiter = ',')]
        replicas: Vec<String>,
        /// Or as vllm-sim printed them (a JSON line each: the URL, and
        /// where the replica publishes its KV events, if it does).
        #[arg(long, conflicts_with = "replicas")]
        sim_out: Option<PathBuf>,
        /// Fill `${KEY}` with VALUE.
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
    /// Print load NAME (a loadgen scenario) of a scenario file, filled for a run.
    Load {
        file: PathBuf,
        name: String,
        /// Where the load goes (loopback URLs, comma-separated).
        #[arg(long)]
        target: String,
        #[arg(long = "set", value_name = "KEY=VALUE")]
        sets: Vec<String>,
    },
    /// Print var NAME of a scenario file (a parameter the driver reads).
    Var { file: PathBuf, name: String },
    /// Write one run's report (`report.md`, `measured.json`, charts), as
    /// its driver asks: `NAME [KIND] DIR ARGS` (`capacity RESULT.json`
    /// prints C; the list is in `loadtest/src/bench/report/dispatch.rs`).
    Report {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
        args: Vec<String>,
    },
    /// Sample a gateway's admission state every 250 ms into a CSV, and
    /// switch simulator faults at given offsets (loopback only).
    Timeline {
        /// The gateway's admin URL.
        #[arg(long)]
        admin: String,
        /// The class whose TTFT, breaker and reduction are sampled.
        #[arg(long = "class", default_value = "chat")]
        class: String,
        /// Seconds to sample for.
        #[arg(long)]
        duration: f64,
        #[arg(long)]
        out: PathBuf,
        /// `SECONDS=SIM_URL=JSON`: POST JSON to the simulator's /admin/faults then.
        #[arg(long = "fault")]
        faults: Vec<bench::timeline::Fault>,
    },
    /// Misbehaving clients for the soak benchmark (loopback only): hang-ups
    /// mid-stream, readers that stop, half request heads; prints a summary.
    SoakClients {
        host: String,
        port: u16,
        /// Seconds to run for.
        seconds: f64,
    },
    /// Read every scenario file and say what is wrong with any.
    Check {
        #[arg(long, default_value = ".")]
        root: PathBuf,
    },
}

fn main() -> ExitCode {
    let result = match Args::parse().cmd {
        Cmd::Run { name, root, runs, machine, out, sets } => {
            bench::parse_sets(&sets).and_then(|sets| run(&name, &root, runs, &machine, out, sets))
        }
        Cmd::Config { file, name, replicas, sim_out, sets } => {
            let replicas = match sim_out {
                Some(f) => std::fs::read_to_string(&f)
                    .map(|t| t.lines().map(str::to_string).collect())
                    .map_err(|e| format!("{}: {e}", f.display())),
                None => Ok(replicas),
            };
            replicas
                .and_then(|replicas| bench::parse_sets(&sets).and_then(|vars| for_driver(&file)?.gateway_config(&name, &replicas, &vars)))
                .map(|y| print!("{y}"))
        }
        Cmd::Load { file, name, target, sets } => {
            bench::parse_sets(&sets).and_then(|vars| for_driver(&file)?.load_scenario(&name, &target, &vars)).map(|y| print!("{y}"))
        }
        Cmd::Var { file, name } => for_driver(&file).and_then(|f| f.var(&name)).map(|v| println!("{v}")),
        Cmd::Report { args } => bench::report::main(&args),
        Cmd::Timeline { admin, class, duration, out, faults } => bench::timeline::run(&admin, &class, duration, &out, faults),
        Cmd::SoakClients { host, port, seconds } => bench::soak_clients::run(&host, port, seconds).map(|s| println!("{s}")),
        Cmd::Check { root } => check_all(&root),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("bench: {e}");
            ExitCode::from(2)
        }
    }
}

/// The scenario file as a driver of this result sees it: with the vars the
/// runner was given (`BENCH_SET`) over the file's own.
fn for_driver(path: &Path) -> Result<BenchFile, String> {
    let mut f = BenchFile::load(path)?;
    if let Ok(env) = std::env::var("BENCH_SET") {
        let sets: Vec<String> = env.lines().filter(|l| !l.is_empty()).map(str::to_string).collect();
        f.override_vars(bench::parse_sets(&sets)?)?;
    }
    Ok(f)
}

fn scenarios_dir(root: &Path) -> PathBuf {
    root.join("loadtest/scenarios")
}

fn check_all(root: &Path) -> Result<(), String> {
    let dir = scenarios_dir(root);
    let names = bench::scenario_names(&dir)?;
    for n in &names {
        let f = BenchFile::load(&dir.join(format!("{n}.yaml")))?;
        let (script, _) = f.driver_command(root);
        if !script.is_file() {
            return Err(format!("{n}: driver {} does not exist", script.display()));
        }
    }
    println!("{} scenario files read", names.len());
    Ok(())
}

fn run(
    name: &str,
    root: &Path,
    runs: Option<u32>,
    machine: &str,
    out: Option<PathBuf>,
    sets: BTreeMap<String, String>,
) -> Result<(), String> {
    let root = std::fs::canonicalize(root).map_err(|e| format!("{}: {e}", root.display()))?;
    let path = scenarios_dir(&root).join(format!("{name}.yaml"));
    let mut file = BenchFile::load(&path)?;
    file.override_vars(sets)?;
    let runs = runs.unwrap_or(file.runs).max(1);
    let work = std::env::var_os("WORK").map(PathBuf::from).ok_or("WORK (a scratch directory) is not set; run it through loadtest/run")?;
    let (script, args) = file.driver_command(&root);
    let mut done = Vec::new();
    for i in 1..=runs {
        let dir = work.join(format!("run-{i}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        eprintln!("bench: {name}, run {i} of {runs}");
        let status = Command::new("bash")
            .arg(&script)
            .args(&args)
            .current_dir(&root)
            .env("RUN", &dir)
            .env("SEED", i.to_string())
            .env("RUNS", runs.to_string())
            .env("SCENARIO", &path)
            .env("BENCH_SET", file.overrides_env())
            .status()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        if !status.success() {
            return Err(format!("{name}: run {i}: the driver failed ({status}); its files are in {}", dir.display()));
        }
        done.push(collect(&dir)?);
    }
    let readme = judge::readme(name, &file, machine, &done);
    let to = out.unwrap_or_else(|| root.join("loadtest/results").join(name));
    publish(&readme, &work.join("run-1"), &to)?;
    print!("{readme}");
    eprintln!("bench: wrote {}", to.display());
    Ok(())
}

/// One run's measured values and report, as its driver left them.
fn collect(dir: &Path) -> Result<judge::Run, String> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).map_err(|e| format!("{}: {e} (the driver writes it)", dir.join(f).display()));
    let measured: BTreeMap<String, judge::Measured> =
        serde_json::from_str(&read("measured.json")?).map_err(|e| format!("measured.json: {e}"))?;
    Ok(judge::Run { measured, report: read("report.md")? })
}

/// The committed result is the README and run 1's charts only; the folder is replaced.
fn publish(readme: &str, charts: &Path, to: &Path) -> Result<(), String> {
    let err = |p: &Path, e: std::io::Error| format!("{}: {e}", p.display());
    if to.exists() {
        std::fs::remove_dir_all(to).map_err(|e| err(to, e))?;
    }
    std::fs::create_dir_all(to).map_err(|e| err(to, e))?;
    std::fs::write(to.join("README.md"), readme).map_err(|e| err(to, e))?;
    for entry in std::fs::read_dir(charts).map_err(|e| err(charts, e))? {
        let p = entry.map_err(|e| err(charts, e))?.path();
        if p.extension().is_some_and(|x| x == "svg") {
            if let Some(n) = p.file_name() {
                std::fs::copy(&p, to.join(n)).map_err(|e| err(&p, e))?;
            }
        }
    }
    Ok(())
}
