//! The `oncegate` binary's tests, as users run it: one test binary for them all (each file a
//! module), so that the harness and the dependencies' generics are compiled and linked once,
//! not once a file (`cargo test -p oncegate --test binary faults::` runs one file's tests).

mod doc;
mod e2e;
mod support;

mod aibot;
mod at_rest;
mod cli;
mod clients;
mod dingtalk_stream;
mod durability;
mod faults;
mod gateway;
mod generic_send;
mod hardening;
mod keys;
mod logs;
mod longconn;
mod observability;
mod platforms;
mod reload;
mod reply_routes;
mod scale;
mod send;
mod sender_rules;
mod status_page;
mod store_apps;
mod suites;
mod telemetry_faults;
mod templates;
mod tenant_routes;
mod tenants;
mod traces;
mod webhooks;
