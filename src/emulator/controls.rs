//! The `/_emulator/*` control endpoints: faults and hangs, key rotation, containers (with their
//! provisioned throughput), splits and merges of physical partitions, and the account's regions
//! (failover, a region offline).

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;

use super::{ContainerSpec, Emulator, EmulatorError, Fault, PhysicalPartition};

type Response = hyper::Response<Full<Bytes>>;

impl Emulator {
    /// The fault-injection endpoints; `None` for other actions.
    fn fault_control(
        &self,
        method: &hyper::Method,
        action: &str,
        params: &HashMap<String, String>,
    ) -> Option<Response> {
        let bad = |message: String| crate::http_server::json(400, &serde_json::json!({ "message": message }));
        match (method, action) {
            (&hyper::Method::POST, "faults") => {
                let rate = params.get("rate").map_or(Ok(0.1), |r| r.parse::<f64>());
                let kinds: Option<Vec<Fault>> = params
                    .get("kinds")
                    .map_or("429,503,408", String::as_str)
                    .split(',')
                    .map(Fault::parse)
                    .collect();
                let latency = params.get("latencyMs").map_or(Ok(0), |ms| ms.parse::<u64>());
                match (rate, kinds, latency) {
                    (Ok(rate), Some(kinds), Ok(latency)) if (0.0..=1.0).contains(&rate) => {
                        self.faults.configure(rate, kinds);
                        self.faults.slow_down(Duration::from_millis(latency));
                    }
                    _ => {
                        return Some(bad(
                            "rate must be 0..1, kinds a list of 429, 503, 408, reset, 429/3212, 404/1002, 403/3, 403/1008 and latencyMs a number of milliseconds"
                                .into(),
                        ));
                    }
                }
            }
            (&hyper::Method::POST, "outage") => match params.get("ms").and_then(|ms| ms.parse::<u64>().ok()) {
                Some(ms) => self.faults.outage(Duration::from_millis(ms)),
                None => return Some(bad("ms (the outage's length in milliseconds) is required".into())),
            },
            (&hyper::Method::DELETE, "faults") => self.faults.clear(),
            (&hyper::Method::GET, "faults") => {}
            _ => return None,
        }
        Some(crate::http_server::json(200, &self.faults.report()))
    }

    /// `/_emulator/hang`: change feed reads of a partition that never return.
    fn hang_control(&self, method: &hyper::Method, action: &str, params: &HashMap<String, String>) -> Option<Response> {
        match (method, action) {
            (&hyper::Method::POST, "hang") => match params.get("partition") {
                Some(partition) => self.hangs.hang(partition, params.get("container").map(String::as_str)),
                None => {
                    let message = "partition (a physical partition id, see /_emulator/ranges) is required";
                    return Some(crate::http_server::json(
                        400,
                        &serde_json::json!({ "message": message }),
                    ));
                }
            },
            (&hyper::Method::DELETE, "hang") => self.hangs.lift(),
            (&hyper::Method::GET, "hang") => {}
            _ => return None,
        }
        Some(crate::http_server::json(200, &self.hangs.report()))
    }

    /// Answers one control request.
    pub(super) async fn control(&self, method: hyper::Method, action: &str, query: &str) -> Response {
        let params: HashMap<String, String> = url::form_urlencoded::parse(query.as_bytes()).into_owned().collect();
        if let Some(response) = self.fault_control(&method, action, &params) {
            return response;
        }
        if let Some(response) = self.hang_control(&method, action, &params) {
            return response;
        }
        if let Some(response) = self.region_control(&method, action, &params) {
            return response;
        }
        if (&method, action) == (&hyper::Method::POST, "key") {
            let value = params.get("value").map(String::as_str).unwrap_or_default();
            return match self.regenerate_key(value) {
                Ok(()) => {
                    tracing::info!("account key regenerated");
                    crate::http_server::json(200, &serde_json::json!({"message": "key regenerated"}))
                }
                Err(error) => crate::http_server::json(409, &serde_json::json!({ "message": error.to_string() })),
            };
        }
        if (&method, action) == (&hyper::Method::GET, "load") {
            return crate::http_server::json(200, &serde_json::json!(self.edge.throttles().report()));
        }
        if !matches!(action, "ranges" | "containers" | "split" | "merge") {
            return crate::http_server::json(404, &serde_json::json!({"message": "unknown control endpoint"}));
        }
        let (Some(database), Some(container)) = (params.get("database"), params.get("container")) else {
            return bad_request("database and container are required".into());
        };
        match self
            .container_control(&method, action, database, container, &params)
            .await
        {
            Ok(partitions) => crate::http_server::json(200, &serde_json::json!({ "partitions": partitions })),
            Err(EmulatorError::NoSuchContainer(name)) => crate::http_server::json(
                404,
                &serde_json::json!({"message": format!("container {name} does not exist")}),
            ),
            Err(error @ (EmulatorError::InvalidSpec { .. } | EmulatorError::BadRequest(_))) => {
                bad_request(error.to_string())
            }
            Err(error) => crate::http_server::json(409, &serde_json::json!({"message": error.to_string()})),
        }
    }

    /// `/_emulator/ranges`, `containers`, `split` and `merge`: the partitions after the action.
    async fn container_control(
        &self,
        method: &hyper::Method,
        action: &str,
        database: &str,
        container: &str,
        params: &HashMap<String, String>,
    ) -> Result<Vec<PhysicalPartition>, EmulatorError> {
        let lock = || -> Result<Duration, EmulatorError> {
            params.get("lockMs").map_or(Ok(Duration::from_millis(100)), |ms| {
                ms.parse().map(Duration::from_millis).map_err(|_| {
                    EmulatorError::BadRequest(format!("lockMs must be a number of milliseconds (got {ms:?})"))
                })
            })
        };
        match (method, action) {
            (&hyper::Method::GET, "ranges") => self.partitions(database, container).await,
            (&hyper::Method::POST, "containers") => {
                let partition_key = params.get("partitionKey").map_or("/id", String::as_str);
                let partitions = params.get("partitions").map_or("1", String::as_str);
                let spec: ContainerSpec = format!("{database}/{container}:{partition_key}:{partitions}").parse()?;
                let throughput = params
                    .get("throughput")
                    .map(|ru| super::regions::parse_throughput(ru).map_err(EmulatorError::BadRequest))
                    .transpose()?;
                self.create_container_with_throughput(&spec, throughput).await?;
                self.partitions(database, container).await
            }
            (&hyper::Method::POST, "split") => {
                let partition = params.get("partition").map(String::as_str);
                self.split(database, container, partition, lock()?).await
            }
            (&hyper::Method::POST, "merge") => {
                let ids: Vec<&str> = params
                    .get("partitions")
                    .map(|p| p.split(',').map(str::trim).collect())
                    .unwrap_or_default();
                let [first, second] = ids.as_slice() else {
                    return Err(EmulatorError::BadRequest(
                        "partitions must name two adjacent physical partitions, such as partitions=0,1 (see /_emulator/ranges)"
                            .into(),
                    ));
                };
                self.merge(database, container, [first, second], lock()?).await
            }
            _ => Err(EmulatorError::BadRequest(format!(
                "{method} is not a method of /_emulator/{action}"
            ))),
        }
    }

    /// `/_emulator/regions`, `failover` and `region-offline`; `None` for other actions.
    fn region_control(
        &self,
        method: &hyper::Method,
        action: &str,
        params: &HashMap<String, String>,
    ) -> Option<Response> {
        let region = params.get("region").map(String::as_str);
        let names = || {
            self.region_endpoints()
                .into_iter()
                .map(|(name, _)| name)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let result = match (method, action, region) {
            (&hyper::Method::GET, "regions", _) => Ok(self.topology()),
            (_, "failover" | "region-offline", None) => Err(EmulatorError::BadRequest("region is required".into())),
            (&hyper::Method::POST, "failover", Some(region)) => {
                match params.get("windowMs").map_or(Ok(0), |ms| ms.parse::<u64>()) {
                    Ok(ms) => self.fail_over(region, Duration::from_millis(ms)),
                    Err(_) => Err(EmulatorError::BadRequest(
                        "windowMs must be a number of milliseconds".into(),
                    )),
                }
            }
            (&hyper::Method::POST, "region-offline", Some(region)) => self.set_region_offline(region, true),
            (&hyper::Method::DELETE, "region-offline", Some(region)) => self.set_region_offline(region, false),
            _ => return None,
        };
        Some(match result {
            Ok(topology) => crate::http_server::json(200, &serde_json::json!(topology)),
            Err(error) => bad_request(format!("{error} (regions: {})", names())),
        })
    }
}

/// A 400 with `message`.
fn bad_request(message: String) -> Response {
    crate::http_server::json(400, &serde_json::json!({ "message": message }))
}
