//! The on-disk format, as pure functions: the segment header and record frames
//! ([`segment`]), blocks ([`block`]), their checksum (`crc`, CRC-32C) and their encryption
//! (`crypt`), the one walk that reads a segment's blocks back (`cursor`), and the names of
//! segment files and process directories ([`names`]).

pub mod block;
pub(crate) mod crc;
pub(crate) mod crypt;
pub(crate) mod cursor;
pub(crate) mod names;
pub mod segment;
