//! What this binary was built from, for `GET /version` and the `p2_build_info` metric. The
//! commit and the build time come from `build.rs`.

use std::time::{Duration, SystemTime};

use crate::model::timestamp::format_rfc3339;

/// The crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit built, or `unknown` when built outside a git checkout.
pub const GIT_COMMIT: &str = env!("P2_GIT_COMMIT");

/// When the build script last ran (it runs again when the commit changes), or
/// `SOURCE_DATE_EPOCH` when set, for reproducible builds; RFC 3339.
pub fn build_time() -> String {
    let seconds: u64 = env!("P2_BUILD_EPOCH")
        .parse()
        .expect("build.rs writes the build time as seconds");
    format_rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
}
