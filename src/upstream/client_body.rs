//! A request's body as the request path reads it: from a client
//! connection, or whole (as Envoy sent it to slogate as its endpoint
//! picker, docs/endpoint-picker.md).

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

/// A request's body: as its client connection delivers it, or whole.
#[derive(Debug)]
pub(crate) enum ClientBody {
    Hyper(Incoming),
    /// Read whole already (taken by the first read).
    Whole(Option<Bytes>),
}

impl From<Incoming> for ClientBody {
    fn from(b: Incoming) -> Self {
        ClientBody::Hyper(b)
    }
}

impl Body for ClientBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        match self.get_mut() {
            ClientBody::Hyper(b) => Pin::new(b).poll_frame(cx),
            ClientBody::Whole(b) => Poll::Ready(b.take().filter(|b| !b.is_empty()).map(|b| Ok(Frame::data(b)))),
        }
    }

    fn is_end_stream(&self) -> bool {
        match self {
            ClientBody::Hyper(b) => b.is_end_stream(),
            ClientBody::Whole(b) => b.as_ref().is_none_or(Bytes::is_empty),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match self {
            ClientBody::Hyper(b) => b.size_hint(),
            ClientBody::Whole(b) => SizeHint::with_exact(b.as_ref().map_or(0, |b| b.len() as u64)),
        }
    }
}
