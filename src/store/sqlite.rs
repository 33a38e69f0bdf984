//! The embedded backend: SQLite through sqlx, schema in `migrations/`.

use super::StoreResult;

/// The SQLite store.
pub struct SqliteStore {}

impl SqliteStore {
    /// Opens (creating if needed) the database file and applies migrations.
    pub async fn open(_path: &str) -> StoreResult<Self> {
        unimplemented!()
    }
}
