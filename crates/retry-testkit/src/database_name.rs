//! What a real server refuses about the database a command names in `$db` (review32 R4, house
//! rule 7: the test server is at least as strict as a real one). All are InvalidNamespace (73).
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
//!   `/`, `\`, `.`, a space or `"`; `$` passes (the server calls it with
//!   `DollarInDbNameBehavior::Allow`). The characters only a Windows build refuses are taken, as
//!   on the Linux servers the tests stand in for. A router checks first that the database is not
//!   `local`: IllegalOperation (20), "Can't use 'local' database through mongos".

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
