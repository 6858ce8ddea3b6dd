//! The plugin contracts the host serves, each with its own bindings:
//! `ratchet:stage@0.1.0` (frozen) and `@0.2.0` (chat models, structured
//! output). A component runs under the contract its imports name; both
//! reach the same capabilities (`host/`), which speak neither version's
//! types.

use wasmtime::Store as WasmStore;
use wasmtime::component::{HasSelf, InstancePre, Linker};

use super::{HostState, Invocation, Payload, Proposal, StageFailure};

pub(super) mod v0_1 {
    wasmtime::component::bindgen!({
        world: "stage",
        path: "../plugin-sdk/wit-0.1.0",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

pub(super) mod v0_2 {
    wasmtime::component::bindgen!({
        world: "stage",
        path: "../plugin-sdk/wit",
        imports: { default: async | trappable },
        exports: { default: async },
    });
}

/// A version of the plugin contract (`ratchet:stage@VERSION`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Contract {
    V0_1,
    V0_2,
}

impl Contract {
    /// Every contract the host serves, oldest first.
    pub const ALL: [Contract; 2] = [Contract::V0_1, Contract::V0_2];
    /// The one new stages are built against.
    pub const LATEST: Contract = Contract::V0_2;

    pub fn version(self) -> &'static str {
        match self {
            Contract::V0_1 => "0.1.0",
            Contract::V0_2 => "0.2.0",
        }
    }

    /// The contract a component speaks: the one version of `ratchet:stage`
    /// its imports name, the latest when they name none. The error says
    /// which import is at fault.
    pub fn of(imports: &[String]) -> Result<Contract, String> {
        let mut found: Option<(Contract, &str)> = None;
        for import in imports {
            let Some(rest) = import.strip_prefix("ratchet:stage/") else {
                continue;
            };
            let version = rest.split_once('@').map_or("", |(_, v)| v);
            let Some(contract) = Self::ALL.into_iter().find(|c| c.version() == version) else {
                return Err(format!(
                    "the component imports `{import}`, a version of Ratchet's contract this host does not serve (served: {}); rebuild it against plugin-sdk/wit",
                    Self::served()
                ));
            };
            match found {
                Some((other, first)) if other != contract => {
                    return Err(format!(
                        "the component imports both `{first}` and `{import}`; build it against one version of Ratchet's contract"
                    ));
                }
                _ => found = Some((contract, import)),
            }
        }
        Ok(found.map_or(Self::LATEST, |(c, _)| c))
    }

    /// `0.1.0, 0.2.0`
    pub fn served() -> String {
        Self::ALL.map(Contract::version).join(", ")
    }
}

impl std::fmt::Display for Contract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ratchet:stage@{}", self.version())
    }
}

/// Links the imports of every contract (WASI is linked by the caller).
pub(super) fn add_to_linker(linker: &mut Linker<HostState>) -> wasmtime::Result<()> {
    v0_1::Stage::add_to_linker::<_, HasSelf<_>>(linker, |s| s)?;
    v0_2::Stage::add_to_linker::<_, HasSelf<_>>(linker, |s| s)
}

/// A component linked and checked against its contract's world.
pub(super) enum StagePre {
    V0_1(v0_1::StagePre<HostState>),
    V0_2(v0_2::StagePre<HostState>),
}

/// One body for both contracts' exports: their types differ only in name.
macro_rules! run_stage {
    ($v:ident, $pre:expr, $store:expr, $inv:expr, $inputs:expr) => {{
        use $v::ratchet::stage::types::{Artifact, StageContext, StageError};
        let ctx = StageContext {
            run_id: $inv.run_id.clone(),
            stage: $inv.stage.clone(),
            attempt: $inv.attempt.clamp(0, i64::from(u32::MAX)) as u32,
            idempotency_key: $inv.idempotency_key.clone(),
        };
        let inputs: Vec<Artifact> = $inputs
            .into_iter()
            .map(|p| Artifact {
                name: p.name,
                media_type: p.media_type,
                bytes: p.bytes,
            })
            .collect();
        let instance = $pre.instantiate_async(&mut *$store).await?;
        Ok(
            match instance.call_run(&mut *$store, &ctx, &inputs).await? {
                Ok(outputs) => Ok(outputs
                    .into_iter()
                    .map(|a| Proposal {
                        name: a.name,
                        media_type: a.media_type,
                        bytes: a.bytes,
                    })
                    .collect()),
                Err(StageError::Retryable(m)) => Err(StageFailure::Retryable(m)),
                Err(StageError::Fatal(m)) => Err(StageFailure::Fatal(m)),
            },
        )
    }};
}

impl StagePre {
    pub fn new(contract: Contract, pre: InstancePre<HostState>) -> wasmtime::Result<Self> {
        Ok(match contract {
            Contract::V0_1 => Self::V0_1(v0_1::StagePre::new(pre)?),
            Contract::V0_2 => Self::V0_2(v0_2::StagePre::new(pre)?),
        })
    }

    pub fn contract(&self) -> Contract {
        match self {
            Self::V0_1(_) => Contract::V0_1,
            Self::V0_2(_) => Contract::V0_2,
        }
    }

    /// A fresh instance's `describe`.
    pub async fn describe(&self, store: &mut WasmStore<HostState>) -> wasmtime::Result<String> {
        match self {
            Self::V0_1(pre) => {
                let instance = pre.instantiate_async(&mut *store).await?;
                instance.call_describe(store).await
            }
            Self::V0_2(pre) => {
                let instance = pre.instantiate_async(&mut *store).await?;
                instance.call_describe(store).await
            }
        }
    }

    /// A fresh instance's `run`: a trap is the outer error, the stage's own
    /// failure the inner one.
    pub async fn run(
        &self,
        store: &mut WasmStore<HostState>,
        inv: &Invocation,
        inputs: Vec<Payload>,
    ) -> wasmtime::Result<Result<Vec<Proposal>, StageFailure>> {
        match self {
            Self::V0_1(pre) => run_stage!(v0_1, pre, store, inv, inputs),
            Self::V0_2(pre) => run_stage!(v0_2, pre, store, inv, inputs),
        }
    }
}

impl v0_1::ratchet::stage::types::Host for HostState {}
impl v0_2::ratchet::stage::types::Host for HostState {}

#[cfg(test)]
mod tests {
    use super::*;

    fn imports(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    /// Seen failing with the version read from the first import only.
    #[test]
    fn a_component_speaks_the_version_of_its_imports() {
        let v01 = imports(&["wasi:io/streams@0.2.6", "ratchet:stage/types@0.1.0"]);
        assert_eq!(Contract::of(&v01), Ok(Contract::V0_1));
        let v02 = imports(&["ratchet:stage/types@0.2.0", "ratchet:stage/model@0.2.0"]);
        assert_eq!(Contract::of(&v02), Ok(Contract::V0_2));
        assert_eq!(Contract::of(&[]), Ok(Contract::LATEST));
        let mixed = imports(&["ratchet:stage/types@0.2.0", "ratchet:stage/log@0.1.0"]);
        let err = Contract::of(&mixed).expect_err("two versions");
        assert!(err.contains("both"), "{err}");
        let future = imports(&["ratchet:stage/types@0.9.0"]);
        let err = Contract::of(&future).expect_err("unserved version");
        assert!(err.contains("served: 0.1.0, 0.2.0"), "{err}");
    }
}
