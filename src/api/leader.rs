//! Who runs the farms now: the holder of the leader lock.

use axum::extract::State;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::extract::{ApiJson, NoQuery};
use crate::app::AppState;
use crate::error::{ApiError, ErrorBody};
use crate::leader::{current_leader, LeaderRecord};

/// OpenAPI tag of the leader route.
pub const TAG: &str = "leader";

/// The leader route.
pub fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(get_leader))
}

/// The server that leads now (runs the farms), and since when.
///
/// 404 while no server holds the lock, for example during a failover.
#[utoipa::path(
    get,
    path = "/leader",
    tag = TAG,
    responses(
        (status = OK, description = "The current leader", body = LeaderRecord),
        (status = NOT_FOUND, description = "No server leads now", body = ErrorBody),
        (status = SERVICE_UNAVAILABLE, description = "The store is unavailable", body = ErrorBody)
    )
)]
async fn get_leader(
    State(app): State<AppState>,
    _: NoQuery,
) -> Result<ApiJson<LeaderRecord>, ApiError> {
    match current_leader(&*app.store).await? {
        Some(record) => Ok(ApiJson(record)),
        None => Err(ApiError::not_found("no server leads now")),
    }
}
