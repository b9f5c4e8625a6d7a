//! The operator's trust boundary: it acts for whoever may write a `ChangeFeedProcessor`, so it
//! never does for one namespace what that namespace could not do itself. [`accounts`] (the accounts
//! the operator may reach for a namespace, the cluster admin's allow-list), [`owned_objects`]
//! (objects are applied or deleted only when the resource owns them).

pub mod accounts;
pub mod owned_objects;
