//! SRV and TXT lookups (SRV-2, SRV-5) on hickory-resolver, written once for every runtime: an
//! adapter hands over its sockets and timers as a hickory [`RuntimeProvider`], and the resolver
//! configuration, the queries, the reading of the answers and the errors are here.
//!
//! hickory-resolver is a well-kept, runtime-neutral resolver (the official Rust driver uses it
//! too); without its `tokio` feature it pulls in no runtime. Each lookup builds a fresh resolver,
//! so the TTLs it reports are the records' own (no cache in between) and nothing outlives it.

use core::time::Duration;
use std::io;
use std::net::SocketAddr;

use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::NetError;
use hickory_resolver::proto::rr::{RData, Record};
use hickory_resolver::Resolver;

pub use hickory_resolver::net::runtime::RuntimeProvider;

use crate::srv::SrvRecord;

/// Where a runtime's DNS queries go.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Nameservers {
    /// The system's resolver configuration (`/etc/resolv.conf` on Unix, the registry on Windows).
    #[default]
    System,
    /// These name servers, over UDP with TCP for truncated answers, and no search domains: a
    /// private resolver, or a test's DNS server on 127.0.0.1.
    Fixed(Vec<SocketAddr>),
}

/// SRV-2: the SRV records of `name`, each with its target, port and TTL. A name without SRV
/// records is an error of kind `NotFound`.
pub async fn lookup_srv<P: RuntimeProvider>(
    provider: P,
    nameservers: &Nameservers,
    name: &str,
) -> io::Result<Vec<SrvRecord>> {
    let lookup = resolver(provider, nameservers)?
        .srv_lookup(name)
        .await
        .map_err(dns_error)?;
    Ok(lookup.answers().iter().filter_map(srv_record).collect())
}

/// SRV-5: the TXT records of `name`, each as its character strings in order. A name without TXT
/// records is an error of kind `NotFound`.
pub async fn lookup_txt<P: RuntimeProvider>(
    provider: P,
    nameservers: &Nameservers,
    name: &str,
) -> io::Result<Vec<Vec<String>>> {
    let lookup = resolver(provider, nameservers)?
        .txt_lookup(name)
        .await
        .map_err(dns_error)?;
    Ok(lookup
        .answers()
        .iter()
        .filter_map(|record| match &record.data {
            RData::TXT(txt) => Some(
                txt.txt_data
                    .iter()
                    .map(|s| String::from_utf8_lossy(s).into_owned())
                    .collect(),
            ),
            _ => None,
        })
        .collect())
}

/// One SRV answer (priority and weight are ignored, SRV-2), with the record's TTL for SRV
/// polling's rescan interval.
fn srv_record(record: &Record) -> Option<SrvRecord> {
    match &record.data {
        RData::SRV(srv) => Some(SrvRecord {
            target: srv.target.to_ascii(),
            port: srv.port,
            ttl: Some(Duration::from_secs(u64::from(record.ttl))),
        }),
        _ => None,
    }
}

fn resolver<P: RuntimeProvider>(provider: P, nameservers: &Nameservers) -> io::Result<Resolver<P>> {
    let builder = match nameservers {
        Nameservers::System => Resolver::builder(provider).map_err(io::Error::other)?,
        Nameservers::Fixed(addresses) => {
            let servers = addresses
                .iter()
                .map(|address| {
                    let connection = |mut config: ConnectionConfig| {
                        config.port = address.port();
                        config
                    };
                    NameServerConfig::new(
                        address.ip(),
                        true,
                        vec![
                            connection(ConnectionConfig::udp()),
                            connection(ConnectionConfig::tcp()),
                        ],
                    )
                })
                .collect();
            Resolver::builder_with_config(ResolverConfig::from_name_servers(servers), provider)
        }
    };
    builder.build().map_err(io::Error::other)
}

/// A failed lookup; a name without records of the type is `NotFound`.
fn dns_error(error: NetError) -> io::Error {
    if error.is_no_records_found() {
        io::Error::new(io::ErrorKind::NotFound, error.to_string())
    } else {
        io::Error::other(error.to_string())
    }
}

/// The addresses of `host` (A and AAAA records), for runtimes whose sockets do not resolve
/// names themselves. A failed lookup's message starts with [`crate::LOOKUP_FAILED`], so the
/// engine sees a DNS error (HS-9).
pub async fn lookup_ip<P: RuntimeProvider>(
    provider: P,
    nameservers: &Nameservers,
    host: &str,
) -> io::Result<Vec<std::net::IpAddr>> {
    let failed = |error: &dyn std::fmt::Display| {
        io::Error::other(format!("{} for {host}: {error}", crate::LOOKUP_FAILED))
    };
    let lookup = resolver(provider, nameservers)
        .map_err(|e| failed(&e))?
        .lookup_ip(host)
        .await
        .map_err(|e| failed(&e))?;
    Ok(lookup.iter().collect())
}
