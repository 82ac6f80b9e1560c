//! An observed body outside a gateway, for the fuzz targets and the tests:
//! a `chat` class with the default targets, and a replica's stream cut into
//! reads at chosen offsets.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::classify::Class;
use crate::telemetry::metrics::Metrics;

/// A metrics registry and a `chat` class with the default targets, for
/// observing a body outside a gateway (tests, fuzzing).
pub(crate) fn fixture() -> (Arc<Metrics>, Arc<Class>) {
    let cfg = crate::config::Config::default();
    let metrics = Arc::new(Metrics::new(&cfg));
    let controls = crate::admission::Controls::new(metrics.clone());
    let class = Arc::new(Class {
        name: "chat".into(),
        header: Some(http::HeaderValue::from_static("chat")),
        tier: crate::config::Tier::Interactive,
        ttft: Duration::from_millis(300),
        itl: Duration::from_millis(50),
        control: controls.prepare("chat", &cfg.classes["chat"], &cfg),
    });
    (metrics, class)
}

/// `whole` cut into reads at the offsets `at` (in any order).
#[doc(hidden)]
pub(crate) fn cut_into_reads(whole: &Bytes, mut at: Vec<usize>) -> Vec<Bytes> {
    at.sort_unstable();
    let mut reads = Vec::new();
    let mut start = 0;
    for end in at.into_iter().map(|e| e.min(whole.len())).chain([whole.len()]) {
        reads.push(whole.slice(start..end.max(start)));
        start = end.max(start);
    }
    reads
}

/// The bytes a client gets when a replica's SSE stream arrives in
/// `chunks` (with `strip`: usage stripped). For the fuzz targets: the
/// result must not depend on how the stream was cut into reads.
#[cfg(feature = "fuzzing")]
pub(crate) use sse::observe_sse;

/// The SSE observer on reads, for the fuzz target.
#[cfg(feature = "fuzzing")]
mod sse {
    use std::pin::Pin;
    use std::sync::Arc;
    use std::task::{Context, Poll};
    use std::time::Duration;

    use bytes::Bytes;
    use http_body::{Body, Frame};
    use tokio::time::Instant;

    use super::fixture;
    use crate::classify::Class;
    use crate::proxy::observe::{ObservedBody, StreamTimeouts};
    use crate::proxy::tracker::Tracker;
    use crate::telemetry::metrics::Metrics;

    pub(crate) fn observe_sse(chunks: Vec<Bytes>, strip: bool) -> Result<Bytes, String> {
        thread_local! {
            // Built once per thread: a fuzzer calls this hundreds of thousands of times.
            static HERE: Option<(tokio::runtime::Runtime, Arc<Metrics>, Arc<Class>)> =
                tokio::runtime::Builder::new_current_thread().enable_time().build().ok().map(|rt| {
                    let (metrics, class) = fixture();
                    (rt, metrics, class)
                });
        }
        HERE.with(|here| {
            let (rt, metrics, class) = here.as_ref().ok_or("no runtime")?;
            rt.block_on(observe_sse_on(chunks, strip, metrics.clone(), class.clone()))
        })
    }

    async fn observe_sse_on(chunks: Vec<Bytes>, strip: bool, metrics: Arc<Metrics>, class: Arc<Class>) -> Result<Bytes, String> {
        use http_body_util::BodyExt;
        struct Reads(std::collections::VecDeque<Bytes>);
        impl Body for Reads {
            type Data = Bytes;
            type Error = std::io::Error;
            fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, std::io::Error>>> {
                Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
            }
        }
        let tracker = Tracker::new(metrics, class, Instant::now());
        let timeouts = StreamTimeouts {
            first_token: Duration::from_secs(60),
            idle: Duration::from_secs(60),
            total: Duration::from_secs(600),
            max_event: 1 << 20,
            send: Duration::from_secs(30),
        };
        let body = ObservedBody::sse(Reads(chunks.into()), tracker, timeouts, strip);
        body.collect().await.map(|c| c.to_bytes()).map_err(|e| e.to_string())
    }
}
