//! The group commit's reads and writes for armed sensors ([`rules::armed`]).

use rusqlite::{Transaction, params};

use crate::domain::SensorId;
use crate::domain::armed::Armed;
use crate::store::Result;
use crate::store::rules::armed::ArmedRow;
use crate::store::types::StoredSchedule;

/// The sensors among `sensors` that are armed (with their schedule when it exists) or hold
/// an `out_of_schedule` alarm not resolved.
pub(super) fn armed(tx: &Transaction, sensors: &[SensorId]) -> Result<Vec<ArmedRow>> {
    let mut st = tx.prepare_cached(
        "SELECT s.armed, sc.body, sc.created_at, sc.updated_at FROM sensors s \
         LEFT JOIN schedules sc ON sc.id = json_extract(s.armed, '$.schedule_id') \
         WHERE s.id = ?1 AND (s.armed IS NOT NULL OR EXISTS (SELECT 1 FROM alarms a \
         WHERE a.sensor_id = s.id AND a.kind = 'out_of_schedule' AND a.state <> 'resolved'))",
    )?;
    let mut rows = Vec::new();
    for &id in sensors {
        let found = st
            .query_map([id.to_string()], |r| {
                Ok((
                    r.get::<_, Option<String>>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, Option<i64>>(2)?,
                    r.get::<_, Option<i64>>(3)?,
                ))
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        for (armed, body, created, updated) in found {
            let schedule = match body {
                Some(b) => Some(StoredSchedule::of(
                    &b,
                    created.unwrap_or(0),
                    updated.unwrap_or(0),
                )?),
                None => None,
            };
            rows.push(ArmedRow {
                sensor_id: id,
                armed: Armed::from_column(armed.as_deref()).zip(schedule.map(|s| s.schedule)),
            });
        }
    }
    Ok(rows)
}

/// Stores each notification's own fields by seq.
pub(super) fn describe(tx: &Transaction, bodies: &[(i64, String)]) -> Result<()> {
    let mut st = tx.prepare_cached("UPDATE notifications SET body = ?2 WHERE seq = ?1")?;
    for (seq, body) in bodies {
        st.execute(params![seq, body])?;
    }
    Ok(())
}
