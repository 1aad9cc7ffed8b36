//! Authentication as the last step of connection establishment (AU-2..AU-11), sans-IO and free of
//! cryptography: the mechanism is a trait object ([`Mechanism`]) that another crate implements
//! (retry-auth ships SCRAM-SHA-256 and SCRAM-SHA-1; a driver can add X.509, OIDC, AWS, ...).
//!
//! One [`AuthOptions`] per client says which mechanism, or which pair to negotiate between, and
//! the credential's source database. Each new pooled connection gets an [`Authentication`]: it
//! adds `saslSupportedMechs` and `speculativeAuthenticate` to that connection's `hello` (AU-3,
//! AU-4), reads the `hello` reply, and then runs the conversation (`saslStart`, `saslContinue` on
//! the source database with the server's `conversationId`, until `done`, AU-5, AU-8), one command
//! at a time through [`AuthStep`]. The connection machine ([`crate::connection`]) sends the
//! commands; monitoring connections never authenticate (AU-2, MO-3). Authentication commands carry
//! no `lsid` and no `$clusterTime` (SE-13, SE-19).
//!
//! Nothing secret is ever printed: `Debug` of [`Credential`] and [`AuthOptions`] hides the user
//! name and password, and errors name the mechanism, never the credential.

use alloc::boxed::Box;
use alloc::string::{String, ToString};
use alloc::sync::Arc;
use alloc::vec::Vec;
use bson::spec::BinarySubtype;
use bson::{doc, Binary, Bson, Document};
use core::fmt;

use crate::address::ServerAddress;
use crate::error::{Labels, OperationError};
use crate::handshake::{insert_api_fields, ServerApi};

/// A user's credential as the URI or the application gives it (AU-1, AU-10).
///
/// `Debug` shows the source and the mechanism only: the user name and password are redacted.
#[derive(Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Credential {
    /// The user name (raw, never SASLprep'd: AU-3, AU-7).
    pub username: Option<String>,
    /// The password.
    pub password: Option<String>,
    /// The database the user is defined in (AU-10: `authSource`, else the URI's database, else
    /// the mechanism's default).
    pub source: String,
    /// The mechanism the user asked for; `None` negotiates (AU-3).
    pub mechanism: Option<String>,
    /// `authMechanismProperties`, keys as given.
    pub mechanism_properties: Document,
}

impl Credential {
    /// A user name and password in `source`, mechanism negotiated.
    pub fn new(
        username: impl Into<String>,
        password: impl Into<String>,
        source: impl Into<String>,
    ) -> Credential {
        Credential {
            username: Some(username.into()),
            password: Some(password.into()),
            source: source.into(),
            mechanism: None,
            mechanism_properties: Document::new(),
        }
    }
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let set = |v: &Option<String>| if v.is_some() { "<redacted>" } else { "None" };
        f.debug_struct("Credential")
            .field("username", &format_args!("{}", set(&self.username)))
            .field("password", &format_args!("{}", set(&self.password)))
            .field("source", &self.source)
            .field("mechanism", &self.mechanism)
            .field(
                "mechanism_properties",
                &self.mechanism_properties.keys().collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// A client-side authentication failure: the mechanism refused what the server sent (a wrong
/// server signature, too few iterations, a bad payload) or could not start (a password SASLprep
/// rejects). It names the mechanism and never the credential.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AuthError {
    /// The mechanism, e.g. `SCRAM-SHA-256`.
    pub mechanism: String,
    /// What went wrong.
    pub message: String,
}

impl AuthError {
    /// An error of `mechanism`.
    pub fn new(mechanism: impl Into<String>, message: impl Into<String>) -> AuthError {
        AuthError {
            mechanism: mechanism.into(),
            message: message.into(),
        }
    }
}

impl fmt::Display for AuthError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "authentication failed ({}): {}",
            self.mechanism, self.message
        )
    }
}

impl core::error::Error for AuthError {}

/// How a mechanism starts on one connection.
pub enum MechanismStart {
    /// A SASL conversation (AU-5): `saslStart` carries `payload`, and each server payload goes to
    /// `conversation`.
    Sasl {
        /// The client's first message.
        payload: Vec<u8>,
        /// The rest of the conversation.
        conversation: Box<dyn SaslConversation>,
    },
    /// One command, without `$db` (MONGODB-X509's `{authenticate: 1, mechanism, user?}`); an
    /// `ok: 1` reply completes authentication.
    Command(Document),
}

impl fmt::Debug for MechanismStart {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MechanismStart::Sasl { .. } => f.write_str("Sasl { .. }"),
            MechanismStart::Command(_) => f.write_str("Command(..)"),
        }
    }
}

/// An authentication mechanism: one value per client, shared by every connection.
///
/// Implement it to add a mechanism; the engine runs the conversation (see the module docs).
pub trait Mechanism: Send + Sync + fmt::Debug {
    /// The name the server knows it by (`SCRAM-SHA-256`, `MONGODB-X509`, ...).
    fn name(&self) -> &str;

    /// AU-4: whether the first message may go in the `hello` as `speculativeAuthenticate`.
    fn speculative(&self) -> bool {
        true
    }

    /// Starts one connection's conversation (a fresh nonce each time, AU-4).
    fn start(&self) -> Result<MechanismStart, AuthError>;
}

/// The client side of one SASL conversation (RFC 4422).
pub trait SaslConversation: Send + fmt::Debug {
    /// The server's next payload in, the client's next payload out (empty when the client has
    /// nothing more to say, AU-8's long form).
    fn step(&mut self, server_payload: &[u8]) -> Result<Vec<u8>, AuthError>;

    /// Whether the client is satisfied (SCRAM: the server's signature checked, AU-6); the
    /// server's `done: true` is accepted only then.
    fn is_complete(&self) -> bool;
}

/// Which mechanism a client uses.
#[derive(Clone)]
enum Choice {
    /// The user named it: it always wins (AU-3).
    Fixed(Arc<dyn Mechanism>),
    /// AU-3: speculate with `preferred` and ask for `saslSupportedMechs`; use `preferred` when
    /// the server lists it, else `fallback`.
    Negotiate {
        user: String,
        preferred: Arc<dyn Mechanism>,
        fallback: Arc<dyn Mechanism>,
    },
}

/// A client's authentication: the source database and the mechanism (or the two to negotiate
/// between). Cheap to clone; `Debug` shows the source and the mechanism names only.
#[derive(Clone)]
pub struct AuthOptions {
    source: String,
    choice: Choice,
}

impl fmt::Debug for AuthOptions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("AuthOptions");
        s.field("source", &self.source);
        match &self.choice {
            Choice::Fixed(m) => s.field("mechanism", &m.name()),
            Choice::Negotiate {
                preferred,
                fallback,
                ..
            } => s.field("negotiate", &[preferred.name(), fallback.name()]),
        };
        s.finish_non_exhaustive()
    }
}

impl AuthOptions {
    /// Authenticate with `mechanism` against the database `source`.
    pub fn new(source: impl Into<String>, mechanism: Arc<dyn Mechanism>) -> AuthOptions {
        AuthOptions {
            source: source.into(),
            choice: Choice::Fixed(mechanism),
        }
    }

    /// AU-3: no mechanism was given. The `hello` carries `saslSupportedMechs: "<source>.<user>"`
    /// (the raw user name) and a speculative conversation of `preferred`; when the server does
    /// not take it, `preferred` is used if the reply lists it, else `fallback` (SCRAM-SHA-256,
    /// else SCRAM-SHA-1, even when unlisted or with no list).
    pub fn negotiated(
        source: impl Into<String>,
        user: impl Into<String>,
        preferred: Arc<dyn Mechanism>,
        fallback: Arc<dyn Mechanism>,
    ) -> AuthOptions {
        AuthOptions {
            source: source.into(),
            choice: Choice::Negotiate {
                user: user.into(),
                preferred,
                fallback,
            },
        }
    }

    /// The source database.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The mechanism a speculative conversation uses.
    fn first(&self) -> &Arc<dyn Mechanism> {
        match &self.choice {
            Choice::Fixed(m) => m,
            Choice::Negotiate { preferred, .. } => preferred,
        }
    }
}

/// What the connection does next.
#[derive(Debug, PartialEq)]
#[non_exhaustive]
pub enum AuthStep {
    /// Send this command (with `$db`) and feed its reply to [`Authentication::handle_reply`].
    Send(Document),
    /// The connection is authenticated.
    Done,
}

/// Why authentication failed.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum AuthFailure {
    /// The mechanism refused (see [`AuthError`]).
    Client(AuthError),
    /// The server answered an authentication command with an error (e.g. 18
    /// `AuthenticationFailed`).
    Server(OperationError),
    /// A reply that does not follow the SASL protocol (missing `conversationId` or `payload`,
    /// `done` before the client was satisfied, too many steps).
    Protocol(String),
}

impl fmt::Display for AuthFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AuthFailure::Client(e) => write!(f, "{e}"),
            AuthFailure::Server(e) => write!(f, "authentication failed: {e}"),
            AuthFailure::Protocol(m) => write!(f, "authentication failed: {m}"),
        }
    }
}

impl AuthFailure {
    /// The error the operation waiting for the connection sees. A server error keeps its code
    /// (SDAM reads state-change codes) but loses the overload labels: HS-9 labels no error of the
    /// authentication step. The others are handshake errors naming the failure, with no labels.
    /// Every one names `address`, the server that was authenticating.
    pub fn into_operation_error(self, address: &ServerAddress) -> OperationError {
        match self {
            AuthFailure::Server(mut e) => {
                e.address = Some(address.clone());
                e.labels = e
                    .labels
                    .names()
                    .filter(|n| !matches!(*n, "SystemOverloadedError" | "RetryableError"))
                    .filter_map(Labels::from_name)
                    .fold(Labels::NONE, Labels::union);
                e
            }
            other => OperationError {
                kind: crate::error::ErrorKind::Handshake {
                    message: other.to_string(),
                },
                labels: Labels::NONE,
                address: Some(address.clone()),
            },
        }
    }
}

/// AU-8: a conversation that needs more round trips than this is a broken server.
const MAX_STEPS: u32 = 16;

/// Where one connection's authentication is.
#[derive(Debug)]
enum Phase {
    /// Before the `hello` reply; the speculative start, if one was sent.
    Hello(Option<Speculation>),
    /// A SASL conversation on the server's `conversationId` (known after the first reply).
    Sasl {
        mechanism: String,
        conversation: Box<dyn SaslConversation>,
        id: Option<Bson>,
        steps: u32,
    },
    /// A single command is out.
    Command,
    Finished,
}

#[derive(Debug)]
struct Speculation {
    mechanism: String,
    /// `None` for a single-command mechanism.
    conversation: Option<Box<dyn SaslConversation>>,
}

/// One connection's authentication (see the module docs). Made by [`Authentication::new`] when
/// the connection is created, so that its `hello` can carry the speculative start. `Debug` shows
/// the options and the phase, never the hello fields (they hold the user name).
pub struct Authentication {
    options: AuthOptions,
    phase: Phase,
    /// The fields [`Authentication::add_to_hello`] adds.
    hello_fields: Document,
    /// The declared Stable API version's fields, on every command of the conversation
    /// (versioned-api spec: every command); empty when none is declared.
    api_fields: Document,
}

impl fmt::Debug for Authentication {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Authentication")
            .field("options", &self.options)
            .field("phase", &self.phase)
            .finish_non_exhaustive()
    }
}

impl Authentication {
    /// Prepares one connection's authentication: `saslSupportedMechs` when negotiating (AU-3) and
    /// a speculative start when the mechanism allows it (AU-4, HS-8). A mechanism that cannot
    /// start here simply does not speculate; it fails after the `hello`, where the error reaches
    /// the operation.
    pub fn new(options: &AuthOptions) -> Authentication {
        let mut hello_fields = Document::new();
        if let Choice::Negotiate { user, .. } = &options.choice {
            hello_fields.insert(
                "saslSupportedMechs",
                alloc::format!("{}.{user}", options.source),
            );
        }
        let first = options.first();
        let mut speculation = None;
        if first.speculative() {
            if let Ok(start) = first.start() {
                let (mut command, conversation) = first_command(first.name(), start);
                command.insert("db", options.source.as_str());
                hello_fields.insert("speculativeAuthenticate", command);
                speculation = Some(Speculation {
                    mechanism: first.name().into(),
                    conversation,
                });
            }
        }
        Authentication {
            options: options.clone(),
            phase: Phase::Hello(speculation),
            hello_fields,
            api_fields: Document::new(),
        }
    }

    /// This authentication for a client that declares the Stable API version `api`
    /// ([`HandshakeOptions::server_api`](crate::handshake::HandshakeOptions::server_api)): every
    /// command of the conversation (`saslStart`, `saslContinue`, a single-command mechanism's)
    /// then carries `apiVersion`, and `apiStrict` / `apiDeprecationErrors` when set
    /// (versioned-api spec, "Sending Declared API Version to the Server": every command). The
    /// `hello` gets them from the handshake (HS-2), not from here. The engine calls it for its
    /// pooled connections; a caller driving [`crate::connection::Connection`] itself calls it
    /// with the `server_api` of its handshake.
    #[must_use]
    pub fn with_server_api(mut self, api: &ServerApi) -> Authentication {
        self.api_fields = api.fields();
        self
    }

    /// Adds the declared API version's fields (if any) and `$db` (the credential's source) to
    /// one of the conversation's commands.
    fn finish_command(&self, command: &mut Document) {
        insert_api_fields(&self.api_fields, command);
        command.insert("$db", self.options.source.as_str());
    }

    /// HS-4: adds `saslSupportedMechs` and `speculativeAuthenticate` to a handshake command,
    /// keeping `$db` last.
    pub fn add_to_hello(&self, hello: &mut Document) {
        let db = hello.remove("$db");
        for (k, v) in &self.hello_fields {
            hello.insert(k.clone(), v.clone());
        }
        if let Some(db) = db {
            hello.insert("$db", db);
        }
    }

    /// Input: the validated `hello` reply. Continues the speculative conversation when the reply
    /// has `speculativeAuthenticate` (AU-4); otherwise starts the negotiated (or given) mechanism
    /// afresh (AU-3, HS-8).
    pub fn handle_hello(&mut self, reply: &Document) -> Result<AuthStep, AuthFailure> {
        let Phase::Hello(speculation) = core::mem::replace(&mut self.phase, Phase::Finished) else {
            return Err(AuthFailure::Protocol("unexpected hello reply".into()));
        };
        if let (Some(speculation), Ok(first)) =
            (speculation, reply.get_document("speculativeAuthenticate"))
        {
            return match speculation.conversation {
                None => Ok(AuthStep::Done),
                Some(conversation) => {
                    self.phase = Phase::Sasl {
                        mechanism: speculation.mechanism,
                        conversation,
                        id: None,
                        steps: 0,
                    };
                    self.sasl_reply(first)
                }
            };
        }
        let mechanism = match &self.options.choice {
            Choice::Fixed(m) => m.clone(),
            Choice::Negotiate {
                preferred,
                fallback,
                ..
            } => {
                let listed = reply
                    .get_array("saslSupportedMechs")
                    .is_ok_and(|mechs| mechs.iter().any(|m| m.as_str() == Some(preferred.name())));
                if listed {
                    preferred.clone()
                } else {
                    fallback.clone()
                }
            }
        };
        let start = mechanism.start().map_err(AuthFailure::Client)?;
        let (mut command, conversation) = first_command(mechanism.name(), start);
        self.finish_command(&mut command);
        self.phase = match conversation {
            Some(conversation) => Phase::Sasl {
                mechanism: mechanism.name().into(),
                conversation,
                id: None,
                steps: 0,
            },
            None => Phase::Command,
        };
        Ok(AuthStep::Send(command))
    }

    /// Input: the reply to the command of the last [`AuthStep::Send`].
    pub fn handle_reply(&mut self, reply: &Document) -> Result<AuthStep, AuthFailure> {
        if let Some(mut error) = OperationError::from_reply(reply, &ServerAddress::new("", 0)) {
            // The conversation does not know its server: `into_operation_error` names it.
            error.address = None;
            self.phase = Phase::Finished;
            return Err(AuthFailure::Server(error));
        }
        match &self.phase {
            Phase::Command => {
                self.phase = Phase::Finished;
                Ok(AuthStep::Done)
            }
            Phase::Sasl { .. } => self.sasl_reply(reply),
            _ => Err(AuthFailure::Protocol("unexpected reply".into())),
        }
    }

    /// AU-5, AU-8: one SASL reply (`conversationId`, `payload`, `done`).
    fn sasl_reply(&mut self, reply: &Document) -> Result<AuthStep, AuthFailure> {
        let Phase::Sasl {
            mechanism,
            conversation,
            id,
            steps,
        } = &mut self.phase
        else {
            return Err(AuthFailure::Protocol("unexpected SASL reply".into()));
        };
        let protocol = |m: &str| Err(AuthFailure::Protocol(alloc::format!("{mechanism}: {m}")));
        let reply_id = match reply.get("conversationId") {
            Some(v @ (Bson::Int32(_) | Bson::Int64(_))) => v.clone(),
            _ => return protocol("the reply has no integer conversationId"),
        };
        if id.as_ref().is_some_and(|id| *id != reply_id) {
            return protocol("the reply's conversationId changed");
        }
        let payload: &[u8] = match reply.get("payload") {
            Some(Bson::Binary(b)) => &b.bytes,
            None => &[],
            Some(_) => return protocol("the reply's payload is not binary"),
        };
        let done = reply.get_bool("done").unwrap_or(false);
        *steps += 1;
        if *steps > MAX_STEPS {
            return protocol("the conversation did not end");
        }
        let client = if done && conversation.is_complete() {
            Vec::new()
        } else {
            conversation.step(payload).map_err(AuthFailure::Client)?
        };
        if done {
            return if conversation.is_complete() {
                self.phase = Phase::Finished;
                Ok(AuthStep::Done)
            } else {
                protocol("the server ended the conversation before proving itself")
            };
        }
        let mut command = doc! {
            "saslContinue": 1,
            "conversationId": reply_id.clone(),
            "payload": Binary { subtype: BinarySubtype::Generic, bytes: client },
        };
        *id = Some(reply_id);
        self.finish_command(&mut command);
        Ok(AuthStep::Send(command))
    }
}

/// AU-5, AU-8: a mechanism's first command (`saslStart` with `skipEmptyExchange`, or its own
/// command), without `$db`, and the conversation that continues it.
fn first_command(
    mechanism: &str,
    start: MechanismStart,
) -> (Document, Option<Box<dyn SaslConversation>>) {
    match start {
        MechanismStart::Sasl {
            payload,
            conversation,
        } => (
            doc! {
                "saslStart": 1,
                "mechanism": mechanism,
                "payload": Binary { subtype: BinarySubtype::Generic, bytes: payload },
                "options": { "skipEmptyExchange": true },
            },
            Some(conversation),
        ),
        MechanismStart::Command(command) => (command, None),
    }
}

/// A toy SASL mechanism for the tests of this module and of the connection machine.
#[cfg(test)]
pub(crate) mod toy {
    use super::*;

    /// A toy mechanism: the client sends "hi", expects "proof" and answers "ok", then is
    /// complete once the server says "verified".
    #[derive(Debug)]
    pub(crate) struct Toy(pub(crate) &'static str, pub(crate) bool);

    #[derive(Debug)]
    pub(crate) struct ToyConversation(u8);

    impl Mechanism for Toy {
        fn name(&self) -> &str {
            self.0
        }
        fn speculative(&self) -> bool {
            self.1
        }
        fn start(&self) -> Result<MechanismStart, AuthError> {
            Ok(MechanismStart::Sasl {
                payload: b"hi".to_vec(),
                conversation: Box::new(ToyConversation(0)),
            })
        }
    }

    impl SaslConversation for ToyConversation {
        fn step(&mut self, server: &[u8]) -> Result<Vec<u8>, AuthError> {
            match (self.0, server) {
                (0, b"proof") => {
                    self.0 = 1;
                    Ok(b"ok".to_vec())
                }
                (1, b"verified") => {
                    self.0 = 2;
                    Ok(Vec::new())
                }
                (2, b"") => Ok(Vec::new()),
                _ => Err(AuthError::new("TOY", "unexpected server payload")),
            }
        }
        fn is_complete(&self) -> bool {
            self.0 == 2
        }
    }
}

#[cfg(test)]
mod tests {
    use super::toy::Toy;
    use super::*;
    use crate::error::ErrorKind;

    fn bin(b: &[u8]) -> Binary {
        Binary {
            subtype: BinarySubtype::Generic,
            bytes: b.to_vec(),
        }
    }

    fn negotiated() -> AuthOptions {
        AuthOptions::negotiated(
            "admin",
            "al.ice",
            Arc::new(Toy("SCRAM-SHA-256", true)),
            Arc::new(Toy("SCRAM-SHA-1", true)),
        )
    }

    /// AU-3, AU-4; also HS-8: a credential without a mechanism sends a speculative SCRAM-SHA-256
    /// `saslStart` plus `saslSupportedMechs`.
    #[test]
    fn au3_au4_negotiation_adds_supported_mechs_and_a_speculative_sasl_start_with_db() {
        let auth = Authentication::new(&negotiated());
        let mut hello = doc! { "isMaster": 1, "$db": "admin" };
        auth.add_to_hello(&mut hello);
        assert_eq!(
            hello,
            doc! {
                "isMaster": 1,
                "saslSupportedMechs": "admin.al.ice",
                "speculativeAuthenticate": {
                    "saslStart": 1, "mechanism": "SCRAM-SHA-256", "payload": bin(b"hi"),
                    "options": { "skipEmptyExchange": true }, "db": "admin",
                },
                "$db": "admin",
            }
        );
    }

    /// AU-3; also HS-8: a hello reply without `speculativeAuthenticate` runs normal auth
    /// (`saslStart`).
    #[test]
    fn au3_unlisted_preferred_falls_back_and_an_explicit_mechanism_always_wins() {
        for (mechs, expected) in [
            (Some(vec!["SCRAM-SHA-1", "SCRAM-SHA-256"]), "SCRAM-SHA-256"),
            (Some(vec!["SCRAM-SHA-1"]), "SCRAM-SHA-1"),
            (Some(vec!["PLAIN"]), "SCRAM-SHA-1"),
            (None, "SCRAM-SHA-1"),
        ] {
            let mut auth = Authentication::new(&negotiated());
            let mut reply = doc! { "ok": 1 };
            if let Some(m) = mechs {
                reply.insert("saslSupportedMechs", m);
            }
            let Ok(AuthStep::Send(cmd)) = auth.handle_hello(&reply) else {
                panic!("no saslStart");
            };
            assert_eq!(cmd.get_str("mechanism").unwrap(), expected);
            assert_eq!(cmd.get_str("$db").unwrap(), "admin");
            assert!(!cmd.contains_key("lsid") && !cmd.contains_key("$clusterTime"));
        }
        let fixed = AuthOptions::new("db1", Arc::new(Toy("SCRAM-SHA-1", false)));
        let auth = Authentication::new(&fixed);
        let mut hello = doc! { "hello": 1 };
        auth.add_to_hello(&mut hello);
        assert_eq!(hello, doc! { "hello": 1 }, "no speculation, no negotiation");
        let mut auth = Authentication::new(&fixed);
        let reply = doc! { "ok": 1, "saslSupportedMechs": ["SCRAM-SHA-256"] };
        let Ok(AuthStep::Send(cmd)) = auth.handle_hello(&reply) else {
            panic!()
        };
        assert_eq!(cmd.get_str("mechanism").unwrap(), "SCRAM-SHA-1");
        assert_eq!(cmd.get_str("$db").unwrap(), "db1");
    }

    #[test]
    fn au4_au5_speculative_reply_continues_on_its_conversation_id_until_done() {
        let mut auth = Authentication::new(&negotiated());
        let reply = doc! { "ok": 1, "speculativeAuthenticate": {
        "conversationId": 7, "payload": bin(b"proof"), "done": false } };
        let Ok(AuthStep::Send(cmd)) = auth.handle_hello(&reply) else {
            panic!()
        };
        assert_eq!(
            cmd,
            doc! { "saslContinue": 1, "conversationId": 7, "payload": bin(b"ok"), "$db": "admin" }
        );
        let done = doc! { "ok": 1, "conversationId": 7, "payload": bin(b"verified"), "done": true };
        assert_eq!(auth.handle_reply(&done), Ok(AuthStep::Done));
    }

    /// Versioned-api spec, "Command Syntax" (AU-5): with a declared version every command
    /// carries `apiVersion`, and `apiStrict` / `apiDeprecationErrors` only when the user set
    /// them; so an `Authentication` driven alone puts them on `saslStart` and `saslContinue`,
    /// the speculative path's `saslContinue` included, and never on the hello (HS-2 has them).
    #[test]
    fn au5_versioned_api_every_conversation_command_carries_the_declared_fields() {
        let api = ServerApi {
            version: "1".into(),
            strict: Some(true),
            deprecation_errors: None,
        };
        let mut auth = Authentication::new(&negotiated()).with_server_api(&api);
        let mut hello = doc! { "hello": 1, "$db": "admin" };
        auth.add_to_hello(&mut hello);
        assert!(!hello.contains_key("apiVersion"), "the handshake adds them");
        // No `saslSupportedMechs` in the reply: the fallback starts (AU-3).
        let Ok(AuthStep::Send(start)) = auth.handle_hello(&doc! { "ok": 1 }) else {
            panic!("no saslStart");
        };
        assert_eq!(
            start,
            doc! {
                "saslStart": 1, "mechanism": "SCRAM-SHA-1", "payload": bin(b"hi"),
                "options": { "skipEmptyExchange": true },
                "apiVersion": "1", "apiStrict": true, "$db": "admin",
            }
        );
        let proof = doc! { "ok": 1, "conversationId": 3, "payload": bin(b"proof"), "done": false };
        let Ok(AuthStep::Send(next)) = auth.handle_reply(&proof) else {
            panic!("no saslContinue");
        };
        assert_eq!(
            next,
            doc! {
                "saslContinue": 1, "conversationId": 3, "payload": bin(b"ok"),
                "apiVersion": "1", "apiStrict": true, "$db": "admin",
            }
        );
        let mut speculative = Authentication::new(&negotiated()).with_server_api(&api);
        let reply = doc! { "ok": 1, "speculativeAuthenticate": {
        "conversationId": 7, "payload": bin(b"proof"), "done": false } };
        let Ok(AuthStep::Send(next)) = speculative.handle_hello(&reply) else {
            panic!("no saslContinue");
        };
        assert_eq!(next.get("apiVersion"), Some(&Bson::from("1")));
        assert_eq!(next.get("apiStrict"), Some(&Bson::Boolean(true)));
        assert!(
            !next.contains_key("apiDeprecationErrors"),
            "not set, not sent"
        );
        assert_eq!(next.keys().last().map(String::as_str), Some("$db"));
    }

    #[test]
    fn au8_the_long_form_sends_empty_payloads_until_done() {
        let mut auth = Authentication::new(&negotiated());
        let AuthStep::Send(_) = auth.handle_hello(&doc! { "ok": 1 }).unwrap() else {
            panic!()
        };
        let step = |p: &[u8], done: bool| doc! { "ok": 1, "conversationId": 1, "payload": bin(p), "done": done };
        assert!(matches!(
            auth.handle_reply(&step(b"proof", false)),
            Ok(AuthStep::Send(_))
        ));
        let Ok(AuthStep::Send(cmd)) = auth.handle_reply(&step(b"verified", false)) else {
            panic!()
        };
        assert_eq!(
            cmd.get_binary_generic("payload").unwrap(),
            &Vec::<u8>::new()
        );
        assert_eq!(auth.handle_reply(&step(b"", true)), Ok(AuthStep::Done));
    }

    #[test]
    fn au6_done_before_the_server_proved_itself_fails() {
        let mut auth = Authentication::new(&negotiated());
        auth.handle_hello(&doc! { "ok": 1 }).unwrap();
        let early = doc! { "ok": 1, "conversationId": 1, "payload": bin(b""), "done": true };
        assert!(matches!(
            auth.handle_reply(&early),
            Err(AuthFailure::Client(_))
        ));
    }

    #[test]
    fn au11_hs9_a_server_error_keeps_its_code_but_no_overload_labels() {
        let mut auth = Authentication::new(&negotiated());
        auth.handle_hello(&doc! { "ok": 1 }).unwrap();
        let reply = doc! { "ok": 0, "code": 18, "codeName": "AuthenticationFailed",
        "errmsg": "Authentication failed.",
        "errorLabels": ["SystemOverloadedError", "RetryableError", "NoWritesPerformed"] };
        let Err(failure) = auth.handle_reply(&reply) else {
            panic!()
        };
        assert!(!failure.to_string().contains(":0"), "{failure}");
        let e = failure.into_operation_error(&ServerAddress::new("db", 1));
        assert_eq!(e.labels, Labels::NO_WRITES_PERFORMED);
        assert_eq!(e.server_error().and_then(|s| s.code), Some(18));
        assert!(e.to_string().contains("Authentication failed"));
        // Review item 15: the error names the server that refused the credential.
        assert_eq!(e.address, Some(ServerAddress::new("db", 1)));
        assert!(e.to_string().ends_with("from db:1"), "{e}");
    }

    #[test]
    fn client_failures_are_handshake_errors_naming_authentication() {
        let failure = AuthFailure::Client(AuthError::new("SCRAM-SHA-256", "bad server signature"));
        let e = failure.into_operation_error(&ServerAddress::new("db", 1));
        assert!(matches!(e.kind, ErrorKind::Handshake { .. }));
        assert!(e.labels.is_empty());
        assert!(
            e.to_string().starts_with(
                "handshake failed: authentication failed (SCRAM-SHA-256): bad server signature"
            ),
            "{e}"
        );
    }

    proptest::proptest! {
        /// No reply, however malformed, panics the conversation, and it ends within MAX_STEPS.
        #[test]
        fn no_reply_sequence_panics(
            replies in proptest::collection::vec(
                (proptest::option::of(0i32..3), proptest::option::of(proptest::collection::vec(0u8..255, 0..8)),
                 proptest::option::of(proptest::bool::ANY), 0i32..3),
                0..20,
            )
        ) {
            let mut auth = Authentication::new(&negotiated());
            let mut step = auth.handle_hello(&doc! { "ok": 1 });
            let mut sent = 0;
            for (id, payload, done, ok) in replies {
                if !matches!(step, Ok(AuthStep::Send(_))) {
                    break;
                }
                sent += 1;
                let mut reply = doc! { "ok": ok };
                if let Some(id) = id { reply.insert("conversationId", id); }
                if let Some(p) = payload { reply.insert("payload", bin(&p)); }
                if let Some(d) = done { reply.insert("done", d); }
                step = auth.handle_reply(&reply);
            }
            proptest::prop_assert!(sent <= MAX_STEPS + 1);
        }
    }

    #[test]
    fn credentials_are_never_in_debug() {
        let c = Credential::new("alice", "s3cret", "admin");
        let s = alloc::format!(
            "{c:?} {:?} {:?}",
            negotiated(),
            Authentication::new(&negotiated())
        );
        assert!(
            !s.contains("alice") && !s.contains("s3cret") && !s.contains("al.ice"),
            "{s}"
        );
        assert!(s.contains("admin") && s.contains("SCRAM-SHA-256"));
    }
}
