//! Precompiled components on disk, so a restarted worker does not recompile.
//!
//! A file is named for the component's digest and for the engine's
//! compatibility hash (wasmtime version and every setting that affects code
//! generation). A changed engine therefore looks for another file name and
//! compiles afresh; it never loads code built for another configuration.
//! Each file carries the SHA-256 of its body, so a torn or corrupted file is
//! recompiled, not loaded.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use wasmtime::Engine;
use wasmtime::component::Component;

const MAGIC: &[u8; 8] = b"RATCHET1";
const HEADER: usize = MAGIC.len() + 32;

/// One engine's view of a cache folder.
#[derive(Debug, Clone)]
pub struct DiskCache {
    dir: PathBuf,
    engine_key: String,
}

impl DiskCache {
    pub fn new(dir: PathBuf, engine: &Engine) -> Self {
        // `DefaultHasher::new()` has fixed keys: the same engine settings
        // give the same name in every process of one build.
        let mut hasher = std::hash::DefaultHasher::new();
        engine.precompile_compatibility_hash().hash(&mut hasher);
        Self {
            dir,
            engine_key: format!("{:016x}", hasher.finish()),
        }
    }

    pub fn path(&self, digest: &str) -> PathBuf {
        self.dir.join(format!("{digest}-{}.cwasm", self.engine_key))
    }

    /// The precompiled component, when a sound file for this engine exists.
    /// Any problem (missing, torn, from another wasmtime) is a miss.
    pub fn load(&self, engine: &Engine, digest: &str) -> Option<Component> {
        let path = self.path(digest);
        let file = std::fs::read(&path).ok()?;
        let body = checked_body(&file)?;
        match deserialize(engine, body) {
            Ok(component) => Some(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring a precompiled component: {e:#}");
                None
            }
        }
    }

    /// Writes the precompiled component atomically (temp file, then rename),
    /// so a concurrent reader sees the old state or the whole new file.
    pub fn store(&self, digest: &str, component: &Component) -> std::io::Result<()> {
        let body = component.serialize().map_err(std::io::Error::other)?;
        std::fs::create_dir_all(&self.dir)?;
        let path = self.path(digest);
        let tmp = self.dir.join(format!(
            ".{digest}-{}.{}.tmp",
            self.engine_key,
            uuid::Uuid::now_v7().simple()
        ));
        let result = write_file(&tmp, &body).and_then(|()| std::fs::rename(&tmp, &path));
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

fn write_file(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::File::create(path)?;
    file.write_all(MAGIC)?;
    file.write_all(&Sha256::digest(body))?;
    file.write_all(body)?;
    file.sync_all()
}

fn checked_body(file: &[u8]) -> Option<&[u8]> {
    if file.len() < HEADER || &file[..MAGIC.len()] != MAGIC {
        return None;
    }
    let (sum, body) = file[MAGIC.len()..].split_at(32);
    (Sha256::digest(body)[..] == *sum).then_some(body)
}

#[allow(unsafe_code)]
fn deserialize(engine: &Engine, body: &[u8]) -> wasmtime::Result<Component> {
    // SAFETY: `Component::deserialize` trusts its input to be the output of
    // `Component::serialize`, as it runs the machine code inside. These bytes
    // are: `store` wrote them from `serialize`, under a name that includes
    // this engine's compatibility hash, into a folder the operator owns (as
    // trusted as the binary itself), and their SHA-256 matched the one
    // written with them, so a torn or corrupted file never gets here.
    // wasmtime also checks its own version and settings in the header.
    unsafe { Component::deserialize(engine, body) }
}
