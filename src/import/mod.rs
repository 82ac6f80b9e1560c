//! `slogate import litellm`: a LiteLLM deployment's config and virtual
//! keys as slogate's config, its keys file, and a report of every field
//! that could not be carried, with the reason. Keys keep their hashes
//! (LiteLLM stores a key as the SHA-256 hex of the whole `sk-…` string,
//! as `key_sha256` does), so no client is issued a new key. The mapping's
//! rules are docs/migrating-from-litellm.md's (1 to 4).

mod fetch;
mod keys;
mod model_list;
mod report;
mod settings;

use report::all_classes;
pub use report::{Report, Skipped};

use std::path::{Path, PathBuf};

use serde_json::Value;

/// What the importer reads and where it writes (`slogate import litellm`'s arguments).
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// LiteLLM's config.yaml (its `include:` files are read too).
    #[arg(long)]
    pub config: PathBuf,
    /// LiteLLM's `/key/list?return_full_object=true` answer, saved (one page, or a list of pages).
    #[arg(long, conflicts_with = "keys_from")]
    pub keys: Option<PathBuf>,
    /// LiteLLM's `/team/list` answer, saved (teams' limits apply to their keys).
    #[arg(long, requires = "keys")]
    pub teams: Option<PathBuf>,
    /// A running LiteLLM proxy (http://HOST:PORT) to read the keys and teams from.
    #[arg(long)]
    pub keys_from: Option<String>,
    /// The environment variable holding its master key (with --keys-from).
    #[arg(long, default_value = "LITELLM_MASTER_KEY")]
    pub master_key_env: String,
    /// Convert dollar budgets to token quotas at model_info's prices (approximate; reported).
    #[arg(long)]
    pub budgets_as_tokens: bool,
    /// Where slogate.yaml, keys.yaml and report.md are written.
    #[arg(long)]
    pub out: PathBuf,
    /// The proxy listener's address in the written config (LiteLLM's port by default; another to run beside it on one host).
    #[arg(long, default_value = "0.0.0.0:4000")]
    pub listen: String,
    /// The admin listener's address in the written config (slogate's default when not given).
    #[arg(long)]
    pub admin_listen: Option<String>,
}

/// What an import wrote.
#[derive(Debug)]
pub struct Imported {
    pub config: PathBuf,
    pub keys: PathBuf,
    pub report: PathBuf,
    pub keys_imported: usize,
    pub keys_left_out: usize,
    pub skipped: usize,
    /// What `slogate check` says until the environment has the variables
    /// the config names (the replicas' keys, the admin token).
    pub env_to_set: Vec<String>,
}

impl Imported {
    /// What the command prints: what was written, and what to set before serving.
    pub fn summary(&self) -> String {
        let env: String = self.env_to_set.iter().map(|p| format!("before serving, set: {p}\n")).collect();
        format!(
            "wrote {} and {} ({} keys; {} left out); {} fields not carried: read {}\n{env}",
            self.config.display(),
            self.keys.display(),
            self.keys_imported,
            self.keys_left_out,
            self.skipped,
            self.report.display()
        )
    }
}

/// Import a LiteLLM deployment as `opts` says; the written config is then
/// checked as `slogate check` checks it (its problems are the error).
pub async fn litellm(opts: &Options) -> Result<Imported, String> {
    let mut report = Report::default();
    let source = settings::read(&opts.config, &mut report)?;
    let pools = model_list::pools(&source, &mut report)?;
    let (key_rows, team_rows) = match (&opts.keys_from, &opts.keys) {
        (Some(url), _) => {
            let master =
                std::env::var(&opts.master_key_env).map_err(|_| format!("--keys-from needs the master key in ${}", opts.master_key_env))?;
            fetch::keys_and_teams(url, master.trim()).await?
        }
        (None, Some(file)) => (
            keys::rows_of(&read_json(file)?)?,
            opts.teams.as_deref().map(read_json).transpose()?.map_or(Ok(Vec::new()), |t| keys::teams_of(&t))?,
        ),
        (None, None) => (Vec::new(), Vec::new()),
    };
    let ctx = keys::Context { prices: &pools.prices, models: &pools.names, budgets_as_tokens: opts.budgets_as_tokens };
    let (mut imported, left_out) = keys::convert(&key_rows, &team_rows, &ctx, &mut report);
    if let Some(master) = &source.master_key {
        imported.insert(0, settings::master_key_entry(master));
    }
    let config = settings::config(&source, pools.pools, (&opts.listen, opts.admin_listen.as_deref()), &mut report);
    std::fs::create_dir_all(&opts.out).map_err(|e| format!("cannot make {}: {e}", opts.out.display()))?;
    let config_path = opts.out.join("slogate.yaml");
    let keys_path = opts.out.join("keys.yaml");
    let report_path = opts.out.join("report.md");
    let header = "# Written by `slogate import litellm`; what it could not carry is in report.md.\n";
    write(&config_path, &format!("{header}{}", yaml(&config)?))?;
    write(&keys_path, &format!("{header}{}", yaml(&Value::Array(imported.clone()))?))?;
    let keys_imported = imported.len() - usize::from(source.master_key.is_some());
    write(&report_path, &report.markdown(keys_imported, left_out))?;
    // As `slogate check` checks it; a variable the operator is still to
    // set (the report names it) is not the importer's fault.
    let unset = |p: &crate::config::Problem| p.message.starts_with("environment variable") && p.message.ends_with("is not set");
    let mut env_to_set = Vec::new();
    if let Err(e) = crate::config::Config::load(&config_path) {
        let (env, wrong): (Vec<_>, Vec<_>) = e.0.into_iter().partition(unset);
        if !wrong.is_empty() {
            let lines: Vec<String> = wrong.iter().map(ToString::to_string).collect();
            return Err(format!("the imported config does not pass `slogate check`:\n{}", lines.join("\n")));
        }
        env_to_set = env.iter().map(ToString::to_string).collect();
    }
    Ok(Imported {
        env_to_set,
        config: config_path,
        keys: keys_path,
        report: report_path,
        keys_imported,
        keys_left_out: left_out,
        skipped: report.skipped.len(),
    })
}

fn read_json(path: &Path) -> Result<Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    serde_json::from_str(&text).map_err(|e| format!("{}: not JSON: {e}", path.display()))
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}

fn yaml(v: &Value) -> Result<String, String> {
    serde_norway::to_string(v).map_err(|e| format!("cannot write YAML: {e}"))
}

#[cfg(test)]
mod tests;
