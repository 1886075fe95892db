//! What the settings' one declaration, [`Config`], says of each setting: its name, and
//! whether its value is a secret. A secret setting is one read by [`secret`] (or a reader
//! built on it): that reader announces itself to serde as a newtype named [`SECRET`],
//! which a probe here watches for. So `latch config` masks a new secret setting the moment
//! it is declared with that reader, and no list elsewhere can forget one.

use std::cell::Cell;
use std::fmt;
use std::sync::OnceLock;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, forward_to_deserialize_any};

use super::Config;

/// The newtype name a secret setting's reader asks serde for. Formats that know nothing of
/// it (TOML, serde's own value types) hand the value on unchanged.
pub(super) const SECRET: &str = "latch::config::Secret";

/// Reads an optional secret text setting (empty: unset) and marks it as a secret.
pub(super) fn secret<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    secret_with(d, |s| Ok(s.to_string()))
}

/// As [`secret`], the text then parsed by `parse` (whose message must never quote it).
pub(super) fn secret_with<'de, D, T>(
    d: D,
    parse: fn(&str) -> Result<T, String>,
) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
{
    struct Marked<T>(fn(&str) -> Result<T, String>);
    impl<'de, T> Visitor<'de> for Marked<T> {
        type Value = Option<T>;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a text")
        }
        fn visit_newtype_struct<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            match Option::<String>::deserialize(d)? {
                Some(s) if !s.trim().is_empty() => {
                    (self.0)(&s).map(Some).map_err(de::Error::custom)
                }
                _ => Ok(None),
            }
        }
    }
    d.deserialize_newtype_struct(SECRET, Marked(parse))
}

/// The settings as [`Config`] declares them, in declaration order (the tests hold the
/// defaults file to it).
#[cfg(test)]
pub(super) fn settings() -> &'static [&'static str] {
    &declared().0
}

/// The settings whose value is a secret.
pub(super) fn secret_settings() -> &'static [&'static str] {
    &declared().1
}

fn declared() -> &'static (Vec<&'static str>, Vec<&'static str>) {
    static DECLARED: OnceLock<(Vec<&'static str>, Vec<&'static str>)> = OnceLock::new();
    DECLARED.get_or_init(|| {
        let names = Cell::new(&[][..]);
        // The probe fails by design; what it saw on the way is the answer.
        let _ = Config::deserialize(Probe {
            only: None,
            names: &names,
            secret: &Cell::new(false),
        });
        let all = names.get().to_vec();
        let secrets = all
            .iter()
            .copied()
            .filter(|name| {
                let secret = Cell::new(false);
                let _ = Config::deserialize(Probe {
                    only: Some(name),
                    names: &names,
                    secret: &secret,
                });
                secret.get()
            })
            .collect();
        (all, secrets)
    })
}

/// The probe's error: it stops at the first value it is asked for.
#[derive(Debug)]
struct Stop;

impl fmt::Display for Stop {
    fn fmt(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("probe")
    }
}

impl std::error::Error for Stop {}

impl de::Error for Stop {
    fn custom<T: fmt::Display>(_: T) -> Self {
        Stop
    }
}

/// A deserializer for [`Config`] that notes the struct's field names and offers it one
/// field, `only`, whose value notes whether it is read as a secret.
struct Probe<'a> {
    only: Option<&'static str>,
    names: &'a Cell<&'static [&'static str]>,
    secret: &'a Cell<bool>,
}

impl<'de> Deserializer<'de> for Probe<'_> {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Stop> {
        self.names.set(fields);
        visitor.visit_map(OneField {
            key: self.only,
            secret: self.secret,
        })
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        option unit unit_struct newtype_struct seq tuple tuple_struct map enum identifier
        ignored_any
    }
}

/// The map of one field: its name, then a value that only looks at how it is read.
struct OneField<'a> {
    key: Option<&'static str>,
    secret: &'a Cell<bool>,
}

impl<'de> MapAccess<'de> for OneField<'_> {
    type Error = Stop;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Stop> {
        match self.key.take() {
            Some(k) => seed
                .deserialize(de::value::StrDeserializer::<Stop>::new(k))
                .map(Some),
            None => Ok(None),
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Stop> {
        seed.deserialize(Value {
            secret: self.secret,
        })
    }
}

/// A field's value: notes the [`SECRET`] newtype, and gives nothing.
struct Value<'a> {
    secret: &'a Cell<bool>,
}

impl<'de> Deserializer<'de> for Value<'_> {
    type Error = Stop;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Stop> {
        Err(Stop)
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Stop> {
        visitor.visit_some(self)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        _: V,
    ) -> Result<V::Value, Stop> {
        if name == SECRET {
            self.secret.set(true);
        }
        Err(Stop)
    }

    forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes byte_buf
        unit unit_struct seq tuple tuple_struct map struct enum identifier ignored_any
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_declaration_names_every_setting_of_the_defaults_and_its_secrets() {
        let mut declared: Vec<&str> = settings().to_vec();
        declared.sort_unstable();
        let known = super::super::known_keys();
        assert_eq!(
            declared, known,
            "config.default.toml and Config name the same settings"
        );
        for key in ["api_token", "cluster_secret", "secret_key"] {
            assert!(
                secret_settings().contains(&key),
                "{key} is a secret setting"
            );
        }
        for key in ["listen", "database_url"] {
            assert!(!secret_settings().contains(&key), "{key} is not");
        }
    }
}
