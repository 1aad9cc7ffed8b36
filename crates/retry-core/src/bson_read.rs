//! BSON decoding from a frame's bytes into a [`Document`]: the document, and the errors, of the
//! `bson` crate's `Document::try_from(&RawDocument)`, without its detours. That conversion copies
//! every embedded document and array into an owned `RawDocumentBuf` before converting it, and
//! turns every value into an owned `RawBson` first; here each value goes from the borrowed
//! `RawBsonRef` straight to its `Bson`, walking the same `bson` iterators (so validation and
//! error messages are the crate's own). The wire codec decodes every OP_MSG body and sequence
//! document with it.
//!
//! Decoding recurses once per level of nesting, so a document nested deeper than [`MAX_DEPTH`]
//! is refused before it can exhaust the stack (review6 finding 1, WP-2, house rule 11).

use alloc::string::String;
use alloc::vec::Vec;
use bson::error::Error;
use bson::raw::{RawArray, RawBsonRef};
use bson::{Bson, Document, RawDocument, RawDocumentBuf, Timestamp};
use core::fmt;
use core::ops::Range;

/// The deepest nesting read: a document or array more than this many levels deep (the top-level
/// document is level 1) is refused, as a server refuses it (`maxBSONDepth`, 200 by default).
pub(crate) const MAX_DEPTH: usize = 200;

/// Why a document could not be read.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The `bson` crate's conversion error.
    Bson(Error),
    /// Nested more than [`MAX_DEPTH`] levels deep.
    TooDeep,
}

impl fmt::Display for ReadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::Bson(e) => write!(f, "{e}"),
            ReadError::TooDeep => write!(
                f,
                "a document or array nested more than {MAX_DEPTH} levels deep"
            ),
        }
    }
}

impl From<Error> for ReadError {
    fn from(e: Error) -> ReadError {
        ReadError::Bson(e)
    }
}

/// The document `raw` holds, or the first error the `bson` crate's conversion would report
/// (or [`ReadError::TooDeep`]).
pub(crate) fn document(raw: &RawDocument) -> Result<Document, ReadError> {
    document_in(raw, None, None)
}

/// [`document`], built for a caller that converts many documents (issue 9). When
/// [`well_formed`] accepts the document, the top-level document is built into `top` (an empty
/// document whose table and hasher are reused) and every embedded one is a clone of `empty` (an
/// empty document: the clones share its hasher, where [`Document::new`] draws a seed each time,
/// and allocate as a new document does). A non-empty `top` or `empty` is not used; without
/// `top` the top-level document is a clone of `empty` too, and without `empty` each document is
/// a [`Document::new`].
pub(crate) fn document_in(
    raw: &RawDocument,
    top: Option<Document>,
    empty: Option<&Document>,
) -> Result<Document, ReadError> {
    let empty = empty.filter(|empty| empty.is_empty());
    let mut document = top_document(top, empty);
    match plain_into(raw, &mut document, empty) {
        true => Ok(document),
        // The crate's conversion, and its error.
        false => document_at(raw, 1),
    }
}

/// Builds `raw` into `document` (a [`top_document`]) when [`well_formed`] accepts it (a usual
/// reply), its embedded documents clones of `empty` (an empty one, or none); whether it did.
/// Issue 9: straight from its bytes in the same pass that checks it ([`plain_document`]),
/// without the crate's iterators and their second round of checks; the rest (and the rare
/// values it leaves alone) take the crate's conversion, [`document_at`].
#[inline(always)]
fn plain_into(raw: &RawDocument, document: &mut Document, empty: Option<&Document>) -> bool {
    plain_document(raw.as_bytes(), 0, document, empty).is_some()
}

/// The most bytes a document may have for [`owned_document_into`] to keep its buffer.
const KEPT_BUFFER: usize = 64;

/// Test helper: [`owned_document_into`] a [`top_document`], returned.
#[cfg(test)]
pub(crate) fn owned_document_in(
    raw: RawDocumentBuf,
    top: Option<Document>,
    empty: Option<&Document>,
) -> Result<Document, ReadError> {
    let mut document = top_document(top, empty);
    owned_document_into(raw, &mut document, empty)?;
    Ok(document)
}

/// The document [`document_in`] builds the top level into: `top` if empty, else a clone of
/// `empty` if empty, else a new one.
#[inline(always)]
pub(crate) fn top_document(top: Option<Document>, empty: Option<&Document>) -> Document {
    top.filter(Document::is_empty)
        .unwrap_or_else(|| new_document(empty.filter(|empty| empty.is_empty())))
}

/// [`document_in`] of a document the caller gives up, into `document`, a [`top_document`]
/// (issue 9: the document is filled where the caller holds it, not moved through the result).
/// When its buffer is small (at most [`KEPT_BUFFER`] bytes of capacity: a usual reply such as
/// `{ok: 1}`), the buffer becomes the document's first key, which then needs no allocation of
/// its own, and is not freed (issue 9: one allocation and one free fewer per small reply); a
/// document of one element with an ASCII key has that element's value built from the buffer
/// before its key bytes move to the buffer's front, without a copy of the whole document. On
/// an error `document` is left as it is, or holds what was read before it.
pub(crate) fn owned_document_into(
    raw: RawDocumentBuf,
    document: &mut Document,
    empty: Option<&Document>,
) -> Result<(), ReadError> {
    let len = raw.as_bytes().len();
    let empty = empty.filter(|empty| empty.is_empty());
    if len > KEPT_BUFFER {
        if !plain_into(&raw, document, empty) {
            *document = document_at(&raw, 1)?;
        }
        return Ok(());
    }
    // One element with an ASCII key (`{ok: 1}`, say).
    if let Some((key, value)) = lone_element(raw.as_bytes(), empty) {
        let mut buffer = raw.into_bytes();
        if buffer.capacity() > KEPT_BUFFER {
            buffer = buffer[key.clone()].to_vec();
        } else {
            buffer.copy_within(key.clone(), 0);
            buffer.truncate(key.len());
        }
        // ASCII, checked: never lossy.
        let key = String::from_utf8(buffer)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
        document.insert(key, value);
        return Ok(());
    }
    let mut copy = [0; KEPT_BUFFER];
    let copy = &mut copy[..len];
    copy.copy_from_slice(raw.as_bytes());
    let mut buffer = Some(raw.into_bytes()).filter(|buffer| buffer.capacity() <= KEPT_BUFFER);
    let built = plain_elements(copy, 0, empty, cstring_key, |key, value| {
        match buffer.take() {
            Some(mut buffer) => {
                buffer.clear();
                buffer.extend_from_slice(key);
                document.insert(String::from_utf8(buffer).ok()?, value)
            }
            None => document.insert(core::str::from_utf8(key).ok()?, value),
        };
        Some(())
    });
    if built.is_some() {
        return Ok(());
    }
    // Not a plain document: the crate's conversion of the same bytes, and its error.
    *document = document_at(RawDocument::from_bytes(copy)?, 1)?;
    Ok(())
}

/// The one element of the document `bytes` when it has exactly one, with an ASCII key, that
/// [`plain_elements`] builds: where its key is in `bytes`, and its value (embedded documents
/// clones of `empty`). `None` for anything else, left to [`plain_elements`].
#[inline]
fn lone_element(bytes: &[u8], empty: Option<&Document>) -> Option<(Range<usize>, Bson)> {
    let end = framed(bytes, 0).filter(|&end| end > 4)?;
    let (tag, key_len, value, size) = element_at(bytes, 4, end, ascii_key)?;
    if value + size != end {
        return None;
    }
    let value = checked_value(tag, &bytes[value..end], 0, empty)?;
    Some((5..5 + key_len, value))
}

/// An ASCII key (a C string) at the start of `bytes`: its length, twice (as a key and as its
/// length, for [`element_at`]); `None` without a terminator or with a non-ASCII byte.
#[inline]
fn ascii_key(bytes: &[u8]) -> Option<(usize, usize)> {
    for (len, &b) in bytes.iter().enumerate() {
        if b == 0 {
            return Some((len, len));
        }
        if !b.is_ascii() {
            return None;
        }
    }
    None
}

/// A document's key (a C string) at the start of `bytes`, left as bytes (whoever makes it a
/// `str` checks it), and its length.
#[inline]
fn cstring_key(bytes: &[u8]) -> Option<(&[u8], usize)> {
    let len = bytes.iter().position(|&b| b == 0)?;
    Some((&bytes[..len], len))
}

/// A clone of `empty`, or a new document without one.
fn new_document(empty: Option<&Document>) -> Document {
    empty.map_or_else(Document::new, Document::clone)
}

/// Builds the document of `bytes` into `document` (empty) if [`well_formed`] accepts them, as
/// the `bson` crate's conversion builds it, checked and built in one pass, each embedded
/// document a clone of `empty` (or new); `None` for bytes [`well_formed`] refuses and for a
/// value it accepts but does not build itself (a binary of a subtype other than generic), which
/// the caller then leaves to that conversion. Filled in place, the document is not moved.
fn plain_document(
    bytes: &[u8],
    depth: usize,
    document: &mut Document,
    empty: Option<&Document>,
) -> Option<()> {
    plain_elements(bytes, depth, empty, utf8_key, |key, value| {
        document.insert(key, value);
        Some(())
    })
}

/// Walks the elements of `bytes` as [`well_formed`] checks them, handing each key (as `key`
/// reads it from the bytes after the type tag: the key and its length without the
/// terminator) and value ([`plain_value`]) to `each`; `None` where [`well_formed`] would say
/// `false`, a value is not plain or `each` says `None`. A key is checked as UTF-8 once, by the
/// reader: a document's as it is made a `str` ([`utf8_key`]), an array's, which nobody reads,
/// without one ([`utf8_cstring_len`]; issue 9).
fn plain_elements<'a, K>(
    bytes: &'a [u8],
    depth: usize,
    empty: Option<&Document>,
    key: impl Fn(&'a [u8]) -> Option<(K, usize)>,
    mut each: impl FnMut(K, Bson) -> Option<()>,
) -> Option<()> {
    let end = framed(bytes, depth)?;
    let mut at = 4;
    while at < end {
        let (tag, name, value, size) = element_at(bytes, at, end, &key)?;
        each(
            name,
            checked_value(tag, &bytes[value..value + size], depth, empty)?,
        )?;
        at = value + size;
    }
    (at == end).then_some(())
}

/// Where the terminator of the document `bytes` at `depth` is, when [`well_formed`] would read
/// its elements: not deeper than [`WELL_FORMED_DEPTH`], its length prefix its length, its last
/// byte 0.
#[inline(always)]
fn framed(bytes: &[u8], depth: usize) -> Option<usize> {
    if depth > WELL_FORMED_DEPTH || bytes.len() < 5 || read_len(bytes, 0) != Some(bytes.len()) {
        return None;
    }
    let end = bytes.len() - 1;
    (bytes[end] == 0).then_some(end)
}

/// The element at `at` (before `end`, its document's terminator) of `bytes`, sized as
/// [`well_formed`] sizes it: its type tag, its key as `key` reads it (from the bytes after the
/// tag: the key and its length without the terminator), where its value starts and its size;
/// `None` if `key` refuses the key or the value cannot be sized or ends past `end`.
#[inline(always)]
fn element_at<'a, K>(
    bytes: &'a [u8],
    at: usize,
    end: usize,
    key: impl Fn(&'a [u8]) -> Option<(K, usize)>,
) -> Option<(u8, K, usize, usize)> {
    let tag = bytes[at];
    let (name, key_len) = key(&bytes[at + 1..end])?;
    let value = at + 1 + key_len + 1;
    let size = value_size(tag, &bytes[value..end])
        .filter(|&size| value.checked_add(size).is_some_and(|e| e <= end))?;
    Some((tag, name, value, size))
}

/// The key (a C string) that starts `bytes`, as a `str`, and its length: `None` if it has no
/// terminator or is not UTF-8 (checked once, as it is made a `str`).
#[inline]
fn utf8_key(bytes: &[u8]) -> Option<(&str, usize)> {
    let len = bytes.iter().position(|&b| b == 0)?;
    Some((core::str::from_utf8(&bytes[..len]).ok()?, len))
}

/// An array's key: its length, checked as a key ([`utf8_cstring_len`]); nobody reads it.
#[inline]
fn array_key(bytes: &[u8]) -> Option<((), usize)> {
    Some(((), utf8_cstring_len(bytes)?))
}

/// One value of a document [`well_formed`] accepted, as [`value`] converts it; `None` for a
/// binary of a subtype other than generic.
pub(crate) fn plain_value(tag: u8, value: &[u8]) -> Option<Bson> {
    checked_value(tag, value, 0, None)
}

/// One value whose bytes (sized by [`value_size`]) are those of an element at `depth`, checked
/// as [`well_formed`] checks it and converted as [`value`] converts it; `None` for a value
/// [`well_formed`] refuses or a binary of a subtype other than generic.
#[inline(always)]
fn checked_value(tag: u8, value: &[u8], depth: usize, empty: Option<&Document>) -> Option<Bson> {
    let eight = || -> Option<[u8; 8]> { value.get(..8)?.try_into().ok() };
    Some(match tag {
        0x01 => Bson::Double(f64::from_le_bytes(eight()?)),
        // The length counts the terminator.
        0x02 => match value.get(4..)? {
            [text @ .., 0] => Bson::String(core::str::from_utf8(text).ok()?.into()),
            _ => return None,
        },
        0x03 => {
            let mut document = new_document(empty);
            plain_document(value, depth + 1, &mut document, empty)?;
            Bson::Document(document)
        }
        0x04 => {
            let mut items = Vec::new();
            plain_elements(value, depth + 1, empty, array_key, |(), item| {
                items.push(item);
                Some(())
            })?;
            Bson::Array(items)
        }
        0x05 => match value.get(4) {
            Some(0) => Bson::Binary(bson::Binary {
                subtype: bson::spec::BinarySubtype::Generic,
                bytes: value.get(5..)?.to_vec(),
            }),
            _ => return None,
        },
        0x07 => Bson::ObjectId(bson::oid::ObjectId::from_bytes(
            value.get(..12)?.try_into().ok()?,
        )),
        0x08 => match value {
            [0] => Bson::Boolean(false),
            [1] => Bson::Boolean(true),
            _ => return None,
        },
        0x09 => Bson::DateTime(bson::DateTime::from_millis(i64::from_le_bytes(eight()?))),
        0x0A => Bson::Null,
        0x10 => Bson::Int32(i32::from_le_bytes(value.get(..4)?.try_into().ok()?)),
        0x11 => Bson::Timestamp(timestamp(tag, value)?),
        0x12 => Bson::Int64(i64::from_le_bytes(eight()?)),
        _ => return None,
    })
}

/// Checks `raw` as [`document`] reads it, without building anything: the same first error, or
/// none. (Only embedded documents, arrays and code-with-scope scopes can fail to convert once
/// the iterator has read a value.) A document of the usual types is accepted by
/// [`well_formed`] in one pass over its bytes; anything it does not accept goes through the
/// `bson` crate's iterators, which give the verdict and the error.
pub(crate) fn validate(raw: &RawDocument) -> Result<(), ReadError> {
    if well_formed(raw.as_bytes(), 0) {
        return Ok(());
    }
    validate_at(raw, 1)
}

/// The level of a document or array nested in one at `level`, if allowed.
fn nested(level: usize) -> Result<usize, ReadError> {
    match level + 1 {
        next if next > MAX_DEPTH => Err(ReadError::TooDeep),
        next => Ok(next),
    }
}

fn document_at(raw: &RawDocument, level: usize) -> Result<Document, ReadError> {
    let mut doc = Document::new();
    for element in raw {
        let (key, raw_value) = element?;
        doc.insert(key.as_str(), value(raw_value, level)?);
    }
    Ok(doc)
}

fn validate_at(raw: &RawDocument, level: usize) -> Result<(), ReadError> {
    for element in raw {
        let (_, raw_value) = element?;
        validate_value(raw_value, level)?;
    }
    Ok(())
}

/// How deep [`well_formed`] follows embedded documents (well under [`MAX_DEPTH`], so it never
/// accepts what the depth limit refuses) before it leaves a document to the
/// `bson` crate's checks.
const WELL_FORMED_DEPTH: usize = 32;

/// Whether `bytes` is a document the `bson` crate's conversion accepts, judged without it: only
/// ever `true` for a document that conversion accepts (never the reverse), and `false` for
/// anything unusual (a type other than double, string, document, array, binary other than the
/// old subtype, ObjectId, boolean, datetime, null, int32, timestamp and int64; nesting deeper
/// than [`WELL_FORMED_DEPTH`]), which then goes through the crate's own checks. It checks what
/// those do: the length prefix and terminator of every document, every key's and string's UTF-8
/// and terminator, string, document and binary lengths, booleans of 0 or 1, and that every
/// element ends before its document's terminator.
fn well_formed(bytes: &[u8], depth: usize) -> bool {
    well_formed_with(bytes, depth, |_, _, _| {})
}

/// Whether [`well_formed`] accepts the document `bytes` (which [`validate`] then accepts too),
/// handing each top-level element to `each` as [`validate_with`] does; `false` says nothing of
/// an unusual document, which [`validate_with`] decides (issue 9: the decoder's one pass over a
/// usual reply).
#[inline]
pub(crate) fn plain_with<'a>(bytes: &'a [u8], each: impl FnMut(&'a [u8], u8, &'a [u8])) -> bool {
    well_formed_with(bytes, 0, each)
}

/// [`validate`], handing each top-level element of a document it accepts to `each` (its key,
/// type tag and value bytes, as [`Elements`] gives them) in the same pass (issue 9: the engine
/// reads an encoded command's fields as it checks it).
pub(crate) fn validate_with<'a>(
    raw: &'a RawDocument,
    each: impl FnMut(&'a [u8], u8, &'a [u8]),
) -> Result<(), ReadError> {
    validate_each(raw, each).map(|_| ())
}

/// [`validate_with`], also saying whether every element was handed over: `false` only when the
/// walk of an unusual document (one the crate's checks accepted) stopped at an element it could
/// not size ([`Elements::broken`]).
pub(crate) fn validate_each<'a>(
    raw: &'a RawDocument,
    mut each: impl FnMut(&'a [u8], u8, &'a [u8]),
) -> Result<bool, ReadError> {
    let mut seen = 0;
    if well_formed_with(raw.as_bytes(), 0, |key, tag, value| {
        seen += 1;
        each(key, tag, value);
    }) {
        return Ok(true);
    }
    // An unusual document: the crate's checks, then the elements not handed over yet.
    validate_at(raw, 1)?;
    let mut elements = Elements::of(raw);
    elements
        .by_ref()
        .skip(seen)
        .for_each(|(key, tag, value)| each(key, tag, value));
    Ok(!elements.broken())
}

/// [`well_formed`], handing each element of `bytes` it has checked to `each` (nested documents'
/// elements are not handed over).
fn well_formed_with<'a>(
    bytes: &'a [u8],
    depth: usize,
    mut each: impl FnMut(&'a [u8], u8, &'a [u8]),
) -> bool {
    let Some(end) = framed(bytes, depth) else {
        return false;
    };
    let mut at = 4;
    while at < end {
        let Some((tag, key, value, size)) = element_at(bytes, at, end, utf8_cstring) else {
            return false;
        };
        let content = &bytes[value..value + size];
        let accepted = match tag {
            0x01 | 0x09 | 0x11 | 0x12 | 0x10 | 0x07 | 0x0A => true,
            0x08 => matches!(content, [0 | 1]),
            // The length counts the terminator.
            0x02 => match &content[4..] {
                [text @ .., 0] => text.is_ascii() || core::str::from_utf8(text).is_ok(),
                _ => false,
            },
            0x03 | 0x04 => well_formed(content, depth + 1),
            // The old binary subtype (2) carries an inner length the crate checks: left to it.
            0x05 => content[4] != 2,
            _ => false,
        };
        if !accepted {
            return false;
        }
        each(key, tag, content);
        at = value + size;
    }
    at == end
}

/// A key (a C string) that starts `bytes`, checked as UTF-8 ([`utf8_cstring_len`]), left as
/// bytes, and its length.
#[inline(always)]
fn utf8_cstring(bytes: &[u8]) -> Option<(&[u8], usize)> {
    let len = utf8_cstring_len(bytes)?;
    Some((&bytes[..len], len))
}

/// The length of the C string (a key) that starts `bytes`, without its terminator: `None` if it
/// has no terminator or is not UTF-8. One pass finds the terminator and notes a non-ASCII byte;
/// only then is the key checked as UTF-8 (keys are nearly always ASCII).
#[inline]
fn utf8_cstring_len(bytes: &[u8]) -> Option<usize> {
    let mut ascii = true;
    for (len, &b) in bytes.iter().enumerate() {
        if b == 0 {
            return (ascii || core::str::from_utf8(&bytes[..len]).is_ok()).then_some(len);
        }
        ascii &= b.is_ascii();
    }
    None
}

/// The non-negative int32 at `at`, as a length.
fn read_len(bytes: &[u8], at: usize) -> Option<usize> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    usize::try_from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok()
}

/// The size in bytes of one encoded element's value (BSON spec), by its type tag: `value` holds
/// the bytes from the value's first byte to the end of its document (at least), and bounds the
/// lengths and terminators read. `None` for an unknown tag, or a length or terminator that cannot
/// be read. It only sizes: what the value holds is the reader's to check. The one element sizer
/// of the workspace: the decoder's validation, the engine's in-place reply reader and the test
/// server's raw path walk elements with it, so they cannot size a type differently.
///
/// The usual types (fixed sizes, strings, documents, arrays) are sized inline, the rest out of
/// line (issue 9: a reply's or a command's usual elements are sized without a call).
#[inline(always)]
pub fn value_size(tag: u8, value: &[u8]) -> Option<usize> {
    match tag {
        0x01 | 0x09 | 0x11 | 0x12 => Some(8),
        0x10 => Some(4),
        0x08 => Some(1),
        0x0A => Some(0),
        0x02 => read_len(value, 0)?.checked_add(4),
        0x03 | 0x04 => read_len(value, 0),
        _ => variable_value_size(tag, value),
    }
}

/// [`value_size`] of the types it does not size inline.
#[inline(never)]
fn variable_value_size(tag: u8, value: &[u8]) -> Option<usize> {
    let cstring = |at: usize| value.get(at..)?.iter().position(|&b| b == 0);
    let len = || read_len(value, 0);
    Some(match tag {
        0x07 => 12,
        0x13 => 16,
        0x06 | 0x7F | 0xFF => 0,
        0x0D | 0x0E => len()?.checked_add(4)?,
        0x0F => len()?,
        0x05 => len()?.checked_add(5)?,
        0x0C => len()?.checked_add(16)?,
        0x0B => {
            let pattern = cstring(0)?;
            pattern + 1 + cstring(pattern + 1)? + 1
        }
        _ => return None,
    })
}

/// The top-level elements of a document [`validate`] accepted, read straight from its bytes
/// (no UTF-8 checks, no values built): each element's key bytes, type tag and value bytes, in
/// order. It stops at the first element it cannot size (which a validated document does not
/// have) and then says so with [`Elements::broken`].
pub(crate) struct Elements<'a> {
    bytes: &'a [u8],
    at: usize,
    broken: bool,
}

impl<'a> Elements<'a> {
    /// The elements of `raw`.
    pub(crate) fn of(raw: &'a RawDocument) -> Elements<'a> {
        Elements::in_bytes(raw.as_bytes())
    }

    /// The elements of the encoded document `bytes`.
    fn in_bytes(bytes: &'a [u8]) -> Elements<'a> {
        Elements {
            bytes,
            at: 4,
            broken: false,
        }
    }

    /// Whether the walk stopped at an element it could not size.
    pub(crate) fn broken(&self) -> bool {
        self.broken
    }
}

impl<'a> Iterator for Elements<'a> {
    type Item = (&'a [u8], u8, &'a [u8]);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let end = self.bytes.len().checked_sub(1)?;
        if self.broken || self.at >= end {
            return None;
        }
        let tag = self.bytes[self.at];
        let key_start = self.at + 1;
        let Some(key_len) = self.bytes[key_start..end].iter().position(|&b| b == 0) else {
            self.broken = true;
            return None;
        };
        let value = key_start + key_len + 1;
        let Some(value_end) = value_size(tag, &self.bytes[value..end])
            .and_then(|size| value.checked_add(size))
            .filter(|&value_end| value_end <= end)
        else {
            self.broken = true;
            return None;
        };
        self.at = value_end;
        Some((
            &self.bytes[key_start..key_start + key_len],
            tag,
            &self.bytes[value..value_end],
        ))
    }
}

/// Whether `document` (validated, e.g. a reply the engine decoded) has the top-level key `key`,
/// read from its bytes with the workspace's one element walker (the decoder's): no UTF-8 checks,
/// no values built, nested keys never match. `None` if an element before it cannot be sized (a
/// document the decoder did not accept); the caller then decides on the full conversion.
/// Review10 finding 8: the one top-level key lookup of the workspace (retry-driver's RW-3 check).
pub fn has_top_level_key(document: &RawDocument, key: &[u8]) -> Option<bool> {
    let mut elements = Elements::of(document);
    if elements.by_ref().any(|(name, _, _)| name == key) {
        return Some(true);
    }
    (!elements.broken()).then_some(false)
}

/// The value of a timestamp element from [`Elements`] (tag 0x11): the increment, then the
/// time, each a little-endian u32; `None` for another type.
pub(crate) fn timestamp(tag: u8, value: &[u8]) -> Option<Timestamp> {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(value.get(at..at + 4)?.try_into().ok()?))
    };
    (tag == 0x11 && value.len() == 8).then_some(())?;
    Some(Timestamp {
        increment: word(0)?,
        time: word(4)?,
    })
}

/// A value inside a document or array at `level`.
fn validate_value(raw: RawBsonRef<'_>, level: usize) -> Result<(), ReadError> {
    match raw {
        RawBsonRef::Document(d) => validate_at(d, nested(level)?),
        RawBsonRef::Array(a) => {
            let level = nested(level)?;
            for element in a {
                validate_value(element?, level)?;
            }
            Ok(())
        }
        RawBsonRef::JavaScriptCodeWithScope(code) => validate_at(code.scope, nested(level)?),
        _ => Ok(()),
    }
}

fn array(raw: &RawArray, level: usize) -> Result<Vec<Bson>, ReadError> {
    let mut values = Vec::new();
    for element in raw {
        values.push(value(element?, level)?);
    }
    Ok(values)
}

/// One value inside a document or array at `level`; the rare types go through the `bson`
/// crate's own conversion (a code-with-scope's scope, which it converts recursively, is checked
/// for depth first).
fn value(raw: RawBsonRef<'_>, level: usize) -> Result<Bson, ReadError> {
    Ok(match raw {
        RawBsonRef::Double(v) => Bson::Double(v),
        RawBsonRef::String(s) => Bson::String(s.into()),
        RawBsonRef::Document(d) => Bson::Document(document_at(d, nested(level)?)?),
        RawBsonRef::Array(a) => Bson::Array(array(a, nested(level)?)?),
        RawBsonRef::Boolean(b) => Bson::Boolean(b),
        RawBsonRef::Null => Bson::Null,
        RawBsonRef::Int32(v) => Bson::Int32(v),
        RawBsonRef::Int64(v) => Bson::Int64(v),
        RawBsonRef::Timestamp(t) => Bson::Timestamp(t),
        RawBsonRef::ObjectId(id) => Bson::ObjectId(id),
        RawBsonRef::DateTime(at) => Bson::DateTime(at),
        RawBsonRef::JavaScriptCodeWithScope(code) => {
            validate_at(code.scope, nested(level)?)?;
            Bson::try_from(raw)?
        }
        other => Bson::try_from(other)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::string::String;
    use alloc::vec;
    use bson::oid::ObjectId;
    use bson::raw::{cstr, RawArrayBuf, RawDocumentBuf};
    use bson::spec::BinarySubtype;
    use bson::{doc, Binary, DateTime, Decimal128, JavaScriptCodeWithScope, Regex, Timestamp};
    use proptest::prelude::*;

    fn both(bytes: &[u8]) -> (Result<Document, String>, Result<Document, String>) {
        let ours = RawDocument::from_bytes(bytes)
            .map_err(|e| alloc::format!("{e}"))
            .and_then(|raw| document(raw).map_err(|e| alloc::format!("{e}")));
        let theirs = RawDocument::from_bytes(bytes)
            .map_err(|e| alloc::format!("{e}"))
            .and_then(|raw| Document::try_from(raw).map_err(|e| alloc::format!("{e}")));
        (ours, theirs)
    }

    /// `levels` documents nested in one another, `{a: {a: ... {}}}` (or arrays, `{a: [[...]]}`),
    /// built as bytes without recursion.
    fn nested_bytes(levels: usize, array: bool) -> Vec<u8> {
        let mut inner = vec![5, 0, 0, 0, 0];
        for level in (1..levels).rev() {
            let (kind, key) = match (array, level) {
                (true, l) if l > 1 => (4, b'0'),
                (true, _) => (4, b'a'),
                (false, _) => (3, b'a'),
            };
            let mut doc = Vec::with_capacity(inner.len() + 9);
            doc.extend(((inner.len() + 8) as i32).to_le_bytes());
            doc.extend([kind, key, 0]);
            doc.extend(&inner);
            doc.push(0);
            inner = doc;
        }
        inner
    }

    /// Review6 finding 1, WP-2, house rule 11: nesting is read up to the server's 200 levels;
    /// deeper documents and arrays (10,000 levels here, which would overflow the stack) are a
    /// clear error from both the reader and the validator, never an abort.
    #[test]
    fn wp2_a_document_nested_deeper_than_200_levels_is_an_error_not_a_stack_overflow() {
        for array in [false, true] {
            let deepest = nested_bytes(MAX_DEPTH, array);
            let raw = RawDocument::from_bytes(&deepest).unwrap();
            assert!(document(raw).is_ok(), "200 levels (array {array})");
            assert!(validate(raw).is_ok());
            for levels in [MAX_DEPTH + 1, 10_000] {
                let bytes = nested_bytes(levels, array);
                let raw = RawDocument::from_bytes(&bytes).unwrap();
                assert!(matches!(document(raw), Err(ReadError::TooDeep)), "{levels}");
                assert!(matches!(validate(raw), Err(ReadError::TooDeep)), "{levels}");
            }
        }
        let error = document(RawDocument::from_bytes(&nested_bytes(201, false)).unwrap());
        assert_eq!(
            error.map(|_| ()).map_err(|e| alloc::format!("{e}")),
            Err("a document or array nested more than 200 levels deep".into())
        );
    }

    /// Review6 finding 1: a code-with-scope's scope, which the `bson` crate converts
    /// recursively, counts as a level and is checked before it is converted.
    #[test]
    fn wp2_a_deep_code_with_scope_scope_is_an_error() {
        let scope = nested_bytes(10_000, false);
        let code = b"f()\0";
        let mut value = Vec::new();
        value.extend(((4 + 4 + code.len() + scope.len()) as i32).to_le_bytes());
        value.extend((code.len() as i32).to_le_bytes());
        value.extend(code);
        value.extend(&scope);
        let mut doc = Vec::new();
        doc.extend(((4 + 3 + value.len() + 1) as i32).to_le_bytes());
        doc.extend([0x0F, b'c', 0]);
        doc.extend(&value);
        doc.push(0);
        let raw = RawDocument::from_bytes(&doc).unwrap();
        assert!(matches!(document(raw), Err(ReadError::TooDeep)));
        assert!(matches!(validate(raw), Err(ReadError::TooDeep)));
    }

    /// A document with a value of every BSON type, nested, and an empty key (a `Document` holds
    /// a key once: [`repeated_keys`] has repeated ones).
    fn every_bson_type() -> Document {
        doc! {
            "double": 1.5, "string": "héllo", "array": [1, "two", [3], { "four": 4 }],
            "doc": { "a": { "b": null } }, "true": true, "false": false, "null": null,
            "regex": Regex {
                pattern: String::from("^a.*").try_into().unwrap(),
                options: String::from("imx").try_into().unwrap(),
            }, "code": Bson::JavaScriptCode("f()".into()),
            "scope": JavaScriptCodeWithScope { code: "g()".into(), scope: doc! { "x": 1 } },
            "int32": -7, "int64": 1_i64 << 40, "ts": Timestamp { time: 5, increment: 9 },
            "binary": Binary { subtype: BinarySubtype::Uuid, bytes: vec![1; 16] },
            "old": Binary { subtype: BinarySubtype::BinaryOld, bytes: vec![2, 3] },
            "oid": ObjectId::from_bytes([7; 12]), "date": DateTime::from_millis(-1),
            "symbol": Bson::Symbol("s".into()), "dec": Decimal128::from_bytes([4; 16]),
            "undefined": Bson::Undefined, "max": Bson::MaxKey, "min": Bson::MinKey,
            "": "empty key",
        }
    }

    /// Review9 finding 5: a reply with real repeated keys, built as bytes (a `Document` cannot
    /// hold a key twice): `dup` twice at the top with values of two types, and `k` twice inside
    /// the embedded `doc` and inside a document in `arr`.
    fn repeated_keys() -> RawDocumentBuf {
        let mut inner = RawDocumentBuf::new();
        inner.append(cstr!("k"), 1_i32);
        inner.append(cstr!("x"), "x");
        inner.append(cstr!("k"), "two");
        let mut array = RawArrayBuf::new();
        array.push(&inner);
        array.push(2_i64);
        let mut reply = RawDocumentBuf::new();
        reply.append(cstr!("dup"), 1_i32);
        reply.append(cstr!("ok"), 1.0);
        reply.append(cstr!("doc"), &inner);
        reply.append(cstr!("arr"), array);
        reply.append(cstr!("dup"), "second");
        reply
    }

    /// The keys and type tags [`Elements`] walks in `bytes`, and whether it stopped broken.
    fn walked(bytes: &[u8]) -> (Vec<(String, u8)>, bool) {
        let mut elements = Elements::in_bytes(bytes);
        let walked = elements
            .by_ref()
            .map(|(k, t, _)| (String::from_utf8(k.to_vec()).unwrap(), t))
            .collect();
        (walked, elements.broken())
    }

    /// Review9 finding 5, WP-2, LB-10: the element walk yields every occurrence of a repeated
    /// key, in order, with its own type and value (what "the last occurrence" readers such as
    /// `opened_cursor` and `ReplyFields` rely on), at the top and nested, as the bson crate's
    /// element iterator does.
    #[test]
    fn review9_f5_elements_yield_every_occurrence_of_a_repeated_key() {
        let reply = repeated_keys();
        let owned = |k: &str, t: u8| (String::from(k), t);
        let (top, broken) = walked(reply.as_bytes());
        assert!(!broken);
        assert_eq!(
            top,
            [
                owned("dup", 0x10),
                owned("ok", 0x01),
                owned("doc", 0x03),
                owned("arr", 0x04),
                owned("dup", 0x02),
            ]
        );
        let theirs: Vec<_> = reply
            .iter_elements()
            .map(|e| e.unwrap())
            .map(|e| (String::from(e.key().as_str()), e.element_type() as u8))
            .collect();
        assert_eq!(top, theirs);
        let values: Vec<&[u8]> = Elements::of(&reply)
            .filter(|&(k, _, _)| k == b"dup")
            .map(|(_, _, v)| v)
            .collect();
        assert_eq!(values, [&[1, 0, 0, 0][..], b"\x07\0\0\0second\0"]);
        let (_, _, doc) = Elements::of(&reply).nth(2).unwrap();
        let (nested, broken) = walked(doc);
        assert!(!broken);
        assert_eq!(
            nested,
            [owned("k", 0x10), owned("x", 0x02), owned("k", 0x02)]
        );
    }

    /// Review9 finding 5, WP-2: a reply with repeated keys (top level, embedded document, a
    /// document in an array) takes the plain path, which gives the bson crate's conversion:
    /// each key at its first position with its last value.
    #[test]
    fn review9_f5_repeated_keys_take_the_plain_path_as_the_bson_crate_converts_them() {
        let reply = repeated_keys();
        assert!(well_formed(reply.as_bytes(), 0));
        let theirs = Document::try_from(reply.as_ref()).unwrap();
        let mut built = Document::new();
        let taken = plain_document(reply.as_bytes(), 0, &mut built, None);
        let plain = taken.map(|()| built);
        assert_eq!(plain.as_ref(), Some(&theirs));
        assert_eq!(document(&reply).unwrap(), theirs);
        let inner = doc! { "k": "two", "x": "x" };
        assert_eq!(
            theirs,
            doc! { "dup": "second", "ok": 1.0, "doc": inner.clone(), "arr": [inner, 2_i64] }
        );
        let keys: Vec<&str> = plain.as_ref().unwrap().keys().map(String::as_str).collect();
        assert_eq!(keys, ["dup", "ok", "doc", "arr"]);
    }

    /// WP-2: every BSON type, nested, decodes to the document the bson crate decodes.
    #[test]
    fn wp2_every_bson_type_decodes_as_the_bson_crate_decodes_it() {
        let doc = every_bson_type();
        let bytes = doc.to_vec().unwrap();
        let (ours, theirs) = both(&bytes);
        assert_eq!(ours, theirs);
        assert_eq!(ours.unwrap(), doc);
    }

    /// A document with a repeated key keeps the last value at the first position, as the bson
    /// crate's conversion does.
    #[test]
    fn a_repeated_key_decodes_as_the_bson_crate_decodes_it() {
        // {a: 1, b: 2, a: 3}
        let bytes = [
            26, 0, 0, 0, 0x10, b'a', 0, 1, 0, 0, 0, 0x10, b'b', 0, 2, 0, 0, 0, 0x10, b'a', 0, 3, 0,
            0, 0, 0,
        ];
        let (ours, theirs) = both(&bytes);
        assert_eq!(ours, theirs);
        assert_eq!(ours.unwrap(), doc! { "a": 3, "b": 2 });
    }

    /// WP-2, issue 9: a reply of the usual types (a `$clusterTime` with its generic binary hash,
    /// nested documents and arrays; repeated keys: [`repeated_keys`]) is built from its bytes by
    /// the plain path,
    /// into the document the bson crate's conversion gives; a binary of another subtype is left
    /// to that conversion, with the same result.
    #[test]
    fn wp2_a_plain_document_is_built_as_the_bson_crate_builds_it() {
        let plain = doc! {
            "ok": 1.0, "n": 3, "big": 1_i64 << 40, "s": "héllo", "t": true, "f": false,
            "none": null, "oid": ObjectId::from_bytes([7; 12]), "at": DateTime::from_millis(-5),
            "cursor": { "id": 0_i64, "ns": "db.c", "firstBatch": [{ "a": [1, [2.5], {}] }, "x"] },
            "$clusterTime": {
                "clusterTime": Timestamp { time: 5, increment: 9 },
                "signature": {
                    "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] },
                    "keyId": 0_i64,
                },
            },
            "empty": [], "": "empty key",
        };
        let uuid = doc! { "u": Binary { subtype: BinarySubtype::Uuid, bytes: vec![1; 16] } };
        for doc in [plain.clone(), uuid.clone()] {
            let bytes = doc.to_vec().unwrap();
            assert!(well_formed(&bytes, 0));
            let (ours, theirs) = both(&bytes);
            assert_eq!(ours, theirs);
            assert_eq!(ours.unwrap(), doc);
        }
        let plain_bytes = plain.to_vec().unwrap();
        let mut built = Document::new();
        assert_eq!(plain_document(&plain_bytes, 0, &mut built, None), Some(()));
        assert_eq!(built, plain);
        let uuid_bytes = uuid.to_vec().unwrap();
        let mut refused = Document::new();
        assert_eq!(plain_document(&uuid_bytes, 0, &mut refused, None), None);
        // Issue 9: built into an emptied document, embedded ones cloned from a template, the
        // same document; a document that is not empty is not built into.
        let empty = crate::wire::empty_document();
        let mut emptied = doc! { "ping": 1, "$db": "admin" };
        emptied.clear();
        let raw = RawDocument::from_bytes(&plain_bytes).unwrap();
        let into = document_in(raw, Some(emptied), Some(&empty)).unwrap();
        assert_eq!(into, plain);
        let not_empty = Some(doc! { "left": "over" });
        assert_eq!(document_in(raw, not_empty, Some(&empty)).unwrap(), plain);
        let uuid_raw = RawDocument::from_bytes(&uuid_bytes).unwrap();
        assert_eq!(document_in(uuid_raw, None, Some(&empty)).unwrap(), uuid);
    }

    /// Issue 9: the checking pass hands over every top-level element, as the element walk
    /// gives them, for a usual document and for one the crate's checks judge (every type);
    /// and refuses what `validate` refuses.
    #[test]
    fn validate_with_hands_over_the_elements_it_checks() {
        for doc in [
            doc! { "ok": 1.0, "cursor": { "id": 0_i64 }, "s": "x" },
            every_bson_type(),
        ] {
            let bytes = doc.to_vec().unwrap();
            let raw = RawDocument::from_bytes(&bytes).unwrap();
            let mut seen = Vec::new();
            validate_with(raw, |k, t, v| seen.push((k.to_vec(), t, v.to_vec()))).unwrap();
            let walked: Vec<_> = Elements::of(raw)
                .map(|(k, t, v)| (k.to_vec(), t, v.to_vec()))
                .collect();
            assert_eq!(seen, walked);
        }
        // A string element whose length runs past the document.
        let bytes = [12, 0, 0, 0, 0x02, b'a', 0, 0xFF, 0xFF, 0xFF, 0x7F, 0];
        let raw = RawDocument::from_bytes(&bytes).unwrap();
        assert!(validate_with(raw, |_, _, _| {}).is_err());
        assert!(validate(raw).is_err());
    }

    fn raw_elements(doc: &Document) -> Vec<(String, u8, Vec<u8>)> {
        let bytes = doc.to_vec().unwrap();
        let raw = RawDocument::from_bytes(&bytes).unwrap();
        let mut elements = Elements::of(raw);
        let ours: Vec<_> = elements
            .by_ref()
            .map(|(k, t, v)| (String::from_utf8(k.to_vec()).unwrap(), t, v.to_vec()))
            .collect();
        assert!(!elements.broken());
        ours
    }

    /// WP-2: the element walk sizes every BSON type as the bson crate does: the same keys,
    /// types and value bytes, in order.
    #[test]
    fn wp2_elements_size_every_bson_type_as_the_bson_crate_does() {
        let doc = every_bson_type();
        let bytes = doc.to_vec().unwrap();
        let raw = RawDocument::from_bytes(&bytes).unwrap();
        let theirs: Vec<_> = raw
            .iter_elements()
            .map(|e| e.unwrap())
            .map(|e| {
                (
                    String::from(e.key().as_str()),
                    e.element_type() as u8,
                    e.size(),
                )
            })
            .collect();
        let ours = raw_elements(&doc);
        assert_eq!(ours.len(), theirs.len());
        for (o, t) in ours.iter().zip(&theirs) {
            assert_eq!((&o.0, o.1, o.2.len()), (&t.0, t.1, t.2));
        }
    }

    /// WP-2, review7 finding 5: the one element sizer (the engine's walk, the validator's
    /// one-pass check and the test server's raw path use it) sizes each value as the bson crate
    /// does, and gives no size for an unknown type or a length or terminator it cannot read.
    #[test]
    fn value_size_is_the_bson_crates_size_or_none() {
        let doc = doc! {
            "s": "héllo", "o": { "a": 1 }, "r": Regex {
                pattern: String::from("^a").try_into().unwrap(),
                options: String::from("i").try_into().unwrap(),
            }, "b": Binary { subtype: BinarySubtype::Generic, bytes: vec![1; 3] }, "i": 7,
        };
        let bytes = doc.to_vec().unwrap();
        let raw = RawDocument::from_bytes(&bytes).unwrap();
        for (element, (_, tag, ours)) in raw.iter_elements().zip(Elements::of(raw)) {
            let element = element.unwrap();
            let value = ours.as_ptr() as usize - bytes.as_ptr() as usize;
            assert_eq!(tag, element.element_type() as u8);
            assert_eq!(value_size(tag, &bytes[value..]), Some(element.size()));
            // Cut one byte short of a length prefix or a terminator: no size.
            let cut = match tag {
                0x0B => element.size() - 1,
                0x10 => continue,
                _ => 3,
            };
            assert_eq!(value_size(tag, &bytes[value..value + cut]), None, "{tag}");
        }
        assert_eq!(value_size(0x14, &[0; 16]), None);
        assert_eq!(value_size(0x02, &(-1_i32).to_le_bytes()), None);
    }

    proptest! {
        /// The one-pass check never accepts what the bson crate refuses: valid documents of the
        /// usual types with bytes flipped or cut.
        #[test]
        fn well_formed_accepts_nothing_the_bson_crate_refuses(
            flips in proptest::collection::vec((0_usize..300, any::<u8>()), 0..4),
            cut in 0_usize..300,
        ) {
            let doc = doc! {
                "ok": 1.0, "n": 3, "big": 1_i64 << 40, "t": true, "z": null, "s": "héllo",
                "cursor": { "id": 0_i64, "ns": "db.c", "firstBatch": [{ "_id": ObjectId::from_bytes([1; 12]) }] },
                "$clusterTime": { "clusterTime": Timestamp { time: 1, increment: 2 },
                    "signature": { "hash": Binary { subtype: BinarySubtype::Generic, bytes: vec![0; 20] }, "keyId": 0_i64 } },
                "at": DateTime::from_millis(5), "e": [],
            };
            let mut bytes = doc.to_vec().unwrap();
            prop_assert!(well_formed(&bytes, 0));
            for (at, byte) in flips {
                let len = bytes.len();
                bytes[at % len] = byte;
            }
            for bytes in [&bytes[..], &bytes[..cut.min(bytes.len())]] {
                if well_formed(bytes, 0) {
                    let raw = RawDocument::from_bytes(bytes).expect("the crate accepts it");
                    prop_assert!(Document::try_from(raw).is_ok());
                }
            }
        }

        /// Any bytes (a valid document with bytes flipped, or noise) give the bson crate's
        /// document or its error.
        #[test]
        fn any_bytes_decode_as_the_bson_crate_decodes_them(
            flips in proptest::collection::vec((0_usize..200, any::<u8>()), 0..4),
            noise in proptest::collection::vec(any::<u8>(), 0..64),
        ) {
            let bytes = flipped_reply(&flips);
            for bytes in [&bytes, &noise] {
                let (ours, theirs) = both(bytes);
                let checked = RawDocument::from_bytes(bytes)
                    .map_err(|e| alloc::format!("{e}"))
                    .and_then(|raw| validate(raw).map_err(|e| alloc::format!("{e}")));
                prop_assert_eq!(checked.is_ok(), theirs.is_ok());
                // Compared as encoded bytes: a flipped byte can make a double NaN, which `==`
                // on documents never equals, while the decoders agree bit for bit.
                let encoded = |r: Result<Document, String>| r.map(|d| d.to_vec().unwrap());
                prop_assert_eq!(encoded(ours), encoded(theirs));
            }
        }
    }

    proptest! {
        /// Issue 9: a document converted from a buffer the caller gives up is the one converted
        /// from borrowed bytes, or the same error: small replies (whose buffer becomes the
        /// first key) with bytes flipped inside their framing, and a larger one.
        #[test]
        fn an_owned_document_converts_as_a_borrowed_one(
            flips in proptest::collection::vec((0_usize..64, any::<u8>()), 0..4),
            shape in 0_usize..5,
        ) {
            // Of every shape: several elements, more than 64 bytes, and one element (the usual
            // reply, converted without a copy of the document: issue 9) of several types.
            let doc = match shape {
                0 => doc! { "ok": 1.0, "é": "x", "n": [1, { "a": true }] },
                1 => doc! { "ok": 1.0, "s": "a string long enough to pass sixty-four bytes" },
                2 => doc! { "ok": 1.0 },
                3 => doc! { "ok": true },
                _ => doc! { "cursor": { "id": 0_i64, "ns": "é", "b": [1] } },
            };
            let mut bytes = doc.to_vec().unwrap();
            let inner = bytes.len() - 5;
            for (at, byte) in flips {
                bytes[4 + at % inner] = byte;
            }
            let raw = RawDocumentBuf::from_bytes(bytes).expect("framing kept");
            let text = |r: Result<Document, ReadError>| {
                r.map(|d| d.to_vec().unwrap()).map_err(|e| alloc::format!("{e}"))
            };
            let borrowed = text(document_in(&raw, None, None));
            prop_assert_eq!(text(owned_document_in(raw, Some(Document::new()), None)), borrowed);
        }
    }

    /// Issue 9: the conversion of a given-up buffer keeps it as the first key only when it is
    /// small: an empty document, a non-ASCII first key, a buffer with room to spare, a document
    /// it leaves to the crate's conversion (a Decimal128) all convert as borrowed bytes do.
    #[test]
    fn an_owned_buffer_is_kept_only_when_small() {
        let empty = Document::new();
        for doc in [
            doc! {},
            doc! { "ok": 1 },
            doc! { "é": 1 },
            doc! { "bin": bson::Binary { subtype: bson::spec::BinarySubtype::UserDefined(0x80), bytes: vec![1] } },
            doc! { "clé": 1, "ok": 1.0 },
            doc! { "d": Decimal128::from_bytes([1; 16]), "ok": 1 },
        ] {
            let raw = RawDocumentBuf::try_from(&doc).unwrap();
            let owned = owned_document_in(raw.clone(), None, Some(&empty)).unwrap();
            assert_eq!(owned, doc);
            assert_eq!(owned, document_in(&raw, None, Some(&empty)).unwrap());
        }
        // {a: 1, b: 2, a: 3}: the first key, kept, holds the last value.
        let repeated = vec![
            26, 0, 0, 0, 0x10, b'a', 0, 1, 0, 0, 0, 0x10, b'b', 0, 2, 0, 0, 0, 0x10, b'a', 0, 3, 0,
            0, 0, 0,
        ];
        let raw = RawDocumentBuf::from_bytes(repeated).unwrap();
        let owned = owned_document_in(raw.clone(), None, None).unwrap();
        assert_eq!(owned, doc! { "a": 3, "b": 2 });
        assert_eq!(owned, document(&raw).unwrap());
        let mut roomy = doc! { "ok": 1 }.to_vec().unwrap();
        roomy.reserve(1000);
        let first_key = |bytes: Vec<u8>| {
            let raw = RawDocumentBuf::from_bytes(bytes).unwrap();
            let converted = owned_document_in(raw, None, None).unwrap();
            assert_eq!(converted, doc! { "ok": 1 });
            converted.into_iter().next().unwrap().0
        };
        assert_eq!(first_key(roomy).capacity(), 2);
        let small = doc! { "ok": 1 }.to_vec().unwrap();
        let capacity = small.capacity();
        assert!(capacity <= KEPT_BUFFER);
        assert_eq!(first_key(small).capacity(), capacity);
    }

    /// A cursor reply's bytes with `flips` written over them (each at its offset modulo the length).
    fn flipped_reply(flips: &[(usize, u8)]) -> Vec<u8> {
        let doc = doc! {
            "ok": 1.0, "cursor": { "id": 0_i64, "ns": "db.c", "firstBatch": [{ "_id": 1 }] },
            "$clusterTime": { "clusterTime": Timestamp { time: 1, increment: 2 } },
            "errorLabels": ["RetryableError"], "s": "x",
        };
        let mut bytes = doc.to_vec().unwrap();
        for &(at, byte) in flips {
            let len = bytes.len();
            bytes[at % len] = byte;
        }
        bytes
    }

    /// The case proptest found: two flipped bytes make `ok` a NaN double; both decoders give the
    /// same bits (compared encoded, as `==` on a NaN is false).
    #[test]
    fn a_flipped_double_that_becomes_nan_decodes_as_the_bson_crate_decodes_it() {
        let bytes = flipped_reply(&[(8, 1), (193, 127)]);
        let (ours, theirs) = both(&bytes);
        let ours = ours.expect("still a valid document");
        assert!(matches!(ours.get("ok"), Some(bson::Bson::Double(d)) if d.is_nan()));
        assert_eq!(ours.to_vec().unwrap(), theirs.unwrap().to_vec().unwrap());
    }

    /// RW-3, review10 finding 8 (moved from retry-driver): the write-errors check finds a top-level `writeErrors` wherever it is, and no
    /// other key (a nested one, or one it prefixes) passes for it.
    #[test]
    fn rw3_has_top_level_key_reads_top_level_keys_only() {
        let has = |document: bson::Document| {
            let bytes = document.to_vec().unwrap();
            has_top_level_key(RawDocument::from_bytes(&bytes).unwrap(), b"writeErrors")
                .expect("a valid document walks to its end")
        };
        assert!(!has(bson::doc! { "ok": 1.0 }));
        assert!(!has(bson::doc! {}));
        assert!(has(
            bson::doc! { "n": 0, "writeErrors": [{ "code": 11000 }], "ok": 1.0 }
        ));
        assert!(has(bson::doc! { "ok": 1.0, "writeErrors": [] }));
        assert!(!has(
            bson::doc! { "nested": { "writeErrors": [] }, "ok": 1.0 }
        ));
        assert!(!has(
            bson::doc! { "writeError": 1, "writeErrorsX": 2, "s": "writeErrors" }
        ));
        assert!(!has(bson::doc! {
            "d": 1.5, "b": true, "i": 1i64, "t": bson::Timestamp { time: 1, increment: 2 },
            "r": bson::Regex {
                pattern: String::from("a").try_into().unwrap(),
                options: String::from("i").try_into().unwrap(),
            },
            "bin": bson::Binary { subtype: bson::spec::BinarySubtype::Generic, bytes: vec![1, 2] },
            "oid": bson::oid::ObjectId::from_bytes([7; 12]), "n": null, "a": [1, "x"],
        }));
    }
}
