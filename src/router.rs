//! Wires every route, the OpenAPI document, the JSON fallbacks and the middleware together.

use std::error::Error as _;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{to_bytes, Body, HttpBody};
use axum::extract::rejection::PathRejection;
use axum::extract::{MatchedPath, Path, Request, State};
use axum::http::header::{
    ACCEPT_ENCODING, ACCESS_CONTROL_REQUEST_METHOD, ALLOW, AUTHORIZATION, CONTENT_ENCODING,
    CONTENT_LENGTH, CONTENT_TYPE, ETAG, LOCATION, RETRY_AFTER,
};
use axum::http::{HeaderValue, Method, StatusCode, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use futures::FutureExt as _;
use http_body_util::LengthLimitError;
use tower::{Layer, Service, ServiceBuilder};
use tower_http::cors::{self as tower_cors, AllowHeaders, AllowOrigin, CorsLayer};
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer;
use tower_http::trace::{DefaultOnResponse, TraceLayer};
use tracing::{Level, Span};
use utoipa::openapi::path::Operation;
use utoipa::openapi::RefOr;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_swagger_ui::SwaggerUi;

use crate::api;
use crate::api::blocking::INDEX_HEADER;
use crate::api::list_query::requested_wait;
use crate::api::preconditions::IF_MATCH_PATTERN;
use crate::app::{AppState, HttpLimits};
use crate::auth::{self, REQUEST_ID_HEADER};
use crate::error::{ApiError, Cause, ErrorBody};
use crate::kv::{self, sent::Sent};
use crate::metrics;
use crate::model::duration::DURATION_PATTERN;
use crate::panics;

/// Largest request body accepted: generous for any resource (a value in the store is at most
/// 512 KiB) while bounding what one request can make the server buffer.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;

/// Longest request target (path and query) accepted; longer ones are 414. Far above any
/// URL the API builds, well below the HTTP layer's own limit of 64 KiB.
pub const MAX_URI_BYTES: usize = 8 * 1024;

/// Largest header section accepted, counted as sent; a larger one is 431.
pub const MAX_HEADER_BYTES: usize = 32 * 1024;

/// Most headers accepted in one request; more are 431. The HTTP layer's own limit
/// ([`crate::server`]) is set above it, so that this one answers with the JSON body.
pub const MAX_HEADERS: usize = 100;

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
        (name = api::watch::TAG, description = "The change stream: Server-Sent Events of every change to the objects asked for"),
        (name = api::observability::TAG, description = "Prometheus metrics and the server's version"),
        (name = api::events::TAG, description = "Who changed what, when: every change made through the API or by the farms"),
    ),
    components(schemas(ErrorBody, Cause, api::watch::WatchEvent))
)]
struct ApiDoc;

/// Every API route with its OpenAPI description. Resource routers are merged (root-level
/// probes) or nested (resources) here; the document comes from the same router that serves,
/// so the two cannot drift.
pub fn api() -> OpenApiRouter<AppState> {
    let mut router = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .merge(api::health::router())
        .merge(api::observability::router())
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
        .nest("/api/v1", api::watch::router())
        .nest("/api/v1", api::events::router());
    document_unknown_parameters(router.get_openapi_mut());
    document_coded_bodies(router.get_openapi_mut());
    document_request_limits(router.get_openapi_mut());
    document_unavailable(router.get_openapi_mut());
    document_internal_errors(router.get_openapi_mut());
    document_if_match_forms(router.get_openapi_mut());
    auth::document(router.get_openapi_mut());
    document_request_ids(router.get_openapi_mut());
    document_text_patterns(router.get_openapi_mut());
    refer_to_listed_components(router.get_openapi_mut());
    router
}

/// utoipa writes a generic's type argument out in full (juhaku/utoipa#1586), so each list
/// page (`Page_Rc`, ...) would repeat its item's schema inline, and an SDK generated from
/// the document would get a second, anonymous type for every kind it lists. A component's
/// list whose items are exactly another component refers to it instead.
fn refer_to_listed_components(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::schema::{ArrayItems, Schema};
    use utoipa::openapi::Ref;
    let Some(components) = openapi.components.as_mut() else {
        return;
    };
    let named = components.schemas.clone();
    for schema in components.schemas.values_mut() {
        let RefOr::T(Schema::Object(object)) = schema else {
            continue;
        };
        for property in object.properties.values_mut() {
            let RefOr::T(Schema::Array(list)) = property else {
                continue;
            };
            let ArrayItems::RefOrSchema(items) = &mut list.items else {
                continue;
            };
            if let Some((name, _)) = named.iter().find(|(_, named)| *named == &**items) {
                **items = RefOr::Ref(Ref::from_schema_name(name.as_str()));
            }
        }
    }
}

/// The text parameters read by hand, each documented wherever it is taken with the pattern
/// of what the server reads: `If-Match` ([`IF_MATCH_PATTERN`], anything else refused with
/// 400) and a blocking read's `wait` ([`DURATION_PATTERN`], its bound in its words).
fn document_text_patterns(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::ParameterIn;
    use utoipa::openapi::{ObjectBuilder, Type};
    let patterns = [
        (ParameterIn::Header, "If-Match", IF_MATCH_PATTERN),
        (ParameterIn::Query, "wait", DURATION_PATTERN),
    ];
    for operation in operations(openapi) {
        for parameter in operation.parameters.iter_mut().flatten() {
            let documented = patterns.iter().find(|(place, name, _)| {
                *place == parameter.parameter_in && *name == parameter.name
            });
            if let Some((_, _, pattern)) = documented {
                let schema = ObjectBuilder::new()
                    .schema_type(Type::String)
                    .pattern(Some(*pattern));
                parameter.schema = Some(schema.into());
            }
        }
    }
}

/// Every write taking `If-Match` takes any of its forms ([`crate::api::preconditions::IfMatch`]),
/// which each operation's own words (naming one version) leave out: its description says
/// them, and its 412 the one of `*`.
fn document_if_match_forms(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::ParameterIn;
    for operation in operations(openapi) {
        let if_match = operation.parameters.iter_mut().flatten().find(|parameter| {
            parameter.parameter_in == ParameterIn::Header && parameter.name == "If-Match"
        });
        let Some(if_match) = if_match else { continue };
        const FORMS: &str = "A comma-separated list of ETags takes any one of them; `*`, any \
                             version while there is one";
        let described = if_match.description.take().unwrap_or_default();
        if_match.description = Some(match described.trim_end_matches('.') {
            "" => FORMS.to_owned(),
            described => format!("{described}. {FORMS}"),
        });
        document_also(
            operation,
            "412",
            "with `If-Match: *`, there is no version (no object; for labels, no label set)",
        );
    }
}

/// Every request has an id ([`with_middleware`]): the client's own `X-Request-Id`, or one
/// the server makes, returned on every answer and named by the events of the changes the
/// request made (`request_id`). Each operation documents both sides, last, so that every
/// answer added before carries it.
fn document_request_ids(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::path::{ParameterBuilder, ParameterIn};
    use utoipa::openapi::{HeaderBuilder, ObjectBuilder, Required, Type};
    let name = "X-Request-Id";
    let text = || ObjectBuilder::new().schema_type(Type::String);
    let sent = ParameterBuilder::new()
        .name(name)
        .parameter_in(ParameterIn::Header)
        .required(Required::False)
        .schema(Some(
            text()
                .min_length(Some(1))
                .max_length(Some(MAX_REQUEST_ID))
                .pattern(Some("^[!-~]+$")),
        ))
        .description(Some(format!(
            "An id of the client's for the request, to find it in the server's log and in the \
             events of its changes: up to {MAX_REQUEST_ID} visible ASCII characters; the server \
             makes one when none, or another, is sent",
        )))
        .build();
    let returned = HeaderBuilder::new()
        .schema(text())
        .description(Some(
            "The request's id: the one sent, or the one the server made; the events of the \
             request's changes name it as `request_id`",
        ))
        .build();
    for operation in operations(openapi) {
        operation
            .parameters
            .get_or_insert_with(Vec::new)
            .push(sent.clone());
        for response in operation.responses.responses.values_mut() {
            if let RefOr::T(response) = response {
                response.headers.insert(name.to_owned(), returned.clone());
            }
        }
    }
}

/// Every operation of `openapi`.
fn operations(openapi: &mut utoipa::openapi::OpenApi) -> impl Iterator<Item = &mut Operation> {
    openapi.paths.paths.values_mut().flat_map(path_operations)
}

/// Every operation of one path.
fn path_operations(item: &mut utoipa::openapi::PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.delete,
        &mut item.patch,
    ]
    .into_iter()
    .flatten()
}

/// The limits on every request ([`with_middleware`]) answer on every route: 414 and 431 for
/// its head, and 413 and 408 for its body, which is read whether the operation takes one or
/// not. Each operation documents them.
fn document_request_limits(openapi: &mut utoipa::openapi::OpenApi) {
    for operation in operations(openapi) {
        let mut limits = vec![
            ("414", "The request target (path and query) is over 8 KiB"),
            ("431", "The header section is over 100 headers or 32 KiB"),
        ];
        if operation.request_body.is_some() {
            limits.push(("413", "The body is over 1 MiB"));
            limits.push(("408", "The body took too long to arrive"));
        } else {
            limits.push((
                "413",
                "A body (which this operation does not read) is over 1 MiB",
            ));
            limits.push((
                "408",
                "A body (which this operation does not read) took too long to arrive",
            ));
        }
        let responses = &mut operation.responses.responses;
        for (code, description) in limits {
            if !responses.contains_key(code) {
                responses.insert(code.to_owned(), ErrorBody::documented(description));
            }
        }
    }
}

/// Every route may answer 503: a connection past `--max-connections` is refused before its
/// request is read ([`crate::server`]), whatever its route. Every 503 but an `OutcomeUnknown`
/// carries `Retry-After` ([`crate::error::RETRY_AFTER_SECONDS`]), documented on each.
fn document_unavailable(openapi: &mut utoipa::openapi::OpenApi) {
    use utoipa::openapi::{HeaderBuilder, ObjectBuilder, Type};
    let retry_after = HeaderBuilder::new()
        .schema(ObjectBuilder::new().schema_type(Type::Integer))
        .description(Some(
            "Seconds to wait before trying again; not sent with `OutcomeUnknown`, whose write \
             may have been applied: re-read before retrying it",
        ))
        .build();
    for operation in operations(openapi) {
        let responses = &mut operation.responses.responses;
        let unavailable = responses.entry("503".to_owned()).or_insert_with(|| {
            ErrorBody::documented("The server is at its connection cap; retry later")
        });
        if let RefOr::T(response) = unavailable {
            response
                .headers
                .insert("Retry-After".to_owned(), retry_after.clone());
        }
    }
}

/// Every API route reads or writes the store, and the store may refuse the server's own
/// credentials (a Consul token without the rights it needs): that is a 500 with the generic
/// body ([`ApiError`]'s `From<StoreError>`), which every API operation documents, beside
/// any 500 of its own (an unreadable document).
fn document_internal_errors(openapi: &mut utoipa::openapi::OpenApi) {
    let api = openapi.paths.paths.iter_mut();
    let api = api.filter(|(path, _)| path.starts_with("/api/"));
    const REFUSED: &str =
        "the store refused the server's credentials; the cause is in the server's log";
    for (_, item) in api {
        for operation in path_operations(item) {
            document_also(operation, "500", REFUSED);
        }
    }
}

/// A body sent with a content coding is refused with 415 ([`read_body`]), so every operation
/// that takes a body documents that 415, added to the one it may already have.
fn document_coded_bodies(openapi: &mut utoipa::openapi::OpenApi) {
    let with_body = operations(openapi).filter(|operation| operation.request_body.is_some());
    for operation in with_body {
        document_also(
            operation,
            "415",
            "the body has a content coding (`Content-Encoding`)",
        );
    }
}

/// Every route answers 400 to a query parameter it does not take ([`api::extract`]), so
/// every operation documents that 400, added to the one it may already have.
fn document_unknown_parameters(openapi: &mut utoipa::openapi::OpenApi) {
    for operation in operations(openapi) {
        document_also(operation, "400", "an unknown query parameter");
    }
}

/// Documents that `operation` also answers `status` when `why` (lowercase, a sentence's
/// end): after the reasons it already gives for that status, or alone.
fn document_also(operation: &mut Operation, status: &str, why: &str) {
    let responses = &mut operation.responses.responses;
    match responses.get_mut(status) {
        Some(RefOr::T(response)) => {
            response.description = format!("{}; or {why}", response.description);
        }
        Some(RefOr::Ref(_)) => {}
        None => {
            let mut alone = why.to_owned();
            alone[..1].make_ascii_uppercase();
            responses.insert(status.to_owned(), ErrorBody::documented(&alone));
        }
    }
}

/// The complete service over `state`: the API, its document at `/openapi.json` (with the
/// server's own replica maximum, and the operations it lets through without a token) and
/// Swagger UI at `/docs`, JSON fallbacks and middleware. Each route checks the request's
/// token against the role its operation needs ([`auth`]); the fallbacks do not, so an
/// unknown route is a 404 to anyone, and a method a route does not take a 405. Installs the
/// metrics recorder that `/metrics` renders, if nothing has yet.
pub fn build(state: AppState) -> Router {
    metrics::install();
    let limits = state.limits;
    let access = state.access.clone();
    let (routes, mut openapi) = api().split_for_parts();
    state.validation.document(&mut openapi);
    access.document(&mut openapi);
    let routes = routes
        .merge(SwaggerUi::new("/docs").url("/openapi.json", openapi))
        .with_state(state);
    let cors = cors(access.cors_origins().to_vec());
    let routes = routes.layer(middleware::from_fn_with_state(access, auth::authorize));
    with_middleware_and_cors(routes, limits, cors)
}

/// With `--cors-origin`, what answers browsers' preflights and adds the CORS headers for the
/// allowed origins to every answer, errors included. Outside authentication and the JSON
/// fallbacks: preflights come without a token and to routes that have no OPTIONS.
fn cors(origins: Vec<HeaderValue>) -> Option<PreflightsOnly> {
    if origins.is_empty() {
        return None;
    }
    Some(PreflightsOnly(
        CorsLayer::new()
            .allow_origin(AllowOrigin::list(origins))
            .allow_methods([
                Method::GET,
                Method::HEAD,
                Method::POST,
                Method::PUT,
                Method::PATCH,
                Method::DELETE,
            ])
            .allow_headers(AllowHeaders::mirror_request())
            // Past the few headers a page may always read: ours, and `ETag`, without which
            // a page could not make the `If-Match` writes the API offers.
            .expose_headers([REQUEST_ID_HEADER, INDEX_HEADER, LOCATION, ETAG, RETRY_AFTER])
            .max_age(Duration::from_secs(600)),
    ))
}

/// [`CorsLayer`], but for an OPTIONS that is no preflight: tower-http answers every OPTIONS
/// as one (200, empty), where a preflight is one naming the method the page means to use
/// (`Access-Control-Request-Method`, Fetch); any other goes to the routes, which answer it as
/// without `--cors-origin` (a route's 405, an unknown route's 404).
#[derive(Clone)]
struct PreflightsOnly(CorsLayer);

impl<S: Clone> Layer<S> for PreflightsOnly {
    type Service = PreflightsOnlyService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PreflightsOnlyService {
            cors: self.0.layer(inner.clone()),
            plain: inner,
        }
    }
}

/// The service of [`PreflightsOnly`]: `cors` for every request but an OPTIONS that is no
/// preflight, which `plain` takes.
#[derive(Clone)]
struct PreflightsOnlyService<S> {
    cors: tower_cors::Cors<S>,
    plain: S,
}

impl<S, B, ResBody> Service<axum::http::Request<B>> for PreflightsOnlyService<S>
where
    S: Service<axum::http::Request<B>, Response = axum::http::Response<ResBody>>,
    ResBody: Default,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::Either<S::Future, tower_cors::ResponseFuture<S::Future>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::ready!(self.plain.poll_ready(cx))?;
        self.cors.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let no_preflight = request.method() == Method::OPTIONS
            && !request
                .headers()
                .contains_key(ACCESS_CONTROL_REQUEST_METHOD);
        if no_preflight {
            futures::future::Either::Left(self.plain.call(request))
        } else {
            futures::future::Either::Right(self.cors.call(request))
        }
    }
}

/// What every route gets: JSON 404 and 405, limits on the request head and body, the
/// request deadline, request ids, a tracing span and the request's metrics (outermost, so
/// that every answer is counted).
///
/// Call it last: the 405 fallback only reaches routes already added. Public so tests can wrap
/// test-only routes exactly as the real ones are wrapped.
pub fn with_middleware(router: Router, limits: HttpLimits) -> Router {
    with_middleware_and_cors(router, limits, None)
}

/// [`with_middleware`], with `cors` answering preflights inside the layers that give every
/// request its id, span and metrics, so that a preflight is answered, logged and counted as
/// any other request.
fn with_middleware_and_cors(
    router: Router,
    limits: HttpLimits,
    cors: Option<PreflightsOnly>,
) -> Router {
    // Outermost first: the request id exists before the span is opened, so every log line of
    // the request carries it; the body is read in full before the deadline starts, so a slow
    // client is told 408 and a slow store 503.
    let layers = ServiceBuilder::new()
        .layer(middleware::from_fn(metrics::track_http))
        .layer(SetSensitiveRequestHeadersLayer::new([AUTHORIZATION]))
        .map_request(drop_unusable_request_id)
        .layer(SetRequestIdLayer::new(REQUEST_ID_HEADER, MakeRequestUuid))
        .layer(PropagateRequestIdLayer::new(REQUEST_ID_HEADER))
        .layer(
            TraceLayer::new_for_http()
                .make_span_with(request_span)
                .on_response(DefaultOnResponse::new().level(Level::INFO)),
        )
        .option_layer(cors)
        .layer(middleware::from_fn(json_errors))
        .layer(middleware::from_fn(head_limits))
        .layer(middleware::from_fn_with_state(limits, read_body))
        .layer(middleware::from_fn_with_state(limits, deadline));
    router
        .fallback(no_route)
        .method_not_allowed_fallback(not_allowed)
        .layer(layers)
}

/// The longest `X-Request-Id` taken as sent: ids made by proxies and clients are UUIDs or
/// shorter, and each is echoed, logged and kept in the events of the request's changes.
const MAX_REQUEST_ID: usize = 200;

/// An `X-Request-Id` that is empty, longer than [`MAX_REQUEST_ID`] or not visible ASCII
/// names no request usefully: dropped, so that the request is given an id of its own, as
/// one sent without the header is.
fn drop_unusable_request_id<B>(mut request: axum::http::Request<B>) -> axum::http::Request<B> {
    let headers = request.headers_mut();
    let usable = |id: &HeaderValue| {
        (1..=MAX_REQUEST_ID).contains(&id.len()) && id.as_bytes().iter().all(u8::is_ascii_graphic)
    };
    if headers.get(REQUEST_ID_HEADER).is_some_and(|id| !usable(id)) {
        headers.remove(REQUEST_ID_HEADER);
    }
    request
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
        subject = tracing::field::Empty,
    )
}

async fn no_route(method: Method, uri: Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

/// The 405 of a route that does not take the method, answered before authentication (it
/// reveals nothing and changes nothing) as an unknown route's 404 is. Axum adds the route's
/// `Allow`, but for P2's label routes, which serve two paths on one route
/// ([`api::p2_labels::allowed_on`]).
async fn not_allowed(
    method: Method,
    uri: Uri,
    matched: Option<MatchedPath>,
    params: Result<Path<(String, String)>, PathRejection>,
) -> Response {
    let error = ApiError::method_not_allowed(&method, uri.path());
    match (matched, params) {
        (Some(matched), Ok(Path((type_name, tail))))
            if matched.as_str() == api::p2_labels::OBJECT_ROUTE =>
        {
            let allow = api::p2_labels::allowed_on(&type_name, &tail);
            ([(ALLOW, allow)], error).into_response()
        }
        _ => error.into_response(),
    }
}

/// Refuses a request target or header section over our limits with 414 or 431 and the JSON
/// body. The HTTP layer refuses only far larger ones (with empty bodies), so in practice
/// every such refusal is this one.
async fn head_limits(request: Request, next: Next) -> Response {
    let target = request
        .uri()
        .path_and_query()
        .map_or(0, |target| target.as_str().len());
    if target > MAX_URI_BYTES {
        return ApiError::new(
            StatusCode::URI_TOO_LONG,
            format!("the request target is longer than the limit of {MAX_URI_BYTES} bytes"),
        )
        .into_response();
    }
    let headers = request.headers();
    // As sent: `name: value` and CRLF.
    let header_bytes: usize = headers
        .iter()
        .map(|(name, value)| name.as_str().len() + value.len() + 4)
        .sum();
    if headers.len() > MAX_HEADERS || header_bytes > MAX_HEADER_BYTES {
        return ApiError::new(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            format!(
                "the request has more than {MAX_HEADERS} headers or more than \
                 {MAX_HEADER_BYTES} bytes of them"
            ),
        )
        .into_response();
    }
    next.run(request).await
}

/// Reads the request body in full, at most [`MAX_BODY_BYTES`] within `--body-read-timeout`,
/// so that neither a large nor a trickling body holds the server, and handlers only ever see
/// a body that has arrived.
async fn read_body(State(limits): State<HttpLimits>, request: Request, next: Next) -> Response {
    let (parts, body) = request.into_parts();
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {MAX_BODY_BYTES} bytes"),
        )
        .into_response()
    };
    // A Content-Length over the limit is refused before reading anything.
    if body.size_hint().lower() > MAX_BODY_BYTES as u64 {
        return too_large();
    }
    let timeout = limits.body_read_timeout;
    let bytes = match tokio::time::timeout(timeout, to_bytes(body, MAX_BODY_BYTES)).await {
        Ok(Ok(bytes)) => bytes,
        Ok(Err(e)) if e.source().is_some_and(|e| e.is::<LengthLimitError>()) => return too_large(),
        Ok(Err(e)) => {
            return ApiError::bad_request(format!("the request body could not be read: {e}"))
                .into_response()
        }
        Err(_) => {
            return ApiError::new(
                StatusCode::REQUEST_TIMEOUT,
                format!("the request body did not arrive in full within {timeout:?}"),
            )
            .into_response()
        }
    };
    if !bytes.is_empty() {
        if let Some(coding) = content_coding(&parts.headers) {
            let mut refused = ApiError::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                format!(
                    "request bodies are taken as sent, without a content coding; got \
                     Content-Encoding: {coding}"
                ),
            )
            .into_response();
            // RFC 9110 §15.5.16: the codings that would have been taken.
            (refused.headers_mut()).insert(ACCEPT_ENCODING, HeaderValue::from_static("identity"));
            return refused;
        }
    }
    next.run(Request::from_parts(parts, Body::from(bytes)))
        .await
}

/// The `Content-Encoding` of a request, unless none or `identity`: a body the server would
/// otherwise read as JSON or YAML while it is compressed, and refuse as malformed.
fn content_coding(headers: &axum::http::HeaderMap) -> Option<String> {
    let codings = headers.get_all(CONTENT_ENCODING).iter();
    let codings: Vec<&str> = codings
        .flat_map(|value| value.to_str().unwrap_or("?").split(','))
        .map(str::trim)
        .filter(|coding| !coding.is_empty() && !coding.eq_ignore_ascii_case("identity"))
        .collect();
    (!codings.is_empty()).then(|| codings.join(", "))
}

/// Answers 503 once the request's deadline passes, whatever the handler is waiting for (in
/// practice a hung store, whose client may otherwise retry for minutes), and 500 with the
/// JSON body should the handler panic (a bug), which would otherwise take the connection
/// down with no answer.
///
/// A request cut short may have sent a write that the store applies later, so a cut write
/// answers `OutcomeUnknown` (re-read before retrying), and a cut read `StoreTimeout` (or, on
/// a panic, `InternalError`); so does a cut write whose every write sent was withdrawn before
/// the store took it (the embedded store's writer waiting for a write lock held elsewhere, or
/// Consul's client for a free connection, `--consul-max-connections`), as nothing was
/// written.
async fn deadline(State(limits): State<HttpLimits>, request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let deadline = request_deadline(&limits, request.uri());
    let sent = Arc::new(Sent::default());
    let handled = AssertUnwindSafe(next.run(request)).catch_unwind();
    let outcome = tokio::time::timeout(deadline, kv::sent::scope(sent.clone(), handled)).await;
    let wrote_nothing = || method.is_safe() || sent.all_withdrawn();
    let error = match outcome {
        Ok(Ok(response)) => return response,
        Ok(Err(panic)) => {
            let cause = format!(
                "the request's handler panicked: {}",
                panics::message(&*panic)
            );
            if wrote_nothing() {
                ApiError::internal(cause)
            } else {
                ApiError::outcome_unknown(cause)
            }
        }
        Err(_) => {
            let cause = format!("the request's deadline of {deadline:?} passed");
            if wrote_nothing() {
                ApiError::store_timeout(cause)
            } else {
                ApiError::outcome_unknown(cause)
            }
        }
    };
    error.into_response()
}

/// `--request-timeout`, plus for a blocking query its wait and the store's jitter of up to a
/// sixteenth of it (as Consul adds). A query that does not parse gets the plain timeout: its
/// handler refuses it at once.
fn request_deadline(limits: &HttpLimits, uri: &Uri) -> Duration {
    let wait = requested_wait(uri).map_or(Duration::ZERO, |wait| wait + wait / 16);
    limits.request_timeout + wait
}

/// Turns any error response that is not already JSON (axum's own rejections from extractors
/// other than ours) into the one error shape, keeping its status and headers such as `Allow`.
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
    let message = status
        .canonical_reason()
        .unwrap_or("request failed")
        .to_lowercase();
    let (mut parts, _) = response.into_parts();
    let (json_parts, body) = ApiError::new(status, message).into_response().into_parts();
    parts.headers.remove(CONTENT_LENGTH);
    if let Some(content_type) = json_parts.headers.get(CONTENT_TYPE) {
        parts.headers.insert(CONTENT_TYPE, content_type.clone());
    }
    Response::from_parts(parts, body)
}
