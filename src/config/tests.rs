//! Flags, defaults, config-file keys and their checks.

use super::*;
use clap::Command;

#[test]
fn listen_specs() {
    let one: ListenSpec = "127.0.0.1:8080".parse().unwrap();
    assert_eq!(one.addrs().count(), 1);
    let range: ListenSpec = "127.0.0.1:8000-8499".parse().unwrap();
    assert_eq!(range.addrs().count(), 500);
    let v6: ListenSpec = "[::1]:9000".parse().unwrap();
    assert!(v6.ip.is_ipv6());
    for bad in [
        "8080",
        "x:80",
        "1.2.3.4:99999",
        "1.2.3.4:90-80",
        "1.2.3.4:0-5",
    ] {
        assert!(bad.parse::<ListenSpec>().is_err(), "{bad}");
    }
}

#[test]
fn io_uring_is_auto_or_off_and_auto_by_default() {
    assert_eq!(parse_io_uring("auto"), Ok(true));
    assert_eq!(parse_io_uring("off"), Ok(false));
    assert!(parse_io_uring("on").is_err());
    assert!(ServeConfig::default().io_uring);
}

#[test]
fn sizes_and_durations() {
    assert_eq!(parse_size("65536"), Ok(65536));
    assert_eq!(parse_size("64KiB"), Ok(65536));
    assert_eq!(parse_size("1MiB"), Ok(1 << 20));
    assert_eq!(parse_size("16MiB"), Ok(16 << 20));
    assert_eq!(parse_size("2kb"), Ok(2000));
    assert!(parse_size("12 parsecs").is_err());
    assert!(parse_size("").is_err());
    assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
    assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
    assert!(parse_duration("soon").is_err());
}

#[test]
fn defaults_parse() {
    let config = ServeConfig::default();
    assert_eq!(
        config.listen,
        vec![SocketAddr::from(([127, 0, 0, 1], 8080))]
    );
    assert_eq!(config.ping_interval, Duration::from_secs(25));
    assert_eq!(config.idle_timeout, Duration::from_secs(60));
    assert_eq!(config.handshake_timeout, Duration::from_secs(10));
    assert_eq!(config.max_message_size, 64 << 10);
    assert_eq!(config.max_queue, 1 << 20);
    assert_eq!(config.drain_timeout, Duration::from_secs(10));
    assert_eq!(config.stats_interval, Duration::from_secs(10));
    assert_eq!(config.history_size, 100);
    assert_eq!(config.history_ttl, Duration::from_secs(300));
}

#[test]
fn the_command_line_defaults_are_the_config_defaults() {
    let cmd = ServeArgs::augment_args(Command::new("serve"));
    // Only the defaults: no THRONG_* variable may leak in from the test's
    // environment, so every flag's env lookup is switched off.
    let cmd = cmd.mut_args(|arg| arg.env(None::<&str>));
    let matches = cmd
        .try_get_matches_from(["serve"])
        .expect("no arguments parse");
    let args = ServeArgs::from_arg_matches(&matches).expect("defaults are valid");
    let from_flags = args.into_config().expect("defaults are a valid config");
    let built_in = ServeConfig::default();
    assert_eq!(from_flags.listen, built_in.listen);
    assert_eq!(from_flags.ping_interval, built_in.ping_interval);
    assert_eq!(from_flags.idle_timeout, built_in.idle_timeout);
    assert_eq!(from_flags.handshake_timeout, built_in.handshake_timeout);
    assert_eq!(from_flags.max_message_size, built_in.max_message_size);
    assert_eq!(from_flags.max_queue, built_in.max_queue);
    assert_eq!(from_flags.echo_prefix, built_in.echo_prefix);
    assert_eq!(from_flags.drain_timeout, built_in.drain_timeout);
    assert_eq!(from_flags.stats_interval, built_in.stats_interval);
    assert_eq!(from_flags.history_size, built_in.history_size);
    assert_eq!(from_flags.history_ttl, built_in.history_ttl);
    assert_eq!(from_flags.redis_prefix, built_in.redis_prefix);
}

#[test]
fn config_path_is_found_before_parsing() {
    let args: Vec<String> = ["throng", "serve", "--config", "a.toml"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(config_path_from(&args), Some(PathBuf::from("a.toml")));
    let args: Vec<String> = ["throng", "serve", "--config=b.toml"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    assert_eq!(config_path_from(&args), Some(PathBuf::from("b.toml")));
}

#[test]
fn brokers_are_memory_redis_or_redis_behind_sentinel() {
    assert_eq!("memory".parse::<BrokerSpec>(), Ok(BrokerSpec::Memory));
    for url in [
        "redis://127.0.0.1:6379/0",
        "redis-sentinel://10.0.0.1:26379,10.0.0.2:26379/mymaster",
    ] {
        assert_eq!(url.parse::<BrokerSpec>(), Ok(BrokerSpec::Redis(url.into())));
    }
    let refused = "postgres://x".parse::<BrokerSpec>().unwrap_err();
    assert!(
        refused.contains("memory, redis://") && refused.contains("redis-sentinel://"),
        "{refused}"
    );
    let no_master = "redis-sentinel://:pw@h:26379"
        .parse::<BrokerSpec>()
        .unwrap_err();
    assert!(
        no_master.contains("no master name") && !no_master.contains("pw@"),
        "{no_master}"
    );
}

/// `serve` with these flags, no `THRONG_*` variable of the test's environment
/// leaking in.
fn config_from(flags: &[&str]) -> Result<ServeConfig, ConfigError> {
    let cmd = ServeArgs::augment_args(Command::new("serve")).mut_args(|arg| arg.env(None::<&str>));
    let matches = cmd
        .try_get_matches_from(std::iter::once("serve").chain(flags.iter().copied()))
        .expect("the flags parse");
    ServeArgs::from_arg_matches(&matches)
        .expect("the flags are ServeArgs")
        .into_config()
}

#[test]
fn app_ids_whose_namespace_means_something_are_refused() {
    for (id, why) in [("chat", "chat rooms"), ("throng", "server's own feeds")] {
        let flag = format!("{id}:key:the-secret");
        let refused = config_from(&["--pusher-app", &flag]).unwrap_err();
        let text = format!("{:#}", anyhow::Error::from(refused));
        assert!(
            text.contains(&format!("--pusher-app {id}:")) && text.contains(why),
            "{text}"
        );
        assert!(!text.contains("the-secret"), "{text}");
    }
    assert!(config_from(&["--pusher-app", "chats:key:s", "--pusher-app", "Chat:k2:s"]).is_ok());
}

#[test]
fn app_ids_the_config_file_declares_as_namespaces_are_refused() {
    let dir = std::env::temp_dir().join(format!("throng-app-ns-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for declared in ["room", "\"room.user\""] {
        let path = dir.join("throng.toml");
        std::fs::write(
            &path,
            format!("[namespaces.{declared}]\njoin_leave = true\n"),
        )
        .unwrap();
        let path = path.to_str().unwrap();
        let refused = config_from(&["--config", path, "--pusher-app", "room:k:s"]).unwrap_err();
        let text = format!("{:#}", anyhow::Error::from(refused));
        let name = declared.trim_matches('"');
        assert!(
            text.contains("--pusher-app room:") && text.contains(&format!("[namespaces.{name}]")),
            "{text}"
        );
        assert!(config_from(&["--config", path, "--pusher-app", "other:k:s"]).is_ok());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn flags_that_carry_secrets_say_so_and_name_their_variable() {
    let cmd = ServeArgs::augment_args(Command::new("serve"));
    for (id, var) in [
        ("api_key", "THRONG_API_KEY"),
        ("token_secret", "THRONG_TOKEN_SECRET"),
        ("pusher_app", "THRONG_PUSHER_APP"),
        ("broker", "THRONG_BROKER"),
    ] {
        let arg = cmd.get_arguments().find(|a| a.get_id() == id).unwrap();
        assert_eq!(arg.get_env().and_then(|v| v.to_str()), Some(var), "{id}");
        assert!(
            arg.is_hide_env_values_set(),
            "--help would show {var}'s value"
        );
        let help = arg.get_long_help().or(arg.get_help()).unwrap().to_string();
        assert!(
            help.contains("secret") && help.contains("`ps`") && help.contains(var),
            "{id}: {help}"
        );
    }
}

#[test]
fn the_test_time_scale_is_hidden_one_by_default_and_refused_out_of_range() {
    let cmd = ServeArgs::augment_args(Command::new("serve"));
    let flag = cmd
        .get_arguments()
        .find(|a| a.get_id() == "test_time_scale")
        .expect("the flag exists");
    assert!(flag.is_hide_set(), "--test-time-scale is testing only");
    assert_eq!(
        flag.get_env(),
        Some(std::ffi::OsStr::new("THRONG_TEST_TIME_SCALE"))
    );
    assert_eq!(config_from(&[]).unwrap().test_time_scale, 1.0);
    assert_eq!(ServeConfig::default().test_time_scale, 1.0);
    let scaled = config_from(&["--test-time-scale", "0.1"]).unwrap();
    assert_eq!(scaled.test_time_scale, 0.1);
    for bad in ["0", "-1", "1.5", "fast"] {
        let cmd =
            ServeArgs::augment_args(Command::new("serve")).mut_args(|arg| arg.env(None::<&str>));
        let refused = cmd
            .try_get_matches_from(["serve", &format!("--test-time-scale={bad}")])
            .expect_err(bad)
            .to_string();
        assert!(refused.contains("--test-time-scale"), "{refused}");
    }
}

#[test]
fn the_redis_prefix_is_throng_by_default_settable_and_checked() {
    assert_eq!(config_from(&[]).unwrap().redis_prefix, "throng");
    assert_eq!(ServeConfig::default().redis_prefix, "throng");
    let set = config_from(&["--redis-prefix", "staging-2"]).unwrap();
    assert_eq!(set.redis_prefix, "staging-2");
    let cmd = ServeArgs::augment_args(Command::new("serve"));
    let flag = cmd
        .get_arguments()
        .find(|a| a.get_id() == "redis_prefix")
        .expect("the flag exists");
    assert_eq!(
        flag.get_env(),
        Some(std::ffi::OsStr::new("THRONG_REDIS_PREFIX"))
    );
    let too_long = "x".repeat(65);
    for (bad, why) in [
        ("", "empty"),
        (too_long.as_str(), "longer than 64 bytes"),
        ("a{b}", "'{'"),
        ("a:b", "':'"),
        ("a*", "'*'"),
        ("a b", "' '"),
    ] {
        let cmd =
            ServeArgs::augment_args(Command::new("serve")).mut_args(|arg| arg.env(None::<&str>));
        let refused = cmd
            .try_get_matches_from(["serve", &format!("--redis-prefix={bad}")])
            .expect_err(bad)
            .to_string();
        assert!(
            refused.contains("--redis-prefix") && refused.contains(why),
            "{bad}: {refused}"
        );
    }
}

#[test]
fn the_redis_prefix_comes_from_the_config_file_too() {
    let dir = std::env::temp_dir().join(format!("throng-redis-prefix-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("throng.toml");
    std::fs::write(&path, "redis-prefix = \"from-file\"\n").unwrap();
    let prefix_with = |flags: &[&str]| {
        let serve =
            ServeArgs::augment_args(Command::new("serve")).mut_args(|arg| arg.env(None::<&str>));
        let cmd = apply_config_file(Command::new("throng").subcommand(serve), &path).unwrap();
        let matches = cmd
            .try_get_matches_from(["throng", "serve"].iter().chain(flags))
            .expect("the flags parse");
        let serve = matches.subcommand_matches("serve").expect("serve");
        ServeArgs::from_arg_matches(serve)
            .expect("the flags are ServeArgs")
            .into_config()
            .expect("a valid config")
            .redis_prefix
    };
    assert_eq!(prefix_with(&[]), "from-file");
    assert_eq!(
        prefix_with(&["--redis-prefix", "flag"]),
        "flag",
        "the command line wins over the file"
    );
    std::fs::write(&path, "redis-prefix = \"a:b\"\n").unwrap();
    let serve =
        ServeArgs::augment_args(Command::new("serve")).mut_args(|arg| arg.env(None::<&str>));
    let cmd = apply_config_file(Command::new("throng").subcommand(serve), &path).unwrap();
    let refused = cmd
        .try_get_matches_from(["throng", "serve"])
        .expect_err("a bad prefix from the file")
        .to_string();
    assert!(refused.contains("':'"), "{refused}");
    std::fs::remove_dir_all(&dir).unwrap();
}
