//! The Sentinel URL's parsing, and a connect that finds no Sentinel answering; failovers
//! themselves are tested against real processes (tests/python/test_sentinel.py).

use std::net::TcpListener;

use super::*;

fn parse(url: &str) -> SentinelUrl {
    SentinelUrl::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
}

#[test]
fn sentinel_urls_name_hosts_in_order_and_the_master() {
    let url = parse("redis-sentinel://10.0.0.1:26380,sentinel-b,[::1]:5000/mymaster");
    assert_eq!(
        url.sentinels,
        vec![
            ("10.0.0.1".to_string(), 26380),
            ("sentinel-b".to_string(), SENTINEL_PORT),
            ("::1".to_string(), 5000),
        ]
    );
    assert_eq!(url.master, "mymaster");
    assert_eq!((url.username, url.password), (None, None));
    assert_eq!(parse("redis-sentinel://h:1/m/").master, "m");
}

#[test]
fn a_password_and_a_user_are_for_redis_and_may_be_escaped() {
    let url = parse("redis-sentinel://:s%40cret%2F1@h:1,h:2/m");
    assert_eq!(url.password.as_deref(), Some("s@cret/1"));
    assert_eq!(url.username, None);
    assert_eq!(url.sentinels.len(), 2);
    let url = parse("redis-sentinel://app:pw@h/m");
    assert_eq!(
        (url.username.as_deref(), url.password.as_deref()),
        (Some("app"), Some("pw"))
    );
}

#[test]
fn malformed_sentinel_urls_say_what_is_wrong_without_the_password() {
    for (url, says) in [
        ("redis-sentinel:///m", "no Sentinel host"),
        ("redis-sentinel://,/m", "no Sentinel host"),
        ("redis-sentinel://h:26379", "no master name"),
        ("redis-sentinel://h:26379/", "no master name"),
        ("redis-sentinel://h:26379/a/b", "is not a master name"),
        ("redis-sentinel://h:26379/m?db=1", "is not a master name"),
        ("redis-sentinel://h:0/m", "is not a port"),
        ("redis-sentinel://h:x/m", "is not a port"),
        ("redis-sentinel://:9/m", "has no host name"),
        ("redis-sentinel://[::1/m", "no closing"),
        ("redis-sentinel://user@h/m", "without a password"),
        ("redis-sentinel://:bad%zz@h/m", "%-escape"),
    ] {
        let e = SentinelUrl::parse(url).expect_err(url);
        assert!(e.contains(says), "{url}: {e}");
        assert!(e.contains("expected redis-sentinel://"), "{url}: {e}");
    }
    let e = SentinelUrl::parse("redis-sentinel://:hunter2@h:1").unwrap_err();
    assert!(!e.contains("hunter2"), "{e}");
}

#[test]
fn without_a_sentinel_answering_a_connect_fails_naming_each() {
    // One Sentinel port that refuses, one that takes the connection and never
    // answers (a hung host): the connect gives up on both, in order.
    let refused = TcpListener::bind("127.0.0.1:0").unwrap();
    let refused_port = refused.local_addr().unwrap().port();
    drop(refused);
    let hung = TcpListener::bind("127.0.0.1:0").unwrap();
    let hung_port = hung.local_addr().unwrap().port();
    let target = Target::open(&format!(
        "redis-sentinel://127.0.0.1:{refused_port},127.0.0.1:{hung_port}/m"
    ))
    .unwrap();
    assert!(target.is_sentinel());
    let Err(e) = target.connect() else {
        panic!("connected through Sentinels that do not answer");
    };
    let e = e.to_string();
    assert!(e.contains("no master 'm' found through Sentinel"), "{e}");
    assert!(e.contains(&format!("127.0.0.1:{refused_port}")), "{e}");
    assert!(e.contains(&format!("127.0.0.1:{hung_port}")), "{e}");
    drop(hung);
}

#[test]
fn a_pause_ends_early_when_the_master_changes() {
    let target = Arc::new(Target::open("redis://127.0.0.1:1").unwrap());
    let generation = target.generation();
    let other = Arc::clone(&target);
    let switch = std::thread::spawn(move || other.next_generation());
    // Without the switch this would sleep an hour.
    target.pause(generation, Duration::from_secs(3600));
    switch.join().unwrap();
    assert_eq!(target.generation(), generation + 1);
}
