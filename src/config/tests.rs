//! The settings' layers, checks and messages.

use super::*;

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn defaults_match_the_contract() {
    let c = Config::load_from(None, &[]).unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.data_dir, PathBuf::from("./latch-data"));
    assert_eq!(c.amqp_queue, "latch.readings");
    assert_eq!(c.amqp_exchange, "latch.by-sensor");
    assert_eq!(c.mqtt_topic, "sensors/+/state");
    assert_eq!(c.heartbeat_timeout, Duration::from_secs(3600));
    assert_eq!(c.retry_base, Duration::from_secs(30));
    assert_eq!(c.retry_max_delay, Duration::from_secs(3600));
    assert_eq!(c.retry_max_attempts, 10);
    assert_eq!(c.delivery_timeout, Duration::from_secs(10));
    assert_eq!(c.secret_rotation_grace, Duration::from_secs(24 * 3600));
    assert_eq!(c.endpoint_disable_after, Duration::from_secs(5 * 24 * 3600));
    assert_eq!(c.database_url, None);
    assert_eq!(c.api_token, None);
}

#[test]
fn database_timeout_is_a_positive_duration() {
    let c = Config::load_from(None, &[]).unwrap();
    assert_eq!(c.database_timeout, Duration::from_secs(5));
    let c = Config::load_from(None, &env(&[("LATCH_DATABASE_TIMEOUT", "750ms")])).unwrap();
    assert_eq!(c.database_timeout, Duration::from_millis(750));
    let e = Config::load_from(None, &env(&[("LATCH_DATABASE_TIMEOUT", "0s")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("database_timeout"), "{e}");
}

#[test]
fn environment_overrides_file_overrides_defaults() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("latch.toml");
    std::fs::write(
        &file,
        "retry_base = \"5s\"\nretry_max_attempts = 3\nlisten = \"127.0.0.1:9000\"\n",
    )
    .unwrap();
    let c = Config::load_from(
        Some(&file),
        &env(&[
            ("LATCH_RETRY_MAX_ATTEMPTS", "7"),
            ("LATCH_API_TOKEN", "12345"),
            ("LATCH_CONFIG", "ignored"),
            ("PATH", "/bin"),
        ]),
    )
    .unwrap();
    assert_eq!(c.retry_base, Duration::from_secs(5));
    assert_eq!(c.retry_max_attempts, 7);
    assert_eq!(c.listen.port(), 9000);
    assert_eq!(c.api_token.as_deref(), Some("12345"));
}

#[test]
fn errors_name_the_bad_key() {
    let err = |pairs: &[(&str, &str)]| {
        Config::load_from(None, &env(pairs))
            .unwrap_err()
            .to_string()
    };
    assert!(err(&[("LATCH_RETRY_BASE", "soon")]).contains("retry_base"));
    assert!(err(&[("LATCH_LISTEN", "nowhere")]).contains("listen"));
    assert!(err(&[("LATCH_RETRY_MAX_ATTEMPTS", "ten")]).contains("retry_max_attempts"));
    assert!(err(&[("LATCH_RETRY_MAX_ATTEMPTS", "0")]).contains("retry_max_attempts"));
    assert!(err(&[("LATCH_RETRY_BSE", "1s")]).contains("LATCH_RETRY_BSE"));
    assert!(err(&[("LATCH_RETRY_POLICY", "random")]).contains("retry_policy"));
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("latch.toml");
    std::fs::write(&file, "lisen = \"x\"\n").unwrap();
    let e = Config::load_from(Some(&file), &[]).unwrap_err().to_string();
    assert!(e.contains("unknown key `lisen`"), "{e}");
}

#[test]
fn the_amqp_exchange_is_a_name_rabbitmq_takes_or_empty() {
    let c = Config::load_from(None, &env(&[("LATCH_AMQP_EXCHANGE", "")])).unwrap();
    assert_eq!(c.amqp_exchange, "", "empty: the plain queue only");
    let c = Config::load_from(None, &env(&[("LATCH_AMQP_EXCHANGE", "site-1.readings:v2")]));
    assert_eq!(c.unwrap().amqp_exchange, "site-1.readings:v2");
    for bad in ["by sensor", "latch/x", "amq.direct", &"x".repeat(251)] {
        let e = Config::load_from(None, &env(&[("LATCH_AMQP_EXCHANGE", bad)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("amqp_exchange"), "{bad}: {e}");
    }
}

#[test]
fn fixed_delays_parse_from_text() {
    let c = Config::load_from(None, &env(&[("LATCH_RETRY_FIXED", "1s, 2s,500ms")])).unwrap();
    assert_eq!(
        c.retry_fixed,
        vec![
            Duration::from_secs(1),
            Duration::from_secs(2),
            Duration::from_millis(500)
        ]
    );
}

#[test]
fn empty_optional_values_mean_unset() {
    let c = Config::load_from(None, &env(&[("LATCH_API_TOKEN", "")])).unwrap();
    assert_eq!(c.api_token, None);
}

#[test]
fn cluster_settings_need_postgresql_and_sane_values() {
    let load = |pairs: &[(&str, &str)]| Config::load_from(None, &env(pairs));
    for key in [
        "LATCH_CLUSTER_LEASE",
        "LATCH_CLUSTER_PARTITIONS",
        "LATCH_CLUSTER_SECRET",
        "LATCH_NODE_ADVERTISE",
    ] {
        let value = match key {
            "LATCH_CLUSTER_LEASE" => "5s",
            "LATCH_CLUSTER_PARTITIONS" => "64",
            "LATCH_NODE_ADVERTISE" => "http://10.0.0.5:8080",
            _ => "s3cret-value",
        };
        let e = load(&[(key, value)]).unwrap_err().to_string();
        assert!(e.contains(&key[6..].to_lowercase()), "{e}");
        assert!(e.contains("one node"), "{e}");
    }
    let pg = ("LATCH_DATABASE_URL", "postgres://u@127.0.0.1/db");
    let key = (
        "LATCH_SECRET_KEY",
        "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=",
    );
    let c = load(&[pg, key]).unwrap();
    assert_eq!((c.partitions(), c.lease()), (128, Duration::from_secs(10)));
    let c = load(&[
        pg,
        key,
        ("LATCH_CLUSTER_LEASE", "3s"),
        ("LATCH_CLUSTER_PARTITIONS", "16"),
    ])
    .unwrap();
    assert_eq!((c.partitions(), c.lease()), (16, Duration::from_secs(3)));
    for (k, v) in [
        ("LATCH_CLUSTER_PARTITIONS", "0"),
        ("LATCH_CLUSTER_PARTITIONS", "5000"),
        ("LATCH_CLUSTER_LEASE", "200ms"),
        ("LATCH_NODE_ADVERTISE", "10.0.0.5:8080"),
    ] {
        let e = load(&[pg, key, (k, v)]).unwrap_err().to_string();
        assert!(e.contains(&k[6..].to_lowercase()), "{k}={v}: {e}");
    }
    let c = load(&[pg, key, ("LATCH_CLUSTER_SECRET", "s3cret-value")]).unwrap();
    assert_eq!(c.redact("key s3cret-value"), "key ***");
    let any: SocketAddr = "0.0.0.0:8080".parse().unwrap();
    let one: SocketAddr = "127.0.0.1:8080".parse().unwrap();
    assert_eq!(c.advertise(any), None, "a wildcard is no address");
    assert_eq!(c.advertise(one).as_deref(), Some("http://127.0.0.1:8080"));
}

#[test]
fn rate_limits_parse_with_and_without_burst() {
    let c = Config::load_from(None, &[]).unwrap();
    assert_eq!(c.rate_limit, None);
    let c = Config::load_from(None, &env(&[("LATCH_RATE_LIMIT", "200/s burst 400")])).unwrap();
    assert_eq!(
        c.rate_limit,
        Some(RateLimit {
            per_second: 200.0,
            burst: 400
        })
    );
    assert_eq!(RateLimit::parse("5/s").unwrap().burst, 5);
    let slow = RateLimit::parse("30/m").unwrap();
    assert_eq!((slow.per_second, slow.burst), (0.5, 1));
    let c = Config::load_from(None, &env(&[("LATCH_RATE_LIMIT", "")])).unwrap();
    assert_eq!(c.rate_limit, None);
    for bad in [
        "fast",
        "0/s",
        "10/h",
        "10/s burst",
        "10/s burst 0",
        "10/s bust 5",
    ] {
        let e = Config::load_from(None, &env(&[("LATCH_RATE_LIMIT", bad)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("rate_limit"), "{bad}: {e}");
    }
}

#[test]
fn redact_masks_url_passwords_and_the_token() {
    let mut c = Config::for_data_dir(Path::new("/tmp"));
    c.database_url = Some("postgres://latch:pg%2Fsecret@db:5432/latch".into());
    c.amqp_url = Some("amqps://guest:rabbitpass@mq/%2f".into());
    c.api_token = Some("tok-123456".into());
    let text = "cannot connect to postgres://latch:pg%2Fsecret@db:5432/latch (pg/secret); \
                amqps://guest:rabbitpass@mq/%2f refused; token tok-123456; \
                http://u:p@ch:8123?x=1 and http://plain:8123/";
    let r = c.redact(text);
    for secret in [
        "pg%2Fsecret",
        "pg/secret",
        "rabbitpass",
        "tok-123456",
        "u:p@",
    ] {
        assert!(!r.contains(secret), "{secret} leaked in {r}");
    }
    assert!(r.contains("postgres://latch:***@db:5432/latch"), "{r}");
    assert!(r.contains("http://u:***@ch:8123?x=1"), "{r}");
    assert!(r.contains("http://plain:8123/"), "{r}");
}

#[test]
fn the_ssrf_guard_settings_parse() {
    let c = Config::load_from(None, &[]).unwrap();
    assert!(c.delivery_allow_nets.is_empty());
    assert!(!c.delivery_https_only);
    let c = Config::load_from(
        None,
        &env(&[
            (
                "LATCH_DELIVERY_ALLOW_NETS",
                "127.0.0.0/8, 10.0.0.0/8,fd00::/8",
            ),
            ("LATCH_DELIVERY_HTTPS_ONLY", "true"),
        ]),
    )
    .unwrap();
    let nets: Vec<String> = c
        .delivery_allow_nets
        .iter()
        .map(|n| n.to_string())
        .collect();
    assert_eq!(nets, ["127.0.0.0/8", "10.0.0.0/8", "fd00::/8"]);
    assert!(c.delivery_https_only);
    let e = Config::load_from(None, &env(&[("LATCH_DELIVERY_ALLOW_NETS", "10.0.0.0")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("delivery_allow_nets"), "{e}");
    let e = Config::load_from(None, &env(&[("LATCH_DELIVERY_HTTPS_ONLY", "yes")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("delivery_https_only"), "{e}");
}

#[test]
fn logs_are_text_unless_json_is_asked_for() {
    let c = Config::load_from(None, &[]).unwrap();
    assert_eq!(c.log_format, LogFormat::Text);
    let c = Config::load_from(None, &env(&[("LATCH_LOG_FORMAT", "json")])).unwrap();
    assert_eq!(c.log_format, LogFormat::Json);
    let e = Config::load_from(None, &env(&[("LATCH_LOG_FORMAT", "xml")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("log_format"), "{e}");
}

#[test]
fn reminders_and_debounce_are_off_by_default_and_checked() {
    let c = Config::load_from(None, &[]).unwrap();
    assert_eq!((c.lost_reminder, c.debounce), (None, Duration::ZERO));
    let c = Config::load_from(
        None,
        &env(&[("LATCH_LOST_REMINDER", "6h"), ("LATCH_DEBOUNCE", "30s")]),
    )
    .unwrap();
    assert_eq!(c.lost_reminder, Some(Duration::from_secs(6 * 3600)));
    assert_eq!(c.debounce, Duration::from_secs(30));
    for (key, value, named) in [
        ("LATCH_LOST_REMINDER", "500ms", "lost_reminder"),
        ("LATCH_DEBOUNCE", "2d", "debounce"),
        ("LATCH_DEBOUNCE", "soon", "debounce"),
    ] {
        let e = Config::load_from(None, &env(&[(key, value)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(named), "{key}={value}: {e}");
    }
}

#[test]
fn retention_takes_days_and_zero_keeps_forever() {
    let c = Config::load_from(None, &[]).unwrap();
    assert_eq!(c.retention_readings, Duration::from_secs(90 * 86_400));
    assert_eq!(c.retention_notifications, Duration::from_secs(30 * 86_400));
    let c = Config::load_from(
        None,
        &env(&[
            ("LATCH_RETENTION_READINGS", "0"),
            ("LATCH_RETENTION_NOTIFICATIONS", "7d 12h"),
        ]),
    )
    .unwrap();
    assert_eq!(c.retention_readings, Duration::ZERO);
    assert_eq!(
        c.retention_notifications,
        Duration::from_secs(7 * 86_400 + 12 * 3600)
    );
    let e = Config::load_from(None, &env(&[("LATCH_RETENTION_READINGS", "90 days ago")]))
        .unwrap_err()
        .to_string();
    assert!(e.contains("retention_readings"), "{e}");
}

#[test]
fn a_bad_value_names_its_key_once() {
    for (var, key) in [
        ("LATCH_HEARTBEAT_TIMEOUT", "heartbeat_timeout"),
        ("LATCH_RETRY_MAX_ATTEMPTS", "retry_max_attempts"),
        ("LATCH_RETRY_POLICY", "retry_policy"),
        ("LATCH_LISTEN", "listen"),
    ] {
        let e = Config::load_from(None, &env(&[(var, "zz")]))
            .unwrap_err()
            .to_string();
        assert_eq!(e.matches(key).count(), 1, "{e}");
        assert!(e.starts_with(&format!("invalid setting `{key}`: ")), "{e}");
        assert!(!e.contains('\n'), "one line: {e:?}");
    }
}

#[test]
fn the_proxy_and_secret_key_settings_parse_and_never_quote_a_key() {
    let c = Config::load_from(None, &[]).unwrap();
    assert_eq!(c.delivery_proxy, None);
    assert_eq!(c.secret_key, None);
    let key = "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=";
    let c = Config::load_from(
        None,
        &env(&[
            ("LATCH_DELIVERY_PROXY", "http://127.0.0.1:3128"),
            ("LATCH_DELIVERY_NO_PROXY", "localhost, 10.0.0.0/8"),
            ("LATCH_SECRET_KEY", key),
        ]),
    )
    .unwrap();
    assert_eq!(c.delivery_proxy.as_deref(), Some("http://127.0.0.1:3128"));
    assert_eq!(c.secret_key.as_ref().map(|k| k.0.len()), Some(1));
    assert!(!format!("{c:?}").contains(key), "Debug shows no key");
    for (name, value, key) in [
        ("LATCH_DELIVERY_PROXY", "socks5://p:1080", "delivery_proxy"),
        (
            "LATCH_DELIVERY_PROXY",
            "http://p:3128/path",
            "delivery_proxy",
        ),
        ("LATCH_DELIVERY_NO_PROXY", "localhost", "delivery_no_proxy"),
        ("LATCH_SECRET_KEY", "c2hvcnQ=", "secret_key"),
    ] {
        let e = Config::load_from(None, &env(&[(name, value)]))
            .unwrap_err()
            .to_string();
        assert!(e.contains(key), "{name}={value}: {e}");
    }
    let e = Config::load_from(None, &env(&[("LATCH_SECRET_KEY", "c2hvcnQ=")]))
        .unwrap_err()
        .to_string();
    assert!(!e.contains("c2hvcnQ="), "the key is not quoted: {e}");
}

/// Issue #69: a shared store takes its key from outside the data folder, and says how to
/// make one; the embedded store may still make its own, and takes the same settings.
#[test]
fn a_shared_store_needs_a_key_from_outside_the_data_folder() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let data_dir = ("LATCH_DATA_DIR", data.to_str().unwrap());
    let pg = ("LATCH_DATABASE_URL", "postgres://u@127.0.0.1/db");
    let load = |pairs: &[(&str, &str)]| Config::load_from(None, &env(pairs));
    let e = load(&[data_dir, pg]).unwrap_err().to_string();
    for words in [
        "LATCH_SECRET_KEY_FILE",
        "openssl rand -base64 32",
        "same on every node",
    ] {
        assert!(e.contains(words), "{words}: {e}");
    }
    // A node that made secret.key before is told to move it, not to make a new key.
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(data.join("secret.key"), "# old\n").unwrap();
    let e = load(&[data_dir, pg]).unwrap_err().to_string();
    assert!(e.contains("move it out of the data folder"), "{e}");

    // The file: surrounding whitespace, a `#` line and one key a line are all taken.
    let (a, b) = (
        "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=",
        "CQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQkJCQk=",
    );
    let file = dir.path().join("latch.key");
    std::fs::write(&file, format!("# latch\n  {a}\n{b}  \n\n")).unwrap();
    let path = file.to_str().unwrap();
    let c = load(&[data_dir, pg, ("LATCH_SECRET_KEY_FILE", path)]).unwrap();
    assert_eq!(c.secret_key_file.as_deref(), Some(file.as_path()));
    assert_eq!(crate::secrets::read_given_file(&file).unwrap().0.len(), 2);
    assert!(load(&[data_dir, ("LATCH_SECRET_KEY_FILE", path)]).is_ok());
    // One place for the keys; a file that is not there, or holds no key, is named.
    let e = load(&[pg, ("LATCH_SECRET_KEY_FILE", path), ("LATCH_SECRET_KEY", a)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("secret_key_file") && !e.contains(a), "{e}");
    let missing = dir.path().join("none.key");
    let e = load(&[pg, ("LATCH_SECRET_KEY_FILE", missing.to_str().unwrap())])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("secret_key_file") && e.contains("none.key"),
        "{e}"
    );
    std::fs::write(&file, "bm90IGEga2V5\n").unwrap();
    let e = load(&[pg, ("LATCH_SECRET_KEY_FILE", path)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("bytes") && !e.contains("bm90IGEga2V5"), "{e}");
}
