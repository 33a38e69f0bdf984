//! The Consul backend: Consul's HTTP API v1 through reqwest.

use super::StoreError;

/// How to reach Consul.
#[derive(Debug, Clone)]
pub struct ConsulConfig {
    /// `http://HOST:PORT` or `https://HOST:PORT`.
    pub base_url: String,
    /// Sent as `X-Consul-Token`.
    pub token: Option<String>,
    /// Sent as `?dc=`.
    pub datacenter: Option<String>,
}

/// The Consul store.
pub struct ConsulStore {}

impl ConsulStore {
    /// Builds the HTTP client; nothing is sent until the first call.
    pub fn new(_config: ConsulConfig) -> Result<Self, StoreError> {
        unimplemented!()
    }
}
