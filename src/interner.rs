//! Values shared by content. A large fleet repeats itself: the ten replicas of an RC carry
//! the same label set, and a hundred thousand pods name ten thousand nodes. Kept once per
//! distinct content, such values cost memory by what differs, not by how often it repeats.
//!
//! An interner holds its values weakly: a value lives as long as someone outside holds it,
//! and the interner forgets it some time after the last holder drops it.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, Weak};

/// Node names and pod ids, shared by the mirror's health views and the farms' pod keys: a
/// hundred thousand pods name ten thousand nodes and as many pod ids as there are RCs.
pub static NAMES: LazyLock<Interner<str>> = LazyLock::new(Interner::default);

/// Below this many known values, forgotten ones are not swept.
const SWEEP_FLOOR: usize = 1024;

/// Shared values of type `T`, each found by the bytes it was made from.
pub struct Interner<T: ?Sized> {
    known: Mutex<Known<T>>,
}

struct Known<T: ?Sized> {
    by_bytes: HashMap<Box<[u8]>, Weak<T>>,
    /// Swept again once `by_bytes` holds this many: twice what the last sweep left, so that
    /// sweeping costs O(1) per value made, amortized.
    sweep_at: usize,
}

impl<T: ?Sized> Known<T> {
    /// The value shared for `bytes`, if someone holds it.
    fn held(&self, bytes: &[u8]) -> Option<Arc<T>> {
        self.by_bytes.get(bytes).and_then(Weak::upgrade)
    }
}

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Interner {
            known: Mutex::new(Known {
                by_bytes: HashMap::new(),
                sweep_at: SWEEP_FLOOR,
            }),
        }
    }
}

impl<T: ?Sized> Interner<T> {
    /// The value made from `bytes`: the one already shared if someone holds it, else what
    /// `make` makes of them (`None` when it cannot), kept to share from then on. `make`
    /// runs outside the lock, so that threads decoding different values do not wait on
    /// each other; of two made at once from the same bytes, the first kept is shared.
    pub fn share(&self, bytes: &[u8], make: impl FnOnce() -> Option<Arc<T>>) -> Option<Arc<T>> {
        if let Some(shared) = self.lock().held(bytes) {
            return Some(shared);
        }
        let made = make()?;
        let mut known = self.lock();
        if let Some(shared) = known.held(bytes) {
            return Some(shared);
        }
        known.by_bytes.insert(bytes.into(), Arc::downgrade(&made));
        if known.by_bytes.len() >= known.sweep_at {
            known.by_bytes.retain(|_, value| value.strong_count() > 0);
            known.sweep_at = (2 * known.by_bytes.len()).max(SWEEP_FLOOR);
        }
        Some(made)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Known<T>> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many values it knows, forgotten ones not yet swept included.
    #[cfg(test)]
    fn known(&self) -> usize {
        self.lock().by_bytes.len()
    }
}

impl Interner<str> {
    /// `text`, shared.
    pub fn text(&self, text: &str) -> Arc<str> {
        self.share(text.as_bytes(), || Some(text.into()))
            .expect("text is always made")
    }
}

impl Interner<[u8]> {
    /// `bytes`, shared: the one held already if any, else `bytes` itself.
    pub fn bytes(&self, bytes: Arc<[u8]>) -> Arc<[u8]> {
        let key = bytes.clone();
        self.share(&key, || Some(bytes))
            .expect("bytes are always kept")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_bytes_give_the_same_value_while_it_is_held() {
        let names: Interner<str> = Interner::default();
        let a = names.text("node-1");
        let b = names.text("node-1");
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &names.text("node-2")));
        drop((a, b));
        // Nobody holds it: it is made again.
        let made = names.share(b"node-1", || Some(Arc::from("again")));
        assert_eq!(made.as_deref(), Some("again"));
    }

    #[test]
    fn a_value_that_cannot_be_made_is_not_kept() {
        let values: Interner<str> = Interner::default();
        assert_eq!(values.share(b"x", || None), None);
        assert_eq!(values.known(), 0);
    }

    #[test]
    fn forgotten_values_are_swept() {
        let names: Interner<str> = Interner::default();
        let held: Vec<Arc<str>> = (0..10).map(|i| names.text(&format!("held-{i}"))).collect();
        for i in 0..10 * SWEEP_FLOOR {
            names.text(&format!("dropped-{i}"));
        }
        assert!(names.known() < 2 * SWEEP_FLOOR, "{} known", names.known());
        for (i, name) in held.iter().enumerate() {
            assert!(Arc::ptr_eq(name, &names.text(&format!("held-{i}"))));
        }
    }
}
