//! TK-11: the `onPrimaryTransactionalWrite` fail point of a replica-set member (a mongos or load
//! balancer refuses it). It fires only when a retryable write (lsid + txnNumber) commits: a
//! deduplicated retry commits nothing, so it never fires. With `closeConnection` (default true)
//! the write commits and the connection closes without a reply; `failBeforeCommitExceptionCode`
//! skips the commit and still closes.
//!
//! An `insert` fires once for all its documents; an `update` or `delete` of several statements
//! fires once per statement (the server runs those statement by statement, TK-5).

use bson::{Bson, Document};

use crate::commands::integer;
use crate::fail_point::{FailPointError, FailPointMode};

/// The parsed fail point.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct OnPrimaryWrite {
    pub(crate) mode: FailPointMode,
    /// `closeConnection`, default true.
    pub(crate) close_connection: bool,
    /// `failBeforeCommitExceptionCode`: do not commit.
    pub(crate) fail_before_commit: Option<i32>,
}

/// What a firing does to the write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Firing {
    /// Commit, then close without a reply.
    CommitThenClose,
    /// Do not commit; close without a reply.
    CloseWithoutCommit,
    /// Commit and reply as usual (`closeConnection: false`, no exception code).
    Nothing,
}

impl OnPrimaryWrite {
    /// Parses `{configureFailPoint: "onPrimaryTransactionalWrite", mode, data}`; `Ok(None)` is
    /// off. Reuses the `failCommand` mode parser by parsing a stand-in `failCommand`.
    pub(crate) fn from_command(
        command: &Document,
    ) -> Result<Option<OnPrimaryWrite>, FailPointError> {
        let mut stand_in = command.clone();
        stand_in.insert("configureFailPoint", "failCommand");
        stand_in.insert("data", bson::doc! { "failCommands": [] });
        let Some(parsed) = crate::fail_point::FailCommand::from_command(&stand_in)? else {
            return Ok(None);
        };
        let data = match command.get("data") {
            None => Document::new(),
            Some(Bson::Document(d)) => d.clone(),
            Some(_) => return Err(FailPointError::new("data must be a document")),
        };
        let close_connection = match data.get("closeConnection") {
            None => true,
            Some(Bson::Boolean(b)) => *b,
            Some(_) => return Err(FailPointError::new("closeConnection must be a boolean")),
        };
        let fail_before_commit = match data.get("failBeforeCommitExceptionCode") {
            None => None,
            Some(code) => Some(
                integer(code)
                    .and_then(|c| i32::try_from(c).ok())
                    .ok_or_else(|| {
                        FailPointError::new("failBeforeCommitExceptionCode must be an int32")
                    })?,
            ),
        };
        Ok(Some(OnPrimaryWrite {
            mode: parsed.mode,
            close_connection,
            fail_before_commit,
        }))
    }

    /// What firing does, given the data.
    pub(crate) fn firing(&self) -> Firing {
        match (self.fail_before_commit, self.close_connection) {
            (Some(_), _) => Firing::CloseWithoutCommit,
            (None, true) => Firing::CommitThenClose,
            (None, false) => Firing::Nothing,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    /// TK-11: closeConnection defaults to true; failBeforeCommitExceptionCode skips the commit.
    #[test]
    fn parses_modes_and_data() {
        let parse = |c: Document| OnPrimaryWrite::from_command(&c);
        let fp = parse(doc! { "configureFailPoint": "onPrimaryTransactionalWrite",
        "mode": { "skip": 1 } })
        .unwrap()
        .unwrap();
        assert_eq!(fp.mode, FailPointMode::Skip(1));
        assert_eq!(fp.firing(), Firing::CommitThenClose);
        let fp = parse(doc! { "configureFailPoint": "onPrimaryTransactionalWrite",
        "mode": "alwaysOn", "data": { "failBeforeCommitExceptionCode": 1 } })
        .unwrap()
        .unwrap();
        assert_eq!(fp.firing(), Firing::CloseWithoutCommit);
        assert_eq!(
            parse(doc! { "configureFailPoint": "onPrimaryTransactionalWrite", "mode": "off" }),
            Ok(None)
        );
        assert!(
            parse(doc! { "configureFailPoint": "onPrimaryTransactionalWrite",
            "mode": "alwaysOn", "data": { "closeConnection": 1 } })
            .is_err()
        );
    }
}
