//! The tests each unified suite is known to fail, each with its reason (review5 item 12, house
//! rule 10). A suite's trial fails when any other test fails, or a listed test passes (take it
//! off the list) or does not run; "not diagnosed yet" marks a failure whose cause is still open.
//! Reasons: `product` (a missing feature), `runner` (a test-runner operation or argument not
//! implemented), `testkit` (server behaviour the test server does not model).

use super::{fails, KnownFailure};

/// sdam: one test that depends on timing (a 250 ms `socketTimeoutMS` during authentication,
/// which other processes' load may exhaust); it usually passes.
pub const SDAM: &[KnownFailure] = &[KnownFailure {
    test: "auth-network-timeout-error.json: Reset server and pool after network timeout error during authentication",
    reason: "timing: its 250 ms socketTimeoutMS may run out during authentication on a loaded machine",
    may_pass: true,
}];

/// transactions: 14 known failures.
pub const TRANSACTIONS: &[KnownFailure] = &[
    fails(
        r#"causal-consistency.json: causal consistency"#,
        "product: causal consistency cannot be turned off (SE-21: always on)",
    ),
    fails(
        r#"causal-consistency.json: causal consistency disabled"#,
        "product: causal consistency cannot be turned off (SE-21: always on)",
    ),
    fails(
        r#"client-bulkWrite.json: client bulkWrite with writeConcern in a transaction causes a transaction error"#,
        "runner: the operation argument writeConcern is not supported",
    ),
    fails(
        r#"create-collection.json: explicitly create collection using create command"#,
        "runner: the operation argument collection is not supported",
    ),
    fails(
        r#"create-collection.json: implicitly create collection using insert"#,
        "runner: the operation argument collection is not supported",
    ),
    fails(
        r#"create-index.json: create index on a collection created within the same transaction"#,
        "runner: the operation argument collection is not supported",
    ),
    fails(
        r#"create-index.json: create index on a non-existing collection"#,
        "runner: the operation argument collection is not supported",
    ),
    fails(
        r#"read-pref.json: nearest readPreference"#,
        "product: a transaction's read preference is always primary (no other mode can be set)",
    ),
    fails(
        r#"read-pref.json: primaryPreferred readPreference"#,
        "product: a transaction's read preference is always primary (no other mode can be set)",
    ),
    fails(
        r#"read-pref.json: secondary readPreference"#,
        "product: a transaction's read preference is always primary (no other mode can be set)",
    ),
    fails(
        r#"read-pref.json: secondary write only"#,
        "product: a transaction's read preference is always primary (no other mode can be set)",
    ),
    fails(
        r#"run-command.json: run command fails with secondary read preference from transaction options"#,
        "product: a transaction's read preference is always primary (no other mode can be set)",
    ),
    fails(
        r#"transaction-options.json: readPreference inherited from defaultTransactionOptions"#,
        "product: a transaction's read preference is always primary (no other mode can be set)",
    ),
    fails(
        r#"transaction-options.json: startTransaction overrides readPreference"#,
        "product: a transaction's read preference is always primary (no other mode can be set)",
    ),
];

/// sessions: 25 known failures.
pub const SESSIONS: &[KnownFailure] = &[
    fails(
        r#"snapshot-sessions-not-supported-server-error.json: Server returns an error on aggregate with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-not-supported-server-error.json: Server returns an error on distinct with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-not-supported-server-error.json: Server returns an error on find with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on deleteOne with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on findOneAndUpdate with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on insertMany with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on insertOne with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on listCollections with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on listDatabases with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on listIndexes with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on runCommand with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions-unsupported-ops.json: Server returns an error on updateOne with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Aggregate operation with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Aggregate operation with snapshot and snapshot time"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Distinct operation with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Distinct operation with snapshot and snapshot time"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Find operation with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Find operation with snapshot and snapshot time"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: First snapshot read does not send atClusterTime"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Mixed operation with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Mixed operation with snapshot and snapshotTime"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: StartTransaction fails in snapshot session"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: Write commands with snapshot session do not affect snapshot reads"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: countDocuments operation with snapshot"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
    fails(
        r#"snapshot-sessions.json: countDocuments operation with snapshot and snapshot time"#,
        "product: snapshot sessions are not supported (SE-22)",
    ),
];

/// client-side-operations-timeout (the files `UnifiedSuite::files` lists): 3 known failures.
pub const CLIENT_SIDE_OPERATIONS_TIMEOUT: &[KnownFailure] = &[
    fails(
        r#"legacy-timeouts.json: wTimeoutMS is not used to derive a maxTimeMS command field"#,
        "runner: a client's wTimeoutMS is not put into the write concern its collections inherit",
    ),
    fails(
        r#"sessions-inherit-timeoutMS.json: timeoutMS applied to withTransaction"#,
        "product: there is no withTransaction (the convenient transaction API, TX-13)",
    ),
    fails(
        r#"sessions-override-timeoutMS.json: timeoutMS applied to withTransaction"#,
        "product: there is no withTransaction (the convenient transaction API, TX-13)",
    ),
];
