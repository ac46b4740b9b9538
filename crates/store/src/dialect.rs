//! What a backend's SQL differs in, so that [`crate::sql`] writes each
//! statement once: templates with `$1`, `$2`, ... (each once, in order) and
//! `{..}` pieces that [`render`] puts in the dialect's words.

use sqlx::Database;

use crate::rows::RECORD_COLUMNS;

/// A backend's SQL dialect and capabilities.
pub trait Dialect: Send + Sync + Sized + std::fmt::Debug + 'static {
    type Db: Database;
    /// How the backend returns a stored time: SQLite, integer Unix
    /// milliseconds; PostgreSQL and MySQL, a UTC timestamp.
    type Ts: crate::rows::Timestamp;

    /// The database's current time when the expression runs (not the
    /// transaction's or the statement's start), to the millisecond.
    const NOW: &'static str;
    /// `$N` milliseconds as something to add to or subtract from [`Self::NOW`].
    fn interval(param: &str) -> String;
    /// How long ago `column` was, in whole milliseconds.
    fn ms_since(column: &str) -> String;
    /// A condition as an integer column (1 or 0).
    fn flag(condition: &str) -> String {
        format!("({condition})")
    }
    /// `$N` Unix milliseconds as a stored time, for comparisons.
    fn at_ms(param: &str) -> String;
    /// The text value of key `$N` of a JSON `column` (NULL when absent).
    fn json_text(column: &str, key: &str) -> String;
    /// The parameter holding a charge's metadata (JSON text).
    fn json(param: &str) -> String {
        param.to_owned()
    }
    /// A `metadata` column read back as JSON text, named `metadata`.
    fn metadata(column: &str) -> String {
        format!("{column} AS metadata")
    }
    /// A `customer_id` column read back as text, named `customer_id`
    /// (MySQL stores it as bytes, so that it compares exactly).
    fn customer_id(column: &str) -> String {
        column.to_owned()
    }

    /// Starts a transaction that will write.
    const BEGIN_WRITE: &'static str = "BEGIN";
    /// Appended to a `SELECT` that picks rows to change, so that a second
    /// job passes over rows the first has locked instead of queueing.
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
    /// Appended to a `SELECT` that reads a row the transaction will write,
    /// so that no other writer changes it in between.
    const FOR_UPDATE: &'static str = " FOR UPDATE";
    /// `INSERT .. ON CONFLICT DO NOTHING` and `.. RETURNING`. Without them
    /// (MySQL) a claim is a plain insert whose duplicate-key error means
    /// "someone has this key", and a write's times are read back after it.
    const RETURNING: bool = true;
    /// Writable CTEs: a claim and a finish are one statement each.
    const ONE_STATEMENT: bool = false;
    /// One writer at a time (SQLite): writes go through one connection.
    const SINGLE_WRITER: bool = false;
    /// A batch delete is `DELETE .. LIMIT` (MySQL allows no `LIMIT`
    /// subquery on the table being deleted from).
    const DELETE_LIMIT: bool = false;

    /// This backend's migrations (`migrations/<backend>`).
    const MIGRATOR: &'static sqlx::migrate::Migrator;

    /// Rows a write changed (or, on MySQL, matched).
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// The `n`th parameter: `$n` (sqlx's SQLite driver binds `$n` by
    /// number too); MySQL binds `?` by position.
    fn placeholder(n: usize) -> String {
        format!("${n}")
    }
}

/// A statement template in the dialect's words:
/// - `$N` or `{p}`: the next parameter (`$N` checked: they come in order);
/// - `{now}`: the database's clock; `{ms}`: the next parameter, as an
///   interval of milliseconds; `{at_ms}`: the next parameter, Unix
///   milliseconds, as a stored time; `{json}`: the next parameter, as JSON;
///   `{json_text col}`: the text at the next parameter's key of JSON `col`;
/// - `{record}`: a record's columns and what the clock says of it
///   (`lease_live`, `expired`, `age_ms`, `ttl_left_ms`);
/// - `{new_record}`, `{charge}`, `{refund}`: the nine values of a new
///   record, the twelve of a new charge and the eleven of a new refund, in the
///   order the store binds them;
/// - `{returning cols}`, `{skip_locked}`, `{for_update}`, `{metadata col}`,
///   `{customer_id col}`: where the backend has them;
/// - `{ignore_duplicate cols}`: an insert whose key `cols` exists already
///   changes nothing (`ON CONFLICT .. DO NOTHING`, MySQL's no-op update).
pub(crate) fn render<D: Dialect>(template: &str) -> String {
    let mut out = String::with_capacity(template.len() * 2);
    expand::<D>(template, &mut out, &mut 1);
    out
}

fn expand<D: Dialect>(template: &str, out: &mut String, next: &mut usize) {
    fn param<D: Dialect>(next: &mut usize) -> String {
        *next += 1;
        D::placeholder(*next - 1)
    }
    let mut rest = template;
    while let Some(at) = rest.find(['{', '$']) {
        out.push_str(&rest[..at]);
        let (token, after) = if let Some(numbered) = rest[at..].strip_prefix('$') {
            let digits = numbered
                .find(|c: char| !c.is_ascii_digit())
                .unwrap_or(numbered.len());
            let expected = next.to_string();
            assert_eq!(
                numbered[..digits],
                expected,
                "parameters out of order in {template}"
            );
            ("p", &numbered[digits..])
        } else {
            let end = at + rest[at..].find('}').expect("a `{` piece is closed");
            (&rest[at + 1..end], &rest[end + 1..])
        };
        rest = after;
        match token.split_once(' ').unwrap_or((token, "")) {
            ("now", _) => out.push_str(D::NOW),
            ("p", _) => out.push_str(&param::<D>(next)),
            ("ms", _) => out.push_str(&D::interval(&param::<D>(next))),
            ("at_ms", _) => out.push_str(&D::at_ms(&param::<D>(next))),
            ("json_text", column) => out.push_str(&D::json_text(column, &param::<D>(next))),
            ("json", _) => out.push_str(&D::json(&param::<D>(next))),
            ("returning", columns) if D::RETURNING => {
                out.push_str(" RETURNING ");
                out.push_str(columns);
            }
            ("returning", _) => {}
            // A row whose key exists already is left as it is.
            ("ignore_duplicate", columns) if D::RETURNING => {
                out.push_str(&format!(" ON CONFLICT ({columns}) DO NOTHING"));
            }
            ("ignore_duplicate", columns) => {
                let first = columns.split(',').next().unwrap_or(columns).trim();
                out.push_str(&format!(" ON DUPLICATE KEY UPDATE {first} = {first}"));
            }
            ("skip_locked", _) => out.push_str(D::SKIP_LOCKED),
            ("for_update", _) => out.push_str(D::FOR_UPDATE),
            ("metadata", column) => out.push_str(&D::metadata(column)),
            ("customer_id", column) => out.push_str(&D::customer_id(column)),
            ("record", _) => out.push_str(&format!(
                "{}, {} AS lease_live, {} AS expired, {} AS age_ms, -({}) AS ttl_left_ms",
                render::<D>(RECORD_COLUMNS),
                D::flag(&format!(
                    "locked_until IS NOT NULL AND locked_until > {}",
                    D::NOW
                )),
                D::flag(&format!("expires_at <= {}", D::NOW)),
                D::ms_since("created_at"),
                D::ms_since("expires_at"),
            )),
            ("new_record", _) => expand::<D>(
                "{p}, {p}, {p}, {p}, 'in_progress', {p}, {now} + {ms}, {p}, {p}, {now}, {now} + {ms}",
                out,
                next,
            ),
            ("charge", _) => expand::<D>(
                "{p}, {p}, {p}, {p}, {p}, {p}, {json}, {p}, {p}, {p}, {p}, {p}, {p}",
                out,
                next,
            ),
            ("capture", _) => expand::<D>(
                "{p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}, {p}",
                out,
                next,
            ),
            ("refund", _) => expand::<D>(
                "{p}, {p}, {p}, {p}, {p}, {p}, {json}, {p}, {p}, {p}, {p}",
                out,
                next,
            ),
            _ => panic!("unknown piece {{{token}}} in {template}"),
        }
    }
    out.push_str(rest);
}

#[cfg(test)]
mod tests {
    use super::render;
    use crate::{MySql, Postgres};

    #[test]
    fn numbers_become_positions() {
        assert_eq!(
            render::<MySql>("a = $1 AND b IN ($2, {p}) LIMIT $4"),
            "a = ? AND b IN (?, ?) LIMIT ?"
        );
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn refuses_reordered_parameters() {
        render::<Postgres>("a = $2 AND b = $1");
    }
}
