//! Serves the API on a listener until told to stop.

use std::future::Future;
use std::io;

use tokio::net::TcpListener;

use crate::app::AppState;
use crate::router;

/// Serves until `shutdown` completes, then stops accepting connections and returns once the
/// requests in flight have been answered.
///
/// The caller binds the listener, so tests can pass `127.0.0.1:0` and read the port back.
/// Logs `listening on ADDR` first; end-to-end tests parse that line.
pub async fn run(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> io::Result<()> {
    let addr = listener.local_addr()?;
    tracing::info!("listening on {addr}");
    axum::serve(listener, router::build(state))
        .with_graceful_shutdown(shutdown)
        .await?;
    tracing::info!("server stopped; in-flight requests answered");
    Ok(())
}
