//! The `one_row_per_key` check's view of the database behind the server: the
//! `charges` rows whose metadata carries this run's id.
//!
//! `metadata` is TEXT on SQLite and MySQL but JSONB on PostgreSQL, so every
//! dialect casts it to text before `LIKE`; the match is then confirmed by
//! parsing the JSON, so the `LIKE` is only a filter.

use std::collections::BTreeMap;
use std::str::FromStr;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, MySqlConnection, PgConnection, SqliteConnection};

use super::SmokeError;
use super::report::Check;

/// One connection (the smoke needs no pool), read only in practice: the
/// smoke only ever SELECTs.
#[derive(Debug)]
pub(crate) enum Database {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
    MySql(MySqlConnection),
}

/// A `charges` row made by this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SmokeRow {
    pub id: String,
    /// The check that made it (`metadata.smoke_check`).
    pub check: String,
}

impl Database {
    /// Opens `url` by its scheme: `sqlite:`, `postgres://` / `postgresql://`,
    /// `mysql://` / `mariadb://`.
    pub(crate) async fn connect(url: &str) -> Result<Self, SmokeError> {
        let scheme = url.split(':').next().unwrap_or_default();
        let db = match scheme {
            "sqlite" => {
                // Never create a file: a typo should fail, not find no rows.
                let options = SqliteConnectOptions::from_str(url)
                    .map_err(SmokeError::Database)?
                    .create_if_missing(false);
                Self::Sqlite(options.connect().await.map_err(SmokeError::Database)?)
            }
            "postgres" | "postgresql" => Self::Postgres(
                PgConnection::connect(url)
                    .await
                    .map_err(SmokeError::Database)?,
            ),
            "mysql" | "mariadb" => Self::MySql(
                MySqlConnection::connect(url)
                    .await
                    .map_err(SmokeError::Database)?,
            ),
            _ => return Err(SmokeError::UnsupportedDatabase(scheme.to_owned())),
        };
        Ok(db)
    }

    /// The rows whose `metadata.smoke_run` is `run_id`.
    pub(crate) async fn rows_of_run(&mut self, run_id: &str) -> Result<Vec<SmokeRow>, sqlx::Error> {
        let pattern = format!("%{run_id}%");
        let rows: Vec<(String, String)> = match self {
            Self::Sqlite(conn) => {
                sqlx::query_as(
                    "SELECT id, CAST(metadata AS TEXT) FROM charges \
                     WHERE CAST(metadata AS TEXT) LIKE ?",
                )
                .bind(pattern)
                .fetch_all(conn)
                .await?
            }
            Self::Postgres(conn) => {
                sqlx::query_as(
                    "SELECT id, CAST(metadata AS TEXT) FROM charges \
                     WHERE CAST(metadata AS TEXT) LIKE $1",
                )
                .bind(pattern)
                .fetch_all(conn)
                .await?
            }
            Self::MySql(conn) => {
                sqlx::query_as(
                    "SELECT id, CAST(metadata AS CHAR) FROM charges \
                     WHERE CAST(metadata AS CHAR) LIKE ?",
                )
                .bind(pattern)
                .fetch_all(conn)
                .await?
            }
        };
        Ok(rows
            .into_iter()
            .filter_map(|(id, metadata)| {
                let metadata: BTreeMap<String, serde_json::Value> =
                    serde_json::from_str(&metadata).ok()?;
                if metadata.get("smoke_run")?.as_str()? != run_id {
                    return None;
                }
                let check = metadata.get("smoke_check")?.as_str()?.to_owned();
                Some(SmokeRow { id, check })
            })
            .collect())
    }
}

/// The verdict: exactly one row for each operation in `expected` (a check
/// and the charge ids its answers named), and that row is the charge the
/// answers named.
pub(crate) fn one_row_per_key(
    rows: &[SmokeRow],
    expected: &[(Check, Vec<String>)],
) -> (bool, String) {
    let mut passed = true;
    let mut parts = Vec::new();
    for (check, seen) in expected {
        let ids: Vec<&str> = rows
            .iter()
            .filter(|r| r.check == check.name())
            .map(|r| r.id.as_str())
            .collect();
        let ok = ids.len() == 1 && seen.iter().all(|s| ids.contains(&s.as_str()));
        passed &= ok;
        let listed = if ids.is_empty() {
            "none".to_owned()
        } else {
            ids.join(", ")
        };
        let mut part = format!("{check}: {} row(s) ({listed})", ids.len());
        if !ok && ids.len() == 1 {
            part.push_str(&format!(", but the answers named {}", seen.join(", ")));
        }
        parts.push(part);
    }
    let mut detail = parts.join("; ");
    if rows.is_empty() {
        detail.push_str(
            "; no charges carry this run's id: is --database-url the database behind --base-url?",
        );
    }
    (passed, detail)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: &str, check: Check) -> SmokeRow {
        SmokeRow {
            id: id.into(),
            check: check.name().into(),
        }
    }

    #[test]
    fn exactly_one_row_that_the_answers_named() {
        let expected = vec![
            (Check::ConcurrentSameKey, vec!["ch_a".to_owned()]),
            (Check::SequentialReplay, vec!["ch_b".to_owned()]),
        ];
        let good = [
            row("ch_a", Check::ConcurrentSameKey),
            row("ch_b", Check::SequentialReplay),
            row("ch_c", Check::MissingKey),
        ];
        assert!(one_row_per_key(&good, &expected).0);

        let doubled = [
            row("ch_a", Check::ConcurrentSameKey),
            row("ch_x", Check::ConcurrentSameKey),
            row("ch_b", Check::SequentialReplay),
        ];
        let (ok, detail) = one_row_per_key(&doubled, &expected);
        assert!(!ok);
        assert!(
            detail.contains("concurrent_same_key: 2 row(s) (ch_a, ch_x)"),
            "{detail}"
        );

        let other = [
            row("ch_z", Check::ConcurrentSameKey),
            row("ch_b", Check::SequentialReplay),
        ];
        assert!(!one_row_per_key(&other, &expected).0);

        let (ok, detail) = one_row_per_key(&[], &expected);
        assert!(!ok);
        assert!(detail.contains("database behind"), "{detail}");
    }
}
