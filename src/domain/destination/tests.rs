use super::*;

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
