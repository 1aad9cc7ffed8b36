//! What an I/O error from a runtime means to the engine: its [`NetworkErrorKind`] and the cause it
//! keeps, the same for every runtime.
//!
//! HS-9 leaves DNS failures unlabelled, so they must be told apart from other connect errors.
//! Resolvers report them in ways that vary by runtime and platform: std's (and so tokio's)
//! `getaddrinfo` failure is an uncategorized error whose message starts with
//! [`LOOKUP_FAILED`]; a name with no addresses is `InvalidInput` "could not resolve to any
//! address"; a runtime without a resolver reports a host name as `InvalidInput`
//! ([`crate::literal_address`]); some platforms say `NotFound`. Only errors while connecting can
//! be DNS errors.

use std::io;

use retry_core::error::{NetworkCause, NetworkErrorKind};

/// How std (and every runtime resolving through it) begins the message of a failed name lookup.
pub const LOOKUP_FAILED: &str = "failed to lookup address information";

/// The engine's kind for `error` and the cause to attach to the operation error
/// ([`retry_core::error::OperationError::with_cause`]). `connecting` is true while the socket is
/// being opened (name resolution and TCP connect), false once it is open.
pub fn classify_io_error(error: &io::Error, connecting: bool) -> (NetworkErrorKind, NetworkCause) {
    let kind = if crate::TlsError::is_tls(error) {
        NetworkErrorKind::TlsCertificate
    } else if connecting && is_dns_failure(error) {
        NetworkErrorKind::Dns
    } else {
        match error.kind() {
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                NetworkErrorKind::Reset
            }
            io::ErrorKind::UnexpectedEof | io::ErrorKind::BrokenPipe => NetworkErrorKind::Closed,
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => NetworkErrorKind::Timeout,
            _ => NetworkErrorKind::Io,
        }
    };
    (kind, io_cause(error))
}

/// The error's kind name and message, kept by the operation error.
fn io_cause(error: &io::Error) -> NetworkCause {
    NetworkCause::io(format!("{:?}", error.kind()), error.to_string())
}

/// HS-9: whether a connect error is a failed name resolution.
fn is_dns_failure(error: &io::Error) -> bool {
    let message = error.to_string();
    matches!(
        error.kind(),
        io::ErrorKind::NotFound | io::ErrorKind::InvalidInput
    ) || message.starts_with(LOOKUP_FAILED)
        || message.contains("could not resolve to any address")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kind(error: io::Error, connecting: bool) -> NetworkErrorKind {
        classify_io_error(&error, connecting).0
    }

    #[test]
    fn hs9_lookup_failures_while_connecting_are_dns_errors() {
        // What std's resolver returns for an unknown name (an uncategorized kind).
        let lookup = io::Error::other(format!("{LOOKUP_FAILED}: Name or service not known"));
        assert_eq!(kind(lookup, true), NetworkErrorKind::Dns);
        let none = io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        );
        assert_eq!(kind(none, true), NetworkErrorKind::Dns);
        assert_eq!(
            kind(io::Error::from(io::ErrorKind::NotFound), true),
            NetworkErrorKind::Dns
        );
        let literal = crate::literal_address("db.example.invalid", 1).unwrap_err();
        assert_eq!(kind(literal, true), NetworkErrorKind::Dns);
    }

    #[test]
    fn other_errors_keep_their_kinds_and_are_never_dns_once_connected() {
        assert_eq!(
            kind(io::Error::from(io::ErrorKind::ConnectionRefused), true),
            NetworkErrorKind::Io
        );
        assert_eq!(
            kind(io::Error::from(io::ErrorKind::InvalidInput), false),
            NetworkErrorKind::Io
        );
        assert_eq!(
            kind(io::Error::from(io::ErrorKind::ConnectionReset), false),
            NetworkErrorKind::Reset
        );
        assert_eq!(
            kind(io::Error::from(io::ErrorKind::UnexpectedEof), false),
            NetworkErrorKind::Closed
        );
        assert_eq!(
            kind(io::Error::from(io::ErrorKind::TimedOut), true),
            NetworkErrorKind::Timeout
        );
    }

    #[test]
    fn the_cause_keeps_the_kind_name_and_message() {
        let refused = io::Error::new(io::ErrorKind::ConnectionRefused, "Connection refused");
        let (_, cause) = classify_io_error(&refused, true);
        assert_eq!(
            cause,
            NetworkCause::io("ConnectionRefused", "Connection refused")
        );
        assert_eq!(cause.to_string(), "Connection refused (ConnectionRefused)");
    }
}
