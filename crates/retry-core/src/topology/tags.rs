//! Tag sets: the `tags` a replica-set member reports, and the tag sets of a read preference.

use alloc::boxed::Box;
use alloc::vec::Vec;
use core::fmt;

/// A set of `key: value` string tags, kept sorted by key with no duplicate keys.
///
/// A server reports its tags in `hello` (SDAM); a read preference lists tag sets it wants (SS-6).
/// Matching never allocates.
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct TagSet {
    tags: Vec<(Box<str>, Box<str>)>,
}

impl TagSet {
    /// The empty tag set `{}`, which every server matches (SS-6).
    pub const fn new() -> TagSet {
        TagSet { tags: Vec::new() }
    }

    /// Adds or replaces the tag `key: value`.
    pub fn insert(&mut self, key: &str, value: &str) {
        match self.tags.binary_search_by(|(k, _)| (**k).cmp(key)) {
            Ok(i) => self.tags[i].1 = value.into(),
            Err(i) => self.tags.insert(i, (key.into(), value.into())),
        }
    }

    /// The value of `key`, if tagged.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.tags
            .binary_search_by(|(k, _)| (**k).cmp(key))
            .ok()
            .map(|i| &*self.tags[i].1)
    }

    /// Whether there are no tags.
    pub fn is_empty(&self) -> bool {
        self.tags.is_empty()
    }

    /// The number of tags.
    pub fn len(&self) -> usize {
        self.tags.len()
    }

    /// The tags, sorted by key.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.tags.iter().map(|(k, v)| (&**k, &**v))
    }

    /// SS-6: whether every tag of `self` is also a tag of `server` (`self ⊆ server`); the empty set
    /// matches every server.
    pub fn matches(&self, server: &TagSet) -> bool {
        self.iter().all(|(k, v)| server.get(k) == Some(v))
    }
}

impl<K: AsRef<str>, V: AsRef<str>> FromIterator<(K, V)> for TagSet {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(iter: I) -> TagSet {
        let mut set = TagSet::new();
        for (k, v) in iter {
            set.insert(k.as_ref(), v.as_ref());
        }
        set
    }
}

impl fmt::Debug for TagSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl fmt::Display for TagSet {
    /// Formats like a document: `{dc: "ny", rack: "2"}`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("{")?;
        for (i, (k, v)) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{k}: {v:?}")?;
        }
        f.write_str("}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ss6_a_tag_set_matches_its_supersets_only() {
        let server: TagSet = [("dc", "ny"), ("rack", "2"), ("size", "large")]
            .into_iter()
            .collect();
        let wanted: TagSet = [("rack", "2"), ("dc", "ny")].into_iter().collect();
        assert!(wanted.matches(&server));
        assert!(TagSet::new().matches(&server));
        assert!(TagSet::new().matches(&TagSet::new()));
        let other: TagSet = [("dc", "sf")].into_iter().collect();
        assert!(!other.matches(&server));
        assert!(!wanted.matches(&TagSet::new()));
    }

    #[test]
    fn insert_keeps_keys_sorted_and_unique() {
        let mut t = TagSet::new();
        t.insert("b", "1");
        t.insert("a", "2");
        t.insert("b", "3");
        assert_eq!(t.iter().collect::<Vec<_>>(), [("a", "2"), ("b", "3")]);
        assert_eq!(t.to_string(), r#"{a: "2", b: "3"}"#);
    }
}
