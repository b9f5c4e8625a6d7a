//! The operator against a real kube-apiserver + etcd (no kubelet: tests check the objects the
//! operator writes), with real `kubectl`, `cfp operator` processes and `cfp emulator`; a module
//! per topic.

mod cleanup;
mod digest;
mod leadership;
mod secrets;
mod validation;
mod workload;
