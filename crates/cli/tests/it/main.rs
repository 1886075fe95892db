//! Integration tests: the real service, on a port-0 listener, used over HTTP like a user.

mod amqp;
mod bench;
mod broker_links;
mod brokers;
mod choices;
mod clients;
mod cluster;
mod cluster_choices;
mod console;
mod delivery;
mod history;
mod http_edges;
mod liveness;
mod logs;
mod metrics;
mod moves;
mod mqtt;
mod node_trust;
mod nodes;
mod readings;
mod redelivery;
mod registry;
mod ssrf;
mod store_faults;
mod tokens;
mod utils;
