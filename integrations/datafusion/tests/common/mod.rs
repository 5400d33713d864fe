//! What the DataFusion tests and the bench share: TPC-H `lineitem`-like record batches (the
//! engine benches' generator, `spillring_benches::lineitem`), sessions whose spill files are
//! DataFusion's own or spillring's under a small `FairSpillPool`, the three spilling queries,
//! a hash of a query's output, and the plan's spill metrics.
#![allow(dead_code)]

use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, Date32Builder, Decimal128Builder, Int32Builder, Int64Builder, RecordBatch,
    StringBuilder,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::datasource::MemTable;
use datafusion::error::Result;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::FairSpillPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::execution::spill_file::TempFileFactory;
use datafusion::functions_aggregate::expr_fn::{count, max, sum};
use datafusion::physical_plan::Partitioning;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::{DataFrame, SessionConfig, SessionContext, col, lit};
use futures::StreamExt;
use spillring_benches::lineitem::Lineitem;

/// Rows of one batch (DataFusion's default `batch_size`).
pub const BATCH_ROWS: usize = 8192;

pub fn lineitem_schema() -> SchemaRef {
    let dec = DataType::Decimal128(15, 2);
    Arc::new(Schema::new(vec![
        Field::new("l_orderkey", DataType::Int64, false),
        Field::new("l_partkey", DataType::Int64, false),
        Field::new("l_suppkey", DataType::Int64, false),
        Field::new("l_linenumber", DataType::Int32, false),
        Field::new("l_quantity", dec.clone(), false),
        Field::new("l_extendedprice", dec.clone(), false),
        Field::new("l_discount", dec.clone(), false),
        Field::new("l_tax", dec, false),
        Field::new("l_returnflag", DataType::Utf8, false),
        Field::new("l_linestatus", DataType::Utf8, false),
        Field::new("l_shipdate", DataType::Date32, false),
        Field::new("l_commitdate", DataType::Date32, false),
        Field::new("l_receiptdate", DataType::Date32, false),
        Field::new("l_shipinstruct", DataType::Utf8, false),
        Field::new("l_shipmode", DataType::Utf8, false),
        Field::new("l_comment", DataType::Utf8, false),
    ]))
}

/// About `bytes` of lineitem batches (their Arrow memory), split round-robin into `partitions`
/// partitions, from a fixed seed.
pub fn lineitem_batches(bytes: usize, partitions: usize) -> Vec<Vec<RecordBatch>> {
    let schema = lineitem_schema();
    let mut g = Lineitem::new(20261202);
    let mut parts = vec![Vec::new(); partitions];
    let (mut total, mut i) = (0, 0);
    while total < bytes {
        let b = batch(&mut g, &schema, BATCH_ROWS);
        total += b.get_array_memory_size();
        parts[i % partitions].push(b);
        i += 1;
    }
    parts
}

fn batch(g: &mut Lineitem, schema: &SchemaRef, n: usize) -> RecordBatch {
    let mut orderkey = Int64Builder::with_capacity(n);
    let mut partkey = Int64Builder::with_capacity(n);
    let mut suppkey = Int64Builder::with_capacity(n);
    let mut linenumber = Int32Builder::with_capacity(n);
    let dec = || {
        Decimal128Builder::with_capacity(n)
            .with_precision_and_scale(15, 2)
            .expect("decimal(15, 2)")
    };
    let (mut quantity, mut price, mut discount, mut tax) = (dec(), dec(), dec(), dec());
    let mut returnflag = StringBuilder::with_capacity(n, n);
    let mut linestatus = StringBuilder::with_capacity(n, n);
    let mut shipdate = Date32Builder::with_capacity(n);
    let mut commitdate = Date32Builder::with_capacity(n);
    let mut receiptdate = Date32Builder::with_capacity(n);
    let mut instruct = StringBuilder::with_capacity(n, n * 12);
    let mut mode = StringBuilder::with_capacity(n, n * 5);
    let mut comment = StringBuilder::with_capacity(n, n * 27);
    for _ in 0..n {
        let r = g.next_row();
        orderkey.append_value(r.orderkey);
        partkey.append_value(r.partkey);
        suppkey.append_value(r.suppkey);
        linenumber.append_value(r.linenumber);
        quantity.append_value(r.quantity as i128 * 100);
        price.append_value(r.extendedprice as i128);
        discount.append_value(r.discount as i128);
        tax.append_value(r.tax as i128);
        returnflag.append_value(char::from(r.returnflag).to_string());
        linestatus.append_value(char::from(r.linestatus).to_string());
        shipdate.append_value(r.shipdate);
        commitdate.append_value(r.commitdate);
        receiptdate.append_value(r.receiptdate);
        instruct.append_value(r.shipinstruct);
        mode.append_value(r.shipmode);
        comment.append_value(g.comment(&r));
    }
    let cols: Vec<ArrayRef> = vec![
        Arc::new(orderkey.finish()),
        Arc::new(partkey.finish()),
        Arc::new(suppkey.finish()),
        Arc::new(linenumber.finish()),
        Arc::new(quantity.finish()),
        Arc::new(price.finish()),
        Arc::new(discount.finish()),
        Arc::new(tax.finish()),
        Arc::new(returnflag.finish()),
        Arc::new(linestatus.finish()),
        Arc::new(shipdate.finish()),
        Arc::new(commitdate.finish()),
        Arc::new(receiptdate.finish()),
        Arc::new(instruct.finish()),
        Arc::new(mode.finish()),
        Arc::new(comment.finish()),
    ];
    RecordBatch::try_new(schema.clone(), cols).expect("lineitem batch")
}

/// Where a session's spill files go.
#[derive(Clone)]
pub enum Spills {
    /// DataFusion's default: `NamedTempFile`s in a directory under this one.
    Default(PathBuf),
    /// A custom factory (spillring's, or a wrapper of it).
    Factory(Arc<dyn TempFileFactory>),
}

/// A session over the lineitem table `t` with `partitions` target partitions, whose memory pool
/// is a `FairSpillPool` of `pool` bytes (`None`: unlimited), spilling as `spills` says.
pub fn session(
    parts: &[Vec<RecordBatch>],
    pool: Option<usize>,
    spills: &Spills,
) -> Result<SessionContext> {
    session_with(parts, pool, spills, SessionConfig::new())
}

/// [`session`] with DataFusion options of the caller's (`cfg`).
pub fn session_with(
    parts: &[Vec<RecordBatch>],
    pool: Option<usize>,
    spills: &Spills,
    cfg: SessionConfig,
) -> Result<SessionContext> {
    let disk = match spills {
        Spills::Default(dir) => {
            DiskManagerBuilder::default().with_mode(DiskManagerMode::Directories(vec![dir.clone()]))
        }
        Spills::Factory(f) => DiskManagerBuilder::default().with_temp_file_factory(f.clone()),
    };
    let mut rt = RuntimeEnvBuilder::new().with_disk_manager_builder(disk);
    if let Some(bytes) = pool {
        rt = rt.with_memory_pool(Arc::new(FairSpillPool::new(bytes)));
    }
    let cfg = cfg
        .with_target_partitions(parts.len())
        .with_batch_size(BATCH_ROWS);
    let ctx = SessionContext::new_with_config_rt(cfg, rt.build_arc()?);
    let table = MemTable::try_new(lineitem_schema(), parts.to_vec())?;
    ctx.register_table("t", Arc::new(table))?;
    Ok(ctx)
}

/// The spilling queries of the tests and the bench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Query {
    /// Every column, ordered by (orderkey, linenumber): a unique key, so one right order.
    OrderBy,
    /// Per order key (about a quarter as many groups as rows): exact sums (decimals), a count
    /// and a max of the comment.
    GroupBy,
    /// A round-robin repartition (`RepartitionExec`) of the table into 4 partitions, read one
    /// partition after another: the other partitions' batches wait in DataFusion's spill pool,
    /// whose files are read while they are written.
    Repartition,
}

impl Query {
    pub const ALL: [Query; 3] = [Query::OrderBy, Query::GroupBy, Query::Repartition];

    pub fn name(self) -> &'static str {
        match self {
            Query::OrderBy => "order_by",
            Query::GroupBy => "group_by",
            Query::Repartition => "repartition",
        }
    }

    /// True when the output's row order is the query's (the hash takes it into account).
    pub fn ordered(self) -> bool {
        self == Query::OrderBy
    }

    pub async fn frame(self, ctx: &SessionContext) -> Result<DataFrame> {
        let t = ctx.table("t").await?;
        match self {
            Query::OrderBy => t.sort(vec![
                col("l_orderkey").sort(true, false),
                col("l_linenumber").sort(true, false),
            ]),
            Query::GroupBy => t.aggregate(
                vec![col("l_orderkey")],
                vec![
                    sum(col("l_quantity")).alias("qty"),
                    sum(col("l_extendedprice")).alias("price"),
                    count(lit(1)).alias("lines"),
                    max(col("l_comment")).alias("comment"),
                ],
            ),
            // The optimizer drops a repartition nothing downstream needs: `plan` adds it.
            Query::Repartition => Ok(t),
        }
    }

    pub async fn plan(self, ctx: &SessionContext) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.frame(ctx).await?.create_physical_plan().await?;
        Ok(match self {
            Query::Repartition => Arc::new(RepartitionExec::try_new(
                plan,
                Partitioning::RoundRobinBatch(4),
            )?),
            _ => plan,
        })
    }
}

/// What a query produced: rows and a hash of them (in order for an ordered query, as a
/// multiset otherwise), and the spill metrics of its plan.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub rows: usize,
    pub hash: u64,
}

/// Runs `plan` to the end, one output partition after another, hashing what it yields.
pub async fn run(q: Query, ctx: &SessionContext, plan: &Arc<dyn ExecutionPlan>) -> Result<Outcome> {
    let mut h = OutputHash::new(plan.schema(), q.ordered())?;
    for p in 0..plan.output_partitioning().partition_count() {
        let mut s = plan.execute(p, ctx.task_ctx())?;
        while let Some(b) = s.next().await {
            h.add(&b?)?;
        }
    }
    Ok(h.finish())
}

/// Hashes rows through Arrow's row format (every column's exact bytes).
pub struct OutputHash {
    conv: RowConverter,
    ordered: bool,
    rows: usize,
    acc: u64,
}

impl OutputHash {
    pub fn new(schema: SchemaRef, ordered: bool) -> Result<Self> {
        let fields = schema
            .fields()
            .iter()
            .map(|f| SortField::new(f.data_type().clone()))
            .collect();
        Ok(OutputHash {
            conv: RowConverter::new(fields)?,
            ordered,
            rows: 0,
            acc: 0,
        })
    }

    pub fn add(&mut self, b: &RecordBatch) -> Result<()> {
        let rows = self.conv.convert_columns(b.columns())?;
        for r in rows.iter() {
            let mut s = std::hash::DefaultHasher::new();
            r.as_ref().hash(&mut s);
            let rh = s.finish();
            self.acc = if self.ordered {
                self.acc.rotate_left(5) ^ rh
            } else {
                self.acc.wrapping_add(rh)
            };
        }
        self.rows += b.num_rows();
        Ok(())
    }

    pub fn finish(&self) -> Outcome {
        Outcome {
            rows: self.rows,
            hash: self.acc,
        }
    }
}

/// The spill metrics summed over a plan's operators: (spill files, spilled bytes, spilled rows).
pub fn spill_metrics(plan: &Arc<dyn ExecutionPlan>) -> (usize, usize, usize) {
    let mut t = (0, 0, 0);
    if let Some(m) = plan.metrics() {
        t.0 += m.spill_count().unwrap_or(0);
        t.1 += m.spilled_bytes().unwrap_or(0);
        t.2 += m.spilled_rows().unwrap_or(0);
    }
    for c in plan.children() {
        let (a, b, r) = spill_metrics(c);
        t = (t.0 + a, t.1 + b, t.2 + r);
    }
    t
}

/// Regular files under `dir`, recursively.
pub fn files_under(dir: &std::path::Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => out.extend(files_under(&p)),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
    out
}
