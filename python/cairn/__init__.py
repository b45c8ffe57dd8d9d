"""cairn: a multi-level checkpoint cache for large-model training.

The C++ core, as a Python module:

    import cairn
    ck = cairn.Checkpointer(cairn.Options.from_environment())
    ck.save(step, [cairn.Shard.from_buffer("w", "float32", [n], array)])
    ck.fence()            # before the bytes change again
    report = ck.restore([cairn.Shard.from_buffer("w", "float32", [n], array)])

For PyTorch, `cairn.torch.Checkpointer(model, optimizer)` builds the shards from the
state dicts, fences before every optimizer step and restores the RNG states.

Every error is a `cairn.Error` (a RuntimeError) whose `code` names its kind
("InvalidArgument", "NotFound", "Corruption", "Unavailable", ...). Settings and their
defaults: `cairn.settings()`, `cairn --help` or docs/settings.md; every setting is an
attribute of `cairn.Options`, named as in settings().
"""

from ._cairn import (  # noqa: F401
    Checkpointer,
    Error,
    Options,
    PfsStep,
    Prefault,
    RestoreReport,
    Shard,
    ShardList,
    Stats,
    VersionInfo,
    newest_held_blob,
    settings,
)

__all__ = ["Checkpointer", "Error", "Options", "PfsStep", "Prefault", "RestoreReport", "Shard",
           "ShardList", "Stats", "VersionInfo", "newest_held_blob", "settings"]
