#!/usr/bin/env python3
"""Tests of scripts/bench_report.py's goal table: `python3 scripts/test_bench_report.py`.

They run the report on hand-made raw JSON (no bench, no cargo) and read the REPORT.md it writes.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bench_report  # noqa: E402


def goal_rows(md):
    """The goal table of REPORT.md as {figure: (measured, goal, verdict)}."""
    body = md.split("## Goals", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("area", "---"):
            rows[cells[1]] = tuple(cells[2:])
    return rows


def run_report(docs):
    with tempfile.TemporaryDirectory() as raw, tempfile.TemporaryDirectory() as out:
        for name, doc in docs.items():
            with open(os.path.join(raw, name + ".json"), "w") as fh:
                json.dump(doc, fh)
        subprocess.run([sys.executable, os.path.join(HERE, "bench_report.py"), "--raw", raw, "--out", out,
                        "--no-profile"], check=True, capture_output=True)
        with open(os.path.join(out, "REPORT.md")) as fh:
            md = fh.read()
        saved = {n for n in os.listdir(out) if n.endswith(".json")}
    return md, saved


OVERLAP = {
    "bench": "overlap", "what": "w", "engine": {"backend": "io_uring", "write_mode": "direct"}, "root": "/r",
    "record_bytes": 1 << 20, "bytes_per_run": 1 << 27, "quick": True,
    "calibration": {"engine_write_alone_s": 0.1, "compute_target_us_per_record": 800.0, "spins_per_record": 1000,
                    "spins_per_s": 1e9},
    "engine_vs_longer": {"n": 5, "median": 1.30, "min": 1.1, "max": 1.5},
    "std_vs_longer": {"n": 5, "median": 1.9, "min": 1.8, "max": 2.0},
    "compute_vs_engine_write": {"n": 5, "median": 1.0, "min": 0.9, "max": 1.1},
    "engine_vs_std": {"n": 5, "median": 0.7, "min": 0.6, "max": 0.8},
    "rows": [],
}


def codec_doc(auto_phys=0.3, auto_gain=1.8, rnd_gain=0.97, rnd_cpu=1.02, lz4=0.95, enc=0.9, allocs=0.0):
    """codec.json as benches/benches/codec.rs writes it, with the goal figures as given."""
    def st(m):
        return {"n": 5, "median": m, "min": m - 0.01, "max": m + 0.01, "values": [m] * 5}

    def cfg(ppl, blocks=(0, 0, 512)):
        return {"runs": 5, "logical_bytes": 512 << 20, "physical_bytes": int(ppl * (512 << 20)),
                "write_gb_s": 1.0, "read_gb_s": 1.5, "physical_per_logical": ppl, "physical_per_logical_read": ppl,
                "cpu_s_per_gib_write": 0.5, "cpu_s_per_gib_read": 0.3,
                "blocks": {"raw": blocks[0], "lz4": blocks[1], "zstd": blocks[2]},
                "compress_s_per_gib": 0.2, "decompress_s_per_gib": 0.1, "encrypt_s_per_gib": 0.0,
                "decrypt_s_per_gib": 0.0, "write_gb_s_runs": [1.0] * 5}
    names = ["none", "lz4", "zstd1", "zstd2", "zstd3", "auto", "enc_none", "enc_auto"]
    return {
        "bench": "codec", "what": "w", "engine": {"backend": "io_uring", "write_mode": "direct"}, "root": "/r",
        "quick": True, "bytes_per_run": 512 << 20, "rounds": 5, "block_bytes": 1 << 20,
        "datasets": {
            "lineitem": {"what": "rows", "pool_bytes": 1, "configs": {n: cfg(auto_phys if n == "auto" else 0.45)
                                                                    for n in names}},
            "random": {"what": "random", "pool_bytes": 1, "configs": {n: cfg(1.0, (512, 0, 0))
                                                                  for n in ("none", "lz4", "auto", "enc_none", "enc_auto")}},
        },
        "ratios": {"lineitem_auto_vs_none_gb_s": st(auto_gain), "random_auto_vs_none_gb_s": st(rnd_gain),
                   "random_auto_vs_none_cpu": st(rnd_cpu), "lineitem_lz4_vs_crate": st(lz4),
                   "lineitem_enc_none_vs_none_gb_s": st(enc), "lineitem_enc_auto_vs_auto_gb_s": st(enc),
                   "random_enc_none_vs_none_gb_s": st(enc)},
        "baselines": {"lz4_flex": {"gb_s": 0.8, "gb_per_cpu_s": 0.8, "cpu_s_per_gib": 1.3, "ratio": 0.44},
                      "aes_gcm": {"gb_s": 3.0, "gb_per_cpu_s": 3.0, "cpu_s_per_gib": 0.36, "ratio": 1.0}},
        "encryption_cpu": {"engine_extra_cpu_s_per_gib": 0.4, "crate_cpu_s_per_gib": 0.36},
        "allocs": {"configs": {n: {"writes": 1000, "allocations": int(allocs * 1000), "allocs_per_write": allocs}
                               for n in ("lz4", "zstd1", "auto", "enc_none", "enc_auto")}},
    }


def codec_rows(rows):
    return {g.figure: rows[g.figure] for g in bench_report.GOALS if g.source == "codec"}


class GoalTable(unittest.TestCase):
    def test_every_goal_row_shows_when_no_bench_ran(self):
        md, saved = run_report({})
        rows = goal_rows(md)
        self.assertEqual(set(rows), {g.figure for g in bench_report.GOALS})
        for figure, (measured, _, verdict) in rows.items():
            self.assertEqual(measured, "not measured", figure)
            self.assertIn("not measured", verdict, figure)
        self.assertEqual(saved, set())

    def test_a_missed_goal_is_judged_from_the_table_and_bolded(self):
        md, saved = run_report({"overlap": OVERLAP})
        rows = goal_rows(md)
        measured, goal, verdict = rows[next(g.figure for g in bench_report.GOALS
                                            if g.source == "overlap" and g.op)]
        self.assertTrue(measured.startswith("1.300×"), measured)
        self.assertEqual(goal, "≤ 1.15×")
        self.assertTrue(verdict.startswith("**missed by 0.15"), verdict)
        # The other benches' rows are still there, not measured.
        self.assertIn("not measured", rows[next(g.figure for g in bench_report.GOALS if g.source == "scale")][2])
        self.assertIn("overlap.json", saved)

    def test_a_json_without_the_figure_says_which_field_is_missing(self):
        # capacity.json as the bench wrote it before it measured the points past powers of two.
        old = {"bench": "capacity", "what": "w", "record_struct_bytes": 16, "bytes_per_ticket_at_capacity": 16.0,
               "points": [{"tickets": 65536, "retained_bytes": 1048520, "retained_blocks": 0, "bytes_per_ticket": 16.0,
                           "tickets_used": 65536, "ledger_full_refused_next": True,
                           "released_after_recovery": True, "dhat_sites": None}]}
        md, _ = run_report({"capacity": old})
        rows = goal_rows(md)
        cap = next(g.figure for g in bench_report.GOALS if g.source == "capacity")
        self.assertIn("has no 'worst_bytes_per_ticket'", rows[cap][2])

    def test_a_registered_section_renders_or_says_not_measured(self):
        code = ("import sys; sys.argv = sys.argv[1:]; import bench_report as b; "
                "b.SECTIONS.append(('overlap', 'Extra', lambda d: ['extra median ' + str(d['engine_vs_longer']['median']), ''])); "
                "b.SECTIONS.append(('scale', 'Scale', lambda d: ['never'])); b.main()")
        with tempfile.TemporaryDirectory() as raw, tempfile.TemporaryDirectory() as out:
            with open(os.path.join(raw, "overlap.json"), "w") as fh:
                json.dump(OVERLAP, fh)
            subprocess.run([sys.executable, "-c", code, "x", "--raw", raw, "--out", out, "--no-profile"],
                           check=True, capture_output=True, cwd=HERE)
            with open(os.path.join(out, "REPORT.md")) as fh:
                md = fh.read()
        self.assertIn("## Extra\n\nextra median 1.3", md)
        self.assertIn("## Scale\n\nNot measured (no `scale.json`).", md)

    def test_codec_rows_cover_issue_11s_goals_and_judge_them(self):
        md, saved = run_report({"codec": codec_doc()})
        rows = codec_rows(goal_rows(md))
        # Every row of issue 11's Goals table, the encryption CPU context row and nothing else.
        self.assertEqual(len(rows), 10)
        judged = [(m, v) for m, _, v in rows.values()]
        self.assertEqual(sum(v == "met" for _, v in judged), 9, rows)
        self.assertEqual(sum(v == "context" for _, v in judged), 1, rows)
        auto = next(v for k, v in rows.items() if k.startswith("physical / logical"))
        self.assertTrue(auto[0].startswith("0.300 ("), auto)
        self.assertEqual(auto[1], "≤ 0.4")
        self.assertIn("codec.json", saved)
        self.assertIn("## Codecs and encryption (segment format v2)", md)
        self.assertIn("| auto | 1.000 | 1.500 | 0.300 | – |", md)

    def test_codec_misses_are_bolded_with_their_distance(self):
        md, _ = run_report({"codec": codec_doc(auto_phys=0.45, auto_gain=1.2, rnd_gain=0.9, rnd_cpu=1.2, lz4=0.5,
                                               enc=0.7, allocs=0.25)})
        rows = codec_rows(goal_rows(md))
        verdicts = {k: v[2] for k, v in rows.items()}
        missed = [k for k, v in verdicts.items() if v.startswith("**missed")]
        self.assertEqual(len(missed), 9, verdicts)
        allocs = next(v for k, v in rows.items() if k.startswith("heap allocations per write with"))
        self.assertTrue(allocs[0].startswith("0.2500 (lz4, worst of 5"), allocs)
        self.assertTrue(allocs[2].startswith("**missed: 0.25 above 0"), allocs)
        gain = next(v for k, v in rows.items() if "`Auto` / `None`, direct" in k)
        self.assertTrue(gain[0].startswith("1.20× (median of 5 pairs, 1.19–1.21)"), gain)
        self.assertTrue(gain[2].startswith("**missed by 0.3"), gain)

    def test_codec_json_without_a_figure_names_the_field(self):
        doc = codec_doc()
        del doc["ratios"]["lineitem_lz4_vs_crate"]
        md, _ = run_report({"codec": doc})
        rows = codec_rows(goal_rows(md))
        lz4 = next(v for k, v in rows.items() if "lz4_flex" in k)
        self.assertIn("has no 'lineitem_lz4_vs_crate'", lz4[2])

    def test_verdicts(self):
        le = bench_report.Goal("a", "b", "c", None, "<=", 2.0, unit="")
        ge = bench_report.Goal("a", "b", "c", None, ">=", 0.9)
        ctx = bench_report.Goal("a", "b", "c", None, None, None)
        self.assertEqual(bench_report.verdict(le, 2.0), ("met", True))
        self.assertEqual(bench_report.verdict(le, 3.0)[1], False)
        self.assertEqual(bench_report.verdict(ge, 0.89)[1], False)
        self.assertEqual(bench_report.verdict(ge, None), ("not measured", False))
        self.assertEqual(bench_report.verdict(ctx, 5.0), ("context", True))


if __name__ == "__main__":
    unittest.main()
