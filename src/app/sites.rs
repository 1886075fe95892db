//! Sites registered, changed and deleted.

use super::{App, Error, Result};
use crate::domain::SensorId;
use crate::domain::site::{Site, SiteCounts};

/// A site's fields as a caller gives them (`None`: unchanged on update, absent on create).
#[derive(Debug, Clone, Default)]
pub struct SiteFields {
    pub name: Option<Option<String>>,
    pub address: Option<Option<String>>,
    pub gateway_sensor_id: Option<Option<SensorId>>,
}

impl App {
    /// A site named by a sensor must exist.
    pub(super) async fn check_site(&self, site_id: Option<&str>) -> Result<()> {
        if let Some(site) = site_id
            && self.0.store.get_site(site.to_string()).await?.is_none()
        {
            return Err(Error::Invalid(format!("site_id: no site {site:?}")));
        }
        Ok(())
    }

    async fn check_gateway(&self, gateway: Option<SensorId>) -> Result<()> {
        if let Some(g) = gateway
            && !self.has_sensor(g).await?
        {
            return Err(Error::Invalid(format!(
                "gateway_sensor_id: no sensor {g:?}"
            )));
        }
        Ok(())
    }

    pub async fn create_site(&self, id: String, f: SiteFields) -> Result<(Site, SiteCounts)> {
        let gateway = f.gateway_sensor_id.flatten();
        self.check_gateway(gateway).await?;
        let now = self.now();
        let site = Site {
            id,
            name: f.name.flatten(),
            address: f.address.flatten(),
            gateway_sensor_id: gateway,
            created_at: now,
            updated_at: now,
        };
        self.0.store.create_site(site.clone()).await?;
        Ok((site, SiteCounts::default()))
    }

    /// Changes the fields given (`None`: no such site).
    pub async fn update_site(
        &self,
        id: String,
        f: SiteFields,
    ) -> Result<Option<(Site, SiteCounts)>> {
        let Some((mut site, _)) = self.0.store.get_site(id.clone()).await? else {
            return Ok(None);
        };
        if let Some(g) = f.gateway_sensor_id {
            self.check_gateway(g).await?;
            site.gateway_sensor_id = g;
        }
        if let Some(n) = f.name {
            site.name = n;
        }
        if let Some(a) = f.address {
            site.address = a;
        }
        site.updated_at = self.now();
        if !self.0.store.replace_site(site).await? {
            return Ok(None);
        }
        Ok(self.0.store.get_site(id).await?)
    }

    /// Deletes a site (`false`: no such site); what it held back of its sensors goes out
    /// as their own, from the node that serves each.
    pub async fn delete_site(&self, id: String) -> Result<bool> {
        let Some(made) = self.0.store.delete_site(id, self.now()).await? else {
            return Ok(false);
        };
        self.0.dispatcher.deliver_served(made);
        Ok(true)
    }
}
