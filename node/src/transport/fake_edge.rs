//! Test support: the one fake Edge. A test implements [`FakeEdge`] for the
//! calls it plays (every other call is refused as `unimplemented`), and
//! [`serve`] serves it on a loopback port, without TLS, returning a client
//! connected to it.

use iop_proto::pb;
use iop_proto::pb::node_gateway_client::NodeGatewayClient;
use iop_proto::pb::node_gateway_server::{NodeGateway, NodeGatewayServer};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::transport::Channel;
use tonic::{Request, Response, Status, Streaming};

/// What a fake Edge sends down one call.
pub(crate) type Downlink<D> = ReceiverStream<Result<D, Status>>;

/// The calls of a fake Edge, each refused unless the test plays it.
#[tonic::async_trait]
pub(crate) trait FakeEdge: Send + Sync + 'static {
    async fn control(
        &self,
        _: Request<Streaming<pb::NodeToEdge>>,
    ) -> Result<Response<Downlink<pb::EdgeToNode>>, Status> {
        Err(Status::unimplemented("control"))
    }

    async fn run_events(
        &self,
        _: Request<Streaming<pb::RunUplink>>,
    ) -> Result<Response<Downlink<pb::RunDownlink>>, Status> {
        Err(Status::unimplemented("run_events"))
    }

    async fn tunnel_frames(
        &self,
        _: Request<Streaming<pb::TunnelUplink>>,
    ) -> Result<Response<Downlink<pb::TunnelDownlink>>, Status> {
        Err(Status::unimplemented("tunnel_frames"))
    }

    async fn workspace_calls(
        &self,
        _: Request<Streaming<pb::WorkspaceUplink>>,
    ) -> Result<Response<Downlink<pb::WorkspaceDownlink>>, Status> {
        Err(Status::unimplemented("workspace_calls"))
    }
}

/// The gRPC service of a [`FakeEdge`].
pub(crate) struct Gateway<F>(pub(crate) F);

#[tonic::async_trait]
impl<F: FakeEdge> NodeGateway for Gateway<F> {
    type ControlStream = Downlink<pb::EdgeToNode>;
    type RunEventsStream = Downlink<pb::RunDownlink>;
    type TunnelFramesStream = Downlink<pb::TunnelDownlink>;
    type WorkspaceCallsStream = Downlink<pb::WorkspaceDownlink>;

    async fn control(
        &self,
        request: Request<Streaming<pb::NodeToEdge>>,
    ) -> Result<Response<Self::ControlStream>, Status> {
        self.0.control(request).await
    }

    async fn run_events(
        &self,
        request: Request<Streaming<pb::RunUplink>>,
    ) -> Result<Response<Self::RunEventsStream>, Status> {
        self.0.run_events(request).await
    }

    async fn tunnel_frames(
        &self,
        request: Request<Streaming<pb::TunnelUplink>>,
    ) -> Result<Response<Self::TunnelFramesStream>, Status> {
        self.0.tunnel_frames(request).await
    }

    async fn workspace_calls(
        &self,
        request: Request<Streaming<pb::WorkspaceUplink>>,
    ) -> Result<Response<Self::WorkspaceCallsStream>, Status> {
        self.0.workspace_calls(request).await
    }
}

pub(crate) async fn serve<F: FakeEdge>(fake: F) -> NodeGatewayClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder().add_service(NodeGatewayServer::new(Gateway(fake)));
    tokio::spawn(server.serve_with_incoming(TcpListenerStream::new(listener)));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    NodeGatewayClient::new(channel)
}
