"""aiolocks: distributed locks for asyncio.

Apache Curator's ZooKeeper recipes and Redisson's Redis locks behind one
``async with lock:`` API, with an in-process ``memory://`` backend as the
embedded default::

    import aiolocks

    async with aiolocks.connect("memory://") as backend:
        async with backend.mutex("locks/pay/order-1001").hold(timeout=5):
            ...

Reentrancy belongs to the current asyncio task; waiting is event-driven; a
lost hold cancels the body of ``async with`` and raises ``LockLostError``;
cancelling a task at any await point never leaks a lock.
"""

from ._connect import connect as connect
from ._core.admin import LockInfo as LockInfo
from ._core.backend import Backend as Backend
from ._core.barrier import Barrier as Barrier
from ._core.countdown import CountDownLatch as CountDownLatch
from ._core.doctor import DoctorReport as DoctorReport
from ._core.doctor import Finding as Finding
from ._core.doctor import SelfTest as SelfTest
from ._core.doctor import Severity as Severity
from ._core.driver import Capabilities as Capabilities
from ._core.errors import AccessDeniedError as AccessDeniedError
from ._core.errors import BackendUnavailableError as BackendUnavailableError
from ._core.errors import BrokenBarrierError as BrokenBarrierError
from ._core.errors import DeadlockError as DeadlockError
from ._core.errors import InvalidLockNameError as InvalidLockNameError
from ._core.errors import LockError as LockError
from ._core.errors import LockLostError as LockLostError
from ._core.errors import LockNotOwnedError as LockNotOwnedError
from ._core.errors import LockTimeoutError as LockTimeoutError
from ._core.events import EventHook as EventHook
from ._core.events import LockEvent as LockEvent
from ._core.group import Group as Group
from ._core.group import GroupMembership as GroupMembership
from ._core.group import Member as Member
from ._core.leader import LeaderLatch as LeaderLatch
from ._core.locks import HoldContext as HoldContext
from ._core.locks import Lock as Lock
from ._core.locks import Mutex as Mutex
from ._core.locks import ReadLock as ReadLock
from ._core.locks import ReadWriteLock as ReadWriteLock
from ._core.locks import SemaphoreMutex as SemaphoreMutex
from ._core.locks import WriteLock as WriteLock
from ._core.multilock import MultiLock as MultiLock
from ._core.names import validate_name as validate_name
from ._core.once import Once as Once
from ._core.participants import Participant as Participant
from ._core.partitioner import Partition as Partition
from ._core.partitioner import Partitioner as Partitioner
from ._core.semaphore import Lease as Lease
from ._core.semaphore import LeaseContext as LeaseContext
from ._core.semaphore import Semaphore as Semaphore
from ._once import once as once

__version__ = "0.1.0.dev0"

__all__ = [
    "AccessDeniedError",
    "Backend",
    "BackendUnavailableError",
    "Barrier",
    "BrokenBarrierError",
    "Capabilities",
    "CountDownLatch",
    "DeadlockError",
    "DoctorReport",
    "EventHook",
    "Finding",
    "Group",
    "GroupMembership",
    "HoldContext",
    "InvalidLockNameError",
    "LeaderLatch",
    "Lease",
    "LeaseContext",
    "Lock",
    "LockError",
    "LockEvent",
    "LockInfo",
    "LockLostError",
    "LockNotOwnedError",
    "LockTimeoutError",
    "Member",
    "MultiLock",
    "Mutex",
    "Once",
    "Participant",
    "Partition",
    "Partitioner",
    "ReadLock",
    "ReadWriteLock",
    "SelfTest",
    "Semaphore",
    "SemaphoreMutex",
    "Severity",
    "WriteLock",
    "connect",
    "once",
    "validate_name",
]
