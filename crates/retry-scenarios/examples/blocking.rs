//! The engine on plain threads: `std::net` sockets, one reader thread per socket, one channel,
//! and `recv_timeout` as the timer. No async runtime; the custom-runtime story in one file.
//!
//! `cargo run -p retry-scenarios --example blocking -- 127.0.0.1:27017` pings a server and exits
//! with status 0 if the ping succeeded, 1 if not; as a test (`cargo test -p retry-scenarios
//! --example blocking`) it pings a retry-testkit server.
//!
//! Socket errors reach the engine classified by `retry_driver::classify_io_error`: a failed name
//! lookup is a DNS error, which CMAP never labels as overload (HS-9), and the I/O error is kept
//! as the cause, so a failure says "Connection refused".
//!
//! The same driving loop, on one thread with non-blocking reads, runs as a doctest in retry-core's
//! crate docs ("Driving the engine", `crates/retry-core/src/lib.rs`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
use std::process::ExitCode;
use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
use std::time::Duration;

use bson::{doc, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{ConnId, Engine, EngineEvent, EngineOptions, OperationRequest};
use retry_core::error::{NetworkErrorKind, OperationError};
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::retry::OperationKind;
use retry_core::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use retry_core::time::Instant;
use retry_core::topology::TopologySettings;
use retry_driver::classify_io_error;

/// What the socket threads tell the engine's thread.
enum Input {
    Connected(ConnId, std::io::Result<TcpStream>),
    Bytes(ConnId, Vec<u8>),
    /// The peer closed the socket (`None`) or reading it failed.
    Closed(ConnId, Option<std::io::Error>),
}

/// Opens `address` and forwards what it reads, on a thread of its own.
fn open(conn: ConnId, address: ServerAddress, inputs: Sender<Input>) {
    std::thread::spawn(move || {
        let stream = (address.host(), address.port())
            .to_socket_addrs()
            .and_then(|mut a| a.next().ok_or_else(|| std::io::ErrorKind::NotFound.into()))
            .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_secs(10)));
        let reader = stream.as_ref().ok().and_then(|s| s.try_clone().ok());
        let _ = inputs.send(Input::Connected(conn, stream));
        let Some(mut reader) = reader else { return };
        let mut buffer = vec![0; 64 * 1024];
        let error = loop {
            match reader.read(&mut buffer) {
                Ok(0) => break None,
                Ok(n) => {
                    let _ = inputs.send(Input::Bytes(conn, buffer[..n].to_vec()));
                }
                Err(e) => break Some(e),
            }
        };
        let _ = inputs.send(Input::Closed(conn, error));
    });
}

/// The engine's options for a client of `seed`.
pub fn options(seed: ServerAddress) -> EngineOptions {
    let metadata = ClientMetadata::new("retry-blocking-example", "0.1.0");
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = metadata;
    let mut options = EngineOptions::new(TopologySettings::new(vec![seed]), handshake);
    // The seed must differ between processes (BP-14's jitter): std's RandomState is keyed from
    // the OS's randomness.
    options.seed =
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0);
    options
}

/// Runs `command` with `options` and returns its result, printing every event; then closes the
/// engine and drives it until it is closed (its `endSessions`, SE-15).
pub fn run(options: EngineOptions, command: Document) -> Result<Document, OperationError> {
    let origin = std::time::Instant::now();
    let now = || Instant::ZERO.saturating_add(origin.elapsed());
    let mut engine = Engine::new(options, now()).expect("valid options");
    let primary = ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("ok");
    let criteria = SelectionCriteria::Read(primary);
    let request = OperationRequest::new("admin", command, OperationKind::RunCommand, criteria);
    let op = engine.start_operation(request, now());
    let (inputs, received) = channel();
    let mut sockets: BTreeMap<ConnId, TcpStream> = BTreeMap::new();
    let mut buf = Vec::new();
    let mut outcome = None;
    loop {
        // Taking transmits can queue connects, closes and events (an unacknowledged write ends
        // there, WP-6), and a failed write queues more: drain until nothing is left.
        let mut drained = true;
        while drained {
            drained = false;
            while let Some(connect) = engine.poll_connect() {
                drained = true;
                open(connect.conn, connect.address, inputs.clone());
            }
            while let Some(conn) = engine.poll_transmit(&mut buf) {
                drained = true;
                let written = sockets.get_mut(&conn).map(|s| s.write_all(&buf));
                buf.clear();
                if let Some(Err(error)) = written {
                    sockets.remove(&conn);
                    let (kind, cause) = classify_io_error(&error, false);
                    engine.handle_closed(conn, kind, Some(cause), now());
                }
            }
            // Every byte handed over was written (`write_all`) before the engine asks for a close.
            while let Some(close) = engine.poll_close() {
                drained = true;
                if let Some(stream) = sockets.remove(&close.conn) {
                    let _ = stream.shutdown(Shutdown::Both); // ends its reader thread
                }
            }
            while let Some(event) = engine.poll_event() {
                drained = true;
                println!("{event:?}");
                if let EngineEvent::OperationFinished {
                    op: done, result, ..
                } = event
                {
                    if done == op {
                        // The reply comes encoded; this example hands its caller a document.
                        outcome = Some(result.map(|reply| {
                            retry_core::wire::to_document(&reply).expect("a decoded reply converts")
                        }));
                        engine.close(now());
                    }
                }
            }
        }
        if engine.is_closed() {
            return outcome.expect("the operation finished before the engine closed");
        }
        let wait = engine.poll_timeout().map_or(Duration::from_secs(1), |at| {
            at.saturating_duration_since(now())
        });
        match received.recv_timeout(wait) {
            Ok(Input::Connected(conn, Ok(stream))) => {
                sockets.insert(conn, stream);
                engine.handle_connected(conn, now());
            }
            Ok(Input::Connected(conn, Err(error))) => {
                let (kind, cause) = classify_io_error(&error, true);
                engine.handle_closed(conn, kind, Some(cause), now());
            }
            Ok(Input::Bytes(conn, bytes)) => engine.handle_bytes(conn, &bytes, now()),
            Ok(Input::Closed(conn, error)) => {
                sockets.remove(&conn);
                match error.map(|e| classify_io_error(&e, false)) {
                    Some((kind, cause)) => engine.handle_closed(conn, kind, Some(cause), now()),
                    None => engine.handle_closed(conn, NetworkErrorKind::Closed, None, now()),
                }
            }
            Err(RecvTimeoutError::Timeout) => engine.handle_timeout(now()),
            Err(RecvTimeoutError::Disconnected) => unreachable!("this thread holds a sender"),
        }
    }
}

fn main() -> ExitCode {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:27017".into());
    let seed: ServerAddress = address.parse().expect("an address host:port");
    match run(options(seed), doc! { "ping": 1 }) {
        Ok(reply) => {
            println!("reply: {reply}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: {error}");
            ExitCode::FAILURE
        }
    }
}

#[test]
fn pings_a_test_server_on_plain_threads() {
    let runtime = tokio::runtime::Runtime::new().expect("a runtime for the server");
    let config = retry_testkit::ServerConfig::new(retry_testkit::Role::Standalone);
    let server = runtime
        .block_on(retry_testkit::TestServer::start(config))
        .expect("a server");
    let seed = ServerAddress::new("127.0.0.1", server.address().port());
    let reply = run(options(seed), doc! { "ping": 1 }).expect("the ping succeeds");
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
    let counters = server.handle().counters();
    assert_eq!(counters.command("ping").executed, 1);
    // SE-15, review32 R18: closed and driven on, the engine ended the ping's server session.
    assert_eq!(counters.command("endSessions").executed, 1);
    runtime.block_on(server.shutdown());
}

/// Review32 R10 (HS-9): a refused connect reaches the engine with its I/O error as the cause,
/// so the failure says why.
#[test]
fn a_refused_connection_is_reported_with_its_cause() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let port = listener.local_addr().expect("bound").port();
    drop(listener);
    let mut options = options(ServerAddress::new("127.0.0.1", port));
    options.selection.server_selection_timeout = Duration::from_millis(300);
    let error = run(options, doc! { "ping": 1 }).expect_err("nothing listens");
    assert!(error.to_string().contains("(ConnectionRefused)"), "{error}");
}
