//! The plumbing `payments-smoke` and `payments-load` share, written once:
//! the preflight that proves the server answers and accepts the token
//! before anything is charged, the `Debug` of their settings with the
//! secrets left out, and the rest of each binary's `main` once its flags
//! are parsed (a runtime, the run, the report printed, the exit status).

use std::fmt;
use std::future::Future;
use std::process::ExitCode;

use payments_client::error::error_chain;
use payments_client::{Client, ClientError};

use crate::{load, smoke};

/// Why the server cannot be used, found by the preflight before anything
/// is charged.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("cannot reach the server at {url}: {detail}")]
    Unreachable { url: String, detail: String },
    #[error("the server at {url} refused the token (401 unauthorized)")]
    Unauthorized { url: String },
}

/// The server answers and accepts the token, before anything is charged: a
/// lookup of `probe`, a charge that does not exist (404 expected; anything
/// but 401 or a transport failure lets the run go on and judge).
pub(crate) async fn preflight(client: &Client, probe: &str) -> Result<(), PreflightError> {
    let url = client.base_url().to_owned();
    match client.get_charge(probe).await {
        Err(ClientError::Transport(e)) => Err(PreflightError::Unreachable {
            url,
            detail: error_chain(&e),
        }),
        Err(ClientError::Rejected { status: 401, .. }) => Err(PreflightError::Unauthorized { url }),
        _ => Ok(()),
    }
}

/// What a tool's report offers its binary.
pub trait ToolReport {
    /// The report's verdict field (`passed`, `correct`), `false` in the JSON
    /// object printed when the run could not start.
    const VERDICT: &'static str;
    /// The exit status when the run could not start (or bad usage).
    const EXIT_ERROR: u8;
    fn to_json(&self) -> String;
    fn to_text(&self) -> String;
    fn exit_code(&self) -> u8;
}

/// Implements [`ToolReport`] with the report's own methods.
macro_rules! tool_report {
    ($report:ty, $verdict:literal, $exit_error:expr) => {
        impl ToolReport for $report {
            const VERDICT: &'static str = $verdict;
            const EXIT_ERROR: u8 = $exit_error;

            fn to_json(&self) -> String {
                <$report>::to_json(self)
            }

            fn to_text(&self) -> String {
                <$report>::to_text(self)
            }

            fn exit_code(&self) -> u8 {
                <$report>::exit_code(self)
            }
        }
    };
}

tool_report!(smoke::Report, "passed", smoke::EXIT_ERROR);
tool_report!(load::Report, "correct", load::EXIT_ERROR);

/// The rest of a tool's `main` once clap has parsed its flags (clap exits
/// with status 2 on a usage error): runs `run` on a multi-threaded runtime,
/// prints its report (JSON with `json`, else text) and exits with the
/// report's status. When the run could not start, the error goes to stderr
/// as `<name>: <error>` (and, with `json`, `{"<verdict>": false, "error"}` to
/// stdout) and the status is [`ToolReport::EXIT_ERROR`].
pub fn finish<R, E>(name: &str, json: bool, run: impl Future<Output = Result<R, E>>) -> ExitCode
where
    R: ToolReport,
    E: fmt::Display,
{
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return error::<R>(name, json, &format!("cannot start the runtime: {e}")),
    };
    match runtime.block_on(run) {
        Ok(report) => {
            if json {
                println!("{}", report.to_json());
            } else {
                print!("{}", report.to_text());
            }
            ExitCode::from(report.exit_code())
        }
        Err(e) => error::<R>(name, json, &e.to_string()),
    }
}

/// The run could not start: the status [`ToolReport::EXIT_ERROR`], with a
/// JSON object for machines.
fn error<R: ToolReport>(name: &str, json: bool, message: &str) -> ExitCode {
    eprintln!("{name}: {message}");
    if json {
        let mut object = serde_json::Map::new();
        object.insert(R::VERDICT.to_owned(), false.into());
        object.insert("error".to_owned(), message.into());
        println!("{}", serde_json::Value::Object(object));
    }
    ExitCode::from(R::EXIT_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_never_show_the_token_or_the_database_password() {
        let database_url = Some("postgres://payments:hunter2@db:5432/payments".into());
        let mut smoke = smoke::Config::new("http://127.0.0.1:8080", "secret-token");
        smoke.database_url = database_url.clone();
        let scenario = load::Scenario::New {
            requests: 1,
            concurrency: 1,
        };
        let mut load = load::Config::new("http://127.0.0.1:8080", "secret-token", scenario);
        load.database_url = database_url;
        for shown in [format!("{smoke:?}"), format!("{load:?}")] {
            assert!(!shown.contains("secret-token"), "{shown}");
            assert!(!shown.contains("hunter2"), "{shown}");
            assert!(
                shown.contains("base_url: \"http://127.0.0.1:8080\""),
                "{shown}"
            );
        }
    }
}
