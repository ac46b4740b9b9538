//! What a backend's SQL differs in, so that [`crate::sql`] writes each
//! statement once.
//!
//! Statements are written with `$1`, `$2`, ... in ascending order, each
//! once; SQLite and PostgreSQL take them as they are (sqlx's SQLite driver
//! binds `$N` by number), MySQL gets `?` ([`Dialect::finish_sql`]).

use sqlx::Database;

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
    /// The parameter holding a charge's metadata (JSON text).
    fn json(param: &str) -> String {
        param.to_owned()
    }
    /// The `metadata` column read back as JSON text.
    const METADATA: &'static str = "metadata";

    /// Starts a transaction that will write.
    const BEGIN_WRITE: &'static str = "BEGIN";
    /// Appended to a `SELECT` that picks rows to change, so that a second
    /// job passes over rows the first has locked instead of queueing.
    const SKIP_LOCKED: &'static str = " FOR UPDATE SKIP LOCKED";
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
    fn migrator() -> &'static sqlx::migrate::Migrator;

    /// Rows a write changed (or, on MySQL, matched).
    fn rows_affected(done: &<Self::Db as Database>::QueryResult) -> u64;

    /// The statement as this backend takes its placeholders.
    fn finish_sql(sql: String) -> String {
        sql
    }
}

/// `$1`, `$2`, ... as `?`, checking that each appears once and in order
/// (a `?` is bound by position).
pub(crate) fn question_marks(sql: &str) -> String {
    let mut out = String::with_capacity(sql.len());
    let mut next = 1;
    let mut rest = sql;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len() - at - 1);
        let number: usize = rest[at + 1..at + 1 + digits]
            .parse()
            .expect("a statement's `$` is followed by its parameter's number");
        assert_eq!(number, next, "parameters out of order in {sql}");
        next += 1;
        out.push('?');
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::question_marks;

    #[test]
    fn numbers_become_positions() {
        assert_eq!(
            question_marks("a = $1 AND b IN ($2, $3) LIMIT $4"),
            "a = ? AND b IN (?, ?) LIMIT ?"
        );
    }

    #[test]
    #[should_panic(expected = "out of order")]
    fn refuses_reordered_parameters() {
        question_marks("a = $2 AND b = $1");
    }
}
