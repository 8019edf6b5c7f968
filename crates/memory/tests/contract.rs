//! The shared store contract, run against the memory backend.

use oncegate_memory::{MemoryConfig, MemoryStore};

oncegate_contract::contract_suite!(|clock| MemoryStore::with_clock(
    MemoryConfig {
        shards: 8,
        max_records: 1_000_000,
        partitions: 4,
    },
    clock
));

mod state {
    use oncegate_memory::{MemoryConfig, MemoryStore};

    oncegate_contract::state_suite!(|clock| MemoryStore::with_clock(
        MemoryConfig::default(),
        clock
    ));
}
