//! A collection: its documents in insertion order and the index of their `_id`s, kept in step
//! with every change by construction (the documents change only through these methods), so the
//! duplicate-`_id` check of an insert, an upsert or a `$merge` is a search, not a scan (house
//! rule 9). `_id`s are indexed by [`id_key`]: ids a real server calls equal (integral numbers of
//! every type, integral Decimal128s, at every depth) share a key.

use std::collections::BTreeMap;

use bson::{Bson, Document};

use super::id_key;

/// The documents of one namespace and their `_id` index.
#[derive(Debug, Default)]
pub(super) struct Collection {
    documents: Vec<Document>,
    /// How many documents hold each `_id` ([`id_key`]): one each, as every write that adds
    /// documents (insert, upsert, `$merge`, `$out`) refuses a second; a count, so that an
    /// overlooked path shows in the tests' index check rather than corrupting the index.
    ids: BTreeMap<Vec<u8>, usize>,
}

/// A document's `_id` (every stored document has one).
fn key_of(document: &Document) -> Vec<u8> {
    id_key(document.get("_id").unwrap_or(&Bson::Null))
}

impl Collection {
    /// `documents`, indexed (the cost of building it follows the documents given).
    pub(super) fn new(documents: Vec<Document>) -> Collection {
        let mut collection = Collection {
            documents: Vec::with_capacity(documents.len()),
            ids: BTreeMap::new(),
        };
        for document in documents {
            collection.push(document);
        }
        collection
    }

    /// The documents, in insertion order.
    pub(super) fn documents(&self) -> &[Document] {
        &self.documents
    }

    /// The documents, taken out.
    pub(super) fn into_documents(self) -> Vec<Document> {
        self.documents
    }

    /// Whether a document with `_id` equal to `id` is here: a search of the index.
    pub(super) fn contains_id(&self, id: &Bson) -> bool {
        self.ids.contains_key(&id_key(id))
    }

    /// Whether it holds no document.
    pub(super) fn is_empty(&self) -> bool {
        self.documents.is_empty()
    }

    /// How many documents it holds.
    pub(super) fn len(&self) -> usize {
        self.documents.len()
    }

    /// Appends `document`.
    pub(super) fn push(&mut self, document: Document) {
        *self.ids.entry(key_of(&document)).or_default() += 1;
        self.documents.push(document);
    }

    /// Removes the document at `index`.
    pub(super) fn remove(&mut self, index: usize) -> Document {
        let document = self.documents.remove(index);
        self.unindex(key_of(&document));
        document
    }

    /// Runs `change` on the document at `index` (`None` when there is none), re-indexing it if
    /// its `_id` changed.
    pub(super) fn change<T>(
        &mut self,
        index: usize,
        change: impl FnOnce(&mut Document) -> T,
    ) -> Option<T> {
        let document = self.documents.get_mut(index)?;
        let id = document.get("_id").cloned();
        let result = change(document);
        if document.get("_id") != id.as_ref() {
            let new = key_of(document);
            self.unindex(id_key(id.as_ref().unwrap_or(&Bson::Null)));
            *self.ids.entry(new).or_default() += 1;
        }
        Some(result)
    }

    fn unindex(&mut self, key: Vec<u8>) {
        if let Some(count) = self.ids.get_mut(&key) {
            *count -= 1;
            if *count == 0 {
                self.ids.remove(&key);
            }
        }
    }
}

#[cfg(test)]
impl Collection {
    /// How many `_id`s the index holds, for the tests of its invariant.
    pub(super) fn indexed(&self) -> usize {
        self.ids.values().sum()
    }
}
