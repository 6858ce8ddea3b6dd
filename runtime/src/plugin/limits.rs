//! What one attempt's instance may hold: one memory budget for the whole
//! instance, however many linear memories its core modules define, and
//! caps on how many instances, memories and tables it may create.

use wasmtime::{PoolingAllocationConfig, ResourceLimiter};

/// Most core instances one component instance may create (a component
/// built by componentize-py needs about ten).
const MAX_INSTANCES: usize = 16;
/// Most linear memories and tables, over all its core instances.
const MAX_MEMORIES: usize = 4;
const MAX_TABLES: usize = 8;
/// Most elements one table may grow to.
const MAX_TABLE_ELEMENTS: usize = 100_000;

/// The limiter of one store. A growth past the budget traps (the guest's
/// allocator would otherwise abort in ways that read as a plain trap); the
/// trap's message says so, and the host reports it as out of memory.
#[derive(Debug)]
pub(crate) struct InstanceLimits {
    budget: usize,
    used: usize,
}

/// The start of the message of a growth refused for the budget.
pub(crate) const OUT_OF_MEMORY: &str = "forcing trap when growing memory";

impl InstanceLimits {
    pub(crate) fn new(memory_bytes: usize) -> Self {
        Self {
            budget: memory_bytes,
            used: 0,
        }
    }
}

impl ResourceLimiter for InstanceLimits {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        let total = (self.used - current.min(self.used)).saturating_add(desired);
        if total > self.budget || maximum.is_some_and(|max| desired > max) {
            return Err(wasmtime::format_err!(
                "{OUT_OF_MEMORY}: the instance's memories would hold {total} bytes, over its {} bytes",
                self.budget
            ));
        }
        self.used = total;
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > MAX_TABLE_ELEMENTS || maximum.is_some_and(|max| desired > max) {
            return Err(wasmtime::format_err!(
                "forcing trap when growing a table to {desired} elements (at most {MAX_TABLE_ELEMENTS})"
            ));
        }
        Ok(true)
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

/// Pooling allocator settings: `slots` component instances at once, each
/// with room for the core instances, memories and tables a component built
/// by componentize-py needs, memories up to the operator's cap.
///
/// A finished instance's memory and tables are reset to their initial
/// contents by writing over what it touched, up to 1 MiB of each memory
/// (64 KiB of each table), instead of handing the pages back to the kernel:
/// that `madvise` made every CPU flush its TLB on every stage (`perf`: about
/// a fifth of a fan-out's samples; ADR 0011). The cost is that much memory
/// kept resident per used slot. `PAGEMAP_SCAN` (Linux 6.7 and later) finds
/// the touched pages; without it the lowest MiB is reset whole.
pub(super) fn pooling(slots: u32, memory_cap_mb: u64) -> PoolingAllocationConfig {
    let mut pool = PoolingAllocationConfig::default();
    let max_memory = usize::try_from(memory_cap_mb.saturating_mul(1 << 20)).unwrap_or(usize::MAX);
    pool.total_component_instances(slots)
        .total_core_instances(slots.saturating_mul(16))
        .total_memories(slots.saturating_mul(4))
        .total_tables(slots.saturating_mul(8))
        .total_stacks(slots)
        .table_elements(100_000)
        .max_memory_size(max_memory)
        .linear_memory_keep_resident(1 << 20)
        .table_keep_resident(1 << 16)
        .pagemap_scan(wasmtime::Enabled::Auto);
    pool
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memories_share_one_budget() {
        let mut limits = InstanceLimits::new(100);
        assert!(limits.memory_growing(0, 60, None).expect("first memory"));
        let second = limits.memory_growing(0, 60, None);
        assert!(second.is_err(), "two memories of 60 exceed 100 together");
        assert!(limits.memory_growing(0, 40, None).expect("40 more fits"));
        // Growing a memory counts only what it adds.
        let mut limits = InstanceLimits::new(100);
        assert!(limits.memory_growing(0, 50, None).expect("grow"));
        assert!(
            limits
                .memory_growing(50, 100, None)
                .expect("grow to the budget")
        );
        assert!(limits.memory_growing(100, 101, None).is_err());
    }
}
