//! # retry-testkit
//!
//! A MongoDB wire-protocol server for tests, on 127.0.0.1 only, tokio based. It speaks OP_MSG
//! through retry-core's codec ([`retry_core::wire`]), plays a standalone, a `mongos`, a replica-set
//! member or a load balancer, runs a small in-memory CRUD subset, and misbehaves on demand: the
//! `failCommand` fail point, an ingress request rate limiter that sheds load the way MongoDB 8.2+
//! does (code 462 with both overload labels, BP-3), a connection rate limiter, and seeded random
//! faults. It counts what it executed, so a test can prove that a write ran once.
//!
//! ```
//! use bson::doc;
//! use retry_testkit::{FailCommand, FailPointMode, RawClient, Role, ServerConfig, TestServer};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let server = TestServer::start(ServerConfig::new(Role::Mongos)).await?;
//! let handle = server.handle();
//! // The next insert fails with a retryable overload error.
//! handle.set_fail_command(Some(
//!     FailCommand::new(FailPointMode::Times(1), ["insert"])
//!         .with_error_code(462)
//!         .with_error_labels(["SystemOverloadedError", "RetryableError"]),
//! ));
//!
//! let mut client = RawClient::connect(server.address()).await?;
//! let hello = client.command(doc! { "hello": 1, "backpressure": "2", "$db": "admin" }).await?;
//! assert_eq!(hello.get_str("msg").ok(), Some("isdbgrid"));
//!
//! let insert = doc! { "insert": "c", "documents": [{ "x": 1 }], "$db": "db" };
//! let failed = client.command(insert.clone()).await?;
//! assert_eq!(failed.get_i32("code").ok(), Some(462));
//! let retried = client.command(insert).await?;
//! assert_eq!(retried.get_i32("n").ok(), Some(1));
//!
//! // The handshake was recorded, and the insert ran once out of two attempts.
//! assert_eq!(handle.handshakes()[0].command.get_str("backpressure").ok(), Some("2"));
//! let inserts = handle.counters().command("insert");
//! assert_eq!((inserts.received, inserts.executed), (2, 1));
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! ## Handling a request
//!
//! 1. The request is counted under its command name (the first key of its body). A `hello`,
//!    `isMaster` or `ismaster` is recorded as a [`Handshake`].
//! 2. A body or a document-sequence document over 16 MiB + 16 KiB fails with BSONObjectTooLarge
//!    (10334) before anything else is read (review32 R4). A body without `$db` fails with code
//!    40571, as a real server does; so does a body with a key sent twice (FailedToParse 9), or a
//!    document sequence the command does not take (40472, 40415) or that repeats a body field
//!    (40433) (house rule 7). A command the server does not know is CommandNotFound (59) now,
//!    before any other check, as a real server looks it up first (TK-2); then a `$db` holding
//!    `.` or NUL, or over 63 bytes, is InvalidNamespace (73), and one `validDBName` refuses
//!    otherwise (empty, `/`, `\`, space, `"`) is too, after the fail point of step 4 (a router
//!    refuses `local`, IllegalOperation 20). While the `requireApiVersion` server parameter is on
//!    ([`ServerConfig::require_api_version`], `setParameter`), a command without `apiVersion`,
//!    hellos included, fails with code 498870. `stmtId` is refused (`TestkitUnsupported`).
//!    Writes to a database whose name holds `$`, and the creation of a database a server may not
//!    create (one differing only in case from another; on a router `admin`, `local`, `config`
//!    in another case), are refused as the command runs (review34 Y4, `database_name`).
//! 3. Every command but the handshake (BP-6) and `configureFailPoint` takes a token from the ingress
//!    limiter, if one is set; without a token it fails with code 462,
//!    `IngressRequestRateLimitExceeded`, labels `SystemOverloadedError` and `RetryableError`, and
//!    `baseBackoffMS` when configured (BP-3, BP-15).
//! 4. The `failCommand` fail point, when it matches, blocks, closes the connection, fails the
//!    command or adds a `writeConcernError` ([`FailCommand`]).
//! 5. The command runs ([`CommandCounts::executed`]), unless it is the retry of a retryable
//!    write (`insert`, `update`, `delete`, `findAndModify`, `bulkWrite`) that already ran (same
//!    `lsid`, `txnNumber` and statement): that gets the first reply again
//!    ([`CommandCounts::replayed`]). A command with `autocommit: false` belongs to its session's
//!    transaction (TK-15: snapshot reads, writes matched against the snapshot and invisible to
//!    others until the commit, another transaction's write to a document it changed (or its
//!    write to one changed after its start) is WriteConflict 112, an abort undoes only its own
//!    changes and drops the collections it created). A write outside any transaction that
//!    touches a document a transaction in progress changed waits until it ends, as on a real
//!    server, bounded by `maxTimeMS` (MaxTimeMSExpired 50) or else by 60 s, the default
//!    `transactionLifetimeLimitSeconds` counted from that transaction's start, after which it
//!    is aborted, as a real server's reaper does. A multi-statement write outside any transaction is undone whole and
//!    runs again after the wait, where a real server keeps the statements done before it (a
//!    retryable write resumes at its waiting statement on both). A command, operator, stage,
//!    option or fail point the server does not
//!    evaluate is refused (`CommandNotFound` or `TestkitUnsupported`) and logged
//!    ([`ServerHandle::unsupported`]), never ignored.
//! 6. The reply is written unless the request had `moreToCome`, or replaced by a random fault
//!    ([`FaultConfig`]).
//!
//! A client that sends bytes which do not frame as OP_MSG has its connection closed; nothing a
//! client sends can panic the server. See `docs/testkit.md` for the roles, commands and knobs.
//!
//! ## The raw path: hot commands without a `Document`
//!
//! `ping`, `hello`, `isMaster` and `ismaster` (a driver's pings and heartbeats) are answered
//! without decoding the request into a `bson::Document` (issue 9: the server's share of a ping
//! round trip). A request whose frame names one of them is decoded with retry-core's
//! `FrameDecoder::decode_raw`, which accepts and refuses exactly the frames the `Document` decoder
//! does, and is answered raw only when every check above would pass it: a body within 16 MiB +
//! 16 KiB, no document sequence, no field twice, a `$db` a server runs commands on, an `lsid` that is `{id: <binary>}` alone, a valid numeric `maxTimeMS`,
//! only the generic fields no check reads (`$clusterTime`, `$readPreference`, `apiVersion`,
//! `apiStrict`, `apiDeprecationErrors`, `comment`) and, for a hello, a boolean `helloOk` and
//! `loadBalanced`, `client`, `compression` and `backpressure` (an awaitable or authenticating
//! hello is not raw), an `apiVersion` when the server requires one, no authentication refusal, no
//! `failCommand` fail point on the command. Any
//! other request, valid or not, takes the `Document` path from step 1, so every refusal keeps
//! its one implementation. A request answered raw has the same effects in the same order
//! (counters, command log, handshake record, `appName`, service routing, ingress token, noted
//! session, cluster time, random faults) and the same reply bytes: the reply body is built by the
//! same functions, encoded once per connection for what it depends on, and framed with the next
//! `requestID`. A test runs valid and invalid commands, fail points, the limiter and faults
//! through both paths in every role and compares every reply byte for byte (house rule 7: the
//! raw path is not one bit more forgiving). Cost per command, counted with callgrind
//! (`docs/benchmarks.md`, "Test server cost per command"): a ping about 5,200 server
//! instructions instead of 16,500, a heartbeat about 5,400 instead of 32,000.
#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod auth;
mod client;
mod commands;
mod config;
mod counters;
mod database_name;
mod fail_point;
mod faults;
mod limiter;
mod on_primary_write;
mod parameters;
mod query;
mod refusals;
mod server;
mod store;
mod tls;

pub use auth::{ScramUser, ScramVersion, SCRAM_ITERATIONS};
pub use client::RawClient;
pub use config::{
    IngressLimit, RateLimit, ReplicaSetMember, Role, ServerConfig, LOGICAL_SESSION_TIMEOUT_MINUTES,
    MAX_BSON_OBJECT_SIZE, MAX_MESSAGE_SIZE_BYTES, MAX_WRITE_BATCH_SIZE,
};
pub use counters::{CommandCounts, Counters, FaultCounts};
pub use fail_point::{
    code_name, FailCommand, FailPointError, FailPointMode, FAIL_POINT_MESSAGE, TESTKIT_UNSUPPORTED,
};
pub use faults::{Fault, FaultConfig, DEFAULT_STALL};
pub use server::{
    Handshake, LoggedCommand, ServerHandle, TestServer, HANDSHAKES_KEPT, INGRESS_RATE_LIMIT_CODE,
    OVERLOAD_LABELS,
};
pub use store::DataStore;
pub use tls::{ServerCertificate, ServerTls, TestCa};
