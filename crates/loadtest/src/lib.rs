//! # payments-loadtest
//!
//! Two tools that check a running payments API from the outside, built on
//! [`payments_client`] and kept out of it, so that a service linking the
//! client does not build a database driver, a flag parser or a histogram:
//!
//! - `payments-smoke` ([`smoke`]): the post-deploy check that proves a
//!   deployed server takes money exactly once. Safe to repeat against
//!   staging: fresh keys, small sandbox charges tagged with the run's id.
//! - `payments-load` ([`load`]): a load generator for a server on this
//!   machine (loopback only) that measures and, above all, counts: the
//!   charges at the provider and in the database must equal the operations
//!   answered 201.
//!
//! Both are libraries first ([`smoke::run`], [`load::run`]): their binaries
//! only parse flags and print the report, and the tests and `payments-bench`
//! call them directly.
//!
//! ## Layout
//! - [`smoke`], [`load`]: each tool's settings, run and report.
//! - [`tool`]: what the two share, written once: the preflight (the server
//!   answers and accepts the token before anything is charged), the `Debug`
//!   of their settings without secrets, and the rest of each binary's `main`.
//! - `database`: finds a run's tagged `charges` rows on SQLite, PostgreSQL
//!   or MySQL (sqlx), for the smoke's `one_row_per_key` and the load's count.
#![forbid(unsafe_code)]

mod database;
pub mod load;
pub mod smoke;
pub mod tool;
