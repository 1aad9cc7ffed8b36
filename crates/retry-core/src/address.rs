//! Server addresses: the identity of a server in the topology, in selection, and in a retry's
//! deprioritized set.
//!
//! An address is a lowercased host and a port (SDAM compares addresses case-insensitively). The host
//! is reference-counted, so cloning an address, as the retry machine does for every attempt, never
//! allocates.

use alloc::sync::Arc;
use core::fmt;
use core::str::FromStr;

/// The port a MongoDB address has when none is written.
pub const DEFAULT_PORT: u16 = 27017;

/// A server's `host:port`. Cheap to clone; compares and hashes by value.
#[derive(Clone)]
pub struct ServerAddress {
    host: Arc<str>,
    port: u16,
}

// Compared by value, host then port, as derived; clones of one address share their host, so
// the engine's lookups by address (every pool, every server id) usually skip the byte compare.
impl PartialEq for ServerAddress {
    fn eq(&self, other: &ServerAddress) -> bool {
        self.port == other.port && (Arc::ptr_eq(&self.host, &other.host) || self.host == other.host)
    }
}

impl Eq for ServerAddress {}

impl core::hash::Hash for ServerAddress {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.host.hash(state);
        self.port.hash(state);
    }
}

impl PartialOrd for ServerAddress {
    fn partial_cmp(&self, other: &ServerAddress) -> Option<core::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ServerAddress {
    fn cmp(&self, other: &ServerAddress) -> core::cmp::Ordering {
        if Arc::ptr_eq(&self.host, &other.host) {
            return self.port.cmp(&other.port);
        }
        self.host
            .cmp(&other.host)
            .then_with(|| self.port.cmp(&other.port))
    }
}

impl ServerAddress {
    /// An address from a host and port. The host is lowercased; IPv6 hosts are written without
    /// brackets (`"::1"`).
    pub fn new(host: &str, port: u16) -> ServerAddress {
        let host = if host.bytes().any(|b| b.is_ascii_uppercase()) {
            Arc::from(host.to_ascii_lowercase())
        } else {
            Arc::from(host)
        };
        ServerAddress { host, port }
    }

    /// The host, lowercased, without IPv6 brackets.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl fmt::Display for ServerAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
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

    /// Shared and separately built hosts compare alike: by value, host then port.
    #[test]
    fn addresses_compare_by_value_whether_or_not_they_share_their_host() {
        use core::cmp::Ordering;
        let a = ServerAddress::new("a", 1);
        let cases = [
            (a.clone(), Ordering::Equal),
            (ServerAddress::new("a", 1), Ordering::Equal),
            (
                ServerAddress {
                    port: 2,
                    ..a.clone()
                },
                Ordering::Less,
            ),
            (
                ServerAddress {
                    port: 0,
                    ..a.clone()
                },
                Ordering::Greater,
            ),
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
