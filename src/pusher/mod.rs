//! Pusher Channels (protocol 7) as throng speaks it, apart from the wire: the apps
//! (`--pusher-app ID:KEY:SECRET`), how a Pusher channel is a throng channel (one
//! namespace per app: channel `NAME` of app `ID` is throng's `ID:NAME`, so an id
//! whose namespace already means something is refused: [`id_clash`]), socket
//! ids, what kind a channel is by its prefix, the signatures ([`sign`]) and what
//! a webhook is ([`webhook_events`]: its kinds, targets, events and signed body).
//!
//! The connection side is `transport::pusher`; the signed HTTP API is
//! `server::routes::pusher_api`; webhook delivery (threads, queues, HTTP) is the
//! server's, [`crate::webhooks`]. This module is protocol only: it does no I/O,
//! spawns no thread and touches no connection, so the load generator shares it
//! (`tests/structure.rs` holds it to that).

pub mod sign;
pub mod webhook_events;

use crate::hub::SocketId;
use std::str::FromStr;

/// Longest Pusher channel name (Pusher's limit).
pub const MAX_CHANNEL_NAME: usize = 164;
/// Longest app id: with `:` and a channel name it stays a valid throng channel.
pub const MAX_APP_ID: usize = 32;
/// What a connection is told to ping within when it has heard nothing (seconds):
/// Pusher's default.
pub const ACTIVITY_TIMEOUT: u32 = 120;
/// Channels one connection may be subscribed to at once: every subscription
/// costs memory, so a client cannot take without bound.
pub const MAX_SUBSCRIPTIONS: usize = 100;
/// The protocol versions spoken (`?protocol=`): 5 to 7 differ in nothing a
/// server does differently.
pub const PROTOCOLS: std::ops::RangeInclusive<u32> = 5..=7;

/// One app: its id (in API paths), key (in connection URLs and signatures),
/// secret (what signs), and its settings (the server's flags unless the config
/// file gives the app its own).
#[derive(Clone, PartialEq, Eq)]
pub struct App {
    pub id: Box<str>,
    pub key: Box<str>,
    pub secret: Box<str>,
    /// Its clients may send client events.
    pub client_events: bool,
    /// Most users one of its presence channels may have.
    pub max_presence_members: usize,
    /// Where its webhooks go.
    pub webhooks: Vec<webhook_events::Target>,
}

/// Pusher's limit of users in one presence channel.
pub const MAX_PRESENCE_MEMBERS: usize = 100;

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret stays out of logs.
        f.debug_struct("App")
            .field("id", &self.id)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Why a `--pusher-app` value is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AppError {
    #[error("a Pusher app is ID:KEY:SECRET, e.g. 1:app-key:app-secret")]
    Shape,
    #[error("a Pusher app id is 1-{MAX_APP_ID} bytes of A-Z a-z 0-9 _ -")]
    Id,
    #[error("a Pusher app key is 1-64 bytes of A-Z a-z 0-9 _ - .")]
    Key,
    #[error("a Pusher app secret is 1-128 bytes without ':' or whitespace")]
    Secret,
}

impl FromStr for App {
    type Err = AppError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let mut parts = s.splitn(3, ':');
        let (Some(id), Some(key), Some(secret)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(AppError::Shape);
        };
        let word = |v: &str, max: usize, extra: &str| {
            (1..=max).contains(&v.len())
                && v.chars()
                    .all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
        };
        if !word(id, MAX_APP_ID, "_-") {
            return Err(AppError::Id);
        }
        if !word(key, 64, "_-.") {
            return Err(AppError::Key);
        }
        if !(1..=128).contains(&secret.len())
            || secret
                .chars()
                .any(|c| c == ':' || c.is_whitespace() || c.is_control())
        {
            return Err(AppError::Secret);
        }
        Ok(App {
            id: id.into(),
            key: key.into(),
            secret: secret.into(),
            client_events: false,
            max_presence_members: MAX_PRESENCE_MEMBERS,
            webhooks: Vec::new(),
        })
    }
}

/// Why an app id cannot be used although it is well formed: its namespace
/// (`ID:*`, and `ID.user:*` for its users' channels) already means something,
/// and that meaning would apply to the app's channels.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdClash {
    #[error(
        "the app id is the namespace of chat rooms ({}:*), so anyone could publish into the app's private and presence channels; choose another id",
        crate::rules::CHAT_NAMESPACE
    )]
    Chat,
    #[error(
        "the app id is the namespace of the server's own feeds ({}:stats), which the signed API could then publish into; choose another id",
        crate::rules::RESERVED_NAMESPACE
    )]
    Reserved,
    #[error(
        "the config file declares [namespaces.{0}], whose rules would apply to the app's channels; choose another id or another namespace name"
    )]
    Declared(String),
}

/// Whether app id `id` names a namespace that already means something: the
/// built-in chat rooms, the server's own feeds, or one `declared` in the config
/// file (as `ID` or as its users' `ID.user`). Two apps cannot clash with each
/// other this way: an id has no `.`, so no id is another's `ID.user`.
pub fn id_clash(id: &str, declared: &crate::rules::Namespaces) -> Option<IdClash> {
    if id == crate::rules::CHAT_NAMESPACE {
        return Some(IdClash::Chat);
    }
    if id == crate::rules::RESERVED_NAMESPACE {
        return Some(IdClash::Reserved);
    }
    [id.to_string(), user_namespace(id)]
        .into_iter()
        .find(|ns| declared.contains(ns))
        .map(IdClash::Declared)
}

/// Finds an app by the key a connection URL names; with its place in `apps`.
pub fn app_by_key<'a>(apps: &'a [App], key: &str) -> Option<(u16, &'a App)> {
    apps.iter()
        .enumerate()
        .find(|(_, a)| &*a.key == key)
        .map(|(i, a)| (i as u16, a))
}

/// Finds an app by the id an API path names.
pub fn app_by_id<'a>(apps: &'a [App], id: &str) -> Option<&'a App> {
    apps.iter().find(|a| &*a.id == id)
}

/// What the channel of one signed-in user is called: the Pusher SDKs' `sendToUser`
/// publishes to it, and pusher-js subscribes to it after `pusher:signin_success`.
pub const USER_CHANNEL_PREFIX: &str = "#server-to-user-";
/// The namespace suffix of users' channels: `ID.user:USER` (an app id has no
/// `.`, so no Pusher channel of the app can be one).
const USER_NAMESPACE: &str = ".user";

/// The namespace of app `app_id`'s users' channels: `ID.user`.
pub fn user_namespace(app_id: &str) -> String {
    format!("{app_id}{USER_NAMESPACE}")
}

/// The throng channel of Pusher channel `name` of app `app_id`: `ID:NAME`, and
/// for a user's channel (`#server-to-user-USER`) `ID.user:USER`.
pub fn throng_channel(app_id: &str, name: &str) -> String {
    match name.strip_prefix(USER_CHANNEL_PREFIX) {
        Some(user) => format!("{app_id}{USER_NAMESPACE}:{user}"),
        None => format!("{app_id}:{name}"),
    }
}

/// The app whose namespace throng channel `channel` is in (`ID:NAME` or
/// `ID.user:USER`), with what the Pusher channel's name makes it there. A channel
/// of an app belongs to the Pusher protocol: throng's own endpoints, wildcard
/// token grants and the stats feed must not open what its signatures guard.
pub fn app_channel<'a>(apps: &'a [App], channel: &str) -> Option<(&'a App, ChannelKind)> {
    let (namespace, name) = channel.split_once(':')?;
    if let Some(id) = namespace.strip_suffix(USER_NAMESPACE) {
        return app_by_id(apps, id).map(|app| (app, ChannelKind::User));
    }
    app_by_id(apps, namespace).map(|app| (app, ChannelKind::of(name)))
}

/// The Pusher channel name of a throng channel (what follows the app id).
pub fn pusher_name(channel: &str) -> std::borrow::Cow<'_, str> {
    match channel.split_once(':') {
        Some((namespace, user)) if namespace.ends_with(USER_NAMESPACE) => {
            std::borrow::Cow::Owned(format!("{USER_CHANNEL_PREFIX}{user}"))
        }
        Some((_, name)) => std::borrow::Cow::Borrowed(name),
        None => std::borrow::Cow::Borrowed(channel),
    }
}

/// Checks a signed-in user's id: 1–128 bytes of the characters a channel name
/// takes (it names the user's channel).
pub fn validate_user_id(id: &str) -> Result<(), ChannelNameError> {
    if id.len() > 128 {
        return Err(ChannelNameError::TooLong);
    }
    validate_channel_name(id)
}

/// What a channel's name makes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChannelKind {
    Public,
    /// `private-`: a subscriber needs the app's signature.
    Private,
    /// `private-encrypted-`: private; its payloads are ciphertext the server
    /// passes on untouched.
    Encrypted,
    /// `presence-`: private, and members are announced.
    Presence,
    /// `#server-to-user-USER`: only a connection signed in as USER.
    User,
}

impl ChannelKind {
    pub fn of(name: &str) -> ChannelKind {
        if name.starts_with(USER_CHANNEL_PREFIX) {
            ChannelKind::User
        } else if name.starts_with("private-encrypted-") {
            ChannelKind::Encrypted
        } else if name.starts_with("private-") {
            ChannelKind::Private
        } else if name.starts_with("presence-") {
            ChannelKind::Presence
        } else {
            ChannelKind::Public
        }
    }

    /// What a refusal calls a channel of this kind.
    pub fn describe(self) -> &'static str {
        match self {
            ChannelKind::Public => "public",
            ChannelKind::Private => "private",
            ChannelKind::Encrypted => "encrypted",
            ChannelKind::Presence => "presence",
            ChannelKind::User => "user",
        }
    }

    /// Whether subscribing needs a signature.
    pub fn signed(self) -> bool {
        matches!(
            self,
            ChannelKind::Private | ChannelKind::Encrypted | ChannelKind::Presence
        )
    }
}

/// Why a Pusher channel name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ChannelNameError {
    #[error("channel name is empty")]
    Empty,
    #[error("channel name is longer than {MAX_CHANNEL_NAME} bytes")]
    TooLong,
    #[error("channel name has '{0}': allowed are A-Z a-z 0-9 _ - = @ , . ;")]
    BadChar(char),
}

/// Checks a Pusher channel name: 1–164 bytes of `A-Z a-z 0-9 _ - = @ , . ;`, or
/// a user's channel, `#server-to-user-` and a user id.
pub fn validate_channel_name(name: &str) -> Result<(), ChannelNameError> {
    if let Some(user) = name.strip_prefix(USER_CHANNEL_PREFIX) {
        return validate_user_id(user);
    }
    if name.is_empty() {
        return Err(ChannelNameError::Empty);
    }
    if name.len() > MAX_CHANNEL_NAME {
        return Err(ChannelNameError::TooLong);
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "_-=@,.;".contains(*c)))
    {
        Some(c) => Err(ChannelNameError::BadChar(c)),
        None => Ok(()),
    }
}

/// A connection's socket id, `NODE.CLIENT` (digits, as Pusher's SDKs check).
pub fn socket_id(client: u32) -> String {
    let id = SocketId::local(client);
    format!("{}.{}", id.node, id.client)
}

/// Reads a socket id (`\d+\.\d+`, both parts 32-bit as this server makes them).
pub fn parse_socket_id(id: &str) -> Option<SocketId> {
    let (node, client) = id.split_once('.')?;
    let number = |s: &str| {
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse::<u32>().ok())
            .flatten()
    };
    Some(SocketId {
        node: number(node)?,
        client: number(client)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn app_ids_whose_namespace_means_something_clash() {
        use crate::rules::{NamespaceRules, Namespaces};
        let none = Namespaces::default();
        assert_eq!(id_clash("chat", &none), Some(IdClash::Chat));
        assert_eq!(id_clash("throng", &none), Some(IdClash::Reserved));
        assert_eq!(id_clash("app1", &none), None);
        let mut declared = Namespaces::default();
        declared.insert("room".into(), NamespaceRules::default());
        declared.insert("app1.user".into(), NamespaceRules::default());
        assert_eq!(
            id_clash("room", &declared),
            Some(IdClash::Declared("room".into()))
        );
        assert_eq!(
            id_clash("app1", &declared),
            Some(IdClash::Declared("app1.user".into()))
        );
        assert_eq!(id_clash("app2", &declared), None);
    }

    #[test]
    fn apps_parse_and_refuse_with_the_reason() {
        assert_eq!("123:key-1:s3cr:et".parse::<App>(), Err(AppError::Secret));
        let app: App = "123:key-1:secret".parse().unwrap();
        assert_eq!(
            (&*app.id, &*app.key, &*app.secret),
            ("123", "key-1", "secret")
        );
        assert!(!format!("{app:?}").contains("secret"));
        assert_eq!("123:key".parse::<App>(), Err(AppError::Shape));
        assert_eq!("1 2:key:s".parse::<App>(), Err(AppError::Id));
        assert_eq!("1:k/y:s".parse::<App>(), Err(AppError::Key));
        assert_eq!("1:k:a b".parse::<App>(), Err(AppError::Secret));
        assert_eq!("1:k:".parse::<App>(), Err(AppError::Secret));
    }

    #[test]
    fn channels_map_onto_the_apps_namespace_and_back() {
        let channel = throng_channel("123", "private-a=b");
        assert_eq!(channel, "123:private-a=b");
        assert!(crate::rules::validate_channel_name(&channel).is_ok());
        assert_eq!(pusher_name(&channel), "private-a=b");
        let user = throng_channel("123", "#server-to-user-u1");
        assert_eq!(user, "123.user:u1");
        assert!(crate::rules::validate_channel_name(&user).is_ok());
        assert_eq!(pusher_name(&user), "#server-to-user-u1");
        assert_eq!(ChannelKind::of("#server-to-user-u1"), ChannelKind::User);
        assert!(validate_channel_name("#server-to-user-u1").is_ok());
        assert!(validate_channel_name("#server-to-user-").is_err());
        assert!(validate_channel_name("#other").is_err());
        let longest = throng_channel(&"9".repeat(MAX_APP_ID), &"x".repeat(MAX_CHANNEL_NAME));
        assert!(crate::rules::validate_channel_name(&longest).is_ok());
    }

    #[test]
    fn an_apps_channels_are_found_with_their_kind() {
        let apps = vec!["4242:key:secret".parse::<App>().unwrap()];
        let kind = |c: &str| app_channel(&apps, c).map(|(a, k)| (&*a.id, k));
        assert_eq!(
            kind("4242:private-payroll"),
            Some(("4242", ChannelKind::Private))
        );
        assert_eq!(
            kind("4242:presence-room"),
            Some(("4242", ChannelKind::Presence))
        );
        assert_eq!(
            kind("4242:private-encrypted-x"),
            Some(("4242", ChannelKind::Encrypted))
        );
        assert_eq!(kind("4242.user:bob"), Some(("4242", ChannelKind::User)));
        assert_eq!(kind("4242:news"), Some(("4242", ChannelKind::Public)));
        assert_eq!(kind("4243:private-x"), None);
        assert_eq!(kind("private-x"), None);
        assert_eq!(kind("chat:private-x"), None);
    }

    #[test]
    fn channel_kinds_and_names() {
        assert_eq!(ChannelKind::of("news"), ChannelKind::Public);
        assert_eq!(ChannelKind::of("private-x"), ChannelKind::Private);
        assert_eq!(
            ChannelKind::of("private-encrypted-x"),
            ChannelKind::Encrypted
        );
        assert_eq!(ChannelKind::of("presence-x"), ChannelKind::Presence);
        assert!(validate_channel_name("a-b_c=d@e,f.g;h").is_ok());
        assert_eq!(validate_channel_name(""), Err(ChannelNameError::Empty));
        assert_eq!(
            validate_channel_name("a:b"),
            Err(ChannelNameError::BadChar(':'))
        );
        assert_eq!(
            validate_channel_name(&"a".repeat(165)),
            Err(ChannelNameError::TooLong)
        );
    }

    #[test]
    fn socket_ids_are_two_numbers() {
        let id = socket_id(42);
        assert_eq!(parse_socket_id(&id), Some(SocketId::local(42)), "{id}");
        assert!(id.ends_with(".42"));
        for bad in [
            "",
            "1",
            "1.",
            ".1",
            "a.1",
            "1.2.3",
            "1.2x",
            "+1.2",
            "1.99999999999",
        ] {
            assert_eq!(parse_socket_id(bad), None, "{bad}");
        }
    }
}
