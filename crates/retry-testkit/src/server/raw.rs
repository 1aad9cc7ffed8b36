//! The raw path: `ping` and `hello` / `isMaster` / `ismaster` answered from the encoded request,
//! without decoding it into a `Document` (issue 9: a ping cost the server about 19,000
//! instructions, a heartbeat about 32,000, mostly building, hashing and encoding documents).
//!
//! A request goes this way when its frame names one of those commands at the front of the
//! input ([`names_hot_command`], only a hint): it is decoded with `FrameDecoder::decode_raw`,
//! which accepts and refuses exactly the frames the Document decoder does (a frame it refuses
//! closes the connection either way). [`Hot::read`] then accepts only a body every check of the
//! Document path passes (house rule 7: never more forgiving):
//!
//! - a body within `BSONObjMaxInternalSize` (`malformed`), no document sequence, no field twice,
//!   and only these fields besides the command's own: a string `$db` naming a database a server
//!   takes (`crate::database_name`, review32 R4: not `local` on a router either), an `lsid` that is `{id: <binary>}` alone, `$clusterTime`, a
//!   `$readPreference` document holding only a known `mode`, `apiVersion: "1"`, boolean `apiStrict` (true
//!   only on `ping` and `hello`, API version 1, and not with a hello's `loadBalanced`) and
//!   `apiDeprecationErrors` (only with `apiVersion`), `comment`, a numeric `maxTimeMS` the
//!   server's check (`refusals::max_time_refusal`) accepts, and for a hello a boolean `helloOk`
//!   and `loadBalanced`, a `client` document (only on the connection's first hello),
//!   `compression` as an array of strings and `backpressure` (review7 finding 3: only what
//!   `refusals::generic_field_refusal` accepts); not an awaitable hello's
//!   `topologyVersion` / `maxAwaitTimeMS`, not the authentication fields, nothing else. None of
//!   those draws a refusal (`refusals`: the session, transaction, concern and secondary-read
//!   checks read other fields or other commands), neither command checks unknown fields, and no
//!   value type but those [`Elements`] sizes;
//! - then, under the lock, before anything is counted: a `$db`, an `apiVersion` when the server
//!   requires one (`requireApiVersion`, crate `parameters`), no authentication refusal, and
//!   no `failCommand` fail point matching the command (its `appName` filter included).
//!
//! Anything else is converted to the `Document` and answered by the Document path, from the
//! start. An accepted request has the Document path's effects, in its order: logged (TK-16), a
//! hello recorded as a handshake with its `client.application.name` and its connection routed to
//! a service (TK-12), a ping admitted by the ingress limiter (BP-3; a rejection is the same
//! reply, built by the same function), its `lsid` noted for `$listLocalSessions`, counted as
//! received, executed and succeeded; random faults apply to the reply as to any. The reply bodies
//! are built by the Document path's functions, encoded once and kept by the connection for what
//! they depend on (a ping's: the cluster time, off a standalone; a hello's: [`HelloKey`]), then
//! framed with the connection's next `requestID`. `raw_equivalence` runs valid and invalid
//! commands through both paths in every role and compares the reply bytes, closes, counters,
//! handshakes and logs.

use std::sync::MutexGuard;

use bson::oid::ObjectId;
use bson::{Document, RawDocument, RawDocumentBuf, Timestamp};
use retry_core::wire::{to_document, DocumentSequence, MsgFlags, OpMsg, RawOpMsg};

use super::elements::{kind, Element, Elements, Walk};
use super::malformed::MAX_INTERNAL_DOCUMENT_SIZE;
use super::{add_cluster_time, insert_cluster_time, Connection, LoggedCommand, Recorded};
use super::{ServerStream, Shared, State};
use crate::commands::{is_hello, ok, HelloAsk};
use crate::config::Role;
use crate::refusals::{max_time_refusal, API_VERSION_1};

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
    name: &'static str,
    hello: bool,
    /// `$db`, a name `validDBName` takes (`crate::database_name`).
    db: Option<&'a str>,
    /// Whether it declares `apiVersion` (a server requiring one refuses it otherwise, on the
    /// Document path: crate `parameters`).
    api_version: bool,
    /// The `lsid`'s encoding, `{id: <binary>}` alone.
    lsid: Option<&'a [u8]>,
    ask: HelloAsk,
    /// `client.application.name`, read as the Document path reads it (the last of a repeated
    /// key).
    app_name: Option<&'a str>,
    /// A hello's `client` document (only the connection's first hello may carry one, 186; its
    /// metadata is checked in [`Connection::answer`], where the role is known).
    client: Option<&'a [u8]>,
    /// SE-17: a well-formed gossiped `$clusterTime` (a malformed one goes to the Document path,
    /// which refuses it).
    cluster_time: Option<Timestamp>,
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
            db: None,
            api_version: false,
            lsid: None,
            ask: HelloAsk::default(),
            app_name: None,
            client: None,
            cluster_time: None,
        };
        let mut seen = 0_u32;
        let mut strict = false;
        loop {
            let field = match fields.next() {
                Walk::Element(field) => field,
                // `apiStrict` / `apiDeprecationErrors` only with `apiVersion` (4886600).
                Walk::End if seen & 0b110_0000 != 0 && seen & 0b1_0000 == 0 => return None,
                // A hello's `loadBalanced` under `apiStrict: true` (323, `commands::hello_refusal`).
                Walk::End if strict && seen & (1 << 10) != 0 => return None,
                Walk::End => return Some(hot),
                Walk::Unreadable => return None,
            };
            let (bit, accepted) = match field.key {
                b"$db" => {
                    hot.db = field.str();
                    (0, hot.db.is_some_and(crate::database_name::valid))
                }
                b"lsid" => {
                    hot.lsid = plain_lsid(field);
                    (1, hot.lsid.is_some())
                }
                b"$clusterTime" => {
                    hot.cluster_time = gossiped_time(field);
                    (2, hot.cluster_time.is_some())
                }
                // Review7 finding 3: only values `refusals::generic_field_refusal` accepts.
                b"$readPreference" => (3, known_read_preference(field)),
                b"apiVersion" => {
                    hot.api_version = true;
                    (4, field.str() == Some("1"))
                }
                // `apiStrict: true` only on a command in API version 1 (else 323).
                b"apiStrict" => {
                    strict = field.bool() == Some(true);
                    (
                        5,
                        field
                            .bool()
                            .is_some_and(|strict| !strict || API_VERSION_1.contains(&name)),
                    )
                }
                b"apiDeprecationErrors" => (6, field.bool().is_some()),
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
                    hot.client = Some(field.value);
                    (11, field.kind == kind::DOCUMENT)
                }
                b"compression" if hello => (12, strings(field)),
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

/// An lsid that is `{id: <UUID>}` alone (binary subtype 4, 16 bytes: SE-3, the shape the
/// Document path's lsid check accepts, review6 finding 9) and `Store::note_plain_session` takes.
fn plain_lsid(lsid: Element<'_>) -> Option<&[u8]> {
    let mut fields = lsid.document()?;
    let Walk::Element(id) = fields.next() else {
        return None;
    };
    // The binary value: its length (16), its subtype (4), its 16 bytes.
    let uuid = id.binary_subtype() == Some(4) && id.value.len() == 21;
    let plain = id.key == b"id" && uuid;
    (plain && matches!(fields.next(), Walk::End)).then_some(lsid.value)
}

/// SE-17 (review6 finding 8): a `$clusterTime` the Document path accepts
/// (`refusals::gossiped_cluster_time`, the last of each repeated key as a decoded `Document`
/// keeps it): its `clusterTime`.
fn gossiped_time(gossip: Element<'_>) -> Option<Timestamp> {
    let time = gossip.document()?.last(b"clusterTime")?;
    let signature = gossip.document()?.last(b"signature")?;
    let hash = signature.document()?.last(b"hash")?;
    let key_id = signature.document()?.last(b"keyId")?;
    let well_formed =
        time.kind == kind::TIMESTAMP && hash.kind == kind::BINARY && key_id.kind == kind::INT64;
    let bytes: [u8; 8] = time.value.try_into().ok()?;
    let [i0, i1, i2, i3, t0, t1, t2, t3] = bytes;
    well_formed.then(|| Timestamp {
        increment: u32::from_le_bytes([i0, i1, i2, i3]),
        time: u32::from_le_bytes([t0, t1, t2, t3]),
    })
}

/// Review7 finding 3: a `$readPreference` document whose `mode` (the last, as a decoded
/// `Document` keeps it) is a mode the server knows. Review37 W9: and no other field (`tags`,
/// `maxStalenessSeconds`, ... are checked by the Document path, `refusals::generic_field_refusal`).
fn known_read_preference(preference: Element<'_>) -> bool {
    let Some(mut fields) = preference.document() else {
        return false;
    };
    loop {
        match fields.next() {
            Walk::Element(field) if field.key == b"mode" => {}
            Walk::End => break,
            Walk::Element(_) | Walk::Unreadable => return false,
        }
    }
    let mode = preference.document().and_then(|d| d.last(b"mode"));
    mode.and_then(|m| m.str())
        .is_some_and(|m| crate::refusals::READ_PREFERENCE_MODES.contains(&m))
}

/// Review7 finding 3: an array of strings (a hello's `compression`).
fn strings(array: Element<'_>) -> bool {
    if array.kind != kind::ARRAY {
        return false;
    }
    let mut names = Elements::of(array.value);
    loop {
        match names.next() {
            Walk::Element(name) if name.kind == kind::STRING => {}
            Walk::End => return true,
            Walk::Element(_) | Walk::Unreadable => return false,
        }
    }
}

/// HS-4: `client.application.name`, when it is a string in documents, the last of each
/// repeated key as a decoded `Document` keeps it.
fn app_name(client: Element<'_>) -> Option<&str> {
    let application = client.document()?.last(b"application")?;
    application.document()?.last(b"name")?.str()
}

/// What the raw path answers.
enum Answer {
    /// The reply body in [`Replies::ping`] or [`Replies::hello`], counted.
    Cached(Cached),
    /// A reply built as the Document path builds it (an ingress rejection), to finish (cluster
    /// time) and count.
    Reply(Document),
    /// A reply finished and counted.
    Counted(Document),
}

/// Which cached reply body.
#[derive(Clone, Copy)]
enum Cached {
    Ping,
    Hello,
}

/// A reply body, encoded once for what it depends on.
struct Reply<K> {
    key: K,
    body: Vec<u8>,
}

/// What a hello reply depends on besides what never changes for a connection (`me`, process id,
/// connection id, wire versions): the role only changes with `topologyVersion.counter`
/// (`ServerHandle::set_role`).
#[derive(Clone, Copy, PartialEq)]
struct HelloKey {
    name: &'static str,
    ask: HelloAsk,
    counter: i64,
    service_id: ObjectId,
}

/// A connection's reply bodies of the raw path: a ping's by cluster time, a hello's by
/// [`HelloKey`].
#[derive(Default)]
pub(super) struct Replies {
    ping: Option<Reply<Option<Timestamp>>>,
    hello: Option<Reply<HelloKey>>,
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
        let in_bounds = request.body.as_bytes().len() <= MAX_INTERNAL_DOCUMENT_SIZE;
        let hot = match request.sequences.is_empty() && in_bounds {
            true => Hot::read(&request.body),
            false => None,
        };
        let Some((name, answer)) = hot.and_then(|hot| {
            let answer = self.answer(shared, &hot, &request.body)?;
            Some((hot.name, answer))
        }) else {
            return self.respond_decoded(shared, stream, &request).await;
        };
        let reply = match answer {
            Answer::Cached(cached) => Err(cached),
            Answer::Counted(reply) => Ok(reply),
            Answer::Reply(mut reply) => {
                add_cluster_time(shared, name, &mut reply);
                shared.count_reply(name, &reply);
                Ok(reply)
            }
        };
        if request.flags.contains(MsgFlags::MORE_TO_COME) {
            return true;
        }
        match reply {
            Ok(reply) => {
                self.send(shared, stream, request.request_id, reply, false)
                    .await
            }
            Err(cached) => {
                let bytes = self.cached_frame(cached, request.request_id);
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
        // HS-4: a later hello carrying `client` (186), or metadata a real server refuses, is the
        // Document path's refusal.
        let router = state.role.is_router();
        let metadata_refused = hot.client.is_some_and(|client| {
            self.seen_hello
                || decoded_document(client)
                    .is_none_or(|c| crate::refusals::client_metadata_refusal(&c, router).is_some())
        });
        if metadata_refused
            || hot
                .db
                .is_none_or(|db| crate::database_name::validity_refusal(db, router).is_some())
            || (state.require_api_version && !hot.api_version)
            || self.auth.refuse(&state.users, name).is_some()
            // HS-3: `hello` on a server that does not offer it is the Document path's 59.
            || (name == "hello" && !shared.offers_hello)
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
        // SE-17: where the Document path takes the gossiped `$clusterTime`.
        if let (false, Some(time)) = (state.role == Role::Standalone, hot.cluster_time) {
            state.data.lock().advance_clock(time);
        }
        if hot.hello {
            return Some(self.answer_hello(state, shared, hot, body));
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
        if self.replies.ping.as_ref().is_some_and(|r| r.key == time) {
            return Some(Answer::Cached(Cached::Ping));
        }
        let mut reply = ok();
        if let Some(time) = time {
            insert_cluster_time(&mut reply, time);
        }
        Some(match reply.to_vec() {
            Ok(body) => {
                self.replies.ping = Some(Reply { key: time, body });
                Answer::Cached(Cached::Ping)
            }
            // Not for these fields; `send` answers as the Document path would.
            Err(_) => Answer::Counted(reply),
        })
    }

    /// HS-4: records the handshake, then answers it as the Document path does (a hello reply
    /// has `ok: 1` and no cluster time).
    fn answer_hello(
        &mut self,
        mut state: MutexGuard<'_, State>,
        shared: &Shared,
        hot: &Hot<'_>,
        body: &RawDocumentBuf,
    ) -> Answer {
        state.record_hello(self.id, Recorded::Raw(body.clone()));
        self.seen_hello = true;
        if let Some(app_name) = hot.app_name {
            if self.app_name.as_deref() != Some(app_name) {
                self.app_name = Some(app_name.to_owned());
            }
        }
        let counts = state.counters.command_mut(hot.name);
        counts.received += 1;
        counts.executed += 1;
        counts.succeeded += 1;
        let key = HelloKey {
            name: hot.name,
            ask: hot.ask,
            counter: state.topology_counter,
            service_id: self.service_id(&mut state, shared),
        };
        if self.replies.hello.as_ref().is_some_and(|r| r.key == key) {
            return Answer::Cached(Cached::Hello);
        }
        let reply = self.hello_reply(&mut state, shared, hot.name, hot.ask);
        drop(state);
        match reply.to_vec() {
            Ok(body) => {
                self.replies.hello = Some(Reply { key, body });
                Answer::Cached(Cached::Hello)
            }
            Err(_) => Answer::Counted(reply),
        }
    }

    /// A cached reply body's frame with the next `requestID`, answering `response_to`, in the
    /// connection's reused buffer: the bytes `OpMsg::encode` gives.
    fn cached_frame(&mut self, cached: Cached, response_to: i32) -> Vec<u8> {
        self.last_request_id = self.last_request_id.wrapping_add(1);
        let mut bytes = core::mem::take(&mut self.out);
        bytes.clear();
        let body = match cached {
            Cached::Ping => self.replies.ping.as_ref().map(|r| &r.body),
            Cached::Hello => self.replies.hello.as_ref().map(|r| &r.body),
        };
        let body = body.map_or(&[][..], |body| &body[..]);
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
    to_document(RawDocument::from_bytes(bytes).ok()?).ok()
}

/// The request as the Document decoder would have given it (`wire::to_document` is its
/// conversion).
pub(super) fn decoded(request: &RawOpMsg) -> Option<OpMsg> {
    let sequences = request
        .sequences
        .iter()
        .map(|sequence| {
            let documents = sequence
                .documents
                .iter()
                .map(|d| to_document(d).ok())
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
        body: to_document(&request.body).ok()?,
        sequences,
    })
}
