"""Embedding a pipeline in an async application: a source the application pushes into
(:mod:`.push_source`), a sink's records as an async iterator, released as their checkpoint
commits (:mod:`.committed_results`), and point lookups of keyed state, committed or live
(:mod:`.state_query`)."""

from .committed_results import CommittedResults
from .push_source import PushSource
from .state_query import StateQueryError

__all__ = ["CommittedResults", "PushSource", "StateQueryError"]
