//! The raw path: `ping` and `hello` / `isMaster` / `ismaster` answered from the encoded request,
//! without decoding it into a `Document` (issue 9: a ping cost the server about 19,000
//! instructions, mostly decoding, lookups and encoding).
//!
//! A request goes this way when its frame names one of those commands at the front of the
//! input ([`names_hot_command`]): it is decoded with [`FrameDecoder::decode_raw`], which accepts
//! and refuses exactly the frames the Document decoder does. [`Hot::read`] then accepts only a
//! body every check of the Document path would pass (house rule 7: never more forgiving):
//!
//! - no document sequence, no field twice, and only these fields besides the command's own:
//!   `$db`, an `lsid` that is `{id: <binary>}` alone, `$clusterTime`, `$readPreference`,
//!   `apiVersion`, `apiStrict`, `apiDeprecationErrors`, `comment`, a `maxTimeMS` the server's
//!   check ([`crate::refusals::max_time_refusal`]) accepts, and for a hello `helloOk`,
//!   `loadBalanced`, `client`, `compression` and `backpressure` (not an awaitable hello's
//!   `topologyVersion` / `maxAwaitTimeMS`, not the authentication fields). None of those draws a
//!   refusal (`crate::refusals`: the session, transaction, concern and secondary-read checks
//!   read other fields or other commands), and neither command checks unknown fields;
//! - then, under the lock, before anything is counted: a `$db`, no authentication refusal,
//!   and no `failCommand` fail point matching the command.
//!
//! Anything else is converted to the `Document` and answered by the Document path, from the
//! start. An accepted request has the Document path's effects, in its order: counted as received,
//! logged (TK-16), a hello recorded with its `client.application.name`, a ping admitted by the
//! ingress limiter (BP-3; its rejection is the same reply), its `lsid` noted, counted as executed
//! and as succeeded, and its reply carries `operationTime` / `$clusterTime` off a standalone. A
//! ping's reply body is encoded once per cluster time and framed with the connection's next
//! `requestID` (random faults apply as on any reply); a hello's is built by the same function as
//! the Document path's. `raw_equivalence` runs valid and invalid commands through both paths and
//! compares the reply bytes, counters, handshakes and command logs.

use bson::{Document, RawDocument, RawDocumentBuf, Timestamp};
use retry_core::wire::{DocumentSequence, MsgFlags, OpMsg, RawOpMsg};

use super::elements::{Element, Elements, Walk};
use super::{add_cluster_time, insert_cluster_time, Connection, LoggedCommand, Recorded};
use super::{ServerStream, Shared};
use crate::commands::{is_hello, ok, HelloAsk};
use crate::config::Role;
use crate::refusals::max_time_refusal;

/// OP_MSG's opcode, little-endian.
const OP_MSG: [u8; 4] = 2013_i32.to_le_bytes();

/// Where a frame's first body key starts: the header (16 bytes), `flagBits` (4), the section
/// kind (1), the body's length (4) and its first element's type (1).
const NAME_AT: usize = 26;

/// Whether `input` starts with an OP_MSG whose body's first key is a hot command. Only a hint
/// for which decoder to use: [`Hot::read`] decides.
pub(super) fn names_hot_command(input: &[u8]) -> bool {
    if input.len() < NAME_AT || input[12..16] != OP_MSG || input[20] != 0 {
        return false;
    }
    let name = &input[NAME_AT..];
    [&b"ping\0"[..], b"hello\0", b"isMaster\0", b"ismaster\0"]
        .iter()
        .any(|hot| name.starts_with(hot))
}

/// A hot command whose every field the Document path would accept (see the module docs).
pub(super) struct Hot<'a> {
    name: &'a str,
    hello: bool,
    has_db: bool,
    /// The `lsid`'s encoding, `{id: <binary>}` alone.
    lsid: Option<&'a [u8]>,
    ask: HelloAsk,
    /// `client.application.name`, read as the Document path reads it (the last of a repeated
    /// key).
    app_name: Option<&'a str>,
}

impl<'a> Hot<'a> {
    /// The body's hot command, or `None` when the Document path must answer it. Reads the
    /// validated bytes ([`Elements`]), a field's value only when the answer depends on it.
    pub(super) fn read(body: &'a RawDocument) -> Option<Hot<'a>> {
        let mut fields = Elements::of(body.as_bytes());
        let Walk::Element(first) = fields.next() else {
            return None;
        };
        let name = match first.key {
            b"ping" => "ping",
            b"hello" => "hello",
            b"isMaster" => "isMaster",
            b"ismaster" => "ismaster",
            _ => return None,
        };
        let hello = is_hello(name);
        let mut hot = Hot {
            name,
            hello,
            has_db: false,
            lsid: None,
            ask: HelloAsk::default(),
            app_name: None,
        };
        let mut seen = 0_u32;
        loop {
            let field = match fields.next() {
                Walk::Element(field) => field,
                Walk::End => return Some(hot),
                Walk::Unreadable => return None,
            };
            let (bit, accepted) = match field.key {
                b"$db" => {
                    hot.has_db = true;
                    (0, true)
                }
                b"lsid" => {
                    hot.lsid = plain_lsid(field);
                    (1, hot.lsid.is_some())
                }
                b"$clusterTime" => (2, true),
                b"$readPreference" => (3, true),
                b"apiVersion" => (4, true),
                b"apiStrict" => (5, true),
                b"apiDeprecationErrors" => (6, true),
                b"comment" => (7, true),
                b"maxTimeMS" => {
                    let refused = field.number().map(|value| max_time_refusal(&value));
                    (8, matches!(refused, Some(None)))
                }
                b"helloOk" if hello => {
                    hot.ask.hello_ok = field.bool()?;
                    (9, true)
                }
                b"loadBalanced" if hello => {
                    hot.ask.load_balanced = field.bool()?;
                    (10, true)
                }
                b"client" if hello => {
                    hot.app_name = app_name(field);
                    (11, true)
                }
                b"compression" if hello => (12, true),
                b"backpressure" if hello => (13, true),
                _ => return None,
            };
            if !accepted || seen & (1 << bit) != 0 {
                return None;
            }
            seen |= 1 << bit;
        }
    }
}

/// An lsid that is `{id: <binary>}` alone, of any subtype but `BinaryOld` (whose encoding has a
/// second length): the shape every check accepts and `Store::note_plain_session` takes.
fn plain_lsid(lsid: Element<'_>) -> Option<&[u8]> {
    let mut fields = lsid.document()?;
    let Walk::Element(id) = fields.next() else {
        return None;
    };
    let plain = id.key == b"id" && id.binary_subtype().is_some();
    (plain && matches!(fields.next(), Walk::End)).then_some(lsid.value)
}

/// HS-4: `client.application.name`, when it is a string in documents, the last of each
/// repeated key as a decoded `Document` keeps it.
fn app_name(client: Element<'_>) -> Option<&str> {
    let application = client.document()?.last(b"application")?;
    application.document()?.last(b"name")?.str()
}

/// What the raw path answers.
enum Answer {
    /// `{ok: 1}`, with the cluster time off a standalone: [`Connection::ping_reply`]'s body.
    Ping,
    /// A reply built as the Document path builds it (a hello's, an ingress rejection), to finish
    /// (cluster time) and count.
    Reply(Document),
    /// A reply finished and counted.
    Counted(Document),
}

/// The ping reply body of one cluster time, encoded once.
pub(super) struct PingReply {
    time: Option<Timestamp>,
    body: Vec<u8>,
}

impl Connection {
    /// Handles a request decoded raw: a hot command [`Hot::read`] accepts is answered here, any
    /// other by [`Connection::respond`]; `false` means close the connection.
    pub(super) async fn respond_raw<S: ServerStream>(
        &mut self,
        shared: &Shared,
        stream: &mut S,
        request: RawOpMsg,
    ) -> bool {
        let hot = match request.sequences.is_empty() {
            true => Hot::read(&request.body),
            false => None,
        };
        let Some((hot, answer)) = hot.and_then(|hot| {
            let answer = self.answer(shared, &hot, &request.body)?;
            Some((hot, answer))
        }) else {
            return match decoded(&request) {
                Some(request) => self.respond(shared, stream, request).await,
                // Cannot happen: `decode_raw` validated the documents as `decode` converts them.
                None => {
                    shared.lock().counters.protocol_errors += 1;
                    false
                }
            };
        };
        let reply = match answer {
            Answer::Ping => None,
            Answer::Counted(reply) => Some(reply),
            Answer::Reply(mut reply) => {
                add_cluster_time(shared, hot.name, &mut reply);
                shared.count_reply(hot.name, &reply);
                Some(reply)
            }
        };
        if request.flags.contains(MsgFlags::MORE_TO_COME) {
            return true;
        }
        match reply {
            Some(reply) => {
                self.send(shared, stream, request.request_id, reply, false)
                    .await
            }
            None => {
                let bytes = self.ping_frame(request.request_id);
                self.write_reply(shared, stream, request.request_id, bytes, false)
                    .await
            }
        }
    }

    /// The Document path's admission, execution and counting of an accepted hot command, under
    /// one lock; `None` (before any effect) when the Document path must answer it.
    fn answer(&mut self, shared: &Shared, hot: &Hot<'_>, body: &RawDocumentBuf) -> Option<Answer> {
        let name = hot.name;
        let mut state = shared.lock();
        let app_name = match hot.app_name {
            Some(app_name) if hot.hello => Some(app_name),
            _ => self.app_name.as_deref(),
        };
        let fail_point = state.fail_point.as_ref();
        if !hot.has_db
            || self.auth.refuse(&state.users, name).is_some()
            || fail_point.is_some_and(|fail| fail.matches(name, app_name))
        {
            return None;
        }
        #[cfg(test)]
        {
            state.raw_answers += 1;
        }
        if let Some(log) = &mut state.command_log {
            log.push(LoggedCommand {
                name: name.to_owned(),
                lsid: hot.lsid.and_then(decoded_document),
                txn_number: None,
            });
        }
        if hot.hello {
            state
                .handshakes
                .push((self.id, Recorded::Raw(body.clone())));
            if let Some(app_name) = hot.app_name {
                self.app_name = Some(app_name.to_owned());
            }
            let reply = self.hello_reply(&mut state, shared, name, hot.ask);
            let counts = state.counters.command_mut(name);
            counts.received += 1;
            counts.executed += 1;
            return Some(Answer::Reply(reply));
        }
        if let Some(rejection) = state.ingress_rejection() {
            state.counters.command_mut(name).received += 1;
            return Some(Answer::Reply(rejection));
        }
        let new_lsid = hot.lsid.filter(|&lsid| lsid != self.noted_lsid);
        let standalone = state.role == Role::Standalone;
        let time = if new_lsid.is_none() && standalone {
            None
        } else {
            let mut store = state.data.lock();
            // Sessions are never forgotten: one this connection noted last is still noted.
            if let Some(lsid) = new_lsid {
                if store.note_plain_session(lsid) {
                    self.noted_lsid.clear();
                    self.noted_lsid.extend_from_slice(lsid);
                }
            }
            (!standalone).then(|| store.cluster_time())
        };
        // Counted once: the lock is held since the request was admitted.
        let counts = state.counters.command_mut(name);
        counts.received += 1;
        counts.executed += 1;
        counts.succeeded += 1;
        drop(state);
        if self.ping_reply.as_ref().is_some_and(|r| r.time == time) {
            return Some(Answer::Ping);
        }
        let mut reply = ok();
        if let Some(time) = time {
            insert_cluster_time(&mut reply, time);
        }
        match reply.to_vec() {
            Ok(body) => {
                self.ping_reply = Some(PingReply { time, body });
                Some(Answer::Ping)
            }
            // Not for these fields; `send` answers as the Document path would.
            Err(_) => Some(Answer::Counted(reply)),
        }
    }

    /// The ping reply's frame ([`PingReply`]) with the next `requestID`, answering `response_to`,
    /// in the connection's reused buffer: the bytes `OpMsg::encode` gives.
    fn ping_frame(&mut self, response_to: i32) -> Vec<u8> {
        self.last_request_id = self.last_request_id.wrapping_add(1);
        let mut bytes = core::mem::take(&mut self.out);
        bytes.clear();
        let body = self.ping_reply.as_ref().map_or(&[][..], |r| &r.body[..]);
        let length = (16 + 4 + 1 + body.len()) as i32;
        for field in [length, self.last_request_id, response_to] {
            bytes.extend_from_slice(&field.to_le_bytes());
        }
        bytes.extend_from_slice(&OP_MSG);
        bytes.extend_from_slice(&MsgFlags::NONE.bits().to_le_bytes());
        bytes.push(0);
        bytes.extend_from_slice(body);
        bytes
    }
}

/// A validated document's bytes as a decoded `Document`.
fn decoded_document(bytes: &[u8]) -> Option<Document> {
    Document::try_from(RawDocument::from_bytes(bytes).ok()?).ok()
}

/// The request as the Document decoder would have given it.
fn decoded(request: &RawOpMsg) -> Option<OpMsg> {
    let sequences = request
        .sequences
        .iter()
        .map(|sequence| {
            let documents = sequence
                .documents
                .iter()
                .map(|d| Document::try_from(d).ok())
                .collect::<Option<Vec<_>>>()?;
            Some(DocumentSequence {
                identifier: sequence.identifier.clone(),
                documents,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    Some(OpMsg {
        request_id: request.request_id,
        response_to: request.response_to,
        flags: request.flags,
        body: Document::try_from(&request.body).ok()?,
        sequences,
    })
}
