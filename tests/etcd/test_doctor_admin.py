"""``doctor`` and ``list``/``break`` on etcd, against both server builds."""

from __future__ import annotations

from typing import Any

import pytest

import aiolocks
from aiolocks import LockLostError
from aiolocks._core.driver import Family
from aiolocks._core.participants import Participant
from aiolocks.etcd._client import EtcdClient, KeyValue
from aiolocks.etcd._doctor import (
    leader_findings,
    plaintext_finding,
    ttl_finding,
    version_finding,
)
from aiolocks.testing import EtcdServer

from ..polling import eventually

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


def test_plaintext_finding_is_info_on_loopback_only() -> None:
    assert plaintext_finding(["127.0.0.1:2379", "localhost:2379"]).severity.value == "info"
    assert plaintext_finding(["[::1]:2379"]).severity.value == "info"
    found = plaintext_finding(["127.0.0.1:2379", "10.0.0.2:2379"])
    assert found.code == "etcd-no-tls" and found.severity.value == "warning"


@pytest.mark.asyncio
async def test_doctor_finds_an_open_cluster(etcd: EtcdServer, prefix: str) -> None:
    """Auth disabled (AuthStatus on 3.5, inferred on 3.4, which lacks it), no TLS."""
    async with aiolocks.connect(f"{etcd.url}/{prefix.rstrip('/')}") as backend:
        report = await backend.doctor(self_test=False)
    found = {f.code: f for f in report.findings}
    assert found["etcd-open"].severity is aiolocks.Severity.WARNING, report.findings
    assert found["etcd-no-tls"].severity is aiolocks.Severity.INFO  # loopback
    assert ("3.4" in str(found["etcd-open"].details["how"])) == etcd.version().startswith("3.4")


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
        # the holder's own watch reports the delete
        await eventually(lambda: lock.is_lost, what="the holder told of the loss")
        with pytest.raises(LockLostError):
            await lock.release()
        assert await admin.force_release("jobs/a") == 0
        assert {i.name for i in await admin.list_locks("jobs/")} == {"jobs/b"}
        await lease.release()
        await other.release()
        assert await admin.list_locks("") == []


@pytest.mark.asyncio
async def test_break_spares_a_key_written_again_after_the_listing(
    etcd: EtcdServer, prefix: str, client: EtcdClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between ``break``'s read and its delete the holder's key is written again
    (a newer hold under the same key): the delete compares the create revision
    it read, so the newer key stays."""
    url = f"{etcd.url}/{prefix.rstrip('/')}"
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as admin:
        lock = backend.mutex("jobs/a")
        assert await lock.acquire(timeout=10)
        driver: Any = admin._driver  # the hook sits between the read and the delete
        read = driver.participants
        rewritten: list[KeyValue] = []

        async def read_then_rewrite(name: str, family: Family) -> list[Participant]:
            found: list[Participant] = await read(name, family)
            keys = [p.node.encode() for p in found if p.is_holder and p.node]
            if family is not Family.MUTEX or not keys:
                return found
            (key,) = keys
            await client.delete(key)
            await client.put(key, b"newer holder")
            kv = await client.get(key)
            assert kv is not None
            rewritten.append(kv)
            return found

        monkeypatch.setattr(driver, "participants", read_then_rewrite)
        assert await admin.force_release("jobs/a") == 0
        (kv,) = rewritten
        survivor = await client.get(kv.key)
        assert survivor is not None and survivor.create_revision == kv.create_revision
        monkeypatch.undo()
        await client.delete(kv.key)
        await eventually(lambda: lock.is_lost, what="the first holder seeing its key go")


@pytest.mark.asyncio
async def test_delete_holds_with_a_stale_revision_deletes_nothing(
    etcd: EtcdServer, prefix: str
) -> None:
    url = f"{etcd.url}/{prefix.rstrip('/')}"
    async with aiolocks.connect(url) as backend, aiolocks.connect(url) as admin:
        lock = backend.mutex("jobs/a")
        assert await lock.acquire(timeout=10)
        (info,) = await admin.list_locks("jobs/a")
        holder = info.participants[0]
        assert holder.node is not None and holder.fencing_token is not None
        driver: Any = admin._driver
        key = holder.node.encode()
        assert await driver.admin().delete_holds([(key, holder.fencing_token - 1)]) == 0
        assert not lock.is_lost
        assert await driver.admin().delete_holds([(key, holder.fencing_token)]) == 1
        await eventually(lambda: lock.is_lost, what="the holder seeing its key deleted")
