//! Command monitoring events in the shape of the command logging and monitoring spec (EV-1..EV-6).
//!
//! Every attempt written to a connection publishes one [`CommandEvent::Started`] and then exactly
//! one [`CommandEvent::Succeeded`] or [`CommandEvent::Failed`] with the same request id (EV-1):
//! succeeded for a reply with `ok: 1` (even with write errors or a write concern error, EV-3),
//! failed for `ok: 0`, a network error, a timeout or a cancellation. An unacknowledged write
//! (`w: 0`, sent with `moreToCome`) has no reply: it succeeds with the reply `{ok: 1}` (no `n`)
//! when the caller takes its bytes (EV-4, WP-6). Handshakes and monitoring checks publish none
//! (EV-8). Security-sensitive commands are redacted (EV-6).

use alloc::boxed::Box;
use alloc::string::String;
use bson::{oid::ObjectId, Bson, Document};
use core::time::Duration;

use super::{ConnId, Engine, EngineEvent, OpId};
use crate::address::ServerAddress;
use crate::error::{ErrorKind, OperationError};
use crate::time::Instant;

/// The fields the three command events share (EV-2).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct CommandInfo {
    /// `commandName`: the command's first key, as sent.
    pub command_name: String,
    /// `databaseName`.
    pub database_name: String,
    /// `requestId` of the OP_MSG.
    pub request_id: i32,
    /// `operationId`: the operation, the same for every attempt (BP-26).
    pub operation_id: OpId,
    /// The engine's socket, the driver-side connection id.
    pub connection: ConnId,
    /// The pool's id for the connection (CMAP `connectionId`).
    pub driver_connection_id: u32,
    /// The server.
    pub address: ServerAddress,
    /// `serverConnectionId`: the handshake reply's `connectionId`, if the server sent one.
    pub server_connection_id: Option<i64>,
    /// `serviceId`, in load-balanced mode (LB-16).
    pub service_id: Option<ObjectId>,
}

/// A command monitoring event (EV-1, EV-2).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum CommandEvent {
    /// The command was written to the connection.
    Started {
        /// The shared fields.
        info: CommandInfo,
        /// The command as sent (with `$db` and the attempt's modifications), or `{}` when
        /// redacted (EV-6).
        command: Document,
    },
    /// A reply with `ok: 1` came back (EV-3); for an unacknowledged write, its bytes were handed
    /// over, and the reply is `{ok: 1}` (EV-4).
    Succeeded {
        /// The shared fields.
        info: CommandInfo,
        /// From writing the command to reading the reply (zero for an unacknowledged write).
        duration: Duration,
        /// The reply, or `{}` when redacted (EV-6); `{ok: 1}` for an unacknowledged write (EV-4).
        reply: Document,
    },
    /// The command failed: an `ok: 0` reply, a network error, a timeout or a cancellation.
    Failed {
        /// The shared fields.
        info: CommandInfo,
        /// From writing the command to the failure.
        duration: Duration,
        /// The failure; for a redacted command a server error keeps only its code, code name and
        /// labels (EV-6).
        failure: OperationError,
    },
}

/// A command in flight on a socket: what its closing event needs.
pub(super) struct PendingCommand {
    pub(super) info: CommandInfo,
    pub(super) sent_at: Instant,
    pub(super) sensitive: bool,
}

/// EV-6: commands whose events carry no command and no reply.
const SENSITIVE: [&str; 9] = [
    "authenticate",
    "saslStart",
    "saslContinue",
    "getnonce",
    "createUser",
    "updateUser",
    "copydbgetnonce",
    "copydbsaslstart",
    "copydb",
];

/// EV-6: a sensitive command, or a hello carrying `speculativeAuthenticate`.
pub(super) fn is_sensitive(command: &Document) -> bool {
    let Some(name) = command.keys().next() else {
        return false;
    };
    let hello = name.eq_ignore_ascii_case("hello") || name.eq_ignore_ascii_case("ismaster");
    SENSITIVE.iter().any(|s| s.eq_ignore_ascii_case(name))
        || (hello && command.contains_key("speculativeAuthenticate"))
}

/// EV-6: a redacted failure keeps only the server's code, code name and labels.
fn redact(failure: OperationError) -> OperationError {
    let mut failure = failure;
    if let ErrorKind::Server(error) = &mut failure.kind {
        let error = alloc::sync::Arc::make_mut(error);
        let mut raw = Document::new();
        for key in ["code", "codeName", "errorLabels"] {
            if let Some(value) = error.raw.get(key) {
                raw.insert(key, value.clone());
            }
        }
        error.raw = raw;
        error.message = String::new();
        error.write_concern_error = None;
    }
    failure
}

impl Engine {
    /// EV-1, EV-2: the command of `op` was written on `conn` with `request_id`; publishes
    /// `Started` and remembers what its closing event needs.
    pub(super) fn command_started(
        &mut self,
        op: OpId,
        conn: ConnId,
        request_id: i32,
        command: &Document,
        now: Instant,
    ) {
        let Some(socket) = self.sockets.get_mut(&conn) else {
            return;
        };
        let super::Owner::Pool(id) = socket.owner else {
            return;
        };
        let handshake = socket.machine.handshake();
        let info = CommandInfo {
            command_name: command.keys().next().cloned().unwrap_or_default(),
            database_name: match command.get("$db") {
                Some(Bson::String(db)) => db.clone(),
                _ => String::new(),
            },
            request_id,
            operation_id: op,
            connection: conn,
            driver_connection_id: id.0,
            address: socket.address.clone(),
            server_connection_id: handshake.and_then(|h| h.server_connection_id),
            service_id: handshake.and_then(|h| h.service_id),
        };
        let sensitive = is_sensitive(command);
        let published = if sensitive {
            Document::new()
        } else {
            command.clone()
        };
        socket.command = Some(PendingCommand {
            info: info.clone(),
            sent_at: now,
            sensitive,
        });
        self.events
            .push_back(EngineEvent::Command(Box::new(CommandEvent::Started {
                info,
                command: published,
            })));
    }

    /// EV-1, EV-3: the reply to a pending command.
    pub(super) fn command_replied(
        &mut self,
        pending: PendingCommand,
        reply: &Document,
        now: Instant,
    ) {
        let duration = now.saturating_duration_since(pending.sent_at);
        let event = match (
            crate::reply::is_ok(reply),
            OperationError::from_reply(reply, &pending.info.address),
        ) {
            (false, Some(failure)) => CommandEvent::Failed {
                info: pending.info,
                duration,
                failure: if pending.sensitive {
                    redact(failure)
                } else {
                    failure
                },
            },
            _ => CommandEvent::Succeeded {
                info: pending.info,
                duration,
                reply: if pending.sensitive {
                    Document::new()
                } else {
                    reply.clone()
                },
            },
        };
        self.events.push_back(EngineEvent::Command(Box::new(event)));
    }

    /// EV-1: a pending command failed without a reply (network error, timeout, cancellation).
    pub(super) fn command_failed(
        &mut self,
        pending: PendingCommand,
        failure: &OperationError,
        now: Instant,
    ) {
        let duration = now.saturating_duration_since(pending.sent_at);
        let failure = if pending.sensitive {
            redact(failure.clone())
        } else {
            failure.clone()
        };
        self.events
            .push_back(EngineEvent::Command(Box::new(CommandEvent::Failed {
                info: pending.info,
                duration,
                failure,
            })));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// EV-6: the listed commands, and hellos with `speculativeAuthenticate` only.
    #[test]
    fn ev6_sensitive_commands_are_recognised() {
        assert!(is_sensitive(&doc! { "saslStart": 1 }));
        assert!(is_sensitive(&doc! { "createUser": "u" }));
        assert!(is_sensitive(
            &doc! { "hello": 1, "speculativeAuthenticate": {} }
        ));
        assert!(is_sensitive(
            &doc! { "isMaster": 1, "speculativeAuthenticate": {} }
        ));
        assert!(is_sensitive(
            &doc! { "ismaster": 1, "speculativeAuthenticate": {} }
        ));
        assert!(is_sensitive(&doc! { "SASLSTART": 1 }));
        assert!(is_sensitive(&doc! { "copydbsaslstart": 1 }));
        assert!(!is_sensitive(&doc! { "hello": 1 }));
        assert!(!is_sensitive(&doc! { "isMaster": 1 }));
        // The command name is the first key: a later `saslStart` field does not count.
        assert!(!is_sensitive(&doc! { "find": "c", "saslStart": 1 }));
        assert!(!is_sensitive(&doc! { "find": "c" }));
    }

    /// EV-6: a redacted server failure keeps code, code name and labels only.
    #[test]
    fn ev6_a_redacted_failure_keeps_code_code_name_and_labels() {
        let reply = doc! { "ok": 0, "code": 18, "codeName": "AuthenticationFailed",
        "errmsg": "secret", "errorLabels": ["X"], "extra": 1 };
        let failure =
            OperationError::from_reply(&reply, &ServerAddress::new("db", 27017)).expect("an error");
        let ErrorKind::Server(error) = redact(failure).kind else {
            panic!("a server error");
        };
        assert_eq!(
            error.raw,
            doc! { "code": 18, "codeName": "AuthenticationFailed", "errorLabels": ["X"] }
        );
        assert!(error.message.is_empty());
    }
}
