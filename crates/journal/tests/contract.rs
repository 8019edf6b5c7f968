//! The shared store contract, run against the journal backend.

oncegate_contract::contract_suite!(
    |clock| oncegate_journal::open_temporary(clock).expect("open a temporary journal store")
);

mod state {
    oncegate_contract::state_suite!(
        |clock| oncegate_journal::open_temporary(clock).expect("open a temporary journal store")
    );
}
