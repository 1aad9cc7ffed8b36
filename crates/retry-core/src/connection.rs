//! One connection's state machine: connecting → handshaking → (authenticating) → ready ⇄ in
//! flight → closed.
//!
//! ```text
//!              handle_connected          handshake reply valid
//!  Connecting ─────────────────▶ Handshaking ─────────────────▶ Ready ◀──────────┐
//!      │                             │    │                   ▲   │ send_command  │ reply
//!      │                             │    │ with credentials  │   ▼               │
//!      │                             │    └──▶ Authenticating ┘ InFlight ─────────┘
//!      │ closed / connect timeout    │ closed / timeout /  │          │ closed / request timeout /
//!      ▼                             ▼ bad reply           ▼          ▼ garbage
//!    Closed ◀────────────────────────┴─────────────────────┴──────────┘
//! ```
//!
//! A pooled connection with an [`Authentication`] (AU-2) runs its conversation between the
//! handshake reply and `Ready`: each step's command goes out as OP_MSG and its reply goes back to
//! the conversation, under the establishment deadline. Only then is the handshake complete
//! ([`ConnectionEvent::HandshakeComplete`], [`Connection::handshake`]): an authentication failure
//! is an error before the handshake completed (AU-11), in [`NetworkPhase::Authentication`], which
//! carries no overload labels (HS-9).
//!
//! The machine owns no socket and reads no clock (quinn-proto style). The adapter feeds it
//! `handle_connected`, `handle_bytes`, `handle_closed` and `handle_timeout`, each with `now`, then
//! drains [`Connection::poll_transmit`] (bytes to write, appended to the caller's buffer) and [`Connection::poll_event`] (handshake
//! complete, a reply, a failure) and sleeps until [`Connection::poll_timeout`]. A spurious
//! `handle_timeout` is harmless.
//!
//! Every failure closes the connection and only this connection: the machine emits one
//! [`ConnectionEvent::Failed`] and then ignores further input. A failure carries the facts the retry
//! rules need ([`ConnectionError::to_operation_error`]): whether it was a network error or timeout,
//! in which phase (connect, handshake, before or after the command was sent), so that CMAP's
//! overload labels are applied by [`OperationError::network`] (HS-9) and never here.

use alloc::boxed::Box;
use alloc::collections::VecDeque;
use alloc::string::String;
use alloc::vec::Vec;
use bson::Document;
use core::fmt;
use core::time::Duration;

use crate::address::ServerAddress;
use crate::auth::{AuthFailure, AuthStep, Authentication};
use crate::error::{NetworkCause, NetworkErrorKind, NetworkPhase, OperationError};
use crate::handshake::{
    validate_reply_of, HandshakeError, HandshakeReply, DEFAULT_MAX_BSON_OBJECT_SIZE,
};
use crate::time::Instant;
use crate::topology::ServerType;
use crate::wire::{
    to_document, DecodeError, Decompressor, DocumentSequence, EncodeError, EncodedSizes,
    FrameDecoder, MsgFlags, MsgParts, OpMsg, RawOpMsg, COMMAND_OVERHEAD_BYTES,
    DEFAULT_MAX_MESSAGE_SIZE_BYTES,
};

/// `connectTimeoutMS` when unset: 10 seconds, covering TCP, TLS and the handshake.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How a connection is set up.
#[derive(Clone, Debug)]
pub struct ConnectionConfig {
    /// The server this connection goes to.
    pub address: ServerAddress,
    /// The pool generation when the connection was created (CM-1). In load-balanced mode the pool
    /// replaces it by the `serviceId`'s generation after the handshake (CM-5).
    pub generation: u32,
    /// `connectTimeoutMS`: the limit from creation to a validated handshake reply; zero means no
    /// limit (URI options).
    pub connect_timeout: Duration,
    /// CS-3: the CSOT deadline of the operation that asked for this connection, if any; it caps
    /// the connect timeout.
    pub establishment_deadline: Option<Instant>,
    /// `socketTimeoutMS`: the limit on each request's round trip when the request has no earlier
    /// deadline of its own; `None` or zero for no limit (URI options).
    pub socket_timeout: Option<Duration>,
    /// `loadBalanced=true`: the handshake reply must carry a `serviceId` (LB-8).
    pub load_balanced: bool,
    /// WP-8: decompresses replies for the compressors offered in the handshake (`compression`);
    /// `None` when none are offered (`noop` needs none).
    pub decompressor: Option<Decompressor>,
}

impl ConnectionConfig {
    /// A configuration with the default timeouts, generation 0, not load-balanced.
    pub fn new(address: ServerAddress) -> ConnectionConfig {
        ConnectionConfig {
            address,
            generation: 0,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            establishment_deadline: None,
            socket_timeout: None,
            load_balanced: false,
            decompressor: None,
        }
    }
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ConnectionState {
    /// Waiting for the adapter to open the socket.
    Connecting,
    /// The handshake command is out; waiting for its reply.
    Handshaking,
    /// AU-2: an authentication command is out; waiting for its reply.
    Authenticating,
    /// Idle and usable.
    Ready,
    /// A command is out; waiting for its reply.
    InFlight,
    /// Closed, after a failure; the adapter closes the socket.
    Closed,
}

/// A command to send on a ready connection.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Request {
    /// The command document, `$db` included (WP-5).
    pub body: Document,
    /// Kind-1 sections (WP-4).
    pub sequences: Vec<DocumentSequence>,
    /// WP-6: send with `moreToCome` and expect no reply (unacknowledged `w:0` writes only).
    pub unacknowledged: bool,
    /// WP-6: send with `exhaustAllowed`, so the server may stream several replies (`moreToCome`);
    /// only for `getMore` and `hello` / legacy hello.
    pub exhaust_allowed: bool,
    /// The CSOT deadline of the attempt (CS-4), if any; `socketTimeoutMS` applies when it is later
    /// or absent, unless [`Request::under_timeout_ms`].
    pub deadline: Option<Instant>,
    /// TO-8: the operation runs under `timeoutMS` (`0` included): `socketTimeoutMS` does not
    /// apply, only [`Request::deadline`].
    pub under_timeout_ms: bool,
}

impl Request {
    /// An acknowledged command with no document sequences and no deadline of its own.
    pub fn new(body: Document) -> Request {
        Request {
            body,
            sequences: Vec::new(),
            unacknowledged: false,
            exhaust_allowed: false,
            deadline: None,
            under_timeout_ms: false,
        }
    }
}

/// Why a command could not be sent. The connection is unchanged and nothing was written.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum SendError {
    /// The connection is not [`ConnectionState::Ready`].
    NotReady(ConnectionState),
    /// CS-4: the request's deadline has already passed; it is not sent.
    DeadlinePassed,
    /// WP-6: `exhaustAllowed` on a command other than `getMore` or `hello` / legacy hello, or
    /// together with `moreToCome`.
    ExhaustNotAllowed,
    /// The message does not encode or exceeds the connection's `maxMessageSizeBytes` (WP-7).
    Encode(EncodeError),
    /// WP-7: the command's body, or a document of a kind-1 sequence, is larger than the
    /// connection's `maxBsonObjectSize` plus [`COMMAND_OVERHEAD_BYTES`]: the bound a server puts
    /// on each of them alike (`BSONObjMaxInternalSize`, 16 MiB + 16 KiB), since an `updates`,
    /// `deletes` or `ops` statement wraps a document that may itself be `maxBsonObjectSize`
    /// large (review35 Z2, house rule 7). An inserted document over `maxBsonObjectSize` is the
    /// server's to refuse (a write error for that document), as it is for a body, except in an
    /// unacknowledged request (`moreToCome`, WP-6): no reply would carry that refusal, so there
    /// each sequence document is bounded by `maxBsonObjectSize` itself (review36 V1, house rule
    /// 11: never a silent loss).
    BsonObjectTooLarge {
        /// `None` for the command's body; else the sequence's identifier and the document's
        /// index in it.
        document: Option<(String, usize)>,
        /// Its encoded length.
        length: usize,
        /// The connection's `maxBsonObjectSize`.
        max_bson_object_size: u32,
        /// The bytes allowed over `maxBsonObjectSize`: [`COMMAND_OVERHEAD_BYTES`], or 0 for a
        /// sequence document of an unacknowledged request.
        allowance: usize,
    },
}

impl fmt::Display for SendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SendError::NotReady(state) => write!(f, "connection is {state:?}, not ready"),
            SendError::DeadlinePassed => {
                f.write_str("the deadline passed before the command was sent")
            }
            SendError::ExhaustNotAllowed => {
                f.write_str("exhaustAllowed is only for acknowledged getMore and hello")
            }
            SendError::Encode(e) => write!(f, "{e}"),
            SendError::BsonObjectTooLarge {
                document,
                length,
                max_bson_object_size,
                allowance,
            } => {
                match document {
                    None => write!(f, "the command body of {length} bytes")?,
                    Some((identifier, index)) => write!(
                        f,
                        "document {index} of the {identifier:?} sequence, of {length} bytes,"
                    )?,
                }
                write!(f, " exceeds maxBsonObjectSize {max_bson_object_size}")?;
                if *allowance > 0 {
                    write!(f, " + {allowance} bytes")?;
                } else {
                    f.write_str(" in an unacknowledged write")?;
                }
                f.write_str(" (WP-7)")
            }
        }
    }
}

impl core::error::Error for SendError {}

/// A protocol violation by the peer: the stream can no longer be trusted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProtocolError {
    /// The bytes are not a valid OP_MSG stream (garbage, bad length, bad section, bad BSON, ...).
    Decode(DecodeError),
    /// A reply whose `responseTo` is not the request waiting for one (or, while replies stream,
    /// the previous reply), or none is waiting.
    UnexpectedResponseTo {
        /// The `responseTo` of the reply.
        response_to: i32,
        /// The request id a reply was expected for, if any.
        expected: Option<i32>,
    },
    /// WP-6: a reply with `moreToCome` to a request that did not set `exhaustAllowed`.
    UnrequestedMoreToCome,
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtocolError::Decode(e) => write!(f, "{e}"),
            ProtocolError::UnexpectedResponseTo {
                response_to,
                expected: Some(id),
            } => write!(f, "reply to request {response_to}, expected one to {id}"),
            ProtocolError::UnexpectedResponseTo {
                response_to,
                expected: None,
            } => write!(
                f,
                "reply to request {response_to} while none is outstanding"
            ),
            ProtocolError::UnrequestedMoreToCome => {
                f.write_str("reply has moreToCome but exhaustAllowed was not set")
            }
        }
    }
}

/// What made a connection fail.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum FailureCause {
    /// The adapter reported the socket closed, reset, or failing (DNS, TLS, I/O, ...), with the
    /// I/O error's kind and message when it gave them.
    Network(NetworkErrorKind, Option<NetworkCause>),
    /// The connect timeout or the request deadline passed.
    Timeout,
    /// The peer broke the protocol.
    Protocol(ProtocolError),
    /// The handshake reply was rejected.
    Handshake(HandshakeError),
    /// Authentication failed (AU-11).
    Authentication(AuthFailure),
}

/// A connection failure, with the facts the retry and SDAM rules read.
#[derive(Clone, Debug, PartialEq)]
pub struct ConnectionError {
    /// What happened.
    pub cause: FailureCause,
    /// When: connect, handshake, or before / after the current command was handed to the socket.
    pub phase: NetworkPhase,
    /// The request that was waiting for a reply, if any.
    pub request_id: Option<i32>,
}

impl ConnectionError {
    /// The error the affected operation sees. Network errors, timeouts and protocol violations are
    /// network errors (protocol corruption counts as I/O) built by [`OperationError::network`],
    /// which adds `SystemOverloadedError` + `RetryableError` in the connect and handshake phases
    /// (HS-9); a rejected handshake reply becomes [`HandshakeError::into_operation_error`].
    pub fn to_operation_error(&self, address: &ServerAddress) -> OperationError {
        let (kind, cause) = match &self.cause {
            FailureCause::Network(kind, cause) => (*kind, cause.clone()),
            FailureCause::Timeout => (NetworkErrorKind::Timeout, None),
            FailureCause::Protocol(ProtocolError::Decode(e)) => {
                (NetworkErrorKind::Io, Some(NetworkCause::Decode(e.clone())))
            }
            FailureCause::Protocol(p) => (
                NetworkErrorKind::Io,
                Some(NetworkCause::Protocol(p.to_string())),
            ),
            FailureCause::Handshake(e) => return e.clone().into_operation_error(address),
            FailureCause::Authentication(e) => return e.clone().into_operation_error(address),
        };
        let error = OperationError::network(kind, self.phase, address.clone());
        match cause {
            Some(cause) => error.with_cause(cause),
            None => error,
        }
    }
}

impl fmt::Display for ConnectionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.cause {
            FailureCause::Network(kind, None) => write!(f, "network error {kind:?}")?,
            FailureCause::Network(kind, Some(cause)) => {
                write!(f, "network error {kind:?}: {cause}")?
            }
            FailureCause::Timeout => f.write_str("timed out")?,
            FailureCause::Protocol(e) => write!(f, "protocol error: {e}")?,
            FailureCause::Handshake(e) => write!(f, "handshake rejected: {e}")?,
            FailureCause::Authentication(e) => write!(f, "{e}")?,
        }
        write!(f, " during {:?}", self.phase)
    }
}

impl core::error::Error for ConnectionError {}

/// An output of the machine, polled with [`Connection::poll_event`].
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ConnectionEvent {
    /// The handshake reply was valid; the connection is ready. Carries the server description,
    /// `serviceId` and this connection's limits, and the generation it was created with.
    HandshakeComplete {
        /// The validated reply.
        reply: Box<HandshakeReply>,
        /// [`ConnectionConfig::generation`].
        generation: u32,
    },
    /// A reply to the request `request_id`. The connection is ready again, unless the reply has
    /// `moreToCome` (`reply.flags`, WP-6: only after `exhaustAllowed`), in which case more replies
    /// to the same request follow. The reply document may still report a server error (`ok: 0`,
    /// see [`OperationError::from_reply`]).
    Reply {
        /// The id [`Connection::send_command`] returned.
        request_id: i32,
        /// The reply message, its documents left encoded (validated as
        /// [`FrameDecoder::decode`] converts them): read its fields in place, or convert it with
        /// [`to_document`].
        reply: RawOpMsg,
    },
    /// The connection failed and is closed.
    Failed(ConnectionError),
}

/// The request waiting for a reply.
#[derive(Clone, Copy, Debug)]
struct Outstanding {
    request_id: i32,
    /// The `responseTo` the next reply must carry: the request's id, then, while replies stream,
    /// the previous reply's id (WP-6).
    response_to: i32,
    /// The request set `exhaustAllowed`.
    exhaust: bool,
    /// The request's own (CSOT) deadline.
    deadline: Option<Instant>,
    /// TO-8: `socketTimeoutMS` does not apply.
    under_timeout_ms: bool,
    /// When it was queued (the handshake's round-trip time starts here).
    queued_at: Instant,
    /// Whether the adapter has taken its bytes (from then on it may have reached the server).
    handed_over: bool,
}

/// One connection (see the module docs for the states and the driving rules).
#[derive(Debug)]
pub struct Connection {
    config: ConnectionConfig,
    state: ConnectionState,
    decoder: FrameDecoder,
    /// The encoded handshake message (request id 1) until it is queued.
    hello: Vec<u8>,
    handshake: Option<HandshakeReply>,
    /// AU-2: the conversation of a connection that authenticates, until it is done.
    authentication: Option<Authentication>,
    /// The validated handshake reply while authentication runs (kept after a failure: LB-14).
    authenticating: Option<HandshakeReply>,
    /// The connect deadline (CS-3 capped), which also bounds authentication.
    establishment_deadline: Option<Instant>,
    /// A monitor's connection ([`Connection::set_monitoring`]): an incompatible wire-version
    /// range completes the handshake.
    monitoring: bool,
    /// Request ids are per connection: 1 (the handshake), 2, ... wrapping to 1 after `i32::MAX`.
    next_request_id: i32,
    outstanding: Option<Outstanding>,
    deadline: Option<Instant>,
    /// The bytes not yet taken by [`Connection::poll_transmit`]: messages are encoded straight
    /// into it, so a socket has one outbound buffer and no message gets its own allocation.
    outbound: Vec<u8>,
    /// WP-6: the instant the last request queued was written, when it is unacknowledged
    /// (`moreToCome`) and its bytes are still in `outbound`
    /// ([`Connection::take_unacknowledged_handed_over`]).
    unacknowledged: Option<Instant>,
    events: VecDeque<ConnectionEvent>,
}

/// HS-2: the handshake command as the OP_MSG (request id 1) a new connection writes first.
pub(crate) fn encode_handshake(handshake_command: Document) -> Result<Vec<u8>, EncodeError> {
    let mut hello = Vec::new();
    OpMsg::command(1, handshake_command).encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut hello)?;
    Ok(hello)
}

impl Connection {
    /// A connection created at `now`, waiting for its socket. `handshake_command` is the document
    /// from [`HandshakeOptions::command`](crate::handshake::HandshakeOptions::command); it is encoded
    /// here, so a command that cannot be sent is refused before any socket is opened.
    ///
    /// The connect timer starts now and covers TCP, TLS and the handshake; a CSOT deadline caps it
    /// (CS-3).
    pub fn new(
        config: ConnectionConfig,
        handshake_command: Document,
        now: Instant,
    ) -> Result<Connection, EncodeError> {
        let hello = encode_handshake(handshake_command)?;
        Ok(Connection::with_encoded_handshake(config, hello, now))
    }

    /// [`Connection::new`] with the handshake already encoded by [`encode_handshake`]: an engine
    /// encodes its handshake once (HS-2) and hands every socket a copy of the bytes.
    pub(crate) fn with_encoded_handshake(
        config: ConnectionConfig,
        hello: Vec<u8>,
        now: Instant,
    ) -> Connection {
        let connect_deadline = Some(config.connect_timeout)
            .filter(|t| !t.is_zero())
            .map(|t| now.saturating_add(t));
        let deadline = earliest(connect_deadline, config.establishment_deadline);
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        decoder.set_decompressor(config.decompressor);
        Connection {
            config,
            state: ConnectionState::Connecting,
            decoder,
            hello,
            handshake: None,
            authentication: None,
            authenticating: None,
            establishment_deadline: deadline,
            monitoring: false,
            next_request_id: 2,
            outstanding: None,
            deadline,
            outbound: Vec::new(),
            unacknowledged: None,
            events: VecDeque::new(),
        }
    }

    /// AU-2: this connection authenticates with `authentication` after the handshake, whose
    /// command must already carry [`Authentication::add_to_hello`]'s fields. Ignored once the
    /// socket is open.
    pub fn set_authentication(&mut self, authentication: Authentication) {
        if self.state == ConnectionState::Connecting {
            self.authentication = Some(authentication);
        }
    }

    /// Makes this a monitor's connection (SDAM monitoring; MO-1: its handshake is the first
    /// check): a handshake reply whose wire-version range does not overlap ours then completes
    /// the handshake, so that the server's description reaches SDAM, which records the
    /// incompatibility ([`TopologyDescription::compatibility_error`](
    /// crate::topology::TopologyDescription::compatibility_error)) and selection fails at once
    /// (SS-16 step 2, review32 R3). A monitor sends only `hello`. Any other connection refuses
    /// such a reply ([`HandshakeError::IncompatibleWireVersion`]). Ignored once the socket is
    /// open.
    pub fn set_monitoring(&mut self) {
        if self.state == ConnectionState::Connecting {
            self.monitoring = true;
        }
    }

    /// The current state.
    pub fn state(&self) -> ConnectionState {
        self.state
    }

    /// The configuration.
    pub fn config(&self) -> &ConnectionConfig {
        &self.config
    }

    /// The validated handshake reply, once the handshake (and authentication) is complete.
    pub fn handshake(&self) -> Option<&HandshakeReply> {
        self.handshake.as_ref()
    }

    /// The `serviceId` of the hello reply, known from the handshake on, authentication included
    /// (LB-14: an authentication error can then clear that service's pool).
    pub fn service_id(&self) -> Option<bson::oid::ObjectId> {
        self.handshake
            .as_ref()
            .or(self.authenticating.as_ref())
            .and_then(|r| r.service_id)
    }

    /// Input: the socket is open (TCP and TLS done). Sends the handshake (HS-1: the first command
    /// on every socket) as OP_MSG (HS-2). Ignored unless connecting.
    pub fn handle_connected(&mut self, now: Instant) {
        if self.state != ConnectionState::Connecting {
            return;
        }
        self.outbound = core::mem::take(&mut self.hello);
        self.outstanding = Some(Outstanding {
            request_id: 1,
            response_to: 1,
            exhaust: false,
            deadline: None,
            under_timeout_ms: false,
            queued_at: now,
            handed_over: false,
        });
        self.state = ConnectionState::Handshaking;
    }

    /// Input: bytes read from the socket, in any chunking. Each complete reply is matched to the
    /// outstanding request by `responseTo`; anything else fails the connection.
    pub fn handle_bytes(&mut self, mut bytes: &[u8], now: Instant) {
        while !bytes.is_empty() && self.state != ConnectionState::Closed {
            if let Some((consumed, message)) = self.decoder.decode_lone(bytes) {
                bytes = &bytes[consumed..];
                self.on_message(message, now);
                continue;
            }
            match self.decoder.decode_raw(bytes) {
                Ok((consumed, message)) => {
                    bytes = &bytes[consumed..];
                    if let Some(message) = message {
                        self.on_message(message, now);
                    }
                }
                Err(e) => self.fail(FailureCause::Protocol(ProtocolError::Decode(e))),
            }
        }
    }

    /// Input: the socket closed or failed, for `kind` of reason, with the adapter's I/O error as
    /// `cause` when it has one (kept by the operation error). Ignored once closed.
    pub fn handle_closed(
        &mut self,
        kind: NetworkErrorKind,
        cause: Option<NetworkCause>,
        _now: Instant,
    ) {
        self.fail(FailureCause::Network(kind, cause));
    }

    /// Input: the timer fired. Fails the connection with a timeout if its deadline has passed;
    /// otherwise does nothing.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| now >= d) {
            self.fail(FailureCause::Timeout);
        }
    }

    /// Sends `request` at `now` and returns its request id, which the reply event will carry.
    ///
    /// The request's deadline is the earlier of its own (CSOT) and `now + socketTimeoutMS`. An
    /// unacknowledged request (WP-6) expects no reply: the connection stays ready.
    pub fn send_command(&mut self, mut request: Request, now: Instant) -> Result<i32, SendError> {
        self.send(&mut request, now)
    }

    /// [`Connection::send_command`], leaving the request with the caller (its body and sequences
    /// are encoded where they are), so that a retry can send it again without rebuilding it.
    pub fn send(&mut self, request: &mut Request, now: Instant) -> Result<i32, SendError> {
        self.send_with(request, None, now, |_| Ok(()))
    }

    /// [`Connection::send`], with the elements of `encoded` (an operation's command kept encoded,
    /// issue 9) before the body's, except those the body replaces, and `append` writing
    /// pre-encoded elements at the end of the body (the engine's `$db` and `lsid`).
    pub(crate) fn send_with(
        &mut self,
        request: &mut Request,
        encoded: Option<&bson::RawDocument>,
        now: Instant,
        append: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
    ) -> Result<i32, SendError> {
        if self.state != ConnectionState::Ready {
            return Err(SendError::NotReady(self.state));
        }
        if request.deadline.is_some_and(|d| now >= d) {
            return Err(SendError::DeadlinePassed);
        }
        if request.exhaust_allowed {
            let streamable = encoded.is_none()
                && matches!(
                    request.body.keys().next().map(String::as_str),
                    Some("getMore" | "hello" | "isMaster" | "ismaster")
                );
            if request.unacknowledged || !streamable {
                return Err(SendError::ExhaustNotAllowed);
            }
        }
        let flags = match (request.unacknowledged, request.exhaust_allowed) {
            (true, _) => MsgFlags::MORE_TO_COME,
            (false, true) => MsgFlags::EXHAUST_ALLOWED,
            (false, false) => MsgFlags::NONE,
        };
        let request_id = self.next_request_id;
        let message = MsgParts {
            request_id,
            response_to: 0,
            flags,
            encoded,
            body: &request.body,
            sequences: &request.sequences,
        };
        let start = self.outbound.len();
        let sizes = message
            .encode_with(self.decoder.max_message_size(), &mut self.outbound, append)
            .map_err(SendError::Encode)?;
        if let Err(e) = self.check_object_sizes(&sizes, &request.sequences, request.unacknowledged)
        {
            self.outbound.truncate(start);
            return Err(e);
        }
        self.next_request_id = request_id.checked_add(1).unwrap_or(1);
        if request.unacknowledged {
            // WP-6: no reply will come; the request is done once its bytes are handed over.
            self.unacknowledged = Some(now);
            return Ok(request_id);
        }
        // An unacknowledged request queued before this one is no longer the last (its bytes
        // still go out first).
        self.unacknowledged = None;
        self.outstanding = Some(Outstanding {
            request_id,
            response_to: request_id,
            exhaust: request.exhaust_allowed,
            deadline: request.deadline,
            under_timeout_ms: request.under_timeout_ms,
            queued_at: now,
            handed_over: false,
        });
        self.deadline = self.request_deadline(request.deadline, request.under_timeout_ms, now);
        self.state = ConnectionState::InFlight;
        Ok(request_id)
    }

    /// WP-7: the body and each sequence document within the connection's `maxBsonObjectSize`
    /// plus [`COMMAND_OVERHEAD_BYTES`], the server's bound for both (review35 Z2); a sequence
    /// document of an unacknowledged request within `maxBsonObjectSize` itself (review36 V1).
    fn check_object_sizes(
        &self,
        sizes: &EncodedSizes,
        sequences: &[DocumentSequence],
        unacknowledged: bool,
    ) -> Result<(), SendError> {
        let max_bson_object_size = self
            .handshake
            .as_ref()
            .map_or(DEFAULT_MAX_BSON_OBJECT_SIZE, |h| h.max_bson_object_size);
        let max = (max_bson_object_size as usize).saturating_add(COMMAND_OVERHEAD_BYTES);
        let (largest, section, index) = sizes.largest_document;
        let document_allowance = if unacknowledged {
            0
        } else {
            COMMAND_OVERHEAD_BYTES
        };
        if sizes.body > max {
            Err(SendError::BsonObjectTooLarge {
                document: None,
                length: sizes.body,
                max_bson_object_size,
                allowance: COMMAND_OVERHEAD_BYTES,
            })
        } else if largest > (max_bson_object_size as usize).saturating_add(document_allowance) {
            let identifier = sequences
                .get(section)
                .map(|s| s.identifier.clone())
                .unwrap_or_default();
            Err(SendError::BsonObjectTooLarge {
                document: Some((identifier, index)),
                length: largest,
                max_bson_object_size,
                allowance: document_allowance,
            })
        } else {
            Ok(())
        }
    }

    /// A request's deadline: its own, and `now + socketTimeoutMS` unless it runs under
    /// `timeoutMS` (TO-8).
    fn request_deadline(
        &self,
        own: Option<Instant>,
        under_timeout_ms: bool,
        now: Instant,
    ) -> Option<Instant> {
        if under_timeout_ms {
            own
        } else {
            earliest(own, self.socket_deadline(now))
        }
    }

    /// `now + socketTimeoutMS`, unless unset or zero.
    fn socket_deadline(&self, now: Instant) -> Option<Instant> {
        self.config
            .socket_timeout
            .filter(|t| !t.is_zero())
            .map(|t| now.saturating_add(t))
    }

    /// Output: appends every byte waiting to be written to `buf`, in order, and says whether there
    /// were any. Once taken, the current command counts as possibly sent (a later failure is
    /// [`NetworkPhase::AfterSend`]).
    pub fn poll_transmit(&mut self, buf: &mut Vec<u8>) -> bool {
        if self.outbound.is_empty() {
            return false;
        }
        if buf.is_empty() {
            // Hand the whole buffer over and keep the caller's (already allocated) one.
            core::mem::swap(buf, &mut self.outbound);
        } else {
            buf.append(&mut self.outbound);
        }
        if let Some(outstanding) = &mut self.outstanding {
            outstanding.handed_over = true;
        }
        true
    }

    /// WP-6: after [`Connection::poll_transmit`] handed bytes over, the instant the last
    /// request queued was written, when that request is unacknowledged (`moreToCome`): its bytes
    /// were among those handed over, and nothing more will come for it. `None` otherwise, and
    /// after a failure (the bytes were dropped unsent). Inlined: one test of a field for a
    /// transmit of anything else.
    #[inline(always)]
    pub(crate) fn take_unacknowledged_handed_over(&mut self) -> Option<Instant> {
        match self.unacknowledged {
            Some(_) if self.outbound.is_empty() => self.unacknowledged.take(),
            _ => None,
        }
    }

    /// Whether [`Connection::poll_transmit`] has bytes to give.
    pub fn has_transmit(&self) -> bool {
        !self.outbound.is_empty()
    }

    /// Whether [`Connection::poll_event`] has an event to give.
    pub(crate) fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// Output: the next event.
    pub fn poll_event(&mut self) -> Option<ConnectionEvent> {
        self.events.pop_front()
    }

    /// Output: when [`Connection::handle_timeout`] should next be called: the connect deadline
    /// while establishing, the request deadline while in flight, none otherwise.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    #[inline]
    fn on_message(&mut self, message: RawOpMsg, now: Instant) {
        let expected = self.outstanding.map(|o| o.response_to);
        let Some(outstanding) = self
            .outstanding
            .filter(|o| o.response_to == message.response_to)
        else {
            return self.fail(FailureCause::Protocol(
                ProtocolError::UnexpectedResponseTo {
                    response_to: message.response_to,
                    expected,
                },
            ));
        };
        let more_to_come = message.flags.contains(MsgFlags::MORE_TO_COME);
        if more_to_come && !outstanding.exhaust {
            return self.fail(FailureCause::Protocol(ProtocolError::UnrequestedMoreToCome));
        }
        match self.state {
            ConnectionState::Handshaking | ConnectionState::Authenticating => {
                self.on_establishment_message(&message, outstanding, now)
            }
            _ if more_to_come => {
                // WP-6: the next reply answers this one; each gets a fresh socket timeout.
                self.outstanding = Some(Outstanding {
                    response_to: message.request_id,
                    ..outstanding
                });
                self.deadline =
                    self.request_deadline(outstanding.deadline, outstanding.under_timeout_ms, now);
                self.events.push_back(ConnectionEvent::Reply {
                    request_id: outstanding.request_id,
                    reply: message,
                });
            }
            _ => {
                self.become_ready();
                self.events.push_back(ConnectionEvent::Reply {
                    request_id: outstanding.request_id,
                    reply: message,
                });
            }
        }
    }

    /// The reply to the handshake or to an authentication step, still encoded: out of line
    /// (once per connection; issue 9: a command's reply takes the inlined rest of
    /// [`Connection::on_message`]).
    #[inline(never)]
    fn on_establishment_message(
        &mut self,
        message: &RawOpMsg,
        outstanding: Outstanding,
        now: Instant,
    ) {
        // The handshake and authentication read their replies as documents (once per
        // connection); a command's reply stays encoded.
        match to_document(&message.body) {
            Ok(body) => self.on_establishment_reply(body, outstanding, now),
            Err(e) => self.fail(FailureCause::Protocol(ProtocolError::Decode(e))),
        }
    }

    /// The reply to the handshake or to an authentication step.
    fn on_establishment_reply(&mut self, body: Document, outstanding: Outstanding, now: Instant) {
        match self.state {
            ConnectionState::Handshaking => {
                let round_trip = now.saturating_duration_since(outstanding.queued_at);
                match validate_reply_of(
                    &body,
                    &self.config.address,
                    self.config.load_balanced,
                    round_trip,
                    now,
                    !self.monitoring,
                ) {
                    Ok(reply) => {
                        self.decoder
                            .set_max_message_size(reply.max_message_size_bytes);
                        // AU-2: arbiters hold no users and are not authenticated.
                        let arbiter = reply.description.server_type == ServerType::RsArbiter;
                        match self.authentication.as_mut().filter(|_| !arbiter) {
                            Some(auth) => {
                                let step = auth.handle_hello(&body);
                                self.authenticating = Some(reply);
                                self.auth_step(step, now);
                            }
                            None => self.complete_handshake(reply),
                        }
                    }
                    Err(e) => self.fail(FailureCause::Handshake(e)),
                }
            }
            _ => {
                let step = match self.authentication.as_mut() {
                    Some(auth) => auth.handle_reply(&body),
                    None => Err(AuthFailure::Protocol("no conversation".into())),
                };
                self.auth_step(step, now);
            }
        }
    }

    /// The handshake, authentication included, is complete: the connection is ready.
    fn complete_handshake(&mut self, reply: HandshakeReply) {
        self.authentication = None;
        self.handshake = Some(reply.clone());
        self.become_ready();
        self.events.push_back(ConnectionEvent::HandshakeComplete {
            reply: Box::new(reply),
            generation: self.config.generation,
        });
    }

    /// AU-5: sends the conversation's next command, or completes the handshake, or fails.
    fn auth_step(&mut self, step: Result<AuthStep, AuthFailure>, now: Instant) {
        match step {
            Ok(AuthStep::Done) => match self.authenticating.take() {
                Some(reply) => self.complete_handshake(reply),
                None => self.fail(FailureCause::Authentication(AuthFailure::Protocol(
                    "no handshake reply".into(),
                ))),
            },
            Ok(AuthStep::Send(command)) => {
                let request_id = self.next_request_id;
                let message = OpMsg::command(request_id, command);
                if let Err(e) = message.encode(self.decoder.max_message_size(), &mut self.outbound)
                {
                    return self.fail(FailureCause::Authentication(AuthFailure::Protocol(
                        alloc::format!("the command cannot be sent: {e}"),
                    )));
                }
                self.next_request_id = request_id.checked_add(1).unwrap_or(1);
                self.outstanding = Some(Outstanding {
                    request_id,
                    response_to: request_id,
                    exhaust: false,
                    deadline: None,
                    under_timeout_ms: false,
                    queued_at: now,
                    handed_over: false,
                });
                // The establishment deadline keeps running; socketTimeoutMS bounds each step.
                self.deadline = earliest(self.establishment_deadline, self.socket_deadline(now));
                self.state = ConnectionState::Authenticating;
            }
            Err(failure) => self.fail(FailureCause::Authentication(failure)),
        }
    }

    fn become_ready(&mut self) {
        self.state = ConnectionState::Ready;
        self.outstanding = None;
        self.deadline = None;
    }

    /// Closes the connection with `cause`, once; later failures are ignored.
    fn fail(&mut self, cause: FailureCause) {
        let phase = match self.state {
            ConnectionState::Closed => return,
            ConnectionState::Connecting => NetworkPhase::Connect,
            ConnectionState::Handshaking => NetworkPhase::Handshake,
            ConnectionState::Authenticating => NetworkPhase::Authentication,
            ConnectionState::Ready => NetworkPhase::BeforeSend,
            ConnectionState::InFlight => match self.outstanding {
                Some(o) if o.handed_over => NetworkPhase::AfterSend,
                _ => NetworkPhase::BeforeSend,
            },
        };
        let request_id = match self.state {
            ConnectionState::InFlight => self.outstanding.map(|o| o.request_id),
            _ => None,
        };
        self.state = ConnectionState::Closed;
        self.authentication = None;
        self.outstanding = None;
        self.deadline = None;
        self.outbound.clear();
        self.unacknowledged = None;
        self.events
            .push_back(ConnectionEvent::Failed(ConnectionError {
                cause,
                phase,
                request_id,
            }));
    }
}

/// The earlier of two optional deadlines; `None` only when both are.
fn earliest(a: Option<Instant>, b: Option<Instant>) -> Option<Instant> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{ErrorKind, Labels, NetworkError};
    use crate::handshake::{ClientMetadata, HandshakeOptions, LOAD_BALANCER_UNSUPPORTED};
    use bson::doc;
    use bson::oid::ObjectId;

    const T0: Instant = Instant::from_millis(1_000);

    fn at(ms: u64) -> Instant {
        Instant::from_millis(1_000 + ms)
    }

    fn config() -> ConnectionConfig {
        ConnectionConfig {
            generation: 4,
            socket_timeout: Some(Duration::from_secs(5)),
            ..ConnectionConfig::new(ServerAddress::new("db", 27017))
        }
    }

    fn hello(load_balanced: bool) -> Document {
        HandshakeOptions {
            metadata: ClientMetadata::new("retry-core", "0.1.0"),
            load_balanced,
            server_api: None,
            compressors: Vec::new(),
        }
        .command()
        .unwrap()
    }

    fn open(config: ConnectionConfig) -> Connection {
        let load_balanced = config.load_balanced;
        Connection::new(config, hello(load_balanced), T0).unwrap()
    }

    /// The server side: decodes what the connection sent.
    fn sent(conn: &mut Connection) -> Vec<OpMsg> {
        let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let mut out = Vec::new();
        let mut bytes = Vec::new();
        while conn.poll_transmit(&mut bytes) {}
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let (n, msg) = dec.decode(rest).unwrap();
            rest = &rest[n..];
            out.push(msg.unwrap());
        }
        out
    }

    fn reply_bytes(response_to: i32, body: Document) -> Vec<u8> {
        let mut msg = OpMsg::command(1000 + response_to, body);
        msg.response_to = response_to;
        let mut out = Vec::new();
        msg.encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut out)
            .unwrap();
        out
    }

    fn server_hello() -> Document {
        doc! { "ok": 1, "isWritablePrimary": true, "maxWireVersion": 21, "maxMessageSizeBytes": 2000 }
    }

    fn ready() -> Connection {
        let mut conn = open(config());
        conn.handle_connected(at(10));
        let hello = sent(&mut conn);
        conn.handle_bytes(&reply_bytes(hello[0].request_id, server_hello()), at(13));
        assert!(matches!(
            conn.poll_event(),
            Some(ConnectionEvent::HandshakeComplete { .. })
        ));
        conn
    }

    fn failure(conn: &mut Connection) -> ConnectionError {
        match conn.poll_event() {
            Some(ConnectionEvent::Failed(e)) => {
                assert_eq!(conn.state(), ConnectionState::Closed);
                assert_eq!((conn.poll_event(), conn.poll_timeout()), (None, None));
                e
            }
            other => panic!("expected a failure, got {other:?}"),
        }
    }

    #[test]
    fn hs1_hs2_handshake_is_the_first_message_as_op_msg_to_admin_then_ready() {
        let mut conn = open(config());
        assert_eq!(conn.state(), ConnectionState::Connecting);
        assert_eq!(conn.poll_timeout(), Some(at(10_000)));
        assert!(!conn.has_transmit());
        conn.handle_connected(at(10));
        assert_eq!(conn.state(), ConnectionState::Handshaking);
        assert_eq!(
            conn.poll_timeout(),
            Some(at(10_000)),
            "connectTimeoutMS covers the handshake"
        );
        let out = sent(&mut conn);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].request_id, 1);
        assert_eq!(out[0].body, hello(false));
        assert_eq!(out[0].body.get_str("$db").unwrap(), "admin");
        conn.handle_bytes(&reply_bytes(1, server_hello()), at(13));
        let Some(ConnectionEvent::HandshakeComplete { reply, generation }) = conn.poll_event()
        else {
            panic!("no handshake event");
        };
        assert_eq!(generation, 4);
        assert_eq!(reply.description.server_type, ServerType::Standalone);
        assert_eq!(
            reply.description.average_rtt.get(),
            Some(Duration::from_millis(3))
        );
        assert_eq!(reply.max_message_size_bytes, 2000);
        assert_eq!(conn.state(), ConnectionState::Ready);
        assert_eq!(conn.poll_timeout(), None);
    }

    #[test]
    fn command_round_trip_with_socket_timeout_deadline() {
        let mut conn = ready();
        let id = conn
            .send_command(Request::new(doc! { "ping": 1, "$db": "admin" }), at(20))
            .unwrap();
        assert_eq!(id, 2);
        assert_eq!(conn.state(), ConnectionState::InFlight);
        assert_eq!(conn.poll_timeout(), Some(at(5_020)));
        let out = sent(&mut conn);
        assert_eq!(out[0].body, doc! { "ping": 1, "$db": "admin" });
        assert_eq!(out[0].request_id, 2);
        conn.handle_bytes(&reply_bytes(2, doc! { "ok": 1 }), at(25));
        let Some(ConnectionEvent::Reply { request_id, reply }) = conn.poll_event() else {
            panic!("no reply");
        };
        assert_eq!(
            (request_id, to_document(&reply.body).unwrap()),
            (2, doc! { "ok": 1 })
        );
        assert_eq!(
            (conn.state(), conn.poll_timeout()),
            (ConnectionState::Ready, None)
        );
    }

    #[test]
    fn cs4_an_earlier_csot_deadline_wins_and_a_passed_one_is_not_sent() {
        let mut conn = ready();
        let mut request = Request::new(doc! { "ping": 1 });
        request.deadline = Some(at(20));
        assert_eq!(
            conn.send_command(request.clone(), at(20)),
            Err(SendError::DeadlinePassed)
        );
        assert_eq!(
            (conn.state(), conn.has_transmit()),
            (ConnectionState::Ready, false)
        );
        request.deadline = Some(at(100));
        conn.send_command(request, at(20)).unwrap();
        assert_eq!(conn.poll_timeout(), Some(at(100)));
    }

    /// SS-16 step 2, review32 R3: an incompatible wire-version range fails a pooled
    /// connection's handshake, while a monitor's completes it with the server's description, for
    /// SDAM to record the incompatibility.
    #[test]
    fn ss16_r3_only_a_monitoring_connection_accepts_an_incompatible_hello() {
        let reply = doc! { "ok": 1, "isWritablePrimary": true, "minWireVersion": 99,
        "maxWireVersion": 100 };
        for monitoring in [false, true] {
            let mut conn = open(config());
            if monitoring {
                conn.set_monitoring();
            }
            conn.handle_connected(at(10));
            let hello = sent(&mut conn);
            conn.handle_bytes(&reply_bytes(hello[0].request_id, reply.clone()), at(13));
            if monitoring {
                let Some(ConnectionEvent::HandshakeComplete { reply, .. }) = conn.poll_event()
                else {
                    panic!("the monitor's handshake completes");
                };
                assert_eq!(reply.description.min_wire_version, 99);
                assert_eq!(conn.state(), ConnectionState::Ready);
            } else {
                let error = failure(&mut conn);
                assert!(
                    matches!(
                        &error.cause,
                        FailureCause::Handshake(HandshakeError::IncompatibleWireVersion(m))
                            if m.contains("requires wire version 99")
                    ),
                    "{error:?}"
                );
            }
        }
    }

    /// WP-7, review32 R11, review35 Z2: a connection whose handshake said `maxBsonObjectSize:
    /// 1000` refuses a body or a sequence document over 1000 + 16 KiB (the server's bound for
    /// both), writing nothing and staying ready; a body within the allowance and an `updates`
    /// document over `maxBsonObjectSize` but within the allowance go.
    #[test]
    fn wp7_r11_max_bson_object_size_bounds_the_body_and_each_sequence_document() {
        let mut conn = ready_with_max_bson_object_size_1000();
        // A body of `{insert: "c", x: <string>}` is 27 bytes plus the string's length.
        let body = |len: usize| doc! { "insert": "c", "x": "y".repeat(len - 27) };
        let limit = 1000 + COMMAND_OVERHEAD_BYTES;
        let refused = conn.send_command(Request::new(body(limit + 1)), at(20));
        assert_eq!(
            refused,
            Err(SendError::BsonObjectTooLarge {
                document: None,
                length: limit + 1,
                max_bson_object_size: 1000,
                allowance: COMMAND_OVERHEAD_BYTES,
            })
        );
        assert_eq!(
            refused.unwrap_err().to_string(),
            "the command body of 17385 bytes exceeds maxBsonObjectSize 1000 + 16384 bytes (WP-7)"
        );
        assert_eq!(
            (conn.state(), conn.has_transmit()),
            (ConnectionState::Ready, false)
        );
        // A document is `{x: <string>}`: 13 bytes plus the string's length.
        let document = |len: usize| doc! { "x": "y".repeat(len - 13) };
        let mut request = Request::new(doc! { "update": "c" });
        request.sequences = vec![
            DocumentSequence {
                identifier: "a".into(),
                documents: vec![document(20)],
            },
            DocumentSequence {
                identifier: "updates".into(),
                documents: vec![document(1100), document(limit + 1), document(20)],
            },
        ];
        let refused = conn.send_command(request.clone(), at(20));
        assert_eq!(
            refused,
            Err(SendError::BsonObjectTooLarge {
                document: Some(("updates".into(), 1)),
                length: limit + 1,
                max_bson_object_size: 1000,
                allowance: COMMAND_OVERHEAD_BYTES,
            })
        );
        assert_eq!(
            refused.unwrap_err().to_string(),
            "document 1 of the \"updates\" sequence, of 17385 bytes, exceeds maxBsonObjectSize \
             1000 + 16384 bytes (WP-7)"
        );
        assert_eq!(
            (conn.state(), conn.has_transmit()),
            (ConnectionState::Ready, false)
        );
        request.sequences[1].documents[1] = document(limit);
        conn.send_command(request, at(20))
            .expect("a document over maxBsonObjectSize, within the allowance, goes");
        let out = sent(&mut conn);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].sequences[1].documents.len(), 3);
        conn.handle_bytes(&reply_bytes(out[0].request_id, doc! { "ok": 1 }), at(21));
        assert!(matches!(
            conn.poll_event(),
            Some(ConnectionEvent::Reply { .. })
        ));
        conn.send_command(Request::new(body(limit)), at(22))
            .expect("a body within the allowance goes");
        assert_eq!(sent(&mut conn).len(), 1);
    }

    /// A connection whose handshake reply set `maxBsonObjectSize` to 1000 (WP-7).
    fn ready_with_max_bson_object_size_1000() -> Connection {
        let mut conn = open(config());
        conn.handle_connected(at(10));
        let hello = sent(&mut conn);
        let reply = doc! { "ok": 1, "isWritablePrimary": true, "maxWireVersion": 21,
        "maxBsonObjectSize": 1000 };
        conn.handle_bytes(&reply_bytes(hello[0].request_id, reply), at(13));
        assert!(matches!(
            conn.poll_event(),
            Some(ConnectionEvent::HandshakeComplete { .. })
        ));
        conn
    }

    /// Review36 V1 (WP-6, WP-7, house rule 11): in an unacknowledged request a sequence
    /// document over `maxBsonObjectSize` is refused before sending, even within the allowance
    /// an acknowledged one has: no reply would carry the server's refusal. At the limit it goes.
    #[test]
    fn wp7_an_unacknowledged_sequence_document_is_bounded_by_max_bson_object_size() {
        let mut conn = ready_with_max_bson_object_size_1000();
        // A document is `{x: <string>}`: 13 bytes plus the string's length.
        let document = |len: usize| doc! { "x": "y".repeat(len - 13) };
        let mut request = Request::new(doc! { "insert": "c", "writeConcern": { "w": 0 } });
        request.unacknowledged = true;
        request.sequences = vec![DocumentSequence {
            identifier: "documents".into(),
            documents: vec![document(20), document(1001)],
        }];
        let refused = conn.send_command(request.clone(), at(20));
        assert_eq!(
            refused,
            Err(SendError::BsonObjectTooLarge {
                document: Some(("documents".into(), 1)),
                length: 1001,
                max_bson_object_size: 1000,
                allowance: 0,
            })
        );
        assert_eq!(
            refused.unwrap_err().to_string(),
            "document 1 of the \"documents\" sequence, of 1001 bytes, exceeds maxBsonObjectSize \
             1000 in an unacknowledged write (WP-7)"
        );
        assert_eq!(
            (conn.state(), conn.has_transmit()),
            (ConnectionState::Ready, false)
        );
        request.sequences[0].documents[1] = document(1000);
        conn.send_command(request.clone(), at(21))
            .expect("a document at maxBsonObjectSize goes");
        assert_eq!(sent(&mut conn).len(), 1);
        // Acknowledged, the same document over maxBsonObjectSize is the server's to refuse.
        request.unacknowledged = false;
        request.body = doc! { "insert": "c" };
        request.sequences[0].documents[1] = document(1001);
        conn.send_command(request, at(22))
            .expect("acknowledged: within the allowance, it goes");
        assert_eq!(sent(&mut conn).len(), 1);
    }

    #[test]
    fn wp7_the_handshake_limit_applies_to_later_replies_and_commands() {
        let mut conn = ready();
        let big = doc! { "x": "y".repeat(3000) };
        assert!(matches!(
            conn.send_command(Request::new(big.clone()), at(20)),
            Err(SendError::Encode(EncodeError::TooLarge { max: 2000, .. }))
        ));
        assert_eq!(conn.state(), ConnectionState::Ready);
        let id = conn
            .send_command(Request::new(doc! { "find": "c" }), at(20))
            .unwrap();
        sent(&mut conn);
        conn.handle_bytes(&reply_bytes(id, big), at(21));
        let e = failure(&mut conn);
        assert!(matches!(
            e.cause,
            FailureCause::Protocol(ProtocolError::Decode(DecodeError::BadLength {
                max: 2000,
                ..
            }))
        ));
        assert_eq!((e.phase, e.request_id), (NetworkPhase::AfterSend, Some(id)));
    }

    #[test]
    fn wp6_unacknowledged_writes_set_more_to_come_and_expect_no_reply() {
        let mut conn = ready();
        let mut request = Request::new(doc! { "insert": "c", "writeConcern": { "w": 0 } });
        request.unacknowledged = true;
        assert_eq!(conn.send_command(request.clone(), at(20)), Ok(2));
        assert_eq!(
            (conn.state(), conn.poll_timeout()),
            (ConnectionState::Ready, None)
        );
        // Not handed over yet: the engine's operation is not done.
        assert_eq!(conn.take_unacknowledged_handed_over(), None);
        let out = sent(&mut conn);
        assert!(out[0].flags.contains(MsgFlags::MORE_TO_COME));
        // Handed over: once, with the instant it was written.
        assert_eq!(conn.take_unacknowledged_handed_over(), Some(at(20)));
        assert_eq!(conn.take_unacknowledged_handed_over(), None);
        assert_eq!(
            conn.send_command(Request::new(doc! { "ping": 1 }), at(21)),
            Ok(3)
        );
        assert_eq!(conn.take_unacknowledged_handed_over(), None);
        // An acknowledged request queued after an unacknowledged one is the last: the marker
        // goes (its reply ends the engine's operation).
        let mut conn = ready();
        conn.send_command(request.clone(), at(20)).unwrap();
        conn.send_command(Request::new(doc! { "ping": 1 }), at(20))
            .unwrap();
        sent(&mut conn);
        assert_eq!(conn.take_unacknowledged_handed_over(), None);
        // A failure before the bytes were taken drops them and the marker: nothing was sent.
        let mut conn = ready();
        conn.send_command(request, at(20)).unwrap();
        conn.handle_closed(NetworkErrorKind::Reset, None, at(21));
        assert!(!conn.has_transmit());
        assert_eq!(conn.take_unacknowledged_handed_over(), None);
        let e = failure(&mut conn);
        assert_eq!((e.phase, e.request_id), (NetworkPhase::BeforeSend, None));
    }

    fn streamed(request_id: i32, response_to: i32, more: bool) -> Vec<u8> {
        let mut msg = OpMsg::command(request_id, doc! { "ok": 1, "n": request_id });
        msg.response_to = response_to;
        if more {
            msg.flags = MsgFlags::MORE_TO_COME;
        }
        let mut bytes = Vec::new();
        msg.encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut bytes)
            .unwrap();
        bytes
    }

    #[test]
    fn wp6_exhaust_replies_chain_by_response_to_until_one_without_more_to_come() {
        let mut conn = ready();
        let mut request = Request::new(doc! { "hello": 1, "$db": "admin" });
        request.exhaust_allowed = true;
        let id = conn.send_command(request, at(20)).unwrap();
        assert!(sent(&mut conn)[0].flags.contains(MsgFlags::EXHAUST_ALLOWED));
        conn.handle_bytes(&streamed(50, id, true), at(30));
        let Some(ConnectionEvent::Reply { request_id, reply }) = conn.poll_event() else {
            panic!("no reply");
        };
        assert_eq!((request_id, reply.request_id), (id, 50));
        assert_eq!(conn.state(), ConnectionState::InFlight);
        assert_eq!(
            conn.poll_timeout(),
            Some(at(5_030)),
            "a fresh socket timeout per reply"
        );
        conn.handle_bytes(&streamed(51, 50, true), at(40));
        conn.handle_bytes(&streamed(52, 51, false), at(50));
        let ids: Vec<_> = core::iter::from_fn(|| conn.poll_event())
            .map(|e| match e {
                ConnectionEvent::Reply { request_id, reply } => (request_id, reply.request_id),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, vec![(id, 51), (id, 52)]);
        assert_eq!(
            (conn.state(), conn.poll_timeout()),
            (ConnectionState::Ready, None)
        );
    }

    #[test]
    fn wp6_a_streamed_reply_must_answer_the_previous_reply() {
        let mut conn = ready();
        let mut request = Request::new(doc! { "getMore": 5_i64, "collection": "c", "$db": "d" });
        request.exhaust_allowed = true;
        let id = conn.send_command(request, at(20)).unwrap();
        sent(&mut conn);
        conn.handle_bytes(&streamed(50, id, true), at(30));
        conn.handle_bytes(&streamed(51, id, false), at(31));
        assert!(matches!(
            conn.poll_event(),
            Some(ConnectionEvent::Reply { .. })
        ));
        assert_eq!(
            failure(&mut conn).cause,
            FailureCause::Protocol(ProtocolError::UnexpectedResponseTo {
                response_to: id,
                expected: Some(50)
            })
        );
    }

    #[test]
    fn wp6_exhaust_is_only_for_get_more_and_hello() {
        let mut conn = ready();
        let mut request = Request::new(doc! { "find": "c", "$db": "d" });
        request.exhaust_allowed = true;
        assert_eq!(
            conn.send_command(request, at(20)),
            Err(SendError::ExhaustNotAllowed)
        );
        let mut request = Request::new(doc! { "hello": 1, "$db": "admin" });
        request.exhaust_allowed = true;
        request.unacknowledged = true;
        assert_eq!(
            conn.send_command(request, at(20)),
            Err(SendError::ExhaustNotAllowed)
        );
        assert_eq!(
            (conn.state(), conn.has_transmit()),
            (ConnectionState::Ready, false)
        );
    }

    #[test]
    fn wp6_a_reply_with_more_to_come_is_a_protocol_error() {
        let mut conn = ready();
        let id = conn
            .send_command(Request::new(doc! { "ping": 1 }), at(20))
            .unwrap();
        sent(&mut conn);
        let mut msg = OpMsg::command(77, doc! { "ok": 1 });
        msg.response_to = id;
        msg.flags = MsgFlags::MORE_TO_COME;
        let mut bytes = Vec::new();
        msg.encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut bytes)
            .unwrap();
        conn.handle_bytes(&bytes, at(21));
        assert_eq!(
            failure(&mut conn).cause,
            FailureCause::Protocol(ProtocolError::UnrequestedMoreToCome)
        );
    }

    #[test]
    fn a_reply_in_one_byte_chunks_equals_one_chunk() {
        let mut whole = ready();
        let mut bytewise = ready();
        for conn in [&mut whole, &mut bytewise] {
            conn.send_command(Request::new(doc! { "ping": 1 }), at(20))
                .unwrap();
            sent(conn);
        }
        let bytes = reply_bytes(2, doc! { "ok": 1, "n": 5 });
        whole.handle_bytes(&bytes, at(30));
        for b in &bytes {
            bytewise.handle_bytes(core::slice::from_ref(b), at(30));
        }
        assert_eq!(whole.poll_event(), bytewise.poll_event());
        assert_eq!(whole.state(), bytewise.state());
    }

    #[test]
    fn hs9_connect_timeout_is_a_labelled_connect_phase_timeout() {
        let mut conn = open(config());
        conn.handle_timeout(at(9_999));
        assert_eq!(conn.poll_event(), None, "spurious wakeups are harmless");
        conn.handle_timeout(at(10_000));
        let e = failure(&mut conn);
        assert_eq!(
            (e.cause.clone(), e.phase),
            (FailureCause::Timeout, NetworkPhase::Connect)
        );
        let op = e.to_operation_error(&conn.config().address);
        assert_eq!(
            op.kind,
            ErrorKind::Network(NetworkError {
                kind: NetworkErrorKind::Timeout,
                phase: NetworkPhase::Connect,
                cause: None,
            })
        );
        assert_eq!(op.labels, Labels::OVERLOAD_RETRYABLE);
    }

    #[test]
    fn hs9_handshake_close_is_labelled_but_dns_failure_is_not() {
        let mut conn = open(config());
        conn.handle_connected(at(1));
        sent(&mut conn);
        conn.handle_closed(NetworkErrorKind::Reset, None, at(2));
        let e = failure(&mut conn);
        assert_eq!(e.phase, NetworkPhase::Handshake);
        assert!(e
            .to_operation_error(&conn.config().address)
            .is_retryable_overload());
        conn.handle_closed(NetworkErrorKind::Closed, None, at(3));
        assert_eq!(conn.poll_event(), None, "one failure per connection");

        let mut conn = open(config());
        conn.handle_closed(NetworkErrorKind::Dns, None, at(1));
        let e = failure(&mut conn);
        assert_eq!(e.phase, NetworkPhase::Connect);
        assert_eq!(
            e.to_operation_error(&conn.config().address).labels,
            Labels::NONE
        );
    }

    #[test]
    fn zero_connect_and_socket_timeouts_mean_no_limit() {
        let mut cfg = config();
        cfg.connect_timeout = Duration::ZERO;
        cfg.socket_timeout = Some(Duration::ZERO);
        let mut conn = open(cfg.clone());
        assert_eq!(conn.poll_timeout(), None);
        conn.handle_connected(at(1));
        conn.handle_bytes(&reply_bytes(1, server_hello()), at(2));
        conn.send_command(Request::new(doc! { "ping": 1 }), at(3))
            .unwrap();
        assert_eq!(conn.poll_timeout(), None);
        cfg.establishment_deadline = Some(at(50));
        assert_eq!(open(cfg).poll_timeout(), Some(at(50)));
    }

    #[test]
    fn cs3_a_csot_deadline_caps_the_connect_timeout() {
        let mut cfg = config();
        cfg.establishment_deadline = Some(at(300));
        assert_eq!(open(cfg).poll_timeout(), Some(at(300)));
    }

    #[test]
    fn close_before_and_after_the_command_was_handed_over() {
        let mut conn = ready();
        let id = conn
            .send_command(Request::new(doc! { "ping": 1 }), at(20))
            .unwrap();
        conn.handle_closed(NetworkErrorKind::Closed, None, at(21));
        let e = failure(&mut conn);
        assert_eq!(
            (e.phase, e.request_id),
            (NetworkPhase::BeforeSend, Some(id))
        );
        assert!(!e.to_operation_error(&conn.config().address).was_sent());

        let mut conn = ready();
        let id = conn
            .send_command(Request::new(doc! { "ping": 1 }), at(20))
            .unwrap();
        sent(&mut conn);
        conn.handle_timeout(at(5_020));
        let e = failure(&mut conn);
        assert_eq!(
            (e.cause.clone(), e.phase, e.request_id),
            (FailureCause::Timeout, NetworkPhase::AfterSend, Some(id))
        );
        let op = e.to_operation_error(&conn.config().address);
        assert!(op.was_sent() && op.labels.is_empty());
    }

    #[test]
    fn garbage_and_unknown_response_to_close_the_connection() {
        let mut conn = ready();
        conn.handle_bytes(b"definitely not an OP_MSG header", at(20));
        let e = failure(&mut conn);
        assert!(matches!(
            e.cause,
            FailureCause::Protocol(ProtocolError::Decode(_))
        ));
        assert_eq!(e.phase, NetworkPhase::BeforeSend);
        let op = e.to_operation_error(&conn.config().address);
        assert!(matches!(
            &op.kind,
            ErrorKind::Network(NetworkError {
                kind: NetworkErrorKind::Io,
                phase: NetworkPhase::BeforeSend,
                cause: Some(cause),
            }) if matches!(**cause, NetworkCause::Decode(_))
        ));

        let mut conn = ready();
        let id = conn
            .send_command(Request::new(doc! { "ping": 1 }), at(20))
            .unwrap();
        sent(&mut conn);
        conn.handle_bytes(&reply_bytes(id + 1, doc! { "ok": 1 }), at(21));
        assert_eq!(
            failure(&mut conn).cause,
            FailureCause::Protocol(ProtocolError::UnexpectedResponseTo {
                response_to: id + 1,
                expected: Some(id)
            })
        );
    }

    #[test]
    fn lb8_load_balanced_handshake_needs_a_service_id() {
        let mut cfg = config();
        cfg.load_balanced = true;
        let mut conn = open(cfg.clone());
        conn.handle_connected(at(1));
        assert!(sent(&mut conn)[0].body.contains_key("loadBalanced"));
        conn.handle_bytes(
            &reply_bytes(1, doc! { "ok": 1, "msg": "isdbgrid", "maxWireVersion": 21 }),
            at(2),
        );
        let e = failure(&mut conn);
        assert_eq!(e.phase, NetworkPhase::Handshake);
        let op = e.to_operation_error(&cfg.address);
        assert_eq!(
            op.to_string(),
            alloc::format!("handshake failed: {LOAD_BALANCER_UNSUPPORTED} from db:27017")
        );

        let id = ObjectId::from_bytes([7; 12]);
        let mut conn = open(cfg);
        conn.handle_connected(at(1));
        conn.handle_bytes(
            &reply_bytes(
                1,
                doc! { "ok": 1, "msg": "isdbgrid", "maxWireVersion": 21, "serviceId": id },
            ),
            at(2),
        );
        let Some(ConnectionEvent::HandshakeComplete { reply, .. }) = conn.poll_event() else {
            panic!("no handshake event");
        };
        assert_eq!(reply.service_id, Some(id));
    }

    #[test]
    fn wp8_a_noop_compressed_handshake_reply_is_accepted() {
        let mut conn = open(config());
        conn.handle_connected(at(1));
        sent(&mut conn);
        let plain = reply_bytes(1, server_hello());
        let mut frame = Vec::new();
        frame.extend(((plain.len() + 9) as i32).to_le_bytes());
        frame.extend(&plain[4..12]);
        frame.extend(crate::wire::OP_COMPRESSED.to_le_bytes());
        frame.extend(crate::wire::OP_MSG.to_le_bytes());
        frame.extend(((plain.len() - 16) as i32).to_le_bytes());
        frame.push(crate::wire::NOOP_COMPRESSOR_ID);
        frame.extend(&plain[16..]);
        conn.handle_bytes(&frame, at(2));
        assert!(matches!(
            conn.poll_event(),
            Some(ConnectionEvent::HandshakeComplete { .. })
        ));
    }

    #[test]
    fn sending_is_refused_unless_ready() {
        let mut conn = open(config());
        assert_eq!(
            conn.send_command(Request::new(doc! { "ping": 1 }), at(1)),
            Err(SendError::NotReady(ConnectionState::Connecting))
        );
    }
}

/// AU-2, AU-11: the authentication phase between the handshake reply and `Ready`.
#[cfg(test)]
mod auth_tests {
    use super::*;
    use crate::auth::toy::Toy;
    use crate::auth::AuthOptions;
    use crate::error::Labels;
    use crate::handshake::HandshakeOptions;
    use alloc::sync::Arc;
    use bson::spec::BinarySubtype;
    use bson::{doc, Binary};

    fn at(ms: u64) -> Instant {
        Instant::from_millis(1_000 + ms)
    }

    fn bin(b: &[u8]) -> Binary {
        Binary {
            subtype: BinarySubtype::Generic,
            bytes: b.to_vec(),
        }
    }

    /// A connection authenticating with the toy mechanism (speculative or not), its hello sent.
    fn authenticating(speculative: bool) -> (Connection, OpMsg) {
        let options = AuthOptions::new("db1", Arc::new(Toy("TOY", speculative)));
        let auth = Authentication::new(&options);
        let mut hello = HandshakeOptions::new().command().unwrap();
        auth.add_to_hello(&mut hello);
        let mut config = ConnectionConfig::new(ServerAddress::new("db", 27017));
        config.socket_timeout = Some(Duration::from_secs(5));
        let mut conn = Connection::new(config, hello, at(0)).unwrap();
        conn.set_authentication(auth);
        conn.handle_connected(at(1));
        let hello = sent(&mut conn).remove(0);
        (conn, hello)
    }

    fn sent(conn: &mut Connection) -> Vec<OpMsg> {
        let mut bytes = Vec::new();
        while conn.poll_transmit(&mut bytes) {}
        let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let (mut rest, mut out) = (&bytes[..], Vec::new());
        while !rest.is_empty() {
            let (n, msg) = dec.decode(rest).unwrap();
            rest = &rest[n..];
            out.push(msg.unwrap());
        }
        out
    }

    fn reply(conn: &mut Connection, response_to: i32, body: Document, now: Instant) {
        let mut msg = OpMsg::command(500 + response_to, body);
        msg.response_to = response_to;
        let mut bytes = Vec::new();
        msg.encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut bytes)
            .unwrap();
        conn.handle_bytes(&bytes, now);
    }

    fn hello_reply(extra: Document) -> Document {
        let mut d = doc! { "ok": 1, "isWritablePrimary": true, "maxWireVersion": 21 };
        d.extend(extra);
        d
    }

    #[test]
    fn au2_au5_two_step_conversation_runs_before_the_handshake_completes() {
        let (mut conn, hello) = authenticating(false);
        assert!(!hello.body.contains_key("speculativeAuthenticate"));
        reply(&mut conn, 1, hello_reply(doc! {}), at(3));
        assert_eq!(
            conn.poll_event(),
            None,
            "not complete before authentication"
        );
        assert_eq!(conn.state(), ConnectionState::Authenticating);
        assert!(conn.handshake().is_none());
        assert_eq!(
            conn.poll_timeout(),
            Some(at(3 + 5_000)),
            "socketTimeoutMS per step"
        );
        let start = sent(&mut conn).remove(0);
        assert_eq!(start.request_id, 2);
        assert_eq!(start.body.get_str("$db").unwrap(), "db1");
        assert_eq!(start.body.get_i32("saslStart").unwrap(), 1);
        assert!(!start.body.contains_key("lsid") && !start.body.contains_key("$clusterTime"));
        reply(
            &mut conn,
            2,
            doc! { "ok": 1, "conversationId": 3, "payload": bin(b"proof"), "done": false },
            at(4),
        );
        let cont = sent(&mut conn).remove(0);
        assert_eq!(cont.request_id, 3);
        assert_eq!(
            cont.body,
            doc! { "saslContinue": 1, "conversationId": 3, "payload": bin(b"ok"), "$db": "db1" }
        );
        reply(
            &mut conn,
            3,
            doc! { "ok": 1, "conversationId": 3, "payload": bin(b"verified"), "done": true },
            at(5),
        );
        let Some(ConnectionEvent::HandshakeComplete { reply, .. }) = conn.poll_event() else {
            panic!("no handshake event");
        };
        assert_eq!(
            reply.description.average_rtt.get(),
            Some(Duration::from_millis(2)),
            "the hello's round trip"
        );
        assert_eq!(
            (conn.state(), conn.poll_timeout()),
            (ConnectionState::Ready, None)
        );
        assert!(conn.handshake().is_some());
        assert_eq!(
            conn.send_command(Request::new(doc! { "ping": 1 }), at(6)),
            Ok(4)
        );
    }

    #[test]
    fn au4_speculative_reply_in_the_hello_skips_sasl_start() {
        let (mut conn, hello) = authenticating(true);
        let spec = hello.body.get_document("speculativeAuthenticate").unwrap();
        assert_eq!(spec.get_str("db").unwrap(), "db1");
        let first = doc! { "conversationId": 1, "payload": bin(b"proof"), "done": false };
        reply(
            &mut conn,
            1,
            hello_reply(doc! { "speculativeAuthenticate": first }),
            at(3),
        );
        let cont = sent(&mut conn).remove(0);
        assert_eq!(cont.body.get_i32("saslContinue").unwrap(), 1);
        reply(
            &mut conn,
            2,
            doc! { "ok": 1, "conversationId": 1, "payload": bin(b"verified"), "done": true },
            at(4),
        );
        assert!(matches!(
            conn.poll_event(),
            Some(ConnectionEvent::HandshakeComplete { .. })
        ));
    }

    #[test]
    fn au11_hs9_failures_while_authenticating_carry_no_overload_labels() {
        let address = ServerAddress::new("db", 27017);
        // A wrong password: the server's error 18.
        let (mut conn, _) = authenticating(false);
        reply(&mut conn, 1, hello_reply(doc! {}), at(3));
        sent(&mut conn);
        reply(
            &mut conn,
            2,
            doc! { "ok": 0, "code": 18, "codeName": "AuthenticationFailed",
            "errmsg": "Authentication failed." },
            at(4),
        );
        let Some(ConnectionEvent::Failed(e)) = conn.poll_event() else {
            panic!("no failure");
        };
        assert_eq!(e.phase, NetworkPhase::Authentication);
        let op = e.to_operation_error(&address);
        assert_eq!(op.server_error().and_then(|s| s.code), Some(18));
        assert_eq!(op.labels, Labels::NONE);
        assert_eq!(conn.state(), ConnectionState::Closed);

        // The server stops mid-conversation: a network error of the authentication phase.
        let (mut conn, _) = authenticating(false);
        reply(&mut conn, 1, hello_reply(doc! {}), at(3));
        sent(&mut conn);
        conn.handle_closed(NetworkErrorKind::Closed, None, at(4));
        let Some(ConnectionEvent::Failed(e)) = conn.poll_event() else {
            panic!("no failure");
        };
        let op = e.to_operation_error(&address);
        assert!(matches!(
            op.kind,
            crate::error::ErrorKind::Network(crate::error::NetworkError {
                phase: NetworkPhase::Authentication,
                ..
            })
        ));
        assert_eq!(op.labels, Labels::NONE, "HS-9: not an overload error");

        // A step that times out.
        let (mut conn, _) = authenticating(false);
        reply(&mut conn, 1, hello_reply(doc! {}), at(3));
        conn.handle_timeout(at(5_003));
        let Some(ConnectionEvent::Failed(e)) = conn.poll_event() else {
            panic!("no failure");
        };
        assert_eq!(
            (e.cause, e.phase),
            (FailureCause::Timeout, NetworkPhase::Authentication)
        );
    }

    #[test]
    fn au2_arbiters_are_not_authenticated() {
        let (mut conn, _) = authenticating(false);
        reply(
            &mut conn,
            1,
            doc! { "ok": 1, "arbiterOnly": true, "setName": "rs", "maxWireVersion": 21 },
            at(3),
        );
        assert!(matches!(
            conn.poll_event(),
            Some(ConnectionEvent::HandshakeComplete { .. })
        ));
        assert!(!conn.has_transmit());
    }
}
