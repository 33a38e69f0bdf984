//! Gives the HTTP layer's own error answers the JSON error body.
//!
//! A request the HTTP layer (hyper) cannot parse never reaches the router: hyper answers it
//! itself (400 for a broken request line, header or framing, 414 or 431 for a head past its
//! limits) with an empty body, and closes the connection. This wrapper of the connection
//! recognises such an answer as it is written and sends ours instead. The router never
//! answers a 4xx with an empty body, so an empty-bodied 4xx is always hyper's. Only a write
//! that is such a head whole, and does not go on with what a write before left unwritten,
//! is taken for one: an answer's body (a manifest served as YAML) may hold the same text,
//! and a slow reader may leave the rest of a write to start exactly there.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use axum::http::StatusCode;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::raw_answer;

/// A connection whose empty-bodied 4xx answers are replaced with the JSON error body.
pub(super) struct JsonErrors<S> {
    stream: S,
    /// Our answer in place of the HTTP layer's, and how much of it is written.
    replacement: Option<(Vec<u8>, usize)>,
    /// The last write was taken in part: the next goes on with the rest of its bytes, which
    /// start no answer.
    continuing: bool,
}

impl<S> JsonErrors<S> {
    pub(super) fn new(stream: S) -> Self {
        JsonErrors {
            stream,
            replacement: None,
            continuing: false,
        }
    }
}

/// The status of an answer hyper wrote by itself: a 4xx head with `content-length: 0`, and
/// nothing after it.
fn own_error_status(written: &[u8]) -> Option<StatusCode> {
    let rest = written.strip_prefix(b"HTTP/1.1 4")?;
    let end = rest.len().checked_sub(4)?;
    if &rest[end..] != b"\r\n\r\n" || rest[..end].windows(4).any(|w| w == b"\r\n\r\n") {
        return None;
    }
    let head = std::str::from_utf8(&rest[..end]).ok()?;
    let empty = head
        .split("\r\n")
        .any(|line| line.eq_ignore_ascii_case("content-length: 0"));
    if !empty {
        return None;
    }
    let code: u16 = format!("4{}", head.get(..2)?).parse().ok()?;
    StatusCode::from_u16(code).ok()
}

fn message(status: StatusCode) -> &'static str {
    match status {
        StatusCode::URI_TOO_LONG => "the request target is longer than the server accepts",
        StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE => {
            "the request's header section is larger than the server accepts"
        }
        _ => "the request is not well-formed HTTP/1.1",
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for JsonErrors<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for JsonErrors<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        if this.replacement.is_none() {
            match own_error_status(buf).filter(|_| !this.continuing) {
                Some(status) => {
                    this.replacement = Some((raw_answer(status, message(status)), 0));
                }
                None => {
                    let written = ready!(Pin::new(&mut this.stream).poll_write(cx, buf))?;
                    this.continuing = written < buf.len();
                    return Poll::Ready(Ok(written));
                }
            }
        }
        // The answer the HTTP layer meant to write counts as written once ours is.
        if let Some((answer, written)) = &mut this.replacement {
            while *written < answer.len() {
                *written += ready!(Pin::new(&mut this.stream).poll_write(cx, &answer[*written..]))?;
            }
        }
        Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_empty_bodied_4xx_heads_are_the_http_layers() {
        let own = b"HTTP/1.1 400 Bad Request\r\nconnection: close\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(own_error_status(own), Some(StatusCode::BAD_REQUEST));
        let own = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(
            own_error_status(own),
            Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE)
        );
        let ours = b"HTTP/1.1 404 Not Found\r\ncontent-length: 57\r\n\r\n{}";
        assert_eq!(own_error_status(ours), None);
        let ok = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n";
        assert_eq!(own_error_status(ok), None);
        let followed = b"HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\nid: x\n";
        assert_eq!(own_error_status(followed), None);
    }

    /// A socket that takes at most `room` bytes of a write, then everything.
    struct Slow {
        room: Option<usize>,
        written: Vec<u8>,
    }

    impl AsyncWrite for Slow {
        fn poll_write(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            let taken = self
                .room
                .take()
                .map_or(buf.len(), |room| room.min(buf.len()));
            self.written.extend_from_slice(&buf[..taken]);
            Poll::Ready(Ok(taken))
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// An answer whose body holds the text of an empty-bodied 4xx head (a manifest served
    /// as YAML may), written to a reader that takes the write only up to that text, goes
    /// out as it is: the rest of a write is no answer of the HTTP layer's.
    #[tokio::test]
    async fn a_body_holding_a_4xx_head_is_written_as_it_is() {
        use tokio::io::AsyncWriteExt;
        let head =
            "HTTP/1.1 200 OK\r\ncontent-type: application/yaml\r\ncontent-length: 47\r\n\r\n";
        let planted = "HTTP/1.1 400 Bad Request\r\ncontent-length: 0\r\n\r\n";
        let answer = format!("{head}{planted}");
        let slow = Slow {
            room: Some(head.len()),
            written: Vec::new(),
        };
        let mut connection = JsonErrors::new(slow);
        connection.write_all(answer.as_bytes()).await.unwrap();
        assert_eq!(String::from_utf8_lossy(&connection.stream.written), answer);
    }
}
