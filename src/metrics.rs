//! The server's Prometheus metrics: the one home of every metric's name, labels and help
//! text, and of the recorder that `GET /metrics` renders.
//!
//! Metrics are recorded through the `metrics` facade into the process's one
//! `metrics-exporter-prometheus` recorder, installed by [`install`]; the code that records
//! (the store wrapper, the farms, the election, the mirror, the change stream) calls the
//! functions here, so it needs no handle passed down to it. The exporter's own HTTP listener
//! is not used: the API serves the text format itself, behind its authentication.
//!
//! Durations are histograms in seconds, whose `_count` also counts the events measured.
//! Label values come from small fixed sets (route templates, never raw paths), so the number
//! of series stays bounded whatever clients send.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use axum::extract::{MatchedPath, Request};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio_util::sync::CancellationToken;

/// HTTP requests, by `route` (the route template, `unmatched` for a request no route takes),
/// `method` and `status` (`499` for one whose client hung up first); the time to the
/// response's head, or to the hang-up.
pub const HTTP_REQUEST_DURATION: &str = "p2_http_request_duration_seconds";
/// Store operations, by `backend` (`sqlite`, `consul`), `operation` (the store call: `get`,
/// `list`, `txn`, `watch`, ...) and `outcome` (`ok`, or the error kind: `conflict`,
/// `not_found`, `unavailable`, `outcome_unknown`, `invalid`, `forbidden`).
pub const STORE_OPERATION_DURATION: &str = "p2_store_operation_duration_seconds";
/// The embedded store's writer, by `stage` ([`WriterStage`]). The writer does one stage at a
/// time, so the stages' sums tell where its time goes.
pub const SQLITE_WRITER_STAGE_DURATION: &str = "p2_sqlite_writer_stage_duration_seconds";
/// Rows the embedded store's writer wrote into the database, changed or deleted, in batches
/// that committed.
pub const SQLITE_ROWS_WRITTEN: &str = "p2_sqlite_rows_written_total";
/// Passes of a farm over every object it owns, by `farm`.
pub const FARM_RECONCILE_DURATION: &str = "p2_farm_reconcile_duration_seconds";
/// Failed reconciles of one object by a farm (each puts the object into backoff), failed
/// steps of a farm that has no objects (`retention`), and failed tidying, by `farm`.
pub const FARM_ERRORS: &str = "p2_farm_errors_total";
/// Objects (or steps) a farm waits to retry after a failure, its failed tidying counting as
/// one, by `farm`.
pub const FARM_QUEUE_DEPTH: &str = "p2_farm_queue_depth";
/// Objects whose ownership lock this server's farm holds, by `farm`.
pub const FARM_OWNED_OBJECTS: &str = "p2_farm_owned_objects";
/// 1 while this server leads (runs the farms), else 0.
pub const LEADER: &str = "p2_leader_is_leader";
/// Leadership terms this server has begun.
pub const LEADER_TERMS: &str = "p2_leader_terms_total";
/// How far the mirror may be behind the store, by `tree` (its key prefix).
pub const MIRROR_LAG: &str = "p2_mirror_lag_seconds";
/// Clients of the change stream (`GET /api/v1/watch`) connected now.
pub const SSE_CLIENTS: &str = "p2_sse_clients";
/// Clients of the change stream cut off for falling too far behind.
pub const SSE_CLIENTS_DROPPED: &str = "p2_sse_clients_dropped_total";
/// Connections answered 503 and closed (over HTTPS, closed unanswered) at
/// `--max-connections`: no request of theirs reaches the request histogram.
pub const HTTP_CONNECTIONS_REFUSED: &str = "p2_http_connections_refused_total";
/// Always 1, labelled with the `version` and `git_commit` the binary was built from.
pub const BUILD_INFO: &str = "p2_build_info";

/// Histogram buckets, in seconds: from 50 µs (a read served from the mirror takes tens of
/// microseconds, an SQLite get a few hundred) to ten minutes (the longest blocking watch).
const BUCKETS: [f64; 21] = [
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
    2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0,
];

/// How often recorded durations are folded into their histograms between scrapes, so that
/// memory stays bounded when nobody scrapes.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// The process's recorder, installed (and every metric described) on the first call; later
/// calls return the same. Call it before anything records: what is recorded without a
/// recorder is lost.
pub fn install() -> &'static PrometheusHandle {
    static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
    HANDLE.get_or_init(|| {
        let recorder = PrometheusBuilder::new()
            .set_buckets(&BUCKETS)
            .expect("the buckets are not empty")
            .build_recorder();
        let handle = recorder.handle();
        if let Err(e) = metrics::set_global_recorder(recorder) {
            tracing::error!(error = %e, "another metrics recorder is installed; /metrics stays empty");
        }
        describe();
        handle
    })
}

/// The Prometheus text exposition of every metric.
pub fn render() -> String {
    install().render()
}

/// Folds recorded durations into their histograms every few seconds until `shutdown`.
pub async fn upkeep(shutdown: CancellationToken) {
    let handle = install();
    loop {
        tokio::select! {
            () = tokio::time::sleep(UPKEEP_EVERY) => handle.run_upkeep(),
            () = shutdown.cancelled() => return,
        }
    }
}

/// Gives every metric its help text, and sets the build's.
fn describe() {
    describe_histogram!(
        HTTP_REQUEST_DURATION,
        metrics::Unit::Seconds,
        "HTTP requests by route template, method and status (499: the client hung up first): \
         time to the response head"
    );
    describe_histogram!(
        STORE_OPERATION_DURATION,
        metrics::Unit::Seconds,
        "Store operations by backend, operation and outcome"
    );
    describe_histogram!(
        FARM_RECONCILE_DURATION,
        metrics::Unit::Seconds,
        "Passes of each farm over every object it owns"
    );
    describe_histogram!(
        SQLITE_WRITER_STAGE_DURATION,
        metrics::Unit::Seconds,
        format!(
            "The embedded store's writer, by stage: {}",
            WriterStage::ALL.map(WriterStage::label).join(", ")
        )
    );
    describe_counter!(
        SQLITE_ROWS_WRITTEN,
        "Rows the embedded store's writer wrote into the database, in batches that committed"
    );
    describe_counter!(
        FARM_ERRORS,
        "Failed reconciles of one object by each farm, failed steps of the retention farm, \
         and failed tidying (freeing the locks, and removing the conditions, of objects gone)"
    );
    describe_gauge!(
        FARM_QUEUE_DEPTH,
        "Objects (for the retention farm, steps) each farm waits to retry after a failure, \
         its failed tidying counting as one"
    );
    describe_gauge!(
        FARM_OWNED_OBJECTS,
        "Objects whose ownership lock each farm holds"
    );
    describe_gauge!(LEADER, "1 while this server leads and runs the farms");
    describe_counter!(LEADER_TERMS, "Leadership terms this server has begun");
    describe_gauge!(
        MIRROR_LAG,
        metrics::Unit::Seconds,
        "How far each tree of the mirror may be behind the store: 0 while its watch works, \
         else the time since its last successful read"
    );
    describe_gauge!(SSE_CLIENTS, "Clients of the change stream connected now");
    describe_counter!(
        SSE_CLIENTS_DROPPED,
        "Clients of the change stream cut off for falling too far behind"
    );
    describe_counter!(
        HTTP_CONNECTIONS_REFUSED,
        "Connections refused at --max-connections (answered 503, or over HTTPS closed unanswered)"
    );
    describe_gauge!(BUILD_INFO, "The version and git commit of this binary");
    gauge!(BUILD_INFO, "version" => crate::version::VERSION, "git_commit" => crate::version::GIT_COMMIT)
        .set(1.0);
    // Shown from the start, not from their first change: a server that has never led
    // reports 0, so that `sum(p2_leader_is_leader) < 1` fires when no server leads (a sum
    // of no series is no answer at all), and a counter's first increase is seen by
    // `rate()` and `increase()`, which need a sample before it.
    gauge!(LEADER).set(0.0);
    counter!(LEADER_TERMS).increment(0);
    gauge!(SSE_CLIENTS).increment(0.0);
    counter!(SSE_CLIENTS_DROPPED).increment(0);
    counter!(HTTP_CONNECTIONS_REFUSED).increment(0);
}

/// The `status` label of a request whose client hung up before its answer's head (its
/// handling dropped with the connection): nginx's 499, "client closed request".
pub const CLIENT_CLOSED_STATUS: &str = "499";

/// Middleware recording every request under its route template, method and status; a
/// request whose client hangs up first is recorded as it is dropped, under
/// [`CLIENT_CLOSED_STATUS`].
pub async fn track_http(request: Request, next: Next) -> Response {
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| "unmatched".to_owned(), |m| m.as_str().to_owned());
    let mut in_flight = InFlight {
        route: Some(route),
        method: method_label(request.method()),
        started: Instant::now(),
    };
    let response = next.run(request).await;
    in_flight.record(&response.status().as_u16().to_string());
    response
}

/// A request being handled: recorded once, with its status when answered, or with
/// [`CLIENT_CLOSED_STATUS`] when dropped unanswered.
struct InFlight {
    /// `None` once recorded.
    route: Option<String>,
    method: &'static str,
    started: Instant,
}

impl InFlight {
    fn record(&mut self, status: &str) {
        if let Some(route) = self.route.take() {
            histogram!(HTTP_REQUEST_DURATION, "route" => route, "method" => self.method, "status" => status.to_owned())
                .record(self.started.elapsed());
        }
    }
}

impl Drop for InFlight {
    /// Dropped unanswered: the client hung up, or a layer around the handler panicked (a
    /// server fault, which the client sees as its connection closed; the handler's own panic
    /// is answered 500 by the router's `deadline`), counted as a 500.
    fn drop(&mut self) {
        let status = if std::thread::panicking() {
            "500"
        } else {
            CLIENT_CLOSED_STATUS
        };
        self.record(status);
    }
}

/// The method's name if it is a standard one; `other` for any other, which clients may make
/// up at will.
fn method_label(method: &Method) -> &'static str {
    const KNOWN: [Method; 9] = [
        Method::GET,
        Method::HEAD,
        Method::POST,
        Method::PUT,
        Method::PATCH,
        Method::DELETE,
        Method::OPTIONS,
        Method::TRACE,
        Method::CONNECT,
    ];
    KNOWN
        .iter()
        .find(|known| *known == method)
        .map_or("other", |known| known.as_str())
}

/// Records one store operation.
pub fn store_operation(
    backend: &'static str,
    operation: &'static str,
    outcome: &'static str,
    took: Duration,
) {
    histogram!(STORE_OPERATION_DURATION, "backend" => backend, "operation" => operation, "outcome" => outcome)
        .record(took);
}

/// A stage of the embedded store's writer, in the order a write goes through them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriterStage {
    /// The rows that queued transactions check, read together.
    Read,
    /// Their ops applied in memory.
    Check,
    /// The batch's changed rows written into the database.
    Write,
    /// The batch made durable.
    Commit,
}

impl WriterStage {
    pub const ALL: [WriterStage; 4] = [
        WriterStage::Read,
        WriterStage::Check,
        WriterStage::Write,
        WriterStage::Commit,
    ];

    /// Its `stage` label.
    pub fn label(self) -> &'static str {
        match self {
            WriterStage::Read => "read",
            WriterStage::Check => "check",
            WriterStage::Write => "write",
            WriterStage::Commit => "commit",
        }
    }
}

/// Records one stage of the embedded store's writer.
pub fn sqlite_writer_stage(stage: WriterStage, took: Duration) {
    histogram!(SQLITE_WRITER_STAGE_DURATION, "stage" => stage.label()).record(took);
}

/// Counts rows the embedded store's writer wrote into the database, once their batch
/// committed.
pub fn sqlite_rows_written(rows: usize) {
    counter!(SQLITE_ROWS_WRITTEN).increment(rows as u64);
}

/// What one pass of a farm left: how long it took, the failures since the last pass, the
/// objects waiting for a retry, and the objects it owns (for a farm that owns any).
pub struct FarmPass {
    pub took: Duration,
    /// Failed reconciles since the previous pass.
    pub new_errors: u64,
    /// Objects waiting for a retry.
    pub waiting: usize,
    /// Objects owned; `None` for a farm that owns none.
    pub owned: Option<usize>,
}

/// Records one pass of `farm`.
pub fn farm_pass(farm: &'static str, pass: FarmPass) {
    histogram!(FARM_RECONCILE_DURATION, "farm" => farm).record(pass.took);
    counter!(FARM_ERRORS, "farm" => farm).increment(pass.new_errors);
    gauge!(FARM_QUEUE_DEPTH, "farm" => farm).set(pass.waiting as f64);
    if let Some(owned) = pass.owned {
        gauge!(FARM_OWNED_OBJECTS, "farm" => farm).set(owned as f64);
    }
}

/// Records that `farm` stopped with its term: it owns nothing (its locks went with the
/// term's session) and waits on nothing any more.
fn farm_stopped(farm: &'static str, owns: bool) {
    gauge!(FARM_QUEUE_DEPTH, "farm" => farm).set(0.0);
    if owns {
        gauge!(FARM_OWNED_OBJECTS, "farm" => farm).set(0.0);
    }
}

/// A farm running in a term. Once dropped, however the farm stopped (with its term, or by
/// a panic, which ends the term too), its gauges say it owns and waits on nothing, so that a
/// server that no longer leads never shows what the farm's last pass saw.
pub struct FarmRunning {
    farm: &'static str,
    owns: bool,
}

impl FarmRunning {
    /// `farm` (which owns objects when `owns`) has started.
    pub fn started(farm: &'static str, owns: bool) -> FarmRunning {
        FarmRunning { farm, owns }
    }
}

impl Drop for FarmRunning {
    fn drop(&mut self) {
        farm_stopped(self.farm, self.owns);
    }
}

/// Records that this server began (`true`) or ended (`false`) a leadership term.
pub fn leading(leads: bool) {
    if leads {
        counter!(LEADER_TERMS).increment(1);
    }
    gauge!(LEADER).set(if leads { 1.0 } else { 0.0 });
}

/// Records how far the mirror of the tree under `prefix` may be behind: zero while its
/// watch is in touch with the store, else the time since it last was
/// ([`crate::state::Mirror::publish_lag`]).
pub fn mirror_lag(prefix: &str, lag: Duration) {
    gauge!(MIRROR_LAG, "tree" => prefix.to_owned()).set(lag.as_secs_f64());
}

/// Counts a change-stream client cut off for falling too far behind.
pub fn sse_client_dropped() {
    counter!(SSE_CLIENTS_DROPPED).increment(1);
}

/// Counts a connection refused at `--max-connections`.
pub fn connection_refused() {
    counter!(HTTP_CONNECTIONS_REFUSED).increment(1);
}

/// Counts a change-stream client while it lives.
pub struct SseClient(());

impl SseClient {
    /// Counts a client that just connected, until the value is dropped.
    pub fn connected() -> SseClient {
        gauge!(SSE_CLIENTS).increment(1.0);
        SseClient(())
    }
}

impl Drop for SseClient {
    fn drop(&mut self) {
        gauge!(SSE_CLIENTS).decrement(1.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prom_text_format_parser::Scrape;

    /// The value of the gauge `name` of farm `farm` in `text`, parsed as Prometheus would.
    fn farm_gauge(text: &str, name: &str, farm: &str) -> Option<f64> {
        value(text, name, Some(("farm", farm)))
    }

    /// The value of the counter or gauge `name` in `text` (its sample with the `label`
    /// given, if any), parsed as Prometheus would.
    fn value(text: &str, name: &str, label: Option<(&str, &str)>) -> Option<f64> {
        let scrape = Scrape::parse(text).expect("the Prometheus text format");
        let metric = scrape.metrics.iter().find(|metric| metric.name == name)?;
        let sample = metric.samples.iter().find(|sample| {
            label.is_none_or(|(key, value)| {
                sample
                    .labels
                    .iter()
                    .any(|l| l.key == key && l.value == value)
            })
        })?;
        Some(sample.value.value.as_f64())
    }

    /// A server that has never led nor had a change-stream client shows leadership and the
    /// change stream at 0, not nothing: a cluster where no server leads must sum to 0.
    #[test]
    fn leadership_and_the_change_stream_are_shown_at_zero_from_the_start() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, describe);
        let text = handle.render();
        for name in [LEADER, LEADER_TERMS, SSE_CLIENTS, SSE_CLIENTS_DROPPED] {
            assert_eq!(value(&text, name, None), Some(0.0), "{name} in\n{text}");
        }
        assert_eq!(value(&text, BUILD_INFO, None), Some(1.0), "{text}");
    }

    /// The help of the farms' error and retry metrics tells all they count, as the README
    /// does: the retention farm's failed steps, and each farm's failed tidying, beside
    /// failed reconciles of objects.
    #[test]
    fn the_farms_error_and_retry_help_tells_all_they_count() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let pass = FarmPass {
            took: Duration::from_millis(1),
            new_errors: 1,
            waiting: 1,
            owned: None,
        };
        metrics::with_local_recorder(&recorder, || {
            describe();
            farm_pass("retention", pass);
        });
        let text = handle.render();
        let scrape = Scrape::parse(&text).expect("the Prometheus text format");
        for name in [FARM_ERRORS, FARM_QUEUE_DEPTH] {
            let metric = scrape.metrics.iter().find(|m| m.name == name).unwrap();
            let help = metric.help_desc.as_deref().unwrap_or_default();
            for counted in ["retention", "tidying"] {
                assert!(help.contains(counted), "{name}: {help:?} omits {counted}");
            }
        }
    }

    /// A farm that stops with its term (its locks gone with the term's session) reports
    /// owning and waiting for nothing, not what its last pass saw.
    #[test]
    fn a_stopped_farm_reports_owning_and_waiting_for_nothing() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let gauges = || {
            let text = handle.render();
            let gauge = |name| farm_gauge(&text, name, "rc");
            (gauge(FARM_OWNED_OBJECTS), gauge(FARM_QUEUE_DEPTH))
        };
        let pass = FarmPass {
            took: Duration::from_millis(1),
            new_errors: 0,
            waiting: 3,
            owned: Some(5),
        };
        metrics::with_local_recorder(&recorder, || farm_pass("rc", pass));
        assert_eq!(gauges(), (Some(5.0), Some(3.0)));
        metrics::with_local_recorder(&recorder, || farm_stopped("rc", true));
        assert_eq!(gauges(), (Some(0.0), Some(0.0)));
    }
}
