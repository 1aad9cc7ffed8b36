//! The OP_MSG wire format: encoding commands and decoding replies from a byte stream.
//!
//! Only `OP_MSG` (opcode 2013) is spoken. Every handshake goes over OP_MSG too (HS-2: the 2026
//! handshake spec dropped the OP_QUERY first message), so OP_QUERY / OP_REPLY are never needed:
//! every other opcode is a [`DecodeError::UnknownOpCode`] (WP-9), except `OP_COMPRESSED` (2012)
//! wrapping an OP_MSG (WP-8). A server that was offered compressors in the handshake may compress
//! any reply, so the decoder unwraps the `noop` compressor itself and hands the others to a
//! [`Decompressor`] the caller supplies (the engine carries no compression library). Requests are
//! always sent uncompressed, which the spec allows.
//!
//! [`FrameDecoder`] is incremental: it takes bytes in whatever chunks the socket delivers and
//! yields whole messages, with the same result whether the input arrives one byte at a time or in
//! one buffer. It validates the 16-byte header before reserving room for the rest of a frame, so an
//! allocation is never sized by an unchecked length (WP-7: the limit is the connection's
//! `maxMessageSizeBytes`, [`DEFAULT_MAX_MESSAGE_SIZE_BYTES`] until its handshake says otherwise).

use alloc::string::String;
use alloc::vec::Vec;
use bson::{Document, RawDocument, RawDocumentBuf};
use core::fmt;

use crate::reply::TopFields;
use crate::{bson_read, bson_write};

pub use crate::bson_read::value_size;

pub use crate::bson_read::has_top_level_key;

/// The opcode of `OP_MSG` (WP-2).
pub const OP_MSG: i32 = 2013;

/// The opcode of `OP_COMPRESSED` (WP-8).
pub const OP_COMPRESSED: i32 = 2012;

/// The `noop` compressor id: the "compressed" bytes are the message itself (WP-8).
pub const NOOP_COMPRESSOR_ID: u8 = 0;

/// Decompresses the body of an `OP_COMPRESSED` frame (WP-8: 1 snappy, 2 zlib, 3 zstd) by appending
/// exactly `uncompressed_size` bytes to `out`, or fails with a reason. Called only after
/// `uncompressed_size` has been checked against the connection's `maxMessageSizeBytes`; an
/// implementation must stop at that size rather than trust the compressed stream.
pub type Decompressor = fn(
    compressor_id: u8,
    compressed: &[u8],
    uncompressed_size: usize,
    out: &mut Vec<u8>,
) -> Result<(), String>;

/// The length of the standard message header: `messageLength`, `requestID`, `responseTo`,
/// `opCode`, four little-endian int32s (WP-1).
pub const HEADER_LEN: usize = 16;

/// The smallest possible OP_MSG: a header, `flagBits`, and one kind-0 section holding the empty
/// BSON document (5 bytes).
pub const MIN_MESSAGE_LEN: usize = HEADER_LEN + 4 + 1 + 5;

/// The `maxMessageSizeBytes` a connection assumes until its handshake reply gives its own value
/// (WP-7, C12: no spec states a default; servers report 48,000,000).
pub const DEFAULT_MAX_MESSAGE_SIZE_BYTES: u32 = 48_000_000;

/// WP-7: how much larger than `maxBsonObjectSize` a command's body may be, for the command's
/// own fields around its largest document (16 KiB, the server's `BSONObjMaxInternalSize` over
/// `BSONObjMaxUserSize`).
pub const COMMAND_OVERHEAD_BYTES: usize = 16 * 1024;

/// The room [`OpMsg::encode`] reserves up front: most commands and replies fit.
const SMALL_MESSAGE_LEN: usize = 256;

/// CRC-32C (Castagnoli, the iSCSI polynomial), slice-by-16.
const CRC32C: crc::Crc<u32, crc::Table<16>> =
    crc::Crc::<u32, crc::Table<16>>::new(&crc::CRC_32_ISCSI);

/// The `flagBits` of an OP_MSG (WP-2).
///
/// The low 16 bits are *required*: a receiver that sees an unknown one set must fail. The high 16
/// bits are optional and ignored when unknown.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct MsgFlags(u32);

impl MsgFlags {
    /// No flags.
    pub const NONE: MsgFlags = MsgFlags(0);
    /// Bit 0: a CRC-32C checksum of the whole message follows the last section.
    pub const CHECKSUM_PRESENT: MsgFlags = MsgFlags(1);
    /// Bit 1: on a request, no reply will come (unacknowledged writes); on a reply, another reply
    /// to the same request follows (WP-6).
    pub const MORE_TO_COME: MsgFlags = MsgFlags(1 << 1);
    /// Bit 16: the client accepts several replies (`moreToCome`) to this request; only for
    /// `getMore` and `hello` (WP-6).
    pub const EXHAUST_ALLOWED: MsgFlags = MsgFlags(1 << 16);

    /// The required bits this implementation understands.
    const KNOWN_REQUIRED: u32 = 0b11;
    /// The required half of the flag word.
    const REQUIRED_MASK: u32 = 0xFFFF;

    /// The flags as the raw `flagBits` word.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Flags from a raw `flagBits` word, as received.
    pub const fn from_bits(bits: u32) -> MsgFlags {
        MsgFlags(bits)
    }

    /// Whether every bit of `other` is set in `self`.
    pub const fn contains(self, other: MsgFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// `self` with the bits of `other` also set.
    pub const fn with(self, other: MsgFlags) -> MsgFlags {
        MsgFlags(self.0 | other.0)
    }

    /// The set required bits (0-15) this implementation does not know (WP-2: must be an error).
    const fn unknown_required(self) -> u32 {
        self.0 & Self::REQUIRED_MASK & !Self::KNOWN_REQUIRED
    }
}

/// A kind-1 section: a named sequence of documents that stands for an array argument of the
/// command, such as `insert.documents` (WP-3, WP-4).
#[derive(Clone, Debug, PartialEq)]
pub struct DocumentSequence {
    /// The argument the sequence replaces (`"documents"`, `"updates"`, `"deletes"`, ...).
    pub identifier: String,
    /// The documents, in order.
    pub documents: Vec<Document>,
}

/// One OP_MSG: header ids, flags, the kind-0 body and any kind-1 document sequences (WP-2, WP-3).
#[derive(Clone, Debug, PartialEq)]
pub struct OpMsg {
    /// `requestID`: the sender's id for this message.
    pub request_id: i32,
    /// `responseTo`: the `requestID` this message answers, 0 on requests.
    pub response_to: i32,
    /// `flagBits`. On encode, [`MsgFlags::CHECKSUM_PRESENT`] makes the encoder append the CRC-32C.
    pub flags: MsgFlags,
    /// The one kind-0 section: the command (its first key is the command name) or the reply.
    pub body: Document,
    /// Kind-1 sections, in order; identifiers are unique within one message (WP-3).
    pub sequences: Vec<DocumentSequence>,
}

/// One OP_MSG whose documents are left encoded, from [`FrameDecoder::decode_raw`]: read the
/// fields you need with [`RawDocument::get`] (no tree is built), or convert a document with
/// `Document::try_from`. The documents were validated as [`FrameDecoder::decode`] converts them.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RawOpMsg {
    /// `requestID`.
    pub request_id: i32,
    /// `responseTo`.
    pub response_to: i32,
    /// `flagBits`.
    pub flags: MsgFlags,
    /// The kind-0 section: the command or the reply.
    pub body: RawDocumentBuf,
    /// Kind-1 sections, in order (WP-3).
    pub sequences: Vec<RawDocumentSequence>,
    /// The body's top-level fields every reply is read for, noted as the body was validated
    /// (issue 9).
    pub(crate) top: TopFields,
}

/// A kind-1 section of a [`RawOpMsg`] (WP-3, WP-4).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct RawDocumentSequence {
    /// The argument the sequence replaces.
    pub identifier: String,
    /// The documents, in order.
    pub documents: Vec<RawDocumentBuf>,
}

impl OpMsg {
    /// A request carrying `body` and nothing else.
    pub fn command(request_id: i32, body: Document) -> OpMsg {
        OpMsg {
            request_id,
            response_to: 0,
            flags: MsgFlags::NONE,
            body,
            sequences: Vec::new(),
        }
    }

    /// Appends the encoded message to `out` and returns its length.
    ///
    /// Fails, leaving `out` as it was, when a document does not serialize, two sequences share an
    /// identifier (WP-3), or the message would be longer than `max_message_size` (WP-7).
    pub fn encode(&self, max_message_size: u32, out: &mut Vec<u8>) -> Result<usize, EncodeError> {
        self.parts()
            .encode_with(max_message_size, out, |_| Ok(()))
            .map(|sizes| sizes.len)
    }

    /// The message as borrowed parts.
    fn parts(&self) -> MsgParts<'_> {
        MsgParts {
            request_id: self.request_id,
            response_to: self.response_to,
            flags: self.flags,
            encoded: None,
            body: &self.body,
            sequences: &self.sequences,
        }
    }
}

/// What [`MsgParts::encode_with`] wrote: the sizes the WP-7 limits apply to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct EncodedSizes {
    /// The whole message, header included.
    pub(crate) len: usize,
    /// The kind-0 body document.
    pub(crate) body: usize,
    /// The largest document of the kind-1 sections (size 0 without any) and its place: its
    /// size, the index of its section among the sequences and its index in that section.
    pub(crate) largest_document: (usize, usize, usize),
}

/// An OP_MSG to encode, borrowed from its owner: the engine encodes a request's command without
/// moving it into an [`OpMsg`] (and out again).
pub(crate) struct MsgParts<'a> {
    pub(crate) request_id: i32,
    pub(crate) response_to: i32,
    pub(crate) flags: MsgFlags,
    /// An encoded command whose elements come first, except those `body` replaces (issue 9).
    pub(crate) encoded: Option<&'a bson::RawDocument>,
    pub(crate) body: &'a Document,
    pub(crate) sequences: &'a [DocumentSequence],
}

impl MsgParts<'_> {
    /// [`OpMsg::encode`], with `append` writing more elements at the end of the body (the
    /// engine's `$db` and `lsid`, pre-encoded rather than inserted into the document). The body
    /// must not hold the keys `append` writes.
    pub(crate) fn encode_with(
        &self,
        max_message_size: u32,
        out: &mut Vec<u8>,
        append: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
    ) -> Result<EncodedSizes, EncodeError> {
        let start = out.len();
        let result = self
            .encode_unchecked_size(start, out, append)
            .and_then(|sizes| {
                if sizes.len > max_message_size as usize {
                    Err(EncodeError::TooLarge {
                        length: sizes.len,
                        max: max_message_size,
                    })
                } else {
                    Ok(sizes)
                }
            });
        if result.is_err() {
            out.truncate(start);
        }
        result
    }

    fn encode_unchecked_size(
        &self,
        start: usize,
        out: &mut Vec<u8>,
        append: impl FnOnce(&mut Vec<u8>) -> Result<(), EncodeError>,
    ) -> Result<EncodedSizes, EncodeError> {
        for (i, seq) in self.sequences.iter().enumerate() {
            if self.sequences[..i]
                .iter()
                .any(|s| s.identifier == seq.identifier)
            {
                return Err(EncodeError::DuplicateIdentifier(seq.identifier.clone()));
            }
            if seq.identifier.as_bytes().contains(&0) {
                return Err(EncodeError::Bson(String::from(
                    "a sequence identifier contains a NUL byte",
                )));
            }
        }
        // One allocation for a small message in an empty buffer, instead of growing it 16, 32,
        // 64, ... bytes at a time.
        out.reserve(SMALL_MESSAGE_LEN);
        // The header (filled in at the end), `flagBits`, the body's kind byte (0) and room for
        // its length, written at once.
        let mut head = [0; HEADER_LEN + 9];
        head[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&self.flags.bits().to_le_bytes());
        out.extend_from_slice(&head);
        let body = out.len() - 4;
        if let Some(encoded) = self.encoded {
            bson_write::elements_except(encoded, self.body, out);
        }
        for (key, value) in self.body {
            bson_write::element(key, value, out).map_err(bson_error)?;
        }
        append(out)?;
        out.push(0);
        let body_len = i32_len(out.len() - body)?;
        out[body..body + 4].copy_from_slice(&body_len.to_le_bytes());
        let mut largest_document = (0, 0, 0);
        for (s, seq) in self.sequences.iter().enumerate() {
            out.push(1);
            let size_at = out.len();
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(seq.identifier.as_bytes());
            out.push(0);
            for (i, doc) in seq.documents.iter().enumerate() {
                let at = out.len();
                write_document(doc, out)?;
                if out.len() - at > largest_document.0 {
                    largest_document = (out.len() - at, s, i);
                }
            }
            let size = i32_len(out.len() - size_at)?;
            out[size_at..size_at + 4].copy_from_slice(&size.to_le_bytes());
        }
        let checksum = self.flags.contains(MsgFlags::CHECKSUM_PRESENT);
        let len = out.len() - start + if checksum { 4 } else { 0 };
        let mut header = [0; HEADER_LEN];
        for (i, field) in [i32_len(len)?, self.request_id, self.response_to, OP_MSG]
            .iter()
            .enumerate()
        {
            header[4 * i..4 * i + 4].copy_from_slice(&field.to_le_bytes());
        }
        out[start..start + HEADER_LEN].copy_from_slice(&header);
        if checksum {
            let crc = CRC32C.checksum(&out[start..]);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        Ok(EncodedSizes {
            len,
            body: body_len as usize,
            largest_document,
        })
    }
}

fn write_document(doc: &Document, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    bson_write::document(doc, out).map_err(bson_error)
}

/// Appends `$db: <db>` (WP-5) to a body being encoded, written at once.
pub(crate) fn append_db(db: &str, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    let mut head = *b"\x02$db\0\0\0\0\0";
    head[5..].copy_from_slice(&i32_len(db.len() + 1)?.to_le_bytes());
    out.extend_from_slice(&head);
    out.extend_from_slice(db.as_bytes());
    out.push(0);
    Ok(())
}

/// Appends `lsid: {id: <UUID>}` (SE-3) to a body being encoded: the id's 16 bytes in a constant
/// frame.
pub(crate) fn append_lsid(id: &[u8; 16], out: &mut Vec<u8>) {
    // 0x03 "lsid" NUL; the embedded document's length, 30; 0x05 "id" NUL; the binary's length,
    // 16; subtype 4 (UUID); the id, then the document's final NUL: one write.
    let mut element = [
        0x03, b'l', b's', b'i', b'd', 0, 30, 0, 0, 0, 0x05, b'i', b'd', 0, 16, 0, 0, 0, 4, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];
    element[19..35].copy_from_slice(id);
    out.extend_from_slice(&element);
}

/// Appends `$readPreference` (SS-8, SS-9, LB-6) to a body being encoded, without building its
/// document when it is only a mode. Not inlined: most commands send none (issue 9).
#[inline(never)]
pub(crate) fn append_read_preference(
    sent: crate::read_preference_wire::Sent<'_>,
    out: &mut Vec<u8>,
) -> Result<(), EncodeError> {
    crate::read_preference_wire::append_element(sent, out).map_err(bson_error)
}

fn bson_error(error: bson_write::WriteError) -> EncodeError {
    match error {
        bson_write::WriteError::Nul => EncodeError::Bson(String::from(
            "a key or regular expression contains a NUL byte",
        )),
        bson_write::WriteError::TooLong(length) => EncodeError::TooLarge {
            length,
            max: i32::MAX as u32,
        },
    }
}

fn i32_len(len: usize) -> Result<i32, EncodeError> {
    i32::try_from(len).map_err(|_| EncodeError::TooLarge {
        length: len,
        max: i32::MAX as u32,
    })
}

/// Why a message could not be encoded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EncodeError {
    /// The message would exceed the connection's `maxMessageSizeBytes` (WP-7).
    TooLarge {
        /// The encoded length.
        length: usize,
        /// The limit.
        max: u32,
    },
    /// Two kind-1 sections share an identifier (WP-3).
    DuplicateIdentifier(String),
    /// A document could not be serialized.
    Bson(String),
}

impl fmt::Display for EncodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EncodeError::TooLarge { length, max } => write!(
                f,
                "message of {length} bytes exceeds maxMessageSizeBytes {max}"
            ),
            EncodeError::DuplicateIdentifier(id) => {
                write!(f, "two document sequences are named {id:?}")
            }
            EncodeError::Bson(e) => write!(f, "document does not serialize: {e}"),
        }
    }
}

impl core::error::Error for EncodeError {}

/// Why a byte stream is not a valid OP_MSG. Every variant means the stream can no longer be framed:
/// the connection that produced it must be closed (WP-3).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum DecodeError {
    /// `messageLength` is shorter than the smallest OP_MSG or longer than the connection's
    /// `maxMessageSizeBytes` (WP-7). Checked before anything is allocated.
    BadLength {
        /// The `messageLength` field.
        length: i32,
        /// The limit in force.
        max: u32,
    },
    /// The opcode is not OP_MSG, nor OP_COMPRESSED wrapping one (WP-9).
    UnknownOpCode(i32),
    /// An OP_COMPRESSED frame uses a compressor with no [`Decompressor`] installed (WP-8).
    UnsupportedCompressor(u8),
    /// An OP_COMPRESSED frame does not decompress to its `uncompressedSize` bytes (WP-8).
    Decompression {
        /// The frame's `compressorId`.
        compressor_id: u8,
        /// Why.
        reason: String,
    },
    /// A required flag bit (0-15) this implementation does not know is set (WP-2).
    UnknownRequiredFlags(u32),
    /// `checksumPresent` is set and the CRC-32C does not match (WP-2).
    ChecksumMismatch {
        /// The checksum in the message.
        expected: u32,
        /// The checksum of the bytes received.
        actual: u32,
    },
    /// A section kind other than 0 or 1 (WP-3: an error, and the socket must be closed).
    UnknownSectionKind(u8),
    /// No kind-0 section, or more than one (WP-3).
    BodyCount(usize),
    /// Two kind-1 sections share an identifier (WP-3).
    DuplicateIdentifier(String),
    /// A section or document length runs past the end of the frame or is too small.
    Truncated,
    /// A document or identifier is not valid BSON / UTF-8.
    Bson(String),
}

impl fmt::Display for DecodeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DecodeError::BadLength { length, max } => {
                write!(
                    f,
                    "bad message length {length} (allowed {MIN_MESSAGE_LEN}..={max})"
                )?;
                if &length.to_le_bytes() == b"HTTP" {
                    f.write_str(": the peer answered in HTTP, not the MongoDB wire protocol")?;
                }
                Ok(())
            }
            DecodeError::UnknownOpCode(op) => write!(f, "not OP_MSG: opcode {op}"),
            DecodeError::UnsupportedCompressor(id) => {
                write!(f, "no decompressor for compressor id {id}")
            }
            DecodeError::Decompression {
                compressor_id,
                reason,
            } => write!(f, "compressor {compressor_id} failed: {reason}"),
            DecodeError::UnknownRequiredFlags(bits) => {
                write!(f, "unknown required flag bits {bits:#06x}")
            }
            DecodeError::ChecksumMismatch { expected, actual } => write!(
                f,
                "CRC-32C mismatch: message says {expected:#010x}, bytes give {actual:#010x}"
            ),
            DecodeError::UnknownSectionKind(k) => write!(f, "unknown section kind {k}"),
            DecodeError::BodyCount(n) => {
                write!(f, "an OP_MSG needs exactly one kind-0 section, got {n}")
            }
            DecodeError::DuplicateIdentifier(id) => {
                write!(f, "two document sequences are named {id:?}")
            }
            DecodeError::Truncated => f.write_str("a section overruns its message"),
            DecodeError::Bson(e) => write!(f, "invalid BSON: {e}"),
        }
    }
}

impl core::error::Error for DecodeError {}

/// Frames OP_MSG messages out of a byte stream, incrementally (see the module docs).
///
/// Holds at most one partial frame. After an error it stays failed: the stream cannot be resynced.
#[derive(Debug)]
pub struct FrameDecoder {
    max_message_size: u32,
    /// The frame being assembled: the header, then (once the header is valid) the rest.
    frame: Vec<u8>,
    /// The validated `messageLength` of the frame in progress, once its header is complete.
    expected: Option<usize>,
    failed: Option<DecodeError>,
    decompressor: Option<Decompressor>,
}

/// Frame buffers larger than this are released after use rather than kept for the next frame.
const RETAINED_CAPACITY: usize = 64 * 1024;

impl FrameDecoder {
    /// A decoder that accepts messages up to `max_message_size` bytes (WP-7).
    pub fn new(max_message_size: u32) -> FrameDecoder {
        FrameDecoder {
            max_message_size,
            frame: Vec::new(),
            expected: None,
            failed: None,
            decompressor: None,
        }
    }

    /// Installs the function that decompresses OP_COMPRESSED frames other than `noop` (WP-8).
    pub fn set_decompressor(&mut self, decompressor: Option<Decompressor>) {
        self.decompressor = decompressor;
    }

    /// Changes the size limit, for frames whose header has not yet been read (WP-7: the
    /// connection's own handshake reply sets it).
    pub fn set_max_message_size(&mut self, max_message_size: u32) {
        self.max_message_size = max_message_size;
    }

    /// The size limit in force.
    pub fn max_message_size(&self) -> u32 {
        self.max_message_size
    }

    /// Whether a frame has been started and not finished.
    pub fn is_mid_frame(&self) -> bool {
        !self.frame.is_empty()
    }

    /// Consumes bytes from the front of `input` until one message is complete or `input` runs out.
    ///
    /// Returns how many bytes were consumed and the message, if one was completed; call again
    /// with the rest of the input. An error is final: every later call returns it again.
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<OpMsg>), DecodeError> {
        self.decode_as(input, parse_frame)
    }

    /// [`FrameDecoder::decode`], leaving the documents encoded ([`RawOpMsg`]): for a reader that
    /// needs a few fields, not every document as a tree. Accepts and refuses exactly the frames
    /// [`FrameDecoder::decode`] does (the documents are validated, not converted).
    pub fn decode_raw(&mut self, input: &[u8]) -> Result<(usize, Option<RawOpMsg>), DecodeError> {
        self.decode_as(input, parse_frame_raw)
    }

    /// The usual case of [`FrameDecoder::decode_raw`], in one step (issue 9): a whole frame of
    /// the usual shape ([`lone_body`]) at the front of `input`, none in progress, its body
    /// valid: how many bytes it took and its message. `None` for anything else, which
    /// [`FrameDecoder::decode_raw`] then decodes or refuses as always.
    #[inline]
    pub(crate) fn decode_lone(&self, input: &[u8]) -> Option<(usize, RawOpMsg)> {
        if self.failed.is_some() || !self.frame.is_empty() {
            return None;
        }
        let header = input.get(..HEADER_LEN)?;
        let len = Self::validate(header, self.max_message_size).ok()?;
        let frame = input
            .get(..len)
            .filter(|_| read_i32(header, 12) == OP_MSG)?;
        let body = plain_raw_body(lone_body(frame)?)?;
        Some((len, lone_message(frame, body)))
    }

    fn decode_as<M>(
        &mut self,
        input: &[u8],
        parse: impl Fn(&[u8]) -> Result<M, DecodeError>,
    ) -> Result<(usize, Option<M>), DecodeError> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        let result = self.decode_inner(input, parse);
        if let Err(e) = &result {
            self.failed = Some(e.clone());
            self.frame = Vec::new();
        }
        result
    }

    fn decode_inner<M>(
        &mut self,
        input: &[u8],
        parse: impl Fn(&[u8]) -> Result<M, DecodeError>,
    ) -> Result<(usize, Option<M>), DecodeError> {
        // A whole uncompressed frame at the front of `input` with none in progress (the usual
        // case) is parsed where it lies, without copying it into `frame` first.
        if self.frame.is_empty() && input.len() >= HEADER_LEN {
            let len = Self::validate(&input[..HEADER_LEN], self.max_message_size)?;
            if input.len() >= len && read_i32(input, 12) == OP_MSG {
                return Ok((len, Some(parse(&input[..len])?)));
            }
        }
        let mut consumed = 0;
        let expected = match self.expected {
            Some(len) => len,
            None => {
                let take = (HEADER_LEN - self.frame.len()).min(input.len());
                self.frame.extend_from_slice(&input[..take]);
                consumed = take;
                if self.frame.len() < HEADER_LEN {
                    return Ok((consumed, None));
                }
                let len = self.validate_header()?;
                self.frame.reserve_exact(len - HEADER_LEN);
                self.expected = Some(len);
                len
            }
        };
        let take = (expected - self.frame.len()).min(input.len() - consumed);
        self.frame
            .extend_from_slice(&input[consumed..consumed + take]);
        consumed += take;
        if self.frame.len() < expected {
            return Ok((consumed, None));
        }
        self.expected = None;
        let msg = if read_i32(&self.frame, 12) == OP_COMPRESSED {
            self.decompress().and_then(|frame| parse(&frame))
        } else {
            parse(&self.frame)
        };
        if self.frame.capacity() > RETAINED_CAPACITY {
            self.frame = Vec::new();
        } else {
            self.frame.clear();
        }
        Ok((consumed, Some(msg?)))
    }

    /// WP-1, WP-7, WP-9: the length is within bounds and the opcode is OP_MSG, before any
    /// allocation for the body.
    fn validate_header(&self) -> Result<usize, DecodeError> {
        Self::validate(&self.frame, self.max_message_size)
    }

    /// [`FrameDecoder::validate_header`] of the header at the start of `header`.
    fn validate(header: &[u8], max_message_size: u32) -> Result<usize, DecodeError> {
        let length = read_i32(header, 0);
        let op_code = read_i32(header, 12);
        let in_bounds = usize::try_from(length)
            .ok()
            .filter(|&l| l >= MIN_MESSAGE_LEN && l <= max_message_size as usize);
        let Some(len) = in_bounds else {
            return Err(DecodeError::BadLength {
                length,
                max: max_message_size,
            });
        };
        if op_code != OP_MSG && op_code != OP_COMPRESSED {
            return Err(DecodeError::UnknownOpCode(op_code));
        }
        Ok(len)
    }

    /// WP-8: rebuilds the OP_MSG frame an OP_COMPRESSED frame wraps. `uncompressedSize` is checked
    /// against the size limit before the output is allocated.
    fn decompress(&self) -> Result<Vec<u8>, DecodeError> {
        let body = &self.frame[HEADER_LEN..];
        if body.len() < 9 {
            return Err(DecodeError::Truncated);
        }
        let original = read_i32(body, 0);
        if original != OP_MSG {
            return Err(DecodeError::UnknownOpCode(original));
        }
        let size = read_i32(body, 4);
        let total = usize::try_from(size)
            .ok()
            .and_then(|s| s.checked_add(HEADER_LEN))
            .filter(|&t| t >= MIN_MESSAGE_LEN && t <= self.max_message_size as usize)
            .ok_or(DecodeError::BadLength {
                length: size.saturating_add(HEADER_LEN as i32),
                max: self.max_message_size,
            })?;
        let compressor_id = body[8];
        let compressed = &body[9..];
        let mut frame = Vec::with_capacity(total);
        frame.extend_from_slice(&i32_len(total).unwrap_or(i32::MAX).to_le_bytes());
        frame.extend_from_slice(&self.frame[4..12]);
        frame.extend_from_slice(&OP_MSG.to_le_bytes());
        match (compressor_id, self.decompressor) {
            (NOOP_COMPRESSOR_ID, _) => frame.extend_from_slice(compressed),
            (id, Some(decompress)) => decompress(id, compressed, total - HEADER_LEN, &mut frame)
                .map_err(|reason| DecodeError::Decompression {
                    compressor_id: id,
                    reason,
                })?,
            (id, None) => return Err(DecodeError::UnsupportedCompressor(id)),
        }
        if frame.len() != total {
            return Err(DecodeError::Decompression {
                compressor_id,
                reason: alloc::format!(
                    "{} bytes, uncompressedSize says {}",
                    frame.len() - HEADER_LEN,
                    total - HEADER_LEN
                ),
            });
        }
        Ok(frame)
    }
}

/// Parses one complete OP_MSG frame whose header has been validated.
///
/// Public so a caller holding a whole frame (a test server, a fuzzer) can skip the framing step;
/// `frame` must be exactly as long as its `messageLength` says, else [`DecodeError::Truncated`].
pub fn parse_frame(frame: &[u8]) -> Result<OpMsg, DecodeError> {
    parse_frame_as(frame)
}

/// [`parse_frame`], leaving the documents encoded ([`RawOpMsg`]); accepts and refuses the same
/// frames.
pub fn parse_frame_raw(frame: &[u8]) -> Result<RawOpMsg, DecodeError> {
    match lone_body(frame) {
        Some(body) => Ok(lone_message(frame, parse_raw_body(body)?)),
        None => parse_frame_as(frame),
    }
}

/// The message of a frame of the usual shape whose body ([`lone_body`]) parsed into `body`.
#[inline(always)]
fn lone_message(frame: &[u8], (body, top): (RawDocumentBuf, TopFields)) -> RawOpMsg {
    RawOpMsg {
        request_id: read_i32(frame, 4),
        response_to: read_i32(frame, 8),
        flags: MsgFlags::from_bits(u32::from_le_bytes(le4(frame, HEADER_LEN))),
        body,
        sequences: Vec::new(),
        top,
    }
}

/// The body of a frame of the usual shape, whose layout [`parse_frame_as`] would accept as it
/// is: its length right, no checksum, no unknown required flag, and one kind-0 section that
/// ends the frame. Such a frame is the body's alone (issue 9: a reply is read without the
/// general section walk); `None` for any other, left to that walk.
#[inline]
fn lone_body(frame: &[u8]) -> Option<&[u8]> {
    const BODY: usize = HEADER_LEN + 5;
    let header = frame.get(..BODY + 4)?;
    let flags = MsgFlags::from_bits(u32::from_le_bytes(le4(header, HEADER_LEN)));
    let plain = usize::try_from(read_i32(header, 0)) == Ok(frame.len())
        && flags.unknown_required() == 0
        && !flags.contains(MsgFlags::CHECKSUM_PRESENT)
        && header[BODY - 1] == 0
        && usize::try_from(read_i32(header, BODY)) == Ok(frame.len() - BODY)
        && frame.len() - BODY >= 5;
    plain.then(|| &frame[BODY..])
}

/// A message type a frame parses into: how its documents are read and how it is assembled.
trait Parsed: Sized {
    type Doc;
    type Body;
    type Seq;
    fn document(bytes: &[u8]) -> Result<Self::Doc, DecodeError>;
    fn body(bytes: &[u8]) -> Result<Self::Body, DecodeError>;
    fn sequence(identifier: String, documents: Vec<Self::Doc>) -> Self::Seq;
    fn identifier(sequence: &Self::Seq) -> &str;
    fn message(header: [i32; 2], flags: MsgFlags, body: Self::Body, seqs: Vec<Self::Seq>) -> Self;
}

impl Parsed for OpMsg {
    type Doc = Document;
    type Body = Document;
    type Seq = DocumentSequence;
    fn document(bytes: &[u8]) -> Result<Document, DecodeError> {
        parse_document(bytes)
    }
    fn body(bytes: &[u8]) -> Result<Document, DecodeError> {
        Self::document(bytes)
    }
    fn sequence(identifier: String, documents: Vec<Document>) -> DocumentSequence {
        DocumentSequence {
            identifier,
            documents,
        }
    }
    fn identifier(sequence: &DocumentSequence) -> &str {
        &sequence.identifier
    }
    fn message(header: [i32; 2], flags: MsgFlags, body: Document, seqs: Vec<Self::Seq>) -> OpMsg {
        OpMsg {
            request_id: header[0],
            response_to: header[1],
            flags,
            body,
            sequences: seqs,
        }
    }
}

impl Parsed for RawOpMsg {
    type Doc = RawDocumentBuf;
    type Body = (RawDocumentBuf, TopFields);
    type Seq = RawDocumentSequence;
    fn document(bytes: &[u8]) -> Result<RawDocumentBuf, DecodeError> {
        parse_raw_document(bytes)
    }
    fn body(bytes: &[u8]) -> Result<(RawDocumentBuf, TopFields), DecodeError> {
        parse_raw_body(bytes)
    }
    fn sequence(identifier: String, documents: Vec<RawDocumentBuf>) -> RawDocumentSequence {
        RawDocumentSequence {
            identifier,
            documents,
        }
    }
    fn identifier(sequence: &RawDocumentSequence) -> &str {
        &sequence.identifier
    }
    fn message(
        header: [i32; 2],
        flags: MsgFlags,
        (body, top): (RawDocumentBuf, TopFields),
        seqs: Vec<Self::Seq>,
    ) -> Self {
        RawOpMsg {
            request_id: header[0],
            response_to: header[1],
            flags,
            body,
            sequences: seqs,
            top,
        }
    }
}

/// The frame layout checks of [`parse_frame`] (WP-2, WP-3), for either message type.
fn parse_frame_as<M: Parsed>(frame: &[u8]) -> Result<M, DecodeError> {
    if frame.len() < HEADER_LEN + 4 || usize::try_from(read_i32(frame, 0)) != Ok(frame.len()) {
        return Err(DecodeError::Truncated);
    }
    let flags = MsgFlags::from_bits(u32::from_le_bytes(le4(frame, HEADER_LEN)));
    if flags.unknown_required() != 0 {
        return Err(DecodeError::UnknownRequiredFlags(flags.unknown_required()));
    }
    let mut end = frame.len();
    if flags.contains(MsgFlags::CHECKSUM_PRESENT) {
        if end < HEADER_LEN + 8 {
            return Err(DecodeError::Truncated);
        }
        end -= 4;
        let expected = u32::from_le_bytes(le4(frame, end));
        let actual = CRC32C.checksum(&frame[..end]);
        if expected != actual {
            return Err(DecodeError::ChecksumMismatch { expected, actual });
        }
    }
    let mut body = None;
    let mut bodies = 0;
    let mut sequences: Vec<M::Seq> = Vec::new();
    let mut at = HEADER_LEN + 4;
    while at < end {
        let kind = frame[at];
        at += 1;
        match kind {
            0 => {
                let len = section_len(frame, at, end, 5)?;
                bodies += 1;
                if bodies == 1 {
                    body = Some(M::body(&frame[at..at + len])?);
                }
                at += len;
            }
            1 => {
                let len = section_len(frame, at, end, 5)?;
                let section = &frame[at + 4..at + len];
                let nul = section
                    .iter()
                    .position(|&b| b == 0)
                    .ok_or(DecodeError::Truncated)?;
                let identifier = core::str::from_utf8(&section[..nul])
                    .map_err(|e| DecodeError::Bson(alloc::format!("identifier: {e}")))?;
                if sequences.iter().any(|s| M::identifier(s) == identifier) {
                    return Err(DecodeError::DuplicateIdentifier(identifier.into()));
                }
                let mut documents = Vec::new();
                let mut doc_at = nul + 1;
                while doc_at < section.len() {
                    let doc_len = section_len(section, doc_at, section.len(), 5)?;
                    documents.push(M::document(&section[doc_at..doc_at + doc_len])?);
                    doc_at += doc_len;
                }
                sequences.push(M::sequence(identifier.into(), documents));
                at += len;
            }
            other => return Err(DecodeError::UnknownSectionKind(other)),
        }
    }
    match body {
        Some(body) if bodies == 1 => Ok(M::message(
            [read_i32(frame, 4), read_i32(frame, 8)],
            flags,
            body,
            sequences,
        )),
        _ => Err(DecodeError::BodyCount(bodies)),
    }
}

/// The int32 length at `at`, checked to be at least `min` and to end by `end`.
#[inline]
fn section_len(buf: &[u8], at: usize, end: usize, min: usize) -> Result<usize, DecodeError> {
    if end.saturating_sub(at) < 4 {
        return Err(DecodeError::Truncated);
    }
    usize::try_from(read_i32(buf, at))
        .ok()
        .filter(|&len| len >= min && len <= end - at)
        .ok_or(DecodeError::Truncated)
}

fn parse_document(bytes: &[u8]) -> Result<Document, DecodeError> {
    let raw =
        RawDocument::from_bytes(bytes).map_err(|e| DecodeError::Bson(alloc::format!("{e}")))?;
    to_document(raw)
}

/// The [`Document`] an encoded document holds, converted as [`FrameDecoder::decode`] converts
/// each document of a message (the `bson` crate's `Document::try_from(&RawDocument)` result,
/// without its intermediate copies). A document of a [`RawOpMsg`] was validated this way, so
/// converting it cannot fail.
pub fn to_document(raw: &RawDocument) -> Result<Document, DecodeError> {
    bson_read::document(raw).map_err(|e| DecodeError::Bson(alloc::format!("{e}")))
}

/// [`to_document`] for a caller that converts many documents (issue 9): the same document,
/// built into `document` when it is an empty one (its table and hasher reused: an emptied
/// command document from [`Engine::take_document`](crate::engine::Engine::take_document), say),
/// and with the embedded documents (and the top-level one without `document`) made as clones of
/// `empty`, an empty document the caller keeps (see [`empty_document`]). A clone shares its
/// hasher, where [`Document::new`] draws a new seed each time; it allocates as a new document
/// does (the `bson` crate's `Document` clones no entry capacity). A non-empty `document` or
/// `empty` is not used.
#[inline]
pub fn to_document_in(
    raw: &RawDocument,
    document: Option<Document>,
    empty: &Document,
) -> Result<Document, DecodeError> {
    bson_read::document_in(raw, document, Some(empty))
        .map_err(|e| DecodeError::Bson(alloc::format!("{e}")))
}

/// [`to_document_in`] of an encoded document the caller no longer needs (a reply it converts
/// and drops): the same document, or the same error. A small document's buffer (up to 64 bytes,
/// a usual reply such as `{ok: 1}`) becomes the document's first key instead of being freed,
/// so that key allocates nothing (issue 9: one allocation and one free fewer per reply).
#[inline]
pub fn into_document_in(
    raw: RawDocumentBuf,
    document: Option<Document>,
    empty: &Document,
) -> Result<Document, DecodeError> {
    let mut document = bson_read::top_document(document, Some(empty));
    match bson_read::owned_document_into(raw, &mut document, Some(empty)) {
        Ok(()) => Ok(document),
        Err(e) => Err(DecodeError::Bson(alloc::format!("{e}"))),
    }
}

/// An empty document, the `empty` of [`to_document_in`]: its clones share its hasher. It holds
/// no table, so a clone of it (an embedded `{}`) allocates nothing, as [`Document::new`].
pub fn empty_document() -> Document {
    Document::new()
}

/// [`parse_raw_document`] for a message's body, noting its top-level fields as it is validated
/// ([`TopFields`], issue 9: an attempt's reply is then not walked again).
fn parse_raw_body(bytes: &[u8]) -> Result<(RawDocumentBuf, TopFields), DecodeError> {
    let raw = RawDocumentBuf::from_bytes(bytes.to_vec())
        .map_err(|e| DecodeError::Bson(alloc::format!("{e}")))?;
    let mut top = TopFields::default();
    let document = raw.as_bytes();
    let complete =
        bson_read::validate_each(&raw, |key, tag, value| top.note(document, key, tag, value))
            .map_err(|e| DecodeError::Bson(alloc::format!("{e}")))?;
    if !complete {
        top.ok = false;
    }
    Ok((raw, top))
}

/// [`parse_raw_body`] of a body of the usual types, checked and noted in one pass
/// ([`bson_read::plain_with`], issue 9: no error to build, no second pass); `None` for any other
/// body, which [`parse_raw_body`] then accepts or refuses.
fn plain_raw_body(bytes: &[u8]) -> Option<(RawDocumentBuf, TopFields)> {
    let mut top = TopFields::default();
    if !bson_read::plain_with(bytes, |key, tag, value| top.note(bytes, key, tag, value)) {
        return None;
    }
    Some((RawDocumentBuf::from_bytes(bytes.to_vec()).ok()?, top))
}

/// A document left encoded, validated as [`parse_document`] would convert it.
fn parse_raw_document(bytes: &[u8]) -> Result<RawDocumentBuf, DecodeError> {
    // Copied first, so its framing is checked once (`to_owned` would check it again; issue 9).
    let raw = RawDocumentBuf::from_bytes(bytes.to_vec())
        .map_err(|e| DecodeError::Bson(alloc::format!("{e}")))?;
    bson_read::validate(&raw).map_err(|e| DecodeError::Bson(alloc::format!("{e}")))?;
    Ok(raw)
}

/// The four bytes at `at`: one bounds check, not one per byte (issue 9).
#[inline(always)]
fn le4(buf: &[u8], at: usize) -> [u8; 4] {
    let bytes = &buf[at..at + 4];
    [bytes[0], bytes[1], bytes[2], bytes[3]]
}

#[inline(always)]
fn read_i32(buf: &[u8], at: usize) -> i32 {
    i32::from_le_bytes(le4(buf, at))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bson::doc;

    fn encoded(msg: &OpMsg) -> Vec<u8> {
        let mut out = Vec::new();
        msg.encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut out)
            .unwrap();
        out
    }

    fn decode_all(dec: &mut FrameDecoder, mut input: &[u8]) -> Result<Vec<OpMsg>, DecodeError> {
        let mut out = Vec::new();
        while !input.is_empty() {
            let (n, msg) = dec.decode(input)?;
            input = &input[n..];
            out.extend(msg);
        }
        Ok(out)
    }

    fn insert() -> OpMsg {
        OpMsg {
            request_id: 7,
            response_to: 0,
            flags: MsgFlags::NONE,
            body: doc! { "insert": "c", "$db": "d" },
            sequences: vec![DocumentSequence {
                identifier: "documents".into(),
                documents: vec![doc! { "_id": 1 }, doc! { "_id": 2, "x": "y" }],
            }],
        }
    }

    #[test]
    fn wp1_wp2_header_layout_is_little_endian_length_ids_opcode() {
        let bytes = encoded(&OpMsg::command(0x0102_0304, doc! { "ping": 1 }));
        let body = doc! { "ping": 1 }.to_vec().unwrap();
        assert_eq!(bytes.len(), HEADER_LEN + 4 + 1 + body.len());
        assert_eq!(&bytes[0..4], &(bytes.len() as i32).to_le_bytes());
        assert_eq!(&bytes[4..8], &[4, 3, 2, 1]);
        assert_eq!(&bytes[8..12], &[0, 0, 0, 0]);
        assert_eq!(&bytes[12..16], &2013i32.to_le_bytes());
        assert_eq!(&bytes[16..20], &[0, 0, 0, 0]);
        assert_eq!(bytes[20], 0);
        assert_eq!(&bytes[21..], &body[..]);
    }

    #[test]
    fn wp3_kind1_sequence_size_counts_itself_but_not_the_kind_byte() {
        let msg = insert();
        let bytes = encoded(&msg);
        let body_len = msg.body.to_vec().unwrap().len();
        let seq_at = HEADER_LEN + 4 + 1 + body_len;
        assert_eq!(bytes[seq_at], 1);
        let size = read_i32(&bytes, seq_at + 1) as usize;
        assert_eq!(seq_at + 1 + size, bytes.len());
        assert_eq!(&bytes[seq_at + 5..seq_at + 15], b"documents\0");
    }

    #[test]
    fn round_trips_body_sequences_and_checksum() {
        let mut msg = insert();
        let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        assert_eq!(
            decode_all(&mut dec, &encoded(&msg)).unwrap(),
            vec![msg.clone()]
        );
        msg.flags = MsgFlags::CHECKSUM_PRESENT;
        assert_eq!(decode_all(&mut dec, &encoded(&msg)).unwrap(), vec![msg]);
    }

    #[test]
    fn one_byte_at_a_time_equals_whole_buffer() {
        let mut stream = encoded(&insert());
        let mut reply = OpMsg::command(9, doc! { "ok": 1 });
        reply.response_to = 7;
        reply.flags = MsgFlags::CHECKSUM_PRESENT;
        stream.extend(encoded(&reply));
        let mut whole = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let expected = decode_all(&mut whole, &stream).unwrap();
        assert_eq!(expected, vec![insert(), reply]);
        let mut bytewise = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let mut got = Vec::new();
        for b in &stream {
            got.extend(decode_all(&mut bytewise, core::slice::from_ref(b)).unwrap());
        }
        assert_eq!(got, expected);
        assert!(!bytewise.is_mid_frame());
    }

    /// WP-5, SE-3: `$db` and the `lsid` are appended as the bson crate writes them.
    #[test]
    fn wp5_se3_appended_db_and_lsid_are_the_bson_crate_bytes() {
        let id = [9_u8; 16];
        let mut body = vec![0; 4];
        append_db("test", &mut body).unwrap();
        append_lsid(&id, &mut body);
        body.push(0);
        let len = body.len() as i32;
        body[..4].copy_from_slice(&len.to_le_bytes());
        let expected = doc! {
            "$db": "test",
            "lsid": { "id": bson::Binary { subtype: bson::spec::BinarySubtype::Uuid, bytes: id.to_vec() } },
        };
        assert_eq!(body, expected.to_vec().unwrap());
    }

    /// Issue 9 (WP-2, WP-3): a usual reply (one body, no checksum) is decoded in one step, to
    /// the message `decode_raw` gives; a frame of another shape, a partial one or one after a
    /// frame in progress is left to `decode_raw`.
    #[test]
    fn a_usual_reply_is_decoded_in_one_step() {
        let mut reply = OpMsg::command(9, doc! { "ok": 1.0, "n": 2 });
        reply.response_to = 7;
        let bytes = encoded(&reply);
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let (used, lone) = decoder.decode_lone(&bytes).expect("one step");
        assert_eq!((used, lone.response_to), (bytes.len(), 7));
        assert_eq!(
            decoder.decode_raw(&bytes).unwrap(),
            (used, Some(lone.clone()))
        );
        let mut stream = bytes.clone();
        stream.extend_from_slice(&bytes);
        assert_eq!(decoder.decode_lone(&stream).map(|(n, _)| n), Some(used));
        reply.flags = MsgFlags::CHECKSUM_PRESENT;
        assert!(decoder.decode_lone(&encoded(&reply)).is_none());
        assert!(decoder.decode_lone(&encoded(&insert())).is_none());
        assert!(decoder.decode_lone(&bytes[..bytes.len() - 1]).is_none());
        assert_eq!(decoder.decode_raw(&bytes[..10]).unwrap(), (10, None));
        assert!(decoder.decode_lone(&bytes).is_none());
    }

    #[test]
    fn wp2_checksum_mismatch_is_an_error() {
        let mut msg = insert();
        msg.flags = MsgFlags::CHECKSUM_PRESENT;
        let mut bytes = encoded(&msg);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF;
        let err = parse_frame(&bytes).unwrap_err();
        assert!(matches!(err, DecodeError::ChecksumMismatch { .. }), "{err}");
    }

    #[test]
    fn wp2_crc32c_matches_the_castagnoli_check_value() {
        // The standard check value of CRC-32C over "123456789".
        assert_eq!(CRC32C.checksum(b"123456789"), 0xE306_9283);
    }

    #[test]
    fn wp2_unknown_required_flag_is_an_error_unknown_optional_flag_is_ignored() {
        let mut msg = insert();
        msg.flags = MsgFlags::from_bits(1 << 5);
        assert_eq!(
            parse_frame(&encoded(&msg)),
            Err(DecodeError::UnknownRequiredFlags(1 << 5))
        );
        msg.flags = MsgFlags::from_bits(1 << 20).with(MsgFlags::EXHAUST_ALLOWED);
        assert_eq!(parse_frame(&encoded(&msg)).unwrap(), msg);
    }

    #[test]
    fn wp7_length_is_checked_before_allocating() {
        let mut dec = FrameDecoder::new(1000);
        let mut header = Vec::new();
        header.extend(1001i32.to_le_bytes());
        header.extend([0; 8]);
        header.extend(OP_MSG.to_le_bytes());
        assert_eq!(
            dec.decode(&header),
            Err(DecodeError::BadLength {
                length: 1001,
                max: 1000
            })
        );
        assert_eq!(dec.frame.capacity(), 0);
        // Once failed, always failed.
        assert!(dec.decode(&[0]).is_err());
        for length in [-1, 0, 25] {
            let mut dec = FrameDecoder::new(1000);
            header[..4].copy_from_slice(&i32::to_le_bytes(length));
            assert!(matches!(
                dec.decode(&header),
                Err(DecodeError::BadLength { .. })
            ));
        }
    }

    #[test]
    fn wp9_other_opcodes_are_errors() {
        let mut bytes = encoded(&insert());
        bytes[12..16].copy_from_slice(&2004i32.to_le_bytes());
        let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        assert_eq!(dec.decode(&bytes), Err(DecodeError::UnknownOpCode(2004)));
    }

    /// WP-8: an OP_COMPRESSED frame around `msg`, compressed by `compress` under `id`.
    fn compressed(msg: &OpMsg, id: u8, compress: fn(&[u8]) -> Vec<u8>) -> Vec<u8> {
        let plain = encoded(msg);
        let payload = compress(&plain[HEADER_LEN..]);
        let mut out = Vec::new();
        out.extend(((HEADER_LEN + 9 + payload.len()) as i32).to_le_bytes());
        out.extend(&plain[4..12]);
        out.extend(OP_COMPRESSED.to_le_bytes());
        out.extend(OP_MSG.to_le_bytes());
        out.extend(((plain.len() - HEADER_LEN) as i32).to_le_bytes());
        out.push(id);
        out.extend(payload);
        out
    }

    /// A toy codec for the tests: every byte XOR 0x55.
    fn xor(bytes: &[u8]) -> Vec<u8> {
        bytes.iter().map(|b| b ^ 0x55).collect()
    }

    fn unxor(id: u8, input: &[u8], size: usize, out: &mut Vec<u8>) -> Result<(), String> {
        assert_eq!(id, 99);
        out.extend(xor(&input[..input.len().min(size)]));
        Ok(())
    }

    #[test]
    fn wp8_compressed_replies_decode_like_plain_ones() {
        let msg = insert();
        let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let noop = compressed(&msg, NOOP_COMPRESSOR_ID, <[u8]>::to_vec);
        assert_eq!(decode_all(&mut dec, &noop).unwrap(), vec![msg.clone()]);
        let custom = compressed(&msg, 99, xor);
        assert_eq!(
            decode_all(&mut dec, &custom),
            Err(DecodeError::UnsupportedCompressor(99))
        );
        let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        dec.set_decompressor(Some(unxor));
        assert_eq!(decode_all(&mut dec, &custom).unwrap(), vec![msg]);
    }

    #[test]
    fn wp8_uncompressed_size_is_checked_before_allocating_and_after_decompressing() {
        let mut frame = compressed(&insert(), NOOP_COMPRESSOR_ID, <[u8]>::to_vec);
        frame[20..24].copy_from_slice(&i32::MAX.to_le_bytes());
        let mut dec = FrameDecoder::new(1000);
        assert!(matches!(
            decode_all(&mut dec, &frame),
            Err(DecodeError::BadLength { max: 1000, .. })
        ));
        frame[20..24].copy_from_slice(&40i32.to_le_bytes());
        let mut dec = FrameDecoder::new(1000);
        assert!(matches!(
            decode_all(&mut dec, &frame),
            Err(DecodeError::Decompression {
                compressor_id: 0,
                ..
            })
        ));
        frame[16..20].copy_from_slice(&2004i32.to_le_bytes());
        let mut dec = FrameDecoder::new(1000);
        assert_eq!(
            decode_all(&mut dec, &frame),
            Err(DecodeError::UnknownOpCode(2004))
        );
    }

    #[test]
    fn wp3_section_rules() {
        let one = encoded(&OpMsg::command(1, doc! { "a": 1 }));
        let section0 = &one[HEADER_LEN + 4..];
        let frame = |sections: &[&[u8]]| {
            let mut f = one[..HEADER_LEN + 4].to_vec();
            for s in sections {
                f.extend_from_slice(s);
            }
            let len = f.len() as i32;
            f[..4].copy_from_slice(&len.to_le_bytes());
            f
        };
        assert_eq!(
            parse_frame(&frame(&[section0, section0])),
            Err(DecodeError::BodyCount(2))
        );
        assert_eq!(parse_frame(&frame(&[])), Err(DecodeError::BodyCount(0)));
        assert_eq!(
            parse_frame(&frame(&[section0, &[7, 0, 0]])),
            Err(DecodeError::UnknownSectionKind(7))
        );
        let seq: &[u8] = &[1, 6, 0, 0, 0, b'x', 0];
        assert_eq!(
            parse_frame(&frame(&[seq, section0]))
                .unwrap()
                .sequences
                .len(),
            1
        );
        assert_eq!(
            parse_frame(&frame(&[seq, section0, seq])),
            Err(DecodeError::DuplicateIdentifier("x".into()))
        );
        let overrun: &[u8] = &[1, 60, 0, 0, 0, b'x', 0];
        assert_eq!(
            parse_frame(&frame(&[section0, overrun])),
            Err(DecodeError::Truncated)
        );
        let mut bad_bson = section0.to_vec();
        bad_bson[5] = 0x7F; // an unknown element type
        assert!(matches!(
            parse_frame(&frame(&[&bad_bson])),
            Err(DecodeError::Bson(_))
        ));
    }

    #[test]
    fn encode_rejects_oversize_and_duplicate_identifiers_without_writing() {
        let mut out = vec![1, 2, 3];
        let err = insert().encode(30, &mut out).unwrap_err();
        assert!(matches!(err, EncodeError::TooLarge { max: 30, .. }));
        assert_eq!(out, vec![1, 2, 3]);
        let mut dup = insert();
        dup.sequences.push(dup.sequences[0].clone());
        assert_eq!(
            dup.encode(1000, &mut out),
            Err(EncodeError::DuplicateIdentifier("documents".into()))
        );
        assert_eq!(out, vec![1, 2, 3]);
    }

    fn arbitrary_message() -> impl proptest::strategy::Strategy<Value = OpMsg> {
        use proptest::prelude::*;
        let document = proptest::collection::vec(("[a-z]{1,8}", any::<i64>(), ".{0,40}"), 0..4)
            .prop_map(|fields| {
                let mut d = Document::new();
                for (k, n, s) in fields {
                    d.insert(alloc::format!("{k}n"), n);
                    d.insert(alloc::format!("{k}s"), s);
                }
                d
            });
        let sequence = (
            "[a-z]{1,6}",
            proptest::collection::vec(document.clone(), 0..3),
        );
        (
            any::<i32>(),
            any::<i32>(),
            any::<bool>(),
            document,
            proptest::collection::vec(sequence, 0..3),
        )
            .prop_map(|(request_id, response_to, checksum, body, sequences)| {
                let mut seen = Vec::new();
                let sequences = sequences
                    .into_iter()
                    .filter(|(id, _)| {
                        let fresh = !seen.contains(id);
                        seen.push(id.clone());
                        fresh
                    })
                    .map(|(identifier, documents)| DocumentSequence {
                        identifier,
                        documents,
                    })
                    .collect();
                let flags = if checksum {
                    MsgFlags::CHECKSUM_PRESENT
                } else {
                    MsgFlags::NONE
                };
                OpMsg {
                    request_id,
                    response_to,
                    flags,
                    body,
                    sequences,
                }
            })
    }

    proptest::proptest! {
        /// Any stream of valid messages, cut at any points, decodes to the same messages.
        #[test]
        fn any_chunking_decodes_the_same_messages(
            messages in proptest::collection::vec(arbitrary_message(), 1..4),
            cuts in proptest::collection::vec(1usize..64, 0..40),
        ) {
            let stream: Vec<u8> = messages.iter().flat_map(encoded).collect();
            let mut dec = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
            let mut got = Vec::new();
            let mut rest = &stream[..];
            for cut in cuts.iter().cycle().take(stream.len()) {
                if rest.is_empty() {
                    break;
                }
                let (piece, tail) = rest.split_at((*cut).min(rest.len()));
                got.extend(decode_all(&mut dec, piece).unwrap());
                rest = tail;
            }
            got.extend(decode_all(&mut dec, rest).unwrap());
            proptest::prop_assert_eq!(got, messages);
        }

        /// WP-2, WP-3: `decode_raw` accepts and refuses exactly what `decode` does (here a valid
        /// message with bytes overwritten, fed whole or in two pieces), and its documents
        /// convert to `decode`'s; the body's noted fields are those a walk of it reads.
        #[test]
        fn decode_raw_agrees_with_decode(
            message in arbitrary_message(),
            flips in proptest::collection::vec((0usize..400, proptest::prelude::any::<u8>()), 0..3),
            cut in 0usize..400,
        ) {
            let mut bytes = encoded(&message);
            for (at, byte) in flips {
                let len = bytes.len();
                bytes[at % len] = byte;
            }
            let cut = cut % bytes.len();
            let (mut tree, mut raw) = (
                FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES),
                FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES),
            );
            for piece in [&bytes[..cut], &bytes[cut..]] {
                let expected = tree.decode(piece);
                // Issue 9: the one-step path gives `decode_raw`'s message, or leaves it the input.
                let lone = raw.decode_lone(piece);
                let got = raw.decode_raw(piece);
                if let Some(lone) = lone {
                    proptest::prop_assert_eq!(got.as_ref().ok(), Some(&(lone.0, Some(lone.1))));
                }
                let got = got.map(|(n, m)| {
                    // Issue 9: the fields noted as the body was validated are a walk's.
                    if let Some(m) = &m {
                        assert_eq!(m.top, TopFields::read(&m.body));
                    }
                    (n, m.map(|m| OpMsg {
                        request_id: m.request_id,
                        response_to: m.response_to,
                        flags: m.flags,
                        body: Document::try_from(m.body).expect("validated"),
                        sequences: m.sequences.into_iter().map(|s| DocumentSequence {
                            identifier: s.identifier,
                            documents: s.documents.into_iter()
                                .map(|d| Document::try_from(d).expect("validated"))
                                .collect(),
                        }).collect(),
                    }))
                });
                proptest::prop_assert_eq!(got, expected);
            }
        }
    }

    #[test]
    fn decode_errors_say_what_the_peer_sent() {
        let length = i32::from_le_bytes(*b"HTTP");
        let http = DecodeError::BadLength {
            length,
            max: DEFAULT_MAX_MESSAGE_SIZE_BYTES,
        };
        let text = http.to_string();
        assert!(
            text.starts_with(&alloc::format!("bad message length {length}")),
            "{text}"
        );
        assert!(text.contains("HTTP"), "{text}");
        let huge = DecodeError::BadLength {
            length: i32::MAX,
            max: DEFAULT_MAX_MESSAGE_SIZE_BYTES,
        };
        assert_eq!(
            huge.to_string(),
            "bad message length 2147483647 (allowed 26..=48000000)"
        );
        assert_eq!(
            DecodeError::UnknownOpCode(2004).to_string(),
            "not OP_MSG: opcode 2004"
        );
        // An HTTP server's reply, fed to the decoder as a MongoDB server's would be.
        let mut decoder = FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES);
        let error = decoder
            .decode(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
            .unwrap_err();
        assert!(error.to_string().contains("HTTP"), "{error}");
    }
}
