//! The `NodeGateway` gRPC service: the control stream starts a session; each
//! `RunEvents` call carries one run's events into its `RunStream`.

use std::sync::Arc;

use iop_proto::pb::{self, node_gateway_server::NodeGateway, run_uplink::Frame};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::tls::NodePeer;
use crate::EdgeState;
use crate::dispatch::AttachError;

/// Control messages queued per node connection.
const CONTROL_CHANNEL_CAPACITY: usize = 256;

pub struct GatewayService {
    pub state: Arc<EdgeState>,
}

fn peer<T>(request: &Request<T>) -> Result<NodePeer, Status> {
    // Present on every connection the mTLS accept loop let through.
    request.extensions().get::<NodePeer>().cloned().ok_or_else(|| Status::unauthenticated("no verified node identity"))
}

#[tonic::async_trait]
impl NodeGateway for GatewayService {
    type ControlStream = ReceiverStream<Result<pb::EdgeToNode, Status>>;

    async fn control(
        &self,
        request: Request<Streaming<pb::NodeToEdge>>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        let peer = peer(&request)?;
        let (out, rx) = mpsc::channel(CONTROL_CHANNEL_CAPACITY);
        tokio::spawn(super::session::run(self.state.clone(), peer, request.into_inner(), out));
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn run_events(
        &self,
        request: Request<Streaming<pb::RunUplink>>,
    ) -> Result<Response<pb::RunEventsAck>, Status> {
        let peer = peer(&request)?;
        let mut inbound = request.into_inner();
        let open = match inbound.message().await? {
            Some(pb::RunUplink { frame: Some(Frame::Open(open)) }) => open,
            _ => return Err(Status::invalid_argument("first RunEvents frame must be RunOpen")),
        };
        let attached = match self.state.runs.attach(&open.run_id, &peer.identity.name, open.generation) {
            Ok(attached) => attached,
            Err(reason) => {
                self.count_dropped(reason);
                return Err(self.drop_stream(reason, inbound).await);
            }
        };
        let mut accepted = 0u64;
        loop {
            let frame = tokio::select! {
                biased;
                // Fenced: keep the stream open only to count what still arrives.
                _ = attached.fence.cancelled() => return Err(self.drop_stream(AttachError::FencedGeneration, inbound).await),
                // The client went away: end this stream so the node aborts.
                _ = attached.events.closed() => return Err(Status::cancelled("run cancelled by the client")),
                frame = inbound.message() => frame,
            };
            let event = match frame {
                Ok(Some(pb::RunUplink { frame: Some(Frame::Event(event)) })) => event,
                Ok(Some(_)) => return Err(Status::invalid_argument("RunEvents frames after the first must be events")),
                // Ending without a terminal: the RunStream reports it.
                Ok(None) | Err(_) => return Ok(Response::new(pb::RunEventsAck { accepted_events: accepted })),
            };
            let terminal = event.is_terminal();
            tokio::select! {
                biased;
                _ = attached.fence.cancelled() => {
                    self.count_dropped(AttachError::FencedGeneration);
                    return Err(self.drop_stream(AttachError::FencedGeneration, inbound).await);
                }
                sent = attached.events.send(event) => if sent.is_err() {
                    return Err(Status::cancelled("run cancelled by the client"));
                },
            }
            accepted += 1;
            if terminal {
                return Ok(Response::new(pb::RunEventsAck { accepted_events: accepted }));
            }
        }
    }
}

impl GatewayService {
    fn count_dropped(&self, reason: AttachError) {
        self.state.metrics.reason(&self.state.metrics.fenced_frames, reason.label());
    }

    /// Counts every further frame of a stream that may not deliver (fenced
    /// generation, unknown run, ...) until the node closes it, then refuses it.
    async fn drop_stream(&self, reason: AttachError, mut inbound: Streaming<pb::RunUplink>) -> Status {
        while let Ok(Some(_)) = inbound.message().await {
            self.count_dropped(reason);
        }
        tracing::debug!(reason = reason.label(), "dropped a RunEvents stream");
        Status::failed_precondition(reason.label())
    }
}
