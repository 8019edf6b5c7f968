//! A WeCom AI bot's long connection: frames off the socket and the callbacks they carry.

use bytes::Bytes;
use oncegate_wecom::AiBot;
use oncegate_wecom_ws::frame::Incoming;

/// One text frame as the connection reads it: it parses or is refused; a callback's body is
/// admitted or refused; an admitted one names the bot, keys the same when admitted again, and is a takeover never.
pub fn aibot_frames(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(frame) = Incoming::parse(text) else {
        return;
    };
    if !frame.is_callback() || frame.is_takeover() {
        return;
    }
    let Ok(body) = frame.body() else {
        return;
    };
    let bot = match AiBot::new("aibFUZZ") {
        Ok(bot) => bot,
        Err(error) => panic!("the fuzz bot: {error}"),
    };
    let Ok(admit) = bot.admit(Bytes::copy_from_slice(body.as_bytes())) else {
        return;
    };
    assert_eq!(&*admit.event.app, "aibFUZZ");
    let again = match bot.admit(Bytes::copy_from_slice(body.as_bytes())) {
        Ok(again) => again,
        Err(error) => panic!("admitted once, refused again: {error}"),
    };
    assert_eq!(admit.keys, again.keys, "the keys depend on the body only");
    assert_eq!(
        admit.event.payload.as_ref(),
        body.as_bytes(),
        "handlers get the body"
    );
    assert_eq!(admit.event.order_key, again.event.order_key);
}
