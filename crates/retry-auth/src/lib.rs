//! # retry-auth
//!
//! Authentication mechanisms for [`retry_core::auth`]'s pluggable [`Mechanism`] trait, so that
//! retry-core itself stays free of cryptography:
//!
//! - [`scram::Scram`]: SCRAM-SHA-256 (password SASLprep'd, RFC 4013) and SCRAM-SHA-1 (password
//!   digested as `HEX(MD5(user ":mongo:" password))`) per RFC 5802 / RFC 7677 and AU-6..AU-9:
//!   the server nonce must extend ours, fewer than 4096 iterations fail, the server's signature is
//!   checked before success, and derived keys are cached per salt and iteration count.
//! - [`scram::server`]: the server side of the same exchange, for test servers (retry-testkit).
//!
//! [`auth_options`] turns a [`Credential`] into the engine's [`AuthOptions`] with the spec's
//! defaults (AU-3: no mechanism negotiates SCRAM-SHA-256, else SCRAM-SHA-1) and refuses the
//! mechanisms this crate does not implement by name. The client nonce comes from an RNG the
//! caller passes: [`os_rng`] in production, a seeded one in deterministic tests.
//!
//! ```
//! use retry_auth::{auth_options, os_rng};
//! use retry_core::auth::Credential;
//! use retry_core::engine::EngineOptions;
//! # use retry_core::{address::ServerAddress, handshake::HandshakeOptions, topology::TopologySettings};
//! # let mut options = EngineOptions::new(
//! #     TopologySettings::new(vec![ServerAddress::new("127.0.0.1", 27017)]),
//! #     HandshakeOptions::new(),
//! # );
//! let credential = Credential::new("alice", "pencil", "admin");
//! options.auth = Some(auth_options(&credential, os_rng()).unwrap());
//! ```
#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod scram;

use std::sync::{Arc, Mutex};

use rand_core::RngCore;
use retry_core::auth::{AuthError, AuthOptions, Credential, Mechanism};

pub use scram::{Scram, ScramVersion};

/// A random source shared by the mechanisms of one client (client nonces, AU-6).
pub type SharedRng = Arc<Mutex<dyn RngCore + Send>>;

/// The operating system's random source, for client nonces in production.
pub fn os_rng() -> impl RngCore + Send + 'static {
    rand_core::UnwrapErr(rand_core::OsRng)
}

/// The mechanisms the MongoDB auth spec names that this crate does not implement; a driver may
/// implement them on [`Mechanism`] itself.
pub const UNSUPPORTED_MECHANISMS: &[&str] = &[
    "MONGODB-X509",
    "GSSAPI",
    "PLAIN",
    "MONGODB-AWS",
    "MONGODB-OIDC",
];

/// The engine's authentication for `credential` (AU-3, AU-10): SCRAM-SHA-256 or SCRAM-SHA-1 when
/// named, negotiation between them when no mechanism is given. Nonces are drawn from `rng`.
///
/// Errors (naming the mechanism, never the credential): no user name or no password for SCRAM,
/// and any other mechanism ([`UNSUPPORTED_MECHANISMS`] or unknown).
pub fn auth_options(
    credential: &Credential,
    rng: impl RngCore + Send + 'static,
) -> Result<AuthOptions, AuthError> {
    let rng: SharedRng = Arc::new(Mutex::new(rng));
    let scram = |version: ScramVersion| -> Result<Arc<dyn Mechanism>, AuthError> {
        Ok(Arc::new(Scram::new(version, credential, rng.clone())?))
    };
    match credential.mechanism.as_deref() {
        None => {
            let user = credential
                .username
                .clone()
                .ok_or_else(|| AuthError::new("SCRAM", "a user name is required"))?;
            Ok(AuthOptions::negotiated(
                credential.source.clone(),
                user,
                scram(ScramVersion::Sha256)?,
                scram(ScramVersion::Sha1)?,
            ))
        }
        Some(name) => {
            let version = match name {
                "SCRAM-SHA-256" => ScramVersion::Sha256,
                "SCRAM-SHA-1" => ScramVersion::Sha1,
                other if UNSUPPORTED_MECHANISMS.contains(&other) => {
                    return Err(AuthError::new(
                        other,
                        "this mechanism is not supported by retry-auth (only SCRAM-SHA-256 and \
                         SCRAM-SHA-1); implement retry_core::auth::Mechanism for it",
                    ))
                }
                other => return Err(AuthError::new(other, "unknown mechanism")),
            };
            Ok(AuthOptions::new(credential.source.clone(), scram(version)?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use retry_core::rng::EngineRng;

    #[test]
    fn au3_au13_known_mechanisms_build_and_the_others_are_named_in_the_error() {
        let mut c = Credential::new("alice", "pencil", "admin");
        let rng = || EngineRng::from_seed_u64(1);
        let negotiated = format!("{:?}", auth_options(&c, rng()).unwrap());
        assert!(negotiated.contains("SCRAM-SHA-256") && negotiated.contains("SCRAM-SHA-1"));
        for name in ["SCRAM-SHA-256", "SCRAM-SHA-1"] {
            c.mechanism = Some(name.into());
            assert!(format!("{:?}", auth_options(&c, rng()).unwrap()).contains(name));
        }
        for name in UNSUPPORTED_MECHANISMS {
            c.mechanism = Some((*name).into());
            let e = auth_options(&c, rng()).unwrap_err();
            assert!(e.to_string().contains(name), "{e}");
            assert!(!e.to_string().contains("pencil"));
        }
        c.mechanism = None;
        c.password = None;
        assert!(auth_options(&c, rng()).is_err(), "SCRAM needs a password");
    }
}
