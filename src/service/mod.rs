//! Core flows: what a request does, independent of HTTP. Handlers parse and
//! authenticate, call one function here, and render its result.

pub mod api_keys;
pub mod charges;
