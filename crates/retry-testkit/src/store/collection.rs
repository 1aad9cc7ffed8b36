//! A collection: its documents in insertion order and the index of their `_id`s, kept in step
//! with every change by construction (the documents change only through these methods), so the
//! duplicate-`_id` check of an insert, an upsert or a `$merge`, and the position of the document
//! a `$merge` merges into, are searches, not scans (house rule 9). `_id`s are indexed by [`id_key`]: ids a real server calls equal (integral numbers of
//! every type, integral Decimal128s, at every depth) share a key.

use std::collections::BTreeMap;

use bson::{Bson, Document};

use super::id_key;

/// The documents of one namespace and their `_id` index.
#[derive(Debug, Default)]
pub(super) struct Collection {
    documents: Vec<Document>,
    /// Each document's insertion number, in step with `documents`: ascending (documents are
    /// only appended or removed), so a number's position is a binary search.
    numbers: Vec<u64>,
    /// The insertion number the next document gets.
    next: u64,
    /// Each `_id` ([`id_key`]) and the insertion number of the document holding it: one each,
    /// as every write that adds documents (insert, upsert, `$merge`, `$out`) refuses a second
    /// (an overlooked path shows in the tests' index check, `Collection::indexed`).
    ids: BTreeMap<Vec<u8>, u64>,
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
            numbers: Vec::with_capacity(documents.len()),
            next: 0,
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

    /// Where the document with `_id` equal to `id` is: a search of the index, then of the
    /// insertion numbers (house rule 9: no document is compared).
    pub(super) fn position_of(&self, id: &Bson) -> Option<usize> {
        let number = self.ids.get(&id_key(id))?;
        self.numbers.binary_search(number).ok()
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
        let number = self.next;
        self.next += 1;
        self.ids.insert(key_of(&document), number);
        self.numbers.push(number);
        self.documents.push(document);
    }

    /// Removes the document at `index`.
    pub(super) fn remove(&mut self, index: usize) -> Document {
        let document = self.documents.remove(index);
        let number = self.numbers.remove(index);
        self.unindex(key_of(&document), number);
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
            let number = self.numbers[index];
            self.unindex(id_key(id.as_ref().unwrap_or(&Bson::Null)), number);
            self.ids.insert(new, number);
        }
        Some(result)
    }

    /// Drops `key` from the index if the document numbered `number` holds it.
    fn unindex(&mut self, key: Vec<u8>, number: u64) {
        if self.ids.get(&key) == Some(&number) {
            self.ids.remove(&key);
        }
    }
}

#[cfg(test)]
impl Collection {
    /// How many `_id`s the index holds, for the tests of its invariant (one per document, each
    /// at its document's number).
    pub(super) fn indexed(&self) -> usize {
        let at_their_documents = self
            .documents
            .iter()
            .zip(&self.numbers)
            .all(|(document, number)| self.ids.get(&key_of(document)) == Some(number));
        if at_their_documents {
            self.ids.len()
        } else {
            usize::MAX
        }
    }
}
