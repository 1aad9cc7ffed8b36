//! Sockets: one connection machine per socket, owned by a pool or a monitor.
//!
//! A socket is opened for a pool's `Establish` or a monitor's check, and its outputs are routed by
//! its owner: a completed handshake to the pool (`handle_established`) or the monitor (its
//! `hello`), a reply to the operation whose command is on it or to the monitor, a failure to the
//! operation, SDAM error handling and the pool, or to the monitor.
//!
//! AU-2, AU-11: a pooled socket of a client with credentials authenticates before its handshake
//! completes, so an authentication failure is a failure before the handshake completed: the
//! server is marked Unknown and its pool cleared (HS-9; the error has no overload labels), and the
//! checkout that wanted the connection fails.

use super::{ConnId, CursorHandle, CursorUse, Engine, OpId, Owner, ServerId, Socket};
use crate::auth::Authentication;
use crate::connection::{Connection, ConnectionConfig, ConnectionEvent};
use crate::error::{ErrorKind, Labels, NetworkErrorKind, NetworkPhase, OperationError};
use crate::pool::ConnectionId;
use crate::time::Instant;
use crate::topology::ErrorContext;
use bson::oid::ObjectId;
use smallvec::SmallVec;

use super::worklist::{Machine, Timers};
use alloc::collections::VecDeque;

impl Engine {
    /// Opens a socket to `server` for `owner`; `None` if its connection machine cannot be built
    /// (the caller fails what it was for).
    pub(super) fn open_socket(
        &mut self,
        server: ServerId,
        owner: Owner,
        generation: u32,
        now: Instant,
    ) -> Option<ConnId> {
        let address = self.server(server).address.clone();
        let mut config = ConnectionConfig::new(address.clone());
        config.generation = generation;
        config.connect_timeout = self.options.connect_timeout;
        config.socket_timeout = match owner {
            // TO-3: socketTimeoutMS is for application connections only.
            Owner::Pool(_) => self.options.socket_timeout,
            // MO-4: an awaited reply may take a heartbeat; polling hellos set their own deadline.
            Owner::Monitor | Owner::Rtt => Some(self.options.connect_timeout)
                .filter(|t| !t.is_zero())
                .map(|t| t.saturating_add(self.options.heartbeat_frequency)),
        };
        config.load_balanced = self.options.topology.load_balanced;
        let machine = match (&self.options.auth, owner) {
            // AU-2: pooled connections authenticate; the hello carries the speculative start.
            (Some(auth), Owner::Pool(_)) => {
                let mut auth = Authentication::new(auth);
                // Versioned-api spec: the conversation's commands carry the declared version.
                if let Some(api) = &self.options.handshake.server_api {
                    auth = auth.with_server_api(api);
                }
                let mut hello = self.handshake.clone();
                auth.add_to_hello(&mut hello);
                let mut machine = Connection::new(config, hello, now).ok()?;
                machine.set_authentication(auth);
                machine
            }
            // HS-2: the same bytes for every socket that does not authenticate (the invariant
            // on `Engine::encoded_handshake`).
            _ => {
                let hello = self.encoded_handshake.as_ref().ok()?.clone();
                let mut machine = Connection::with_encoded_handshake(config, hello, now);
                // SS-16 step 2 (review32 R3): a monitor's handshake reports an incompatible
                // server to SDAM instead of failing the check.
                if matches!(owner, Owner::Monitor | Owner::Rtt) {
                    machine.set_monitoring();
                }
                machine
            }
        };
        let conn = ConnId(self.next_conn);
        self.next_conn += 1;
        if let Owner::Pool(id) = owner {
            self.server_mut(server).sockets.insert(id, conn);
        }
        self.sockets.insert(
            conn,
            Socket {
                server,
                address: address.clone(),
                owner,
                machine,
                op: None,
                drain: None,
                transmit_queued: false,
                command: None,
                timer: None,
                queued: false,
            },
        );
        self.connects.push_back(super::Connect { conn, address });
        // Registers the connect timer.
        self.schedule(Machine::Socket(conn));
        Some(conn)
    }

    /// The error of a socket whose connection machine could not be built: no handshake was sent.
    pub(super) fn unbuildable(&self, server: ServerId) -> OperationError {
        OperationError {
            kind: ErrorKind::Handshake {
                message: "the connection's handshake could not be built".into(),
            },
            labels: Labels::NONE,
            address: Some(self.server(server).address.clone()),
        }
    }

    /// Forgets a socket (its timer, its pool index entry).
    fn remove_socket(&mut self, conn: ConnId) -> Option<Socket> {
        let mut socket = self.sockets.remove(&conn)?;
        self.timers
            .set(Machine::Socket(conn), &mut socket.timer, None);
        if let Owner::Pool(id) = socket.owner {
            self.server_mut(socket.server).sockets.remove(&id);
        }
        Some(socket)
    }

    /// Closes a socket. One with an attempt on it (a pool closing an in-use connection, CM-4's
    /// interruption) fails like a socket the peer closed, so its operation hears of it. Any
    /// other is closed with `write_out` ([`super::Close::write_out`]: a pool letting a healthy
    /// connection go, WP-6; not after an error, a cancel or for a monitor's).
    pub(super) fn close_socket(&mut self, conn: ConnId, write_out: bool, now: Instant) {
        match self.sockets.get_mut(&conn) {
            Some(socket) if socket.op.is_some() || socket.drain.is_some() => {
                socket
                    .machine
                    .handle_closed(NetworkErrorKind::Closed, None, now);
                self.schedule(Machine::Socket(conn));
            }
            Some(_) => {
                self.remove_socket(conn);
                self.closes.push_back(super::Close { conn, write_out });
            }
            None => {}
        }
    }

    /// The socket of a pool's connection.
    pub(super) fn pool_socket(&self, server: ServerId, id: ConnectionId) -> Option<ConnId> {
        self.server(server).sockets.get(&id).copied()
    }

    /// Routes the outputs of one socket's connection machine, then registers its deadline (a
    /// socket that failed is gone).
    pub(super) fn drain_socket(&mut self, conn: ConnId, now: Instant) {
        loop {
            let Some(socket) = self.sockets.get_mut(&conn) else {
                return;
            };
            list_transmit(conn, socket, &mut self.transmits);
            let Some(event) = socket.machine.poll_event() else {
                // Issue 9: its deadline registered with the socket at hand (`Engine::turn`).
                register_deadline(conn, socket, &mut self.timers);
                return;
            };
            let (server, owner, op) = (socket.server, socket.owner, socket.op);
            match event {
                ConnectionEvent::HandshakeComplete { reply, .. } => match owner {
                    Owner::Monitor => self.monitor_handshake_completed(server, &reply, now),
                    Owner::Rtt => self.rtt_measured(server, &reply.description, now),
                    Owner::Pool(id) => {
                        if let Some(pool) = self.pool_mut(server) {
                            pool.handle_established(id, reply.service_id, now);
                        }
                        self.schedule(Machine::Pool(server));
                        self.pool_handshake_completed(server, &reply, now);
                    }
                },
                ConnectionEvent::Reply { reply, .. } => match (owner, op) {
                    (Owner::Monitor, _) => self.monitor_replied(server, conn, &reply, now),
                    (Owner::Rtt, _) => self.rtt_replied(server, now),
                    (Owner::Pool(_), Some(op)) => {
                        let crate::wire::RawOpMsg {
                            body,
                            top,
                            sequences,
                            ..
                        } = reply;
                        super::let_go(sequences);
                        self.attempt_replied(op, conn, body, top, now)
                    }
                    (Owner::Pool(_), None) => self.drained_reply(conn, &reply.body, now),
                },
                ConnectionEvent::Failed(failure) => {
                    // Read before the socket is removed (only a failure needs them).
                    let (handshaken, hello_service) =
                        self.sockets.get(&conn).map_or((false, None), |s| {
                            (s.machine.handshake().is_some(), s.machine.service_id())
                        });
                    let address = self.server(server).address.clone();
                    let error = failure.to_operation_error(&address);
                    let (pending, drain) = self
                        .remove_socket(conn)
                        .map_or((None, None), |s| (s.command, s.drain));
                    // Failed under a command: its unwritten rest must not reach the server.
                    self.closes.push_back(super::Close {
                        conn,
                        write_out: false,
                    });
                    if let Some(pending) = pending {
                        self.command_failed(pending, &error, now);
                    }
                    match (owner, drain) {
                        (Owner::Monitor, _) => self.monitor_check_failed(server, &error, now),
                        (Owner::Rtt, _) => self.rtt_failed(server, Some(conn), now),
                        (Owner::Pool(id), Some(drain)) => {
                            self.drain_failed(server, id, drain, &error, now)
                        }
                        (Owner::Pool(id), None) => {
                            let failure = (op, handshaken, hello_service);
                            self.pool_socket_failed(server, id, conn, failure, error, now)
                        }
                    }
                    return;
                }
            }
        }
    }

    /// LB-9, LB-11, TX-4 (2) (review38 L1): a cancelled operation's command was in flight on its
    /// pinned connection (a cursor's or a transaction's). Nobody would read the reply, and the
    /// connection would stay busy, so it closes as a connection lost with no operation on it: no
    /// SDAM error handling (no operation saw an error), its cursors send no `killCursors`, the
    /// pool gets it back once (closed, reason error), and a transaction pinned to it sees a
    /// network error on its next command.
    pub(super) fn pinned_attempt_cancelled(&mut self, conn: ConnId, now: Instant) {
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        socket.op = None;
        let (server, owner) = (socket.server, socket.owner);
        let Owner::Pool(id) = owner else {
            return;
        };
        let error = OperationError::network(
            NetworkErrorKind::Closed,
            NetworkPhase::AfterSend,
            socket.address.clone(),
        );
        self.close_socket(conn, false, now);
        self.pool_socket_failed(server, id, conn, (None, true, None), error, now);
    }

    /// A pooled connection failed.
    #[allow(clippy::too_many_arguments)]
    fn pool_socket_failed(
        &mut self,
        server: ServerId,
        id: ConnectionId,
        conn: ConnId,
        (op, handshaken, hello_service): (Option<(OpId, usize)>, bool, Option<ObjectId>),
        error: OperationError,
        now: Instant,
    ) {
        let mut context = self.error_context(server, id, handshaken);
        // LB-14, CM-5 (review38 L5): an error after the hello (during authentication) knows its
        // serviceId. The connection never completed its establishment, so it holds the pool's
        // base generation, not its service's: it is judged by the generation it would have
        // taken from that service's entry (what the pool gives it at establishment), else after
        // one clear of the service every later such error on it would be stale.
        let load_balanced = self.options.topology.load_balanced;
        if let (None, Some(service), true) = (context.service_id, hello_service, load_balanced) {
            context.service_id = Some(service);
            context.generation = self
                .pool(server)
                .map_or(0, |pool| pool.service_generation(&service));
        }
        // House rule 8 (review38 L1): an operation that no longer exists saw nothing; the
        // connection's own holders (its cursors, a transaction's pin) decide, as for an idle one.
        let op = op.filter(|(op_id, _)| self.ops.contains_key(op_id));
        match op {
            Some((op_id, slot)) => {
                self.application_error(server, &error, context, now);
                // LB-11: the cursor stays pinned, but will send no killCursors; its connection
                // stays checked out until the cursor is closed (LB `cursors.json`: "pinned
                // connections are not returned after an network error during getMore").
                let cursor = self.ops.get(&op_id).map(|o| o.request.cursor);
                let mut pinned = false;
                if let Some(CursorUse::GetMore(handle)) = cursor {
                    if let Some(cursor) = self.cursors.get_mut(&handle) {
                        cursor.pin.get_more_failed(&error);
                        pinned = cursor.conn == Some(conn);
                    }
                }
                // House rule 8: every other cursor on the connection (a transaction's cursors
                // share it) sends no killCursors either and checks it in by its pin when closed.
                let others: SmallVec<[CursorHandle; 2]> = self.cursors.on_conn(conn).collect();
                for handle in others {
                    if let Some(cursor) = self.cursors.get_mut(&handle) {
                        cursor.pin.get_more_failed(&error);
                    }
                }
                if let Some(op) = self.ops.get_mut(&op_id) {
                    op.slots[slot].conn = None;
                }
                // Otherwise the connection goes back (and is closed) before the retry rules run
                // (BP-27).
                if !pinned {
                    if let Some(pool) = self.pool_mut(server) {
                        pool.check_in(id, false, now);
                    }
                    self.flush_pool_events(server);
                }
                self.fail_attempt(op_id, slot, error, false, now);
            }
            // An established connection no operation was using (idle, or pinned between
            // operations) died: no SDAM error handling, as no operation saw it; the pool frees
            // its slot, and a cursor pinned to it will send no killCursors (LB-11).
            None if handshaken => {
                let pinned: SmallVec<[CursorHandle; 2]> = self.cursors.on_conn(conn).collect();
                for handle in pinned {
                    if let Some(cursor) = self.cursors.get_mut(&handle) {
                        cursor.pin.get_more_failed(&error);
                    }
                }
                if let Some(pool) = self.pool_mut(server) {
                    pool.handle_connection_lost(id, now);
                }
                self.schedule(Machine::Pool(server));
            }
            // The handshake (or authentication, AU-11) failed: the checkout that wanted the
            // connection fails with this error, then SDAM error handling (HS-9) may clear the
            // pool, failing the other waiters with PoolClearedError (CM-2); only then is the
            // connection closed and that checkout failed, so PoolClearedEvent comes first (CM-4,
            // LB-14).
            None => {
                if let Some(pool) = self.pool_mut(server) {
                    pool.hold_establishing_checkout(id);
                }
                self.application_error(server, &error, context, now);
                if let Some(pool) = self.pool_mut(server) {
                    pool.handle_establish_failed(id, error, now);
                }
                self.schedule(Machine::Pool(server));
            }
        }
    }

    /// SDAM error handling of an operation's error on `server`.
    pub(super) fn application_error(
        &mut self,
        server: ServerId,
        error: &OperationError,
        context: ErrorContext,
        now: Instant,
    ) {
        let address = self.server(server).address.clone();
        self.topology
            .input()
            .handle_application_error(&address, error, context, now);
        self.topology_touched(server);
    }

    /// What SDAM error handling needs to know about the pooled connection an error happened on:
    /// its generation and service (CM-1, CM-5) and whether its handshake had completed (HS-9,
    /// LB-14).
    pub(super) fn error_context(
        &self,
        server: ServerId,
        id: ConnectionId,
        handshake_completed: bool,
    ) -> ErrorContext {
        let (generation, service_id) = self
            .pool(server)
            .and_then(|p| p.connection_generation(id))
            .unwrap_or((0, None));
        ErrorContext {
            generation,
            service_id,
            handshake_completed,
        }
    }
}

/// A command was written on `conn` (`Engine::send_attempt`): its socket's turn, which then only
/// queues the bytes to write and registers the socket's deadline, runs here when it would be the
/// next one (issue 9; `next`: nothing on the worklist or served ahead of it,
/// `Engine::run_served`), the socket not queued, and no connection event waiting; whether it
/// did (else the socket goes on the worklist). The transmits stay in the order their sockets'
/// turns would give them.
#[inline(always)]
pub(super) fn socket_settled(
    next: bool,
    conn: ConnId,
    socket: &mut Socket,
    transmits: &mut VecDeque<ConnId>,
    timers: &mut Timers,
) -> bool {
    if !next || socket.queued || socket.machine.has_events() {
        return false;
    }
    // The steps of `Engine::drain_socket` for a socket with no event (review24 R6).
    list_transmit(conn, socket, transmits);
    register_deadline(conn, socket, timers);
    true
}

/// A socket's bytes to write join the transmit order once, when its turn finds them.
#[inline(always)]
fn list_transmit(conn: ConnId, socket: &mut Socket, transmits: &mut VecDeque<ConnId>) {
    if !socket.transmit_queued && socket.machine.has_transmit() {
        socket.transmit_queued = true;
        transmits.push_back(conn);
    }
}

/// The socket's next deadline, registered at the end of its turn.
#[inline(always)]
fn register_deadline(conn: ConnId, socket: &mut Socket, timers: &mut Timers) {
    let at = socket.machine.poll_timeout();
    timers.set(Machine::Socket(conn), &mut socket.timer, at);
}
