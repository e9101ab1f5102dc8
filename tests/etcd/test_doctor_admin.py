"""``doctor`` and ``list``/``break`` on etcd, against both server builds."""

from __future__ import annotations

import asyncio

import pytest

import aiolocks
from aiolocks import LockLostError
from aiolocks.etcd._doctor import leader_findings, ttl_finding, version_finding
from aiolocks.testing import EtcdServer

pytestmark = pytest.mark.etcd


def test_version_finding_present_below_3_5() -> None:
    found = version_finding("h:2379", "3.4.23")
    assert found is not None and found.code == "etcd-version"
    assert version_finding("h:2379", "3.5.1") is None
    assert version_finding("h:2379", "3.6.0") is None


def test_ttl_finding_present_when_short() -> None:
    found = ttl_finding(2, 2)  # election timeout ~1.3 s: 2 s < 4 s
    assert found is not None and found.code == "etcd-lease-ttl"
    assert ttl_finding(10, 2) is None


def test_leader_findings() -> None:
    assert leader_findings({"a": {"leader": 7}, "b": {"leader": 7}}) == []
    assert [f.code for f in leader_findings({"a": {"leader": 0}})] == ["etcd-no-leader"]
    split = leader_findings({"a": {"leader": 7}, "b": {"leader": 9}})
    assert [f.code for f in split] == ["etcd-split-leader"]


@pytest.mark.asyncio
async def test_doctor_live(etcd: EtcdServer, prefix: str) -> None:
    version = etcd.version()
    async with aiolocks.connect(f"{etcd.url}/{prefix.rstrip('/')}?lease_ttl=1") as backend:
        report = await backend.doctor()
    codes = report.codes()
    assert ("etcd-version" in codes) == version.startswith("3.4"), (version, codes)
    # the test servers' election timeout is short, but no etcd grants a lease
    # shorter than 1.5 election timeouts, so lease_ttl=1 is always too short
    assert "etcd-lease-ttl" in codes
    assert "etcd-no-leader" not in codes
    assert report.self_test is not None and report.self_test.ok, report.self_test
    async with aiolocks.connect(f"{etcd.url}/{prefix.rstrip('/')}?lease_ttl=30") as backend:
        report = await backend.doctor(self_test=False)
    assert "etcd-lease-ttl" not in report.codes()


@pytest.mark.asyncio
async def test_list_and_break(etcd: EtcdServer, prefix: str) -> None:
    url = f"{etcd.url}/{prefix.rstrip('/')}"
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as admin:
        lock = backend.mutex("jobs/a")
        sem = backend.semaphore("jobs/b", 2)
        other = backend.mutex("other/c")
        await lock.acquire()
        lease = await sem.acquire()
        assert lease is not None
        await other.acquire()
        listed = {(i.kind, i.name) for i in await admin.list_locks("jobs/")}
        assert listed == {("mutex", "jobs/a"), ("semaphore", "jobs/b")}
        assert await admin.force_release("jobs/a") == 1
        for _ in range(500):  # the holder's own watch reports the delete
            if lock.is_lost:
                break
            await asyncio.sleep(0.01)
        assert lock.is_lost
        with pytest.raises(LockLostError):
            await lock.release()
        assert await admin.force_release("jobs/a") == 0
        assert {i.name for i in await admin.list_locks("jobs/")} == {"jobs/b"}
        await lease.release()
        await other.release()
        assert await admin.list_locks("") == []
