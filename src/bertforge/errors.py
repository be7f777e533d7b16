"""The one exception type users see: a problem with their input, stated with the fix."""

from __future__ import annotations


class BertforgeError(ValueError):
    """A user-facing error. The CLI prints its message on one line and exits with status 2.

    Messages name the file, field or option at fault and say what to do, e.g.
    ``"data/meta.json: tokenizer hash 1a2b.. differs from tokenizer 3c4d..; re-run bertforge prepare"``.
    """


__all__ = ["BertforgeError"]
