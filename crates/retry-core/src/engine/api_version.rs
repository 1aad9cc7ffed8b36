//! The declared Stable API version on every command (versioned-api spec, "Sending Declared API
//! Version to the Server"; beside WP-5's `$db`): when the client declares one
//! ([`crate::handshake::HandshakeOptions::server_api`]), every command the engine sends carries
//! `apiVersion`, and `apiStrict` / `apiDeprecationErrors` when the client set them: operations,
//! `getMore` and every command of a transaction (`commitTransaction` and `abortTransaction`
//! included) as well as the handshake (HS-2), the authentication conversation (AU-5,
//! [`Authentication::with_server_api`](crate::auth::Authentication::with_server_api)) and the
//! monitors' polling, awaitable and RTT `hello`s. A caller's own field of the same name is
//! replaced (the spec leaves such a command's behaviour undefined). Without a declared version
//! nothing is added and nothing is looked for.

use alloc::vec::Vec;
use bson::Document;

use crate::handshake::{insert_api_fields, ServerApi};

/// The declared API version's fields, built once per engine.
#[derive(Debug)]
pub(super) struct ApiFields {
    /// The fields as a document, in their wire order (for the started event and the monitors).
    document: Document,
    /// The same fields pre-encoded as BSON elements, appended to an operation's body.
    elements: Vec<u8>,
}

impl ApiFields {
    /// The fields of `api`: `apiVersion`, then `apiStrict` and `apiDeprecationErrors` if set
    /// (even when equal to the server's default).
    pub(super) fn new(api: &ServerApi) -> ApiFields {
        let document = api.fields();
        // A document's bytes are its length (4 bytes), its elements and a final NUL. Keys and a
        // version string with a NUL byte cannot encode: the handshake, which carries the same
        // fields, already refuses them (`EngineError::HandshakeEncoding`).
        let elements = document
            .to_vec()
            .ok()
            .and_then(|bytes| {
                bytes
                    .get(4..bytes.len().saturating_sub(1))
                    .map(<[u8]>::to_vec)
            })
            .unwrap_or_default();
        ApiFields { document, elements }
    }

    /// The fields as BSON elements, to append to a body being encoded.
    pub(super) fn elements(&self) -> &[u8] {
        &self.elements
    }

    /// Adds the fields to `command` (replacing any of the same name).
    pub(super) fn insert_into(&self, command: &mut Document) {
        insert_api_fields(&self.document, command);
    }

    /// Removes the caller's own API fields from `command`: the appended ones replace them.
    pub(super) fn strip(command: &mut Document) {
        if command
            .keys()
            .any(|key| ServerApi::KEYS.contains(&key.as_str()))
        {
            for key in ServerApi::KEYS {
                command.remove(key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn api(strict: Option<bool>, deprecation_errors: Option<bool>) -> ServerApi {
        ServerApi {
            version: "1".into(),
            strict,
            deprecation_errors,
        }
    }

    /// versioned-api spec: `apiStrict` / `apiDeprecationErrors` only when set, `false` included.
    #[test]
    fn versioned_api_fields_are_those_the_client_set() {
        let fields = ApiFields::new(&api(None, Some(false)));
        assert_eq!(
            fields.document,
            doc! { "apiVersion": "1", "apiDeprecationErrors": false }
        );
        let mut encoded = doc! { "ping": 1 }.to_vec().expect("encodes");
        encoded.pop();
        encoded.extend_from_slice(fields.elements());
        encoded.push(0);
        let len = (encoded.len() as i32).to_le_bytes();
        encoded[..4].copy_from_slice(&len);
        assert_eq!(
            Document::from_reader(&mut encoded.as_slice()).expect("decodes"),
            doc! { "ping": 1, "apiVersion": "1", "apiDeprecationErrors": false }
        );
        let all = ApiFields::new(&api(Some(true), Some(true)));
        assert_eq!(
            all.document,
            doc! { "apiVersion": "1", "apiStrict": true, "apiDeprecationErrors": true }
        );
    }

    /// versioned-api spec: a caller's own fields are replaced, never sent twice.
    #[test]
    fn versioned_api_callers_fields_are_found_and_stripped() {
        let mut command = doc! { "find": "c", "apiVersion": "2", "apiStrict": false };
        ApiFields::strip(&mut command);
        assert_eq!(command, doc! { "find": "c" });
    }
}
