//! Which retry rules a command falls under, read from the command itself.
//!
//! [`classify`] maps a command document (with its kind-1 document sequences and the write concern
//! it inherits) to the [`OperationKind`] the retry machine needs, by the retryable-reads and
//! retryable-writes specs:
//!
//! - RR-3: `find`, `aggregate` without `$out`/`$merge` (change streams included), `distinct`,
//!   `count`, `listDatabases`, `listCollections`, `listIndexes` are retryable reads;
//! - RR-4: `getMore` is never a retryable read; `mapReduce` and any command this module does not
//!   know are generic commands (RW-5: never given a `txnNumber`);
//! - RW-3: `insert`, `update`, `delete`, `findAndModify` and client `bulkWrite` are retryable
//!   writes when acknowledged and no statement is multi-document;
//! - RW-4: `update` with `multi: true`, `delete` with `limit: 0`, a client `bulkWrite` with a
//!   `multi: true` operation, any write with `w: 0`, `aggregate` with `$out`/`$merge`, and every
//!   other write command are not retryable writes;
//! - TX-1, TX-10, RW-4: `commitTransaction` / `abortTransaction` are retried by the transaction
//!   rules; any other command with `autocommit: false` runs inside a transaction, and
//!   `startTransaction: true` marks its first command.
//!
//! The function reads the command; it never changes it. A caller that knows better (a cursor's
//! `getMore`, a second commit of the same transaction) passes its own kind instead.
//!
//! The same tables say which commands inherit the client's write or read concern
//! ([`inherits_write_concern`], [`inherits_read_concern`], read-write-concern spec), so that the
//! retry rules and the concerns a driver adds cannot disagree on what a write is.

use bson::{Bson, Document};

use crate::retry::OperationKind;
use crate::wire::DocumentSequence;

/// The read commands (RR-3): retryable reads, and the only commands a hedging policy applies to
/// ([`crate::service_config`]). `aggregate` is a read only without a `$out` or `$merge` stage.
pub const READ_COMMANDS: [&str; 7] = [
    "find",
    "aggregate",
    "distinct",
    "count",
    "listDatabases",
    "listCollections",
    "listIndexes",
];

/// Write commands that are never retryable writes (RW-4): everything that changes data or
/// metadata other than the four retryable write commands and client `bulkWrite`; with whether
/// each takes a `writeConcern` (the server's list: the search-index commands and `compact` take
/// none, and refuse one).
const OTHER_WRITES: [(&str, bool); 28] = [
    ("create", true),
    ("createIndexes", true),
    ("drop", true),
    ("dropDatabase", true),
    ("dropIndexes", true),
    ("deleteIndexes", true),
    ("renameCollection", true),
    ("collMod", true),
    ("convertToCapped", true),
    ("cloneCollectionAsCapped", true),
    ("createSearchIndexes", false),
    ("dropSearchIndex", false),
    ("updateSearchIndex", false),
    ("createUser", true),
    ("updateUser", true),
    ("dropUser", true),
    ("dropAllUsersFromDatabase", true),
    ("grantRolesToUser", true),
    ("revokeRolesFromUser", true),
    ("createRole", true),
    ("updateRole", true),
    ("dropRole", true),
    ("dropAllRolesFromDatabase", true),
    ("grantRolesToRole", true),
    ("revokeRolesFromRole", true),
    ("grantPrivilegesToRole", true),
    ("revokePrivilegesFromRole", true),
    ("compact", false),
];

/// The retryable write commands (RW-3), all of which take a `writeConcern`.
const RETRYABLE_WRITES: [&str; 6] = [
    "insert",
    "update",
    "delete",
    "findAndModify",
    "findandmodify",
    "bulkWrite",
];

/// Reads that take a `readConcern` besides `aggregate` without a write stage and `mapReduce`
/// with inline output. (`aggregate` with `$out` / `$merge` takes one only from MongoDB 4.2 on;
/// it inherits none.)
const READ_CONCERN_READS: [&str; 4] = ["find", "count", "distinct", "geoSearch"];

/// The retry rules a command falls under (see the module docs for the rules and their IDs).
///
/// `sequences` are the command's kind-1 sections (WP-4: `documents`, `updates`, `deletes`, `ops`
/// may travel there instead of in the body). `inherited_write_concern` is the write concern the
/// command gets from its client, database or collection when it has no `writeConcern` field of
/// its own; `None` means the server default (acknowledged).
pub fn classify(
    command: &Document,
    sequences: &[DocumentSequence],
    inherited_write_concern: Option<&Document>,
) -> OperationKind {
    let Some(name) = command.keys().next().map(String::as_str) else {
        return OperationKind::RunCommand;
    };
    match name {
        "commitTransaction" => return OperationKind::CommitTransaction { again: false },
        "abortTransaction" => return OperationKind::AbortTransaction,
        _ => {}
    }
    if command.get("autocommit") == Some(&Bson::Boolean(false)) {
        return OperationKind::InTransaction {
            read: name == "getMore" || is_read_command(name, command),
            first: command.get("startTransaction") == Some(&Bson::Boolean(true)),
        };
    }
    if name == "getMore" {
        return OperationKind::GetMore;
    }
    if is_read_command(name, command) {
        return OperationKind::Read;
    }
    let write_concern = match command.get("writeConcern") {
        Some(Bson::Document(wc)) => Some(wc),
        _ => inherited_write_concern,
    };
    let statements = |field: &'static str| statements(command, sequences, field);
    let multi_document = match name {
        "insert" | "findAndModify" | "findandmodify" => false,
        "update" => statements("updates").any(|s| s.get("multi") == Some(&Bson::Boolean(true))),
        "delete" => statements("deletes").any(|s| s.get("limit").is_some_and(is_zero)),
        "bulkWrite" => statements("ops").any(|s| s.get("multi") == Some(&Bson::Boolean(true))),
        _ if is_write_command(name, command) => return OperationKind::NonRetryableWrite,
        _ => return OperationKind::RunCommand,
    };
    if multi_document || write_concern.is_some_and(is_unacknowledged) {
        OperationKind::NonRetryableWrite
    } else {
        OperationKind::RetryableWrite
    }
}

/// RW-4, SE-13: a write concern is unacknowledged when `w` is 0 and `j` is not true.
pub(crate) fn is_unacknowledged(write_concern: &Document) -> bool {
    write_concern.get("w").is_some_and(is_zero)
        && write_concern.get("j") != Some(&Bson::Boolean(true))
        && write_concern.get("journal") != Some(&Bson::Boolean(true))
}

/// Whether `command` takes the write concern its client, database or collection sets
/// (read-write-concern spec): every write command that accepts a `writeConcern`, `aggregate`
/// with a `$out` or `$merge` stage and `mapReduce` with an output collection included. The
/// transaction commands take their transaction's instead (TX-1), never an inherited one.
pub fn inherits_write_concern(command: &Document) -> bool {
    let Some(name) = command.keys().next().map(String::as_str) else {
        return false;
    };
    match name {
        "aggregate" | "mapReduce" | "mapreduce" => is_write_command(name, command),
        _ => {
            RETRYABLE_WRITES.contains(&name)
                || OTHER_WRITES.iter().any(|&(n, takes)| takes && n == name)
        }
    }
}

/// Whether `command` takes the read concern its client, database or collection sets
/// (read-write-concern spec): `find`, `count`, `distinct`, `geoSearch`, `aggregate` without a
/// write stage and `mapReduce` with inline output.
pub fn inherits_read_concern(command: &Document) -> bool {
    let Some(name) = command.keys().next().map(String::as_str) else {
        return false;
    };
    match name {
        "aggregate" | "mapReduce" | "mapreduce" => !is_write_command(name, command),
        _ => READ_CONCERN_READS.contains(&name),
    }
}

/// RR-3: a retryable read command; `aggregate` only without a `$out` or `$merge` stage.
fn is_read_command(name: &str, command: &Document) -> bool {
    match name {
        "aggregate" => !has_write_stage(command),
        "mapReduce" | "mapreduce" => false,
        _ => READ_COMMANDS.contains(&name),
    }
}

/// RW-4: a write command other than the four retryable ones.
fn is_write_command(name: &str, command: &Document) -> bool {
    match name {
        "aggregate" => has_write_stage(command),
        // mapReduce writes unless its output is inline (RR-4: never retried either way).
        "mapReduce" | "mapreduce" => !matches!(
            command.get("out"),
            Some(Bson::Document(out)) if out.contains_key("inline")
        ),
        _ => OTHER_WRITES.iter().any(|&(n, _)| n == name),
    }
}

/// Whether an aggregate pipeline has a `$out` or `$merge` stage.
fn has_write_stage(command: &Document) -> bool {
    match command.get("pipeline") {
        Some(Bson::Array(stages)) => stages.iter().any(|stage| match stage {
            Bson::Document(stage) => stage.contains_key("$out") || stage.contains_key("$merge"),
            _ => false,
        }),
        _ => false,
    }
}

/// The statements of an `update` / `delete` / `bulkWrite`: the body's array and the kind-1
/// sequence of the same name.
fn statements<'a>(
    command: &'a Document,
    sequences: &'a [DocumentSequence],
    field: &'a str,
) -> impl Iterator<Item = &'a Document> + 'a {
    let body = match command.get(field) {
        Some(Bson::Array(items)) => items.as_slice(),
        _ => &[],
    };
    body.iter()
        .filter_map(|item| match item {
            Bson::Document(d) => Some(d),
            _ => None,
        })
        .chain(
            sequences
                .iter()
                .filter(move |s| s.identifier == field)
                .flat_map(|s| s.documents.iter()),
        )
}

fn is_zero(value: &Bson) -> bool {
    match value {
        Bson::Int32(v) => *v == 0,
        Bson::Int64(v) => *v == 0,
        Bson::Double(v) => *v == 0.0,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;
    use OperationKind::*;

    fn kind(command: Document) -> OperationKind {
        classify(&command, &[], None)
    }

    #[test]
    fn rr3_retryable_reads() {
        for command in [
            doc! { "find": "c", "filter": {} },
            doc! { "aggregate": "c", "pipeline": [{ "$match": {} }], "cursor": {} },
            doc! { "aggregate": 1, "pipeline": [{ "$changeStream": {} }], "cursor": {} },
            doc! { "distinct": "c", "key": "x" },
            doc! { "count": "c" },
            doc! { "listDatabases": 1 },
            doc! { "listCollections": 1 },
            doc! { "listIndexes": "c" },
        ] {
            assert_eq!(kind(command.clone()), Read, "{command}");
        }
    }

    #[test]
    fn rr4_get_more_map_reduce_and_unknown_commands_are_not_retryable_reads() {
        assert_eq!(kind(doc! { "getMore": 5_i64, "collection": "c" }), GetMore);
        assert_eq!(
            kind(doc! { "mapReduce": "c", "out": { "inline": 1 } }),
            RunCommand
        );
        assert_eq!(
            kind(doc! { "mapReduce": "c", "out": "target" }),
            NonRetryableWrite
        );
        for command in [
            doc! { "ping": 1 },
            doc! { "buildInfo": 1 },
            doc! { "killCursors": "c" },
        ] {
            assert_eq!(kind(command.clone()), RunCommand, "{command}");
        }
        assert_eq!(classify(&Document::new(), &[], None), RunCommand);
    }

    #[test]
    fn rw3_single_statement_writes_are_retryable() {
        for command in [
            doc! { "insert": "c", "documents": [{ "x": 1 }, { "x": 2 }] },
            doc! { "update": "c", "updates": [{ "q": {}, "u": { "$set": { "x": 1 } } }] },
            doc! { "update": "c", "updates": [{ "q": {}, "u": {}, "multi": false }] },
            doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 1 }] },
            doc! { "findAndModify": "c", "query": {}, "remove": true },
            doc! { "bulkWrite": 1, "ops": [{ "insert": 0, "document": {} },
            { "update": 0, "filter": {}, "updateMods": {}, "multi": false }] },
        ] {
            assert_eq!(kind(command.clone()), RetryableWrite, "{command}");
        }
    }

    #[test]
    fn rw4_multi_statements_write_stages_and_other_writes_are_not_retryable() {
        for command in [
            doc! { "update": "c", "updates": [{ "q": {}, "u": {} }, { "q": {}, "u": {}, "multi": true }] },
            doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 0 }] },
            doc! { "delete": "c", "deletes": [{ "q": {}, "limit": 0_i64 }] },
            doc! { "bulkWrite": 1, "ops": [{ "delete": 0, "filter": {}, "multi": true }] },
            doc! { "aggregate": "c", "pipeline": [{ "$match": {} }, { "$out": "t" }] },
            doc! { "aggregate": "c", "pipeline": [{ "$merge": { "into": "t" } }] },
            doc! { "createIndexes": "c", "indexes": [] },
            doc! { "drop": "c" },
        ] {
            assert_eq!(kind(command.clone()), NonRetryableWrite, "{command}");
        }
    }

    #[test]
    fn rw3_batches_are_judged_by_their_document_sequences_too() {
        let body = doc! { "update": "c" };
        let single = DocumentSequence {
            identifier: "updates".into(),
            documents: vec![doc! { "q": {}, "u": {} }],
        };
        assert_eq!(classify(&body, &[single], None), RetryableWrite);
        let multi = DocumentSequence {
            identifier: "updates".into(),
            documents: vec![doc! { "q": {}, "u": {} }, doc! { "q": {}, "multi": true }],
        };
        assert_eq!(classify(&body, &[multi], None), NonRetryableWrite);
    }

    #[test]
    fn rw4_unacknowledged_writes_are_not_retryable_from_either_write_concern() {
        let insert = doc! { "insert": "c", "documents": [{}] };
        let w0 = doc! { "w": 0 };
        assert_eq!(classify(&insert, &[], Some(&w0)), NonRetryableWrite);
        let own = doc! { "insert": "c", "documents": [{}], "writeConcern": { "w": 0 } };
        assert_eq!(classify(&own, &[], None), NonRetryableWrite);
        // The command's own write concern wins over the inherited one.
        let own_acknowledged = doc! { "insert": "c", "writeConcern": { "w": 1 } };
        assert_eq!(classify(&own_acknowledged, &[], Some(&w0)), RetryableWrite);
        // w:0 with j:true is acknowledged.
        assert!(!is_unacknowledged(&doc! { "w": 0, "j": true }));
        assert!(is_unacknowledged(&doc! { "w": 0.0 }));
        assert!(!is_unacknowledged(&doc! { "w": "majority" }));
    }

    /// Review5 item 14 (read-write-concern spec): one table says which writes inherit a write
    /// concern, for the retry rules and the driver alike; the search-index commands and
    /// `compact` refuse one, the role commands take one, and reads inherit the read concern.
    #[test]
    fn writes_that_take_a_write_concern_inherit_it_and_reads_the_read_concern() {
        for write in [
            doc! { "insert": "c", "documents": [] },
            doc! { "bulkWrite": 1, "ops": [] },
            doc! { "createRole": "r", "privileges": [], "roles": [] },
            doc! { "dropRole": "r" },
            doc! { "grantRolesToUser": "u", "roles": [] },
            doc! { "createIndexes": "c", "indexes": [] },
            doc! { "aggregate": "c", "pipeline": [{ "$out": "d" }], "cursor": {} },
            doc! { "mapReduce": "c", "out": "d" },
        ] {
            assert!(inherits_write_concern(&write), "{write}");
            assert!(!inherits_read_concern(&write), "{write}");
            assert_ne!(kind(write.clone()), Read, "{write}");
        }
        for none in [
            doc! { "createSearchIndexes": "c", "indexes": [] },
            doc! { "compact": "c" },
            doc! { "commitTransaction": 1 },
            doc! { "ping": 1 },
            doc! { "listCollections": 1 },
        ] {
            assert!(!inherits_write_concern(&none), "{none}");
            assert!(!inherits_read_concern(&none), "{none}");
        }
        for read in [
            doc! { "find": "c" },
            doc! { "count": "c" },
            doc! { "aggregate": "c", "pipeline": [{ "$match": {} }], "cursor": {} },
            doc! { "mapReduce": "c", "out": { "inline": 1 } },
        ] {
            assert!(inherits_read_concern(&read), "{read}");
            assert!(!inherits_write_concern(&read), "{read}");
        }
        assert_eq!(
            kind(doc! { "createSearchIndexes": "c", "indexes": [] }),
            NonRetryableWrite
        );
    }

    #[test]
    fn tx1_tx10_transaction_commands() {
        assert_eq!(
            kind(doc! { "commitTransaction": 1, "autocommit": false }),
            CommitTransaction { again: false }
        );
        assert_eq!(
            kind(doc! { "abortTransaction": 1, "autocommit": false }),
            AbortTransaction
        );
        assert_eq!(
            kind(doc! { "insert": "c", "autocommit": false, "startTransaction": true }),
            InTransaction {
                read: false,
                first: true
            }
        );
        assert_eq!(
            kind(doc! { "find": "c", "autocommit": false }),
            InTransaction {
                read: true,
                first: false
            }
        );
    }
}
