//! The on-disk format, as pure functions: the segment header and record frames
//! ([`segment`]), blocks and their checksum, CRC-32C ([`block`]) and their encryption
//! (`crypt`), the one walk that reads a segment's blocks back (`cursor`), and the names of
//! segment files and process directories ([`names`]).

pub mod block;
pub(crate) mod crypt;
pub(crate) mod cursor;
pub(crate) mod names;
pub mod segment;
