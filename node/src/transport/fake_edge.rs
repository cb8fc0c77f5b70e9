//! Test support: serves a fake Edge (`NodeGateway` implementation) on a
//! loopback port, without TLS, and returns a client connected to it.

use iop_proto::pb::node_gateway_client::NodeGatewayClient;
use iop_proto::pb::node_gateway_server::{NodeGateway, NodeGatewayServer};
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Channel;

pub(crate) async fn serve<S: NodeGateway>(service: S) -> NodeGatewayClient<Channel> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let server = tonic::transport::Server::builder().add_service(NodeGatewayServer::new(service));
    tokio::spawn(server.serve_with_incoming(TcpListenerStream::new(listener)));
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}")).unwrap().connect().await.unwrap();
    NodeGatewayClient::new(channel)
}
