//! Liveness and readiness probes for process supervisors and load balancers.

use axum::extract::State;
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::RefOr;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{ApiJson, NoQuery};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody};

/// OpenAPI tag of the probes.
pub const TAG: &str = "health";

/// A probe's answer when all is well.
#[derive(Debug, Serialize, ToSchema)]
pub struct Health {
    /// Always `ok`; failures are error bodies.
    #[schema(schema_with = status_schema)]
    pub status: &'static str,
}

/// The one `status` a probe answers with.
const OK: &str = "ok";

const HEALTHY: Health = Health { status: OK };

/// `Health.status` as the document gives it: a one-value enum, so that generated clients
/// know the one value rather than take any text.
fn status_schema() -> impl Into<RefOr<Schema>> {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some([OK]))
        .description(Some("Always `ok`; failures are error bodies."))
        .examples([serde_json::json!(OK)])
}

/// The probe routes, at the root of the URL space as supervisors expect.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_healthz))
        .routes(routes!(get_readyz))
}

/// Liveness: answers while the process serves HTTP at all.
///
/// It never touches the store, so a store outage does not get the process restarted.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = TAG,
    responses((status = OK, description = "The process is alive", body = Health))
)]
async fn get_healthz(_: NoQuery) -> ApiJson<Health> {
    ApiJson(HEALTHY)
}

/// Readiness: answers 200 only while the store answers (the embedded one: and can write),
/// within `--readiness-timeout`, and the server's mirror of the store follows every tree.
///
/// While it fails, load balancers send traffic elsewhere; the body says why: a store that
/// refuses is `ServiceUnavailable`, one that does not answer in time (hung) `StoreTimeout`,
/// a mirror that has lost a tree's watch for longer than its bound `ServiceUnavailable`
/// naming the trees, or saying that the store has answered none of the mirror's reads for
/// that long (its reads meanwhile go to the store). A mirror still loading does not
/// make the server unready: reads go to the store until it has loaded.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = TAG,
    responses(
        (status = OK, description = "The store answers and the mirror follows it", body = Health),
        (status = SERVICE_UNAVAILABLE, description = "The store fails or does not answer in time, or the mirror has lost its watch", body = ErrorBody)
    )
)]
async fn get_readyz(State(app): State<AppState>, _: NoQuery) -> Result<ApiJson<Health>, ApiError> {
    // Unlike other 5xx bodies this one names the cause: telling the operator why the
    // instance is out of rotation is the point of the probe.
    let health = app.mirror.health();
    if let Some(silent) = health.silent {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "mirror not ready: the store has answered none of its reads for {}s",
                silent.as_secs()
            ),
        ));
    }
    if !health.lost.is_empty() {
        let trees: Vec<String> = (health.lost.iter())
            .map(|(prefix, since)| format!("{prefix} for {}s", since.as_secs()))
            .collect();
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("mirror not ready: lost the watch of {}", trees.join(", ")),
        ));
    }
    let timeout = app.limits.readiness_timeout;
    match tokio::time::timeout(timeout, app.store.ping()).await {
        Ok(Ok(())) => Ok(ApiJson(HEALTHY)),
        Ok(Err(err)) => Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("store not ready: {err}"),
        )),
        Err(_) => Err(ApiError::store_timeout("readiness probe")
            .with_message(&format!("store not ready: no answer within {timeout:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use crate::app::App;
    use crate::error::ErrorBody;
    use crate::kv::sqlite::SqliteStore;

    /// Sends `request` to `routes`; the answer's status and error body, if any.
    async fn call(
        routes: &axum::Router,
        request: Request<Body>,
    ) -> (StatusCode, Option<ErrorBody>) {
        let response = routes.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, serde_json::from_slice(&body).ok())
    }

    /// With the embedded store's writer stopped, the server is not ready, saying why, and a
    /// write is refused at once with a 503, while the process stays alive. Before, it was
    /// ready and a write waited out its deadline.
    #[tokio::test]
    async fn a_stopped_store_writer_makes_the_server_unready_and_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p2.db").display().to_string();
        let store = Arc::new(SqliteStore::open(&path).await.unwrap());
        let routes = crate::router::build(App::new(store.clone()));
        let get = |uri: &str| Request::get(uri).body(Body::empty()).unwrap();
        assert_eq!(call(&routes, get("/readyz")).await.0, StatusCode::OK);

        store.stop_writer().await;
        let (status, error) = call(&routes, get("/readyz")).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{error:?}");
        let error = error.expect("an error body");
        assert_eq!(error.reason, "ServiceUnavailable");
        assert!(error.message.contains("writer"), "{error:?}");

        let write = Request::put("/api/v1/labels/node/n1")
            .header("content-type", "application/json")
            .body(Body::from(r#"{"labels": {"role": "web"}}"#))
            .unwrap();
        let (status, error) = call(&routes, write).await;
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{error:?}");
        assert_eq!(error.expect("an error body").reason, "ServiceUnavailable");
        assert_eq!(call(&routes, get("/healthz")).await.0, StatusCode::OK);
    }
}
