//! What the console finds ([`Find`]): sensors by an id prefix (a range of the primary
//! key) or by words of their address (the FTS5 table `sensor_search`, which triggers on
//! `sensors` keep; migration 10).

use async_trait::async_trait;
use rusqlite::params;

use super::super::rows::{self as row, SENSOR_COLS};
use super::super::types::filter_sql;
use super::super::{
    Find, Page, PageRequest, Result, Search, SensorFilter, SensorView, limit_plus_one,
};
use super::SqliteStore;

#[async_trait]
impl Find for SqliteStore {
    async fn find_sensors(
        &self,
        search: Search,
        filter: SensorFilter,
        site_id: Option<String>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.read_seen(move |c, seen| {
            let after = page.after.clone().unwrap_or_default();
            let conn_filter = filter.connection.map(|c| c.as_str()).unwrap_or("");
            // Ids are ASCII letters and digits, all below U+007F: under SQLite's binary order
            // every id starting with the prefix sorts in [prefix, prefix + U+007F).
            let (lo, hi) = match search.id_prefix() {
                Some(p) => (p.to_string(), format!("{p}\u{7f}")),
                None => (String::new(), String::new()),
            };
            // The matches (an id range and the words' postings) are listed first, so a rare word
            // reads a few rows rather than every sensor in id order.
            let mut rows = c
                .prepare_cached(&format!(
                    "SELECT {SENSOR_COLS} FROM sensors s LEFT JOIN sensor_state st \
                     ON st.sensor_id = s.id WHERE s.id IN ( \
                       SELECT id FROM sensors WHERE id >= ?2 AND id < ?3 AND id > ?1 \
                       UNION SELECT id FROM sensor_search WHERE sensor_search MATCH ?4 AND id > ?1) \
                     AND (?5 = '' OR COALESCE(st.connection, 'unknown') = ?5) \
                     AND (?7 IS NULL OR s.site_id = ?7) {} \
                     ORDER BY s.id LIMIT ?6",
                    filter_sql(8, |i, _| format!("?{i}"))
                ))?
                .query_map(
                    params![
                        after,
                        lo,
                        hi,
                        search.fts5(),
                        conn_filter,
                        limit_plus_one(&page),
                        site_id,
                        filter.battery_below,
                        filter.tamper,
                        filter.held,
                        filter.flapping,
                        filter.battery_low
                    ],
                    |r| row::sensor_view(r),
                )?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            seen.patch_views(&mut rows);
            Ok(Page::from_rows(rows, page.limit, |(s, _)| s.id.to_string()))
        })
        .await
    }
}
