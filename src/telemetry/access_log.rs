//! The access log (`telemetry.access_log`): one line per finished request,
//! for an auditor or an on-call engineer to grep.
//!
//! Rules (docs/access.md, rules 14 to 17):
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
use std::sync::mpsc::{self, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use http::HeaderValue;
use prometheus_client::metrics::counter::Counter;

use super::series::RequestSeries;
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

/// One line as written: borrowed from the record, serialised straight into
/// the writer's buffer (no JSON tree).
#[derive(serde::Serialize)]
struct Line<'a> {
    time: String,
    request_id: &'a str,
    tenant: Option<&'a str>,
    model: &'a str,
    class: &'a str,
    endpoint: &'static str,
    replica: Option<&'a str>,
    status: u16,
    outcome: &'static str,
    queue_ms: f64,
    ttft_ms: Option<f64>,
    e2e_ms: f64,
    prompt_tokens: Option<u64>,
    completion_tokens: Option<u64>,
    usage_estimated: bool,
    bytes_in: u64,
    bytes_out: u64,
}

impl AccessRecord {
    /// A request for a path slogate does not serve: no model, class, replica,
    /// tokens or bytes, only who asked and what it got.
    pub(crate) fn unrouted(request_id: HeaderValue, tenant: Option<Arc<str>>, class: Arc<str>, status: u16, e2e: Duration) -> Self {
        AccessRecord {
            end: SystemTime::now(),
            request_id,
            tenant,
            model: None,
            class,
            endpoint: Endpoint::Other,
            replica: None,
            status,
            outcome: Outcome::client_error,
            queued: Duration::ZERO,
            ttft: None,
            e2e,
            prompt_tokens: None,
            completion_tokens: None,
            usage_estimated: false,
            bytes_in: 0,
            bytes_out: 0,
        }
    }

    /// Append the record as one JSON object and a newline to `out`.
    pub(crate) fn write_json(&self, out: &mut Vec<u8>) {
        let start = self.end.checked_sub(self.e2e).unwrap_or(self.end);
        let line = Line {
            time: humantime::format_rfc3339_millis(start).to_string(),
            request_id: text(&self.request_id),
            tenant: self.tenant.as_deref(),
            model: self.model.as_deref().map_or("unknown", RequestSeries::model),
            class: &self.class,
            endpoint: self.endpoint.as_str(),
            replica: self.replica.as_ref().map(text),
            status: self.status,
            outcome: self.outcome.as_str(),
            queue_ms: ms(self.queued),
            ttft_ms: self.ttft.map(ms),
            e2e_ms: ms(self.e2e),
            prompt_tokens: self.prompt_tokens,
            completion_tokens: self.completion_tokens,
            usage_estimated: self.usage_estimated,
            bytes_in: self.bytes_in,
            bytes_out: self.bytes_out,
        };
        if serde_json::to_writer(&mut *out, &line).is_ok() {
            out.push(b'\n');
        }
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
    /// The target to switch to (a reload named another) or reopen; `Some`: a reopen is wanted.
    reopen: Arc<Mutex<Option<Target>>>,
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
        let writer = Writer { out: std::io::BufWriter::with_capacity(BUFFER, out), reopen: reopen.clone(), dropped: dropped.clone() };
        std::thread::Builder::new().name("slogate-access-log".into()).spawn(move || writer.run(rx))?;
        Ok(AccessLog { tx, dropped, reopen })
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
        let _ = self.tx.try_send(Msg::Wake);
    }
}

struct Writer {
    out: std::io::BufWriter<Box<dyn Write + Send>>,
    reopen: Arc<Mutex<Option<Target>>>,
    dropped: Counter,
}

/// How long the writer gathers lines before it writes them: one wake-up
/// and one write per interval under load, not one per request.
const GATHER: std::time::Duration = std::time::Duration::from_millis(50);

impl Writer {
    /// Write lines until every sender is gone: wait for a line, then gather
    /// what arrives for [`GATHER`] and write it at once (a line is out within
    /// that of its request's end).
    fn run(mut self, rx: Receiver<Msg>) {
        let mut lines = Vec::with_capacity(BUFFER);
        while let Ok(first) = rx.recv() {
            let mut next = Some(first);
            loop {
                while let Some(msg) = next {
                    match msg {
                        Msg::Line(r) => r.write_json(&mut lines),
                        // Lines before it go to the old file, lines after it to the new one.
                        Msg::Wake => self.switch(&mut lines),
                    }
                    next = rx.try_recv().ok();
                }
                // A reopen whose wake-up found the buffer full.
                self.switch(&mut lines);
                if lines.is_empty() {
                    break;
                }
                self.write(&mut lines);
                std::thread::sleep(GATHER);
                next = rx.try_recv().ok();
            }
        }
        self.write(&mut lines);
    }

    /// Write and flush what was gathered; a failed write counts its lines as dropped.
    fn write(&mut self, lines: &mut Vec<u8>) {
        if lines.is_empty() {
            return;
        }
        if self.out.write_all(lines).and_then(|()| self.out.flush()).is_err() {
            self.dropped.inc_by(lines.iter().filter(|b| **b == b'\n').count() as u64);
        }
        lines.clear();
    }

    /// Reopen (or switch target) if a reopen is wanted, after writing the
    /// lines gathered so far to the old file.
    fn switch(&mut self, lines: &mut Vec<u8>) {
        let Some(target) = self.reopen.lock().unwrap_or_else(|p| p.into_inner()).take() else { return };
        self.write(lines);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_is_one_json_object_with_every_field_and_its_start_time() {
        let end = std::time::UNIX_EPOCH + Duration::from_millis(1_764_201_600_250);
        let r = AccessRecord {
            end,
            request_id: HeaderValue::from_static("req-1"),
            tenant: Some("team-a".into()),
            model: None,
            class: "chat".into(),
            endpoint: Endpoint::Chat,
            replica: Some(HeaderValue::from_static("p-1")),
            status: 200,
            outcome: Outcome::ok,
            queued: Duration::from_micros(1500),
            ttft: Some(Duration::from_millis(42)),
            e2e: Duration::from_millis(250),
            prompt_tokens: Some(7),
            completion_tokens: Some(3),
            usage_estimated: false,
            bytes_in: 80,
            bytes_out: 400,
        };
        let mut out = Vec::new();
        r.write_json(&mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        assert_eq!(out.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        let v: serde_json::Value = serde_json::from_slice(&out).expect("JSON");
        assert_eq!(v["time"], "2025-11-27T00:00:00.000Z", "the request's start: its end less its e2e");
        assert_eq!((v["queue_ms"].as_f64(), v["ttft_ms"].as_f64(), v["e2e_ms"].as_f64()), (Some(1.5), Some(42.0), Some(250.0)));
        assert_eq!((v["tenant"].as_str(), v["model"].as_str(), v["endpoint"].as_str()), (Some("team-a"), Some("unknown"), Some("chat")));
        assert_eq!(v.as_object().map(|o| o.len()), Some(17));
    }
}
