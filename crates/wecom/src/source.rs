//! WeCom and WeChat behind the platform seam: a callback in — a URL verification (GET with
//! `echostr`) or an event (POST) — a challenge answer or an admission out; and the sealers that
//! send as the platforms do, for `oncegate simulate` and tests.

use bytes::Bytes;
use oncegate_core::{
    Accepted, Admit, Callback, Decoded, Event, Method, Refusal, RefusalKind, Reply, SealedRequest,
    Sealer, Stamp, SyntheticMembership, SyntheticMessage, Versions, WebhookSource,
};

use crate::keys::{JSON, Names, Origin, XML, normalize};
use crate::query::Query;
use crate::signed::Signed;
use crate::xml::Fields;
use crate::{AesKey, WechatApp, WecomApp, WecomError, crypto};

impl WecomError {
    /// The refusal the gateway answers with.
    pub fn refusal(&self) -> Refusal {
        let (kind, label) = match self {
            WecomError::BadSignature => (RefusalKind::Unauthenticated, "bad_signature"),
            WecomError::BadCiphertext(_) | WecomError::BadKey(_) => {
                (RefusalKind::BadInput, "decrypt_error")
            }
            WecomError::WrongReceiver { .. }
            | WecomError::WrongApp { .. }
            | WecomError::WrongAgent { .. } => (RefusalKind::BadInput, "wrong_app"),
            WecomError::BadDocument(_) => (RefusalKind::BadInput, "bad_xml"),
            WecomError::BadTimestamp(_) => (RefusalKind::BadInput, "bad_timestamp"),
            WecomError::PlainRefused | WecomError::NoKey | WecomError::EmptySecret(_) => {
                (RefusalKind::BadInput, "wrong_mode")
            }
        };
        Refusal::new(kind, label, self.to_string())
    }
}

/// How the callback came: the XML envelope, or WeCom's AI-bot JSON `{"encrypt": …}`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    Xml,
    Json,
}

impl Dialect {
    pub(crate) fn names(self) -> &'static Names {
        match self {
            Dialect::Xml => &XML,
            Dialect::Json => &JSON,
        }
    }

    fn fields(self, document: &[u8]) -> Result<Fields, WecomError> {
        match self {
            Dialect::Xml => Fields::parse(document),
            Dialect::Json => Fields::from_json(document),
        }
    }
}

/// The `Encrypt` of an envelope and its dialect, read before the signature is checked: any
/// failure is the signature's, so a forger learns nothing.
pub(crate) fn envelope_encrypt(body: &[u8]) -> Result<(String, Dialect), WecomError> {
    let json = body.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    if json {
        // An AI bot's `{"encrypt": …}`, read as that one borrowed field: whatever else an
        // unsigned body holds is skipped, never built into a tree.
        #[derive(serde::Deserialize)]
        struct Envelope<'a> {
            #[serde(borrow)]
            encrypt: std::borrow::Cow<'a, str>,
        }
        let envelope: Envelope<'_> =
            serde_json::from_slice(body).map_err(|_| WecomError::BadSignature)?;
        let encrypt = envelope.encrypt.trim();
        if encrypt.is_empty() {
            return Err(WecomError::BadSignature);
        }
        return Ok((encrypt.to_owned(), Dialect::Json));
    }
    let fields = Dialect::Xml
        .fields(body)
        .map_err(|_| WecomError::BadSignature)?;
    fields
        .text("Encrypt")
        .map(|encrypt| (encrypt.to_owned(), Dialect::Xml))
        .ok_or(WecomError::BadSignature)
}

/// An encrypted POST, both platforms' way: the envelope's `Encrypt`, its `msg_signature`, the
/// stamp, then the document decrypted for `receiver` (XML) or `json_receiver` (an AI bot's JSON).
fn open_encrypted(
    signed: &Signed<'_>,
    token: &str,
    key: &AesKey,
    body: &[u8],
    receiver: &str,
    json_receiver: &str,
) -> Result<(Dialect, Vec<u8>, Stamp), WecomError> {
    let (encrypt, dialect) = envelope_encrypt(body)?;
    signed.verify(token, Some(&encrypt))?;
    let stamp = signed.stamp(body)?;
    let receiver = match dialect {
        Dialect::Xml => receiver,
        Dialect::Json => json_receiver,
    };
    Ok((dialect, crypto::decrypt(key, &encrypt, receiver)?, stamp))
}

/// An event for `origin` (and `agent`, when the source names one; addressed to `to`, when the
/// source knows what its messages' `ToUserName` is) from its decrypted document.
pub(crate) fn admit(
    origin: &Origin<'_>,
    agent: Option<&str>,
    to: Option<&str>,
    dialect: Dialect,
    document: Vec<u8>,
    stamp: Stamp,
) -> Result<Decoded, WecomError> {
    let fields = dialect.fields(&document)?;
    // System events (contacts, groups) name no agent; one that names another is refused.
    if let (Some(expected), Some(got)) = (agent, origin.names.tenant(&fields))
        && got != expected
    {
        return Err(WecomError::WrongAgent {
            expected: expected.to_owned(),
            got: got.to_owned(),
        });
    }
    if let (Some(expected), Some(got)) = (to, fields.text("ToUserName"))
        && got != expected
    {
        return Err(WecomError::WrongApp {
            expected: expected.to_owned(),
            got: got.to_owned(),
        });
    }
    let (event, keys) = normalize(origin, &fields, Bytes::from(document));
    Ok(Decoded::Admit {
        admit: Admit::new(event, keys),
        stamp: Some(stamp),
    })
}

impl WecomApp {
    fn origin(&self, dialect: Dialect) -> Origin<'_> {
        Origin {
            platform: "wecom",
            app: &self.corp_id,
            names: dialect.names(),
        }
    }

    fn open(&self, callback: &Callback<'_>) -> Result<Decoded, WecomError> {
        let query = Query::parse(callback.query);
        let signed = Signed::from(&query, "msg_signature")?;
        match callback.method {
            // URL verification: the encrypted echostr is signed; its plaintext is the answer.
            // An AI bot's echostr is encrypted for the empty receive id.
            Method::Get => {
                let echostr = query.get("echostr").ok_or(WecomError::BadSignature)?;
                signed.verify(&self.token, Some(echostr))?;
                let plain = crypto::decrypt_for(&self.key, echostr, &[&self.corp_id, ""])?;
                Ok(signed.challenge(Reply::text(plain))?)
            }
            Method::Post => {
                let (dialect, document, stamp) = open_encrypted(
                    &signed,
                    &self.token,
                    &self.key,
                    callback.body,
                    &self.corp_id,
                    "",
                )?;
                admit(
                    &self.origin(dialect),
                    self.agent_id.as_deref(),
                    Some(&self.corp_id),
                    dialect,
                    document,
                    stamp,
                )
            }
        }
    }
}

/// Whose an event of this crate's platforms is, read from the event alone (every gateway and
/// every configuration says the same): a WeCom event's corp (its app) and the agent it names
/// (`AgentID`); a suite's own push (`suite.*`) is the corp it is about (`AuthCorpId`); an
/// Official Account is its own tenant, with no agents.
pub fn owner(event: &Event) -> oncegate_core::Owner<'_> {
    if &*event.platform == "wechat" {
        return oncegate_core::Owner {
            tenant: Some(&event.app),
            agent: None,
        };
    }
    if event.event_type.starts_with(crate::SUITE_EVENTS) {
        return oncegate_core::Owner {
            tenant: event.tenant.as_deref(),
            agent: None,
        };
    }
    oncegate_core::Owner {
        tenant: Some(&event.app),
        agent: event.tenant.as_deref(),
    }
}

impl WebhookSource for WecomApp {
    fn platform(&self) -> &str {
        "wecom"
    }

    fn decode(&self, callback: &Callback<'_>) -> Result<Decoded, Refusal> {
        self.open(callback).map_err(|error| error.refusal())
    }

    /// WeCom takes an empty 200 as "received".
    fn accepted(&self, _how: Accepted) -> Reply {
        Reply::text(Bytes::new())
    }

    /// Retries reuse the query (the SDKs' dedup by `msg_signature` relies on it).
    fn retries_repeat_the_request(&self) -> bool {
        true
    }

    /// External-group member changes carry `LastMemVer` → `CurMemVer`.
    fn versions(&self, event: &Event) -> Option<Versions> {
        let fields = Fields::parse(&event.payload).ok()?;
        Some(Versions {
            before: fields.text("LastMemVer")?.to_owned(),
            after: fields.text("CurMemVer")?.to_owned(),
        })
    }

    /// The handler's answer (reply XML, or an AI bot's reply JSON) encrypted for the corp;
    /// no answer is the empty 200.
    fn sync_reply(&self, result: Option<Bytes>, request: Option<&Stamp>) -> Reply {
        let sealing = Sealing {
            token: &self.token,
            key: &self.key,
            receive_id: &self.corp_id,
        };
        match result.filter(|answer| !answer.is_empty()) {
            Some(answer) => passive_reply(sealing, &answer, request),
            None => Reply::text(Bytes::new()),
        }
    }

    /// WeCom waits 5 s.
    fn sync_deadline(&self) -> std::time::Duration {
        REPLY_DEADLINE
    }
}

impl WechatApp {
    fn origin(&self, dialect: Dialect) -> Origin<'_> {
        Origin {
            platform: "wechat",
            app: &self.app_id,
            names: dialect.names(),
        }
    }

    fn open(&self, callback: &Callback<'_>) -> Result<Decoded, WecomError> {
        let query = Query::parse(callback.query);
        let safe = query.get("encrypt_type") == Some("aes");
        match (callback.method, safe, &self.key) {
            // URL verification: the plain signature; the echostr goes back as it came.
            (Method::Get, _, _) => {
                let signed = Signed::from(&query, "signature")?;
                let echostr = query.get("echostr").ok_or(WecomError::BadSignature)?;
                signed.verify(&self.token, None)?;
                Ok(signed.challenge(Reply::text(echostr.to_owned()))?)
            }
            (Method::Post, true, Some(key)) => {
                let signed = Signed::from(&query, "msg_signature")?;
                let (dialect, document, stamp) = open_encrypted(
                    &signed,
                    &self.token,
                    key,
                    callback.body,
                    &self.app_id,
                    &self.app_id,
                )?;
                // An Official Account's messages are addressed to its original id (gh_…), not
                // its app id; the receive id inside the ciphertext binds them to the account.
                admit(
                    &self.origin(dialect),
                    None,
                    self.original_id.as_deref(),
                    dialect,
                    document,
                    stamp,
                )
            }
            // Plain mode signs only the token, timestamp and nonce, not the body: with a key
            // configured, only the signed-and-encrypted form is taken.
            (Method::Post, false, None) => {
                let signed = Signed::from(&query, "signature")?;
                signed.verify(&self.token, None)?;
                let stamp = signed.plain_stamp()?;
                let dialect = Dialect::Xml;
                admit(
                    &self.origin(dialect),
                    None,
                    self.original_id.as_deref(),
                    dialect,
                    callback.body.to_vec(),
                    stamp,
                )
            }
            (Method::Post, false, Some(_)) => {
                Signed::from(&query, "signature")?.verify(&self.token, None)?;
                Err(WecomError::PlainRefused)
            }
            (Method::Post, true, None) => {
                Signed::from(&query, "signature")?.verify(&self.token, None)?;
                Err(WecomError::NoKey)
            }
        }
    }
}

impl WebhookSource for WechatApp {
    fn platform(&self) -> &str {
        "wechat"
    }

    fn decode(&self, callback: &Callback<'_>) -> Result<Decoded, Refusal> {
        self.open(callback).map_err(|error| error.refusal())
    }

    /// WeChat takes `success` as "received, nothing to reply".
    fn accepted(&self, _how: Accepted) -> Reply {
        Reply::text(Bytes::from_static(b"success"))
    }

    fn retries_repeat_the_request(&self) -> bool {
        true
    }

    /// The handler's reply XML, encrypted in safe mode; no answer is `success`.
    fn sync_reply(&self, result: Option<Bytes>, request: Option<&Stamp>) -> Reply {
        match (result.filter(|answer| !answer.is_empty()), &self.key) {
            (Some(answer), Some(key)) => passive_reply(
                Sealing {
                    token: &self.token,
                    key,
                    receive_id: &self.app_id,
                },
                &answer,
                request,
            ),
            (Some(answer), None) => Reply::xml(answer),
            (None, _) => self.accepted(Accepted::Admitted),
        }
    }

    /// WeChat waits 5 s.
    fn sync_deadline(&self) -> std::time::Duration {
        REPLY_DEADLINE
    }
}

/// Both platforms wait 5 s for an answer; leave room for the way back.
pub(crate) const REPLY_DEADLINE: std::time::Duration = std::time::Duration::from_millis(4_000);

/// A passive reply, encrypted and signed with the request's timestamp and nonce: XML, or JSON
/// when the handler answered JSON (an AI bot, whose receive id is empty).
pub(crate) fn passive_reply(sealing: Sealing<'_>, answer: &[u8], request: Option<&Stamp>) -> Reply {
    let json = answer.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let receive_id = if json { "" } else { sealing.receive_id };
    let encrypt = crypto::encrypt(sealing.key, answer, receive_id, random_prefix(answer));
    let timestamp = request.map_or_else(|| "0".to_owned(), |s| s.timestamp_secs.to_string());
    let nonce = request.map_or("", |s| s.nonce.as_str());
    let signature = crypto::signature(&[sealing.token, &timestamp, nonce, &encrypt]);
    if json {
        let body = serde_json::json!({
            "encrypt": encrypt, "msgsignature": signature, "timestamp": timestamp, "nonce": nonce,
        });
        return Reply::json(body.to_string());
    }
    let nonce = nonce.replace("]]>", "");
    Reply::xml(format!(
        "<xml><Encrypt><![CDATA[{encrypt}]]></Encrypt><MsgSignature><![CDATA[{signature}]]></MsgSignature><TimeStamp>{timestamp}</TimeStamp><Nonce><![CDATA[{nonce}]]></Nonce></xml>"
    ))
}

/// The 16 random bytes that open every encrypted message; should the system's generator fail,
/// a digest of the message and the time, so that equal replies still differ.
fn random_prefix(message: &[u8]) -> [u8; 16] {
    let mut prefix = [0u8; 16];
    if getrandom::fill(&mut prefix).is_err() {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let digest = crypto::signature(&[&String::from_utf8_lossy(message), &nanos.to_string()]);
        prefix.copy_from_slice(&digest.as_bytes()[..16]);
    }
    prefix
}

/// A text message as the platform's XML.
fn text_message(to: &str, message: &SyntheticMessage, agent: Option<&str>) -> Vec<u8> {
    // Message ids are 64-bit numbers on these platforms.
    let msg_id = message
        .id
        .parse::<u64>()
        .unwrap_or_else(|_| oncegate_core::KeyHash::of(&[&message.id]).low64() >> 1);
    let agent = agent.map_or_else(String::new, |agent| format!("<AgentID>{agent}</AgentID>"));
    format!(
        "<xml><ToUserName><![CDATA[{to}]]></ToUserName><FromUserName><![CDATA[{from}]]></FromUserName><CreateTime>{created}</CreateTime><MsgType><![CDATA[text]]></MsgType><Content><![CDATA[{text}]]></Content><MsgId>{msg_id}</MsgId>{agent}</xml>",
        // The conversation is the sender's: the synthetic chat is the sender, so that
        // `simulate --chats` spreads the order keys.
        from = message.chat,
        created = message.created_ms / 1000,
        text = message.text.replace("]]>", "]]]]><![CDATA[>"),
    )
    .into_bytes()
}

/// Who seals: the token, the key and the receive id.
pub(crate) struct Sealing<'a> {
    pub(crate) token: &'a str,
    pub(crate) key: &'a AesKey,
    pub(crate) receive_id: &'a str,
}

fn encoded(nonce: &str) -> percent_encoding::PercentEncode<'_> {
    percent_encoding::utf8_percent_encode(nonce, percent_encoding::NON_ALPHANUMERIC)
}

/// An encrypted envelope addressed to `to` and its signed query (after `extra_query`), as both
/// platforms send it.
fn sealed_encrypted(
    sealing: Sealing<'_>,
    to: &str,
    plaintext: &[u8],
    timestamp_secs: u64,
    nonce: &str,
    iv: [u8; 16],
    extra_query: &str,
) -> SealedRequest {
    let Sealing {
        token,
        key,
        receive_id,
    } = sealing;
    let encrypt = crypto::encrypt(key, plaintext, receive_id, iv);
    let timestamp = timestamp_secs.to_string();
    let signature = crypto::signature(&[token, &timestamp, nonce, &encrypt]);
    let body = format!(
        "<xml><ToUserName><![CDATA[{to}]]></ToUserName><Encrypt><![CDATA[{encrypt}]]></Encrypt></xml>"
    );
    SealedRequest {
        method: Method::Post,
        query: Some(format!(
            "{extra_query}msg_signature={signature}&timestamp={timestamp}&nonce={}",
            encoded(nonce)
        )),
        headers: vec![("content-type", "text/xml".to_owned())],
        body: body.into_bytes(),
    }
}

impl Sealer for WecomApp {
    /// A `change_external_chat` update with the member versions.
    fn membership(&self, change: &SyntheticMembership) -> Option<Vec<u8>> {
        let detail = if change.joined {
            "add_member"
        } else {
            "del_member"
        };
        Some(
            format!(
                "<xml><ToUserName><![CDATA[{corp}]]></ToUserName><FromUserName><![CDATA[sys]]></FromUserName><CreateTime>{created}</CreateTime><MsgType><![CDATA[event]]></MsgType><Event><![CDATA[change_external_chat]]></Event><ChatId><![CDATA[{chat}]]></ChatId><ChangeType><![CDATA[update]]></ChangeType><UpdateDetail><![CDATA[{detail}]]></UpdateDetail><JoinScene>0</JoinScene><QuitScene>0</QuitScene><MemChangeCnt>1</MemChangeCnt><MemChangeList><Item><![CDATA[{member}]]></Item></MemChangeList><LastMemVer>{before}</LastMemVer><CurMemVer>{after}</CurMemVer></xml>",
                corp = self.corp_id,
                created = change.created_ms / 1000,
                chat = change.chat,
                member = change.member,
                before = change.before,
                after = change.after,
            )
            .into_bytes(),
        )
    }

    fn message(&self, message: &SyntheticMessage) -> Vec<u8> {
        text_message(
            &self.corp_id,
            message,
            Some(self.agent_id.as_deref().unwrap_or("1000002")),
        )
    }

    fn seal(
        &self,
        plaintext: &[u8],
        timestamp_secs: u64,
        nonce: &str,
        iv: [u8; 16],
    ) -> SealedRequest {
        let sealing = Sealing {
            token: &self.token,
            key: &self.key,
            receive_id: &self.corp_id,
        };
        sealed_encrypted(
            sealing,
            &self.corp_id,
            plaintext,
            timestamp_secs,
            nonce,
            iv,
            "",
        )
    }
}

impl Sealer for WechatApp {
    /// Addressed as the platform addresses it: to the original id (`gh_…`), a stand-in one when
    /// the source names none.
    fn message(&self, message: &SyntheticMessage) -> Vec<u8> {
        text_message(self.addressee(), message, None)
    }

    fn seal(
        &self,
        plaintext: &[u8],
        timestamp_secs: u64,
        nonce: &str,
        iv: [u8; 16],
    ) -> SealedRequest {
        let timestamp = timestamp_secs.to_string();
        let plain_signature = crypto::signature(&[&self.token, &timestamp, nonce]);
        match &self.key {
            Some(key) => sealed_encrypted(
                Sealing {
                    token: &self.token,
                    key,
                    receive_id: &self.app_id,
                },
                self.addressee(),
                plaintext,
                timestamp_secs,
                nonce,
                iv,
                &format!("signature={plain_signature}&encrypt_type=aes&"),
            ),
            None => SealedRequest {
                method: Method::Post,
                query: Some(format!(
                    "signature={plain_signature}&timestamp={timestamp}&nonce={}",
                    encoded(nonce)
                )),
                headers: vec![("content-type", "text/xml".to_owned())],
                body: plaintext.to_vec(),
            },
        }
    }
}
