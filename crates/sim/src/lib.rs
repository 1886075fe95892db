//! The deterministic simulation of latch's delivery and cluster core.

pub mod model;
