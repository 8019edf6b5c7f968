//! The `oncegate` command.

/// `println!` that returns the write's error instead of panicking: a reader that went away
/// (`oncegate dlq list | head`) ends the command quietly (see `main`).
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)
    }};
}

mod dlq_cmd;
mod logging;
mod machine;
mod queue_cmd;
mod remote;
mod serve;
mod simulate;
mod simulate_aibot;
mod simulate_api;
mod simulate_counts;
mod simulate_ws;
mod store_files;
mod telemetry;
mod tenants_cmd;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Args, Parser, Subcommand};
use oncegate_config::{Config, Severity};
use oncegate_core::{Clock, KeyHash, Record, RecordState, SystemClock, key_for};

/// oncegate: chat-platform events that take effect exactly once.
#[derive(Debug, Parser)]
#[command(name = "oncegate", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the gateway: receive callbacks, admit them once, hand them to the routes' sinks.
    Serve {
        /// The configuration (without one: defaults, embedded store in ./data, no sources).
        #[arg(long, env = "ONCEGATE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// Send signed, encrypted platform events (with retries and replays) to a running gateway and
    /// summarize what was admitted, dropped and delivered.
    Simulate(simulate::SimulateArgs),
    /// Check a configuration file (with ONCEGATE_* overrides applied) and name every problem.
    CheckConfig {
        /// The TOML file (or `--config FILE`, or ONCEGATE_CONFIG, as the other commands take it).
        file: Option<PathBuf>,
        /// The TOML file, named as every other command names it.
        #[arg(long = "config", env = "ONCEGATE_CONFIG", value_name = "FILE")]
        config: Option<PathBuf>,
        /// Also print the configuration serve would run with: the file laid over the
        /// defaults, with the ONCEGATE_* variables applied (secrets shown by where they come
        /// from, never their values).
        #[arg(long)]
        effective: bool,
    },
    /// Read an embedded store's records, queue and dead letters (works while a gateway runs).
    Inspect(InspectArgs),
    /// Move a store file of the earlier embedded format (one redb file) into a store folder.
    MigrateStore {
        /// The earlier store file, e.g. data/oncegate.redb (no gateway may have it open).
        from: PathBuf,
        /// The new store folder, e.g. data/oncegate (must not hold a store).
        to: PathBuf,
    },
    /// Print the commented defaults every configuration is laid over.
    Defaults,
    /// A running gateway's dead letters: list, replay (once, keeping their keys) or purge.
    Dlq(dlq_cmd::DlqArgs),
    /// A running gateway on one screen: readiness, traffic, queue, store, connections.
    Status(remote::StatusArgs),
    /// Exit 0 when a running gateway is ready (/readyz answers 200), 1 when it is not, 2 when
    /// it does not answer: a container healthcheck for an image without a shell.
    Ready(remote::StatusArgs),
    /// A running gateway's queue: every partition's depth and oldest event, or one
    /// partition's events in queue order.
    Queue(queue_cmd::QueueArgs),
    /// A running gateway's tenant registries (a WeCom suite's corps): list, add or remove;
    /// every gateway on the same store follows within a second.
    Tenants(tenants_cmd::TenantsArgs),
    /// A running gateway reads its configuration file again (as on SIGHUP): sources, their
    /// secrets, routes and dispatcher.max_queued change without a restart; on any error
    /// nothing changes and the answer says why.
    Reload(remote::StatusArgs),
}

#[derive(Debug, Args)]
struct InspectArgs {
    /// Take the store path from this configuration.
    #[arg(long, env = "ONCEGATE_CONFIG")]
    config: Option<PathBuf>,
    /// The store folder (or a file of the earlier format; overrides the configuration).
    #[arg(long, conflicts_with = "admin")]
    store: Option<PathBuf>,
    /// Ask a running gateway's admin listener instead (any store; `record` only), e.g.
    /// http://127.0.0.1:9090. A configuration with another store than embedded asks its
    /// gateway too.
    #[arg(long, env = "ONCEGATE_ADMIN_URL", global = true)]
    admin: Option<String>,
    /// The admin token, when asking a gateway (or server.admin_token in --config).
    #[arg(
        long,
        env = "ONCEGATE_ADMIN_TOKEN",
        hide_env_values = true,
        global = true
    )]
    token: Option<String>,
    #[command(subcommand)]
    what: InspectWhat,
}

#[derive(Debug, Subcommand)]
enum InspectWhat {
    /// Counts by state.
    Stats,
    /// One key's record, by its hex hash or by platform, app, kind and id.
    Record {
        /// The 32-character key hash.
        #[arg(long, conflicts_with_all = ["platform", "app", "id"])]
        key: Option<String>,
        /// The platform: feishu, lark, wecom, wechat.
        #[arg(long)]
        platform: Option<String>,
        /// The app id.
        #[arg(long)]
        app: Option<String>,
        /// The sender of a WeCom or WeChat message (its MsgId repeats across senders) or an AI
        /// bot's (msgid): the kind is then msg_id unless named.
        #[arg(long)]
        from: Option<String>,
        /// The kind of id: event_id (the default), message_id, or a business-key kind (msg_id
        /// with --from).
        #[arg(long)]
        kind: Option<String>,
        /// The id.
        #[arg(long)]
        id: Option<String>,
    },
    /// Records, up to a limit.
    Records {
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Queued events, oldest first per partition.
    Queue {
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Dead letters, oldest first.
    DeadLetters {
        /// How many.
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
}

/// mimalloc instead of the C library's allocator: the request path allocates per request, and
/// glibc's (and musl's, in the static build) malloc and free cost several per cent of it.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        // The gateway logs as its configuration says (a configuration that does not load is
        // reported by serve itself, on a plain log).
        Command::Serve { config } => match load(config.as_deref()) {
            Ok(config) => logging::init(config.log.format, &config.log.instance_name()),
            Err(_) => logging::init_plain(),
        },
        _ => logging::init_plain(),
    }
    let result = match cli.command {
        Command::CheckConfig {
            file,
            config,
            effective,
        } => match file.or(config) {
            Some(file) => check_config(&file, effective),
            None => Err(anyhow::anyhow!(
                "name the file to check: oncegate check-config FILE (or --config FILE, or \
                 ONCEGATE_CONFIG=FILE)"
            )),
        },
        Command::Inspect(args) => inspect(args),
        Command::MigrateStore { from, to } => store_files::migrate(&from, &to).map(|()| true),
        Command::Defaults => {
            use std::io::Write as _;
            std::io::stdout()
                .lock()
                .write_all(oncegate_config::DEFAULTS.as_bytes())
                .map(|()| true)
                .map_err(anyhow::Error::from)
        }
        Command::Serve { config } => runtime()
            .and_then(|rt| rt.block_on(serve::serve(config.as_deref())))
            .map(|()| true),
        Command::Simulate(args) => runtime()
            .and_then(|rt| rt.block_on(simulate::simulate(args)))
            .map(|()| true),
        Command::Dlq(args) => runtime().and_then(|rt| rt.block_on(dlq_cmd::dlq(args))),
        Command::Status(args) => runtime().and_then(|rt| rt.block_on(remote::status(args))),
        Command::Ready(args) => runtime().and_then(|rt| rt.block_on(remote::ready(args))),
        Command::Queue(args) => runtime().and_then(|rt| rt.block_on(queue_cmd::queue(args))),
        Command::Tenants(args) => runtime().and_then(|rt| rt.block_on(tenants_cmd::tenants(args))),
        Command::Reload(args) => runtime().and_then(|rt| rt.block_on(remote::reload(args))),
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        // Whoever read the output has all it wanted (`| head`): not an error of ours.
        Err(error)
            if error
                .downcast_ref::<std::io::Error>()
                .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?)
}

fn load(file: Option<&Path>) -> anyhow::Result<Config> {
    Ok(oncegate_config::load(file, std::env::vars())?)
}

/// `[store]`'s durability settings as the Redis store takes them.
pub(crate) fn redis_durability(
    settings: &oncegate_config::RedisSettings,
) -> oncegate_redis::RedisDurability {
    use oncegate_config::RedisDurabilityMode as Mode;
    match settings.durability {
        Mode::Fsync => oncegate_redis::RedisDurability::Fsync,
        Mode::Replicas => oncegate_redis::RedisDurability::Replicas {
            min: settings.min_replicas,
            wait: settings
                .replica_wait
                .unwrap_or(std::time::Duration::from_millis(500)),
        },
        Mode::Memory => oncegate_redis::RedisDurability::Memory,
    }
}

/// What the configured Redis keeps under the configured durability, asked of the server (read
/// only): a problem when it does not hold or cannot be reached, the guarantee in words
/// otherwise.
fn redis_guarantee(settings: &oncegate_config::RedisSettings) -> (Option<Severity>, String) {
    let config = oncegate_redis::RedisConfig {
        cluster: settings.cluster,
        durability: redis_durability(settings),
        ..oncegate_redis::RedisConfig::at(&settings.url)
    };
    let name = config.durability.name();
    match oncegate_redis::RedisStore::probe(&config) {
        Ok(found) if !found.holds => (Some(Severity::Error), found.detail),
        Ok(found) => match found.at_risk {
            Some(at_risk) => (
                Some(Severity::Warning),
                format!(
                    "durability = \"{name}\" in force: {}; acknowledged events \
                     this can lose: {at_risk}",
                    found.detail
                ),
            ),
            None => (
                None,
                format!(
                    "store.durability: durability = \"{name}\" in force: {}",
                    found.detail
                ),
            ),
        },
        Err(error) => (
            Some(Severity::Warning),
            format!(
                "could not ask the Redis what it keeps ({error}); the gateway \
                 checks at start and refuses to start when durability = \"fsync\" does not hold"
            ),
        ),
    }
}

/// Prints every problem (and, `effective`, the configuration as serve reads it); `Ok(false)`
/// when any is an error.
fn check_config(file: &Path, effective: bool) -> anyhow::Result<bool> {
    let config = load(Some(file))?;
    if effective {
        out!(
            "# {}: the defaults, this file and the ONCEGATE_* variables, as serve reads them\n{}",
            file.display(),
            toml::to_string(&config).context("print the configuration")?
        )?;
    }
    let mut problems = oncegate_config::validate(&config);
    problems.extend(machine::problems(&config));
    problems.extend(oncegate_gateway::left_out(&config));
    // Built as serve builds them, the sources whose settings passed: what serve refuses at once
    // (an EncodingAESKey of the wrong length) is said here, and nothing twice.
    let said: Vec<String> = problems.iter().map(|p| p.setting.clone()).collect();
    problems.extend(
        oncegate_gateway::registry::source_problems(&config)
            .into_iter()
            .filter(|p| !said.iter().any(|s| s.starts_with(&p.setting))),
    );
    let mut guarantee = None;
    if let oncegate_config::StoreConfig::Redis(settings) = &config.store
        && !problems.iter().any(|p| p.severity == Severity::Error)
    {
        match redis_guarantee(settings) {
            (Some(severity), message) => problems.push(oncegate_config::Problem {
                severity,
                setting: "store.durability".into(),
                message,
            }),
            (None, message) => guarantee = Some(message),
        }
    }
    if let Some(guarantee) = guarantee {
        out!("{guarantee}")?;
    }
    for problem in &problems {
        out!("{problem}")?;
    }
    let errors = problems
        .iter()
        .filter(|p| p.severity == Severity::Error)
        .count();
    let warnings = problems.len() - errors;
    if errors == 0 {
        out!(
            "{}: ok ({} source{}, {} store, {} warning{})",
            file.display(),
            config.sources.len(),
            if config.sources.len() == 1 { "" } else { "s" },
            config.store.backend(),
            warnings,
            if warnings == 1 { "" } else { "s" }
        )?;
        Ok(true)
    } else {
        out!(
            "{}: {errors} error{}, {warnings} warning{}",
            file.display(),
            if errors == 1 { "" } else { "s" },
            if warnings == 1 { "" } else { "s" }
        )?;
        Ok(false)
    }
}

fn inspect(args: InspectArgs) -> anyhow::Result<bool> {
    let local = match (&args.store, &args.admin, &args.config) {
        (Some(path), _, _) => Some(path.clone()),
        (None, Some(_), _) => None,
        (None, None, config) => match load(config.as_deref())?.store {
            oncegate_config::StoreConfig::Embedded(settings) => Some(settings.path),
            _ => None,
        },
    };
    let Some(path) = local else {
        return inspect_remote(args);
    };
    let reader = store_files::Inspected::open(&path)?;
    let now_ms = SystemClock.now_ms();
    match args.what {
        InspectWhat::Stats => {
            let stats = reader.stats(now_ms)?;
            out!("store        {}", path.display())?;
            out!(
                "pending      {}  (admitted, not handled yet: queued events' keys, their \
                 message-id aliases, dead-lettered events' keys)",
                stats.pending
            )?;
            out!("processing   {}", stats.processing)?;
            out!("completed    {}", stats.completed)?;
            out!("queued       {}", stats.queued)?;
            out!("dead letters {}", stats.dead_letters)?;
        }
        InspectWhat::Record {
            key,
            platform,
            app,
            from,
            kind,
            id,
        } => {
            let key = match (key, platform, app, id) {
                (Some(hex), ..) => KeyHash::from_hex(&hex).with_context(|| {
                    format!("{hex:?} is not a key hash: expected 32 hex characters")
                })?,
                (None, Some(platform), Some(app), Some(id)) => match from {
                    Some(from) => oncegate_core::sender_key(
                        &platform,
                        &app,
                        kind.as_deref().unwrap_or("msg_id"),
                        &id,
                        &from,
                    ),
                    None => key_for(&platform, &app, kind.as_deref().unwrap_or("event_id"), &id),
                },
                _ => bail!("name the record with --key HEX, or with --platform, --app and --id"),
            };
            let found = reader.record(&key)?;
            if found.is_empty() {
                out!("{key}  not seen (or forgotten after its retention)")?;
            }
            for (partition, record) in found {
                out!(
                    "{key}  partition {partition}  {}",
                    describe(&record, now_ms)
                )?;
            }
        }
        InspectWhat::Records { limit } => {
            let records = reader.records(limit)?;
            if records.is_empty() {
                out!("no records (nothing admitted within the retention)")?;
            }
            for (key, record) in records {
                out!("{key}  {}", describe(&record, now_ms))?;
            }
        }
        InspectWhat::Queue { limit } => {
            let queued = reader.queued(limit)?;
            if queued.is_empty() {
                out!("no events queued")?;
            }
            for (id, event, attempt) in queued {
                out!(
                    "{id}  {}/{}  {}  {}  chat={}  attempt={attempt}",
                    event.platform,
                    event.app,
                    event.event_type,
                    event.event_id,
                    event.order_key.as_deref().unwrap_or("-")
                )?;
            }
        }
        InspectWhat::DeadLetters { limit } => {
            let letters = reader.dead_letters(limit)?;
            if letters.is_empty() {
                out!("no dead letters")?;
            }
            for letter in letters {
                out!(
                    "{}  {}  {}  attempts={}  reason: {}",
                    letter.id,
                    letter.event.event_type,
                    letter.event.event_id,
                    letter.attempts,
                    letter.reason
                )?;
            }
        }
    }
    Ok(true)
}

/// `inspect` against a running gateway: one record, through its admin API.
fn inspect_remote(args: InspectArgs) -> anyhow::Result<bool> {
    let InspectWhat::Record {
        key,
        platform,
        app,
        from,
        kind,
        id,
    } = args.what
    else {
        bail!(
            "a running gateway answers `inspect record` (any store); stats, records, the queue \
             and dead letters of it: `oncegate status`, `oncegate dlq list`, or --store FILE \
             for an embedded store"
        );
    };
    let query = match (key, platform, app, id) {
        (Some(hex), ..) => vec![("key", hex)],
        (None, Some(platform), Some(app), Some(id)) => {
            let mut query = vec![("platform", platform), ("app", app), ("id", id)];
            query.extend(kind.map(|kind| ("kind", kind)));
            query.extend(from.map(|from| ("from", from)));
            query
        }
        _ => bail!("name the record with --key HEX, or with --platform, --app and --id"),
    };
    let admin = remote::Admin::new(args.config, args.admin, args.token);
    runtime()?.block_on(remote::record(admin, query))
}

/// A span of `ms` as people read it: `23h59m59s`.
pub(crate) fn span(ms: u64) -> String {
    let secs = ms / 1000;
    format!("{}h{:02}m{:02}s", secs / 3600, secs / 60 % 60, secs % 60)
}

fn describe(record: &Record, now_ms: u64) -> String {
    let left = |at: u64| span(at.saturating_sub(now_ms));
    let state = match &record.state {
        RecordState::Pending => "pending".to_owned(),
        RecordState::Processing {
            token,
            lease_until_ms,
        } => format!(
            "processing (token {token}, lease {} left)",
            left(*lease_until_ms)
        ),
        RecordState::Completed { outcome } => format!(
            "completed ({})",
            outcome
                .as_ref()
                .map_or("no outcome".to_owned(), |o| format!(
                    "{} byte outcome",
                    o.len()
                ))
        ),
    };
    let live = if record.is_live(now_ms) {
        ""
    } else {
        ", expired"
    };
    format!("{state}, kept {} more{live}", left(record.expires_at_ms))
}
