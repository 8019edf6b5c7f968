//! `[[source]]`: the platforms' apps, their secrets and transports (checked in `check`).

mod check;
mod webhook;
mod webhook_check;

pub(crate) use check::check;
#[cfg(test)]
pub(crate) use check::plain_transport;
pub use webhook::{
    AnswerType, HandshakeSettings, HttpSendSettings, KeyEncoding, SignatureEncoding, TimeUnit,
    VerifyKind, WebhookSettings,
};

use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration_opt;
use crate::store::variant;

/// The platform of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Platform {
    /// Feishu (China).
    Feishu,
    /// Lark (international Feishu).
    Lark,
    /// WeCom (企业微信).
    Wecom,
    /// WeChat official accounts.
    Wechat,
    /// A WeCom AI bot (智能机器人) on its long connection.
    #[serde(rename = "wecom-aibot")]
    WecomAibot,
    /// A WeCom third-party suite (第三方应用, 代开发 template) for every corp that authorised it.
    #[serde(rename = "wecom-suite")]
    WecomSuite,
    /// Any platform's webhooks by configuration (a preset or each setting).
    Webhook,
    /// DingTalk (钉钉): an app's HTTP event subscription.
    Dingtalk,
}

/// A secret: inline, from an environment variable, or from a file. Neither its `Debug` nor
/// its `Serialize` (what `check-config --effective` prints) shows an inline value.
#[derive(Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum Secret {
    /// Written in the file (fine for tests, not for production).
    Inline(String),
    /// Read from an environment variable.
    Env {
        /// The variable.
        env: String,
    },
    /// Read from a file (trailing newline removed).
    File {
        /// The file.
        file: PathBuf,
    },
}

impl Serialize for Secret {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let (field, value) = match self {
            Secret::Inline(_) => return serializer.serialize_str("<hidden: written in the file>"),
            Secret::Env { env } => ("env", env.clone()),
            Secret::File { file } => ("file", file.display().to_string()),
        };
        let mut map = serializer.serialize_map(Some(1))?;
        map.serialize_entry(field, &value)?;
        map.end()
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Secret::Inline(_) => f.write_str("Inline(<hidden>)"),
            Secret::Env { env } => f.debug_struct("Env").field("env", env).finish(),
            Secret::File { file } => f.debug_struct("File").field("file", file).finish(),
        }
    }
}

impl Secret {
    /// The secret's value. A value that is empty or only whitespace is an error, never "no
    /// secret": an empty Kubernetes secret or a blank template must not switch checks off.
    pub fn resolve(&self) -> Result<String, String> {
        let (value, origin) = match self {
            Secret::Inline(value) => (value.clone(), "the inline value".to_owned()),
            Secret::Env { env } => (
                std::env::var(env).map_err(|_| format!("environment variable {env} is not set"))?,
                format!("environment variable {env}"),
            ),
            Secret::File { file } => (
                read_secret_file(file)?
                    .trim_end_matches(['\n', '\r'])
                    .to_owned(),
                format!("file {}", file.display()),
            ),
        };
        if value.trim().is_empty() {
            return Err(format!(
                "{origin} is empty: an empty secret would switch its check off; set a value, \
                 or remove the setting"
            ));
        }
        Ok(value)
    }

    /// The secret written in place with its value now: two settings whose secrets resolve
    /// alike compare equal, whichever file or variable held them (what a reload compares).
    pub fn resolved(&self) -> Result<Secret, String> {
        self.resolve().map(Secret::Inline)
    }
}

/// Each of `secrets` resolved in place; the first that cannot be, named by `setting`.
fn resolve_all<'a>(
    secrets: impl IntoIterator<Item = (&'static str, &'a mut Secret)>,
) -> Result<(), String> {
    for (setting, secret) in secrets {
        *secret = secret
            .resolved()
            .map_err(|message| format!("{setting}: {message}"))?;
    }
    Ok(())
}

/// The most a secret file holds: keys and tokens are bytes to a few kilobytes; a path to
/// something else (`/dev/zero`, a log) is refused before it fills memory.
pub const MAX_SECRET_FILE: u64 = 64 << 10;

/// Reads a secret file, at most [`MAX_SECRET_FILE`] bytes of UTF-8.
fn read_secret_file(file: &std::path::Path) -> Result<String, String> {
    use std::io::Read;
    let cannot = |error: std::io::Error| format!("cannot read {}: {error}", file.display());
    let mut bytes = Vec::new();
    std::fs::File::open(file)
        .map_err(cannot)?
        .take(MAX_SECRET_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(cannot)?;
    if bytes.len() as u64 > MAX_SECRET_FILE {
        return Err(format!(
            "{} holds more than {} KiB: a secret file holds the secret only",
            file.display(),
            MAX_SECRET_FILE >> 10
        ));
    }
    String::from_utf8(bytes).map_err(|_| format!("{} is not UTF-8 text", file.display()))
}

/// `[[source]]`: one app on one platform. `platform` picks the variant; each platform has its
/// own settings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceConfig {
    /// The name, used in the route `/webhook/<name>` and in metrics.
    pub name: String,
    /// The platform and its settings.
    #[serde(flatten)]
    pub platform: PlatformConfig,
}

/// A source's platform with the settings that platform needs.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "platform", rename_all = "lowercase")]
pub enum PlatformConfig {
    /// Feishu (China).
    Feishu(FeishuSettings),
    /// Lark (international Feishu).
    Lark(FeishuSettings),
    /// WeCom (企业微信).
    Wecom(WecomSettings),
    /// WeChat Official Accounts.
    Wechat(WechatSettings),
    /// A WeCom AI bot (智能机器人) on its long connection: oncegate dials WeCom.
    #[serde(rename = "wecom-aibot")]
    WecomAibot(AibotSettings),
    /// A WeCom third-party suite: one source for its own pushes and every authorising corp.
    #[serde(rename = "wecom-suite")]
    WecomSuite(SuiteSettings),
    /// Any platform's webhooks by configuration (boxed: its many settings would make every
    /// source as large).
    Webhook(Box<WebhookSettings>),
    /// DingTalk's HTTP event subscription.
    Dingtalk(DingtalkSettings),
}

/// A Feishu or Lark app.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FeishuSettings {
    /// The app id (`cli_…`).
    pub app_id: String,
    /// The encrypt key: callbacks are signed and encrypted with it.
    pub encrypt_key: Option<Secret>,
    /// The verification token in every callback's body.
    pub verification_token: Option<Secret>,
    /// Accept requests with no authentication at all (no encrypt key, no token). Only for local
    /// experiments: anyone who knows the URL can send events.
    pub allow_unsigned: bool,
    /// How events arrive: Feishu posts them (`webhook`), or oncegate dials Feishu's long
    /// connection (`websocket`, needs no public address).
    pub transport: Transport,
    /// The app secret: the long connection's endpoint asks for it.
    pub app_secret: Option<Secret>,
    /// Where the long connection's endpoint is: `https://open.feishu.cn` (Feishu) or
    /// `https://open.larksuite.com` (Lark) unless set (a local server, a proxy).
    pub domain: Option<String>,
    /// Long connections held per gateway (Feishu allows 50 per app, and gives each event to
    /// one of them).
    pub connections: usize,
    /// Which gateways of several hold the long connections.
    pub instances: Instances,
    /// How long past a ping interval a connection may stay silent before it is dialled anew;
    /// unset: half the interval, between 5 s and 60 s.
    #[serde(with = "duration_opt")]
    pub pong_grace: Option<Duration>,
    /// A store app (商店应用) that many tenants install: its `app_ticket` is kept in the store
    /// and asked for again at start, its tenants (`app_open`, `app_status_change`,
    /// `app_uninstalled`) kept in the registry, and `/send/<source>/<tenant_key>` sends with
    /// that tenant's token. Needs `app_secret`; webhooks only (Feishu gives store apps no long
    /// connection).
    pub store_app: bool,
    /// The bot's own `open_id` (`ou_…`, as `GET /open-apis/bot/v3/info` answers it): a group
    /// message goes before its tenant's backlog (a route's `priority = "mentions"`) only when
    /// one of its mentions names it. Unset, any mention counts: right for a bot that receives
    /// only the group messages that @-mention it (without the permission to read every group
    /// message), where every group message it gets mentions it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bot_open_id: Option<String>,
}

/// How a Feishu source's events arrive.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    /// HTTP callbacks to `/webhook/<name>`.
    #[default]
    Webhook,
    /// The long connection (长连接; DingTalk's Stream mode, also spelled `stream`).
    #[serde(alias = "stream")]
    Websocket,
}

/// Which of several gateways hold a source's long connections.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Instances {
    /// Every gateway connects; Feishu spreads the events over them and the shared store
    /// (Redis) catches redeliveries that reach another gateway.
    #[default]
    All,
    /// One gateway holds them, through a lease in the store; another takes over when it stops.
    Leader,
}

impl Default for FeishuSettings {
    fn default() -> Self {
        Self {
            app_id: String::new(),
            encrypt_key: None,
            verification_token: None,
            allow_unsigned: false,
            transport: Transport::Webhook,
            app_secret: None,
            domain: None,
            connections: 1,
            instances: Instances::All,
            pong_grace: None,
            store_app: false,
            bot_open_id: None,
        }
    }
}

/// A WeCom app (self-built app or third-party suite).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WecomSettings {
    /// The corp id (the receive id checked in every decrypted message).
    pub corp_id: String,
    /// The app's AgentID: callbacks naming another agent are refused. A corp's apps each have
    /// their own token and key, so each is its own source. A number as WeCom's console shows
    /// it (`agent_id = 1000002`) or a string.
    #[serde(deserialize_with = "number_or_text")]
    pub agent_id: Option<String>,
    /// The callback token, signing every callback.
    pub token: Option<Secret>,
    /// The 43-character EncodingAESKey.
    pub encoding_aes_key: Option<Secret>,
    /// The app's Secret: `/send/<source>` sends as this agent with it (needs `agent_id`).
    pub secret: Option<Secret>,
    /// WeCom's API address: `https://qyapi.weixin.qq.com` unless set (a local server, a proxy).
    pub domain: Option<String>,
    /// A template for the self-built apps of many corps: no corp, token or key here — each
    /// corp's token, EncodingAESKey and AgentID are its settings in the tenant registry
    /// (`oncegate tenants add`), its callbacks checked with those alone, at
    /// `/webhook/<source>/<corp id>` or at `/webhook/<source>` for all.
    pub template: bool,
}

/// An id the platform's console shows as a number (a WeCom AgentID): read from an integer or a
/// string, kept as text.
fn number_or_text<'de, D: serde::Deserializer<'de>>(from: D) -> Result<Option<String>, D::Error> {
    struct Id;

    impl serde::de::Visitor<'_> for Id {
        type Value = Option<String>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an id, as a number (1000002) or a string (\"1000002\")")
        }

        fn visit_u64<E: serde::de::Error>(self, id: u64) -> Result<Self::Value, E> {
            Ok(Some(id.to_string()))
        }

        fn visit_i64<E: serde::de::Error>(self, id: i64) -> Result<Self::Value, E> {
            match u64::try_from(id) {
                Ok(id) => Ok(Some(id.to_string())),
                Err(_) => Err(E::custom(format!("{id} is negative: an id is not"))),
            }
        }

        fn visit_str<E: serde::de::Error>(self, id: &str) -> Result<Self::Value, E> {
            Ok(Some(id.to_owned()))
        }
    }
    from.deserialize_any(Id)
}

impl WecomSettings {
    /// Whether `platform` is a WeCom template (self-built apps of many corps).
    pub fn is_template(platform: &PlatformConfig) -> bool {
        matches!(platform, PlatformConfig::Wecom(settings) if settings.template)
    }
}

/// A WeChat Official Account.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WechatSettings {
    /// The app id (`wx…`).
    pub app_id: String,
    /// The account's original id (原始ID, `gh_…`): what its messages carry as `ToUserName`.
    /// Optional: when set, a message addressed to another account is refused; without it
    /// `ToUserName` is not checked (in safe mode the receive id inside the ciphertext binds a
    /// message to the app id).
    pub original_id: Option<String>,
    /// The token, signing every callback.
    pub token: Option<Secret>,
    /// The EncodingAESKey of safe mode; plain mode without it.
    pub encoding_aes_key: Option<Secret>,
}

/// A DingTalk app's HTTP event subscription (事件订阅): callbacks signed with the token and
/// encrypted with the aes_key for the app key (or the corp id, or the suite key).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DingtalkSettings {
    /// What DingTalk encrypts the callbacks for: the app's AppKey (Client ID) for the app's
    /// own subscription, the corp id for the older `register_call_back`, a suite's SuiteKey.
    pub app_key: String,
    /// The subscription's token (签名 token).
    pub token: Option<Secret>,
    /// The subscription's 43-character aes_key (加密 aes_key).
    pub aes_key: Option<Secret>,
    /// How events arrive: DingTalk posts them (`webhook`, the HTTP event subscription), or
    /// oncegate dials DingTalk's Stream mode (`stream`: a long connection, no public address).
    pub transport: Transport,
    /// The app's Client Secret (AppSecret): Stream mode's registration asks for it.
    pub app_secret: Option<Secret>,
    /// Where Stream mode registers: `https://api.dingtalk.com` unless set (a local server, a
    /// proxy).
    pub domain: Option<String>,
    /// Which gateways of several hold the Stream connection.
    pub instances: Instances,
}

/// A WeCom AI bot on its long connection (API mode, 长连接): no public callback URL.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AibotSettings {
    /// The bot's id (`aibotid`, the Bot ID of its API settings).
    pub bot_id: String,
    /// The bot's secret (its API settings' Secret), sent when subscribing.
    pub secret: Option<Secret>,
    /// The long connection's address: `wss://openws.work.weixin.qq.com` unless set (a local
    /// server, a proxy).
    pub domain: Option<String>,
}

/// A WeCom third-party application (第三方应用) or 代开发 template: its command URL (the suite's
/// own pushes) and data URL (its corps' callbacks) both point at `/webhook/<name>`; the corps it
/// takes callbacks from are the tenant registry's (`oncegate tenants`, `/admin/tenants`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SuiteSettings {
    /// The SuiteId (`ww…`; a 代开发 template's starts with `dk`).
    pub suite_id: String,
    /// The ISV's own corp id: WeCom encrypts the URL verification for it (and some
    /// `create_auth` pushes, as seen).
    pub provider_corp_id: Option<String>,
    /// The callback token of the suite's callback configuration.
    pub token: Option<Secret>,
    /// The suite's 43-character EncodingAESKey.
    pub encoding_aes_key: Option<Secret>,
    /// The suite's Secret: with it the gateway exchanges each `create_auth`'s code for the
    /// corp's permanent code (the corp joins the registry by itself) and `/send/<source>` sends
    /// as each corp. Without it corps are added by hand and nothing is sent.
    pub suite_secret: Option<Secret>,
    /// WeCom's API address: `https://qyapi.weixin.qq.com` unless set (a local server, a proxy).
    pub domain: Option<String>,
}

impl SourceConfig {
    /// The source with every secret resolved now ([`Secret::resolved`]): what a reload
    /// compares, so that a secret rotated in its file is a change too.
    pub fn resolved(&self) -> Result<SourceConfig, String> {
        let mut source = self.clone();
        let secrets: Vec<(&'static str, &mut Option<Secret>)> = match &mut source.platform {
            PlatformConfig::Feishu(s) | PlatformConfig::Lark(s) => vec![
                ("encrypt_key", &mut s.encrypt_key),
                ("verification_token", &mut s.verification_token),
                ("app_secret", &mut s.app_secret),
            ],
            PlatformConfig::Wecom(s) => vec![
                ("token", &mut s.token),
                ("encoding_aes_key", &mut s.encoding_aes_key),
                ("secret", &mut s.secret),
            ],
            PlatformConfig::Wechat(s) => vec![
                ("token", &mut s.token),
                ("encoding_aes_key", &mut s.encoding_aes_key),
            ],
            PlatformConfig::WecomAibot(s) => vec![("secret", &mut s.secret)],
            PlatformConfig::Dingtalk(s) => vec![
                ("token", &mut s.token),
                ("aes_key", &mut s.aes_key),
                ("app_secret", &mut s.app_secret),
            ],
            PlatformConfig::WecomSuite(s) => vec![
                ("token", &mut s.token),
                ("encoding_aes_key", &mut s.encoding_aes_key),
                ("suite_secret", &mut s.suite_secret),
            ],
            PlatformConfig::Webhook(s) => {
                let mut secrets: Vec<(&'static str, &mut Secret)> = Vec::new();
                if let Some(secret) = s.secret.as_mut() {
                    secrets.push(("secret", secret));
                }
                secrets.extend(
                    s.previous_secrets
                        .iter_mut()
                        .map(|p| ("previous_secrets", p)),
                );
                if let Some(send) = s.send.as_mut() {
                    secrets.extend(send.headers.values_mut().map(|h| ("send.headers", h)));
                }
                resolve_all(secrets)
                    .map_err(|message| format!("source {:?} {message}", self.name))?;
                return Ok(source);
            }
        };
        resolve_all(
            secrets
                .into_iter()
                .filter_map(|(setting, secret)| Some((setting, secret.as_mut()?))),
        )
        .map_err(|message| format!("source {:?} {message}", self.name))?;
        Ok(source)
    }

    /// The platform.
    pub fn platform(&self) -> Platform {
        match self.platform {
            PlatformConfig::Feishu(_) => Platform::Feishu,
            PlatformConfig::Lark(_) => Platform::Lark,
            PlatformConfig::Wecom(_) => Platform::Wecom,
            PlatformConfig::Wechat(_) => Platform::Wechat,
            PlatformConfig::WecomAibot(_) => Platform::WecomAibot,
            PlatformConfig::WecomSuite(_) => Platform::WecomSuite,
            PlatformConfig::Webhook(_) => Platform::Webhook,
            PlatformConfig::Dingtalk(_) => Platform::Dingtalk,
        }
    }

    /// What makes two sources the same app: the platform, the app id and, on WeCom, the agent.
    pub fn identity(&self) -> (Platform, &str, Option<&str>) {
        let agent = match &self.platform {
            PlatformConfig::Wecom(s) => s.agent_id.as_deref(),
            _ => None,
        };
        (self.platform(), self.app_id(), agent)
    }

    /// The app's id on its platform (Feishu app id, WeCom corp id, WeChat app id).
    pub fn app_id(&self) -> &str {
        match &self.platform {
            PlatformConfig::Feishu(s) | PlatformConfig::Lark(s) => &s.app_id,
            PlatformConfig::Wecom(s) => &s.corp_id,
            PlatformConfig::Wechat(s) => &s.app_id,
            PlatformConfig::WecomAibot(s) => &s.bot_id,
            PlatformConfig::WecomSuite(s) => &s.suite_id,
            PlatformConfig::Webhook(s) => s.app_id.as_deref().unwrap_or(&self.name),
            PlatformConfig::Dingtalk(s) => &s.app_key,
        }
    }
}

/// By hand, like [`StoreConfig`](crate::StoreConfig): the platform picks the settings, and errors name the field.
impl<'de> Deserialize<'de> for SourceConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let mut table = toml::Table::deserialize(deserializer)?;
        let name = match table.remove("name") {
            Some(toml::Value::String(name)) => name,
            Some(other) => {
                return Err(D::Error::custom(format!(
                    "name = {other}: expected a string"
                )));
            }
            None => return Err(D::Error::custom("missing field `name`")),
        };
        let platform = match table.remove("platform") {
            Some(toml::Value::String(platform)) => platform,
            _ => {
                return Err(D::Error::custom(format!(
                    "source {name:?}: set platform = \"feishu\", \"lark\", \"wecom\", \"wecom-aibot\", \
                     \"wecom-suite\", \"wechat\", \"dingtalk\" or \"webhook\" (any other platform)"
                )));
            }
        };
        let settings = toml::Value::Table(table);
        let context = format!("source {name:?} (platform = \"{platform}\")");
        let platform = match platform.as_str() {
            "feishu" => variant(settings, &context).map(PlatformConfig::Feishu),
            "lark" => variant(settings, &context).map(PlatformConfig::Lark),
            "wecom" => variant(settings, &context).map(PlatformConfig::Wecom),
            "wechat" => variant(settings, &context).map(PlatformConfig::Wechat),
            "wecom-aibot" => variant(settings, &context).map(PlatformConfig::WecomAibot),
            "wecom-suite" => variant(settings, &context).map(PlatformConfig::WecomSuite),
            "webhook" => variant(settings, &context).map(|s| PlatformConfig::Webhook(Box::new(s))),
            "dingtalk" => variant(settings, &context).map(PlatformConfig::Dingtalk),
            other => {
                return Err(D::Error::custom(format!(
                    "source {name:?}: platform = {other:?}: expected \"feishu\", \"lark\", \
                     \"wecom\", \"wecom-aibot\", \"wecom-suite\", \"wechat\", \"dingtalk\" or \"webhook\" \
                     (any other platform, by a preset or each setting)"
                )));
            }
        }?;
        Ok(SourceConfig { name, platform })
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    #[test]
    fn a_secret_file_is_read_whole_and_bounded() {
        let dir = tempfile::tempdir().expect("dir");
        let good = dir.path().join("token");
        std::fs::write(&good, "s3cr3t\n").expect("write");
        let secret = Secret::File { file: good };
        assert_eq!(secret.resolve(), Ok("s3cr3t".to_owned()));
        let big = dir.path().join("big");
        std::fs::write(&big, vec![b'a'; MAX_SECRET_FILE as usize + 1]).expect("write");
        let refused = Secret::File { file: big }.resolve().expect_err("too big");
        assert!(refused.contains("more than 64 KiB"), "{refused}");
        // A device that never ends is refused as quickly.
        if std::path::Path::new("/dev/zero").exists() {
            let zero = Secret::File {
                file: "/dev/zero".into(),
            };
            assert!(zero.resolve().is_err());
        }
        let missing = Secret::File {
            file: dir.path().join("missing"),
        };
        assert!(
            missing
                .resolve()
                .expect_err("missing")
                .contains("cannot read")
        );
    }
}
