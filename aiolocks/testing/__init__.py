"""Real servers for tests, demos and benchmarks, a TCP fault proxy, pytest fixtures and
:func:`lose` to test loss handlers.

The launchers start ZooKeeper, Redis, PostgreSQL and pgbouncer from the
installed binaries on free ports in temporary folders (see
:mod:`aiolocks.testing.servers`; PostgreSQL in ``aiolocks.testing._postgres``); the pytest
fixtures live in :mod:`aiolocks.testing.pytest_plugin` (load it with
``-p aiolocks.testing.pytest_plugin`` or
``pytest_plugins = ["aiolocks.testing.pytest_plugin"]``).
"""

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
    "free_port",
    "lose",
]
