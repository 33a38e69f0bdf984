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
    #[schema(required = true)]
    pub continue_token: Option<String>,
}

impl Paging {
    /// Cuts one page out of `items`, which must be sorted by `key` ascending.
    pub fn page<T>(&self, items: Vec<T>, key: impl Fn(&T) -> &str) -> Page<T> {
        self.cut(items, key, |item, after| item > after, Some)
    }

    /// Cuts one page of what `decode` makes of `items`, which are sorted by `key`
    /// descending (newest first, for time-sortable keys): the next page starts below the
    /// token's key. Only as many are decoded as the page needs (see [`Paging::page_decoded`]).
    pub fn page_descending_decoded<T, U>(
        &self,
        items: impl IntoIterator<Item = T>,
        key: impl Fn(&T) -> &str,
        decode: impl FnMut(T) -> Option<U>,
    ) -> Page<U> {
        self.cut(items, key, |item, after| item < after, decode)
    }

    /// [`Paging::page`] of what `decode` makes of `items`, leaving out those it cannot
    /// decode; only as many are decoded as the page needs, so a page's cost does not grow
    /// with the items past it.
    pub fn page_decoded<T, U>(
        &self,
        items: impl IntoIterator<Item = T>,
        key: impl Fn(&T) -> &str,
        decode: impl FnMut(T) -> Option<U>,
    ) -> Page<U> {
        self.cut(items, key, |item, after| item > after, decode)
    }

    /// The items `beyond` the token's key that `decode` keeps, at most `limit` of them; a
    /// continue token when one more is kept past them.
    fn cut<T, U>(
        &self,
        items: impl IntoIterator<Item = T>,
        key: impl Fn(&T) -> &str,
        beyond: impl Fn(&str, &str) -> bool,
        mut decode: impl FnMut(T) -> Option<U>,
    ) -> Page<U> {
        let limit = self.limit.unwrap_or(usize::MAX);
        let mut kept = Vec::new();
        let mut last_key = None;
        for item in items {
            if let Some(after) = &self.after {
                if !beyond(key(&item), after) {
                    continue;
                }
            }
            let item_key = (kept.len() < limit).then(|| key(&item).to_owned());
            let Some(decoded) = decode(item) else {
                continue;
            };
            match item_key {
                Some(item_key) => {
                    kept.push(decoded);
                    last_key = Some(item_key);
                }
                None => {
                    return Page {
                        items: kept,
                        continue_token: last_key.as_deref().map(encode),
                    }
                }
            }
        }
        Page {
            items: kept,
            continue_token: None,
        }
    }
}

fn encode(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(key)
}

/// The key a `continue` token carries; `None` for text no page's token could be (the
/// token is not signed: one made by hand only moves where a listing starts).
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

    /// Items that do not decode are left out of full pages, and a page decodes only up to
    /// the first kept item past it.
    #[test]
    fn decoded_pages_are_full_and_decode_only_what_they_need() {
        let items: Vec<String> = (0..10).map(|i| format!("item-{i}")).collect();
        let mut paging = Paging {
            limit: Some(3),
            after: None,
        };
        let mut seen = Vec::new();
        loop {
            let mut decoded = Vec::new();
            let page = paging.page_decoded(
                items.clone(),
                |s| s.as_str(),
                |s| {
                    decoded.push(s.clone());
                    (!s.ends_with('4')).then_some(s)
                },
            );
            assert!(decoded.len() <= 5, "decoded {decoded:?}");
            if page.continue_token.is_some() {
                assert_eq!(page.items.len(), 3);
            }
            seen.extend(page.items);
            match page.continue_token {
                Some(token) => paging.after = decode_token(&token),
                None => break,
            }
        }
        let kept: Vec<&String> = items.iter().filter(|s| !s.ends_with('4')).collect();
        assert_eq!(seen.iter().collect::<Vec<_>>(), kept);
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
