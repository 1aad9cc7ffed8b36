//! An input an operation's machine refused: a bug of the engine's. The operation keeps the first
//! refusal and the engine ends it with [`OperationError::internal`] the next time it drains the
//! operation, so it still ends exactly once (house rule 8) in release builds too; what its
//! attempt held (a checkout, a connection with a command in flight) is given up. Debug builds of
//! other crates' tests also stop at the refusal with a panic, so the bug is seen where it happens.

use alloc::string::String;

use super::{Engine, Machine, OpId, Operation};
use crate::error::OperationError;
use crate::time::Instant;

impl Operation {
    /// Keeps the first refusal for [`Engine::end_refused`].
    pub(super) fn note(&mut self, result: Result<(), String>) {
        if self.refused.is_none() {
            self.refused = result.err();
        }
    }
}

/// The message of a refusal.
pub(super) fn refusal(error: impl core::fmt::Display) -> String {
    alloc::format!("internal error: the operation's machine refused an input: {error}")
}

impl Engine {
    /// Ends `op_id` with an internal error if its machine refused an input; whether it did.
    #[inline]
    pub(super) fn end_refused(&mut self, op_id: OpId, now: Instant) -> bool {
        let refused = self.ops.get_mut(&op_id).and_then(|op| op.refused.take());
        match refused {
            Some(message) => {
                self.end_with_refusal(op_id, message, now);
                true
            }
            None => false,
        }
    }

    /// [`Engine::end_refused`]'s work once a refusal was found (never on a healthy path).
    #[cold]
    #[inline(never)]
    fn end_with_refusal(&mut self, op_id: OpId, message: String, now: Instant) {
        let Some(op) = self.ops.get_mut(&op_id) else {
            return;
        };
        // This crate's own unit tests check the release-build path below.
        #[cfg(not(test))]
        debug_assert!(false, "{message}");
        let error = OperationError::internal(message);
        let (pinned, keep) = (op.pinned_conn, op.keep_conn);
        let mut held: smallvec::SmallVec<[_; 1]> = smallvec::SmallVec::new();
        for slot in op.slots.iter_mut() {
            slot.selection = None;
            slot.wake = None;
            held.push((slot.checkout.take(), slot.conn.take()));
        }
        self.waiting.remove(&op_id);
        for (index, (checkout, conn)) in held.into_iter().enumerate() {
            if let Some((server, checkout)) = checkout {
                self.checkouts.remove(&(server, checkout));
                if let Some(pool) = self.pool_mut(server) {
                    pool.cancel_checkout(checkout, now);
                }
                self.schedule(Machine::Pool(server));
            }
            let Some(conn) = conn else {
                continue;
            };
            let in_flight = self
                .sockets
                .get_mut(&conn)
                .filter(|socket| socket.op == Some((op_id, index)))
                .map(|socket| socket.command.take());
            if let Some(pending) = in_flight {
                // EV-1: a command in flight gets its failed event.
                if let Some(pending) = pending {
                    self.command_failed(pending, &error, now);
                }
                // SE-12: the connection closes under the command.
                self.mark_session_dirty(op_id, index);
            }
            // A connection a cursor or transaction owns stays with it; any other is closed, as
            // the state of its command is unknown.
            if pinned != Some(conn) && !keep {
                self.release(conn, false, now);
            }
        }
        self.finish(op_id, Err(error), 0, now);
    }
}

#[cfg(test)]
mod tests {
    use super::super::*;
    use crate::selection::{ReadPreference, ReadPreferenceMode};

    /// House rule 8, review item 13: an input the operation's machine refuses (here `sent` while
    /// it is still selecting a server) ends the operation once with an internal error instead of
    /// leaving it unfinished; its selection wait is dropped.
    #[test]
    fn a_refused_input_ends_the_operation_once_with_an_internal_error() {
        let settings = TopologySettings::new(alloc::vec![ServerAddress::new("db", 27017)]);
        let options = EngineOptions::new(settings, HandshakeOptions::new());
        let mut engine = Engine::new(options, Instant::ZERO).expect("valid");
        let primary = ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).unwrap();
        let request = OperationRequest::new(
            "test",
            bson::doc! { "ping": 1 },
            OperationKind::Read,
            SelectionCriteria::Read(primary),
        );
        let op = engine.start_operation(request, Instant::ZERO);
        assert!(engine.waiting.contains(&op), "the selection waits");
        engine
            .ops
            .get_mut(&op)
            .expect("running")
            .sent(0, Instant::ZERO);
        engine.schedule(Machine::Operation(op));
        engine.run(Instant::ZERO);
        engine.run(Instant::ZERO);
        let finished: Vec<_> = core::iter::from_fn(|| engine.poll_event())
            .filter_map(|e| match e {
                EngineEvent::OperationFinished { op: o, result, .. } if o == op => Some(result),
                _ => None,
            })
            .collect();
        assert_eq!(finished.len(), 1, "{finished:?}");
        let error = finished[0].as_ref().unwrap_err();
        assert!(
            matches!(error.kind, crate::error::ErrorKind::Internal { .. }),
            "{error:?}"
        );
        assert!(!engine.ops.contains_key(&op) && !engine.waiting.contains(&op));
    }
}
