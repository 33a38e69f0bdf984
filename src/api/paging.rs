//! `limit` and `continue` on list endpoints: items come sorted by a stable key, and the
//! continue token is the opaque form of the last key returned.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use crate::error::{ApiError, Cause};

/// The largest page a client may ask for.
pub const MAX_LIMIT: usize = 1000;

/// Paging query parameters.
#[derive(Debug, Default, Clone, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// At most this many items (1 to 1000); all of them when absent.
    pub limit: Option<usize>,
    /// The `continue` token of the previous page.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

/// A list answer: one page of items and the token for the next page, if any.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `continue` to get the next page; `null` on the last page.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

impl PageParams {
    /// Checks `limit` and `continue` before there are items to page, so that a bad one is
    /// refused before a blocking request is held.
    pub fn check(&self) -> Result<(), ApiError> {
        self.page(Vec::<String>::new(), String::as_str).map(drop)
    }

    /// Cuts one page out of `items`, which must be sorted by `key` ascending.
    pub fn page<T>(&self, items: Vec<T>, key: impl Fn(&T) -> &str) -> Result<Page<T>, ApiError> {
        let mut causes = Vec::new();
        if let Some(limit) = self.limit {
            if limit == 0 || limit > MAX_LIMIT {
                causes.push(Cause::new(
                    "limit",
                    format!("must be between 1 and {MAX_LIMIT}"),
                ));
            }
        }
        let after = match &self.continue_token {
            None => None,
            Some(token) => match decode(token) {
                Some(after) => Some(after),
                None => {
                    causes.push(Cause::new("continue", "is not a token this server issued"));
                    None
                }
            },
        };
        if !causes.is_empty() {
            return Err(ApiError::invalid(causes));
        }
        let mut rest: Vec<T> = match &after {
            Some(after) => items
                .into_iter()
                .filter(|i| key(i) > after.as_str())
                .collect(),
            None => items,
        };
        let limit = self.limit.unwrap_or(usize::MAX);
        let continue_token = if rest.len() > limit {
            rest.truncate(limit);
            rest.last().map(|last| encode(key(last)))
        } else {
            None
        };
        Ok(Page {
            items: rest,
            continue_token,
        })
    }
}

fn encode(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key)
}

fn decode(token: &str) -> Option<String> {
    String::from_utf8(URL_SAFE_NO_PAD.decode(token).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_through_everything_once() {
        let items: Vec<String> = (0..7).map(|i| format!("item-{i}")).collect();
        let mut params = PageParams {
            limit: Some(3),
            continue_token: None,
        };
        let mut seen = Vec::new();
        loop {
            let page = params.page(items.clone(), |s| s.as_str()).unwrap();
            seen.extend(page.items);
            match page.continue_token {
                Some(token) => params.continue_token = Some(token),
                None => break,
            }
        }
        assert_eq!(seen, items);
    }

    #[test]
    fn refuses_bad_limits_and_tokens() {
        for params in [
            PageParams {
                limit: Some(0),
                continue_token: None,
            },
            PageParams {
                limit: Some(MAX_LIMIT + 1),
                continue_token: None,
            },
            PageParams {
                limit: None,
                continue_token: Some("%%%".into()),
            },
        ] {
            let err = params
                .page(vec!["a".to_string()], |s| s.as_str())
                .unwrap_err();
            assert_eq!(err.status().as_u16(), 422);
        }
    }
}
