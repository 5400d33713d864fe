//! The bystander: a spill of another engine on the same root, kept open across every kill and
//! sweep; it must read back intact at the end.

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use spillring::{Engine, EngineConfig, SpilledState, TaskSpill};

use super::State;
use crate::args::Workload;
use crate::data::{Expect, Pool, Rng, mix, record_len};

/// A spill of another engine, kept open across every kill: it must survive the sweeps.
pub(super) struct Bystander {
    pub(super) engine: Engine,
    task: TaskSpill,
    state: SpilledState,
    expect: Vec<Expect>,
}

pub(super) fn bystander(w: &Workload, root: &Path, seed: u64) -> Result<Bystander, String> {
    let roots = w.spill_roots(root);
    let mut cfg = EngineConfig::new(&roots[0]);
    for r in &roots[1..] {
        cfg = cfg.add_root(r);
    }
    let engine = Engine::open(cfg.segment_size(64 << 10).io_buffer_size(16 << 10))
        .map_err(|e| format!("open the bystander engine: {e}"))?;
    let task = engine
        .task("bystander")
        .map_err(|e| format!("bystander task: {e}"))?;
    let mut w = task
        .writer()
        .map_err(|e| format!("bystander writer: {e}"))?;
    let pool = Pool::new(seed, 1 << 20);
    let mut rng = Rng::new(mix(seed ^ 0xB157));
    let mut expect = Vec::new();
    for _ in 0..400 {
        let len = record_len(&mut rng, 32 << 10);
        let rec: Bytes = pool.record(&mut rng, len);
        expect.push(Expect::of(&rec));
        w.write(rec).map_err(|e| format!("bystander write: {e}"))?;
    }
    let state = w.finish().map_err(|e| format!("bystander finish: {e}"))?;
    Ok(Bystander {
        engine,
        task,
        state,
        expect,
    })
}

impl Bystander {
    /// Reads the spill back and checks it; then closes everything.
    pub(super) fn verify_and_close(self, st: &mut State) -> bool {
        let mut ok = true;
        match self.state.reader() {
            Ok(mut r) => {
                let mut i = 0;
                loop {
                    match r.next_record() {
                        Ok(Some(b)) => {
                            if let Some(why) = self.expect.get(i).and_then(|e| e.mismatch(&b)) {
                                st.bad(
                                    "bystander",
                                    format!("record {i}: {why}"),
                                    "bystander spill".into(),
                                );
                                ok = false;
                                break;
                            }
                            i += 1;
                        }
                        Ok(None) => break,
                        Err(e) => {
                            st.bad(
                                "bystander",
                                format!(
                                    "a live engine's spill was damaged by a sweep: record {i}: {e}"
                                ),
                                format!("{:?}", self.state.paths()),
                            );
                            ok = false;
                            break;
                        }
                    }
                }
                if ok && i != self.expect.len() {
                    st.bad(
                        "bystander",
                        format!("read {i} records, {} were written", self.expect.len()),
                        "bystander spill".into(),
                    );
                    ok = false;
                }
            }
            Err(e) => {
                st.bad(
                    "bystander",
                    format!("reader: {e}"),
                    "bystander spill".into(),
                );
                ok = false;
            }
        }
        drop(self.state);
        self.task.close();
        self.engine.trim_pool();
        if !self.engine.settle(Duration::from_secs(30)) {
            st.bad(
                "settle",
                "the bystander engine did not settle".into(),
                "bystander".into(),
            );
        }
        let r = self.engine.shutdown(Duration::from_secs(10));
        if !r.drained || r.tickets_held != 0 {
            st.bad(
                "leak",
                format!("bystander shutdown left work: {r:?}"),
                "bystander".into(),
            );
        }
        ok
    }
}
