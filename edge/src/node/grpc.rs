//! The `NodeGateway` gRPC service: the control stream starts a session; each
//! `RunEvents` / `TunnelFrames` call hands one run its request (unless the
//! assignment carried it) and carries its frames into its `RunStream`; each
//! `WorkspaceCalls` call is bound to its request's `WorkspaceCall`.

use std::sync::Arc;

use iop_proto::pb::{self, node_gateway_server::NodeGateway};
use tokio::sync::mpsc;
use tokio_stream::StreamExt;
use tokio_stream::adapters::Map;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::tls::NodePeer;
use crate::dispatch::{AttachError, NodeFrame, RunTable};
use crate::state::EdgeState;

/// Control messages queued per node connection.
const CONTROL_CHANNEL_CAPACITY: usize = 256;

/// A node message above this size (a provider line the node passed whole,
/// an embeddings answer, a workspace answer) is large: see [`queue`]. Run
/// text is coalesced to ~16 KiB and tunnel bodies come in 64 KiB frames,
/// so ordinary traffic never waits.
const LARGE_MESSAGE_BYTES: usize = 256 * 1024;

/// Queues a node's message of `size` encoded bytes for its consumer (the
/// client's run stream, the job's workspace call). A large one is then
/// waited on until the consumer has taken it, and the call reads the
/// node's next message only after that: a call holds at most one large
/// decoded message nobody has consumed (besides its queue of small ones),
/// and HTTP/2 flow control holds the node back meanwhile. With the
/// in-transit budget of `node::limits`, what a node's messages occupy on
/// the Edge stays bounded even when their consumers read slowly.
async fn queue<T>(queue: &mpsc::Sender<T>, item: T, size: usize) -> Result<(), ()> {
    queue.send(item).await.map_err(drop)?;
    if size > LARGE_MESSAGE_BYTES {
        // Every slot free: everything queued, this one included, was taken.
        drop(queue.reserve_many(queue.max_capacity()).await.map_err(drop)?);
    }
    Ok(())
}

pub struct GatewayService {
    pub state: Arc<EdgeState>,
}

fn peer<T>(request: &Request<T>) -> Result<NodePeer, Status> {
    // Present on every connection the mTLS accept loop let through.
    request.extensions().get::<NodePeer>().cloned().ok_or_else(|| Status::unauthenticated("no verified node identity"))
}

/// One message of a run's uplink: the opening frame or a payload frame.
enum Uplink<F> {
    Open { id: String, generation: u64 },
    Frame(F),
    Empty,
}

trait UplinkMessage: Send + 'static {
    type Frame: NodeFrame + prost::Message;
    /// The call's answer: the run's request.
    type Downlink: Send + 'static;
    fn split(self) -> Uplink<Self::Frame>;
    fn downlink(request: <Self::Frame as NodeFrame>::Request) -> Self::Downlink;
}

/// A run call's answer stream as tonic serves it: at most the run's request,
/// then at most one status. Its items are boxed in the channel because an
/// mpsc allocates a block of 32 slots up front: with the ~200-byte downlink
/// message inline that block was about 6 KiB of every open run's memory
/// (`cargo bench -p iop-e2e --bench overhead`, docs/performance.md "Benchmark").
type DownlinkStream<D> = Map<ReceiverStream<Result<Box<D>, Status>>, fn(Result<Box<D>, Status>) -> Result<D, Status>>;

fn unbox<D>(item: Result<Box<D>, Status>) -> Result<D, Status> {
    item.map(|downlink| *downlink)
}

impl UplinkMessage for pb::RunUplink {
    type Frame = pb::RunEvent;
    type Downlink = pb::RunDownlink;
    fn downlink(request: pb::RunRequest) -> pb::RunDownlink {
        pb::RunDownlink { msg: Some(pb::run_downlink::Msg::Request(request)) }
    }
    fn split(self) -> Uplink<pb::RunEvent> {
        use pb::run_uplink::Frame;
        match self.frame {
            Some(Frame::Open(o)) => Uplink::Open { id: o.run_id, generation: o.generation },
            Some(Frame::Event(e)) => Uplink::Frame(e),
            None => Uplink::Empty,
        }
    }
}

impl UplinkMessage for pb::TunnelUplink {
    type Frame = pb::ProviderTunnelFrame;
    type Downlink = pb::TunnelDownlink;
    fn downlink(request: pb::ProviderTunnelRequest) -> pb::TunnelDownlink {
        pb::TunnelDownlink { msg: Some(pb::tunnel_downlink::Msg::Request(request)) }
    }
    fn split(self) -> Uplink<pb::ProviderTunnelFrame> {
        use pb::tunnel_uplink::Msg;
        match self.msg {
            Some(Msg::Open(o)) => Uplink::Open { id: o.tunnel_id, generation: o.generation },
            Some(Msg::Frame(f)) => Uplink::Frame(f),
            None => Uplink::Empty,
        }
    }
}

#[tonic::async_trait]
impl NodeGateway for GatewayService {
    type ControlStream = ReceiverStream<Result<pb::EdgeToNode, Status>>;
    type RunEventsStream = DownlinkStream<pb::RunDownlink>;
    type TunnelFramesStream = DownlinkStream<pb::TunnelDownlink>;
    type WorkspaceCallsStream = ReceiverStream<Result<pb::WorkspaceDownlink, Status>>;

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
    ) -> Result<Response<Self::RunEventsStream>, Status> {
        let peer = peer(&request)?;
        Ok(Response::new(self.spawn_relay(self.state.link.runs.clone(), peer, request.into_inner())))
    }

    async fn tunnel_frames(
        &self,
        request: Request<Streaming<pb::TunnelUplink>>,
    ) -> Result<Response<Self::TunnelFramesStream>, Status> {
        let peer = peer(&request)?;
        Ok(Response::new(self.spawn_relay(self.state.link.tunnels.clone(), peer, request.into_inner())))
    }

    /// Binds a request's workspace call (its node, its generation, once),
    /// then carries the node's answers to the `WorkspaceCall` until either
    /// side ends it or the generation is fenced.
    async fn workspace_calls(
        &self,
        request: Request<Streaming<pb::WorkspaceUplink>>,
    ) -> Result<Response<Self::WorkspaceCallsStream>, Status> {
        use pb::workspace_uplink::Msg;
        let peer = peer(&request)?;
        let mut inbound = request.into_inner();
        let (request_id, generation) = match inbound.message().await? {
            Some(pb::WorkspaceUplink { msg: Some(Msg::Attach(a)) }) => (a.request_id, a.generation),
            _ => return Err(Status::invalid_argument("the first frame must attach the workspace call")),
        };
        let attached = match self.state.link.workspace_calls.attach(&request_id, &peer.identity.name, generation) {
            Ok(attached) => attached,
            Err(reason) => {
                self.count_dropped(reason);
                return Err(Status::failed_precondition(reason.label()));
            }
        };
        let service = GatewayService { state: self.state.clone() };
        tokio::spawn(async move {
            loop {
                let message = tokio::select! {
                    biased;
                    _ = attached.fence.cancelled() => break,
                    message = inbound.message() => message,
                };
                let Ok(Some(answer)) = message else { return };
                let size = prost::Message::encoded_len(&answer);
                tokio::select! {
                    biased;
                    _ = attached.fence.cancelled() => break,
                    queued = queue(&attached.uplink, answer, size) => if queued.is_err() {
                        return;
                    },
                }
            }
            // Fenced: whatever still arrives is counted, never delivered.
            while let Ok(Some(_)) = inbound.message().await {
                service.count_dropped(AttachError::FencedGeneration);
            }
        });
        Ok(Response::new(ReceiverStream::new(attached.downlink)))
    }
}

impl GatewayService {
    /// Serves one run's call on its own task: the answer stream carries the
    /// run's request, then ends (with a status when the Edge refused or
    /// stopped the run).
    fn spawn_relay<U: UplinkMessage>(
        &self,
        table: Arc<RunTable<U::Frame>>,
        peer: NodePeer,
        inbound: Streaming<U>,
    ) -> DownlinkStream<U::Downlink> {
        // One request, then at most one status.
        let (downlink, rx) = mpsc::channel(2);
        let service = GatewayService { state: self.state.clone() };
        tokio::spawn(async move {
            if let Err(status) = service.relay(&table, &peer, inbound, &downlink).await {
                let _ = downlink.send(Err(status)).await;
            }
        });
        ReceiverStream::new(rx).map(unbox::<U::Downlink> as fn(_) -> _)
    }

    /// Binds a run's call to its run (same node, current generation), sends
    /// the run's request down it, then carries the run's frames into its
    /// `RunStream`. Returns how many frames were accepted.
    async fn relay<U: UplinkMessage>(
        &self,
        table: &RunTable<U::Frame>,
        peer: &NodePeer,
        mut inbound: Streaming<U>,
        downlink: &mpsc::Sender<Result<Box<U::Downlink>, Status>>,
    ) -> Result<u64, Status> {
        let (id, generation) = match inbound.message().await?.map(UplinkMessage::split) {
            Some(Uplink::Open { id, generation }) => (id, generation),
            _ => return Err(Status::invalid_argument("the first frame must open the run")),
        };
        let attached = match table.attach(&id, &peer.identity.name, generation) {
            Ok(attached) => attached,
            Err(reason) => {
                self.count_dropped(reason);
                return Err(self.drop_stream(reason, inbound).await);
            }
        };
        if let Some(request) = attached.request
            && downlink.send(Ok(Box::new(U::downlink(request)))).await.is_err()
        {
            // The node abandoned the call; the RunStream sees the stream end.
            return Ok(0);
        }
        let mut accepted = 0u64;
        loop {
            let message = tokio::select! {
                biased;
                // Fenced: keep the stream open only to count what still arrives.
                _ = attached.fence.cancelled() => return Err(self.drop_stream(AttachError::FencedGeneration, inbound).await),
                // The client went away: end this stream so the node aborts.
                _ = attached.events.closed() => return Err(Status::cancelled("run cancelled by the client")),
                message = inbound.message() => message,
            };
            let frame = match message.map(|m| m.map(UplinkMessage::split)) {
                Ok(Some(Uplink::Frame(frame))) => frame,
                Ok(Some(_)) => return Err(Status::invalid_argument("only the first frame may open the run")),
                // Ending without a terminal: the RunStream reports it.
                Ok(None) | Err(_) => return Ok(accepted),
            };
            let terminal = frame.is_terminal();
            let size = prost::Message::encoded_len(&frame);
            tokio::select! {
                biased;
                _ = attached.fence.cancelled() => {
                    self.count_dropped(AttachError::FencedGeneration);
                    return Err(self.drop_stream(AttachError::FencedGeneration, inbound).await);
                }
                queued = queue(&attached.events, frame, size) => if queued.is_err() {
                    return Err(Status::cancelled("run cancelled by the client"));
                },
            }
            accepted += 1;
            if terminal {
                return Ok(accepted);
            }
        }
    }

    fn count_dropped(&self, reason: AttachError) {
        self.state.metrics.reason(&self.state.metrics.fenced_frames, reason.label());
    }

    /// Counts every further frame of a stream that may not deliver (fenced
    /// generation, unknown run, ...) until the node closes it, then refuses it.
    async fn drop_stream<U: UplinkMessage>(&self, reason: AttachError, mut inbound: Streaming<U>) -> Status {
        while let Ok(Some(_)) = inbound.message().await {
            self.count_dropped(reason);
        }
        tracing::debug!(reason = reason.label(), "dropped a node run stream");
        Status::failed_precondition(reason.label())
    }
}

#[cfg(test)]
mod tests;
