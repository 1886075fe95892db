//! A model of the store.
