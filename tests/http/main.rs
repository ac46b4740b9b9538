//! HTTP tests: the real router on loopback, in front of the real sandbox
//! over HTTP, on each backend. Provider-side charges are counted at the
//! sandbox, database-side charges in the test's own database.
#![allow(clippy::unwrap_used)]

mod idempotency;
mod incident;
mod observability;
mod validation;
