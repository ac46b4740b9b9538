//! The lane: pooled connections kept between PostgreSQL's one-statement
//! claims and finishes, so that each goes back without sqlx's ping.
//!
//! sqlx pings every connection as it goes back to its pool (a round trip
//! to the database, on a task of its own), and nothing turns that off. A
//! new charge is two statements, so it paid two extra round trips: 9% of
//! the API's CPU in issue 31's profile, and the wake-ups around them.
//!
//! A connection taken from the lane is an ordinary [`PoolConnection`]: it
//! counts against the pool's size the whole time. After a statement that
//! completed, it is kept here (no ping) for the next claim or finish; after
//! an error, or when the caller's future is dropped mid-statement, it goes
//! back to the pool, which pings it and drops it if it is broken, as
//! before. So the lane never hands out a connection the pool would not.
//!
//! What it may not do is hoard. A claim or finish waiting for the pool
//! takes a connection kept meanwhile at once (no connection sits here while
//! one of them waits). It keeps at most half of the pool, so the
//! other half always flows through the pool to every other statement and
//! transaction in arrival order; a connection kept longer than [`KEEP_FOR`]
//! goes back to the pool (a task sweeps every [`KEEP_FOR`]), so when the
//! charges stop, the pool has all its connections again within 2 x
//! [`KEEP_FOR`]; one older than [`RENEW_AFTER`] goes back too, so the
//! pool's own lifetime and idle checks still see every connection.

use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use sqlx::pool::PoolConnection;
use sqlx::{Database, Pool};

/// How long a connection may wait in the lane for the next statement.
pub(crate) const KEEP_FOR: Duration = Duration::from_millis(100);

/// How long a connection may go from lane to lane before it goes back to
/// the pool once.
const RENEW_AFTER: Duration = Duration::from_secs(60);

/// A kept connection: since when it is kept, and since when it left the pool.
struct Kept<DB: Database> {
    conn: PoolConnection<DB>,
    idle_since: Instant,
    taken_at: Instant,
}

pub(crate) struct Lane<DB: Database> {
    pool: Pool<DB>,
    kept: Mutex<Vec<Kept<DB>>>,
    most: usize,
    /// Told each time a connection is kept: a claim or finish waiting for
    /// the pool takes it instead, so no connection sits in the lane while
    /// one of them waits.
    kept_one: tokio::sync::Notify,
}

impl<DB: Database> std::fmt::Debug for Lane<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lane")
            .field("kept", &self.lock().len())
            .field("most", &self.most)
            .finish()
    }
}

impl<DB: Database> Lane<DB> {
    /// A lane over `pool` of `max_connections`; `None` when the pool is too
    /// small to lend half of itself (one connection), or there is no
    /// runtime to sweep it.
    pub(crate) fn over(pool: &Pool<DB>, max_connections: u32) -> Option<Arc<Self>> {
        let most = usize::try_from(max_connections / 2).ok()?;
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        if most == 0 {
            return None;
        }
        let lane = Arc::new(Self {
            pool: pool.clone(),
            kept: Mutex::new(Vec::with_capacity(most)),
            most,
            kept_one: tokio::sync::Notify::new(),
        });
        runtime.spawn(sweep(Arc::downgrade(&lane)));
        Some(lane)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Kept<DB>>> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The connection kept last, else one from the pool; with when it left
    /// the pool, for [`Lane::keep`].
    ///
    /// While it waits for the pool, a connection kept meanwhile is taken
    /// instead (a notification, then the lane again): a claim waiting in
    /// the pool's queue while a finished one's connection sat in the lane
    /// made new charges' p99 three times longer at 32 connections.
    pub(crate) async fn acquire(&self) -> Result<(PoolConnection<DB>, Instant), sqlx::Error> {
        loop {
            if let Some(kept) = self.lock().pop() {
                return Ok((kept.conn, kept.taken_at));
            }
            let kept_one = self.kept_one.notified();
            tokio::pin!(kept_one);
            // Listening before looking again: a connection kept between
            // the look above and here is seen one way or the other.
            kept_one.as_mut().enable();
            if let Some(kept) = self.lock().pop() {
                return Ok((kept.conn, kept.taken_at));
            }
            tokio::select! {
                biased;
                () = &mut kept_one => {}
                conn = self.pool.acquire() => return Ok((conn?, Instant::now())),
            }
        }
    }

    /// Keeps `conn`, lent at `taken_at`, after a statement that completed;
    /// gives it back to the pool instead when the lane is full or the
    /// connection is due back. A connection not kept (an error, a future
    /// dropped mid-statement) is dropped: the pool pings it as it returns.
    pub(crate) fn keep(&self, conn: PoolConnection<DB>, taken_at: Instant) {
        let now = Instant::now();
        if now.duration_since(taken_at) < RENEW_AFTER {
            let mut kept = self.lock();
            if kept.len() < self.most {
                kept.push(Kept {
                    conn,
                    idle_since: now,
                    taken_at,
                });
                drop(kept);
                self.kept_one.notify_one();
                return;
            }
        }
        drop(conn);
    }

    /// Gives the pool back every connection kept for [`KEEP_FOR`] or more.
    fn sweep(&self) {
        let due: Vec<Kept<DB>> = {
            let mut kept = self.lock();
            let (due, fresh) = std::mem::take(&mut *kept)
                .into_iter()
                .partition(|k| k.idle_since.elapsed() >= KEEP_FOR);
            *kept = fresh;
            due
        };
        // Dropped outside the lock: each goes back through the pool's ping.
        drop(due);
    }

    /// How many connections it keeps now.
    pub(crate) fn kept(&self) -> usize {
        self.lock().len()
    }
}

async fn sweep<DB: Database>(lane: Weak<Lane<DB>>) {
    loop {
        tokio::time::sleep(KEEP_FOR).await;
        match lane.upgrade() {
            Some(lane) => lane.sweep(),
            None => return,
        }
    }
}
