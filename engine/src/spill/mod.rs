//! The user's stages of a spill: the task's scope ([`task`]), the writer ([`writer`]), the
//! grants on a finished spill's files ([`grant`]) and the state that holds them ([`state`]),
//! the reader ([`reader`]) and the reader of a published file without an engine
//! ([`segment_reader`]), both walking a segment with the codec of `format/cursor.rs`; the
//! budget of work after which an async call yields ([`budget`]).

pub(crate) mod budget;
pub(crate) mod grant;
pub(crate) mod reader;
pub(crate) mod segment_reader;
pub(crate) mod state;
pub(crate) mod task;
pub(crate) mod writer;
