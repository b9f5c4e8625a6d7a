//! The only place that talks to `azure_data_cosmos`: client setup, feed ranges, change-feed page
//! reads, document CRUD with If-Match, and the continuation-token bridge between the SDK's
//! composite tokens and the raw per-range continuations stored in lease documents.
//!
//! `client` and `auth` (reaching an account: key or Entra ID), `provision` (opening the
//! processor's own containers), `feed` (feed ranges and change feed pages), `change` (the change
//! feed modes), `documents` (CRUD with If-Match), `range` (EPK ranges as leases store them),
//! `continuation` and `lsn` (continuation tokens and the LSNs inside them), `error` (SDK errors
//! classified into what the processor decides on).

mod auth;
mod change;
mod client;
mod continuation;
mod documents;
mod error;
mod feed;
mod lsn;
mod provision;
mod range;

pub use auth::{AccountAuth, AuthMethod};
pub use change::{Change, FeedMode, Operation};
pub use client::{CosmosAccount, EMULATOR_KEY};
pub use continuation::{RangeContinuation, decode_sdk_token, encode_sdk_token};
pub use documents::{Document, DocumentContainer};
pub use error::{CosmosError, ErrorKind, ProvisionError};
pub use feed::{ChangePage, FeedReader, MonitoredContainer, Presence, StartFrom};
pub use lsn::{continuation_lsn, session_token_lsn};
pub use provision::create_commands;
pub use range::EpkRange;
