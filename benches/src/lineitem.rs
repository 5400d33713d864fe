//! Bench data that is not ours to tune (issue 11): TPC-H `lineitem`-like rows as dbgen writes
//! them, and an incompressible set of random bytes.
//!
//! [`Lineitem`] generates rows with the columns and value distributions of the TPC-H spec
//! (clause 4.2.3), from a fixed seed: sparse order keys (the first 8 of every 32) with 1-7 lines
//! per order and an order date uniform in 1992-01-01..1998-08-02, part keys uniform in
//! 1..=200,000 and the supplier chosen from the part's four, quantity 1-50, extended price =
//! quantity x the part's retail price, discount 0.00-0.10, tax 0.00-0.08, ship date 1-121 days
//! after the order, commit date 30-90 days after it, receipt date 1-30 days after shipping,
//! return flag R or A (received by 1995-06-17) else N, line status O (shipped after 1995-06-17)
//! else F, ship instruction and mode from the spec's lists, and a comment of 10-43 characters
//! taken, as dbgen takes it, at a random offset of a text pool made from the spec's sentence
//! grammar and word lists (clause 4.2.2.10; uniform choices where the spec weighs them).
//!
//! Each row is rendered as dbgen's `lineitem.tbl` line, `|`-separated with a trailing `|` and a
//! newline (`1|155190|7706|1|17|21168.23|0.04|0.02|N|O|1996-03-13|...|egular courts above the|`):
//! the text form every TPC-H user has, rather than a binary layout we would pick for our codec.
//! One row is one record (about 130 bytes).
//!
//! [`random_records`] is the incompressible set: records of random bytes.
//! [`RecordSet`] holds a set in one buffer so a bench can replay it without generating in its
//! timed loop, and [`RecordSet::blocks`] packs records into blocks the way a staging buffer
//! holds them, for the codec baselines.

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

/// Days from 1970-01-01 to 1992-01-01 (the spec's STARTDATE).
pub const START_DATE: i32 = 8035;
/// Days from 1970-01-01 to 1998-12-31 (ENDDATE).
pub const END_DATE: i32 = 10591;
/// 1995-06-17, the spec's CURRENTDATE.
pub const CURRENT_DATE: i32 = 9298;
/// Parts at scale factor 1 (`P_PARTKEY` in 1..=SF*200,000).
pub const SCALE_PARTS: i64 = 200_000;
/// Suppliers at scale factor 1.
pub const SCALE_SUPPS: i64 = 10_000;

/// `L_SHIPINSTRUCT` values (clause 4.2.2.13, Instructions).
pub const INSTRUCTIONS: [&str; 4] = [
    "DELIVER IN PERSON",
    "COLLECT COD",
    "NONE",
    "TAKE BACK RETURN",
];
/// `L_SHIPMODE` values (Modes).
pub const MODES: [&str; 7] = ["REG AIR", "AIR", "RAIL", "SHIP", "TRUCK", "MAIL", "FOB"];

const NOUNS: [&str; 40] = [
    "foxes",
    "ideas",
    "theodolites",
    "pinto beans",
    "instructions",
    "dependencies",
    "excuses",
    "platelets",
    "asymptotes",
    "courts",
    "dolphins",
    "multipliers",
    "sauternes",
    "warthogs",
    "frets",
    "dinos",
    "attainments",
    "somas",
    "Tiresias",
    "patterns",
    "forges",
    "braids",
    "hockey players",
    "frays",
    "warhorses",
    "dugouts",
    "notornis",
    "epitaphs",
    "pearls",
    "tithes",
    "waters",
    "orbits",
    "gifts",
    "sheaves",
    "depths",
    "sentiments",
    "decoys",
    "realms",
    "pains",
    "grouches",
];
const VERBS: [&str; 40] = [
    "sleep",
    "wake",
    "are",
    "cajole",
    "haggle",
    "nag",
    "use",
    "boost",
    "affix",
    "detect",
    "integrate",
    "maintain",
    "nod",
    "was",
    "lose",
    "sublate",
    "solve",
    "thrash",
    "promise",
    "engage",
    "hinder",
    "print",
    "x-ray",
    "breach",
    "eat",
    "grow",
    "impress",
    "mold",
    "poach",
    "serve",
    "run",
    "dazzle",
    "snooze",
    "doze",
    "unwind",
    "kindle",
    "play",
    "hang",
    "believe",
    "doubt",
];
const ADJECTIVES: [&str; 25] = [
    "furious",
    "sly",
    "careful",
    "blithe",
    "quick",
    "fluffy",
    "slow",
    "quiet",
    "ruthless",
    "thin",
    "close",
    "dogged",
    "daring",
    "brave",
    "stealthy",
    "permanent",
    "enticing",
    "idle",
    "busy",
    "regular",
    "final",
    "ironic",
    "even",
    "bold",
    "silent",
];
const ADVERBS: [&str; 28] = [
    "sometimes",
    "always",
    "never",
    "furiously",
    "slyly",
    "carefully",
    "blithely",
    "quickly",
    "fluffily",
    "slowly",
    "quietly",
    "ruthlessly",
    "thinly",
    "closely",
    "doggedly",
    "daringly",
    "bravely",
    "stealthily",
    "permanently",
    "enticingly",
    "idly",
    "busily",
    "regularly",
    "finally",
    "ironically",
    "evenly",
    "boldly",
    "silently",
];
const PREPOSITIONS: [&str; 47] = [
    "about",
    "above",
    "according to",
    "across",
    "after",
    "against",
    "along",
    "alongside of",
    "among",
    "around",
    "at",
    "atop",
    "before",
    "behind",
    "beneath",
    "beside",
    "besides",
    "between",
    "beyond",
    "by",
    "despite",
    "during",
    "except",
    "for",
    "from",
    "in place of",
    "inside",
    "instead of",
    "into",
    "near",
    "of",
    "on",
    "outside",
    "over",
    "past",
    "since",
    "through",
    "throughout",
    "to",
    "toward",
    "under",
    "until",
    "up",
    "upon",
    "without",
    "with",
    "within",
];
const AUXILIARIES: [&str; 18] = [
    "do",
    "may",
    "might",
    "shall",
    "will",
    "would",
    "can",
    "could",
    "should",
    "ought to",
    "must",
    "will have to",
    "shall have to",
    "could have to",
    "should have to",
    "must have to",
    "need to",
    "try to",
];
const TERMINATORS: [&str; 6] = [".", ";", ":", "?", "!", "--"];

/// Bytes of the comment text pool (dbgen's is 300 MB; ours is large enough that the ~8,000
/// comments of a 1 MiB block come from places far apart).
pub const TEXT_POOL_BYTES: usize = 8 << 20;
/// Shortest and longest `L_COMMENT`.
pub const COMMENT_LEN: (usize, usize) = (10, 43);

fn pick<'a>(rng: &mut StdRng, words: &[&'a str]) -> &'a str {
    words[rng.random_range(0..words.len())]
}

fn noun_phrase(rng: &mut StdRng, out: &mut String) {
    match rng.random_range(0..4) {
        0 => {}
        1 => {
            out.push_str(pick(rng, &ADJECTIVES));
            out.push(' ');
        }
        2 => {
            out.push_str(pick(rng, &ADJECTIVES));
            out.push_str(", ");
            out.push_str(pick(rng, &ADJECTIVES));
            out.push(' ');
        }
        _ => {
            out.push_str(pick(rng, &ADVERBS));
            out.push(' ');
            out.push_str(pick(rng, &ADJECTIVES));
            out.push(' ');
        }
    }
    out.push_str(pick(rng, &NOUNS));
}

fn verb_phrase(rng: &mut StdRng, out: &mut String) {
    let form = rng.random_range(0..4);
    if form & 1 == 1 {
        out.push_str(pick(rng, &AUXILIARIES));
        out.push(' ');
    }
    out.push_str(pick(rng, &VERBS));
    if form & 2 == 2 {
        out.push(' ');
        out.push_str(pick(rng, &ADVERBS));
    }
}

fn prepositional_phrase(rng: &mut StdRng, out: &mut String) {
    out.push_str(pick(rng, &PREPOSITIONS));
    out.push_str(" the ");
    noun_phrase(rng, out);
}

/// One sentence of the spec's grammar (clause 4.2.2.14), with a trailing space.
fn sentence(rng: &mut StdRng, out: &mut String) {
    noun_phrase(rng, out);
    out.push(' ');
    match rng.random_range(0..5) {
        0 => verb_phrase(rng, out),
        1 => {
            verb_phrase(rng, out);
            out.push(' ');
            prepositional_phrase(rng, out);
        }
        2 => {
            verb_phrase(rng, out);
            out.push(' ');
            noun_phrase(rng, out);
        }
        3 => {
            prepositional_phrase(rng, out);
            out.push(' ');
            verb_phrase(rng, out);
            out.push(' ');
            noun_phrase(rng, out);
        }
        _ => {
            prepositional_phrase(rng, out);
            out.push(' ');
            verb_phrase(rng, out);
            out.push(' ');
            prepositional_phrase(rng, out);
        }
    }
    out.push_str(pick(rng, &TERMINATORS));
    out.push(' ');
}

/// `P_RETAILPRICE` of part `key` in cents (clause 4.2.3).
pub fn retail_price_cents(key: i64) -> i64 {
    90_000 + ((key / 10) % 20_001) + 100 * (key % 1_000)
}

/// `O_ORDERKEY` of the `index`th order (0-based): the spec's sparse keys, the first 8 of every 32.
pub fn order_key(index: i64) -> i64 {
    (index / 8) * 32 + index % 8 + 1
}

/// `(year, month, day)` of `days` since 1970-01-01 (proleptic Gregorian).
pub fn civil_from_days(days: i32) -> (i32, u32, u32) {
    // Howard Hinnant's days_from_civil, inverted.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i32::from(m <= 2);
    (y, m, d)
}

/// One `lineitem` row (money in cents, dates in days since 1970-01-01).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Row {
    /// `L_ORDERKEY`.
    pub orderkey: i64,
    /// `L_PARTKEY`.
    pub partkey: i64,
    /// `L_SUPPKEY`.
    pub suppkey: i64,
    /// `L_LINENUMBER` (1-7).
    pub linenumber: i32,
    /// `L_QUANTITY` (1-50).
    pub quantity: i64,
    /// `L_EXTENDEDPRICE` in cents.
    pub extendedprice: i64,
    /// `L_DISCOUNT` in hundredths (0-10).
    pub discount: i64,
    /// `L_TAX` in hundredths (0-8).
    pub tax: i64,
    /// `L_RETURNFLAG` (`R`, `A` or `N`).
    pub returnflag: u8,
    /// `L_LINESTATUS` (`O` or `F`).
    pub linestatus: u8,
    /// `L_SHIPDATE`.
    pub shipdate: i32,
    /// `L_COMMITDATE`.
    pub commitdate: i32,
    /// `L_RECEIPTDATE`.
    pub receiptdate: i32,
    /// `L_SHIPINSTRUCT`.
    pub shipinstruct: &'static str,
    /// `L_SHIPMODE`.
    pub shipmode: &'static str,
    /// `L_COMMENT`, a range of the generator's text pool.
    pub comment: std::ops::Range<usize>,
}

/// A seeded generator of `lineitem` rows at scale factor 1's key ranges (see the module docs).
#[derive(Debug)]
pub struct Lineitem {
    rng: StdRng,
    text: String,
    order_index: i64,
    order_date: i32,
    lines: i32,
    line: i32,
}

impl Lineitem {
    /// A generator whose rows are a function of `seed` only.
    pub fn new(seed: u64) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut text = String::with_capacity(TEXT_POOL_BYTES + 256);
        while text.len() < TEXT_POOL_BYTES {
            sentence(&mut rng, &mut text);
        }
        Lineitem {
            rng,
            text,
            order_index: -1,
            order_date: 0,
            lines: 0,
            line: 0,
        }
    }

    /// The comment text of `row` (a row of this generator).
    pub fn comment(&self, row: &Row) -> &str {
        &self.text[row.comment.clone()]
    }

    /// The next row.
    pub fn next_row(&mut self) -> Row {
        if self.line == self.lines {
            self.order_index += 1;
            self.order_date = self.rng.random_range(START_DATE..=END_DATE - 151);
            self.lines = self.rng.random_range(1..=7);
            self.line = 0;
        }
        self.line += 1;
        let r = &mut self.rng;
        let partkey = r.random_range(1..=SCALE_PARTS);
        let s = SCALE_SUPPS;
        let i = r.random_range(0..4i64);
        let suppkey = (partkey + i * (s / 4 + (partkey - 1) / s)) % s + 1;
        let quantity = r.random_range(1..=50i64);
        let discount = r.random_range(0..=10i64);
        let tax = r.random_range(0..=8i64);
        let shipdate = self.order_date + r.random_range(1..=121);
        let commitdate = self.order_date + r.random_range(30..=90);
        let receiptdate = shipdate + r.random_range(1..=30);
        let returnflag = if receiptdate <= CURRENT_DATE {
            if r.random_bool(0.5) { b'R' } else { b'A' }
        } else {
            b'N'
        };
        let linestatus = if shipdate > CURRENT_DATE { b'O' } else { b'F' };
        let shipinstruct = INSTRUCTIONS[r.random_range(0..INSTRUCTIONS.len())];
        let shipmode = MODES[r.random_range(0..MODES.len())];
        let len = r.random_range(COMMENT_LEN.0..=COMMENT_LEN.1);
        let mut start = r.random_range(0..self.text.len() - len);
        // The pool is ASCII but for nothing; stay on char boundaries anyway.
        while !self.text.is_char_boundary(start) || !self.text.is_char_boundary(start + len) {
            start -= 1;
        }
        Row {
            orderkey: order_key(self.order_index),
            partkey,
            suppkey,
            linenumber: self.line,
            quantity,
            extendedprice: quantity * retail_price_cents(partkey),
            discount,
            tax,
            returnflag,
            linestatus,
            shipdate,
            commitdate,
            receiptdate,
            shipinstruct,
            shipmode,
            comment: start..start + len,
        }
    }

    /// Appends the next row to `out` as dbgen's text line (`|` after every field, then `\n`).
    pub fn write_row(&mut self, out: &mut Vec<u8>) {
        use std::io::Write;
        let row = self.next_row();
        let date = |d: i32| {
            let (y, m, dd) = civil_from_days(d);
            format!("{y:04}-{m:02}-{dd:02}")
        };
        // Writing into a Vec cannot fail.
        let _ = writeln!(
            out,
            "{}|{}|{}|{}|{}|{}.{:02}|0.{:02}|0.{:02}|{}|{}|{}|{}|{}|{}|{}|{}|",
            row.orderkey,
            row.partkey,
            row.suppkey,
            row.linenumber,
            row.quantity,
            row.extendedprice / 100,
            row.extendedprice % 100,
            row.discount,
            row.tax,
            row.returnflag as char,
            row.linestatus as char,
            date(row.shipdate),
            date(row.commitdate),
            date(row.receiptdate),
            row.shipinstruct,
            row.shipmode,
            self.comment(&row),
        );
    }
}

/// Records held in one buffer: record `i` is `data[ends[i-1]..ends[i]]`.
#[derive(Debug, Clone, Default)]
pub struct RecordSet {
    data: Vec<u8>,
    ends: Vec<usize>,
}

impl RecordSet {
    /// Number of records.
    pub fn len(&self) -> usize {
        self.ends.len()
    }

    /// True when there is no record.
    pub fn is_empty(&self) -> bool {
        self.ends.is_empty()
    }

    /// Bytes of all records (without framing).
    pub fn bytes(&self) -> usize {
        self.data.len()
    }

    /// Record `i`.
    pub fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] };
        &self.data[start..self.ends[i]]
    }

    /// The records in order.
    pub fn iter(&self) -> impl Iterator<Item = &[u8]> + '_ {
        (0..self.len()).map(|i| self.get(i))
    }

    /// The records packed as a staging buffer holds them: each as a 4-byte little-endian length
    /// and its bytes, a block closed when the next record would pass `block_size` (a record
    /// larger than `block_size` is a block of its own). The blocks a codec baseline compresses.
    pub fn blocks(&self, block_size: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut cur = Vec::with_capacity(block_size);
        for r in self.iter() {
            if !cur.is_empty() && cur.len() + 4 + r.len() > block_size {
                out.push(std::mem::replace(&mut cur, Vec::with_capacity(block_size)));
            }
            cur.extend_from_slice(&(r.len() as u32).to_le_bytes());
            cur.extend_from_slice(r);
        }
        if !cur.is_empty() {
            out.push(cur);
        }
        out
    }

    fn push(&mut self, f: impl FnOnce(&mut Vec<u8>)) {
        f(&mut self.data);
        self.ends.push(self.data.len());
    }
}

/// `lineitem` rows from `seed`, one record per row, until they hold at least `bytes` bytes.
pub fn lineitem_records(seed: u64, bytes: usize) -> RecordSet {
    let mut g = Lineitem::new(seed);
    let mut set = RecordSet {
        data: Vec::with_capacity(bytes + 256),
        ends: Vec::with_capacity(bytes / 120),
    };
    while set.bytes() < bytes {
        set.push(|out| g.write_row(out));
    }
    set
}

/// Records of `record_len` random bytes from `seed` until they hold at least `bytes` bytes:
/// the incompressible set.
pub fn random_records(seed: u64, bytes: usize, record_len: usize) -> RecordSet {
    assert!(record_len > 0, "empty random records");
    let mut rng = StdRng::seed_from_u64(seed);
    let n = bytes.div_ceil(record_len);
    let mut data = vec![0u8; n * record_len];
    rng.fill_bytes(&mut data);
    RecordSet {
        data,
        ends: (1..=n).map(|i| i * record_len).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(line: &[u8]) -> Vec<String> {
        let s = std::str::from_utf8(line).expect("a row is ASCII text");
        let s = s.strip_suffix("|\n").expect("a row ends in |\\n");
        s.split('|').map(str::to_owned).collect()
    }

    fn date_days(s: &str) -> i32 {
        // Inverse of civil_from_days by search (the tests' dates are in 1992-1999).
        (START_DATE - 400..END_DATE + 400)
            .find(|&d| {
                let (y, m, dd) = civil_from_days(d);
                format!("{y:04}-{m:02}-{dd:02}") == s
            })
            .unwrap_or_else(|| panic!("date {s} outside 1990-2000"))
    }

    fn cents(s: &str) -> i64 {
        let (a, b) = s.split_once('.').expect("a decimal");
        assert_eq!(b.len(), 2, "two decimals in {s}");
        a.parse::<i64>().expect("int") * 100 + b.parse::<i64>().expect("cents")
    }

    #[test]
    fn dates_are_the_calendars() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(START_DATE), (1992, 1, 1));
        assert_eq!(civil_from_days(END_DATE), (1998, 12, 31));
        assert_eq!(civil_from_days(CURRENT_DATE), (1995, 6, 17));
        assert_eq!(civil_from_days(END_DATE - 151), (1998, 8, 2));
        assert_eq!(civil_from_days(8_094), (1992, 2, 29));
    }

    #[test]
    fn the_same_seed_makes_the_same_rows_and_another_seed_others() {
        let a = lineitem_records(7, 1 << 20);
        let b = lineitem_records(7, 1 << 20);
        let c = lineitem_records(8, 1 << 20);
        assert_eq!(a.data, b.data);
        assert_eq!(a.ends, b.ends);
        assert_ne!(a.data[..4096], c.data[..4096]);
        let (r1, r2) = (
            random_records(7, 1 << 16, 1000),
            random_records(7, 1 << 16, 1000),
        );
        assert_eq!(r1.data, r2.data);
        assert_ne!(r1.data, random_records(8, 1 << 16, 1000).data);
    }

    #[test]
    fn rows_have_the_specs_columns_and_ranges() {
        let mut g = Lineitem::new(42);
        let (mut flags, mut status, mut modes, mut instr) = (
            std::collections::BTreeSet::new(),
            std::collections::BTreeSet::new(),
            std::collections::BTreeSet::new(),
            std::collections::BTreeSet::new(),
        );
        let (mut lines_seen, mut last_order, mut orders) = (0, 0i64, 0);
        let mut comment_lens = std::collections::BTreeSet::new();
        for _ in 0..20_000 {
            let mut line = Vec::new();
            g.write_row(&mut line);
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
            let f = fields(&line);
            assert_eq!(f.len(), 16, "16 columns: {f:?}");
            let orderkey: i64 = f[0].parse().expect("orderkey");
            // Sparse keys: the first 8 of every 32.
            assert!((1..=8).contains(&((orderkey - 1) % 32 + 1)), "{orderkey}");
            let linenumber: i32 = f[3].parse().expect("linenumber");
            assert!((1..=7).contains(&linenumber));
            if orderkey != last_order {
                assert!(orderkey > last_order, "order keys ascend");
                assert_eq!(linenumber, 1, "an order's lines start at 1");
                last_order = orderkey;
                orders += 1;
            } else {
                assert_eq!(linenumber, lines_seen + 1, "lines count up");
            }
            lines_seen = linenumber;
            let partkey: i64 = f[1].parse().expect("partkey");
            assert!((1..=SCALE_PARTS).contains(&partkey));
            let suppkey: i64 = f[2].parse().expect("suppkey");
            assert!((1..=SCALE_SUPPS).contains(&suppkey));
            let quantity: i64 = f[4].parse().expect("quantity");
            assert!((1..=50).contains(&quantity));
            assert_eq!(cents(&f[5]), quantity * retail_price_cents(partkey));
            assert!((0..=10).contains(&cents(&f[6])), "discount {}", f[6]);
            assert!((0..=8).contains(&cents(&f[7])), "tax {}", f[7]);
            let (ship, commit, receipt) = (date_days(&f[10]), date_days(&f[11]), date_days(&f[12]));
            for d in [ship, commit, receipt] {
                assert!((START_DATE..=END_DATE).contains(&d), "{f:?}");
            }
            assert!((1..=30).contains(&(receipt - ship)));
            assert_eq!(f[8] == "N", receipt > CURRENT_DATE, "{f:?}");
            assert_eq!(f[9] == "O", ship > CURRENT_DATE, "{f:?}");
            flags.insert(f[8].clone());
            status.insert(f[9].clone());
            instr.insert(f[13].clone());
            modes.insert(f[14].clone());
            assert!(INSTRUCTIONS.contains(&f[13].as_str()));
            assert!(MODES.contains(&f[14].as_str()));
            let clen = f[15].len();
            assert!((COMMENT_LEN.0..=COMMENT_LEN.1).contains(&clen), "{clen}");
            comment_lens.insert(clen);
        }
        // Every value of each categorical column shows up; comment lengths span the range.
        assert_eq!(flags.len(), 3);
        assert_eq!(status.len(), 2);
        assert_eq!(instr.len(), INSTRUCTIONS.len());
        assert_eq!(modes.len(), MODES.len());
        assert_eq!(comment_lens.len(), COMMENT_LEN.1 - COMMENT_LEN.0 + 1);
        // 1-7 lines per order: about 4 on average.
        let per_order = 20_000.0 / orders as f64;
        assert!((3.5..4.5).contains(&per_order), "{per_order}");
    }

    #[test]
    fn record_sets_and_blocks_keep_every_record() {
        let set = lineitem_records(1, 300_000);
        assert!(set.bytes() >= 300_000 && set.bytes() < 300_200);
        assert!(set.iter().all(|r| r.ends_with(b"|\n")));
        let blocks = set.blocks(64 << 10);
        assert!(blocks.iter().all(|b| b.len() <= 64 << 10));
        let mut back = Vec::new();
        for b in &blocks {
            let mut at = 0;
            while at < b.len() {
                let n = u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes")) as usize;
                back.push(&b[at + 4..at + 4 + n]);
                at += 4 + n;
            }
        }
        assert!(back.iter().copied().eq(set.iter()));
        let rnd = random_records(3, 10_000, 4096);
        assert_eq!((rnd.len(), rnd.bytes()), (3, 3 * 4096));
        // A record larger than the block size is a block of its own.
        assert_eq!(rnd.blocks(1000).len(), 3);
    }
}
