//! `plugin add` on core modules wasm-smith generates, each wrapped as a
//! component that embeds and instantiates it (wasm-smith's own component
//! generator is unfinished, and wasm-mutate refuses components). Each one
//! compiles; none implements the `stage` world, so each must be refused, in
//! one clear line.
#![no_main]

use std::sync::LazyLock;

use libfuzzer_sys::fuzz_target;
use ratchet_fuzz::Admission;
use wasm_encoder::{Component, ComponentSectionId, InstanceSection, ModuleArg, RawSection};

static ADMISSION: LazyLock<Admission> = LazyLock::new(Admission::new);

fuzz_target!(|data: &[u8]| {
    let mut u = arbitrary::Unstructured::new(data);
    let Ok(mut config) = u.arbitrary::<wasm_smith::Config>() else {
        return;
    };
    // An import would need an argument to instantiate with.
    config.max_imports = 0;
    let Ok(module) = wasm_smith::Module::new(config, &mut u) else {
        return;
    };
    let mut component = Component::new();
    component.section(&RawSection {
        id: ComponentSectionId::CoreModule as u8,
        data: &module.to_bytes(),
    });
    let mut instances = InstanceSection::new();
    instances.instantiate(0, Vec::<(&str, ModuleArg)>::new());
    component.section(&instances);
    ADMISSION.check(&component.finish());
});
