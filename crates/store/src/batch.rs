//! Group commit for a database with one writer (SQLite): the claims and
//! finishes waiting for the writer run in one transaction and are made
//! durable by one commit (one fsync), instead of one each.
//!
//! - Every caller is answered only after its batch committed: a claim is on
//!   disk before its provider call, as without batching.
//! - Each caller's work runs inside its own savepoint. Work that fails is
//!   rolled back to its savepoint alone, and its neighbours commit: one bad
//!   row never fails a batch. Savepoints are named per caller and never
//!   released (the commit releases them all): one statement per caller,
//!   where `RELEASE` would be a second round trip to SQLite's worker.
//! - A batch that cannot commit (or whose transaction broke under it) fails
//!   every caller in it with an error the client retries (503): nobody is
//!   told their write stands unless the commit that carries it succeeded.
//!   Work not yet run when a batch broke waits for the next one.
//! - A batch is what queued while the writer was busy, up to a bound: under
//!   no load every batch is one caller, with only a channel hop added.
//! - What callers defer to the batch ([`BeforeCommit`]: the events of their
//!   changes) is written once, in one statement, after the last caller and
//!   before the commit, in the same transaction: it commits with them, or
//!   fails the batch.
//!
//! The batch runs on the store's writer pool (one connection), so the other
//! writes (a takeover, the reaper's, the pruner's) queue with the batches
//! in the order the pool hands the connection out.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use sqlx::{AssertSqlSafe, Connection, Database, Executor, Pool};
use tokio::sync::{mpsc, oneshot};

use crate::Error;

/// `payments_sqlite_write_batch_size`: how many claims and finishes each
/// committed SQLite transaction carried.
pub const WRITE_BATCH_SIZE: &str = "payments_sqlite_write_batch_size";

/// The buckets of [`WRITE_BATCH_SIZE`].
pub const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];

/// Callers that may wait for the writer before `send` waits for room.
const QUEUE: usize = 4096;

pub(crate) type BoxFut<'c, T> = Pin<Box<dyn Future<Output = T> + Send + 'c>>;
type Conn<DB> = <DB as Database>::Connection;

/// Why a batch failed, shared by every caller in it.
type Failure = Arc<str>;

/// What a caller's work did: whether it stands (its savepoint is
/// released) and how its caller is answered once the batch's fate is known.
struct Ran {
    stands: bool,
    answer: Box<dyn FnOnce(Option<Failure>) + Send>,
}

/// One caller's work, waiting for the writer.
trait Pending<DB: Database>: Send {
    fn run<'c>(self: Box<Self>, conn: &'c mut Conn<DB>) -> BoxFut<'c, Ran>;
    /// Answers the caller without running its work: no batch could start.
    fn refuse(self: Box<Self>, why: Failure);
}

struct Work<F, T> {
    work: F,
    reply: oneshot::Sender<Result<T, Error>>,
}

impl<DB, F, T> Pending<DB> for Work<F, T>
where
    DB: Database,
    T: Send + 'static,
    F: for<'c> FnOnce(&'c mut Conn<DB>) -> BoxFut<'c, Result<T, Error>> + Send + 'static,
{
    fn run<'c>(self: Box<Self>, conn: &'c mut Conn<DB>) -> BoxFut<'c, Ran> {
        let Work { work, reply } = *self;
        Box::pin(async move {
            let result = work(conn).await;
            let stands = result.is_ok();
            let answer = Box::new(move |failure: Option<Failure>| {
                let result = match (failure, result) {
                    (Some(why), Ok(_)) => Err(not_committed(&why)),
                    (_, result) => result,
                };
                // The caller may have gone (its client hung up): its work
                // stands or not all the same, as it would unbatched.
                let _ = reply.send(result);
            });
            Ran { stands, answer }
        })
    }

    fn refuse(self: Box<Self>, why: Failure) {
        let _ = self.reply.send(Err(not_committed(&why)));
    }
}

/// The error a caller whose batch did not commit gets: the connection's
/// kind, so it is answered 503 and retried with the same key.
fn not_committed(why: &str) -> Error {
    let why = format!("the write batch was not committed: {why}");
    Error::Sql(sqlx::Error::Io(std::io::Error::other(why)))
}

/// What a batch writes for its callers after they ran and before it
/// commits: what they deferred to it, in one statement instead of one each
/// (every statement is a round trip to SQLite's worker thread).
pub(crate) trait BeforeCommit<DB: Database>: Send + Sync + 'static {
    /// A batch starts: what a batch that did not commit deferred is dropped.
    fn begin(&self);
    /// Writes what the batch's callers deferred, in its transaction.
    fn run<'c>(&'c self, conn: &'c mut Conn<DB>) -> BoxFut<'c, Result<(), Error>>;
}

/// The queue in front of the writer, and the task that drains it.
pub(crate) struct Batcher<DB: Database> {
    queue: mpsc::Sender<Box<dyn Pending<DB>>>,
    committed: Arc<Committed>,
}

impl<DB: Database> Clone for Batcher<DB> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
            committed: self.committed.clone(),
        }
    }
}

/// What the batches committed so far: transactions, and the claims and
/// finishes they carried.
#[derive(Debug, Default)]
struct Committed {
    batches: AtomicU64,
    writes: AtomicU64,
}

impl<DB: Database> std::fmt::Debug for Batcher<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher").finish_non_exhaustive()
    }
}

impl<DB: Database> Batcher<DB> {
    /// Starts the task that runs batches of at most `most` callers on
    /// `writer`, each opened by `begin`. It ends when the last store
    /// holding this batcher is dropped.
    pub(crate) fn start(
        writer: Pool<DB>,
        begin: &'static str,
        most: usize,
        before_commit: Arc<dyn BeforeCommit<DB>>,
    ) -> Self
    where
        for<'c> &'c mut Conn<DB>: Executor<'c, Database = DB>,
    {
        let (queue, waiting) = mpsc::channel(QUEUE);
        let committed = Arc::new(Committed::default());
        let batches = Batches {
            begin,
            most: most.max(1),
            before_commit,
        };
        tokio::spawn(serve(writer, batches, waiting, committed.clone()));
        Self { queue, committed }
    }

    /// Batches committed so far, and the claims and finishes they carried.
    pub(crate) fn committed(&self) -> (u64, u64) {
        let c = &self.committed;
        (
            c.batches.load(Ordering::Relaxed),
            c.writes.load(Ordering::Relaxed),
        )
    }

    /// Runs `work` in the next batch, and answers once that batch committed.
    pub(crate) async fn run<T, F>(&self, work: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: for<'c> FnOnce(&'c mut Conn<DB>) -> BoxFut<'c, Result<T, Error>> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let gone = || Error::Sql(sqlx::Error::WorkerCrashed);
        let work: Box<dyn Pending<DB>> = Box::new(Work { work, reply });
        self.queue.send(work).await.map_err(|_| gone())?;
        answer.await.map_err(|_| gone())?
    }
}

/// How every batch is run: opened by `begin`, at most `most` callers, and
/// `before_commit` after them.
struct Batches<DB: Database> {
    begin: &'static str,
    most: usize,
    before_commit: Arc<dyn BeforeCommit<DB>>,
}

/// The writer's loop: takes what waits, runs it as one batch, repeats.
async fn serve<DB>(
    writer: Pool<DB>,
    batches: Batches<DB>,
    mut queue: mpsc::Receiver<Box<dyn Pending<DB>>>,
    committed: Arc<Committed>,
) where
    DB: Database,
    for<'c> &'c mut Conn<DB>: Executor<'c, Database = DB>,
{
    let mut waiting: VecDeque<Box<dyn Pending<DB>>> = VecDeque::new();
    loop {
        if waiting.is_empty() {
            let Some(first) = queue.recv().await else {
                return;
            };
            waiting.push_back(first);
        }
        let conn = writer.acquire().await;
        // Whoever queued while the writer was busy joins this batch.
        while waiting.len() < batches.most {
            match queue.try_recv() {
                Ok(work) => waiting.push_back(work),
                Err(_) => break,
            }
        }
        match conn {
            Ok(mut conn) => {
                if let Some(writes) = batch(&mut *conn, &batches, &mut waiting).await {
                    committed.batches.fetch_add(1, Ordering::Relaxed);
                    committed.writes.fetch_add(writes, Ordering::Relaxed);
                }
            }
            Err(e) => refuse(&mut waiting, &e),
        }
    }
}

fn refuse<DB: Database>(waiting: &mut VecDeque<Box<dyn Pending<DB>>>, why: &sqlx::Error) {
    let why: Failure = why.to_string().into();
    for work in waiting.drain(..) {
        work.refuse(why.clone());
    }
}

/// One transaction: up to `most` of `waiting`, each in its savepoint. How
/// many it carried, when it committed.
async fn batch<DB>(
    conn: &mut Conn<DB>,
    batches: &Batches<DB>,
    waiting: &mut VecDeque<Box<dyn Pending<DB>>>,
) -> Option<u64>
where
    DB: Database,
    for<'c> &'c mut Conn<DB>: Executor<'c, Database = DB>,
{
    let most = batches.most;
    batches.before_commit.begin();
    let mut tx = match conn.begin_with(AssertSqlSafe(batches.begin)).await {
        Ok(tx) => tx,
        Err(e) => {
            refuse(waiting, &e);
            return None;
        }
    };
    let mut ran = Vec::with_capacity(waiting.len().min(most));
    let mut broken = None;
    while ran.len() < most {
        let Some(work) = waiting.pop_front() else {
            break;
        };
        let savepoint = format!("write_{}", ran.len());
        let set = format!("SAVEPOINT {savepoint}");
        if let Err(e) = sqlx::raw_sql(AssertSqlSafe(set)).execute(&mut *tx).await {
            waiting.push_front(work);
            broken = Some(e);
            break;
        }
        let done = work.run(&mut tx).await;
        let stands = done.stands;
        ran.push(done.answer);
        if stands {
            continue;
        }
        let undo = format!("ROLLBACK TO {savepoint}");
        // A savepoint that cannot be rolled back to means the transaction
        // itself failed (SQLite rolls it back on a full disk or an I/O error).
        if let Err(e) = sqlx::raw_sql(AssertSqlSafe(undo)).execute(&mut *tx).await {
            broken = Some(e);
            break;
        }
    }
    metrics::histogram!(WRITE_BATCH_SIZE).record(ran.len() as f64);
    if broken.is_none()
        && let Err(e) = batches.before_commit.run(&mut tx).await
    {
        broken = Some(match e {
            Error::Sql(e) => e,
            other => sqlx::Error::Protocol(format!("{other:?}")),
        });
    }
    let failure: Option<Failure> = match broken {
        Some(e) => {
            let _ = tx.rollback().await;
            Some(e.to_string().into())
        }
        None => tx.commit().await.err().map(|e| e.to_string().into()),
    };
    if let Some(why) = &failure {
        tracing::warn!(callers = ran.len(), %why, "a write batch was not committed");
    }
    let carried = (failure.is_none()).then_some(ran.len() as u64);
    for answer in ran {
        answer(failure.clone());
    }
    carried
}
