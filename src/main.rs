//! The `p2-apiserver` binary: parses the command line and runs the chosen command.

use std::io::IsTerminal;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use tokio::net::TcpListener;
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing_subscriber::EnvFilter;

use p2_apiserver::allocator;
use p2_apiserver::app::App;
use p2_apiserver::auth::Access;
use p2_apiserver::config::{Cli, Command, FarmArgs, ServeArgs, SimulateArgs};
use p2_apiserver::farms::{self, alerts::Alerter};
use p2_apiserver::kv::{open_store, KvStore};
use p2_apiserver::leader::{self, LeaderConfig};
use p2_apiserver::metrics;
use p2_apiserver::server::{self, Tls};
use p2_apiserver::simulator;
use p2_apiserver::state::{Mirror, MirrorConfig};

/// mimalloc rather than the system allocator: the server's many short-lived allocations (a
/// request's JSON, the mirror's decoded entries) cost less CPU, and freed memory is reused
/// rather than left fragmented. Measured with `cargo bench --bench api` on 2 cores: GET one
/// RC and durable PATCH gained well over half, and a 10,000-RC fleet grew the process by
/// 58 to 85 MiB instead of 217 MiB. Built without transparent huge pages (`no_thp`): on a
/// machine where they are given on request, mimalloc's requests kept whole 2 MiB pages for
/// sparsely used memory, and the 10,000-RC farm bench's server was 20 to 40 MiB larger.
/// It also replaces the C library's `malloc` (`override`), so SQLite allocates from the same
/// heap: under glibc's `malloc`, SQLite's threads each kept an arena of their own, which held
/// 48 of the 286 MiB resident in the 10,000-RC farm bench's server 90 s after its start.
/// How soon it gives freed memory back to the OS: [`allocator`].
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> anyhow::Result<()> {
    allocator::start_again_with_allocator_options();
    run()
}

#[tokio::main]
async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    init_tracing();
    match cli.into_command() {
        Command::Serve(args) => serve(*args).await,
        Command::Simulate(args) => simulate(*args).await,
    }
}

/// Logs to stdout, filtered by RUST_LOG (default `info`). A line that cannot be written is
/// dropped without a word: the subscriber would otherwise report it on stderr, and once
/// stderr's reader is gone too (a `| head`, a log collector that died) that report panics
/// the task that logged, such as the one that handles SIGTERM.
fn init_tracing() {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stdout().is_terminal())
        .log_internal_errors(false)
        .init();
}

/// Serves until SIGINT or SIGTERM, then lets in-flight requests finish and exits 0; re-reads
/// the token file and the TLS certificate and key on SIGHUP.
async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    // Before anything records a metric.
    metrics::install();
    let access = Arc::new(args.access.access(args.listen)?);
    let tls = args.tls.tls()?.map(Arc::new);
    // Installed before the port opens, so a signal sent as soon as the server is reachable
    // still shuts it down gracefully instead of killing it.
    let interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let terminate = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let hangup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;

    let store = open_store(&args.store, args.consul.options())
        .await
        .with_context(|| format!("opening the store {}", args.store))?;
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;

    let shutdown = CancellationToken::new();
    let tasks = TaskTracker::new();
    tasks.spawn(cancel_on_signal(interrupt, terminate, shutdown.clone()));
    tasks.spawn(metrics::upkeep(shutdown.clone()));
    tasks.spawn(reload_on_hangup(
        hangup,
        access.clone(),
        tls.clone(),
        shutdown.clone(),
    ));
    // One mirror of the store, read by the API and the farms alike.
    let mirror = Mirror::new(store.clone(), MirrorConfig::default());
    mirror.start(&tasks, shutdown.clone());
    if !args.farms.no_farms {
        tasks.spawn(run_farms(
            store.clone(),
            mirror.clone(),
            args.farms.clone(),
            shutdown.clone(),
        ));
    }
    let served = server::run_with(
        listener,
        tls,
        App::serving(
            store.clone(),
            mirror,
            shutdown.clone(),
            args.http.limits(),
            args.validation(),
            access,
        ),
        shutdown.clone().cancelled_owned(),
    )
    .await;

    // Shutdown hook. Background work (leader election, the farms) runs on `tasks` and watches
    // `shutdown`; each such task destroys the Consul sessions it holds when cancelled, so
    // waiting here is what releases their locks before the process exits.
    shutdown.cancel();
    tasks.close();
    tasks.wait().await;
    store.shut_down().await;
    served.context("serving HTTP")
}

/// Simulates nodes until SIGINT or SIGTERM.
async fn simulate(args: SimulateArgs) -> anyhow::Result<()> {
    let interrupt = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let terminate = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let shutdown = CancellationToken::new();
    let signals = tokio::spawn(cancel_on_signal(interrupt, terminate, shutdown.clone()));
    let result = simulator::run(args.config(), shutdown.clone()).await;
    shutdown.cancel();
    signals.await.context("the signal task panicked")?;
    result
}

/// Campaigns for leadership until shutdown, running the farms on `mirror` while this server
/// leads.
async fn run_farms(
    store: Arc<dyn KvStore>,
    mirror: Mirror,
    args: FarmArgs,
    shutdown: CancellationToken,
) {
    let holder = args.holder();
    let config = LeaderConfig {
        holder: holder.clone(),
        session_ttl: args.leader_ttl,
        lock_delay: args.leader_lock_delay,
        behavior: args.leader_behavior,
    };
    let options = args.options();
    let alerts = Arc::new(Alerter::new(args.alert_webhook));
    let ready = {
        let mirror = mirror.clone();
        move || farms::could_lead(&mirror)
    };
    leader::campaign(store.clone(), config, ready, shutdown, move |term| {
        farms::run_term(
            store.clone(),
            mirror.clone(),
            term,
            alerts.clone(),
            holder.clone(),
            options,
        )
    })
    .await;
}

/// Re-reads the token file and the TLS certificate and key on each SIGHUP until shutdown. A
/// file that cannot be read or is invalid leaves what was read before in force.
async fn reload_on_hangup(
    mut hangup: Signal,
    access: Arc<Access>,
    tls: Option<Arc<Tls>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = hangup.recv() => {}
            () = shutdown.cancelled() => return,
        }
        match access.reload() {
            None => tracing::info!("SIGHUP received; no token file to re-read"),
            Some(Ok(count)) => {
                tracing::info!("SIGHUP received; token file re-read: {count} tokens")
            }
            Some(Err(e)) => tracing::error!(
                "SIGHUP received; keeping the previous tokens, the token file is unusable: {e:#}"
            ),
        }
        if let Some(tls) = &tls {
            match tls.reload() {
                Ok(()) => tracing::info!(
                    "SIGHUP received; TLS certificate and key re-read from {}",
                    tls.cert_path().display()
                ),
                Err(e) => tracing::error!(
                    "SIGHUP received; keeping the previous TLS certificate, the new pair is \
                     unusable: {e:#}"
                ),
            }
        }
    }
}

/// Cancels `shutdown` on the first SIGINT or SIGTERM; returns early if something else
/// cancels it first. A second signal ends the process ([`exit_on_signal`]).
async fn cancel_on_signal(
    mut interrupt: Signal,
    mut terminate: Signal,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = interrupt.recv() => tracing::info!("SIGINT received; shutting down"),
        _ = terminate.recv() => tracing::info!("SIGTERM received; shutting down"),
        () = shutdown.cancelled() => return,
    }
    shutdown.cancel();
    // Not tracked: the graceful stop waits for its tracked tasks, and this one ends only
    // with the process.
    tokio::spawn(exit_on_signal(interrupt, terminate));
}

/// Exits at once, with status 1, on the next SIGINT or SIGTERM: a graceful stop waits for
/// every answer in flight to be taken (a client reading a large one slowly holds it up to
/// `--header-read-timeout` without progress), and an operator who asks again wants it over.
/// The store expires the sessions left.
async fn exit_on_signal(mut interrupt: Signal, mut terminate: Signal) {
    tokio::select! {
        _ = interrupt.recv() => {}
        _ = terminate.recv() => {}
    }
    tracing::warn!("a second signal received; exiting without finishing the graceful stop");
    std::process::exit(1);
}
