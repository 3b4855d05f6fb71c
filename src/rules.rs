//! The application's rules: which channel names are valid, what a namespace makes a
//! channel (a chat room or push-only), what clients are called, and what a client's
//! data message asks for.
//!
//! Everything here is a pure decision that returns a value; the transports carry it
//! out. This module must not do I/O, touch connections, or know any wire format.

/// Longest channel name in bytes: room for a Pusher app's id, `:` and a Pusher
/// channel name (at most 164 bytes there).
pub const MAX_CHANNEL_NAME: usize = 200;

/// Why a channel name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    #[error("channel name is empty")]
    Empty,
    #[error("channel name is longer than {MAX_CHANNEL_NAME} bytes")]
    TooLong,
    #[error("channel name has '{0}': allowed are A-Z a-z 0-9 _ - . : @ = , ;")]
    BadChar(char),
}

/// Checks a channel name: 1–200 bytes of `A-Z a-z 0-9 _ - . : @ = , ;` (Pusher's
/// channel names, whose characters these are, fit in it).
pub fn validate_channel_name(name: &str) -> Result<(), NameError> {
    if name.is_empty() {
        return Err(NameError::Empty);
    }
    if name.len() > MAX_CHANNEL_NAME {
        return Err(NameError::TooLong);
    }
    if let Some(c) = name.chars().find(|c| {
        !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '@' | '=' | ',' | ';'))
    }) {
        return Err(NameError::BadChar(c));
    }
    Ok(())
}

/// Longest event name in bytes (Pusher's limit).
pub const MAX_EVENT_NAME: usize = 200;

/// Why an event name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EventNameError {
    #[error("event name is empty")]
    Empty,
    #[error("event name is longer than {MAX_EVENT_NAME} bytes")]
    TooLong,
    #[error("event name has a control character")]
    Control,
}

/// Checks an event name: 1–200 bytes, no control characters.
pub fn validate_event_name(name: &str) -> Result<(), EventNameError> {
    if name.is_empty() {
        return Err(EventNameError::Empty);
    }
    if name.len() > MAX_EVENT_NAME {
        return Err(EventNameError::TooLong);
    }
    if name.chars().any(char::is_control) {
        return Err(EventNameError::Control);
    }
    Ok(())
}

/// The namespace of the server's own feeds (`throng:stats`, the dashboard's):
/// anyone may subscribe, nobody may publish.
pub const RESERVED_NAMESPACE: &str = "throng";

/// Whether `channel` is one of the server's own feeds, closed to publishers.
pub fn is_reserved(channel: &str) -> bool {
    namespace(channel) == RESERVED_NAMESPACE
}

/// Longest chosen client name (`?name=`) in bytes.
pub const MAX_CLIENT_NAME: usize = 32;

/// Why a chosen client name is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientNameError {
    #[error("name must be 1-{MAX_CLIENT_NAME} bytes of A-Z a-z 0-9 _ - .")]
    Invalid,
}

/// Checks a name a chat client chose: 1–32 bytes of `A-Z a-z 0-9 _ - .`, so it
/// needs no escaping in a URL, a JSON string or a page.
pub fn validate_client_name(name: &str) -> Result<(), ClientNameError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_CLIENT_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'));
    if ok {
        Ok(())
    } else {
        Err(ClientNameError::Invalid)
    }
}

/// The part of a channel name before its first `:` (empty if there is none).
pub fn namespace(name: &str) -> &str {
    name.split_once(':').map_or("", |(ns, _)| ns)
}

/// The namespace the built-in rules make chat rooms (`chat:*`).
pub const CHAT_NAMESPACE: &str = "chat";

/// How a channel behaves, decided by its namespace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChannelRules {
    /// Subscribers' data messages are published to the channel (a chat room).
    pub client_publish: bool,
    /// Members are announced: a welcome on joining, join/leave events with the count.
    pub join_leave: bool,
}

impl ChannelRules {
    pub fn for_name(name: &str) -> Self {
        let chat = namespace(name) == CHAT_NAMESPACE;
        ChannelRules {
            client_publish: chat,
            join_leave: chat,
        }
    }
}

/// What a config file may say about one namespace (`[namespaces.NAME]`); what it
/// leaves out keeps the built-in behaviour (`chat` is a chat room, others push-only)
/// and the server-wide history flags.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NamespaceRules {
    pub client_publish: Option<bool>,
    pub join_leave: Option<bool>,
    pub history_size: Option<usize>,
    pub history_ttl: Option<std::time::Duration>,
}

/// The namespaces a config file declares, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Namespaces(std::collections::HashMap<String, NamespaceRules>);

impl Namespaces {
    pub fn insert(&mut self, name: String, rules: NamespaceRules) {
        self.0.insert(name, rules);
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether the config file declares namespace `name`.
    pub fn contains(&self, name: &str) -> bool {
        self.0.contains_key(name)
    }

    fn declared(&self, channel: &str) -> NamespaceRules {
        self.0.get(namespace(channel)).copied().unwrap_or_default()
    }

    /// How `channel` behaves: its namespace's declared rules over the built-in ones.
    /// The reserved namespace stays push-only whatever a config file says.
    pub fn rules(&self, channel: &str) -> ChannelRules {
        let built_in = ChannelRules::for_name(channel);
        if is_reserved(channel) {
            return built_in;
        }
        let declared = self.declared(channel);
        ChannelRules {
            client_publish: declared.client_publish.unwrap_or(built_in.client_publish),
            join_leave: declared.join_leave.unwrap_or(built_in.join_leave),
        }
    }

    /// The history `channel` keeps: its namespace's size and age, where declared.
    pub fn history(&self, channel: &str) -> (Option<usize>, Option<std::time::Duration>) {
        let declared = self.declared(channel);
        (declared.history_size, declared.history_ttl)
    }
}

/// A client's name in chat events and envelopes: the one it chose, else `c<id>`.
pub fn client_name(id: u32, chosen: Option<&str>) -> String {
    match chosen {
        Some(name) => name.to_string(),
        None => format!("c{id}"),
    }
}

/// What a connection is for, as far as its own messages go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `/` and `/echo`: every message comes back.
    Echo,
    /// A channel subscription (`/ws/{channel}`).
    Subscriber(ChannelRules),
}

/// What a client's data message asks the server to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Send it back, text prefixed with `--echo-prefix`.
    Echo,
    /// Publish it to the client's channel, in its name.
    Publish,
    /// Refuse it and close the connection, saying why.
    Refuse(&'static str),
}

/// Decides what a data message from a client in `role` means.
pub fn on_client_message(role: Role) -> Action {
    match role {
        Role::Echo => Action::Echo,
        Role::Subscriber(rules) if rules.client_publish => Action::Publish,
        Role::Subscriber(_) => Action::Refuse("push-only channel: clients cannot publish"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channel_names() {
        assert!(validate_channel_name("news").is_ok());
        assert!(validate_channel_name("chat:lobby-1.x@y_z").is_ok());
        assert_eq!(validate_channel_name(""), Err(NameError::Empty));
        assert_eq!(
            validate_channel_name(&"a".repeat(201)),
            Err(NameError::TooLong)
        );
        assert!(validate_channel_name(&"a".repeat(200)).is_ok());
        assert!(validate_channel_name("1234:presence-a=b,c;d").is_ok());
        assert_eq!(validate_channel_name("a b"), Err(NameError::BadChar(' ')));
        assert_eq!(validate_channel_name("a/b"), Err(NameError::BadChar('/')));
        assert_eq!(validate_channel_name("é"), Err(NameError::BadChar('é')));
        assert_eq!(namespace("chat:lobby"), "chat");
        assert_eq!(namespace("news"), "");
    }

    #[test]
    fn chat_rooms_take_client_messages_and_push_channels_refuse_them() {
        let chat = ChannelRules::for_name("chat:x");
        assert!(chat.client_publish && chat.join_leave);
        let push = ChannelRules::for_name("chatx");
        assert!(!push.client_publish && !push.join_leave);
        assert_eq!(on_client_message(Role::Subscriber(chat)), Action::Publish);
        assert!(matches!(
            on_client_message(Role::Subscriber(push)),
            Action::Refuse(reason) if reason.contains("push-only")
        ));
        assert_eq!(on_client_message(Role::Echo), Action::Echo);
    }

    #[test]
    fn declared_namespaces_override_the_built_in_rules() {
        let mut namespaces = Namespaces::default();
        namespaces.insert(
            "room".into(),
            NamespaceRules {
                client_publish: Some(true),
                join_leave: Some(true),
                ..NamespaceRules::default()
            },
        );
        namespaces.insert(
            "chat".into(),
            NamespaceRules {
                join_leave: Some(false),
                history_size: Some(5),
                ..NamespaceRules::default()
            },
        );
        let room = namespaces.rules("room:a");
        assert!(room.client_publish && room.join_leave);
        let chat = namespaces.rules("chat:a");
        assert!(chat.client_publish && !chat.join_leave);
        assert_eq!(namespaces.history("chat:a"), (Some(5), None));
        assert_eq!(namespaces.rules("news"), ChannelRules::for_name("news"));
        assert_eq!(namespaces.history("news"), (None, None));
    }

    #[test]
    fn client_names() {
        assert_eq!(client_name(42, None), "c42");
        assert_eq!(client_name(42, Some("alice")), "alice");
        assert!(validate_client_name("Al_ice-2.0").is_ok());
        for bad in ["", "a b", "<script>", "é", &"x".repeat(33)] {
            assert!(validate_client_name(bad).is_err(), "{bad}");
        }
        assert!(is_reserved("throng:stats") && !is_reserved("throngs:x") && !is_reserved("news"));
    }
}
