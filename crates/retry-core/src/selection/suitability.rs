//! Which servers are suitable for an operation: deprioritization (SS-11), topology and server
//! types (SS-3, SS-7, SS-8, SS-9), staleness (SS-5) and tag sets (SS-6).

use core::time::Duration;

use super::{
    ReadPreference, ReadPreferenceError, ReadPreferenceMode, SelectionCriteria, ServerList,
};
use crate::address::ServerAddress;
use crate::time::duration_nanos;
use crate::topology::{ServerDescription, ServerType, TagSet, TopologyDescription, TopologyType};

/// SS-11: the suitable servers for `criteria`, avoiding `deprioritized` addresses when possible.
///
/// Servers whose address is deprioritized are dropped first (compared by address only), then the
/// topology and read-preference rules run on what is left, mode fallbacks included (SS-12). If that
/// yields nothing, the rules run again on every server. The staleness reference (the primary, or
/// the freshest secondary) always comes from the whole topology. In a replica set, a maximum
/// staleness below the minimum is an error (SS-2). Allocation-free when the topology has at most
/// [`super::INLINE_SERVERS`] servers.
pub fn suitable_servers<'a>(
    topology: &'a TopologyDescription,
    criteria: &SelectionCriteria,
    deprioritized: &[ServerAddress],
    heartbeat_frequency: Duration,
) -> Result<ServerList<'a>, ReadPreferenceError> {
    let mut suitable = ServerList::new();
    suitable_servers_into(
        topology,
        criteria,
        deprioritized,
        heartbeat_frequency,
        &mut suitable,
    )?;
    Ok(suitable)
}

/// [`suitable_servers`] writing into `out` (cleared first), so the pipeline moves no lists.
pub(super) fn suitable_servers_into<'a>(
    topology: &'a TopologyDescription,
    criteria: &SelectionCriteria,
    deprioritized: &[ServerAddress],
    heartbeat_frequency: Duration,
    out: &mut ServerList<'a>,
) -> Result<(), ReadPreferenceError> {
    out.clear();
    let is_replica_set = matches!(
        topology.topology_type,
        TopologyType::ReplicaSetNoPrimary | TopologyType::ReplicaSetWithPrimary
    );
    // SS-5: the staleness reference is needed only for a maximum staleness.
    let staleness = match criteria {
        SelectionCriteria::Read(rp) if rp.max_staleness().is_some() => {
            if is_replica_set {
                rp.check_max_staleness(heartbeat_frequency)?;
            }
            Some(StalenessReference::of(topology, heartbeat_frequency))
        }
        _ => None,
    };
    if !deprioritized.is_empty() {
        let preferred = Pool {
            servers: &topology.servers,
            avoid: deprioritized,
        };
        preferred.suitable(topology.topology_type, criteria, staleness.as_ref(), out);
        if !out.is_empty() {
            return Ok(());
        }
    }
    let all = Pool {
        servers: &topology.servers,
        avoid: &[],
    };
    all.suitable(topology.topology_type, criteria, staleness.as_ref(), out);
    Ok(())
}

/// The servers one pass of SS-11 looks at: the topology's, less the `avoid` addresses.
struct Pool<'a, 'b> {
    servers: &'a [ServerDescription],
    avoid: &'b [ServerAddress],
}

impl<'a> Pool<'a, '_> {
    /// Appends the servers of the pool that satisfy `keep` to `out`, in topology order. At most
    /// one allocation, and none up to [`super::INLINE_SERVERS`] servers.
    fn collect(&self, keep: impl Fn(&ServerDescription) -> bool, out: &mut ServerList<'a>) {
        if self.servers.len() > out.inline_size() {
            out.reserve(self.servers.len());
        }
        for s in self.servers {
            if keep(s) && !self.avoid.contains(&s.address) {
                out.push(s);
            }
        }
    }

    /// The topology rules (SS-7 for writes; SS-3, SS-8, SS-9 for reads), appended to the empty
    /// `out`.
    fn suitable(
        &self,
        topology_type: TopologyType,
        criteria: &SelectionCriteria,
        staleness: Option<&StalenessReference>,
        out: &mut ServerList<'a>,
    ) {
        let of_type =
            |t: ServerType, out: &mut ServerList<'a>| self.collect(|s| s.server_type == t, out);
        match (topology_type, criteria) {
            (TopologyType::Unknown, _) => {}
            (TopologyType::Single, _) => self.collect(ServerDescription::is_available, out),
            (TopologyType::Sharded, _) => of_type(ServerType::Mongos, out),
            (TopologyType::LoadBalanced, _) => of_type(ServerType::LoadBalancer, out),
            (
                TopologyType::ReplicaSetNoPrimary | TopologyType::ReplicaSetWithPrimary,
                SelectionCriteria::Write,
            ) => of_type(ServerType::RsPrimary, out),
            (
                TopologyType::ReplicaSetNoPrimary | TopologyType::ReplicaSetWithPrimary,
                SelectionCriteria::Read(rp),
            ) => self.replica_set_read(rp, staleness, out),
        }
    }

    /// SS-3: a replica-set read by mode, with the primaryPreferred / secondaryPreferred
    /// fallbacks, appended to the empty `out`. `staleness` is present when `rp` has a maximum
    /// staleness.
    fn replica_set_read(
        &self,
        rp: &ReadPreference,
        staleness: Option<&StalenessReference>,
        out: &mut ServerList<'a>,
    ) {
        let primaries = |out: &mut ServerList<'a>| {
            self.collect(|s| s.server_type == ServerType::RsPrimary, out)
        };
        let eligible = |with_primary: bool, out: &mut ServerList<'a>| {
            self.collect(
                |s| {
                    s.server_type == ServerType::RsSecondary
                        || (with_primary && s.server_type == ServerType::RsPrimary)
                },
                out,
            );
            if let (Some(max), Some(staleness)) = (rp.max_staleness(), staleness) {
                out.retain(|s| staleness.is_fresh(s, max));
            }
            retain_matching_tags(out, rp.tag_sets());
        };
        match rp.mode() {
            ReadPreferenceMode::Primary => primaries(out),
            ReadPreferenceMode::Secondary => eligible(false, out),
            ReadPreferenceMode::Nearest => eligible(true, out),
            ReadPreferenceMode::SecondaryPreferred => {
                eligible(false, out);
                if out.is_empty() {
                    primaries(out);
                }
            }
            ReadPreferenceMode::PrimaryPreferred => {
                primaries(out);
                if out.is_empty() {
                    eligible(false, out);
                }
            }
        }
    }
}

/// SS-6: the first tag set that matches at least one candidate decides; no match leaves none; an
/// empty list keeps all.
fn retain_matching_tags(candidates: &mut ServerList<'_>, tag_sets: &[TagSet]) {
    if tag_sets.is_empty() {
        return;
    }
    match tag_sets
        .iter()
        .find(|set| candidates.iter().any(|s| set.matches(&s.tags)))
    {
        Some(set) => candidates.retain(|s| set.matches(&s.tags)),
        None => candidates.clear(),
    }
}

/// SS-5: what a secondary's staleness is measured against.
enum StalenessReference {
    /// With a primary P: `(S.lastUpdateTime − S.lastWriteDate) − (P.lastUpdateTime −
    /// P.lastWriteDate) + heartbeatFrequencyMS`; holds `P`'s lag minus the heartbeat, in ns.
    Primary { lag_minus_heartbeat: i128 },
    /// Without one: `SMax.lastWriteDate − S.lastWriteDate + heartbeatFrequencyMS`; holds
    /// `SMax.lastWriteDate + heartbeatFrequencyMS`, in ns.
    FreshestSecondary { last_write_plus_heartbeat: i128 },
}

impl StalenessReference {
    fn of(topology: &TopologyDescription, heartbeat_frequency: Duration) -> StalenessReference {
        let heartbeat = i128::from(duration_nanos(heartbeat_frequency));
        let primary = topology
            .servers
            .iter()
            .find(|s| s.server_type == ServerType::RsPrimary);
        match (topology.topology_type, primary) {
            (TopologyType::ReplicaSetWithPrimary, Some(p)) => StalenessReference::Primary {
                lag_minus_heartbeat: lag(p) - heartbeat,
            },
            _ => StalenessReference::FreshestSecondary {
                last_write_plus_heartbeat: topology
                    .servers
                    .iter()
                    .filter(|s| s.server_type == ServerType::RsSecondary)
                    .map(last_write_nanos)
                    .max()
                    .unwrap_or(0)
                    + heartbeat,
            },
        }
    }

    /// SS-5: whether `server`'s staleness is at most `max`. Only secondaries can be stale.
    fn is_fresh(&self, server: &ServerDescription, max: Duration) -> bool {
        if server.server_type != ServerType::RsSecondary {
            return true;
        }
        let staleness = match *self {
            StalenessReference::Primary {
                lag_minus_heartbeat,
            } => lag(server) - lag_minus_heartbeat,
            StalenessReference::FreshestSecondary {
                last_write_plus_heartbeat,
            } => last_write_plus_heartbeat - last_write_nanos(server),
        };
        staleness <= i128::from(duration_nanos(max))
    }
}

/// `lastWriteDate` in nanoseconds since the Unix epoch (0 when unknown).
fn last_write_nanos(server: &ServerDescription) -> i128 {
    server
        .last_write_date
        .map_or(0, |d| i128::from(d.timestamp_millis()) * 1_000_000)
}

/// `lastUpdateTime − lastWriteDate` in nanoseconds. The two clocks differ (the engine's and the
/// server's), which is why the formula only ever subtracts two such lags.
fn lag(server: &ServerDescription) -> i128 {
    i128::from(server.last_update_time.as_nanos()) - last_write_nanos(server)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Instant;
    use alloc::vec;
    use alloc::vec::Vec;

    const HB: Duration = Duration::from_secs(10);

    fn server(host: &str, server_type: ServerType, tags: &[(&str, &str)]) -> ServerDescription {
        ServerDescription {
            server_type,
            tags: tags.iter().copied().collect(),
            ..ServerDescription::unknown(ServerAddress::new(host, 27017))
        }
    }

    fn rs(servers: Vec<ServerDescription>) -> TopologyDescription {
        let has_primary = servers
            .iter()
            .any(|s| s.server_type == ServerType::RsPrimary);
        let t = if has_primary {
            TopologyType::ReplicaSetWithPrimary
        } else {
            TopologyType::ReplicaSetNoPrimary
        };
        TopologyDescription::new(t, servers)
    }

    fn read(mode: ReadPreferenceMode, tags: &[&[(&str, &str)]]) -> SelectionCriteria {
        let tag_sets = tags.iter().map(|t| t.iter().copied().collect()).collect();
        SelectionCriteria::Read(ReadPreference::new(mode, tag_sets, None).unwrap())
    }

    fn hosts(list: &ServerList<'_>) -> Vec<String> {
        list.iter().map(|s| s.address.host().into()).collect()
    }

    use alloc::string::String;

    fn addr(host: &str) -> ServerAddress {
        ServerAddress::new(host, 27017)
    }

    #[test]
    fn ss3_modes_and_their_fallbacks() {
        use ReadPreferenceMode::*;
        let t = rs(vec![
            server("a", ServerType::RsPrimary, &[]),
            server("b", ServerType::RsSecondary, &[("dc", "ny")]),
            server("c", ServerType::RsSecondary, &[("dc", "sf")]),
            server("d", ServerType::RsArbiter, &[]),
        ]);
        let run = |c| hosts(&suitable_servers(&t, &c, &[], HB).unwrap());
        assert_eq!(run(read(Primary, &[])), ["a"]);
        assert_eq!(run(read(Secondary, &[])), ["b", "c"]);
        assert_eq!(run(read(Nearest, &[])), ["a", "b", "c"]);
        assert_eq!(run(read(SecondaryPreferred, &[&[("dc", "sf")]])), ["c"]);
        assert_eq!(run(read(SecondaryPreferred, &[&[("dc", "la")]])), ["a"]);
        assert_eq!(run(read(PrimaryPreferred, &[&[("dc", "sf")]])), ["a"]);
        assert_eq!(run(SelectionCriteria::Write), ["a"]);
    }

    #[test]
    fn ss6_the_first_tag_set_matching_anything_decides() {
        use ReadPreferenceMode::Secondary;
        let t = rs(vec![
            server("b", ServerType::RsSecondary, &[("dc", "ny"), ("rack", "1")]),
            server("c", ServerType::RsSecondary, &[("dc", "ny"), ("rack", "2")]),
        ]);
        let run = |c| hosts(&suitable_servers(&t, &c, &[], HB).unwrap());
        assert_eq!(
            run(read(Secondary, &[&[("dc", "la")], &[("rack", "2")], &[]])),
            ["c"]
        );
        assert_eq!(
            run(read(Secondary, &[&[("dc", "la")], &[("dc", "ny")]])),
            ["b", "c"]
        );
        assert!(run(read(Secondary, &[&[("dc", "la")]])).is_empty());
        assert_eq!(run(read(Secondary, &[&[]])), ["b", "c"]);
    }

    #[test]
    fn ss11_deprioritized_servers_are_avoided_unless_nothing_else_is_suitable() {
        use ReadPreferenceMode::*;
        let t = rs(vec![
            server("a", ServerType::RsPrimary, &[]),
            server("b", ServerType::RsSecondary, &[]),
            server("c", ServerType::RsSecondary, &[]),
        ]);
        let run = |c, d: &[ServerAddress]| hosts(&suitable_servers(&t, &c, d, HB).unwrap());
        // SS-12: primaryPreferred with the primary deprioritized goes to the secondaries.
        assert_eq!(run(read(PrimaryPreferred, &[]), &[addr("a")]), ["b", "c"]);
        // SS-12: secondaryPreferred with every secondary deprioritized goes to the primary.
        assert_eq!(
            run(read(SecondaryPreferred, &[]), &[addr("b"), addr("c")]),
            ["a"]
        );
        // SS-12: everything deprioritized is plain selection.
        let all = [addr("a"), addr("b"), addr("c")];
        assert_eq!(run(read(SecondaryPreferred, &[]), &all), ["b", "c"]);
        // The only suitable server is chosen even when deprioritized.
        assert_eq!(run(read(Primary, &[]), &[addr("a")]), ["a"]);
        assert_eq!(run(SelectionCriteria::Write, &[addr("a")]), ["a"]);
    }

    #[test]
    fn ss7_ss8_ss9_other_topologies() {
        let sharded = TopologyDescription::new(
            TopologyType::Sharded,
            vec![
                server("a", ServerType::Mongos, &[]),
                server("b", ServerType::Mongos, &[]),
                server("c", ServerType::Unknown, &[]),
            ],
        );
        let secondary = read(ReadPreferenceMode::Secondary, &[&[("dc", "x")]]);
        let run = |t, c, d: &[ServerAddress]| hosts(&suitable_servers(t, &c, d, HB).unwrap());
        assert_eq!(run(&sharded, secondary.clone(), &[]), ["a", "b"]);
        assert_eq!(run(&sharded, SelectionCriteria::Write, &[addr("a")]), ["b"]);
        // The only other mongos is Unknown: fall back to the deprioritized one.
        assert_eq!(
            run(&sharded, SelectionCriteria::Write, &[addr("b"), addr("a")]),
            ["a", "b"]
        );

        let single = TopologyDescription::new(
            TopologyType::Single,
            vec![server("a", ServerType::RsSecondary, &[])],
        );
        assert_eq!(run(&single, SelectionCriteria::Write, &[]), ["a"]);
        assert_eq!(run(&single, secondary.clone(), &[addr("a")]), ["a"]);
        let single_unknown = TopologyDescription::new(
            TopologyType::Single,
            vec![server("a", ServerType::Unknown, &[])],
        );
        assert!(run(&single_unknown, SelectionCriteria::Write, &[]).is_empty());

        let lb = TopologyDescription::new(
            TopologyType::LoadBalanced,
            vec![ServerDescription::load_balancer(addr("lb"), Instant::ZERO)],
        );
        assert_eq!(run(&lb, secondary.clone(), &[addr("lb")]), ["lb"]);

        let unknown = TopologyDescription::new(
            TopologyType::Unknown,
            vec![server("a", ServerType::Standalone, &[])],
        );
        assert!(run(&unknown, secondary, &[]).is_empty());
        let no_primary = rs(vec![server("b", ServerType::RsSecondary, &[])]);
        assert!(run(&no_primary, SelectionCriteria::Write, &[]).is_empty());
    }

    fn with_writes(mut s: ServerDescription, update_ms: u64, write_ms: i64) -> ServerDescription {
        s.last_update_time = Instant::from_millis(update_ms);
        s.last_write_date = Some(bson::DateTime::from_millis(write_ms));
        s
    }

    #[test]
    fn ss5_staleness_with_a_primary_compares_lags() {
        // P lag 0; b lag 80 s → staleness 90 s (eligible at 90); c lag 80.001 s → 90.001 s.
        let t = rs(vec![
            with_writes(
                server("a", ServerType::RsPrimary, &[]),
                1_000_000,
                1_000_000,
            ),
            with_writes(
                server("b", ServerType::RsSecondary, &[]),
                1_000_000,
                920_000,
            ),
            with_writes(
                server("c", ServerType::RsSecondary, &[]),
                1_000_000,
                919_999,
            ),
        ]);
        let rp = ReadPreference::new(ReadPreferenceMode::Secondary, vec![], Some(90)).unwrap();
        let s = suitable_servers(&t, &SelectionCriteria::Read(rp), &[], HB).unwrap();
        assert_eq!(hosts(&s), ["b"]);
    }

    #[test]
    fn ss5_staleness_without_a_primary_uses_the_freshest_secondary() {
        let t = rs(vec![
            with_writes(server("a", ServerType::RsSecondary, &[]), 5, 200_000),
            with_writes(server("b", ServerType::RsSecondary, &[]), 5, 120_000),
            with_writes(server("c", ServerType::RsSecondary, &[]), 5, 119_999),
        ]);
        let rp = ReadPreference::new(ReadPreferenceMode::Nearest, vec![], Some(90)).unwrap();
        let s = suitable_servers(&t, &SelectionCriteria::Read(rp), &[], HB).unwrap();
        assert_eq!(hosts(&s), ["a", "b"]);
    }

    #[test]
    fn ss2_too_small_max_staleness_is_an_error_only_in_a_replica_set() {
        let rp = ReadPreference::new(ReadPreferenceMode::Nearest, vec![], Some(1)).unwrap();
        let criteria = SelectionCriteria::Read(rp);
        let rs = rs(vec![server("a", ServerType::Unknown, &[])]);
        assert!(matches!(
            suitable_servers(&rs, &criteria, &[], HB),
            Err(ReadPreferenceError::MaxStalenessTooSmall { .. })
        ));
        let sharded = TopologyDescription::new(
            TopologyType::Sharded,
            vec![server("a", ServerType::Mongos, &[])],
        );
        assert_eq!(
            hosts(&suitable_servers(&sharded, &criteria, &[], HB).unwrap()),
            ["a"]
        );
    }
}
