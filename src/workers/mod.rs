//! Background work inside `serve`. Every worker runs until the shared
//! cancellation token fires, which happens once the HTTP server has drained.

pub mod backlog;
pub mod clock;
pub mod dispatcher;
pub mod event_retention;
pub mod recovery;
pub mod sweeper;
