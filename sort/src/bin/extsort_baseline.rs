//! The `extsort` crate on the same records and the same memory budget: the baseline of
//! `scripts/sort-baseline.sh`.
//!
//! ```text
//! extsort-baseline --input in.dat --output out.dat --budget 256M --tmp DIR
//! ```
//! extsort keeps `segment_size` items in memory before it sorts and writes a segment file, so
//! the budget in bytes becomes `budget / 100` records.

use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::PathBuf;

use clap::Parser;
use extsort::{ExternalSorter, Sortable};
use spillring_sort::{RECORD, parse_size};

#[derive(Parser, Debug)]
struct Cli {
    #[arg(long)]
    input: PathBuf,
    #[arg(long)]
    output: PathBuf,
    #[arg(long, value_parser = parse_size)]
    budget: usize,
    /// Directory for extsort's segment files (the same disk as the others').
    #[arg(long)]
    tmp: PathBuf,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Rec([u8; RECORD]);

impl Sortable for Rec {
    fn encode<W: Write>(&self, w: &mut W) -> std::io::Result<()> {
        w.write_all(&self.0)
    }
    fn decode<R: Read>(r: &mut R) -> std::io::Result<Rec> {
        let mut b = [0u8; RECORD];
        r.read_exact(&mut b)?;
        Ok(Rec(b))
    }
}

fn main() -> std::io::Result<()> {
    let cli = Cli::parse();
    let file = File::open(&cli.input)?;
    let len = file.metadata()?.len();
    if len % RECORD as u64 != 0 {
        return Err(std::io::Error::other(format!(
            "{} is {len} bytes, not whole {RECORD}-byte records",
            cli.input.display()
        )));
    }
    let mut input = BufReader::with_capacity(1 << 20, file);
    let mut left = len / RECORD as u64;
    let read_err = std::rc::Rc::new(std::cell::RefCell::new(None));
    let err = read_err.clone();
    let records = std::iter::from_fn(move || {
        if left == 0 {
            return None;
        }
        left -= 1;
        let mut b = [0u8; RECORD];
        match input.read_exact(&mut b) {
            Ok(()) => Some(Rec(b)),
            Err(e) => {
                *err.borrow_mut() = Some(e);
                None
            }
        }
    });
    // extsort deletes its segment files only in a temp directory it made itself (under the
    // system temp dir); given a directory, it leaves them. A temp directory of our own on the
    // same disk, deleted at the end, gives the same cleanup as its default.
    let tmp = tempfile::TempDir::new_in(&cli.tmp)?;
    let sorter = ExternalSorter::new()
        .with_segment_size((cli.budget / RECORD).max(1))
        .with_sort_dir(tmp.path().to_path_buf());
    let sorted = sorter.sort(records)?;
    if let Some(e) = read_err.borrow_mut().take() {
        return Err(e);
    }
    let mut out = BufWriter::with_capacity(4 << 20, File::create(&cli.output)?);
    for r in sorted {
        out.write_all(&r?.0)?;
    }
    out.flush()?;
    tmp.close()
}
