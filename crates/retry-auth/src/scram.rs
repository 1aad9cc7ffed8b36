//! SCRAM (RFC 5802) as MongoDB uses it: SCRAM-SHA-1 and SCRAM-SHA-256 (RFC 7677), AU-6..AU-9.
//!
//! The client sends `n,,n=<user>,r=<client nonce>` (no channel binding; `=` and `,` in the user
//! name escaped as `=3D` / `=2C`), reads `r=<nonce>,s=<salt>,i=<iterations>`, answers
//! `c=biws,r=<nonce>,p=<proof>` and accepts only `v=<server signature>` equal to its own
//! computation. The password fed to `Hi()` is `HEX(MD5(user ":mongo:" password))` for SHA-1 and
//! the SASLprep'd password for SHA-256 (AU-7). Derived keys are cached per salt and iteration
//! count (AU-9): a mechanism value belongs to one credential, so the password and mechanism parts
//! of the spec's cache key are fixed. The cache keeps the last [`CACHED_KEYS`] pairs only, and an
//! iteration count above [`MAX_ITERATIONS`] is refused before any hashing (RFC 5802 section 9: a
//! hostile server can ask for a costly count).

use std::fmt;
use std::sync::{Arc, Mutex};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use hmac::{Hmac, KeyInit, Mac};
use md5::{Digest, Md5};
use retry_core::auth::{AuthError, Credential, Mechanism, MechanismStart, SaslConversation};
use sha1::Sha1;
use sha2::Sha256;

use crate::SharedRng;

/// AU-6: fewer iterations than this MUST fail.
pub const MIN_ITERATIONS: u32 = 4096;

/// More iterations than this are refused with an [`AuthError`], before any hashing (review5
/// item 7). `Hi()` runs synchronously where the reply is handled, so a hostile or misconfigured
/// server's count would stall every socket and deadline of the client meanwhile (house rule 8).
/// The number: a server's `scramIterationCount` (SCRAM-SHA-1) defaults to 10,000 and its
/// `scramSHA256IterationCount` to 15,000, both at least 5,000 and bounded only by their 32-bit
/// type (2,147,483,647, about 140,000 times the default: tens of minutes of PBKDF2). The highest
/// count a deployment plausibly chooses is the OWASP password-storage recommendation for
/// PBKDF2 (2023: 1,300,000 for HMAC-SHA-1, 600,000 for HMAC-SHA-256), so the cap is
/// 2,000,000: above both with room, 130 times the server's default, and a bounded stall (order
/// of a second) instead of an unbounded one.
pub const MAX_ITERATIONS: u32 = 2_000_000;

/// AU-9: how many (salt, iterations) pairs a mechanism value keeps derived keys for: one per
/// server of a deployment whose members do not share a user document is the usual worst case;
/// the oldest entry goes first, so a server that rotates salts cannot grow it.
pub const CACHED_KEYS: usize = 4;

/// Random bytes in a client nonce (base64-encoded on the wire: 32 characters).
const NONCE_BYTES: usize = 24;

/// Which SCRAM.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ScramVersion {
    /// SCRAM-SHA-1 (HMAC-SHA-1, MD5 password digest).
    Sha1,
    /// SCRAM-SHA-256 (HMAC-SHA-256, SASLprep'd password).
    Sha256,
}

impl ScramVersion {
    /// A `Debug` builder for `type_name` that shows this mechanism; what the SCRAM types add
    /// never includes a password, key or nonce.
    fn debug_struct<'a, 'b>(
        self,
        f: &'a mut fmt::Formatter<'b>,
        type_name: &str,
    ) -> fmt::DebugStruct<'a, 'b> {
        let mut debug = f.debug_struct(type_name);
        debug.field("mechanism", &self.name());
        debug
    }

    /// The mechanism's name.
    pub fn name(self) -> &'static str {
        match self {
            ScramVersion::Sha1 => "SCRAM-SHA-1",
            ScramVersion::Sha256 => "SCRAM-SHA-256",
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        fn run<M: Mac + KeyInit>(key: &[u8], data: &[u8]) -> Vec<u8> {
            // HMAC takes keys of any length.
            let mut mac = <M as KeyInit>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
            mac.update(data);
            mac.finalize().into_bytes().to_vec()
        }
        match self {
            ScramVersion::Sha1 => run::<Hmac<Sha1>>(key, data),
            ScramVersion::Sha256 => run::<Hmac<Sha256>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            ScramVersion::Sha1 => Sha1::digest(data).to_vec(),
            ScramVersion::Sha256 => Sha256::digest(data).to_vec(),
        }
    }

    /// RFC 5802 `Hi()`: PBKDF2 with this HMAC, one block.
    fn hi(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            ScramVersion::Sha1 => {
                let mut out = [0u8; 20];
                pbkdf2::pbkdf2_hmac::<Sha1>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            ScramVersion::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }

    /// AU-7: what `Hi()` is fed for `user` and `password`.
    pub fn prepare_password(self, user: &str, password: &str) -> Result<String, AuthError> {
        match self {
            ScramVersion::Sha1 => {
                let digest = Md5::digest(format!("{user}:mongo:{password}").as_bytes());
                Ok(digest.iter().map(|b| format!("{b:02x}")).collect())
            }
            ScramVersion::Sha256 => stringprep::saslprep(password)
                .map(|p| p.into_owned())
                .map_err(|_| {
                    AuthError::new(
                        self.name(),
                        "the password contains characters SASLprep (RFC 4013) prohibits",
                    )
                }),
        }
    }

    /// ClientKey and ServerKey of a prepared password.
    fn keys(self, prepared: &str, salt: &[u8], iterations: u32) -> Keys {
        let salted = self.hi(prepared.as_bytes(), salt, iterations);
        Keys {
            client: self.hmac(&salted, b"Client Key"),
            server: self.hmac(&salted, b"Server Key"),
        }
    }
}

/// The keys derived from a password, a salt and an iteration count (AU-9's cached value).
#[derive(Clone)]
struct Keys {
    client: Vec<u8>,
    server: Vec<u8>,
}

/// What every conversation of one mechanism value shares.
struct Shared {
    version: ScramVersion,
    /// The user name as it goes on the wire (escaped).
    user: String,
    /// The password `Hi()` takes, or why there is none.
    prepared: Result<String, AuthError>,
    /// AU-9: (salt, iterations) → keys, the last [`CACHED_KEYS`] pairs, oldest first.
    cache: Mutex<Vec<(Vec<u8>, u32, Keys)>>,
}

impl Shared {
    fn keys(&self, salt: &[u8], iterations: u32) -> Result<Keys, AuthError> {
        let prepared = self.prepared.as_ref().map_err(Clone::clone)?;
        let cached = self.cache.lock().ok().and_then(|c| {
            c.iter()
                .find(|(s, i, _)| s == salt && *i == iterations)
                .map(|(_, _, keys)| keys.clone())
        });
        if let Some(keys) = cached {
            return Ok(keys);
        }
        let keys = self.version.keys(prepared, salt, iterations);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHED_KEYS {
                cache.remove(0);
            }
            cache.push((salt.to_vec(), iterations, keys.clone()));
        }
        Ok(keys)
    }
}

/// A SCRAM mechanism for one credential (see the module docs). `Debug` shows the version only.
pub struct Scram {
    shared: Arc<Shared>,
    rng: SharedRng,
}

impl fmt::Debug for Scram {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared
            .version
            .debug_struct(f, "Scram")
            .finish_non_exhaustive()
    }
}

impl Scram {
    /// SCRAM `version` for `credential`, drawing client nonces from `rng`. A user name and a
    /// password are required. A password SASLprep rejects fails each conversation's start with a
    /// clear error (and never speculates).
    pub fn new(
        version: ScramVersion,
        credential: &Credential,
        rng: SharedRng,
    ) -> Result<Scram, AuthError> {
        let (Some(user), Some(password)) = (&credential.username, &credential.password) else {
            return Err(AuthError::new(
                version.name(),
                "a user name and a password are required",
            ));
        };
        Ok(Scram {
            shared: Arc::new(Shared {
                version,
                user: escape_user(user),
                prepared: version.prepare_password(user, password),
                cache: Mutex::new(Vec::new()),
            }),
            rng,
        })
    }

    /// The number of (salt, iterations) pairs whose keys are cached (at most [`CACHED_KEYS`]).
    pub fn cached_keys(&self) -> usize {
        self.shared.cache.lock().map(|c| c.len()).unwrap_or(0)
    }

    fn nonce(&self) -> String {
        let mut bytes = [0u8; NONCE_BYTES];
        match self.rng.lock() {
            Ok(mut rng) => rng.fill_bytes(&mut bytes),
            Err(poisoned) => poisoned.into_inner().fill_bytes(&mut bytes),
        }
        B64.encode(bytes)
    }
}

impl Mechanism for Scram {
    fn name(&self) -> &str {
        self.shared.version.name()
    }

    fn start(&self) -> Result<MechanismStart, AuthError> {
        if let Err(e) = &self.shared.prepared {
            return Err(e.clone());
        }
        let (payload, conversation) = ClientConversation::start(self.shared.clone(), self.nonce());
        Ok(MechanismStart::Sasl {
            payload,
            conversation: Box::new(conversation),
        })
    }
}

/// AU-6: `=` → `=3D`, `,` → `=2C` in a SCRAM user name.
fn escape_user(user: &str) -> String {
    user.replace('=', "=3D").replace(',', "=2C")
}

/// The inverse of [`escape_user`]; `None` for a bad escape.
fn unescape_user(user: &str) -> Option<String> {
    let mut out = String::with_capacity(user.len());
    let mut rest = user;
    while let Some(at) = rest.find('=') {
        out.push_str(&rest[..at]);
        match rest.get(at..at + 3) {
            Some("=3D") => out.push('='),
            Some("=2C") => out.push(','),
            _ => return None,
        }
        rest = &rest[at + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The attributes of a SCRAM message, in order (`a=value`).
fn attributes(message: &[u8]) -> Option<Vec<(char, &str)>> {
    let text = std::str::from_utf8(message).ok()?;
    text.split(',')
        .map(|part| {
            let mut chars = part.chars();
            let name = chars.next()?;
            let value = part.get(1..)?.strip_prefix('=')?;
            Some((name, value))
        })
        .collect()
}

fn attribute<'a>(attrs: &[(char, &'a str)], name: char) -> Option<&'a str> {
    attrs.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

/// Constant-time equality of two byte strings of equal length.
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn xor(a: &[u8], b: &[u8]) -> Vec<u8> {
    a.iter().zip(b).map(|(x, y)| x ^ y).collect()
}

enum ClientState {
    /// client-first sent.
    First { nonce: String, bare: String },
    /// client-final sent; the server signature we expect.
    Final { server_signature: Vec<u8> },
    /// The server proved itself.
    Complete,
    /// Failed; every later step fails.
    Failed,
}

/// The client side of one SCRAM conversation.
struct ClientConversation {
    shared: Arc<Shared>,
    state: ClientState,
}

impl fmt::Debug for ClientConversation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared
            .version
            .debug_struct(f, "ScramConversation")
            .field("complete", &self.is_complete())
            .finish_non_exhaustive()
    }
}

impl ClientConversation {
    /// client-first with `nonce`.
    fn start(shared: Arc<Shared>, nonce: String) -> (Vec<u8>, ClientConversation) {
        let bare = format!("n={},r={nonce}", shared.user);
        let payload = format!("n,,{bare}").into_bytes();
        (
            payload,
            ClientConversation {
                shared,
                state: ClientState::First { nonce, bare },
            },
        )
    }

    fn error(&mut self, message: impl Into<String>) -> AuthError {
        self.state = ClientState::Failed;
        AuthError::new(self.shared.version.name(), message)
    }

    /// server-first → client-final.
    fn client_final(&mut self, server_first: &[u8]) -> Result<Vec<u8>, AuthError> {
        let ClientState::First { nonce, bare } = &self.state else {
            return Err(self.error("unexpected server-first message"));
        };
        let Some(attrs) = attributes(server_first) else {
            return Err(self.error("malformed server-first message"));
        };
        if attribute(&attrs, 'm').is_some() {
            return Err(self.error("the server requires an unsupported extension"));
        }
        let (Some(server_nonce), Some(salt), Some(iterations)) = (
            attribute(&attrs, 'r'),
            attribute(&attrs, 's'),
            attribute(&attrs, 'i'),
        ) else {
            return Err(self.error("server-first message lacks r, s or i"));
        };
        if !server_nonce.starts_with(nonce.as_str()) || server_nonce.len() <= nonce.len() {
            return Err(self.error("the server nonce does not extend the client nonce"));
        }
        let Ok(salt) = B64.decode(salt) else {
            return Err(self.error("the salt is not base64"));
        };
        // A count of digits too long for u64 is still a count, just far too large.
        let count = match iterations.parse::<u64>() {
            Err(_) if !iterations.is_empty() && iterations.bytes().all(|b| b.is_ascii_digit()) => {
                Ok(u64::MAX)
            }
            count => count,
        };
        let iterations = match count {
            Ok(i) if i < u64::from(MIN_ITERATIONS) => {
                return Err(self.error(format!(
                    "iteration count {i} is below the minimum of {MIN_ITERATIONS}"
                )))
            }
            Ok(i) => match u32::try_from(i) {
                Ok(i) if i <= MAX_ITERATIONS => i,
                _ => {
                    return Err(self.error(format!(
                        "iteration count {iterations} is above the maximum of {MAX_ITERATIONS} \
                         (server defaults: 10000 for SCRAM-SHA-1, 15000 for SCRAM-SHA-256)"
                    )))
                }
            },
            Err(_) => return Err(self.error("the iteration count is not a number")),
        };
        let version = self.shared.version;
        let keys = self.shared.keys(&salt, iterations)?;
        let without_proof = format!("c=biws,r={server_nonce}");
        let auth_message = format!(
            "{bare},{},{without_proof}",
            String::from_utf8_lossy(server_first)
        );
        let stored = version.hash(&keys.client);
        let signature = version.hmac(&stored, auth_message.as_bytes());
        let proof = xor(&keys.client, &signature);
        let server_signature = version.hmac(&keys.server, auth_message.as_bytes());
        self.state = ClientState::Final { server_signature };
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// server-final: `v=` must be our server signature.
    fn verify(&mut self, server_final: &[u8]) -> Result<Vec<u8>, AuthError> {
        let ClientState::Final { server_signature } = &self.state else {
            return Err(self.error("unexpected server-final message"));
        };
        let attrs = attributes(server_final).unwrap_or_default();
        if let Some(e) = attribute(&attrs, 'e') {
            return Err(self.error(format!("the server refused: {e}")));
        }
        let ok = attribute(&attrs, 'v')
            .and_then(|v| B64.decode(v).ok())
            .is_some_and(|v| same(&v, server_signature));
        if !ok {
            return Err(self.error("the server's signature is wrong"));
        }
        self.state = ClientState::Complete;
        Ok(Vec::new())
    }
}

impl SaslConversation for ClientConversation {
    fn step(&mut self, server_payload: &[u8]) -> Result<Vec<u8>, AuthError> {
        match self.state {
            ClientState::First { .. } => self.client_final(server_payload),
            ClientState::Final { .. } => self.verify(server_payload),
            // AU-8's long form: empty exchanges after the server-final.
            ClientState::Complete if server_payload.is_empty() => Ok(Vec::new()),
            ClientState::Complete => Err(self.error("a message after the conversation ended")),
            ClientState::Failed => Err(self.error("the conversation already failed")),
        }
    }

    fn is_complete(&self) -> bool {
        matches!(self.state, ClientState::Complete)
    }
}

/// The server side of SCRAM, for test servers: parses a client-first message, answers with a
/// server-first message and checks the client's proof. Not used by clients.
pub mod server {
    use super::*;

    /// A client-first message, parsed: who wants to log in, with which nonce.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct ClientFirst {
        /// The user name (unescaped).
        pub user: String,
        nonce: String,
        bare: String,
    }

    impl ClientFirst {
        /// Parses `n,,n=<user>,r=<nonce>`; `None` when malformed or asking for channel binding.
        pub fn parse(payload: &[u8]) -> Option<ClientFirst> {
            let text = std::str::from_utf8(payload).ok()?;
            let bare = text.strip_prefix("n,,")?;
            let attrs = attributes(bare.as_bytes())?;
            Some(ClientFirst {
                user: unescape_user(attribute(&attrs, 'n')?)?,
                nonce: attribute(&attrs, 'r')?.to_string(),
                bare: bare.to_string(),
            })
        }
    }

    /// What a server stores for one user and mechanism (RFC 5802): the salt, the iteration
    /// count, StoredKey and ServerKey; never the password. `Debug` shows the mechanism only.
    #[derive(Clone)]
    pub struct StoredCredential {
        version: ScramVersion,
        salt: Vec<u8>,
        iterations: u32,
        stored_key: Vec<u8>,
        server_key: Vec<u8>,
    }

    impl fmt::Debug for StoredCredential {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.version
                .debug_struct(f, "StoredCredential")
                .field("iterations", &self.iterations)
                .finish_non_exhaustive()
        }
    }

    impl StoredCredential {
        /// Derives the stored keys of `user` / `password` with `salt` and `iterations` (AU-7's
        /// password preparation included).
        pub fn derive(
            version: ScramVersion,
            user: &str,
            password: &str,
            salt: &[u8],
            iterations: u32,
        ) -> Result<StoredCredential, AuthError> {
            let keys = version.keys(&version.prepare_password(user, password)?, salt, iterations);
            Ok(StoredCredential {
                version,
                salt: salt.to_vec(),
                iterations,
                stored_key: version.hash(&keys.client),
                server_key: keys.server,
            })
        }

        /// The mechanism.
        pub fn version(&self) -> ScramVersion {
            self.version
        }
    }

    /// One server conversation after the client-first message.
    pub struct ServerConversation {
        credential: StoredCredential,
        auth_prefix: String,
        nonce: String,
    }

    impl fmt::Debug for ServerConversation {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            self.credential
                .version
                .debug_struct(f, "ServerConversation")
                .finish_non_exhaustive()
        }
    }

    impl ServerConversation {
        /// Starts answering `first` for a user stored as `credential`, with the server's part of
        /// the nonce. Returns the server-first message.
        pub fn new(
            first: &ClientFirst,
            credential: &StoredCredential,
            server_nonce: &str,
        ) -> (ServerConversation, Vec<u8>) {
            let nonce = format!("{}{server_nonce}", first.nonce);
            let server_first = format!(
                "r={nonce},s={},i={}",
                B64.encode(&credential.salt),
                credential.iterations
            );
            let conversation = ServerConversation {
                credential: credential.clone(),
                auth_prefix: format!("{},{server_first}", first.bare),
                nonce,
            };
            (conversation, server_first.into_bytes())
        }

        /// Checks the client-final message; the server-final message (`v=<signature>`) when
        /// the proof is right, `None` when it is not.
        pub fn finish(&self, client_final: &[u8]) -> Option<Vec<u8>> {
            let text = std::str::from_utf8(client_final).ok()?;
            let (without_proof, proof) = text.rsplit_once(",p=")?;
            let attrs = attributes(without_proof.as_bytes())?;
            if attribute(&attrs, 'c') != Some("biws")
                || attribute(&attrs, 'r') != Some(self.nonce.as_str())
            {
                return None;
            }
            let proof = B64.decode(proof).ok()?;
            let auth_message = format!("{},{without_proof}", self.auth_prefix);
            let version = self.credential.version;
            let signature = version.hmac(&self.credential.stored_key, auth_message.as_bytes());
            let client_key = xor(&proof, &signature);
            if !same(&version.hash(&client_key), &self.credential.stored_key) {
                return None;
            }
            let server_signature =
                version.hmac(&self.credential.server_key, auth_message.as_bytes());
            Some(format!("v={}", B64.encode(server_signature)).into_bytes())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::server::{ClientFirst, ServerConversation, StoredCredential};
    use super::*;
    use retry_core::rng::EngineRng;

    /// A conversation whose `Hi()` input is `prepared` as given (the RFC vectors use no MD5).
    fn raw(
        version: ScramVersion,
        user: &str,
        prepared: &str,
        nonce: &str,
    ) -> (Vec<u8>, ClientConversation) {
        let shared = Arc::new(Shared {
            version,
            user: escape_user(user),
            prepared: Ok(prepared.into()),
            cache: Mutex::new(Vec::new()),
        });
        ClientConversation::start(shared, nonce.into())
    }

    fn run_vector(
        version: ScramVersion,
        nonce: &str,
        server_first: &str,
        client_final: &str,
        server_final: &str,
    ) {
        let (first, mut conv) = raw(version, "user", "pencil", nonce);
        assert_eq!(first, format!("n,,n=user,r={nonce}").into_bytes());
        let out = conv.step(server_first.as_bytes()).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), client_final);
        assert!(!conv.is_complete());
        assert_eq!(
            conv.step(server_final.as_bytes()).unwrap(),
            Vec::<u8>::new()
        );
        assert!(conv.is_complete());
    }

    #[test]
    fn au6_rfc5802_scram_sha_1_test_vector() {
        run_vector(
            ScramVersion::Sha1,
            "fyko+d2lbbFgONRv9qkxdawL",
            "r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096",
            "c=biws,r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,p=v0X8v3Bz2T0CJGbJQyF0X+HI4Ts=",
            "v=rmF9pqV8S7suAoZWja4dJRkFsKQ=",
        );
    }

    #[test]
    fn au6_rfc7677_scram_sha_256_test_vector() {
        run_vector(
            ScramVersion::Sha256,
            "rOprNGfwEbeRWgbNEkqO",
            "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=",
            "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=",
        );
    }

    #[test]
    fn au7_sha1_digests_the_password_with_md5_and_sha256_saslpreps_it() {
        let md5 = ScramVersion::Sha1
            .prepare_password("user", "pencil")
            .unwrap();
        assert_eq!(md5.len(), 32);
        assert!(md5
            .chars()
            .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
        // RFC 4013 examples: the soft hyphen maps to nothing, U+00AA and U+2168 are NFKC-folded.
        let prep = |p| ScramVersion::Sha256.prepare_password("u", p);
        assert_eq!(prep("I\u{00AD}X").unwrap(), "IX");
        assert_eq!(prep("\u{00AA}").unwrap(), "a");
        assert_eq!(prep("\u{2168}").unwrap(), "IX");
        assert!(
            prep("\u{0007}").is_err(),
            "a control character is prohibited"
        );
    }

    #[test]
    fn au6_user_names_are_escaped() {
        assert_eq!(escape_user("a=b,c"), "a=3Db=2Cc");
        assert_eq!(unescape_user("a=3Db=2Cc").as_deref(), Some("a=b,c"));
        assert_eq!(unescape_user("a=4"), None);
    }

    fn bad_server_first(server_first: &str) -> String {
        let (_, mut conv) = raw(ScramVersion::Sha256, "user", "pencil", "abc");
        conv.step(server_first.as_bytes()).unwrap_err().message
    }

    #[test]
    fn au6_the_server_first_message_is_checked() {
        assert!(bad_server_first("r=abcdef,s=QSXCR+Q6sek8bf92,i=4095").contains("4095"));
        // Above the cap: refused before any hashing, even past u32.
        for too_many in [
            "2000001",
            "2147483648",
            "4294967296",
            "99999999999999999999",
        ] {
            let error = bad_server_first(&format!("r=abcdef,s=QSXCR+Q6sek8bf92,i={too_many}"));
            assert!(
                error.contains("above the maximum of 2000000"),
                "{too_many}: {error}"
            );
        }
        assert!(bad_server_first("r=abcdef,s=QSXCR+Q6sek8bf92,i=-1").contains("not a number"));
        assert!(bad_server_first("r=xyzdef,s=QSXCR+Q6sek8bf92,i=4096").contains("nonce"));
        assert!(bad_server_first("r=abc,s=QSXCR+Q6sek8bf92,i=4096").contains("nonce"));
        assert!(bad_server_first("m=ext,r=abcdef,s=QSXCR+Q6sek8bf92,i=4096").contains("extension"));
        assert!(bad_server_first("r=abcdef,i=4096").contains("lacks"));
        assert!(bad_server_first("garbage").contains("malformed"));
    }

    #[test]
    fn au6_a_wrong_server_signature_fails_and_so_does_everything_after() {
        // The RFC 5802 example's conversation, past the server-first message.
        let past_server_first = || {
            let (_, mut conv) = raw(
                ScramVersion::Sha1,
                "user",
                "pencil",
                "fyko+d2lbbFgONRv9qkxdawL",
            );
            conv.step(b"r=fyko+d2lbbFgONRv9qkxdawL3rfcNHYJY1ZVvWVs7j,s=QSXCR+Q6sek8bf92,i=4096")
                .unwrap();
            conv
        };
        let mut conv = past_server_first();
        let e = conv.step(b"v=AAAApqV8S7suAoZWja4dJRkFsKQ=").unwrap_err();
        assert!(e.to_string().contains("signature"), "{e}");
        assert!(!conv.is_complete());
        assert!(conv.step(b"").is_err());
        let mut conv = past_server_first();
        assert!(conv
            .step(b"e=invalid-proof")
            .unwrap_err()
            .message
            .contains("invalid-proof"));
    }

    fn scram(version: ScramVersion, user: &str, password: &str, seed: u64) -> Scram {
        let credential = Credential::new(user, password, "admin");
        Scram::new(
            version,
            &credential,
            Arc::new(Mutex::new(EngineRng::from_seed_u64(seed))),
        )
        .unwrap()
    }

    /// The client-first message and the conversation of `client`'s start.
    fn start_sasl(client: &Scram) -> (Vec<u8>, Box<dyn SaslConversation>) {
        match client.start().unwrap() {
            MechanismStart::Sasl {
                payload,
                conversation,
            } => (payload, conversation),
            MechanismStart::Command(_) => panic!("SCRAM is SASL"),
        }
    }

    /// Runs `client` against the server side with `server_password`; whether the client got in.
    fn login(client: &Scram, server_password: &str, salt: &[u8]) -> Result<(), String> {
        let (payload, mut conversation) = start_sasl(client);
        let first = ClientFirst::parse(&payload).ok_or("bad client-first")?;
        let version = if client.name() == "SCRAM-SHA-1" {
            ScramVersion::Sha1
        } else {
            ScramVersion::Sha256
        };
        let stored = StoredCredential::derive(version, &first.user, server_password, salt, 4096)
            .map_err(|e| e.to_string())?;
        let (server, server_first) = ServerConversation::new(&first, &stored, "srv");
        let client_final = conversation
            .step(&server_first)
            .map_err(|e| e.to_string())?;
        let server_final = server.finish(&client_final).ok_or("wrong proof")?;
        conversation
            .step(&server_final)
            .map_err(|e| e.to_string())?;
        assert!(conversation.is_complete());
        Ok(())
    }

    #[test]
    fn au6_au7_client_and_server_agree_and_a_wrong_password_is_refused() {
        for version in [ScramVersion::Sha1, ScramVersion::Sha256] {
            let client = scram(version, "al=i,ce", "pencil", 3);
            assert_eq!(login(&client, "pencil", b"salt"), Ok(()));
            assert_eq!(
                login(&client, "pencil!", b"salt"),
                Err("wrong proof".into())
            );
        }
        // AU-7 prose step 4: SASLprep on the client and on the server.
        let client = scram(ScramVersion::Sha256, "IX", "I\u{00AD}X", 4);
        assert_eq!(login(&client, "IX", b"salt"), Ok(()));
        let client = scram(ScramVersion::Sha256, "\u{2168}", "IV", 5);
        assert_eq!(login(&client, "I\u{00AD}V", b"salt"), Ok(()));
    }

    #[test]
    fn au9_keys_are_cached_per_salt_and_iteration_count() {
        let client = scram(ScramVersion::Sha256, "u", "p", 6);
        login(&client, "p", b"salt-1").unwrap();
        login(&client, "p", b"salt-1").unwrap();
        assert_eq!(client.cached_keys(), 1);
        login(&client, "p", b"salt-2").unwrap();
        assert_eq!(client.cached_keys(), 2);
    }

    /// AU-9, house rule 8 (review5 item 7): a server that rotates salts cannot grow the cache
    /// beyond [`CACHED_KEYS`]; the newest pairs stay.
    #[test]
    fn au9_the_key_cache_is_bounded() {
        let client = scram(ScramVersion::Sha1, "u", "p", 8);
        for salt in 0..10u8 {
            login(&client, "p", &[b's', salt]).unwrap();
            assert!(client.cached_keys() <= CACHED_KEYS);
        }
        assert_eq!(client.cached_keys(), CACHED_KEYS);
        let newest = client.shared.cache.lock().unwrap();
        let salts: Vec<u8> = newest.iter().map(|(s, _, _)| s[1]).collect();
        assert_eq!(salts, [6, 7, 8, 9]);
    }

    /// RFC 5802 section 9, house rule 8 (review5 item 7): a count above [`MAX_ITERATIONS`] fails
    /// with a clear error and derives nothing (no key was computed, so none is cached).
    #[test]
    fn au6_an_iteration_count_above_the_cap_fails_without_deriving() {
        let client = scram(ScramVersion::Sha256, "u", "p", 9);
        let (payload, mut conversation) = start_sasl(&client);
        let payload = String::from_utf8(payload).unwrap();
        let nonce = payload.rsplit("r=").next().unwrap();
        let first = format!("r={nonce}srv,s=QSXCR+Q6sek8bf92,i={}", MAX_ITERATIONS + 1);
        let error = conversation.step(first.as_bytes()).unwrap_err();
        assert_eq!(error.mechanism, "SCRAM-SHA-256");
        assert!(
            error
                .message
                .contains("iteration count 2000001 is above the maximum of 2000000"),
            "{error}"
        );
        assert_eq!(client.cached_keys(), 0, "nothing was derived");
    }

    #[test]
    fn au4_each_conversation_has_a_fresh_nonce_from_the_callers_rng() {
        let nonce = |client: &Scram| match client.start().unwrap() {
            MechanismStart::Sasl { payload, .. } => String::from_utf8(payload).unwrap(),
            MechanismStart::Command(_) => unreachable!(),
        };
        let a = scram(ScramVersion::Sha256, "u", "p", 7);
        let b = scram(ScramVersion::Sha256, "u", "p", 7);
        let (a1, a2) = (nonce(&a), nonce(&a));
        assert_ne!(a1, a2);
        assert_eq!(a1, nonce(&b), "the same seed gives the same nonce");
        assert_eq!(a1.len(), "n,,n=u,r=".len() + 32);
    }

    #[test]
    fn no_server_message_panics_the_client() {
        let messages = [
            &b""[..],
            b",,,",
            b"r=",
            b"r=abc",
            b"r=abcd,s=!!!,i=5000",
            b"r=abcd,s=QQ==,i=-1",
            b"r=abcd,s=QQ==,i=99999999999",
            b"\xff\xfe",
            b"v=",
            b"e=",
            b"x",
            b"=",
        ];
        for first in messages {
            for second in messages {
                let (_, mut conv) = raw(ScramVersion::Sha256, "u", "p", "abc");
                let _ = conv.step(first);
                let _ = conv.step(second);
                let _ = conv.step(b"");
                assert!(!conv.is_complete(), "{first:?} {second:?}");
            }
        }
    }

    #[test]
    fn credentials_are_not_in_debug_or_errors() {
        let client = scram(ScramVersion::Sha256, "alice", "s3cret", 8);
        let MechanismStart::Sasl { conversation, .. } = client.start().unwrap() else {
            unreachable!()
        };
        let text = format!("{client:?} {conversation:?}");
        assert!(
            !text.contains("alice") && !text.contains("s3cret"),
            "{text}"
        );
        let bad = Credential::new("alice", "\u{0007}s3cret", "admin");
        let mech = Scram::new(
            ScramVersion::Sha256,
            &bad,
            Arc::new(Mutex::new(EngineRng::from_seed_u64(1))),
        )
        .unwrap();
        let e = mech.start().unwrap_err().to_string();
        assert!(e.contains("SASLprep") && !e.contains("s3cret"), "{e}");
    }
}
