//! `payments-smoke`: the post-deploy idempotency check (see
//! `payments_loadtest::smoke`). Exit status 0 when every check passed, 1 when
//! one failed, 2 on bad usage or when the server or database is unreachable.
#![forbid(unsafe_code)]

use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use payments_loadtest::smoke::{self, Config};
use payments_loadtest::tool;

/// Proves from the outside that a deployed payments API takes money exactly
/// once. Safe to run repeatedly: fresh keys, small sandbox charges tagged
/// with `metadata.smoke_run`.
#[derive(Debug, Parser)]
#[command(name = "payments-smoke", version)]
struct Args {
    /// The API's base URL: scheme, host, port and any path prefix.
    #[arg(long, env = "SMOKE_BASE_URL")]
    base_url: String,
    /// A bearer token for a test customer (`payments-api token --customer cus_smoke`).
    #[arg(long, env = "SMOKE_TOKEN", hide_env_values = true)]
    token: String,
    /// A back-office token with refunds:write and charges:capture, for the
    /// refund and capture checks (`payments-api token --subject ops_smoke
    /// --scope refunds:write --scope charges:capture --audience
    /// <JWT_BACKOFFICE_AUDIENCE>`). Without it the customer's token
    /// refunds, which only a server with REFUNDS_BY_CUSTOMER allows, and
    /// the capture check is skipped.
    #[arg(long, env = "SMOKE_BACK_OFFICE_TOKEN", hide_env_values = true)]
    back_office_token: Option<String>,
    /// The server's database (sqlite:, postgres://, mysql://), to check
    /// that each key made exactly one `charges` row.
    #[arg(long, env = "SMOKE_DATABASE_URL", hide_env_values = true)]
    database_url: Option<String>,
    /// Print the report as JSON.
    #[arg(long)]
    json: bool,
    /// Fail when the server accepts a request without an Idempotency-Key
    /// (the `optional` rollout mode).
    #[arg(long)]
    require_key: bool,
    /// One request's timeout, e.g. `30s`, `1500ms`.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// The amount of each charge, in minor units.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..))]
    amount_cents: i64,
    /// The ISO 4217 currency of each charge.
    #[arg(long, default_value = "GBP")]
    currency: String,
    /// A sandbox test card that succeeds.
    #[arg(long, default_value = "tok_visa")]
    card_token: String,
}

fn main() -> ExitCode {
    // Clap exits with status 2 on a usage error.
    let args = Args::parse();
    let json = args.json;
    let config = Config {
        base_url: args.base_url,
        token: args.token.into(),
        back_office_token: args.back_office_token.map(Into::into),
        database_url: args.database_url.map(Into::into),
        require_key: args.require_key,
        timeout: args.timeout,
        amount_cents: args.amount_cents,
        currency: args.currency,
        card_token: args.card_token,
    };
    tool::finish("payments-smoke", json, smoke::run(&config))
}
