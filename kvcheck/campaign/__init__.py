"""Campaigns: many checker runs of one target, each with its own seed, shape and mix.

``plan`` draws each run (swarm testing), ``worker`` runs one in a watched child process,
``pools`` keeps local processes or Ray tasks busy, ``results`` groups violations by
signature and keeps the ``--out`` directory (resumable), ``runner`` ties them together,
``coverage`` counts the spec's outcome classes. The command is ``kvcheck campaign``.
"""

from kvcheck.campaign.plan import RunSpec, Settings, draw, parse_duration
from kvcheck.campaign.runner import Budget, Campaign

__all__ = ["Budget", "Campaign", "RunSpec", "Settings", "draw", "parse_duration"]
