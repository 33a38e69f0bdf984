//! Cuts off a client that stops taking the answer it is sent.
//!
//! The HTTP layer bounds how long a client may take to send a request head, and the router
//! how long its body, but nothing bounds how long an answer may wait on a client that
//! never reads it: once the socket's buffers are full, the connection would wait forever,
//! holding its slot under `--max-connections` and holding up a graceful stop. This wrapper
//! of the connection fails a write that has made no progress for the limit, which ends the
//! connection.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Sleep;

/// A connection whose writes fail once the client has taken nothing for `limit`.
pub(super) struct StalledWrites<S> {
    stream: S,
    limit: Duration,
    /// Since when the client has taken nothing of what is waiting to be written.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl<S> StalledWrites<S> {
    pub(super) fn new(stream: S, limit: Duration) -> Self {
        StalledWrites {
            stream,
            limit,
            stalled: None,
        }
    }

    /// What to answer for a write of the inner stream that is `Pending`: still `Pending`
    /// within the limit, an error past it.
    fn waiting<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match stalled.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took nothing of the answer for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Passes on the inner stream's answer, timing how long it makes no progress.
    fn timed<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        match polled {
            Poll::Ready(result) => {
                self.stalled = None;
                Poll::Ready(result)
            }
            Poll::Pending => self.waiting(cx),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for StalledWrites<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for StalledWrites<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_write(cx, buf);
        this.timed(cx, polled)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_flush(cx);
        this.timed(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.stream).poll_shutdown(cx);
        this.timed(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncWriteExt;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_fails_only_once_nothing_is_taken_for_the_limit() {
        let (client, server) = tokio::io::duplex(4);
        let mut server = StalledWrites::new(server, Duration::from_secs(10));
        // Taken bit by bit, however long the whole takes.
        let reader = tokio::spawn(async move {
            let mut client = client;
            let mut buf = [0; 4];
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(9)).await;
                tokio::io::AsyncReadExt::read_exact(&mut client, &mut buf)
                    .await
                    .unwrap();
            }
            client
        });
        server.write_all(&[1; 20]).await.unwrap();
        let _client = reader.await.unwrap();
        // Then nothing more is taken.
        let error = server.write_all(&[1; 8]).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::TimedOut);
    }
}
