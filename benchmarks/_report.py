"""Turn a results document into a table, JSON, a PNG chart and docs/benchmarks.md."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

__all__ = [
    "HAND_WRITTEN",
    "chart",
    "keep_hand_written",
    "markdown",
    "table",
    "write_json",
    "write_markdown",
]

#: The line that marks a ``## `` section of docs/benchmarks.md as written by
#: hand (figures of a run of its own, such as ``python -m benchmarks.tls``):
#: regenerating the page keeps such a section as it is, where it stood.
HAND_WRITTEN = "<!-- hand-written: python -m benchmarks keeps this section as it is -->"


def _clean(value: Any) -> Any:
    """JSON has no NaN: map it to null, recursively."""
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def write_json(doc: dict[str, Any], path: Path) -> None:
    """Write the results document (NaN as null)."""
    path.write_text(json.dumps(_clean(doc), indent=2) + "\n")


def _f(value: Any, digits: int = 3, unit: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, int):
        return f"{value}{unit}"
    return f"{float(value):.{digits}g}{unit}"


def _label(doc: dict[str, Any], key: str) -> str:
    return str(doc["contenders"].get(key, {}).get("label", key))


def _server_cost(row: dict[str, Any]) -> str:
    if row.get("server_cpu_us_per_hold") is not None:
        return (
            f"{_f(row['server_cpu_us_per_hold'])} µs CPU, "
            f"{_f(row.get('server_commands_per_hold'))} cmds"
        )
    if row.get("server_requests_per_hold") is not None:
        return f"{_f(row['server_requests_per_hold'])} requests"
    return "-"


def _contended_rows(doc: dict[str, Any], section: str) -> list[list[str]]:
    rows = [
        [
            "service",
            "library",
            "holds/s",
            "handoff p50 ms",
            "p99 ms",
            "aiolocks x (p50)",
            "wait p50 ms",
            "wait p99 ms",
            "Jain",
            "min/max per worker",
            "server per hold",
            "overlaps",
        ]
    ]
    for key, row in doc[section].items():
        adv = row.get("aiolocks_advantage") or {}
        rows.append(
            [
                row["service"],
                _label(doc, key),
                _f(row.get("holds_per_s"), 4),
                _f(row.get("handoff_p50_ms")),
                _f(row.get("handoff_p99_ms")),
                _f(adv.get("handoff_p50")),
                _f(row.get("wait_p50_ms")),
                _f(row.get("wait_p99_ms")),
                _f(row.get("jain")),
                _f(row.get("min_holds_per_worker"), 4)
                + "/"
                + _f(row.get("max_holds_per_worker"), 4),
                _server_cost(row),
                f"{row.get('overlaps', '-')} (+{row.get('lost_updates', 0)} lost)",
            ]
        )
    return rows


def _rows(doc: dict[str, Any]) -> dict[str, list[list[str]]]:
    """Rows of every table, shared by the terminal table and the markdown."""
    tables: dict[str, list[list[str]]] = {}
    rows = [["service", "library", "cycle ms", "aiolocks x", "requests", "in scripts"]]
    for key, row in doc["uncontended"].items():
        rows.append(
            [
                row["service"],
                _label(doc, key),
                _f(row.get("cycle_ms")),
                _f(row.get("aiolocks_advantage")),
                _f(row.get("requests_per_cycle")),
                _f(row.get("script_commands_per_cycle")),
            ]
        )
    tables["uncontended"] = rows
    for section in ("contended", "handoff"):
        tables[section] = _contended_rows(doc, section)
    rows = [["library", "waiters", "drain ms", "aiolocks x", "watches", "requests/waiter"]]
    for key, row in doc["many_waiters"].items():
        rows.append(
            [
                _label(doc, key),
                _f(row.get("waiters")),
                _f(row.get("drain_ms"), 4),
                _f(row.get("aiolocks_advantage")),
                _f(row.get("watches"), 4),
                _f(row.get("requests_per_waiter")),
            ]
        )
    tables["many_waiters"] = rows
    rows = [
        [
            "client",
            "locks",
            "lease s",
            "renewals/s",
            "expected/s",
            "min key TTL s",
            "CPU (1 core)",
            "loop lag p99 ms",
            "lost",
        ]
    ]
    clients = {
        "aiolocks-redis": "aiolocks.connect(url)",
        "aiolocks-redis-blocking-pool": "RedisBackend(client with BlockingConnectionPool)",
    }
    for key, client in clients.items():
        many = doc["many_locks"].get(key)
        if isinstance(many, dict) and "renewals_per_s" in many:
            rows.append(
                [
                    client,
                    str(many["locks"]),
                    _f(many["lease_s"]),
                    _f(many["renewals_per_s"], 4),
                    _f(many["expected_renewals_per_s"], 4),
                    _f(many["min_key_ttl_ms"] / 1000),
                    f"{100 * many['cpu_share']:.0f}%",
                    _f(many.get("loop_lag_p99_ms")),
                    f"{many['lost']} of {many['locks']}",
                ]
            )
        elif isinstance(many, dict) and "error" in many:
            rows.append([client, *["-"] * 7, many["error"][:80]])
    tables["many_locks"] = rows
    tables["redis_many_waiters"] = _redis_waiter_rows(doc)
    tables["loss_latency"] = _loss_rows(doc)
    rows = [["target", "measured", "met"]]
    for target in doc.get("targets", []):
        met = {True: "yes", False: "NO", None: "not evaluated"}[target["met"]]
        rows.append([target["goal"], target["measured"], met])
    tables["targets"] = rows
    return tables


def _redis_waiter_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = [
        [
            "library",
            "processes x tasks",
            "EVALSHA/hold",
            "commands/hold",
            "server CPU us/hold",
            "holds/s",
            "wait p99 ms",
            "handoff p50 ms",
            "overlaps",
        ]
    ]
    section = doc.get("redis_many_waiters", {})
    if "error" in section:
        rows.append(["aiolocks-redis", *["-"] * 7, section["error"][:80]])
    for row in section.get("rows", []):
        rows.append(
            [
                _label(doc, row["library"]),
                f"{row['processes']} x {row['tasks']}",
                _f(row.get("server_evalsha_per_hold")),
                _f(row.get("server_commands_per_hold")),
                _f(row.get("server_cpu_us_per_hold")),
                _f(row.get("holds_per_s"), 4),
                _f(row.get("wait_p99_ms")),
                _f(row.get("handoff_p50_ms")),
                str(row.get("overlaps", "-")),
            ]
        )
    return rows


#: peers with no loss detection at all: a hold taken from them is never noticed
NEVER_NOTICE = {"redis": "redis-py, python-redis-lock, pottery, aioredlock", "zookeeper": "kazoo"}


def _loss_rows(doc: dict[str, Any]) -> list[list[str]]:
    rows = [["backend", "samples", "p50 ms", "p99 ms", "max ms", "missed"]]
    for service in ("redis", "zookeeper"):
        loss = doc.get("loss_latency", {}).get(service)
        if isinstance(loss, dict) and "error" in loss:
            rows.append([f"aiolocks {service}", "-", "-", "-", "-", loss["error"][:80]])
        elif isinstance(loss, dict):
            rows.append(
                [
                    f"aiolocks {service}",
                    str(loss["samples"]),
                    _f(loss.get("p50_ms")),
                    _f(loss.get("p99_ms")),
                    _f(loss.get("max_ms")),
                    str(loss.get("missed", "-")),
                ]
            )
        else:
            continue
        rows.append([NEVER_NOTICE[service], "-", "never", "never", "never", "all"])
    return rows


def _render(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


TITLES = {
    "uncontended": "Uncontended acquire+release (median per cycle; requests counted on the server)",
    "contended": "Contended, closed loop: processes x tasks on one lock, think time between holds",
    "handoff": "Handoff: every release goes to a queued waiter "
    "(a releaser asks again only after the next entry)",
    "many_waiters": "Many waiters on one ZooKeeper lock",
    "redis_many_waiters": "Many waiters on one Redis lock, one run each, side by side "
    "(per acquisition, counted on the server)",
    "many_locks": "Many held Redis locks kept alive by the aiolocks watchdog",
    "loss_latency": "Loss latency: held lock deleted on the server by another client until "
    "the async with body is cancelled",
    "targets": "Targets (issue 6)",
}


def _postgres_rows(doc: dict[str, Any]) -> list[list[str]]:
    """The PostgreSQL section (``benchmarks.postgres``): one row per contender."""
    pg = doc.get("postgres") or {}
    if "uncontended_cycle_us" not in pg:
        return []
    rows = [["contender", "uncontended cycle", "x floor", "contended holds/s", "x floor"]]
    for name, us in pg["uncontended_cycle_us"].items():
        holds = pg["contended_holds_per_s"].get(name)
        rows.append(
            [
                name,
                _f(round(us), unit=" µs"),
                _f(pg["uncontended_vs_floor"][name], 3),
                _f(None if holds is None else round(holds)),
                _f(pg["contended_vs_floor"].get(name), 3),
            ]
        )
    return rows


def _postgres_drain(doc: dict[str, Any]) -> str:
    drain = (doc.get("postgres") or {}).get("many_waiters")
    if not drain:
        return ""
    return (
        f"{drain['waiters']} waiters (two backends) drained in {drain['drain_s']:.2f} s; "
        f"{drain['server_transactions_per_hold']:.2f} server transactions per hold"
    )


def table(doc: dict[str, Any]) -> str:
    """The results as plain-text tables."""
    parts = []
    for name, rows in _rows(doc).items():
        if len(rows) > 1:
            parts.append(f"\n{TITLES[name]}\n{_render(rows)}")
    pg_rows = _postgres_rows(doc)
    if pg_rows:
        parts.append(f"\nPostgreSQL (benchmarks.postgres)\n{_render(pg_rows)}")
        parts.append(_postgres_drain(doc))
    elif "error" in (doc.get("postgres") or {}):
        parts.append(f"\nPostgreSQL not run: {doc['postgres']['error']}")
    missing = [
        f"  {key}: {c['reason']}" for key, c in doc["contenders"].items() if not c["available"]
    ]
    if missing:
        parts.append("\nNot run:\n" + "\n".join(missing))
    return "\n".join(parts)


def _md(rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(rows[0]) + " |", "|" + "---|" * len(rows[0])]
    out += ["| " + " | ".join(c.replace("|", "/") for c in r) + " |" for r in rows[1:]]
    return "\n".join(out)


def markdown(doc: dict[str, Any]) -> str:
    """docs/benchmarks.md: the figures, the method, and how to rerun."""
    meta = doc["meta"]
    plan = meta["plan"]
    tables = _rows(doc)
    versions = ", ".join(
        f"{c['label'].split(' ')[0]} {c['version']}"
        for key, c in doc["contenders"].items()
        if c.get("version") and key not in ("redis-py-tuned", "aiolocks-zk")
    )
    lines = [
        "# Benchmarks",
        "",
        "aiolocks side by side with the locks users would otherwise pick, in one run on",
        "the same servers, rounds interleaved (A B C … C B A …) so machine drift lands on",
        "everyone alike; every figure is a median over rounds. Rerun with",
        "`python -m benchmarks` (about 8 minutes; `--quick` for about 2); it starts its own",
        "`redis-server` and ZooKeeper and writes `benchmarks/results/latest.json` and",
        "`latest.png`.",
        "",
        "![benchmarks](benchmarks.png)",
        "",
        f"Measured {meta['started']} on {meta['platform']}, {meta['cpus']} CPUs, Python "
        f"{meta['python']}, Redis {meta.get('redis_server', '-')}, ZooKeeper "
        f"{meta.get('zookeeper_server', '-')}; {versions}. The machine was shared with other "
        "jobs: absolute times move between runs, ratios much less.",
        "",
        "## Targets",
        "",
        _md(tables["targets"]),
        "",
        "## Uncontended acquire + release",
        "",
        f"One task, one lock, {plan['cycles']} cycles per round after {plan['warmup']} "
        f"warm-up cycles, {plan['uncontended_rounds']} rounds, after one unmeasured round "
        f"of {plan['cycles'] * 3} cycles per library (ZooKeeper's JIT warms up first). "
        "*requests*: client requests "
        "per cycle seen by Redis `MONITOR` or ZooKeeper `mntr` (`zk_packets_received`);",
        "*in scripts*: commands run inside Lua scripts. *aiolocks x*: the library's time",
        "divided by aiolocks's (above 1: aiolocks is faster).",
        "",
        _md(tables["uncontended"]),
        "",
        "## Contended",
        "",
        f"{plan['processes']} processes x {plan['tasks']} tasks (threads for kazoo and "
        f"python-redis-lock) on one lock for {plan['duration_s']:g} s, "
        f"{plan['contended_rounds']} rounds. A critical section reads a counter in a file "
        f"shared by the processes, sleeps {1000 * plan['hold_s']:g} ms and writes it back "
        f"+ 1; then the worker thinks {1000 * plan['think_s']:g} ms (±50 %) before asking "
        "again. *handoff*: from a holder's exit to the entry of a *different* worker that "
        "was already waiting (lock idle while somebody queued); *wait*: request to grant. "
        "*Jain*: Jain's fairness index of holds per worker (1 = even). *overlaps*: critical "
        "sections that began before the previous one ended (timestamps on the shared "
        "`CLOCK_MONOTONIC`), plus counter updates lost to a race: both must be 0. "
        "*server per hold*: what the server did per hold over the whole run: Redis CPU time "
        "(`INFO cpu`) and commands (`total_commands_processed`, commands inside scripts "
        "included), or ZooKeeper requests (`zk_packets_received`). Polling shows up here.",
        "",
        _md(tables["contended"]),
        "",
        "In this closed loop a polling lock (redis-py, pottery, aioredlock) is mostly",
        "re-taken by the worker that just released it, once its think time is over, while",
        "the sleeping waiters miss their turn: few handoffs happen, and those that do are",
        "capped by the think time. Their cost shows in *wait p99* and *Jain* instead.",
        "The handoff scenario below removes that effect.",
        "",
        "## Handoff",
        "",
        f"{plan['handoff_processes']} processes x {plan['handoff_tasks']} task on one lock "
        f"for {plan['handoff_duration_s']:g} s, {plan['contended_rounds']} rounds, the same "
        "critical section, no think time, but a worker that let go asks again only once "
        "another worker has entered (a second slot in the shared file counts entries). So "
        "every release goes to a worker that is already queued, and a releaser never races "
        "its own waiters: *handoff* is the pure release-to-next-holder latency. For a lock "
        "that polls every *s* seconds with *n* waiters it is about *s*/(*n*+1) on average "
        "(redis-py's default *s* = 0.1 s).",
        "",
        _md(tables["handoff"]),
        "",
    ]
    if len(tables["many_waiters"]) > 1:
        lines += [
            "## Many waiters (ZooKeeper)",
            "",
            f"One holder and {plan['waiters']} waiting tasks (threads for kazoo) on one "
            "lock in one session; the holder lets go and every waiter takes and releases "
            "the lock in turn. *watches*: total from `wchs` with the queue complete (one per "
            "waiter means no herd); *requests/waiter*: `zk_packets_received` during the "
            "drain.",
            "",
            _md(tables["many_waiters"]),
            "",
        ]
    if len(tables["many_locks"]) > 1:
        lines += [
            "## Many held locks (Redis watchdog)",
            "",
            "One process holds the locks (one task each); the watchdog renews every "
            "`lease_time / 3`. Kept up = no hold lost, every key keeps at least a third of its "
            "lease as TTL, and at least 90 % of the expected renewals reached Redis. "
            "*renewals/s* counted on Redis (`EVALSHA` in `INFO commandstats`) over the window; "
            "*CPU*: process CPU time / wall time over the window; *loop lag*: how late a "
            "10 ms `asyncio.sleep` wakes up.",
            "",
            _md(tables["many_locks"]),
            "",
            "The peers are not in this table: redis-py, pottery and aioredlock do not renew",
            "leases, and python-redis-lock's `auto_renewal` starts one thread per lock.",
            "The second row gives aiolocks a client whose pool waits for a free connection",
            "(`redis.asyncio.BlockingConnectionPool`, 100 connections) instead of redis-py's",
            "default pool, which raises `MaxConnectionsError` past 100 commands in flight.",
            "",
        ]
    if len(tables["redis_many_waiters"]) > 1:
        lines += [
            "## Many waiters (Redis)",
            "",
            "*W* worker processes (one waiting task each, or *tasks* each) take turns on one",
            "lock, as in the handoff scenario (a worker asks again only after another one",
            "entered), aiolocks and python-redis-lock one after the other on the same server.",
            "Per hold, counted on the server: `EVALSHA` calls (`INFO commandstats`), all",
            "commands executed including those run inside scripts",
            "(`total_commands_processed`), and server CPU (`INFO cpu`, idle CPU subtracted).",
            "",
            _md(tables["redis_many_waiters"]),
            "",
        ]
    if len(tables["loss_latency"]) > 1:
        lines += [
            "## Loss latency",
            "",
            "A mutex is held, its `async with` body waits; another client deletes the lock's",
            "Redis key or ZooKeeper node; the time until the body's cancellation arrives.",
            "ZooKeeper: the clock starts before the delete is sent; Redis: when the `DEL`",
            "returned. *missed*: no cancellation within 10 s (none expected). The peers have",
            "no loss detection: their bodies run on, *never* told.",
            "",
            _md(tables["loss_latency"]),
            "",
        ]
    pg_rows = _postgres_rows(doc)
    if pg_rows:
        lines += [
            "## PostgreSQL",
            "",
            "`benchmarks.postgres` on a throwaway server (`fsync=off`), in the same run:",
            "the bare `pg_try_advisory_lock`/`pg_advisory_unlock` pair on asyncpg (the",
            "floor), the floor plus a `nextval()` and plus a fencing-row upsert, both",
            "aiolocks modes, a `SELECT … FOR UPDATE` lock row and `asyncpg-lock` (when",
            "installed). Uncontended: median cycle over interleaved rounds; contended:",
            "completed holds per second of several tasks on one name. See",
            "`docs/postgres.md` for the reading.",
            "",
            _md(pg_rows),
            "",
            f"Many waiters: {_postgres_drain(doc)}.",
            "",
        ]
    missing = [
        f"- {c['label']}: {c['reason']}" for c in doc["contenders"].values() if not c["available"]
    ]
    if missing:
        lines += ["## Not run", "", *missing, ""]
    lines += [
        "## Notes on the peers",
        "",
        *[f"- **{c['label']}**: {c['note']}" for c in doc["contenders"].values()],
        "",
    ]
    return "\n".join(lines)


def _sections(text: str) -> list[tuple[str, str]]:
    """``(heading, text)`` of each ``## `` section; what comes before the first: heading ``""``."""
    sections: list[tuple[str, str]] = []
    heading = ""
    lines: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.startswith("## "):
            sections.append((heading, "".join(lines)))
            heading, lines = line[3:].strip(), []
        lines.append(line)
    sections.append((heading, "".join(lines)))
    return sections


def keep_hand_written(generated: str, existing: str) -> str:
    """``generated`` with the :data:`HAND_WRITTEN` sections of ``existing`` put back.

    Each goes right after the section it followed in ``existing`` (the first
    one before it that ``generated`` also has), or first after the title when
    none is left; it replaces a generated section of the same heading.
    """
    old = _sections(existing)
    out = _sections(generated)
    for index, (heading, body) in enumerate(old):
        if HAND_WRITTEN not in body:
            continue
        out = [(h, b) for h, b in out if h != heading]
        headings = [h for h, _ in out]
        before = next((h for h, _ in reversed(old[:index]) if h in headings), "")
        out.insert(headings.index(before) + 1 if before in headings else 1, (heading, body))
    text = "".join(body if body.endswith("\n") else body + "\n" for _, body in out[:-1])
    return text + out[-1][1]


def write_markdown(doc: dict[str, Any], path: Path) -> None:
    """Write :func:`markdown` of ``doc`` to ``path``, keeping its hand-written sections."""
    generated = markdown(doc)
    if path.exists():
        generated = keep_hand_written(generated, path.read_text())
    path.write_text(generated)


def chart(doc: dict[str, Any], path: Path) -> None:
    """A 2x2 PNG: uncontended cycle, contended handoff, contended throughput, many waiters."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(13, 8.5))
    colors = {"redis": "#c0392b", "zookeeper": "#2471a3"}

    def bars(
        ax: Any, items: list[tuple[str, str, float]], title: str, xlabel: str, log: bool = False
    ) -> None:
        if not items:
            ax.set_visible(False)
            return
        short = {"redis": "Redis", "zookeeper": "ZK"}
        labels = [f"{label} ({short.get(svc, svc)})" for label, svc, _ in items]
        values = [v for _, _, v in items]
        bar_colors = [
            colors[svc] if not label.startswith("aiolocks") else "#1e8449"
            for label, svc, _ in items
        ]
        ypos = range(len(items))
        ax.barh(list(ypos), values, color=bar_colors)
        ax.set_yticks(list(ypos), labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_title(title, fontsize=10)
        if log:
            ax.set_xscale("log")
            ax.set_xlim(min(values) / 1.5, max(values) * 3)
        else:
            ax.set_xlim(0, max(values) * 1.15)
        ax.set_xlabel(xlabel, fontsize=9)
        for y, v in zip(ypos, values, strict=True):
            ax.text(v, y, f" {v:.3g}", va="center", fontsize=7)

    def collect(section: str, key: str) -> list[tuple[str, str, float]]:
        out = []
        for name, row in doc[section].items():
            value = row.get(key) if isinstance(row, dict) else None
            if value is None or (isinstance(value, float) and math.isnan(value)):
                continue
            service = row.get("service", "zookeeper")
            out.append((_label(doc, name), service, float(value)))
        return out

    bars(
        axes[0][0],
        collect("uncontended", "cycle_ms"),
        "Uncontended acquire+release",
        "ms per cycle (lower is better)",
    )
    handoff = collect("handoff", "handoff_p50_ms")
    bars(
        axes[0][1],
        handoff,
        f"Handoff p50 to a queued waiter ({doc['meta']['plan']['handoff_processes']} processes)",
        "ms, log scale (lower is better)",
        log=True,
    )
    bars(
        axes[1][0],
        collect("contended", "holds_per_s"),
        "Contended throughput (closed loop, think time)",
        "holds per second (higher is better)",
    )
    bars(
        axes[1][1],
        collect("many_waiters", "drain_ms"),
        "Many waiters on one ZooKeeper lock: drain",
        "ms to serve every waiter (lower is better)",
    )
    many = doc["many_locks"].get("aiolocks-redis")
    subtitle = ""
    if isinstance(many, dict) and "renewals_per_s" in many:
        subtitle = (
            f"\n{many['locks']} held Redis locks, lease {many['lease_s']:g} s: "
            f"{many['renewals_per_s']:.0f} renewals/s of {many['expected_renewals_per_s']:.0f} "
            f"expected, {100 * many['cpu_share']:.0f}% of one core, {many['lost']} lost"
        )
    fig.suptitle(
        f"aiolocks vs peers ({doc['meta'].get('mode', '')} run, {doc['meta']['cpus']} CPUs, "
        f"medians of interleaved rounds){subtitle}",
        fontsize=11,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
