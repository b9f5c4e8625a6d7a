//! The worker pods' NetworkPolicy (`spec.worker.networkPolicy`). Pure: which traffic the workers
//! need follows from the resource — DNS, Cosmos DB on the ports of the account endpoints, the
//! HTTP handler on the port of its URL (none for a sidecar on localhost), and ingress to the
//! metrics port.

use std::collections::BTreeSet;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::cosmos::AuthMethod;
use crate::operator::crd::{ChangeFeedProcessor, Connection, HandlerKind};
use crate::operator::workload::{owner, selector_labels, workload_labels};

/// The port Microsoft Entra ID issues tokens on (workload identity).
const ENTRA_ID_PORT: i32 = 443;

/// The NetworkPolicy of `cfp`'s worker pods, when its `spec.worker.networkPolicy.enabled`.
pub fn worker_network_policy(cfp: &ChangeFeedProcessor) -> Option<NetworkPolicy> {
    let policy = cfp.spec.worker.network_policy.as_ref().filter(|p| p.enabled)?;
    let mut egress = vec![dns_egress()];
    egress.push(egress_rule(&policy.cosmos_cidrs, cosmos_ports(cfp)));
    if let Some(port) = handler_port(cfp) {
        egress.push(egress_rule(&policy.handler_cidrs, BTreeSet::from([port])));
    }
    // The trace collector (`observability.tracing`), on its endpoint's port.
    if let Some(port) = tracing_port(cfp) {
        egress.push(egress_rule(&[], BTreeSet::from([port])));
    }
    egress.extend(policy.extra_egress.iter().cloned());
    let ingress = NetworkPolicyIngressRule {
        from: (!policy.metrics_from.is_empty()).then(|| policy.metrics_from.clone()),
        ports: Some(vec![tcp(cfp.spec.worker.metrics_port)]),
    };
    Some(NetworkPolicy {
        metadata: ObjectMeta {
            name: cfp.metadata.name.clone(),
            namespace: cfp.metadata.namespace.clone(),
            labels: Some(workload_labels(cfp)),
            owner_references: Some(owner(cfp)),
            ..Default::default()
        },
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(cfp)),
                ..Default::default()
            }),
            policy_types: Some(vec!["Ingress".into(), "Egress".into()]),
            ingress: Some(vec![ingress]),
            egress: Some(egress),
        }),
    })
}

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        protocol: Some("TCP".into()),
        port: Some(IntOrString::Int(port)),
        end_port: None,
    }
}

/// DNS to any resolver (the cluster's), over UDP and TCP.
fn dns_egress() -> NetworkPolicyEgressRule {
    let udp = NetworkPolicyPort {
        protocol: Some("UDP".into()),
        ..tcp(53)
    };
    NetworkPolicyEgressRule {
        to: None,
        ports: Some(vec![udp, tcp(53)]),
    }
}

/// Egress on `ports` to `cidrs` (anywhere when there are none).
fn egress_rule(cidrs: &[String], ports: BTreeSet<i32>) -> NetworkPolicyEgressRule {
    let to = cidrs
        .iter()
        .map(|cidr| NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: cidr.clone(),
                except: None,
            }),
            ..Default::default()
        })
        .collect::<Vec<_>>();
    NetworkPolicyEgressRule {
        to: (!to.is_empty()).then_some(to),
        ports: Some(ports.into_iter().map(tcp).collect()),
    }
}

/// The port of `url` (its scheme's when it names none).
fn url_port(url: &str) -> Option<i32> {
    url::Url::parse(url).ok()?.port_or_known_default().map(i32::from)
}

/// The ports of the account endpoints the workers reach (and Entra ID's with workload identity).
fn cosmos_ports(cfp: &ChangeFeedProcessor) -> BTreeSet<i32> {
    let connections: Vec<&Connection> = std::iter::once(&cfp.spec.connection)
        .chain(cfp.spec.leases.connection.as_ref())
        .collect();
    let mut ports: BTreeSet<i32> = connections.iter().filter_map(|c| url_port(&c.endpoint)).collect();
    if connections.iter().any(|c| c.auth == AuthMethod::WorkloadIdentity) {
        ports.insert(ENTRA_ID_PORT);
    }
    ports
}

/// The port of the trace collector the workers export to, if any (unless it is in the pod).
fn tracing_port(cfp: &ChangeFeedProcessor) -> Option<i32> {
    let tracing = cfp.spec.observability.as_ref()?.tracing.as_ref()?;
    remote_port(&tracing.endpoint)
}

/// The port of the HTTP handler, unless it is in the pod (localhost: a sidecar).
fn handler_port(cfp: &ChangeFeedProcessor) -> Option<i32> {
    let handler = &cfp.spec.handler;
    let http = handler.http.as_ref().filter(|_| handler.kind == HandlerKind::Http)?;
    remote_port(&http.url)
}

/// The port of `url` (its scheme's when it names none), unless it is in the pod (localhost).
fn remote_port(url: &str) -> Option<i32> {
    let url = url::Url::parse(url).ok()?;
    let local = matches!(url.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
    (!local).then(|| url.port_or_known_default().map(i32::from)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::operator::workload::tests::resource;

    /// (protocol, port) of each port of a rule, and its CIDRs.
    type Rule = (Vec<(String, i32)>, Vec<String>);

    fn rule(rule: &NetworkPolicyEgressRule) -> Rule {
        let ports = rule
            .ports
            .iter()
            .flatten()
            .map(|p| match (&p.protocol, &p.port) {
                (Some(protocol), Some(IntOrString::Int(port))) => (protocol.clone(), *port),
                _ => panic!("unexpected port {p:?}"),
            })
            .collect();
        let cidrs = rule
            .to
            .iter()
            .flatten()
            .filter_map(|peer| peer.ip_block.as_ref().map(|b| b.cidr.clone()))
            .collect();
        (ports, cidrs)
    }

    #[test]
    fn the_policy_allows_what_the_resource_needs_and_nothing_more() {
        let tcp = |port| ("TCP".to_owned(), port);
        let dns = (vec![("UDP".to_owned(), 53), tcp(53)], vec![]);
        let sidecar = serde_json::json!({"type": "Http", "http": {"url": "http://localhost:8080/changes"}});
        // (resource fields, egress rules rendered)
        let cases: Vec<(serde_json::Value, Vec<Rule>)> = vec![
            // Stdout: DNS and Cosmos on the endpoint's port.
            (serde_json::json!({}), vec![dns.clone(), (vec![tcp(443)], vec![])]),
            // A handler in a sidecar needs no egress; CIDRs narrow Cosmos.
            (
                serde_json::json!({"handler": sidecar, "cosmosCidrs": ["10.1.0.0/16"]}),
                vec![dns.clone(), (vec![tcp(443)], vec!["10.1.0.0/16".to_owned()])],
            ),
            // A handler Service on port 80 (the scheme's), in CIDRs.
            (
                serde_json::json!({"handler": {"type": "Http", "http": {"url": "http://orders.shop.svc/changes"}}, "handlerCidrs": ["10.96.0.0/12"]}),
                vec![
                    dns.clone(),
                    (vec![tcp(443)], vec![]),
                    (vec![tcp(80)], vec!["10.96.0.0/12".to_owned()]),
                ],
            ),
            // Traces to a collector on 4318.
            (
                serde_json::json!({"observability": {"tracing": {"endpoint": "http://otel.monitoring:4318"}}}),
                vec![dns.clone(), (vec![tcp(443)], vec![]), (vec![tcp(4318)], vec![])],
            ),
            // Leases in another account on another port, with workload identity: Entra ID on 443.
            (
                serde_json::json!({"leases": {"connection": {"endpoint": "http://emulator.dev.svc:8081/", "auth": "WorkloadIdentity"}}}),
                vec![dns.clone(), (vec![tcp(443), tcp(8081)], vec![])],
            ),
        ];
        for (fields, want) in cases {
            let mut extra = serde_json::json!({"worker": {"networkPolicy": {"enabled": true}}});
            for (key, value) in fields.as_object().unwrap() {
                match key.as_str() {
                    "handler" | "leases" | "observability" => extra[key] = value.clone(),
                    _ => extra["worker"]["networkPolicy"][key] = value.clone(),
                }
            }
            let cfp = resource(extra.clone());
            let policy = worker_network_policy(&cfp).expect("enabled");
            let spec = policy.spec.unwrap();
            let egress: Vec<_> = spec.egress.unwrap().iter().map(rule).collect();
            assert_eq!(egress, want, "{extra}");
            assert_eq!(spec.policy_types.unwrap(), ["Ingress", "Egress"]);
            let ingress = &spec.ingress.unwrap()[0];
            assert_eq!(ingress.ports.as_ref().unwrap()[0].port, Some(IntOrString::Int(9090)));
            assert!(ingress.from.is_none(), "the metrics port from anyone by default");
            assert_eq!(spec.pod_selector.unwrap().match_labels.unwrap(), selector_labels(&cfp));
            assert_eq!(policy.metadata.owner_references.unwrap()[0].uid, "uid-1");
        }
    }

    #[test]
    fn no_policy_unless_enabled_and_extra_egress_and_metrics_peers_are_kept() {
        assert!(worker_network_policy(&resource(serde_json::json!({}))).is_none());
        let off = serde_json::json!({"worker": {"networkPolicy": {"enabled": false}}});
        assert!(worker_network_policy(&resource(off)).is_none());
        let on = serde_json::json!({"worker": {"networkPolicy": {
            "enabled": true,
            "metricsFrom": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}],
            "extraEgress": [{"ports": [{"port": 5432}]}],
        }}});
        let spec = worker_network_policy(&resource(on)).unwrap().spec.unwrap();
        let from = spec.ingress.unwrap()[0].from.clone().unwrap();
        assert_eq!(from.len(), 1);
        let egress = spec.egress.unwrap();
        assert_eq!(egress.len(), 3);
        assert_eq!(egress[2].ports.as_ref().unwrap()[0].port, Some(IntOrString::Int(5432)));
    }
}
