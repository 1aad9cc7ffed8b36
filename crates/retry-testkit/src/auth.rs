//! SCRAM users (AU-3..AU-8), as strict as a `mongod` with access control: `saslStart` /
//! `saslContinue` on the user's database, `saslSupportedMechs` and `speculativeAuthenticate` in
//! the hello, and error 13 `Unauthorized` for any other command before the connection has
//! authenticated. The server side of SCRAM is retry-auth's
//! [`server`](retry_auth::scram::server) module. Like a real server, it stores per user and
//! mechanism a salt (fixed, derived from the user's name, database and mechanism, so runs repeat)
//! and the derived keys, computed once when the server starts, so a client's key cache (AU-9)
//! hits on every connection after its first; server nonces come from the connection's seeded
//! generator.
//!
//! A wrong password, an unknown user, a mechanism the user does not have or a database the user is
//! not defined in all fail with 18 `AuthenticationFailed`, as a real server answers. To stop a
//! server mid-conversation, set a `failCommand` fail point on `saslContinue` with
//! `closeConnection`.

use std::fmt;

use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
use rand_core::RngCore;
use retry_auth::scram::server::{ClientFirst, ServerConversation, StoredCredential};
pub use retry_auth::ScramVersion;
use retry_core::rng::EngineRng;

use crate::commands::is_hello;
use crate::fail_point::error_reply;

/// The iteration count the server asks for: the minimum clients accept (AU-6).
pub const SCRAM_ITERATIONS: u32 = 4096;

/// A user the server knows. `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramUser {
    /// The user name.
    pub name: String,
    /// The password (in clear: the server derives its keys per conversation).
    pub password: String,
    /// The database the user is defined in (`admin` by default).
    pub db: String,
    /// The mechanisms the user has credentials for, listed in `saslSupportedMechs` in this order.
    pub mechanisms: Vec<ScramVersion>,
}

impl ScramUser {
    /// A user of `admin` with SCRAM-SHA-256 and SCRAM-SHA-1 credentials.
    pub fn new(name: impl Into<String>, password: impl Into<String>) -> ScramUser {
        ScramUser {
            name: name.into(),
            password: password.into(),
            db: "admin".into(),
            mechanisms: vec![ScramVersion::Sha256, ScramVersion::Sha1],
        }
    }
}

impl fmt::Debug for ScramUser {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramUser")
            .field("name", &self.name)
            .field("password", &"<redacted>")
            .field("db", &self.db)
            .field("mechanisms", &self.mechanisms)
            .finish()
    }
}

/// The users with their stored credentials, derived once.
#[derive(Default)]
pub(crate) struct UserStore {
    users: Vec<(ScramUser, Vec<StoredCredential>)>,
}

impl UserStore {
    /// Derives every user's stored credentials (a user whose password SASLprep refuses has no
    /// SCRAM-SHA-256 credential).
    pub(crate) fn new(users: &[ScramUser]) -> UserStore {
        let users = users
            .iter()
            .map(|user| {
                let stored = user
                    .mechanisms
                    .iter()
                    .filter_map(|&version| {
                        let salt = salt(&user.name, &user.db, version);
                        StoredCredential::derive(
                            version,
                            &user.name,
                            &user.password,
                            &salt,
                            SCRAM_ITERATIONS,
                        )
                        .ok()
                    })
                    .collect();
                (user.clone(), stored)
            })
            .collect();
        UserStore { users }
    }

    fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    fn user(&self, name: &str, db: &str) -> Option<&(ScramUser, Vec<StoredCredential>)> {
        self.users
            .iter()
            .find(|(u, _)| u.name == name && u.db == db)
    }
}

/// A user's fixed salt for one mechanism: 16 bytes from a generator seeded with an FNV-1a hash
/// of the name, database and mechanism.
fn salt(name: &str, db: &str, version: ScramVersion) -> [u8; 16] {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in [name, "\0", db, "\0", version.name()].concat().bytes() {
        hash = (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3);
    }
    let mut salt = [0u8; 16];
    EngineRng::from_seed_u64(hash).fill_bytes(&mut salt);
    salt
}

/// Commands a connection may run before it authenticates.
fn allowed_unauthenticated(name: &str) -> bool {
    is_hello(name)
        || matches!(
            name,
            "saslStart" | "saslContinue" | "authenticate" | "ping" | "buildInfo"
        )
}

/// A conversation in progress.
struct Conversation {
    id: i32,
    server: ServerConversation,
    skip_empty_exchange: bool,
    /// The server-final message was sent (long form): an empty `saslContinue` ends it.
    proved: bool,
}

/// One connection's authentication state.
#[derive(Default)]
pub(crate) struct ConnectionAuth {
    authenticated: bool,
    conversation: Option<Conversation>,
    last_id: i32,
}

fn binary(bytes: Vec<u8>) -> Binary {
    Binary {
        subtype: BinarySubtype::Generic,
        bytes,
    }
}

fn auth_failed() -> Document {
    error_reply(18, "Authentication failed.")
}

fn version_named(name: &str) -> Option<ScramVersion> {
    match name {
        "SCRAM-SHA-256" => Some(ScramVersion::Sha256),
        "SCRAM-SHA-1" => Some(ScramVersion::Sha1),
        _ => None,
    }
}

impl ConnectionAuth {
    /// Error 13 for a command this connection may not run yet; `None` when it may.
    pub(crate) fn refuse(&self, users: &UserStore, name: &str) -> Option<Document> {
        if users.is_empty() || self.authenticated || allowed_unauthenticated(name) {
            return None;
        }
        Some(error_reply(
            13,
            &format!("command {name} requires authentication"),
        ))
    }

    /// The reply to `saslStart` / `saslContinue` / `authenticate`; `None` for any other command.
    pub(crate) fn dispatch(
        &mut self,
        users: &UserStore,
        name: &str,
        command: &Document,
        rng: &mut EngineRng,
    ) -> Option<Document> {
        let db = command.get_str("$db").unwrap_or_default();
        match name {
            "saslStart" => Some(match self.start(users, command, db, rng) {
                Some(mut reply) => {
                    reply.insert("ok", 1.0);
                    reply
                }
                None => auth_failed(),
            }),
            "saslContinue" => Some(self.continue_(command)),
            // MONGODB-X509's one command (AU-5): known, in API version 1, not implemented.
            "authenticate" => Some(crate::commands::unsupported_reply(
                "authenticate (MONGODB-X509)",
            )),
            _ => None,
        }
    }

    /// AU-3, AU-4: answers `saslSupportedMechs` and `speculativeAuthenticate` in a hello reply.
    pub(crate) fn hello(
        &mut self,
        users: &UserStore,
        command: &Document,
        reply: &mut Document,
        rng: &mut EngineRng,
    ) {
        if let Ok(query) = command.get_str("saslSupportedMechs") {
            let user = query
                .split_once('.')
                .and_then(|(db, name)| users.user(name, db));
            if let Some((user, _)) = user {
                let names: Vec<&str> = user.mechanisms.iter().map(|m| m.name()).collect();
                reply.insert("saslSupportedMechs", names);
            }
        }
        if let Ok(speculative) = command.get_document("speculativeAuthenticate") {
            let db = speculative.get_str("db").unwrap_or_default();
            if speculative.contains_key("saslStart") {
                // A failed speculative start is simply not answered (HS-8).
                if let Some(first) = self.start(users, speculative, db, rng) {
                    reply.insert("speculativeAuthenticate", first);
                }
            }
        }
    }

    /// `saslStart`: the first SASL reply (without `ok`), or `None` to fail with 18.
    fn start(
        &mut self,
        users: &UserStore,
        command: &Document,
        db: &str,
        rng: &mut EngineRng,
    ) -> Option<Document> {
        self.conversation = None;
        let version = version_named(command.get_str("mechanism").ok()?)?;
        let payload = match command.get("payload") {
            Some(Bson::Binary(b)) => &b.bytes,
            _ => return None,
        };
        let first = ClientFirst::parse(payload)?;
        let (_, stored) = users.user(&first.user, db)?;
        let stored = stored.iter().find(|c| c.version() == version)?;
        let mut nonce = [0u8; 18];
        rng.fill_bytes(&mut nonce);
        let nonce: String = nonce.iter().map(|b| format!("{b:02x}")).collect();
        let (server, server_first) = ServerConversation::new(&first, stored, &nonce);
        let skip_empty_exchange = command
            .get_document("options")
            .and_then(|o| o.get_bool("skipEmptyExchange"))
            .unwrap_or(false);
        self.last_id += 1;
        self.conversation = Some(Conversation {
            id: self.last_id,
            server,
            skip_empty_exchange,
            proved: false,
        });
        Some(doc! {
            "conversationId": self.last_id,
            "done": false,
            "payload": binary(server_first),
        })
    }

    /// `saslContinue` (AU-5, AU-8).
    fn continue_(&mut self, command: &Document) -> Document {
        let id = match command.get("conversationId") {
            Some(Bson::Int32(id)) => i64::from(*id),
            Some(Bson::Int64(id)) => *id,
            _ => -1,
        };
        let Some(conversation) = self.conversation.take().filter(|c| i64::from(c.id) == id) else {
            return error_reply(17, "No SASL session state found");
        };
        let payload = match command.get("payload") {
            Some(Bson::Binary(b)) => b.bytes.clone(),
            _ => return auth_failed(),
        };
        if conversation.proved {
            if !payload.is_empty() {
                return auth_failed();
            }
            self.authenticated = true;
            return doc! { "conversationId": conversation.id, "done": true,
            "payload": binary(Vec::new()), "ok": 1.0 };
        }
        let Some(server_final) = conversation.server.finish(&payload) else {
            return auth_failed();
        };
        let id = conversation.id;
        let done = conversation.skip_empty_exchange;
        if done {
            self.authenticated = true;
        } else {
            self.conversation = Some(Conversation {
                proved: true,
                ..conversation
            });
        }
        doc! { "conversationId": id, "done": done, "payload": binary(server_final), "ok": 1.0 }
    }
}
