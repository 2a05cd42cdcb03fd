//! Batching across requests: concurrent requests on one HTTP worker that
//! need the same statement share one statement, hence one round trip and
//! one commit.
//!
//! A batch holds the items of one merchant: on a database distributed by
//! merchant its statement then runs on one shard, and the merchant is one
//! parameter the statement's plan can use. Items of other merchants wait for
//! the next batch, in their order.
//!
//! No timer: a request that finds a free slot (fewer than `max_in_flight`
//! batches running) starts a batch at once, so a request alone goes alone,
//! as fast as without batching. Requests that arrive while all slots are
//! busy queue, and the next batch takes whatever queued (at most `max_rows`)
//! the moment a slot frees. So batches grow with load and only with load.
//!
//! Each batch runs in a task of its own: a request that is cancelled (its
//! client hung up) cannot cancel the statement of the others.
//!
//! A request's wait in the queue counts against its bound
//! (`Database::request_bound`): a batch gets a connection and runs within
//! what is left to its oldest request. Without that, requests queued behind
//! a batch stalled by an unanswering database waited for its deadline and
//! then for their own, on another stalled connection: 503 after two
//! statement deadlines instead of within one.
//!
//! Errors keep each request's answer what it would have been alone:
//! - an error of the database itself (unreachable, out of time, a lost
//!   connection) would have met each of them: each gets it, shared
//!   (`DbError::Batch`), and each decides for itself what it means (an
//!   ambiguous commit is undone per request, see `service::lifecycle`);
//! - any other error (a constraint one row broke) is retried row by row, so
//!   it fails only the request it belongs to.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::{Conn, Database, DbError};
use crate::domain::MerchantId;

/// How many batches of one statement may run at once on `db`'s pool: one
/// per 8 connections, at least one. The default pool of an HTTP worker (16
/// connections for 2 workers) runs one at a time: while it runs, the next
/// gathers. Fewer, larger batches pay PostgreSQL's per-statement costs
/// (planning, preparing the table's checks, a commit) fewer times and keep
/// fewer backends competing for the database's cores: one slot instead of
/// two made new charges at 32 clients 3,824/s instead of 3,186/s, p99 16 ms
/// instead of 18 (BENCHMARKS.md, "Batching across requests, without a
/// timer"). The other connections stay free for the other statements of a
/// request.
pub fn slots(db: &Database) -> usize {
    (db.pool().status().max_size / 8).max(1)
}

/// One statement for many rows.
#[async_trait]
pub trait BatchStatement: Send + Sync + 'static {
    type Item: Send + Sync + 'static;
    type Output: Send + 'static;

    /// For metrics and logs: which statement.
    fn name(&self) -> &'static str;

    /// The merchant `item` belongs to: a batch holds one merchant's items.
    fn merchant(&self, item: &Self::Item) -> MerchantId;

    /// Runs the statement for `items` in one transaction; an output per item,
    /// in order.
    async fn run(&self, conn: &Conn, items: &[Self::Item]) -> Result<Vec<Self::Output>, DbError>;
}

/// Queues the items of one statement and runs them in batches. Cheap to
/// clone; clones share the queue.
pub struct Batcher<S: BatchStatement> {
    shared: Arc<Shared<S>>,
}

impl<S: BatchStatement> Clone for Batcher<S> {
    fn clone(&self) -> Self {
        Self {
            shared: self.shared.clone(),
        }
    }
}

struct Shared<S: BatchStatement> {
    db: Database,
    statement: S,
    max_rows: usize,
    max_in_flight: usize,
    state: Mutex<State<S>>,
}

struct State<S: BatchStatement> {
    queue: VecDeque<Waiting<S>>,
    in_flight: usize,
}

struct Waiting<S: BatchStatement> {
    item: S::Item,
    reply: oneshot::Sender<Result<S::Output, DbError>>,
    /// When its request's bound runs out.
    deadline: Instant,
}

impl<S: BatchStatement> Batcher<S> {
    /// Batches of at most `database.batch_rows` rows (1: no batching) on
    /// connections of `db`, at most `slots(db)` at a time.
    pub fn new(db: Database, statement: S) -> Self {
        let max_rows = db.batch_rows();
        let max_in_flight = slots(&db);
        Self::with_limits(db, statement, max_rows, max_in_flight)
    }

    /// Batches of at most `max_rows`, at most `max_in_flight` at a time.
    pub fn with_limits(db: Database, statement: S, max_rows: usize, max_in_flight: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                db,
                statement,
                max_rows: max_rows.max(1),
                max_in_flight: max_in_flight.max(1),
                state: Mutex::new(State {
                    queue: VecDeque::new(),
                    in_flight: 0,
                }),
            }),
        }
    }

    /// The pool the batches run on.
    pub fn database(&self) -> &Database {
        &self.shared.db
    }

    /// Runs the statement for `item`, in a batch with whatever else is
    /// waiting.
    pub async fn run(&self, item: S::Item) -> Result<S::Output, DbError> {
        let (reply, answer) = oneshot::channel();
        let deadline = Instant::now() + self.shared.db.request_bound();
        let start = {
            let mut state = self.shared.lock();
            state.queue.push_back(Waiting {
                item,
                reply,
                deadline,
            });
            let start = state.in_flight < self.shared.max_in_flight;
            if start {
                state.in_flight += 1;
            }
            start
        };
        if start {
            tokio::spawn(self.shared.clone().run_batches());
        }
        // The sender is dropped unanswered only if its batch's task died.
        answer.await.unwrap_or(Err(DbError::BatchLost))
    }
}

impl<S: BatchStatement> Shared<S> {
    fn lock(&self) -> std::sync::MutexGuard<'_, State<S>> {
        // The state is a queue and a counter, consistent after every step.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs batches until the queue is empty, then frees its slot. Taking
    /// the batch and freeing the slot happen under the lock that queuing
    /// takes, so no item is left waiting with no batch to run it.
    async fn run_batches(self: Arc<Self>) {
        let mut slot = Slot {
            shared: self.clone(),
            freed: false,
        };
        loop {
            let batch: Vec<Waiting<S>> = {
                let mut state = self.lock();
                if state.queue.is_empty() {
                    state.in_flight -= 1;
                    slot.freed = true;
                    return;
                }
                self.take_batch(&mut state.queue)
            };
            self.run_batch(batch).await;
        }
    }

    /// The next batch: the first item waiting, and after it those of the
    /// same merchant, at most `max_rows`. The others keep their order.
    fn take_batch(&self, queue: &mut VecDeque<Waiting<S>>) -> Vec<Waiting<S>> {
        let Some(first) = queue.front() else {
            return Vec::new();
        };
        let merchant = self.statement.merchant(&first.item);
        let mut batch = Vec::with_capacity(queue.len().min(self.max_rows));
        let mut others = VecDeque::new();
        for waiting in queue.drain(..) {
            if batch.len() < self.max_rows && self.statement.merchant(&waiting.item) == merchant {
                batch.push(waiting);
            } else {
                others.push_back(waiting);
            }
        }
        *queue = others;
        batch
    }

    /// The statement for `items` on a connection of the pool, by `deadline`.
    async fn run_on_a_connection(
        &self,
        items: &[S::Item],
        deadline: Instant,
    ) -> Result<Vec<S::Output>, DbError> {
        let conn = self
            .db
            .conn_within(deadline.saturating_duration_since(Instant::now()))
            .await?;
        self.statement.run(&conn, items).await
    }

    async fn run_batch(&self, batch: Vec<Waiting<S>>) {
        crate::metrics::batch_rows(self.statement.name(), batch.len());
        let (mut items, mut replies, mut deadlines) = (Vec::new(), Vec::new(), Vec::new());
        for waiting in batch {
            items.push(waiting.item);
            replies.push(waiting.reply);
            deadlines.push(waiting.deadline);
        }
        let Some(&oldest) = deadlines.iter().min() else {
            return;
        };
        match self.run_on_a_connection(&items, oldest).await {
            Ok(outputs) if outputs.len() == items.len() => {
                for (reply, output) in replies.into_iter().zip(outputs) {
                    let _ = reply.send(Ok(output));
                }
            }
            Ok(outputs) => {
                let error = DbError::Decode(format!(
                    "{} answered {} rows for {} items",
                    self.statement.name(),
                    outputs.len(),
                    items.len()
                ));
                share(error, replies);
            }
            Err(error) if items.len() == 1 || error.is_transient() => share(error, replies),
            Err(error) => {
                tracing::debug!(statement = self.statement.name(), error = %crate::telemetry::error_chain(&error), "batch failed; running its rows one by one");
                for ((item, reply), deadline) in items.iter().zip(replies).zip(deadlines) {
                    let alone = self
                        .run_on_a_connection(std::slice::from_ref(item), deadline)
                        .await
                        .and_then(|mut outputs| {
                            outputs.pop().ok_or_else(|| {
                                DbError::Decode(format!(
                                    "{} answered no row",
                                    self.statement.name()
                                ))
                            })
                        });
                    let _ = reply.send(alone);
                }
            }
        }
    }
}

/// The same error for every request of a batch.
fn share<T>(error: DbError, replies: Vec<oneshot::Sender<Result<T, DbError>>>) {
    if let [_] = replies.as_slice() {
        if let Some(reply) = replies.into_iter().next() {
            let _ = reply.send(Err(error));
        }
        return;
    }
    let error = Arc::new(error);
    for reply in replies {
        let _ = reply.send(Err(DbError::Batch(error.clone())));
    }
}

/// A batch task's slot. If the task ends by a panic, the requests of its
/// batch get `BatchLost`, and the slot passes to a new task if others wait.
struct Slot<S: BatchStatement> {
    shared: Arc<Shared<S>>,
    freed: bool,
}

impl<S: BatchStatement> Drop for Slot<S> {
    fn drop(&mut self) {
        if self.freed {
            return;
        }
        let waiting = !self.shared.lock().queue.is_empty();
        if waiting && tokio::runtime::Handle::try_current().is_ok() {
            tokio::spawn(self.shared.clone().run_batches());
        } else {
            self.shared.lock().in_flight -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::path::Path;

    use super::*;
    use crate::config::Settings;

    /// A pool of `max_size` on the embedded defaults; building it connects
    /// to nothing.
    fn database_of(max_size: usize) -> Database {
        let settings = Settings::load_from(Path::new("/nonexistent-config-dir"), &HashMap::new())
            .expect("the embedded defaults load");
        Database::new(&settings.database, max_size).expect("a pool builds without connecting")
    }

    #[tokio::test]
    async fn one_batch_of_a_statement_at_a_time_per_eight_connections() {
        for (max_size, expected) in [(1, 1), (7, 1), (8, 1), (15, 1), (16, 2), (32, 4)] {
            assert_eq!(
                slots(&database_of(max_size)),
                expected,
                "pool of {max_size}"
            );
        }
    }
}
