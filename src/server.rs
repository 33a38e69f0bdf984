//! Serves the API on a listener, over HTTP or HTTPS, until told to stop, within the
//! connection limits.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_io_timeout::TimeoutStream;
use tokio_rustls::server::TlsStream;

use crate::app::AppState;
use crate::error::{ApiError, RETRY_AFTER_SECONDS};
use crate::router::{self, MAX_HEADERS};

mod json_errors;
mod tls;

use json_errors::JsonErrors;
use tls::Handshake;
pub use tls::Tls;

/// How long accepting pauses after a failure (such as running out of file descriptors), so
/// that the loop does not spin while the cause lasts.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// Serves plain HTTP until `shutdown` completes; see [`run_with`].
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    run_with(listener, None, state, shutdown).await
}

/// Serves until `shutdown` completes, then stops accepting connections and returns once the
/// requests in flight have been answered. With `tls`, it serves HTTPS only.
///
/// The caller binds the listener, so tests can pass `127.0.0.1:0` and read the port back.
/// Logs `listening on ADDR` first; end-to-end tests parse that line.
///
/// Each connection is HTTP/1.1 and is closed when it goes `--header-read-timeout` without a
/// complete request head (silent, trickling or idle), or as long without taking any of an
/// answer being sent to it; over HTTPS the TLS handshake must also be done within that time,
/// before the first head's own. At most `--max-connections` are open at once; past that, a
/// new one is answered 503 at once and closed (over HTTPS, closed unanswered), so a flood of
/// idle clients can neither exhaust the file descriptors nor leave newcomers hanging.
pub async fn run_with(
    listener: TcpListener,
    tls: Option<Arc<Tls>>,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!("listening on {addr}");
    if let Some(tls) = &tls {
        tracing::info!("serving HTTPS with {}", tls.cert_path().display());
    }
    let limits = state.limits;
    let service = TowerToHyperService::new(router::build(state));
    let mut http = http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        // Above the router's own limit, so that it answers with the JSON body.
        .max_headers(4 * MAX_HEADERS);
    // A client that takes none of its answer for as long as a head may take to arrive is
    // cut off, so that it holds neither its slot nor a graceful stop.
    let stall = limits.header_read_timeout;
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let too_many = refusal();
    let connections = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(ACCEPT_PAUSE).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            // Over HTTPS no answer can be sent before a handshake, which would cost the
            // descriptors the cap protects: the connection is closed unanswered.
            if tls.is_none() {
                refuse(&stream, &too_many);
            }
            tracing::warn!("connection refused: too many open connections");
            crate::metrics::connection_refused();
            continue;
        };
        // Taken now, so that shutdown also waits for a connection still in its handshake.
        let watcher = connections.watcher();
        let (http, service, tls) = (http.clone(), service.clone(), tls.clone());
        tokio::spawn(async move {
            // Timeouts and clients hanging up end connections all the time: not worth more.
            let served = match tls {
                None => {
                    let io = TokioIo::new(JsonErrors::new(cut_off_when_stalled(stream, stall)));
                    watcher.watch(http.serve_connection(io, service)).await
                }
                Some(tls) => match secure(&tls, stream, limits.header_read_timeout).await {
                    Some(stream) => {
                        let io = TokioIo::new(JsonErrors::new(cut_off_when_stalled(stream, stall)));
                        watcher.watch(http.serve_connection(io, service)).await
                    }
                    None => Ok(()),
                },
            };
            if let Err(e) = served {
                tracing::debug!(error = %e, "connection ended");
            }
            drop(slot);
        });
    }
    drop(listener);
    connections.shutdown().await;
    tracing::info!("server stopped; in-flight requests answered");
    Ok(())
}

/// `stream`, whose writes fail once the client has taken nothing of them for `limit`: a
/// client that never reads its answers would otherwise keep its connection, its slot under
/// `--max-connections` and a graceful stop waiting forever.
fn cut_off_when_stalled<S: AsyncRead + AsyncWrite>(
    stream: S,
    limit: Duration,
) -> Pin<Box<TimeoutStream<S>>> {
    let mut stream = TimeoutStream::new(stream);
    stream.set_write_timeout(Some(limit));
    Box::pin(stream)
}

/// The connection past its TLS handshake, done within `timeout`; `None` when it cannot be
/// served: too slow, not TLS (answered 400 and closed), or a failed handshake.
async fn secure(
    tls: &Tls,
    stream: TcpStream,
    timeout: Duration,
) -> Option<Box<TlsStream<TcpStream>>> {
    let deadline = Instant::now() + timeout;
    match tokio::time::timeout_at(deadline, tls.handshake(stream)).await {
        Ok(Ok(Handshake::Done(stream))) => Some(stream),
        Ok(Ok(Handshake::NotTls(stream))) => {
            let answer = raw_answer(
                StatusCode::BAD_REQUEST,
                "this port serves HTTPS only: send the request over TLS (an https:// URL)",
            );
            if tokio::time::timeout_at(deadline, answer_plain(stream, &answer))
                .await
                .is_err()
            {
                tracing::debug!("a plain HTTP client on the HTTPS port was too slow to answer");
            }
            None
        }
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "TLS handshake failed");
            None
        }
        Err(_) => {
            tracing::debug!("TLS handshake timed out");
            None
        }
    }
}

/// Reads what the client has sent (so that closing does not reset the connection before it
/// reads the answer), writes `answer` and closes.
async fn answer_plain(mut stream: TcpStream, answer: &[u8]) {
    let mut request = [0; 4096];
    let written = async {
        let _ = stream.read(&mut request).await?;
        stream.write_all(answer).await?;
        stream.shutdown().await
    };
    if let Err(e) = written.await {
        tracing::debug!(error = %e, "answering a plain HTTP client on the HTTPS port");
    }
}

/// The answer to a connection past the cap: a complete 503 with the JSON error body, sent
/// before reading anything, and the connection closed.
fn refusal() -> Vec<u8> {
    raw_answer(
        StatusCode::SERVICE_UNAVAILABLE,
        "the server has too many open connections; retry later",
    )
}

/// A whole HTTP/1.1 answer with the JSON error body that closes the connection, for the
/// answers given before the router sees a request.
fn raw_answer(status: StatusCode, message: &str) -> Vec<u8> {
    let body = serde_json::to_vec(&ApiError::new(status, message.to_owned()).body())
        .expect("an error body serializes");
    let retry = if status == StatusCode::SERVICE_UNAVAILABLE {
        format!("retry-after: {RETRY_AFTER_SECONDS}\r\n")
    } else {
        String::new()
    };
    let head = format!(
        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
         {retry}connection: close\r\n\r\n",
        body.len()
    );
    [head.into_bytes(), body].concat()
}

/// Writes `answer` without waiting (it fits any socket buffer) and drops the connection.
fn refuse(stream: &TcpStream, answer: &[u8]) {
    if let Err(e) = stream.try_write(answer) {
        tracing::debug!(error = %e, "refusing a connection past the cap");
    }
}
