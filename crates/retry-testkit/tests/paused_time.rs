//! The server's clock is tokio's: under a paused runtime, the ingress limiter refills and
//! `blockConnection` ends in virtual time.
//!
//! A paused runtime jumps to the next timer whenever it is idle, even while a socket read is
//! pending, so these tests keep no timer of their own inside the runtime (no `timeout`). They are
//! bounded from outside instead: the runtime runs on its own thread, and the test waits for it a
//! bounded time.

use std::sync::mpsc;
use std::time::Duration;

use bson::{doc, Document};
use retry_testkit::{
    FailCommand, FailPointMode, IngressLimit, RateLimit, RawClient, ServerConfig, TestServer,
};
use tokio::time::Instant;

/// Runs `body` on a paused current-thread runtime on its own thread; fails if it takes more than
/// 20 real seconds or panics.
fn paused<F>(body: impl FnOnce() -> F + Send + 'static)
where
    F: std::future::Future<Output = ()>,
{
    let (done, finished) = mpsc::channel();
    let runner = std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a runtime");
        runtime.block_on(body());
        // The receiver is gone only if the test already failed on its bound.
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(20)) {
        Ok(()) => runner.join().expect("the runtime thread ended"),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // The body panicked: re-raise its panic here.
            if let Err(panic) = runner.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("the test exceeded its bound"),
    }
}

fn ping() -> Document {
    doc! { "ping": 1, "$db": "admin" }
}

#[test]
fn the_ingress_limiter_refills_in_virtual_time() {
    paused(|| async {
        let config = ServerConfig {
            ingress_limit: Some(IngressLimit::new(RateLimit::new(1.0, 1))),
            ..ServerConfig::default()
        };
        let server = TestServer::start(config).await.unwrap();
        let mut client = RawClient::connect(server.address()).await.unwrap();
        let code = |reply: Document| reply.get_i32("code").ok();

        assert_eq!(code(client.command(ping()).await.unwrap()), None);
        assert_eq!(code(client.command(ping()).await.unwrap()), Some(462));
        tokio::time::advance(Duration::from_millis(999)).await;
        assert_eq!(code(client.command(ping()).await.unwrap()), Some(462));
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(code(client.command(ping()).await.unwrap()), None);
        assert_eq!(server.handle().counters().ingress_rejected, 2);
        server.shutdown().await;
    });
}

#[test]
fn block_connection_ends_in_virtual_time() {
    paused(|| async {
        let server = TestServer::start(ServerConfig::default()).await.unwrap();
        let block = Duration::from_secs(3600);
        server.handle().set_fail_command(Some(
            FailCommand::new(FailPointMode::Times(1), ["ping"]).with_block(block),
        ));
        let mut client = RawClient::connect(server.address()).await.unwrap();
        let start = Instant::now();
        let reply = client.command(ping()).await.unwrap();
        assert_eq!(reply.get_f64("ok").ok(), Some(1.0));
        assert!(
            Instant::now() - start >= block,
            "the hour passed, virtually"
        );
        server.shutdown().await;
    });
}

/// An `lsid` as a real server takes it: `{id: <UUID>}`, the UUID's bytes all `n`.
fn lsid_of(n: u8) -> Document {
    let uuid = bson::Binary {
        subtype: bson::spec::BinarySubtype::Uuid,
        bytes: vec![n; 16],
    };
    doc! { "id": uuid }
}

/// TK-15 (review8 finding 6): a write outside any transaction waits for each transaction in
/// progress it runs into until that transaction is 60 s old (a real server's default
/// `transactionLifetimeLimitSeconds`, counted from the transaction's own start), then that
/// transaction is aborted. Here the write waits for A (started at 0 s) until 60 s, then runs
/// into B (started at 30 s) and waits until 90 s, not aborting B at once.
#[test]
fn tk15_review8_f6_the_wait_deadline_counts_from_each_transactions_start() {
    paused(|| async {
        let server = TestServer::start_replica_set("rs0", 1, ServerConfig::default())
            .await
            .unwrap()
            .remove(0);
        let mut client = RawClient::connect(server.address()).await.unwrap();
        let mut writer = RawClient::connect(server.address()).await.unwrap();
        let start_transaction = |session: u8, id: i32| {
            doc! {
                "insert": "t", "documents": [{ "_id": id }], "$db": "test",
                "lsid": lsid_of(session), "txnNumber": 1_i64, "autocommit": false,
                "startTransaction": true,
            }
        };
        let start = Instant::now();
        let reply = client.command(start_transaction(1, 1)).await.unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
        let waiting = tokio::spawn(async move {
            let reply = writer
                .command(doc! {
                    "update": "t", "$db": "test",
                    "updates": [
                        { "q": { "_id": 1 }, "u": { "$set": { "x": 1 } }, "upsert": true },
                        { "q": { "_id": 2 }, "u": { "$set": { "x": 1 } }, "upsert": true },
                    ],
                })
                .await
                .unwrap();
            (reply, Instant::now())
        });
        tokio::time::sleep(Duration::from_secs(30)).await;
        let mut other = RawClient::connect(server.address()).await.unwrap();
        let reply = other.command(start_transaction(2, 2)).await.unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(1), "{reply}");
        let (reply, done) = waiting.await.unwrap();
        assert_eq!(reply.get_i32("n").ok(), Some(2), "{reply}");
        let waited = done - start;
        assert!(
            waited >= Duration::from_secs(90) && waited < Duration::from_secs(91),
            "B expires 60 s after its own start: {waited:?}"
        );
        server.shutdown().await;
    });
}
