//! UT-4..6: `runOnRequirements` answered from the deployment the runner starts, and the fixed
//! skip reasons.

use serde_json::Value;

use super::schema::parse_version;

/// Skip reason: the test needs (or refuses) authentication and no deployment offers it. The
/// runner starts deployments with a SCRAM user for `auth: true` (UT-5: real SASL, never faked).
pub const AUTH: &str = "auth";
/// Skip reason: the test needs a server version the test server does not report.
pub const SERVER_VERSION: &str = "server version";
/// Skip reason: the test needs a server at most 4.2 (UT-6).
pub const SERVER_4_2: &str = "server<=4.2";
/// Skip reason: the test carries a `skipReason` (UT-4).
pub const SKIP_REASON: &str = "skipReason";
/// Skip reason: GridFS (`bucket` entities, UT-11).
pub const GRIDFS: &str = "gridfs";
/// Skip reason: the test needs server-side JavaScript (`mapReduce` results, UT-6).
pub const SERVER_JS: &str = "server-js";
/// Skip reason: the test steps a primary down and waits for a new one (UT-6).
pub const ELECTION: &str = "election";
/// Skip reason: log messages (`expectLogMessages`, UT-24).
pub const LOGGING: &str = "logging";
/// Skip reason: a serverless deployment is required.
pub const SERVERLESS: &str = "serverless";
/// Skip reason: client-side encryption, an auth mechanism, server parameters or a topology the
/// test server cannot start.
pub const UNSUPPORTED_REQUIREMENT: &str = "unsupported requirement";

/// The test servers' facts, asked of a started retry-testkit server (UT-5: never hard-coded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployment {
    /// `buildInfo.versionArray[0..3]`.
    pub version: [u32; 3],
    /// Whether the deployment authenticates (its servers have a SCRAM user).
    pub auth: bool,
    /// The topology started for the test (`single`, `replicaset`, `sharded`, `load-balanced`).
    pub topology: &'static str,
}

/// Skip reason: no topology the runner starts meets the requirements.
pub const TOPOLOGY: &str = "topology";

/// UT-4: `None` when `requirements` (absent, or an array any of whose objects holds) is met, else
/// the skip reason of the first object's first unmet field.
pub fn unmet(requirements: Option<&Value>, deployment: &Deployment) -> Option<&'static str> {
    let requirements = requirements?;
    let Some(list) = requirements.as_array() else {
        return Some(UNSUPPORTED_REQUIREMENT);
    };
    if list.is_empty() {
        return None;
    }
    let mut first = None;
    for requirement in list {
        match unmet_one(requirement, deployment) {
            None => return None,
            Some(reason) => {
                first.get_or_insert(reason);
            }
        }
    }
    first
}

/// One requirement object: all of its fields must hold.
fn unmet_one(requirement: &Value, deployment: &Deployment) -> Option<&'static str> {
    let Some(fields) = requirement.as_object() else {
        return Some(UNSUPPORTED_REQUIREMENT);
    };
    for (key, value) in fields {
        let reason = match key.as_str() {
            "minServerVersion" => match value.as_str().and_then(parse_version) {
                Some(min) if deployment.version >= min => None,
                _ => Some(SERVER_VERSION),
            },
            "maxServerVersion" => match value.as_str().and_then(parse_version) {
                Some(max) if deployment.version <= max => None,
                Some(max) if max <= [4, 2, 99] => Some(SERVER_4_2),
                _ => Some(SERVER_VERSION),
            },
            "topologies" => {
                let any = value
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .any(|t| {
                        t == deployment.topology
                            || (t == "sharded-replicaset" && deployment.topology == "sharded")
                    });
                (!any).then_some(TOPOLOGY)
            }
            "serverless" => match value.as_str() {
                Some("forbid" | "allow") => None,
                Some("require") => Some(SERVERLESS),
                _ => Some(UNSUPPORTED_REQUIREMENT),
            },
            "auth" => match value.as_bool() {
                Some(wanted) if wanted == deployment.auth => None,
                Some(true) => Some(AUTH),
                _ => Some(UNSUPPORTED_REQUIREMENT),
            },
            // Schema 1.25: `true` or an object (`minLibmongocryptVersion`) asks for CSFLE.
            "csfle" => (value.as_bool() != Some(false)).then_some(UNSUPPORTED_REQUIREMENT),
            _ => Some(UNSUPPORTED_REQUIREMENT),
        };
        if reason.is_some() {
            return reason;
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn eight() -> Deployment {
        Deployment {
            version: [8, 0, 0],
            auth: false,
            topology: "sharded",
        }
    }

    /// UT-4, UT-5: any object met is enough; each field answered from the deployment.
    #[test]
    fn requirements_against_the_deployment() {
        let d = eight();
        assert_eq!(unmet(None, &d), None);
        assert_eq!(unmet(Some(&json!([])), &d), None);
        assert_eq!(
            unmet(Some(&json!([{ "minServerVersion": "4.4" }])), &d),
            None
        );
        assert_eq!(
            unmet(Some(&json!([{ "maxServerVersion": "4.2.99" }])), &d),
            Some(SERVER_4_2)
        );
        assert_eq!(
            unmet(Some(&json!([{ "minServerVersion": "9.0" }])), &d),
            Some(SERVER_VERSION)
        );
        assert_eq!(unmet(Some(&json!([{ "auth": true }])), &d), Some(AUTH));
        assert_eq!(
            unmet(
                Some(&json!([{ "auth": true }, { "topologies": ["sharded-replicaset"] }])),
                &d
            ),
            None,
            "the second object holds"
        );
        assert_eq!(
            unmet(Some(&json!([{ "serverless": "require" }])), &d),
            Some(SERVERLESS)
        );
        assert_eq!(
            unmet(Some(&json!([{ "serverParameters": { "x": 1 } }])), &d),
            Some(UNSUPPORTED_REQUIREMENT),
            "no getParameter yet: not met, never assumed"
        );
    }

    /// UT-2 (schema 1.25): `csfle` as `true` or as an object asks for CSFLE, which is not
    /// supported: not met; `false` is met.
    #[test]
    fn ut2_csfle_true_or_an_object_is_not_met() {
        let d = eight();
        for csfle in [json!(true), json!({ "minLibmongocryptVersion": "1.13.0" })] {
            assert_eq!(
                unmet(Some(&json!([{ "csfle": csfle }])), &d),
                Some(UNSUPPORTED_REQUIREMENT),
                "{csfle}"
            );
        }
        assert_eq!(unmet(Some(&json!([{ "csfle": false }])), &d), None);
    }
}
