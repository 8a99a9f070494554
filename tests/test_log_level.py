"""MINEDRAFT_LOG_LEVEL sets a service's log level; a value that is not a level logs at INFO and says so."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from minedraft.observability.logs import configure_logging


@pytest.fixture
def root_logging() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield root
    root.handlers[:] = handlers
    root.setLevel(level)


@pytest.mark.parametrize(("named", "level"),
                         [(None, logging.INFO), ("debug", logging.DEBUG), (" WARNING ", logging.WARNING)])
def test_the_environment_sets_the_level(root_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch,
                                        named: str | None, level: int) -> None:
    if named is None:
        monkeypatch.delenv("MINEDRAFT_LOG_LEVEL", raising=False)
    else:
        monkeypatch.setenv("MINEDRAFT_LOG_LEVEL", named)
    configure_logging("test")
    assert root_logging.level == level


def test_a_wrong_level_logs_at_info_and_says_why(root_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MINEDRAFT_LOG_LEVEL", "verbose")
    configure_logging("test")
    assert root_logging.level == logging.INFO
    assert "MINEDRAFT_LOG_LEVEL='VERBOSE' is not a level" in capsys.readouterr().err


def test_an_explicit_level_wins(root_logging: logging.Logger, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MINEDRAFT_LOG_LEVEL", "DEBUG")
    configure_logging("test", logging.ERROR)
    assert root_logging.level == logging.ERROR
