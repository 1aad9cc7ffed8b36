//! Set-ups and readers the simulation tests share: a request on `test`, a load balancer or a
//! recording mongos behind a [`Sim`], the commands a server received, the pool's trace and the
//! retries scheduled.

use std::time::Duration;

use bson::{doc, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{
    CursorHandle, CursorUse, EngineEvent, EngineOptions, OpId, OperationRequest, SessionHandle,
};
use retry_core::pool::{CloseReason, PoolEvent};
use retry_core::retry::{OperationKind, RetryEvent, RetryReason};
use retry_core::selection::SelectionCriteria;
use retry_core::transaction::TransactionOptions;

use crate::{address, Role, Sim, SimServer, Step};

/// `command` on database `test`, to the primary (or the mongos, or the load balancer), without a
/// timeout, cursor or explicit session; the `with_*` setters of [`OperationRequest`] add those.
pub fn request(command: Document, kind: OperationKind) -> OperationRequest {
    OperationRequest::new("test", command, kind, SelectionCriteria::Write)
}

/// A read of `command` on database `test` with read preference primary, as [`Sim::read`] starts
/// it; the `with_*` setters of [`OperationRequest`] add a timeout, cursor or explicit session.
pub fn read_request(command: Document) -> OperationRequest {
    OperationRequest::new("test", command, OperationKind::Read, crate::primary())
}

/// The kind of a transaction's first statement, a write (TX-1: it carries `startTransaction`).
pub const FIRST_WRITE: OperationKind = OperationKind::InTransaction {
    read: false,
    first: true,
};

/// The kind of a later write in a transaction.
pub const LATER_WRITE: OperationKind = OperationKind::InTransaction {
    read: false,
    first: false,
};

/// The kind of a later read in a transaction.
pub const LATER_READ: OperationKind = OperationKind::InTransaction {
    read: true,
    first: false,
};

/// An insert of one empty document into `test.c`, of `kind`.
pub fn insert(kind: OperationKind) -> OperationRequest {
    request(doc! { "insert": "c", "documents": [{}] }, kind)
}

/// A `find` on `test.c` with `batchSize: 1` that opens a cursor (SE-14), of `kind`.
pub fn open_cursor(kind: OperationKind) -> OperationRequest {
    request(doc! { "find": "c", "batchSize": 1 }, kind).with_cursor(CursorUse::Open)
}

/// The `getMore` of the server's cursor `id` on `test.c`, which the engine knows as `cursor`.
pub fn get_more(id: i64, cursor: CursorHandle) -> OperationRequest {
    request(
        doc! { "getMore": id, "collection": "c" },
        OperationKind::GetMore,
    )
    .with_cursor(CursorUse::GetMore(cursor))
}

/// The `killCursors` that closes the server's cursor `id` on `test.c`, which the engine knows
/// as `cursor`.
pub fn kill_cursors(id: i64, cursor: CursorHandle) -> OperationRequest {
    request(
        doc! { "killCursors": "c", "cursors": [id] },
        OperationKind::RunCommand,
    )
    .with_cursor(CursorUse::Close(cursor))
}

/// `commitTransaction` on `admin` in `session` (TX-1).
pub fn commit(session: SessionHandle) -> OperationRequest {
    OperationRequest::new(
        "admin",
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: false },
        SelectionCriteria::Write,
    )
    .with_session(session)
}

/// `abortTransaction` on `admin` in `session` (TX-1).
pub fn abort(session: SessionHandle) -> OperationRequest {
    OperationRequest::new(
        "admin",
        doc! { "abortTransaction": 1 },
        OperationKind::AbortTransaction,
        SelectionCriteria::Write,
    )
    .with_session(session)
}

/// A cursor reply: cursor `id` on `test.c` with an empty `batch` (`firstBatch` or `nextBatch`).
pub fn cursor_batch(id: i64, batch: &str) -> Document {
    doc! { "ok": 1, "cursor": { "id": id, "ns": "test.c", batch: [] } }
}

/// Options with a pool of one connection (`maxPoolSize=1`): a configuration for [`Sim::lb`],
/// [`Sim::mongos`] or [`Sim::new`].
pub fn pool_of_one(options: &mut EngineOptions) {
    options.topology.pool.max_pool_size = 1;
}

/// A replica set of members at `hosts` (port 27017) whose config lists them all; the first is
/// the primary, the others secondaries: the servers for [`Sim::new`].
pub fn replica_set(hosts: &[&str]) -> Vec<(ServerAddress, SimServer)> {
    let config: Vec<String> = hosts.iter().map(|h| format!("{h}:27017")).collect();
    hosts
        .iter()
        .enumerate()
        .map(|(i, host)| {
            let mut server = SimServer::new(Role::Member);
            server.member.hosts = config.clone();
            server.member.primary = i == 0;
            (address(host), server)
        })
        .collect()
}

impl Sim {
    /// One load balancer at `lb` whose hello carries a `serviceId`, answering with `script`; the
    /// engine runs load balanced, then `configure` changes its options.
    pub fn lb(
        script: impl IntoIterator<Item = Step>,
        configure: impl FnOnce(&mut EngineOptions),
    ) -> Sim {
        let mut lb = SimServer::new(Role::LoadBalancer { service_id: true });
        lb.script = script.into_iter().collect();
        Sim::new(vec![(address("lb"), lb)], |o| {
            o.topology.load_balanced = true;
            configure(o);
        })
    }

    /// One mongos at `m` that records every command it receives ([`Sim::received`]), answering
    /// with `script`; `configure` changes the engine's options.
    pub fn mongos(
        script: impl IntoIterator<Item = Step>,
        configure: impl FnOnce(&mut EngineOptions),
    ) -> Sim {
        let mut server = SimServer::new(Role::Mongos);
        server.record_commands = true;
        server.script = script.into_iter().collect();
        Sim::new(vec![(address("m"), server)], configure)
    }

    /// Starts `request` and lets 10 ms of virtual time pass: what it waits for (`waits_for`, a
    /// connection another operation holds) keeps it from finishing.
    ///
    /// Panics if it finished.
    pub fn start_waiting(&mut self, request: OperationRequest, waits_for: &str) -> OpId {
        let op = self.start_request(request);
        self.advance_to(self.now.saturating_add(Duration::from_millis(10)));
        assert!(self.result(op).is_none(), "waits for {waits_for}");
        op
    }

    /// The `txnNumber` of every command named `name` the server at `host` recorded, in order
    /// (TX-1).
    ///
    /// Panics if one has none, or if there is no server at `host`.
    pub fn txn_numbers(&self, host: &str, name: &str) -> Vec<i64> {
        self.received(host, name)
            .iter()
            .map(|c| c.get_i64("txnNumber").expect("a txnNumber"))
            .collect()
    }

    /// The commands named `name` the server at `host` recorded, in order.
    ///
    /// Panics if there is no server at `host`.
    pub fn received(&self, host: &str, name: &str) -> Vec<&Document> {
        self.servers[&address(host)]
            .commands
            .iter()
            .filter(|c| c.keys().next().map(String::as_str) == Some(name))
            .collect()
    }

    /// The names of the commands (not hello) the server at `host` executed, in order.
    ///
    /// Panics if there is no server at `host`.
    pub fn log(&self, host: &str) -> Vec<&str> {
        self.servers[&address(host)]
            .log
            .iter()
            .map(|(name, _)| name.as_str())
            .collect()
    }

    /// Starts a transaction with the default options on `session` (TX-1).
    ///
    /// Panics if the engine refuses it.
    pub fn begin_transaction(&mut self, session: SessionHandle) {
        self.engine
            .start_transaction(session, TransactionOptions::default(), self.now)
            .expect("the session can start a transaction");
    }

    /// The pool events among `names`, in the order they were published, each by its short name:
    /// `"started"` (a check-out started), `"out"`, `"in"` and `"closed(error)"` (a connection
    /// closed after an error); what tests of CM-/TX-/LB- connection release compare.
    pub fn pool_trace(&self, names: &[&str]) -> Vec<&'static str> {
        self.events
            .iter()
            .filter_map(|(_, e)| match e {
                EngineEvent::Pool { event, .. } => pool_event_name(event),
                _ => None,
            })
            .filter(|name| names.contains(name))
            .collect()
    }

    /// The delay and reason of every retry the engine scheduled, in order.
    pub fn retries_scheduled(&self) -> Vec<(Duration, RetryReason)> {
        self.events
            .iter()
            .filter_map(|(_, e)| match e {
                EngineEvent::Operation {
                    event: RetryEvent::RetryScheduled { delay, reason, .. },
                    ..
                } => Some((*delay, *reason)),
                _ => None,
            })
            .collect()
    }
}

/// The short name [`Sim::pool_trace`] gives a pool event, if it names it.
fn pool_event_name(event: &PoolEvent) -> Option<&'static str> {
    Some(match event {
        PoolEvent::CheckOutStarted { .. } => "started",
        PoolEvent::CheckedOut { .. } => "out",
        PoolEvent::CheckedIn { .. } => "in",
        PoolEvent::ConnectionClosed {
            reason: CloseReason::Error,
            ..
        } => "closed(error)",
        _ => return None,
    })
}
