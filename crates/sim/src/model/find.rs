//! What the console finds: sensors by an id prefix or by words of their address
//! (`find.rs` of both backends). The backends' full-text indexes split an address into
//! words of letters and digits and match each search word as a prefix of one; this does
//! the same over lower-cased words (SQLite's tokenizer also folds diacritics, which this
//! does not).

use async_trait::async_trait;

use latch::domain::SensorId;
use latch::store::{Find, Page, PageRequest, Result, Search, SensorFilter, SensorView};

use super::node::NodeStore;
use super::registry::{after, page_of};
use super::tables::Tables;

/// Whether every word of the search starts a word of `address`.
fn words_match(search: &Search, address: &str) -> bool {
    let words: Vec<String> = address
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(str::to_lowercase)
        .collect();
    search
        .words
        .iter()
        .all(|w| words.iter().any(|a| a.starts_with(w.as_str())))
}

impl Tables {
    fn find_sensors(
        &self,
        search: &Search,
        filter: SensorFilter,
        site_id: Option<&str>,
        page: &PageRequest,
    ) -> Page<SensorView> {
        // The text is an id prefix when it could start an id.
        let prefix = SensorId::parse(&search.text)
            .ok()
            .map(|_| search.text.as_str());
        let rows = self
            .sensors
            .values()
            .filter(|s| {
                let id = s.id.to_string();
                after(&id, page)
                    && site_id.is_none_or(|site| s.site_id.as_deref() == Some(site))
                    && (prefix.is_some_and(|p| id.starts_with(p))
                        || words_match(search, &s.address))
            })
            .filter_map(|s| self.sensor_view(s.id))
            .filter(|(_, st)| filter.keeps(st));
        page_of(rows, page, |(s, _)| s.id.to_string())
    }
}

#[async_trait]
impl Find for NodeStore {
    async fn find_sensors(
        &self,
        search: Search,
        filter: SensorFilter,
        site_id: Option<String>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        self.run("find_sensors", false, |t, _| {
            Ok(t.find_sensors(&search, filter, site_id.as_deref(), &page))
        })
        .await
    }
}
