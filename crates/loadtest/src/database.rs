//! The charges a smoke or load run left in the server's database, found by
//! a tag its requests carried in `metadata` (e.g. `smoke_run = smoke-<uuid>`).
//!
//! `metadata` is TEXT on SQLite and MySQL but JSONB on PostgreSQL, so every
//! dialect casts it to text before `LIKE`; each match is then confirmed by
//! parsing the JSON, so the `LIKE` is only a filter. The scan has no index:
//! fine for staging and load-test tables, not for production.

use std::collections::BTreeMap;
use std::str::FromStr;

use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, MySqlConnection, PgConnection, SqliteConnection};

/// The `charges` rows whose metadata, cast to text, is `LIKE` the bound
/// pattern: SQLite's statement, then PostgreSQL's and MySQL's.
const SQLITE_TAGGED: &str = "SELECT id, status, CAST(metadata AS TEXT) FROM charges \
                             WHERE CAST(metadata AS TEXT) LIKE ?";
const POSTGRES_TAGGED: &str = "SELECT id, status, CAST(metadata AS TEXT) FROM charges \
                               WHERE CAST(metadata AS TEXT) LIKE $1";
const MYSQL_TAGGED: &str = "SELECT id, status, CAST(metadata AS CHAR) FROM charges \
                            WHERE CAST(metadata AS CHAR) LIKE ?";

/// One connection (no pool needed), used only for SELECTs.
#[derive(Debug)]
pub(crate) enum Database {
    Sqlite(SqliteConnection),
    Postgres(PgConnection),
    MySql(MySqlConnection),
}

/// Why the database could not be opened.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenError {
    #[error("unsupported database URL scheme {0:?}: use sqlite:, postgres:// or mysql://")]
    Unsupported(String),
    #[error(transparent)]
    Sqlx(#[from] sqlx::Error),
}

/// A `charges` row carrying the tag.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct TaggedRow {
    pub id: String,
    pub status: String,
    pub metadata: BTreeMap<String, serde_json::Value>,
}

impl Database {
    /// Opens `url` by its scheme: `sqlite:`, `postgres://` / `postgresql://`,
    /// `mysql://` / `mariadb://`.
    pub(crate) async fn connect(url: &str) -> Result<Self, OpenError> {
        let scheme = url.split(':').next().unwrap_or_default();
        Ok(match scheme {
            "sqlite" => {
                // Never create a file: a typo should fail, not find no rows.
                let options = SqliteConnectOptions::from_str(url)?.create_if_missing(false);
                Self::Sqlite(options.connect().await?)
            }
            "postgres" | "postgresql" => Self::Postgres(PgConnection::connect(url).await?),
            "mysql" | "mariadb" => Self::MySql(MySqlConnection::connect(url).await?),
            _ => return Err(OpenError::Unsupported(scheme.to_owned())),
        })
    }

    /// The rows whose `metadata[tag]` is `value`.
    pub(crate) async fn tagged(
        &mut self,
        tag: &str,
        value: &str,
    ) -> Result<Vec<TaggedRow>, sqlx::Error> {
        let pattern = format!("%{value}%");
        let rows = match self {
            Self::Sqlite(conn) => select(conn, SQLITE_TAGGED, pattern).await?,
            Self::Postgres(conn) => select(conn, POSTGRES_TAGGED, pattern).await?,
            Self::MySql(conn) => select(conn, MYSQL_TAGGED, pattern).await?,
        };
        Ok(keep_tagged(rows, tag, value))
    }
}

/// `(id, status, metadata as text)`.
type Row = (String, String, String);

/// Runs one dialect's `sql` with `pattern` bound to its placeholder.
async fn select<'c, DB>(
    conn: impl sqlx::Executor<'c, Database = DB>,
    sql: &'static str,
    pattern: String,
) -> Result<Vec<Row>, sqlx::Error>
where
    DB: sqlx::Database,
    for<'q> String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    for<'r> Row: sqlx::FromRow<'r, DB::Row>,
    DB::Arguments: sqlx::IntoArguments<DB>,
{
    sqlx::query_as(sql).bind(pattern).fetch_all(conn).await
}

/// Keeps the rows whose parsed metadata really has `tag` = `value`.
fn keep_tagged(rows: Vec<Row>, tag: &str, value: &str) -> Vec<TaggedRow> {
    rows.into_iter()
        .filter_map(|(id, status, metadata)| {
            let metadata: BTreeMap<String, serde_json::Value> =
                serde_json::from_str(&metadata).ok()?;
            (metadata.get(tag)?.as_str()? == value).then_some(TaggedRow {
                id,
                status,
                metadata,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_rows_really_tagged_are_kept() {
        let row =
            |id: &str, metadata: &str| (id.to_owned(), "succeeded".to_owned(), metadata.to_owned());
        let rows = vec![
            row("ch_1", r#"{"run":"r-1","op":"a"}"#),
            row("ch_2", r#"{"run": "r-1"}"#),
            row("ch_3", r#"{"note":"r-1"}"#),
            row("ch_4", r#"{"run":"r-12"}"#),
            row("ch_5", "not json"),
        ];
        let kept: Vec<String> = keep_tagged(rows, "run", "r-1")
            .into_iter()
            .map(|r| r.id)
            .collect();
        assert_eq!(kept, ["ch_1", "ch_2"]);
    }
}
