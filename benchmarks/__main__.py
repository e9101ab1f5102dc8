"""``python -m benchmarks``: :mod:`benchmarks.run`.

``python -m benchmarks etcd``: :mod:`benchmarks.etcd`.
``python -m benchmarks groups``: :mod:`benchmarks.groups` (groups and partitions against tooz).
``python -m benchmarks once``: :mod:`benchmarks.once` (``once`` against ``SET NX PX``).
``python -m benchmarks postgres``: :mod:`benchmarks.postgres` alone (the main run
has it as its PostgreSQL section).
"""

import sys

if sys.argv[1:2] == ["etcd"]:
    from .etcd import main as etcd_main

    raise SystemExit(etcd_main(sys.argv[2:]))
if sys.argv[1:2] == ["groups"]:
    from .groups import main as groups_main

    raise SystemExit(groups_main(sys.argv[2:]))
if sys.argv[1:2] == ["once"]:
    from .once import main as once_main

    raise SystemExit(once_main(sys.argv[2:]))
if sys.argv[1:2] == ["postgres"]:
    from .postgres import main as postgres_main

    raise SystemExit(postgres_main(sys.argv[2:]))

from .run import main

raise SystemExit(main())
