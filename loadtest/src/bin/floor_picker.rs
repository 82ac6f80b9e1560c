//! The floor of Envoy's `ext_proc` endpoint picking: a picker that names
//! the next replica in turn (the destination header and its `envoy.lb`
//! metadata, on the request's headers) and passes every other message on
//! unchanged. What slogate as the picker costs beyond it is slogate's own.
//!
//!     floor-picker --listen 127.0.0.1:9002 --endpoint 127.0.0.1:8000 [--endpoint ...]

use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use clap::Parser;
use envoy_types::pb::envoy::config::core::v3::{header_value_option::HeaderAppendAction, HeaderValue, HeaderValueOption};
use envoy_types::pb::envoy::service::ext_proc::v3::external_processor_server::{ExternalProcessor, ExternalProcessorServer};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    processing_request::Request as In, processing_response::Response as Out, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse,
    ProcessingRequest, ProcessingResponse,
};
use envoy_types::pb::google::protobuf::{value::Kind, Struct, Value};
use futures_util::{Stream, StreamExt};

#[derive(Parser)]
struct Args {
    #[arg(long)]
    listen: std::net::SocketAddr,
    /// A replica, `ip:port` (repeat).
    #[arg(long = "endpoint", required = true)]
    endpoints: Vec<String>,
}

struct Floor {
    endpoints: Arc<Vec<String>>,
    next: Arc<AtomicUsize>,
}

type Answers = Pin<Box<dyn Stream<Item = Result<ProcessingResponse, tonic::Status>> + Send>>;

fn answer(out: Out) -> ProcessingResponse {
    ProcessingResponse { response: Some(out), ..Default::default() }
}

/// The answer naming `to`.
fn pick(to: &str) -> ProcessingResponse {
    let header = HeaderValue { key: "x-gateway-destination-endpoint".into(), raw_value: to.as_bytes().to_vec(), ..Default::default() };
    let set =
        HeaderValueOption { header: Some(header), append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32, ..Default::default() };
    let common = CommonResponse {
        header_mutation: Some(HeaderMutation { set_headers: vec![set], remove_headers: Vec::new() }),
        clear_route_cache: true,
        ..Default::default()
    };
    let inner =
        Struct { fields: [("x-gateway-destination-endpoint".to_string(), Value { kind: Some(Kind::StringValue(to.into())) })].into() };
    let metadata = Struct { fields: [("envoy.lb".to_string(), Value { kind: Some(Kind::StructValue(inner)) })].into() };
    ProcessingResponse {
        response: Some(Out::RequestHeaders(HeadersResponse { response: Some(common) })),
        dynamic_metadata: Some(metadata),
        ..Default::default()
    }
}

#[tonic::async_trait]
impl ExternalProcessor for Floor {
    type ProcessStream = Answers;

    async fn process(
        &self,
        request: tonic::Request<tonic::Streaming<ProcessingRequest>>,
    ) -> Result<tonic::Response<Answers>, tonic::Status> {
        let (endpoints, next) = (self.endpoints.clone(), self.next.clone());
        let answers = request.into_inner().filter_map(move |msg| {
            let out = match msg.ok().and_then(|m| m.request) {
                Some(In::RequestHeaders(_)) => Some(pick(&endpoints[next.fetch_add(1, Ordering::Relaxed) % endpoints.len()])),
                Some(In::RequestBody(_)) => Some(answer(Out::RequestBody(BodyResponse::default()))),
                Some(In::ResponseHeaders(_)) => Some(answer(Out::ResponseHeaders(HeadersResponse::default()))),
                Some(In::ResponseBody(_)) => Some(answer(Out::ResponseBody(BodyResponse::default()))),
                _ => None,
            };
            std::future::ready(out.map(Ok))
        });
        Ok(tonic::Response::new(Box::pin(answers)))
    }
}

#[tokio::main]
async fn main() {
    let args = Args::parse();
    let floor = Floor { endpoints: Arc::new(args.endpoints), next: Arc::new(AtomicUsize::new(0)) };
    let incoming = tonic::transport::server::TcpIncoming::bind(args.listen).expect("bind").with_nodelay(Some(true));
    println!("{}", serde_json::json!({ "listen": args.listen.to_string() }));
    let served = tonic::transport::Server::builder().add_service(ExternalProcessorServer::new(floor)).serve_with_incoming(incoming).await;
    if let Err(e) = served {
        eprintln!("floor-picker: {e}");
        std::process::exit(1);
    }
}
