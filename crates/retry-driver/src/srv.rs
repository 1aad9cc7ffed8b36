//! Initial DNS seedlist discovery (`mongodb+srv`, SRV-1..SRV-6): the rules, as pure functions
//! of the connection string and the DNS answers, and [`resolve_seedlist`], which asks a
//! [`Runtime`] for those answers. Any resolver (or a test's fake one) feeds the same rules.
//!
//! Hosts under 3 labels are allowed (SRV-2), TLS defaults on (TL-1, in
//! [`crate::ClientOptions::from_connection_string`]), and `srvMaxHosts` picks hosts with a
//! Fisher–Yates shuffle drawn from a seeded [`EngineRng`], so a pinned seed picks the same hosts.
//! Polling SRV records for sharded deployments is not implemented.

use std::io;

use rand_core::RngCore;
use retry_core::rng::EngineRng;

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
pub fn srv_query_name(hostname: &str, service_name: &str) -> String {
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

/// SRV-4: at most `max_hosts` of `records` (0 = all), chosen by a Fisher–Yates shuffle from `rng`.
fn choose_hosts(
    mut records: Vec<SrvRecord>,
    max_hosts: usize,
    rng: &mut EngineRng,
) -> Vec<SrvRecord> {
    if max_hosts == 0 || max_hosts >= records.len() {
        return records;
    }
    for i in (1..records.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        records.swap(i, j);
    }
    records.truncate(max_hosts);
    records
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
    let chosen = choose_hosts(srv, max_hosts, &mut EngineRng::from_seed_u64(seed));
    let hosts = chosen
        .into_iter()
        .map(|record| Host {
            host: record.target.trim_end_matches('.').to_string(),
            port: Some(record.port),
            kind: HostKind::Hostname,
        })
        .collect();
    cs.with_seedlist(hosts, txt.as_deref())
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
    let service = match cs.option("srvServiceName") {
        Some(crate::OptionValue::Str(name)) => name.as_str(),
        _ => "mongodb",
    };
    let query = srv_query_name(hostname, service);
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
        let records: Vec<SrvRecord> = (0..5)
            .map(|i| record(&format!("h{i}.example.com"), 27017))
            .collect();
        let pick =
            |max, seed| choose_hosts(records.clone(), max, &mut EngineRng::from_seed_u64(seed));
        assert_eq!(pick(0, 1), records);
        assert_eq!(pick(5, 1), records);
        assert_eq!(pick(9, 1), records);
        let two = pick(2, 1);
        assert_eq!(two.len(), 2);
        assert_ne!(two[0], two[1]);
        assert!(two.iter().all(|r| records.contains(r)));
        assert_eq!(two, pick(2, 1), "the same seed picks the same hosts");
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
    }
}
