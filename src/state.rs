//! The one swappable snapshot of everything built from a config.
//!
//! A snapshot is built by a fallible `prepare` step and installed by an
//! infallible swap of one `ArcSwap`; each request loads it once and keeps
//! that `Arc` until it ends, so a reload never changes a request midway.

use std::sync::Arc;

use arc_swap::ArcSwap;

use crate::admission::Controls;
use crate::classify::{Class, Classifier};
use crate::config::Config;
use crate::telemetry::Metrics;
use crate::upstream::Pool;

/// Everything the request path needs, immutable once built.
pub struct Snapshot {
    pub config: Arc<Config>,
    pub pools: Vec<Arc<Pool>>,
    pub classifier: Classifier,
}

impl Snapshot {
    /// Build a snapshot; fails without side effects on the running one.
    pub fn prepare(config: Config, metrics: &Metrics, controls: &Controls) -> Result<Snapshot, String> {
        let classifier = Classifier::new(&config, controls)?;
        let pools =
            config.pools.iter().map(|p| Pool::new(p.clone(), &config.tiers, metrics).map(Arc::new)).collect::<Result<Vec<_>, _>>()?;
        Ok(Snapshot { config: Arc::new(config), pools, classifier })
    }

    /// The pool serving `model`: static names first, then discovered ones.
    pub fn pool_for(&self, model: &str) -> Option<&Arc<Pool>> {
        self.pools.iter().find(|p| p.static_models.contains(model)).or_else(|| self.pools.iter().find(|p| p.serves(model)))
    }

    pub fn default_class(&self) -> Arc<Class> {
        self.classifier.class(&self.config.default_class).cloned().unwrap_or_else(|| self.classifier.classes()[0].clone())
    }

    /// Ready: at least one healthy replica in every pool.
    pub fn ready(&self) -> bool {
        self.pools.iter().all(|p| p.healthy_count() > 0)
    }
}

/// Process-wide state shared by both listeners.
pub struct App {
    state: ArcSwap<Snapshot>,
    pub metrics: Arc<Metrics>,
    /// Per-class rolling windows, breakers and reduction triggers.
    pub controls: Arc<Controls>,
}

impl App {
    pub fn new(snapshot: Snapshot, metrics: Arc<Metrics>, controls: Arc<Controls>) -> App {
        App { state: ArcSwap::from_pointee(snapshot), metrics, controls }
    }

    /// The current snapshot; hold it for the whole request.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.state.load_full()
    }
}
