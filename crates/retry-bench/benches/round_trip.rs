//! Ping round trips through each adapter against a raw TCP echo of the same OP_MSG bytes, at
//! concurrency 1 and 64, all on 127.0.0.1 and in the same run.
//!
//! The echo is the physical limit here: one write and one read of the ping's bytes per round trip,
//! with no encoding, no server work and no engine. The adapters pay for the engine (selection,
//! checkout, encode, decode, events) and their runtime, and for the server's work: every client
//! runs against a retry-testkit standalone and against the bench-only canned server (`canned`,
//! no server work), so their own distance to the echo is measured apart from the server's. The
//! servers run on a runtime and thread of their own, as a server process would. After the
//! criterion runs, interleaved rounds of every case print the ratios (not with
//! `RETRY_BENCH_RATIOS=0`).
//!
//! What each client builds and gets back: the official driver's `run_command` and retry's
//! `run_command` (cases `tokio`, `async-std`) take the command as a `bson::Document` (`doc! {
//! "ping": 1 }`, built for every ping) and convert every reply into one; the `-raw` cases call
//! `run_command_encoded`, which takes the command encoded (`rawdoc! { "ping": 1 }`, built for
//! every ping) and hands the reply over as the server encoded it (a `RawDocumentBuf`): no
//! `Document` on either side, as a caller that keeps BSON bytes would run it. The comparison
//! with the official driver is the Document cases'.
//!
//! How a case runs (the same code under criterion's `iter_custom(n)`, in the interleaved rounds
//! and in [`profile`]): the echo, retry-tokio and the official driver start the clock in
//! `Runtime::block_on` on the bench's own thread, `tokio::spawn` their callers (one task per
//! operation in flight, each running its share of the `n` round trips in a loop) onto the
//! 2-worker "bench-client" runtime their client was built on, and await the tasks' handles: the
//! callers run on the runtime's workers as an application's tasks do, and the bench's thread
//! sleeps until the last caller ends (one wake per `n` round trips, not per round trip; criterion's
//! slope leaves it out). retry-async-std's callers run on a `smol::LocalExecutor` on the bench's
//! thread, which also drives async-io's reactor (docs/adapters.md). Per round trip a caller builds
//! the command and drops the reply, nothing else. Every server runs on the 1-worker "bench-server"
//! runtime in the same process; every client exists (idle between its cases) for every case.
//!
//! Where the threads run decides the figures at one in flight, not the clients: every round trip
//! wakes the server's thread and then the caller's, and on a VM a wake of a thread on another
//! vCPU that has halted costs the host's halt exit and re-entry (20-40 us on the 2-vCPU VM of
//! 2026-11-24, whose guest does not poll before halting), against 17-22 us for the whole round
//! trip's work on one CPU and ~2 us for a retry client's share of it.
//! Unpinned, the kernel puts the threads on one CPU or on both, in phases of seconds that follow
//! what ran before (which case, how long), so a case's figure is its share of such wakes: short
//! blocks of each case in turn (1,000 round trips) and criterion's 2 s per case got different
//! shares and disagreed about the official driver. With the whole process on one CPU (`taskset
//! -c 0`) no wait for a halted vCPU is left and the figure is the round trip's work (clients,
//! server, kernel, context switches: the official driver's hops to its pool worker included),
//! reproducible and the same for every block length; issue 9's one-in-flight goals are read
//! there, the unpinned figure beside it (docs/benchmarks.md, "One in flight: what is measured";
//! scripts/bench-adapters-interleaved.sh, `PIN`). `RETRY_BENCH_CPUS` ([`Placement`]) places the
//! server's and the clients' threads on CPUs of their own, to measure that wake apart; the
//! blocks mode prints per case the machine's cpuidle entries, the bench threads' migrations and
//! context switches per round trip ([`SchedCounts`]).
//!
//! `cargo bench -p retry-bench --bench round_trip`; with `--features mongodb` the official
//! `mongodb` crate runs the same pings against the same servers. `RETRY_BENCH_PROFILE` runs one
//! case for a profiler instead ([`profile`]); `RETRY_BENCH_INTERLEAVED` runs cases in short
//! blocks in rotating order ([`interleaved`]).

#![allow(missing_docs)] // criterion's macros generate undocumented functions.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bson::{doc, rawdoc};
use criterion::{criterion_group, Criterion};
use retry_core::retry::OperationKind;
use retry_core::wire::{OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use retry_testkit::{Role, ServerConfig, TestServer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const CONCURRENCY: [usize; 2] = [1, 64];

/// The ping command's OP_MSG bytes, as the adapters send them.
fn ping_bytes() -> Vec<u8> {
    let mut out = Vec::new();
    OpMsg::command(1, doc! { "ping": 1, "$db": "admin" })
        .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut out)
        .expect("a ping encodes");
    out
}

/// A TCP echo server on 127.0.0.1 on the current runtime: every byte read is written back.
async fn echo_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind 127.0.0.1");
    let address = listener.local_addr().expect("a local address");
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n) = socket.read(&mut buf).await {
                    if n == 0 || socket.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    address
}

/// The bench-only canned server: the adapters' distance to the physical limit without a
/// server's work. It reads whole OP_MSG messages by their length prefix and answers a `hello`
/// (`isMaster`, `ismaster`) with one fixed reply for a standalone and any other command with
/// `{ok: 1}`, encoded once; per reply it only patches `requestID` and `responseTo`. It is not
/// a MongoDB server (no `$db` check, no sessions, no errors): only for retry-bench.
mod canned {
    use bson::doc;
    use retry_core::wire::{MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES, OP_MSG};
    use std::net::SocketAddr;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    /// The encoded replies: `[hello, legacy isMaster, {ok: 1}]`.
    pub(crate) fn replies() -> [Vec<u8>; 3] {
        let hello = |writable: &str| {
            let mut body = doc! { writable: true, "helloOk": true };
            body.extend(doc! {
                "maxBsonObjectSize": 16 * 1024 * 1024,
                "maxMessageSizeBytes": 48_000_000,
                "maxWriteBatchSize": 100_000,
                "localTime": bson::DateTime::now(),
                "logicalSessionTimeoutMinutes": 30,
                "connectionId": 1,
                "minWireVersion": 0,
                "maxWireVersion": 21,
                "readOnly": false,
                "ok": 1.0,
            });
            body
        };
        [
            hello("isWritablePrimary"),
            hello("ismaster"),
            doc! { "ok": 1.0 },
        ]
        .map(|body| {
            let mut out = Vec::new();
            OpMsg::command(0, body)
                .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut out)
                .expect("a canned reply encodes");
            out
        })
    }

    /// Starts the server on the current runtime.
    pub(crate) async fn start() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind 127.0.0.1");
        let address = listener.local_addr().expect("a local address");
        let replies = std::sync::Arc::new(replies());
        tokio::spawn(async move {
            while let Ok((socket, _)) = listener.accept().await {
                socket.set_nodelay(true).expect("nodelay");
                tokio::spawn(serve(socket, replies.clone()));
            }
        });
        address
    }

    /// The command name of an OP_MSG `frame` (its body section's first key), and whether the
    /// client expects no reply (`moreToCome`); `None` if it is not an OP_MSG with a body.
    fn command(frame: &[u8]) -> Option<(&[u8], bool)> {
        let int = |at: usize| Some(i32::from_le_bytes(frame.get(at..at + 4)?.try_into().ok()?));
        if int(12)? != OP_MSG {
            return None;
        }
        let flags = MsgFlags::from_bits(int(16)? as u32);
        let mut at = 20;
        loop {
            let kind = *frame.get(at)?;
            let len = usize::try_from(int(at + 1)?).ok()?;
            if kind == 0 {
                let name = frame.get(at + 6..at + 1 + len)?;
                let end = name.iter().position(|&b| b == 0)?;
                return Some((&name[..end], flags.contains(MsgFlags::MORE_TO_COME)));
            }
            at += 1 + len;
        }
    }

    async fn serve(mut socket: TcpStream, replies: std::sync::Arc<[Vec<u8>; 3]>) {
        let mut input = Vec::with_capacity(64 * 1024);
        let mut output = Vec::with_capacity(64 * 1024);
        let mut request_id = 0i32;
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            let n = match socket.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            input.extend_from_slice(&chunk[..n]);
            let mut used = 0;
            // Every whole message read so far, answered in one write.
            while let Some(len) = input
                .get(used..used + 4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as usize)
            {
                if len < 16 || len > DEFAULT_MAX_MESSAGE_SIZE_BYTES as usize {
                    return;
                }
                if input.len() < used + len {
                    break;
                }
                let frame = &input[used..used + len];
                used += len;
                let Some((name, more_to_come)) = command(frame) else {
                    return;
                };
                if more_to_come {
                    continue;
                }
                let reply = match name {
                    b"hello" => &replies[0],
                    b"isMaster" | b"ismaster" => &replies[1],
                    _ => &replies[2],
                };
                request_id = request_id.wrapping_add(1);
                let start = output.len();
                output.extend_from_slice(reply);
                output[start + 4..start + 8].copy_from_slice(&request_id.to_le_bytes());
                output[start + 8..start + 12].copy_from_slice(&frame[4..8]);
            }
            input.drain(..used);
            if !output.is_empty() {
                if socket.write_all(&output).await.is_err() {
                    return;
                }
                output.clear();
            }
        }
    }
}

/// The bench's threads, by what they run (`RETRY_BENCH_CPUS`).
#[derive(Clone, Copy, Debug)]
enum ThreadRole {
    /// The "bench-server" runtime's threads: the echo, the test server, the canned server.
    Server,
    /// The "bench-client" runtime's threads: the tokio clients' callers, retry-tokio's driver
    /// task, the official driver's pool worker and monitors.
    Client,
    /// The bench's own thread (retry-async-std's and the async-io echo's callers, async-io's
    /// reactor; `block_on` of the tokio cases) and the threads it starts later (async-io's).
    Bench,
}

/// `RETRY_BENCH_CPUS="server=<cpus> client=<cpus> bench=<cpus>"` (`<cpus>` as `taskset -c`
/// reads it, e.g. `1` or `0,1`): the CPUs each role's threads may run on, set with `taskset -p`
/// on every thread as it starts. A role left out is not pinned: its threads inherit the CPUs of
/// the thread that starts them, and `main` pins the bench thread first and starts every
/// runtime from it, so with `bench=` given the server's and the clients' threads left out run
/// on the bench's CPUs (`bench=0` alone puts every thread on CPU 0; `bench=0 server=1` leaves
/// the clients on 0), and with `bench=` left out on the CPUs the process may use (review18
/// finding 9). The whole process on one CPU is `taskset -c 0`
/// around the bench (scripts/bench-adapters-interleaved.sh, `PIN`); this places the server's
/// threads and the clients' apart, to tell the cost of waking a thread on another (halted) vCPU
/// from the clients' own (docs/benchmarks.md, "One in flight: what is measured").
#[derive(Clone, Debug, Default)]
struct Placement {
    server: Option<String>,
    client: Option<String>,
    bench: Option<String>,
}

impl Placement {
    fn from_env() -> Placement {
        let Ok(spec) = std::env::var("RETRY_BENCH_CPUS") else {
            return Placement::default();
        };
        let mut placement = Placement::default();
        for word in spec.split_whitespace() {
            let (role, cpus) = word.split_once('=').unwrap_or_else(|| {
                panic!("RETRY_BENCH_CPUS is \"server=<cpus> client=<cpus> bench=<cpus>\", not {spec:?}")
            });
            let slot = match role {
                "server" => &mut placement.server,
                "client" => &mut placement.client,
                "bench" => &mut placement.bench,
                other => {
                    panic!("unknown role {other:?} in RETRY_BENCH_CPUS: server, client or bench")
                }
            };
            *slot = Some(cpus.to_string());
        }
        placement
    }

    /// A thread-start hook that pins the starting thread to `role`'s CPUs (if any were given;
    /// if not, the thread keeps the CPUs it inherited).
    fn pinning(&self, role: ThreadRole) -> impl Fn() + Send + Sync + 'static {
        let cpus = match role {
            ThreadRole::Server => self.server.clone(),
            ThreadRole::Client => self.client.clone(),
            ThreadRole::Bench => self.bench.clone(),
        };
        move || {
            if let Some(cpus) = &cpus {
                pin_this_thread(cpus);
            }
        }
    }
}

/// Pins the calling thread to `cpus` (`taskset -c` syntax) with `taskset -p`: no `unsafe` and
/// no libc binding in the bench, at the cost of a process per thread start (setup only).
fn pin_this_thread(cpus: &str) {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self (Linux)");
    let tid = link
        .file_name()
        .and_then(|tid| tid.to_str())
        .expect("/proc/thread-self is <pid>/task/<tid>")
        .to_string();
    let status = std::process::Command::new("taskset")
        .args(["-p", "-c", cpus, &tid])
        .stdout(std::process::Stdio::null())
        .status()
        .expect("taskset runs");
    assert!(status.success(), "taskset -p -c {cpus} {tid} failed");
}

/// `RETRY_BENCH_RUNTIME="event_interval=<n> global_queue_interval=<n>"`: tokio's scheduler
/// settings for both of the bench's runtimes (the servers' and the clients'), so every case that
/// runs on them (the echo, retry-tokio, the official driver and every server) runs with the same
/// ones; tokio's defaults when left out. For measuring how the figures at 64 in flight depend
/// on them (docs/benchmarks.md, "64 in flight, thirteenth session"). tokio's `disable_lifo_slot`
/// needs `--cfg tokio_unstable`, a build of its own, and is not offered.
#[derive(Clone, Copy, Debug, Default)]
struct RuntimeTuning {
    event_interval: Option<u32>,
    global_queue_interval: Option<u32>,
}

impl RuntimeTuning {
    fn from_env() -> RuntimeTuning {
        let Ok(spec) = std::env::var("RETRY_BENCH_RUNTIME") else {
            return RuntimeTuning::default();
        };
        let usage = "RETRY_BENCH_RUNTIME is \"event_interval=<n> global_queue_interval=<n>\"";
        let mut tuning = RuntimeTuning::default();
        for word in spec.split_whitespace() {
            let (name, value) = word
                .split_once('=')
                .unwrap_or_else(|| panic!("{usage}, not {spec:?}"));
            let value: u32 = value
                .parse()
                .unwrap_or_else(|_| panic!("{usage}, not {spec:?}"));
            match name {
                "event_interval" => tuning.event_interval = Some(value),
                "global_queue_interval" => tuning.global_queue_interval = Some(value),
                _ => panic!("{usage}, not {spec:?}"),
            }
        }
        tuning
    }

    fn apply(self, builder: &mut tokio::runtime::Builder) -> &mut tokio::runtime::Builder {
        if let Some(n) = self.event_interval {
            builder.event_interval(n);
        }
        if let Some(n) = self.global_queue_interval {
            builder.global_queue_interval(n);
        }
        builder
    }
}

/// Which server the clients talk to.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Server {
    /// A retry-testkit standalone (decodes, dispatches and encodes every command).
    Testkit,
    /// The bench-only canned server ([`canned`]): no server work.
    Canned,
}

const SERVERS: [Server; 2] = [Server::Testkit, Server::Canned];

impl Server {
    fn label(self) -> &'static str {
        match self {
            Server::Testkit => "testkit",
            Server::Canned => "canned",
        }
    }
}

/// One client per adapter (and the official driver) on one server.
struct Clients {
    tokio: retry_tokio::Client,
    async_std: retry_async_std::Client,
    #[cfg(feature = "mongodb")]
    official: mongodb::Client,
}

/// Everything the cases share. The servers (echo, retry-testkit, canned) run on a tokio runtime
/// of their own, on one thread ("bench-server"), as a server process would; the tokio clients on
/// a 2-worker runtime (tokio's default kind); the async-io clients on the bench's thread.
struct Setup {
    // Fields drop in order: the clients before the runtimes they run on.
    clients: [Clients; 2],
    _server: TestServer,
    echo: SocketAddr,
    /// An echo server on the clients' own runtime (the arrangement of the runs before
    /// 2026-11-23 13:00), for comparison only.
    echo_shared: SocketAddr,
    /// The canned server (for the `echo-canned` case).
    canned: SocketAddr,
    runtime: tokio::runtime::Runtime,
    /// The servers' runtime.
    _servers: tokio::runtime::Runtime,
}

impl Setup {
    fn new() -> Setup {
        let placement = Placement::from_env();
        let tuning = RuntimeTuning::from_env();
        let servers = tuning
            .apply(tokio::runtime::Builder::new_multi_thread().worker_threads(1))
            .thread_name("bench-server")
            .on_thread_start(placement.pinning(ThreadRole::Server))
            .enable_all()
            .build()
            .expect("the servers' runtime");
        let runtime = tuning
            .apply(tokio::runtime::Builder::new_multi_thread().worker_threads(2))
            .thread_name("bench-client")
            .on_thread_start(placement.pinning(ThreadRole::Client))
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let (echo, server, canned) = servers.block_on(async {
            let server = TestServer::start(ServerConfig::new(Role::Standalone))
                .await
                .expect("the test server starts");
            (echo_server().await, server, canned::start().await)
        });
        let echo_shared = runtime.block_on(echo_server());
        let clients = [server.address(), canned].map(|address| {
            let uri = format!("mongodb://{address}/?directConnection=true");
            let tokio = runtime
                .block_on(async { retry_tokio::Client::with_uri(&uri).expect("a tokio client") });
            Clients {
                tokio,
                async_std: retry_async_std::Client::with_uri(&uri).expect("an async-std client"),
                #[cfg(feature = "mongodb")]
                official: runtime.block_on(async {
                    mongodb::Client::with_uri_str(&uri)
                        .await
                        .expect("an official client")
                }),
            }
        });
        let setup = Setup {
            clients,
            _server: server,
            echo,
            echo_shared,
            canned,
            runtime,
            _servers: servers,
        };
        // Warm up: discover the servers and open the pools.
        for server in SERVERS {
            setup.tokio(server, 8, 8, false);
            setup.async_std(server, 8, 8, false);
        }
        setup
    }

    fn clients(&self, server: Server) -> &Clients {
        &self.clients[server as usize]
    }

    /// `total` echo round trips over `concurrency` connections to `echo`; the time they took.
    fn echo_at(&self, echo: SocketAddr, concurrency: usize, total: u64) -> Duration {
        self.raw_round_trips(echo, ping_bytes().len(), concurrency, total)
    }

    /// `total` round trips of the ping's bytes over `concurrency` connections to `address`, each
    /// reading `reply_len` bytes back, as the echo's callers do; the time they took.
    fn raw_round_trips(
        &self,
        address: SocketAddr,
        reply_len: usize,
        concurrency: usize,
        total: u64,
    ) -> Duration {
        let bytes = ping_bytes();
        self.runtime.block_on(async move {
            let mut sockets = Vec::new();
            for _ in 0..concurrency {
                let socket = TcpStream::connect(address).await.expect("connect");
                socket.set_nodelay(true).expect("nodelay");
                sockets.push(socket);
            }
            let start = Instant::now();
            let tasks: Vec<_> = sockets
                .into_iter()
                .enumerate()
                .map(|(i, mut socket)| {
                    let bytes = bytes.clone();
                    let n = share(total, concurrency, i);
                    tokio::spawn(async move {
                        let mut reply = vec![0u8; reply_len];
                        for _ in 0..n {
                            socket.write_all(&bytes).await.expect("write");
                            socket.read_exact(&mut reply).await.expect("read");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("an echo task");
            }
            start.elapsed()
        })
    }

    /// [`Setup::echo`] with async-io's callers on the bench's thread, arranged as
    /// [`Setup::async_std`] runs retry-async-std (a `smol::LocalExecutor` under `smol::block_on`,
    /// `Async<TcpStream>` sockets): the same runtime without the client, for telling the runtime's
    /// share of a round trip from the adapter's. Not a criterion case.
    fn echo_async_io(&self, concurrency: usize, total: u64) -> Duration {
        use smol::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let bytes = ping_bytes();
        let executor = smol::LocalExecutor::new();
        smol::block_on(executor.run(async {
            let mut sockets = Vec::new();
            for _ in 0..concurrency {
                let socket = smol::net::TcpStream::connect(self.echo)
                    .await
                    .expect("connect to the echo");
                socket.set_nodelay(true).expect("nodelay");
                sockets.push(socket);
            }
            let start = Instant::now();
            let tasks: Vec<_> = sockets
                .into_iter()
                .enumerate()
                .map(|(i, mut socket)| {
                    let bytes = bytes.clone();
                    let n = share(total, concurrency, i);
                    executor.spawn(async move {
                        let mut reply = vec![0u8; bytes.len()];
                        for _ in 0..n {
                            socket.write_all(&bytes).await.expect("write");
                            socket.read_exact(&mut reply).await.expect("read");
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
            start.elapsed()
        }))
    }

    /// `total` echo round trips (the physical limit) with `concurrency` in flight.
    fn echo(&self, concurrency: usize, total: u64) -> Duration {
        self.echo_at(self.echo, concurrency, total)
    }

    /// Runs `total` operations on the tokio runtime, split over `concurrency` tasks: `task(n)`
    /// is a task's future, which runs `n` of them; the time they took.
    fn on_tokio<F, Fut>(&self, concurrency: usize, total: u64, task: F) -> Duration
    where
        F: Fn(u64) -> Fut,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.runtime.block_on(async move {
            let start = Instant::now();
            let tasks: Vec<_> = (0..concurrency)
                .map(|i| tokio::spawn(task(share(total, concurrency, i))))
                .collect();
            for task in tasks {
                task.await.expect("a ping task");
            }
            start.elapsed()
        })
    }

    /// `total` pings through retry-tokio with `concurrency` in flight; the time they took. Each
    /// reply is converted into a `Document` (`run_command`, as the official driver's
    /// `run_command` does), or with `raw` the command and reply kept encoded
    /// (`run_command_encoded`). Each task holds
    /// its own handle to the client, as the echo's tasks hold their sockets (a clone per ping
    /// would add a shared reference count's traffic between the workers that a user's loop
    /// does not have).
    fn tokio(&self, server: Server, concurrency: usize, total: u64, raw: bool) -> Duration {
        let client = &self.clients(server).tokio;
        self.on_tokio(concurrency, total, |n| {
            let client = client.clone();
            async move {
                for _ in 0..n {
                    let (db, kind) = ("admin", OperationKind::RunCommand);
                    if raw {
                        let command = rawdoc! { "ping": 1 };
                        let reply = client.run_command_encoded(db, command, kind).await;
                        black_box(reply.expect("ping"));
                    } else {
                        let reply = client.run_command(db, doc! { "ping": 1 }, kind).await;
                        black_box(reply.expect("ping"));
                    }
                }
            }
        })
    }

    /// `total` pings through the official `mongodb` crate with `concurrency` in flight (a
    /// database handle per task, as [`Setup::tokio`]).
    #[cfg(feature = "mongodb")]
    fn official(&self, server: Server, concurrency: usize, total: u64) -> Duration {
        let admin = self.clients(server).official.database("admin");
        self.on_tokio(concurrency, total, |n| {
            let admin = admin.clone();
            async move {
                for _ in 0..n {
                    let reply = admin.run_command(doc! { "ping": 1 }).await.expect("ping");
                    black_box(reply);
                }
            }
        })
    }

    /// `total` pings through retry-async-std with `concurrency` in flight, the way docs/adapters.md
    /// recommends: every caller on one thread's executor, which also drives async-io's reactor
    /// (`smol::LocalExecutor` under `smol::block_on`).
    /// With `raw`, through `run_command_encoded` (command and reply encoded), as
    /// [`Setup::tokio`].
    fn async_std(&self, server: Server, concurrency: usize, total: u64, raw: bool) -> Duration {
        let client = self.clients(server).async_std.clone();
        let executor = smol::LocalExecutor::new();
        smol::block_on(executor.run(async {
            let start = Instant::now();
            let tasks: Vec<_> = (0..concurrency)
                .map(|i| {
                    let client = client.clone();
                    let n = share(total, concurrency, i);
                    executor.spawn(async move {
                        for _ in 0..n {
                            let (db, kind) = ("admin", OperationKind::RunCommand);
                            if raw {
                                let command = rawdoc! { "ping": 1 };
                                let reply = client.run_command_encoded(db, command, kind).await;
                                black_box(reply.expect("ping"));
                            } else {
                                let command = doc! { "ping": 1 };
                                let reply = client.run_command(db, command, kind).await;
                                black_box(reply.expect("ping"));
                            }
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
            start.elapsed()
        }))
    }

    /// [`Setup::async_std`] with the callers as `async_std::task::spawn` tasks (async-std's
    /// multi-threaded executor) under `async_std::task::block_on`: the arrangement of the runs
    /// before 2026-11-23 13:00, for comparison.
    fn async_std_spawned(&self, server: Server, concurrency: usize, total: u64) -> Duration {
        let client = self.clients(server).async_std.clone();
        async_std::task::block_on(async move {
            let start = Instant::now();
            let tasks: Vec<_> = (0..concurrency)
                .map(|i| {
                    let client = client.clone();
                    let n = share(total, concurrency, i);
                    async_std::task::spawn(async move {
                        for _ in 0..n {
                            let reply = client
                                .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
                                .await
                                .expect("ping");
                            black_box(reply);
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await;
            }
            start.elapsed()
        })
    }

    /// Runs `case` (a name of [`CASES`]) on `server`.
    fn run(&self, case: &str, server: Server, concurrency: usize, total: u64) -> Duration {
        match case {
            "echo" => self.echo(concurrency, total),
            "echo-shared" => self.echo_at(self.echo_shared, concurrency, total),
            // The echo's callers against the canned server: what the server's answer costs over
            // an echo's, without a client (a diagnostic, no goal).
            "echo-canned" => {
                let reply_len = canned::replies()[2].len();
                self.raw_round_trips(self.canned, reply_len, concurrency, total)
            }
            "echo-async-io" => self.echo_async_io(concurrency, total),
            "tokio" => self.tokio(server, concurrency, total, false),
            "tokio-raw" => self.tokio(server, concurrency, total, true),
            "async-std" => self.async_std(server, concurrency, total, false),
            "async-std-raw" => self.async_std(server, concurrency, total, true),
            "async-std-spawned" => self.async_std_spawned(server, concurrency, total),
            #[cfg(feature = "mongodb")]
            "mongodb" => self.official(server, concurrency, total),
            _ => panic!("unknown case {case:?}: one of {CASES:?}"),
        }
    }
}

/// The cases of `RETRY_BENCH_PROFILE` and the interleaved rounds.
const CASES: [&str; 10] = [
    "echo",
    "echo-shared",
    "echo-canned",
    "echo-async-io",
    "tokio",
    "tokio-raw",
    "async-std",
    "async-std-raw",
    "async-std-spawned",
    "mongodb",
];

/// Task `i`'s share of `total` operations split over `concurrency` tasks.
fn share(total: u64, concurrency: usize, i: usize) -> u64 {
    let c = concurrency as u64;
    total / c + u64::from((i as u64) < total % c)
}

fn benches(c: &mut Criterion) {
    let setup = Setup::new();
    for concurrency in CONCURRENCY {
        let mut group = c.benchmark_group(format!("ping_round_trip_concurrency_{concurrency}"));
        group.bench_function("raw TCP echo", |b| {
            b.iter_custom(|n| setup.echo(concurrency, n))
        });
        for server in SERVERS {
            let label = server.label();
            group.bench_function(format!("retry-tokio, {label} server"), |b| {
                b.iter_custom(|n| setup.tokio(server, concurrency, n, false))
            });
            group.bench_function(
                format!("retry-tokio encoded command and reply, {label} server"),
                |b| b.iter_custom(|n| setup.tokio(server, concurrency, n, true)),
            );
            group.bench_function(format!("retry-async-std, {label} server"), |b| {
                b.iter_custom(|n| setup.async_std(server, concurrency, n, false))
            });
            group.bench_function(
                format!("retry-async-std encoded command and reply, {label} server"),
                |b| b.iter_custom(|n| setup.async_std(server, concurrency, n, true)),
            );
            #[cfg(feature = "mongodb")]
            group.bench_function(format!("mongodb crate, {label} server"), |b| {
                b.iter_custom(|n| setup.official(server, concurrency, n))
            });
        }
        group.finish();
    }
}

/// Interleaved rounds of every case, so the printed ratios come from one run.
fn ratios() {
    let setup = Setup::new();
    let (rounds, per_round) = (10, 2_000u64);
    let cases: Vec<(&str, Server)> = {
        let mut cases = vec![("echo", Server::Testkit), ("echo-shared", Server::Testkit)];
        for server in SERVERS {
            for case in [
                "tokio",
                "tokio-raw",
                "async-std",
                "async-std-raw",
                "async-std-spawned",
                "mongodb",
            ] {
                if case != "mongodb" || cfg!(feature = "mongodb") {
                    cases.push((case, server));
                }
            }
        }
        cases
    };
    println!();
    println!(
        "{rounds} interleaved rounds of {per_round} round trips (ns per round trip, wall time):"
    );
    for concurrency in CONCURRENCY {
        let mut totals = vec![Duration::ZERO; cases.len()];
        for _ in 0..rounds {
            for (total, &(case, server)) in totals.iter_mut().zip(&cases) {
                *total += setup.run(case, server, concurrency, per_round);
            }
        }
        let per_op = |d: Duration| d.as_nanos() as f64 / (rounds as f64 * per_round as f64);
        let echo = per_op(totals[0]);
        let time = |case: &str, server: Server| {
            let i = cases.iter().position(|c| *c == (case, server));
            i.map(|i| per_op(totals[i]))
        };
        println!("  concurrency {concurrency:>2}: echo (server on its own thread) {echo:.0} ns");
        for (&(case, server), total) in cases.iter().zip(&totals).skip(1) {
            let t = per_op(*total);
            let mut line = format!(
                "  concurrency {concurrency:>2}: {case}, {} server: {t:.0} ns ({:.2}x echo",
                if case.starts_with("echo") {
                    "its"
                } else {
                    server.label()
                },
                t / echo
            );
            // Each async-std case against the tokio case that does the same with the reply.
            let tokio_case = match case {
                "async-std-raw" => "tokio-raw",
                _ => "tokio",
            };
            if let Some(tokio) = time(tokio_case, server).filter(|_| case.starts_with("async-std"))
            {
                line += &format!(", {:.2}x {tokio_case}", t / tokio);
            }
            // The official driver converts every reply into a Document: the like-for-like
            // comparison is `tokio` (run_command); `tokio-raw` is shown apart, labelled.
            if case == "mongodb" {
                for tokio_case in ["tokio", "tokio-raw"] {
                    if let Some(tokio) = time(tokio_case, server) {
                        line += &format!(", {tokio_case}'s throughput {:.2}x this", t / tokio);
                    }
                }
            }
            println!("{line})");
        }
    }
}

/// `RETRY_BENCH_PROFILE="<case> <in flight> <round trips> [testkit|canned]"` (a case of
/// [`CASES`]; the server defaults to `testkit`): after the setup and 1,000 round trips of
/// warm-up, runs that many round trips of that one case and exits, for `valgrind` and `strace`
/// (`scripts/bench-adapters-profile.sh` runs it at two counts and takes the difference).
fn profile(spec: &str) {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let (case, in_flight, total, server) = match words[..] {
        [case, in_flight, total] => (case, in_flight, total, "testkit"),
        [case, in_flight, total, server] => (case, in_flight, total, server),
        _ => panic!(
            "RETRY_BENCH_PROFILE is \"<case> <in flight> <round trips> [testkit|canned]\", not {spec:?}"
        ),
    };
    let in_flight: usize = in_flight.parse().expect("in flight is a number");
    let total: u64 = total.parse().expect("round trips is a number");
    let server = match server {
        "testkit" => Server::Testkit,
        "canned" => Server::Canned,
        other => panic!("unknown server {other:?}: testkit or canned"),
    };
    let setup = Setup::new();
    setup.run(case, server, in_flight, 1_000);
    let took = setup.run(case, server, in_flight, total);
    println!(
        "{case} server={} in_flight={in_flight} round_trips={total} ns_per_round_trip={:.0}",
        server.label(),
        took.as_nanos() as f64 / total as f64
    );
}

/// `RETRY_BENCH_INTERLEAVED="<in flight> <testkit|canned> <rounds> <blocks> <round trips> [cases]"`
/// (cases of [`CASES`], default `echo tokio async-std` and with the `mongodb` feature `mongodb`): after the setup and 1,000 round
/// trips of warm-up per case, every round runs `blocks` blocks, and every block runs each case for
/// `round trips`, in an order that rotates by one case from block to block, across rounds too
/// (ABCD, BCDA, ...). A change of the machine's state (a busy or halted vCPU, another process)
/// lasting longer than a block then falls on every case alike. Prints two lines per round: the ns
/// per round trip of each case over that round's blocks, and its [`SchedCounts`] per round trip
/// (`counts=<round> idle_entries/migrations/switches <case>=a/b/c ...`);
/// scripts/bench-adapters-interleaved.sh, `MODE=blocks`, reads them. A block's time includes its
/// start (the spawn of its callers, the bench thread's wake at its end), once per `round trips`,
/// in every case.
fn interleaved(spec: &str) {
    let words: Vec<&str> = spec.split_whitespace().collect();
    let usage = "RETRY_BENCH_INTERLEAVED is \"<in flight> <testkit|canned> <rounds> <blocks> <round trips> [cases]\"";
    let [in_flight, server, rounds, blocks, per_block, ref cases @ ..] = words[..] else {
        panic!("{usage}, not {spec:?}");
    };
    let number = |word: &str| -> u64 { word.parse().unwrap_or_else(|_| panic!("{usage}")) };
    let (in_flight, rounds, blocks, per_block) = (
        number(in_flight) as usize,
        number(rounds),
        number(blocks),
        number(per_block),
    );
    let server = match server {
        "testkit" => Server::Testkit,
        "canned" => Server::Canned,
        other => panic!("unknown server {other:?}: testkit or canned"),
    };
    let cases: Vec<&str> = if cases.is_empty() {
        let official = cfg!(feature = "mongodb").then_some("mongodb");
        ["echo", "tokio", "async-std"]
            .into_iter()
            .chain(official)
            .collect()
    } else {
        cases.to_vec()
    };
    let setup = Setup::new();
    for case in &cases {
        setup.run(case, server, in_flight, 1_000);
    }
    for round in 1..=rounds {
        let mut took = vec![Duration::ZERO; cases.len()];
        let mut counts = vec![SchedCounts::default(); cases.len()];
        for block in 0..blocks as usize {
            // The rotation goes on across rounds, so one block per round rotates too.
            let block = (round - 1) as usize * blocks as usize + block;
            for i in 0..cases.len() {
                let i = (block + i) % cases.len();
                let before = SchedCounts::read();
                took[i] += setup.run(cases[i], server, in_flight, per_block);
                counts[i] += SchedCounts::read() - before;
            }
        }
        let round_trips = (blocks * per_block) as f64;
        let per_op = |d: Duration| d.as_nanos() as f64 / round_trips;
        let line: Vec<String> = cases
            .iter()
            .zip(&took)
            .map(|(case, d)| format!("{case}={:.0}", per_op(*d)))
            .collect();
        println!(
            "round={round} in_flight={in_flight} server={} {}",
            server.label(),
            line.join(" ")
        );
        let line: Vec<String> = cases
            .iter()
            .zip(&counts)
            .map(|(case, c)| {
                let per = |n: u64| n as f64 / round_trips;
                format!(
                    "{case}={:.3}/{:.3}/{:.3}",
                    per(c.idle_entries),
                    per(c.migrations),
                    per(c.switches)
                )
            })
            .collect();
        println!(
            "counts={round} idle_entries/migrations/switches {}",
            line.join(" ")
        );
    }
}

/// Scheduler counts between blocks of [`interleaved`], per round trip of a case: how often a
/// CPU went idle (every CPU's cpuidle entries, from sysfs: on this VM a halt, whose wake-up costs a
/// VM exit; the whole machine's, so idle only on an idle machine), and the bench's threads'
/// migrations between CPUs and context switches (`/proc/self/task/*/sched`). Counts, not times:
/// they say why a case's time per round trip moves with thread placement (docs/benchmarks.md,
/// "One in flight: what is measured"). Zero where the files are missing.
#[derive(Clone, Copy, Debug, Default)]
struct SchedCounts {
    idle_entries: u64,
    migrations: u64,
    switches: u64,
}

impl SchedCounts {
    fn read() -> SchedCounts {
        let number = |path: &std::path::Path| -> u64 {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0)
        };
        let mut counts = SchedCounts::default();
        for cpu in std::fs::read_dir("/sys/devices/system/cpu")
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = cpu.file_name();
            let name = name.to_string_lossy();
            if !name.starts_with("cpu") || !name[3..].bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let states = cpu.path().join("cpuidle");
            for state in std::fs::read_dir(states).into_iter().flatten().flatten() {
                counts.idle_entries += number(&state.path().join("usage"));
            }
        }
        for task in std::fs::read_dir("/proc/self/task")
            .into_iter()
            .flatten()
            .flatten()
        {
            let Ok(sched) = std::fs::read_to_string(task.path().join("sched")) else {
                continue;
            };
            for line in sched.lines() {
                let value = || line.rsplit(':').next().and_then(|v| v.trim().parse().ok());
                if line.starts_with("se.nr_migrations") {
                    counts.migrations += value().unwrap_or(0);
                } else if line.starts_with("nr_switches") {
                    counts.switches += value().unwrap_or(0);
                }
            }
        }
        counts
    }
}

impl std::ops::Sub for SchedCounts {
    type Output = SchedCounts;

    fn sub(self, earlier: SchedCounts) -> SchedCounts {
        SchedCounts {
            idle_entries: self.idle_entries.saturating_sub(earlier.idle_entries),
            migrations: self.migrations.saturating_sub(earlier.migrations),
            switches: self.switches.saturating_sub(earlier.switches),
        }
    }
}

impl std::ops::AddAssign for SchedCounts {
    fn add_assign(&mut self, other: SchedCounts) {
        self.idle_entries += other.idle_entries;
        self.migrations += other.migrations;
        self.switches += other.switches;
    }
}

criterion_group!(round_trip, benches);

fn main() {
    Placement::from_env().pinning(ThreadRole::Bench)();
    if let Ok(spec) = std::env::var("RETRY_BENCH_PROFILE") {
        profile(&spec);
        return;
    }
    if let Ok(spec) = std::env::var("RETRY_BENCH_INTERLEAVED") {
        interleaved(&spec);
        return;
    }
    round_trip();
    Criterion::default().configure_from_args().final_summary();
    // `RETRY_BENCH_RATIOS=0`: the criterion run only (scripts/bench-adapters-interleaved.sh).
    if std::env::var("RETRY_BENCH_RATIOS").as_deref() != Ok("0") {
        ratios();
    }
}
