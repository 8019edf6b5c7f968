//! The business-key API's reading of its bodies.

/// A `/keys/<op>` body: the first byte picks the call (claim, or a call on a held lease), the
/// rest is the body; it is read or refused with a message, never a panic.
pub fn keys_body(data: &[u8]) {
    let Some((&op, body)) = data.split_first() else {
        return;
    };
    let op = if op % 2 == 0 { "claim" } else { "complete" };
    if let Err(message) = oncegate_gateway::api::read_body(op, body) {
        assert!(!message.is_empty(), "a refusal says what was wrong");
    }
}
