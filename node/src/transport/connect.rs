//! How the [`Dialer`](super::Dialer) opens a connection to the Edge: TCP,
//! the mTLS handshake ([`super::tls::client_config`]), then the Edge's first
//! bytes, before the connection is handed to HTTP/2.
//!
//! In TLS 1.3 the node's side of the handshake is done before the Edge has
//! verified the node's certificate; a refusal arrives after it, as an
//! alert, and an accepted connection goes to the Edge's HTTP/2 server, which
//! speaks first (its SETTINGS). Waiting for those bytes makes a refusal this
//! dial's error, alert included ([`super::refusal`]); without the wait the
//! connection would die under the first call, and tonic keeps that cause to
//! itself.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tonic::transport::Uri;

use super::tls::ALPN_H2;

/// Opens connections to one Edge address (tonic's connector: the URI it
/// passes is ignored, the address is the config's).
#[derive(Clone)]
pub(super) struct EdgeConnector {
    host: String,
    port: u16,
    server_name: ServerName<'static>,
    tls: TlsConnector,
}

/// A connection as HTTP/2 gets it.
pub(super) type EdgeIo = TokioIo<Prefaced<TlsStream<TcpStream>>>;

impl EdgeConnector {
    pub(super) fn new(host: String, port: u16, server_name: ServerName<'static>, tls: rustls::ClientConfig) -> Self {
        Self { host, port, server_name, tls: TlsConnector::from(Arc::new(tls)) }
    }

    async fn dial(self) -> io::Result<EdgeIo> {
        let tcp = TcpStream::connect((self.host.as_str(), self.port)).await?;
        tcp.set_nodelay(true)?;
        let mut stream = self.tls.connect(self.server_name, tcp).await?;
        if stream.get_ref().1.alpn_protocol() != Some(ALPN_H2) {
            let message = "the server did not agree to HTTP/2 (ALPN h2): edge.url is not the Edge's node port";
            return Err(io::Error::new(io::ErrorKind::InvalidData, message));
        }
        let mut head = vec![0u8; 1024];
        let read = match stream.read(&mut head).await {
            Ok(read) if read > 0 => read,
            // What an Edge does when it refuses after the handshake (a node
            // over its connection limit), or one older than the alerts:
            // closed, with or without a close_notify.
            Ok(_) => return Err(silent_close()),
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(silent_close()),
            Err(e) => return Err(e),
        };
        head.truncate(read);
        Ok(TokioIo::new(Prefaced { head, taken: 0, inner: stream }))
    }
}

fn silent_close() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "the Edge closed the connection after the handshake without a word")
}

impl tower::Service<Uri> for EdgeConnector {
    type Response = EdgeIo;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<EdgeIo>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        Box::pin(self.clone().dial())
    }
}

/// A stream whose first bytes were read already: they are read again first.
pub(super) struct Prefaced<S> {
    head: Vec<u8>,
    taken: usize,
    inner: S,
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefaced<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let rest = &self.head[self.taken..];
        if rest.is_empty() {
            return Pin::new(&mut self.inner).poll_read(cx, buf);
        }
        let n = rest.len().min(buf.remaining());
        buf.put_slice(&rest[..n]);
        self.taken += n;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefaced<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests;
