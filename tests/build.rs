//! Builds the Python stage in `plugins/python/` with componentize-py (from
//! PyPI; `.ci/run` installs it) and hands its path to the tests as
//! `RATCHET_PYTHON_HEADLINE`. Without the tool the path is empty and the
//! Python test says how to install it (and fails under `CI=true`).
//!
//! Builds the Python fetch stage (`plugins/python/fetch`, the research
//! example's fetch over `wasi:http`) the same way as `RATCHET_PYTHON_FETCH`;
//! its world adds WASI's HTTP, whose WIT comes from the wasmtime-wasi-http
//! crate in cargo's registry (or `RATCHET_WASI_WIT`).
//!
//! Builds the JavaScript stage in `plugins/javascript/` the same way with
//! componentize-js (from npm; `.ci/run` installs it with `npm ci --prefix
//! tests/js`) as `RATCHET_JS_HEADLINE`.
//!
//! Also builds, from WAT with wit-component, a hostile component Rust will
//! not emit: one with two linear memories (`RATCHET_TWO_MEMORIES`).

use std::path::PathBuf;
use std::process::Command;

fn main() {
    // Read when the script runs, not when it was compiled: a script built
    // in another checkout sharing this target dir must not build that
    // checkout's files (it did, and failed once that checkout was gone).
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = PathBuf::from(manifest).join("..");
    let app = root.join("plugins/python/headline");
    let wit = root.join("plugin-sdk/wit");
    println!("cargo::rerun-if-changed={}", app.join("app.py").display());
    println!(
        "cargo::rerun-if-changed={}",
        wit.join("stage.wit").display()
    );
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("headline.wasm");
    let path = componentize_py(&wit, "stage", &app, &out).unwrap_or_else(|e| {
        println!(
            "cargo::warning=componentize-py not found ({e}); the Python stage test will be skipped (pip install componentize-py==0.25.1)"
        );
        String::new()
    });
    println!("cargo::rustc-env=RATCHET_PYTHON_HEADLINE={path}");
    python_fetch(&root, &wit, !path.is_empty());
    javascript(&root, &wit);
    two_memories(&wit);
}

/// Builds the Python app in `app` against `world` of the WIT in `wit`
/// into `out` and returns its path; the error when componentize-py cannot
/// be run. A failed build panics with componentize-py's output.
fn componentize_py(
    wit: &std::path::Path,
    world: &str,
    app: &std::path::Path,
    out: &std::path::Path,
) -> std::io::Result<String> {
    let built = Command::new("componentize-py")
        .arg("-d")
        .arg(wit)
        .args(["-w", world, "componentize", "app", "-p"])
        .arg(app)
        .arg("-o")
        .arg(out)
        .output()?;
    if !built.status.success() {
        panic!(
            "componentize-py failed to build {}:\n{}",
            app.display(),
            String::from_utf8_lossy(&built.stderr)
        );
    }
    Ok(out.display().to_string())
}

/// The wasmtime-wasi-http the runtime links (keep in step with the
/// workspace's `wasmtime-wasi-http` pin): its `wit/deps` is WASI's WIT at
/// the version the host serves.
const WASMTIME_WASI_HTTP: &str = "wasmtime-wasi-http-48.0.8";

/// WASI's WIT packages, one `.wit` file each: `RATCHET_WASI_WIT`, or the
/// wasmtime-wasi-http crate's in cargo's registry.
fn wasi_wit() -> Option<PathBuf> {
    println!("cargo::rerun-if-env-changed=RATCHET_WASI_WIT");
    if let Some(dir) = std::env::var_os("RATCHET_WASI_WIT") {
        return Some(dir.into());
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))?;
    std::fs::read_dir(home.join("registry/src"))
        .ok()?
        .flatten()
        .map(|index| index.path().join(WASMTIME_WASI_HTTP).join("wit/deps"))
        .find(|deps| deps.is_dir())
}

/// `plugins/python/fetch`: its world (`wit/world.wit`) with the stage
/// contract and WASI's WIT put beside it in a `deps/` folder.
fn python_fetch(root: &std::path::Path, wit: &std::path::Path, tool: bool) {
    let app = root.join("plugins/python/fetch");
    println!("cargo::rerun-if-changed={}", app.join("app.py").display());
    println!(
        "cargo::rerun-if-changed={}",
        app.join("wit/world.wit").display()
    );
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let path = match (tool, wasi_wit()) {
        (false, _) => String::new(),
        (true, None) => {
            println!(
                "cargo::warning=WASI's WIT not found ({WASMTIME_WASI_HTTP} in cargo's registry); the Python fetch test will be skipped (set RATCHET_WASI_WIT to its wit/deps)"
            );
            String::new()
        }
        (true, Some(wasi)) => {
            let world = out_dir.join("python-fetch-wit");
            let deps = world.join("deps");
            let _ = std::fs::remove_dir_all(&world);
            std::fs::create_dir_all(&deps).expect("create the world's folder");
            let copy = |from: &std::path::Path, to: PathBuf| {
                std::fs::copy(from, &to).unwrap_or_else(|e| {
                    panic!("copying {} to {}: {e}", from.display(), to.display())
                });
            };
            copy(&app.join("wit/world.wit"), world.join("world.wit"));
            copy(&wit.join("stage.wit"), deps.join("ratchet-stage.wit"));
            for file in std::fs::read_dir(&wasi).expect("WASI's WIT").flatten() {
                copy(&file.path(), deps.join(file.file_name()));
            }
            let out = out_dir.join("research-fetch-py.wasm");
            componentize_py(&world, "stage-http", &app, &out)
                .unwrap_or_else(|e| panic!("cannot run componentize-py: {e}"))
        }
    };
    println!("cargo::rustc-env=RATCHET_PYTHON_FETCH={path}");
}

/// `plugins/javascript/headline` with the componentize-js that `npm ci
/// --prefix tests/js` installed. Its fetch and HTTP features are left out:
/// the stage imports only Ratchet's contract and WASI 0.2's basics.
fn javascript(root: &std::path::Path, wit: &std::path::Path) {
    let stage = root.join("plugins/javascript/headline/stage.js");
    let tool = root.join("tests/js/node_modules/.bin/componentize-js");
    println!("cargo::rerun-if-changed={}", stage.display());
    // npm writes this file on every install: a later `npm ci` builds anew.
    println!(
        "cargo::rerun-if-changed={}",
        root.join("tests/js/node_modules/.package-lock.json")
            .display()
    );
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("headline-js.wasm");
    let path = if tool.exists() {
        let built = Command::new("node")
            .arg(&tool)
            .arg(&stage)
            .arg("--wit")
            .arg(wit)
            .args(["--world-name", "stage", "-d", "http", "fetch-event", "-o"])
            .arg(&out)
            .output()
            .unwrap_or_else(|e| panic!("cannot run node for componentize-js: {e}"));
        if !built.status.success() {
            panic!(
                "componentize-js failed to build plugins/javascript/headline:\n{}{}",
                String::from_utf8_lossy(&built.stdout),
                String::from_utf8_lossy(&built.stderr)
            );
        }
        out.display().to_string()
    } else {
        println!(
            "cargo::warning=componentize-js not installed; the JavaScript stage test will be skipped (npm ci --prefix tests/js)"
        );
        String::new()
    };
    println!("cargo::rustc-env=RATCHET_JS_HEADLINE={path}");
}

/// A stage whose core module defines two linear memories and whose `run`
/// grows each to 12 MiB, under a manifest limit of 16 MiB: each memory stays
/// under the limit, both together do not.
fn two_memories(wit: &std::path::Path) {
    const MANIFEST: &str = "name = \"two-memories\"\nversion = \"1.0.0\"\n\
        description = \"Hostile test component: two memories, each under the limit, together over it.\"\n\
        outputs = [\"out\"]\n\n[limits]\nmemory_mb = 16\n";
    let escaped: String = MANIFEST
        .bytes()
        .map(|b| match b {
            b'"' | b'\\' | b'\n' => format!("\\{b:02x}"),
            _ => char::from(b).to_string(),
        })
        .collect();
    let wat = format!(
        r#"(module
            (memory $main (export "memory") 2)
            (memory $second 1)
            (global $bump (mut i32) (i32.const 4096))
            (data (memory $main) (i32.const 16) "{escaped}")
            (func (export "cabi_realloc") (param i32 i32 i32 i32) (result i32)
                (local $p i32)
                (local.set $p (i32.and
                    (i32.add (global.get $bump) (i32.sub (local.get 2) (i32.const 1)))
                    (i32.sub (i32.const 0) (local.get 2))))
                (global.set $bump (i32.add (local.get $p) (local.get 3)))
                (local.get $p))
            (func (export "describe") (result i32)
                (i32.store $main (i32.const 0) (i32.const 16))
                (i32.store $main (i32.const 4) (i32.const {len}))
                (i32.const 0))
            (func (export "run") (param i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)
                (drop (memory.grow $second (i32.const 192)))
                (drop (memory.grow $main (i32.const 192)))
                unreachable))"#,
        len = MANIFEST.len()
    );
    let mut module = wat::parse_str(&wat).unwrap_or_else(|e| panic!("two-memories WAT: {e}"));
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve
        .push_dir(wit)
        .unwrap_or_else(|e| panic!("plugin-sdk/wit: {e:#}"));
    let world = resolve
        .select_world(&[package], Some("stage"))
        .unwrap_or_else(|e| panic!("the stage world: {e:#}"));
    wit_component::embed_component_metadata(
        &mut module,
        &resolve,
        world,
        wit_component::StringEncoding::UTF8,
        false,
    )
    .unwrap_or_else(|e| panic!("embedding the stage world: {e:#}"));
    let component = wit_component::ComponentEncoder::default()
        .module(&module)
        .and_then(|encoder| encoder.validate(true).encode())
        .unwrap_or_else(|e| panic!("encoding the two-memories component: {e:#}"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR")).join("two_memories.wasm");
    std::fs::write(&out, component).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    println!("cargo::rustc-env=RATCHET_TWO_MEMORIES={}", out.display());
}
