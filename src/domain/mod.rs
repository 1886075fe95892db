//! Pure types of latch's world: sensors, readings, clients, events and notifications.
//! Nothing here does I/O; every other layer depends on these. [`policy`] holds the rules
//! over notifications that the store and the dispatcher both carry out.

pub mod alarm;
pub mod alarms;
pub mod armed;
pub mod audit;
pub mod client;
pub mod destination;
pub mod escalation;
pub mod flap;
pub mod hold;
pub mod live;
pub mod notification;
pub mod outbox;
pub mod partition;
pub mod policy;
pub mod reading;
pub mod receiver;
pub mod schedule;
pub mod sensor;
pub mod signals;
pub mod silence;
pub mod site;
pub mod time;
pub mod token;

pub use client::Client;
pub use live::Live;
pub use notification::{Attempt, Detail, Event, EventKind, Notification, Status};
pub use outbox::{Claim, ClaimBatch, NotificationRef, Outcome, Sendable, Verdict};
pub use reading::{Reading, RejectCode, Rejection};
pub use sensor::{Connection, Sensor, SensorId, SensorStatus, Source};
pub use time::Millis;
