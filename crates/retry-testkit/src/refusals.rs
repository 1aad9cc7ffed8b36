//! What a real server refuses before it runs a command, about sessions and secondary reads
//! (house rule 7: the test server is at least as strict as a real one).
//!
//! - A `txnNumber` without an `lsid`: `InvalidOptions` (72), "Transaction number requires a session
//!   ID to also be specified".
//! - A `txnNumber` on a standalone: `IllegalOperation` (20), "Transaction numbers are only allowed
//!   on a replica set member or mongos" (RW-2, RW-16).
//! - An `lsid` that is not `{id: <binary>}`: `TypeMismatch` (14).
//! - A read on a secondary without a non-primary `$readPreference` (SS-9: OP_MSG's secondaryOk):
//!   `NotPrimaryNoSecondaryOk` (13435).

use bson::{Bson, Document};

use crate::config::Role;
use crate::fail_point::error_reply;

/// Reads a secondary serves only with a non-primary `$readPreference`.
const SECONDARY_READS: [&str; 6] = [
    "find",
    "aggregate",
    "count",
    "distinct",
    "listCollections",
    "listIndexes",
];

/// The error reply a real server gives `command` (named `name`) in `role` before running it, if
/// any.
pub(crate) fn refusal(role: &Role, name: &str, command: &Document) -> Option<Document> {
    if let Some(lsid) = command.get("lsid") {
        let well_formed =
            matches!(lsid, Bson::Document(d) if matches!(d.get("id"), Some(Bson::Binary(_))));
        if !well_formed {
            return Some(error_reply(
                14,
                "BSON field 'lsid.id' is the wrong type, expected type 'binData'",
            ));
        }
    }
    if command.contains_key("txnNumber") {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ReplicaSetMember;
    use bson::{doc, spec::BinarySubtype, Binary};

    fn lsid() -> Document {
        doc! { "id": Binary { subtype: BinarySubtype::Uuid, bytes: vec![0; 16] } }
    }

    fn code(reply: Option<Document>) -> Option<i32> {
        reply.and_then(|r| r.get_i32("code").ok())
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
}
