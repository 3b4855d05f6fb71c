//! The TOML config file (`--config FILE`, `THRONG_CONFIG`): finding it before the
//! real parse, its keys becoming the flags' defaults (a key is a flag's long name),
//! and its `[namespaces.NAME]` tables. It must not decide a flag's meaning: the
//! values go through the same parsers as the flags'.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Command;

use super::{ConfigError, parse_duration};
use crate::rules::{NamespaceRules, Namespaces};

/// Finds `--config FILE` (or `THRONG_CONFIG`) before the real parse, so the file's
/// values can become the flags' defaults.
pub fn config_path_from(args: &[String]) -> Option<PathBuf> {
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        if arg == "--" {
            break;
        }
        if arg == "--config" {
            return iter.next().map(PathBuf::from);
        }
        if let Some(path) = arg.strip_prefix("--config=") {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os("THRONG_CONFIG").map(PathBuf::from)
}

/// The config file as a TOML table.
fn read_config_table(path: &Path) -> Result<toml::Table, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    text.parse().map_err(|source| ConfigError::Toml {
        path: path.to_path_buf(),
        source: Box::new(source),
    })
}

/// Makes the config file's keys the defaults of `serve`'s flags; the command line
/// and the environment still win over them.
pub fn apply_config_file(cmd: Command, path: &Path) -> Result<Command, ConfigError> {
    let table = read_config_table(path)?;
    let mut cmd = cmd;
    for (key, value) in table {
        if key == NAMESPACES_KEY {
            // Read by namespaces_from_file; not a flag.
            continue;
        }
        if key == PUSHER_APPS_KEY && pusher_app_tables(&value).is_some() {
            // Read by pusher_apps_from_file.
            continue;
        }
        let id = key.replace('-', "_");
        let known = cmd
            .find_subcommand("serve")
            .is_some_and(|serve| serve.get_arguments().any(|a| a.get_id() == id.as_str()));
        if !known || id == "config" {
            return Err(ConfigError::UnknownKey {
                path: path.to_path_buf(),
                key,
            });
        }
        let scalar = |v: &toml::Value| -> Option<String> {
            match v {
                toml::Value::String(s) => Some(s.clone()),
                toml::Value::Integer(i) => Some(i.to_string()),
                toml::Value::Float(f) => Some(f.to_string()),
                toml::Value::Boolean(b) => Some(b.to_string()),
                _ => None,
            }
        };
        let values: Vec<String> = match &value {
            toml::Value::Array(items) => items.iter().map(scalar).collect::<Option<_>>(),
            v => scalar(v).map(|s| vec![s]),
        }
        .ok_or_else(|| ConfigError::BadValue {
            path: path.to_path_buf(),
            key: key.clone(),
        })?;
        cmd = cmd.mut_subcommand("serve", |serve| {
            serve.mut_arg(id.as_str(), |arg| {
                // A flag whose environment value --help hides holds a secret:
                // the file's value is not shown as its default either.
                let secret = arg.is_hide_env_values_set();
                let arg = arg.default_values(values);
                if secret {
                    arg.hide_default_value(true)
                } else {
                    arg
                }
            })
        });
    }
    Ok(cmd)
}

/// The config file's Pusher apps with settings of their own: `[[pusher-app]]`
/// (the same key as the flag's, whose plain `"ID:KEY:SECRET"` strings it may
/// also hold).
const PUSHER_APPS_KEY: &str = "pusher-app";

/// The `[[pusher-app]]` tables, when the key holds tables (not strings).
fn pusher_app_tables(value: &toml::Value) -> Option<Vec<&toml::Table>> {
    let toml::Value::Array(items) = value else {
        return None;
    };
    if items.is_empty() || !items.iter().all(toml::Value::is_table) {
        return None;
    }
    Some(items.iter().filter_map(toml::Value::as_table).collect())
}

/// A Pusher app the config file declares, with the settings it gives it (the
/// server's flags fill in the rest).
#[derive(Debug, Clone)]
pub struct FileApp {
    pub app: crate::pusher::App,
    pub client_events: Option<bool>,
    pub max_presence_members: Option<usize>,
    pub webhooks: Option<Vec<crate::pusher::webhook_events::Target>>,
}

/// Reads the `[[pusher-app]]` tables: `id`, `key`, `secret`, and optionally
/// `client-events`, `max-presence-members` and `webhooks` (URLs, or tables
/// `{ url = "…", events = ["channel_occupied", …] }`).
pub fn pusher_apps_from_file(path: &Path) -> Result<Vec<FileApp>, ConfigError> {
    use crate::pusher::webhook_events::{Kinds, Target};
    let table = read_config_table(path)?;
    let Some(tables) = table.get(PUSHER_APPS_KEY).and_then(pusher_app_tables) else {
        return Ok(Vec::new());
    };
    let mut apps = Vec::new();
    for (i, options) in tables.into_iter().enumerate() {
        let fail = |reason: String| {
            ConfigError::Invalid(format!(
                "config file {}: [[pusher-app]] number {}: {reason}",
                path.display(),
                i + 1
            ))
        };
        let text = |key: &str| {
            options
                .get(key)
                .and_then(toml::Value::as_str)
                .ok_or_else(|| fail(format!("needs {key}, a string")))
        };
        let spec = format!("{}:{}:{}", text("id")?, text("key")?, text("secret")?);
        let app: crate::pusher::App = spec.parse().map_err(|e| fail(format!("{e}")))?;
        let mut file_app = FileApp {
            app,
            client_events: None,
            max_presence_members: None,
            webhooks: None,
        };
        for (key, value) in options {
            match key.as_str() {
                "id" | "key" | "secret" => {}
                "client-events" => {
                    let on = value
                        .as_bool()
                        .ok_or_else(|| fail("client-events must be true or false".into()))?;
                    file_app.client_events = Some(on);
                }
                "max-presence-members" => {
                    let n = value
                        .as_integer()
                        .and_then(|n| usize::try_from(n).ok())
                        .filter(|n| *n > 0)
                        .ok_or_else(|| {
                            fail("max-presence-members must be a number above 0".into())
                        })?;
                    file_app.max_presence_members = Some(n);
                }
                "webhooks" => {
                    let items = value
                        .as_array()
                        .ok_or_else(|| fail("webhooks must be an array".into()))?;
                    let mut targets = Vec::new();
                    for item in items {
                        let target = match item {
                            toml::Value::String(url) => {
                                url.parse::<Target>().map_err(|e| fail(e.to_string()))?
                            }
                            toml::Value::Table(hook) => {
                                let url =
                                    hook.get("url").and_then(toml::Value::as_str).ok_or_else(
                                        || fail("a webhook table needs url, a string".into()),
                                    )?;
                                let mut target =
                                    url.parse::<Target>().map_err(|e| fail(e.to_string()))?;
                                if let Some(events) = hook.get("events") {
                                    let names = events
                                        .as_array()
                                        .and_then(|a| {
                                            a.iter()
                                                .map(toml::Value::as_str)
                                                .collect::<Option<Vec<_>>>()
                                        })
                                        .ok_or_else(|| {
                                            fail("webhook events must be an array of names".into())
                                        })?;
                                    target.kinds = Kinds::parse(names).map_err(fail)?;
                                }
                                if let Some(other) = hook
                                    .keys()
                                    .find(|k| !matches!(k.as_str(), "url" | "events"))
                                {
                                    return Err(fail(format!(
                                        "unknown webhook option '{other}' (options: url, events)"
                                    )));
                                }
                                target
                            }
                            _ => return Err(fail("a webhook is a URL or a table".into())),
                        };
                        targets.push(target);
                    }
                    file_app.webhooks = Some(targets);
                }
                other => {
                    return Err(fail(format!(
                        "unknown option '{other}' (options: id, key, secret, client-events, max-presence-members, webhooks)"
                    )));
                }
            }
        }
        apps.push(file_app);
    }
    Ok(apps)
}

/// The config file's table of namespaces: `[namespaces.NAME]`.
const NAMESPACES_KEY: &str = "namespaces";

/// Reads the namespaces a config file declares (`[namespaces.NAME]` tables with
/// `client_publish`, `join_leave`, `history_size`, `history_ttl`).
pub fn namespaces_from_file(path: &Path) -> Result<Namespaces, ConfigError> {
    let table = read_config_table(path)?;
    let mut namespaces = Namespaces::default();
    let Some(declared) = table.get(NAMESPACES_KEY) else {
        return Ok(namespaces);
    };
    let fail = |name: &str, reason: String| ConfigError::Namespace {
        path: path.to_path_buf(),
        name: name.to_string(),
        reason,
    };
    let toml::Value::Table(declared) = declared else {
        return Err(fail(
            "",
            "namespaces must be tables, e.g. [namespaces.chat]".into(),
        ));
    };
    for (name, options) in declared {
        if name.is_empty()
            || name.contains(':')
            || crate::rules::validate_channel_name(name).is_err()
        {
            return Err(fail(
                name,
                "a namespace name is 1-128 of A-Z a-z 0-9 _ - . @ (no ':')".into(),
            ));
        }
        let toml::Value::Table(options) = options else {
            return Err(fail(name, "must be a table of options".into()));
        };
        let mut rules = NamespaceRules::default();
        for (key, value) in options {
            let want_bool = || {
                value
                    .as_bool()
                    .ok_or_else(|| fail(name, format!("{key} must be true or false")))
            };
            match key.as_str() {
                "client_publish" => rules.client_publish = Some(want_bool()?),
                "join_leave" => rules.join_leave = Some(want_bool()?),
                "history_size" => {
                    let size = value
                        .as_integer()
                        .and_then(|n| usize::try_from(n).ok())
                        .ok_or_else(|| {
                            fail(name, "history_size must be a whole number from 0".into())
                        })?;
                    rules.history_size = Some(size);
                }
                "history_ttl" => {
                    let ttl = match value {
                        toml::Value::String(s) => {
                            let ttl = parse_duration(s).map_err(|e| fail(name, e))?;
                            if ttl.subsec_nanos() != 0 {
                                return Err(fail(name, "history_ttl must be whole seconds".into()));
                            }
                            ttl
                        }
                        toml::Value::Integer(n) if *n >= 0 => Duration::from_secs(*n as u64),
                        _ => {
                            return Err(fail(
                                name,
                                "history_ttl must be a duration like \"5m\" or seconds".into(),
                            ));
                        }
                    };
                    rules.history_ttl = Some(ttl);
                }
                other => {
                    return Err(fail(
                        name,
                        format!(
                            "unknown option '{other}' (options: client_publish, join_leave, history_size, history_ttl)"
                        ),
                    ));
                }
            }
        }
        namespaces.insert(name.clone(), rules);
    }
    Ok(namespaces)
}
