//! OpenTelemetry traces: one span per request, exported over OTLP/HTTP
//! (protobuf) by the SDK's batch processor, which runs on its own thread
//! with a bounded queue: the request path only records span fields and
//! never waits on an export (a full queue drops spans, it does not block).
//!
//! Span attributes follow the GenAI semantic conventions
//! (`gen_ai.operation.name`, `gen_ai.request.model`,
//! `gen_ai.usage.input_tokens`, `gen_ai.usage.output_tokens`,
//! `gen_ai.response.finish_reasons`) plus slogate's own (`slogate.class`,
//! `slogate.tier`, `slogate.request_id`, `slogate.queue_ms`, `slogate.ttft_ms`, `slogate.outcome`,
//! `slogate.replica`). The W3C `traceparent` of an incoming request becomes
//! the span's parent, and the span's context is sent on to the replica.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use super::accounting::Finished;
use super::SliClass;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Keeps the exporter alive; flushes and shuts it down when dropped.
pub struct OtelGuard {
    provider: SdkTracerProvider,
}

impl OtelGuard {
    /// Export what is buffered now (tests; shutdown).
    pub fn flush(&self) {
        let _ = self.provider.force_flush();
    }
}

impl Drop for OtelGuard {
    fn drop(&mut self) {
        let _ = self.provider.shutdown();
    }
}

/// The OTLP/HTTP traces URL for an endpoint: `http://host:4318` gets
/// `/v1/traces` appended; a URL that already names a path is used as is.
pub fn traces_url(endpoint: &str) -> String {
    let e = endpoint.trim_end_matches('/');
    let has_path = e.splitn(4, '/').nth(3).is_some_and(|p| !p.is_empty());
    if has_path {
        e.to_string()
    } else {
        format!("{e}/v1/traces")
    }
}

/// Install the global subscriber: logs on stderr (text or JSON) and spans
/// to the OTLP endpoint. Call outside any async runtime (the exporter's HTTP
/// client runs on the processor's own thread).
pub fn init(endpoint: &str, json_logs: bool) -> Result<OtelGuard, String> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_endpoint(traces_url(endpoint))
        .with_timeout(std::time::Duration::from_secs(5))
        .build()
        .map_err(|e| format!("telemetry.otlp_endpoint {endpoint}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder().with_service_name("slogate").build();
    let provider = SdkTracerProvider::builder().with_batch_exporter(exporter).with_resource(resource).build();
    let tracer = provider.tracer("slogate");
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    // Only slogate's request spans go to OTLP; logs keep their own filter.
    let otel = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::Targets::new().with_target(REQUEST_TARGET, tracing::Level::INFO));
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let registry = tracing_subscriber::registry().with(otel);
    let result = if json_logs {
        registry.with(fmt.json().with_filter(filter)).try_init()
    } else {
        registry.with(fmt.with_filter(filter)).try_init()
    };
    result.map_err(|e| format!("tracing subscriber: {e}"))?;
    Ok(OtelGuard { provider })
}

/// The target of request spans (what the OTLP layer exports).
pub const REQUEST_TARGET: &str = "slogate::request";

/// A span for one request, parented on the caller's `traceparent` if any.
pub fn request_span(headers: &http::HeaderMap, operation: &'static str) -> tracing::Span {
    let span = tracing::info_span!(
        target: "slogate::request",
        "request",
        otel.name = operation,
        otel.kind = "server",
        otel.status_code = tracing::field::Empty,
        gen_ai.operation.name = operation,
        gen_ai.request.model = tracing::field::Empty,
        gen_ai.usage.input_tokens = tracing::field::Empty,
        gen_ai.usage.output_tokens = tracing::field::Empty,
        gen_ai.response.finish_reasons = tracing::field::Empty,
        slogate.class = tracing::field::Empty,
        slogate.tier = tracing::field::Empty,
        slogate.queue_ms = tracing::field::Empty,
        slogate.ttft_ms = tracing::field::Empty,
        slogate.outcome = tracing::field::Empty,
        slogate.replica = tracing::field::Empty,
        slogate.request_id = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let _ = span.set_parent(parent);
    span
}

/// Put the span's W3C `traceparent` (and `tracestate`) on an upstream request.
pub fn inject(span: &tracing::Span, headers: &mut http::HeaderMap) {
    let cx = span.context();
    TraceContextPropagator::new().inject_context(&cx, &mut HeaderInjector(headers));
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (http::HeaderName::from_bytes(key.as_bytes()), http::HeaderValue::from_str(&value)) {
            self.0.insert(k, v);
        }
    }
}

/// Close a request's span with how it went: its outcome, TTFT, tokens,
/// finish reason and replica (a no-op when tracing is off).
pub(crate) fn span_finished(span: &tracing::Span, f: &Finished, finish_reason: Option<&str>, replica: Option<&str>) {
    if span.is_disabled() {
        return;
    }
    span.record("slogate.outcome", f.outcome.as_str());
    if let Some(t) = f.ttft() {
        span.record("slogate.ttft_ms", t.as_secs_f64() * 1000.0);
    }
    if let Some(u) = f.usage {
        span.record("gen_ai.usage.input_tokens", u.prompt_tokens);
        span.record("gen_ai.usage.output_tokens", u.completion_tokens);
    }
    if let Some(r) = finish_reason {
        span.record("gen_ai.response.finish_reasons", r);
    }
    if let Some(r) = replica {
        span.record("slogate.replica", r);
    }
    span.record("otel.status_code", if f.outcome.sli() == SliClass::Bad { "ERROR" } else { "OK" });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traces_url_appends_the_otlp_path_only_when_missing() {
        assert_eq!(traces_url("http://127.0.0.1:4318"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(traces_url("http://127.0.0.1:4318/"), "http://127.0.0.1:4318/v1/traces");
        assert_eq!(traces_url("http://collector:4318/custom/traces"), "http://collector:4318/custom/traces");
    }
}
