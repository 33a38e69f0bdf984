//! What a caught panic says, for the log of the request or the task it cut short.

use std::any::Any;

/// The text a panic was raised with, or `"a panic"` for a payload of another kind.
pub fn message(panic: &(dyn Any + Send)) -> &str {
    panic
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| panic.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic")
}
