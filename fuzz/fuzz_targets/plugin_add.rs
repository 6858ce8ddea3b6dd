//! `plugin add` on byte-level mutations of the real plugins: each input
//! names a bundled component and a few edits (insert, delete or replace a
//! byte at an offset), so libFuzzer mutates small edit lists, not megabytes.
//! Admitted, or refused in one clear line.
#![no_main]

use std::sync::LazyLock;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ratchet_fuzz::Admission;
use ratchet_runtime::bundled::{BENCH_PLUGINS, PLUGINS};

#[derive(Debug, Arbitrary)]
struct Mutation {
    plugin: u8,
    edits: Vec<Edit>,
}

#[derive(Debug, Arbitrary)]
enum Edit {
    Insert(u32, u8),
    Delete(u32),
    Replace(u32, u8),
}

static ADMISSION: LazyLock<Admission> = LazyLock::new(Admission::new);

fuzz_target!(|m: Mutation| {
    let real: Vec<&[u8]> = PLUGINS
        .iter()
        .chain(&BENCH_PLUGINS)
        .map(|(_, bytes)| *bytes)
        .collect();
    let mut bytes = real[usize::from(m.plugin) % real.len()].to_vec();
    for edit in m.edits.iter().take(16) {
        let at = |offset: u32| offset as usize % bytes.len().max(1);
        match *edit {
            Edit::Insert(offset, byte) => {
                let at = at(offset);
                bytes.insert(at.min(bytes.len()), byte);
            }
            Edit::Delete(offset) if !bytes.is_empty() => {
                let at = at(offset);
                bytes.remove(at);
            }
            Edit::Replace(offset, byte) if !bytes.is_empty() => {
                let at = at(offset);
                bytes[at] = byte;
            }
            _ => {}
        }
    }
    ADMISSION.check(&bytes);
});
