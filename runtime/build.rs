//! Compiles the stage plugins in `plugins/` to wasm32-wasip2 components and
//! leaves them in `$OUT_DIR/plugins` (the demo embeds them; tests load them).
//! Installs the wasm32-wasip2 target through rustup when it is missing.

use std::path::{Path, PathBuf};
use std::process::{Command, exit};

const TARGET: &str = "wasm32-wasip2";

fn main() {
    let manifest_dir = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("runtime/ has a parent")
        .to_path_buf();
    let plugins = root.join("plugins");
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("set by cargo")).join("plugins");

    for entry in std::fs::read_dir(&plugins)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", plugins.display())))
    {
        let path = entry.map(|e| e.path()).unwrap_or_default();
        if path.file_name().is_some_and(|n| n != "target") {
            println!("cargo::rerun-if-changed={}", path.display());
        }
    }
    for sdk in ["src", "wit", "Cargo.toml"] {
        println!(
            "cargo::rerun-if-changed={}",
            root.join("plugin-sdk").join(sdk).display()
        );
    }

    ensure_target();
    let target_dir = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"))
        .join("wasm-plugins");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build
        .current_dir(&plugins)
        .args(["build", "--release", "--target", TARGET, "--target-dir"])
        .arg(&target_dir);
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "RUSTC",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        build.env_remove(var);
    }
    let status = build
        .status()
        .unwrap_or_else(|e| fail(&format!("cannot run cargo: {e}")));
    if !status.success() {
        fail("building the stage plugins in plugins/ failed (see the cargo output above)");
    }

    std::fs::create_dir_all(&out)
        .unwrap_or_else(|e| fail(&format!("cannot create {}: {e}", out.display())));
    let built = target_dir.join(TARGET).join("release");
    for entry in std::fs::read_dir(&built)
        .unwrap_or_else(|e| fail(&format!("cannot read {}: {e}", built.display())))
    {
        let path = entry.map(|e| e.path()).unwrap_or_default();
        if path.extension().is_some_and(|e| e == "wasm") {
            let dest = out.join(path.file_name().expect("a file"));
            std::fs::copy(&path, &dest)
                .unwrap_or_else(|e| fail(&format!("cannot copy {}: {e}", path.display())));
        }
    }
}

/// Makes sure the toolchain can build for wasm32-wasip2, installing the
/// target with rustup when it is missing.
fn ensure_target() {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    let sysroot = Command::new(&rustc)
        .args(["--print", "sysroot"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    let installed = |root: &Path| root.join("lib/rustlib").join(TARGET).exists();
    if sysroot.as_deref().is_some_and(installed) {
        return;
    }
    println!("cargo::warning=installing the {TARGET} target with `rustup target add {TARGET}`");
    let ok = Command::new("rustup")
        .args(["target", "add", TARGET])
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        fail(&format!(
            "the {TARGET} target is missing and rustup could not install it; run `rustup target add {TARGET}` and build again"
        ));
    }
}

fn fail(message: &str) -> ! {
    eprintln!("error: {message}");
    println!("cargo::error={message}");
    exit(1)
}
