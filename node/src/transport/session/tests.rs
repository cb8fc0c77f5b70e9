//! A real control stream to a fake Edge: what a Ready session sends about
//! its providers' model residency and keep-warm.

use std::time::Duration;

use iop_proto::pb::{self, edge_to_node::Msg as Down, node_to_edge::Msg as Up};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use crate::adapter::fake::{self, Reply};
use crate::config::NodeConfig;
use crate::metrics::NodeMetrics;
use crate::transport::fake_edge::{self, Downlink};
use crate::transport::session::{self, Ours, Shared};
use crate::workspace::sandbox::{CommandEnvironment, SandboxMode};

const WAIT: Duration = Duration::from_secs(10);
const GENERATION: u64 = 42;

/// Answers Register with `providers`, NodeReady with its response, and
/// forwards every later node message.
struct FakeEdge {
    providers: Vec<pb::ProviderAssignment>,
    seen: mpsc::UnboundedSender<Up>,
}

#[tonic::async_trait]
impl fake_edge::FakeEdge for FakeEdge {
    async fn control(
        &self,
        request: Request<Streaming<pb::NodeToEdge>>,
    ) -> Result<Response<Downlink<pb::EdgeToNode>>, Status> {
        let mut inbound = request.into_inner();
        let (down, rx) = mpsc::channel(16);
        let (providers, seen) = (self.providers.clone(), self.seen.clone());
        tokio::spawn(async move {
            let send = |msg| pb::EdgeToNode { msg: Some(msg) };
            while let Ok(Some(pb::NodeToEdge { msg: Some(msg) })) = inbound.message().await {
                match &msg {
                    Up::Register(_) => {
                        let response = pb::RegisterResponse {
                            generation: GENERATION,
                            config: Some(pb::NodeConfigPayload { providers: providers.clone(), workspaces: vec![] }),
                            node_identity: "spiffe://iop.local/node/mac-1".into(),
                            replica_id: "r1".into(),
                            replicas: vec!["r1".into()],
                            duplicate: false,
                        };
                        let _ = down.send(Ok(send(Down::RegisterResponse(response)))).await;
                    }
                    Up::Ready(_) => {
                        let ready = pb::NodeReadyResponse { generation: GENERATION };
                        let _ = down.send(Ok(send(Down::ReadyResponse(ready)))).await;
                    }
                    Up::Heartbeat(hb) => {
                        let ack = pb::HeartbeatAck { seq: hb.seq };
                        let _ = down.send(Ok(send(Down::HeartbeatAck(ack)))).await;
                    }
                    _ => {}
                }
                let _ = seen.send(msg);
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn assignment(id: &str, adapter: pb::AdapterKind, base_url: &str, keep_warm: bool) -> pb::ProviderAssignment {
    pb::ProviderAssignment {
        provider_id: id.into(),
        adapter: adapter.into(),
        target_model: "test-model".into(),
        base_url: base_url.into(),
        keep_warm,
        ..Default::default()
    }
}

/// Runs one session against the fake Edge; returns what the node sent.
async fn connect(
    providers: Vec<pb::ProviderAssignment>,
    allow_keep_warm: bool,
) -> (mpsc::UnboundedReceiver<Up>, tokio_util::sync::DropGuard) {
    let (seen, rx) = mpsc::unbounded_channel();
    let client = fake_edge::serve(FakeEdge { providers, seen }).await;
    let yaml = format!(
        "edge: {{ url: \"https://edge.example:7443\" }}\ntls: {{ ca_file: ca.pem, cert_file: n.pem, key_file: n-key.pem }}\nmodels: {{ allow_keep_warm: {allow_keep_warm} }}\n"
    );
    let config = NodeConfig::from_yaml(&yaml).unwrap();
    let shared = Shared {
        ledger: Default::default(),
        replicas: Default::default(),
        admission: Default::default(),
        commands: std::sync::Arc::new(CommandEnvironment::for_tests(SandboxMode::Refused, Vec::new())),
        tracer: Default::default(),
    };
    let (registered, _verdict) = tokio::sync::oneshot::channel();
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    tokio::spawn(async move {
        let ours = Ours { id: 1, registered, shared };
        let heartbeat = iop_proto::liveness::HeartbeatProfile::PRODUCTION;
        session::run(client, crate::adapter::http_client(), NodeMetrics::new(), heartbeat, &config, shutdown, ours)
            .await
    });
    (rx, stop.drop_guard())
}

async fn next_residency(seen: &mut mpsc::UnboundedReceiver<Up>) -> Vec<pb::ProviderResidency> {
    loop {
        match tokio::time::timeout(WAIT, seen.recv()).await.expect("a residency report in time").unwrap() {
            Up::ResidencyReport(report) => return report.providers,
            _ => continue,
        }
    }
}

#[tokio::test]
async fn a_ready_session_reports_every_providers_residency_once() {
    let ollama =
        fake::serve(Reply::json(200, r#"{"models":[{"name":"test-model:latest","size":7,"size_vram":6}]}"#)).await;
    let openai = fake::serve(Reply::json(404, r#"{"error":"not found"}"#)).await;
    let (mut seen, _stop) = connect(
        vec![
            assignment("warm", pb::AdapterKind::Ollama, &ollama.base_url, false),
            assignment("plain", pb::AdapterKind::Openai, &openai.base_url, false),
        ],
        false,
    )
    .await;
    // NodeReady comes first.
    loop {
        match tokio::time::timeout(WAIT, seen.recv()).await.unwrap().unwrap() {
            Up::Ready(_) => break,
            Up::ResidencyReport(_) => panic!("residency before readiness"),
            _ => {}
        }
    }
    let mut report = next_residency(&mut seen).await;
    report.sort_by(|a, b| a.provider_id.cmp(&b.provider_id));
    let got: Vec<_> =
        report.iter().map(|r| (r.provider_id.as_str(), r.residency(), r.size_bytes, r.vram_bytes)).collect();
    assert_eq!(
        got,
        [("plain", pb::ModelResidency::Unknown, 0, 0), ("warm", pb::ModelResidency::Loaded, 7, 6)],
        "every provider in the first report"
    );
}

/// Not allowed, nothing is touched: `keep_warm::tests` (the config reaches
/// `keep_warm::apply` here, in `apply_config`).
#[tokio::test]
async fn an_allowed_keep_warm_touches_once_ready() {
    let mut ollama = fake::serve(Reply::json(200, r#"{"models":[]}"#)).await;
    let (_seen, _stop) = connect(vec![assignment("p1", pb::AdapterKind::Ollama, &ollama.base_url, true)], true).await;
    loop {
        let req = ollama.request().await;
        if req.path == "/api/generate" {
            assert_eq!(req.json(), serde_json::json!({"model": "test-model", "keep_alive": "10m"}));
            break;
        }
        assert!(["/api/show", "/api/ps"].contains(&req.path.as_str()), "only metadata calls before: {}", req.path);
    }
}
