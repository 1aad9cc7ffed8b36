//! The awaitable `hello` of the streaming monitoring protocol (MO-8, MO-9).
//!
//! A `hello` with both `topologyVersion` and `maxAwaitTimeMS` waits before it replies: at once when
//! the client's `processId` is not this server's or its `counter` is behind, otherwise after
//! `maxAwaitTimeMS` (this server's topology only changes when a test changes it). One without the
//! other is an error, as on a real server. With `exhaustAllowed` the server then streams: every
//! `ok: 1` reply carries `moreToCome`, answers the previous reply, and the next follows a wait
//! later, until the client closes the connection. Each reply is counted as a received `hello`.

use bson::{Bson, Document};
use retry_core::wire::{MsgFlags, OpMsg};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{sleep, Duration};

use super::{Connection, Response, ServerStream, Shared, MAX_MESSAGE_SIZE_BYTES};
use crate::commands::is_hello;
use crate::fail_point::error_reply;

/// What an awaitable `hello` asks for.
pub(super) enum Awaitable {
    /// Reply after this long.
    After(Duration),
    /// MO-8: `topologyVersion` without `maxAwaitTimeMS`, or the reverse, or wrong types.
    Invalid(&'static str),
}

/// Whether `request` is an awaitable `hello`, and how long it waits on this server. One without a
/// `$db` a server runs a command on is not: the Document path refuses it (review32 R4).
pub(super) fn awaitable(shared: &Shared, request: &OpMsg) -> Option<Awaitable> {
    let body = &request.body;
    let name = body.keys().next().map_or("", String::as_str);
    // HS-3: `hello` on a server that does not offer it is refused at once (59), not awaited.
    if !is_hello(name) || (name == "hello" && !shared.offers_hello) {
        return None;
    }
    let db = body.get_str("$db").ok()?;
    // Review34 Y9: only `local` depends on the role (refused on a router), so only it locks.
    let router = db == "local" && shared.lock().role.is_router();
    if crate::database_name::validity_refusal(db, router).is_some() {
        return None;
    }
    let version = body.get("topologyVersion");
    let max_await = body.get("maxAwaitTimeMS");
    let (version, max_await) = match (version, max_await) {
        (None, None) => return None,
        (Some(Bson::Document(v)), Some(m)) => (v, m),
        (Some(_), None) | (None, Some(_)) => {
            return Some(Awaitable::Invalid(
                "topologyVersion and maxAwaitTimeMS must be given together",
            ))
        }
        (Some(_), Some(_)) => return Some(Awaitable::Invalid("topologyVersion must be an object")),
    };
    let millis = match max_await {
        Bson::Int64(ms) if *ms >= 0 => *ms as u64,
        Bson::Int32(ms) if *ms >= 0 => *ms as u64,
        _ => {
            return Some(Awaitable::Invalid(
                "maxAwaitTimeMS must be a non-negative integer",
            ))
        }
    };
    let current = shared.lock().topology_counter;
    let same_process = version.get("processId") == Some(&Bson::ObjectId(shared.process_id));
    let counter = match version.get("counter") {
        Some(Bson::Int64(c)) => *c,
        _ => return Some(Awaitable::Invalid("topologyVersion.counter must be a long")),
    };
    Some(Awaitable::After(if same_process && counter >= current {
        Duration::from_millis(millis)
    } else {
        Duration::ZERO
    }))
}

impl Connection {
    /// Answers an awaitable `hello` (and streams, with `exhaustAllowed`); `false` means close.
    pub(super) async fn await_hello<S: ServerStream>(
        &mut self,
        shared: &Shared,
        stream: &mut S,
        request: OpMsg,
        awaitable: Awaitable,
    ) -> bool {
        let wait = match awaitable {
            Awaitable::After(wait) => wait,
            Awaitable::Invalid(message) => {
                let reply = error_reply(9, message);
                return self
                    .send(shared, stream, request.request_id, reply, true)
                    .await;
            }
        };
        let name = request.body.keys().next().cloned().unwrap_or_default();
        let exhaust = request.flags.contains(MsgFlags::EXHAUST_ALLOWED);
        let mut response_to = request.request_id;
        let mut wait_for = wait;
        let mut buffer = [0; 64];
        loop {
            // The client closing (or, against the protocol, sending) ends the stream.
            tokio::select! {
                () = sleep(wait_for) => {}
                _ = stream.read(&mut buffer) => return false,
            }
            wait_for = wait;
            let reply = match self.handle(shared, &name, &request, None).await {
                Response::Reply(reply) => reply,
                Response::Close => return false,
            };
            shared.count_reply(&name, &reply);
            let ok = retry_core::reply::is_ok(&reply);
            if !exhaust || !ok {
                // MO-9: `ok: 0` never has `moreToCome`.
                return self.send(shared, stream, response_to, reply, true).await;
            }
            match self.push(stream, response_to, reply).await {
                Some(request_id) => response_to = request_id,
                None => return false,
            }
        }
    }

    /// Writes `reply` with `moreToCome`; returns its request id, which the next reply answers.
    async fn push<S: ServerStream>(
        &mut self,
        stream: &mut S,
        response_to: i32,
        reply: Document,
    ) -> Option<i32> {
        self.last_request_id = self.last_request_id.wrapping_add(1);
        let message = OpMsg {
            request_id: self.last_request_id,
            response_to,
            flags: MsgFlags::MORE_TO_COME,
            body: reply,
            sequences: Vec::new(),
        };
        let mut bytes = Vec::new();
        message
            .encode(MAX_MESSAGE_SIZE_BYTES as u32, &mut bytes)
            .ok()?;
        stream.write_all(&bytes).await.ok()?;
        Some(self.last_request_id)
    }
}
