//! A real Kubernetes control plane for tests: etcd and kube-apiserver (built by
//! `tools/k8s/build.sh` from pinned Go modules, cached) on free loopback ports, with a generated
//! CA, serving certificate and `system:masters` client certificate, and a kubeconfig for `kubectl`
//! and `cfp operator`. One control plane serves the namespaced tests (each isolates itself in a
//! namespace of its own); tests whose cluster-wide objects the others must not meet have one of
//! their own. The processes die with the test binary (parent-death signal).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use changefeed_operator::bench::control_plane::{ApiServer, apiserver_args, etcd_args};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};

use crate::common::free_port;

/// A running control plane.
pub struct ControlPlane {
    /// The kubeconfig file (embedded certificates).
    pub kubeconfig: PathBuf,
    /// Where kube-apiserver, etcd and kubectl are.
    pub bin: PathBuf,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// How long the start took.
    pub startup: Duration,
}

/// A started control plane with its processes, which stop when it is dropped.
pub struct OwnedPlane {
    plane: ControlPlane,
    /// Dropping it ends the keeper thread of the processes, which stops them.
    _stop: mpsc::Sender<()>,
}

impl std::ops::Deref for OwnedPlane {
    type Target = ControlPlane;

    fn deref(&self) -> &ControlPlane {
        &self.plane
    }
}

static NAMESPACED: OnceLock<Result<OwnedPlane, String>> = OnceLock::new();
static HELM: OnceLock<Result<OwnedPlane, String>> = OnceLock::new();

/// The control plane in `cell`, started on first use; it lives as long as the test binary.
fn started_once(cell: &'static OnceLock<Result<OwnedPlane, String>>) -> &'static ControlPlane {
    match cell.get_or_init(start_on_keeper_thread) {
        Ok(plane) => plane,
        Err(error) => panic!("cannot start the test control plane: {error}"),
    }
}

impl ControlPlane {
    /// The control plane of the namespaced tests (each in a namespace of its own), started on
    /// first use.
    pub fn shared() -> &'static ControlPlane {
        started_once(&NAMESPACED)
    }

    /// The control plane of the Helm tests, started on first use: their cluster-wide releases (a
    /// CRD owned by Helm, ClusterRoles, an operator of all namespaces) must not meet the
    /// namespaced tests' resources.
    pub fn for_helm() -> &'static ControlPlane {
        started_once(&HELM)
    }

    /// A control plane of the caller's own, stopped when it is dropped.
    pub fn own() -> OwnedPlane {
        start_on_keeper_thread().unwrap_or_else(|error| panic!("cannot start the test control plane: {error}"))
    }

    /// A client for the control plane.
    pub async fn client(&self) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("client config");
        kube::Client::try_from(config).expect("client")
    }

    /// A kubeconfig that acts as `user` (impersonation, for example
    /// `system:serviceaccount:<ns>:<name>`): a process using it has exactly that user's RBAC.
    pub fn kubeconfig_as(&self, user: &str) -> std::path::PathBuf {
        let text = std::fs::read_to_string(&self.kubeconfig).expect("kubeconfig");
        let impersonating = text.replace("    client-key-data:", &format!("    as: {user}\n    client-key-data:"));
        let path = self
            .kubeconfig
            .with_file_name(format!("kubeconfig-as-{}", user.replace(':', "_")));
        std::fs::write(&path, impersonating).expect("write the kubeconfig");
        path
    }

    /// `kubectl` against the control plane.
    pub fn kubectl(&self) -> Command {
        let mut command = Command::new(self.bin.join("kubectl"));
        command.env("KUBECONFIG", &self.kubeconfig);
        command
    }

    /// Runs kubectl with `args` and `stdin`; returns (success, stdout, stderr).
    pub fn kubectl_run(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        use std::io::Write;
        let mut child = self
            .kubectl()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run kubectl");
        if let (Some(text), Some(mut input)) = (stdin, child.stdin.take()) {
            input.write_all(text.as_bytes()).expect("kubectl stdin");
        }
        drop(child.stdin.take());
        let output = child.wait_with_output().expect("kubectl output");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Waits (bounded) until `kubectl get --raw /readyz` answers ok; fails early when the API
    /// server exits, with the tail of its `log`.
    pub fn wait_ready(&self, apiserver: &mut Child, log: &Path) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let (ok, out, _) = self.kubectl_run(&["get", "--raw", "/readyz"], None);
            if ok && out.trim() == "ok" {
                return Ok(());
            }
            let exited = apiserver.try_wait().ok().flatten();
            if Instant::now() > deadline || exited.is_some() {
                let log = std::fs::read_to_string(log).unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(30).collect();
                return Err(format!(
                    "kube-apiserver not ready (exit: {exited:?}); log tail:\n{}",
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// Starts the processes from a thread that lives until the plane is dropped (or the test binary
/// exits), so that the parent-death signal (which follows the spawning thread) fires no earlier.
fn start_on_keeper_thread() -> Result<OwnedPlane, String> {
    let (started_tx, started_rx) = mpsc::channel();
    let (stop_tx, stop_rx) = mpsc::channel::<()>();
    std::thread::spawn(move || {
        let (plane, mut children, dir) = match start() {
            Ok(started) => started,
            Err(error) => {
                let _ = started_tx.send(Err(error));
                return;
            }
        };
        let _ = started_tx.send(Ok(plane));
        // Nothing is ever sent: this returns when the plane is dropped.
        let _ = stop_rx.recv();
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(dir);
    });
    let plane = started_rx.recv().map_err(|e| e.to_string())??;
    Ok(OwnedPlane { plane, _stop: stop_tx })
}

/// Runs the `helm` of `bin` with `args` (against `kubeconfig` when given; its caches in the temp
/// directory): (success, stdout, stderr).
pub fn helm(bin: &Path, kubeconfig: Option<&Path>, args: &[&str]) -> (bool, String, String) {
    let mut command = Command::new(bin.join("helm"));
    command
        .args(args)
        .env("HELM_CACHE_HOME", std::env::temp_dir().join("cfp-helm-cache"))
        .env("HELM_CONFIG_HOME", std::env::temp_dir().join("cfp-helm-config"))
        .env("HELM_DATA_HOME", std::env::temp_dir().join("cfp-helm-data"));
    if let Some(kubeconfig) = kubeconfig {
        command.env("KUBECONFIG", kubeconfig);
    }
    let output = command.output().expect("run helm");
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// The YAML documents of `text` as JSON values (empty documents skipped).
pub fn yaml_documents(text: &str) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    serde_yaml::Deserializer::from_str(text)
        .filter_map(|doc| serde_json::Value::deserialize(doc).ok())
        .filter(|v| !v.is_null())
        .collect()
}

/// Starts `bin` with `args`, output to `log`, killed when the spawning thread ends.
pub fn spawn(bin: &Path, args: &[String], log: &Path) -> Result<Child, String> {
    let log = std::fs::File::create(log).map_err(|e| e.to_string())?;
    let err = log.try_clone().map_err(|e| e.to_string())?;
    let mut command = Command::new(bin);
    command.args(args).stdout(log).stderr(err).stdin(Stdio::null());
    // SAFETY: prctl is async-signal-safe; it only asks the kernel to kill the child with the parent.
    unsafe {
        command.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
    command.spawn().map_err(|e| format!("{}: {e}", bin.display()))
}

/// Starts etcd on free loopback ports with its data in `dir`; returns it and its client URL.
pub fn start_etcd(bin: &Path, dir: &Path) -> Result<(Child, String), String> {
    let (args, etcd_url) = etcd_args(dir, free_port(), free_port());
    let etcd = spawn(&bin.join("etcd"), &args, &dir.join("etcd.log"))?;
    Ok((etcd, etcd_url))
}

/// The directory of the binaries, built (or found) by the project's script once per test binary.
pub fn binaries() -> Result<&'static Path, String> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(build_binaries).as_deref().map_err(Clone::clone)
}

fn build_binaries() -> Result<PathBuf, String> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/k8s/build.sh");
    let output = Command::new("bash")
        .arg(&script)
        .output()
        .map_err(|e| format!("{}: {e}", script.display()))?;
    if !output.status.success() {
        return Err(format!(
            "{} failed:\n{}",
            script.display(),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let stdout = String::from_utf8_lossy(&output.stdout);
    stdout
        .lines()
        .last()
        .map(PathBuf::from)
        .ok_or_else(|| "build.sh printed no directory".into())
}

/// A test CA with an API server certificate, an admin client certificate and a service account key.
pub struct Pki {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
    pub service_account_key: String,
    pub service_account_public_key: String,
}

/// Where [`Pki::write_to`] put each file.
pub struct PkiFiles {
    pub ca: String,
    pub server_cert: String,
    pub server_key: String,
    pub client_cert: String,
    pub client_key: String,
    pub service_account_key: String,
    pub service_account_public_key: String,
}

impl Pki {
    /// Writes every certificate and key into `dir`.
    pub fn write_to(&self, dir: &Path) -> Result<PkiFiles, String> {
        let write = |name: &str, text: &str| -> Result<String, String> {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| e.to_string())?;
            Ok(path.display().to_string())
        };
        Ok(PkiFiles {
            ca: write("ca.crt", &self.ca)?,
            server_cert: write("server.crt", &self.server_cert)?,
            server_key: write("server.key", &self.server_key)?,
            client_cert: write("admin.crt", &self.client_cert)?,
            client_key: write("admin.key", &self.client_key)?,
            service_account_key: write("sa.key", &self.service_account_key)?,
            service_account_public_key: write("sa.pub", &self.service_account_public_key)?,
        })
    }
}

/// A new PKI whose server certificate is valid for `names` (host names and IP addresses).
pub fn pki(names: &[&str]) -> Result<Pki, rcgen::Error> {
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "cfp-test-ca");
    ca_params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let server_key = KeyPair::generate()?;
    let mut server = CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
    server.distinguished_name.push(DnType::CommonName, "kube-apiserver");
    server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server_cert = server.signed_by(&server_key, &issuer)?;

    let client_key = KeyPair::generate()?;
    let mut client = CertificateParams::new(Vec::<String>::new())?;
    client.distinguished_name.push(DnType::CommonName, "cfp-test-admin");
    client
        .distinguished_name
        .push(DnType::OrganizationName, "system:masters");
    client.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = client.signed_by(&client_key, &issuer)?;
    let service_account = KeyPair::generate()?;

    Ok(Pki {
        ca: ca.pem(),
        server_cert: server_cert.pem(),
        server_key: server_key.serialize_pem(),
        client_cert: client_cert.pem(),
        client_key: client_key.serialize_pem(),
        service_account_key: service_account.serialize_pem(),
        service_account_public_key: service_account.public_key_pem(),
    })
}

/// kube-apiserver's command line on `address:port` serving with the certificates of `files`,
/// trusting its CA for clients, privileged pods allowed, its own files under `dir`.
pub fn apiserver_args_with(
    files: &PkiFiles,
    etcd_url: &str,
    address: &str,
    port: u16,
    dir: &Path,
    service_cluster_ip_range: &str,
) -> Vec<String> {
    let mut args = apiserver_args(&ApiServer {
        etcd_url,
        address,
        port,
        cert_dir: &dir.join("certs"),
        service_cluster_ip_range,
        service_account_key: &files.service_account_key,
        service_account_public_key: &files.service_account_public_key,
    });
    args.extend([
        format!("--tls-cert-file={}", files.server_cert),
        format!("--tls-private-key-file={}", files.server_key),
        format!("--client-ca-file={}", files.ca),
        "--allow-privileged=true".into(),
    ]);
    args
}

/// An admin kubeconfig for `server` (certificates embedded).
pub fn kubeconfig(server: &str, pki: &Pki) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: test\n  cluster:\n    server: {server}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    client-certificate-data: {}\n    client-key-data: {}\ncontexts:\n- name: test\n  context:\n    cluster: test\n    user: admin\n    namespace: default\ncurrent-context: test\n",
        b64(&pki.ca),
        b64(&pki.client_cert),
        b64(&pki.client_key)
    )
}

/// Base64 of `text` (kubeconfig data fields).
pub fn b64(text: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// Starts etcd and kube-apiserver: the plane, its processes and its directory.
fn start() -> Result<(ControlPlane, Vec<Child>, PathBuf), String> {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let started = Instant::now();
    let bin = binaries()?.to_path_buf();
    let dir = std::env::temp_dir().join(format!(
        "cfp-control-plane-{}-{}",
        std::process::id(),
        STARTED.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let pki = pki(&["localhost", "127.0.0.1"]).map_err(|e| e.to_string())?;
    let files = pki.write_to(&dir)?;
    let (etcd, etcd_url) = start_etcd(&bin, &dir)?;
    let api_port = free_port();
    let mut args = apiserver_args_with(&files, &etcd_url, "127.0.0.1", api_port, &dir, "10.0.0.0/24");
    args.push("--disable-admission-plugins=ServiceAccount".into());
    let mut apiserver = spawn(&bin.join("kube-apiserver"), &args, &dir.join("kube-apiserver.log"))?;
    let server = format!("https://127.0.0.1:{api_port}");
    let kubeconfig = kubeconfig(&server, &pki);
    let kubeconfig_path = dir.join("kubeconfig");
    std::fs::write(&kubeconfig_path, kubeconfig).map_err(|e| e.to_string())?;
    let plane = ControlPlane {
        kubeconfig: kubeconfig_path,
        bin,
        server,
        startup: Duration::ZERO,
    };
    plane.wait_ready(&mut apiserver, &dir.join("kube-apiserver.log"))?;
    let plane = ControlPlane {
        startup: started.elapsed(),
        ..plane
    };
    eprintln!("control plane ready at {} in {:.1?}", plane.server, plane.startup);
    Ok((plane, vec![etcd, apiserver], dir))
}
