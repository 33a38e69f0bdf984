//! The one shape every repository reads and writes: a decoded document and the modify index
//! it was read at, which is both the CAS token of the next write and the API's `ETag`.

/// A decoded document and the modify index it was read at (0 for a document that is not
/// stored, such as the labels of an object that has none).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub index: u64,
}

impl<T> Versioned<T> {
    /// The same version of something derived from the value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Versioned<U> {
        Versioned {
            value: f(self.value),
            index: self.index,
        }
    }
}
