//! The command line: every flag can also come from a `P2_*` environment variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use axum::http::HeaderValue;
use clap::{Args, Parser, Subcommand};
use url::Url;

use crate::app::HttpLimits;
use crate::auth::Access;
use crate::farms::FarmOptions;
use crate::kv::consul::DEFAULT_MAX_CONNECTIONS;
use crate::kv::{
    lock_delay_problem, ConsulOptions, SessionBehavior, StoreUrl, MAX_SESSION_TTL, MIN_SESSION_TTL,
};
use crate::labels::{validate_labels, Labels};
use crate::leader;
use crate::model::{parse_duration, Limits, DEFAULT_MAX_REPLICAS};
use crate::server::Tls;
use crate::simulator::SimulatorConfig;
use crate::state::Mirror;
use crate::store::events::Retention;

/// HTTP/JSON control plane for P2-style deployments over Consul or an embedded SQLite store.
#[derive(Debug, Parser)]
#[command(name = "p2-apiserver", version, args_conflicts_with_subcommands = true)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,

    /// `serve`'s flags, accepted without the subcommand because serving is the default.
    #[command(flatten)]
    serve: Box<ServeArgs>,
}

impl Cli {
    /// The command to run: `serve` when none is named.
    pub fn into_command(self) -> Command {
        self.command.unwrap_or_else(|| Command::Serve(self.serve))
    }
}

/// What the binary can do.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the HTTP API (the default when no command is given).
    // Boxed: it holds every server flag, far more than the other commands.
    Serve(Box<ServeArgs>),
    /// Simulate node agents against a running server: label N nodes, then report the pods
    /// intended on them installed and healthy, as P2's preparers would.
    // Boxed too, so that the enum is no larger than a pointer and a tag.
    Simulate(Box<SimulateArgs>),
}

/// Everything `simulate` needs.
#[derive(Debug, Clone, Args)]
pub struct SimulateArgs {
    /// Base URL of the server to drive: http:// or https://.
    #[arg(
        long,
        value_name = "URL",
        env = "P2_SIM_SERVER",
        default_value = "http://127.0.0.1:8080"
    )]
    pub server: Url,

    /// How many nodes to simulate.
    #[arg(long, value_name = "N", env = "P2_SIM_NODES", default_value_t = 10)]
    pub nodes: usize,

    /// Labels every simulated node gets, as k=v,k=v; at least one, since the farms only know
    /// nodes by their labels.
    #[arg(long, value_name = "LABELS", env = "P2_SIM_LABELS", default_value = "simulated=true",
          value_parser = parse_labels)]
    pub labels: Labels,

    /// Share of nodes (0 to 1) whose pods report critical instead of passing; the same nodes
    /// on every run.
    #[arg(long, value_name = "F", env = "P2_SIM_UNHEALTHY_FRACTION", default_value_t = 0.0,
          value_parser = parse_fraction)]
    pub unhealthy_fraction: f64,

    /// How long a pod takes to start before it is reported installed and healthy.
    #[arg(long, value_name = "DURATION", env = "P2_SIM_START_DELAY", default_value = "1s",
          value_parser = parse_duration)]
    pub start_delay: Duration,

    /// Node names are PREFIX-0001, PREFIX-0002, ...
    #[arg(
        long,
        value_name = "PREFIX",
        env = "P2_SIM_NAME_PREFIX",
        default_value = "node"
    )]
    pub name_prefix: String,

    /// The most requests in flight at once, besides the one change stream, and the most
    /// pods being reported at once (from a pod's install to its health).
    #[arg(long, value_name = "N", env = "P2_SIM_MAX_IN_FLIGHT", default_value_t = 32,
          value_parser = clap::value_parser!(u16).range(1..))]
    pub max_in_flight: u16,

    /// PEM certificates to trust, besides the usual public roots, when the server's URL is
    /// https://: its CA's, or its own self-signed certificate.
    #[arg(long, value_name = "PATH", env = "P2_SIM_CA_CERT")]
    pub ca_cert: Option<PathBuf>,

    /// Bearer token sent with every request, for a server run with --auth-tokens; its role
    /// must both write node labels and report pods, which only admin may do.
    #[arg(
        long,
        value_name = "TOKEN",
        env = "P2_SIM_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,
}

impl SimulateArgs {
    /// The simulator's configuration.
    pub fn config(&self) -> SimulatorConfig {
        SimulatorConfig {
            server: self.server.clone(),
            nodes: self.nodes,
            labels: self.labels.clone(),
            unhealthy_fraction: self.unhealthy_fraction,
            start_delay: self.start_delay,
            name_prefix: self.name_prefix.clone(),
            max_in_flight: usize::from(self.max_in_flight),
            ca_cert: self.ca_cert.clone(),
            token: self.token.clone(),
        }
    }
}

/// `k=v,k=v` into labels, each key and value held to the label rules.
fn parse_labels(text: &str) -> Result<Labels, String> {
    let mut labels = Labels::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (key, value) = pair
            .split_once('=')
            .ok_or_else(|| format!("expected k=v, got {pair:?}"))?;
        labels.insert(key.trim().to_owned(), value.trim().to_owned());
    }
    match validate_labels(&labels).into_iter().next() {
        Some((field, message)) => Err(format!("{field}: {message}")),
        None if labels.is_empty() => Err("give at least one label".into()),
        None => Ok(labels),
    }
}

fn parse_fraction(text: &str) -> Result<f64, String> {
    let fraction: f64 = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    if (0.0..=1.0).contains(&fraction) {
        Ok(fraction)
    } else {
        Err(format!("must be between 0 and 1, not {fraction}"))
    }
}

/// Everything `serve` needs; later features add their flags here.
#[derive(Debug, Clone, Args)]
pub struct ServeArgs {
    /// Address to serve HTTP (HTTPS with --tls-cert) on; port 0 picks a free port, which the log reports
    /// ("listening on ADDR").
    #[arg(
        long,
        value_name = "ADDR",
        env = "P2_LISTEN",
        default_value = "127.0.0.1:8080"
    )]
    pub listen: SocketAddr,

    /// Where the state lives: sqlite://PATH for the embedded store (no other service needed),
    /// consul://HOST:PORT or consul+https://HOST:PORT for Consul.
    #[arg(
        long,
        value_name = "URL",
        env = "P2_STORE",
        default_value = "sqlite://p2-apiserver.db"
    )]
    pub store: StoreUrl,

    #[command(flatten)]
    pub consul: ConsulArgs,

    #[command(flatten)]
    pub farms: FarmArgs,

    #[command(flatten)]
    pub http: HttpArgs,

    #[command(flatten)]
    pub access: AccessArgs,

    #[command(flatten)]
    pub tls: TlsArgs,

    /// The most replicas an RC may want (`replicas_desired`) or a roll may aim for
    /// (`desired_replicas`); a request for more is refused with 422.
    #[arg(long, value_name = "N", env = "P2_MAX_REPLICAS",
          default_value_t = DEFAULT_MAX_REPLICAS,
          value_parser = clap::value_parser!(i64).range(0..))]
    pub max_replicas: i64,
}

impl ServeArgs {
    /// The bounds validation applies.
    pub fn validation(&self) -> Limits {
        Limits {
            max_replicas: self.max_replicas,
        }
    }
}

/// Who may call the API: bearer tokens and browser origins (README, "Authentication").
#[derive(Debug, Clone, Args)]
pub struct AccessArgs {
    /// YAML (or JSON) file of the accepted bearer tokens: per token a name, a role (viewer,
    /// deployer, agent or admin), for an agent optionally its nodes, and the token's hex
    /// SHA-256. Re-read on SIGHUP. Without it no token is needed, which is only allowed on
    /// a loopback address unless --insecure-no-auth is given.
    #[arg(long, value_name = "PATH", env = "P2_AUTH_TOKENS")]
    pub auth_tokens: Option<PathBuf>,

    /// Serve without authentication on a non-loopback address: anyone who can reach the
    /// port may change or delete everything.
    #[arg(long, env = "P2_INSECURE_NO_AUTH", value_parser = on_or_off)]
    pub insecure_no_auth: bool,

    /// An origin (`scheme://host[:port]`) whose browser pages may call the API, preflights
    /// included; repeat the flag for more (in the environment variable, separate them by
    /// commas).
    #[arg(long, value_name = "ORIGIN", env = "P2_CORS_ORIGIN", value_delimiter = ',',
          value_parser = parse_origin)]
    pub cors_origin: Vec<HeaderValue>,

    /// Serve /metrics and /version without a token, for a Prometheus that scrapes without
    /// one; otherwise they need the viewer role.
    #[arg(long, env = "P2_METRICS_PUBLIC", value_parser = on_or_off)]
    pub metrics_public: bool,
}

impl AccessArgs {
    /// Who may call the API, or why the server must not start: without a token file, it
    /// serves only on a loopback address unless told `--insecure-no-auth`.
    pub fn access(&self, listen: SocketAddr) -> anyhow::Result<Access> {
        if self.auth_tokens.is_none() && !listen.ip().is_loopback() && !self.insecure_no_auth {
            anyhow::bail!(
                "refusing to serve on {listen} without authentication: it is not a loopback \
                 address, so anyone who can reach it could change everything. Give \
                 --auth-tokens PATH, or --insecure-no-auth to serve without authentication \
                 anyway"
            );
        }
        Ok(
            Access::new(self.auth_tokens.as_deref(), self.cors_origin.clone())?
                .with_metrics_public(self.metrics_public),
        )
    }
}

/// HTTPS (README, "TLS").
#[derive(Debug, Clone, Args)]
pub struct TlsArgs {
    /// Serve HTTPS only, with this PEM certificate chain (the server's certificate first);
    /// needs --tls-key. Re-read, with the key, on SIGHUP: new connections get the new pair,
    /// and a pair that cannot be used leaves the old one in force.
    #[arg(long, value_name = "PATH", env = "P2_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,

    /// The PEM private key (PKCS#8, PKCS#1 or SEC1) of --tls-cert's certificate; needs
    /// --tls-cert.
    #[arg(long, value_name = "PATH", env = "P2_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The TLS identity to serve with, or `None` to serve plain HTTP.
    pub fn tls(&self) -> anyhow::Result<Option<Tls>> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Tls::load(cert, key).map(Some),
            (None, None) => Ok(None),
            _ => anyhow::bail!("give both --tls-cert and --tls-key, or neither"),
        }
    }
}

/// An origin as browsers send it: `scheme://host[:port]`, nothing after.
fn parse_origin(text: &str) -> Result<HeaderValue, String> {
    let url = Url::parse(text).map_err(|e| format!("{text:?}: {e}"))?;
    let origin = url.origin().ascii_serialization();
    if origin != text.trim_end_matches('/') || !url.origin().is_tuple() {
        return Err(format!(
            "{text:?} is not an origin: give scheme://host[:port], as in {origin:?}"
        ));
    }
    HeaderValue::from_str(&origin).map_err(|e| format!("{text:?}: {e}"))
}

/// Time and connection limits of the HTTP server, so that a hung store or silent, slow or
/// idle clients never hold the server's resources for good. Defaults are
/// [`HttpLimits::default`]'s.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs {
    /// Longest a request is handled once its body is in; past it the answer is 503
    /// (`StoreTimeout`, or `OutcomeUnknown` for a write the store may have applied). A blocking
    /// query (`?index=`) gets its wait, plus a sixteenth for the store's jitter, on top.
    #[arg(long, value_name = "DURATION", env = "P2_REQUEST_TIMEOUT", default_value = "10s",
          value_parser = parse_timeout)]
    pub request_timeout: Duration,

    /// Longest /readyz waits for the store before answering 503 (not ready).
    #[arg(long, value_name = "DURATION", env = "P2_READINESS_TIMEOUT", default_value = "2s",
          value_parser = parse_timeout)]
    pub readiness_timeout: Duration,

    /// Longest a connection may go without a complete request head, whether new or idle
    /// between two requests, or without taking any of an answer sent to it; then it is
    /// closed.
    #[arg(long, value_name = "DURATION", env = "P2_HEADER_READ_TIMEOUT", default_value = "10s",
          value_parser = parse_timeout)]
    pub header_read_timeout: Duration,

    /// Longest a request body may take to arrive in full; past it the answer is 408.
    #[arg(long, value_name = "DURATION", env = "P2_BODY_READ_TIMEOUT", default_value = "30s",
          value_parser = parse_timeout)]
    pub body_read_timeout: Duration,

    /// Most connections open at once; past it a new connection is answered 503 and closed.
    /// Keep it below the open-file limit (ulimit -n).
    #[arg(long, value_name = "N", env = "P2_MAX_CONNECTIONS", default_value_t = 512,
          value_parser = clap::value_parser!(u32).range(1..))]
    pub max_connections: u32,
}

impl HttpArgs {
    /// The limits the server applies.
    pub fn limits(&self) -> HttpLimits {
        HttpLimits {
            request_timeout: self.request_timeout,
            readiness_timeout: self.readiness_timeout,
            header_read_timeout: self.header_read_timeout,
            body_read_timeout: self.body_read_timeout,
            max_connections: self.max_connections as usize,
        }
    }
}

/// What a switch's variable takes: `1`, `yes`, `on`, `true` or `0`, `no`, `off`, `false`
/// (any case), as environments spell them, and nothing else; clap's default for a switch
/// takes only `true` and `false`, and its boolish parser `y`, `t`, `n` and `f` as well.
fn on_or_off(text: &str) -> Result<bool, String> {
    match text.to_ascii_lowercase().as_str() {
        "1" | "yes" | "on" | "true" => Ok(true),
        "0" | "no" | "off" | "false" => Ok(false),
        _ => Err("takes 1, yes, on or true for on, and 0, no, off or false for off".into()),
    }
}

/// A duration above zero: a zero timeout would fail every request.
fn parse_timeout(text: &str) -> Result<Duration, String> {
    let timeout = parse_duration(text)?;
    if timeout.is_zero() {
        return Err("must be above zero".into());
    }
    Ok(timeout)
}

/// Leader election and the farms it runs.
#[derive(Debug, Clone, Args)]
pub struct FarmArgs {
    /// Do not take part in leader election nor run the farms: serve the API only.
    #[arg(long, env = "P2_NO_FARMS", value_parser = on_or_off)]
    pub no_farms: bool,

    /// TTL of the leader's store sessions (10s to 24h). A crashed leader is replaced once
    /// the store expires its session and the lock-delay has passed: on SQLite within TTL +
    /// lock-delay + 1s (its expiry sweep runs every half second), on Consul within 2×TTL +
    /// lock-delay (Consul may expire a session up to twice its TTL after its last renewal).
    #[arg(long, value_name = "DURATION", env = "P2_LEADER_TTL", default_value = "15s",
          value_parser = parse_session_ttl)]
    pub leader_ttl: Duration,

    /// How long the leader lock and the farms' locks stay untakeable after their session
    /// dies, so a deposed leader's in-flight writes land (or fail) before anyone else acts.
    #[arg(long, value_name = "DURATION", env = "P2_LEADER_LOCK_DELAY", default_value = "5s",
          value_parser = parse_lock_delay)]
    pub leader_lock_delay: Duration,

    /// What happens to the leader lock when its session dies: delete (as P2's farms' locks)
    /// or release. The farms' locks under P2's lock trees are always deleted with their
    /// session, as P2's are.
    #[arg(long, value_name = "BEHAVIOR", env = "P2_LEADER_BEHAVIOR", default_value = "delete",
          value_parser = parse_behavior)]
    pub leader_behavior: SessionBehavior,

    /// Names this server in the leader lock and in audit records; defaults to
    /// HOSTNAME:PID.
    #[arg(long, value_name = "NAME", env = "P2_HOLDER",
          value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub holder: Option<String>,

    /// URL the farms POST a JSON alert to when they cannot do what is asked (for example
    /// too few eligible nodes); without it alerts are only logged.
    #[arg(long, value_name = "URL", env = "P2_ALERT_WEBHOOK", value_parser = parse_webhook)]
    pub alert_webhook: Option<String>,

    /// How long a roll may go without progress (a replica moved, a pod placed, removed or
    /// turned healthy) before its `Stalled` condition turns true and an alert is raised.
    #[arg(long, value_name = "DURATION", env = "P2_ROLL_STALL_DEADLINE", default_value = "10m",
          value_parser = parse_timeout)]
    pub roll_stall_deadline: Duration,

    /// How many events (`GET /api/v1/events`) are kept, and how many finished rolls; the
    /// leader prunes the oldest beyond it (first those whose time cannot be read).
    #[arg(long, value_name = "N", env = "P2_EVENT_RETENTION_COUNT", default_value_t = 10_000,
          value_parser = parse_retention_count)]
    pub event_retention_count: usize,

    /// How long events and finished rolls are kept (at least 1m).
    #[arg(long, value_name = "DURATION", env = "P2_EVENT_RETENTION_AGE", default_value = "168h",
          value_parser = parse_retention_age)]
    pub event_retention_age: Duration,
}

impl FarmArgs {
    /// The farms' settings.
    pub fn options(&self) -> FarmOptions {
        FarmOptions {
            roll_stall_deadline: self.roll_stall_deadline,
            retention: Retention {
                count: self.event_retention_count,
                age: self.event_retention_age,
            },
        }
    }

    /// The name this server goes by in the election.
    pub fn holder(&self) -> String {
        self.holder.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "localhost".into());
            format!("{host}:{}", std::process::id())
        })
    }
}

/// An http:// or https:// URL, checked at start: a webhook that cannot be posted to would
/// otherwise show only when an alert is due, and lose it.
fn parse_webhook(text: &str) -> Result<String, String> {
    let url = Url::parse(text).map_err(|e| format!("{text:?} is not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") || !url.has_host() {
        return Err(format!("{text:?} is not an http:// or https:// URL"));
    }
    Ok(text.to_owned())
}

/// A retention count: at least 1, so the latest change is always kept.
fn parse_retention_count(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(count) if count >= 1 => Ok(count),
        _ => Err("must be a whole number, at least 1".into()),
    }
}

/// A retention age that keeps the events just recorded: `0s` would prune every event as it
/// is written, which is more likely a mistaken "no limit" than a wish.
fn parse_retention_age(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        age if age >= Duration::from_secs(60) => Ok(age),
        _ => Err("must be at least 1m".into()),
    }
}

/// A session TTL the store accepts (Consul's range, which both backends enforce).
fn parse_session_ttl(text: &str) -> Result<Duration, String> {
    let ttl = parse_duration(text)?;
    if !(MIN_SESSION_TTL..=MAX_SESSION_TTL).contains(&ttl) {
        return Err("must be between 10s and 24h".into());
    }
    Ok(ttl)
}

/// A lock-delay the store takes as given ([`lock_delay_problem`]).
fn parse_lock_delay(text: &str) -> Result<Duration, String> {
    let delay = parse_duration(text)?;
    match lock_delay_problem(delay) {
        Some(problem) => Err(problem),
        None => Ok(delay),
    }
}

fn parse_behavior(text: &str) -> Result<SessionBehavior, String> {
    match text {
        "delete" => Ok(SessionBehavior::Delete),
        "release" => Ok(SessionBehavior::Release),
        _ => Err(format!("expected delete or release, got {text:?}")),
    }
}

/// How to talk to Consul; ignored with an sqlite:// store.
#[derive(Debug, Clone, Args)]
pub struct ConsulArgs {
    /// Consul ACL token; when unset or empty, CONSUL_HTTP_TOKEN is used, and with neither, no
    /// token is sent.
    #[arg(
        long = "consul-token",
        value_name = "TOKEN",
        env = "P2_CONSUL_TOKEN",
        hide_env_values = true
    )]
    token: Option<String>,

    /// Consul's own token variable, honoured so an environment set up for the `consul` CLI
    /// works as is. Hidden: --consul-token is the documented way.
    #[arg(
        long = "consul-http-token",
        env = "CONSUL_HTTP_TOKEN",
        hide = true,
        hide_env_values = true
    )]
    http_token: Option<String>,

    /// Consul datacenter to read and write; when unset, the agent's own datacenter.
    #[arg(
        long = "consul-datacenter",
        value_name = "DC",
        env = "P2_CONSUL_DATACENTER"
    )]
    datacenter: Option<String>,

    /// The most requests in flight to the Consul agent at once (20 to 65535): a quarter, and
    /// at least one for each of the server's 18 own blocking watches (one per tree it
    /// mirrors, one for its election), kept for those, a quarter (or what is left but one)
    /// for API clients' blocking queries, the rest for everything else, one of them (when
    /// the rest has two or more) kept for session renewals; more wait, and a write still
    /// waiting at its request's deadline is withdrawn unsent (503 StoreTimeout). Keep it
    /// under the agent's limits.http_max_conns_per_client (200 by default), past which it
    /// refuses connections with 429.
    #[arg(id = "consul_max_connections", long = "consul-max-connections", value_name = "N",
          env = "P2_CONSUL_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(MIN_CONSUL_CONNECTIONS..=MAX_CONSUL_CONNECTIONS))]
    max_connections: usize,
}

/// The blocking watches a server keeps open on its store at once, its mirror's and its
/// election's: on Consul each holds a connection for a whole wait, and one left waiting for
/// a connection is answered only once another's wait is over, past its own.
const OWN_WATCHES: usize = Mirror::WATCHES + leader::WATCHES;

/// The fewest connections to Consul a server works with: one for each of its own watches,
/// one for its clients' blocking queries, one for everything else.
const MIN_CONSUL_CONNECTIONS: u64 = OWN_WATCHES as u64 + 2;

/// The most connections to Consul a server is given: one client has no more local ports to
/// open connections to one agent's address from, and far more would pass the bound of the
/// client's semaphores.
const MAX_CONSUL_CONNECTIONS: u64 = 65_535;

impl ConsulArgs {
    /// The options for `open_store`, with the token fallback applied. An empty token (a
    /// variable set to nothing) is none, as for Consul's own tools: it would otherwise hide
    /// CONSUL_HTTP_TOKEN and send the anonymous token.
    pub fn options(&self) -> ConsulOptions {
        let given = |token: &Option<String>| token.clone().filter(|token| !token.is_empty());
        ConsulOptions {
            token: given(&self.token).or_else(|| given(&self.http_token)),
            datacenter: self.datacenter.clone(),
            max_connections: self.max_connections,
            own_watches: OWN_WATCHES,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    use super::*;

    // Parsing tests pass every flag they assert on explicitly, because flags win over the
    // environment: the results cannot depend on what the test process inherits.

    fn serve_args(argv: &[&str]) -> ServeArgs {
        let argv = std::iter::once("p2-apiserver").chain(argv.iter().copied());
        match Cli::try_parse_from(argv).unwrap().into_command() {
            Command::Serve(args) => *args,
            other => panic!("expected serve, got {other:?}"),
        }
    }

    #[test]
    fn definition_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn each_command_is_described_for_its_user() {
        let cli = Cli::command();
        let about = |name| {
            let command = cli.find_subcommand(name).unwrap();
            command.get_about().unwrap().to_string()
        };
        assert_eq!(
            about("serve"),
            "Serve the HTTP API (the default when no command is given)"
        );
        assert!(about("simulate").starts_with("Simulate node agents against a running server"));
    }

    #[test]
    fn every_flag_has_its_env_var_and_default() {
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").unwrap();
        let expected = [
            ("listen", Some("P2_LISTEN"), Some("127.0.0.1:8080")),
            ("store", Some("P2_STORE"), Some("sqlite://p2-apiserver.db")),
            ("token", Some("P2_CONSUL_TOKEN"), None),
            ("http_token", Some("CONSUL_HTTP_TOKEN"), None),
            ("datacenter", Some("P2_CONSUL_DATACENTER"), None),
        ];
        for command in [&cli, serve] {
            for (id, env, default) in expected {
                let arg = command
                    .get_arguments()
                    .find(|a| a.get_id() == id)
                    .unwrap_or_else(|| panic!("no argument {id}"));
                assert_eq!(arg.get_env().and_then(|e| e.to_str()), env, "{id}");
                let defaults: Vec<_> = arg
                    .get_default_values()
                    .iter()
                    .map(|v| v.to_str().unwrap())
                    .collect();
                assert_eq!(defaults.first().copied(), default, "{id}");
            }
        }
    }

    // `debug_assert` does not run defaults through their parsers; this does.
    #[test]
    fn defaults_parse() {
        let cli = Cli::command();
        for id in ["listen", "store"] {
            let arg = cli.get_arguments().find(|a| a.get_id() == id).unwrap();
            let default = arg.get_default_values()[0].to_str().unwrap();
            let argv = ["serve".to_string(), format!("--{id}"), default.to_string()];
            let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
            serve_args(&argv);
        }
    }

    #[test]
    fn serve_is_the_default_command() {
        let flags = [
            "--listen",
            "0.0.0.0:9000",
            "--store",
            "consul://127.0.0.1:8500",
        ];
        for argv in [
            &flags[..],
            &["serve", flags[0], flags[1], flags[2], flags[3]][..],
        ] {
            let args = serve_args(argv);
            assert_eq!(args.listen, "0.0.0.0:9000".parse().unwrap());
            assert_eq!(
                args.store,
                StoreUrl::Consul {
                    base_url: "http://127.0.0.1:8500".into()
                }
            );
        }
    }

    #[test]
    fn parses_consul_flags() {
        let args = serve_args(&[
            "--store",
            "consul+https://consul.example:8501",
            "--consul-token",
            "ours",
            "--consul-http-token",
            "consuls",
            "--consul-datacenter",
            "dc2",
            "--consul-max-connections",
            "40",
        ]);
        assert_eq!(
            args.store,
            StoreUrl::Consul {
                base_url: "https://consul.example:8501".into()
            }
        );
        let options = args.consul.options();
        assert_eq!(options.token.as_deref(), Some("ours"));
        assert_eq!(options.datacenter.as_deref(), Some("dc2"));
        assert_eq!(options.max_connections, 40);
        let fewest = serve_args(&["--consul-max-connections", "20"])
            .consul
            .options();
        assert_eq!((fewest.max_connections, fewest.own_watches), (20, 18));
        // A connection for each of the server's own watches, one for its clients', one for
        // everything else.
        assert!(Cli::try_parse_from(["p2-apiserver", "--consul-max-connections", "19"]).is_err());
        // One client cannot open more connections to one agent's address than it has ports.
        let most = serve_args(&["--consul-max-connections", "65535"]);
        assert_eq!(most.consul.options().max_connections, 65_535);
        for beyond in ["65536", "18446744073709551615"] {
            let argv = ["p2-apiserver", "--consul-max-connections", beyond];
            assert!(Cli::try_parse_from(argv).is_err(), "{beyond} accepted");
        }
    }

    #[test]
    fn consul_http_token_is_the_fallback() {
        // Built directly: parsing would read both variables from the test's environment.
        let args = ConsulArgs {
            token: None,
            http_token: Some("consuls".into()),
            datacenter: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        };
        assert_eq!(args.options().token.as_deref(), Some("consuls"));
    }

    #[test]
    fn an_empty_consul_token_is_no_token() {
        // As a deployment's `P2_CONSUL_TOKEN=` leaves it: Consul's token still applies, and
        // with neither, no empty token is sent.
        let args = |token: &str, http_token: &str| ConsulArgs {
            token: Some(token.into()),
            http_token: Some(http_token.into()),
            datacenter: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
        };
        assert_eq!(
            args("", "consuls").options().token.as_deref(),
            Some("consuls")
        );
        assert_eq!(args("", "").options().token, None);
        assert_eq!(
            args("ours", "consuls").options().token.as_deref(),
            Some("ours")
        );
    }

    fn simulate_args(argv: &[&str]) -> Result<SimulateArgs, clap::Error> {
        let argv = ["p2-apiserver", "simulate"]
            .into_iter()
            .chain(argv.iter().copied());
        match Cli::try_parse_from(argv)?.into_command() {
            Command::Simulate(args) => Ok(*args),
            other => panic!("expected simulate, got {other:?}"),
        }
    }

    #[test]
    fn simulate_flags_have_env_vars() {
        let cli = Cli::command();
        let simulate = cli.find_subcommand("simulate").unwrap();
        for arg in simulate.get_arguments().filter(|a| !a.is_positional()) {
            let id = arg.get_id().as_str();
            if id == "help" {
                continue;
            }
            let env = arg.get_env().and_then(|e| e.to_str()).unwrap_or_default();
            assert_eq!(env, format!("P2_SIM_{}", id.to_uppercase()), "{id}");
        }
    }

    #[test]
    fn parses_simulate_flags() {
        let args = simulate_args(&[
            "--server",
            "http://10.0.0.1:9000/",
            "--nodes",
            "1000",
            "--labels",
            "role=web, zone=a",
            "--unhealthy-fraction",
            "0.25",
            "--start-delay",
            "250ms",
            "--name-prefix",
            "web",
            "--max-in-flight",
            "8",
            "--ca-cert",
            "/etc/p2/ca.pem",
            "--token",
            "secret",
        ])
        .unwrap();
        let config = args.config();
        assert_eq!(config.server.as_str(), "http://10.0.0.1:9000/");
        assert_eq!(config.nodes, 1000);
        assert_eq!(
            config.labels,
            Labels::from([("role".into(), "web".into()), ("zone".into(), "a".into())])
        );
        assert_eq!(config.unhealthy_fraction, 0.25);
        assert_eq!(config.start_delay, Duration::from_millis(250));
        assert_eq!(config.name_prefix, "web");
        assert_eq!(config.max_in_flight, 8);
        assert_eq!(config.ca_cert, Some(PathBuf::from("/etc/p2/ca.pem")));
        assert_eq!(config.token.as_deref(), Some("secret"));
    }

    #[test]
    fn refuses_bad_simulate_values() {
        for argv in [
            &["--server", "not a url"][..],
            &["--labels", "role"][..],
            &["--labels", "role=a b"][..],
            &["--labels", ""][..],
            &["--unhealthy-fraction", "1.5"][..],
            &["--unhealthy-fraction", "-0.1"][..],
            &["--start-delay", "soon"][..],
            &["--max-in-flight", "0"][..],
            &["--nodes", "-1"][..],
        ] {
            assert!(simulate_args(argv).is_err(), "{argv:?}");
        }
    }

    #[test]
    fn refuses_bad_values() {
        for argv in [
            &["--store", "redis://x"][..],
            &["--listen", "localhost"][..],
            &["serve", "--nope"][..],
            // As `P2_HOLDER=` gives it: a leader lock naming no one.
            &["--holder", ""][..],
            // Every event pruned as it is written.
            &["--event-retention-age", "0s"][..],
            &["--event-retention-age", "59s"][..],
        ] {
            let args = std::iter::once("p2-apiserver").chain(argv.iter().copied());
            assert!(Cli::try_parse_from(args).is_err(), "{argv:?} accepted");
        }
    }

    #[test]
    fn the_alert_webhook_must_be_an_http_url() {
        // A webhook that cannot be posted to would otherwise only show when an alert is due,
        // and that alert would be lost.
        for bad in [
            "hooks.example.com/alert",
            "not a url",
            "ftp://hooks.example.com/",
        ] {
            let argv = ["p2-apiserver", "--alert-webhook", bad];
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?}");
        }
        for good in [
            "http://127.0.0.1:9/alert",
            "https://hooks.example.com/a?b=c",
        ] {
            let args = serve_args(&["--alert-webhook", good]);
            assert_eq!(args.farms.alert_webhook.as_deref(), Some(good));
        }
    }

    #[test]
    fn max_replicas_reaches_validation_and_refuses_negatives() {
        let cli = Cli::command();
        let arg = cli
            .get_arguments()
            .find(|a| a.get_id() == "max_replicas")
            .unwrap();
        assert_eq!(arg.get_env().unwrap(), "P2_MAX_REPLICAS");
        let default = arg.get_default_values()[0].to_str().unwrap();
        assert_eq!(
            serve_args(&["--max-replicas", default]).validation(),
            Limits::default()
        );
        assert_eq!(
            serve_args(&["--max-replicas", "7"]).validation(),
            Limits { max_replicas: 7 }
        );
        let argv = ["p2-apiserver", "--max-replicas", "-1"];
        assert!(Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn http_limits_default_to_the_servers_and_refuse_zero() {
        // Each default given back as a flag, so that the environment cannot get in.
        let cli = Cli::command();
        let mut argv = vec!["p2-apiserver".to_string()];
        for id in [
            "request_timeout",
            "readiness_timeout",
            "header_read_timeout",
            "body_read_timeout",
            "max_connections",
        ] {
            let arg = cli.get_arguments().find(|a| a.get_id() == id).unwrap();
            argv.push(format!("--{}", arg.get_long().unwrap()));
            argv.push(arg.get_default_values()[0].to_str().unwrap().to_owned());
        }
        let defaults = match Cli::try_parse_from(argv).unwrap().into_command() {
            Command::Serve(args) => args.http.limits(),
            other => panic!("expected serve, got {other:?}"),
        };
        assert_eq!(defaults, HttpLimits::default());
        let args = serve_args(&[
            "--request-timeout",
            "200ms",
            "--readiness-timeout",
            "1s",
            "--header-read-timeout",
            "3s",
            "--body-read-timeout",
            "4s",
            "--max-connections",
            "7",
        ]);
        assert_eq!(
            args.http.limits(),
            HttpLimits {
                request_timeout: Duration::from_millis(200),
                readiness_timeout: Duration::from_secs(1),
                header_read_timeout: Duration::from_secs(3),
                body_read_timeout: Duration::from_secs(4),
                max_connections: 7,
            }
        );
        for bad in [
            ["--request-timeout", "0s"],
            ["--readiness-timeout", "soon"],
            ["--header-read-timeout", "0ms"],
            ["--max-connections", "0"],
        ] {
            let argv = ["p2-apiserver", bad[0], bad[1]];
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn leader_timings_outside_the_stores_range_are_refused() {
        let args = serve_args(&["--leader-ttl", "1m", "--leader-lock-delay", "0s"]);
        assert_eq!(args.farms.leader_ttl, Duration::from_secs(60));
        assert_eq!(args.farms.leader_lock_delay, Duration::ZERO);
        for bad in [
            ["--leader-ttl", "5s"],
            ["--leader-ttl", "25h"],
            ["--leader-lock-delay", "61s"],
            ["--leader-lock-delay", "500ns"],
            ["--leader-behavior", "keep"],
        ] {
            let argv = ["p2-apiserver", bad[0], bad[1]];
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn the_roll_stall_deadline_defaults_to_the_farms_and_refuses_zero() {
        let cli = Cli::command();
        let arg = cli
            .get_arguments()
            .find(|a| a.get_id() == "roll_stall_deadline")
            .unwrap();
        let default = arg.get_default_values()[0].to_str().unwrap();
        let args = serve_args(&["--roll-stall-deadline", default]);
        assert_eq!(args.farms.options(), FarmOptions::default());
        let args = serve_args(&["--roll-stall-deadline", "90s"]);
        assert_eq!(
            args.farms.options().roll_stall_deadline,
            Duration::from_secs(90)
        );
        let argv = ["p2-apiserver", "--roll-stall-deadline", "0s"];
        assert!(Cli::try_parse_from(argv).is_err());
    }

    #[test]
    fn without_tokens_only_loopback_serves_unless_told_insecure() {
        // Built directly: parsing would read P2_AUTH_TOKENS from the test's environment.
        let args = |insecure_no_auth| AccessArgs {
            auth_tokens: None,
            insecure_no_auth,
            cors_origin: Vec::new(),
            metrics_public: false,
        };
        for loopback in ["127.0.0.1:8080", "[::1]:8080"] {
            assert!(
                args(false).access(loopback.parse().unwrap()).is_ok(),
                "{loopback}"
            );
        }
        let error = args(false)
            .access("0.0.0.0:8080".parse().unwrap())
            .unwrap_err();
        assert!(error.to_string().contains("--insecure-no-auth"), "{error}");
        assert!(args(true).access("0.0.0.0:8080".parse().unwrap()).is_ok());
    }

    #[test]
    fn tls_needs_both_the_certificate_and_the_key() {
        let args = serve_args(&[
            "--tls-cert",
            "/etc/p2/cert.pem",
            "--tls-key",
            "/etc/p2/key.pem",
        ]);
        assert_eq!(args.tls.tls_cert, Some(PathBuf::from("/etc/p2/cert.pem")));
        assert_eq!(args.tls.tls_key, Some(PathBuf::from("/etc/p2/key.pem")));
        for alone in [["--tls-cert", "cert.pem"], ["--tls-key", "key.pem"]] {
            let argv = ["p2-apiserver", alone[0], alone[1]];
            let error = Cli::try_parse_from(argv).unwrap_err();
            assert_eq!(
                error.kind(),
                clap::error::ErrorKind::MissingRequiredArgument,
                "{alone:?}"
            );
        }
        let cli = Cli::command();
        for (id, env) in [("tls_cert", "P2_TLS_CERT"), ("tls_key", "P2_TLS_KEY")] {
            let arg = cli.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert_eq!(arg.get_env().unwrap(), env);
        }
    }

    #[test]
    fn metrics_public_is_a_flag_with_its_env_var() {
        let cli = Cli::command();
        let arg = cli
            .get_arguments()
            .find(|a| a.get_id() == "metrics_public")
            .unwrap();
        assert_eq!(arg.get_env().unwrap(), "P2_METRICS_PUBLIC");
        assert!(serve_args(&["--metrics-public"]).access.metrics_public);
    }

    /// A switch's variable takes the words a shell or a deployment's environment uses for
    /// on and off (`1`, `yes`, `on`, `true`; `0`, `no`, `off`, `false`), as the flag's
    /// presence does: only `true` and `false` were taken, and `P2_NO_FARMS=1` refused to
    /// start.
    #[test]
    fn switches_take_the_usual_words_for_on_and_off_from_their_variables() {
        for (id, env) in [
            ("no_farms", "P2_NO_FARMS"),
            ("insecure_no_auth", "P2_INSECURE_NO_AUTH"),
            ("metrics_public", "P2_METRICS_PUBLIC"),
        ] {
            let cli = Cli::command();
            let arg = cli.get_arguments().find(|a| a.get_id() == id).unwrap();
            assert_eq!(arg.get_env().unwrap(), env);
            let long = arg.get_long().unwrap().to_owned();
            // The variable's text goes through the switch's value parser; given as the
            // switch's value here, so that the test reads no variable.
            let parse = |text: &str| {
                let cli = Cli::command().mut_arg(id, |arg| arg.action(clap::ArgAction::Set));
                let matches =
                    cli.try_get_matches_from(["p2-apiserver", &format!("--{long}"), text]);
                matches.map(|matches| *matches.get_one::<bool>(id).expect("a bool"))
            };
            for on in ["1", "yes", "on", "true", "TRUE"] {
                assert_eq!(parse(on).ok(), Some(true), "{env}={on}");
            }
            for off in ["0", "no", "off", "false"] {
                assert_eq!(parse(off).ok(), Some(false), "{env}={off}");
            }
            // A word that says neither is refused, rather than taken for either; so are
            // the one-letter words of other parsers, which the README does not name.
            for other in ["maybe", "y", "t", "n", "f"] {
                assert!(parse(other).is_err(), "{env}={other}");
            }
        }
        let args = serve_args(&["--no-farms", "--insecure-no-auth", "--metrics-public"]);
        assert!(args.farms.no_farms && args.access.insecure_no_auth && args.access.metrics_public);
    }

    #[test]
    fn cors_origins_are_repeatable_origins() {
        let args = serve_args(&[
            "--cors-origin",
            "https://dash.example",
            "--cors-origin",
            "http://localhost:3000",
        ]);
        assert_eq!(
            args.access.cors_origin,
            ["https://dash.example", "http://localhost:3000"]
        );
        for bad in ["dash.example", "https://dash.example/path", "*"] {
            let argv = ["p2-apiserver", "--cors-origin", bad];
            assert!(Cli::try_parse_from(argv).is_err(), "{bad:?} accepted");
        }
    }
}
