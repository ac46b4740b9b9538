//! `payments-load`: drives a payments API on this machine and counts its
//! charges (see `payments_loadtest::load`). Exit status 0 when the run was
//! correct, 1 when it was not, 2 on bad usage (a non-loopback URL included)
//! or when the run could not start.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use payments_loadtest::load::{self, Config, Scenario};
use payments_loadtest::tool;

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
    /// A back-office token with refunds:write and charges:capture, for
    /// `refund`'s refunds and `capture`'s captures. Without it the
    /// customer's token refunds, which only a server with
    /// REFUNDS_BY_CUSTOMER allows, and `capture` refuses to run.
    #[arg(
        long,
        env = "LOAD_BACK_OFFICE_TOKEN",
        hide_env_values = true,
        global = true
    )]
    back_office_token: Option<String>,
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
    scenario: Scenario,
}

fn main() -> ExitCode {
    // Clap exits with status 2 on a usage error.
    let args = Args::parse();
    let json = args.json;
    let mut config = Config::new(args.base_url, args.token, args.scenario);
    config.back_office_token = args.back_office_token.map(Into::into);
    config.sandbox_url = args.sandbox_url;
    config.database_url = args.database_url.map(Into::into);
    config.duration = args.duration;
    config.drain = args.drain;
    config.timeout = args.timeout;
    config.reset_sandbox = args.reset_sandbox;
    tool::finish("payments-load", json, load::run(&config))
}
