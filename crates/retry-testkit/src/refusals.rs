//! What a real server refuses before it runs a command, about sessions and secondary reads
//! (house rule 7: the test server is at least as strict as a real one).
//!
//! - A `txnNumber` without an `lsid`: `InvalidOptions` (72), "Transaction number requires a session
//!   ID to also be specified".
//! - A `txnNumber` on a standalone: `IllegalOperation` (20), "Transaction numbers are only allowed
//!   on a replica set member or mongos" (RW-2, RW-16).
//! - An `lsid` that is not `{id: <binary>}`: `TypeMismatch` (14).
//! - A `txnNumber` that is not an Int64: `TypeMismatch` (14), "BSON field
//!   'OperationSessionInfo.txnNumber' is the wrong type ..., expected type 'long'".
//! - A `txnNumber` without `autocommit: false` on a command that is not a retryable write
//!   (`commitTransaction` and `abortTransaction` included): `NotARetryableWriteCommand` (50768),
//!   "txnNumber may only be provided for multi-document transactions and retryable write
//!   commands. autocommit:false was not provided, and ... is not a retryable write command." (TX-1)
//! - A `maxTimeMS` that is not a number, is negative or above `i32::MAX`, or is a fractional
//!   double: `BadValue` (2), "maxTimeMS must be a number" / "is out of range" / "has
//!   non-integral value" (the server's `parseMaxTimeMS`).
//! - A read on a secondary without a non-primary `$readPreference` (SS-9: OP_MSG's secondaryOk):
//!   `NotPrimaryNoSecondaryOk` (13435).
//! - The session fields of a transaction (TX-1, the server's session-info parsing): `autocommit`
//!   other than `false`, or without a `txnNumber`; `startTransaction` other than `true`, or
//!   without `autocommit`: `InvalidOptions` (72) with the server's messages ("Specifying
//!   autocommit=true is not allowed.", "'autocommit' field requires a transaction number to also
//!   be specified", "'startTransaction' field requires 'autocommit' field to also be specified",
//!   "Specifying startTransaction=false is not allowed."); `startTransaction` on a commit, an
//!   abort or a `killCursors`, and any command a transaction may not run (`count`, `ping`, ...):
//!   `OperationNotSupportedInTransaction` (263).
//! - Transactions on a server that has none ([`transactions_unsupported`]): on 3.6 (wire 6)
//!   `autocommit` / `startTransaction` as unknown fields (40415 on the write commands, 9 on the
//!   others) and `commitTransaction` / `abortTransaction` as unknown commands (59,
//!   [`known_command`]); on a 4.0 mongos (wire 7) either field with 50841.
//! - Inside a transaction (`autocommit: false`): a `writeConcern` on a command other than commit
//!   and abort ("writeConcern is not allowed within a multi-statement transaction", 72), and a
//!   `readConcern` on a command that does not start it ("Only the first command in a transaction
//!   may specify a readConcern", 72).
//! - Outside a transaction, a `writeConcern` on a command that takes none (`find`, `count`,
//!   `getMore`, `ping`, ...): InvalidOptions (72), "Command does not support writeConcern"
//!   ([`write_concern_refusal`], checked after the fail point); a `readConcern` level the
//!   command's `supportsReadConcern` refuses ("Command &lt;name&gt; does not support { readConcern:
//!   ... } :: caused by :: ...", 72, [`read_concern_level_refusal`]).
//! - A transaction's first statement with a `readConcern` level other than "local", "majority"
//!   or "snapshot", or with `afterOpTime` (72).
//! - The generic fields (review7 finding 3, [`generic_field_refusal`]): `apiVersion`,
//!   `apiStrict`, `apiDeprecationErrors`, `$readPreference`, a hello's `client` and
//!   `compression` of the wrong type or value.
//! - A `readConcern` that does not parse: not a document, or a field of the wrong type
//!   (`TypeMismatch`, 14: `level` a string, `afterClusterTime` a Timestamp), an unknown field or
//!   level (`FailedToParse`, 9). An `afterClusterTime` ahead of the deployment's clock is refused
//!   where the clock is known (`crate::server`, [`after_cluster_time_refusal`]).

use bson::spec::BinarySubtype;
use bson::{Bson, Document};

use crate::config::Role;
use crate::fail_point::error_reply;

/// Reads a secondary serves only with a non-primary `$readPreference`.
/// Review37 W11: `listDatabases` too, opt-in on a secondary (mongodb/mongo
/// src/mongo/db/commands/list_databases.cpp: `slaveOk()` false, `slaveOverrideOk()` true; today
/// `secondaryAllowed` is `kOptIn`).
const SECONDARY_READS: [&str; 7] = [
    "find",
    "aggregate",
    "count",
    "distinct",
    "listCollections",
    "listDatabases",
    "listIndexes",
];

/// The read preference modes a server knows (server selection spec, `$readPreference.mode`).
pub(crate) const READ_PREFERENCE_MODES: [&str; 5] = [
    "primary",
    "primaryPreferred",
    "secondary",
    "secondaryPreferred",
    "nearest",
];

/// The commands of the test server that are in Stable API version 1: with `apiStrict: true` any
/// other is APIStrictError (323). Checked against the server's source (commands whose
/// `apiVersions()` is `kApiVersions1`: insert, find, aggregate, count, listCollections,
/// createIndexes, dropIndexes, saslStart; distinct and buildInfo are not; the `bulkWrite`
/// command's IDL declares `api_version: "1"`, and so does `authenticate`'s, whose command class
/// is generated as `AuthenticateCmdVersion1Gen`) and the Stable API changelog (the rest).
/// `authenticate` (run by `crate::auth`, MONGODB-X509 unsupported) and `collMod`
/// (`crate::commands::KNOWN_NOT_RUN`) are known but not run by the test server:
/// TestkitUnsupported (TK-2). Not in it: `isMaster` / `ismaster` (`hello`
/// replaced them), `buildInfo`, `distinct`, `killSessions`, `killAllSessions`,
/// `configureFailPoint`, `deleteIndexes`.
pub(crate) const API_VERSION_1: &[&str] = &[
    "abortTransaction",
    "aggregate",
    "authenticate",
    "bulkWrite",
    "collMod",
    "commitTransaction",
    "count",
    "create",
    "createIndexes",
    "delete",
    "drop",
    "dropDatabase",
    "dropIndexes",
    "endSessions",
    "find",
    "findAndModify",
    "getMore",
    "hello",
    "insert",
    "killCursors",
    "listCollections",
    "listDatabases",
    "listIndexes",
    "ping",
    "saslContinue",
    "saslStart",
    "update",
];

/// The test server's commands outside Stable API version 1 (every other command it runs is in
/// [`API_VERSION_1`]): with `apiStrict: true` they are APIStrictError (323). Some are known but
/// not run (`crate::commands::KNOWN_NOT_RUN`: TestkitUnsupported, TK-2). A command in neither
/// list is unknown ([`known_command`]).
pub(crate) const KNOWN_OUTSIDE_API_VERSION_1: &[&str] = &[
    "buildInfo",
    "buildinfo",
    "configureFailPoint",
    "deleteIndexes",
    "distinct",
    "isMaster",
    "ismaster",
    "killAllSessions",
    "killSessions",
    "mapReduce",
    "renameCollection",
    "replSetFreeze",
    "replSetStepDown",
    "setParameter",
];

/// The test server's commands a real server runs with a `writeConcern`: those whose
/// `supportsWriteConcern()` is true (the writes, `create`, `drop`, `dropDatabase`, the index
/// commands, commit and abort), and `aggregate` whatever its pipeline (the server's jstests
/// aggregation_accepts_write_concern.js), `collMod`, `renameCollection` and `mapReduce` (with an output
/// collection; inline it refuses one, but the test server answers either TestkitUnsupported, which
/// is never more forgiving). Every other command it knows refuses one ([`write_concern_refusal`];
/// the replica-set commands' base class `ReplSetCommand` takes none).
const WRITE_CONCERN_COMMANDS: &[&str] = &[
    "abortTransaction",
    "aggregate",
    "bulkWrite",
    "collMod",
    "commitTransaction",
    "create",
    "createIndexes",
    "delete",
    "deleteIndexes",
    "drop",
    "dropDatabase",
    "dropIndexes",
    "findAndModify",
    "insert",
    "mapReduce",
    "renameCollection",
    "update",
];

/// TK-2, review13 finding 1 (house rule 7): a `writeConcern` (any value, `{}` included) on a
/// known command whose `supportsWriteConcern()` is false (`find`, `count`, `distinct`, `getMore`,
/// `killCursors`, `ping`, `hello`, the `list*` commands, `setParameter`, ...) is InvalidOptions
/// (72), "Command does not support writeConcern", on a mongod (`service_entry_point_common`:
/// `uassertCommandDoesNotSpecifyWriteConcern`, for `getMore` too) and a mongos alike. The server
/// checks it once the command is parsed and the failCommand fail point passed, before it checks
/// the session out and runs the command. Inside a transaction the earlier refusal of any
/// statement's `writeConcern` (72, [`refusal`]) answers first. Only asked about a known command:
/// an unknown one was CommandNotFound (59, [`known_command`]) before.
///
/// Review37 W8: then, on a command that takes one, the server parses it
/// ([`write_concern_parse_refusal`]) and checks it against the deployment (a standalone refuses
/// `w` above 1).
pub(crate) fn write_concern_refusal(
    role: &Role,
    name: &str,
    command: &Document,
) -> Option<Document> {
    let write_concern = command.get("writeConcern")?;
    if !WRITE_CONCERN_COMMANDS.contains(&name) {
        return Some(error_reply(72, "Command does not support writeConcern"));
    }
    write_concern_parse_refusal(role, write_concern)
}

/// Review37 W8 (house rule 7): what a server's `extractWriteConcern` refuses in a command's
/// `writeConcern` (mongodb/mongo src/mongo/db/write_concern_options.cpp and its unit test
/// write_concern_options_test.cpp, src/mongo/db/write_concern.cpp `validateWriteConcern`; the
/// 4.x messages):
/// - not a document: TypeMismatch (14); `{}` is the default write concern;
/// - a field other than `w`, `j`, `fsync`, `wtimeout` (and the ignored `wElectionId`,
///   `wOpTime`, `getLastError`): FailedToParse (9), "unrecognized write concern field: x";
/// - `w` neither a number nor a string: FailedToParse (9), "w has to be a number or a string";
/// - `j` or `fsync` neither a number nor a boolean: FailedToParse (9), "j must be numeric or a
///   boolean value"; both true: FailedToParse (9), "fsync and j options cannot be used together";
/// - on a standalone, a numeric `w` above 1: BadValue (2), "cannot use 'w' > 1 when a host is not
///   replicated".
///
/// Not modelled: an unknown tag-set name in `w` on a replica set (UnknownReplWriteConcern, 79).
pub(crate) fn write_concern_parse_refusal(role: &Role, value: &Bson) -> Option<Document> {
    let Bson::Document(write_concern) = value else {
        return Some(wrong_type("writeConcern", value, "object"));
    };
    let numeric_or_bool = |value: &Bson| {
        matches!(
            value,
            Bson::Boolean(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)
        )
    };
    let truthy = |value: Option<&Bson>| match value {
        Some(Bson::Boolean(b)) => *b,
        Some(Bson::Int32(n)) => *n != 0,
        Some(Bson::Int64(n)) => *n != 0,
        Some(Bson::Double(n)) => *n != 0.0,
        _ => false,
    };
    for (field, value) in write_concern {
        match field.as_str() {
            "w" => {
                let valid = matches!(
                    value,
                    Bson::String(_) | Bson::Int32(_) | Bson::Int64(_) | Bson::Double(_)
                );
                if !valid {
                    return Some(error_reply(9, "w has to be a number or a string"));
                }
            }
            "j" | "fsync" => {
                if !numeric_or_bool(value) {
                    return Some(error_reply(
                        9,
                        &format!("{field} must be numeric or a boolean value"),
                    ));
                }
            }
            "wtimeout" | "wElectionId" | "wOpTime" => {}
            other if other.eq_ignore_ascii_case("getLastError") => {}
            other => {
                return Some(error_reply(
                    9,
                    &format!("unrecognized write concern field: {other}"),
                ))
            }
        }
    }
    if truthy(write_concern.get("j")) && truthy(write_concern.get("fsync")) {
        return Some(error_reply(
            9,
            "fsync and j options cannot be used together",
        ));
    }
    let w = write_concern.get("w").and_then(|w| match w {
        Bson::Int32(n) => Some(f64::from(*n)),
        Bson::Int64(n) => Some(*n as f64),
        Bson::Double(n) => Some(*n),
        _ => None,
    });
    let unreplicated = *role == Role::Standalone && w.is_some_and(|w| w > 1.0);
    unreplicated.then(|| error_reply(2, "cannot use 'w' > 1 when a host is not replicated"))
}

/// TK-15, versioned-api "Cursors" and "Transactions": the Stable API parameters a command sent,
/// compared as a real server compares them (`APIParameters`' `operator==`, field by field with
/// absent a value of its own: `apiStrict: false` is not the same as no `apiStrict`). Read from
/// an admitted command ([`generic_field_refusal`]: `apiVersion` is `"1"`, the flags booleans).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct ApiParameters {
    version: bool,
    strict: Option<bool>,
    deprecation_errors: Option<bool>,
}

impl ApiParameters {
    /// No API parameter.
    pub(crate) const NONE: ApiParameters = ApiParameters {
        version: false,
        strict: None,
        deprecation_errors: None,
    };

    /// The API parameters of `command`.
    pub(crate) fn of(command: &Document) -> ApiParameters {
        ApiParameters {
            version: command.contains_key("apiVersion"),
            strict: command.get_bool("apiStrict").ok(),
            deprecation_errors: command.get_bool("apiDeprecationErrors").ok(),
        }
    }

    /// APIMismatchError (347) when a command continuing a cursor or transaction (`continuing`,
    /// e.g. "getMore") sent these parameters and the command that opened it (`opener`, e.g.
    /// "the cursor-creating command") sent `opened`; the server's message.
    pub(crate) fn mismatch(
        self,
        opened: ApiParameters,
        continuing: &str,
        opener: &str,
    ) -> Option<(i32, String)> {
        (self != opened).then(|| {
            (
                347,
                format!(
                    "API parameter mismatch: {continuing} used params {self}, {opener} used \
                     {opened}"
                ),
            )
        })
    }
}

/// The parameters as the server prints them (`BSONObj::toString`).
impl std::fmt::Display for ApiParameters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut fields = Vec::new();
        if self.version {
            fields.push(String::from("apiVersion: \"1\""));
        }
        if let Some(strict) = self.strict {
            fields.push(format!("apiStrict: {strict}"));
        }
        if let Some(errors) = self.deprecation_errors {
            fields.push(format!("apiDeprecationErrors: {errors}"));
        }
        if fields.is_empty() {
            f.write_str("{}")
        } else {
            write!(f, "{{ {} }}", fields.join(", "))
        }
    }
}

/// Review7 finding 3 (house rule 7): what a real server refuses about the generic fields every
/// command may carry, before it runs the command:
/// - `apiVersion` not a string, `apiStrict` / `apiDeprecationErrors` not booleans: TypeMismatch
///   (14); `apiStrict` / `apiDeprecationErrors` without `apiVersion`: 4886600; an `apiVersion`
///   other than `"1"`: APIVersionError (322) (the server's jstests/core/api
///   api_version_parameters.js); with `apiStrict: true`, a command outside [`API_VERSION_1`]:
///   APIStrictError (323). Only read for a command the test server knows: an unknown one was
///   already CommandNotFound (59, [`known_command`]);
/// - `$readPreference` not a document: TypeMismatch (14, `ReadPreferenceSetting::fromInnerBSON`);
///   without a `mode`: NoSuchKey (4); a `mode` not a string: TypeMismatch (14); an unknown mode:
///   BadValue (2, the IDL enum parse; older servers answered FailedToParse, 9: unverified which
///   code 8.x gives);
/// - a hello's `client` not a document, `compression` not an array of strings: TypeMismatch (14,
///   the hello command's IDL types).
pub(crate) fn generic_field_refusal(name: &str, command: &Document) -> Option<Document> {
    let api = ["apiVersion", "apiStrict", "apiDeprecationErrors"];
    if api.iter().any(|field| command.contains_key(field)) {
        if let Some(refusal) = api_refusal(name, command) {
            return Some(refusal);
        }
    }
    let wrong_type =
        |field: &str, value: &Bson, expected: &str| Some(wrong_type(field, value, expected));
    if let Some(preference) = command.get("$readPreference") {
        let Bson::Document(preference) = preference else {
            return Some(error_reply(
                14,
                &format!(
                    "$readPreference has incorrect type: expected object but got {}",
                    type_name(preference)
                ),
            ));
        };
        match preference.get("mode") {
            None => return Some(error_reply(4, "Missing expected field \"mode\"")),
            Some(Bson::String(mode)) if READ_PREFERENCE_MODES.contains(&mode.as_str()) => {}
            Some(Bson::String(mode)) => {
                return Some(error_reply(
                    2,
                    &format!(
                        "Could not parse $readPreference mode '{mode}'. Only the modes \
                         'primary', 'primaryPreferred', 'secondary', 'secondaryPreferred', and \
                         'nearest' are supported."
                    ),
                ))
            }
            Some(mode) => return wrong_type("mode", mode, "string"),
        }
        if let Some(refusal) = read_preference_refusal(preference) {
            return Some(refusal);
        }
    }
    if matches!(name, "hello" | "isMaster" | "ismaster") {
        match command.get("client") {
            None | Some(Bson::Document(_)) => {}
            Some(value) => return wrong_type(&format!("{name}.client"), value, "object"),
        }
        match command.get("compression") {
            None => {}
            Some(Bson::Array(names)) => {
                let other = names.iter().enumerate().find(|(_, n)| n.as_str().is_none());
                if let Some((index, value)) = other {
                    return wrong_type(&format!("{name}.compression.{index}"), value, "string");
                }
            }
            Some(value) => return wrong_type(&format!("{name}.compression"), value, "array"),
        }
    }
    None
}

/// Review37 W9 (SS-2, SS-8, SS-9): what a server's `ReadPreferenceSetting::fromInnerBSON`
/// refuses in a `$readPreference` with a known `mode`, in its order (mongodb/mongo
/// src/mongo/client/read_preference.cpp):
/// - `tags` not an array: TypeMismatch (14); a tag set other than `[]` or `[{}]` with the
///   "primary" mode: BadValue (2), "Only empty tags are allowed with primary read preference";
/// - `maxStalenessSeconds` not a number: TypeMismatch (14); below 0: BadValue (2), "must be a
///   non-negative integer"; between 0 and 90: MaxStalenessOutOfRange (160), "can not be less than
///   90"; any but 0 with "primary": BadValue (2), "can not be set for the primary mode".
///
/// A tag set that is not a document is not checked (the source read does not refuse one here).
fn read_preference_refusal(preference: &Document) -> Option<Document> {
    let primary = preference.get_str("mode").ok() == Some("primary");
    match preference.get("tags") {
        None => {}
        Some(Bson::Array(tags)) => {
            let empty = match tags.as_slice() {
                [] => true,
                [Bson::Document(only)] => only.is_empty(),
                _ => false,
            };
            if primary && !empty {
                return Some(error_reply(
                    2,
                    "Only empty tags are allowed with primary read preference",
                ));
            }
        }
        Some(other) => {
            return Some(error_reply(
                14,
                &format!(
                    "\"tags\" had the wrong type. Expected array, found {}",
                    type_name(other)
                ),
            ))
        }
    }
    let staleness = match preference.get("maxStalenessSeconds") {
        None => 0.0,
        Some(Bson::Int32(n)) => f64::from(*n),
        Some(Bson::Int64(n)) => *n as f64,
        Some(Bson::Double(n)) => n.trunc(),
        Some(other) => {
            return Some(error_reply(
                14,
                &format!(
                    "Expected field \"maxStalenessSeconds\" to have numeric type, but found {}",
                    type_name(other)
                ),
            ))
        }
    };
    let field = "maxStalenessSeconds";
    if staleness < 0.0 {
        return Some(error_reply(
            2,
            &format!("{field} must be a non-negative integer"),
        ));
    }
    if staleness > 0.0 && staleness < 90.0 {
        return Some(error_reply(
            160,
            &format!("{field} value can not be less than 90"),
        ));
    }
    (primary && staleness != 0.0)
        .then(|| error_reply(2, &format!("{field} can not be set for the primary mode")))
}

/// TK-2: whether the test server, as a server of `max_wire_version`, knows command `name`
/// ([`API_VERSION_1`], [`KNOWN_OUTSIDE_API_VERSION_1`]; `bulkWrite` from 8.0, wire version 25,
/// TK-1). A real server looks the command up before anything reads its body (mongod's
/// `ServiceEntryPointCommon` calls `findCommand` before `execCommandDatabase`, a mongos's
/// `ParseAndRunCommand::_parseCommand` before anything else): an unknown one is CommandNotFound
/// (59) whatever it carries, before authentication, the session, transaction, concern and API
/// checks and the failCommand fail point.
pub(crate) fn known_command(name: &str, max_wire_version: i32) -> bool {
    let known = API_VERSION_1.contains(&name) || KNOWN_OUTSIDE_API_VERSION_1.contains(&name);
    let transaction_end = matches!(name, "commitTransaction" | "abortTransaction");
    known
        && (name != "bulkWrite" || max_wire_version >= 25)
        && (!transaction_end || max_wire_version >= TRANSACTIONS_WIRE_VERSION)
}

/// The wire version of MongoDB 4.0, the first with multi-document transactions (on a replica
/// set) and the `commitTransaction` / `abortTransaction` commands.
const TRANSACTIONS_WIRE_VERSION: i32 = 7;

/// The wire version of MongoDB 4.2, the first whose mongos runs transactions.
const ROUTER_TRANSACTIONS_WIRE_VERSION: i32 = 8;

/// Fixes18c (TX-1, TK-15, house rule 7): a transaction's session fields on a server that has no
/// transactions. 3.6 (wire 6) does not know `autocommit` and `startTransaction` (they are not
/// among its generic arguments, `commands.h` `isGenericArgument`), so the command's own parser
/// refuses the first of them as an unknown field: the IDL-generated write parsers (`insert`,
/// `update`, `delete`) with 40415, `"BSON field '<command>.<field>' is an unknown field."`, and
/// the others with FailedToParse (9), as `find`, `getMore` and `aggregate` do (a command whose
/// 3.6 parser ignores unknown fields is refused too: stricter, and a driver never sends these to
/// a 3.6 server). A 4.0 mongos (wire 7) refuses any command carrying either with 50841 (the
/// code its 4.0 jstest asserts for `startTransaction` and `autocommit`, together or alone); the
/// message is the test server's own, not the server's wording, which was not found. Whether a
/// 4.0 mongos knows `commitTransaction` / `abortTransaction` at all (59 before any field is
/// read) was not verified: the test server answers 50841, as a driver sends them with
/// `autocommit`.
fn transactions_unsupported(
    role: &Role,
    name: &str,
    command: &Document,
    max_wire_version: i32,
) -> Option<Document> {
    let field = command
        .keys()
        .find(|k| matches!(k.as_str(), "autocommit" | "startTransaction"))?;
    if max_wire_version < TRANSACTIONS_WIRE_VERSION {
        return Some(if matches!(name, "insert" | "update" | "delete") {
            error_reply(
                40415,
                &format!("BSON field '{name}.{field}' is an unknown field."),
            )
        } else {
            error_reply(9, &format!("{name}: unrecognized field '{field}'"))
        });
    }
    let router = role.is_router();
    (router && max_wire_version < ROUTER_TRANSACTIONS_WIRE_VERSION).then(|| {
        error_reply(
            50841,
            "Multi-document transactions need a mongos of 4.2 or later",
        )
    })
}

/// TK-2: CommandNotFound (59) for command `name`, with a mongod's or a router's message
/// (`no such command: '<name>'`, `no such cmd: <name>`).
pub(crate) fn command_not_found(role: &Role, name: &str) -> Document {
    let message = if role.is_router() {
        format!("no such cmd: {name}")
    } else {
        format!("no such command: '{name}'")
    };
    error_reply(59, &message)
}

/// The API parameter checks of [`generic_field_refusal`], for a command the test server knows.
fn api_refusal(name: &str, command: &Document) -> Option<Document> {
    let version = command.get("apiVersion");
    if let Some(value) = version.filter(|v| !matches!(v, Bson::String(_))) {
        return Some(wrong_type("apiVersion", value, "string"));
    }
    for field in ["apiStrict", "apiDeprecationErrors"] {
        match command.get(field) {
            Some(Bson::Boolean(_)) if version.is_none() => {
                return Some(error_reply(
                    4886600,
                    &format!("Provided {field} without passing apiVersion"),
                ))
            }
            Some(Bson::Boolean(_)) | None => {}
            Some(value) => return Some(wrong_type(field, value, "boolean")),
        }
    }
    if version.is_some_and(|v| v.as_str() != Some("1")) {
        return Some(error_reply(322, "API version must be \"1\""));
    }
    if command.get("apiStrict") == Some(&Bson::Boolean(true)) && !API_VERSION_1.contains(&name) {
        return Some(error_reply(
            323,
            &format!("Provided apiStrict:true, but the command {name} is not in API Version 1"),
        ));
    }
    None
}

/// HS-4 (review7 finding 3): what a real server's hello refuses about its `client` metadata
/// (`ClientMetadata::parse`): larger than 1,024 bytes on a mongod, 512 on a router (review8 finding
/// 1; ClientMetadataDocumentTooLarge, 185); `application`, `driver` or `os` not a document, `application.name`, `driver.name`,
/// `driver.version` or `os.type` not a string (TypeMismatch, 14); `application.name` over 128
/// bytes (ClientMetadataAppNameTooLarge, 184); no `driver` with `name` and `version`, or no `os`
/// with `type` (ClientMetadataMissingField, 183).
pub(crate) fn client_metadata_refusal(client: &Document, router: bool) -> Option<Document> {
    let limit = if router { 512 } else { 1024 };
    if client.to_vec().map_or(0, |b| b.len()) > limit {
        return Some(error_reply(
            185,
            &format!("The client metadata document must be less then or equal to {limit} bytes"),
        ));
    }
    let not_string = |field: &str| {
        Some(error_reply(
            14,
            &format!("The '{field}' field must be a string in the client metadata document"),
        ))
    };
    let missing = |field: &str| {
        Some(error_reply(
            183,
            &format!("Missing required field '{field}' in the client metadata document"),
        ))
    };
    let (mut driver, mut os) = (false, false);
    for (name, value) in client {
        if !matches!(name.as_str(), "application" | "driver" | "os") {
            continue;
        }
        let Bson::Document(part) = value else {
            return Some(error_reply(
                14,
                &format!(
                    "The '{name}' field is required to be a BSON document in the client \
                     metadata document"
                ),
            ));
        };
        let required: &[&str] = match name.as_str() {
            "application" => &["name"],
            "driver" => &["name", "version"],
            _ => &["type"],
        };
        for field in required {
            match part.get(*field) {
                Some(Bson::String(app)) if name == "application" && app.len() > 128 => {
                    return Some(error_reply(
                        184,
                        "The 'application.name' field must be less then or equal to 128 bytes \
                         in the client metadata document",
                    ))
                }
                Some(Bson::String(_)) => {}
                Some(_) => return not_string(&format!("{name}.{field}")),
                None if name == "application" => {}
                None => return missing(&format!("{name}.{field}")),
            }
        }
        driver |= name == "driver";
        os |= name == "os";
    }
    for (found, part) in [(driver, "driver"), (os, "os")] {
        if !found {
            return Some(error_reply(
                183,
                &format!("Missing required sub-document '{part}' in the client metadata document"),
            ));
        }
    }
    None
}

/// The error reply a real server of `max_wire_version` gives `command` (named `name`) in `role`
/// before running it, if any.
pub(crate) fn refusal(
    role: &Role,
    name: &str,
    command: &Document,
    max_wire_version: i32,
) -> Option<Document> {
    if let Some(refusal) = generic_field_refusal(name, command) {
        return Some(refusal);
    }
    if let Some(refusal) = command.get("lsid").and_then(lsid_refusal) {
        return Some(refusal);
    }
    if let Some(refusal) = command.get("maxTimeMS").and_then(max_time_refusal) {
        return Some(refusal);
    }
    if let Some(number) = command.get("txnNumber") {
        if !matches!(number, Bson::Int64(_)) {
            return Some(wrong_type("OperationSessionInfo.txnNumber", number, "long"));
        }
        if !command.contains_key("lsid") {
            return Some(error_reply(
                72,
                "Transaction number requires a session ID to also be specified",
            ));
        }
        if *role == Role::Standalone {
            return Some(error_reply(
                20,
                "Transaction numbers are only allowed on a replica set member or mongos",
            ));
        }
        // Checked before the 50768 below: a 4.0 mongos refuses `startTransaction` without
        // `autocommit` with 50841 too.
        if let Some(refusal) = transactions_unsupported(role, name, command, max_wire_version) {
            return Some(refusal);
        }
        let retryable_write = matches!(
            name,
            "insert" | "update" | "delete" | "findAndModify" | "findandmodify" | "bulkWrite"
        );
        if !command.contains_key("autocommit") && !retryable_write {
            return Some(error_reply(
                50768,
                &format!(
                    "txnNumber may only be provided for multi-document transactions and \
                     retryable write commands. autocommit:false was not provided, and {name} is \
                     not a retryable write command."
                ),
            ));
        }
    }
    if let Some(refusal) = transactions_unsupported(role, name, command, max_wire_version) {
        return Some(refusal);
    }
    if let Some(refusal) = transaction_refusal(name, command) {
        return Some(refusal);
    }
    if let Some(refusal) = command.get("readConcern").and_then(read_concern_refusal) {
        return Some(refusal);
    }
    if let Some(refusal) = read_concern_level_refusal(role, name, command, max_wire_version) {
        return Some(refusal);
    }
    if let Role::ReplicaSetMember(member) = role {
        let secondary_ok = matches!(
            command.get("$readPreference"),
            Some(Bson::Document(p)) if matches!(p.get("mode"), Some(Bson::String(m)) if m != "primary")
        );
        if !member.primary && !secondary_ok && SECONDARY_READS.contains(&name) {
            return Some(error_reply(13435, "not primary and secondaryOk=false"));
        }
    }
    None
}

/// TX-1 (review5 item 11): what the server's session-info parsing and transaction checks refuse
/// about `autocommit`, `startTransaction` and the concerns of a transaction's commands.
fn transaction_refusal(name: &str, command: &Document) -> Option<Document> {
    let autocommit = command.get("autocommit");
    let start = command.get("startTransaction");
    match autocommit {
        None => {
            if start.is_some() {
                return Some(error_reply(
                    72,
                    "'startTransaction' field requires 'autocommit' field to also be specified",
                ));
            }
            return None;
        }
        Some(Bson::Boolean(false)) => {}
        Some(Bson::Boolean(true)) => {
            return Some(error_reply(
                72,
                "Specifying autocommit=true is not allowed.",
            ))
        }
        Some(other) => return Some(wrong_type("OperationSessionInfo.autocommit", other, "bool")),
    }
    if !command.contains_key("txnNumber") {
        return Some(error_reply(
            72,
            "'autocommit' field requires a transaction number to also be specified",
        ));
    }
    let starts = match start {
        None => false,
        Some(Bson::Boolean(true)) => true,
        Some(Bson::Boolean(false)) => {
            return Some(error_reply(
                72,
                "Specifying startTransaction=false is not allowed.",
            ))
        }
        Some(other) => {
            return Some(wrong_type(
                "OperationSessionInfo.startTransaction",
                other,
                "bool",
            ))
        }
    };
    let ends = matches!(name, "commitTransaction" | "abortTransaction");
    if !TRANSACTION_COMMANDS.contains(&name) {
        return Some(error_reply(
            263,
            &format!("Cannot run '{name}' in a multi-document transaction."),
        ));
    }
    if starts {
        if let Some(refusal) = command
            .get_document("readConcern")
            .ok()
            .and_then(transaction_read_concern_refusal)
        {
            return Some(refusal);
        }
        let refused = match name {
            "killCursors" => Some(
                "Cannot run killCursors as the first operation in a multi-document transaction.",
            ),
            "commitTransaction" => Some("Cannot start a transaction with a commit"),
            "abortTransaction" => Some("Cannot start a transaction with an abort"),
            _ => None,
        };
        if let Some(message) = refused {
            return Some(error_reply(263, message));
        }
    }
    if !ends && command.contains_key("writeConcern") {
        return Some(error_reply(
            72,
            "writeConcern is not allowed within a multi-statement transaction",
        ));
    }
    if !starts && command.contains_key("readConcern") {
        return Some(error_reply(
            72,
            "Only the first command in a transaction may specify a readConcern",
        ));
    }
    None
}

/// Leftovers12 item 2 (house rule 7): the `readConcern` of a transaction's first statement, as
/// a mongod and a mongos check it when the transaction starts: only "local", "majority" and
/// "snapshot" (InvalidOptions 72), and no `afterOpTime` (72).
fn transaction_read_concern_refusal(read_concern: &Document) -> Option<Document> {
    let level = read_concern.get_str("level").unwrap_or("local");
    if !matches!(level, "local" | "majority" | "snapshot") {
        return Some(error_reply(
            72,
            "The readConcern level must be either 'local' (default), 'majority' or 'snapshot' \
             in order to run in a transaction",
        ));
    }
    read_concern.contains_key("afterOpTime").then(|| {
        error_reply(
            72,
            "The readConcern cannot specify 'afterOpTime' in a transaction",
        )
    })
}

/// Review13 finding 1, review14 finding 2, leftovers12 items 1 and 2 (house rule 7): outside a
/// transaction, a parsed `readConcern` level the command does not support. A mongod and a mongos
/// check the level against the command's `supportsReadConcern` (`service_entry_point_common`,
/// outside a multi-document transaction and only with a level, before the fail point):
/// InvalidOptions (72), "Command &lt;name&gt; does not support { readConcern: ... } :: caused by
/// :: &lt;reason&gt;" ([`unsupported_read_concern`] says which level each command takes).
/// Review16 finding 6: a server before 5.0 (`max_wire_version` below 13) then refuses a
/// "snapshot" level the command supports as well ([`SNAPSHOT_READS_WIRE_VERSION`]). Inside a
/// transaction the first statement's level is checked by [`transaction_refusal`], and `create`
/// and `createIndexes` against it when the session is checked out (`crate::commands`).
fn read_concern_level_refusal(
    role: &Role,
    name: &str,
    command: &Document,
    max_wire_version: i32,
) -> Option<Document> {
    if command.contains_key("autocommit") {
        return None;
    }
    let read_concern = command.get_document("readConcern").ok()?;
    let level = read_concern.get_str("level").ok()?;
    if let Some(reason) = unsupported_read_concern(role, name, command, level) {
        return Some(read_concern_not_supported(
            &format!("Command {name} does not support"),
            read_concern,
            &reason,
        ));
    }
    let before_5_0 = max_wire_version < SNAPSHOT_READS_WIRE_VERSION;
    (level == "snapshot" && before_5_0).then(|| {
        let router = role.is_router();
        let message = if router {
            "read concern snapshot is only supported in a multi-statement transaction"
        } else {
            "readConcern level snapshot is only valid in multi-statement transactions"
        };
        error_reply(72, message)
    })
}

/// Review16 finding 6 (house rule 7): the wire version of MongoDB 5.0, the first release that
/// runs a read with `readConcern: {level: "snapshot"}` outside a multi-document transaction.
/// Before it, a mongod's `service_entry_point_common.cpp` refuses one (after the command's
/// `supportsReadConcern` check) with InvalidOptions (72), "readConcern level snapshot is only
/// valid in multi-statement transactions", unless the server runs with test commands enabled
/// (not emulated: the test server answers as a production server does); a mongos's
/// `strategy.cpp` with InvalidOptions (72), "read concern snapshot is only supported in a
/// multi-statement transaction".
const SNAPSHOT_READS_WIRE_VERSION: i32 = 13;

/// InvalidOptions (72): `context` and the request's read concern, as the server's
/// `ReadConcernArgs::toString` renders it, caused by `reason`.
pub(crate) fn read_concern_not_supported(
    context: &str,
    read_concern: &Document,
    reason: &str,
) -> Document {
    let mut fields = Vec::new();
    if let Ok(level) = read_concern.get_str("level") {
        fields.push(format!("level: \"{level}\""));
    }
    for field in ["afterClusterTime", "atClusterTime"] {
        if let Ok(t) = read_concern.get_timestamp(field) {
            fields.push(format!("{field}: Timestamp({}, {})", t.time, t.increment));
        }
    }
    fields.push(String::from("provenance: \"clientSupplied\""));
    let rendered = fields.join(", ");
    error_reply(
        72,
        &format!("{context} {{ readConcern: {{ {rendered} }} }} :: caused by :: {reason}"),
    )
}

/// Leftovers12 item 1 (house rule 7): what command `name`'s `supportsReadConcern` answers for
/// `level` on `role`, verified in the server's command classes: `None` when the level is
/// supported, else the reason. `find`, `distinct` and `getMore` take every level (`getMore` uses
/// its cursor's); `killCursors` every level on a mongos (`ClusterKillCursorsCmd`) and only
/// "local" on a mongod; `count` every level but "snapshot"; `mapReduce` "local" and "available";
/// `aggregate` what its stages take ([`pipeline_read_concern`]). Every other command keeps the
/// base class's default, "local" only: the writes (`insert`, `update`, `delete`,
/// `findAndModify`, `bulkWrite`: "snapshot" too is refused outside a transaction, as a 5.0+
/// server answers it), the DDL and index commands, `listCollections`, `listIndexes`,
/// `listDatabases`, `collMod`, hello, `ping` and the rest.
fn unsupported_read_concern(
    role: &Role,
    name: &str,
    command: &Document,
    level: &str,
) -> Option<String> {
    let router = role.is_router();
    let refused = match name {
        "find" | "distinct" | "getMore" => false,
        "killCursors" if router => false,
        "aggregate" => return pipeline_read_concern(command, level),
        "count" => {
            return (level == "snapshot").then(|| "read concern snapshot not supported".into())
        }
        "mapReduce" => !matches!(level, "local" | "available"),
        _ => level != "local",
    };
    refused.then(|| String::from("read concern not supported"))
}

/// Leftovers12 item 1: the level an aggregation's stages take (the server's
/// `LiteParsedPipeline::supportsReadConcern`, the first refusing stage's reason): `$changeStream`
/// only "majority", `$listLocalSessions` only "local", `$out` and `$merge` any but
/// "linearizable"; the other stages every level.
fn pipeline_read_concern(command: &Document, level: &str) -> Option<String> {
    let stages = command.get_array("pipeline").ok()?;
    stages.iter().find_map(|stage| {
        let name = stage.as_document()?.keys().next()?.as_str();
        let only = |supported: &str| {
            (level != supported).then(|| {
                format!(
                    "Aggregation stage {name} cannot run with a readConcern other than \
                     '{supported}'. Current readConcern: {level}"
                )
            })
        };
        match name {
            "$changeStream" => only("majority"),
            "$listLocalSessions" => only("local"),
            "$out" | "$merge" => (level == "linearizable")
                .then(|| format!("{name} cannot be used with a 'linearizable' read concern level")),
            _ => None,
        }
    })
}

/// The commands a server runs inside a multi-document transaction; any other (`count`,
/// `listCollections`, `ping`, ...) is `OperationNotSupportedInTransaction` (263).
const TRANSACTION_COMMANDS: [&str; 16] = [
    "abortTransaction",
    "aggregate",
    "bulkWrite",
    "commitTransaction",
    "create",
    "createIndexes",
    "delete",
    "distinct",
    "find",
    "findAndModify",
    "findandmodify",
    "getMore",
    "insert",
    "killCursors",
    "update",
    "geoSearch",
];

/// The read concern levels a server knows.
const READ_CONCERN_LEVELS: [&str; 5] =
    ["local", "majority", "linearizable", "available", "snapshot"];

/// What the server's `readConcern` parsing refuses (review5 item 11): a non-document, a field of
/// the wrong type, an unknown field or level.
fn read_concern_refusal(value: &Bson) -> Option<Document> {
    let Bson::Document(read_concern) = value else {
        return Some(wrong_type("readConcern", value, "object"));
    };
    for (field, value) in read_concern {
        match (field.as_str(), value) {
            ("level", Bson::String(level)) if READ_CONCERN_LEVELS.contains(&level.as_str()) => {}
            ("level", Bson::String(level)) => {
                return Some(error_reply(
                    9,
                    &format!("readConcern.level has an unknown value '{level}'"),
                ))
            }
            ("afterClusterTime" | "atClusterTime", Bson::Timestamp(_))
            | ("afterOpTime", Bson::Document(_)) => {}
            ("level" | "afterClusterTime" | "atClusterTime" | "afterOpTime", other) => {
                let expected = if field == "level" {
                    "string"
                } else {
                    "timestamp"
                };
                return Some(wrong_type(&format!("readConcern.{field}"), other, expected));
            }
            (field, _) => {
                return Some(error_reply(
                    9,
                    &format!("BSON field 'readConcern.{field}' is an unknown field."),
                ))
            }
        }
    }
    // Review7 finding 3: `atClusterTime` goes with neither `afterClusterTime` nor a level other
    // than snapshot (InvalidOptions 72, the review's reading of the server; messages unverified).
    if read_concern.contains_key("atClusterTime") {
        if read_concern.contains_key("afterClusterTime") {
            return Some(error_reply(
                72,
                "Can not specify both afterClusterTime and atClusterTime",
            ));
        }
        if read_concern.get_str("level").ok() != Some("snapshot") {
            return Some(error_reply(
                72,
                "readConcern.atClusterTime field is only compatible with snapshot readConcern level",
            ));
        }
    }
    None
}

/// TypeMismatch (14): the BSON field `field` holds `value`, not a value of type `expected`.
pub(crate) fn wrong_type(field: &str, value: &Bson, expected: &str) -> Document {
    error_reply(
        14,
        &format!(
            "BSON field '{field}' is the wrong type '{}', expected type '{expected}'",
            type_name(value)
        ),
    )
}

/// SE-3 (review6 finding 9): a real server parses `lsid` strictly: a document whose `id` is a
/// UUID (binary subtype 4: else TypeMismatch 14) of 16 bytes (else InvalidUUID 207), with no
/// field besides `id` and the server's internal ones (`uid`, `txnNumber`, `txnUUID`; else
/// 40415); a missing `id` is 40414.
fn lsid_refusal(lsid: &Bson) -> Option<Document> {
    let Bson::Document(lsid) = lsid else {
        return Some(wrong_type("lsid", lsid, "object"));
    };
    if let Some(field) = lsid
        .keys()
        .find(|k| !matches!(k.as_str(), "id" | "uid" | "txnNumber" | "txnUUID"))
    {
        return Some(error_reply(
            40415,
            &format!("BSON field 'lsid.{field}' is an unknown field."),
        ));
    }
    match lsid.get("id") {
        None => Some(error_reply(
            40414,
            "BSON field 'lsid.id' is missing but a required field",
        )),
        Some(Bson::Binary(id)) if id.subtype == BinarySubtype::Uuid && id.bytes.len() == 16 => None,
        Some(Bson::Binary(id)) if id.subtype == BinarySubtype::Uuid => Some(error_reply(
            207,
            "uuid must be a 16-byte binary field with UUID (4) subtype",
        )),
        Some(Bson::Binary(id)) => Some(error_reply(
            14,
            &format!(
                "BSON field 'lsid.id' is the wrong binData type '{:?}', expected type 'UUID'",
                id.subtype
            ),
        )),
        Some(other) => Some(wrong_type("lsid.id", other, "binData")),
    }
}

/// SE-17 (review6 finding 8): a command's `$clusterTime`, parsed as a server without
/// authentication parses it before it advances its clock to it: a document with a `clusterTime`
/// Timestamp and a `signature` document holding a binary `hash` and an Int64 `keyId`; a missing
/// field is NoSuchKey (4), a wrong type TypeMismatch (14).
pub(crate) fn gossiped_cluster_time(value: &Bson) -> Result<bson::Timestamp, Document> {
    fn field<'a>(document: &'a Document, name: &str) -> Result<&'a Bson, Document> {
        document
            .get(name)
            .ok_or_else(|| error_reply(4, &format!("Missing expected field \"{name}\"")))
    }
    fn wrong(name: &str, expected: &str, found: &Bson) -> Document {
        error_reply(
            14,
            &format!(
                "\"{name}\" had the wrong type. Expected {expected}, found {}",
                type_name(found)
            ),
        )
    }
    let Bson::Document(gossip) = value else {
        return Err(wrong("$clusterTime", "object", value));
    };
    let time = match field(gossip, "clusterTime")? {
        Bson::Timestamp(time) => *time,
        other => return Err(wrong("clusterTime", "timestamp", other)),
    };
    let signature = match field(gossip, "signature")? {
        Bson::Document(signature) => signature,
        other => return Err(wrong("signature", "object", other)),
    };
    match field(signature, "hash")? {
        Bson::Binary(_) => {}
        other => return Err(wrong("hash", "binData", other)),
    }
    match field(signature, "keyId")? {
        Bson::Int64(_) => Ok(time),
        other => Err(wrong("keyId", "long", other)),
    }
}

/// SE-21: what a server's `waitForReadConcern` refuses about a read concern's cluster time, in
/// its order (mongodb/mongo src/mongo/db/read_concern_mongod.cpp), after the level checks
/// ([`refusal`]) and the gossiped `$clusterTime`:
/// - review37 W6: an `afterClusterTime` on a command whose `allowsAfterClusterTime()` is false,
///   here `getMore` (src/mongo/db/commands/getmore_cmd.cpp): InvalidOptions (72), "afterClusterTime
///   is not allowed for this command";
/// - review37 W7: an `afterClusterTime` or `atClusterTime` on a server without replication, a
///   standalone: IllegalOperation (20), "Cannot specify afterClusterTime readConcern without
///   replication enabled" (or atClusterTime);
/// - review5 item 11: an `afterClusterTime` ahead of the deployment's current cluster time
///   (`now`): InvalidOptions (72), as a server that never saw that time.
pub(crate) fn after_cluster_time_refusal(
    role: &Role,
    name: &str,
    command: &Document,
    now: bson::Timestamp,
) -> Option<Document> {
    let Ok(read_concern) = command.get_document("readConcern") else {
        return None;
    };
    let after = read_concern.get_timestamp("afterClusterTime").ok();
    if after.is_some() && name == "getMore" {
        return Some(error_reply(
            72,
            "afterClusterTime is not allowed for this command",
        ));
    }
    if *role == Role::Standalone {
        let given = ["afterClusterTime", "atClusterTime"]
            .into_iter()
            .find(|field| read_concern.contains_key(field));
        if let Some(field) = given {
            return Some(error_reply(
                20,
                &format!("Cannot specify {field} readConcern without replication enabled"),
            ));
        }
    }
    let after = after?;
    ((after.time, after.increment) > (now.time, now.increment)).then(|| {
        error_reply(
            72,
            &format!(
                "readConcern afterClusterTime value must not be greater than the current \
                 clusterTime. Requested clusterTime: {after}; current clusterTime: {now}"
            ),
        )
    })
}

/// The server's `parseMaxTimeMS`: any number in `0..=i32::MAX` with an integral value.
pub(crate) fn max_time_refusal(value: &Bson) -> Option<Document> {
    let (whole, integral) = match value {
        Bson::Int32(v) => (i64::from(*v), true),
        Bson::Int64(v) => (*v, true),
        // The server truncates toward zero (saturating) before the range check.
        Bson::Double(v) => (*v as i64, v.fract() == 0.0),
        Bson::Decimal128(_) => return Some(error_reply(2, "maxTimeMS is out of range")),
        _ => return Some(error_reply(2, "maxTimeMS must be a number")),
    };
    if !(0..=i64::from(i32::MAX)).contains(&whole) {
        return Some(error_reply(2, "maxTimeMS is out of range"));
    }
    (!integral).then(|| error_reply(2, "maxTimeMS has non-integral value"))
}

/// The server's name of a BSON type, for type errors.
pub(crate) fn type_name(value: &Bson) -> &'static str {
    match value {
        Bson::Int32(_) => "int",
        Bson::Int64(_) => "long",
        Bson::Double(_) => "double",
        Bson::Decimal128(_) => "decimal",
        Bson::String(_) => "string",
        Bson::Boolean(_) => "bool",
        Bson::Null => "null",
        Bson::Document(_) => "object",
        Bson::Array(_) => "array",
        Bson::Timestamp(_) => "timestamp",
        _ => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReplicaSetMember;
    use bson::{bson, doc, spec::BinarySubtype, Binary};

    /// [`super::refusal`] on a server of the default wire version (25).
    fn refusal(role: &Role, name: &str, command: &Document) -> Option<Document> {
        super::refusal(role, name, command, 25)
    }

    /// Review16 finding 6 (house rule 7, before 5.0 a mongod's `service_entry_point_common.cpp`
    /// and a mongos's `strategy.cpp`): outside a transaction, a `find`, `distinct` or `aggregate`
    /// with `readConcern: {level: "snapshot"}` is InvalidOptions 72 at wire 9 (4.4) and 12, each
    /// with its own message, and runs at wire 13 (5.0); in a transaction (`autocommit: false`)
    /// the level is checked elsewhere; a level the command does not support (`count`) keeps its
    /// own message first.
    #[test]
    fn review16_snapshot_reads_outside_a_transaction_need_wire_13() {
        let snapshot = doc! { "level": "snapshot" };
        let reads = [
            (
                "find",
                doc! { "find": "c", "readConcern": snapshot.clone() },
            ),
            (
                "distinct",
                doc! { "distinct": "c", "key": "a", "readConcern": snapshot.clone() },
            ),
            (
                "aggregate",
                doc! {
                    "aggregate": "c", "pipeline": [], "cursor": {},
                    "readConcern": snapshot.clone(),
                },
            ),
        ];
        let mongod = "readConcern level snapshot is only valid in multi-statement transactions";
        let mongos = "read concern snapshot is only supported in a multi-statement transaction";
        for (name, command) in &reads {
            for (role, message) in [(Role::Standalone, mongod), (Role::Mongos, mongos)] {
                for wire in [9, 12] {
                    let refused = super::refusal(&role, name, command, wire);
                    let refused = refused.expect("refused before 5.0");
                    assert_eq!(refused.get_i32("code").ok(), Some(72), "{name} at {wire}");
                    assert_eq!(refused.get_str("errmsg").ok(), Some(message));
                }
                let runs = super::refusal(&role, name, command, 13);
                assert_eq!(runs, None, "{name} runs at wire 13");
            }
            let mut in_transaction = command.clone();
            in_transaction.extend(doc! {
                "lsid": lsid(), "txnNumber": 1_i64, "autocommit": false, "startTransaction": true,
            });
            let checked_elsewhere = super::refusal(&Role::Mongos, name, &in_transaction, 9);
            assert_eq!(checked_elsewhere, None, "{name} in a transaction");
        }
        let count = doc! { "count": "c", "readConcern": snapshot };
        let refused = super::refusal(&Role::Standalone, "count", &count, 9).expect("refused");
        let message = refused.get_str("errmsg").unwrap_or_default();
        assert!(
            message.starts_with("Command count does not support"),
            "{message}"
        );
    }

    fn lsid() -> Document {
        doc! { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![0; 16] } }
    }

    fn errmsg(reply: Option<Document>) -> Option<String> {
        reply.and_then(|r| r.get_str("errmsg").ok().map(str::to_owned))
    }

    fn code(reply: Option<Document>) -> Option<i32> {
        reply.and_then(|r| r.get_i32("code").ok())
    }

    /// Versioned-api "Cursors" / "Transactions": API parameters compare field by field, an
    /// absent field differing from any value (the server's `APIParameters` `operator==`), and
    /// print as the server's `BSONObj::toString` in its APIMismatchError (347) message.
    #[test]
    fn tk15_api_parameters_compare_and_print_as_a_real_server() {
        let of = |command: Document| ApiParameters::of(&command);
        let v1 = of(doc! { "ping": 1, "apiVersion": "1" });
        let strict_off = of(doc! { "ping": 1, "apiVersion": "1", "apiStrict": false });
        assert_eq!(of(doc! { "ping": 1 }), ApiParameters::NONE);
        assert_ne!(v1, strict_off);
        assert_eq!(
            v1.mismatch(v1, "getMore", "the cursor-creating command"),
            None
        );
        assert_eq!(
            ApiParameters::NONE.mismatch(strict_off, "getMore", "the cursor-creating command"),
            Some((
                347,
                "API parameter mismatch: getMore used params {}, the cursor-creating command \
                 used { apiVersion: \"1\", apiStrict: false }"
                    .to_owned()
            ))
        );
        let all = of(doc! {
            "ping": 1, "apiVersion": "1", "apiStrict": true, "apiDeprecationErrors": true,
        });
        assert_eq!(
            all.to_string(),
            "{ apiVersion: \"1\", apiStrict: true, apiDeprecationErrors: true }"
        );
    }

    #[test]
    fn a_txn_number_needs_an_lsid_and_a_replica_set_or_mongos() {
        let insert = doc! { "insert": "c", "txnNumber": 1_i64 };
        assert_eq!(code(refusal(&Role::Mongos, "insert", &insert)), Some(72));
        let mut with_lsid = insert.clone();
        with_lsid.insert("lsid", lsid());
        assert_eq!(code(refusal(&Role::Mongos, "insert", &with_lsid)), None);
        assert_eq!(
            code(refusal(&Role::Standalone, "insert", &with_lsid)),
            Some(20)
        );
        let bad = doc! { "insert": "c", "lsid": { "id": 1 } };
        assert_eq!(code(refusal(&Role::Mongos, "insert", &bad)), Some(14));
    }

    /// SE-17 (review6 finding 8): a gossiped `$clusterTime` needs a `clusterTime` Timestamp and
    /// a `signature` with a binary `hash` and an Int64 `keyId` (NoSuchKey 4, TypeMismatch 14).
    #[test]
    fn se17_a_gossiped_cluster_time_is_parsed_like_a_real_servers() {
        let time = bson::Timestamp {
            time: 5,
            increment: 6,
        };
        let signature = doc! { "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] }, "keyId": 0_i64 };
        let parse = |gossip: Bson| gossiped_cluster_time(&gossip).map_err(|e| code(Some(e)));
        assert_eq!(
            parse(Bson::Document(
                doc! { "clusterTime": time, "signature": signature.clone() }
            )),
            Ok(time)
        );
        let mut int32_key = signature.clone();
        int32_key.insert("keyId", 0);
        for (gossip, expected) in [
            (Bson::Int32(1), Some(14)),
            (
                Bson::Document(doc! { "signature": signature.clone() }),
                Some(4),
            ),
            (
                Bson::Document(doc! { "clusterTime": 1, "signature": signature }),
                Some(14),
            ),
            (Bson::Document(doc! { "clusterTime": time }), Some(4)),
            (
                Bson::Document(doc! { "clusterTime": time, "signature": int32_key }),
                Some(14),
            ),
        ] {
            assert_eq!(parse(gossip.clone()), Err(expected), "{gossip}");
        }
    }

    /// SE-3 (review6 finding 9): an lsid's `id` must be a UUID (subtype 4, TypeMismatch 14) of 16
    /// bytes (InvalidUUID 207), with no unknown field (40415) and not missing (40414); the
    /// server's own `uid` is accepted.
    #[test]
    fn se3_an_lsid_is_parsed_as_strictly_as_a_real_server() {
        let with = |lsid: Document| doc! { "ping": 1, "lsid": lsid };
        let generic = Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![0; 16],
        };
        let short = Binary {
            subtype: BinarySubtype::Uuid,
            bytes: vec![0; 12],
        };
        let uid = Binary {
            subtype: BinarySubtype::Generic,
            bytes: vec![0; 32],
        };
        let mut extra = lsid();
        extra.insert("x", 1);
        let mut internal = lsid();
        internal.insert("uid", uid);
        for (lsid, expected) in [
            (doc! { "id": generic }, Some(14)),
            (doc! { "id": short }, Some(207)),
            (extra, Some(40415)),
            (doc! {}, Some(40414)),
            (internal, None),
            (lsid(), None),
        ] {
            let command = with(lsid.clone());
            assert_eq!(
                code(refusal(&Role::Mongos, "ping", &command)),
                expected,
                "{lsid}"
            );
        }
    }

    /// Review items 7 and 21 (house rule 7): `maxTimeMS` must be an integral number in
    /// `0..=i32::MAX` (BadValue, 2) and `txnNumber` an Int64 (TypeMismatch, 14), as a real server
    /// checks them.
    #[test]
    fn max_time_ms_and_txn_number_are_checked_like_a_real_server() {
        let find = |max_time: Bson| doc! { "find": "c", "maxTimeMS": max_time };
        for fine in [
            Bson::Int32(0),
            Bson::Int32(i32::MAX),
            Bson::Int64(5),
            Bson::Double(100.0),
        ] {
            assert_eq!(code(refusal(&Role::Mongos, "find", &find(fine))), None);
        }
        for bad in [
            Bson::Int32(-1),
            Bson::Int64(i64::from(i32::MAX) + 1),
            Bson::Double(1.5),
            Bson::Double(3.0e9),
            Bson::String("5".into()),
            Bson::Null,
        ] {
            let refused = refusal(&Role::Mongos, "find", &find(bad.clone()));
            assert_eq!(code(refused), Some(2), "{bad:?}");
        }
        // TX-1: a transaction's commit without `autocommit: false`.
        let commit = doc! { "commitTransaction": 1, "lsid": lsid(), "txnNumber": 1_i64 };
        assert_eq!(
            code(refusal(&Role::Mongos, "commitTransaction", &commit)),
            Some(50768)
        );
        let mut in_transaction = commit.clone();
        in_transaction.insert("autocommit", false);
        let refused = refusal(&Role::Mongos, "commitTransaction", &in_transaction);
        assert_eq!(code(refused), None);
        for bad in [Bson::Int32(1), Bson::Double(1.0)] {
            let insert = doc! { "insert": "c", "lsid": lsid(), "txnNumber": bad.clone() };
            let refused = refusal(&Role::Mongos, "insert", &insert);
            assert_eq!(code(refused.clone()), Some(14), "{bad:?}");
            let message = refused.and_then(|r| r.get_str("errmsg").ok().map(str::to_owned));
            assert!(message.is_some_and(|m| m.contains("expected type 'long'")));
        }
    }

    #[test]
    fn ss9_a_secondary_refuses_reads_without_a_secondary_ok_read_preference() {
        let secondary = Role::ReplicaSetMember(ReplicaSetMember::secondary("rs"));
        let find = doc! { "find": "c" };
        assert_eq!(code(refusal(&secondary, "find", &find)), Some(13435));
        let primary_pref = doc! { "find": "c", "$readPreference": { "mode": "primary" } };
        assert_eq!(
            code(refusal(&secondary, "find", &primary_pref)),
            Some(13435)
        );
        let secondary_ok = doc! { "find": "c", "$readPreference": { "mode": "secondary" } };
        assert_eq!(code(refusal(&secondary, "find", &secondary_ok)), None);
        let primary = Role::ReplicaSetMember(ReplicaSetMember::primary("rs"));
        assert_eq!(code(refusal(&primary, "find", &find)), None);
        assert_eq!(code(refusal(&secondary, "ping", &doc! { "ping": 1 })), None);
    }

    /// TX-1 (review5 item 11): the session fields and concerns of a transaction's commands are
    /// checked as a server checks them.
    #[test]
    fn tx1_transaction_fields_and_concerns_are_checked_like_a_real_server() {
        let statement = |extra: Document| {
            let mut command = doc! { "insert": "c", "lsid": lsid(), "txnNumber": 1_i64 };
            command.extend(extra);
            command
        };
        let refused = |command: &Document| {
            let name = command.keys().next().unwrap().clone();
            code(refusal(&Role::Mongos, &name, command))
        };
        // startTransaction without autocommit: false; autocommit: true; startTransaction: false.
        assert_eq!(
            refused(&statement(doc! { "startTransaction": true })),
            Some(72)
        );
        assert_eq!(refused(&statement(doc! { "autocommit": true })), Some(72));
        assert_eq!(
            refused(&statement(
                doc! { "autocommit": false, "startTransaction": false }
            )),
            Some(72)
        );
        assert_eq!(
            refused(&doc! { "insert": "c", "lsid": lsid(), "autocommit": false }),
            Some(72),
            "autocommit without a txnNumber"
        );
        let first = doc! { "autocommit": false, "startTransaction": true };
        assert_eq!(refused(&statement(first.clone())), None);
        // readConcern only on the first command.
        let mut with_rc = first.clone();
        with_rc.insert("readConcern", doc! { "level": "snapshot" });
        assert_eq!(refused(&statement(with_rc)), None);
        assert_eq!(
            refused(&statement(
                doc! { "autocommit": false, "readConcern": { "level": "local" } }
            )),
            Some(72)
        );
        // writeConcern only on commit and abort.
        assert_eq!(
            refused(&statement(
                doc! { "autocommit": false, "writeConcern": { "w": 1 } }
            )),
            Some(72)
        );
        let commit = doc! {
            "commitTransaction": 1, "lsid": lsid(), "txnNumber": 1_i64, "autocommit": false,
            "writeConcern": { "w": "majority" },
        };
        assert_eq!(refused(&commit), None);
        let mut starting_commit = commit.clone();
        starting_commit.insert("startTransaction", true);
        assert_eq!(refused(&starting_commit), Some(263));
        let count = doc! {
            "count": "c", "lsid": lsid(), "txnNumber": 1_i64, "autocommit": false,
        };
        assert_eq!(
            refused(&count),
            Some(263),
            "count.json: not in a transaction"
        );
    }

    /// SE-21 (review5 item 11): `readConcern` parses as on a server: a known level, an
    /// `afterClusterTime` that is a Timestamp not ahead of the deployment's clock.
    #[test]
    fn se21_read_concern_is_validated() {
        let find = |rc: Bson| doc! { "find": "c", "readConcern": rc };
        let refused = |rc: Bson| code(refusal(&Role::Mongos, "find", &find(rc)));
        let at = |increment| bson::Timestamp { time: 1, increment };
        assert_eq!(refused(Bson::Document(doc! { "level": "majority" })), None);
        assert_eq!(
            refused(Bson::Document(doc! { "afterClusterTime": at(3) })),
            None
        );
        assert_eq!(refused(Bson::Document(doc! { "level": "strong" })), Some(9));
        assert_eq!(refused(Bson::Document(doc! { "level": 1 })), Some(14));
        assert_eq!(
            refused(Bson::Document(doc! { "afterClusterTime": 5_i64 })),
            Some(14)
        );
        assert_eq!(refused(Bson::Document(doc! { "later": true })), Some(9));
        assert_eq!(refused(Bson::String("majority".into())), Some(14));
        let ahead = find(Bson::Document(doc! { "afterClusterTime": at(4) }));
        let mongos = Role::Mongos;
        let refused = |role: &Role, name: &str, command: &Document, now| {
            code(after_cluster_time_refusal(role, name, command, now))
        };
        assert_eq!(refused(&mongos, "find", &ahead, at(3)), Some(72));
        assert_eq!(refused(&mongos, "find", &ahead, at(4)), None);
    }

    /// Review37 W6, W7 (SE-21; mongodb/mongo src/mongo/db/read_concern_mongod.cpp,
    /// src/mongo/db/commands/getmore_cmd.cpp): a getMore takes no `afterClusterTime`
    /// (InvalidOptions 72, checked first); a standalone takes neither `afterClusterTime` nor
    /// `atClusterTime`, whatever the clock (IllegalOperation 20).
    #[test]
    fn w6_w7_after_cluster_time_not_on_get_more_nor_on_a_standalone() {
        let at = |increment| bson::Timestamp { time: 1, increment };
        let with = |name: &str, read_concern: Document| {
            doc! { name: 1_i64, "readConcern": read_concern, "$db": "db" }
        };
        let after = doc! { "afterClusterTime": at(1) };
        let primary = Role::ReplicaSetMember(ReplicaSetMember::primary("rs"));
        for role in [&Role::Mongos, &primary, &Role::Standalone] {
            let reply =
                after_cluster_time_refusal(role, "getMore", &with("getMore", after.clone()), at(5));
            assert_eq!(
                errmsg(reply.clone()).as_deref(),
                Some("afterClusterTime is not allowed for this command"),
                "{role:?}"
            );
            assert_eq!(code(reply), Some(72));
        }
        // A getMore without a cluster time is not refused here.
        let local = doc! { "level": "local" };
        assert_eq!(
            code(after_cluster_time_refusal(
                &primary,
                "getMore",
                &with("getMore", local),
                at(5)
            )),
            None
        );
        // A standalone: 20 for both, even at or below its clock.
        let snapshot_at = doc! { "level": "snapshot", "atClusterTime": at(1) };
        for read_concern in [after.clone(), snapshot_at] {
            let field = read_concern.keys().last().unwrap().clone();
            let reply = after_cluster_time_refusal(
                &Role::Standalone,
                "find",
                &with("find", read_concern.clone()),
                at(5),
            );
            assert_eq!(
                errmsg(reply.clone()),
                Some(format!(
                    "Cannot specify {field} readConcern without replication enabled"
                ))
            );
            assert_eq!(code(reply), Some(20));
            assert_eq!(
                code(after_cluster_time_refusal(
                    &primary,
                    "find",
                    &with("find", read_concern),
                    at(5)
                )),
                None
            );
        }
    }

    /// Review13 finding 1, leftovers12 item 2 (house rule 7; the server's
    /// `jstests/sharding/read_write_concern_defaults`-style write test, 5.1+, and a 5.0 server's
    /// answer quoted in the specifications' DRIVERS-1819): outside a transaction a write takes
    /// only the "local" `readConcern` level; "snapshot", "majority", "linearizable" and
    /// "available" are InvalidOptions (72) with the server's message; in a transaction's first
    /// statement the transaction's level is taken, and reads are not concerned.
    #[test]
    fn review13_f1_item2_a_write_outside_a_transaction_takes_only_the_local_read_concern() {
        let with = |name: &str, level: &str| {
            doc! { name: "c", "readConcern": { "level": level } }
        };
        for name in ["insert", "update", "delete", "findAndModify", "bulkWrite"] {
            for level in ["snapshot", "majority", "linearizable", "available"] {
                let refused = refusal(&Role::Mongos, name, &with(name, level));
                assert_eq!(code(refused), Some(72), "{name} {level}");
            }
            let command = with(name, "local");
            assert_eq!(code(refusal(&Role::Mongos, name, &command)), None);
        }
        let refused = refusal(&Role::Mongos, "insert", &with("insert", "snapshot"));
        assert_eq!(
            errmsg(refused),
            Some(
                "Command insert does not support { readConcern: { level: \"snapshot\", \
                 provenance: \"clientSupplied\" } } :: caused by :: read concern not supported"
                    .to_owned()
            )
        );
        assert_eq!(
            code(refusal(&Role::Mongos, "find", &with("find", "majority"))),
            None
        );
        for level in ["snapshot", "majority", "local"] {
            let mut first = with("insert", level);
            first.extend(doc! {
                "lsid": lsid(), "txnNumber": 1_i64, "autocommit": false, "startTransaction": true,
            });
            assert_eq!(
                code(refusal(&Role::Mongos, "insert", &first)),
                None,
                "{level}"
            );
        }
    }

    /// Leftovers12 item 2 (house rule 7; the server's `service_entry_point_common` and
    /// `strategy.cpp` when a transaction starts): a transaction's first statement takes only the
    /// "local", "majority" and "snapshot" levels and no `afterOpTime` (InvalidOptions 72), on a
    /// mongod and a mongos.
    #[test]
    fn item2_a_transaction_starts_only_with_local_majority_or_snapshot() {
        let first = |read_concern: Document| {
            doc! {
                "find": "c", "lsid": lsid(), "txnNumber": 1_i64, "autocommit": false,
                "startTransaction": true, "readConcern": read_concern,
            }
        };
        let primary = Role::ReplicaSetMember(ReplicaSetMember::primary("rs"));
        for role in [Role::Mongos, primary] {
            for level in ["linearizable", "available"] {
                let refused = refusal(&role, "find", &first(doc! { "level": level }));
                assert_eq!(
                    errmsg(refused),
                    Some(
                        "The readConcern level must be either 'local' (default), 'majority' or \
                         'snapshot' in order to run in a transaction"
                            .to_owned()
                    ),
                    "{level}"
                );
            }
            for level in ["local", "majority", "snapshot"] {
                let started = first(doc! { "level": level });
                assert_eq!(code(refusal(&role, "find", &started)), None, "{level}");
            }
            let op_time = first(
                doc! { "afterOpTime": { "ts": bson::Timestamp { time: 1, increment: 1 }, "t": 1_i64 } },
            );
            assert_eq!(code(refusal(&role, "find", &op_time)), Some(72));
        }
    }

    /// Leftovers12 item 1 (house rule 7): outside a transaction each command takes the levels
    /// its `supportsReadConcern` takes in the server's source (`list_collections.cpp`,
    /// `list_indexes.cpp`, `list_databases.cpp`, `collmod_cmd.cpp` and the hello command keep
    /// the base default, "local" only; `count_cmd.cpp` refuses "snapshot";
    /// `map_reduce_command_base.h` takes "local" and "available"; `getmore_cmd.cpp`,
    /// `distinct.cpp` and `find_cmd.cpp` take every level; `killcursors_cmd.cpp` only "local",
    /// `cluster_killcursors_cmd.cpp` every level; the pipeline's stages for `aggregate`).
    #[test]
    fn item1_each_command_takes_the_read_concern_levels_of_its_server_class() {
        let primary = Role::ReplicaSetMember(ReplicaSetMember::primary("rs"));
        let refused = |role: &Role, mut command: Document, level: &str| {
            let name = command.keys().next().unwrap().clone();
            command.insert("readConcern", doc! { "level": level });
            refusal(role, &name, &command)
        };
        let levels = ["local", "majority", "linearizable", "available", "snapshot"];
        let local_only = [
            doc! { "listCollections": 1 },
            doc! { "listIndexes": "c" },
            doc! { "listDatabases": 1 },
            doc! { "collMod": "c" },
            doc! { "renameCollection": "db.c", "to": "db.d" },
            doc! { "hello": 1 },
            doc! { "ping": 1 },
            doc! { "buildInfo": 1 },
            doc! { "endSessions": [] },
            doc! { "create": "c" },
        ];
        for role in [Role::Mongos, primary.clone()] {
            for command in &local_only {
                for level in levels {
                    let answer = code(refused(&role, command.clone(), level));
                    let expected = (level != "local").then_some(72);
                    assert_eq!(answer, expected, "{command} {level}");
                }
            }
            for command in [
                doc! { "find": "c" },
                doc! { "distinct": "c", "key": "x" },
                doc! { "getMore": 1_i64, "collection": "c" },
                doc! { "aggregate": "c", "pipeline": [{ "$match": {} }], "cursor": {} },
            ] {
                for level in levels {
                    assert_eq!(
                        code(refused(&role, command.clone(), level)),
                        None,
                        "{command} {level}"
                    );
                }
            }
            for level in levels {
                let count = refused(&role, doc! { "count": "c" }, level);
                if level == "snapshot" {
                    assert_eq!(
                        errmsg(count),
                        Some(
                            "Command count does not support { readConcern: { level: \
                             \"snapshot\", provenance: \"clientSupplied\" } } :: caused by :: \
                             read concern snapshot not supported"
                                .to_owned()
                        )
                    );
                } else {
                    assert_eq!(code(count), None, "count {level}");
                }
                let map_reduce = code(refused(&role, doc! { "mapReduce": "c" }, level));
                let expected = (!matches!(level, "local" | "available")).then_some(72);
                assert_eq!(map_reduce, expected, "mapReduce {level}");
            }
        }
        // killCursors: only "local" on a mongod, every level on a mongos.
        let kill = doc! { "killCursors": "c", "cursors": [1_i64] };
        assert_eq!(code(refused(&primary, kill.clone(), "majority")), Some(72));
        assert_eq!(code(refused(&primary, kill.clone(), "local")), None);
        assert_eq!(code(refused(&Role::Mongos, kill, "majority")), None);
        // The pipeline's stages: the first refusing stage's reason.
        let pipeline = |stages: Bson| doc! { "aggregate": "c", "pipeline": stages, "cursor": {} };
        let change_stream = pipeline(bson!([{ "$changeStream": {} }]));
        assert_eq!(
            errmsg(refused(&primary, change_stream.clone(), "local")),
            Some(
                "Command aggregate does not support { readConcern: { level: \"local\", \
                 provenance: \"clientSupplied\" } } :: caused by :: Aggregation stage \
                 $changeStream cannot run with a readConcern other than 'majority'. Current \
                 readConcern: local"
                    .to_owned()
            )
        );
        assert_eq!(code(refused(&primary, change_stream, "majority")), None);
        let sessions = pipeline(bson!([{ "$listLocalSessions": {} }]));
        assert_eq!(
            code(refused(&primary, sessions.clone(), "majority")),
            Some(72)
        );
        assert_eq!(code(refused(&primary, sessions, "local")), None);
        for stage in ["$out", "$merge"] {
            let writes = pipeline(bson!([{ "$match": {} }, { stage: "d" }]));
            let linearizable = errmsg(refused(&primary, writes.clone(), "linearizable"));
            assert!(
                linearizable.is_some_and(|m| m.ends_with(&format!(
                    ":: caused by :: {stage} cannot be used with a 'linearizable' read concern level"
                ))),
                "{stage}"
            );
            for level in ["local", "majority", "available", "snapshot"] {
                assert_eq!(
                    code(refused(&primary, writes.clone(), level)),
                    None,
                    "{stage} {level}"
                );
            }
        }
        // The rendered read concern keeps its cluster time, as the server's `toString` does.
        let mut after = doc! { "listIndexes": "c" };
        after.insert(
            "readConcern",
            doc! { "level": "majority", "afterClusterTime": bson::Timestamp { time: 7, increment: 2 } },
        );
        assert_eq!(
            errmsg(refusal(&primary, "listIndexes", &after)),
            Some(
                "Command listIndexes does not support { readConcern: { level: \"majority\", \
                 afterClusterTime: Timestamp(7, 2), provenance: \"clientSupplied\" } } :: \
                 caused by :: read concern not supported"
                    .to_owned()
            )
        );
    }

    /// SE-21, review7 finding 3: `atClusterTime` only with the snapshot level and never with
    /// `afterClusterTime` (InvalidOptions, 72).
    #[test]
    fn se21_review7_f3_at_cluster_time_needs_snapshot_and_no_after_cluster_time() {
        let at = bson::Timestamp {
            time: 1,
            increment: 1,
        };
        let refused = |rc: Document| {
            code(refusal(
                &Role::Mongos,
                "find",
                &doc! { "find": "c", "readConcern": rc },
            ))
        };
        assert_eq!(
            refused(doc! { "level": "snapshot", "atClusterTime": at }),
            None
        );
        assert_eq!(
            refused(doc! { "level": "majority", "atClusterTime": at }),
            Some(72)
        );
        assert_eq!(refused(doc! { "atClusterTime": at }), Some(72));
        assert_eq!(
            refused(doc! { "level": "snapshot", "atClusterTime": at, "afterClusterTime": at }),
            Some(72)
        );
    }
}
