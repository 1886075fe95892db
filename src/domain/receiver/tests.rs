use super::*;

const NOW: Millis = 1_800_000_000_000;

fn h(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

#[test]
fn headers_are_checked_by_name_and_value() {
    assert!(
        validate_headers(
            &h(&[("X-Api-Key", "abc 123"), ("Authorization", "Token t")]),
            false
        )
        .is_ok()
    );
    for (name, want) in [
        ("Host", "latch sets this header"),
        ("content-type", "reserved"),
        ("Webhook-Signature", "webhook-*"),
        ("Transfer-Encoding", "reserved"),
        ("bad name", "not a header name"),
        ("", "not a header name"),
    ] {
        let e = validate_headers(&h(&[(name, "v")]), false).unwrap_err();
        assert!(e.contains(want), "{name}: {e}");
    }
    assert!(
        validate_headers(&h(&[("X-A", "1"), ("x-a", "2")]), false).is_ok(),
        "two values"
    );
    let e = validate_headers(&h(&[("Authorization", "x")]), true).unwrap_err();
    assert!(e.contains("auth"), "{e}");
    for value in [" lead", "trail ", "new\nline", "é"] {
        assert!(
            validate_headers(&h(&[("X-V", value)]), false).is_err(),
            "{value:?}"
        );
    }
    assert!(validate_headers(&h(&[("X-Empty", "")]), false).is_ok());
    let many: Vec<(String, String)> = (0..=HEADERS_MAX)
        .map(|i| (format!("x-{i}"), "v".into()))
        .collect();
    assert!(
        validate_headers(&many, false)
            .unwrap_err()
            .contains("at most")
    );
}

#[test]
fn auth_is_checked_by_type() {
    let ok = [
        Auth::Bearer {
            token: "abc.def-ghi".into(),
        },
        Auth::Basic {
            username: "u".into(),
            password: "".into(),
        },
        Auth::OAuth2 {
            token_url: "https://idp.example.com/oauth/token".into(),
            client_id: "id".into(),
            client_secret: "s".into(),
            scope: Some("a b".into()),
            audience: None,
        },
    ];
    for a in &ok {
        assert_eq!(validate_auth(a), Ok(()), "{a:?}");
    }
    let bad = [
        (
            Auth::Bearer {
                token: "has space".into(),
            },
            "auth.token",
        ),
        (
            Auth::Basic {
                username: "a:b".into(),
                password: "p".into(),
            },
            "auth.username",
        ),
        (
            Auth::Basic {
                username: "".into(),
                password: "p".into(),
            },
            "auth.username",
        ),
        (
            Auth::OAuth2 {
                token_url: "ftp://idp/token".into(),
                client_id: "id".into(),
                client_secret: "s".into(),
                scope: None,
                audience: None,
            },
            "auth.token_url",
        ),
        (
            Auth::OAuth2 {
                token_url: "https://u:p@idp/token".into(),
                client_id: "id".into(),
                client_secret: "s".into(),
                scope: None,
                audience: None,
            },
            "auth.token_url",
        ),
        (
            Auth::OAuth2 {
                token_url: "https://idp/token".into(),
                client_id: "id".into(),
                client_secret: "".into(),
                scope: None,
                audience: None,
            },
            "auth.client_secret",
        ),
    ];
    for (a, field) in bad {
        let e = validate_auth(&a).unwrap_err();
        assert!(e.starts_with(field), "{a:?}: {e}");
    }
    let json = serde_json::to_value(&ok[2]).unwrap();
    assert_eq!(json["type"], "oauth2_client_credentials");
    assert_eq!(serde_json::from_value::<Auth>(json).unwrap(), ok[2]);
}

/// A CA and a client certificate it issued, as PEM.
fn issued() -> (String, String, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "Test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let mut p = rcgen::CertificateParams::new(vec!["client.test".to_string()]).unwrap();
    p.distinguished_name
        .push(rcgen::DnType::CommonName, "latch client");
    let cert = p.signed_by(&key, &ca, &ca_key).unwrap();
    (cert.pem(), key.serialize_pem(), ca.pem())
}

#[test]
fn a_client_certificate_is_read_back_as_subject_and_expiry() {
    let (cert, key, ca) = issued();
    let tls = parse_tls(&cert, &key, Some(&ca), NOW).unwrap();
    assert_eq!(tls.subject, "CN=latch client");
    assert_eq!(tls.ca_subject.as_deref(), Some("CN=Test CA"));
    assert!(tls.not_after > NOW, "{}", tls.not_after);
    assert!(
        parse_tls(&cert, &key, None, NOW)
            .unwrap()
            .ca_subject
            .is_none()
    );
}

#[test]
fn bad_certificates_are_refused_with_a_reason() {
    let (cert, key, ca) = issued();
    let (other_cert, other_key, _) = issued();
    let e = parse_tls(&cert, &other_key, None, NOW).unwrap_err();
    assert!(e.contains("not the certificate's"), "{e}");
    let e = parse_tls("not pem", &key, None, NOW).unwrap_err();
    assert!(e.starts_with("tls.client_cert_pem"), "{e}");
    let e = parse_tls(
        &cert,
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        None,
        NOW,
    )
    .unwrap_err();
    assert!(e.starts_with("tls.client_key_pem"), "{e}");
    let e = parse_tls(&cert, &key, Some("garbage"), NOW).unwrap_err();
    assert!(e.starts_with("tls.ca_pem"), "{e}");
    let e = parse_tls(&cert, &key, Some(&ca), i64::MAX / 2).unwrap_err();
    assert!(e.contains("expired"), "{e}");
    assert!(parse_tls(&other_cert, &other_key, Some(&ca), NOW).is_ok());
}

/// Issue #69: a private key pasted beside the certificate (or the CA) is refused: those
/// fields are stored as given, not sealed, and read back in part.
#[test]
fn a_private_key_in_the_certificate_fields_is_refused() {
    let (cert, key, ca) = issued();
    let rsa = "-----BEGIN RSA PRIVATE KEY-----\nAAAA\n-----END RSA PRIVATE KEY-----\n";
    for pasted in [
        format!("{cert}{key}"),
        format!("{key}{cert}"),
        format!("{cert}{rsa}"),
    ] {
        let e = parse_tls(&pasted, &key, None, NOW).unwrap_err();
        assert!(
            e.starts_with("tls.client_cert_pem") && e.contains("private key"),
            "{e}"
        );
        assert!(!e.contains("AAAA") && !e.contains(&key[30..60]), "{e}");
    }
    let e = parse_tls(&cert, &key, Some(&format!("{ca}{key}")), NOW).unwrap_err();
    assert!(
        e.starts_with("tls.ca_pem") && e.contains("private key"),
        "{e}"
    );
}

#[test]
fn debug_output_holds_no_secret() {
    let (cert, key, _) = issued();
    let r = Receiver {
        headers: vec![("X-Key".into(), "header-secret".into())],
        auth: Some(Auth::OAuth2 {
            token_url: "https://idp/t".into(),
            client_id: "id".into(),
            client_secret: "client-secret".into(),
            scope: None,
            audience: None,
        }),
        tls: Some(parse_tls(&cert, &key, None, NOW).unwrap()),
    };
    let shown = format!("{r:?}");
    for secret in ["header-secret", "client-secret", &key[30..60]] {
        assert!(!shown.contains(secret), "{shown}");
    }
    assert!(
        shown.contains("X-Key") && shown.contains("CN=latch client"),
        "{shown}"
    );
    let basic = format!(
        "{:?}",
        Auth::Basic {
            username: "u".into(),
            password: "pw-secret".into()
        }
    );
    assert!(
        !basic.contains("pw-secret") && basic.contains("\"u\""),
        "{basic}"
    );
}
