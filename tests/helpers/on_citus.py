"""Whether this run is on a Citus cluster (`TEST_CITUS=1`: the root `database_url` fixture starts
one, tests/conftest.py), and the mark of the few tests that do not run there, each with its
reason: `make test-citus` runs the domain suites on the cluster, where every statement the
service sends that reaches more than one shard fails."""

from __future__ import annotations

import os
from typing import Final

import pytest

ON_CITUS: Final = os.environ.get("TEST_CITUS") == "1"


def not_on_citus(reason: str) -> pytest.MarkDecorator:
    """Skipped on the cluster: the test needs what a run on it does not have (servers of its
    own, a single node's plans)."""
    return pytest.mark.skipif(ON_CITUS, reason=f"not on a Citus cluster: {reason}")
