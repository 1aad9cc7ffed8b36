//! The engine on plain threads: `std::net` sockets, one reader thread per socket, one channel,
//! and `recv_timeout` as the timer. No async runtime; the custom-runtime story in one file.
//!
//! `cargo run -p retry-scenarios --example blocking -- 127.0.0.1:27017` pings a server; as a
//! test (`cargo test -p retry-scenarios --example blocking`) it pings a retry-testkit server.
//!
//! The same driving loop, on one thread with non-blocking reads, runs as a doctest in retry-core's
//! crate docs ("Driving the engine", `crates/retry-core/src/lib.rs`).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream, ToSocketAddrs};
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

/// What the socket threads tell the engine's thread.
enum Input {
    Connected(ConnId, std::io::Result<TcpStream>),
    Bytes(ConnId, Vec<u8>),
    Closed(ConnId),
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
        while let Ok(n @ 1..) = reader.read(&mut buffer) {
            let _ = inputs.send(Input::Bytes(conn, buffer[..n].to_vec()));
        }
        let _ = inputs.send(Input::Closed(conn));
    });
}

/// Runs `command` against `seed` and returns its result, printing every event.
pub fn run(seed: ServerAddress, command: Document) -> Result<Document, OperationError> {
    let origin = std::time::Instant::now();
    let now = || Instant::ZERO.saturating_add(origin.elapsed());
    let metadata = ClientMetadata::new("retry-blocking-example", "0.1.0");
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = metadata;
    let mut options = EngineOptions::new(TopologySettings::new(vec![seed]), handshake);
    // std's RandomState is keyed from the OS's randomness.
    options.seed =
        std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), 0);
    let mut engine = Engine::new(options, now()).expect("valid options");
    let primary = ReadPreference::new(ReadPreferenceMode::Primary, Vec::new(), None).expect("ok");
    let criteria = SelectionCriteria::Read(primary);
    let request = OperationRequest::new("admin", command, OperationKind::RunCommand, criteria);
    let op = engine.start_operation(request, now());
    let (inputs, received) = channel();
    let mut sockets: BTreeMap<ConnId, TcpStream> = BTreeMap::new();
    let mut buf = Vec::new();
    loop {
        while let Some(connect) = engine.poll_connect() {
            open(connect.conn, connect.address, inputs.clone());
        }
        while let Some(conn) = engine.poll_transmit(&mut buf) {
            let written = sockets.get_mut(&conn).map(|s| s.write_all(&buf));
            buf.clear();
            if let Some(Err(_)) = written {
                sockets.remove(&conn);
                engine.handle_closed(conn, NetworkErrorKind::Io, None, now());
            }
        }
        while let Some(conn) = engine.poll_close() {
            if let Some(stream) = sockets.remove(&conn) {
                let _ = stream.shutdown(Shutdown::Both); // ends its reader thread
            }
        }
        while let Some(event) = engine.poll_event() {
            println!("{event:?}");
            if let EngineEvent::OperationFinished {
                op: done, result, ..
            } = event
            {
                if done == op {
                    // The reply comes encoded; this example hands its caller a document.
                    return result.map(|reply| {
                        retry_core::wire::to_document(&reply).expect("a decoded reply converts")
                    });
                }
            }
        }
        let wait = engine.poll_timeout().map_or(Duration::from_secs(1), |at| {
            at.saturating_duration_since(now())
        });
        match received.recv_timeout(wait) {
            Ok(Input::Connected(conn, Ok(stream))) => {
                sockets.insert(conn, stream);
                engine.handle_connected(conn, now());
            }
            Ok(Input::Connected(conn, Err(_))) => {
                engine.handle_closed(conn, NetworkErrorKind::Io, None, now())
            }
            Ok(Input::Bytes(conn, bytes)) => engine.handle_bytes(conn, &bytes, now()),
            Ok(Input::Closed(conn)) => {
                sockets.remove(&conn);
                engine.handle_closed(conn, NetworkErrorKind::Closed, None, now());
            }
            Err(RecvTimeoutError::Timeout) => engine.handle_timeout(now()),
            Err(RecvTimeoutError::Disconnected) => unreachable!("this thread holds a sender"),
        }
    }
}

fn main() {
    let address = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:27017".into());
    let seed: ServerAddress = address.parse().expect("an address host:port");
    match run(seed, doc! { "ping": 1 }) {
        Ok(reply) => println!("reply: {reply}"),
        Err(error) => println!("error: {error}"),
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
    let reply = run(seed, doc! { "ping": 1 }).expect("the ping succeeds");
    assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
    assert_eq!(server.handle().counters().command("ping").executed, 1);
    runtime.block_on(server.shutdown());
}
