//! What the console finds ([`Find`]): sensors by an id prefix (`LIKE 'prefix%'` over
//! `sensors_id_prefix`, an index in `text_pattern_ops` so the database's collation does not
//! matter) or by words of their address (the GIN index `sensors_address_words` over
//! `to_tsvector('simple', address)`); both from migration 17.

use async_trait::async_trait;

use super::super::rows::{self as row, SENSOR_COLS};
use super::super::types::filter_sql;
use super::super::{
    Find, Page, PageRequest, Result, Search, SensorFilter, SensorView, limit_plus_one,
};
use super::PgStore;
use super::db::Sql;

#[async_trait]
impl Find for PgStore {
    async fn find_sensors(
        &self,
        search: Search,
        filter: SensorFilter,
        site_id: Option<String>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        let c = self.db.get("find_sensors").await?;
        let after = page.after.clone().unwrap_or_default();
        let conn_filter = filter.connection.map(|c| c.as_str().to_string());
        let below = filter.battery_below.map(i32::from);
        // Ids are letters and digits: no `LIKE` wildcard to escape. No prefix: a pattern
        // that only the empty id would match, and no sensor has one.
        let prefix = search
            .id_prefix()
            .map_or_else(String::new, |p| format!("{p}%"));
        let rows = c
            .query(
                &format!(
                    "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                     ON st.sensor_id = s.id WHERE s.id > $1 \
                     AND (s.id LIKE $2 \
                       OR to_tsvector('simple', s.address) @@ to_tsquery('simple', $3)) \
                     AND ($4::text IS NULL OR COALESCE(st.connection, 'unknown') = $4) \
                     AND ($6::text IS NULL OR s.site_id = $6) {} \
                     ORDER BY s.id LIMIT $5",
                    filter_sql(7, |i, t| format!("${i}::{t}"))
                ),
                &[
                    &after,
                    &prefix,
                    &search.tsquery(),
                    &conn_filter,
                    &limit_plus_one(&page),
                    &site_id,
                    &below,
                    &filter.tamper,
                    &filter.held,
                    &filter.flapping,
                    &filter.battery_low,
                ],
            )
            .await?;
        let rows = rows
            .iter()
            .map(row::sensor_view)
            .collect::<Result<Vec<_>>>()?;
        Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
    }
}
