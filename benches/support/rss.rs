//! Memory figures the benchmarks print.

/// The process's resident set now (`VmRSS`) and at its peak so far (`VmHWM`), in MiB; 0
/// where `/proc` has none.
pub struct Rss {
    pub now: f64,
    pub peak: f64,
}

pub fn rss_mib() -> Rss {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
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
