"""Autotuning: ``tf.autotune(factory, variants)`` for user kernels and
``tf.autotune.entry(entry_point, configs=[...])`` for a library entry point's config."""
from __future__ import annotations

from .key import build_key, describe, source_hash
from .memo import Memo, memo_path
from .tuner import ENV, Tuner, autotune, enabled, entry

__all__ = ["ENV", "Memo", "Tuner", "autotune", "build_key", "describe", "enabled", "entry", "memo_path",
           "source_hash"]
