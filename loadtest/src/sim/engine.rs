//! One replica's engine: vLLM's step loop as vLLM runs it.
//!
//! Each step first decodes one token for every running sequence (decode
//! preference), then spends what is left of the `max_num_batched_tokens`
//! budget on prefill chunks: first sequences already partly prefilled, then
//! waiting ones in FCFS (or priority) order. A step takes the larger of its
//! memory-bound part (`base + decode_per_seq x decodes`) and its compute-bound
//! part (`alpha x` tokens processed), times the slowdown fault. `max_num_seqs` caps the running batch; the KV cache is
//! counted in blocks, allocated as vLLM's v1 scheduler does: a sequence
//! gets the blocks of the chunk scheduled in a step, not its whole prompt
//! up front. When a running sequence's decode or next prefill chunk needs a
//! block and none is free, the most recently admitted sequence (under
//! priority scheduling, the latest of the lowest priority) is preempted and
//! recomputed later (its prompt and generated tokens are prefilled again),
//! and no waiting sequence is taken in that step. A waiting sequence whose
//! first chunk does not fit waits. Blocks of computed
//! prompt tokens are named and reused by later prompts with the same prefix
//! (vLLM's automatic prefix caching; see [`super::cache`]): a sequence
//! skips the prefill of the leading blocks the cache holds.
//!
//! Time is `tokio::time`, so the scheduler runs on paused time in tests.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;
use tokio::time::Instant;

use super::cache::PrefixCache;
use super::config::{FaultConfig, SimConfig};
use super::kv_events::Collector;
pub use super::metrics::Finish;
use super::metrics::SimMetrics;

/// How a sequence's stream should fail, if it should.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFault {
    /// A `data: {"error": ...}` event after this many tokens.
    ErrorAt(u32),
    /// The connection is cut after this many tokens.
    CutAt(u32),
}

/// What the engine sends back for one sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Token number `index` (0-based); the last one carries its finish reason.
    Token {
        index: u32,
        finish: Option<Finish>,
    },
    Error(String),
    Cut,
}

/// A request as the engine sees it.
#[derive(Debug, Clone)]
pub struct SeqRequest {
    pub prompt_tokens: u32,
    pub max_tokens: u32,
    /// Stop (`stop`) after this many tokens if below `max_tokens`.
    pub natural_len: Option<u32>,
    /// Lower is served first under priority scheduling.
    pub priority: i64,
    pub fault: Option<StreamFault>,
    /// The chained hashes of the prompt's full blocks (see
    /// [`super::cache::block_hashes`]); empty: nothing to reuse.
    pub block_hashes: Vec<u64>,
    /// Set when the sequence is first scheduled: its prompt tokens found in the prefix cache.
    pub cached: Arc<std::sync::atomic::AtomicU32>,
    /// The prompt's token ids where a tokenizer gave them (for KV events); else empty.
    pub token_ids: Arc<[u32]>,
}

impl SeqRequest {
    /// A request of `prompt_tokens` that shares no prefix with any other.
    pub fn new(prompt_tokens: u32, max_tokens: u32) -> SeqRequest {
        SeqRequest {
            prompt_tokens,
            max_tokens,
            natural_len: None,
            priority: 0,
            fault: None,
            block_hashes: Vec::new(),
            cached: Arc::default(),
            token_ids: Arc::from(Vec::new()),
        }
    }
}

/// Counters the server and tests read.
#[derive(Debug, Default)]
pub struct EngineStats {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub max_running_seen: AtomicUsize,
    pub kv_used_blocks: AtomicUsize,
    /// Prompt tokens scheduled, and those of them found in the prefix cache.
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub preemptions: AtomicU64,
    pub steps: AtomicU64,
}

/// Faults the engine reads each step.
#[derive(Debug, Default)]
pub struct Faults {
    pub config: Mutex<FaultConfig>,
    pub stall_until: Mutex<Option<Instant>>,
}

impl Faults {
    pub fn new(cfg: FaultConfig) -> Faults {
        let f = Faults::default();
        f.set(cfg);
        f
    }

    /// Replace the fault settings; a non-zero `stall_secs` starts a stall now.
    pub fn set(&self, cfg: FaultConfig) {
        let stall = (cfg.stall_secs > 0.0).then(|| Instant::now() + std::time::Duration::from_secs_f64(cfg.stall_secs));
        *self.stall_until.lock().unwrap_or_else(|e| e.into_inner()) = stall;
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = cfg;
    }

    pub fn get(&self) -> FaultConfig {
        self.config.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn stall_until(&self) -> Option<Instant> {
        *self.stall_until.lock().unwrap_or_else(|e| e.into_inner())
    }
}

struct Seq {
    req: SeqRequest,
    order: u64,
    arrival: Instant,
    generated: u32,
    /// Tokens to prefill before decoding: the prompt, or prompt + generated after preemption.
    prefill_target: u32,
    prefilled: u32,
    /// Blocks it holds as its own (not named in the prefix cache).
    blocks: u32,
    /// Named blocks it holds a reference on.
    named: Vec<u64>,
    /// Its prompt's full blocks up to here are named (or tried).
    named_upto: usize,
    /// It was scheduled before (its cache hits are counted once).
    scheduled: bool,
    last_token: Option<Instant>,
    tx: mpsc::UnboundedSender<Event>,
}

impl Seq {
    fn stop_at(&self) -> u32 {
        self.req.natural_len.map_or(self.req.max_tokens, |n| n.min(self.req.max_tokens)).max(1)
    }
    fn decoding(&self) -> bool {
        self.prefilled >= self.prefill_target
    }
    fn held(&self) -> u32 {
        self.blocks + self.named.len() as u32
    }
}

/// Handle to a running engine.
#[derive(Clone)]
pub struct Engine {
    tx: mpsc::UnboundedSender<(SeqRequest, mpsc::UnboundedSender<Event>, Instant)>,
    pub stats: Arc<EngineStats>,
    pub faults: Arc<Faults>,
    cfg: Arc<SimConfig>,
}

/// Why a request was not accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rejected {
    QueueFull,
    TooLong(String),
    Stopped,
}

impl Engine {
    /// Start the engine loop on the current runtime.
    pub fn start(cfg: Arc<SimConfig>, metrics: Arc<SimMetrics>, faults: Arc<Faults>) -> (Engine, tokio::task::JoinHandle<()>) {
        Self::start_publishing(cfg, metrics, faults, None)
    }

    /// [`Engine::start`], publishing KV events through `kv`.
    pub fn start_publishing(
        cfg: Arc<SimConfig>,
        metrics: Arc<SimMetrics>,
        faults: Arc<Faults>,
        kv: Option<Collector>,
    ) -> (Engine, tokio::task::JoinHandle<()>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let stats = Arc::new(EngineStats::default());
        let core = Core {
            cfg: cfg.clone(),
            rx,
            running: Vec::new(),
            waiting: VecDeque::new(),
            cache: PrefixCache::new(cfg.kv_blocks),
            order: 0,
            stats: stats.clone(),
            metrics,
            faults: faults.clone(),
            kv,
        };
        let task = tokio::spawn(core.run());
        (Engine { tx, stats, faults, cfg }, task)
    }

    /// Queue a sequence; events arrive on the returned receiver.
    pub fn submit(&self, req: SeqRequest) -> Result<mpsc::UnboundedReceiver<Event>, Rejected> {
        let total = req.prompt_tokens + req.max_tokens;
        if total.div_ceil(self.cfg.block_size) > self.cfg.kv_blocks {
            return Err(Rejected::TooLong(format!("{total} tokens do not fit the KV cache")));
        }
        if let Some(cap) = self.cfg.max_waiting {
            if self.stats.waiting.load(Ordering::Relaxed) >= cap {
                return Err(Rejected::QueueFull);
            }
        }
        let (etx, erx) = mpsc::unbounded_channel();
        // Counted as waiting at once, so a bounded queue cannot be overrun between steps.
        self.stats.waiting.fetch_add(1, Ordering::Relaxed);
        self.tx.send((req, etx, Instant::now())).map_err(|_| {
            self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
            Rejected::Stopped
        })?;
        Ok(erx)
    }
}

/// The instant of the step grid nearest to `t`: the grid has a point every
/// `period_ms`, `phase` of a period after an epoch shared by the process's
/// replicas.
fn on_grid(t: Instant, period_ms: f64, phase: f64) -> Instant {
    static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(Instant::now);
    let period = std::time::Duration::from_secs_f64(period_ms.max(0.001) / 1000.0);
    let offset = period.mul_f64(phase.clamp(0.0, 1.0));
    let since = t.saturating_duration_since(epoch + offset).as_secs_f64();
    let k = (since / period.as_secs_f64()).round();
    (epoch + offset + period.mul_f64(k)).max(Instant::now())
}

struct Core {
    cfg: Arc<SimConfig>,
    rx: mpsc::UnboundedReceiver<(SeqRequest, mpsc::UnboundedSender<Event>, Instant)>,
    running: Vec<Seq>,
    waiting: VecDeque<Seq>,
    cache: PrefixCache,
    order: u64,
    stats: Arc<EngineStats>,
    metrics: Arc<SimMetrics>,
    faults: Arc<Faults>,
    /// KV events, when the replica publishes them.
    kv: Option<Collector>,
}

impl Core {
    async fn run(mut self) {
        loop {
            if self.running.is_empty() && self.waiting.is_empty() {
                match self.rx.recv().await {
                    Some(m) => self.enqueue(m),
                    None => return,
                }
            }
            while let Ok(m) = self.rx.try_recv() {
                self.enqueue(m);
            }
            if let Some(until) = self.faults.stall_until() {
                if until > Instant::now() {
                    tokio::time::sleep_until(until).await;
                }
            }
            self.drop_cancelled();
            if self.running.is_empty() && self.waiting.is_empty() {
                self.publish();
                continue;
            }
            self.step().await;
        }
    }

    fn enqueue(&mut self, (req, tx, arrival): (SeqRequest, mpsc::UnboundedSender<Event>, Instant)) {
        self.order += 1;
        let seq = Seq {
            prefill_target: req.prompt_tokens.max(1),
            req,
            order: self.order,
            arrival,
            generated: 0,
            prefilled: 0,
            blocks: 0,
            named: Vec::new(),
            named_upto: 0,
            scheduled: false,
            last_token: None,
            tx,
        };
        // Counted as waiting by `submit` already.
        self.insert_waiting(seq, false);
    }

    fn insert_waiting(&mut self, seq: Seq, front: bool) {
        if self.cfg.priority_scheduling {
            let key = (seq.req.priority, seq.order);
            let pos = self.waiting.iter().position(|s| (s.req.priority, s.order) > key).unwrap_or(self.waiting.len());
            self.waiting.insert(pos, seq);
        } else if front {
            self.waiting.push_front(seq);
        } else {
            self.waiting.push_back(seq);
        }
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.cfg.block_size)
    }

    fn drop_cancelled(&mut self) {
        let before = self.waiting.len();
        self.waiting.retain(|s| !s.tx.is_closed());
        self.stats.waiting.fetch_sub(before - self.waiting.len(), Ordering::Relaxed);
        let (gone, kept): (Vec<Seq>, Vec<Seq>) = std::mem::take(&mut self.running).into_iter().partition(|s| s.tx.is_closed());
        self.running = kept;
        for mut s in gone {
            self.release(&mut s);
        }
    }

    /// Give a sequence's blocks back: its own free, its named ones cached.
    fn release(&mut self, s: &mut Seq) {
        self.cache.release(std::mem::take(&mut s.blocks), &std::mem::take(&mut s.named));
        s.named_upto = 0;
    }

    /// Preempt the most recently admitted running sequence (recompute later).
    fn preempt_latest(&mut self) -> Option<u64> {
        let idx = self.running.iter().enumerate().max_by_key(|(_, s)| (s.req.priority, s.order)).map(|(i, _)| i)?;
        let mut seq = self.running.swap_remove(idx);
        self.release(&mut seq);
        seq.prefilled = 0;
        seq.prefill_target = seq.req.prompt_tokens.max(1) + seq.generated;
        let order = seq.order;
        self.stats.preemptions.fetch_add(1, Ordering::Relaxed);
        self.metrics.preemptions.inc();
        self.stats.waiting.fetch_add(1, Ordering::Relaxed);
        self.insert_waiting(seq, true);
        Some(order)
    }

    /// Schedule the waiting queue's front if the blocks of its first chunk
    /// (`budget` tokens at most) fit: the leading prompt blocks the prefix
    /// cache holds are reused (their prefill skipped; at least one token is
    /// always computed, as vLLM does), the chunk's allocated. `None` when it
    /// does not fit. As vLLM's v1 scheduler, only the chunk scheduled now
    /// needs blocks: the rest are allocated step by step as the prefill goes on.
    fn schedule_front(&mut self, budget: u32) -> Option<Seq> {
        let front = self.waiting.front()?;
        let bs = self.cfg.block_size.max(1);
        let hashes = &front.req.block_hashes;
        let hit = self.cache.hits(hashes).min(((front.prefill_target - 1) / bs) as usize);
        let start = hit as u32 * bs;
        let chunk = (front.prefill_target - start).min(budget);
        let need = self.blocks_for(start + chunk).saturating_sub(hit as u32);
        if !self.cache.fits(&hashes[..hit], need) {
            return None;
        }
        let mut s = self.waiting.pop_front()?;
        self.stats.waiting.fetch_sub(1, Ordering::Relaxed);
        let reused = s.req.block_hashes[..hit].to_vec();
        self.cache.acquire(&reused);
        self.cache.allocate(need);
        s.blocks = need;
        s.named = reused;
        s.named_upto = hit;
        s.prefilled = hit as u32 * bs;
        if !std::mem::replace(&mut s.scheduled, true) {
            let cached = hit as u64 * bs as u64;
            s.req.cached.store(cached as u32, Ordering::Relaxed);
            self.stats.prefix_queries.fetch_add(s.req.prompt_tokens as u64, Ordering::Relaxed);
            self.stats.prefix_hits.fetch_add(cached, Ordering::Relaxed);
            self.metrics.prefix_cache_queries.inc_by(s.req.prompt_tokens as u64);
            self.metrics.prefix_cache_hits.inc_by(cached);
        }
        Some(s)
    }

    /// Name the prompt blocks `s` has computed in full, so later prompts reuse them.
    fn name_computed(cache: &mut PrefixCache, s: &mut Seq, block_size: u32, kv: &mut Option<Collector>) {
        let full = ((s.prefilled.min(s.req.prompt_tokens) / block_size.max(1)) as usize).min(s.req.block_hashes.len());
        while s.named_upto < full {
            let h = s.req.block_hashes[s.named_upto];
            if s.blocks > 0 && cache.name(h) {
                s.blocks -= 1;
                s.named.push(h);
                if let Some(kv) = kv {
                    kv.stored(&s.req.block_hashes, &s.req.token_ids, s.named_upto);
                }
            }
            s.named_upto += 1;
        }
    }

    async fn step(&mut self) {
        // 1. Decodes first: every fully prefilled running sequence gets a KV slot for its next token.
        let preempted = self.allocate_decodes();
        let decodes: Vec<u64> = self.running.iter().filter(|s| s.decoding()).map(|s| s.order).collect();
        // 2. Prefill chunks with what is left of the token budget.
        let prefill_tokens = self.prefill(decodes.len(), preempted);
        // Prefills that complete in this step produce their first token at its end.
        let completing: Vec<u64> = self.running.iter().filter(|s| s.decoding() && !decodes.contains(&s.order)).map(|s| s.order).collect();
        self.publish();

        // 3. The step takes its modelled time.
        let slowdown = self.faults.get().slowdown;
        let dt = self.cfg.step_time(decodes.len(), prefill_tokens, slowdown);
        match self.cfg.step_phase {
            None => tokio::time::sleep(dt).await,
            Some(phase) => tokio::time::sleep_until(on_grid(Instant::now() + dt, self.cfg.step_base_ms, phase)).await,
        }
        self.stats.steps.fetch_add(1, Ordering::Relaxed);

        // 4. Emit tokens.
        self.emit(&decodes, &completing);
        self.forget_evicted();
        self.publish();
    }

    /// A KV slot for each decoding sequence's next token, preempting the
    /// latest sequences where the cache is full. True when it preempted one.
    fn allocate_decodes(&mut self) -> bool {
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if !s.decoding() {
                i += 1;
                continue;
            }
            let need = self.blocks_for(s.req.prompt_tokens + s.generated + 1).saturating_sub(s.held());
            if self.cache.allocate(need) {
                self.running[i].blocks += need;
                i += 1;
                continue;
            }
            let me = self.running[i].order;
            match self.preempt_latest() {
                Some(o) if o == me => {} // preempted itself; same index now holds another sequence
                Some(_) => {}
                None => break,
            }
            preempted = true;
            // Re-examine from the start: indices moved.
            i = 0;
        }
        preempted
    }

    /// Prefill chunks within the step's token budget (what `decodes` leave
    /// of it), new sequences taken in while slots and budget remain; the
    /// prompt tokens prefilled. As vLLM's v1 scheduler: each chunk's blocks
    /// are allocated when it is scheduled, a partly prefilled sequence whose
    /// chunk finds none free preempts the latest (under priority scheduling,
    /// the lowest-priority) running sequence, and no waiting sequence is
    /// taken in during a step that preempted one (`preempted`).
    fn prefill(&mut self, decodes: usize, mut preempted: bool) -> u32 {
        let mut budget = self.cfg.max_num_batched_tokens.saturating_sub(decodes as u32);
        let mut prefill_tokens = 0u32;
        let partial: Vec<u64> = self.running.iter().filter(|s| !s.decoding()).map(|s| s.order).collect();
        'partial: for order in partial {
            loop {
                if budget == 0 {
                    break 'partial;
                }
                // Still running (an earlier chunk's allocation may have preempted it)?
                let Some(i) = self.running.iter().position(|s| s.order == order) else { continue 'partial };
                let s = &self.running[i];
                let chunk = (s.prefill_target - s.prefilled).min(budget);
                let need = self.blocks_for(s.prefilled + chunk).saturating_sub(s.held());
                if self.cache.allocate(need) {
                    let s = &mut self.running[i];
                    s.blocks += need;
                    s.prefilled += chunk;
                    budget -= chunk;
                    prefill_tokens += chunk;
                    continue 'partial;
                }
                preempted = true;
                match self.preempt_latest() {
                    Some(o) if o == order => break 'partial, // nothing below it to preempt
                    Some(_) => {}
                    None => break 'partial,
                }
            }
        }
        while !preempted && budget > 0 && self.running.len() < self.cfg.max_num_seqs {
            let Some(mut s) = self.schedule_front(budget) else { break };
            let chunk = (s.prefill_target - s.prefilled).min(budget);
            s.prefilled += chunk;
            budget -= chunk;
            prefill_tokens += chunk;
            self.running.push(s);
        }
        let bs = self.cfg.block_size;
        for s in self.running.iter_mut() {
            Self::name_computed(&mut self.cache, s, bs, &mut self.kv);
        }
        prefill_tokens
    }

    /// Each decoding sequence's token, and each completed prefill's first,
    /// sent; finished and faulted sequences released.
    fn emit(&mut self, decodes: &[u64], completing: &[u64]) {
        let now = Instant::now();
        let mut finished = Vec::new();
        let metrics = self.metrics.clone();
        let running = std::mem::take(&mut self.running);
        for mut s in running {
            let emits = decodes.contains(&s.order) || (completing.contains(&s.order) && s.generated == 0);
            if !emits {
                self.running.push(s);
                continue;
            }
            let index = s.generated;
            s.generated += 1;
            match s.last_token {
                None => metrics.ttft.observe((now - s.arrival).as_secs_f64()),
                Some(prev) => metrics.itl.observe((now - prev).as_secs_f64()),
            }
            s.last_token = Some(now);
            let fault = match s.req.fault {
                Some(StreamFault::ErrorAt(n)) if s.generated >= n => Some(Event::Error("simulated engine error".into())),
                Some(StreamFault::CutAt(n)) if s.generated >= n => Some(Event::Cut),
                _ => None,
            };
            let done = s.generated >= s.stop_at();
            let finish = done.then_some(if s.generated >= s.req.max_tokens { Finish::Length } else { Finish::Stop });
            let sent = s.tx.send(Event::Token { index, finish }).is_ok();
            if let Some(f) = fault.filter(|_| !done) {
                let _ = s.tx.send(f);
                finished.push(s);
                continue;
            }
            if done {
                let reason = finish.unwrap_or(Finish::Stop);
                metrics.finished(reason, (now - s.arrival).as_secs_f64(), s.req.prompt_tokens, s.generated);
            }
            if done || !sent {
                finished.push(s);
                continue;
            }
            self.running.push(s);
        }
        for mut s in finished {
            self.release(&mut s);
        }
    }

    /// The blocks the cache evicted this step, said to the KV event feed.
    fn forget_evicted(&mut self) {
        match &mut self.kv {
            Some(kv) => {
                kv.removed(self.cache.evicted_names.drain(..));
                kv.flush();
            }
            None => self.cache.evicted_names.clear(),
        }
    }

    fn publish(&self) {
        let running = self.running.len();
        self.stats.running.store(running, Ordering::Relaxed);
        self.stats.max_running_seen.fetch_max(running, Ordering::Relaxed);
        let used = self.cache.used();
        self.stats.kv_used_blocks.store(used as usize, Ordering::Relaxed);
        self.metrics.running.set(running as i64);
        self.metrics.waiting.set(self.waiting.len() as i64);
        self.metrics.kv_usage.set(used as f64 / self.cfg.kv_blocks.max(1) as f64);
    }
}

#[cfg(test)]
mod tests;
