//! TO-6 (`maxCommitTimeMS`) and TO-14 (a session's `defaultTimeoutMS`): the `maxTimeMS` a
//! transaction's `commitTransaction` and `abortTransaction` carry, and the timeout they run
//! under, as a scripted mongos receives them, in virtual time.

use core::time::Duration;

use bson::{doc, Bson, Document};
use retry_core::engine::{OpId, OperationRequest, SessionHandle};
use retry_core::error::ErrorKind;
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_core::time::OperationTimeout;
use retry_core::transaction::TransactionOptions;

use retry_sim::{address, Role, Sim, SimServer, Step};

/// One mongos that records what it receives and answers with `script`, then `{ok: 1}`.
fn mongos(script: Vec<Step>) -> Sim {
    let mut server = SimServer::new(Role::Mongos);
    server.record_commands = true;
    server.script.extend(script);
    Sim::new(vec![(address("m"), server)], |_| {})
}

fn received(sim: &Sim) -> Vec<Document> {
    sim.servers[&address("m")].commands.clone()
}

const COMMIT: OperationKind = OperationKind::CommitTransaction { again: false };

/// `command` in `session`, on `admin` for commit and abort, under `timeout` (the client's
/// `timeoutMS`, or for a commit or abort the session's `defaultTimeoutMS`, as a driver sets
/// it: TO-14).
fn request(
    session: SessionHandle,
    command: Document,
    kind: OperationKind,
    timeout: OperationTimeout,
) -> OperationRequest {
    let db = match kind {
        OperationKind::CommitTransaction { .. } | OperationKind::AbortTransaction => "admin",
        _ => "test",
    };
    let mut request =
        OperationRequest::new(db, command, kind, SelectionCriteria::Write).with_session(session);
    request.timeout = timeout;
    request
}

/// Starts a transaction with `options` in a new session and runs its first insert (no CSOT).
fn transaction(sim: &mut Sim, options: TransactionOptions) -> SessionHandle {
    let session = sim.engine.start_session();
    sim.engine
        .start_transaction(session, options, sim.now)
        .expect("the transaction starts");
    let insert = OperationKind::InTransaction {
        read: false,
        first: true,
    };
    let op = sim.start_request(request(
        session,
        doc! { "insert": "c", "documents": [{}] },
        insert,
        OperationTimeout::Off,
    ));
    sim.run(op).expect("the insert succeeds");
    session
}

fn commit(sim: &mut Sim, session: SessionHandle, timeout: OperationTimeout) -> OpId {
    sim.start_request(request(
        session,
        doc! { "commitTransaction": 1 },
        COMMIT,
        timeout,
    ))
}

fn abort(sim: &mut Sim, session: SessionHandle, timeout: OperationTimeout) -> OpId {
    sim.start_request(request(
        session,
        doc! { "abortTransaction": 1 },
        OperationKind::AbortTransaction,
        timeout,
    ))
}

fn max_time(command: &Document) -> Option<&Bson> {
    command.get("maxTimeMS")
}

fn name(command: &Document) -> &str {
    command.keys().next().map_or("", String::as_str)
}

fn one_second() -> TransactionOptions {
    TransactionOptions::default().with_max_commit_time(Duration::from_millis(1_000))
}

/// TO-6 (`legacy-timeouts.json` "maxCommitTimeMS option is used directly as the maxTimeMS
/// field on a commitTransaction command"): without `timeoutMS`, `maxCommitTimeMS` goes on the
/// commit as `maxTimeMS`, exactly, on its TX-10 retry too; the transaction's other commands and
/// its abort carry none.
#[test]
fn to6_max_commit_time_is_the_commits_max_time_ms_without_timeout_ms() {
    let retryable = doc! {
        "ok": 0, "code": 91, "errmsg": "shutting down", "errorLabels": ["RetryableWriteError"],
    };
    let mut sim = mongos(vec![Step::reply(doc! { "ok": 1 }), Step::reply(retryable)]);
    let session = transaction(&mut sim, one_second());
    let op = commit(&mut sim, session, OperationTimeout::Off);
    sim.run(op).expect("the retried commit succeeds");
    // A second transaction of the session, aborted: abort never carries it.
    sim.engine
        .start_transaction(session, one_second(), sim.now)
        .unwrap();
    let insert = OperationKind::InTransaction {
        read: false,
        first: true,
    };
    let op = sim.start_request(request(
        session,
        doc! { "insert": "c", "documents": [{}] },
        insert,
        OperationTimeout::Off,
    ));
    sim.run(op).unwrap();
    let op = abort(&mut sim, session, OperationTimeout::Off);
    sim.run(op).unwrap();

    let commands = received(&sim);
    let names: Vec<&str> = commands.iter().map(name).collect();
    assert_eq!(
        names,
        [
            "insert",
            "commitTransaction",
            "commitTransaction",
            "insert",
            "abortTransaction"
        ]
    );
    assert_eq!(max_time(&commands[1]), Some(&Bson::Int32(1_000)));
    assert_eq!(
        max_time(&commands[2]),
        Some(&Bson::Int32(1_000)),
        "TX-10: the retry carries it too"
    );
    for i in [0, 3, 4] {
        assert_eq!(max_time(&commands[i]), None, "{}", commands[i]);
    }
}

/// TO-6, TO-8, CS-4 (`deprecated-options.json` "commitTransaction ignores maxCommitTimeMS if
/// timeoutMS is set"): under `timeoutMS` the commit's `maxTimeMS` is the remaining time less
/// the minimum RTT, never `maxCommitTimeMS`; TO-7: under `timeoutMS=0` it carries none.
#[test]
fn to6_to8_max_commit_time_is_ignored_under_timeout_ms() {
    let mut sim = mongos(Vec::new());
    let session = transaction(&mut sim, one_second());
    let deadline = sim.now.saturating_add(Duration::from_millis(5_000));
    let op = commit(&mut sim, session, OperationTimeout::Until(deadline));
    sim.run(op).unwrap();
    // A commit again (TX-11), under `timeoutMS=0`.
    let again = sim.start_request(request(
        session,
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: true },
        OperationTimeout::Unbounded,
    ));
    sim.run(again).unwrap();

    let commands = received(&sim);
    assert_eq!(name(&commands[1]), "commitTransaction");
    // Written at once on the session's connection: all 5000 ms left, less the minimum RTT,
    // zero until the monitor has two samples (MO-13).
    assert_eq!(max_time(&commands[1]), Some(&Bson::Int32(5_000)));
    assert_eq!(name(&commands[2]), "commitTransaction");
    assert_eq!(max_time(&commands[2]), None, "TO-7: timeoutMS=0");
}

/// TO-14 (`sessions-override-timeoutMS.json`): a commit given the session's timeout as its own
/// (the client having no `timeoutMS`): its `maxTimeMS` derives from it, not from
/// `maxCommitTimeMS`, and a commit blocked past it fails with a timeout error at its deadline.
/// It is that request's alone: the next commit, given none, runs without CSOT again.
#[test]
fn to14_session_timeout_applies_to_commit_once() {
    let blocked = Step::Reply {
        body: doc! { "ok": 1 },
        delay: Duration::from_millis(600),
    };
    let mut sim = mongos(vec![Step::reply(doc! { "ok": 1 }), blocked]);
    let session = transaction(&mut sim, one_second());
    let started = sim.now;
    let session_timeout = OperationTimeout::from_timeout_ms(started, Duration::from_millis(500));
    let op = commit(&mut sim, session, session_timeout);
    let error = sim
        .run(op)
        .expect_err("the commit outlives the session's timeout");
    assert!(matches!(error.kind, ErrorKind::Timeout { .. }), "{error:?}");
    let finished = sim
        .events
        .iter()
        .find_map(|(at, e)| match e {
            retry_core::engine::EngineEvent::OperationFinished { op: o, .. } if *o == op => {
                Some(*at)
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(
        finished.saturating_duration_since(started),
        Duration::from_millis(500)
    );
    // The session's timeout was that request's: the next commit (TX-11, again) runs without
    // `timeoutMS`, with `maxCommitTimeMS`.
    let again = sim.start_request(request(
        session,
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: true },
        OperationTimeout::Off,
    ));
    sim.run(again).unwrap();

    let commands = received(&sim);
    let commits: Vec<&Document> = commands
        .iter()
        .filter(|c| name(c) == "commitTransaction")
        .collect();
    assert_eq!(commits.len(), 2, "{commands:?}");
    assert_eq!(max_time(commits[0]), Some(&Bson::Int32(500)));
    assert_eq!(max_time(commits[1]), Some(&Bson::Int32(1_000)));
}

/// TO-14: the session's timeout, given to the request in place of the client's `timeoutMS`
/// (both ways), applies to abort (the abort of ending a session is an abort request), and
/// `defaultTimeoutMS=0` (unbounded) sends no `maxTimeMS` even where the client's `timeoutMS`
/// (300 ms) would, nor `maxCommitTimeMS`.
#[test]
fn to14_session_timeout_applies_to_abort_and_overrides_the_clients() {
    let mut sim = mongos(Vec::new());
    let session = transaction(&mut sim, TransactionOptions::default());
    let longer = OperationTimeout::from_timeout_ms(sim.now, Duration::from_millis(2_000));
    let op = abort(&mut sim, session, longer);
    sim.run(op).unwrap();
    let second = transaction(&mut sim, one_second());
    let unbounded = OperationTimeout::from_timeout_ms(sim.now, Duration::ZERO);
    assert_eq!(unbounded, OperationTimeout::Unbounded, "CS-1");
    let op = commit(&mut sim, second, unbounded);
    sim.run(op).unwrap();

    let commands = received(&sim);
    let names: Vec<&str> = commands.iter().map(name).collect();
    assert_eq!(
        names,
        ["insert", "abortTransaction", "insert", "commitTransaction"]
    );
    assert_eq!(max_time(&commands[1]), Some(&Bson::Int32(2_000)));
    assert_eq!(
        max_time(&commands[3]),
        None,
        "TO-7: the session's timeoutMS=0 wins over the client's 300 ms, and CSOT ignores \
         maxCommitTimeMS (TO-8)"
    );
}

/// TO-14, TX-2: a commit that sends nothing under the session's timeout finishes at once,
/// and the timeout stays that request's: the session's later commit, given none, is not held to
/// the spent deadline.
#[test]
fn to14_a_commit_that_sends_nothing_takes_the_timeout() {
    let mut sim = mongos(Vec::new());
    let session = sim.engine.start_session();
    sim.engine
        .start_transaction(session, one_second(), sim.now)
        .unwrap();
    let session_timeout = OperationTimeout::from_timeout_ms(sim.now, Duration::from_millis(1));
    // Nothing written: the commit finishes at once, without a command (TX-2).
    let op = commit(&mut sim, session, session_timeout);
    assert_eq!(sim.run(op).unwrap(), Document::new());
    sim.advance_to(sim.now.saturating_add(Duration::from_secs(1)));
    sim.engine
        .start_transaction(session, one_second(), sim.now)
        .unwrap();
    let insert = OperationKind::InTransaction {
        read: false,
        first: true,
    };
    let op = sim.start_request(request(
        session,
        doc! { "insert": "c", "documents": [{}] },
        insert,
        OperationTimeout::Off,
    ));
    sim.run(op).unwrap();
    let op = commit(&mut sim, session, OperationTimeout::Off);
    sim.run(op).expect("not under the spent 1 ms deadline");
    let commands = received(&sim);
    assert_eq!(max_time(&commands[1]), Some(&Bson::Int32(1_000)));
    sim.engine.end_session(session, sim.now);
}

/// TO-6: a negative `maxCommitTimeMS`, or one above what a server takes as `maxTimeMS`, is a
/// usage error (never a panic); `start_transaction` refuses a `Duration` above it, changing
/// nothing.
#[test]
fn to6_bad_max_commit_time_is_a_usage_error() {
    for bad in [-1_i64, i64::MIN, i64::from(i32::MAX) + 1] {
        let error = TransactionOptions::default()
            .with_max_commit_time_ms(bad)
            .expect_err("refused");
        assert!(matches!(error.kind, ErrorKind::Usage { .. }), "{error:?}");
    }
    let given = |ms: i64| {
        TransactionOptions::default()
            .with_max_commit_time_ms(ms)
            .expect("in range")
            .max_commit_time
    };
    assert_eq!(given(0), Some(Duration::ZERO), "0 is passed through");
    assert_eq!(
        given(i64::from(i32::MAX)),
        Some(Duration::from_millis(i32::MAX as u64))
    );
    let mut sim = mongos(Vec::new());
    let session = sim.engine.start_session();
    let too_long =
        TransactionOptions::default().with_max_commit_time(Duration::from_millis(1 << 31));
    let error = sim
        .engine
        .start_transaction(session, too_long, sim.now)
        .expect_err("refused");
    match error.kind {
        ErrorKind::Usage { message } => assert!(message.contains("maxCommitTimeMS"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        sim.engine.transaction_state(session),
        Some(retry_core::transaction::TransactionState::None)
    );
}
