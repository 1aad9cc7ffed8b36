//! Hedged reads (gRPC A6 `hedgingPolicy`, A6-H1..A6-H7): an operation whose command has a
//! hedging policy in [`super::EngineOptions::service_config`] runs a [`HedgingMachine`], with one
//! attempt slot per copy; anything else runs a [`RetryMachine`], under the command's A6
//! `retryPolicy` when it has one.
//!
//! - Which operations: reads ([`hedgeable`]) in an implicit session that are not a cursor's
//!   `getMore` or `killCursors`. An explicit session is never hedged: two copies would use its one
//!   server session at once (SE-10: a session is not for concurrent use).
//! - A6-H7: the copies' server selections run one at a time, each avoiding every server an earlier
//!   copy was sent to, so copies go to distinct servers while unused ones exist.
//! - Sessions: each copy takes its own implicit server session at checkout (SE-7, SE-9). A server
//!   runs the commands of one session one at a time, so copies sharing a session would queue
//!   behind each other wherever they meet (a shard reached through two mongoses), and the slow
//!   copy would hold up the fast one. The winner's session is the operation's (it goes with the
//!   cursor it opened, SE-14); the others go back to the pool when the operation ends.
//! - A6-H3: a cancelled copy still selecting stops; one waiting for or holding a connection it
//!   wrote nothing to gives it back. A copy in flight gets its command-failed event with the
//!   cancelled error at once (EV-1), and its connection [`Drain`]s: it stays checked out, lent to
//!   nobody, until the reply arrives and it is checked in with the copy's server session (SE-7).
//!   The connection machine closes it if the deadline or the socket timeout passes first.
//!   Closing it at once would cost a new connection and handshake when the servers are busiest,
//!   and a server keeps running a read whose client went away anyway.

use alloc::boxed::Box;
use alloc::string::String;
use alloc::sync::Arc;
use bson::doc;
use bson::raw::RawDocument;
use rand_core::RngCore;

use super::raw_reply::ReplyFields;
use super::refused::refusal;
use super::{
    ConnId, Cursor, CursorHandle, CursorUse, Drain, Engine, EngineEvent, OpId, OpMachine,
    OpSession, Operation, OperationRequest, Owner, ServerId, Slot, SPARE_OPS,
};
use crate::address::ServerAddress;
use crate::bson_read::Elements;
use crate::error::OperationError;
use crate::hedging::{hedgeable, Action, CopyId, HedgingMachine};
use crate::pinning::CursorPin;
use crate::policy::RetryPolicy;
use crate::pool::ConnectionId;
use crate::retry::OperationKind;
use crate::retry::{Attempt, AttemptServer, OperationSpec, RetryMachine, WriteConcernRule};
use crate::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use crate::service_config::MethodPolicy;
use crate::session::ServerSession;
use crate::time::Instant;

use super::worklist::Machine;

/// The id and namespace (`db`, collection) of the cursor a reply opened, if it opened one: the
/// `cursor.id` [`ReplyFields`] read, and `ns` of the reply's `cursor` document, read in place
/// (each the last occurrence of its key, as `Document::get` sees them after conversion).
fn opened_cursor(reply: &RawDocument, fields: &ReplyFields<'_>) -> Option<(i64, (String, String))> {
    fn last<'a>(document: &'a RawDocument, name: &[u8], tag: u8) -> Option<&'a [u8]> {
        let (_, t, value) = Elements::of(document)
            .filter(|&(key, _, _)| key == name)
            .last()?;
        (t == tag).then_some(value)
    }
    let id = fields.cursor_id.filter(|&id| id != 0)?;
    let cursor = RawDocument::from_bytes(last(reply, b"cursor", 0x03)?).ok()?;
    // A string: its length, its UTF-8 bytes, a NUL.
    let ns = last(cursor, b"ns", 0x02)?;
    let ns = core::str::from_utf8(ns.get(4..ns.len().checked_sub(1)?)?).ok()?;
    let (db, collection) = ns.split_once('.')?;
    Some((id, (db.into(), collection.into())))
}

/// The copy of a slot: copy `n` is in slot `n - 1`.
fn copy_of(slot: usize) -> CopyId {
    CopyId(slot as u32 + 1)
}

fn slot_of(copy: CopyId) -> usize {
    copy.0 as usize - 1
}

impl OpMachine {
    /// The servers the next selection avoids (SS-11, A6-H7).
    pub(super) fn deprioritized(&self) -> &[ServerAddress] {
        match self {
            OpMachine::Retry(m) => m.deprioritized(),
            OpMachine::Hedging(m) => m.deprioritized(),
        }
    }

    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        match self {
            OpMachine::Retry(m) => m.poll_timeout(),
            OpMachine::Hedging(m) => m.poll_timeout(),
        }
    }

    pub(super) fn handle_timeout(&mut self, now: Instant) {
        match self {
            OpMachine::Retry(m) => m.handle_timeout(now),
            OpMachine::Hedging(m) => m.handle_timeout(now),
        }
    }

    /// Whether the machine expects inputs for `slot`. A hedged copy the machine has cancelled may
    /// still hear of its selection, checkout or reply before the engine handles the
    /// cancellation, which then gives back whatever the copy holds; such news is dropped.
    pub(super) fn is_live(&self, slot: usize) -> bool {
        match self {
            OpMachine::Retry(_) => true,
            OpMachine::Hedging(m) => m.is_live(copy_of(slot)),
        }
    }
}

/// Inputs to the operation's machine. A refused input is a bug of the engine's; it is kept in
/// `refused` and the engine finishes the operation with an internal error (house rule 8).
impl Operation {
    pub(super) fn server_selected(&mut self, slot: usize, server: AttemptServer, now: Instant) {
        let result = match &mut self.machine {
            OpMachine::Retry(m) => m.handle_server_selected(server, now).map_err(refusal),
            OpMachine::Hedging(m) if m.is_live(copy_of(slot)) => m
                .handle_server_selected(copy_of(slot), server.address, now)
                .map_err(refusal),
            OpMachine::Hedging(_) => Ok(()),
        };
        self.note(result);
    }

    pub(super) fn selection_failed(&mut self, slot: usize, error: OperationError, now: Instant) {
        let result = match &mut self.machine {
            OpMachine::Retry(m) => m.handle_selection_failed(error, now).map_err(refusal),
            OpMachine::Hedging(m) if m.is_live(copy_of(slot)) => m
                .handle_selection_failed(copy_of(slot), error, now)
                .map_err(refusal),
            OpMachine::Hedging(_) => Ok(()),
        };
        self.note(result);
    }

    pub(super) fn sent(&mut self, slot: usize, now: Instant) {
        let result = match &mut self.machine {
            OpMachine::Retry(m) => m.handle_sent(now).map_err(refusal),
            OpMachine::Hedging(m) if m.is_live(copy_of(slot)) => {
                m.handle_sent(copy_of(slot), now).map_err(refusal)
            }
            OpMachine::Hedging(_) => Ok(()),
        };
        self.note(result);
    }

    /// Issue 9: after [`Operation::sent`], whether the operation's turn on the worklist would
    /// do nothing: a retry machine that records no events and has no action queued (its
    /// `handle_sent` only changes its state, queueing none; one queued before the send would be
    /// lost without the turn, house rule 8, review15 finding 2), no refused input, and no
    /// deadline registered or due.
    pub(super) fn settled_after_send(&self) -> bool {
        self.refused.is_none()
            && self.timer.is_none()
            && self.slots.iter().all(|s| s.wake.is_none())
            && matches!(&self.machine, OpMachine::Retry(m)
                if !m.records_events() && !m.has_queued_actions() && m.poll_timeout().is_none())
    }

    pub(super) fn succeeded(&mut self, slot: usize, now: Instant) {
        let result = match &mut self.machine {
            OpMachine::Retry(m) => m.handle_succeeded(now).map_err(refusal),
            OpMachine::Hedging(m) if m.is_live(copy_of(slot)) => {
                m.handle_succeeded(copy_of(slot), now).map_err(refusal)
            }
            OpMachine::Hedging(_) => Ok(()),
        };
        self.note(result);
    }

    pub(super) fn failed(&mut self, slot: usize, error: OperationError, now: Instant) {
        let result = match &mut self.machine {
            OpMachine::Retry(m) => m.handle_failed(error, now).map_err(refusal),
            OpMachine::Hedging(m) if m.is_live(copy_of(slot)) => {
                m.handle_failed(copy_of(slot), error, now).map_err(refusal)
            }
            OpMachine::Hedging(_) => Ok(()),
        };
        self.note(result);
    }

    /// CS-4, TO-10: the attempt was not sent, as its time is up. A hedged copy is just not sent
    /// (A6 deadline rule): the operation times out only when no other copy is in flight.
    pub(super) fn expired_before_send(&mut self, slot: usize, now: Instant) {
        let result = match &mut self.machine {
            OpMachine::Retry(m) => m.handle_expired_before_send(now).map_err(refusal),
            OpMachine::Hedging(m) if m.is_live(copy_of(slot)) => m
                .handle_expired_before_send(copy_of(slot), now)
                .map_err(refusal),
            OpMachine::Hedging(_) => Ok(()),
        };
        self.note(result);
    }
}

/// A new operation's machine ([`Engine::operation_machine`]): on its own, or already in the
/// box of a finished operation that the new one reuses (issue 9).
pub(super) enum Made {
    /// A new machine; the operation needs a new box.
    Fresh(OpMachine),
    /// The spare operation, its machine the new one.
    InSpare(Box<Operation>),
}

impl Made {
    /// `machine`, put into `spare` when there is one.
    fn placed(machine: OpMachine, spare: Option<Box<Operation>>) -> Made {
        match spare {
            Some(mut spare) => {
                spare.machine = machine;
                Made::InSpare(spare)
            }
            None => Made::Fresh(machine),
        }
    }
}

/// A new retry machine, recording its events or not (issue 9: the same actions and decisions).
fn new_machine(
    spec: OperationSpec,
    options: &crate::policy::RetryOptions,
    seed: u64,
    record: bool,
    now: Instant,
) -> RetryMachine {
    let machine = RetryMachine::new(spec, options, seed, now);
    match record {
        true => machine,
        false => machine.without_events(),
    }
}

impl Engine {
    /// The machine of a new operation, by its command's policy in the service config: a
    /// hedging machine when the policy is hedging and the operation may be hedged (see the module
    /// docs); else a retry machine under the command's A6 retry policy, with no retries for a
    /// command named without a policy, or under the client's retry options. `pinned` operations
    /// (a cursor's, a pinned transaction's, the engine's own) keep the client's options.
    ///
    /// Issue 9: `spare` is a finished operation whose box the new one reuses: the machine goes
    /// into it, and a retry machine that records as the spare's does is made by restarting that
    /// one in place (the machine `new` makes, without building and moving 680 bytes twice).
    pub(super) fn operation_machine(
        &mut self,
        request: &OperationRequest,
        session: &OpSession,
        pinned: bool,
        spec: OperationSpec,
        now: Instant,
        spare: Option<Box<Operation>>,
    ) -> Made {
        let policy = match (&self.options.service_config, pinned) {
            (Some(config), false) => request
                .command
                .keys()
                .next()
                .and_then(|name| config.policy_for(name)),
            _ => None,
        };
        let retry = match policy {
            Some(MethodPolicy::Hedging(policy))
                if hedgeable(request.kind)
                    && !matches!(session, OpSession::Explicit(_))
                    && matches!(request.cursor, CursorUse::None | CursorUse::Open) =>
            {
                if let Ok(machine) = HedgingMachine::new(request.kind, request.timeout, policy, now)
                {
                    // Issue 9: events nobody listens to are not recorded (same decisions).
                    let machine = OpMachine::Hedging(Box::new(
                        match self.options.events.publishes_hedging() {
                            true => machine,
                            false => machine.without_events(),
                        },
                    ));
                    return Made::placed(machine, spare);
                }
                None
            }
            Some(MethodPolicy::Retry(policy)) => Some(
                self.options
                    .retry
                    .clone()
                    .policy(RetryPolicy::Grpc(Arc::new(policy.clone()))),
            ),
            // A6: a method named without a policy is not retried.
            Some(MethodPolicy::NoRetries) => {
                let mut options = self
                    .options
                    .retry
                    .clone()
                    .retry_reads(false)
                    .retry_writes(false)
                    .policy(RetryPolicy::Current);
                options.max_adaptive_retries = 0;
                Some(options)
            }
            _ => None,
        };
        let options = retry.as_ref().unwrap_or(&self.options.retry);
        let seed = self.rng.next_u64();
        // Issue 9: events nobody listens to are not recorded (same actions and decisions).
        let record = self.options.events.publishes_retry();
        if let Some(mut spare) = spare {
            if let OpMachine::Retry(machine) = &mut spare.machine {
                if machine.records_events() == record {
                    machine.restart(spec, options, seed, now);
                    return Made::InSpare(spare);
                }
            }
            spare.machine =
                OpMachine::Retry(Box::new(new_machine(spec, options, seed, record, now)));
            return Made::InSpare(spare);
        }
        Made::Fresh(OpMachine::Retry(Box::new(new_machine(
            spec, options, seed, record, now,
        ))))
    }

    /// Keeps a finished operation's box, with its retry machine's, for the next operation
    /// (at most `SPARE_OPS`; issue 9). The command is dropped now: its fields, its document
    /// sequences and its encoded form (`finish` has taken the reply, the opened cursor and the
    /// sessions); its database name, emptied, goes to `Engine::take_db_name`. The rest waits
    /// until the next operation overwrites every field: the request (selection criteria,
    /// session handle, cursor use), the attempt slots (server, attempt), the pinned server, the
    /// transaction and a refused input. A hedged operation's box is not kept.
    pub(super) fn keep_operation(&mut self, mut op: Box<Operation>) {
        if !matches!(op.machine, OpMachine::Retry(_)) || self.spare_ops.len() >= SPARE_OPS {
            return;
        }
        op.wire.body.clear();
        op.wire.sequences.clear();
        op.encoded = None;
        // Its database name goes to the caller's next request (`Engine::take_db_name`).
        if self.spare_names.len() < SPARE_OPS {
            let mut name = core::mem::take(&mut op.request.db);
            name.clear();
            self.spare_names.push(name);
        }
        self.spare_ops.push(op);
    }

    /// Routes a hedged operation's events and actions.
    pub(super) fn drain_hedged(&mut self, op_id: OpId, now: Instant) {
        loop {
            let Some(op) = self.ops.get_mut(&op_id) else {
                return;
            };
            let OpMachine::Hedging(machine) = &mut op.machine else {
                return;
            };
            if let Some(event) = machine.poll_event() {
                if self.options.events.publishes_hedging() {
                    self.events
                        .push_back(EngineEvent::Hedging { op: op_id, event });
                }
                continue;
            }
            let Some(action) = machine.poll_action() else {
                return;
            };
            self.route_copy_action(op_id, action, now);
        }
    }

    fn route_copy_action(&mut self, op_id: OpId, action: Action, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        match action {
            Action::SelectServer(copy) => {
                let slot = slot_of(copy);
                // SE-9: each copy has its own implicit session, taken at its checkout (SE-7).
                while op.slots.len() <= slot {
                    let session = match op.slots[0].session {
                        OpSession::Never => OpSession::Never,
                        _ => OpSession::Implicit(None),
                    };
                    op.slots.push(Slot {
                        session,
                        ..Slot::default()
                    });
                }
                // A6-H7: one selection at a time, so that each avoids the servers of the copies
                // before it.
                if op.slots.iter().any(|s| s.selection.is_some()) {
                    op.slots[slot].select_queued = true;
                } else {
                    self.start_selection(op_id, slot, now);
                }
            }
            Action::Dispatch { copy, address } => {
                let slot = slot_of(copy);
                let server = self.server_id(&address);
                let attempt = Attempt {
                    number: copy.0,
                    address,
                    txn_number: None,
                    start_transaction: false,
                    write_concern: WriteConcernRule::AsRequested,
                };
                self.check_out(op_id, slot, server, attempt, now);
            }
            Action::Release { copy, close } => {
                let slot = slot_of(copy);
                let keep = op.keep_conn;
                let state = &mut op.slots[slot];
                state.checkout = None;
                // LB-10: the winner's connection may now belong to the cursor it opened.
                let release = state.conn.take().filter(|_| !keep);
                self.clear_attempt(op_id, slot);
                if let Some(conn) = release {
                    self.release(conn, !close, now);
                }
            }
            Action::Cancel { copy, .. } => self.cancel_copy(op_id, slot_of(copy), now),
            Action::Finished(result) => {
                let winner = result.as_ref().map_or(0, |copy| slot_of(*copy));
                self.finish(op_id, result.map(|_| ()), winner, now);
            }
        }
    }

    /// Starts the selection of the first copy that waits for one (A6-H7), once none is running.
    pub(super) fn start_queued_selection(&mut self, op_id: OpId, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        if op.slots.iter().any(|s| s.selection.is_some()) {
            return;
        }
        let queued = op.slots.iter().position(|s| s.select_queued);
        if let Some(slot) = queued {
            op.slots[slot].select_queued = false;
            self.start_selection(op_id, slot, now);
        }
    }

    /// A6-H3: stops a losing copy (see the module docs).
    fn cancel_copy(&mut self, op_id: OpId, slot: usize, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        let gossip = op.gossip;
        let state = &mut op.slots[slot];
        state.selection = None;
        state.wake = None;
        state.select_queued = false;
        let checkout = state.checkout.take();
        let conn = state.conn.take();
        let in_flight = conn
            .and_then(|conn| self.sockets.get_mut(&conn))
            .filter(|socket| socket.op == Some((op_id, slot)));
        match in_flight {
            Some(socket) => {
                // The copy's server session stays with the command until its reply (SE-7).
                let session = match &mut state.session {
                    OpSession::Implicit(server) => server.take(),
                    _ => None,
                };
                socket.op = None;
                socket.drain = Some(Drain { session, gossip });
                // EV-1: the command in flight ends with the cancellation.
                if let Some(pending) = socket.command.take() {
                    self.command_failed(pending, &OperationError::cancelled(), now);
                }
            }
            // Checked out but nothing written: the connection goes straight back.
            None => {
                if let Some(conn) = conn {
                    self.release(conn, true, now);
                }
            }
        }
        self.clear_attempt(op_id, slot);
        if let Some((server, checkout)) = checkout {
            self.checkouts.remove(&(server, checkout));
            if let Some(pool) = self.pool_mut(server) {
                pool.cancel_checkout(checkout, now);
            }
            self.schedule(Machine::Pool(server));
        }
    }

    /// The reply to a cancelled copy arrived on its draining connection: SDAM error handling and
    /// `$clusterTime` as for any reply (SE-16), then the connection is checked in and the copy's
    /// server session goes back to the pool (SE-7).
    /// The reply is read in place by the reader of every attempt's reply ([`ReplyFields`]).
    pub(super) fn drained_reply(&mut self, conn: ConnId, body: &RawDocument, now: Instant) {
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        let Some(drain) = socket.drain.take() else {
            return;
        };
        let (server, owner) = (socket.server, socket.owner);
        let fields = ReplyFields::read(body);
        if let (Some(error), Owner::Pool(id)) = (fields.error(body, &socket.address), owner) {
            let context = self.error_context(server, id, true);
            self.application_error(server, &error, context, now);
        }
        if drain.gossip {
            self.gossip_cluster_time(fields.cluster_time, None);
        }
        match opened_cursor(body, &fields).filter(|_| !self.closed) {
            Some((id, ns)) => self.kill_cursor(server, conn, id, ns, drain.session, now),
            None => {
                if let Some(session) = drain.session {
                    self.release_server_session(session, now);
                }
                self.release(conn, true, now);
            }
        }
    }

    /// A cancelled copy's read opened a cursor nobody will read: an engine-internal
    /// `killCursors` closes it on its server (in load-balanced mode on its very connection,
    /// LB-10), with the copy's session (SE-14), which then goes back to the pool.
    fn kill_cursor(
        &mut self,
        server: ServerId,
        conn: ConnId,
        id: i64,
        (db, collection): (String, String),
        session: Option<ServerSession>,
        now: Instant,
    ) {
        let address = self.server(server).address.clone();
        let topology = self.topology.description();
        let Some(attempt_server) = topology
            .server(&address)
            .map(|d| AttemptServer::from_description(d, topology.topology_type))
        else {
            if let Some(session) = session {
                self.release_server_session(session, now);
            }
            self.release(conn, true, now);
            return;
        };
        let (pin, pinned) = match self.sockets.get(&conn).map(|s| s.owner) {
            Some(Owner::Pool(pool_id)) if self.options.topology.load_balanced => {
                (CursorPin::pinned(pool_id), Some(conn))
            }
            _ => {
                self.release(conn, true, now);
                (CursorPin::new(), None)
            }
        };
        let handle = CursorHandle(self.next_cursor);
        self.next_cursor += 1;
        self.cursors.insert(
            handle,
            Cursor {
                server: attempt_server,
                conn: pinned,
                pin,
                session: session.map_or(OpSession::Never, |s| OpSession::Implicit(Some(s))),
                transaction: None,
            },
        );
        let mut request = OperationRequest::new(
            db,
            doc! { "killCursors": collection, "cursors": [id] },
            OperationKind::RunCommand,
            SelectionCriteria::Read(ReadPreference::from_mode(
                ReadPreferenceMode::PrimaryPreferred,
            )),
        );
        request.cursor = CursorUse::Close(handle);
        self.launch(request, true, now);
    }

    /// A draining connection failed (its deadline or socket timeout passed, or the peer closed
    /// it): SDAM error handling, the copy's server session is dirty and discarded (SE-12), and the
    /// connection goes back to be closed.
    pub(super) fn drain_failed(
        &mut self,
        server: ServerId,
        id: ConnectionId,
        drain: Drain,
        error: &OperationError,
        now: Instant,
    ) {
        let context = self.error_context(server, id, true);
        self.application_error(server, error, context, now);
        if let Some(mut session) = drain.session {
            session.mark_dirty();
            self.release_server_session(session, now);
        }
        if let Some(pool) = self.pool_mut(server) {
            pool.check_in(id, false, now);
        }
        self.flush_pool_events(server);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::address::ServerAddress;
    use crate::engine::{EngineOptions, SessionHandle};
    use crate::handshake::HandshakeOptions;
    use crate::service_config::ServiceConfig;
    use crate::topology::TopologySettings;
    use bson::Document;

    /// An engine (no servers answer) with `find` hedged and `count` under an A6 retry policy.
    fn engine() -> Engine {
        let mut options = EngineOptions::new(
            TopologySettings::new(alloc::vec![ServerAddress::new("db", 27017)]),
            HandshakeOptions::new(),
        );
        options.service_config = Some(
            ServiceConfig::from_document(&doc! { "methodConfig": [
            { "name": [{ "service": "mongodb", "method": "find" }],
              "hedgingPolicy": { "maxAttempts": 3, "hedgingDelay": "0s" } },
            { "name": [{ "service": "mongodb", "method": "count" }],
              "retryPolicy": { "maxAttempts": 2, "initialBackoff": "0.1s",
                               "maxBackoff": "1s", "backoffMultiplier": 2,
                               "retryableStatusCodes": [462] } } ] })
            .expect("valid"),
        );
        Engine::new(options, Instant::ZERO).expect("valid")
    }

    fn start(engine: &mut Engine, command: Document, kind: OperationKind) -> OpId {
        let criteria = SelectionCriteria::Read(ReadPreference::PRIMARY);
        let request = OperationRequest::new("test", command, kind, criteria);
        engine.start_operation(request, Instant::ZERO)
    }

    fn hedged(engine: &Engine, op: OpId) -> bool {
        matches!(engine.ops[&op].machine, OpMachine::Hedging(_))
    }

    /// A6-H1 and the choice of machine: a hedged find selects its copies one at a time (A6-H7),
    /// each in a slot of its own; other commands and kinds run a retry machine with one slot.
    #[test]
    fn a6_h7_a_hedged_read_has_a_slot_per_copy_selecting_one_at_a_time() {
        let mut engine = engine();
        let find = start(&mut engine, doc! { "find": "c" }, OperationKind::Read);
        assert!(hedged(&engine, find));
        let op = &engine.ops[&find];
        assert_eq!(
            op.slots.len(),
            3,
            "maxAttempts 3, hedgingDelay 0: every copy at once"
        );
        // The topology is unknown: the first copy waits to select, the others wait for it.
        assert!(op.slots[0].selection.is_some() && !op.slots[0].select_queued);
        assert!(op
            .slots
            .iter()
            .skip(1)
            .all(|s| s.selection.is_none() && s.select_queued));
        let count = start(&mut engine, doc! { "count": "c" }, OperationKind::Read);
        let insert = start(
            &mut engine,
            doc! { "find": "c" },
            OperationKind::RetryableWrite,
        );
        for op in [count, insert] {
            assert!(!hedged(&engine, op));
            assert_eq!(engine.ops[&op].slots.len(), 1);
        }
    }

    /// SE-10: a read in an explicit session is not hedged.
    #[test]
    fn a_read_in_an_explicit_session_is_not_hedged() {
        let mut engine = engine();
        let session: SessionHandle = engine.start_session();
        let criteria = SelectionCriteria::Read(ReadPreference::PRIMARY);
        let mut request =
            OperationRequest::new("test", doc! { "find": "c" }, OperationKind::Read, criteria);
        request.session = Some(session);
        let op = engine.start_operation(request, Instant::ZERO);
        assert!(!hedged(&engine, op));
    }

    /// Cancelling a hedged read that is still selecting ends it once, with every copy cancelled.
    #[test]
    fn cancelling_a_hedged_read_while_selecting_ends_it_once() {
        let mut engine = engine();
        let find = start(&mut engine, doc! { "find": "c" }, OperationKind::Read);
        engine.cancel_operation(find, Instant::ZERO);
        let events: alloc::vec::Vec<_> = core::iter::from_fn(|| engine.poll_event()).collect();
        let finished = events
            .iter()
            .filter(|e| matches!(e, EngineEvent::OperationFinished { op, .. } if *op == find))
            .count();
        let cancelled = events
            .iter()
            .filter(|e| {
                matches!(
                    e,
                    EngineEvent::Hedging {
                        event: crate::hedging::HedgingEvent::CopyCancelled { .. },
                        ..
                    }
                )
            })
            .count();
        assert_eq!((finished, cancelled), (1, 3));
        assert!(engine.ops.is_empty() && engine.waiting.is_empty());
    }

    /// SE-14, LB-10: the cursor a drained reply opened, by id and namespace, read in place from
    /// the encoded reply as the document rules read it; none for id 0 or an unusable `ns`.
    #[test]
    fn opened_cursor_reads_id_and_namespace() {
        let opened = |reply: Document| {
            let raw = bson::RawDocumentBuf::try_from(&reply).expect("encodes");
            opened_cursor(&raw, &ReplyFields::read(&raw))
        };
        let reply = doc! { "ok": 1, "cursor": { "id": 7_i64, "ns": "db.c.d", "firstBatch": [] } };
        assert_eq!(opened(reply), Some((7, ("db".into(), "c.d".into()))));
        let small = doc! { "ok": 1, "cursor": { "ns": "db.c", "id": 8_i32 } };
        assert_eq!(opened(small), Some((8, ("db".into(), "c".into()))));
        let done = doc! { "ok": 1, "cursor": { "id": 0_i64, "ns": "db.c", "firstBatch": [] } };
        assert_eq!(opened(done), None);
        assert_eq!(opened(doc! { "ok": 1 }), None);
        assert_eq!(opened(doc! { "cursor": { "id": 7_i64, "ns": 5 } }), None);
        assert_eq!(
            opened(doc! { "cursor": { "id": 7_i64, "ns": "nodot" } }),
            None
        );
    }

    /// Review9 finding 5, WP-2, LB-10: a reply with two `cursor` keys (built as bytes; a
    /// `Document` cannot hold them) opens the last one's cursor, as the plain path's document
    /// (the last value) and `ReplyFields` (the last `id`) read it; a last one with id 0 opens none.
    #[test]
    fn review9_f5_opened_cursor_reads_the_last_of_two_cursor_keys() {
        use bson::raw::{cstr, RawDocumentBuf};
        let cursor = |id: i64, ns: &str| {
            let mut cursor = RawDocumentBuf::new();
            cursor.append(cstr!("id"), id);
            cursor.append(cstr!("ns"), ns);
            cursor
        };
        let reply = |last_id: i64| {
            let mut reply = RawDocumentBuf::new();
            reply.append(cstr!("ok"), 1.0);
            reply.append(cstr!("cursor"), cursor(7, "first.c"));
            reply.append(cstr!("cursor"), cursor(last_id, "last.d"));
            reply
        };
        let opened = |raw: &RawDocumentBuf| opened_cursor(raw, &ReplyFields::read(raw));
        let two = reply(9);
        assert_eq!(opened(&two), Some((9, ("last".into(), "d".into()))));
        let plain = crate::bson_read::document(&two).unwrap();
        assert_eq!(
            plain.get_document("cursor").unwrap(),
            &doc! { "id": 9_i64, "ns": "last.d" }
        );
        assert_eq!(opened(&reply(0)), None);
    }

    /// Review15 finding 2, house rule 8: the operation's turn after a send is skipped only when
    /// its retry machine has no action queued. Here the machine is sent while its queue still
    /// holds actions no turn has taken (a path that sends without draining the machine first):
    /// the operation keeps its turn, which takes them. Drained first, the turn is skipped.
    #[test]
    fn review15_f2_a_send_with_an_action_queued_keeps_the_turn() {
        let mut options = EngineOptions::new(
            TopologySettings::new(alloc::vec![ServerAddress::new("db", 27017)]),
            HandshakeOptions::new(),
        );
        // No retry events: the machine's `handle_sent` queues nothing of its own.
        options.events = crate::engine::EventFamilies::NONE;
        let mut engine = Engine::new(options, Instant::ZERO).expect("valid");
        let id = start(&mut engine, doc! { "ping": 1 }, OperationKind::Read);
        let op = engine.ops.get_mut(&id).expect("running");
        // Nothing else would give it a turn: no deadline, no selection wake, no refused input.
        op.timer = None;
        op.slots[0].wake = None;
        let server = AttemptServer {
            address: ServerAddress::new("db", 27017),
            server_type: crate::topology::ServerType::Standalone,
            topology_type: crate::topology::TopologyType::Single,
            max_wire_version: 25,
            sessions_supported: true,
        };
        let spec = OperationSpec::new(OperationKind::Read);
        let options = crate::policy::RetryOptions::default();
        let mut sent = |drain: bool| {
            let OpMachine::Retry(m) = &mut op.machine else {
                panic!("a ping runs a retry machine");
            };
            // A new operation: its `SelectServer` is queued.
            m.restart(spec, &options, 7, Instant::ZERO);
            if drain {
                assert_eq!(m.poll_action(), Some(crate::retry::Action::SelectServer));
            }
            m.handle_server_selected(server.clone(), Instant::ZERO)
                .expect("selecting");
            if drain {
                assert!(matches!(
                    m.poll_action(),
                    Some(crate::retry::Action::Dispatch(_))
                ));
            }
            op.sent(0, Instant::ZERO);
            assert!(op.refused.is_none());
            op.settled_after_send()
        };
        assert!(sent(true), "drained: the turn would do nothing");
        assert!(!sent(false), "SelectServer and Dispatch still queued");
    }
}
