//! The shared store contract, run against the embedded backend.

use oncegate_embedded::EmbeddedStore;

oncegate_contract::contract_suite!(
    |clock| EmbeddedStore::open_temporary(clock).expect("open a temporary embedded store")
);
