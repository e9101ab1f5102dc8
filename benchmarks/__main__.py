"""``python -m benchmarks``: :mod:`benchmarks.run`.

``python -m benchmarks etcd``: :mod:`benchmarks.etcd`.
"""

import sys

if sys.argv[1:2] == ["etcd"]:
    from .etcd import main as etcd_main

    raise SystemExit(etcd_main(sys.argv[2:]))

from .run import main

raise SystemExit(main())
