//! The integration tests: one test binary (`cargo test --test integration`) with a module per
//! subject, so that the Azure SDK and kube are linked once rather than once per subject. A test's
//! name is `<module>::<test>`; `cargo test --test integration <module>::` runs one module.
//!
//! The tests share this process and run beside each other (libtest's threads), so what is
//! process-wide lives in the harness modules, started once: the control plane of the namespaced
//! tests (the Helm tests and the one that needs the CRD absent have their own), the built
//! Kubernetes tools and Java peer. Tests that load the whole machine for minutes hold
//! [`common::heavy`], so that no two of them run at once.

// The harness.
mod cluster;
mod common;
mod control_plane;
mod entra_support;
mod operator_support;

// The tests.
mod admission_policy;
mod autoscaling;
mod bench;
mod budgets;
mod checkpoint_modes;
mod checkpoints;
mod clock_skew;
mod command_line;
mod cosmos_feed;
mod crd;
mod demo;
mod deposed_owner;
mod docs;
mod docs_commands;
mod emulator_conditions;
mod end_to_end;
mod entra_auth;
mod estimator;
mod faults;
mod harness;
mod helm;
mod http_handler;
mod http_surfaces;
mod image;
mod java_sdk;
mod keda;
mod lease_format;
mod liveness;
mod metadata_rights;
mod migration;
mod monitoring;
mod multi_process;
mod operator;
mod operator_claims;
mod operator_estimation;
mod operator_rewind;
mod operator_steady;
mod operator_without_crd;
mod overlapping_faults_soak;
mod ownership;
mod processor;
mod python_client;
mod read_budget;
mod reference_bugs;
mod regions;
mod regions_failover;
mod renewals;
mod stall;
mod store_recovery;
mod structure;
mod takeover;
mod traces;
mod trust_boundary;
mod worker_errors;
