"""A tiny run of the benchmark harness: the report has its shape and no lock ever overlapped.

This checks the plumbing (servers, worker processes, counters, report,
chart) and the safety counts, never timings: the figures of a smoke run
mean nothing. The harness runs in a subprocess, as users run it, so the
peers' own warnings stay out of this test's ``filterwarnings = error``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.redis, pytest.mark.zookeeper, pytest.mark.slow]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    out = tmp_path_factory.mktemp("bench")
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--smoke", "--no-docs", "--out", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, f"harness failed:\n{proc.stdout}\n{proc.stderr}"
    doc: dict[str, Any] = json.loads((out / "latest.json").read_text())
    reason = doc["contenders"]["aiolocks-redis"]["reason"] or ""
    if reason.startswith("no Redis server"):
        pytest.skip(reason)
    return doc, out


def _available(doc: dict[str, Any], section: str) -> dict[str, dict[str, Any]]:
    return {k: v for k, v in doc[section].items() if doc["contenders"].get(k, {}).get("available")}


@pytest.mark.timeout(300)
def test_report_has_every_section_and_aiolocks_ran(report: tuple[dict[str, Any], Path]) -> None:
    doc, out = report
    for section in ("meta", "contenders", "uncontended", "contended", "handoff", "targets"):
        assert section in doc
    assert doc["meta"]["mode"] == "smoke"
    assert doc["contenders"]["aiolocks-redis"]["available"] is True
    # every contender is listed, with a reason when it did not run
    for entry in doc["contenders"].values():
        assert entry["available"] or entry["reason"]
    assert {t["name"] for t in doc["targets"]} >= {
        "redis_contended_handoff",
        "redis_uncontended_cycle",
        "redis_many_locks",
        "no_overlaps",
    }
    assert (out / "latest.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(300)
def test_uncontended_rows_measure_time_and_server_requests(
    report: tuple[dict[str, Any], Path],
) -> None:
    doc, _ = report
    rows = _available(doc, "uncontended")
    assert "aiolocks-redis" in rows
    for key, row in rows.items():
        assert "error" not in row, (key, row)
        assert len(row["rounds_ms"]) == doc["meta"]["plan"]["uncontended_rounds"]
        assert row["cycle_ms"] > 0
        assert row["requests_per_cycle"] >= 1, key  # counted on the server
    # docs/redis.md: an uncontended acquire + release is exactly two EVALSHA
    assert rows["aiolocks-redis"]["requests_by_command"] == {"EVALSHA": 2.0}
    assert rows["aiolocks-redis"]["aiolocks_advantage"] == pytest.approx(1.0)


@pytest.mark.timeout(300)
def test_no_overlaps_and_no_lost_updates_anywhere(report: tuple[dict[str, Any], Path]) -> None:
    doc, _ = report
    checked = 0
    for section in ("contended", "handoff"):
        for key, row in _available(doc, section).items():
            assert "error" not in row, (section, key, row)
            assert row["overlaps"] == 0, (section, key)
            assert row["lost_updates"] == 0, (section, key)
            cost = (
                "server_cpu_us_per_hold"
                if row["service"] == "redis"
                else "server_requests_per_hold"
            )
            assert row[cost] is not None and row[cost] >= 0, (section, key)
            for one in row["rounds"]:
                assert one["holds"] > 0, (section, key)
                assert one["holds_total"] >= one["holds"]
                assert 0 < one["jain"] <= 1
            checked += 1
    for key, row in doc["many_waiters"].items():
        assert row["overlaps"] == 0, key
        assert all(r["completed"] == r["waiters"] for r in row["rounds"]), key
    assert checked >= 2
    safety = next(t for t in doc["targets"] if t["name"] == "no_overlaps")
    assert safety["met"] is True


@pytest.mark.timeout(300)
def test_many_locks_are_all_kept(report: tuple[dict[str, Any], Path]) -> None:
    doc, _ = report
    many = doc["many_locks"]["aiolocks-redis"]
    assert "error" not in many, many
    assert many["locks"] == doc["meta"]["plan"]["many_locks"]
    assert many["lost"] == 0
    assert many["still_held"] == many["locks"]
    assert many["keys_at_end"] == many["locks"]
    assert many["min_key_ttl_ms"] > 0
    assert many["renewals_per_s"] > 0


@pytest.mark.timeout(300)
def test_zookeeper_loss_is_reported_for_every_deleted_node(
    report: tuple[dict[str, Any], Path],
) -> None:
    doc, _ = report
    loss = doc.get("loss_latency", {}).get("zookeeper")
    if loss is None:
        pytest.skip("ZooKeeper did not run")
    assert "error" not in loss, loss
    assert loss["missed"] == 0
    assert loss["samples"] == max(10, doc["meta"]["plan"]["cost_cycles"])
    assert 0 < loss["p50_ms"] <= loss["p99_ms"] <= loss["max_ms"]


@pytest.mark.timeout(300)
@pytest.mark.postgres
def test_postgres_section_ran_without_overlap(report: tuple[dict[str, Any], Path]) -> None:
    doc, _ = report
    pg = doc["postgres"]
    if str(pg.get("error", "")).startswith("no PostgreSQL server"):
        pytest.skip(pg["error"])
    assert "error" not in pg, pg  # an overlap would be an Overlap error here
    assert {"floor", "aiolocks-advisory", "aiolocks-lease", "for-update"} <= set(
        pg["uncontended_cycle_us"]
    )
    assert set(pg["contended_holds_per_s"]) >= {"floor", "aiolocks-advisory"}
    assert pg["many_waiters"]["waiters"] >= 1 and pg["many_waiters"]["drain_s"] > 0
