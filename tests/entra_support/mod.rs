//! An HTTPS Microsoft Entra ID token endpoint for the workload-identity tests, and the tokens it
//! deals in.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use tokio_rustls::rustls;

pub const TENANT: &str = "7a1c2f4e-0000-4000-8000-00000000c0de";
pub const CLIENT_ID: &str = "0b5d6c3a-0000-4000-8000-00000000beef";
pub const FEDERATED_TOKEN: &str = "eyJ-federated-service-account-token-of-the-worker-pod";
pub const ACCESS_TOKEN: &str = "eyJ-entra-access-token-for-cosmos-canary-5f1d";
pub const COSMOS_SCOPE: &str = "https://cosmos.azure.com/.default";

/// What the token endpoint saw: requests answered with a token, and refused ones.
#[derive(Default, Debug, Clone)]
pub struct TokenRequests {
    pub issued: usize,
    pub refused: Vec<String>,
}

/// An HTTPS Entra ID token endpoint (`/{tenant}/oauth2/v2.0/token`, client credentials with a
/// client assertion) with a CA of its own, written to `ca.pem` in `dir`.
pub struct TokenEndpoint {
    address: SocketAddr,
    ca_file: PathBuf,
    seen: Arc<Mutex<TokenRequests>>,
}

impl TokenEndpoint {
    pub async fn start(dir: &Path) -> Self {
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "cfp-test-entra-ca");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca_params, ca_key);
        let server_key = rcgen::KeyPair::generate().unwrap();
        let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&server_key, &issuer)
            .unwrap();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, ca.pem()).unwrap();

        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![server.der().clone()],
                rustls::pki_types::PrivatePkcs8KeyDer::from(server_key.serialize_der()).into(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(TokenRequests::default()));
        let counts = seen.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, counts) = (acceptor.clone(), counts.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else { return };
                    let service = hyper::service::service_fn(move |req| {
                        let counts = counts.clone();
                        async move { Ok::<_, hyper::Error>(token_response(req, &counts).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                        .await;
                });
            }
        });
        Self { address, ca_file, seen }
    }

    pub fn seen(&self) -> TokenRequests {
        self.seen.lock().unwrap().clone()
    }

    /// `cfp emulator` with `container`, accepting only [`ACCESS_TOKEN`] (key auth disabled).
    pub async fn start_emulator(dir: &Path, container: &str) -> (tokio::process::Child, String) {
        let accepted = dir.join("accepted-access-token");
        std::fs::write(&accepted, ACCESS_TOKEN).expect("write the accepted token");
        crate::common::start_emulator_with(&[
            "--port",
            "0",
            "--container",
            container,
            "--entra-token-file",
            &accepted.display().to_string(),
        ])
        .await
    }

    /// Writes the federated token into `dir` and returns the pod environment that uses it.
    pub fn pod_env_in(&self, dir: &Path) -> Vec<(&'static str, String)> {
        let file = dir.join("federated-token");
        std::fs::write(&file, FEDERATED_TOKEN).expect("write the federated token");
        self.pod_env(&file)
    }

    /// The environment workload identity gives a pod, with this endpoint as the authority and
    /// the federated token in `token_file`.
    pub fn pod_env(&self, token_file: &Path) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_CLIENT_ID", CLIENT_ID.to_owned()),
            ("AZURE_TENANT_ID", TENANT.to_owned()),
            ("AZURE_FEDERATED_TOKEN_FILE", token_file.display().to_string()),
            ("AZURE_AUTHORITY_HOST", format!("https://{}/", self.address)),
            ("SSL_CERT_FILE", self.ca_file.display().to_string()),
        ]
    }
}

/// An account served on loopback by the test process, as `cfp emulator --entra-token-file` serves
/// it: over HTTP it accepts only [`ACCESS_TOKEN`] (key auth disabled, database and container
/// writes refused as by the service), so its containers are provisioned at start. The test reads
/// it through [`EntraAccount::account`], in-process and unchecked, as an administrator would.
pub struct EntraAccount {
    /// The endpoint the operator and workers use (token-only).
    pub endpoint: String,
    /// An in-process client of the same account, for the test's own reads.
    pub account: changefeed_operator::cosmos::CosmosAccount,
    stop: tokio_util::sync::CancellationToken,
}

impl EntraAccount {
    /// Serves an account with `containers` (`database/container[:/pk[:partitions]]`).
    pub async fn serve(containers: &[&str]) -> Self {
        let specs: Vec<changefeed_operator::emulator::ContainerSpec> =
            containers.iter().map(|spec| spec.parse().unwrap()).collect();
        let (emulator, listener) = changefeed_operator::emulator::bind(([127, 0, 0, 1], 0).into(), &specs)
            .await
            .unwrap();
        let emulator = emulator.require_entra_token(ACCESS_TOKEN);
        let account = emulator.account().await.unwrap();
        let stop = tokio_util::sync::CancellationToken::new();
        let endpoint = emulator.endpoint();
        let serving = stop.clone();
        tokio::spawn(async move { emulator.serve(listener, serving).await });
        crate::common::allow_emulator(&endpoint);
        Self {
            endpoint,
            account,
            stop,
        }
    }
}

impl Drop for EntraAccount {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Entra ID's answer: a token for a well-formed client-assertion request of our app, tenant and
/// the Cosmos DB scope; `invalid_client` otherwise.
async fn token_response(
    req: hyper::Request<hyper::body::Incoming>,
    seen: &Mutex<TokenRequests>,
) -> hyper::Response<Full<Bytes>> {
    let path = req.uri().path().to_owned();
    let body = crate::common::body_of(req).await;
    let form: std::collections::HashMap<String, String> = url::form_urlencoded::parse(&body).into_owned().collect();
    let field = |name: &str| form.get(name).map(String::as_str).unwrap_or_default();
    let problem = if path != format!("/{TENANT}/oauth2/v2.0/token") {
        Some(format!("unknown path {path}"))
    } else if field("grant_type") != "client_credentials"
        || field("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"
    {
        Some("not a client-assertion request".to_owned())
    } else if field("client_id") != CLIENT_ID || field("scope") != COSMOS_SCOPE {
        Some(format!("client {} scope {}", field("client_id"), field("scope")))
    } else if field("client_assertion") != FEDERATED_TOKEN {
        Some("AADSTS700213: No matching federated identity record found for presented assertion".to_owned())
    } else {
        None
    };
    let mut seen = seen.lock().unwrap();
    let (status, body) = match problem {
        None => {
            seen.issued += 1;
            (
                200,
                serde_json::json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": ACCESS_TOKEN}),
            )
        }
        Some(problem) => {
            seen.refused.push(problem.clone());
            (
                400,
                serde_json::json!({"error": "invalid_client", "error_description": problem}),
            )
        }
    };
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap()
}
