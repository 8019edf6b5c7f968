//! The store's tests against a real Redis, one test binary for those that share the server
//! without touching what is server-wide (deadline, gather and instances pause clients, count
//! server calls and flush scripts: binaries of their own, run alone).

mod common;

mod cluster;
mod contract;
mod counts;
mod handout;
mod lean;
mod not_redis;
mod share;
mod upgrade;
