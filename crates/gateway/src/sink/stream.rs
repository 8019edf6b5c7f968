//! A streamed answer from an HTTP handler (`Content-Type: text/event-stream`, as LLM APIs
//! stream): each event's `data` is a piece of content, handed on as it comes; the whole answer
//! is the pieces joined, within [`MAX_ANSWER`](crate::sink::MAX_ANSWER).

use bytes::{Bytes, BytesMut};
use oncegate_core::Updates;

/// Whether a response is a stream of server-sent events.
pub(crate) fn is_event_stream(headers: &reqwest::header::HeaderMap) -> bool {
    headers
        .get(reqwest::header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim_start().starts_with("text/event-stream"))
}

/// Splits server-sent events out of the bytes as they arrive.
#[derive(Default)]
pub(crate) struct Events {
    pending: BytesMut,
    data: Vec<u8>,
    has_data: bool,
}

impl Events {
    /// Takes `chunk` and returns the data of every event it completed (an event ends at a blank
    /// line; its `data:` lines are joined with newlines; comments and other fields are skipped).
    pub(crate) fn feed(&mut self, chunk: &[u8]) -> Vec<Bytes> {
        self.pending.extend_from_slice(chunk);
        let mut done = Vec::new();
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            let line = self.pending.split_to(end + 1);
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            if line.is_empty() {
                if self.has_data {
                    done.push(Bytes::from(std::mem::take(&mut self.data)));
                    self.has_data = false;
                }
                continue;
            }
            if let Some(value) = line.strip_prefix(b"data:") {
                let value = value.strip_prefix(b" ").unwrap_or(value);
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(value);
                self.has_data = true;
            }
        }
        done
    }

    /// The data of an event the stream ended in without its blank line.
    pub(crate) fn finish(&mut self) -> Option<Bytes> {
        if let Some(line) = self.pending.strip_prefix(b"data:") {
            let line = line.strip_prefix(b" ").unwrap_or(line).to_vec();
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(&line);
            self.has_data = true;
            self.pending.clear();
        }
        self.has_data
            .then(|| Bytes::from(std::mem::take(&mut self.data)))
    }
}

/// Why a stream could not be read whole.
pub(crate) enum StreamError {
    TooLarge,
    Read(String),
}

/// Reads a stream of events, handing each piece to `updates` and returning them joined. A
/// `[DONE]` piece (OpenAI's end marker) ends it and is not content.
pub(crate) async fn read(
    mut response: reqwest::Response,
    updates: &Updates,
    max: usize,
) -> Result<Bytes, StreamError> {
    let mut events = Events::default();
    let mut whole = BytesMut::new();
    let take = |piece: Bytes, whole: &mut BytesMut| -> Result<bool, StreamError> {
        if piece.as_ref() == b"[DONE]" {
            return Ok(false);
        }
        if whole.len() + piece.len() > max {
            return Err(StreamError::TooLarge);
        }
        whole.extend_from_slice(&piece);
        updates(piece);
        Ok(true)
    };
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|error| StreamError::Read(error.without_url().to_string()))?
    {
        for piece in events.feed(&chunk) {
            if !take(piece, &mut whole)? {
                return Ok(whole.freeze());
            }
        }
    }
    if let Some(piece) = events.finish() {
        take(piece, &mut whole)?;
    }
    Ok(whole.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_split_anywhere_come_out_whole() {
        let text = b": comment\ndata: Hel\r\n\ndata: lo\ndata: there\n\nevent: x\nid: 3\ndata: !\n\ndata: tail";
        for cut in 0..text.len() {
            let mut events = Events::default();
            let mut got = events.feed(&text[..cut]);
            got.extend(events.feed(&text[cut..]));
            got.extend(events.finish());
            let got: Vec<&[u8]> = got.iter().map(Bytes::as_ref).collect();
            assert_eq!(
                got,
                vec![&b"Hel"[..], b"lo\nthere", b"!", b"tail"],
                "cut at {cut}"
            );
        }
    }
}
