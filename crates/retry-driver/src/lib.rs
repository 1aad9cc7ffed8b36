//! # retry-driver
//!
//! The runtime-agnostic half of retry-core's adapters. [`Runtime`] (in the manner of quinn's)
//! is all a runtime supplies: its clock, timers, one spawn and TCP connect. The driving loop —
//! read sockets into the engine, write what it asks, open and close what it asks, sleep until its
//! next timeout — is written once here, and [`Client`] is the API on top. Every decision (retries,
//! backoff, selection, pools, monitoring) stays in [`retry_core::engine::Engine`].
//!
//! `retry-tokio` and `retry-async-std` implement [`Runtime`] and name `Client<TheirRuntime>`.
//! An adapter for another runtime checks its sockets and timers against the driver's contracts
//! with [`conformance`] from its tests.
//!
//! ```no_run
//! # async fn example<R: retry_driver::Runtime>() -> Result<(), Box<dyn std::error::Error>> {
//! use retry_driver::{Client, ClientOptions};
//! use retry_core::retry::OperationKind;
//!
//! let options = ClientOptions::parse("mongodb://127.0.0.1:27017/?maxAdaptiveRetries=1&appName=demo")?;
//! let client = Client::<R>::connect(options)?;
//! let mut events = client.events();
//! let reply = client
//!     .run_command("test", bson::doc! { "find": "items" }, OperationKind::Read)
//!     .await?;
//! println!("{reply}");
//! for event in events.drain() {
//!     println!("{event:?}");
//! }
//! client.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! ## Stable API
//!
//! [`ClientOptions::server_api`] declares a Stable API version ([`ServerApi`], versioned-api
//! spec; not a URI option): every command the client sends then carries `apiVersion` (and
//! `apiStrict` / `apiDeprecationErrors` when set), the handshake is `hello`, and an unknown
//! version is an [`OptionsError`] when parsed ([`ServerApiVersion`]).
//!
//! ## The loop
//!
//! One task owns the engine. Each poll it starts the operations the client queued, drains the
//! engine's outputs (connects, transmits, closes, events), polls every socket (connects, writes,
//! reads), fires the engine's timers that are due and arms one runtime timer for the next
//! (resetting it only when the deadline changed), and repeats until nothing moves. After 64
//! rounds it yields and wakes itself, so it never exhausts tokio's coop budget in one poll.
//! A healthy socket the engine lets go (`Close::write_out`) writes out the bytes it was already
//! handed first, for at most a second and without blocking (an unacknowledged write the engine
//! reported done may be among them, WP-6, EV-4); one closed under a failed, cancelled or
//! timed-out command, or that failed, goes at once with its unwritten rest.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

mod client;
mod concerns;
pub mod conformance;
mod connection_string;
mod credential;
mod cursor;
mod dns;
mod driver;
mod io_error;
mod options;
mod runtime;
mod session;
mod shared;
mod srv;
mod tls;

pub use client::{Client, CommandOptions, ConnectError, Events};
pub use connection_string::{ConnectionString, Host, HostKind, OptionValue};
pub use cursor::Cursor;
pub use dns::{lookup_ip, lookup_srv, lookup_txt, Nameservers, RuntimeProvider};
pub use io_error::{classify_io_error, LOOKUP_FAILED};
pub use options::{ClientOptions, OptionsError, ServerApi, ServerApiVersion};
pub use runtime::{literal_address, timer_deadline, AsyncTimer, BoxFuture, Runtime, Socket};
pub use session::{Session, SessionOptions};
pub use shared::{Reply, TimedEvent};
pub use srv::{apply_seedlist, resolve_seedlist, SrvPolling, SrvRecord};
pub use tls::{TlsError, TlsOptions, TlsRuntime};
