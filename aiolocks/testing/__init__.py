"""Real servers for tests, demos and benchmarks, a TCP fault proxy, pytest fixtures and
:func:`lose` to test loss handlers.

The launchers start ZooKeeper, Redis, PostgreSQL, pgbouncer and etcd from the
installed binaries on free ports in temporary folders (see
:mod:`aiolocks.testing.servers`; PostgreSQL in ``aiolocks.testing._postgres``, etcd
in ``aiolocks.testing._etcd``); the pytest
fixtures live in :mod:`aiolocks.testing.pytest_plugin` (load it with
``-p aiolocks.testing.pytest_plugin`` or
``pytest_plugins = ["aiolocks.testing.pytest_plugin"]``).
"""

import os as _os

# The launchers start servers with fork + a pre-exec hook (so that the server
# dies with the test run). When gRPC (the etcd client) is loaded, its fork
# handlers run in that child and can abort it ("epoll_wait error: Bad file
# descriptor", exit -6) while gRPC threads are busy. gRPC reads this variable
# once, when it is first imported; an explicit setting is left alone.
_os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")

from ._clock import skewed_clock as skewed_clock
from ._etcd import EtcdCluster as EtcdCluster
from ._etcd import EtcdFlavor as EtcdFlavor
from ._etcd import EtcdMember as EtcdMember
from ._etcd import EtcdServer as EtcdServer
from ._etcd import etcd_flavors as etcd_flavors
from ._postgres import PgBouncer as PgBouncer
from ._postgres import PgWireConnection as PgWireConnection
from ._postgres import PostgresCommandError as PostgresCommandError
from ._postgres import PostgresServer as PostgresServer
from .loss import lose as lose
from .proxy import TcpProxy as TcpProxy
from .servers import RedisCluster as RedisCluster
from .servers import RedisSentinel as RedisSentinel
from .servers import RedisSentinelSet as RedisSentinelSet
from .servers import RedisServer as RedisServer
from .servers import RedisServerGroup as RedisServerGroup
from .servers import RespValue as RespValue
from .servers import ServerCommandError as ServerCommandError
from .servers import ServerError as ServerError
from .servers import ServerNotInstalledError as ServerNotInstalledError
from .servers import ServerNotManagedError as ServerNotManagedError
from .servers import ServerStartError as ServerStartError
from .servers import ZooKeeperEnsemble as ZooKeeperEnsemble
from .servers import ZooKeeperEnsembleMember as ZooKeeperEnsembleMember
from .servers import ZooKeeperServer as ZooKeeperServer
from .servers import free_port as free_port

__all__ = [
    "EtcdCluster",
    "EtcdFlavor",
    "EtcdMember",
    "EtcdServer",
    "PgBouncer",
    "PgWireConnection",
    "PostgresCommandError",
    "PostgresServer",
    "RedisCluster",
    "RedisSentinel",
    "RedisSentinelSet",
    "RedisServer",
    "RedisServerGroup",
    "RespValue",
    "ServerCommandError",
    "ServerError",
    "ServerNotInstalledError",
    "ServerNotManagedError",
    "ServerStartError",
    "TcpProxy",
    "ZooKeeperEnsemble",
    "ZooKeeperEnsembleMember",
    "ZooKeeperServer",
    "etcd_flavors",
    "free_port",
    "lose",
    "skewed_clock",
]
