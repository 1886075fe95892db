use super::*;

fn mqtt(url: &str) -> MqttTarget {
    match parse(url) {
        Ok(Destination::Mqtt(t)) => t,
        other => panic!("{url}: {other:?}"),
    }
}

fn amqp(url: &str) -> AmqpTarget {
    match parse(url) {
        Ok(Destination::Amqp(t)) => t,
        other => panic!("{url}: {other:?}"),
    }
}

fn refused(url: &str, why: &str) {
    let e = parse(url).expect_err(url);
    assert!(e.contains(why), "{url}: {e}");
    assert!(!matches(URL_PATTERN, url), "the pattern takes {url}");
}

#[test]
fn mqtt_urls_name_the_broker_login_and_topic() {
    let t = mqtt("mqtt://acme:s%3Acret@Broker.Example.com:1884/doors/{sensor_id}/{type}");
    assert_eq!(t.broker.protocol, Protocol::Mqtt);
    assert_eq!(t.broker.host, "broker.example.com");
    assert_eq!(t.broker.port, 1884);
    assert_eq!(t.broker.username.as_deref(), Some("acme"));
    assert_eq!(t.broker.password.as_deref(), Some("s:cret"));
    assert_eq!(t.topic.0, "doors/{sensor_id}/{type}");
    assert_eq!(
        t.topic.fill("xa7v9Dfadr7H", "sensor.state_changed"),
        "doors/xa7v9Dfadr7H/sensor.state_changed"
    );
    let plain = mqtt("MQTT://10.0.0.1/a");
    assert_eq!((plain.broker.port, plain.broker.username), (1883, None));
    assert_eq!(mqtt("mqtt://u@h/a").broker.password, None);
    assert_eq!(
        mqtt("mqtt://h//leading/empty/level").topic.0,
        "/leading/empty/level"
    );
}

#[test]
fn amqp_urls_name_the_broker_vhost_exchange_and_key() {
    let t = amqp("amqp://guest:guest@rabbit:5673/%2f?exchange=latch&routing_key=s.{sensor_id}");
    assert_eq!(t.broker.protocol, Protocol::Amqp);
    assert_eq!((t.broker.host.as_str(), t.broker.port), ("rabbit", 5673));
    assert_eq!(t.broker.vhost, "/");
    assert_eq!(t.exchange, "latch");
    assert_eq!(t.routing_key.fill("s1", "x"), "s.s1");
    let d = amqp("amqp://h?exchange=amq.topic");
    assert_eq!((d.broker.vhost.as_str(), d.broker.port), ("/", 5672));
    assert_eq!(d.routing_key.0, "");
    let q = amqp("amqp://h/prod?routing_key=door-events&exchange=");
    assert_eq!((q.broker.vhost.as_str(), q.exchange.as_str()), ("prod", ""));
    assert_eq!(q.routing_key.0, "door-events");
}

#[test]
fn one_broker_is_one_key_whatever_the_case_of_its_name() {
    let a = mqtt("mqtt://u:p@HOST/a/{sensor_id}").broker;
    let b = mqtt("mqtt://u:p@host:1883/b").broker;
    assert_eq!(a, b);
    assert_ne!(a, mqtt("mqtt://u:q@host/b").broker, "another login");
    assert_ne!(
        amqp("amqp://h/a?exchange=x").broker,
        amqp("amqp://h/b?exchange=x").broker,
        "another vhost"
    );
}

#[test]
fn broker_urls_that_cannot_work_are_refused_with_the_reason() {
    refused("mqtts://h/a", "TLS");
    refused("amqps://h?exchange=x", "TLS");
    refused("mqtt://h", "names the topic");
    refused("mqtt://h/", "topic is empty");
    refused("mqtt://h/a/+/b", "wildcard");
    refused("mqtt://h/a/#", "wildcard");
    refused("mqtt://h/a?retain=1", "no query");
    refused("mqtt://h/$SYS/x", "broker's own");
    refused("mqtt://h/a/{sensor}", "unknown placeholder {sensor}");
    refused("mqtt://h/a/{sensor_id", "unknown placeholder {sensor_id");
    refused("mqtt://h/a b", "not ' '");
    refused("mqtt://h/a%20b", "not '%'");
    refused("mqtt://h:0/a", "port");
    refused("mqtt://h:65536/a", "port");
    refused("mqtt://[::1]/a", "IPv4");
    refused("mqtt://:p@h/a", "user name");
    refused("mqtt://u:p%zz@h/a", "escape");
    refused("mqtt://u:p%00@h/a", "printable");
    refused("mqtt://u@w:p@h/a", "not '@'");
    let e = parse("mqtt://u:s3cr@t@h/a").unwrap_err();
    assert!(
        e.contains("password may hold") && !e.contains("s3cr"),
        "{e}"
    );
    refused("amqp://h", "names the exchange");
    refused("amqp://h/", "vhost is empty");
    refused("amqp://h?routing_key=k", "names the exchange");
    refused("amqp://h?exchange=", "default exchange");
    refused("amqp://h?exchange=a&exchange=b", "twice");
    refused("amqp://h?exchange=a&queue=b", "unknown parameter");
    refused("amqp://h?exchange=a/b", "exchange name");
    refused(
        "amqp://h?exchange=a&routing_key=k%2e",
        "routing_key may hold",
    );
    refused(
        "amqp://h?exchange=a&routing_key={id}",
        "unknown placeholder {id}",
    );
    refused("amqp://h?exchange=x#frag", "fragment");
    refused(
        &format!("amqp://h?exchange={}", "x".repeat(256)),
        "up to 255",
    );
    refused("ftp://h/a", "mqtt://");
    // Length is the document's maxLength, not the pattern's.
    let long = format!("mqtt://h/{}", "a".repeat(URL_MAX_CHARS));
    assert!(parse(&long).unwrap_err().contains("at most"));
}

/// The published pattern and the parser agree: what one takes the other takes.
#[test]
fn the_pattern_takes_exactly_what_the_parser_takes() {
    let ok = [
        "http://a/",
        "HTTP://x1.y-2.com:8080/a/b_c~d.e?x=1&y=/z",
        "https://example.com",
        "mqtt://h/a",
        "mqtt://h:1/{type}",
        "Mqtt://user:p%40ss:w@x.y:65535/a/{sensor_id}/{type}/b!c*d",
        "mqtt://u@1.2.3.4/x",
        "amqp://h?exchange=e",
        "amqp://h?routing_key=&exchange=e",
        "amqp://g:g@h/v%2Fx?exchange=a.b:c-d&routing_key={sensor_id}.{type}*~/",
        "amqp://h/%2f?exchange=&routing_key=q",
        "amqp://h?routing_key=q&exchange=",
    ];
    for u in ok {
        assert!(matches(URL_PATTERN, u), "pattern: {u}");
        assert!(parse(u).is_ok(), "parser: {u}: {:?}", parse(u));
    }
    let bad = [
        "ftp://a.com/",
        "http://1234/",
        "http://a.com:0/",
        "http://[::1]/",
        "mqtt://h",
        "mqtt://h/$x",
        "mqtt://h/a+",
        "mqtt://h/{x}",
        "mqtt://h/a}",
        "mqtt://h/{",
        "mqtt://@h/a",
        "mqtt://u:@h/a",
        "amqp://h/",
        "amqp://h?",
        "amqp://h?exchange=&routing_key=",
        "amqp://h?exchange=e&",
        "amqp://h?exchange=e&routing_key=a&routing_key=b",
        "amqp://h?exchange=e&routing_key=a b",
    ];
    for u in bad {
        assert_eq!(
            matches(URL_PATTERN, u),
            parse(u).is_ok(),
            "pattern and parser disagree on {u}: {:?}",
            parse(u)
        );
    }
}

#[test]
fn credentials_are_masked_for_display() {
    assert_eq!(
        redact("mqtt://acme:s3cret@h:1883/doors/{sensor_id}"),
        "mqtt://acme:***@h:1883/doors/{sensor_id}"
    );
    assert_eq!(
        redact("amqp://g:pw@h?exchange=x"),
        "amqp://g:***@h?exchange=x"
    );
    assert_eq!(redact("amqp://h?exchange=x"), "amqp://h?exchange=x");
    assert_eq!(redact("mqtt://user@h/a"), "mqtt://user@h/a");
    assert_eq!(redact("https://e.com/a?b=c"), "https://e.com/a?b=c");
    let b = mqtt("mqtt://acme:s3cret@h/a").broker;
    assert!(!format!("{b:?} {b}").contains("s3cret"), "{b:?}");
}

#[test]
fn a_password_is_split_from_its_url_and_put_back_exactly() {
    for url in [
        "mqtt://user:p%40ss:w@broker:1883/doors/{sensor_id}",
        "amqp://guest:guest@127.0.0.1:5672/%2f?exchange=x&routing_key=k",
        "amqps://u:p@host?exchange=a@b",
    ] {
        let (bare, password) = split_password(url);
        let password = password.unwrap();
        assert!(!bare.contains(&format!(":{password}@")), "{bare}");
        assert_eq!(join_password(&bare, &password), url);
    }
    for url in [
        "https://example.com/hook",
        "mqtt://user@broker/t",
        "mqtt://user:@broker/t",
        "amqp://host?exchange=a:b@c",
    ] {
        assert_eq!(split_password(url), (url.to_string(), None), "{url}");
    }
    assert_eq!(
        split_password("mqtt://u:secret@b/t").0,
        "mqtt://u@b/t",
        "the user stays"
    );
}
