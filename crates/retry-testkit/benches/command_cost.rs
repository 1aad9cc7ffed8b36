//! The test server's cost per command (issue 9, the server side of a round trip): a blocking
//! client on the main thread sends one command over and over to a retry-testkit standalone that
//! runs on a runtime of its own thread, as retry-bench's servers do.
//!
//! `cargo bench -p retry-testkit --bench command_cost` prints the wall time per round trip of
//! each command (informative only: the machine is shared). `TESTKIT_COST="<command> <n>"` runs
//! `n` round trips of one command and exits, for callgrind: the server thread's instructions of
//! two runs (n = 1,000 and 3,000) differ by 2,000 commands' cost (docs/benchmarks.md, "Test server
//! cost per command").
//!
//! The commands are what a driver sends: `ping` with an `lsid`, the `hello` of a connection
//! handshake (client metadata, `helloOk`, `compression`) and of a heartbeat (`hello` alone), and
//! `isMaster` as legacy drivers send it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::mpsc;
use std::time::Instant;

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Document};
use retry_core::wire::OpMsg;
use retry_testkit::{Role, ServerConfig, TestServer};

/// The commands this bench knows, by name.
const COMMANDS: [&str; 4] = ["ping", "hello-handshake", "hello-heartbeat", "isMaster"];

fn command(name: &str) -> Document {
    let lsid = doc! { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![7; 16] } };
    match name {
        "ping" => doc! { "ping": 1, "lsid": lsid, "$db": "admin" },
        "hello-handshake" => doc! {
            "hello": 1,
            "helloOk": true,
            "client": {
                "application": { "name": "bench" },
                "driver": { "name": "retry-core", "version": "0.1.0" },
                "os": { "type": "linux", "architecture": "x86_64" },
                "platform": "rustc",
            },
            "compression": [],
            "$db": "admin",
        },
        "hello-heartbeat" => doc! { "hello": 1, "helloOk": true, "$db": "admin" },
        "isMaster" => doc! { "isMaster": 1, "helloOk": true, "$db": "admin" },
        other => panic!("unknown command {other:?}: one of {COMMANDS:?}"),
    }
}

/// Starts a standalone on a thread of its own; its address.
fn server() -> SocketAddr {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        runtime.block_on(async {
            let server = TestServer::start(ServerConfig::new(Role::Standalone))
                .await
                .expect("the server starts");
            tx.send(server.address()).expect("the bench waits");
            // Serves until the process exits.
            std::future::pending::<()>().await;
        });
    });
    rx.recv().expect("the server's address")
}

/// Sends `body` `n` times, one at a time, reading each reply whole.
fn round_trips(stream: &mut TcpStream, body: &Document, n: u32) {
    let mut request = Vec::new();
    let mut reply = vec![0_u8; 64 * 1024];
    for id in 1..=n {
        request.clear();
        OpMsg::command(id as i32, body.clone())
            .encode(48_000_000, &mut request)
            .expect("the command encodes");
        stream.write_all(&request).expect("the server reads");
        stream.read_exact(&mut reply[..4]).expect("a reply");
        let length = i32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]) as usize;
        stream
            .read_exact(&mut reply[4..length])
            .expect("the whole reply");
    }
}

fn main() {
    let address = server();
    let mut stream = TcpStream::connect(address).expect("the server accepts");
    stream.set_nodelay(true).expect("TCP_NODELAY");
    if let Ok(spec) = std::env::var("TESTKIT_COST") {
        let mut parts = spec.split_whitespace();
        let (Some(name), Some(n)) = (parts.next(), parts.next().and_then(|n| n.parse().ok()))
        else {
            panic!("TESTKIT_COST is \"<command> <n>\", not {spec:?}");
        };
        round_trips(&mut stream, &command(name), n);
        return;
    }
    // `cargo bench` passes `--bench`; any other argument (a test filter) runs nothing.
    if std::env::args().skip(1).any(|a| a != "--bench") {
        return;
    }
    for name in COMMANDS {
        let body = command(name);
        round_trips(&mut stream, &body, 1_000);
        let start = Instant::now();
        round_trips(&mut stream, &body, 20_000);
        let micros = start.elapsed().as_secs_f64() * 1e6 / 20_000.0;
        println!("{name}: {micros:.1} µs per round trip (wall clock, informative)");
    }
}
