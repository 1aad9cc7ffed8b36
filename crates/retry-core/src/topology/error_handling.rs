//! SDAM error handling (`handleError`): what an application operation's error does to the
//! topology and to its server's pool.
//!
//! Rules, in order: an error from a connection older than the pool (its generation is lower) or
//! carrying a topologyVersion no newer than the server's is stale and changes nothing. A
//! state-change error ("not writable primary", "node is recovering") marks the server Unknown,
//! keeping the error's topologyVersion, asks for an immediate check, and clears the pool only when
//! the node is shutting down. A network error, or any error before the handshake completed, marks
//! the server Unknown and clears its pool, unless it carries `SystemOverloadedError` (HS-9, CM-6)
//! or is a timeout on an established connection. In load-balanced mode nothing is marked Unknown
//! and only the failing `serviceId`'s connections are cleared (LB-14, LB-15).

use alloc::string::ToString;

use bson::oid::ObjectId;

use super::{
    CheckError, ServerDescription, Topology, TopologyAction, TopologyType, TopologyVersion,
};
use crate::address::ServerAddress;
use crate::error::{ErrorKind, Labels, NetworkErrorKind, OperationError};
use crate::time::Instant;

/// The kinds of state-change error: the server is reachable but not in the state the client
/// thought (SDAM "not writable primary" and "node is recovering").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StateChange {
    /// Codes 10107, 13435, 10058, or no code and "not master" in the message.
    NotWritablePrimary,
    /// Codes 11602, 13436, 189, or no code and "node is recovering" or "not master or
    /// secondary" in the message.
    NodeRecovering,
    /// Codes 11600 and 91: a recovering node that is shutting down, whose connections are all
    /// about to close.
    NodeShuttingDown,
}

impl StateChange {
    /// Classifies one error `code` and message. A code decides alone; the message is read only
    /// when there is no code (SDAM).
    pub fn classify(code: Option<i32>, message: &str) -> Option<StateChange> {
        match code {
            Some(11600 | 91) => Some(StateChange::NodeShuttingDown),
            Some(11602 | 13436 | 189) => Some(StateChange::NodeRecovering),
            Some(10107 | 13435 | 10058) => Some(StateChange::NotWritablePrimary),
            Some(_) => None,
            None if message.contains("node is recovering")
                || message.contains("not master or secondary") =>
            {
                Some(StateChange::NodeRecovering)
            }
            None if message.contains("not master") => Some(StateChange::NotWritablePrimary),
            None => None,
        }
    }

    /// The state change `error` reports, if any: the command error's code and message, else its
    /// `writeConcernError`'s. `writeErrors` are never read (SDAM).
    pub fn of(error: &OperationError) -> Option<StateChange> {
        let ErrorKind::Server(server) = &error.kind else {
            return None;
        };
        let write_concern = server.write_concern_error.as_ref();
        // A reply that is `ok: 1` with only a write concern error copies the write concern
        // error's message to the top level; it has no top-level code to classify.
        let top_level = (server.code.is_some() || write_concern.is_none())
            .then(|| StateChange::classify(server.code, &server.message))
            .flatten();
        top_level.or_else(|| write_concern.and_then(|w| StateChange::classify(w.code, &w.message)))
    }
}

/// Where an application error happened: the facts about its connection that SDAM error handling
/// needs besides the error itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ErrorContext {
    /// The generation of the connection the error happened on (CM-1; in load-balanced mode, its
    /// service's generation when it was established, CM-5).
    pub generation: u32,
    /// The connection's `serviceId`, known once its handshake completed (load-balanced mode).
    pub service_id: Option<ObjectId>,
    /// Whether the connection had completed its handshake (hello and authentication).
    pub handshake_completed: bool,
}

/// What [`Topology::handle_application_error`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorHandling {
    /// The error came from an older pool generation or carried a topologyVersion no newer than
    /// the server's: nothing changed.
    Stale,
    /// The error does not concern SDAM (an ordinary command error, a timeout on an established
    /// connection, an overload-labelled establishment error, a server no longer in the topology):
    /// nothing changed.
    Ignored,
    /// The error was applied.
    Applied {
        /// Whether the server was marked Unknown (never in load-balanced mode).
        marked_unknown: bool,
        /// Whether its pool (or its service's connections) was cleared.
        pool_cleared: bool,
    },
}

impl Topology {
    /// SDAM `handleError` for `error`, which an application operation got from `address` on the
    /// connection `context` describes, at `now` (see the module docs for the rules).
    ///
    /// Publishes the resulting SDAM events, clears the pool in the same step, and queues
    /// [`TopologyAction::CheckNow`] after a state-change error or [`TopologyAction::CancelCheck`]
    /// after a network error (neither in load-balanced mode, which has no monitors).
    pub fn handle_application_error(
        &mut self,
        address: &ServerAddress,
        error: &OperationError,
        context: ErrorContext,
        now: Instant,
    ) -> ErrorHandling {
        let load_balanced = self.description.topology_type == TopologyType::LoadBalanced;
        let (Some(server), Some(pool)) = (self.description.server(address), self.pool(address))
        else {
            return ErrorHandling::Ignored;
        };
        if self.closed {
            return ErrorHandling::Ignored;
        }
        let pool_generation = match context.service_id {
            Some(service) if load_balanced => pool.service_generation(&service),
            _ => pool.generation(),
        };
        let topology_version = error
            .server_error()
            .and_then(|e| TopologyVersion::from_reply(&e.raw));
        let order =
            TopologyVersion::compare(server.topology_version.as_ref(), topology_version.as_ref());
        if context.generation < pool_generation || order.is_ge() {
            return ErrorHandling::Stale;
        }
        let cause = error.to_string();
        // LB-14: before the handshake no serviceId is known, so nothing can be cleared.
        let service_id = context.service_id.filter(|_| load_balanced);
        if let Some(change) = StateChange::of(error) {
            if !load_balanced {
                self.mark_unknown(address, &cause, topology_version, now);
                self.actions
                    .push_back(TopologyAction::CheckNow(address.clone()));
            }
            let clear =
                change == StateChange::NodeShuttingDown && (!load_balanced || service_id.is_some());
            if clear {
                self.clear_pool(address, service_id, false, &cause, now);
            }
            return ErrorHandling::Applied {
                marked_unknown: !load_balanced,
                pool_cleared: clear,
            };
        }
        // A network error, or any error before the handshake completed; a timeout on an
        // established connection may only mean a slow operation.
        let applies = match &error.kind {
            ErrorKind::Network(n) => {
                !context.handshake_completed || n.kind != NetworkErrorKind::Timeout
            }
            _ => !context.handshake_completed,
        };
        if !applies || error.has_label(Labels::SYSTEM_OVERLOADED) {
            return ErrorHandling::Ignored;
        }
        if load_balanced {
            if service_id.is_none() {
                return ErrorHandling::Ignored;
            }
            self.clear_pool(address, service_id, false, &cause, now);
            return ErrorHandling::Applied {
                marked_unknown: false,
                pool_cleared: true,
            };
        }
        self.mark_unknown(address, &cause, None, now);
        self.clear_pool(address, None, false, &cause, now);
        self.actions
            .push_back(TopologyAction::CancelCheck(address.clone()));
        ErrorHandling::Applied {
            marked_unknown: true,
            pool_cleared: true,
        }
    }

    /// Replaces the server's description with an Unknown one carrying the error (and a
    /// state-change error's topologyVersion), through the update rules.
    fn mark_unknown(
        &mut self,
        address: &ServerAddress,
        cause: &str,
        topology_version: Option<TopologyVersion>,
        now: Instant,
    ) {
        let error = CheckError::Application(cause.into());
        let unknown = ServerDescription {
            topology_version,
            ..ServerDescription::from_check_error(address.clone(), error, now)
        };
        self.apply_description(unknown, now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NetworkPhase;
    use crate::pool::{PoolEvent, PoolState};
    use crate::topology::fixtures::{addr, drain, primary, topology};
    use crate::topology::{ServerType, TopologySettings};
    use bson::doc;
    use core::time::Duration;

    const AFTER_HANDSHAKE: ErrorContext = ErrorContext {
        generation: 0,
        service_id: None,
        handshake_completed: true,
    };

    fn command_error(reply: bson::Document) -> OperationError {
        OperationError::from_reply(&reply, &addr("a")).expect("an error reply")
    }

    fn network(kind: NetworkErrorKind, phase: NetworkPhase) -> OperationError {
        OperationError::network(kind, phase, addr("a"))
    }

    /// A replica set whose primary `a` reported `topologyVersion {processId: 1, counter: 5}`.
    fn with_primary() -> Topology {
        let mut t = topology(&["a"], Some("rs"));
        let mut reply = primary("rs", &["a"]);
        reply.insert(
            "topologyVersion",
            doc! {"processId": ObjectId::from_bytes([1; 12]), "counter": 5_i64},
        );
        t.handle_hello(&addr("a"), &reply, Duration::ZERO, Instant::ZERO);
        drain(&mut t);
        t
    }

    fn server_type(t: &Topology) -> ServerType {
        t.description().servers[0].server_type
    }

    #[test]
    fn a_code_alone_decides_and_the_message_counts_only_without_one() {
        let cases = [
            (Some(91), "", Some(StateChange::NodeShuttingDown)),
            (Some(11600), "", Some(StateChange::NodeShuttingDown)),
            (Some(189), "", Some(StateChange::NodeRecovering)),
            (Some(10058), "", Some(StateChange::NotWritablePrimary)),
            (Some(1), "not master", None),
            (None, "not master", Some(StateChange::NotWritablePrimary)),
            (
                None,
                "not master or secondary",
                Some(StateChange::NodeRecovering),
            ),
            (
                None,
                "node is recovering",
                Some(StateChange::NodeRecovering),
            ),
            (None, "Not Master", None),
        ];
        for (code, message, expected) in cases {
            assert_eq!(
                StateChange::classify(code, message),
                expected,
                "{code:?} {message:?}"
            );
        }
    }

    #[test]
    fn a_write_concern_error_is_read_but_write_errors_are_not() {
        let wce = command_error(doc! {"ok": 1, "writeConcernError": {"code": 91, "errmsg": "x"}});
        assert_eq!(StateChange::of(&wce), Some(StateChange::NodeShuttingDown));
        let top_level_first = command_error(doc! {
            "ok": 0, "code": 10107, "errmsg": "x",
            "writeConcernError": {"code": 91, "errmsg": "y"},
        });
        assert_eq!(
            StateChange::of(&top_level_first),
            Some(StateChange::NotWritablePrimary)
        );
        let write_errors = doc! {"ok": 1, "writeErrors": [{"code": 10107, "errmsg": "not master"}]};
        assert!(OperationError::from_reply(&write_errors, &addr("a")).is_none());
        assert_eq!(
            StateChange::of(&network(NetworkErrorKind::Reset, NetworkPhase::AfterSend)),
            None
        );
    }

    #[test]
    fn a_not_writable_primary_error_marks_unknown_asks_for_a_check_and_keeps_the_pool() {
        let mut t = with_primary();
        let error = command_error(doc! {"ok": 0, "code": 10107, "errmsg": "not primary"});
        let handled =
            t.handle_application_error(&addr("a"), &error, AFTER_HANDSHAKE, Instant::ZERO);
        assert_eq!(
            handled,
            ErrorHandling::Applied {
                marked_unknown: true,
                pool_cleared: false
            }
        );
        assert_eq!(server_type(&t), ServerType::Unknown);
        assert_eq!(
            t.description().topology_type,
            TopologyType::ReplicaSetNoPrimary
        );
        assert!(matches!(t.poll_action(), Some(TopologyAction::CheckNow(a)) if a == addr("a")));
        assert_eq!(t.pool(&addr("a")).map(|p| p.generation()), Some(0));
    }

    #[test]
    fn a_state_change_error_keeps_its_topology_version_and_an_equal_one_is_stale() {
        let mut t = with_primary();
        let tv =
            |counter: i64| doc! {"processId": ObjectId::from_bytes([1; 12]), "counter": counter};
        let equal = command_error(doc! {"ok": 0, "code": 91, "topologyVersion": tv(5)});
        assert_eq!(
            t.handle_application_error(&addr("a"), &equal, AFTER_HANDSHAKE, Instant::ZERO),
            ErrorHandling::Stale
        );
        assert_eq!(server_type(&t), ServerType::RsPrimary);
        let newer = command_error(doc! {"ok": 0, "code": 91, "topologyVersion": tv(6)});
        let handled =
            t.handle_application_error(&addr("a"), &newer, AFTER_HANDSHAKE, Instant::ZERO);
        assert_eq!(
            handled,
            ErrorHandling::Applied {
                marked_unknown: true,
                pool_cleared: true
            }
        );
        let a = &t.description().servers[0];
        assert_eq!(a.topology_version.map(|v| v.counter), Some(6));
        assert!(a
            .error
            .as_ref()
            .is_some_and(|e| e.to_string().contains("91")));
        assert_eq!(t.pool(&addr("a")).map(|p| p.generation()), Some(1));
    }

    #[test]
    fn an_error_from_an_older_pool_generation_is_stale() {
        let mut t = with_primary();
        let reset = network(NetworkErrorKind::Reset, NetworkPhase::AfterSend);
        t.handle_application_error(&addr("a"), &reset, AFTER_HANDSHAKE, Instant::ZERO);
        assert_eq!(t.pool(&addr("a")).map(|p| p.generation()), Some(1));
        t.handle_hello(
            &addr("a"),
            &primary("rs", &["a"]),
            Duration::ZERO,
            Instant::ZERO,
        );
        assert_eq!(
            t.handle_application_error(&addr("a"), &reset, AFTER_HANDSHAKE, Instant::ZERO),
            ErrorHandling::Stale
        );
        assert_eq!(server_type(&t), ServerType::RsPrimary);
    }

    #[test]
    fn hs_9_labelled_establishment_errors_are_ignored_but_auth_errors_are_not() {
        let before = ErrorContext {
            handshake_completed: false,
            ..AFTER_HANDSHAKE
        };
        for phase in [NetworkPhase::Connect, NetworkPhase::Handshake] {
            let mut t = with_primary();
            let timeout = network(NetworkErrorKind::Timeout, phase);
            assert_eq!(
                t.handle_application_error(&addr("a"), &timeout, before, Instant::ZERO),
                ErrorHandling::Ignored
            );
            assert_eq!(server_type(&t), ServerType::RsPrimary);
            assert_eq!(t.pool(&addr("a")).map(|p| p.generation()), Some(0));
        }
        // Not labelled: a DNS failure while connecting, a network error during authentication,
        // and a command error before the handshake completed (CM-6).
        let unlabelled = [
            network(NetworkErrorKind::Dns, NetworkPhase::Connect),
            network(NetworkErrorKind::Reset, NetworkPhase::Authentication),
            command_error(doc! {"ok": 0, "code": 18, "errmsg": "auth failed"}),
        ];
        for error in unlabelled {
            let mut t = with_primary();
            let handled = t.handle_application_error(&addr("a"), &error, before, Instant::ZERO);
            assert_eq!(
                handled,
                ErrorHandling::Applied {
                    marked_unknown: true,
                    pool_cleared: true
                },
                "{error}"
            );
            assert!(matches!(
                t.poll_action(),
                Some(TopologyAction::CancelCheck(_))
            ));
        }
    }

    #[test]
    fn after_the_handshake_timeouts_and_ordinary_command_errors_are_ignored() {
        let mut t = with_primary();
        let ignored = [
            network(NetworkErrorKind::Timeout, NetworkPhase::AfterSend),
            command_error(doc! {"ok": 0, "code": 11000, "errmsg": "duplicate key"}),
            OperationError::timeout(None),
        ];
        for error in ignored {
            assert_eq!(
                t.handle_application_error(&addr("a"), &error, AFTER_HANDSHAKE, Instant::ZERO),
                ErrorHandling::Ignored,
                "{error}"
            );
        }
        let closed = network(NetworkErrorKind::Closed, NetworkPhase::BeforeSend);
        assert!(matches!(
            t.handle_application_error(&addr("a"), &closed, AFTER_HANDSHAKE, Instant::ZERO),
            ErrorHandling::Applied { .. }
        ));
        assert_eq!(
            t.description().topology_type,
            TopologyType::ReplicaSetNoPrimary
        );
    }

    #[test]
    fn lb_15_load_balanced_errors_clear_only_their_service_and_mark_nothing() {
        let settings = TopologySettings {
            load_balanced: true,
            ..TopologySettings::new(alloc::vec![addr("a")])
        };
        let mut t = Topology::new(settings, Instant::ZERO).expect("valid");
        drain(&mut t);
        let service = ObjectId::from_bytes([7; 12]);
        let other = ObjectId::from_bytes([8; 12]);
        let context = ErrorContext {
            service_id: Some(service),
            ..AFTER_HANDSHAKE
        };
        let shutdown = command_error(doc! {"ok": 0, "code": 91});
        assert_eq!(
            t.handle_application_error(&addr("a"), &shutdown, context, Instant::ZERO),
            ErrorHandling::Applied {
                marked_unknown: false,
                pool_cleared: true
            }
        );
        let reset = network(NetworkErrorKind::Reset, NetworkPhase::AfterSend);
        // The same connection's next error is stale: its service moved on (LB-15).
        assert_eq!(
            t.handle_application_error(&addr("a"), &reset, context, Instant::ZERO),
            ErrorHandling::Stale
        );
        let pool = t.pool_mut(&addr("a")).expect("pool");
        assert_eq!(pool.service_generation(&service), 1);
        assert_eq!(pool.service_generation(&other), 0);
        assert_eq!(pool.generation(), 0);
        assert_eq!(pool.state(), PoolState::Ready);
        assert!(core::iter::from_fn(|| pool.poll_event()).any(|e| e
            == PoolEvent::PoolCleared {
                service_id: Some(service),
                interrupt_in_use_connections: false
            }));
        // LB-14: before the handshake there is no serviceId, so nothing is cleared.
        let before = ErrorContext {
            service_id: None,
            handshake_completed: false,
            ..AFTER_HANDSHAKE
        };
        let dns = network(NetworkErrorKind::Dns, NetworkPhase::Connect);
        assert_eq!(
            t.handle_application_error(&addr("a"), &dns, before, Instant::ZERO),
            ErrorHandling::Ignored
        );
        assert_eq!(server_type(&t), ServerType::LoadBalancer);
        assert!(t.poll_event().is_none());
        assert!(t.poll_action().is_none());
    }

    #[test]
    fn errors_for_unknown_servers_or_a_closed_topology_are_ignored() {
        let mut t = with_primary();
        let reset = network(NetworkErrorKind::Reset, NetworkPhase::AfterSend);
        assert_eq!(
            t.handle_application_error(&addr("z"), &reset, AFTER_HANDSHAKE, Instant::ZERO),
            ErrorHandling::Ignored
        );
        t.close(Instant::ZERO);
        assert_eq!(
            t.handle_application_error(&addr("a"), &reset, AFTER_HANDSHAKE, Instant::ZERO),
            ErrorHandling::Ignored
        );
    }
}
