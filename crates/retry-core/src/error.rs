//! Error facts and the pure classifiers the retry rules are written in.
//!
//! An [`OperationError`] is what one attempt (or the selection before it) failed with: a server
//! reply with `ok: 0` or a `writeConcernError` ([`ServerError`]), a network error with the phase it
//! happened in ([`NetworkError`]), a cleared pool, a failed server selection, an expired deadline, or
//! a cancellation. Classifiers are methods that answer the questions the specs ask: is it an overload
//! error (BP-1), a retryable overload error (BP-2), a retryable read error (RR-2), does it carry
//! `RetryableWriteError` (RW-8), was the command sent, did it perform no writes (RW-17).
//!
//! Parsing never fails: a reply whose fields have the wrong types becomes a *malformed* server error
//! that is never retried and keeps the raw document.

use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use bson::{Bson, Document};
use core::fmt;
use core::time::Duration;

use crate::address::ServerAddress;
use crate::wire::DecodeError;

/// The error labels the retry, transaction and SDAM rules look at, as a small set.
///
/// Labels not listed here are kept by [`ServerError::other_labels`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Labels(u8);

impl Labels {
    /// No labels.
    pub const NONE: Labels = Labels(0);
    /// `SystemOverloadedError`: the server (or the connection attempt) was overloaded (BP-1).
    pub const SYSTEM_OVERLOADED: Labels = Labels(1);
    /// `RetryableError`: safe to retry whatever the command (BP-4).
    pub const RETRYABLE: Labels = Labels(1 << 1);
    /// `RetryableWriteError`: a retryable write may be retried (RW-8).
    pub const RETRYABLE_WRITE: Labels = Labels(1 << 2);
    /// `NoWritesPerformed`: the server did not write anything (RW-17).
    pub const NO_WRITES_PERFORMED: Labels = Labels(1 << 3);
    /// `TransientTransactionError`: the whole transaction may be retried (TX-7).
    pub const TRANSIENT_TRANSACTION: Labels = Labels(1 << 4);
    /// `UnknownTransactionCommitResult`: the commit may or may not have happened (TX-8).
    pub const UNKNOWN_TRANSACTION_COMMIT_RESULT: Labels = Labels(1 << 5);
    /// Both overload labels: what CMAP adds to connection-establishment network errors (HS-9).
    pub const OVERLOAD_RETRYABLE: Labels = Labels(1 | 1 << 1);

    const NAMES: [(Labels, &'static str); 6] = [
        (Labels::SYSTEM_OVERLOADED, "SystemOverloadedError"),
        (Labels::RETRYABLE, "RetryableError"),
        (Labels::RETRYABLE_WRITE, "RetryableWriteError"),
        (Labels::NO_WRITES_PERFORMED, "NoWritesPerformed"),
        (Labels::TRANSIENT_TRANSACTION, "TransientTransactionError"),
        (
            Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT,
            "UnknownTransactionCommitResult",
        ),
    ];

    /// The label with this exact name, if it is one of the known ones.
    pub fn from_name(name: &str) -> Option<Labels> {
        Labels::NAMES
            .iter()
            .find(|(_, n)| *n == name)
            .map(|(l, _)| *l)
    }

    /// Whether every label in `other` is in `self`.
    pub const fn contains(self, other: Labels) -> bool {
        self.0 & other.0 == other.0
    }

    /// The union of two sets.
    pub const fn union(self, other: Labels) -> Labels {
        Labels(self.0 | other.0)
    }

    /// Whether the set is empty.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// The names of the labels in the set, in a fixed order.
    pub fn names(self) -> impl Iterator<Item = &'static str> {
        Labels::NAMES
            .iter()
            .filter(move |(l, _)| self.contains(*l))
            .map(|(_, n)| *n)
    }
}

impl core::ops::BitOr for Labels {
    type Output = Labels;
    fn bitor(self, rhs: Labels) -> Labels {
        self.union(rhs)
    }
}

impl fmt::Debug for Labels {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.names()).finish()
    }
}

/// The largest `baseBackoffMS` that changes anything: [`crate::backoff::MAX_BACKOFF`] caps every
/// backoff, and the smallest multiplier applied to the base is 2, so larger values are clamped to
/// this (BP-15).
pub const MAX_BASE_BACKOFF: Duration = Duration::from_secs(10);

/// A `writeConcernError` sub-document.
#[derive(Clone, Debug, PartialEq)]
pub struct WriteConcernError {
    /// Its `code`.
    pub code: Option<i32>,
    /// Its `codeName`.
    pub code_name: Option<String>,
    /// Its `errmsg`.
    pub message: String,
}

/// A server's direction to the gRPC A6 retry policy, read from an error reply.
///
/// gRPC servers send it as the `grpc-retry-pushback-ms` trailer. MongoDB has no equivalent; this
/// crate reads it from a top-level `retryPushbackMS` field (an int32 or int64, or a string in the
/// gRPC grammar), which the test server sends when asked to. Only
/// [`crate::policy::RetryPolicy::Grpc`] looks at it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pushback {
    /// Retry after exactly this delay, then restart the backoff from its initial value.
    RetryAfter(Duration),
    /// Do not retry (a negative or unparseable value).
    DoNotRetry,
}

impl Pushback {
    /// Parses a pushback value in the gRPC grammar: an ASCII signed 32-bit decimal integer of
    /// milliseconds without leading zeros. Anything else, and any negative value, means "do not
    /// retry".
    pub fn parse(s: &str) -> Pushback {
        let digits = s.strip_prefix('-').unwrap_or(s);
        let canonical = !digits.is_empty()
            && digits.bytes().all(|b| b.is_ascii_digit())
            && (digits == "0" || !digits.starts_with('0'));
        match s.parse::<i32>() {
            Ok(ms) if canonical => Pushback::from_millis(i64::from(ms)),
            _ => Pushback::DoNotRetry,
        }
    }

    /// A pushback of `ms` milliseconds; negative means "do not retry".
    pub fn from_millis(ms: i64) -> Pushback {
        match u64::try_from(ms) {
            Ok(ms) => Pushback::RetryAfter(Duration::from_millis(ms)),
            Err(_) => Pushback::DoNotRetry,
        }
    }

    fn from_bson(value: &Bson) -> Pushback {
        match value {
            Bson::Int32(ms) => Pushback::from_millis(i64::from(*ms)),
            Bson::Int64(ms) if i32::try_from(*ms).is_ok() => Pushback::from_millis(*ms),
            Bson::String(s) => Pushback::parse(s),
            _ => Pushback::DoNotRetry,
        }
    }
}

/// A command error from a server reply: `ok: 0`, or `ok: 1` with a `writeConcernError`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct ServerError {
    /// The top-level `code` (absent for an `ok: 1` reply that only has a `writeConcernError`).
    pub code: Option<i32>,
    /// The top-level `codeName`.
    pub code_name: Option<String>,
    /// The top-level `errmsg` (or the write concern error's message when there is none).
    pub message: String,
    /// The `writeConcernError`, if any.
    pub write_concern_error: Option<WriteConcernError>,
    /// A positive `baseBackoffMS`, clamped to [`MAX_BASE_BACKOFF`] (BP-15). Absent, zero, negative,
    /// NaN and non-numeric values are ignored.
    pub base_backoff: Option<Duration>,
    /// A gRPC-style pushback (see [`Pushback`]), if the reply carried one.
    pub pushback: Option<Pushback>,
    /// Labels with names this crate does not classify, as the server sent them.
    pub other_labels: Vec<String>,
    /// Whether a field had the wrong type. A malformed error is never retried.
    pub malformed: bool,
    /// The whole reply, unchanged.
    pub raw: Document,
}

impl ServerError {
    /// Reads the error out of a command reply, or `None` when the reply reports success (`ok: 1`
    /// without a `writeConcernError`).
    ///
    /// Returns the error and its labels (top-level `errorLabels` merged with the
    /// `writeConcernError`'s own `errorLabels`, which some servers send there). Never fails: wrong
    /// types mark the error [`malformed`](ServerError::malformed), which drops its code and labels so
    /// that no classifier can call it retryable.
    pub fn from_reply(reply: &Document) -> Option<(ServerError, Labels)> {
        let mut malformed = false;
        let ok = crate::reply::ok(reply).unwrap_or_else(|| {
            malformed = true;
            false
        });
        let write_concern_error = match reply.get("writeConcernError") {
            None => None,
            Some(Bson::Document(wce)) => Some(wce),
            Some(_) => {
                malformed = true;
                None
            }
        };
        if ok && write_concern_error.is_none() && !malformed {
            return None;
        }

        let mut labels = Labels::NONE;
        let mut other_labels = Vec::new();
        malformed |= !read_labels(reply, &mut labels, &mut other_labels);
        let wce = write_concern_error.map(|wce| {
            malformed |= !read_labels(wce, &mut labels, &mut other_labels);
            let code = read_code(wce, &mut malformed);
            let code_name = read_string(wce, "codeName", &mut malformed);
            let message = read_string(wce, "errmsg", &mut malformed).unwrap_or_default();
            WriteConcernError {
                code,
                code_name,
                message,
            }
        });
        let code = if ok {
            None
        } else {
            read_code(reply, &mut malformed)
        };
        let code_name = read_string(reply, "codeName", &mut malformed);
        let message = read_string(reply, "errmsg", &mut malformed)
            .or_else(|| wce.as_ref().map(|w| w.message.clone()))
            .unwrap_or_default();
        let base_backoff = reply.get("baseBackoffMS").and_then(base_backoff_from_bson);
        let pushback = reply.get("retryPushbackMS").map(Pushback::from_bson);

        let mut error = ServerError {
            code,
            code_name,
            message,
            write_concern_error: wce,
            base_backoff,
            pushback,
            other_labels,
            malformed,
            raw: reply.clone(),
        };
        if malformed {
            error.code = None;
            error.write_concern_error = None;
            labels = Labels::NONE;
        }
        Some((error, labels))
    }
}

/// `baseBackoffMS` as a duration: int32, int64 or double; only positive finite values count, and
/// they are clamped to [`MAX_BASE_BACKOFF`] (BP-15).
fn base_backoff_from_bson(value: &Bson) -> Option<Duration> {
    let ms = match value {
        Bson::Int32(v) => f64::from(*v),
        // int64 values past 2^53 lose precision here, but anything that large is clamped anyway.
        Bson::Int64(v) => *v as f64,
        Bson::Double(v) => *v,
        _ => return None,
    };
    if ms.is_nan() || ms <= 0.0 {
        return None;
    }
    let max_ms = MAX_BASE_BACKOFF.as_millis() as f64;
    if ms >= max_ms {
        return Some(MAX_BASE_BACKOFF);
    }
    // Round up to whole nanoseconds so a positive value stays positive (BP-17: at least).
    Some(Duration::from_nanos((ms * 1e6).ceil() as u64))
}

/// Reads `errorLabels` into `labels`; false when it is present with the wrong type.
fn read_labels(doc: &Document, labels: &mut Labels, other: &mut Vec<String>) -> bool {
    match doc.get("errorLabels") {
        None => true,
        Some(Bson::Array(items)) => {
            let mut well_formed = true;
            for item in items {
                match item {
                    Bson::String(name) => match Labels::from_name(name) {
                        Some(l) => *labels = labels.union(l),
                        None if !other.contains(name) => other.push(name.clone()),
                        None => {}
                    },
                    _ => well_formed = false,
                }
            }
            well_formed
        }
        Some(_) => false,
    }
}

fn read_code(doc: &Document, malformed: &mut bool) -> Option<i32> {
    match doc.get("code") {
        None => None,
        Some(Bson::Int32(c)) => Some(*c),
        Some(Bson::Int64(c)) => i32::try_from(*c).ok().or_else(|| {
            *malformed = true;
            None
        }),
        Some(Bson::Double(c))
            if c.fract() == 0.0 && (i32::MIN as f64..=i32::MAX as f64).contains(c) =>
        {
            Some(*c as i32)
        }
        Some(_) => {
            *malformed = true;
            None
        }
    }
}

fn read_string(doc: &Document, key: &str, malformed: &mut bool) -> Option<String> {
    match doc.get(key) {
        None => None,
        Some(Bson::String(s)) => Some(s.clone()),
        Some(_) => {
            *malformed = true;
            None
        }
    }
}

/// What went wrong on the network.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NetworkErrorKind {
    /// The peer closed the connection.
    Closed,
    /// The connection was reset.
    Reset,
    /// A connect, read or write timed out.
    Timeout,
    /// The host name could not be resolved. Never labelled (HS-9).
    Dns,
    /// The TLS certificate or host name did not verify.
    TlsCertificate,
    /// The SOCKS5 proxy failed.
    Socks5,
    /// Any other I/O error, including a corrupt or unparseable frame.
    Io,
}

/// When, in the life of a connection and an attempt, a network error happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NetworkPhase {
    /// Opening the socket (DNS, TCP, TLS).
    Connect,
    /// The `hello` handshake.
    Handshake,
    /// Authentication after `hello`.
    Authentication,
    /// On an established connection, before any byte of the command was written.
    BeforeSend,
    /// After the command (or part of it) was written.
    AfterSend,
}

/// Why a network error happened, as the socket layer or the frame decoder reported it: kept so
/// that the error says "connection refused" or "bad message length 1347703880" rather than only
/// its [`NetworkErrorKind`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum NetworkCause {
    /// An I/O error from the adapter's socket or resolver.
    Io {
        /// The name of its kind (e.g. `ConnectionRefused`, the `Debug` form of
        /// `std::io::ErrorKind`).
        kind: String,
        /// Its message.
        message: String,
    },
    /// The reply bytes were not a valid OP_MSG stream (WP-1..WP-3): the decoder's reason.
    Decode(DecodeError),
    /// Another protocol violation by the peer (a reply to the wrong request, ...).
    Protocol(String),
}

impl NetworkCause {
    /// An I/O cause from its kind's name and message.
    pub fn io(kind: impl Into<String>, message: impl Into<String>) -> NetworkCause {
        NetworkCause::Io {
            kind: kind.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for NetworkCause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NetworkCause::Io { kind, message } if message.is_empty() => f.write_str(kind),
            NetworkCause::Io { kind, message } => write!(f, "{message} ({kind})"),
            NetworkCause::Decode(e) => write!(f, "{e}"),
            NetworkCause::Protocol(message) => f.write_str(message),
        }
    }
}

impl core::error::Error for NetworkCause {
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match self {
            NetworkCause::Decode(e) => Some(e),
            _ => None,
        }
    }
}

/// A network error: its kind, the phase it happened in, and its cause when known.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct NetworkError {
    /// What went wrong.
    pub kind: NetworkErrorKind,
    /// When it went wrong.
    pub phase: NetworkPhase,
    /// The I/O error or decoder reason behind it, if the reporter gave one.
    pub cause: Option<Arc<NetworkCause>>,
}

impl NetworkError {
    /// Whether CMAP labels this error `SystemOverloadedError` + `RetryableError` (HS-9, CM-6):
    /// network errors and timeouts while connecting or during `hello`, except DNS failures,
    /// TLS certificate or host-name errors and SOCKS5 errors. Errors in authentication after
    /// `hello` are not labelled.
    pub fn is_establishment_overload(&self) -> bool {
        matches!(self.phase, NetworkPhase::Connect | NetworkPhase::Handshake)
            && !matches!(
                self.kind,
                NetworkErrorKind::Dns | NetworkErrorKind::TlsCertificate | NetworkErrorKind::Socks5
            )
    }

    /// Whether any byte of the command may have reached the server.
    pub fn was_sent(&self) -> bool {
        self.phase == NetworkPhase::AfterSend
    }
}

/// The kinds of error an operation's attempt can fail with.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The server answered with an error. Shared, so that cloning an error (the engine and the
    /// retry machine keep the error they may raise, monitoring and retries copy it) costs one
    /// reference count, not a copy of the reply; [`Arc::make_mut`] edits a private copy.
    Server(Arc<ServerError>),
    /// The network failed.
    Network(NetworkError),
    /// The connection pool was cleared while the attempt waited to check out a connection (CM-2).
    /// Nothing was sent. The cause is the error that cleared it.
    PoolCleared {
        /// What cleared the pool.
        cause: String,
    },
    /// No connection could be checked out, for a reason that is not retryable: the pool is closed
    /// or the wait queue timed out (CM-3, LB-13). Nothing was sent.
    Checkout {
        /// The pool's message.
        message: String,
    },
    /// No suitable server was found in time (the message describes the topology and criteria).
    ServerSelection {
        /// The selection error's message.
        message: String,
    },
    /// The client-side operation timeout expired (CS-5); wraps the error that was being handled.
    Timeout {
        /// The error the operation had when its deadline passed, if any.
        cause: Option<Box<OperationError>>,
    },
    /// The operation was cancelled by its caller.
    Cancelled,
    /// The caller used the API wrongly (for example a `getMore` of a cursor that is closed).
    /// Nothing was sent; never retried.
    Usage {
        /// What was wrong.
        message: String,
    },
    /// The server's handshake reply was rejected: no `serviceId` in load-balanced mode (LB-8), a
    /// wire-version range that does not overlap ours, or a malformed reply. Nothing was sent; the
    /// connection is closed.
    Handshake {
        /// Why, e.g. the exact LB-8 message.
        message: String,
    },
    /// An `ok: 1` write reply with `writeErrors`: the command ran, and some statements failed.
    /// Never produced by the engine (for it, and for command monitoring, the command succeeded:
    /// EV-3, and `writeErrors` never make a write retryable: RW-9); a driver turns such a reply
    /// into this error with [`OperationError::from_write_reply`]. Never retried.
    Write(Box<WriteErrors>),
    /// A bug of the engine's: one of its machines refused an input. The operation ends with this
    /// error rather than never (house rule 8); its connection is closed. Never retried.
    Internal {
        /// What was refused.
        message: String,
    },
}

/// One entry of a reply's `writeErrors`.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct WriteError {
    /// `index`: the statement's position in the batch.
    pub index: Option<i64>,
    /// `code`.
    pub code: Option<i32>,
    /// `codeName`.
    pub code_name: Option<String>,
    /// `errmsg`.
    pub message: String,
}

/// The statements of a write that failed, and the whole reply.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct WriteErrors {
    /// The `writeErrors` entries, in order.
    pub errors: Vec<WriteError>,
    /// The reply, unchanged (`n`, `nModified`, `upserted`, ...).
    pub reply: Document,
}

/// What one attempt of an operation failed with: the facts the retry rules read. Made by its
/// constructors ([`OperationError::network`], [`OperationError::from_reply`], ...).
///
/// A cause is both printed and returned: [`Display`](fmt::Display) includes a timeout's cause
/// (CS-5: its text includes it) and a network error's [`NetworkCause`], and
/// [`source`](core::error::Error::source) returns it (CS-5: the timeout wraps it; issue 9: a
/// source wherever an error wraps a cause). One `{error}` is the whole message; a report that
/// walks `source()` after it repeats the cause's text (review32 R15).
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub struct OperationError {
    /// What failed.
    pub kind: ErrorKind,
    /// The labels: the server's, plus the ones the driver adds (HS-9, RW-9).
    pub labels: Labels,
    /// The server that produced the error, when one did (RR-10).
    pub address: Option<ServerAddress>,
}

/// Top-level server error codes that make a read retryable (RR-2).
pub const RETRYABLE_READ_CODES: [i32; 13] = [
    262, 11600, 11602, 10107, 13435, 13436, 189, 134, 91, 7, 6, 89, 9001,
];

/// Error codes for which the driver adds `RetryableWriteError` to errors from servers older than
/// 4.4 (RW-9). The same list as [`RETRYABLE_READ_CODES`] minus 134.
pub const RETRYABLE_WRITE_CODES: [i32; 12] = [
    11600, 11602, 10107, 13435, 13436, 189, 91, 7, 6, 89, 9001, 262,
];

/// The wire version of MongoDB 4.4, from which servers add `RetryableWriteError` themselves (RW-9).
pub const WIRE_VERSION_4_4: i32 = 9;

/// The message the driver raises instead of the server's "Transaction numbers …" IllegalOperation
/// error (RW-16).
pub const RETRYABLE_WRITES_UNSUPPORTED: &str = "This MongoDB deployment does not support retryable writes. Please add retryWrites=false to your connection string.";

// By hand, so that the usual clone, a server error's (one reference count, the labels and the
// address), is inlined where a retry machine keeps an error.
impl Clone for OperationError {
    #[inline]
    fn clone(&self) -> OperationError {
        OperationError {
            kind: self.kind.share(),
            labels: self.labels,
            address: self.address.clone(),
        }
    }

    /// Copies `source` in place; a server error that shares `source`'s reply keeps it (no
    /// reference count).
    #[inline]
    fn clone_from(&mut self, source: &OperationError) {
        match (&self.kind, &source.kind) {
            (ErrorKind::Server(kept), ErrorKind::Server(reply)) if Arc::ptr_eq(kept, reply) => {}
            _ => self.kind = source.kind.share(),
        }
        self.labels = source.labels;
        self.address.clone_from(&source.address);
    }
}

impl ErrorKind {
    /// A copy: a server error's reply is shared (one reference count, inlined); the other kinds
    /// take the derived clone, out of line.
    #[inline]
    fn share(&self) -> ErrorKind {
        #[inline(never)]
        fn other(kind: &ErrorKind) -> ErrorKind {
            kind.clone()
        }
        match self {
            ErrorKind::Server(e) => ErrorKind::Server(Arc::clone(e)),
            kind => other(kind),
        }
    }
}

impl OperationError {
    /// Whether `other` is this very error, not only an equal one: a server error sharing the
    /// same reply (one [`Arc`], not a copy) with the same labels and address. Keeping either is
    /// then keeping the same thing; other kinds are never the same.
    #[inline]
    pub(crate) fn is_same(&self, other: &OperationError) -> bool {
        match (&self.kind, &other.kind) {
            (ErrorKind::Server(a), ErrorKind::Server(b)) => {
                Arc::ptr_eq(a, b) && self.labels == other.labels && self.address == other.address
            }
            _ => false,
        }
    }

    /// An error from a server reply, with the labels [`ServerError::from_reply`] found.
    pub fn server(error: ServerError, labels: Labels, address: ServerAddress) -> OperationError {
        OperationError {
            kind: ErrorKind::Server(Arc::new(error)),
            labels,
            address: Some(address),
        }
    }

    /// Reads an error out of a command reply from `address`; `None` when the reply reports success.
    pub fn from_reply(reply: &Document, address: &ServerAddress) -> Option<OperationError> {
        ServerError::from_reply(reply)
            .map(|(e, labels)| OperationError::server(e, labels, address.clone()))
    }

    /// A network error, labelled `SystemOverloadedError` + `RetryableError` when CMAP says so
    /// (HS-9, [`NetworkError::is_establishment_overload`]).
    pub fn network(
        kind: NetworkErrorKind,
        phase: NetworkPhase,
        address: ServerAddress,
    ) -> OperationError {
        let error = NetworkError {
            kind,
            phase,
            cause: None,
        };
        let labels = if error.is_establishment_overload() {
            Labels::OVERLOAD_RETRYABLE
        } else {
            Labels::NONE
        };
        OperationError {
            kind: ErrorKind::Network(error),
            labels,
            address: Some(address),
        }
    }

    /// The same error with the cause of its network error attached (an I/O error's kind and
    /// message, or the decoder's reason); errors of other kinds are returned unchanged. The cause
    /// is printed by `Display` and returned by [`core::error::Error::source`].
    pub fn with_cause(mut self, cause: NetworkCause) -> OperationError {
        if let ErrorKind::Network(n) = &mut self.kind {
            n.cause = Some(Arc::new(cause));
        }
        self
    }

    /// The cause of a network error, if it has one.
    pub fn network_cause(&self) -> Option<&NetworkCause> {
        match &self.kind {
            ErrorKind::Network(n) => n.cause.as_deref(),
            _ => None,
        }
    }

    /// The write errors of a successful write reply (`ok: 1` with a non-empty `writeErrors`), or
    /// `None` when it has none. Entries whose fields have the wrong types keep what can be read.
    pub fn from_write_reply(reply: &Document, address: &ServerAddress) -> Option<OperationError> {
        let Ok(entries) = reply.get_array("writeErrors") else {
            return None;
        };
        let errors: Vec<WriteError> = entries
            .iter()
            .filter_map(|e| match e {
                Bson::Document(e) => Some(e),
                _ => None,
            })
            .map(|e| {
                let mut ignored = false;
                WriteError {
                    index: match e.get("index") {
                        Some(Bson::Int32(i)) => Some(i64::from(*i)),
                        Some(Bson::Int64(i)) => Some(*i),
                        _ => None,
                    },
                    code: read_code(e, &mut ignored),
                    code_name: read_string(e, "codeName", &mut ignored),
                    message: read_string(e, "errmsg", &mut ignored).unwrap_or_default(),
                }
            })
            .collect();
        if errors.is_empty() {
            return None;
        }
        Some(OperationError {
            kind: ErrorKind::Write(Box::new(WriteErrors {
                errors,
                reply: reply.clone(),
            })),
            labels: Labels::NONE,
            address: Some(address.clone()),
        })
    }

    /// A checkout from a cleared (paused) pool (CM-2): retryable, nothing sent.
    pub fn pool_cleared(address: ServerAddress, cause: impl Into<String>) -> OperationError {
        OperationError {
            kind: ErrorKind::PoolCleared {
                cause: cause.into(),
            },
            labels: Labels::NONE,
            address: Some(address),
        }
    }

    /// A checkout that failed for a reason that is not retryable (CM-3).
    pub fn checkout(message: impl Into<String>, address: ServerAddress) -> OperationError {
        OperationError {
            kind: ErrorKind::Checkout {
                message: message.into(),
            },
            labels: Labels::NONE,
            address: Some(address),
        }
    }

    /// A server selection failure.
    pub fn server_selection(message: impl Into<String>) -> OperationError {
        OperationError {
            kind: ErrorKind::ServerSelection {
                message: message.into(),
            },
            labels: Labels::NONE,
            address: None,
        }
    }

    /// The caller used the API wrongly; nothing was sent.
    pub fn usage(message: impl Into<String>) -> OperationError {
        OperationError {
            kind: ErrorKind::Usage {
                message: message.into(),
            },
            labels: Labels::NONE,
            address: None,
        }
    }

    /// A bug of the engine's ended the operation (see [`ErrorKind::Internal`]).
    pub fn internal(message: impl Into<String>) -> OperationError {
        OperationError {
            kind: ErrorKind::Internal {
                message: message.into(),
            },
            labels: Labels::NONE,
            address: None,
        }
    }

    /// The operation was cancelled.
    pub fn cancelled() -> OperationError {
        OperationError {
            kind: ErrorKind::Cancelled,
            labels: Labels::NONE,
            address: None,
        }
    }

    /// The CSOT deadline expired while handling `cause` (CS-5). The timeout wraps the cause and
    /// keeps its labels and address: a commit that times out after a network or retryable write
    /// error (a socket timeout under CSOT is a network error transformed, CS-7) is still a commit
    /// whose result is unknown, and a statement's network error still makes the transaction
    /// transient, so the raised error says `UnknownTransactionCommitResult` (TX-8) or
    /// `TransientTransactionError` (TX-7) as the error it wraps does.
    pub fn timeout(cause: Option<OperationError>) -> OperationError {
        let (labels, address) = cause
            .as_ref()
            .map_or((Labels::NONE, None), |c| (c.labels, c.address.clone()));
        OperationError {
            kind: ErrorKind::Timeout {
                cause: cause.map(Box::new),
            },
            labels,
            address,
        }
    }

    /// The same error with more labels.
    pub fn with_labels(mut self, labels: Labels) -> OperationError {
        self.labels = self.labels.union(labels);
        self
    }

    /// The top-level server error code, if this is a server error with one.
    pub fn code(&self) -> Option<i32> {
        match &self.kind {
            ErrorKind::Server(e) => e.code,
            _ => None,
        }
    }

    /// The server error, if this is one.
    pub fn server_error(&self) -> Option<&ServerError> {
        match &self.kind {
            ErrorKind::Server(e) => Some(e),
            _ => None,
        }
    }

    /// Whether the error carries `label`.
    pub fn has_label(&self, label: Labels) -> bool {
        self.labels.contains(label)
    }

    /// BP-1: an overload error is one labelled `SystemOverloadedError`.
    pub fn is_overload(&self) -> bool {
        self.has_label(Labels::SYSTEM_OVERLOADED)
    }

    /// BP-2: a retryable overload error carries both `SystemOverloadedError` and `RetryableError`.
    pub fn is_retryable_overload(&self) -> bool {
        self.has_label(Labels::OVERLOAD_RETRYABLE)
    }

    /// RR-2: network errors (in any phase, the handshake included), `PoolClearedError`, and server
    /// errors whose top-level code is in [`RETRYABLE_READ_CODES`].
    pub fn is_retryable_read(&self) -> bool {
        match &self.kind {
            ErrorKind::Network(_) | ErrorKind::PoolCleared { .. } => true,
            ErrorKind::Server(e) => e.code.is_some_and(|c| RETRYABLE_READ_CODES.contains(&c)),
            _ => false,
        }
    }

    /// RW-8: a write error is retryable when it carries `RetryableWriteError`.
    pub fn is_retryable_write(&self) -> bool {
        self.has_label(Labels::RETRYABLE_WRITE)
    }

    /// RW-9: whether the driver adds `RetryableWriteError` to this error, given that `retryWrites`
    /// is on and the error came from a server with `max_wire_version` (mongos or not).
    ///
    /// Network errors (establishment included) and `PoolClearedError` always; errors from servers
    /// older than 4.4 when the top-level code, or a mongod's `writeConcernError` code, is in
    /// [`RETRYABLE_WRITE_CODES`]. Never because of `writeErrors`, never for 4.4+ replies.
    pub fn needs_retryable_write_label(&self, max_wire_version: i32, from_mongos: bool) -> bool {
        match &self.kind {
            ErrorKind::Network(_) | ErrorKind::PoolCleared { .. } => true,
            ErrorKind::Server(e) if max_wire_version < WIRE_VERSION_4_4 => {
                let listed = |c: Option<i32>| c.is_some_and(|c| RETRYABLE_WRITE_CODES.contains(&c));
                listed(e.code)
                    || (!from_mongos && listed(e.write_concern_error.as_ref().and_then(|w| w.code)))
            }
            _ => false,
        }
    }

    /// Whether the command may have reached the server: server errors and network errors after
    /// the write began. Selection, checkout and connection-establishment errors were not sent.
    pub fn was_sent(&self) -> bool {
        match &self.kind {
            // An internal error may have ended an attempt in flight: assume it was sent.
            ErrorKind::Server(_)
            | ErrorKind::Cancelled
            | ErrorKind::Write(_)
            | ErrorKind::Internal { .. } => true,
            ErrorKind::Usage { .. } => false,
            ErrorKind::Network(n) => n.was_sent(),
            ErrorKind::PoolCleared { .. }
            | ErrorKind::Checkout { .. }
            | ErrorKind::ServerSelection { .. }
            | ErrorKind::Handshake { .. } => false,
            ErrorKind::Timeout { cause } => cause.as_ref().is_some_and(|c| c.was_sent()),
        }
    }

    /// RW-17: an error shows that no write was attempted when it was raised before sending or the
    /// server labelled it `NoWritesPerformed`.
    pub fn no_writes_performed(&self) -> bool {
        !self.was_sent() || self.has_label(Labels::NO_WRITES_PERFORMED)
    }

    /// RW-16: turns the server's "Transaction numbers are only allowed …" IllegalOperation (code 20)
    /// into the message that tells the user to set `retryWrites=false`; other errors are unchanged.
    pub fn rewrite_unsupported_retryable_writes(mut self) -> OperationError {
        if let ErrorKind::Server(e) = &mut self.kind {
            if e.code == Some(20) && e.message.starts_with("Transaction numbers") {
                Arc::make_mut(e).message = RETRYABLE_WRITES_UNSUPPORTED.to_string();
            }
        }
        self
    }

    /// A small copyable summary for monitoring events.
    pub fn summary(&self) -> ErrorSummary {
        let class = match &self.kind {
            ErrorKind::Server(_) => ErrorClass::Server,
            ErrorKind::Network(_) => ErrorClass::Network,
            ErrorKind::PoolCleared { .. } => ErrorClass::PoolCleared,
            ErrorKind::Checkout { .. } => ErrorClass::Checkout,
            ErrorKind::ServerSelection { .. } => ErrorClass::ServerSelection,
            ErrorKind::Timeout { .. } => ErrorClass::Timeout,
            ErrorKind::Cancelled => ErrorClass::Cancelled,
            ErrorKind::Usage { .. } => ErrorClass::Usage,
            ErrorKind::Handshake { .. } => ErrorClass::Handshake,
            ErrorKind::Write(_) => ErrorClass::Write,
            ErrorKind::Internal { .. } => ErrorClass::Internal,
        };
        ErrorSummary {
            class,
            code: self.code(),
            labels: self.labels,
        }
    }
}

impl fmt::Display for OperationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            ErrorKind::Server(e) => {
                match (e.code, &e.code_name) {
                    (Some(c), Some(n)) => write!(f, "server error {c} ({n}): {}", e.message)?,
                    (Some(c), None) => write!(f, "server error {c}: {}", e.message)?,
                    _ if e.malformed => write!(f, "malformed server error reply: {}", e.raw)?,
                    _ => write!(f, "server error: {}", e.message)?,
                }
                if let Some(w) = &e.write_concern_error {
                    write!(
                        f,
                        " (write concern error {}: {})",
                        w.code.unwrap_or_default(),
                        w.message
                    )?;
                }
            }
            ErrorKind::Network(n) => {
                write!(f, "network error {:?} during {:?}", n.kind, n.phase)?;
                if let Some(cause) = &n.cause {
                    write!(f, ": {cause}")?;
                }
            }
            ErrorKind::PoolCleared { cause } => {
                write!(
                f,
                "Connection pool for {} was cleared because another operation failed with: {cause}",
                self.address.as_ref().map(ToString::to_string).unwrap_or_default()
            )?
            }
            ErrorKind::Checkout { message } => f.write_str(message)?,
            ErrorKind::ServerSelection { message } => {
                write!(f, "server selection failed: {message}")?
            }
            ErrorKind::Timeout { cause: Some(c) } => write!(f, "operation timed out: {c}")?,
            ErrorKind::Timeout { cause: None } => write!(f, "operation timed out")?,
            ErrorKind::Cancelled => write!(f, "operation cancelled")?,
            ErrorKind::Usage { message } | ErrorKind::Internal { message } => {
                f.write_str(message)?
            }
            ErrorKind::Handshake { message } => write!(f, "handshake failed: {message}")?,
            // `errors` is public and may have been emptied: no panic (house rule 11).
            ErrorKind::Write(w) if w.errors.is_empty() => write!(f, "write error")?,
            ErrorKind::Write(w) => {
                let first = &w.errors[0];
                write!(f, "write error")?;
                if let Some(code) = first.code {
                    write!(f, " {code}")?;
                }
                if let Some(name) = &first.code_name {
                    write!(f, " ({name})")?;
                }
                write!(f, ": {}", first.message)?;
                if let Some(index) = first.index {
                    write!(f, " at statement {index}")?;
                }
                if w.errors.len() > 1 {
                    write!(f, " (and {} more)", w.errors.len() - 1)?;
                }
            }
        }
        if !self.labels.is_empty() {
            write!(f, " {:?}", self.labels)?;
        }
        // A timeout's cause already names its server.
        let cause_named = matches!(&self.kind, ErrorKind::Timeout { cause: Some(_) });
        if let (Some(a), false) = (&self.address, cause_named) {
            write!(f, " from {a}")?;
        }
        Ok(())
    }
}

impl core::error::Error for OperationError {
    /// A network error's cause ([`NetworkCause`]), or the error a timeout wrapped (CS-5).
    fn source(&self) -> Option<&(dyn core::error::Error + 'static)> {
        match &self.kind {
            ErrorKind::Network(n) => n
                .cause
                .as_deref()
                .map(|c| c as &(dyn core::error::Error + 'static)),
            ErrorKind::Timeout { cause: Some(c) } => Some(&**c),
            _ => None,
        }
    }
}

/// The class of an [`OperationError`], without its details.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorClass {
    /// [`ErrorKind::Server`].
    Server,
    /// [`ErrorKind::Network`].
    Network,
    /// [`ErrorKind::PoolCleared`].
    PoolCleared,
    /// [`ErrorKind::Checkout`].
    Checkout,
    /// [`ErrorKind::ServerSelection`].
    ServerSelection,
    /// [`ErrorKind::Timeout`].
    Timeout,
    /// [`ErrorKind::Cancelled`].
    Cancelled,
    /// [`ErrorKind::Usage`].
    Usage,
    /// [`ErrorKind::Handshake`].
    Handshake,
    /// [`ErrorKind::Write`].
    Write,
    /// [`ErrorKind::Internal`].
    Internal,
}

/// A copyable summary of an error, carried by monitoring events.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ErrorSummary {
    /// The error's class.
    pub class: ErrorClass,
    /// The top-level server code, if any.
    pub code: Option<i32>,
    /// Its labels.
    pub labels: Labels,
}

/// MaxTimeMSExpired: matched by code only (CS-7).
pub const MAX_TIME_MS_EXPIRED: i32 = 50;

impl OperationError {
    /// CS-7: whether the server reported MaxTimeMSExpired, matched by code 50 only, at the top
    /// level, in `writeConcernError`, or in one of the `writeErrors`.
    pub fn is_max_time_expired(&self) -> bool {
        let max_time = |code: Option<i32>| code == Some(MAX_TIME_MS_EXPIRED);
        match &self.kind {
            ErrorKind::Server(e) => {
                max_time(e.code) || max_time(e.write_concern_error.as_ref().and_then(|w| w.code))
            }
            ErrorKind::Write(w) => w.errors.iter().any(|e| max_time(e.code)),
            _ => false,
        }
    }

    /// CS-7: the timeout error a MaxTimeMSExpired error becomes under `timeoutMS`. It wraps the
    /// server's error (CS-5) and keeps its labels, as every timeout does
    /// ([`OperationError::timeout`]): a commit's `UnknownTransactionCommitResult` (TX-8) is not
    /// lost.
    pub fn max_time_expired_timeout(self) -> OperationError {
        OperationError::timeout(Some(self))
    }
}

#[cfg(test)]
mod max_time_tests {
    use super::*;
    use bson::doc;

    /// CS-7: code 50 at the top level, in `writeConcernError` or in `writeErrors`; no other
    /// code, and no other place (a `codeName` alone is not matched).
    #[test]
    fn cs7_max_time_expired_is_code_50_at_the_top_in_the_write_concern_or_a_write_error() {
        let address = ServerAddress::new("a", 27017);
        let reply = |reply: Document| OperationError::from_reply(&reply, &address).unwrap();
        let write = |reply: Document| OperationError::from_write_reply(&reply, &address).unwrap();
        assert!(reply(doc! { "ok": 0, "code": 50 }).is_max_time_expired());
        assert!(
            reply(doc! { "ok": 1, "writeConcernError": { "code": 50, "errmsg": "x" } })
                .is_max_time_expired()
        );
        assert!(write(doc! { "ok": 1, "n": 0,
        "writeErrors": [{ "index": 0, "code": 11000 }, { "index": 1, "code": 50 }] })
        .is_max_time_expired());
        assert!(
            !reply(doc! { "ok": 0, "code": 262, "codeName": "MaxTimeMSExpired" })
                .is_max_time_expired()
        );
        assert!(
            !write(doc! { "ok": 1, "writeErrors": [{ "index": 0, "code": 11000 }] })
                .is_max_time_expired()
        );
        assert!(!OperationError::timeout(None).is_max_time_expired());
    }

    /// CS-5, TX-7, TX-8: every timeout keeps its cause's labels and address, not only a
    /// MaxTimeMSExpired's: a commit's network error (a socket timeout under CSOT included, CS-7)
    /// labelled `UnknownTransactionCommitResult` and `RetryableWriteError`, a statement's
    /// labelled `TransientTransactionError`. A timeout with no cause has no labels.
    #[test]
    fn cs5_a_timeout_keeps_the_labels_of_its_cause() {
        let address = ServerAddress::new("a", 27017);
        for kind in [NetworkErrorKind::Timeout, NetworkErrorKind::Reset] {
            for labels in [
                Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT.union(Labels::RETRYABLE_WRITE),
                Labels::TRANSIENT_TRANSACTION,
            ] {
                let cause = OperationError::network(kind, NetworkPhase::AfterSend, address.clone())
                    .with_labels(labels);
                let timeout = OperationError::timeout(Some(cause.clone()));
                assert_eq!(timeout.labels, labels, "{timeout}");
                assert_eq!(timeout.address, Some(address.clone()));
                assert!(
                    matches!(&timeout.kind, ErrorKind::Timeout { cause: Some(c) } if **c == cause)
                );
            }
        }
        assert_eq!(OperationError::timeout(None).labels, Labels::NONE);
    }

    /// CS-7, CS-5, TX-8: the timeout wraps the 50, names its server and keeps its labels.
    #[test]
    fn cs7_the_timeout_keeps_the_cause_its_address_and_its_labels() {
        let address = ServerAddress::new("a", 27017);
        let cause = OperationError::from_reply(&doc! { "ok": 0, "code": 50 }, &address)
            .unwrap()
            .with_labels(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT);
        let timeout = cause.clone().max_time_expired_timeout();
        assert_eq!(timeout.labels, Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT);
        assert_eq!(timeout.address, Some(address));
        assert!(
            matches!(&timeout.kind, ErrorKind::Timeout { cause: Some(c) } if **c == cause),
            "{timeout:?}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn addr() -> ServerAddress {
        ServerAddress::new("a", 27017)
    }

    fn parse(reply: Document) -> OperationError {
        OperationError::from_reply(&reply, &addr()).expect("an error reply")
    }

    /// RW-17, RR-9 keep an error by copying it (`clone`, `clone_from`): the copy equals the
    /// source whatever kinds meet (server errors sharing one reply among them).
    #[test]
    fn a_copied_error_is_the_source() {
        let shed = parse(doc! { "ok": 0, "code": 462,
        "errorLabels": ["SystemOverloadedError", "RetryableError"] });
        let mut other_member = shed.clone();
        other_member.address = Some(ServerAddress::new("b", 27018));
        let errors = [
            shed.clone(),
            other_member,
            parse(doc! { "ok": 0, "code": 462 }),
            parse(doc! { "ok": 0, "code": 91 }),
            OperationError::network(NetworkErrorKind::Timeout, NetworkPhase::AfterSend, addr()),
            OperationError::server_selection("none"),
            OperationError::cancelled(),
        ];
        for source in &errors {
            assert_eq!(&source.clone(), source);
            for start in &errors {
                let mut copy = start.clone();
                copy.clone_from(source);
                assert_eq!(&copy, source);
            }
        }
    }

    #[test]
    fn success_replies_are_not_errors() {
        for ok in [
            Bson::Int32(1),
            Bson::Int64(1),
            Bson::Double(1.0),
            Bson::Boolean(true),
        ] {
            assert!(ServerError::from_reply(&doc! { "ok": ok }).is_none());
        }
    }

    /// BP-1, BP-2; also BP-4: a lone `RetryableError` label does not make an error a retryable
    /// overload error.
    #[test]
    fn bp1_bp2_overload_needs_system_overloaded_and_retryable_overload_needs_both() {
        let e = parse(
            doc! { "ok": 0, "code": 462, "codeName": "IngressRequestRateLimitExceeded",
            "errmsg": "x", "errorLabels": ["SystemOverloadedError", "RetryableError"] },
        );
        assert!(e.is_overload() && e.is_retryable_overload());
        let only_overload =
            parse(doc! { "ok": 0, "code": 2, "errorLabels": ["SystemOverloadedError"] });
        assert!(only_overload.is_overload() && !only_overload.is_retryable_overload());
        let only_retryable = parse(doc! { "ok": 0, "code": 2, "errorLabels": ["RetryableError"] });
        assert!(!only_retryable.is_overload() && !only_retryable.is_retryable_overload());
    }

    #[test]
    fn bp3_classification_depends_on_labels_not_codes() {
        let e = parse(doc! { "ok": 0, "code": 462 });
        assert!(!e.is_overload());
    }

    #[test]
    fn bp15_base_backoff_accepts_int32_int64_double_and_ignores_the_rest() {
        let base = |v: Bson| {
            parse(doc! { "ok": 0, "code": 2, "baseBackoffMS": v })
                .server_error()
                .unwrap()
                .base_backoff
        };
        assert_eq!(base(Bson::Int32(50)), Some(Duration::from_millis(50)));
        assert_eq!(base(Bson::Int64(50)), Some(Duration::from_millis(50)));
        assert_eq!(
            base(Bson::Double(50.5)),
            Some(Duration::from_micros(50_500))
        );
        for ignored in [
            Bson::Int32(0),
            Bson::Int32(-1),
            Bson::Int64(i64::MIN),
            Bson::Double(f64::NAN),
            Bson::Double(-0.0),
            Bson::Double(f64::NEG_INFINITY),
            Bson::String("50".into()),
            Bson::Null,
        ] {
            assert_eq!(base(ignored.clone()), None, "{ignored:?}");
        }
        for absurd in [
            Bson::Int64(i64::MAX),
            Bson::Double(f64::INFINITY),
            Bson::Double(1e300),
            Bson::Int32(i32::MAX),
        ] {
            assert_eq!(base(absurd), Some(MAX_BASE_BACKOFF));
        }
        // A tiny positive value stays positive.
        assert_eq!(base(Bson::Double(1e-300)), Some(Duration::from_nanos(1)));
    }

    #[test]
    fn write_concern_error_labels_are_merged_and_ok_1_with_wce_is_an_error() {
        let e = parse(
            doc! { "ok": 1, "writeConcernError": { "code": 91, "errmsg": "shutdown",
            "errorLabels": ["RetryableWriteError"] } },
        );
        assert!(e.is_retryable_write());
        let s = e.server_error().unwrap();
        assert_eq!(s.code, None);
        assert_eq!(s.write_concern_error.as_ref().unwrap().code, Some(91));
        assert_eq!(s.message, "shutdown");
    }

    #[test]
    fn malformed_replies_keep_the_raw_document_and_are_never_retryable() {
        for reply in [
            doc! { "ok": 0, "code": "462", "errorLabels": ["SystemOverloadedError", "RetryableError"] },
            doc! { "ok": 0, "code": 91, "errorLabels": "RetryableError" },
            doc! { "ok": 0, "code": 91, "errorLabels": [1, "RetryableWriteError"] },
            doc! { "ok": "no", "code": 91 },
            doc! { "code": 91 },
            doc! { "ok": 1, "writeConcernError": 5 },
            doc! { "ok": 0, "code": 91, "errmsg": 3 },
        ] {
            let e = parse(reply.clone());
            let s = e.server_error().unwrap();
            assert!(s.malformed, "{reply}");
            assert_eq!(s.raw, reply);
            assert!(
                !e.is_retryable_read() && !e.is_retryable_write() && !e.is_overload(),
                "{reply}"
            );
        }
    }

    #[test]
    fn unknown_labels_are_kept_by_name_once() {
        let e = parse(doc! { "ok": 0, "code": 2, "errorLabels": ["X", "X", "RetryableError"] });
        assert_eq!(
            e.server_error().unwrap().other_labels,
            vec!["X".to_string()]
        );
        assert!(e.has_label(Labels::RETRYABLE));
    }

    /// RR-2; also RR-11: a `PoolClearedError` is always a retryable read error.
    #[test]
    fn rr2_retryable_read_codes_network_and_pool_cleared() {
        for code in RETRYABLE_READ_CODES {
            assert!(
                parse(doc! { "ok": 0, "code": code }).is_retryable_read(),
                "{code}"
            );
        }
        assert!(!parse(doc! { "ok": 0, "code": 2 }).is_retryable_read());
        assert!(OperationError::pool_cleared(addr(), "x").is_retryable_read());
        assert!(OperationError::network(
            NetworkErrorKind::Timeout,
            NetworkPhase::AfterSend,
            addr()
        )
        .is_retryable_read());
        assert!(!OperationError::server_selection("none").is_retryable_read());
    }

    #[test]
    fn hs9_establishment_network_errors_get_both_overload_labels_except_dns_tls_socks5_and_auth() {
        use NetworkErrorKind::*;
        use NetworkPhase::*;
        for phase in [Connect, Handshake] {
            for kind in [Closed, Reset, Timeout, Io] {
                assert!(
                    OperationError::network(kind, phase, addr()).is_retryable_overload(),
                    "{kind:?} {phase:?}"
                );
            }
            for kind in [Dns, TlsCertificate, Socks5] {
                assert!(
                    OperationError::network(kind, phase, addr())
                        .labels
                        .is_empty(),
                    "{kind:?} {phase:?}"
                );
            }
        }
        for phase in [Authentication, BeforeSend, AfterSend] {
            assert!(
                OperationError::network(Reset, phase, addr())
                    .labels
                    .is_empty(),
                "{phase:?}"
            );
        }
    }

    #[test]
    fn rw9_driver_adds_retryable_write_error_only_for_network_pool_and_pre_4_4_codes() {
        let net = OperationError::network(NetworkErrorKind::Reset, NetworkPhase::AfterSend, addr());
        assert!(net.needs_retryable_write_label(21, false));
        assert!(OperationError::pool_cleared(addr(), "x").needs_retryable_write_label(21, false));
        let old = parse(doc! { "ok": 0, "code": 10107 });
        assert!(old.needs_retryable_write_label(8, false));
        assert!(!old.needs_retryable_write_label(WIRE_VERSION_4_4, false));
        // 134 is a retryable read code but not a retryable write code.
        assert!(!parse(doc! { "ok": 0, "code": 134 }).needs_retryable_write_label(8, false));
        // A mongod writeConcernError code counts; a mongos one does not; writeErrors never do.
        let wce = parse(doc! { "ok": 1, "writeConcernError": { "code": 91, "errmsg": "x" } });
        assert!(wce.needs_retryable_write_label(8, false));
        assert!(!wce.needs_retryable_write_label(8, true));
        let write_errors = parse(doc! { "ok": 0, "code": 2, "writeErrors": [{ "code": 91 }] });
        assert!(!write_errors.needs_retryable_write_label(8, false));
    }

    /// RW-17; also BP-21: when no retry is allowed, the `NoWritesPerformed` rules apply.
    #[test]
    fn rw17_sent_and_no_writes_performed() {
        let nwp = parse(doc! { "ok": 0, "code": 10107, "errorLabels": ["NoWritesPerformed"] });
        assert!(nwp.was_sent() && nwp.no_writes_performed());
        let before =
            OperationError::network(NetworkErrorKind::Reset, NetworkPhase::BeforeSend, addr());
        assert!(!before.was_sent() && before.no_writes_performed());
        let after =
            OperationError::network(NetworkErrorKind::Reset, NetworkPhase::AfterSend, addr());
        assert!(after.was_sent() && !after.no_writes_performed());
        assert!(OperationError::server_selection("x").no_writes_performed());
    }

    #[test]
    fn rw16_transaction_numbers_message_is_rewritten() {
        let e = parse(doc! { "ok": 0, "code": 20, "errmsg": "Transaction numbers are only allowed on a replica set member or mongos" })
            .rewrite_unsupported_retryable_writes();
        assert_eq!(
            e.server_error().unwrap().message,
            RETRYABLE_WRITES_UNSUPPORTED
        );
        assert_eq!(e.code(), Some(20));
        let other = parse(doc! { "ok": 0, "code": 20, "errmsg": "something else" })
            .rewrite_unsupported_retryable_writes();
        assert_eq!(other.server_error().unwrap().message, "something else");
    }

    #[test]
    fn pushback_follows_the_grpc_grammar() {
        assert_eq!(Pushback::parse("0"), Pushback::RetryAfter(Duration::ZERO));
        assert_eq!(
            Pushback::parse("250"),
            Pushback::RetryAfter(Duration::from_millis(250))
        );
        for bad in ["-1", "007", "", "1.5", "+5", "2147483648", " 5", "-"] {
            assert_eq!(Pushback::parse(bad), Pushback::DoNotRetry, "{bad:?}");
        }
        let e = parse(doc! { "ok": 0, "code": 2, "retryPushbackMS": 30 });
        assert_eq!(
            e.server_error().unwrap().pushback,
            Some(Pushback::RetryAfter(Duration::from_millis(30)))
        );
        let e = parse(doc! { "ok": 0, "code": 2, "retryPushbackMS": 1.5 });
        assert_eq!(
            e.server_error().unwrap().pushback,
            Some(Pushback::DoNotRetry)
        );
    }

    #[test]
    fn network_errors_keep_their_io_cause_in_display_and_source() {
        use core::error::Error as _;
        let refused = OperationError::network(
            NetworkErrorKind::Io,
            NetworkPhase::Connect,
            ServerAddress::new("127.0.0.1", 1),
        )
        .with_cause(NetworkCause::io(
            "ConnectionRefused",
            "Connection refused (os error 111)",
        ));
        let text = refused.to_string();
        assert!(
            text.starts_with(
                "network error Io during Connect: Connection refused (os error 111) (ConnectionRefused)"
            ),
            "{text}"
        );
        // HS-9: the cause does not change the labels.
        assert!(refused.is_retryable_overload());
        let source = refused.source().expect("the cause");
        assert_eq!(
            source.to_string(),
            "Connection refused (os error 111) (ConnectionRefused)"
        );
        assert!(matches!(
            refused.network_cause(),
            Some(NetworkCause::Io { kind, .. }) if kind == "ConnectionRefused"
        ));
        // Only network errors take a cause.
        let selection =
            OperationError::server_selection("x").with_cause(NetworkCause::io("a", "b"));
        assert!(selection.source().is_none() && selection.network_cause().is_none());
    }

    #[test]
    fn hs9_dns_failures_keep_their_cause_and_get_no_labels() {
        let dns = OperationError::network(NetworkErrorKind::Dns, NetworkPhase::Connect, addr())
            .with_cause(NetworkCause::io(
                "Uncategorized",
                "failed to lookup address information: Name or service not known",
            ));
        assert!(dns.labels.is_empty());
        assert!(dns
            .to_string()
            .contains("network error Dns during Connect: failed to lookup"));
    }

    #[test]
    fn decoder_reasons_are_printed_and_reachable_through_source() {
        use core::error::Error as _;
        let bad = OperationError::network(NetworkErrorKind::Io, NetworkPhase::Handshake, addr())
            .with_cause(NetworkCause::Decode(DecodeError::BadLength {
                length: i32::MAX,
                max: 48_000_000,
            }));
        assert!(
            bad.to_string().contains("bad message length 2147483647"),
            "{bad}"
        );
        let decode = bad
            .source()
            .and_then(|cause| cause.source())
            .expect("the decode error");
        assert!(decode
            .to_string()
            .starts_with("bad message length 2147483647"));
        let opcode = OperationError::network(NetworkErrorKind::Io, NetworkPhase::AfterSend, addr())
            .with_cause(NetworkCause::Decode(DecodeError::UnknownOpCode(1)));
        assert!(
            opcode.to_string().contains("not OP_MSG: opcode 1"),
            "{opcode}"
        );
        // A timeout wraps its cause (CS-5) and exposes it as its source.
        let timeout = OperationError::timeout(Some(opcode.clone()));
        assert_eq!(
            timeout.source().map(|s| s.to_string()),
            Some(opcode.to_string())
        );
    }

    #[test]
    fn write_errors_of_an_ok_reply_are_a_typed_error_keeping_the_reply() {
        let reply = doc! { "ok": 1, "n": 1, "writeErrors": [
        { "index": 1, "code": 11000, "codeName": "DuplicateKey", "errmsg": "E11000 dup" },
        { "index": 2_i64, "code": 11000, "errmsg": "E11000 dup" } ] };
        let e = OperationError::from_write_reply(&reply, &addr()).expect("write errors");
        assert_eq!(
            e.to_string(),
            "write error 11000 (DuplicateKey): E11000 dup at statement 1 (and 1 more) from a:27017"
        );
        let ErrorKind::Write(w) = &e.kind else {
            panic!("{e:?}")
        };
        assert_eq!(w.reply, reply);
        assert_eq!(w.errors[1].index, Some(2));
        // Review item 16: `errors` is public; emptied, Display still works (house rule 11).
        let mut emptied = e.clone();
        if let ErrorKind::Write(w) = &mut emptied.kind {
            w.errors.clear();
        }
        assert_eq!(emptied.to_string(), "write error from a:27017");
        // RW-9: never retryable, and it was sent.
        assert!(!e.is_retryable_write() && !e.is_retryable_read() && e.was_sent());
        assert_eq!(e.summary().class, ErrorClass::Write);
        for ok in [
            doc! { "ok": 1, "n": 1 },
            doc! { "ok": 1, "writeErrors": [] },
            doc! { "ok": 1, "writeErrors": 5 },
        ] {
            assert!(
                OperationError::from_write_reply(&ok, &addr()).is_none(),
                "{ok}"
            );
        }
    }

    #[test]
    fn cm3_pool_cleared_message() {
        let e = OperationError::pool_cleared(addr(), "boom");
        assert!(e.to_string().starts_with(
            "Connection pool for a:27017 was cleared because another operation failed with: boom"
        ));
    }
}
