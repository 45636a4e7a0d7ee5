//! Harness for capstan's end-to-end tests.

pub mod hooks;
