//! Builds the Python stage in `plugins/python/` with componentize-py (from
//! PyPI; `.ci/run` installs it) and hands its path to the tests as
//! `RATCHET_PYTHON_HEADLINE`. Without the tool the path is empty and the
//! Python test says how to install it (and fails under `CI=true`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let app = root.join("plugins/python/headline");
    let wit = root.join("plugin-sdk/wit");
    println!("cargo::rerun-if-changed={}", app.join("app.py").display());
    println!(
        "cargo::rerun-if-changed={}",
        wit.join("stage.wit").display()
    );
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("headline.wasm");
    let built = Command::new("componentize-py")
        .arg("-d")
        .arg(&wit)
        .args(["-w", "stage", "componentize", "app", "-p"])
        .arg(&app)
        .arg("-o")
        .arg(&out)
        .output();
    let path = match built {
        Ok(o) if o.status.success() => out.display().to_string(),
        Ok(o) => panic!(
            "componentize-py failed to build plugins/python/headline:\n{}",
            String::from_utf8_lossy(&o.stderr)
        ),
        Err(e) => {
            println!(
                "cargo::warning=componentize-py not found ({e}); the Python stage test will be skipped (pip install componentize-py==0.25.1)"
            );
            String::new()
        }
    };
    println!("cargo::rustc-env=RATCHET_PYTHON_HEADLINE={path}");
}
