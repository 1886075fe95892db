//! The SSRF guard's rules, its resolver and its judgment of names a proxy resolves.

use super::*;

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

#[test]
fn non_global_ipv4_ranges_are_named() {
    for (addr, why) in [
        ("0.0.0.0", "unspecified"),
        ("10.1.2.3", "private"),
        ("100.64.0.1", "carrier-grade NAT"),
        ("100.127.255.254", "carrier-grade NAT"),
        ("127.0.0.1", "loopback"),
        ("127.255.255.254", "loopback"),
        ("169.254.169.254", "link-local"),
        ("172.16.0.1", "private"),
        ("172.31.255.255", "private"),
        ("192.0.0.8", "IETF"),
        ("192.0.2.1", "documentation"),
        ("192.168.1.1", "private"),
        ("198.18.0.1", "benchmarking"),
        ("198.19.255.255", "benchmarking"),
        ("198.51.100.7", "documentation"),
        ("203.0.113.9", "documentation"),
        ("224.0.0.251", "multicast"),
        ("239.255.255.250", "multicast"),
        ("240.0.0.1", "reserved"),
        ("255.255.255.255", "broadcast"),
    ] {
        let got = non_global(ip(addr)).unwrap_or_else(|| panic!("{addr} passed"));
        assert!(got.contains(why), "{addr}: {got}");
    }
}

#[test]
fn global_ipv4_addresses_pass() {
    for addr in [
        "1.1.1.1",
        "8.8.8.8",
        "93.184.215.14",
        "100.63.255.255",
        "100.128.0.0",
        "172.15.255.255",
        "172.32.0.0",
        "192.0.1.1",
        "192.169.0.1",
        "198.17.255.255",
        "198.20.0.0",
        "223.255.255.255",
    ] {
        assert_eq!(non_global(ip(addr)), None, "{addr}");
    }
}

#[test]
fn non_global_ipv6_ranges_are_named() {
    for (addr, why) in [
        ("::", "unspecified"),
        ("::1", "loopback"),
        ("fc00::1", "unique-local"),
        ("fd12:3456::1", "unique-local"),
        ("fe80::1", "link-local"),
        ("febf::1", "link-local"),
        ("fec0::1", "site-local"),
        ("ff02::1", "multicast"),
        ("2001:db8::1", "documentation"),
        ("3fff::1", "documentation"),
        ("2001::1", "IETF"),
        ("2002:7f00:1::1", "6to4"),
        ("100::1", "discard"),
        ("64:ff9b:1::1", "NAT64"),
        ("5f00::1", "SRv6"),
    ] {
        let got = non_global(ip(addr)).unwrap_or_else(|| panic!("{addr} passed"));
        assert!(got.contains(why), "{addr}: {got}");
    }
}

#[test]
fn global_ipv6_addresses_pass() {
    for addr in [
        "2606:4700:4700::1111",
        "2a00:1450:4001::200e",
        "2001:4860::1",
    ] {
        assert_eq!(non_global(ip(addr)), None, "{addr}");
    }
}

#[test]
fn ipv6_forms_of_ipv4_addresses_are_judged_as_that_address() {
    for (addr, why) in [
        ("::ffff:127.0.0.1", "loopback"),
        ("::ffff:169.254.169.254", "link-local"),
        ("::ffff:10.0.0.1", "private"),
        ("::ffff:0.0.0.0", "unspecified"),
        ("::127.0.0.1", "loopback"),
        ("::10.0.0.1", "private"),
        ("64:ff9b::127.0.0.1", "loopback"),
        ("64:ff9b::a9fe:a9fe", "link-local"),
        ("64:ff9b::192.168.0.1", "private"),
    ] {
        let got = non_global(ip(addr)).unwrap_or_else(|| panic!("{addr} passed"));
        assert!(got.contains(why), "{addr}: {got}");
    }
    for addr in ["::ffff:8.8.8.8", "64:ff9b::1.1.1.1"] {
        assert_eq!(non_global(ip(addr)), None, "{addr}");
    }
    assert_eq!(
        embedded_v4("::1".parse().unwrap()),
        None,
        "::1 is IPv6 loopback, not 0.0.0.1"
    );
}

#[test]
fn the_allow_list_lets_networks_through() {
    let g = Guard::new(nets(&["127.0.0.0/8", "10.0.0.0/8", "fd00::/8"]), false);
    assert_eq!(g.check_ip(ip("127.0.0.1")), Ok(()));
    assert_eq!(g.check_ip(ip("10.20.30.40")), Ok(()));
    assert_eq!(g.check_ip(ip("fd00::5")), Ok(()));
    assert_eq!(
        g.check_ip(ip("::ffff:127.0.0.1")),
        Ok(()),
        "mapped form too"
    );
    assert_eq!(g.check_ip(ip("8.8.8.8")), Ok(()), "global always passes");
    let refused = g.check_ip(ip("169.254.169.254")).unwrap_err();
    assert!(
        refused
            .to_string()
            .contains("169.254.169.254 is a link-local")
    );
    assert!(refused.to_string().contains("LATCH_DELIVERY_ALLOW_NETS"));
    assert!(g.check_ip(ip("192.168.0.1")).is_err());
    assert!(g.check_ip(ip("::1")).is_err());
    assert!(!g.allows_everything());
    let all = Guard::new(nets(&["0.0.0.0/0", "::/0"]), false);
    assert!(all.allows_everything());
    assert_eq!(all.check_ip(ip("::1")), Ok(()));
    assert_eq!(all.check_ip(ip("169.254.169.254")), Ok(()));
}

#[test]
fn the_default_guard_refuses_every_non_global_address() {
    let g = Guard::default();
    for addr in ["127.0.0.1", "::1", "::ffff:127.0.0.1", "169.254.169.254"] {
        assert!(
            matches!(g.check_ip(ip(addr)), Err(Refusal::Address { .. })),
            "{addr}"
        );
    }
}

#[test]
fn urls_are_checked_by_scheme_and_literal_address() {
    let url = |s: &str| reqwest::Url::parse(s).unwrap();
    let g = Guard::default();
    assert_eq!(g.check_url(&url("http://1.1.1.1/h")), Ok(None));
    assert_eq!(
        g.check_url(&url("http://example.com/h")),
        Ok(Some("example.com"))
    );
    assert!(g.check_url(&url("http://127.0.0.1:9/h")).is_err());
    assert!(g.check_url(&url("http://[::1]:9/h")).is_err());
    assert!(g.check_url(&url("http://[::ffff:127.0.0.1]/h")).is_err());
    assert!(g.check_url(&url("http://169.254.169.254/latest")).is_err());

    let https = Guard::new(vec![], true);
    assert_eq!(
        https.check_url(&url("http://example.com/h")),
        Err(Refusal::NotHttps)
    );
    assert_eq!(
        https.check_url(&url("https://example.com/h")),
        Ok(Some("example.com"))
    );
}

#[test]
fn a_name_keeps_only_its_allowed_addresses() {
    let sa = |s: &str| SocketAddr::new(ip(s), 0);
    let g = Guard::default();
    assert_eq!(
        g.filter("h", [sa("127.0.0.1"), sa("1.1.1.1"), sa("::1")]),
        Ok(vec![sa("1.1.1.1")])
    );
    let refused = g.filter("h", [sa("127.0.0.1"), sa("::1")]).unwrap_err();
    assert_eq!(
        refused,
        Refusal::Name {
            host: "h".into(),
            addr: ip("127.0.0.1"),
            why: "a loopback address"
        }
    );
    assert!(refused.to_string().starts_with("h resolves only to"));
    assert_eq!(g.filter("h", []), Ok(vec![]), "nothing to refuse");
}

#[tokio::test]
async fn broker_hosts_resolve_to_allowed_addresses_only() {
    let g = Guard::default();
    assert!(matches!(
        g.resolve("127.0.0.1", 1883).await,
        Err(ResolveError::Refused(Refusal::Address { .. }))
    ));
    assert!(matches!(
        g.resolve("localhost", 1883).await,
        Err(ResolveError::Refused(Refusal::Name { .. }))
    ));
    assert!(matches!(
        g.resolve("no-such-host.invalid", 1883).await,
        Err(ResolveError::Lookup { .. })
    ));
    let open = Guard::new(nets(&["127.0.0.0/8", "::1/128"]), false);
    let addrs = open.resolve("localhost", 5672).await.unwrap();
    assert!(
        !addrs.is_empty() && addrs.iter().all(|a| a.port() == 5672),
        "{addrs:?}"
    );
    assert!(
        g.vet("mqtt://u:p@10.0.0.1/doors/{sensor_id}")
            .await
            .is_err(),
        "a broker URL is vetted like a webhook's"
    );
    assert!(
        Guard::new(vec![], true)
            .vet("amqp://1.1.1.1?exchange=x")
            .await
            .is_err(),
        "https_only refuses brokers"
    );
}

#[tokio::test]
async fn vetting_resolves_names() {
    let g = Guard::default();
    assert!(matches!(
        g.vet("http://localhost:9/h").await,
        Err(Refusal::Name { .. })
    ));
    assert!(g.vet("http://10.0.0.1/h").await.is_err());
    let open = Guard::new(nets(&["127.0.0.0/8", "::1/128"]), false);
    assert_eq!(open.vet("http://localhost:9/h").await, Ok(()));
    assert_eq!(
        g.vet("http://no-such-host.invalid/h").await,
        Ok(()),
        "an unresolvable name is left to the connect-time check"
    );
}

#[test]
fn a_refusal_is_found_among_the_causes() {
    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Refusal);
    let e = Outer(Refusal::NotHttps);
    assert_eq!(refusal_in(&e), Some(&Refusal::NotHttps));
    let plain = std::io::Error::other("refused");
    assert_eq!(refusal_in(&plain), None);
}

#[tokio::test]
async fn through_a_proxy_every_address_of_a_name_is_judged() {
    let g = Guard::default();
    let within = Duration::from_secs(5);
    assert!(matches!(
        g.judge_name("localhost", 80, within).await,
        Err(Refusal::Proxied { .. })
    ));
    let e = g
        .judge_name("localhost", 80, within)
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("through the proxy"), "{e}");
    // Not left to the proxy, which may resolve it otherwise (split horizon).
    let e = g
        .judge_name("no-such-host.invalid", 80, within)
        .await
        .unwrap_err();
    assert!(matches!(e, Refusal::Unjudged { .. }), "{e}");
    assert!(
        e.to_string()
            .contains("no-such-host.invalid does not resolve"),
        "{e}"
    );
    assert_eq!(
        g.judge_name("127.0.0.1", 80, within).await,
        Ok(()),
        "literals are check_url's"
    );
    let open = Guard::new(nets(&["127.0.0.0/8", "::1/128"]), false);
    assert_eq!(open.judge_name("localhost", 80, within).await, Ok(()));
}

#[tokio::test]
async fn the_proxys_own_name_resolves_unguarded() {
    use reqwest::dns::Resolve;
    let proxy = Proxy {
        url: "http://localhost:3128".into(),
        host: "localhost".into(),
        no_proxy: None,
    };
    let g = Arc::new(Guard::default().with_proxy(Some(proxy)));
    let r = GuardedResolver::new(g);
    let name = |s: &str| <reqwest::dns::Name as std::str::FromStr>::from_str(s).unwrap();
    assert!(r.resolve(name("localhost")).await.is_ok());
    let plain = GuardedResolver::new(Arc::new(Guard::default()));
    assert!(plain.resolve(name("localhost")).await.is_err());
}
