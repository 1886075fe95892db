//! What the live stream carries (`GET /v1/stream`): a sensor's event as committed, or a
//! site's change as a round decided it. Its own module: a site's events are notifications'
//! kinds, so `site` reads `notification`, and this, which names both, reads them both.

use super::notification::Event;
use super::site::SiteEvent;

/// One thing the live stream tells.
#[derive(Debug, Clone, PartialEq)]
pub enum Live {
    Sensor(Event),
    Site(SiteEvent),
}
