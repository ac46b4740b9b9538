//! The charges this run left in the server's database: the `charges` rows
//! whose `metadata.load_run` is the run's id, by status.
//!
//! The rows are found by [`crate::database`].

use std::collections::{BTreeMap, BTreeSet};

use super::LoadError;
use crate::database::{Database, OpenError, TaggedRow};

/// This run's rows.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RunRows {
    /// Ids of the `succeeded` rows.
    pub succeeded: BTreeSet<String>,
    /// How many rows are in each other status (`pending`, `failed`, `unknown`).
    pub other: BTreeMap<String, u64>,
}

/// Opens the database behind the server.
pub(crate) async fn connect(url: &str) -> Result<Database, LoadError> {
    Database::connect(url).await.map_err(|e| match e {
        OpenError::Unsupported(scheme) => LoadError::UnsupportedDatabase(scheme),
        OpenError::Sqlx(e) => LoadError::Database(e.to_string()),
    })
}

/// The rows whose `metadata.load_run` is `run_id`, by status.
pub(crate) async fn rows_of_run(db: &mut Database, run_id: &str) -> Result<RunRows, sqlx::Error> {
    Ok(by_status(db.tagged("load_run", run_id).await?))
}

fn by_status(rows: Vec<TaggedRow>) -> RunRows {
    let mut result = RunRows::default();
    for row in rows {
        if row.status == "succeeded" {
            result.succeeded.insert(row.id);
        } else {
            *result.other.entry(row.status).or_default() += 1;
        }
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_split_by_status() {
        let row = |id: &str, status: &str| TaggedRow {
            id: id.to_owned(),
            status: status.to_owned(),
            metadata: BTreeMap::new(),
        };
        let counted = by_status(vec![
            row("ch_1", "succeeded"),
            row("ch_2", "succeeded"),
            row("ch_3", "pending"),
        ]);
        assert_eq!(
            counted.succeeded,
            BTreeSet::from(["ch_1".to_owned(), "ch_2".to_owned()])
        );
        assert_eq!(counted.other, BTreeMap::from([("pending".to_owned(), 1)]));
    }
}
