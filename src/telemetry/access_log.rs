//! The access log (`telemetry.access_log`): one line per finished request,
//! for an auditor or an on-call engineer to grep.
//!
//! Rules (docs/access.md, rules 13 to 16):
//! 1. A line says who, what and how it went: time, request id, tenant (the
//!    key's name), model, class, endpoint, replica, status, outcome, queue
//!    time, TTFT, e2e, tokens and bytes. Never a body, never a key: every
//!    field is a configured name, a number, or the request id (which slogate
//!    refuses to take from a caller when it carries the caller's key).
//! 2. The request path never waits on it. A finished request hands its
//!    record to a bounded buffer and goes on; the line is formatted and
//!    written by a thread of its own. When the buffer is full the record is
//!    dropped and counted (`slogate_access_log_dropped_total`).
//! 3. A file is opened for appending and reopened on SIGHUP and reload, so
//!    logrotate can move it away.

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::HeaderValue;
use prometheus_client::metrics::counter::Counter;

use super::metrics::RequestSeries;
use super::Outcome;
use crate::config::{AccessLogConfig, Endpoint};

/// One finished request, as its access log line says it. Built at the
/// request's end from what it measured; formatted by the writer thread.
pub(crate) struct AccessRecord {
    /// When the request ended (wall clock); the line's time is its start.
    pub(crate) end: SystemTime,
    pub(crate) request_id: HeaderValue,
    pub(crate) tenant: Option<Arc<str>>,
    /// Its model's series (the model once routed, else `unknown`).
    pub(crate) model: Option<Arc<RequestSeries>>,
    pub(crate) class: Arc<str>,
    pub(crate) endpoint: Endpoint,
    /// The replica's public name, when it reached one.
    pub(crate) replica: Option<HeaderValue>,
    pub(crate) status: u16,
    pub(crate) outcome: Outcome,
    pub(crate) queued: Duration,
    pub(crate) ttft: Option<Duration>,
    pub(crate) e2e: Duration,
    pub(crate) prompt_tokens: Option<u64>,
    pub(crate) completion_tokens: Option<u64>,
    pub(crate) usage_estimated: bool,
    pub(crate) bytes_in: u64,
    pub(crate) bytes_out: u64,
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 1e6).round() / 1e3
}

fn text(v: &HeaderValue) -> &str {
    v.to_str().unwrap_or("-")
}

impl AccessRecord {
    /// The record as one JSON object (no newline).
    pub(crate) fn json(&self) -> String {
        let start = self.end.checked_sub(self.e2e).unwrap_or(self.end);
        let line = serde_json::json!({
            "time": humantime::format_rfc3339_millis(start).to_string(),
            "request_id": text(&self.request_id),
            "tenant": self.tenant.as_deref(),
            "model": self.model.as_deref().map_or("unknown", RequestSeries::model),
            "class": &*self.class,
            "endpoint": self.endpoint.as_str(),
            "replica": self.replica.as_ref().map(text),
            "status": self.status,
            "outcome": self.outcome.as_str(),
            "queue_ms": ms(self.queued),
            "ttft_ms": self.ttft.map(ms),
            "e2e_ms": ms(self.e2e),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "usage_estimated": self.usage_estimated,
            "bytes_in": self.bytes_in,
            "bytes_out": self.bytes_out,
        });
        line.to_string()
    }
}

enum Msg {
    Line(Box<AccessRecord>),
    /// Look at `reopen` (sent without waiting; may be lost when the buffer is full).
    Wake,
}

/// Where lines go.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Stderr,
    Stdout,
    File(std::path::PathBuf),
}

impl Target {
    fn of(to: &str, dir: Option<&std::path::Path>) -> Target {
        match to.trim() {
            "stderr" => Target::Stderr,
            "stdout" => Target::Stdout,
            path => {
                let p = std::path::PathBuf::from(path);
                Target::File(match dir {
                    Some(d) if p.is_relative() => d.join(p),
                    _ => p,
                })
            }
        }
    }

    fn open(&self) -> std::io::Result<Box<dyn Write + Send>> {
        Ok(match self {
            Target::Stderr => Box::new(std::io::stderr()),
            Target::Stdout => Box::new(std::io::stdout()),
            Target::File(p) => Box::new(std::fs::OpenOptions::new().create(true).append(true).open(p)?),
        })
    }
}

/// The access log: a bounded buffer in front of a writer thread.
pub(crate) struct AccessLog {
    tx: SyncSender<Msg>,
    dropped: Counter,
    /// The target to switch to (a reload named another) or reopen.
    reopen: Arc<Mutex<Option<Target>>>,
    wanted: Arc<AtomicBool>,
}

/// Bytes the writer gathers before a write (it writes sooner when no line waits).
const BUFFER: usize = 64 << 10;

impl std::fmt::Debug for AccessLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AccessLog").finish_non_exhaustive()
    }
}

impl AccessLog {
    /// Open the target of `config` (a relative file path is taken from
    /// `dir`, the config file's folder) and start the writer thread. Fails
    /// only when the file cannot be opened.
    pub(crate) fn start(config: &AccessLogConfig, dir: Option<&std::path::Path>, dropped: Counter) -> std::io::Result<AccessLog> {
        let target = Target::of(&config.to, dir);
        let out = target.open()?;
        let (tx, rx) = mpsc::sync_channel(config.buffer.max(1) as usize);
        let reopen = Arc::new(Mutex::new(None));
        let wanted = Arc::new(AtomicBool::new(false));
        let writer = Writer {
            out: std::io::BufWriter::with_capacity(BUFFER, out),
            reopen: reopen.clone(),
            wanted: wanted.clone(),
            dropped: dropped.clone(),
        };
        std::thread::Builder::new().name("slogate-access-log".into()).spawn(move || writer.run(rx))?;
        Ok(AccessLog { tx, dropped, reopen, wanted })
    }

    /// Hand a finished request's record to the writer; never waits. A full
    /// buffer drops it (counted).
    pub(crate) fn log(&self, record: AccessRecord) {
        match self.tx.try_send(Msg::Line(Box::new(record))) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.dropped.inc();
            }
        }
    }

    /// Reopen the file (SIGHUP, reload), or switch to the target `config`
    /// names now. Returns at once; the writer does it before its next line.
    pub(crate) fn reopen(&self, config: &AccessLogConfig, dir: Option<&std::path::Path>) {
        let target = Target::of(&config.to, dir);
        *self.reopen.lock().unwrap_or_else(|p| p.into_inner()) = Some(target);
        self.wanted.store(true, Ordering::Release);
        let _ = self.tx.try_send(Msg::Wake);
    }
}

struct Writer {
    out: std::io::BufWriter<Box<dyn Write + Send>>,
    reopen: Arc<Mutex<Option<Target>>>,
    wanted: Arc<AtomicBool>,
    dropped: Counter,
}

impl Writer {
    /// Write lines until every sender is gone; flush whenever the buffer is
    /// empty, so a line is out as soon as nothing else waits.
    fn run(mut self, rx: Receiver<Msg>) {
        while let Ok(first) = rx.recv() {
            let mut next = Some(first);
            while let Some(msg) = next {
                if self.wanted.swap(false, Ordering::AcqRel) {
                    self.switch();
                }
                if let Msg::Line(r) = msg {
                    let mut line = r.json().into_bytes();
                    line.push(b'\n');
                    if self.out.write_all(&line).is_err() {
                        self.dropped.inc();
                    }
                }
                next = rx.try_recv().ok();
            }
            let _ = self.out.flush();
        }
    }

    fn switch(&mut self) {
        let Some(target) = self.reopen.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        let _ = self.out.flush();
        match target.open() {
            Ok(out) => self.out = std::io::BufWriter::with_capacity(BUFFER, out),
            Err(e) => tracing::warn!(error = %e, target = ?target, "access log: cannot reopen; still writing to the old file"),
        }
    }
}

/// The access log in use (none while `telemetry.access_log` is `null`),
/// switched by reloads.
#[derive(Default)]
pub(crate) struct AccessLogSlot(arc_swap::ArcSwapOption<AccessLog>);

impl AccessLogSlot {
    /// The log of a gateway starting with `config`; fails when its file cannot be opened.
    pub(crate) fn start(
        config: Option<&AccessLogConfig>,
        dir: Option<&std::path::Path>,
        dropped: Counter,
    ) -> std::io::Result<AccessLogSlot> {
        let log = config.map(|c| AccessLog::start(c, dir, dropped)).transpose()?;
        Ok(AccessLogSlot(arc_swap::ArcSwapOption::from(log.map(Arc::new))))
    }

    /// The log to write to now.
    pub(crate) fn current(&self) -> Option<Arc<AccessLog>> {
        self.0.load_full()
    }

    /// A reload (or SIGHUP): reopen the file, switch to another target,
    /// start or stop the log, as `config` says. A file that cannot be opened
    /// is logged and the old one kept.
    pub(crate) fn configure(&self, config: Option<&AccessLogConfig>, dir: Option<&std::path::Path>, dropped: &Counter) {
        match (config, self.0.load_full()) {
            (None, _) => self.0.store(None),
            (Some(c), Some(log)) => log.reopen(c, dir),
            (Some(c), None) => match AccessLog::start(c, dir, dropped.clone()) {
                Ok(log) => self.0.store(Some(Arc::new(log))),
                Err(e) => tracing::warn!(error = %e, to = %c.to, "access log: cannot open; no access log until the next reload"),
            },
        }
    }
}
