use super::*;
use crate::domain::destination::URL_MAX_CHARS;

fn matches(pattern: &str, text: &str) -> bool {
    regex::Regex::new(pattern).unwrap().is_match(text)
}

fn refused(url: &str, why: &str) {
    let e = validate_url(url).expect_err(url);
    assert!(e.contains(why), "{url}: {e}");
    assert!(!matches(&URL_PATTERN, url), "the pattern takes {url}");
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
    let e = validate_url("mqtt://u:s3cr@t@h/a").unwrap_err();
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
    assert!(validate_url(&long).unwrap_err().contains("at most"));
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
        assert!(matches(&URL_PATTERN, u), "pattern: {u}");
        assert!(
            validate_url(u).is_ok(),
            "parser: {u}: {:?}",
            validate_url(u)
        );
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
            matches(&URL_PATTERN, u),
            validate_url(u).is_ok(),
            "pattern and parser disagree on {u}: {:?}",
            validate_url(u)
        );
    }
}
