"""The check behind the driver pool's skipped session reset (`tests/helpers/session_state.py`):
what it must flag as state left on a session, and what it must let through."""

from __future__ import annotations

import pytest
from pglast.parser import ParseError

from tests.helpers.session_state import RESTORED_BY_THE_DRIVER, session_state

LEAVES_STATE = [
    ("SET search_path TO other, public", "search_path"),
    ("SET LOCAL statement_timeout = 0", "statement_timeout"),
    ("SET ROLE someone_else", "role"),
    ("SET SESSION AUTHORIZATION someone_else", "session_authorization"),
    ("RESET ALL", "SET/RESET"),
    ("LISTEN jobs", "LISTEN"),
    ("UNLISTEN *", "UNLISTEN"),
    ("DECLARE rows CURSOR WITH HOLD FOR SELECT 1", "DECLARE"),
    ("FETCH 10 FROM rows", "FETCH"),
    ("CLOSE ALL", "CLOSE"),
    ("PREPARE pick AS SELECT 1", "PREPARE"),
    ("EXECUTE pick", "EXECUTE"),
    ("DEALLOCATE ALL", "DEALLOCATE"),
    ("DISCARD ALL", "DISCARD"),
    ("LOAD 'auto_explain'", "LOAD"),
    ("CREATE TEMP TABLE scratch (id int)", "scratch"),
    ("CREATE TEMPORARY VIEW seen AS SELECT 1", "seen"),
    ("CREATE TEMP TABLE copied AS SELECT 1", "copied"),
    ("SELECT 1 AS one INTO TEMP picked", "picked"),
    ("SELECT pg_advisory_lock(hashtext($1))", "pg_advisory_lock()"),
    ("SELECT pg_try_advisory_lock_shared(1, 2)", "pg_try_advisory_lock_shared()"),
    (
        "WITH s AS (SELECT pg_catalog.set_config('search_path', $1, false)) SELECT * FROM s",
        "set_config()",
    ),
]

LEAVES_NOTHING = [
    "BEGIN ISOLATION LEVEL READ COMMITTED",
    "COMMIT",
    "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))",
    "UPDATE jobs SET status = 'dead' WHERE company_id = $1 AND id = $2",
    "SELECT 'SET search_path TO x; LISTEN y' AS text",
    "SHOW search_path",
    "NOTIFY jobs",
    "CREATE TABLE kept (id int)",
    "DO $$ BEGIN PERFORM 1; END $$",
]


@pytest.mark.parametrize(("sql", "named"), LEAVES_STATE)
def test_a_statement_that_leaves_session_state_is_flagged(sql: str, named: str) -> None:
    [finding] = session_state(sql)
    assert named in finding


@pytest.mark.parametrize("sql", LEAVES_NOTHING)
def test_a_statement_that_leaves_nothing_passes(sql: str) -> None:
    assert session_state(sql) == []


def test_every_statement_of_a_batch_is_read() -> None:
    assert len(session_state("SELECT 1; SET search_path TO x; LISTEN y")) == 2


def test_text_postgresql_would_not_parse_is_an_error() -> None:
    with pytest.raises(ParseError):
        session_state("SET search_path TO")


@pytest.mark.parametrize("sql", sorted(RESTORED_BY_THE_DRIVER))
def test_the_driver_statements_let_through_are_ones_the_check_flags(sql: str) -> None:
    """They are let through by their exact text only, for setting back what they changed."""
    assert session_state(sql) != []
