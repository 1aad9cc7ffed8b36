//! The `$readPreference` global argument a command carries, by topology and server type
//! (SS-8, SS-9, LB-6, WP-5).
//!
//! Selection uses the read preference to pick a server; this module decides what the chosen
//! server is *told*, which differs by deployment:
//!
//! - replica set (with or without primary): every mode except `primary` is sent; `primary` is
//!   never sent;
//! - sharded and load-balanced (LB-6), and a direct connection to a mongos: passed through to the
//!   mongos / load balancer, every mode except `primary` (SS-9);
//! - a direct connection (topology Single) to a standalone: never sent (SS-8);
//! - a direct connection to any other server type: `{mode: "primaryPreferred"}` when the
//!   application's mode is `primary` (or unset), so a secondary accepts the read; otherwise the
//!   application's preference as it is (SS-8);
//! - writes: never sent.
//!
//! The document has `mode`, then `tags` when tag sets were given (`[{}]`-only sets included, as
//! the user wrote them) and `maxStalenessSeconds` when set. The deprecated `hedge` is never sent,
//! since [`ReadPreference`] does not carry one (SS-2: only when the user set it).

use alloc::vec::Vec;

use bson::{Bson, Document};

use crate::bson_write::WriteError;
use crate::selection::{ReadPreference, ReadPreferenceMode, SelectionCriteria};
use crate::topology::{ServerType, TopologyType};

/// The `$readPreference` document to add to a command selected with `criteria` and sent to a
/// server of `server_type` in a topology of `topology_type`, or `None` when the rules above say
/// nothing is sent.
pub fn read_preference_document(
    criteria: &SelectionCriteria,
    topology_type: TopologyType,
    server_type: ServerType,
) -> Option<Document> {
    sent_preference(criteria, topology_type, server_type).map(to_document)
}

/// The document of what is sent.
pub(crate) fn to_document(sent: Sent<'_>) -> Document {
    match sent {
        Sent::Preference(preference) => document(preference),
        Sent::PrimaryPreferred => document(&ReadPreference::from_mode(
            ReadPreferenceMode::PrimaryPreferred,
        )),
    }
}

/// What the rules above send: the application's preference, or `primaryPreferred` in its place
/// (SS-8).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Sent<'a> {
    /// The application's preference as it is.
    Preference(&'a ReadPreference),
    /// `{mode: "primaryPreferred"}` for a `primary` read on a direct connection (SS-8).
    PrimaryPreferred,
}

/// The rules above: what is sent to a server of `server_type` in a topology of `topology_type`
/// for a command selected with `criteria`, `None` for nothing.
pub(crate) fn sent_preference(
    criteria: &SelectionCriteria,
    topology_type: TopologyType,
    server_type: ServerType,
) -> Option<Sent<'_>> {
    let SelectionCriteria::Read(preference) = criteria else {
        return None;
    };
    let primary = preference.mode() == ReadPreferenceMode::Primary;
    match (topology_type, server_type) {
        (TopologyType::Single, ServerType::Standalone) => None,
        (TopologyType::Single, ServerType::Mongos | ServerType::LoadBalancer) if primary => None,
        (TopologyType::Single, ServerType::Mongos | ServerType::LoadBalancer) => {
            Some(Sent::Preference(preference))
        }
        (TopologyType::Single, _) if primary => Some(Sent::PrimaryPreferred),
        (TopologyType::Single, _) => Some(Sent::Preference(preference)),
        (_, ServerType::Standalone) => None,
        _ if primary => None,
        _ => Some(Sent::Preference(preference)),
    }
}

/// Appends `sent` as the element `$readPreference`: the bytes of [`read_preference_document`]'s
/// document as that element, written without building the document when the preference is
/// only a mode (issue 9: the usual case, a `$readPreference` to a mongos or a secondary).
/// A tag with a NUL byte in its key cannot be written, as with the document.
pub(crate) fn append_element(sent: Sent<'_>, out: &mut Vec<u8>) -> Result<(), WriteError> {
    let mode = match sent {
        Sent::Preference(p) if !p.tag_sets().is_empty() || p.max_staleness().is_some() => {
            let value = Bson::Document(document(p));
            return crate::bson_write::element("$readPreference", &value, out);
        }
        Sent::Preference(p) => p.mode().as_str(),
        Sent::PrimaryPreferred => ReadPreferenceMode::PrimaryPreferred.as_str(),
    };
    // {mode: <mode>}: int32 length, a string element, the closing 0.
    let length = 4 + (1 + 5 + 4 + mode.len() + 1) + 1;
    out.push(0x03);
    out.extend_from_slice(b"$readPreference\0");
    out.extend_from_slice(&(length as i32).to_le_bytes());
    out.push(0x02);
    out.extend_from_slice(b"mode\0");
    out.extend_from_slice(&((mode.len() + 1) as i32).to_le_bytes());
    out.extend_from_slice(mode.as_bytes());
    out.push(0);
    out.push(0);
    Ok(())
}

/// The read preference document structure: `mode`, `tags`, `maxStalenessSeconds`.
fn document(preference: &ReadPreference) -> Document {
    let mut doc = Document::new();
    doc.insert("mode", preference.mode().as_str());
    if !preference.tag_sets().is_empty() {
        let tags: Vec<Bson> = preference
            .tag_sets()
            .iter()
            .map(|set| {
                let mut tags = Document::new();
                for (k, v) in set.iter() {
                    tags.insert(k, v);
                }
                Bson::Document(tags)
            })
            .collect();
        doc.insert("tags", tags);
    }
    if let Some(staleness) = preference.max_staleness() {
        let seconds = i64::try_from(staleness.as_secs()).unwrap_or(i64::MAX);
        doc.insert(
            "maxStalenessSeconds",
            i32::try_from(seconds).map_or(Bson::Int64(seconds), Bson::Int32),
        );
    }
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::TagSet;
    use bson::doc;
    use ReadPreferenceMode::*;
    use ServerType::{
        LoadBalancer, Mongos, RsArbiter, RsGhost, RsOther, RsPrimary, RsSecondary, Standalone,
    };
    use TopologyType::{LoadBalanced, ReplicaSetNoPrimary, ReplicaSetWithPrimary, Sharded, Single};

    fn read(mode: ReadPreferenceMode) -> SelectionCriteria {
        SelectionCriteria::Read(ReadPreference::from_mode(mode))
    }

    #[test]
    fn ss9_replica_sets_send_every_mode_but_primary() {
        for topology in [ReplicaSetWithPrimary, ReplicaSetNoPrimary] {
            for server in [RsPrimary, RsSecondary] {
                assert_eq!(
                    read_preference_document(&read(Primary), topology, server),
                    None
                );
                for mode in [PrimaryPreferred, Secondary, SecondaryPreferred, Nearest] {
                    assert_eq!(
                        read_preference_document(&read(mode), topology, server),
                        Some(doc! { "mode": mode.as_str() }),
                        "{topology:?} {server:?} {mode:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn ss9_lb6_mongos_and_load_balancers_get_the_preference_passed_through() {
        let mut tags = TagSet::new();
        tags.insert("dc", "ny");
        let preference =
            ReadPreference::new(Secondary, vec![tags, TagSet::new()], Some(120)).unwrap();
        let criteria = SelectionCriteria::Read(preference);
        let expected = doc! { "mode": "secondary", "tags": [{ "dc": "ny" }, {}],
        "maxStalenessSeconds": 120 };
        for (topology, server) in [
            (Sharded, Mongos),
            (LoadBalanced, LoadBalancer),
            (Single, Mongos),
        ] {
            assert_eq!(
                read_preference_document(&criteria, topology, server),
                Some(expected.clone()),
                "{topology:?}"
            );
            assert_eq!(
                read_preference_document(&read(Primary), topology, server),
                None
            );
            assert_eq!(
                read_preference_document(&read(SecondaryPreferred), topology, server),
                Some(doc! { "mode": "secondaryPreferred" })
            );
        }
    }

    #[test]
    fn ss8_direct_connections_to_a_non_mongos_read_primary_preferred() {
        for server in [
            RsSecondary,
            RsPrimary,
            RsArbiter,
            RsOther,
            RsGhost,
            ServerType::Unknown,
        ] {
            assert_eq!(
                read_preference_document(&read(Primary), Single, server),
                Some(doc! { "mode": "primaryPreferred" }),
                "{server:?}"
            );
            assert_eq!(
                read_preference_document(&read(Nearest), Single, server),
                Some(doc! { "mode": "nearest" })
            );
        }
    }

    #[test]
    fn ss8_standalones_and_writes_never_get_one() {
        assert_eq!(
            read_preference_document(&read(Secondary), Single, Standalone),
            None
        );
        assert_eq!(
            read_preference_document(&read(Primary), Single, Standalone),
            None
        );
        for (topology, server) in [
            (Single, RsSecondary),
            (Sharded, Mongos),
            (ReplicaSetWithPrimary, RsPrimary),
            (LoadBalanced, LoadBalancer),
        ] {
            assert_eq!(
                read_preference_document(&SelectionCriteria::Write, topology, server),
                None
            );
        }
    }

    /// SS-8, SS-9, LB-6 (issue 9): the element written without building the document has the
    /// bytes of the document's element, for every mode, with and without tag sets (`[{}]`
    /// included) and a maximum staleness, on every kind of server it goes to.
    #[test]
    fn ss9_the_appended_element_is_the_documents_bytes() {
        let mut tags = TagSet::new();
        tags.insert("dc", "ny");
        let mut preferences = alloc::vec::Vec::new();
        for mode in [
            Primary,
            PrimaryPreferred,
            Secondary,
            SecondaryPreferred,
            Nearest,
        ] {
            preferences.push(ReadPreference::from_mode(mode));
            if mode != Primary {
                for sets in [alloc::vec![tags.clone()], alloc::vec![TagSet::new()]] {
                    preferences.push(ReadPreference::new(mode, sets, None).unwrap());
                }
                preferences.push(ReadPreference::new(mode, alloc::vec![], Some(120)).unwrap());
            }
        }
        let mut sent = 0;
        for preference in preferences {
            let criteria = SelectionCriteria::Read(preference);
            for (topology, server) in [
                (Single, RsSecondary),
                (Single, Mongos),
                (Sharded, Mongos),
                (ReplicaSetWithPrimary, RsSecondary),
                (LoadBalanced, LoadBalancer),
            ] {
                let Some(document) = read_preference_document(&criteria, topology, server) else {
                    continue;
                };
                let mut expected = alloc::vec::Vec::new();
                crate::bson_write::element(
                    "$readPreference",
                    &Bson::Document(document),
                    &mut expected,
                )
                .unwrap();
                let mut written = alloc::vec::Vec::new();
                let what = sent_preference(&criteria, topology, server).unwrap();
                append_element(what, &mut written).unwrap();
                assert_eq!(written, expected, "{criteria:?} {topology:?} {server:?}");
                sent += 1;
            }
        }
        assert!(sent > 40, "{sent}");
    }
}
