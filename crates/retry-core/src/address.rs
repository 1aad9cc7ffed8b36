//! Server addresses: the identity of a server in the topology, in selection, and in a retry's
//! deprioritized set.
//!
//! An address is a lowercased host and a port (SDAM compares addresses case-insensitively). A short
//! host (up to 20 bytes: `localhost`, an IPv4 address, a short name) is kept inline, so
//! cloning and dropping its address copies bytes and touches no reference count; a longer host is
//! reference-counted. Either way cloning an address, as the retry machine does for every attempt,
//! never allocates.

use alloc::sync::Arc;
use core::fmt;
use core::str::FromStr;

/// The port a MongoDB address has when none is written.
pub const DEFAULT_PORT: u16 = 27017;

/// The longest host, in bytes, an address keeps inline (without a reference count).
const INLINE_HOST: usize = 20;

/// A server's `host:port`. Cheap to clone; compares and hashes by value.
#[derive(Clone)]
pub struct ServerAddress(Repr);

/// A host fits inline exactly when it is at most [`INLINE_HOST`] bytes long, so one host always
/// has the same representation and equal addresses have equal variants. The inline bytes past
/// `len` are zero.
#[derive(Clone)]
enum Repr {
    Inline {
        port: u16,
        len: u8,
        bytes: [u8; INLINE_HOST],
    },
    Shared {
        port: u16,
        host: Arc<str>,
    },
}

// Compared by value, host then port; hosts of different lengths never share a representation.
// Clones of one shared host share it, so the engine's lookups by address usually skip the byte
// compare.
impl PartialEq for ServerAddress {
    fn eq(&self, other: &ServerAddress) -> bool {
        match (&self.0, &other.0) {
            (
                Repr::Inline { port, len, bytes },
                Repr::Inline {
                    port: p,
                    len: l,
                    bytes: b,
                },
            ) => port == p && len == l && bytes == b,
            (Repr::Shared { port, host }, Repr::Shared { port: p, host: h }) => {
                port == p && (Arc::ptr_eq(host, h) || host == h)
            }
            _ => false,
        }
    }
}

impl Eq for ServerAddress {}

impl core::hash::Hash for ServerAddress {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        // What `str`'s hash writes (the bytes, then 0xff), for both representations alike.
        state.write(self.host_bytes());
        state.write_u8(0xff);
        self.port().hash(state);
    }
}

impl PartialOrd for ServerAddress {
    fn partial_cmp(&self, other: &ServerAddress) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ServerAddress {
    /// Host (byte-wise, as `str` orders), then port.
    fn cmp(&self, other: &ServerAddress) -> core::cmp::Ordering {
        if let (Repr::Shared { host, .. }, Repr::Shared { host: h, .. }) = (&self.0, &other.0) {
            if Arc::ptr_eq(host, h) {
                return self.port().cmp(&other.port());
            }
        }
        self.host_bytes()
            .cmp(other.host_bytes())
            .then_with(|| self.port().cmp(&other.port()))
    }
}

impl ServerAddress {
    /// An address from a host and port. The host is lowercased; IPv6 hosts are written without
    /// brackets (`"::1"`).
    pub fn new(host: &str, port: u16) -> ServerAddress {
        if host.len() <= INLINE_HOST {
            let mut bytes = [0; INLINE_HOST];
            bytes[..host.len()].copy_from_slice(host.as_bytes());
            bytes.make_ascii_lowercase();
            // At most INLINE_HOST (20) bytes.
            let len = host.len() as u8;
            return ServerAddress(Repr::Inline { port, len, bytes });
        }
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            Arc::from(host.to_ascii_lowercase())
        } else {
            Arc::from(host)
        };
        ServerAddress(Repr::Shared { port, host })
    }

    /// Whether this address can name a server, as a seed must (review32 R23; [`ServerAddress::new`]
    /// takes any host and port): not an empty host, not port 0, not a host holding its own port
    /// (`"db:27017"`: exactly one `:`, where an IPv6 host has at least two), not an IPv6 host in
    /// brackets (`new` takes it without). An address [`FromStr`] parsed always passes.
    pub fn check(&self) -> Result<(), AddressParseError> {
        let host = self.host();
        let reason = if host.is_empty() {
            "empty host"
        } else if self.port() == 0 {
            "port must be an integer from 1 to 65535"
        } else if host.bytes().filter(|&b| b == b':').count() == 1 {
            "the host holds a port: give the host alone and the port separately"
        } else if host.starts_with('[') || host.ends_with(']') {
            "an IPv6 host is given without its brackets"
        } else {
            return Ok(());
        };
        Err(AddressParseError {
            input: alloc::format!("{self}"),
            reason,
        })
    }

    /// The host, lowercased, without IPv6 brackets.
    pub fn host(&self) -> &str {
        match &self.0 {
            // The bytes are a `str`'s, lowercased in ASCII only: always UTF-8.
            Repr::Inline { len, bytes, .. } => {
                core::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            Repr::Shared { host, .. } => host,
        }
    }

    /// The host's bytes (no UTF-8 check).
    fn host_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes, .. } => &bytes[..usize::from(*len)],
            Repr::Shared { host, .. } => host.as_bytes(),
        }
    }

    /// The port.
    pub fn port(&self) -> u16 {
        match self.0 {
            Repr::Inline { port, .. } | Repr::Shared { port, .. } => port,
        }
    }
}

impl fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (host, port) = (self.host(), self.port());
        if host.contains(':') {
            write!(f, "[{host}]:{port}")
        } else {
            write!(f, "{host}:{port}")
        }
    }
}

impl fmt::Debug for ServerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ServerAddress({self})")
    }
}

/// Why a string is not a server address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AddressParseError {
    input: alloc::string::String,
    reason: &'static str,
}

impl fmt::Display for AddressParseError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "invalid server address {:?}: {}",
            self.input, self.reason
        )
    }
}

impl core::error::Error for AddressParseError {}

impl FromStr for ServerAddress {
    type Err = AddressParseError;

    /// Parses `host`, `host:port`, `[ipv6]` or `[ipv6]:port`; the port defaults to 27017.
    fn from_str(s: &str) -> Result<ServerAddress, AddressParseError> {
        let fail = |reason| AddressParseError {
            input: s.into(),
            reason,
        };
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            let (host, after) = rest.split_once(']').ok_or_else(|| fail("unclosed '['"))?;
            match after {
                "" => (host, None),
                _ => (
                    host,
                    Some(
                        after
                            .strip_prefix(':')
                            .ok_or_else(|| fail("expected ':' after ']'"))?,
                    ),
                ),
            }
        } else {
            match s.rsplit_once(':') {
                Some((h, _)) if h.contains(':') => {
                    return Err(fail("IPv6 hosts must be in brackets"))
                }
                Some((h, p)) => (h, Some(p)),
                None => (s, None),
            }
        };
        if host.is_empty() {
            return Err(fail("empty host"));
        }
        let port = match port {
            None => DEFAULT_PORT,
            Some(p) => match p.parse::<u16>() {
                Ok(0) | Err(_) => return Err(fail("port must be an integer from 1 to 65535")),
                Ok(p) => p,
            },
        };
        Ok(ServerAddress::new(host, port))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Review32 R23: a seed's typo is an error, naming the address and what is wrong.
    #[test]
    fn r23_check_refuses_an_empty_host_port_0_and_a_host_holding_a_port() {
        let reason = |host: &str, port| {
            ServerAddress::new(host, port)
                .check()
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            reason("", 0),
            Err("invalid server address \":0\": empty host".into())
        );
        assert_eq!(
            reason("db", 0),
            Err("invalid server address \"db:0\": port must be an integer from 1 to 65535".into())
        );
        assert_eq!(
            reason("host:27017", 27018),
            Err(
                "invalid server address \"[host:27017]:27018\": the host holds a port: give the \
                 host alone and the port separately"
                    .into()
            )
        );
        assert_eq!(
            reason("[::1]", 27017),
            Err(
                "invalid server address \"[[::1]]:27017\": an IPv6 host is given without its \
                 brackets"
                    .into()
            )
        );
        for ok in [
            ("db", 27017),
            ("::1", 27017),
            ("fe80::1", 1),
            ("a.very-long-host-name.example.com", 65535),
        ] {
            assert_eq!(reason(ok.0, ok.1), Ok(()), "{ok:?}");
        }
        for parsed in ["db", "db:1", "[::1]", "[fe80::1]:27018"] {
            let address: ServerAddress = parsed.parse().expect("valid");
            assert_eq!(address.check(), Ok(()), "{parsed}");
        }
    }

    /// Shared and separately built hosts compare alike: by value, host then port.
    #[test]
    fn addresses_compare_by_value_whether_or_not_they_share_their_host() {
        use core::cmp::Ordering;
        let a = ServerAddress::new("a", 1);
        let cases = [
            (a.clone(), Ordering::Equal),
            (ServerAddress::new("a", 1), Ordering::Equal),
            (ServerAddress::new("a", 2), Ordering::Less),
            (ServerAddress::new("a", 0), Ordering::Greater),
            (ServerAddress::new("b", 0), Ordering::Less),
            (ServerAddress::new("", 9), Ordering::Greater),
        ];
        for (other, order) in cases {
            assert_eq!(a.cmp(&other), order, "{other}");
            assert_eq!(a == other, order == Ordering::Equal, "{other}");
            assert_eq!(
                (a.host(), a.port()).cmp(&(other.host(), other.port())),
                order
            );
        }
    }

    /// Short hosts are kept inline, long ones shared: both compare, order, hash and print by
    /// value, lowercased, whatever their length (20 and 21 bytes straddle the inline limit).
    #[test]
    fn short_and_long_hosts_behave_alike() {
        use core::hash::{Hash, Hasher};
        use std::collections::hash_map::DefaultHasher;
        fn hash(a: &ServerAddress) -> u64 {
            let mut h = DefaultHasher::new();
            a.hash(&mut h);
            h.finish()
        }
        let hosts = [
            "a",
            "Member",
            "abcdefghijklmnopqrst",
            "ABCDEFGHIJKLMNOPQRSTU",
            "mongo-0.mongo.svc.cluster.local",
        ];
        let addresses: Vec<ServerAddress> = hosts
            .iter()
            .flat_map(|h| [ServerAddress::new(h, 1), ServerAddress::new(h, 2)])
            .collect();
        for (i, a) in addresses.iter().enumerate() {
            let host = hosts[i / 2].to_ascii_lowercase();
            assert_eq!(a.host(), host);
            assert_eq!(a.to_string(), format!("{host}:{}", 1 + i % 2));
            let again = ServerAddress::new(&hosts[i / 2].to_ascii_uppercase(), a.port());
            assert_eq!(&again, a);
            assert_eq!(hash(&again), hash(a));
            assert_eq!(hash(&a.clone()), hash(a));
            for b in &addresses {
                assert_eq!(
                    a.cmp(b),
                    (a.host(), a.port()).cmp(&(b.host(), b.port())),
                    "{a} {b}"
                );
                assert_eq!(a == b, (a.host(), a.port()) == (b.host(), b.port()));
            }
        }
        assert_eq!(core::mem::size_of::<ServerAddress>(), 24);
    }

    #[test]
    fn parses_the_usual_forms_and_lowercases_hosts() {
        let a: ServerAddress = "A.Example.com".parse().unwrap();
        assert_eq!((a.host(), a.port()), ("a.example.com", 27017));
        let b: ServerAddress = "[::1]:27018".parse().unwrap();
        assert_eq!((b.host(), b.port()), ("::1", 27018));
        assert_eq!(b.to_string(), "[::1]:27018");
        assert_eq!(
            "a:1".parse::<ServerAddress>().unwrap(),
            ServerAddress::new("A", 1)
        );
    }

    #[test]
    fn rejects_bad_input_with_a_reason() {
        for bad in ["", ":1", "a:0", "a:65536", "a:x", "[::1", "[::1]x", "::1"] {
            let err = bad.parse::<ServerAddress>().unwrap_err();
            assert!(
                err.to_string().contains("invalid server address"),
                "{bad}: {err}"
            );
        }
    }
}
