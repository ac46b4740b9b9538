//! The `one_row_per_key` check's view of the database behind the server: the
//! `charges` rows whose metadata carries this run's id.
//!
//! The rows are found by [`crate::database`].

use super::SmokeError;
use super::report::Check;
use crate::database::{Database, OpenError};

/// A `charges` row made by this run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SmokeRow {
    pub id: String,
    /// The check that made it (`metadata.smoke_check`).
    pub check: String,
}

/// Opens the database behind the server.
pub(crate) async fn connect(url: &str) -> Result<Database, SmokeError> {
    Database::connect(url).await.map_err(|e| match e {
        OpenError::Unsupported(scheme) => SmokeError::UnsupportedDatabase(scheme),
        OpenError::Sqlx(e) => SmokeError::Database(e),
    })
}

/// The rows whose `metadata.smoke_run` is `run_id`, with their check.
pub(crate) async fn rows_of_run(
    db: &mut Database,
    run_id: &str,
) -> Result<Vec<SmokeRow>, sqlx::Error> {
    Ok(db
        .tagged("smoke_run", run_id)
        .await?
        .into_iter()
        .filter_map(|row| {
            let check = row.metadata.get("smoke_check")?.as_str()?.to_owned();
            Some(SmokeRow { id: row.id, check })
        })
        .collect())
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
