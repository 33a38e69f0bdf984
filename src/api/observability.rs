//! The server's Prometheus metrics and the version it runs, for monitoring. Both need the
//! `viewer` role, or nothing with `--metrics-public`, so a Prometheus can scrape without a
//! token where that is wanted.

use axum::extract::State;
use axum::http::header::CONTENT_TYPE;
use axum::http::HeaderValue;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{ApiJson, NoQuery};
use crate::app::AppState;
use crate::version;

/// OpenAPI tag of the monitoring routes.
pub const TAG: &str = "observability";

/// The content type of Prometheus' text exposition format.
const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What this server was built from.
#[derive(Debug, Serialize, ToSchema)]
pub struct BuildInfo {
    /// The crate's version.
    #[schema(example = "0.1.0")]
    pub version: &'static str,
    /// The git commit built, or `unknown` when built outside a git checkout.
    #[schema(example = "185c5ac0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6")]
    pub git_commit: &'static str,
    /// When the binary was built (RFC 3339).
    #[schema(format = DateTime, example = "2024-05-01T12:00:00Z")]
    pub build_time: String,
}

/// The monitoring routes, at the root of the URL space as scrapers expect.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_metrics))
        .routes(routes!(get_version))
}

/// The server's metrics in Prometheus' text format: HTTP requests, store operations, the
/// farms, leadership, the mirror's lag and the change stream's clients (the README's
/// "Metrics" section lists them).
#[utoipa::path(
    get,
    path = "/metrics",
    tag = TAG,
    responses((status = OK, description = "Every metric, in Prometheus' text exposition format", body = String, content_type = "text/plain"))
)]
async fn get_metrics(State(app): State<AppState>, _: NoQuery) -> Response {
    app.mirror.publish_lag();
    let mut response = crate::metrics::render().into_response();
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(PROMETHEUS_TEXT));
    response
}

/// The version, git commit and build time of this server.
#[utoipa::path(
    get,
    path = "/version",
    tag = TAG,
    responses((status = OK, description = "What this server was built from", body = BuildInfo))
)]
async fn get_version(_: NoQuery) -> ApiJson<BuildInfo> {
    ApiJson(BuildInfo {
        version: version::VERSION,
        git_commit: version::GIT_COMMIT,
        build_time: version::build_time(),
    })
}
