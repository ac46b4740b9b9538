//! `payments-load`: drives a payments API on this machine and counts its
//! charges (see `payments_client::load`). Exit status 0 when the run was
//! correct, 1 when it was not, 2 on bad usage (a non-loopback URL included)
//! or when the run could not start.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use payments_client::load::{self, Config, EXIT_ERROR, Scenario};

/// Load for a payments API on this machine (loopback only), bounded by a
/// count and a duration; reports throughput, latency percentiles and
/// statuses per stream, and checks that the charges at the provider and in
/// the database equal the operations answered 201.
#[derive(Debug, Parser)]
#[command(name = "payments-load", version)]
struct Args {
    /// The API's base URL (localhost, 127.0.0.0/8 or ::1).
    #[arg(long, env = "LOAD_BASE_URL")]
    base_url: String,
    /// A bearer token for a test customer (`payments-api token --customer cus_load`).
    #[arg(long, env = "LOAD_TOKEN", hide_env_values = true)]
    token: String,
    /// The sandbox provider behind the API (loopback only), to count its
    /// charges; `slow` needs it to set the provider's latency.
    #[arg(long, env = "LOAD_SANDBOX_URL", global = true)]
    sandbox_url: Option<String>,
    /// The API's database (sqlite:, postgres://, mysql://), to count this
    /// run's `charges` rows.
    #[arg(long, env = "LOAD_DATABASE_URL", hide_env_values = true, global = true)]
    database_url: Option<String>,
    /// A hard cap on the whole run, setup included, e.g. `30s`, `2m`.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration, global = true)]
    duration: Duration,
    /// How long requests in flight at the cap may still finish.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration, global = true)]
    drain: Duration,
    /// One request's timeout (the retry sends the same key).
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration, global = true)]
    timeout: Duration,
    /// `POST /_sandbox/reset` before the run, so every sandbox charge is
    /// this run's (otherwise charges already listed are left out).
    #[arg(long, global = true)]
    reset_sandbox: bool,
    /// Print the report as JSON.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    scenario: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Every request a fresh key.
    New {
        /// Operations in all.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        requests: u64,
        /// Operations at a time.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// Completed keys re-sent round-robin: every answer must be a replay.
    Replay {
        /// Charges made first, then re-sent.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
        keys: u64,
        /// Re-sends in all.
        #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..))]
        requests: u64,
        /// Requests at a time.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// Many concurrent requests per key: one charge per key, only 201/409.
    Storm {
        /// Keys, one after another (`--concurrency` at a time).
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
        keys: u64,
        /// Requests per key, released at once.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        per_key: u64,
        /// Keys stormed at a time.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
        concurrency: u64,
    },
    /// A slow provider: many charges in flight, replays and GETs measured meanwhile.
    Slow {
        /// The sandbox's latency during the run (set back to 0 at the end).
        #[arg(long, default_value = "18s", value_parser = humantime::parse_duration)]
        provider_latency: Duration,
        /// Charges started at once, each retried with its key until 201.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..))]
        in_flight: u64,
        /// Probes at a time, each a replay then a GET of a completed charge.
        #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
        probe_concurrency: u64,
        /// Completed charges made first for the probes.
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..))]
        probe_keys: u64,
        /// Each probe's pause between rounds, so probes measure latency
        /// rather than add load of their own.
        #[arg(long, default_value = "10ms", value_parser = humantime::parse_duration)]
        probe_interval: Duration,
    },
}

impl From<Command> for Scenario {
    fn from(command: Command) -> Self {
        match command {
            Command::New {
                requests,
                concurrency,
            } => Scenario::New {
                requests,
                concurrency,
            },
            Command::Replay {
                keys,
                requests,
                concurrency,
            } => Scenario::Replay {
                keys,
                requests,
                concurrency,
            },
            Command::Storm {
                keys,
                per_key,
                concurrency,
            } => Scenario::Storm {
                keys,
                per_key,
                concurrency,
            },
            Command::Slow {
                provider_latency,
                in_flight,
                probe_concurrency,
                probe_keys,
                probe_interval,
            } => Scenario::Slow {
                in_flight,
                provider_latency,
                probe_concurrency,
                probe_keys,
                probe_interval,
            },
        }
    }
}

fn main() -> ExitCode {
    // Clap exits with status 2 on a usage error.
    let args = Args::parse();
    let json = args.json;
    let mut config = Config::new(args.base_url, args.token, args.scenario.into());
    config.sandbox_url = args.sandbox_url;
    config.database_url = args.database_url;
    config.duration = args.duration;
    config.drain = args.drain;
    config.timeout = args.timeout;
    config.reset_sandbox = args.reset_sandbox;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return error(json, &format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(load::run(&config)) {
        Ok(report) => {
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            ExitCode::from(report.exit_code())
        }
        Err(e) => error(json, &e.to_string()),
    }
}

/// The run could not start: exit 2, with a JSON object for machines.
fn error(json: bool, message: &str) -> ExitCode {
    eprintln!("payments-load: {message}");
    if json {
        println!(
            "{}",
            serde_json::json!({"correct": false, "error": message})
        );
    }
    ExitCode::from(EXIT_ERROR)
}
