//! Sites and silences in the document: the patterns and bounds their handlers check, from
//! the same constants.

use serde_json::{Value, json};

use super::{NOT_BLANK, merge, sensor_id_pattern};
use crate::api::silences::{MAX_COMMENT, MAX_SENSORS};
use crate::api::sites::MAX_TEXT;
use crate::domain::EventKind;
use crate::domain::site::MAX_SITE_ID_LEN;

/// A site id, as [`crate::domain::site::check_site_id`] accepts it.
pub(super) fn site_id_pattern() -> String {
    format!("^[A-Za-z0-9._-]{{1,{MAX_SITE_ID_LEN}}}$")
}

pub(super) fn constrain(doc: &mut Value) {
    let s = "/components/schemas";
    let site = json!({"pattern": site_id_pattern(), "minLength": 1, "maxLength": MAX_SITE_ID_LEN});
    let text = json!({"minLength": 1, "maxLength": MAX_TEXT, "pattern": NOT_BLANK});
    let sensor = json!({"pattern": sensor_id_pattern()});
    for schema in ["SensorCreate", "SensorReplace"] {
        merge(
            doc,
            &format!("{s}/{schema}/properties/site_id"),
            site.clone(),
        );
    }
    merge(doc, &format!("{s}/SiteCreate/properties/id"), site.clone());
    for schema in ["SiteCreate", "SitePatch"] {
        for field in ["name", "address"] {
            merge(
                doc,
                &format!("{s}/{schema}/properties/{field}"),
                text.clone(),
            );
        }
        merge(
            doc,
            &format!("{s}/{schema}/properties/gateway_sensor_id"),
            sensor.clone(),
        );
    }
    let comment = json!({"minLength": 1, "maxLength": MAX_COMMENT, "pattern": NOT_BLANK});
    for schema in ["SilenceCreate", "SilencePatch"] {
        for field in ["starts_at", "ends_at"] {
            merge(
                doc,
                &format!("{s}/{schema}/properties/{field}"),
                json!({"format": "date-time"}),
            );
        }
        merge(
            doc,
            &format!("{s}/{schema}/properties/comment"),
            comment.clone(),
        );
    }
    merge(doc, &format!("{s}/MatchBody"), json!({"minProperties": 1}));
    merge(doc, &format!("{s}/MatchBody/properties/site_id"), site);
    merge(
        doc,
        &format!("{s}/MatchBody/properties/sensor_ids"),
        // Typed: a pattern alone lets `null` through.
        json!({"items": {"type": "string", "pattern": sensor_id_pattern()}, "minItems": 1, "maxItems": MAX_SENSORS}),
    );
    merge(
        doc,
        &format!("{s}/MatchBody/properties/types"),
        json!({"items": {"type": "string", "enum": EventKind::ALL.map(|k| k.as_str())}, "minItems": 1}),
    );
}
