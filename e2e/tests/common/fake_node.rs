//! A test-controlled node speaking the wire directly (real mTLS, a
//! certificate the test PKI issued): what a modified or hostile node
//! binary can send.

use iop_e2e::pki::{PairFiles, Validity};
use iop_proto::pb::{self, edge_to_node::Msg, node_to_edge, run_event, run_uplink::Frame};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{NODE, Stack};

/// A test-controlled node speaking the wire directly (real mTLS), so the test
/// decides exactly when it registers, becomes ready, and stops answering.
pub struct FakeNode {
    pub client: pb::node_gateway_client::NodeGatewayClient<tonic::transport::Channel>,
    pub out: mpsc::Sender<pb::NodeToEdge>,
    pub inbound: tonic::Streaming<pb::EdgeToNode>,
    pub generation: u64,
    /// What it dialed with (the node's own dialer): dials again as the node
    /// does, with the same TLS client config.
    pub dialer: iop_node::transport::Dialer,
}

impl FakeNode {
    pub async fn register(stack: &Stack) -> FakeNode {
        let pair = stack.pki.node_cert(NODE, Validity::Current).unwrap();
        Self::register_with(stack, &pair).await
    }

    /// [`FakeNode::register`] with the certificate `pair`.
    pub async fn register_with(stack: &Stack, pair: &PairFiles) -> FakeNode {
        let config = iop_e2e::harness::node_config(stack.grpc, &stack.pki.ca_file, pair, (50, 500));
        let dialer = iop_node::transport::Dialer::new(&config).unwrap();
        let mut client = dialer.connect().await.unwrap();
        let (out, rx) = mpsc::channel(16);
        out.send(msg(node_to_edge::Msg::Register(pb::Register { node_version: "fake".into(), ..Default::default() })))
            .await
            .unwrap();
        let mut inbound = client.control(ReceiverStream::new(rx)).await.unwrap().into_inner();
        let generation = match inbound.message().await.unwrap().unwrap().msg {
            Some(Msg::RegisterResponse(r)) => r.generation,
            other => panic!("expected RegisterResponse, got {other:?}"),
        };
        FakeNode { client, out, inbound, generation, dialer }
    }

    /// Sends NodeReady and returns every control message up to the
    /// NodeReadyResponse.
    pub async fn ready(&mut self) -> Vec<Msg> {
        // Statuses must name each provider's exact adapter and target; an
        // inexact one leaves the provider unavailable on this connection.
        let providers = [("ollama-mock", pb::AdapterKind::Ollama), ("openai-mock", pb::AdapterKind::Openai)]
            .map(|(id, adapter)| pb::ProviderStatus {
                provider_id: id.into(),
                adapter: adapter.into(),
                target_model: "mock".into(),
                health: pb::ProviderHealth::Available.into(),
                ..Default::default()
            })
            .to_vec();
        self.out
            .send(msg(node_to_edge::Msg::Ready(pb::NodeReady {
                generation: self.generation,
                providers,
                ..Default::default()
            })))
            .await
            .unwrap();
        let mut seen = Vec::new();
        loop {
            match self.inbound.message().await.unwrap().unwrap().msg.unwrap() {
                Msg::ReadyResponse(_) => return seen,
                other => seen.push(other),
            }
        }
    }

    /// Reads the control stream, answering the Edge's heartbeats, until a
    /// run is assigned.
    pub async fn next_run_answering_heartbeats(&mut self) -> pb::RunAssign {
        loop {
            match self.inbound.message().await.unwrap().unwrap().msg.unwrap() {
                Msg::RunAssign(a) => return a,
                Msg::Heartbeat(hb) => {
                    let ack = node_to_edge::Msg::HeartbeatAck(pb::HeartbeatAck { seq: hb.seq });
                    self.out.send(msg(ack)).await.unwrap();
                }
                _ => {}
            }
        }
    }

    /// The next run assigned on the control stream (its id only).
    pub async fn next_run(&mut self) -> pb::RunAssign {
        loop {
            if let Msg::RunAssign(a) = self.inbound.message().await.unwrap().unwrap().msg.unwrap() {
                return a;
            }
        }
    }
}

pub fn msg(m: node_to_edge::Msg) -> pb::NodeToEdge {
    pb::NodeToEdge { msg: Some(m) }
}

pub fn event(seq: u64, e: run_event::Event) -> pb::RunUplink {
    pb::RunUplink { frame: Some(Frame::Event(pb::RunEvent { seq, event: Some(e) })) }
}
