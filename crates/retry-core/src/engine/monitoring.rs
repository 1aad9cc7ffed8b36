//! The topology, its pools and the server monitors.
//!
//! The topology's actions start and stop monitors, ask for immediate checks and cancel them; a
//! changed description wakes the selections waiting for one (SS-16). A server that leaves the
//! topology hands its closed pool over: the engine keeps it, so that its waiters fail and its
//! in-use connections are closed under their operations, which then fail like any other attempt.
//! A pool's outputs are routed to the operation that asked (checkouts) or to the sockets (opening,
//! closing).

use alloc::boxed::Box;
use alloc::vec::Vec;
use bson::{doc, Document};

use super::EventFamilies;
use super::{pool_in, Engine};
use super::{ConnId, EngineEvent, MonitorState, OpId, Owner, ServerId};
use crate::address::ServerAddress;
use crate::connection::Request;
use crate::error::{NetworkErrorKind, NetworkPhase, OperationError};
use crate::handshake::HandshakeReply;
use crate::monitor::{Monitor, MonitorAction};
use crate::pool::{ConnectionId, Pool, PoolAction};
use crate::time::Instant;
use crate::topology::{AverageRtt, SdamEvent, ServerDescription, TopologyAction};
use crate::wire::{MsgFlags, RawOpMsg};

use super::worklist::{Machine, Served};

impl Engine {
    /// The topology was handed an input about `server`: its events and actions, and the server's
    /// pool (which SDAM may have marked ready or cleared), have work.
    pub(super) fn topology_touched(&mut self, server: ServerId) {
        self.schedule(Machine::Topology);
        self.schedule(Machine::Pool(server));
    }

    /// Routes the topology's events and actions.
    pub(super) fn drain_topology(&mut self, now: Instant) {
        let mut changed = false;
        while let Some(event) = self.topology.poll_event() {
            changed |= matches!(event, SdamEvent::TopologyDescriptionChanged { .. });
            if self.options.events.contains(EventFamilies::SDAM) {
                self.events.push_back(EngineEvent::Topology(event));
            }
        }
        while let Some(action) = self.topology.poll_action() {
            match action {
                TopologyAction::StartMonitoring(address) => {
                    let server = self.server_id(&address);
                    let monitor = Monitor::new(address, self.options.heartbeat_frequency, now)
                        .with_mode(
                            self.options.server_monitoring_mode,
                            self.options.handshake.metadata.is_faas(),
                            self.options.handshake.uses_hello(),
                        );
                    self.server_mut(server).monitor = Some(MonitorState {
                        monitor,
                        conn: None,
                        rtt_conn: None,
                        timer: None,
                        queued: false,
                    });
                    self.schedule(Machine::Monitor(server));
                }
                TopologyAction::StopMonitoring { address, pool } => {
                    self.server_removed(&address, pool, now)
                }
                TopologyAction::CheckNow(address) => {
                    if let Some(server) = self.server_ids.get(&address).copied() {
                        if let Some(state) = self.server_mut(server).monitor.as_mut() {
                            state.monitor.request_immediate_check(now);
                            self.schedule(Machine::Monitor(server));
                        }
                    }
                }
                TopologyAction::CancelCheck(address) => {
                    let Some(server) = self.server_ids.get(&address).copied() else {
                        continue;
                    };
                    let Some(state) = self.server_mut(server).monitor.as_mut() else {
                        continue;
                    };
                    let Some(conn) = state.conn.take() else {
                        continue;
                    };
                    // MO-14: the check in flight (a streamed one included) ends once, failed;
                    // the topology already knows (it asked), so it is not told again.
                    let error = OperationError::network(
                        NetworkErrorKind::Closed,
                        NetworkPhase::AfterSend,
                        address.clone(),
                    );
                    // The monitor's report (MO-11) is already in effect: the topology sent this
                    // `CancelCheck` after marking the server Unknown and clearing its pool, which
                    // MO-14 does once, so it is not applied again. The monitor's recheck of a
                    // server it knew runs on its own.
                    let report = state.monitor.handle_check_failed(&error, now);
                    debug_assert!(
                        !report
                            || self
                                .topology
                                .description()
                                .server(&address)
                                .is_some_and(
                                    |s| s.server_type == crate::topology::ServerType::Unknown
                                ),
                        "a cancelled check's failure is reported only for a server already Unknown"
                    );
                    self.schedule(Machine::Monitor(server));
                    self.close_socket(conn, false, now);
                }
            }
        }
        if changed {
            // A new description: every waiting selection looks again (SS-16), and any pool may
            // have been made ready or cleared.
            let waiting: Vec<OpId> = self.waiting.iter().copied().collect();
            for op in waiting {
                if let Some(operation) = self.ops.get_mut(&op) {
                    for slot in operation.slots.iter_mut().filter(|s| s.selection.is_some()) {
                        slot.wake = Some(now);
                    }
                    self.schedule(Machine::Operation(op));
                }
            }
            self.schedule_every_pool();
        }
    }

    /// The server left the topology (a replica-set member removed by the primary's `hosts`, a
    /// mongos gone, client close): its monitor stops, its closed pool fails its waiters, and every
    /// pooled socket of it is closed, failing the attempt on it (which the retry rules then
    /// handle) or the pin that holds it.
    pub(super) fn server_removed(
        &mut self,
        address: &ServerAddress,
        pool: Box<Pool>,
        now: Instant,
    ) {
        let Some(server) = self.server_ids.remove(address) else {
            return;
        };
        if self
            .last_server
            .as_ref()
            .is_some_and(|(_, id)| *id == server)
        {
            self.last_server = None;
        }
        if let Some(mut state) = self.server_mut(server).monitor.take() {
            self.timers
                .set(Machine::Monitor(server), &mut state.timer, None);
            for conn in [state.conn, state.rtt_conn].into_iter().flatten() {
                self.close_socket(conn, false, now);
            }
        }
        self.server_mut(server).retired_pool = Some(pool);
        self.server_mut(server).left = true;
        self.schedule(Machine::Pool(server));
        let conns: Vec<ConnId> = self.server(server).sockets.values().copied().collect();
        for conn in conns {
            if let Some(socket) = self.sockets.get_mut(&conn) {
                socket
                    .machine
                    .handle_closed(NetworkErrorKind::Closed, None, now);
                self.schedule(Machine::Socket(conn));
            }
        }
    }

    /// Routes a monitor's events and checks.
    pub(super) fn drain_monitor(&mut self, server: ServerId, now: Instant) {
        let address = self.server(server).address.clone();
        loop {
            let Some(state) = self.server_mut(server).monitor.as_mut() else {
                return;
            };
            if let Some(event) = state.monitor.poll_event() {
                if self.options.events.contains(EventFamilies::SDAM) {
                    self.events.push_back(EngineEvent::Heartbeat {
                        address: address.clone(),
                        event,
                    });
                }
                continue;
            }
            if !state.monitor.is_streaming() {
                // MO-7, MO-12: no RTT connection unless streaming.
                if let Some(rtt) = state.rtt_conn.take() {
                    self.close_socket(rtt, false, now);
                    continue;
                }
            }
            let action = state.monitor.poll_action();
            let conn = state.conn;
            let rtt_conn = state.rtt_conn;
            match action {
                None => return,
                Some(MonitorAction::Check) => self.start_monitor_check(server, conn, now),
                Some(MonitorAction::Await(hello)) => match conn {
                    Some(conn) => self.send_monitor_hello(server, conn, hello, true, now),
                    None => self.monitor_check_failed(server, &self.unbuildable(server), now),
                },
                Some(MonitorAction::MeasureRtt) => match rtt_conn {
                    Some(rtt) => {
                        let hello = self.polling_hello(rtt);
                        self.send_monitor_hello(server, rtt, hello, false, now);
                    }
                    None => match self.open_socket(server, Owner::Rtt, 0, now) {
                        Some(rtt) => {
                            if let Some(state) = self.server_mut(server).monitor.as_mut() {
                                state.rtt_conn = Some(rtt);
                            }
                        }
                        None => self.rtt_failed(server, None, now),
                    },
                },
            }
        }
    }

    /// A polling check: `hello` on the open monitoring connection, or a new connection whose
    /// handshake is the check (MO-1).
    fn start_monitor_check(&mut self, server: ServerId, conn: Option<ConnId>, now: Instant) {
        let ready = conn
            .and_then(|c| self.sockets.get(&c))
            .is_some_and(|s| s.machine.handshake().is_some());
        match (conn, ready) {
            (Some(conn), true) => {
                let hello = self.polling_hello(conn);
                self.send_monitor_hello(server, conn, hello, false, now);
            }
            // The handshake is under way; its completion ends the check.
            (Some(_), false) => {}
            (None, _) => match self.open_socket(server, Owner::Monitor, 0, now) {
                Some(conn) => {
                    if let Some(state) = self.server_mut(server).monitor.as_mut() {
                        state.conn = Some(conn);
                    }
                }
                None => {
                    let error = self.unbuildable(server);
                    self.monitor_check_failed(server, &error, now);
                }
            },
        }
    }

    /// MO-1, MO-12: the monitoring connection's handshake completed: its reply is the result of
    /// the check that opened the connection (no second `hello` follows) and its round trip is the
    /// check's RTT sample.
    pub(super) fn monitor_handshake_completed(
        &mut self,
        server: ServerId,
        reply: &HandshakeReply,
        now: Instant,
    ) {
        let Some(state) = self.server_mut(server).monitor.as_mut() else {
            return;
        };
        let round_trip = reply.description.average_rtt.get().unwrap_or_default();
        let version = reply.description.topology_version;
        let Some(average) =
            state
                .monitor
                .handle_handshake(version, reply.hello_ok, round_trip, now)
        else {
            return;
        };
        self.schedule(Machine::Monitor(server));
        let mut description = reply.description.clone();
        description.average_rtt = AverageRtt::from_duration(average);
        self.topology.input().handle_handshake(description, now);
        self.topology_touched(server);
    }

    /// MO-2: an application connection's handshake describes its server as a monitor's reply
    /// does. Its round trip is not an RTT sample: the description carries the monitor's average
    /// (the handshake's own round trip while the monitor has none). A failed handshake goes
    /// through SDAM error handling instead, where HS-9's overload errors leave the server as it
    /// is.
    pub(super) fn pool_handshake_completed(
        &mut self,
        server: ServerId,
        reply: &HandshakeReply,
        now: Instant,
    ) {
        let mut description = reply.description.clone();
        let monitored = self
            .server(server)
            .monitor
            .as_ref()
            .and_then(|state| state.monitor.average_rtt());
        if let Some(average) = monitored {
            description.average_rtt = AverageRtt::from_duration(average);
        }
        self.topology.input().handle_handshake(description, now);
        self.topology_touched(server);
    }

    /// HS-3, MO-10: a polling `hello` (or legacy hello when the server did not say `helloOk`),
    /// without the handshake's arguments.
    fn polling_hello(&self, conn: ConnId) -> Document {
        let hello_ok = self
            .sockets
            .get(&conn)
            .and_then(|s| s.machine.handshake())
            .is_some_and(|h| h.hello_ok);
        if hello_ok || self.options.handshake.uses_hello() {
            doc! { "hello": 1 }
        } else {
            doc! { "isMaster": 1 }
        }
    }

    /// Sends a monitoring `hello` on `conn` (the monitor's or its RTT connection): a polling one
    /// bounded by `connectTimeoutMS` (MO-4), or an awaitable one with `exhaustAllowed` (MO-9),
    /// bounded per reply by the monitoring socket's timeout. No `lsid`, `$clusterTime` or
    /// `maxTimeMS` (MO-3); the declared Stable API version's fields, as on every command
    /// (versioned-api spec; the handshake carries them too, HS-2).
    fn send_monitor_hello(
        &mut self,
        server: ServerId,
        conn: ConnId,
        mut hello: Document,
        awaited: bool,
        now: Instant,
    ) {
        if let Some(api) = &self.api {
            api.insert_into(&mut hello);
        }
        hello.insert("$db", "admin");
        let mut request = Request::new(hello);
        request.exhaust_allowed = awaited;
        if !awaited {
            request.deadline = Some(self.options.connect_timeout)
                .filter(|t| !t.is_zero())
                .map(|t| now.saturating_add(t));
        }
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        let owner = socket.owner;
        let sent = socket.machine.send_command(request, now);
        self.schedule(Machine::Socket(conn));
        if sent.is_err() {
            match owner {
                Owner::Rtt => self.rtt_failed(server, Some(conn), now),
                _ => {
                    let address = self.server(server).address.clone();
                    let error = OperationError::network(
                        NetworkErrorKind::Io,
                        NetworkPhase::BeforeSend,
                        address,
                    );
                    self.monitor_check_failed(server, &error, now);
                }
            }
        }
    }

    /// A reply on the monitoring connection: a polling check's, or one of the stream's (MO-9).
    /// A failed reply (`ok: 0`) closes the connection (MO-11).
    pub(super) fn monitor_replied(
        &mut self,
        server: ServerId,
        conn: ConnId,
        reply: &RawOpMsg,
        now: Instant,
    ) {
        // A heartbeat's reply is read as a document: SDAM reads most of its fields.
        let body = super::raw_reply::to_document(&reply.body);
        let address = self.server(server).address.clone();
        let Some(state) = self.server_mut(server).monitor.as_mut() else {
            return;
        };
        let streaming = state.monitor.is_streaming();
        let average = if streaming {
            let more_to_come = reply.flags.contains(MsgFlags::MORE_TO_COME);
            state
                .monitor
                .handle_streamed_reply(&body, more_to_come, now)
        } else {
            state.monitor.handle_check_succeeded(&body, now)
        };
        // MO-11 (1): a failed check (`ok: 0`) closes the monitoring connection, polling or
        // streaming; the next check opens a new one.
        if !crate::reply::is_ok(&body) {
            state.conn = None;
            self.close_socket(conn, false, now);
        }
        self.schedule(Machine::Monitor(server));
        self.topology
            .input()
            .handle_hello(&address, &body, average.unwrap_or_default(), now);
        self.topology_touched(server);
    }

    /// MO-12: the RTT connection's handshake completed; its round trip is a sample.
    pub(super) fn rtt_measured(
        &mut self,
        server: ServerId,
        description: &ServerDescription,
        now: Instant,
    ) {
        if let Some(state) = self.server_mut(server).monitor.as_mut() {
            let round_trip = description.average_rtt.get().unwrap_or_default();
            state.monitor.handle_rtt_sample(round_trip, now);
            self.schedule(Machine::Monitor(server));
        }
    }

    /// MO-12: the RTT connection's `hello` came back (its reply is ignored).
    pub(super) fn rtt_replied(&mut self, server: ServerId, now: Instant) {
        if let Some(state) = self.server_mut(server).monitor.as_mut() {
            state.monitor.handle_rtt_reply(now);
            self.schedule(Machine::Monitor(server));
        }
    }

    /// MO-12: the RTT connection failed (or could not be built): it is closed, the topology is
    /// not touched, the statistics are kept; a new one is opened a heartbeat later.
    pub(super) fn rtt_failed(&mut self, server: ServerId, conn: Option<ConnId>, now: Instant) {
        let Some(state) = self.server_mut(server).monitor.as_mut() else {
            return;
        };
        if conn.is_none() || state.rtt_conn == conn {
            state.rtt_conn = None;
        }
        state.monitor.handle_rtt_failed(now);
        self.schedule(Machine::Monitor(server));
        if let Some(conn) = conn {
            self.close_socket(conn, false, now);
        }
    }

    /// A monitor's check failed: its socket goes, and the topology marks the server Unknown and
    /// clears its pool at once (MO-11); the monitor then rechecks a server that was known once.
    pub(super) fn monitor_check_failed(
        &mut self,
        server: ServerId,
        error: &OperationError,
        now: Instant,
    ) {
        let Some(conn) = self
            .server_mut(server)
            .monitor
            .as_mut()
            .map(|s| s.conn.take())
        else {
            return;
        };
        if let Some(conn) = conn {
            self.close_socket(conn, false, now);
        }
        let Some(state) = self.server_mut(server).monitor.as_mut() else {
            return;
        };
        let give_up = state.monitor.handle_check_failed(error, now);
        self.schedule(Machine::Monitor(server));
        if give_up {
            let address = self.server(server).address.clone();
            self.topology
                .input()
                .handle_check_failed(&address, error, now);
            self.topology_touched(server);
        }
    }

    /// Moves a pool's events to the engine's queue (BP-27: before the operation events that
    /// follow). When nobody subscribed to the pool family its pools record none (issue 9:
    /// `Topology::set_pool_events`): nothing to look up.
    #[inline(always)]
    pub(super) fn move_pool_events(&mut self, server: ServerId) {
        if self.options.events.contains(EventFamilies::POOL) {
            self.publish_pool_events(server);
        }
        debug_assert!(
            self.options.events.contains(EventFamilies::POOL)
                || !self.pool(server).is_some_and(Pool::has_events),
            "a pool records events nobody publishes"
        );
    }

    /// [`Engine::move_pool_events`] for a subscriber.
    #[inline(never)]
    fn publish_pool_events(&mut self, server: ServerId) {
        let address = self.server(server).address.clone();
        while let Some(event) = self.pool_mut(server).and_then(|p| p.poll_event()) {
            self.events.push_back(EngineEvent::Pool {
                address: address.clone(),
                event,
            });
        }
    }

    /// Moves a pool's events to the engine's, so that they come out in causal order with the
    /// operation events that follow (BP-27).
    pub(super) fn flush_pool_events(&mut self, server: ServerId) {
        self.move_pool_events(server);
        // Issue 9: a member's pool with no action to route and its deadline registered as it is
        // would have a turn on the worklist that does nothing (`drain_pool`, `refresh_timer`).
        let entry = &self.servers[server.0 as usize];
        let settled = entry.retired_pool.is_none()
            && self
                .pool(server)
                .is_some_and(|p| !p.has_actions() && p.poll_timeout() == entry.pool_timer);
        if !settled {
            self.schedule(Machine::Pool(server));
        }
    }

    /// Review item 12: a retired pool with nothing left to say and no connections (none in the
    /// pool, no pooled socket of it) is dropped, so servers that leave do not keep pools forever.
    fn drop_empty_retired_pool(&mut self, server: ServerId) {
        // A member's pool (every drain of a live server) is never dropped: no index search.
        let empty = self.servers[server.0 as usize]
            .retired_pool
            .as_ref()
            .is_some_and(|p| p.total_connections() == 0);
        if !empty {
            return;
        }
        if !self.server(server).sockets.is_empty() {
            return;
        }
        let entry = &mut self.servers[server.0 as usize];
        entry.retired_pool = None;
        self.timers
            .set(Machine::Pool(server), &mut entry.pool_timer, None);
    }

    /// Routes a pool's events and actions.
    pub(super) fn drain_pool(&mut self, server: ServerId, now: Instant) {
        let publish = self.options.events.contains(EventFamilies::POOL);
        let address = publish.then(|| self.server(server).address.clone());
        loop {
            let Some(pool) = self.pool_mut(server) else {
                return;
            };
            match &address {
                Some(address) => {
                    if let Some(event) = pool.poll_event() {
                        self.events.push_back(EngineEvent::Pool {
                            address: address.clone(),
                            event,
                        });
                        continue;
                    }
                }
                // Issue 9: nobody listens; no address copies.
                None => pool.discard_events(),
            }
            let Some(action) = pool.poll_action() else {
                self.drop_empty_retired_pool(server);
                return;
            };
            match action {
                PoolAction::Establish { connection } => {
                    let generation = pool.generation();
                    if self
                        .open_socket(server, Owner::Pool(connection), generation, now)
                        .is_none()
                    {
                        // The checkout that wanted it fails (a handshake error: nothing was sent).
                        let error = self.unbuildable(server);
                        if let Some(pool) = self.pool_mut(server) {
                            pool.handle_establish_failed(connection, error, now);
                        }
                    }
                }
                PoolAction::Close { connection, reason } => {
                    if let Some(conn) = self.pool_socket(server, connection) {
                        // WP-6, review39 M3: a healthy connection let go (stale, idle, pool
                        // closed) has the bytes its caller took written out; a failed one not.
                        let write_out = reason != crate::pool::CloseReason::Error;
                        self.close_socket(conn, write_out, now);
                    }
                }
                // CM-4: the attempt on it fails like a socket the peer closed, and its failure
                // checks the connection in; one no attempt is using goes back at once.
                PoolAction::Interrupt { connection } => {
                    let conn = self.pool_socket(server, connection);
                    let busy = conn
                        .and_then(|c| self.sockets.get(&c))
                        .is_some_and(|s| s.op.is_some());
                    if let Some(conn) = conn {
                        self.close_socket(conn, false, now);
                    }
                    if !busy {
                        if let Some(pool) = self.pool_mut(server) {
                            pool.check_in(connection, false, now);
                        }
                    }
                }
                PoolAction::CheckedOut {
                    checkout,
                    connection,
                } => {
                    let waiting = self.checkouts.remove(&(server, checkout));
                    self.checked_out(server, waiting, connection, now);
                }
                PoolAction::CheckoutFailed { checkout, error } => {
                    if let Some((op, slot)) = self.checkouts.remove(&(server, checkout)) {
                        if let Some(operation) = self.ops.get_mut(&op) {
                            operation.slots[slot].checkout = None;
                        }
                        let error = error.into_operation_error(&self.server(server).address);
                        self.fail_attempt(op, slot, error, false, now);
                    }
                }
            }
        }
    }

    /// A checkout's connection, for the operation slot that waits for it (`None`: its operation
    /// is gone, cancelled or finished).
    fn checked_out(
        &mut self,
        server: ServerId,
        waiting: Option<(OpId, usize)>,
        connection: ConnectionId,
        now: Instant,
    ) {
        match (waiting, self.pool_socket(server, connection)) {
            (Some((op, slot)), Some(conn)) => self.send_attempt(op, slot, conn, now),
            // Its operation is gone (cancelled): the connection goes straight back.
            (None, _) => {
                if let Some(pool) = self.pool_mut(server) {
                    pool.check_in(connection, true, now);
                }
            }
            // The socket is gone: the connection is given back to be closed and the
            // attempt fails before sending.
            (Some((op, slot)), None) => {
                if let Some(pool) = self.pool_mut(server) {
                    pool.check_in(connection, false, now);
                }
                self.flush_pool_events(server);
                if let Some(operation) = self.ops.get_mut(&op) {
                    operation.slots[slot].checkout = None;
                }
                let error = OperationError::network(
                    NetworkErrorKind::Closed,
                    NetworkPhase::BeforeSend,
                    self.server(server).address.clone(),
                );
                self.fail_attempt(op, slot, error, false, now);
            }
        }
    }

    /// The pool turn of a checkout served at once (`Engine::check_out`, issue 9), run where the
    /// worklist would have run it: first after the turn that checked out. The same steps as
    /// [`Engine::drain_pool`] with the checkout's answer as the pool's first action: its events,
    /// the answer, then whatever else the pool has to say and its deadline.
    pub(super) fn run_served(&mut self, served: Served, now: Instant) {
        let Served {
            server,
            checkout,
            connection,
            op,
            slot,
        } = served;
        self.unqueue(Machine::Pool(server));
        self.move_pool_events(server);
        // As `checkouts` tells the pool's turn: the slot still waits for this checkout unless
        // its operation finished or gave the checkout up meanwhile. Issue 9: the send asks that
        // with its own lookup of the operation.
        let key = Some((server, checkout));
        let sent = match self.pool_socket(server, connection) {
            Some(conn) => self.send_checked_out(op, slot, conn, key, now),
            None => false,
        };
        if !sent {
            let waiting = self
                .ops
                .get(&op)
                .and_then(|o| o.slots.get(slot))
                .is_some_and(|s| s.checkout == key)
                .then_some((op, slot));
            self.checked_out(server, waiting, connection, now);
        }
        // Issue 9: one look at the pool for its output and its deadline.
        let (output, at) = pool_in(&mut self.servers, &mut self.topology, server)
            .map_or((false, None), |p| (p.has_output(), p.poll_timeout()));
        let entry = &mut self.servers[server.0 as usize];
        match entry.retired_pool.is_some() || output {
            true => {
                self.drain_pool(server, now);
                self.refresh_pool_timer(server);
            }
            false => self
                .timers
                .set(Machine::Pool(server), &mut entry.pool_timer, at),
        }
    }
}
