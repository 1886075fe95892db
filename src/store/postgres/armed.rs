//! The group commit's reads and writes for armed sensors ([`rules::armed`]).

use super::db::{Sql, Tx};
use crate::domain::SensorId;
use crate::domain::armed::Armed;
use crate::store::Result;
use crate::store::rules::armed::ArmedRow;
use crate::store::types::StoredSchedule;

/// The sensors among `sensors` that are armed (with their schedule when it exists) or hold
/// an `out_of_schedule` alarm not resolved, in one statement.
pub(super) async fn armed(tx: &Tx<'_>, sensors: &[SensorId]) -> Result<Vec<ArmedRow>> {
    let ids: Vec<String> = sensors.iter().map(|s| s.to_string()).collect();
    let rows = tx
        .query(
            &tx.prepare_cached(
                "SELECT s.id, s.armed, sc.body, sc.created_at, sc.updated_at FROM sensors s \
                 LEFT JOIN schedules sc ON sc.id = (s.armed::jsonb ->> 'schedule_id') \
                 WHERE s.id = ANY($1) AND (s.armed IS NOT NULL OR EXISTS (SELECT 1 FROM alarms a \
                 WHERE a.sensor_id = s.id AND a.kind = 'out_of_schedule' \
                 AND a.state <> 'resolved'))",
            )
            .await?,
            &[&ids],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let Ok(sensor_id) = SensorId::parse(r.get(0)) else {
            continue;
        };
        let armed: Option<String> = r.get(1);
        let body: Option<String> = r.get(2);
        let schedule = match body {
            Some(b) => Some(StoredSchedule::of(
                &b,
                r.get::<_, Option<i64>>(3).unwrap_or(0),
                r.get::<_, Option<i64>>(4).unwrap_or(0),
            )?),
            None => None,
        };
        out.push(ArmedRow {
            sensor_id,
            armed: Armed::from_column(armed.as_deref()).zip(schedule.map(|s| s.schedule)),
        });
    }
    Ok(out)
}

/// Stores each notification's own fields by seq, in one statement.
pub(super) async fn describe(tx: &Tx<'_>, bodies: &[(i64, String)]) -> Result<()> {
    let seqs: Vec<i64> = bodies.iter().map(|(s, _)| *s).collect();
    let texts: Vec<&str> = bodies.iter().map(|(_, b)| b.as_str()).collect();
    tx.execute(
        "UPDATE notifications n SET body = u.body \
         FROM UNNEST($1::int8[], $2::text[]) AS u(seq, body) WHERE n.seq = u.seq",
        &[&seqs, &texts],
    )
    .await?;
    Ok(())
}
