//! The credential a connection string describes (AU-1, AU-10, AU-13), checked by the auth spec's
//! rules for every mechanism it names, whether or not this client implements it:
//!
//! - userinfo (any `@`) or `authMechanism` creates a credential; a database or `authSource` alone
//!   does not (AU-1, URI-5);
//! - the source is `authSource`, else the URI's database, else `admin` for SCRAM (and no
//!   mechanism), `$external` for PLAIN; GSSAPI, MONGODB-X509, MONGODB-AWS and MONGODB-OIDC always
//!   use `$external`, and another `authSource` is an error (AU-10);
//! - each mechanism's required and forbidden fields and its properties (AU-13): property names
//!   are matched without regard to case and stored in the spec's spelling; an unknown property
//!   is an error; GSSAPI's `SERVICE_NAME` defaults to `mongodb`.
//!
//! Errors name the mechanism and the field, never the password.

use bson::Document;
use retry_core::auth::Credential;

use crate::options::OptionsError;

/// The parts of a connection string a credential comes from.
pub(crate) struct UriAuth<'a> {
    pub(crate) username: Option<&'a str>,
    pub(crate) password: Option<&'a str>,
    pub(crate) database: Option<&'a str>,
    pub(crate) mechanism: Option<&'a str>,
    pub(crate) source: Option<&'a str>,
    pub(crate) properties: &'a [(String, String)],
}

/// The properties each mechanism accepts from a URI (AU-13).
fn known_properties(mechanism: &str) -> &'static [&'static str] {
    match mechanism {
        "GSSAPI" => &[
            "SERVICE_NAME",
            "CANONICALIZE_HOST_NAME",
            "SERVICE_REALM",
            "SERVICE_HOST",
        ],
        "MONGODB-OIDC" => &["ENVIRONMENT", "TOKEN_RESOURCE"],
        _ => &[],
    }
}

/// AU-1, AU-10, AU-13: the credential of a parsed URI, `None` when it describes none.
pub(crate) fn from_uri(uri: UriAuth<'_>) -> Result<Option<Credential>, OptionsError> {
    if uri.username.is_none() && uri.mechanism.is_none() {
        return Ok(None);
    }
    let name = uri.mechanism.unwrap_or("SCRAM");
    let error = |reason: &str| Err(OptionsError::new("authMechanism", name, reason));
    let external = matches!(
        name,
        "GSSAPI" | "MONGODB-X509" | "MONGODB-AWS" | "MONGODB-OIDC"
    );
    let source = if external {
        if uri.source.is_some_and(|s| s != "$external") {
            return error("the authSource must be $external");
        }
        "$external".to_string()
    } else {
        let default = if name == "PLAIN" {
            "$external"
        } else {
            "admin"
        };
        uri.source.or(uri.database).unwrap_or(default).to_string()
    };
    let mut properties = Document::new();
    for (key, value) in uri.properties {
        let Some(canonical) = known_properties(name)
            .iter()
            .find(|k| k.eq_ignore_ascii_case(key))
        else {
            return Err(OptionsError::new(
                "authMechanismProperties",
                key,
                format!("is not a property of {name}"),
            ));
        };
        properties.insert(*canonical, value.as_str());
    }
    let (user, password) = (uri.username.is_some(), uri.password.is_some());
    match name {
        "SCRAM" | "SCRAM-SHA-1" | "SCRAM-SHA-256" | "PLAIN" if !user => {
            return error("a user name is required")
        }
        "GSSAPI" if !user => return error("a user name is required"),
        "GSSAPI" => {
            let canonicalize = properties.get_str("CANONICALIZE_HOST_NAME").ok();
            let allowed = ["none", "forward", "forwardAndReverse", "true", "false"];
            if canonicalize.is_some_and(|v| !allowed.contains(&v)) {
                return error(
                    "CANONICALIZE_HOST_NAME must be none, forward, forwardAndReverse, true or false",
                );
            }
            if !properties.contains_key("SERVICE_NAME") {
                properties.insert("SERVICE_NAME", "mongodb");
            }
        }
        "MONGODB-X509" if password => return error("takes no password"),
        // AU-13 (2025-09-30): AWS credentials never come from the URI.
        "MONGODB-AWS" if user || password => {
            return error("takes no user name or password in the URI")
        }
        "MONGODB-OIDC" => {
            if password {
                return error("takes no password");
            }
            let environment = properties.get_str("ENVIRONMENT").ok();
            let token_resource = properties.contains_key("TOKEN_RESOURCE");
            match environment {
                // A callback may still come from the application: see `check_complete`.
                None => {}
                Some("azure" | "gcp") if !token_resource => {
                    return error("needs TOKEN_RESOURCE with the azure and gcp environments")
                }
                Some("test" | "k8s") if token_resource => {
                    return error("TOKEN_RESOURCE is only for the azure and gcp environments")
                }
                Some("azure" | "gcp" | "test" | "k8s") => {}
                Some(_) => return error("ENVIRONMENT must be test, azure, gcp or k8s"),
            }
            if user && environment.is_some_and(|e| e != "azure") {
                return error("a user name is only for the azure environment");
            }
        }
        _ => {}
    }
    let mut credential = Credential::default();
    credential.username = uri.username.map(str::to_string);
    credential.password = uri.password.map(str::to_string);
    credential.source = source;
    credential.mechanism = uri.mechanism.map(str::to_string);
    credential.mechanism_properties = properties;
    Ok(Some(credential))
}

/// AU-13: what only the client can check, since the application may add to the URI's
/// credential: MONGODB-OIDC needs an `ENVIRONMENT` property or a callback, and this client takes
/// no callbacks.
pub(crate) fn check_complete(credential: &Credential) -> Result<(), OptionsError> {
    let oidc = credential.mechanism.as_deref() == Some("MONGODB-OIDC");
    if oidc && !credential.mechanism_properties.contains_key("ENVIRONMENT") {
        return Err(OptionsError::new(
            "authMechanismProperties",
            "",
            "MONGODB-OIDC needs an ENVIRONMENT property or a callback",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use crate::ConnectionString;

    fn credential(uri: &str) -> Option<retry_core::auth::Credential> {
        ConnectionString::parse(uri)
            .unwrap_or_else(|e| panic!("{uri}: {e}"))
            .credential()
            .cloned()
    }

    #[test]
    fn au1_au10_userinfo_creates_a_credential_with_the_default_source() {
        let c = credential("mongodb://u:p@h").unwrap();
        assert_eq!(
            (
                c.username.as_deref(),
                c.password.as_deref(),
                c.source.as_str()
            ),
            (Some("u"), Some("p"), "admin")
        );
        assert_eq!(c.mechanism, None);
        assert_eq!(credential("mongodb://u:p@h/db").unwrap().source, "db");
        assert_eq!(
            credential("mongodb://u:p@h/db?authSource=x")
                .unwrap()
                .source,
            "x"
        );
        assert!(credential("mongodb://h/db?authSource=x").is_none());
        assert_eq!(
            credential("mongodb://u:p@h/db?authMechanism=PLAIN")
                .unwrap()
                .source,
            "db"
        );
        assert_eq!(
            credential("mongodb://u:p@h/?authMechanism=PLAIN")
                .unwrap()
                .source,
            "$external"
        );
    }

    #[test]
    fn au13_mechanism_rules_and_properties() {
        let c = credential(
            "mongodb://u@h/db?authMechanism=GSSAPI&authMechanismProperties=service_realm:R",
        )
        .unwrap();
        assert_eq!(c.source, "$external");
        assert_eq!(
            c.mechanism_properties,
            bson::doc! { "SERVICE_REALM": "R", "SERVICE_NAME": "mongodb" }
        );
        for bad in [
            "mongodb://h/?authMechanism=SCRAM-SHA-256",
            "mongodb://u@h/?authMechanism=GSSAPI&authSource=db",
            "mongodb://u@h/?authMechanism=GSSAPI&authMechanismProperties=CANONICALIZE_HOST_NAME:maybe",
            "mongodb://u:p@h/?authMechanism=MONGODB-X509",
            "mongodb://u:p@h/?authMechanism=MONGODB-AWS",
            "mongodb://h/?authMechanism=MONGODB-OIDC&authMechanismProperties=ENVIRONMENT:azure",
            "mongodb://u@h/?authMechanism=MONGODB-OIDC&authMechanismProperties=ENVIRONMENT:test",
            "mongodb://u:p@h/?authMechanism=SCRAM-SHA-1&authMechanismProperties=A:b",
        ] {
            let e = ConnectionString::parse(bad).expect_err(bad);
            assert!(!e.to_string().contains(":p@"), "{e}");
        }
    }
}
