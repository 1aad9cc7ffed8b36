//! Ping round trips through each adapter against a raw TCP echo of the same OP_MSG bytes, at
//! concurrency 1 and 64, all on 127.0.0.1 and in the same run.
//!
//! The echo is the physical limit here: one write and one read of the ping's bytes per round trip,
//! with no encoding, no server work and no engine. The adapters pay for the engine (selection,
//! checkout, encode, decode, events), the retry-testkit server's command handling, and their
//! runtime. After the criterion runs, interleaved rounds of every case print the ratios.
//!
//! `cargo bench -p retry-bench --bench round_trip`; with `--features mongodb` the official
//! `mongodb` crate runs the same pings against the same test server.

#![allow(missing_docs)] // criterion's macros generate undocumented functions.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bson::doc;
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

/// A TCP echo server on 127.0.0.1: every byte read is written back.
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

/// Everything the cases share: a multi-threaded tokio runtime, the echo server, the test server,
/// and one client per adapter.
struct Setup {
    runtime: tokio::runtime::Runtime,
    echo: SocketAddr,
    tokio_client: retry_tokio::Client,
    async_std_client: retry_async_std::Client,
    #[cfg(feature = "mongodb")]
    official: mongodb::Client,
    _server: TestServer,
}

impl Setup {
    fn new() -> Setup {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a tokio runtime");
        let (echo, server, tokio_client) = runtime.block_on(async {
            let echo = echo_server().await;
            let server = TestServer::start(ServerConfig::new(Role::Standalone))
                .await
                .expect("the test server starts");
            let uri = format!("mongodb://{}/?directConnection=true", server.address());
            let client = retry_tokio::Client::with_uri(&uri).expect("a tokio client");
            (echo, server, client)
        });
        let uri = format!("mongodb://{}/?directConnection=true", server.address());
        let async_std_client =
            retry_async_std::Client::with_uri(&uri).expect("an async-std client");
        #[cfg(feature = "mongodb")]
        let official = runtime.block_on(async {
            mongodb::Client::with_uri_str(&uri)
                .await
                .expect("an official client")
        });
        let setup = Setup {
            runtime,
            echo,
            tokio_client,
            async_std_client,
            #[cfg(feature = "mongodb")]
            official,
            _server: server,
        };
        // Warm up: discover the server and open the pools.
        setup.tokio(8, 8);
        setup.async_std(8, 8);
        setup
    }

    /// `total` echo round trips over `concurrency` connections; the time they took.
    fn echo(&self, concurrency: usize, total: u64) -> Duration {
        let bytes = ping_bytes();
        let echo = self.echo;
        self.runtime.block_on(async move {
            let mut sockets = Vec::new();
            for _ in 0..concurrency {
                let socket = TcpStream::connect(echo).await.expect("connect to the echo");
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
                        let mut reply = vec![0u8; bytes.len()];
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

    /// Runs `total` operations made by `op` on the tokio runtime, split over `concurrency` tasks;
    /// the time they took.
    fn on_tokio<F, Fut>(&self, concurrency: usize, total: u64, op: F) -> Duration
    where
        F: Fn() -> Fut + Clone + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        self.runtime.block_on(async move {
            let start = Instant::now();
            let tasks: Vec<_> = (0..concurrency)
                .map(|i| {
                    let op = op.clone();
                    let n = share(total, concurrency, i);
                    tokio::spawn(async move {
                        for _ in 0..n {
                            op().await;
                        }
                    })
                })
                .collect();
            for task in tasks {
                task.await.expect("a ping task");
            }
            start.elapsed()
        })
    }

    /// `total` pings through retry-tokio with `concurrency` in flight; the time they took.
    fn tokio(&self, concurrency: usize, total: u64) -> Duration {
        let client = self.tokio_client.clone();
        self.on_tokio(concurrency, total, move || {
            let client = client.clone();
            async move {
                let reply = client
                    .run_command("admin", doc! { "ping": 1 }, OperationKind::RunCommand)
                    .await
                    .expect("ping");
                black_box(reply);
            }
        })
    }

    /// `total` pings through the official `mongodb` crate with `concurrency` in flight.
    #[cfg(feature = "mongodb")]
    fn official(&self, concurrency: usize, total: u64) -> Duration {
        let admin = self.official.database("admin");
        self.on_tokio(concurrency, total, move || {
            let admin = admin.clone();
            async move {
                let reply = admin.run_command(doc! { "ping": 1 }).await.expect("ping");
                black_box(reply);
            }
        })
    }

    /// `total` pings through retry-async-std with `concurrency` in flight; the time they took.
    fn async_std(&self, concurrency: usize, total: u64) -> Duration {
        let client = self.async_std_client.clone();
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
}

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
        group.bench_function("retry-tokio", |b| {
            b.iter_custom(|n| setup.tokio(concurrency, n))
        });
        group.bench_function("retry-async-std", |b| {
            b.iter_custom(|n| setup.async_std(concurrency, n))
        });
        #[cfg(feature = "mongodb")]
        group.bench_function("mongodb crate", |b| {
            b.iter_custom(|n| setup.official(concurrency, n))
        });
        group.finish();
    }
}

/// Interleaved rounds of every case, so the printed ratios come from one run.
fn ratios() {
    let setup = Setup::new();
    let (rounds, per_round) = (10, 2_000u64);
    println!();
    println!(
        "{rounds} interleaved rounds of {per_round} round trips (ns per round trip, wall time):"
    );
    for concurrency in CONCURRENCY {
        let mut totals = [Duration::ZERO; 3];
        for _ in 0..rounds {
            totals[0] += setup.echo(concurrency, per_round);
            totals[1] += setup.tokio(concurrency, per_round);
            totals[2] += setup.async_std(concurrency, per_round);
        }
        let per_op = |d: Duration| d.as_nanos() as f64 / (rounds as f64 * per_round as f64);
        let echo = per_op(totals[0]);
        println!(
            "  concurrency {concurrency:>2}: echo {echo:.0} ns, retry-tokio {:.0} ns ({:.1}x), retry-async-std {:.0} ns ({:.1}x)",
            per_op(totals[1]),
            per_op(totals[1]) / echo,
            per_op(totals[2]),
            per_op(totals[2]) / echo,
        );
        #[cfg(feature = "mongodb")]
        {
            let mut official = Duration::ZERO;
            for _ in 0..rounds {
                official += setup.official(concurrency, per_round);
            }
            println!(
                "  concurrency {concurrency:>2}: mongodb crate {:.0} ns ({:.1}x echo, {:.2}x retry-tokio)",
                per_op(official),
                per_op(official) / echo,
                per_op(official) / per_op(totals[1]),
            );
        }
    }
}

criterion_group!(round_trip, benches);

fn main() {
    round_trip();
    Criterion::default().configure_from_args().final_summary();
    ratios();
}
