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
//! | [`auth`] | authentication in connection establishment: the pluggable [`auth::Mechanism`], negotiation, speculative auth, the SASL conversation |
//! | [`topology`] | server and topology descriptions from `hello` replies; the SDAM update machine ([`topology::Topology`]): update rules, error handling, pools per server, SDAM events |
//! | [`selection`] | server selection with deprioritization, the latency window and the selection loop |
//! | [`engine`] | composes every machine behind one sans-IO interface for adapters |
//! | [`error`] | error facts parsed from replies and network failures, and the classifiers |
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
//! back what arrives, and wake it at [`engine::Engine::poll_timeout`]. Here it runs on blocking
//! `std::net` sockets (non-blocking reads, a short sleep when idle) against a tiny server on a
//! loopback port that answers `hello` as a standalone and every other command with `{ok: 1}`;
//! retry-scenarios' `examples/blocking.rs` is the same loop with a thread per socket.
//!
//! ```
//! use std::collections::BTreeMap;
//! use std::io::{ErrorKind, Read, Write};
//! use std::net::{TcpListener, TcpStream};
//! use std::time::Duration;
//!
//! use bson::doc;
//! use retry_core::address::ServerAddress;
//! use retry_core::engine::{Engine, EngineEvent, EngineOptions, OperationRequest};
//! use retry_core::error::NetworkErrorKind;
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
//! let options = EngineOptions::new(TopologySettings::new(seeds), HandshakeOptions::new());
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
//! let result = 'drive: loop {
//!     assert!(origin.elapsed() < Duration::from_secs(30), "bounded in time");
//!     // 1. Drain every output.
//!     while let Some(connect) = engine.poll_connect() {
//!         match TcpStream::connect((connect.address.host(), connect.address.port())) {
//!             Ok(stream) => {
//!                 stream.set_nonblocking(true)?;
//!                 sockets.insert(connect.conn, stream);
//!                 engine.handle_connected(connect.conn, now());
//!             }
//!             Err(_) => engine.handle_closed(connect.conn, NetworkErrorKind::Io, None, now()),
//!         }
//!     }
//!     while let Some(conn) = engine.poll_transmit(&mut out) {
//!         if let Some(stream) = sockets.get_mut(&conn) {
//!             stream.write_all(&out)?;
//!         }
//!         out.clear();
//!     }
//!     while let Some(conn) = engine.poll_close() {
//!         sockets.remove(&conn);
//!     }
//!     while let Some(event) = engine.poll_event() {
//!         if let EngineEvent::OperationFinished { op: done, result, .. } = event {
//!             if done == op {
//!                 break 'drive result;
//!             }
//!         }
//!     }
//!     // 2. Feed back the inputs: bytes, closed sockets, timers that are due.
//!     let mut idle = true;
//!     let mut closed = Vec::new();
//!     for (conn, stream) in sockets.iter_mut() {
//!         match stream.read(&mut input) {
//!             Ok(0) => closed.push((*conn, NetworkErrorKind::Closed)),
//!             Ok(n) => {
//!                 idle = false;
//!                 engine.handle_bytes(*conn, &input[..n], now());
//!             }
//!             Err(e) if e.kind() == ErrorKind::WouldBlock => {}
//!             Err(_) => closed.push((*conn, NetworkErrorKind::Io)),
//!         }
//!     }
//!     for (conn, kind) in closed {
//!         sockets.remove(&conn);
//!         engine.handle_closed(conn, kind, None, now());
//!         idle = false;
//!     }
//!     if engine.poll_timeout().is_some_and(|at| at <= now()) {
//!         engine.handle_timeout(now());
//!         idle = false;
//!     }
//!     if idle {
//!         std::thread::sleep(Duration::from_millis(1));
//!     }
//! };
//! assert_eq!(result?.get_i32("ok")?, 1);
//! engine.close(now());
//! # Ok(())
//! # }
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
