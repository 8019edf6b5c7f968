//! The gateway library's tests, one test binary for them all (each file a module): the
//! dependencies' generics and the examples they run are compiled and linked once, not once a
//! file (`cargo test -p oncegate-gateway --test gateway bot::` runs one file's tests).

mod bot;
mod in_process;
mod layout;
mod outage;
mod sink;
mod wecom;
