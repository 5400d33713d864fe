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
