//! Reads a connection's first request head before the HTTP layer does, so that a request it
//! cannot parse at all is answered with the JSON error body instead of the HTTP layer's empty
//! one. The bytes read are replayed to the HTTP layer, which parses them again: the same
//! parser (httparse) sits under both, so what passes here passes there.
//!
//! Only the first request of a connection is checked this way; later requests on a kept-alive
//! connection come from a client that has already sent one well-formed request.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;

use super::raw_answer;
use crate::router::MAX_HEADERS;

/// The longest first head read here; the HTTP layer's own limit is far above the router's
/// (`MAX_URI_BYTES`, `MAX_HEADER_BYTES`), which answer anything in between.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long a refused connection's remaining input is read and dropped before closing.
const LINGER: Duration = Duration::from_secs(1);

/// The connection with its first head read and checked, or `None` once it has been answered
/// (malformed, too large) or given up on (closed, silent past `timeout`).
pub(super) async fn read(mut stream: TcpStream, timeout: Duration) -> Option<Replay> {
    let mut head = Vec::with_capacity(1024);
    let verdict = tokio::time::timeout(timeout, read_head(&mut stream, &mut head)).await;
    let refusal = match verdict {
        Ok(Ok(())) => {
            return Some(Replay {
                head,
                read: 0,
                stream,
            })
        }
        // Silent or gone: the HTTP layer closes such connections without an answer too.
        Err(_) | Ok(Err(HeadError::Closed)) => return None,
        Ok(Err(HeadError::Malformed(why))) => raw_answer(
            StatusCode::BAD_REQUEST,
            &format!("the request is not well-formed HTTP/1.1: {why}"),
        ),
        Ok(Err(HeadError::TooLarge)) => raw_answer(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            &format!(
                "the request head is larger than {MAX_HEAD_BYTES} bytes or has more than {} \
                 headers",
                4 * MAX_HEADERS
            ),
        ),
    };
    if let Err(e) = stream.write_all(&refusal).await {
        tracing::debug!(error = %e, "answering a malformed request");
    }
    // Closing with unread input would reset the connection and could destroy the answer
    // before the client reads it: stop sending, then read what is still coming, briefly.
    let _ = stream.shutdown().await;
    let _ =
        tokio::time::timeout(LINGER, tokio::io::copy(&mut stream, &mut tokio::io::sink())).await;
    None
}

enum HeadError {
    Closed,
    Malformed(httparse::Error),
    TooLarge,
}

/// Reads into `head` until it holds one whole request head.
async fn read_head(stream: &mut TcpStream, head: &mut Vec<u8>) -> Result<(), HeadError> {
    loop {
        let mut chunk = [0u8; 4096];
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        head.extend_from_slice(&chunk[..n]);
        let mut headers = vec![httparse::EMPTY_HEADER; 4 * MAX_HEADERS];
        match httparse::Request::new(&mut headers).parse(head) {
            Ok(httparse::Status::Complete(_)) => return Ok(()),
            Ok(httparse::Status::Partial) if head.len() > MAX_HEAD_BYTES => {
                return Err(HeadError::TooLarge)
            }
            Ok(httparse::Status::Partial) => {}
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
            Err(e) => return Err(HeadError::Malformed(e)),
        }
    }
}

/// The connection, giving back the bytes already read before reading on.
pub(super) struct Replay {
    head: Vec<u8>,
    read: usize,
    stream: TcpStream,
}

impl AsyncRead for Replay {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        if this.read < this.head.len() {
            let rest = &this.head[this.read..];
            let n = rest.len().min(buf.remaining());
            buf.put_slice(&rest[..n]);
            this.read += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for Replay {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}
