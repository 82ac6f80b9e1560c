//! Keys' limits kept in Redis or Valkey (`limits.redis`): one Lua script per
//! check, atomic on the server and on its clock; running requests counted
//! per instance and rewritten by each instance's heartbeat; settling queued
//! to a background task. The request path waits at most `limits.timeout`,
//! then enforces the instance's own part: an outage costs precision, never
//! a request. The rules are docs/design/fair-share.md's (rules 13 to 16).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;
use tokio::sync::mpsc;

use super::keylimits::{tightest, Limit, Limits, Quota, RateState};
use super::quota::{Exceeded, Standing, QUOTAS};
use crate::config::LimitsConfig;

/// How often an instance tells the store it is alive.
const HEARTBEAT: Duration = Duration::from_secs(1);
/// An instance unheard this long: its running requests no longer count.
const STALE: u64 = 5;
/// An instance unheard this long is forgotten.
const FORGET: u64 = 3600;

/// Check and take: `KEYS` requests, tokens, running (hashes), instances,
/// then the counters of the current day's requests and tokens and the
/// month's (strings); `ARGV` rpm, tpm, max_concurrent (0: none), tokens to
/// reserve, instance, stale seconds, then the four quotas (0: none) and
/// their counters' lifetimes. Returns refused (0 none, 1 requests, 2
/// tokens, 3 concurrent, 4 to 7 a quota), retry seconds, the server's
/// second, requests used, their reset seconds, tokens used, their reset
/// seconds, then the four quotas' use.
const ADMIT: &str = r#"
local now = tonumber(redis.call('TIME')[1])
local rpm, tpm, maxc = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local reserve, me, stale = tonumber(ARGV[4]), ARGV[5], tonumber(ARGV[6])
local function window(key)
  local all = redis.call('HGETALL', key)
  local used, live = 0, {}
  for i = 1, #all, 2 do
    local s, a = tonumber(all[i]), tonumber(all[i + 1])
    if s + 60 > now then
      used = used + a
      if a > 0 then live[#live + 1] = {s, a} end
    else
      redis.call('HDEL', key, all[i])
    end
  end
  table.sort(live, function(x, y) return x[1] < y[1] end)
  if used < 0 then used = 0 end
  return used, live
end
local function wait_for(used, live, need, limit)
  for _, e in ipairs(live) do
    used = used - e[2]
    if used + need <= limit then return e[1] + 60 - now end
  end
  return 60
end
local function clear_in(live)
  local last = live[#live]
  if last then return last[1] + 60 - now end
  return 0
end
local ru, rl = window(KEYS[1])
local tu, tl = window(KEYS[2])
local running = 0
if maxc > 0 then
  local all = redis.call('HGETALL', KEYS[3])
  for i = 1, #all, 2 do
    local seen = redis.call('HGET', KEYS[4], all[i])
    local age = seen and (now - tonumber(seen)) or 1e9
    if all[i] == me or age <= stale then
      running = running + tonumber(all[i + 1])
    elseif age > 60 then
      redis.call('HDEL', KEYS[3], all[i])
    end
  end
end
local refused, retry = 0, 0
if maxc > 0 and running >= maxc then
  refused, retry = 3, 1
elseif rpm > 0 and ru + 1 > rpm then
  refused, retry = 1, wait_for(ru, rl, 1, rpm)
elseif tpm > 0 and tu + reserve > tpm then
  refused, retry = 2, wait_for(tu, tl, reserve, tpm)
end
local qused, qneed = {0, 0, 0, 0}, {1, reserve, 1, reserve}
for i = 1, 4 do
  if tonumber(ARGV[6 + i]) > 0 then qused[i] = tonumber(redis.call('GET', KEYS[4 + i]) or '0') end
end
if refused == 0 then
  for i = 1, 4 do
    local q = tonumber(ARGV[6 + i])
    if q > 0 and qused[i] + qneed[i] > q then
      refused = 3 + i
      break
    end
  end
end
local rr, tr = clear_in(rl), clear_in(tl)
if refused == 0 then
  for i = 1, 4 do
    if tonumber(ARGV[6 + i]) > 0 then
      qused[i] = redis.call('INCRBY', KEYS[4 + i], qneed[i])
      redis.call('EXPIRE', KEYS[4 + i], ARGV[10 + i])
    end
  end
  redis.call('HINCRBY', KEYS[1], now, 1)
  redis.call('EXPIRE', KEYS[1], 120)
  redis.call('HINCRBY', KEYS[2], now, reserve)
  redis.call('EXPIRE', KEYS[2], 120)
  if maxc > 0 then
    redis.call('HINCRBY', KEYS[3], me, 1)
    redis.call('EXPIRE', KEYS[3], 86400)
  end
  ru, tu, rr, tr = ru + 1, tu + reserve, 60, 60
end
return {refused, retry, now, ru, rr, tu, tr, qused[1], qused[2], qused[3], qused[4]}
"#;

/// A request ended: `KEYS` requests, tokens, running, then the quota
/// counters of the windows it was taken in; `ARGV` its second, tokens used
/// less reserved, refunded (1: it never reached a replica), running (1: it
/// was counted), instance, quotas (1: the key has some).
const SETTLE: &str = r#"
local now = tonumber(redis.call('TIME')[1])
local s = ARGV[1]
if tonumber(s) + 60 > now then
  if tonumber(ARGV[2]) ~= 0 and redis.call('HEXISTS', KEYS[2], s) == 1 then
    redis.call('HINCRBY', KEYS[2], s, ARGV[2])
  end
  if ARGV[3] == '1' and redis.call('HEXISTS', KEYS[1], s) == 1 then
    redis.call('HINCRBY', KEYS[1], s, -1)
  end
end
if ARGV[4] == '1' then
  if redis.call('HINCRBY', KEYS[3], ARGV[5], -1) <= 0 then redis.call('HDEL', KEYS[3], ARGV[5]) end
end
if ARGV[6] == '1' then
  for _, i in ipairs({5, 7}) do
    if tonumber(ARGV[2]) ~= 0 and redis.call('EXISTS', KEYS[i]) == 1 then redis.call('INCRBY', KEYS[i], ARGV[2]) end
  end
  for _, i in ipairs({4, 6}) do
    if ARGV[3] == '1' and redis.call('EXISTS', KEYS[i]) == 1 then redis.call('DECR', KEYS[i]) end
  end
end
return 1
"#;

/// The heartbeat: `KEYS` instances, then the running hash of each key with
/// `max_concurrent`; `ARGV` instance, forget seconds, then this instance's
/// running requests of each of those keys (what it holds, exactly: a count
/// that a lost call left wrong is right again within a heartbeat).
const BEAT: &str = r#"
local now = tonumber(redis.call('TIME')[1])
redis.call('HSET', KEYS[1], ARGV[1], now)
for i = 2, #KEYS do
  local n = tonumber(ARGV[i + 1])
  if n > 0 then
    redis.call('HSET', KEYS[i], ARGV[1], n)
    redis.call('EXPIRE', KEYS[i], 86400)
  else
    redis.call('HDEL', KEYS[i], ARGV[1])
  end
end
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  if now - tonumber(all[i + 1]) > tonumber(ARGV[2]) then redis.call('HDEL', KEYS[1], all[i]) end
end
return now
"#;

/// What the store said of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Taken, in the store's `second`; the key's quotas after it.
    Granted { second: u64, state: RateState, standing: Vec<Standing> },
    Refused {
        limit: Limit,
        retry_after: u64,
        state: RateState,
        quota: Option<Exceeded>,
        /// The key's quotas as the store counts them now.
        standing: Vec<Standing>,
    },
}

/// A request's end, for the store.
#[derive(Debug)]
struct Settle {
    tenant: Arc<str>,
    second: u64,
    delta: i64,
    refund: bool,
    running: bool,
    /// The wall second it was taken in, when the key has quotas.
    quota_at: Option<u64>,
}

/// A connection to the limit store, shared by every request of the config
/// that named it (a reload naming the same store keeps it).
pub(crate) struct Store {
    config: LimitsConfig,
    conn: ConnectionManager,
    admit: Script,
    instance: Arc<str>,
    up: Arc<AtomicBool>,
    gauge: Gauge,
    errors: Counter,
    settles: mpsc::UnboundedSender<Settle>,
    /// The worker, until [`Store::start`] spawns it.
    worker: std::sync::Mutex<Option<(Worker, mpsc::UnboundedReceiver<Settle>)>>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("redis", &self.config.redis).field("up", &self.is_up()).finish()
    }
}

/// Why the limit store cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("limits.redis: {0}")]
    Url(String),
    #[error("limits.password_env: environment variable {0} is not set or empty")]
    Password(String),
}

fn key(prefix: &str, tenant: &str, kind: &str) -> String {
    format!("{prefix}:key:{tenant}:{kind}")
}

/// The counters of the quota windows holding wall second `unix`
/// (`PREFIX:key:NAME:requests:day:N`, ...), in [`QUOTAS`] order.
fn quota_keys(prefix: &str, tenant: &str, unix: u64) -> [String; 4] {
    QUOTAS.map(|(period, kind)| format!("{prefix}:key:{tenant}:{}:{}:{}", kind.as_str(), period.as_str(), period.window(unix).0))
}

impl Store {
    /// A store for `config` (`None` without `limits.redis`). Connects
    /// lazily: a server down at start is a store down, not a failed start.
    /// Starts the task that sends heartbeats and settles requests (it ends
    /// with the store); `running` says what this instance runs of each key
    /// with `max_concurrent`, for the heartbeat. Needs a Tokio runtime.
    pub(crate) fn open(
        config: &LimitsConfig,
        instance: &str,
        up: Gauge,
        errors: Counter,
        running: Box<Running>,
    ) -> Result<Option<Arc<Store>>, StoreError> {
        let Some(url) = &config.redis else { return Ok(None) };
        let mut info = redis::IntoConnectionInfo::into_connection_info(url.as_str()).map_err(|e| StoreError::Url(e.to_string()))?;
        if let Some(var) = &config.password_env {
            let password = std::env::var(var).ok().filter(|p| !p.is_empty()).ok_or_else(|| StoreError::Password(var.clone()))?;
            let redis_info = info.redis_settings().clone().set_password(password);
            info = info.set_redis_settings(redis_info);
        }
        let client = redis::Client::open(info).map_err(|e| StoreError::Url(e.to_string()))?;
        let timeout = config.timeout.get();
        let manager = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(timeout.max(Duration::from_millis(500))))
            .set_response_timeout(Some(timeout.max(Duration::from_millis(100))))
            .set_number_of_retries(1)
            .set_max_delay(Duration::from_secs(1));
        let conn = ConnectionManager::new_lazy_with_config(client, manager).map_err(|e| StoreError::Url(e.to_string()))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let flag = Arc::new(AtomicBool::new(true));
        let worker = Worker {
            conn: conn.clone(),
            prefix: config.key_prefix.clone(),
            instance: instance.into(),
            up: flag.clone(),
            gauge: up.clone(),
            running,
        };
        let store = Arc::new(Store {
            config: config.clone(),
            conn: conn.clone(),
            admit: Script::new(ADMIT),
            instance: instance.into(),
            up: flag.clone(),
            gauge: up.clone(),
            errors,
            settles: tx,
            worker: std::sync::Mutex::new(Some((worker, rx))),
        });
        Ok(Some(store))
    }

    /// Go live (the swap step of a reload; a no-op the second time): its
    /// worker starts settling and sending heartbeats. Opening a store
    /// touches nothing: a reload that fails or is discarded leaves no worker.
    pub(crate) fn start(&self) {
        let worker = self.worker.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((worker, rx)) = worker {
            self.gauge.set(1);
            tokio::spawn(worker.run(rx));
        }
    }

    /// Is this the store `config` names?
    pub(crate) fn serves(&self, config: &LimitsConfig) -> bool {
        self.config == *config
    }

    /// The server answered lately.
    pub(crate) fn is_up(&self) -> bool {
        self.up.load(Ordering::Relaxed)
    }

    /// Check `tenant`'s `limits` (the whole key's, not a part) and take one
    /// request and `reserve` tokens. `None`: the server did not answer in
    /// time; it is taken for down until its next heartbeat.
    /// `unix`: this instance's wall clock, which picks the quota windows.
    pub(crate) async fn admit(&self, tenant: &str, limits: &Limits, reserve: u64, unix: u64) -> Option<Verdict> {
        let prefix = &self.config.key_prefix;
        let mut conn = self.conn.clone();
        let mut call = self.admit.prepare_invoke();
        call.key(key(prefix, tenant, "requests"))
            .key(key(prefix, tenant, "tokens"))
            .key(key(prefix, tenant, "running"))
            .key(format!("{prefix}:instances"));
        for k in quota_keys(prefix, tenant, unix) {
            call.key(k);
        }
        call.arg(limits.requests_per_minute.unwrap_or(0))
            .arg(limits.tokens_per_minute.unwrap_or(0))
            .arg(limits.max_concurrent.unwrap_or(0))
            .arg(reserve)
            .arg(&*self.instance)
            .arg(STALE);
        for q in limits.quotas {
            call.arg(q.unwrap_or(0));
        }
        for (period, _) in QUOTAS {
            // Kept a day past the window's end: a late request's settle still finds it.
            call.arg(period.window(unix).1.saturating_sub(unix) + 86_400);
        }
        let answer = tokio::time::timeout(self.config.timeout.get(), call.invoke_async::<Vec<i64>>(&mut conn)).await;
        let v = match answer {
            Ok(Ok(v)) if v.len() == 11 => v,
            Ok(Ok(v)) => {
                tracing::warn!(answer = ?v, "limit store: unexpected answer; enforcing this instance's part");
                return self.failed();
            }
            Ok(Err(e)) => {
                if self.is_up() {
                    tracing::warn!(error = %e, "limit store: no answer; enforcing this instance's part of every key's limits");
                }
                return self.failed();
            }
            Err(_) => return self.failed(),
        };
        let n = |i: usize| v[i].max(0) as u64;
        let quota = |limit: Option<u64>, used: u64, reset: u64| {
            limit.map(|l| Quota { limit: l, remaining: l.saturating_sub(used), reset: Duration::from_secs(reset) })
        };
        let state =
            RateState { requests: quota(limits.requests_per_minute, n(3), n(4)), tokens: quota(limits.tokens_per_minute, n(5), n(6)) };
        let standing: Vec<Standing> = QUOTAS
            .iter()
            .zip(limits.quotas)
            .enumerate()
            .filter_map(|(i, (&(period, kind), limit))| {
                let reset = period.window(unix).1.saturating_sub(unix);
                limit.map(|limit| Standing { period, kind, limit, used: n(7 + i), reset })
            })
            .collect();
        let refused = |limit, quota| Verdict::Refused { limit, retry_after: n(1), state, quota, standing: standing.clone() };
        Some(match v[0] {
            1 => refused(Limit::Requests, None),
            2 => refused(Limit::Tokens, None),
            3 => refused(Limit::Concurrent, None),
            q @ 4..=7 => {
                let i = (q - 4) as usize;
                let (period, kind) = QUOTAS[i];
                let retry_after = period.window(unix).1.saturating_sub(unix).max(1);
                let limit = limits.quotas[i].unwrap_or(0);
                let e = Exceeded { period, kind, limit, used: n(7 + i), retry_after, too_large: false };
                Verdict::Refused { limit: Limit::Quota, retry_after, state: tightest(state, &standing), quota: Some(e), standing }
            }
            _ => Verdict::Granted { second: n(2), state: tightest(state, &standing), standing },
        })
    }

    fn failed(&self) -> Option<Verdict> {
        self.errors.inc();
        self.up.store(false, Ordering::Relaxed);
        self.gauge.set(0);
        None
    }

    /// A request granted in `second` ended: it used `delta` tokens more than
    /// it reserved (less: negative); `refund`: it never reached a replica;
    /// `running`: it was counted among the key's running requests. Queued,
    /// never waited on.
    /// `quota_at`: the wall second it was taken in, when the key has quotas.
    pub(crate) fn settle(&self, tenant: &Arc<str>, second: u64, delta: i64, refund: bool, running: bool, quota_at: Option<u64>) {
        if delta == 0 && !refund && !running {
            return;
        }
        let _ = self.settles.send(Settle { tenant: tenant.clone(), second, delta, refund, running, quota_at });
    }
}

/// This instance's running requests of each key with `max_concurrent`.
pub(crate) type Running = dyn Fn() -> Vec<(Arc<str>, u64)> + Send + Sync;

/// The store's background task: heartbeats, and requests' ends.
struct Worker {
    conn: ConnectionManager,
    prefix: String,
    instance: Arc<str>,
    up: Arc<AtomicBool>,
    gauge: Gauge,
    running: Box<Running>,
}

impl Worker {
    async fn run(mut self, mut rx: mpsc::UnboundedReceiver<Settle>) {
        let settle = Script::new(SETTLE);
        let beat = Script::new(BEAT);
        let mut every = tokio::time::interval(HEARTBEAT);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = every.tick() => self.beat(&beat).await,
                s = rx.recv() => match s {
                    Some(s) => self.settle(&settle, s).await,
                    // The store is gone (a reload named another, or none).
                    None => return,
                },
            }
        }
    }

    async fn beat(&mut self, beat: &Script) {
        let mut call = beat.prepare_invoke();
        call.key(format!("{}:instances", self.prefix)).arg(&*self.instance).arg(FORGET);
        for (tenant, n) in (self.running)() {
            call.key(key(&self.prefix, &tenant, "running")).arg(n);
        }
        let ok = call.invoke_async::<i64>(&mut self.conn).await;
        let was = self.up.swap(ok.is_ok(), Ordering::Relaxed);
        match (&ok, was) {
            (Ok(_), false) => tracing::info!("limit store: answering again; keys' limits are shared by every instance"),
            (Err(e), true) => tracing::warn!(error = %e, "limit store: down; enforcing this instance's part of every key's limits"),
            _ => {}
        }
        self.gauge.set(ok.is_ok() as i64);
    }

    async fn settle(&mut self, script: &Script, s: Settle) {
        let mut call = script.prepare_invoke();
        call.key(key(&self.prefix, &s.tenant, "requests")).key(key(&self.prefix, &s.tenant, "tokens")).key(key(
            &self.prefix,
            &s.tenant,
            "running",
        ));
        for k in quota_keys(&self.prefix, &s.tenant, s.quota_at.unwrap_or(0)) {
            call.key(k);
        }
        call.arg(s.second).arg(s.delta).arg(s.refund as u8).arg(s.running as u8).arg(&*self.instance).arg(s.quota_at.is_some() as u8);
        if let Err(e) = call.invoke_async::<i64>(&mut self.conn).await {
            tracing::debug!(error = %e, tenant = %s.tenant, "limit store: a request's end was not recorded");
        }
    }
}
