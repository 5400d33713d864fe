//! The on-disk format, as pure functions: the segment header and record frames
//! ([`segment`]), and the names of segment files and process directories ([`names`]).

pub mod block;
pub(crate) mod names;
pub mod segment;
