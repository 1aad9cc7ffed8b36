//! What a real server refuses about the database a command names in `$db` (review32 R4, house
//! rule 7: the test server is at least as strict as a real one), and about the database a write
//! goes to or creates (review34 Y4).
//!
//! Checked against the server's source (mongodb/mongo, read through the search tool):
//!
//! - as the command is parsed, after its lookup (`src/mongo/db/database_name.h`, the
//!   `DatabaseName` constructor that `$db` is turned into): a `.` ("'.' is an invalid character
//!   in a db name: {db}"), a NUL ("database names cannot have embedded null characters"), more
//!   than 63 bytes ("db name must be at most 63 characters, found: {n}",
//!   `kMaxDatabaseNameLength`), in that order ([`parse_refusal`]);
//! - after the `failCommand` fail point was evaluated (`ExecCommandDatabase::_initiateCommand` in
//!   `src/mongo/db/service_entry_point_shard_role.cpp`; `execCommandDatabase` in the older
//!   `service_entry_point_common.cpp`; the router's `ExecCommandClient::_prologue`): a name
//!   `DatabaseName::validDBName` refuses, "Invalid database name: '{db}'"
//!   ([`validity_refusal`]). It refuses an empty name, one over 63 bytes, and one holding NUL,
//!   `/`, `\`, `.`, a space or `"`; `$` passes this check (the server calls it with
//!   `DollarInDbNameBehavior::Allow`), not a write's (below). The characters only a Windows build refuses are taken, as
//!   on the Linux servers the tests stand in for. A router checks first that the database is not
//!   `local`: IllegalOperation (20), "Can't use 'local' database through mongos".
//!
//! Then, as a command writes or creates a collection (review34 Y4):
//!
//! - a write (`insert`, `update`, `delete`, `findAndModify`, `createIndexes`, a `bulkWrite` op)
//!   or `create` on a database whose name holds `$`: `userAllowedWriteNS` /
//!   `userAllowedCreateNS` (`src/mongo/db/ops/insert.cpp`, called first thing by
//!   `performInserts`, `performUpdates`, `performDeletes` in `write_ops_exec.cpp`, by
//!   `findAndModify`, `createIndexes`, each `bulkWrite` op) check the namespace with
//!   `DollarInDbNameBehavior::Disallow`: InvalidNamespace (73), "Invalid namespace: {ns}"
//!   ([`write_refusal`]). So the `$` that passes the checks above is refused here;
//! - a command creating the first collection of a database ([`creation_refusal`]): a `mongod`
//!   opening a database whose name differs only in case from one it has refuses it
//!   (`DatabaseHolderImpl::openDb`, `src/mongo/db/catalog/database_holder_impl.cpp`:
//!   DatabaseDifferCase 13297, "db already exists with different case already have: [{have}]
//!   trying to create [{db}]"); it always has `admin` (the featureCompatibilityVersion
//!   document), `local` (`local.startup_log`, `logStartup`) and `config` (review36 V3: a
//!   replica-set member's `config.transactions`, `createTransactionTable` in
//!   `src/mongo/db/session/session_catalog_mongod.cpp`; a standalone's `config.system.sessions`,
//!   which its logical session cache creates as it starts,
//!   `SessionsCollectionStandalone::setupSessionsCollection` in
//!   `src/mongo/db/session/sessions_collection_standalone.cpp`). A database it opened stays in its
//!   map until `dropDatabase` (`DatabaseHolderImpl::dropDb`, which calls `close`; nothing else
//!   a client runs closes one): dropping its last collection keeps it, and so does a
//!   transaction's abort (`crate::store`'s `Store::databases`). A router has the config server
//!   create the database (`cluster::createDatabase`, called by the write targeter's `_init`
//!   for every write; `ShardingCatalogManager::createDatabase`, `checkDbNameConstraints` in
//!   `src/mongo/db/s/config/`): a name equal to `admin`, `local` or `config` ignoring case, but
//!   not `config` itself, is InvalidOptions (72), "Cannot manually create database '{db}'"; one
//!   differing only in case from a database it has is DatabaseDifferCase 13297, "can't have 2
//!   databases that just differ on case  have: {have} want to add: {db}" (two spaces, as the
//!   server writes it). `admin` itself is never created through a router (its catalog cache
//!   answers for `admin` and `config`), and `local` was refused above. The config server keeps
//!   a database it recorded (`config.databases`) until `dropDatabase`, whether it holds a
//!   collection or not (review36 V3).

use bson::Document;

use crate::fail_point::error_reply;

/// The longest database name a server takes, in bytes (`DatabaseName::kMaxDatabaseNameLength`).
pub(crate) const MAX_DATABASE_NAME_LENGTH: usize = 63;

/// InvalidNamespace.
const INVALID_NAMESPACE: i32 = 73;

/// The characters `validDBName` refuses anywhere in a name (on every platform).
const REFUSED_CHARACTERS: [char; 6] = ['\0', '/', '\\', '.', ' ', '"'];

/// The server's refusal of `db` as it parses the command (see the module docs).
pub(crate) fn parse_refusal(db: &str) -> Option<Document> {
    let message = if db.contains('.') {
        format!("'.' is an invalid character in a db name: {db}")
    } else if db.contains('\0') {
        String::from("database names cannot have embedded null characters")
    } else if db.len() > MAX_DATABASE_NAME_LENGTH {
        format!(
            "db name must be at most {MAX_DATABASE_NAME_LENGTH} characters, found: {}",
            db.len()
        )
    } else {
        return None;
    };
    Some(error_reply(INVALID_NAMESPACE, &message))
}

/// The server's refusal of `db` after the fail point (`validDBName`, and `local` on a `router`:
/// see the module docs).
pub(crate) fn validity_refusal(db: &str, router: bool) -> Option<Document> {
    if router && db == "local" {
        return Some(error_reply(20, "Can't use 'local' database through mongos"));
    }
    (!valid(db)).then(|| error_reply(INVALID_NAMESPACE, &format!("Invalid database name: '{db}'")))
}

/// InvalidOptions.
const INVALID_OPTIONS: i32 = 72;

/// DatabaseDifferCase.
const DATABASE_DIFFER_CASE: i32 = 13297;

/// The databases a `mongod` always has, which it made as it started (see the module docs;
/// `config` from review36 V3).
const MONGOD_DATABASES: [&str; 3] = ["admin", "local", "config"];

/// Review34 Y4: the server's refusal of a write to, or the creation of, collection `ns` whose
/// database name holds `$` (InvalidNamespace 73; see the module docs): code and message.
pub(crate) fn write_refusal(ns: &str) -> Option<(i32, String)> {
    let (db, _) = ns.split_once('.')?;
    db.contains('$')
        .then(|| (INVALID_NAMESPACE, format!("Invalid namespace: {ns}")))
}

/// Review34 Y4: the refusal of a collection's creation in database `db` on a server holding
/// the databases `existing` (review36 V3: those it opened or recorded and did not drop, see
/// the module docs), on a `router` or a `mongod`: code and message. None when `db` exists:
/// nothing is created.
pub(crate) fn creation_refusal<'a>(
    db: &str,
    existing: impl IntoIterator<Item = &'a str>,
    router: bool,
) -> Option<(i32, String)> {
    let always = if router {
        &[][..]
    } else {
        &MONGOD_DATABASES[..]
    };
    let existing: Vec<&str> = existing.into_iter().chain(always.iter().copied()).collect();
    if existing.contains(&db) {
        return None;
    }
    let reserved = ["admin", "local", "config"]
        .iter()
        .any(|name| db.eq_ignore_ascii_case(name));
    if router && reserved && db != "admin" && db != "config" {
        let message = format!("Cannot manually create database '{db}'");
        return Some((INVALID_OPTIONS, message));
    }
    // The server names the first of them in its order (bytes).
    let have = existing
        .into_iter()
        .filter(|name| name.eq_ignore_ascii_case(db))
        .min()?;
    let message = if router {
        format!("can't have 2 databases that just differ on case  have: {have} want to add: {db}")
    } else {
        format!(
            "db already exists with different case already have: [{have}] trying to create [{db}]"
        )
    };
    Some((DATABASE_DIFFER_CASE, message))
}

/// Whether `validDBName` takes `db` (it refuses all that the parse does).
pub(crate) fn valid(db: &str) -> bool {
    !db.is_empty() && db.len() <= MAX_DATABASE_NAME_LENGTH && !db.contains(REFUSED_CHARACTERS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal_message(refusal: Option<Document>) -> Option<String> {
        refusal.map(|r| {
            assert_eq!(r.get_i32("code").ok(), Some(73));
            assert_eq!(r.get_str("codeName").ok(), Some("InvalidNamespace"));
            r.get_str("errmsg").unwrap().to_owned()
        })
    }

    /// House rule 7 (review32 R4): the parse refuses `.`, NUL and over 63 bytes, in that order,
    /// with the server's messages; it takes everything else, the empty name included.
    #[test]
    fn parse_refuses_dot_nul_and_length_as_a_server_does_house_rule_7() {
        let long = "d".repeat(64);
        let cases = [
            (
                "te.st",
                Some("'.' is an invalid character in a db name: te.st".to_owned()),
            ),
            (
                "a.b\0",
                Some("'.' is an invalid character in a db name: a.b\0".to_owned()),
            ),
            (
                "te\0st",
                Some("database names cannot have embedded null characters".to_owned()),
            ),
            (
                &long,
                Some("db name must be at most 63 characters, found: 64".to_owned()),
            ),
            (&long[..63], None),
            ("", None),
            ("a b", None),
            ("test", None),
        ];
        for (db, expected) in cases {
            assert_eq!(refusal_message(parse_refusal(db)), expected, "{db:?}");
        }
    }

    /// House rule 7 (review32 R4): `validDBName` refuses the empty name, over 63 bytes, and NUL,
    /// `/`, `\`, `.`, space and `"`; `$` and other punctuation pass.
    #[test]
    fn validity_refuses_what_valid_db_name_refuses_house_rule_7() {
        let long = "d".repeat(64);
        for db in [
            "",
            "a/b",
            "a\\b",
            "a.b",
            "a b",
            "a\"b",
            "te\0st",
            long.as_str(),
        ] {
            assert_eq!(
                refusal_message(validity_refusal(db, false)),
                Some(format!("Invalid database name: '{db}'")),
                "{db:?}"
            );
            assert!(!valid(db), "{db:?}");
        }
        for db in ["test", "$external", "a-b_c", "a:b*c?", &long[..63], "é"] {
            assert_eq!(validity_refusal(db, true), None, "{db:?}");
            assert!(valid(db), "{db:?}");
        }
    }

    /// House rule 7 (review34 Y4): a write to or the creation of a collection in a database
    /// whose name holds `$` is InvalidNamespace (73), "Invalid namespace: {ns}"; other names
    /// pass, and `$` in the collection's name is not this check's.
    #[test]
    fn a_dollar_in_the_database_name_refuses_writes_house_rule_7() {
        for ns in ["a$b.c", "$db.c", "db$.c.d"] {
            assert_eq!(
                refusal_message(write_refusal(ns).map(|(code, m)| error_reply(code, &m))),
                Some(format!("Invalid namespace: {ns}")),
                "{ns}"
            );
        }
        for ns in ["test.c", "test.c$d", "a-b.c"] {
            assert_eq!(write_refusal(ns), None, "{ns}");
        }
    }

    /// House rule 7 (review34 Y4, review36 V3): a mongod refuses a database differing only in
    /// case from one it has (DatabaseDifferCase 13297), `admin`, `local` and `config` included
    /// (`DatabaseHolderImpl::openDb`), naming the first in byte order; a router with its own
    /// message; the same name or another passes.
    #[test]
    fn a_database_differing_only_in_case_is_refused_house_rule_7() {
        let existing = ["tEST", "TEST", "other"];
        let mongod = creation_refusal("Test", existing, false);
        assert_eq!(
            mongod,
            Some((
                13297,
                "db already exists with different case already have: [TEST] trying to create \
                 [Test]"
                    .to_owned()
            ))
        );
        let router = creation_refusal("Test", existing, true);
        assert_eq!(
            router,
            Some((
                13297,
                "can't have 2 databases that just differ on case  have: TEST want to add: Test"
                    .to_owned()
            ))
        );
        for (db, have) in [("Admin", "admin"), ("LOCAL", "local"), ("Config", "config")] {
            assert_eq!(
                creation_refusal(db, [], false),
                Some((
                    13297,
                    format!(
                        "db already exists with different case already have: [{have}] trying \
                         to create [{db}]"
                    )
                ))
            );
        }
        for router in [false, true] {
            assert_eq!(creation_refusal("tEST", existing, router), None);
            assert_eq!(creation_refusal("fresh", existing, router), None);
        }
        for db in ["admin", "local", "config"] {
            assert_eq!(creation_refusal(db, [], false), None);
        }
    }

    /// House rule 7 (review34 Y4): a router refuses to create `admin`, `local` or `config` in
    /// another case (InvalidOptions 72); `config` itself and `admin` itself pass.
    #[test]
    fn a_router_refuses_the_reserved_names_in_another_case_house_rule_7() {
        for db in ["Admin", "ADMIN", "Local", "Config", "cOnFiG"] {
            assert_eq!(
                creation_refusal(db, [], true),
                Some((72, format!("Cannot manually create database '{db}'"))),
                "{db}"
            );
        }
        for db in ["admin", "config", "admins"] {
            assert_eq!(creation_refusal(db, [], true), None, "{db}");
        }
    }

    /// House rule 7 (review32 R4): a router refuses `local` (IllegalOperation, 20); a mongod
    /// takes it.
    #[test]
    fn a_router_refuses_the_local_database_house_rule_7() {
        let refused = validity_refusal("local", true).expect("refused");
        assert_eq!(refused.get_i32("code").ok(), Some(20));
        assert_eq!(
            refused.get_str("errmsg").ok(),
            Some("Can't use 'local' database through mongos")
        );
        assert_eq!(validity_refusal("local", false), None);
        assert_eq!(validity_refusal("Local", true), None);
    }
}
