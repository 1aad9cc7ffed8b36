//! TX-8, RW-9, TX-4 (3), TX-10 (review38 L2): a server older than 4.4 (wire 8, still supported)
//! never labels its errors, so a commitTransaction refused with a retryable write code (here 6,
//! HostUnreachable) is a retryable write error only by the driver's RW-9 rule. It must get
//! `UnknownTransactionCommitResult` like a labelled one: the transaction unpins from its mongos
//! before the retry selects (TX-4 (3)), and the caller's final error carries both labels.

mod support;

use std::cell::RefCell;
use std::rc::Rc;

use bson::{doc, Document};
use retry_core::address::ServerAddress;
use retry_core::engine::{EngineOptions, OperationRequest};
use retry_core::error::Labels;
use retry_core::handshake::{ClientMetadata, HandshakeOptions};
use retry_core::retry::OperationKind;
use retry_core::selection::SelectionCriteria;
use retry_core::topology::TopologySettings;
use support::net::{address, is_hello, Net, Script};

/// Three 4.2 mongos: inserts succeed, every commit fails with code 6; the commits' servers are
/// kept in `commits`.
fn mongos_42(commits: Rc<RefCell<Vec<ServerAddress>>>) -> Script {
    Box::new(move |server, body: &Document| {
        Some(if is_hello(body) {
            doc! { "ok": 1, "helloOk": true, "isWritablePrimary": true, "msg": "isdbgrid",
            "maxWireVersion": 8, "minWireVersion": 0, "logicalSessionTimeoutMinutes": 30 }
        } else if body.contains_key("commitTransaction") {
            commits.borrow_mut().push(server.clone());
            doc! { "ok": 0, "code": 6, "codeName": "HostUnreachable", "errmsg": "unreachable" }
        } else {
            doc! { "ok": 1, "n": 1 }
        })
    })
}

#[test]
fn tx8_tx4_3_a_pre_4_4_commit_error_with_a_retryable_code_is_unknown_and_unpins() {
    let commits = Rc::new(RefCell::new(Vec::new()));
    let mut handshake = HandshakeOptions::new();
    handshake.metadata = ClientMetadata::new("tx8", "0.1.0");
    let settings = TopologySettings::new(vec![address("m1"), address("m2"), address("m3")]);
    let mut net = Net::new(
        EngineOptions::new(settings, handshake),
        mongos_42(commits.clone()),
    );
    let session = net.engine.start_session();
    net.engine
        .start_transaction(session, Default::default(), net.now)
        .expect("starts");
    let insert = OperationRequest::new(
        "test",
        doc! { "insert": "c", "documents": [{}] },
        OperationKind::InTransaction {
            read: false,
            first: true,
        },
        SelectionCriteria::Write,
    )
    .with_session(session);
    let op = net.start(insert);
    assert!(
        matches!(net.finished(op)[..], [Ok(_)]),
        "the transaction starts"
    );
    let pinned = net
        .engine
        .session_info(session)
        .and_then(|i| i.pinned)
        .expect("TX-3: pinned to its mongos");
    let commit = OperationRequest::new(
        "admin",
        doc! { "commitTransaction": 1 },
        OperationKind::CommitTransaction { again: false },
        SelectionCriteria::Write,
    )
    .with_session(session);
    let op = net.start(commit);
    let limit = net.now.saturating_add(std::time::Duration::from_secs(60));
    net.run_until(limit);
    let finished = net.finished(op);
    let [Err(error)] = finished[..] else {
        panic!("the commit fails: {finished:?}");
    };
    assert!(error.has_label(Labels::RETRYABLE_WRITE), "{error}");
    assert!(
        error.has_label(Labels::UNKNOWN_TRANSACTION_COMMIT_RESULT),
        "TX-8: {error}"
    );
    let commits = commits.borrow();
    assert_eq!(commits.len(), 2, "TX-10: retried once: {commits:?}");
    assert_eq!(commits[0], pinned, "the first commit follows the pin");
    assert_ne!(
        commits[1], pinned,
        "TX-4 (3): unpinned, the retry selects another mongos"
    );
    let info = net.engine.session_info(session).expect("open");
    assert_eq!(info.pinned, None, "TX-4 (3): unpinned");
}
