//! `limit` and `continue` on list endpoints: items come sorted by a stable key, and the
//! continue token is the opaque form of the last key returned. [`crate::api::list_query`]
//! reads and checks the parameters; this module cuts the pages.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// The largest page a client may ask for.
pub const MAX_LIMIT: usize = 1000;

/// Which page to answer, from a checked `limit` and `continue`.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Paging {
    /// At most this many items (1 to [`MAX_LIMIT`]); all of them when `None`.
    pub limit: Option<usize>,
    /// Only items whose key sorts after this one: the key the `continue` token carries.
    pub after: Option<String>,
}

/// A list answer: one page of items and the token for the next page, if any.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Pass as `continue` to get the next page; `null` on the last page.
    #[serde(rename = "continue")]
    pub continue_token: Option<String>,
}

impl Paging {
    /// Cuts one page out of `items`, which must be sorted by `key` ascending.
    pub fn page<T>(&self, items: Vec<T>, key: impl Fn(&T) -> &str) -> Page<T> {
        self.cut(items, key, |item, after| item > after)
    }

    /// Cuts one page out of `items`, sorted by `key` descending (newest first, for
    /// time-sortable keys): the next page starts below the token's key.
    pub fn page_descending<T>(&self, items: Vec<T>, key: impl Fn(&T) -> &str) -> Page<T> {
        self.cut(items, key, |item, after| item < after)
    }

    /// The items `beyond` the token's key, at most `limit` of them.
    fn cut<T>(
        &self,
        items: Vec<T>,
        key: impl Fn(&T) -> &str,
        beyond: impl Fn(&str, &str) -> bool,
    ) -> Page<T> {
        let mut rest: Vec<T> = match &self.after {
            Some(after) => items
                .into_iter()
                .filter(|i| beyond(key(i), after.as_str()))
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
        Page {
            items: rest,
            continue_token,
        }
    }
}

fn encode(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key)
}

/// The key a `continue` token carries; `None` for a token this server did not issue.
pub fn decode_token(token: &str) -> Option<String> {
    String::from_utf8(URL_SAFE_NO_PAD.decode(token).ok()?).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_through_everything_once() {
        let items: Vec<String> = (0..7).map(|i| format!("item-{i}")).collect();
        let mut paging = Paging {
            limit: Some(3),
            after: None,
        };
        let mut seen = Vec::new();
        loop {
            let page = paging.page(items.clone(), |s| s.as_str());
            seen.extend(page.items);
            match page.continue_token {
                Some(token) => paging.after = decode_token(&token),
                None => break,
            }
        }
        assert_eq!(seen, items);
    }

    #[test]
    fn tokens_round_trip_and_foreign_ones_are_refused() {
        assert_eq!(
            decode_token(&encode("node1\0hello")).unwrap(),
            "node1\0hello"
        );
        assert_eq!(decode_token("%%%"), None);
    }
}
