//! What a caller reads: one call per question, so no handler holds the store, the history
//! or the cluster itself. Reads take no order of steps; they are here so that the steps
//! that do (in the other files) are the only way to the parts.

use super::{App, Result};
use crate::domain::client::Health;
use crate::domain::notification::Attempt;
use crate::domain::silence::Silence;
use crate::domain::site::{Site, SiteCounts, SiteTotals};
use crate::domain::{Client, Connection, Event, Millis, Notification, SensorId};
use crate::domain::{partition::Partitioning, silence::SilenceState, token::ApiToken};
use crate::store::cluster::NodeRow;
use crate::store::{
    ConnectionCounts, NotificationFilter, Page, PageRequest, ReadingRecord, Search, SensorFilter,
    SensorView, Stored, TimeRange,
};

/// The fleet's counts for `GET /v1/fleet`.
pub struct FleetCounts {
    pub sensors: ConnectionCounts,
    pub sites: SiteTotals,
    pub pending: u64,
    /// The oldest reading history keeps, as last looked up.
    pub history_from: Option<Millis>,
}

/// The cluster as `GET /v1/cluster` shows it.
pub struct ClusterView {
    pub partitions: u32,
    pub partitioning: Partitioning,
    /// The live nodes (the database's list); `None` on a single node.
    pub nodes: Option<Vec<NodeRow>>,
}

impl App {
    pub async fn sensor(&self, id: SensorId) -> Result<Option<SensorView>> {
        Ok(self.0.store.get_sensor(id).await?)
    }

    /// Sensors by id: found by `search`, or a site's, or all; `connection` filters.
    /// Sensors by id: found by `search`, or of a site, or all. The battery and tamper
    /// filters apply to a site's and to all (the caller refuses them with a search).
    pub async fn sensors(
        &self,
        search: Option<Search>,
        filter: SensorFilter,
        site: Option<String>,
        page: PageRequest,
    ) -> Result<Page<SensorView>> {
        let s = &self.0.store;
        Ok(match (search, site) {
            (Some(q), site) => s.find_sensors(q, filter, site, page).await?,
            (None, Some(site)) => s.site_sensors(site, filter, page).await?,
            (None, None) => s.list_sensors(filter, page).await?,
        })
    }

    pub async fn client(&self, id: String) -> Result<Option<Client>> {
        Ok(self.0.store.get_client(id).await?)
    }

    /// Clients, oldest first: found by `search`, or all; `disabled` filters.
    pub async fn clients(
        &self,
        search: Option<Search>,
        disabled: Option<bool>,
        page: PageRequest,
    ) -> Result<Page<Client>> {
        Ok(match search {
            Some(q) => {
                crate::store::find_clients(self.0.store.as_ref(), &q, disabled, page).await?
            }
            None => self.0.store.list_clients(page, disabled).await?,
        })
    }

    /// A client's endpoint over the last hour (`None`: nothing attempted).
    pub async fn client_health(&self, id: String) -> Result<Option<Health>> {
        Ok(self.0.store.client_health(id, self.now()).await?)
    }

    pub async fn client_sensors(&self, id: String, page: PageRequest) -> Result<Page<SensorView>> {
        Ok(self.0.store.list_client_sensors(id, page).await?)
    }

    pub async fn sensor_clients(&self, id: SensorId, page: PageRequest) -> Result<Page<Client>> {
        Ok(self.0.store.list_sensor_clients(id, page).await?)
    }

    pub async fn notification(&self, id: String) -> Result<Option<(Notification, Vec<Attempt>)>> {
        Ok(self.0.store.get_notification(id).await?)
    }

    pub async fn notifications(
        &self,
        filter: NotificationFilter,
        page: PageRequest,
    ) -> Result<Page<Notification>> {
        Ok(self.0.store.list_notifications(filter, page).await?)
    }

    pub async fn site(&self, id: String) -> Result<Option<(Site, SiteCounts)>> {
        Ok(self.0.store.get_site(id).await?)
    }

    /// Sites by id; `down` keeps those down (or up).
    pub async fn sites(
        &self,
        down: Option<bool>,
        page: PageRequest,
    ) -> Result<Page<(Site, SiteCounts)>> {
        Ok(self.0.store.list_sites(down, page).await?)
    }

    /// A site's sensors (`None`: no such site).
    pub async fn site_sensors(
        &self,
        id: String,
        connection: Option<Connection>,
        page: PageRequest,
    ) -> Result<Option<Page<SensorView>>> {
        if self.0.store.get_site(id.clone()).await?.is_none() {
            return Ok(None);
        }
        let connection = SensorFilter::connection(connection);
        Ok(Some(self.0.store.site_sensors(id, connection, page).await?))
    }

    pub async fn silence(&self, id: String) -> Result<Option<Silence>> {
        Ok(self.0.store.get_silence(id).await?)
    }

    /// Silences in `state` (all when `None`) as of now.
    pub async fn silences(
        &self,
        state: Option<SilenceState>,
        page: PageRequest,
    ) -> Result<Page<Silence>> {
        Ok(self.0.store.list_silences(state, self.now(), page).await?)
    }

    /// The audit trail, newest first.
    pub async fn audit(
        &self,
        filter: crate::store::AuditFilter,
        page: PageRequest,
    ) -> Result<Page<crate::domain::audit::Entry>> {
        Ok(self.0.store.list_audit(filter, page).await?)
    }

    pub async fn tokens(&self) -> Result<Vec<ApiToken>> {
        Ok(self.0.store.list_tokens().await?)
    }

    pub async fn fleet(&self) -> Result<FleetCounts> {
        Ok(FleetCounts {
            sensors: self.0.store.count_sensors().await?,
            sites: self.0.store.site_totals().await?,
            pending: self.0.store.count_pending().await?,
            history_from: self.0.history.history_from(),
        })
    }

    /// A sensor's readings (`None`: no such sensor), from the store and ClickHouse.
    pub async fn readings(
        &self,
        id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Option<Page<Stored<ReadingRecord>>>> {
        if !self.has_sensor(id).await? {
            return Ok(None);
        }
        Ok(Some(self.0.history.readings(id, range, page).await?))
    }

    /// A sensor's events (`None`: no such sensor), from the store and ClickHouse.
    pub async fn events(
        &self,
        id: SensorId,
        range: TimeRange,
        page: PageRequest,
    ) -> Result<Option<Page<Stored<Event>>>> {
        if !self.has_sensor(id).await? {
            return Ok(None);
        }
        Ok(Some(self.0.history.events(id, range, page).await?))
    }

    /// The partitions and, in a cluster, the live nodes.
    pub async fn cluster(&self) -> Result<ClusterView> {
        Ok(match &self.0.cluster {
            None => ClusterView {
                partitions: self.0.engine.partitions(),
                partitioning: self.0.engine.partitioning(),
                nodes: None,
            },
            Some(c) => ClusterView {
                partitions: c.partitions(),
                partitioning: c.partitioning(),
                nodes: Some(c.nodes().await?),
            },
        })
    }

    /// Whether this node is still joining its cluster (never on a single node).
    pub fn joining(&self) -> bool {
        self.0.cluster.as_ref().is_some_and(|c| !c.ready())
    }

    /// Whether the store answers now.
    pub async fn ping(&self) -> crate::store::Result<()> {
        self.0.store.ping().await
    }

    /// Whether the sensor exists.
    pub(super) async fn has_sensor(&self, id: SensorId) -> Result<bool> {
        Ok(self.0.store.get_sensor(id).await?.is_some())
    }
}
