//! Wires every route, the OpenAPI document, the JSON fallbacks and the middleware together.

use axum::extract::Request;
use axum::http::header::{CONTENT_LENGTH, CONTENT_TYPE};
use axum::http::{HeaderName, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tower::ServiceBuilder;
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::{Level, Span};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::api;
use crate::app::AppState;
use crate::error::{ApiError, Cause, ErrorBody};

/// Largest request body accepted: generous for any resource (a value in the store is at most
/// 512 KiB) while bounding what one request can make the server buffer.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Header carrying the request id, as most proxies and tracing tools expect.
pub const REQUEST_ID_HEADER: HeaderName = HeaderName::from_static("x-request-id");

/// The OpenAPI document's root: tags and the shared schemas.
#[derive(OpenApi)]
#[openapi(
    tags(
        (name = api::health::TAG, description = "Liveness and readiness probes"),
        (name = api::labels::TAG, description = "Labels on nodes, pods, RCs, rolls and pod clusters, and selector queries"),
        (name = api::p2_labels::TAG, description = "P2's own label routes, for P2 tools using an HTTP label applicator"),
        (name = api::nodes::TAG, description = "Nodes, known from their node labels"),
        (name = api::pods::TAG, description = "Legacy pods in the intent tree, with labels and health"),
        (name = api::pod_health::TAG, description = "Pod health reported by node agents"),
        (name = api::reality::TAG, description = "Manifests node agents report installed"),
        (name = api::daemonsets::TAG, description = "Daemon sets: a pod on every node a selector matches"),
        (name = api::rcs::TAG, description = "Replication controllers: create, list, read with status, patch, delete"),
        (name = api::leader::TAG, description = "Which server runs the farms"),
        (name = api::rolls::TAG, description = "Rolling updates: moving replicas from one RC to another"),
    ),
    components(schemas(ErrorBody, Cause))
)]
struct ApiDoc;

/// Every API route with its OpenAPI description. Resource routers are merged (root-level
/// probes) or nested (resources) here; the document comes from the same router that serves,
/// so the two cannot drift.
pub fn api() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(api::health::router())
        .nest("/api/v1", api::labels::router())
        .merge(api::p2_labels::router())
        .nest("/api/v1", api::nodes::router())
        .nest("/api/v1", api::pods::router())
        .nest("/api/v1", api::pod_health::router())
        .nest("/api/v1", api::reality::router())
        .nest("/api/v1", api::daemonsets::router())
        .nest("/api/v1", api::rcs::router())
        .merge(api::rolls::router())
        .nest("/api/v1", api::leader::router())
}

/// The complete service over `state`: the API, its document at `/openapi.json` with Swagger UI
/// at `/docs`, JSON fallbacks and middleware.
pub fn build(state: AppState) -> Router {
    let (routes, openapi) = api().split_for_parts();
    let routes = routes
        .merge(SwaggerUi::new("/docs").url("/openapi.json", openapi))
        .with_state(state);
    with_middleware(routes)
}

/// What every route gets: JSON 404 and 405, the body limit, request ids and a tracing span.
///
/// Call it last: the 405 fallback only reaches routes already added. Public so tests can wrap
/// test-only routes exactly as the real ones are wrapped.
pub fn with_middleware(router: Router) -> Router {
    // Outermost first: the request id exists before the span is opened, so every log line of
    // the request carries it; `json_errors` sits outside the body limit to rewrite its 413.
    let layers = ServiceBuilder::new()
        .layer(SetRequestIdLayer::new(REQUEST_ID_HEADER, MakeRequestUuid))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID_HEADER))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(DefaultOnResponse::new().level(Level::INFO)),
        )
        .layer(middleware::from_fn(json_errors))
        .layer(RequestBodyLimitLayer::new(MAX_BODY_BYTES));
    router
        .fallback(no_route)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(layers)
}

fn request_span<B>(request: &axum::http::Request<B>) -> Span {
    let request_id = request
        .headers()
        .get(REQUEST_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    tracing::info_span!(
        "request",
        id = %request_id,
        method = %request.method(),
        uri = %request.uri(),
    )
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!(
            "{method} is not allowed on {}; the Allow header lists what is",
            uri.path()
        ),
    )
}

/// Turns any error response that is not already JSON (the body limit's 413, axum's own
/// rejections from extractors other than ours) into the one error shape, keeping its status
/// and headers such as `Allow`.
async fn json_errors(request: Request, next: Next) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json || !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
        format!("the request body is larger than the limit of {MAX_BODY_BYTES} bytes")
    } else {
        status
            .canonical_reason()
            .unwrap_or("request failed")
            .to_lowercase()
    };
    let (mut parts, _) = response.into_parts();
    let (json_parts, body) = ApiError::new(status, message).into_response().into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    if let Some(content_type) = json_parts.headers.get(CONTENT_TYPE) {
        parts.headers.insert(CONTENT_TYPE, content_type.clone());
    }
    Response::from_parts(parts, body)
}
