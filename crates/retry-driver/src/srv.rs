//! Initial DNS seedlist discovery (`mongodb+srv`, SRV-1..SRV-6): the rules, as pure functions
//! of the connection string and the DNS answers, and [`resolve_seedlist`], which asks a
//! [`Runtime`] for those answers. Any resolver (or a test's fake one) feeds the same rules.
//!
//! Hosts under 3 labels are allowed (SRV-2), TLS defaults on (TL-1, in
//! [`crate::ClientOptions::from_connection_string`]), and `srvMaxHosts` picks hosts with the
//! core's seeded Fisher–Yates shuffle ([`choose_srv_hosts`]), so a pinned seed picks the same
//! hosts. A resolved URI carries [`SrvPolling`]: the engine decides when to rescan and what the
//! answer does (`retry_core::topology::SrvPoller`); `rescan` is the lookup the driver makes for
//! it.

use std::io;

use core::time::Duration;

use retry_core::address::ServerAddress;
use retry_core::rng::EngineRng;
use retry_core::topology::choose_srv_hosts;

use crate::connection_string::{ConnectionString, Host, HostKind};
use crate::options::OptionsError;
use crate::runtime::Runtime;

/// One SRV answer: a target host and port (priority and weight are ignored, SRV-2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrvRecord {
    /// The target host name (a trailing `.` is allowed).
    pub target: String,
    /// The target port.
    pub port: u16,
    /// The record's TTL, when the resolver reports it: SRV polling rescans after the lowest TTL
    /// of the last answer, but no sooner than 60 s (every 60 s without TTLs).
    pub ttl: Option<core::time::Duration>,
}

/// The TXT options a seedlist may carry (SRV-5).
const TXT_OPTIONS: [&str; 3] = ["authSource", "replicaSet", "loadBalanced"];

/// SRV-2: the name whose SRV records list the hosts: `_{srvServiceName}._tcp.{hostname}`.
fn srv_query_name(hostname: &str, service_name: &str) -> String {
    format!("_{service_name}._tcp.{hostname}")
}

/// SRV-2: the domain every target must be in: the hostname minus its first label when it has at
/// least three labels, else the hostname itself.
fn parent_domain(hostname: &str) -> &str {
    let hostname = hostname.trim_end_matches('.');
    if hostname.split('.').count() >= 3 {
        hostname.split_once('.').map_or(hostname, |(_, rest)| rest)
    } else {
        hostname
    }
}

/// SRV-3: a target must end in `"." + domain` on a label boundary (so it also has more labels
/// than a hostname of under three labels).
fn check_target(hostname: &str, target: &str) -> Result<(), OptionsError> {
    let domain = parent_domain(hostname).to_ascii_lowercase();
    let target_name = target.trim_end_matches('.').to_ascii_lowercase();
    if target_name.ends_with(&format!(".{domain}")) {
        Ok(())
    } else {
        Err(OptionsError::new(
            "srv",
            target,
            format!("the SRV target is not in the domain {domain} of {hostname} (SRV-3)"),
        ))
    }
}

/// SRV-5: the options of the TXT records: none, or one record whose strings are joined in
/// order; only `authSource`, `replicaSet` and `loadBalanced` are allowed.
fn txt_options(hostname: &str, records: &[Vec<String>]) -> Result<Option<String>, OptionsError> {
    match records {
        [] => Ok(None),
        [record] => {
            let joined = record.concat();
            for pair in joined.split('&').filter(|p| !p.is_empty()) {
                let key = pair.split_once('=').map_or(pair, |(k, _)| k);
                if !TXT_OPTIONS.iter().any(|o| o.eq_ignore_ascii_case(key)) {
                    return Err(OptionsError::new(
                        "txt",
                        &joined,
                        format!(
                            "TXT records may only set authSource, replicaSet and loadBalanced, \
                             not '{key}' (SRV-5)"
                        ),
                    ));
                }
            }
            Ok(Some(joined))
        }
        _ => Err(OptionsError::new(
            "txt",
            hostname,
            format!(
                "{} TXT records; at most one is allowed (SRV-5)",
                records.len()
            ),
        )),
    }
}

/// What SRV polling needs of a resolved `mongodb+srv` URI: the name to rescan, the host name
/// whose domain the targets must be in (SRV-3), `srvMaxHosts` and the initial answer's lowest TTL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SrvPolling {
    /// The SRV name, `_{srvServiceName}._tcp.{hostname}` (SRV-2).
    pub query: String,
    /// The URI's host name.
    pub hostname: String,
    /// `srvMaxHosts` (0 = no limit, SRV-4).
    pub max_hosts: usize,
    /// The lowest TTL of the initial SRV records, when the resolver reported TTLs.
    pub initial_ttl: Option<Duration>,
}

/// The lowest TTL of `records`, if any reported one.
fn min_ttl(records: &[SrvRecord]) -> Option<Duration> {
    records.iter().filter_map(|r| r.ttl).min()
}

/// SRV-2..SRV-6: the connection string a `mongodb+srv` one stands for, given the answers to its
/// SRV and TXT queries: the records' hosts and ports as the seed list (at most `srvMaxHosts`,
/// shuffled by `seed`), the TXT options under the URI's own, then the URI checks again.
pub fn apply_seedlist(
    cs: &ConnectionString,
    srv: Vec<SrvRecord>,
    txt: &[Vec<String>],
    seed: u64,
) -> Result<ConnectionString, OptionsError> {
    let hostname = srv_hostname(cs)?;
    if srv.is_empty() {
        return Err(OptionsError::new(
            "srv",
            hostname,
            "the DNS has no SRV records for this name (SRV-2)",
        ));
    }
    for record in &srv {
        check_target(hostname, &record.target)?;
    }
    let txt = txt_options(hostname, txt)?;
    let max_hosts = match cs.option("srvMaxHosts") {
        Some(crate::OptionValue::Int(n)) => usize::try_from(*n).unwrap_or(0),
        _ => 0,
    };
    let polling = SrvPolling {
        query: srv_query_name(hostname, service_name(cs)),
        hostname: hostname.to_string(),
        max_hosts,
        initial_ttl: min_ttl(&srv),
    };
    let chosen = choose_srv_hosts(srv, max_hosts, &mut EngineRng::from_seed_u64(seed));
    let hosts = chosen
        .into_iter()
        .map(|record| Host {
            host: record.target.trim_end_matches('.').to_string(),
            port: Some(record.port),
            kind: HostKind::Hostname,
        })
        .collect();
    let mut resolved = cs.with_seedlist(hosts, txt.as_deref())?;
    resolved.srv_polling = Some(polling);
    Ok(resolved)
}

/// `srvServiceName`, `mongodb` by default (SRV-2).
fn service_name(cs: &ConnectionString) -> &str {
    match cs.option("srvServiceName") {
        Some(crate::OptionValue::Str(name)) => name.as_str(),
        _ => "mongodb",
    }
}

/// One SRV rescan for the engine (`Engine::poll_srv_rescan`): the targets of `polling.query`
/// in the parent domain, as addresses, and their lowest TTL. A DNS error, no records, or no
/// target in the domain give no hosts: the engine then keeps its topology (SP-3). Targets
/// outside the domain are dropped without an error (SRV-3 as the polling spec applies it).
pub(crate) async fn rescan(
    runtime: &dyn Runtime,
    polling: &SrvPolling,
) -> (Vec<ServerAddress>, Option<Duration>) {
    let Ok(records) = runtime.resolve_srv(polling.query.clone()).await else {
        return (Vec::new(), None);
    };
    let valid: Vec<SrvRecord> = records
        .into_iter()
        .filter(|r| check_target(&polling.hostname, &r.target).is_ok())
        .collect();
    let ttl = min_ttl(&valid);
    let hosts = valid
        .iter()
        .map(|r| ServerAddress::new(r.target.trim_end_matches('.'), r.port))
        .collect();
    (hosts, ttl)
}

/// The one host name of a `mongodb+srv` connection string (SRV-1).
fn srv_hostname(cs: &ConnectionString) -> Result<&str, OptionsError> {
    match (cs.srv, cs.hosts.as_slice()) {
        (true, [host]) => Ok(&host.host),
        _ => Err(OptionsError::new(
            "uri",
            "",
            "not a mongodb+srv connection string with one host (SRV-1)",
        )),
    }
}

/// SRV-2: asks `runtime` for the SRV and TXT records of a `mongodb+srv` connection string (both
/// before connecting anywhere) and applies them ([`apply_seedlist`]). DNS errors name the query.
pub async fn resolve_seedlist(
    runtime: &dyn Runtime,
    cs: &ConnectionString,
    seed: u64,
) -> Result<ConnectionString, OptionsError> {
    let hostname = srv_hostname(cs)?;
    let query = srv_query_name(hostname, service_name(cs));
    let dns_error = |name: &str, error: io::Error| {
        OptionsError::new("srv", name, format!("DNS lookup failed: {error}"))
    };
    let srv = runtime
        .resolve_srv(query.clone())
        .await
        .map_err(|e| dns_error(&query, e))?;
    let txt = match runtime.resolve_txt(hostname.to_string()).await {
        Ok(records) => records,
        // No TXT record is fine; a failed query is not.
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(dns_error(hostname, e)),
    };
    apply_seedlist(cs, srv, &txt, seed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClientOptions;

    fn record(target: &str, port: u16) -> SrvRecord {
        SrvRecord {
            target: target.into(),
            port,
            ttl: None,
        }
    }

    fn resolve(
        uri: &str,
        srv: &[(&str, u16)],
        txt: &[&[&str]],
    ) -> Result<ClientOptions, OptionsError> {
        let cs = ConnectionString::parse(uri)?;
        let srv = srv.iter().map(|(t, p)| record(t, *p)).collect();
        let txt: Vec<Vec<String>> = txt
            .iter()
            .map(|r| r.iter().map(|s| s.to_string()).collect())
            .collect();
        ClientOptions::from_connection_string(&apply_seedlist(&cs, srv, &txt, 7)?)
    }

    #[test]
    fn srv2_the_query_name_and_the_parent_domain() {
        assert_eq!(
            srv_query_name("cluster0.example.com", "mongodb"),
            "_mongodb._tcp.cluster0.example.com"
        );
        assert_eq!(
            srv_query_name("a.example.com", "customname"),
            "_customname._tcp.a.example.com"
        );
        assert_eq!(parent_domain("cluster0.example.com"), "example.com");
        assert_eq!(parent_domain("example.com"), "example.com");
        assert_eq!(parent_domain("localhost"), "localhost");
    }

    #[test]
    fn srv3_targets_must_be_in_the_parent_domain_on_a_label_boundary() {
        check_target("cluster0.example.com", "node1.example.com.").unwrap();
        check_target("cluster0.example.com", "a.b.EXAMPLE.com").unwrap();
        // prose 1..4: fewer than three labels are fine, but the target needs one more label.
        check_target("localhost", "test.localhost").unwrap();
        check_target("mongo.local", "test_1.mongo.local").unwrap();
        for (host, target) in [
            ("localhost", "localhost"),
            ("mongo.local", "mongo.local"),
            ("localhost", "localhost.mongodb"),
            ("localhost", "test_1.cluster_1localhost"),
            ("mongo.local", "test_1.my_hostmongo.local"),
            ("blogs.mongodb.com", "cluster.testmongodb.com"),
            ("cluster0.example.com", "evil.com"),
        ] {
            let error = check_target(host, target).unwrap_err();
            assert!(error.reason().contains("SRV-3"), "{host} {target}: {error}");
        }
    }

    #[test]
    fn srv3_one_bad_target_fails_the_whole_seedlist() {
        let error = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/",
            &[
                ("localhost.test.build.10gen.cc", 27017),
                ("evil.com", 27018),
            ],
            &[],
        )
        .unwrap_err();
        assert_eq!(error.value(), "evil.com");
    }

    #[test]
    fn srv2_srv6_records_become_the_seed_list_with_their_ports_and_tls_on() {
        let options = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/",
            &[
                ("localhost.test.build.10gen.cc.", 27017),
                ("localhost.test.build.10gen.cc.", 27018),
            ],
            &[],
        )
        .unwrap();
        let seeds: Vec<String> = options.hosts.iter().map(|h| h.to_string()).collect();
        assert_eq!(
            seeds,
            [
                "localhost.test.build.10gen.cc:27017",
                "localhost.test.build.10gen.cc:27018"
            ]
        );
        // TL-1: TLS on by default, off with tls=false.
        assert!(options.tls.is_some());
        let off = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/?tls=false",
            &[("localhost.test.build.10gen.cc", 27017)],
            &[],
        )
        .unwrap();
        assert!(off.tls.is_none());
        // SRV-2: no records is an error.
        assert!(resolve("mongodb+srv://test1.test.build.10gen.cc/", &[], &[]).is_err());
    }

    #[test]
    fn srv5_one_txt_record_its_strings_joined_and_uri_options_win() {
        let srv = [("localhost.test.build.10gen.cc", 27017)];
        let options = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/",
            &srv,
            &[&["replicaS", "et=rep", "l0"]],
        )
        .unwrap();
        assert_eq!(options.replica_set.as_deref(), Some("repl0"));
        let options = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/?replicaSet=mine",
            &srv,
            &[&["replicaSet=repl0"]],
        )
        .unwrap();
        assert_eq!(options.replica_set.as_deref(), Some("mine"));
        // More than one record, or an option TXT may not set, is an error.
        let two = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/",
            &srv,
            &[&["replicaSet=a"], &["authSource=b"]],
        );
        assert!(two.unwrap_err().reason().contains("SRV-5"));
        for txt in ["ssl=true", "socketTimeoutMS=1000", "replicaSet=a&tls=false"] {
            let error =
                resolve("mongodb+srv://test1.test.build.10gen.cc/", &srv, &[&[txt]]).unwrap_err();
            assert!(error.reason().contains("SRV-5"), "{txt}: {error}");
        }
    }

    #[test]
    fn srv6_conflicts_are_checked_after_the_lookups() {
        let two = [
            ("localhost.test.build.10gen.cc", 27017),
            ("localhost.test.build.10gen.cc", 27018),
        ];
        // loadBalanced from TXT with two records.
        assert!(resolve(
            "mongodb+srv://test1.test.build.10gen.cc/",
            &two,
            &[&["loadBalanced=true"]]
        )
        .is_err());
        // loadBalanced with replicaSet from TXT.
        assert!(resolve(
            "mongodb+srv://test1.test.build.10gen.cc/?loadBalanced=true",
            &two[..1],
            &[&["replicaSet=repl0"]]
        )
        .is_err());
        // srvMaxHosts with replicaSet from TXT.
        assert!(resolve(
            "mongodb+srv://test1.test.build.10gen.cc/?srvMaxHosts=1",
            &two,
            &[&["replicaSet=repl0"]]
        )
        .is_err());
        // loadBalanced from TXT with one record is fine.
        let lb = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/",
            &two[..1],
            &[&["loadBalanced=true"]],
        )
        .unwrap();
        assert!(lb.load_balanced);
    }

    #[test]
    fn srv4_srv_max_hosts_picks_that_many_deterministically() {
        let options = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/?srvMaxHosts=1",
            &[
                ("a.test.build.10gen.cc", 27017),
                ("b.test.build.10gen.cc", 27018),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(options.hosts.len(), 1);
        let again = resolve(
            "mongodb+srv://test1.test.build.10gen.cc/?srvMaxHosts=1",
            &[
                ("a.test.build.10gen.cc", 27017),
                ("b.test.build.10gen.cc", 27018),
            ],
            &[],
        )
        .unwrap();
        assert_eq!(
            options.hosts, again.hosts,
            "the same seed picks the same host"
        );
    }

    #[test]
    fn sp2_a_resolved_uri_carries_what_srv_polling_needs() {
        let cs = ConnectionString::parse(
            "mongodb+srv://test22.test.build.10gen.cc/?srvServiceName=customname&srvMaxHosts=2",
        )
        .unwrap();
        let srv = vec![
            SrvRecord {
                ttl: Some(Duration::from_secs(300)),
                ..record("a.test.build.10gen.cc", 27017)
            },
            SrvRecord {
                ttl: Some(Duration::from_secs(90)),
                ..record("b.test.build.10gen.cc", 27018)
            },
        ];
        let options =
            ClientOptions::from_connection_string(&apply_seedlist(&cs, srv, &[], 7).unwrap())
                .unwrap();
        let polling = options.srv.clone().expect("SRV polling");
        assert_eq!(polling.query, "_customname._tcp.test22.test.build.10gen.cc");
        assert_eq!(polling.hostname, "test22.test.build.10gen.cc");
        assert_eq!(polling.max_hosts, 2);
        assert_eq!(polling.initial_ttl, Some(Duration::from_secs(90)));
        let engine = options.engine_options().unwrap();
        assert_eq!(
            engine.srv_polling,
            Some(retry_core::topology::SrvPollingOptions::new(
                2,
                Some(Duration::from_secs(90))
            ))
        );
        assert!(ClientOptions::parse("mongodb://a.example.com")
            .unwrap()
            .srv
            .is_none());
    }
}
