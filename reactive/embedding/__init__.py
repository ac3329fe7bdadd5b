"""Embedding a pipeline in an async application: a source the application pushes into
(:mod:`.push_source`), a sink's records as an async iterator, released as their checkpoint
commits, and point lookups of keyed state, committed or live (the job serves both:
:mod:`reactive.runtime.committed_results`, :mod:`reactive.runtime.state_query`), and jobs
run from trio (:mod:`.trio_host`)."""

from ..runtime.committed_results import CommittedResults
from ..runtime.state_query import StateQueryError
from .push_source import PushSource

__all__ = ["CommittedResults", "PushSource", "StateQueryError"]
