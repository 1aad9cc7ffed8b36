//! A minimal OP_MSG client over a tokio `TcpStream`, built on retry-core's codec: for tests of the
//! server itself and for tests that need to poke a server directly. It has no timeouts of its
//! own; wrap its calls in `tokio::time::timeout`.

use std::io;
use std::net::SocketAddr;

use bson::Document;
use retry_core::wire::{FrameDecoder, MsgFlags, OpMsg, DEFAULT_MAX_MESSAGE_SIZE_BYTES};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// One connection that sends commands and reads replies, one message at a time.
#[derive(Debug)]
pub struct RawClient {
    stream: TcpStream,
    decoder: FrameDecoder,
    /// Bytes read past the end of the last message.
    pending: Vec<u8>,
    last_request_id: i32,
}

impl RawClient {
    /// Connects to `address`.
    pub async fn connect(address: SocketAddr) -> io::Result<RawClient> {
        let stream = TcpStream::connect(address).await?;
        stream.set_nodelay(true)?;
        Ok(RawClient {
            stream,
            decoder: FrameDecoder::new(DEFAULT_MAX_MESSAGE_SIZE_BYTES),
            pending: Vec::new(),
            last_request_id: 0,
        })
    }

    /// Sends `body` as an OP_MSG with `flags`; returns its `requestID`.
    pub async fn send(&mut self, body: Document, flags: MsgFlags) -> io::Result<i32> {
        self.last_request_id = self.last_request_id.wrapping_add(1);
        let message = OpMsg {
            flags,
            ..OpMsg::command(self.last_request_id, body)
        };
        let mut bytes = Vec::new();
        message
            .encode(DEFAULT_MAX_MESSAGE_SIZE_BYTES, &mut bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        self.send_raw(&bytes).await?;
        Ok(self.last_request_id)
    }

    /// Writes `bytes` as they are: for sending garbage.
    pub async fn send_raw(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes).await
    }

    /// Reads the next message. A stream that does not frame is an [`io::ErrorKind::InvalidData`]
    /// error; a close before a whole message is an [`io::ErrorKind::UnexpectedEof`] error.
    pub async fn receive(&mut self) -> io::Result<OpMsg> {
        let mut chunk = [0; 4096];
        // Each pass consumes buffered bytes or reads at least one more, until a message or the end.
        loop {
            if !self.pending.is_empty() {
                let (used, message) = self
                    .decoder
                    .decode(&self.pending)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                self.pending.drain(..used);
                if let Some(message) = message {
                    return Ok(message);
                }
            }
            let n = self.stream.read(&mut chunk).await?;
            if n == 0 {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            self.pending.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends `body` and returns the body of the reply, which must answer it.
    pub async fn command(&mut self, body: Document) -> io::Result<Document> {
        let request_id = self.send(body, MsgFlags::NONE).await?;
        let reply = self.receive().await?;
        if reply.response_to != request_id {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "reply to request {} while waiting for {request_id}",
                    reply.response_to
                ),
            ));
        }
        Ok(reply.body)
    }
}
