//! A throwaway Kubernetes control plane for the operator's figure: etcd and kube-apiserver (the
//! binaries `tools/k8s/build.sh` builds) on free loopback ports, their data in a temporary
//! directory. The API server makes its own serving certificate and authenticates one random
//! bearer token as `system:masters`; the kubeconfig trusts that certificate. Everything stops
//! (and the directory goes) when the [`ControlPlane`] is dropped. The etcd and kube-apiserver
//! command lines are shared with the test suite's control planes.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine;
use tokio::process::Command;

use super::BenchError;
use super::processes::{Owned, free_port};

/// How long etcd and the API server may take to answer.
const STARTUP: Duration = Duration::from_secs(120);

/// A running etcd + kube-apiserver.
pub struct ControlPlane {
    /// The admin kubeconfig (bearer token, the API server's own certificate as the CA).
    pub kubeconfig: PathBuf,
    /// A client for it.
    pub client: kube::Client,
    // Dropped in this order: the processes, then their files.
    _apiserver: Owned,
    _etcd: Owned,
    _dir: RemovedOnDrop,
}

/// A directory removed (with everything in it) when dropped.
struct RemovedOnDrop(PathBuf);

/// The cluster IPs of Services: room for a metrics Service per resource at 500 resources (a /24
/// holds only 254).
const SERVICE_RANGE: &str = "10.0.0.0/16";

impl Drop for RemovedOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `dir/etcd` and `dir/kube-apiserver` exist: the directory can run a control plane.
pub fn has_binaries(dir: &Path) -> bool {
    ["etcd", "kube-apiserver"].iter().all(|name| dir.join(name).is_file())
}

impl ControlPlane {
    /// Starts etcd and kube-apiserver from `bin`; returns once the API server is ready.
    pub async fn start(bin: &Path) -> Result<Self, BenchError> {
        let dir = std::env::temp_dir().join(format!("cfp-bench-control-plane-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("certs")).map_err(|e| format!("{}: {e}", dir.display()))?;
        let guard = RemovedOnDrop(dir.clone());
        let write = |name: &str, text: &str| -> Result<String, BenchError> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
            Ok(path.display().to_string())
        };
        let token = format!("{:016x}{:016x}", fastrand::u64(..), fastrand::u64(..));
        let tokens = write(
            "tokens.csv",
            &format!("{token},cfp-bench,cfp-bench,\"system:masters\"\n"),
        )?;
        let signing = rcgen::KeyPair::generate().map_err(|e| format!("service-account key: {e}"))?;
        let signing_key = write("service-account.key", &signing.serialize_pem())?;
        let verifying_key = write("service-account.pub", &signing.public_key_pem())?;

        let (etcd_port, peer_port, api_port) = (free_port()?, free_port()?, free_port()?);
        let (etcd_args, etcd_url) = etcd_args(&dir, etcd_port, peer_port);
        let etcd = spawn(&bin.join("etcd"), &etcd_args, &dir.join("etcd.log"))?;
        let mut apiserver_args = apiserver_args(&ApiServer {
            etcd_url: &etcd_url,
            address: "127.0.0.1",
            port: api_port,
            cert_dir: &dir.join("certs"),
            service_cluster_ip_range: SERVICE_RANGE,
            service_account_key: &signing_key,
            service_account_public_key: &verifying_key,
        });
        apiserver_args.extend([
            format!("--token-auth-file={tokens}"),
            "--disable-admission-plugins=ServiceAccount".into(),
        ]);
        let mut apiserver = spawn(
            &bin.join("kube-apiserver"),
            &apiserver_args,
            &dir.join("kube-apiserver.log"),
        )?;
        let log_tail = || {
            let log = std::fs::read_to_string(dir.join("kube-apiserver.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(5).collect();
            tail.into_iter().rev().collect::<Vec<_>>().join(" | ")
        };
        // The API server writes its self-signed certificate before it serves.
        let certificate = dir.join("certs/apiserver.crt");
        let server = format!("https://127.0.0.1:{api_port}");
        let deadline = Instant::now() + STARTUP;
        let ca = loop {
            if let Some(status) = apiserver.0.try_wait()? {
                return Err(format!("kube-apiserver exited ({status}): {}", log_tail()).into());
            }
            if Instant::now() > deadline {
                return Err(format!("kube-apiserver not ready in {STARTUP:?}: {}", log_tail()).into());
            }
            if let Ok(ca) = std::fs::read_to_string(&certificate)
                && is_ready(&server, &ca, &token).await
            {
                break ca;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let config = kubeconfig(&server, &ca, &token);
        let kubeconfig = PathBuf::from(write("kubeconfig", &config)?);
        let parsed = kube::config::Kubeconfig::from_yaml(&config).map_err(|e| format!("kubeconfig: {e}"))?;
        let config = kube::Config::from_custom_kubeconfig(parsed, &Default::default())
            .await
            .map_err(|e| format!("kubeconfig: {e}"))?;
        let client = kube::Client::try_from(config).map_err(|e| format!("API client: {e}"))?;
        Ok(Self {
            kubeconfig,
            client,
            _apiserver: apiserver,
            _etcd: etcd,
            _dir: guard,
        })
    }
}

/// etcd's command line: one member on loopback `client_port` and `peer_port`, its data in
/// `dir/etcd`, without fsync (a throwaway store); and its client URL.
pub fn etcd_args(dir: &Path, client_port: u16, peer_port: u16) -> (Vec<String>, String) {
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let args = vec![
        format!("--data-dir={}", dir.join("etcd").display()),
        format!("--listen-client-urls={client_url}"),
        format!("--advertise-client-urls={client_url}"),
        format!("--listen-peer-urls={peer_url}"),
        format!("--initial-advertise-peer-urls={peer_url}"),
        format!("--initial-cluster=default={peer_url}"),
        "--unsafe-no-fsync=true".into(),
        "--log-level=warn".into(),
    ];
    (args, client_url)
}

/// What a kube-apiserver command line needs.
pub struct ApiServer<'a> {
    /// etcd's client URL.
    pub etcd_url: &'a str,
    /// The address it binds and advertises.
    pub address: &'a str,
    /// Its HTTPS port.
    pub port: u16,
    /// Where it keeps (or makes) its serving certificate.
    pub cert_dir: &'a Path,
    /// The Services' cluster IP range.
    pub service_cluster_ip_range: &'a str,
    /// The PEM file of the key that signs service-account tokens.
    pub service_account_key: &'a str,
    /// The PEM file of its public key.
    pub service_account_public_key: &'a str,
}

/// kube-apiserver's command line with RBAC and service-account tokens; callers add how clients
/// authenticate (and anything else they need).
pub fn apiserver_args(server: &ApiServer) -> Vec<String> {
    vec![
        format!("--etcd-servers={}", server.etcd_url),
        format!("--secure-port={}", server.port),
        format!("--bind-address={}", server.address),
        format!("--advertise-address={}", server.address),
        format!("--cert-dir={}", server.cert_dir.display()),
        format!("--service-cluster-ip-range={}", server.service_cluster_ip_range),
        "--authorization-mode=RBAC".into(),
        format!("--service-account-key-file={}", server.service_account_public_key),
        format!("--service-account-signing-key-file={}", server.service_account_key),
        "--service-account-issuer=https://kubernetes.default.svc".into(),
        "--v=0".into(),
    ]
}

/// An admin kubeconfig for `server`, trusting `ca` (PEM), authenticating with `token`.
fn kubeconfig(server: &str, ca: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: bench\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: bench\n  user:\n    token: {token}\ncontexts:\n- name: bench\n  context:\n    cluster: bench\n    user: bench\ncurrent-context: bench\n"
    )
}

/// `server` answers `/readyz` with ok (trusting `ca`, authenticated by `token`).
async fn is_ready(server: &str, ca: &str, token: &str) -> bool {
    let Ok(certificates) = reqwest::Certificate::from_pem_bundle(ca.as_bytes()) else {
        return false;
    };
    let Ok(http) = reqwest::Client::builder().tls_certs_only(certificates).build() else {
        return false;
    };
    let answer = http.get(format!("{server}/readyz")).bearer_auth(token).send().await;
    match answer {
        Ok(answer) if answer.status().is_success() => answer.text().await.is_ok_and(|t| t.trim() == "ok"),
        _ => false,
    }
}

/// Starts `bin` with `args`, its output into `log`; killed with the benchmark (also when the
/// benchmark itself is killed: parent-death signal).
fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Owned, BenchError> {
    let out = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let err = out.try_clone()?;
    let mut command = Command::new(bin);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe; it only asks the kernel to kill the child with us.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    command
        .spawn()
        .map(Owned)
        .map_err(|e| BenchError::from(format!("starting {}: {e}", bin.display())))
}
