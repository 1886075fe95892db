//! What every broker destination's URL shares: the broker and login it names (one
//! connection per distinct one), and the topic or routing key template its notifications
//! fill in. Each sink reads its own URL with these ([`super::Protocol::parse`]).

use std::fmt;

use crate::domain::destination::{HOST, decode};

/// The placeholders a topic or routing key may hold, filled in per notification.
pub const PLACEHOLDERS: [&str; 2] = ["{sensor_id}", "{type}"];

/// A placeholder, as a pattern.
macro_rules! placeholder {
    () => {
        "\\{sensor_id\\}|\\{type\\}"
    };
}
pub(super) use placeholder;

/// A broker and the login to it: latch keeps one connection per distinct one, shared by
/// every client whose URL names it. Its `Debug` and `Display` never show the password.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Broker {
    /// The sink's scheme (`mqtt`, `amqp`).
    pub scheme: &'static str,
    /// Lower case: host names are not case-sensitive, and one broker is one connection.
    pub host: String,
    pub port: u16,
    pub username: Option<String>,
    pub password: Option<String>,
    /// AMQP: the virtual host the connection opens (`/` by default); empty for MQTT.
    pub vhost: String,
}

impl fmt::Display for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}://", self.scheme)?;
        if let Some(u) = &self.username {
            write!(f, "{u}@")?;
        }
        write!(f, "{}:{}", self.host, self.port)?;
        if !self.vhost.is_empty() {
            write!(f, " vhost {:?}", self.vhost)?;
        }
        Ok(())
    }
}

impl fmt::Debug for Broker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Broker({self}")?;
        if self.password.is_some() {
            f.write_str(", password ***")?;
        }
        f.write_str(")")
    }
}

/// A topic or routing key with `{sensor_id}` and `{type}` to fill in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template(pub String);

impl Template {
    pub fn fill(&self, sensor_id: &str, kind: &str) -> String {
        self.0
            .replace("{sensor_id}", sensor_id)
            .replace("{type}", kind)
    }
}

/// `[user[:password]@]host[:port]` of a `scheme` URL, decoded; `default_port` when none is
/// given.
pub(super) fn broker_of(
    scheme: &'static str,
    default_port: u16,
    authority: &str,
    vhost: String,
) -> Result<Broker, String> {
    let (userinfo, hostport) = match authority.rsplit_once('@') {
        Some((u, h)) => (Some(u), h),
        None => (None, authority),
    };
    if !HOST.matches(hostport) {
        return Err(format!(
            "the broker must be a DNS name or an IPv4 address with an optional port \
             (1-65535), got {hostport:?}"
        ));
    }
    let (host, port) = match hostport.split_once(':') {
        Some((h, p)) => (
            h,
            p.parse().map_err(|_| "port must be 1-65535".to_string())?,
        ),
        None => (hostport, default_port),
    };
    let (username, password) = match userinfo {
        None => (None, None),
        Some(u) => {
            let (user, pass) = match u.split_once(':') {
                Some((user, pass)) => (user, Some(pass)),
                None => (u, None),
            };
            if user.is_empty() {
                return Err("the user name before `:password@` is empty".into());
            }
            let user = decode("user name", user, "._~!$&'()*+,;=-")?;
            let pass = pass
                .map(|p| decode("password", p, "._~!$&'()*+,;=:-"))
                .transpose()?;
            (Some(user), pass)
        }
    };
    Ok(Broker {
        scheme,
        host: host.to_ascii_lowercase(),
        port,
        username,
        password,
        vhost,
    })
}

/// A topic or routing key: letters, digits, `extra`, and the placeholders.
pub(super) fn check_template(what: &str, s: &str, extra: &str) -> Result<(), String> {
    let mut rest = s;
    while let Some(c) = rest.chars().next() {
        if c == '{' {
            match PLACEHOLDERS.iter().find(|p| rest.starts_with(**p)) {
                Some(p) => rest = &rest[p.len()..],
                None => {
                    let name = rest.split_inclusive('}').next().unwrap_or(rest);
                    return Err(format!(
                        "unknown placeholder {name} in the {what}: it may hold {{sensor_id}} \
                         and {{type}}"
                    ));
                }
            }
        } else if c.is_ascii_alphanumeric() || extra.contains(c) {
            rest = &rest[1..];
        } else {
            return Err(format!(
                "the {what} may hold letters, digits, `{extra}`, {{sensor_id}} and {{type}}, \
                 not {c:?}"
            ));
        }
    }
    Ok(())
}
