//! The `latch` command: parses the CLI, loads settings, sets up logging, runs.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: every request, reading and notification allocates
/// on several threads at once, where glibc's arenas spent ~10 % of delivery's CPU
/// (BENCHMARKS.md, tenth pass). Its version 2 (the workspace's `v2` feature), not the
/// crate's default 3, which kept RSS at 2–3 times the live heap and growing (+7 to +28 %
/// over a million deliveries, `latch bench soak --passes`, BENCHMARKS.md, with the heap in
/// use flat); see also [`no_transparent_huge_pages`]. Wrapped in a count of live bytes that
/// only `latch bench soak` switches on, to tell what latch holds from what mimalloc keeps.
#[global_allocator]
static ALLOCATOR: heap::Counting<mimalloc::MiMalloc> = heap::Counting(mimalloc::MiMalloc);

mod heap;

#[derive(Parser)]
#[command(
    name = "latch",
    version,
    about = "Watches binary sensors and notifies their owners, reliably, when something changes."
)]
struct Cli {
    /// Settings file (TOML); ./latch.toml is read when present.
    #[arg(long, global = true, env = "LATCH_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the service.
    ///
    /// Settings come from the embedded defaults, then the settings file (--config,
    /// LATCH_CONFIG, or ./latch.toml when present), then LATCH_* environment variables,
    /// which win. The ones to know first:
    ///
    ///   LATCH_LISTEN               HTTP address of the API, ingest and console
    ///                              (listen; default 127.0.0.1:8080)
    ///   LATCH_DATA_DIR             folder of the embedded store (data_dir;
    ///                              default ./latch-data)
    ///   LATCH_DATABASE_URL         postgres://… keeps everything in PostgreSQL instead
    ///                              (database_url; several nodes make a cluster)
    ///   LATCH_API_TOKEN            require this bearer token on the API (api_token)
    ///   LATCH_DELIVERY_ALLOW_NETS  networks webhooks may reach although not public,
    ///                              e.g. 127.0.0.0/8 for a receiver on this machine
    ///
    /// `latch config` prints every setting with its value and what it means;
    /// `latch config --check` checks the settings without starting.
    #[command(
        verbatim_doc_comment,
        about = "Run the service (--help names the main settings)"
    )]
    Serve,
    /// Create or upgrade the store's schema, then exit.
    Migrate,
    /// Print the settings latch would run with (the file and LATCH_* variables applied,
    /// secrets masked), with what each means; or check them.
    Config {
        /// Check the settings (FILE, else --config, LATCH_CONFIG or ./latch.toml, and the
        /// environment) exactly as `latch serve` would, without starting: exits non-zero
        /// with the error, naming the key, when they are not valid.
        #[arg(long, value_name = "FILE", num_args = 0..=1)]
        check: Option<Option<PathBuf>>,
        /// Print the embedded defaults only, ignoring any file and the environment.
        #[arg(long, conflicts_with = "check")]
        defaults: bool,
    },
    /// Print the version.
    Version,
    /// Copy the embedded store into FILE while latch serves (a consistent copy as of one
    /// commit). PostgreSQL: use pg_dump (see the README).
    Backup {
        #[arg(long, value_name = "FILE")]
        to: PathBuf,
    },
    /// Replace the embedded store with the backup FILE; refused while a latch runs on the
    /// data folder, and when the key the backup's secrets are sealed under is not there
    /// (the data folder's secret.key, LATCH_SECRET_KEY or LATCH_SECRET_KEY_FILE): it says
    /// which key that is.
    Restore {
        #[arg(long, value_name = "FILE")]
        from: PathBuf,
    },
    /// Give the embedded store's free pages (left by retention) back to the disk; refused
    /// while a latch runs on the data folder.
    Vacuum,
    /// Seal every client's secrets under a new key, while latch runs. With the data
    /// folder's key file, a new key is added to it; with LATCH_SECRET_KEY, the first key
    /// listed becomes the store's (give it to every node first).
    RotateKey,
    /// Measure: run a load scenario against an in-process latch.
    Bench {
        #[command(subcommand)]
        scenario: Box<Scenario>,
        /// Where to record the figures.
        #[arg(long, default_value = "BENCHMARKS.md", global = true)]
        record: PathBuf,
        /// Print only; record nothing.
        #[arg(long, global = true)]
        no_record: bool,
    },
}

#[derive(Subcommand)]
enum Scenario {
    /// Readings over HTTP, accepted durably; baseline: raw SQLite inserts.
    Ingest(latch_bench::ingest::Args),
    /// State changes to webhooks; baseline: a bare client posting the same signed bodies.
    Deliver(latch_bench::deliver::Args),
    /// Memory per sensor, restart time, and a whole fleet going silent at once.
    Fleet(latch_bench::fleet::Args),
    /// Time to ready with N sensors and P pending notifications.
    Restart(latch_bench::restart::Args),
    /// History shipped to ClickHouse: drain rate, and catch-up after an outage.
    History(latch_bench::history::Args),
    /// Memory over millions of deliveries: RSS after a warm-up, halfway and at the end.
    Soak(latch_bench::soak::Args),
    /// Retention shortened to a minute beside a latch keeping everything: bytes on disk
    /// over time, ingest latency with pruning on and off, bytes per reading and
    /// notification.
    Retention(latch_bench::retention::Args),
    /// N `latch serve` processes on one PostgreSQL: ingest and delivery against one node,
    /// and the takeover time after `kill -9` of one.
    Cluster(latch_bench::cluster::Args),
    /// One client's `rate_limit` through N `latch serve` processes against one node: the
    /// webhooks it receives per second.
    Rate(latch_bench::rate::Args),
    /// Many sites, some dark at once: their losses, then in how many rounds every dark
    /// site's return is told.
    Sites(latch_bench::sites::Args),
    /// Ingest with hundreds of active silences of thousands of sensors each, alternated
    /// with ingest with none: the rate with them over the rate without.
    Silences(latch_bench::silences::Args),
    /// A fleet whose sensors all have a hold alarm, many left open at once: how late the
    /// last `sensor.state_held` is made and delivered, and that only the open ones get one.
    Holds(latch_bench::holds::Args),
}

/// An error is printed as one message with its causes, and never with a stack backtrace:
/// `main` returning it would print anyhow's backtrace wherever the shell sets
/// RUST_BACKTRACE=1, and a refused setting is not a bug to debug.
fn main() -> std::process::ExitCode {
    match run() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run() -> anyhow::Result<()> {
    cap_malloc_arenas();
    no_transparent_huge_pages();
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("latch {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        Command::Bench {
            scenario,
            record,
            no_record,
        } => {
            latch::telemetry::init_tracing("warn", latch::config::LogFormat::Text);
            let command = std::env::args()
                .enumerate()
                .map(|(i, a)| if i == 0 { "latch".to_string() } else { a })
                .collect::<Vec<_>>()
                .join(" ");
            if matches!(*scenario, Scenario::Soak(_)) {
                heap::count();
            }
            tokio::runtime::Runtime::new()?.block_on(async {
                let report = match *scenario {
                    Scenario::Ingest(a) => latch_bench::ingest::run(a).await?,
                    Scenario::Deliver(a) => latch_bench::deliver::run(a).await?,
                    Scenario::Fleet(a) => latch_bench::fleet::run(a).await?,
                    Scenario::Restart(a) => latch_bench::restart::run(a).await?,
                    Scenario::History(a) => latch_bench::history::run(a).await?,
                    Scenario::Soak(a) => latch_bench::soak::run(a, heap::live).await?,
                    Scenario::Retention(a) => latch_bench::retention::run(a).await?,
                    Scenario::Cluster(a) => latch_bench::cluster_any(a).await?,
                    Scenario::Rate(a) => latch_bench::rate::run(a).await?,
                    Scenario::Sites(a) => latch_bench::sites::run(a).await?,
                    Scenario::Silences(a) => latch_bench::silences::run(a).await?,
                    Scenario::Holds(a) => latch_bench::holds::run(a).await?,
                };
                report.publish(&command, (!no_record).then_some(record.as_path()))
            })
        }
        Command::Backup { to } => {
            let config = embedded(cli.config.as_deref(), "backup")?;
            let bytes = latch::store::sqlite::backup(&config.data_dir, &to)?;
            println!(
                "backed up {} to {} ({bytes} bytes)",
                config.data_dir.display(),
                to.display()
            );
            Ok(())
        }
        Command::Restore { from } => {
            let config = embedded(cli.config.as_deref(), "restore")?;
            let source = latch::store::key_source(&config);
            let keys = latch::secrets::Keyring::new(source.clone());
            let needs = latch::store::sqlite::restore(&config.data_dir, &from, &keys)?;
            println!(
                "restored {} into {}",
                from.display(),
                config.data_dir.display()
            );
            match needs {
                Some(id) => println!(
                    "its clients' secrets are sealed under key {id}, which {} holds",
                    source.describe()
                ),
                None => println!("it holds no sealed secret: it needs no key"),
            }
            Ok(())
        }
        Command::Vacuum => {
            let config = embedded(cli.config.as_deref(), "vacuum")?;
            let (before, after) = latch::store::sqlite::vacuum(&config.data_dir)?;
            println!(
                "vacuumed {}: {before} bytes -> {after} bytes",
                config.data_dir.display()
            );
            Ok(())
        }
        Command::RotateKey => {
            let config = latch::load_config(cli.config.as_deref())?;
            latch::telemetry::init_tracing("warn", config.log_format);
            tokio::runtime::Runtime::new()?
                .block_on(async {
                    let r = latch::store::rotate_key(&config).await?;
                    match &r.from {
                        Some(from) if *from != r.to => println!(
                            "sealed {} clients' secrets under key {} (was {from})",
                            r.resealed, r.to
                        ),
                        _ => println!(
                            "secrets are sealed under key {} ({} clients sealed now)",
                            r.to, r.resealed
                        ),
                    }
                    Ok(())
                })
                .map_err(|e| redacted(&config, e))
        }
        Command::Config { defaults: true, .. } => {
            print!("{}", latch::config::DEFAULTS);
            Ok(())
        }
        Command::Config {
            check: Some(file), ..
        } => {
            let path = file.or(cli.config);
            latch::load_config(path.as_deref())?;
            let from =
                match path.or_else(|| Some(PathBuf::from("latch.toml")).filter(|p| p.exists())) {
                    Some(p) => format!("{} and the environment", p.display()),
                    None => "the defaults and the environment".into(),
                };
            println!("settings ok ({from})");
            Ok(())
        }
        Command::Config { .. } => {
            // The checks `serve` makes, the adapters' URL checks included.
            latch::load_config(cli.config.as_deref())?;
            let env: Vec<(String, String)> = std::env::vars().collect();
            print!("{}", latch::config::show(cli.config.as_deref(), &env)?);
            Ok(())
        }
        Command::Migrate => {
            let config = latch::load_config(cli.config.as_deref())?;
            latch::telemetry::init_tracing(&config.log, config.log_format);
            tokio::runtime::Runtime::new()?
                .block_on(async {
                    latch::store::connect(&config).await?;
                    println!("store is up to date");
                    Ok(())
                })
                .map_err(|e| redacted(&config, e))
        }
        Command::Serve => {
            let config = Arc::new(latch::load_config(cli.config.as_deref())?);
            // Kept to the end: dropping it sends the last spans.
            let _traces = latch::telemetry::init(
                &config.log,
                config.log_format,
                config.otlp_endpoint.as_deref(),
            )?;
            tokio::runtime::Runtime::new()?
                .block_on(async {
                    // First of all: from here on SIGTERM means a graceful stop.
                    let shutdown = shutdown_signal();
                    let listener = tokio::net::TcpListener::bind(config.listen)
                        .await
                        .with_context(|| format!("cannot listen on {}", config.listen))?;
                    latch::run(config.clone(), listener, shutdown).await
                })
                .map_err(|e| redacted(&config, e))
        }
    }
}

/// The settings, for a command that works on the embedded store's data folder only.
fn embedded(
    path: Option<&std::path::Path>,
    command: &str,
) -> anyhow::Result<latch::config::Config> {
    let config = latch::load_config(path)?;
    if config.database_url.is_some() {
        anyhow::bail!(
            "latch {command} works on the embedded SQLite store; with PostgreSQL use pg_dump \
             and pg_restore (see the README, Operations → Data)"
        );
    }
    Ok(config)
}

/// The error with its causes in one line, passwords and tokens masked: a failed start
/// often quotes the URL it could not reach.
fn redacted(config: &latch::config::Config, e: anyhow::Error) -> anyhow::Error {
    anyhow::anyhow!(config.redact(&format!("{e:#}")))
}

/// glibc gives threads that allocate arenas of their own (up to eight per core) and hands
/// little of them back: over millions of deliveries RSS crept up by fragmentation while the
/// heap in use stayed flat (`latch bench soak`). Two arenas keep RSS near the live heap; it
/// must be set before any thread starts.
fn cap_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` only sets an allocator tunable; called before any other thread.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

/// mimalloc asks the kernel for transparent huge pages on its arenas (`MADV_HUGEPAGE`), and
/// the kernel then backs any 2 MiB range with one page in use with a whole huge page, so
/// memory mimalloc had freed stayed resident: 38–142 MiB of huge pages in a soak whose live
/// heap was 44 MiB. latch's hot data is SQLite's page cache (glibc's heap, small pages);
/// huge pages buy it nothing. Set before any thread starts; it holds for the whole process.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: `prctl` only sets a flag of this process; the arguments are plain integers.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

/// Completes on SIGINT or SIGTERM. The handlers are installed here, before the returned
/// future is first polled: a signal that arrives while latch is still starting (it may
/// already answer `/readyz`) is kept for the shutdown, not left to its default action,
/// which would end the process at once with nothing flushed.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    let term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    #[cfg(unix)]
    let int = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt()).ok();
    async move {
        #[cfg(unix)]
        {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                _ = wait(term) => {}
                _ = wait(int) => {}
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        tracing::info!("Signal received.");
    }
}
