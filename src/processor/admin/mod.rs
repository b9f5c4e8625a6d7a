//! The offline checkpoint tools, which the running processor never calls: export, import and
//! rewind plans (pure, [`checkpoints`]), writing them ([`checkpoint_apply`]), a request carried
//! out with its refusals ([`checkpoint_requests`]), freeing a gone instance's leases
//! ([`evict`]), and leaving for another processor ([`leave`]). Uses `leases` and `cosmos`.

pub mod checkpoint_apply;
pub mod checkpoint_requests;
pub mod checkpoints;
pub mod evict;
pub mod leave;
