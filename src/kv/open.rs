//! Turns the `--store` URL into a running backend.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use super::consul::{ConsulConfig, ConsulStore, ConsulTimeouts, DEFAULT_MAX_CONNECTIONS};
use super::metered::Metered;
use super::sqlite::SqliteStore;
use super::{KvStore, StoreResult};

/// Where the state lives, as given by `--store`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// `sqlite://PATH`: the embedded store in the file PATH (relative or absolute).
    Sqlite { path: String },
    /// `consul://HOST:PORT` or `consul+https://HOST:PORT`.
    Consul { base_url: String },
}

impl FromStr for StoreUrl {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s.strip_prefix("sqlite://") {
            if path.is_empty() {
                return Err("sqlite:// needs a file path, e.g. sqlite://p2-apiserver.db".into());
            }
            return Ok(StoreUrl::Sqlite { path: path.into() });
        }
        let (scheme, rest) = if let Some(rest) = s.strip_prefix("consul+https://") {
            ("https", rest)
        } else if let Some(rest) = s.strip_prefix("consul://") {
            ("http", rest)
        } else {
            return Err(format!(
                "unknown store {s:?}: use sqlite://PATH, consul://HOST:PORT or consul+https://HOST:PORT"
            ));
        };
        // The client builds every request's query itself: one given here (`?dc=` for the
        // datacenter, say) would be dropped without a word, and a fragment is never sent.
        if rest.contains(['?', '#']) {
            return Err(format!(
                "store {s:?} must be consul://HOST:PORT, with nothing after it: give the \
                 datacenter with --consul-datacenter and the token with --consul-token"
            ));
        }
        let authority = rest.trim_end_matches('/');
        if authority.is_empty() || authority.contains('/') {
            return Err(format!("store {s:?} must be consul://HOST:PORT"));
        }
        // Without one the client would go to HTTP's own port, where no agent listens.
        let port = authority.rsplit_once(':').map(|(_, port)| port);
        if !port.is_some_and(|port| !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit())) {
            return Err(format!(
                "store {s:?} must name the agent's port, e.g. consul://127.0.0.1:8500"
            ));
        }
        Ok(StoreUrl::Consul {
            base_url: format!("{scheme}://{authority}"),
        })
    }
}

/// As an operator reads it in a message: the URL given, or the agent's address.
impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Sqlite { path } => write!(f, "sqlite://{path}"),
            StoreUrl::Consul { base_url } => write!(f, "Consul at {base_url}"),
        }
    }
}

/// Options that only the Consul backend uses.
#[derive(Debug, Clone)]
pub struct ConsulOptions {
    /// Sent as `X-Consul-Token`.
    pub token: Option<String>,
    /// Sent as `?dc=`.
    pub datacenter: Option<String>,
    /// The most requests in flight to the agent at once ([`ConsulStore::with_limits`]).
    pub max_connections: usize,
    /// How many blocking watches the server keeps open at once, each of which gets a
    /// connection of its own ([`ConsulStore::with_limits`]).
    pub own_watches: usize,
}

impl Default for ConsulOptions {
    fn default() -> Self {
        ConsulOptions {
            token: None,
            datacenter: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            own_watches: 0,
        }
    }
}

/// Opens the store named by `url`, its operations measured ([`Metered`]); for SQLite this
/// creates the file and applies migrations.
pub async fn open_store(url: &StoreUrl, consul: ConsulOptions) -> StoreResult<Arc<dyn KvStore>> {
    match url {
        StoreUrl::Sqlite { path } => Ok(Metered::wrap(
            Arc::new(SqliteStore::open(path).await?),
            "sqlite",
        )),
        StoreUrl::Consul { base_url } => Ok(Metered::wrap(
            Arc::new(ConsulStore::with_limits(
                ConsulConfig {
                    base_url: base_url.clone(),
                    token: consul.token,
                    datacenter: consul.datacenter,
                },
                ConsulTimeouts::default(),
                consul.max_connections,
                consul.own_watches,
            )?),
            "consul",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_store_urls() {
        assert_eq!(
            "sqlite://p2.db".parse(),
            Ok(StoreUrl::Sqlite {
                path: "p2.db".into()
            })
        );
        assert_eq!(
            "sqlite:///var/lib/p2.db".parse(),
            Ok(StoreUrl::Sqlite {
                path: "/var/lib/p2.db".into()
            })
        );
        assert_eq!(
            "consul://127.0.0.1:8500".parse(),
            Ok(StoreUrl::Consul {
                base_url: "http://127.0.0.1:8500".into()
            })
        );
        assert_eq!(
            "consul+https://consul.example:8501/".parse(),
            Ok(StoreUrl::Consul {
                base_url: "https://consul.example:8501".into()
            })
        );
        assert!("redis://x".parse::<StoreUrl>().is_err());
        assert!("sqlite://".parse::<StoreUrl>().is_err());
        assert!("consul://".parse::<StoreUrl>().is_err());
        for portless in [
            "consul://127.0.0.1",
            "consul://[::1]",
            "consul+https://c.example:",
        ] {
            let refused = portless.parse::<StoreUrl>().unwrap_err();
            assert!(refused.contains("port"), "{portless}: {refused}");
        }
        assert_eq!(
            "consul://[::1]:8500".parse(),
            Ok(StoreUrl::Consul {
                base_url: "http://[::1]:8500".into()
            })
        );
        // Neither would reach Consul: the client sets each request's query itself.
        for ignored in [
            "consul://127.0.0.1:8500?dc=dc2",
            "consul://127.0.0.1:8500/?token=t",
            "consul+https://consul.example:8501#dc2",
        ] {
            let refused = ignored.parse::<StoreUrl>().unwrap_err();
            assert!(
                refused.contains("--consul-datacenter"),
                "{ignored}: {refused}"
            );
        }
    }
}
