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
        let cause = alloc::string::ToString::to_string(error);
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
