//! The long connection's decoders: frames off the socket, their fragments, and the pushed
//! documents they make.

use std::time::{Duration, Instant};

use oncegate_feishu::{Cloud, FeishuApp};
use oncegate_feishu_ws::fragments::{FragmentLimits, Fragments, Part};
use oncegate_feishu_ws::{Frame, FrameError};

/// A run of frames, each a little-endian u16 length and that many bytes, as one connection
/// would read them: every frame that decodes re-encodes to a frame that decodes the same;
/// its parts go through reassembly within the bounds; what completes is opened as a push.
pub fn feishu_ws_frames(data: &[u8]) {
    let limits = FragmentLimits {
        max_messages: 4,
        max_bytes: 4096,
        max_parts: 8,
        max_age: Duration::from_secs(5),
    };
    let mut fragments = Fragments::new(limits);
    let app = match FeishuApp::new(Cloud::Feishu, "cli_fuzz", None, None) {
        Ok(app) => app,
        Err(error) => panic!("the fuzz app: {error}"),
    };
    let start = Instant::now();
    let mut rest = data;
    let mut step = 0u64;
    while rest.len() >= 2 {
        let length = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let (bytes, tail) = rest[2..].split_at(length);
        rest = tail;
        step += 1;
        let Ok(frame) = Frame::decode_bytes(bytes) else {
            continue;
        };
        let again = Frame::decode_bytes(&frame.to_bytes());
        assert_eq!(again.as_ref(), Ok(&frame), "a frame re-encodes to itself");
        let ack = frame.ack(200, Some(b"{}"), step);
        assert_eq!(ack.seq_id, frame.seq_id);
        assert_eq!(ack.header("biz_rt"), Some(step.to_string().as_str()));
        let sum = frame.number("sum");
        let seq = frame.number("seq");
        let (sum, seq) = match (sum, seq) {
            (Ok(sum), Ok(seq)) => (sum, seq),
            (Err(FrameError::MissingHeader(_)), Err(FrameError::MissingHeader(_))) => (1, 0),
            _ => continue,
        };
        let id = frame.header("message_id").unwrap_or("");
        let payload = frame.payload.clone().unwrap_or_default();
        // Time moves on with every frame, so that expiry is explored too.
        let now = start + Duration::from_millis(step * 700);
        match fragments.add(id, sum, seq, payload, now) {
            Part::Complete(whole) => {
                assert!(sum == 1 || whole.len() <= limits.max_bytes);
                let _ = app.open_pushed(&whole);
            }
            Part::Pending | Part::Refused(_) => {}
        }
        assert!(
            fragments.pending() <= limits.max_messages,
            "the message bound holds"
        );
    }
}
