//! The server parameters the test server knows: only `requireApiVersion` (versioned-api spec,
//! "Backward Compatibility"), set at start ([`crate::ServerConfig::require_api_version`], a real
//! server's `--setParameter requireApiVersion=true`), with `setParameter` as on a real server, or
//! through [`crate::ServerHandle::set_require_api_version`].
//!
//! While it is on, every command without `apiVersion` is refused before it runs with code 498870
//! (the server's jstests `require_api_version.js`: `ping`, `getMore`, `commitTransaction` and
//! `abortTransaction` all need it; a `setParameter` turning it off is sent with `apiVersion`).
//! Hellos are refused too: a real server's monitoring without API fields failed against such a
//! server (the C driver's CDRIVER-3940), so a client that declares no version cannot connect.

use bson::{Bson, Document};

use crate::commands::{unsupported_reply, ENVELOPE};
use crate::fail_point::error_reply;

/// The code of a command without `apiVersion` on a server that requires one.
pub(crate) const API_VERSION_REQUIRED: i32 = 498_870;

/// The refusal of `command` when the server requires an API version and it declares none.
pub(crate) fn api_version_refusal(required: bool, command: &Document) -> Option<Document> {
    (required && !command.contains_key("apiVersion")).then(|| {
        error_reply(
            API_VERSION_REQUIRED,
            "The apiVersion parameter is required, please configure your MongoClient's driver \
             to use Stable API",
        )
    })
}

/// `setParameter` on `admin` (an admin-only command elsewhere: Unauthorized, 13): sets each
/// parameter it names and answers `{was: <the previous value>, ok: 1}`. `requireApiVersion`
/// takes a boolean or a number (non-zero is true). A parameter the test server does not know,
/// or none, is TK-2's refusal: a real server knows many more.
pub(crate) fn set_parameter(require_api_version: &mut bool, command: &Document) -> Document {
    if command.get_str("$db").ok() != Some("admin") {
        return error_reply(
            13,
            "setParameter may only be run against the admin database.",
        );
    }
    let mut parameters = command
        .iter()
        .skip(1)
        .filter(|(key, _)| !ENVELOPE.contains(&key.as_str()))
        .peekable();
    if parameters.peek().is_none() {
        return unsupported_reply("setParameter without a parameter");
    }
    let mut value = None;
    for (name, given) in parameters {
        if name != "requireApiVersion" {
            return unsupported_reply(&format!("setParameter {name}"));
        }
        value = Some(match given {
            Bson::Boolean(on) => *on,
            Bson::Int32(n) => *n != 0,
            Bson::Int64(n) => *n != 0,
            Bson::Double(n) => *n != 0.0,
            other => {
                return unsupported_reply(&format!(
                    "setParameter requireApiVersion of type {:?}",
                    other.element_type()
                ))
            }
        });
    }
    let was = *require_api_version;
    if let Some(value) = value {
        *require_api_version = value;
    }
    bson::doc! { "was": was, "ok": 1.0 }
}

#[cfg(test)]
mod tests {
    use bson::doc;

    use super::*;
    use crate::fail_point::TESTKIT_UNSUPPORTED;

    /// TK-2 (review12 finding 7): every generic argument a command may carry (the one list,
    /// [`ENVELOPE`]: `readConcern` and `txnNumber` too) is not a parameter of `setParameter`;
    /// a field the test server does not know is still refused loudly.
    #[test]
    fn tk2_set_parameter_skips_every_generic_field() {
        let mut required = false;
        let command = doc! {
            "setParameter": 1, "requireApiVersion": true, "$db": "admin", "lsid": { "id": 1 },
            "txnNumber": 1_i64, "readConcern": {}, "writeConcern": { "w": 1 },
            "maxTimeMS": 10, "comment": "c", "apiVersion": "1",
        };
        let reply = set_parameter(&mut required, &command);
        assert_eq!(reply, doc! { "was": false, "ok": 1.0 });
        assert!(required);
        let unknown = set_parameter(
            &mut required,
            &doc! { "setParameter": 1, "$db": "admin", "stmtId": 0 },
        );
        assert_eq!(
            unknown.get_i32("code").ok(),
            Some(TESTKIT_UNSUPPORTED),
            "{unknown}"
        );
        assert!(required, "unchanged");
    }
}
