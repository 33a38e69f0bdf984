//! Memory figures the benchmarks print.
// Each bench uses part: the API bench its own process's, the farms bench its children's.
#![allow(dead_code)]

/// A process's resident set now (`VmRSS`) and at its peak so far (`VmHWM`), in MiB; 0
/// where `/proc` has none.
pub struct Rss {
    pub now: f64,
    pub peak: f64,
}

/// This process's.
pub fn rss_mib() -> Rss {
    rss_mib_of(std::process::id())
}

/// The process `pid`'s.
pub fn rss_mib_of(pid: u32) -> Rss {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        let kib = status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .unwrap_or(0.0);
        kib / 1024.0
    };
    Rss {
        now: field("VmRSS:"),
        peak: field("VmHWM:"),
    }
}
