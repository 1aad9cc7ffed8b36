//! # retry-core
//!
//! A sans-IO engine for MongoDB clients. It decides *whether, when, where and on which connection*
//! each attempt of a command runs, and owns no I/O: no sockets, no clock reads, no threads, no
//! async, no global RNG. Time comes in as a parameter ([`time::Instant`]); randomness comes from an
//! RNG each machine owns, seeded from its caller ([`rng`]). The same seed and the same inputs give
//! the same actions and timestamps, bit for bit.
//!
//! It follows the MongoDB specifications at a pinned commit: client backpressure, retryable reads
//! and writes. Doc comments cite the requirement IDs of the project's spec digest (`BP-14`,
//! `RW-17`, ...). The earlier token-bucket backpressure and gRPC A6 retries are available as
//! explicit, non-default [`policy::RetryPolicy`] variants.
//!
//! ## Modules
//!
//! | module | owns |
//! | --- | --- |
//! | [`time`] | the monotonic [`time::Instant`] newtype and CSOT deadlines |
//! | [`address`] | [`address::ServerAddress`] |
//! | [`wire`] | the OP_MSG wire format: encoding commands, decoding replies from a byte stream |
//! | [`connection`] | one connection's state machine: connect, handshake, authentication, a command in flight |
//! | [`handshake`] | the `hello` every new socket sends first, with the client metadata, and the validation of its reply |
//! | [`auth`] | authentication in connection establishment: the pluggable [`auth::Mechanism`], negotiation, speculative auth, the SASL conversation |
//! | [`topology`] | server and topology descriptions from `hello` replies; the SDAM update machine ([`topology::Topology`]): update rules, error handling, pools per server, SDAM events |
//! | [`selection`] | server selection with deprioritization, the latency window and the selection loop |
//! | [`engine`] | composes every machine behind one sans-IO interface for adapters |
//! | [`error`] | error facts parsed from replies and network failures, and the classifiers |
//! | [`classify`] | which retry rules a command falls under, read from the command itself |
//! | [`rng`] | the seeded generator and exact jitter |
//! | [`backoff`] | backoff formulas |
//! | [`budget`] | retry budgets shared through `&self` without locks |
//! | [`monitor`] | server monitoring: check schedule, RTT, descriptions from checks |
//! | [`pinning`] | transaction and load-balanced cursor pins (TX-3..5, LB-10..12) |
//! | [`reply`] | the reply fields every layer reads alike: `ok` and the cursor id |
//! | [`transaction`] | a session's transaction state: what start, commit, abort and each command do (TX-2) |
//! | [`policy`] | retry options and policies, validated |
//! | [`option_error`] | the error of an invalid option |
//! | [`pool`] | connection-pool accounting (CMAP) for one server |
//! | [`session`] | server sessions: ids, the pool, transaction numbers, `$clusterTime` gossip (SE-*) |
//! | [`max_time`] | the `maxTimeMS` an attempt carries under client-side operation timeouts (CS-4) |
//! | [`read_preference_wire`] | the `$readPreference` a command carries, by topology and server type |
//! | [`id_table`] | entries by increasing id, looked up in constant time (house rule 9) |
//! | [`retry`] | the per-operation retry state machine |
//! | [`hedging`] | hedged reads (gRPC A6): copies in flight at once, first success wins |
//! | [`service_config`] | the gRPC-style service config (A6): per-command retry or hedging policies, throttling |
//! | [`scenario`] | a scripted, bounded driver for the retry machine in virtual time |
//!
//! ## Driving a machine
//!
//! Inputs are `handle_*` methods that take `now`; outputs are polled until `None`. After any
//! input, drain every `poll_*`, then wait for the earlier of `poll_timeout()` and the next input.
//! A spurious `handle_timeout` is harmless.
//!
//! ```
//! use retry_core::address::ServerAddress;
//! use retry_core::error::OperationError;
//! use retry_core::policy::RetryOptions;
//! use retry_core::retry::{Action, AttemptServer, OperationKind, OperationSpec, RetryMachine};
//! use retry_core::time::Instant;
//! use retry_core::topology::{ServerType, TopologyType};
//!
//! let server = AttemptServer {
//!     address: ServerAddress::new("db0.example.com", 27017),
//!     server_type: ServerType::RsPrimary,
//!     topology_type: TopologyType::ReplicaSetWithPrimary,
//!     max_wire_version: 25,
//!     sessions_supported: true,
//! };
//! // The first attempt is rejected by an overloaded server; the retry succeeds.
//! let overloaded = bson::doc! { "ok": 0, "code": 462,
//!     "errorLabels": ["SystemOverloadedError", "RetryableError"] };
//! let mut replies = vec![Some(overloaded), None].into_iter();
//!
//! let mut now = Instant::ZERO;
//! let spec = OperationSpec::new(OperationKind::Read);
//! let mut op = RetryMachine::new(spec, &RetryOptions::default(), 7, now);
//! let result = loop {
//!     match op.poll_action() {
//!         Some(Action::SelectServer) => op.handle_server_selected(server.clone(), now).unwrap(),
//!         Some(Action::Dispatch(attempt)) => {
//!             // Check out a connection to attempt.address, send the command, read the reply.
//!             op.handle_sent(now).unwrap();
//!             match replies.next().flatten() {
//!                 Some(reply) => {
//!                     let error = OperationError::from_reply(&reply, &attempt.address).unwrap();
//!                     op.handle_failed(error, now).unwrap();
//!                 }
//!                 None => op.handle_succeeded(now).unwrap(),
//!             }
//!         }
//!         Some(Action::ReleaseConnection { .. }) => { /* check the connection in */ }
//!         Some(Action::Wait { .. }) => {}
//!         Some(Action::Finished(result)) => break result,
//!         None => {
//!             // Sleep until the backoff ends (virtual time here), then tell the machine.
//!             now = op.poll_timeout().expect("a backoff is pending");
//!             op.handle_timeout(now);
//!         }
//!     }
//!     while let Some(event) = op.poll_event() {
//!         println!("{event:?}");
//!     }
//! };
//! assert!(result.is_ok());
//! assert_eq!(op.attempts(), 2);
//! assert!(now > Instant::ZERO, "the overload error was backed off");
//! ```
//!
//! ## Driving the engine
//!
//! [`engine::Engine`] composes every machine for a whole client. The loop below is all an adapter
//! does: open the sockets it asks for, write what [`engine::Engine::poll_transmit`] gives, feed
//! back what arrives, wake it at [`engine::Engine::poll_timeout`], and at the end close it and
//! drive it on until [`engine::Engine::is_closed`] (that sends the `endSessions` of SE-15). Here it
//! runs on `std::net` sockets in non-blocking mode (bytes the kernel does not take yet wait in the
//! socket's `unsent`; a short sleep when idle) against a tiny server on a loopback port that
//! answers `hello` as a standalone and every other command with `{ok: 1}`; retry-scenarios'
//! `examples/blocking.rs` is the same loop with a thread per socket.
//!
//! Three things every adapter owes the engine besides bytes:
//!
//! - The RNG's seed, from a per-process random source ([`engine::EngineOptions::seed`]): left at
//!   0, every process draws the same backoff jitter (BP-14) and their retries arrive together.
//! - Why a socket failed: its [`error::NetworkErrorKind`] and the I/O error as its cause
//!   ([`error::NetworkCause::io`]), so that the error says "Connection refused". A failed name
//!   lookup is [`error::NetworkErrorKind::Dns`], which CMAP never labels as overload (HS-9); the
//!   `classify` function below does the rest. A driver that can depend on retry-driver has it as
//!   `retry_driver::classify_io_error`, which also recognizes a TLS failure.
//! - The bytes it was given for a socket the engine closes ([`engine::Engine::poll_close`]),
//!   written out before the socket goes (WP-6, EV-4): an unacknowledged (`w: 0`) write ends
//!   with `{ok: 1}` as [`engine::Engine::poll_transmit`] hands its bytes over, and its
//!   connection may be closed in that same call (stale: its pool was cleared meanwhile), so
//!   dropping them would lose a write reported done. Bounded: a socket that does not take them
//!   promptly goes anyway (below within a second, waiting in place; retry-driver keeps it
//!   aside, only written, and goes on). A socket that failed goes at once: the engine learns of
//!   the failure and answers for what it had not handed over.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::hash::BuildHasher;
//! use std::io::{ErrorKind, Read, Write};
//! use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
//! use std::time::Duration;
//!
//! use bson::doc;
//! use retry_core::address::ServerAddress;
//! use retry_core::engine::{Engine, EngineEvent, EngineOptions, OperationRequest};
//! use retry_core::error::{NetworkCause, NetworkErrorKind};
//! use retry_core::handshake::HandshakeOptions;
//! use retry_core::retry::OperationKind;
//! use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
//! use retry_core::time::Instant;
//! use retry_core::topology::TopologySettings;
//! use retry_core::wire::{FrameDecoder, MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // The server: one thread per connection, until the client closes it.
//! let listener = TcpListener::bind("127.0.0.1:0")?;
//! let port = listener.local_addr()?.port();
//! std::thread::spawn(move || {
//!     for stream in listener.incoming().flatten() {
//!         std::thread::spawn(move || serve(stream));
//!     }
//! });
//!
//! // The client: virtual time is the time since the engine was made.
//! let origin = std::time::Instant::now();
//! let now = || Instant::ZERO.saturating_add(origin.elapsed());
//! let seeds = vec![ServerAddress::new("127.0.0.1", port)];
//! let mut options = EngineOptions::new(TopologySettings::new(seeds), HandshakeOptions::new());
//! // std keys each RandomState from the OS's randomness.
//! options.seed = std::collections::hash_map::RandomState::new().hash_one("retry-core");
//! let mut engine = Engine::new(options, now())?;
//! let primary = ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None)?;
//! let ping = OperationRequest::new(
//!     "admin",
//!     doc! { "ping": 1 },
//!     OperationKind::RunCommand,
//!     SelectionCriteria::Read(primary),
//! );
//! let op = engine.start_operation(ping, now());
//!
//! let mut sockets = BTreeMap::new();
//! let (mut out, mut input) = (Vec::new(), vec![0u8; 16 * 1024]);
//! let mut result = None;
//! loop {
//!     assert!(origin.elapsed() < Duration::from_secs(30), "bounded in time");
//!     // 1. Drain every output. What taking transmits queues (an unacknowledged write ends as its
//!     // bytes are taken, WP-6) is taken on the next turn, which comes at once while anything
//!     // moved; a loop that blocks between turns repeats these drains until all are empty.
//!     while let Some(connect) = engine.poll_connect() {
//!         match open(&connect.address) {
//!             Ok(stream) => {
//!                 stream.set_nonblocking(true)?;
//!                 sockets.insert(connect.conn, Socket { stream, unsent: Vec::new() });
//!                 engine.handle_connected(connect.conn, now());
//!             }
//!             Err((kind, cause)) => engine.handle_closed(connect.conn, kind, Some(cause), now()),
//!         }
//!     }
//!     while let Some(conn) = engine.poll_transmit(&mut out) {
//!         if let Some(socket) = sockets.get_mut(&conn) {
//!             socket.unsent.extend_from_slice(&out);
//!         }
//!         out.clear();
//!     }
//!     while let Some(close) = engine.poll_close() {
//!         if let Some(socket) = sockets.remove(&close.conn) {
//!             socket.close(close.write_out); // writes out what it took first if asked (WP-6)
//!         }
//!     }
//!     while let Some(event) = engine.poll_event() {
//!         if let EngineEvent::OperationFinished { op: done, result: finished, .. } = event {
//!             if done == op {
//!                 result = Some(finished);
//!                 engine.close(now()); // ends the server sessions, then closes everything
//!             }
//!         }
//!     }
//!     if engine.is_closed() {
//!         break;
//!     }
//!     // 2. Feed back the inputs: bytes, failed sockets, timers that are due.
//!     let mut idle = true;
//!     let mut failed = Vec::new();
//!     for (&conn, socket) in sockets.iter_mut() {
//!         let step = socket.flush().and_then(|wrote| match socket.stream.read(&mut input) {
//!             Ok(0) => Err(ErrorKind::UnexpectedEof.into()),
//!             Ok(n) => {
//!                 engine.handle_bytes(conn, &input[..n], now());
//!                 Ok(true)
//!             }
//!             Err(e) if e.kind() == ErrorKind::WouldBlock => Ok(wrote),
//!             Err(e) => Err(e),
//!         });
//!         match step {
//!             Ok(busy) => idle &= !busy,
//!             Err(error) => failed.push((conn, error)),
//!         }
//!     }
//!     for (conn, error) in failed {
//!         sockets.remove(&conn);
//!         let (kind, cause) = classify(&error);
//!         engine.handle_closed(conn, kind, Some(cause), now());
//!         idle = false;
//!     }
//!     if engine.poll_timeout().is_some_and(|at| at <= now()) {
//!         engine.handle_timeout(now());
//!         idle = false;
//!     }
//!     if idle {
//!         std::thread::sleep(Duration::from_millis(1));
//!     }
//! }
//! assert_eq!(result.expect("the ping finished")?.get_i32("ok")?, 1);
//! assert!(sockets.is_empty(), "the closed engine closed every socket");
//! # Ok(())
//! # }
//!
//! /// A socket and the bytes the engine gave it that the kernel has not taken yet.
//! struct Socket {
//!     stream: TcpStream,
//!     unsent: Vec<u8>,
//! }
//!
//! impl Socket {
//!     /// Writes what the kernel takes now, without blocking; whether it took anything.
//!     fn flush(&mut self) -> std::io::Result<bool> {
//!         let mut wrote = false;
//!         while !self.unsent.is_empty() {
//!             match self.stream.write(&self.unsent) {
//!                 Ok(0) => return Err(ErrorKind::WriteZero.into()),
//!                 Ok(n) => {
//!                     self.unsent.drain(..n);
//!                     wrote = true;
//!                 }
//!                 Err(e) if e.kind() == ErrorKind::WouldBlock => break,
//!                 Err(e) => return Err(e),
//!             }
//!         }
//!         Ok(wrote)
//!     }
//!
//!     /// Closes it; with `write_out` (a healthy connection let go, WP-6) after writing out what
//!     /// the engine gave it, for at most a second; without, its unwritten rest is dropped.
//!     fn close(mut self, write_out: bool) {
//!         let deadline = std::time::Instant::now() + Duration::from_secs(1);
//!         while write_out && !self.unsent.is_empty() && std::time::Instant::now() < deadline {
//!             match self.flush() {
//!                 Ok(true) => {}
//!                 Ok(false) => std::thread::sleep(Duration::from_millis(1)),
//!                 Err(_) => break,
//!             }
//!         }
//!     }
//! }
//!
//! /// Opens a socket to `address`: a failed lookup is a DNS error (never labelled, HS-9), a
//! /// failed connect is classified like any socket error.
//! fn open(address: &ServerAddress) -> Result<TcpStream, (NetworkErrorKind, NetworkCause)> {
//!     let dns = |e: std::io::Error| (NetworkErrorKind::Dns, classify(&e).1);
//!     let found: Vec<SocketAddr> = (address.host(), address.port())
//!         .to_socket_addrs()
//!         .map_err(dns)?
//!         .collect();
//!     if found.is_empty() {
//!         return Err(dns(ErrorKind::NotFound.into()));
//!     }
//!     TcpStream::connect(&found[..]).map_err(|e| classify(&e))
//! }
//!
//! /// The engine's kind for a socket error, and the error itself as the cause.
//! fn classify(error: &std::io::Error) -> (NetworkErrorKind, NetworkCause) {
//!     let kind = match error.kind() {
//!         ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted => NetworkErrorKind::Reset,
//!         ErrorKind::UnexpectedEof | ErrorKind::BrokenPipe => NetworkErrorKind::Closed,
//!         ErrorKind::TimedOut => NetworkErrorKind::Timeout,
//!         _ => NetworkErrorKind::Io, // "Connection refused" among them
//!     };
//!     (kind, NetworkCause::io(format!("{:?}", error.kind()), error.to_string()))
//! }
//!
//! /// Answers every command on one connection until it closes.
//! fn serve(mut stream: TcpStream) {
//!     let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
//!     let mut buf = vec![0u8; 16 * 1024];
//!     while let Ok(n @ 1..) = stream.read(&mut buf) {
//!         let mut bytes = &buf[..n];
//!         while let Ok((used, message)) = decoder.decode(bytes) {
//!             bytes = &bytes[used..];
//!             let Some(request) = message else { break };
//!             let hello = matches!(request.body.keys().next().map(String::as_str),
//!                 Some("hello" | "isMaster" | "ismaster"));
//!             let body = if hello {
//!                 doc! { "ok": 1, "isWritablePrimary": true, "helloOk": true,
//!                        "maxWireVersion": 21, "minWireVersion": 0,
//!                        "logicalSessionTimeoutMinutes": 30 }
//!             } else {
//!                 doc! { "ok": 1 }
//!             };
//!             let reply = OpMsg { request_id: 0, response_to: request.request_id,
//!                                 flags: MsgFlags::NONE, body, sequences: Vec::new() };
//!             let mut out = Vec::new();
//!             if reply.encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut out).is_err()
//!                 || stream.write_all(&out).is_err()
//!             {
//!                 return;
//!             }
//!             if bytes.is_empty() {
//!                 break;
//!             }
//!         }
//!     }
//! }
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]
#![cfg_attr(
    not(test),
    warn(clippy::unwrap_used, clippy::expect_used, clippy::panic)
)]

extern crate alloc;

pub mod address;
pub mod auth;
pub mod backoff;
mod bson_read;
mod bson_write;
pub mod budget;
pub mod classify;
pub mod connection;
pub mod engine;
pub mod error;
pub mod handshake;
pub mod hedging;
pub mod id_table;
pub mod max_time;
pub mod monitor;
pub mod option_error;
pub mod pinning;
pub mod policy;
pub mod pool;
pub mod read_preference_wire;
pub mod reply;
pub mod retry;
pub mod rng;
pub mod scenario;
pub mod selection;
pub mod service_config;
pub mod session;
pub mod time;
pub mod topology;
pub mod transaction;
pub mod wire;
