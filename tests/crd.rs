//! `crds/` holds exactly what `cfp crd` prints, and `docs/reference/` what `cfp crd --markdown` prints.

#[test]
fn the_committed_crd_is_what_cfp_crd_prints() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cfp"))
        .arg("crd")
        .output()
        .expect("run cfp crd");
    assert!(output.status.success());
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/crds/changefeedprocessors.changefeed.io.yaml"
    );
    let committed = std::fs::read_to_string(path).expect("read the committed CRD");
    assert!(
        committed == String::from_utf8_lossy(&output.stdout),
        "crds/ is out of date: run `cargo run -- crd > {path}`"
    );
}

/// `docs/reference/changefeedprocessor.md` holds exactly what `cfp crd --markdown` prints.
#[test]
fn the_committed_field_reference_is_what_cfp_crd_markdown_prints() {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_cfp"))
        .args(["crd", "--markdown"])
        .output()
        .expect("run cfp crd --markdown");
    assert!(output.status.success());
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/changefeedprocessor.md");
    let committed = std::fs::read_to_string(path).expect("read the committed field reference");
    assert!(
        committed == String::from_utf8_lossy(&output.stdout),
        "docs/reference/ is out of date: run `cargo run -- crd --markdown > {path}`"
    );
}
