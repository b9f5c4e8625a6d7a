//! Where batches go: the handler trait and the stdout handler, the HTTP handler, manual
//! checkpoints for Rust library users, and dead letters. Uses `leases` and `cosmos`.

pub mod change_handler;
pub mod dead_letters;
pub mod http;
pub mod manual;
