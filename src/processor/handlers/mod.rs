//! Where batches go: the handler trait and the stdout handler ([`change_handler`]), the HTTP
//! handler ([`http`]), manual checkpoints for Rust library users ([`manual`]), and dead letters
//! ([`dead_letters`]). Uses `leases` and `cosmos`.

pub mod change_handler;
pub mod dead_letters;
pub mod http;
pub mod manual;
