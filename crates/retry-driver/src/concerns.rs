//! The client's read and write concern (`readConcernLevel`; `w`, `journal`, `wTimeoutMS`) on the
//! commands [`crate::Client::command`] and [`crate::Client::cursor`] send, by the
//! read-write-concern spec: a command with its own `readConcern` / `writeConcern` keeps it; a
//! write that supports a write concern gets the client's, a read that supports a read concern
//! gets `{level}`. The generic [`crate::Client::run_command`] sends the command as given (the
//! spec forbids adding either there). Inside a transaction the engine drops inherited concerns
//! (TX-1: a transaction's concerns are its own, `TransactionOptions`). Under `timeoutMS`, `wtimeout` is left out
//! (TO-5, TO-8), and a write concern of `wTimeoutMS` alone is none.

use bson::Document;
use retry_core::classify::{inherits_read_concern, inherits_write_concern};

/// The concerns a client's commands inherit.
#[derive(Clone, Debug, Default)]
pub(crate) struct Concerns {
    /// The `writeConcern` document (`w`, `j`, `wtimeout`), `None` for the server's default.
    pub(crate) write: Option<Document>,
    /// The `readConcern` level, `None` for the server's default.
    pub(crate) read_level: Option<String>,
}

impl Concerns {
    /// The client's concerns; `timeout_ms` says whether `timeoutMS` is set (TO-8: `wtimeout` is
    /// then ignored).
    pub(crate) fn new(
        write: Option<&Document>,
        read_level: Option<&str>,
        timeout_ms: bool,
    ) -> Concerns {
        let write = write
            .map(|wc| {
                let mut wc = wc.clone();
                if timeout_ms {
                    wc.remove("wtimeout");
                }
                wc
            })
            .filter(|wc| !wc.is_empty());
        Concerns {
            write,
            read_level: read_level.map(str::to_owned),
        }
    }

    /// Adds the inherited `writeConcern` or `readConcern` to `command` where it applies (see the
    /// module docs).
    pub(crate) fn apply(&self, command: &mut Document) {
        let writes = inherits_write_concern(command);
        let reads = inherits_read_concern(command);
        if let Some(wc) = self.write.as_ref().filter(|_| writes) {
            if !command.contains_key("writeConcern") {
                command.insert("writeConcern", wc.clone());
            }
        }
        if let Some(level) = self.read_level.as_ref().filter(|_| reads) {
            if !command.contains_key("readConcern") {
                command.insert("readConcern", bson::doc! { "level": level.as_str() });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn applied(concerns: &Concerns, mut command: Document) -> Document {
        concerns.apply(&mut command);
        command
    }

    /// Review item 2 (read-write-concern spec, URI options): writes inherit the client's write
    /// concern, reads its read concern level; a command's own concern wins; transaction commands
    /// and commands that take none are left alone.
    #[test]
    fn writes_inherit_the_write_concern_and_reads_the_read_concern() {
        let wc = doc! { "w": "majority", "j": true, "wtimeout": 500_i64 };
        let concerns = Concerns::new(Some(&wc), Some("majority"), false);
        let insert = applied(&concerns, doc! { "insert": "c", "documents": [] });
        assert_eq!(insert.get_document("writeConcern").ok(), Some(&wc));
        assert!(!insert.contains_key("readConcern"));
        let find = applied(&concerns, doc! { "find": "c" });
        assert_eq!(
            find.get_document("readConcern").ok(),
            Some(&doc! { "level": "majority" })
        );
        assert!(!find.contains_key("writeConcern"));
        let out = applied(
            &concerns,
            doc! { "aggregate": "c", "pipeline": [{ "$out": "d" }], "cursor": {} },
        );
        assert!(out.contains_key("writeConcern") && !out.contains_key("readConcern"));
        let read = applied(
            &concerns,
            doc! { "aggregate": "c", "pipeline": [{ "$match": {} }], "cursor": {} },
        );
        assert!(read.contains_key("readConcern") && !read.contains_key("writeConcern"));
        let own = applied(
            &concerns,
            doc! { "insert": "c", "documents": [], "writeConcern": { "w": 1 } },
        );
        assert_eq!(
            own.get_document("writeConcern").ok(),
            Some(&doc! { "w": 1 })
        );
        for untouched in [
            doc! { "ping": 1 },
            doc! { "listCollections": 1 },
            doc! { "commitTransaction": 1 },
        ] {
            assert_eq!(applied(&concerns, untouched.clone()), untouched);
        }
    }

    /// Review5 item 14: the driver adds the write concern to exactly the writes the retry rules'
    /// table says take one (the role commands do; `compact` and the search-index commands refuse
    /// one).
    #[test]
    fn the_write_concern_goes_where_retry_core_says_a_write_takes_one() {
        let concerns = Concerns::new(Some(&doc! { "w": "majority" }), None, false);
        let role = applied(
            &concerns,
            doc! { "createRole": "r", "privileges": [], "roles": [] },
        );
        assert!(role.contains_key("writeConcern"));
        for none in [
            doc! { "compact": "c" },
            doc! { "createSearchIndexes": "c", "indexes": [] },
        ] {
            assert_eq!(applied(&concerns, none.clone()), none);
        }
    }

    /// TO-5, TO-8: under `timeoutMS` the client's `wTimeoutMS` is not sent, and a write concern
    /// of `wTimeoutMS` alone is none.
    #[test]
    fn to8_wtimeout_is_left_out_under_timeout_ms() {
        let concerns = Concerns::new(Some(&doc! { "w": 2, "wtimeout": 500_i64 }), None, true);
        assert_eq!(concerns.write, Some(doc! { "w": 2 }));
        let alone = Concerns::new(Some(&doc! { "wtimeout": 500_i64 }), None, true);
        assert_eq!(alone.write, None);
        let insert = applied(&alone, doc! { "insert": "c", "documents": [] });
        assert!(!insert.contains_key("writeConcern"));
    }
}
